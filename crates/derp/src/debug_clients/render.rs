//! The answers of `/debug/clients/`: the counts page, and a page of
//! connections as JSON (derper's field names and types) or HTML.

use serde::Serialize;

use super::query::{Query, SortBy};
use super::row::{Part, Row};

/// A rendered answer: its content type and body.
pub struct Body {
    /// `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub bytes: Vec<u8>,
}

const JSON: &str = "application/json";
const HTML: &str = "text/html; charset=utf-8";

/// The page without a filter: how many connections and keys there are.
pub fn counts(json: bool, conns: i64, keys: i64) -> Body {
    if json {
        return Body {
            content_type: JSON,
            bytes: format!("{{\"conns\":{conns},\"keys\":{keys}}}\n").into_bytes(),
        };
    }
    let body = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>DERP clients</title></head>\n<body>\n\
<h1>DERP clients</h1>\n<p>{conns} connections, {keys} keys.</p>\n\
<form method=\"GET\"><button name=\"all\" value=\"1\">Every client</button></form>\n\
<form method=\"GET\">From address <input name=\"ip\" size=\"40\"> <button>List</button></form>\n\
<form method=\"GET\">From network <input name=\"cidr\" size=\"40\" placeholder=\"10.0.0.0/8\"> <button>List</button></form>\n\
<form method=\"GET\">Of key <input name=\"key\" size=\"80\" placeholder=\"nodekey:…\"> <button>List</button></form>\n\
<form method=\"GET\">With app name <input name=\"app\" size=\"40\"> <button>List</button></form>\n\
<p>Also: <code>app=</code> (repeatable; narrows any filter), <code>sort=</code> key, ip, conn, connected, rx, tx, \
rxpkts or txpkts (a leading <code>-</code> for descending), <code>limit=</code>, <code>after=</code> (a value \
of the sort column; for connected, Unix nanoseconds or a duration such as 30m), <code>format=json</code>.</p>\n\
</body></html>\n"
    );
    Body {
        content_type: HTML,
        bytes: body.into_bytes(),
    }
}

/// The relative URL of the page after `page`, when connections remain.
pub fn next_url(q: &Query, page: &Part) -> Option<String> {
    if page.remaining == 0 {
        return None;
    }
    let last = page.rows.last()?;
    let conn = last.conn_num.to_string();
    let sort = q.sort_param();
    Some(match q.sort {
        SortBy::Key => q.link(&sort, &last.key.to_string(), &conn),
        SortBy::Ip => q.link(&sort, &last.remote.to_string(), &conn),
        SortBy::Conn => q.link(&sort, &conn, ""),
        SortBy::Connected => q.link(&sort, &last.connected_at.to_string(), &conn),
        SortBy::RxBytes => q.link(&sort, &last.rx_bytes.to_string(), &conn),
        SortBy::TxBytes => q.link(&sort, &last.tx_bytes.to_string(), &conn),
        SortBy::RxPkts => q.link(&sort, &last.rx_pkts.to_string(), &conn),
        SortBy::TxPkts => q.link(&sort, &last.tx_pkts.to_string(), &conn),
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonClient<'a> {
    conn_num: i64,
    key: String,
    remote: String,
    connected_at: String,
    connected: i64,
    active: bool,
    dup: bool,
    disabled: bool,
    home: bool,
    mesh_peer: bool,
    not_ideal: bool,
    prober: bool,
    version: u32,
    app_name: &'a str,
    rx_pkts: u64,
    rx_bytes: u64,
    tx_pkts: u64,
    tx_bytes: u64,
    senders: u64,
}

#[derive(Serialize)]
struct JsonPage<'a> {
    query: String,
    conns: usize,
    keys: usize,
    remaining: usize,
    #[serde(skip_serializing_if = "String::is_empty")]
    next: String,
    clients: Vec<JsonClient<'a>>,
}

fn json_client(r: &Row) -> JsonClient<'_> {
    JsonClient {
        conn_num: r.conn_num,
        key: r.key.to_string(),
        remote: r.remote.to_string(),
        connected_at: rfc3339_nano(r.connected_at),
        connected: r.connected,
        active: r.active,
        dup: r.dup,
        disabled: r.disabled,
        home: r.home,
        mesh_peer: r.mesh_peer,
        not_ideal: r.not_ideal,
        prober: r.prober,
        version: r.version,
        app_name: r.app(),
        rx_pkts: r.rx_pkts,
        rx_bytes: r.rx_bytes,
        tx_pkts: r.tx_pkts,
        tx_bytes: r.tx_bytes,
        // Ferry keeps no per-connection sender estimate; derper reports
        // 0 too unless it is told to keep one.
        senders: 0,
    }
}

/// One page under `q`, as JSON or HTML as `q` asks.
pub fn page(q: &Query, page: &Part) -> Body {
    let next = next_url(q, page).unwrap_or_default();
    if q.json {
        let doc = JsonPage {
            query: q.describe(),
            conns: page.conns,
            keys: page.keys,
            remaining: page.remaining,
            next,
            clients: page.rows.iter().map(json_client).collect(),
        };
        let mut out = Vec::with_capacity(512 + page.rows.len() * 512);
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b"\t");
        let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
        doc.serialize(&mut ser).expect("JSON into memory");
        out.push(b'\n');
        return Body {
            content_type: JSON,
            bytes: out,
        };
    }
    Body {
        content_type: HTML,
        bytes: html_page(q, page, &next).into_bytes(),
    }
}

/// `s` safe inside HTML text and quoted attributes.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Go's rounded `time.Duration` text for whole seconds (`1h2m3s`, `0s`).
fn seconds_text(ns: i64) -> String {
    let s = ns / 1_000_000_000;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

fn html_page(q: &Query, page: &Part, next: &str) -> String {
    use std::fmt::Write;
    let title = esc(&q.describe());
    let mut h = String::with_capacity(1024 + page.rows.len() * 600);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>DERP clients: {title}</title>\n\
<style>table{{border-collapse:collapse;font-family:monospace}}th,td{{border:1px solid #ccc;padding:2px 6px}}td.n{{text-align:right}}</style>\n\
</head><body>\n<h1>DERP clients: {title}</h1>\n<p><a href=\"./\">counts</a></p>\n\
<p>{} of {} matching connections ({} keys).",
        page.rows.len(),
        page.conns,
        page.keys
    );
    let more = |h: &mut String| {
        if !next.is_empty() {
            let _ = write!(
                h,
                " <a href=\"{}\">Next page</a> ({} more)",
                esc(next),
                page.remaining
            );
        }
    };
    more(&mut h);
    h.push_str("</p>\n<table>\n<tr>");
    let columns: [(&str, Option<SortBy>); 12] = [
        ("conn#", Some(SortBy::Conn)),
        ("key", Some(SortBy::Key)),
        ("remote", Some(SortBy::Ip)),
        ("connected", Some(SortBy::Connected)),
        ("flags", None),
        ("ver", None),
        ("app", None),
        ("rx pkts", Some(SortBy::RxPkts)),
        ("rx bytes", Some(SortBy::RxBytes)),
        ("tx pkts", Some(SortBy::TxPkts)),
        ("tx bytes", Some(SortBy::TxBytes)),
        ("senders", None),
    ];
    for (label, sort) in columns {
        let Some(sort) = sort else {
            let _ = write!(h, "<th>{label}</th>");
            continue;
        };
        let counter = matches!(
            sort,
            SortBy::RxBytes | SortBy::TxBytes | SortBy::RxPkts | SortBy::TxPkts
        );
        // The current column flips; counters start with the most traffic.
        let desc = if sort == q.sort { !q.desc } else { counter };
        let param = format!("{}{}", if desc { "-" } else { "" }, sort.name());
        let arrow = match (sort == q.sort, q.desc) {
            (false, _) => "",
            (true, false) => " ▲",
            (true, true) => " ▼",
        };
        let _ = write!(
            h,
            "<th><a href=\"{}\">{label}</a>{arrow}</th>",
            esc(&q.link(&param, "", ""))
        );
    }
    h.push_str("</tr>\n");
    for r in &page.rows {
        let mut flags = String::new();
        for (on, name) in [
            (r.home, "home "),
            (r.mesh_peer, "mesh "),
            (r.prober, "prober "),
            (r.not_ideal, "notideal "),
        ] {
            if on {
                flags.push_str(name);
            }
        }
        if r.dup {
            flags.push_str("dup");
            if r.active {
                flags.push_str("-active");
            }
            if r.disabled {
                flags.push_str("-disabled");
            }
        }
        let key = r.key.to_string();
        let ip = r.remote.ip().to_string();
        let app = esc(r.app());
        let app_cell = if app.is_empty() {
            String::new()
        } else {
            let href = super::query::form_encode(r.app());
            format!("<a href=\"?app={}\">{app}</a>", esc(&href))
        };
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td><a href=\"?key={key}\">{key}</a></td><td><a href=\"?ip={}\">{}</a></td>\
<td>{}</td><td>{}</td><td>{}</td><td>{app_cell}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">0</td></tr>",
            r.conn_num,
            esc(&super::query::form_encode(&ip)),
            esc(&r.remote.to_string()),
            seconds_text(r.connected),
            flags.trim_end(),
            r.version,
            r.rx_pkts,
            r.rx_bytes,
            r.tx_pkts,
            r.tx_bytes,
        );
    }
    h.push_str("</table>\n<p>");
    more(&mut h);
    h.push_str("</p>\n</body></html>\n");
    h
}

/// Unix nanoseconds as RFC 3339 in UTC with the fraction's trailing zeros
/// cut (Go's `RFC3339Nano`, which its JSON uses for times).
pub fn rfc3339_nano(ns: i128) -> String {
    let secs = ns.div_euclid(1_000_000_000) as i64;
    let frac = ns.rem_euclid(1_000_000_000) as u32;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, mo, d) = ferry_proto::date::civil_from_days(days);
    let mut s = format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    );
    if frac != 0 {
        let f = format!("{frac:09}");
        s.push('.');
        s.push_str(f.trim_end_matches('0'));
    }
    s.push('Z');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_go_writes_them() {
        assert_eq!(rfc3339_nano(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_nano(1_795_000_000_123_400_000),
            "2026-11-18T11:06:40.1234Z"
        );
        assert_eq!(
            rfc3339_nano(951_782_400_000_000_001),
            "2000-02-29T00:00:00.000000001Z"
        );
        assert_eq!(rfc3339_nano(-1), "1969-12-31T23:59:59.999999999Z");
    }

    #[test]
    fn durations_read_as_go_writes_them() {
        assert_eq!(seconds_text(0), "0s");
        assert_eq!(seconds_text(59_000_000_000), "59s");
        assert_eq!(seconds_text(61_000_000_000), "1m1s");
        assert_eq!(seconds_text(3_600_000_000_000), "1h0m0s");
    }

    #[test]
    fn html_text_is_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&#34;x&#34;&gt;&amp;&#39;"
        );
    }
}
