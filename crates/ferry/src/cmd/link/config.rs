//! `ferry link`'s configuration file, checked before anything is bound or
//! dialled. Every mistake names the key (`peer[1].link_key`) and, when the
//! file has it, the line.
//!
//! ```toml
//! key_file = "/var/lib/ferry/link.key"   # this side's link key; created on first start (0600)
//! wireguard = "127.0.0.1:51820"          # the local WireGuard's listen address (default for peers)
//! metrics_addr = "127.0.0.1:9102"        # optional: Prometheus text at /metrics; `ferry link status` reads it
//! queue = 512                            # optional: datagrams waiting per relay connection
//! bind = "0.0.0.0:0"                     # optional: the UDP socket for direct paths and relay sessions
//! home = "home"                          # optional: the relay this side's peers reach it through (default: the first)
//!
//! [[relay]]
//! name = "home"                          # optional (default relay0, relay1, ...)
//! url = "https://derp.example.com/derp"
//! # or, for a region of several meshed nodes, all their URLs (instead of url):
//! # urls = ["https://derp1.example.com/derp", "https://derp2.example.com/derp"]
//! ca_file = "/etc/ferry/test-ca.pem"     # optional: trust only this CA (default: the system's roots)
//! stun = "192.0.2.1:3478"                # optional: the STUN server (default: the URL's host, port 3478)
//!
//! [[peer]]
//! name = "nas"
//! link_key = "nodekey:..."               # what `ferry link pubkey` prints on the peer
//! endpoint = "127.0.0.1:51001"           # local UDP address standing for the peer (its WireGuard Endpoint)
//! wireguard = "127.0.0.1:51820"          # optional: overrides the top-level one
//! relay = "home"                         # optional: the relay the peer is connected to (default: the first)
//! prefer = "relay"                       # optional: this kind of path first when it works
//! only = "derp"                          # optional: this kind of path alone
//! ```

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use ferry_client::PathKind;
use ferry_proto::key::NodePublic;
use serde::Deserialize;
use toml::Spanned;

/// The most URLs one `[[relay]]` (one region) may list.
const MAX_URLS: usize = 16;

/// Default number of datagrams waiting for one relay connection.
pub(crate) const DEFAULT_QUEUE: usize = 512;

/// A checked `ferry link` configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Config {
    /// Where this side's link key lives.
    pub key_file: PathBuf,
    /// Prometheus text endpoint.
    pub metrics_addr: Option<SocketAddr>,
    /// Datagrams held per relay connection before new ones are dropped.
    pub queue: usize,
    /// The UDP socket for direct paths and relay sessions.
    pub bind: SocketAddr,
    /// DERP servers, in the file's order.
    pub relays: Vec<Relay>,
    /// Index into [`Config::relays`]: the relay this side's peers reach
    /// it through (where a pair's relay session is asked for when this
    /// side's key is the lower).
    pub home: usize,
    /// The remote `ferry link`s.
    pub peers: Vec<Peer>,
}

/// One DERP server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Relay {
    /// Name used in logs and metrics.
    pub name: String,
    /// `http(s)://host[:port]/derp`: `url`, or the first of `urls`.
    pub url: String,
    /// The rest of `urls`: the region's other nodes, tried when `url`'s
    /// cannot be reached or its connection is lost.
    pub fallback_urls: Vec<String>,
    /// A PEM file of CA certificates to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// The STUN server; `None`: the URL's host, port 3478.
    pub stun: Option<SocketAddr>,
    /// `relay[i]`, for errors found later (reading `ca_file`).
    pub field: String,
}

impl Relay {
    /// Its nodes' URLs in order: `url`, then the region's other nodes.
    pub(crate) fn urls(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.url).chain(&self.fallback_urls)
    }
}

/// One remote `ferry link`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Peer {
    /// Name used in logs and metrics.
    pub name: String,
    /// Its link key: its DERP address.
    pub link_key: NodePublic,
    /// The local address that stands for it (its `Endpoint` here).
    pub endpoint: SocketAddr,
    /// The local WireGuard's listen address.
    pub wireguard: SocketAddr,
    /// Index into [`Config::relays`]: where the peer is reachable.
    pub relay: usize,
    /// This kind of path first when it works.
    pub prefer: Option<PathKind>,
    /// This kind of path alone.
    pub only: Option<PathKind>,
    /// `peer[i]`.
    pub field: String,
}

/// A configuration mistake: the file, the line when known, the key, and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigError {
    path: String,
    line: Option<usize>,
    field: String,
    message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    key_file: Option<Spanned<String>>,
    wireguard: Option<Spanned<String>>,
    metrics_addr: Option<Spanned<String>>,
    queue: Option<Spanned<usize>>,
    bind: Option<Spanned<String>>,
    home: Option<Spanned<String>>,
    #[serde(default)]
    relay: Vec<FileRelay>,
    #[serde(default)]
    peer: Vec<FilePeer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRelay {
    name: Option<Spanned<String>>,
    url: Option<Spanned<String>>,
    urls: Option<Spanned<Vec<Spanned<String>>>>,
    ca_file: Option<String>,
    stun: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePeer {
    name: Spanned<String>,
    link_key: Spanned<String>,
    endpoint: Spanned<String>,
    wireguard: Option<Spanned<String>>,
    relay: Option<Spanned<String>>,
    prefer: Option<Spanned<String>>,
    only: Option<Spanned<String>>,
}

/// Builds errors for one file: turns byte spans into line numbers.
struct Errors<'a> {
    path: &'a str,
    text: &'a str,
}

impl Errors<'_> {
    fn at<T>(
        &self,
        value: &Spanned<T>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            path: self.path.to_owned(),
            line: Some(1 + self.text[..value.span().start].matches('\n').count()),
            field: field.into(),
            message: message.into(),
        }
    }

    fn key_file(&self, v: Option<Spanned<String>>) -> Result<PathBuf, ConfigError> {
        match v {
            Some(k) if k.get_ref().is_empty() => Err(self.at(&k, "key_file", "must not be empty")),
            Some(k) => Ok(PathBuf::from(k.into_inner())),
            None => Err(self.file(
                "key_file",
                "missing: the file holding this side's link key (created on first start)",
            )),
        }
    }

    fn toml(&self, err: &toml::de::Error) -> ConfigError {
        ConfigError {
            path: self.path.to_owned(),
            line: err
                .span()
                .map(|s| 1 + self.text[..s.start].matches('\n').count()),
            field: String::new(),
            message: err.message().to_owned(),
        }
    }

    fn file(&self, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            path: self.path.to_owned(),
            line: None,
            field: field.into(),
            message: message.into(),
        }
    }

    /// A name for logs and metric labels: letters, digits, `-`, `_`, `.`.
    fn name(&self, value: &Spanned<String>, field: &str) -> Result<String, ConfigError> {
        let name = value.get_ref();
        if name.is_empty() {
            return Err(self.at(value, field, "must not be empty"));
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(self.at(
                value,
                field,
                format!("{name:?}: use only letters, digits, '-', '_' and '.'"),
            ));
        }
        Ok(name.clone())
    }

    fn addr(&self, value: &Spanned<String>, field: &str) -> Result<SocketAddr, ConfigError> {
        let addr: SocketAddr = value.get_ref().parse().map_err(|_| {
            self.at(
                value,
                field,
                format!(
                    "{:?} is not an address (expected ip:port or [ipv6]:port)",
                    value.get_ref()
                ),
            )
        })?;
        if addr.port() == 0 {
            return Err(self.at(value, field, format!("{addr}: the port must not be 0")));
        }
        Ok(addr)
    }

    /// A kind of path: `direct`, `relay` or `derp`.
    fn path_kind(&self, value: &Spanned<String>, field: &str) -> Result<PathKind, ConfigError> {
        match value.get_ref().as_str() {
            "direct" => Ok(PathKind::Direct),
            "relay" => Ok(PathKind::RelaySession),
            "derp" => Ok(PathKind::Derp),
            other => Err(self.at(
                value,
                field,
                format!("{other:?}: the kinds of path are \"direct\", \"relay\" (a relay session) and \"derp\""),
            )),
        }
    }
}

impl Config {
    /// Parses and checks a file's text; `path` names it in errors.
    pub(crate) fn from_toml(path: &str, text: &str) -> Result<Config, ConfigError> {
        let e = Errors { path, text };
        let file: FileConfig = toml::from_str(text).map_err(|err| e.toml(&err))?;
        let key_file = e.key_file(file.key_file.clone())?;
        let metrics_addr = file
            .metrics_addr
            .as_ref()
            .map(|v| e.addr(v, "metrics_addr"))
            .transpose()?;
        let queue = match &file.queue {
            None => DEFAULT_QUEUE,
            Some(q) if (1..=65536).contains(q.get_ref()) => *q.get_ref(),
            Some(q) => {
                return Err(e.at(
                    q,
                    "queue",
                    format!("{}: must be between 1 and 65536", q.get_ref()),
                ))
            }
        };
        let bind = match &file.bind {
            None => SocketAddr::from(([0, 0, 0, 0], 0)),
            Some(v) => v.get_ref().parse().map_err(|_| {
                e.at(
                    v,
                    "bind",
                    format!(
                        "{:?} is not an address (expected ip:port; port 0 picks one)",
                        v.get_ref()
                    ),
                )
            })?,
        };
        let default_wireguard = file
            .wireguard
            .as_ref()
            .map(|v| e.addr(v, "wireguard"))
            .transpose()?;

        if file.relay.is_empty() {
            return Err(e.file("relay", "at least one [[relay]] with a DERP url is needed"));
        }
        let mut relays: Vec<Relay> = Vec::new();
        let mut relay_names: HashMap<String, usize> = HashMap::new();
        for (i, r) in file.relay.iter().enumerate() {
            let field = format!("relay[{i}]");
            let urls: Vec<(&Spanned<String>, String)> = match (&r.url, &r.urls) {
                (Some(u), None) => vec![(u, format!("{field}.url"))],
                (None, Some(list))
                    if !list.get_ref().is_empty() && list.get_ref().len() <= MAX_URLS =>
                {
                    list.get_ref()
                        .iter()
                        .enumerate()
                        .map(|(j, u)| (u, format!("{field}.urls[{j}]")))
                        .collect()
                }
                (None, Some(list)) => {
                    return Err(e.at(
                        list,
                        format!("{field}.urls"),
                        format!("from 1 to {MAX_URLS} URLs (the nodes of one region)"),
                    ))
                }
                (Some(u), Some(_)) => {
                    return Err(e.at(
                        u,
                        format!("{field}.url"),
                        "url and urls together: give one (urls lists every node of the region)",
                    ))
                }
                (None, None) => {
                    return Err(e.file(
                        field,
                        "a DERP url is needed (url, or urls for the nodes of a region)",
                    ))
                }
            };
            for (u, f) in &urls {
                if let Err(err) = ferry_client::Target::from_url(u.get_ref()) {
                    return Err(e.at(u, f.clone(), err.to_string()));
                }
            }
            let url_span = urls[0].0;
            let name = match &r.name {
                Some(n) => e.name(n, &format!("{field}.name"))?,
                None => format!("relay{i}"),
            };
            if let Some(&j) = relay_names.get(&name) {
                let at = r.name.as_ref().unwrap_or(url_span);
                return Err(e.at(
                    at,
                    format!("{field}.name"),
                    format!("{name:?} is already used by relay[{j}]"),
                ));
            }
            relay_names.insert(name.clone(), i);
            relays.push(Relay {
                name,
                url: url_span.get_ref().clone(),
                fallback_urls: urls[1..].iter().map(|(u, _)| u.get_ref().clone()).collect(),
                ca_file: r.ca_file.as_ref().map(PathBuf::from),
                stun: r
                    .stun
                    .as_ref()
                    .map(|v| e.addr(v, &format!("{field}.stun")))
                    .transpose()?,
                field,
            });
        }

        let home = match &file.home {
            None => 0,
            Some(h) => *relay_names.get(h.get_ref()).ok_or_else(|| {
                e.at(
                    h,
                    "home",
                    format!("no [[relay]] is named {:?}", h.get_ref()),
                )
            })?,
        };

        if file.peer.is_empty() {
            return Err(e.file("peer", "at least one [[peer]] is needed"));
        }
        let mut peers: Vec<Peer> = Vec::new();
        for (i, p) in file.peer.iter().enumerate() {
            let field = format!("peer[{i}]");
            let name = e.name(&p.name, &format!("{field}.name"))?;
            let link_key: NodePublic = p.link_key.get_ref().trim().parse().map_err(|err| {
                e.at(&p.link_key, format!("{field}.link_key"), format!("{err} (a link key looks like nodekey:<64 hex digits>, as `ferry link pubkey` prints it)"))
            })?;
            let endpoint = e.addr(&p.endpoint, &format!("{field}.endpoint"))?;
            let wireguard = match &p.wireguard {
                Some(v) => e.addr(v, &format!("{field}.wireguard"))?,
                None => default_wireguard.ok_or_else(|| {
                    e.at(
                        &p.name,
                        format!("{field}.wireguard"),
                        "missing: the local WireGuard's listen address (here or at the top level)",
                    )
                })?,
            };
            let relay = match &p.relay {
                None => 0,
                Some(r) => *relay_names.get(r.get_ref()).ok_or_else(|| {
                    e.at(
                        r,
                        format!("{field}.relay"),
                        format!("no [[relay]] is named {:?}", r.get_ref()),
                    )
                })?,
            };
            let kind = |v: &Option<Spanned<String>>, key: &str| {
                v.as_ref()
                    .map(|v| e.path_kind(v, &format!("{field}.{key}")))
                    .transpose()
            };
            let (prefer, only) = (kind(&p.prefer, "prefer")?, kind(&p.only, "only")?);
            if let (Some(pv), Some(o), Some(pk)) = (&p.prefer, only, prefer) {
                if pk != o {
                    return Err(e.at(
                        pv,
                        format!("{field}.prefer"),
                        format!("{:?} contradicts only = {:?}: with only, no other kind of path is used", pv.get_ref(), p.only.as_ref().map(|v| v.get_ref().as_str()).unwrap_or_default()),
                    ));
                }
            }
            for (j, q) in peers.iter().enumerate() {
                let clash = if q.name == name {
                    Some((&p.name, "name", format!("{name:?}")))
                } else if q.link_key == link_key {
                    Some((&p.link_key, "link_key", link_key.to_string()))
                } else if q.endpoint == endpoint {
                    Some((&p.endpoint, "endpoint", endpoint.to_string()))
                } else {
                    None
                };
                if let Some((at, key, value)) = clash {
                    return Err(e.at(
                        at,
                        format!("{field}.{key}"),
                        format!("{value} is already used by peer[{j}]"),
                    ));
                }
            }
            if endpoint == wireguard {
                return Err(e.at(
                    &p.endpoint,
                    format!("{field}.endpoint"),
                    format!("{endpoint} is the local WireGuard's own address"),
                ));
            }
            if metrics_addr == Some(endpoint) {
                return Err(e.at(
                    &p.endpoint,
                    format!("{field}.endpoint"),
                    format!("{endpoint} is also metrics_addr"),
                ));
            }
            peers.push(Peer {
                name,
                link_key,
                endpoint,
                wireguard,
                relay,
                prefer,
                only,
                field,
            });
        }
        Ok(Config {
            key_file,
            metrics_addr,
            queue,
            bind,
            relays,
            home,
            peers,
        })
    }

    /// Only `key_file`, for `ferry link pubkey`: a new side prints its key
    /// before it knows its peers' keys.
    pub(crate) fn key_file_only(path: &std::path::Path) -> anyhow::Result<PathBuf> {
        use anyhow::Context;
        #[derive(Deserialize)]
        struct KeyOnly {
            key_file: Option<Spanned<String>>,
        }
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(path).with_context(|| format!("--config: reading {name}"))?;
        let e = Errors {
            path: &name,
            text: &text,
        };
        let file: KeyOnly = toml::from_str(&text).map_err(|err| e.toml(&err))?;
        Ok(e.key_file(file.key_file)?)
    }

    /// Reads and checks the file at `path`.
    pub(crate) fn load(path: &std::path::Path) -> anyhow::Result<Config> {
        use anyhow::Context;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--config: reading {}", path.display()))?;
        Ok(Config::from_toml(&path.display().to_string(), &text)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "nodekey:1111111111111111111111111111111111111111111111111111111111111111";
    const KEY_B: &str = "nodekey:2222222222222222222222222222222222222222222222222222222222222222";

    fn full() -> String {
        format!(
            r#"key_file = "/var/lib/ferry/link.key"
wireguard = "127.0.0.1:51820"
metrics_addr = "127.0.0.1:9102"
queue = 64

[[relay]]
name = "home"
url = "https://derp.example.com/derp"

[[relay]]
url = "http://10.0.0.1:3340/derp"
ca_file = "/tmp/ca.pem"

[[peer]]
name = "nas"
link_key = "{KEY_A}"
endpoint = "127.0.0.1:51001"

[[peer]]
name = "laptop"
link_key = "{KEY_B}"
endpoint = "127.0.0.1:51002"
wireguard = "127.0.0.1:51821"
relay = "relay1"
"#
        )
    }

    #[test]
    fn home_names_a_relay() {
        let f = full();
        let with =
            |home: &str| f.replace("queue = 64\n", &format!("queue = 64\nhome = {home:?}\n"));
        assert_eq!(
            Config::from_toml("link.toml", &with("relay1"))
                .unwrap()
                .home,
            1
        );
        assert_eq!(
            Config::from_toml("link.toml", &with("home")).unwrap().home,
            0
        );
        let e = err(&with("away"));
        assert!(
            e.starts_with("link.toml:5: home: no [[relay]] is named \"away\""),
            "{e}"
        );
    }

    #[test]
    fn a_relay_lists_the_nodes_of_its_region_in_urls() {
        let f = full();
        let one = "url = \"http://10.0.0.1:3340/derp\"";
        let with = |v: &str| f.replace(one, v);
        let c = Config::from_toml(
            "link.toml",
            &with("urls = [\"http://10.0.0.1:3340/derp\", \"http://10.0.0.2:3340/derp\"]"),
        )
        .unwrap();
        assert_eq!(c.relays[1].url, "http://10.0.0.1:3340/derp");
        assert_eq!(c.relays[1].fallback_urls, ["http://10.0.0.2:3340/derp"]);
        assert!(Config::from_toml("link.toml", &f).unwrap().relays[1]
            .fallback_urls
            .is_empty());
        let e = err(&with(&format!(
            "{one}\nurls = [\"http://10.0.0.2:3340/derp\"]"
        )));
        assert!(
            e.starts_with("link.toml:11: relay[1].url: url and urls together"),
            "{e}"
        );
        let e = err(&with("urls = []"));
        assert!(
            e.starts_with("link.toml:11: relay[1].urls: from 1 to 16 URLs"),
            "{e}"
        );
        let e = err(&with("urls = [\"http://10.0.0.1:3340/derp\", \"ftp://x\"]"));
        assert!(e.starts_with("link.toml:11: relay[1].urls[1]: "), "{e}");
        let e = err(&with("name = \"region\""));
        assert!(
            e.starts_with("link.toml: relay[1]: a DERP url is needed"),
            "{e}"
        );
    }

    fn err(text: &str) -> String {
        Config::from_toml("link.toml", text)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_full_file() {
        let c = Config::from_toml("link.toml", &full()).unwrap();
        assert_eq!(c.key_file, PathBuf::from("/var/lib/ferry/link.key"));
        assert_eq!(c.metrics_addr, Some("127.0.0.1:9102".parse().unwrap()));
        assert_eq!(c.queue, 64);
        assert_eq!(c.relays[0].name, "home");
        assert_eq!(c.relays[1].name, "relay1");
        assert_eq!(c.relays[1].ca_file, Some(PathBuf::from("/tmp/ca.pem")));
        assert_eq!(c.home, 0);
        assert_eq!(c.peers[0].link_key.to_string(), KEY_A);
        assert_eq!(c.peers[0].wireguard, "127.0.0.1:51820".parse().unwrap());
        assert_eq!(c.peers[0].relay, 0);
        assert_eq!(c.peers[1].wireguard, "127.0.0.1:51821".parse().unwrap());
        assert_eq!(c.peers[1].relay, 1);
        assert_eq!(c.peers[1].endpoint, "127.0.0.1:51002".parse().unwrap());
    }

    #[test]
    fn defaults() {
        let c = Config::from_toml(
            "f",
            &format!("key_file = \"k\"\n[[relay]]\nurl = \"http://r/derp\"\n[[peer]]\nname = \"p\"\nlink_key = \"{KEY_A}\"\nendpoint = \"127.0.0.1:1\"\nwireguard = \"127.0.0.1:2\"\n"),
        )
        .unwrap();
        assert_eq!(c.queue, DEFAULT_QUEUE);
        assert_eq!(c.metrics_addr, None);
        assert_eq!(c.relays[0].name, "relay0");
        assert_eq!(c.relays[0].ca_file, None);
    }

    #[test]
    fn mistakes_name_the_key_and_line() {
        let f = full();
        let e = err(&f.replace(KEY_B, "nodekey:12"));
        assert!(e.starts_with("link.toml:21: peer[1].link_key: "), "{e}");
        let e = err(&f.replace("127.0.0.1:51002", "here"));
        assert!(
            e.starts_with("link.toml:22: peer[1].endpoint: \"here\" is not an address"),
            "{e}"
        );
        let e = err(&f.replace("127.0.0.1:51002", "127.0.0.1:51001"));
        assert!(
            e.starts_with(
                "link.toml:22: peer[1].endpoint: 127.0.0.1:51001 is already used by peer[0]"
            ),
            "{e}"
        );
        let e = err(&f.replace("laptop", "nas"));
        assert!(
            e.starts_with("link.toml:20: peer[1].name: \"nas\" is already used by peer[0]"),
            "{e}"
        );
        let e = err(&f.replace(KEY_B, KEY_A));
        assert!(
            e.starts_with("link.toml:21: peer[1].link_key: nodekey:1111"),
            "{e}"
        );
        let e = err(&f.replace("relay = \"relay1\"", "relay = \"away\""));
        assert!(
            e.starts_with("link.toml:24: peer[1].relay: no [[relay]] is named \"away\""),
            "{e}"
        );
        let e = err(&f.replace("https://derp", "ftp://derp"));
        assert!(e.starts_with("link.toml:8: relay[0].url: "), "{e}");
        let e = err(&f.replace("\"laptop\"", "\"lap top\""));
        assert!(
            e.starts_with("link.toml:20: peer[1].name: \"lap top\": use only letters"),
            "{e}"
        );
        let e = err(&f.replace("queue = 64", "queue = 0"));
        assert!(
            e.starts_with("link.toml:4: queue: 0: must be between"),
            "{e}"
        );
        let e = err(&f.replace("queue = 64", "colour = 1"));
        assert!(e.starts_with("link.toml:4: unknown field `colour`"), "{e}");
        let e = err(&f.replace(
            "metrics_addr = \"127.0.0.1:9102\"",
            "metrics_addr = \"127.0.0.1:0\"",
        ));
        assert!(
            e.starts_with("link.toml:3: metrics_addr: 127.0.0.1:0: the port must not be 0"),
            "{e}"
        );
        let e = err(&f.replace("key_file = \"/var/lib/ferry/link.key\"\n", ""));
        assert!(e.starts_with("link.toml: key_file: missing"), "{e}");
        let e = err(&f.replace("wireguard = \"127.0.0.1:51820\"\n", ""));
        assert!(
            e.starts_with("link.toml:14: peer[0].wireguard: missing"),
            "{e}"
        );
        let e = err(&f.replace(
            "url = \"http://10.0.0.1:3340/derp\"",
            "name = \"home\"\nurl = \"http://10.0.0.1:3340/derp\"",
        ));
        assert!(
            e.starts_with("link.toml:11: relay[1].name: \"home\" is already used by relay[0]"),
            "{e}"
        );
        let e = err(&f.replace("127.0.0.1:51001", "127.0.0.1:51820"));
        assert!(
            e.contains("peer[0].endpoint: 127.0.0.1:51820 is the local WireGuard's own address"),
            "{e}"
        );
        let e = err(&format!("key_file = \"k\"\n[[peer]]\nname = \"p\"\nlink_key = \"{KEY_A}\"\nendpoint = \"127.0.0.1:1\"\n"));
        assert!(e.starts_with("link.toml: relay: at least one"), "{e}");
        let e = err("key_file = \"k\"\n[[relay]]\nurl = \"http://r/derp\"\n");
        assert!(e.starts_with("link.toml: peer: at least one"), "{e}");
    }

    #[test]
    fn paths_bind_and_stun() {
        let f = full();
        let c = Config::from_toml("link.toml", &f).unwrap();
        assert_eq!(c.bind, "0.0.0.0:0".parse().unwrap());
        assert_eq!((c.peers[0].prefer, c.peers[0].only), (None, None));
        assert_eq!(c.relays[0].stun, None);
        let c = Config::from_toml(
            "link.toml",
            &f.replace("queue = 64", "bind = \"10.0.0.2:0\"")
                .replace(
                    "name = \"home\"",
                    "name = \"home\"\nstun = \"10.0.0.1:3479\"",
                )
                .replace("relay = \"relay1\"", "prefer = \"relay\"\nonly = \"relay\""),
        )
        .unwrap();
        assert_eq!(c.bind, "10.0.0.2:0".parse().unwrap());
        assert_eq!(c.relays[0].stun, Some("10.0.0.1:3479".parse().unwrap()));
        assert_eq!(c.peers[1].prefer, Some(PathKind::RelaySession));
        assert_eq!(c.peers[1].only, Some(PathKind::RelaySession));
        let e = err(&f.replace("relay = \"relay1\"", "only = \"udp\""));
        assert!(
            e.starts_with("link.toml:24: peer[1].only: \"udp\": the kinds of path are \"direct\""),
            "{e}"
        );
        let e = err(&f.replace("relay = \"relay1\"", "prefer = \"direct\"\nonly = \"derp\""));
        assert!(
            e.starts_with("link.toml:24: peer[1].prefer: \"direct\" contradicts only = \"derp\""),
            "{e}"
        );
        let e = err(&f.replace("queue = 64", "bind = \"any\""));
        assert!(
            e.starts_with("link.toml:4: bind: \"any\" is not an address"),
            "{e}"
        );
        let e = err(&f.replace("name = \"home\"", "name = \"home\"\nstun = \"10.0.0.1\""));
        assert!(e.starts_with("link.toml:8: relay[0].stun: "), "{e}");
    }
}
