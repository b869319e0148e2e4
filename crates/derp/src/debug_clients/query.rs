//! The query language of `/debug/clients/`, as derper v1.104 reads it:
//! one filter (`all`, `ip=`, `cidr=` or `key=`; `app=` alone means `all`),
//! any number of `app=` (an empty one matches clients without a name),
//! `sort=` with an optional leading `-` for descending, `limit=` (default
//! 100, at most 1000), a cursor (`after=`, and `afterconn=` to break
//! ties), and `format=json|html`.
//!
//! Bad input is an error whose text starts as derper's 400 answer does
//! (`bad ip "x": …`); what follows the colon is Ferry's own wording of
//! the cause, not Go's.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ferry_proto::app_name::quote;
use ferry_proto::http::unescape_query as unescape;
use ferry_proto::key::NodePublic;

/// Connections on a page when `limit=` is not given.
pub const DEFAULT_LIMIT: usize = 100;
/// The largest `limit=` honoured; more is cut to this.
pub const MAX_LIMIT: usize = 1000;

/// Which connections a query asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// Every connection.
    All,
    /// Connections from this address (IPv4-mapped addresses as IPv4).
    Ip(IpAddr),
    /// Connections from this network (address masked to its prefix).
    Cidr(IpAddr, u8),
    /// The connections of this key.
    Key(NodePublic),
}

/// The order a page walks the connections in (ties broken by connection
/// number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    /// Node key.
    Key,
    /// Remote address and port.
    Ip,
    /// Connection number (accept order).
    Conn,
    /// Connection time (ascending: longest connected first).
    Connected,
    /// Bytes received from the client.
    RxBytes,
    /// Bytes sent to the client.
    TxBytes,
    /// Packets received from the client.
    RxPkts,
    /// Packets sent to the client.
    TxPkts,
}

impl SortBy {
    const NAMES: [(SortBy, &'static str); 8] = [
        (SortBy::Key, "key"),
        (SortBy::Ip, "ip"),
        (SortBy::Conn, "conn"),
        (SortBy::Connected, "connected"),
        (SortBy::RxBytes, "rx"),
        (SortBy::TxBytes, "tx"),
        (SortBy::RxPkts, "rxpkts"),
        (SortBy::TxPkts, "txpkts"),
    ];

    /// The name in `sort=`.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(s, _)| *s == self)
            .map_or("unknown", |(_, n)| n)
    }

    fn from_name(name: &str) -> Option<SortBy> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(s, _)| *s)
    }
}

/// Where a page starts: strictly after this value in the walk order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    /// For the key sort.
    Key(NodePublic),
    /// For the ip sort (a bare address: past all of its ports).
    Addr(SocketAddr),
    /// For the conn sort.
    Conn(i64),
    /// For the connected sort: a connection time, Unix nanoseconds.
    ConnectedAt(i128),
    /// For the counter sorts.
    Counter(u64),
}

/// A parsed `/debug/clients/` query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The primary filter.
    pub filter: Filter,
    /// `app=` values, when given: a connection must have one of them.
    pub apps: Option<Vec<String>>,
    /// The walk order.
    pub sort: SortBy,
    /// Walk in descending order.
    pub desc: bool,
    /// Connections per page, 1 ..= [`MAX_LIMIT`].
    pub limit: usize,
    /// Answer with JSON rather than HTML.
    pub json: bool,
    /// The cursor, when given.
    pub after: Option<After>,
    /// The connection-number tie-break of the cursor (not for the conn
    /// sort); without it a cursor skips every connection at its value.
    pub after_conn: Option<i64>,
}

/// Why a query was refused (the text of the 400 answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QueryError(pub String);

/// The query string's pairs, decoded as Go's `url.ParseQuery` decodes them
/// (`+` is a space, `%XX` a byte); a pair that does not decode is skipped,
/// as derper's handler skips it.
fn pairs(raw: &str) -> Vec<(String, String)> {
    raw.split('&')
        .filter(|p| !p.is_empty() && !p.contains(';'))
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((unescape(k)?, unescape(v)?))
        })
        .collect()
}

fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

fn mask(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

fn parse_cidr(s: &str) -> Result<(IpAddr, u8), &'static str> {
    let (addr, bits) = s.split_once('/').ok_or("no '/'")?;
    let addr: IpAddr = addr.parse().map_err(|_| "bad address")?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let bits = Some(bits)
        .filter(|b| !b.is_empty() && b.len() <= 3 && b.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|b| b.parse::<u8>().ok())
        .filter(|&b| b <= max)
        .ok_or("bad prefix length")?;
    Ok((mask(addr, bits), bits))
}

impl Query {
    /// Whether `ip` (a connection's remote address) passes the address
    /// filters; the key filter is applied by looking the key up.
    pub fn matches_addr(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match &self.filter {
            Filter::Ip(want) => ip == *want,
            Filter::Cidr(net, bits) => net.is_ipv4() == ip.is_ipv4() && mask(ip, *bits) == *net,
            Filter::All | Filter::Key(_) => true,
        }
    }

    /// Whether a connection with `app_name` ("" for none) passes `app=`.
    pub fn matches_app(&self, app_name: &str) -> bool {
        self.apps
            .as_ref()
            .is_none_or(|apps| apps.iter().any(|a| a == app_name))
    }
}

impl Query {
    /// The sort as `sort=` writes it (`-` first when descending).
    pub fn sort_param(&self) -> String {
        format!("{}{}", if self.desc { "-" } else { "" }, self.sort.name())
    }

    /// A short description of the filter, for the page's title.
    pub fn describe(&self) -> String {
        let mut s = match &self.filter {
            Filter::All => "all clients".to_owned(),
            Filter::Ip(ip) => format!("clients from {ip}"),
            Filter::Cidr(net, bits) => format!("clients from {net}/{bits}"),
            Filter::Key(k) => format!("connections for {k}"),
        };
        if let Some(apps) = &self.apps {
            let names: Vec<&str> = apps
                .iter()
                .map(|a| if a.is_empty() { "(none)" } else { a })
                .collect();
            s.push_str(" with app ");
            s.push_str(&names.join(" or "));
        }
        s
    }

    /// A relative URL with this query's filters, page size and format, and
    /// `sort`, `after` and `after_conn` (empty: left out); parameters in
    /// name order.
    pub fn link(&self, sort: &str, after: &str, after_conn: &str) -> String {
        let mut v: Vec<(&str, String)> = Vec::new();
        match &self.filter {
            Filter::All => v.push(("all", "1".into())),
            Filter::Ip(ip) => v.push(("ip", ip.to_string())),
            Filter::Cidr(net, bits) => v.push(("cidr", format!("{net}/{bits}"))),
            Filter::Key(k) => v.push(("key", k.to_string())),
        }
        for a in self.apps.iter().flatten() {
            v.push(("app", a.clone()));
        }
        v.push(("sort", sort.to_owned()));
        if !after.is_empty() {
            v.push(("after", after.to_owned()));
        }
        if !after_conn.is_empty() {
            v.push(("afterconn", after_conn.to_owned()));
        }
        if self.limit != DEFAULT_LIMIT {
            v.push(("limit", self.limit.to_string()));
        }
        if self.json {
            v.push(("format", "json".into()));
        }
        // A stable sort keeps repeated app= in their order.
        v.sort_by_key(|(k, _)| *k);
        let pairs: Vec<String> = v
            .iter()
            .map(|(k, val)| format!("{k}={}", form_encode(val)))
            .collect();
        format!("?{}", pairs.join("&"))
    }
}

/// `s` as a query-string value: letters, digits and `-_.~` as they are, a
/// space as `+`, every other byte as `%XX`.
pub fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b))
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Whether the query string `raw` asks for JSON (`format=json`).
pub fn is_json(raw: &str) -> bool {
    pairs(raw)
        .iter()
        .find(|(k, _)| k == "format")
        .is_some_and(|(_, v)| v == "json")
}

/// Parses the query string `raw` (without `?`). `now_ns` (Unix
/// nanoseconds) turns a duration cursor of the connected sort into a
/// time. `Ok(None)`: no filter at all, so the page shows counts only.
pub fn parse(raw: &str, now_ns: i128) -> Result<Option<Query>, QueryError> {
    let pairs = pairs(raw);
    let has = |k: &str| pairs.iter().any(|(n, _)| n == k);
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == k)
            .map_or("", |(_, v)| v.as_str())
    };
    let bad = |what: &str, s: &str, why: &dyn std::fmt::Display| {
        QueryError(format!("bad {what} {}: {why}", quote(s)))
    };

    let format = get("format");
    if !format.is_empty() && format != "json" && format != "html" {
        return Err(QueryError(format!(
            "bad format {}; want json or html",
            quote(format)
        )));
    }
    let mut filters = Vec::new();
    if has("all") {
        filters.push(Filter::All);
    }
    let s = get("ip");
    if !s.is_empty() {
        let ip: IpAddr = s.parse().map_err(|e| bad("ip", s, &e))?;
        filters.push(Filter::Ip(canonical(ip)));
    }
    let s = get("cidr");
    if !s.is_empty() {
        let (net, bits) = parse_cidr(s).map_err(|e| bad("cidr", s, &e))?;
        filters.push(Filter::Cidr(net, bits));
    }
    let s = get("key");
    if !s.is_empty() {
        let key: NodePublic = s.parse().map_err(|e| bad("key", s, &e))?;
        filters.push(Filter::Key(key));
    }
    let apps = has("app").then(|| {
        pairs
            .iter()
            .filter(|(n, _)| n == "app")
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>()
    });
    let filter = match filters.len() {
        0 if apps.is_none() => return Ok(None),
        0 => Filter::All,
        1 => filters.pop().expect("one filter"),
        _ => {
            return Err(QueryError(
                "only one of all, ip, cidr, or key may be given".into(),
            ))
        }
    };

    let mut sort = SortBy::Key;
    let mut desc = false;
    let s = get("sort");
    if !s.is_empty() {
        let (name, d) = match s.strip_prefix('-') {
            Some(n) => (n, true),
            None => (s, false),
        };
        sort = SortBy::from_name(name).ok_or_else(|| {
            QueryError(format!(
                "bad sort {}; want key, ip, conn, connected, rx, tx, rxpkts, or txpkts, optionally with a leading -",
                quote(s)
            ))
        })?;
        desc = d;
    }
    let mut limit = DEFAULT_LIMIT;
    let s = get("limit");
    if !s.is_empty() {
        limit = match s.parse::<i64>() {
            Ok(n) if n >= 1 => usize::try_from(n).unwrap_or(MAX_LIMIT).min(MAX_LIMIT),
            _ => return Err(QueryError(format!("bad limit {}", quote(s)))),
        };
    }
    let mut after = None;
    let s = get("after");
    if !s.is_empty() {
        let for_sort = format!("after {} for sort by {}", quote(s), sort.name());
        let bad_after = |why: &dyn std::fmt::Display| QueryError(format!("bad {for_sort}: {why}"));
        after = Some(match sort {
            SortBy::Key => After::Key(s.parse().map_err(|e| bad_after(&e))?),
            SortBy::Ip => match s.parse::<SocketAddr>() {
                Ok(a) => After::Addr(a),
                Err(e) => {
                    let ip: IpAddr = s.parse().map_err(|_| bad_after(&e))?;
                    After::Addr(SocketAddr::new(ip, if desc { 0 } else { u16::MAX }))
                }
            },
            SortBy::Conn => After::Conn(s.parse().map_err(|e| bad_after(&e))?),
            SortBy::Connected => {
                if let Ok(ns) = s.parse::<i64>() {
                    After::ConnectedAt(i128::from(ns))
                } else if let Some(d) = ferry_proto::godur::parse(s) {
                    After::ConnectedAt(now_ns - Duration::as_nanos(&d) as i128)
                } else {
                    return Err(QueryError(format!(
                        "bad {for_sort}; want Unix nanoseconds or a duration"
                    )));
                }
            }
            _ => After::Counter(s.parse().map_err(|e| bad_after(&e))?),
        });
    }
    let mut after_conn = None;
    let s = get("afterconn");
    if !s.is_empty() && after.is_some() && sort != SortBy::Conn {
        after_conn = Some(s.parse::<i64>().map_err(|e| bad("afterconn", s, &e))?);
    }
    Ok(Some(Query {
        filter,
        apps,
        sort,
        desc,
        limit,
        json: format == "json",
        after,
        after_conn,
    }))
}

#[cfg(test)]
mod tests;
