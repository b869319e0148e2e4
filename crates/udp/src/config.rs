//! What a UDP relay is asked to do, from flags or a TOML file, checked
//! before anything is bound.
//!
//! Every item remembers the flag or file key it came from (`--target`,
//! `bounce[1].listen[0]`, `hub.peer[2].public_key`), so an error always
//! names the field to fix. The file format:
//!
//! ```toml
//! # Everything at the top level is optional.
//! workers = 0              # shard threads; 0 = one per usable core
//! gro = true               # UDP GRO on receive, if the kernel has it
//! gso = true               # UDP GSO on send, if the kernel has it
//! recv_buffer = 16777216   # bytes per socket (forced past rmem_max when permitted)
//! send_buffer = 16777216
//! handshake_rate = 20      # handshake messages per second per source (IPv4 address or IPv6 /64)
//! handshake_burst = 40
//! metrics_addr = "127.0.0.1:9101"
//!
//! [[bounce]]               # a static bounce; several are allowed
//! listen = [":51820", ":51821"]
//! target = "home.example.net:51820"
//! idle_timeout = "3m"      # a client's upstream socket closes after this long idle
//! resolve_interval = "1m"  # re-resolve a DNS target this often ("0": never)
//! wireguard_only = false   # forward only WireGuard-shaped datagrams
//! max_sessions = 65536
//!
//! [hub]                    # the receiver-index hub; at most one
//! listen = [":51830"]
//! max_indices = 65536
//!
//! [[hub.peer]]
//! name = "laptop"
//! public_key = "QJcvjTS0st3gR6WLSR9Rytg2QjCqcj+5hws4jAMiE1I="
//! allow = ["nas"]          # optional: whom it may talk to (default: every peer)
//! endpoint = "192.0.2.10:51820"   # optional: a fixed address, if it has one
//! ```

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ferry_proto::wireguard::{KeyError, PublicKey};
use serde::Deserialize;
use thiserror::Error;

/// Default idle time after which a bounce client is forgotten.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(180);
/// Default interval between re-resolutions of a DNS bounce target.
pub const DEFAULT_RESOLVE_INTERVAL: Duration = Duration::from_secs(60);
/// Default socket buffer size asked for (each direction, each socket).
pub const DEFAULT_BUFFER: usize = 16 << 20;
/// Largest socket buffer accepted (1 GiB; the kernel's own limit is 2 GiB,
/// and it doubles the request).
pub const MAX_BUFFER: usize = 1 << 30;

/// A relay's whole configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Static bounces.
    pub bounce: Vec<Bounce>,
    /// The receiver-index hub, if any.
    pub hub: Option<Hub>,
    /// Engine settings shared by every mode.
    pub tuning: Tuning,
    /// Where to serve Prometheus metrics (`/metrics`), if anywhere.
    pub metrics_addr: Option<SocketAddr>,
}

/// One listening address and the field it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listen {
    /// The address; `[::]` also accepts IPv4 where the host allows.
    pub addr: SocketAddr,
    /// Flag or key it came from, for errors.
    pub field: String,
}

/// A static bounce: every client of `listen` is relayed to `target`, each
/// through its own upstream socket.
#[derive(Clone, Debug, PartialEq)]
pub struct Bounce {
    /// Where clients send.
    pub listen: Vec<Listen>,
    /// `host:port`; a DNS name is re-resolved every `resolve_interval`.
    pub target: String,
    /// Field `target` came from.
    pub target_field: String,
    /// A client is forgotten (its upstream socket closed) after this long
    /// without traffic either way.
    pub idle_timeout: Duration,
    /// How often a DNS target is resolved again; zero disables.
    pub resolve_interval: Duration,
    /// Forward only WireGuard-shaped datagrams.
    pub wireguard_only: bool,
    /// Most concurrent clients (sessions) across all shards.
    pub max_sessions: usize,
}

/// The receiver-index hub.
#[derive(Clone, Debug, PartialEq)]
pub struct Hub {
    /// Where peers send.
    pub listen: Vec<Listen>,
    /// The peers that may use the hub.
    pub peers: Vec<HubPeer>,
    /// Most index entries (sessions and pending handshakes) in the hub,
    /// all shards together: each shard's replica holds every entry.
    pub max_indices: usize,
}

/// One WireGuard peer of the hub.
#[derive(Clone, Debug, PartialEq)]
pub struct HubPeer {
    /// A name for logs and `allow` lists.
    pub name: String,
    /// Its public key (MAC1 of handshakes to it is keyed with it).
    pub public_key: PublicKey,
    /// Names of the peers it may talk to; `None`: all of them.
    pub allow: Option<Vec<String>>,
    /// A fixed address, when the peer has one; others are learned.
    pub endpoint: Option<SocketAddr>,
    /// Field it came from.
    pub field: String,
}

/// Settings shared by every mode.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    /// Shard threads; 0 means one per usable core.
    pub workers: usize,
    /// Pin each shard to its own core.
    pub pin: bool,
    /// Use UDP GRO on receive when the kernel has it.
    pub gro: bool,
    /// Use UDP GSO on send when the kernel has it.
    pub gso: bool,
    /// Receive buffer per socket, bytes.
    pub recv_buffer: usize,
    /// Send buffer per socket, bytes.
    pub send_buffer: usize,
    /// Handshake messages per second allowed from one source IP.
    pub handshake_rate: u32,
    /// Burst of handshake messages allowed from one source IP.
    pub handshake_burst: u32,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            workers: 0,
            pin: true,
            gro: true,
            gso: true,
            recv_buffer: DEFAULT_BUFFER,
            send_buffer: DEFAULT_BUFFER,
            handshake_rate: 20,
            handshake_burst: 40,
        }
    }
}

/// A configuration mistake, naming the field.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// Neither a bounce nor a hub was configured.
    #[error("nothing to relay: give --listen with --target (bounce) or --peer (hub), or a --config file with [[bounce]] or [hub]")]
    NothingToDo,
    /// A mode has no listening address.
    #[error("{field}: at least one listen address is needed")]
    NoListen {
        /// The mode's field.
        field: String,
    },
    /// An address that does not parse.
    #[error("{field}: {value:?} is not an address ({why})")]
    BadAddress {
        /// Flag or key.
        field: String,
        /// What was given.
        value: String,
        /// What is expected.
        why: &'static str,
    },
    /// Two modes, or two entries, claim the same listening address.
    #[error("{field}: {addr} is already used by {other}; a listening address serves one bounce or the hub")]
    ListenConflict {
        /// The later claim.
        field: String,
        /// The address.
        addr: SocketAddr,
        /// The earlier claim.
        other: String,
    },
    /// Flags for different modes were mixed.
    #[error("{field} conflicts with {other}: {why}")]
    Conflict {
        /// One flag.
        field: String,
        /// The other flag.
        other: String,
        /// Why they cannot go together.
        why: &'static str,
    },
    /// A public key that does not parse.
    #[error("{field}: {error}")]
    BadKey {
        /// Key field.
        field: String,
        /// What is wrong with it.
        error: KeyError,
    },
    /// The same name or key twice among the hub's peers.
    #[error("{field}: {what} {value:?} is already used by {other}")]
    DuplicatePeer {
        /// The later peer.
        field: String,
        /// "name" or "public key".
        what: &'static str,
        /// The repeated value.
        value: String,
        /// The earlier peer.
        other: String,
    },
    /// An allow list names a peer that does not exist.
    #[error("{field}: no peer is named {name:?}")]
    UnknownPeer {
        /// The allow-list field.
        field: String,
        /// The unknown name.
        name: String,
    },
    /// A hub needs at least two peers to be useful.
    #[error("{field}: a hub needs at least two peers, got {got}")]
    TooFewPeers {
        /// The peers field.
        field: String,
        /// How many were given.
        got: usize,
    },
    /// A value out of its range.
    #[error("{field}: {why}")]
    OutOfRange {
        /// Flag or key.
        field: String,
        /// The rule broken.
        why: String,
    },
    /// A duration that does not parse.
    #[error("{field}: {value:?} is not a duration (like \"3m\", \"90s\", \"1m30s\", \"0\")")]
    BadDuration {
        /// Flag or key.
        field: String,
        /// What was given.
        value: String,
    },
    /// The file is not valid TOML for this format.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// The parser's message, after the key it is about where the
        /// position names one.
        message: String,
    },
}

/// Parses a Go-style duration ("3m", "1m30s", "250ms", "0").
pub use ferry_proto::godur::parse as parse_duration;

/// Parses a listening address: `:port` (every address), `ip:port`,
/// `[ipv6]:port` or `localhost:port`.
pub fn parse_listen(field: &str, s: &str) -> Result<Listen, ConfigError> {
    let bad = |why| ConfigError::BadAddress {
        field: field.to_string(),
        value: s.to_string(),
        why,
    };
    let addr = if let Some(port) = s.strip_prefix(':') {
        let port = port.parse().map_err(|_| bad("bad port"))?;
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)
    } else if let Some(port) = s.strip_prefix("localhost:") {
        let port = port.parse().map_err(|_| bad("bad port"))?;
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    } else {
        s.parse()
            .map_err(|_| bad("expected :port, ip:port or [ipv6]:port"))?
    };
    Ok(Listen {
        addr,
        field: field.to_string(),
    })
}

/// Checks that `target` looks like `host:port` (it is resolved when the
/// relay starts).
pub fn check_target(field: &str, target: &str) -> Result<(), ConfigError> {
    let bad = |why| ConfigError::BadAddress {
        field: field.to_string(),
        value: target.to_string(),
        why,
    };
    if target.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let (host, port) = target.rsplit_once(':').ok_or(bad("expected host:port"))?;
    match port.parse::<u16>() {
        Ok(0) => Err(bad("port 0 cannot be sent to")),
        Ok(_) if !host.is_empty() && !host.contains(':') => Ok(()),
        Ok(_) => Err(bad("expected host:port ([ipv6]:port for IPv6)")),
        Err(_) => Err(bad("bad port")),
    }
}

impl Config {
    /// Checks the whole configuration; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.bounce.is_empty() && self.hub.is_none() {
            return Err(ConfigError::NothingToDo);
        }
        let mut claimed: HashMap<SocketAddr, String> = HashMap::new();
        let mut claim = |l: &Listen| -> Result<(), ConfigError> {
            if l.addr.port() != 0 {
                if let Some(other) = claimed.insert(l.addr, l.field.clone()) {
                    return Err(ConfigError::ListenConflict {
                        field: l.field.clone(),
                        addr: l.addr,
                        other,
                    });
                }
            }
            Ok(())
        };
        for (i, b) in self.bounce.iter().enumerate() {
            if b.listen.is_empty() {
                return Err(ConfigError::NoListen {
                    field: format!("bounce[{i}].listen"),
                });
            }
            for l in &b.listen {
                claim(l)?;
            }
            check_target(&b.target_field, &b.target)?;
            if b.idle_timeout.is_zero() {
                return Err(ConfigError::OutOfRange {
                    field: format!("bounce[{i}].idle_timeout"),
                    why: "must be positive".into(),
                });
            }
            if b.max_sessions == 0 {
                return Err(ConfigError::OutOfRange {
                    field: format!("bounce[{i}].max_sessions"),
                    why: "must be positive".into(),
                });
            }
        }
        if let Some(h) = &self.hub {
            if h.listen.is_empty() {
                return Err(ConfigError::NoListen {
                    field: "hub.listen".into(),
                });
            }
            for l in &h.listen {
                claim(l)?;
            }
            if h.peers.len() < 2 {
                return Err(ConfigError::TooFewPeers {
                    field: "hub.peer".into(),
                    got: h.peers.len(),
                });
            }
            if h.peers.len() > usize::from(u16::MAX) {
                return Err(ConfigError::OutOfRange {
                    field: "hub.peer".into(),
                    why: format!("at most {} peers", u16::MAX),
                });
            }
            if h.max_indices < 16 {
                return Err(ConfigError::OutOfRange {
                    field: "hub.max_indices".into(),
                    why: "must be at least 16".into(),
                });
            }
            let mut names: HashMap<&str, &str> = HashMap::new();
            let mut keys: HashMap<PublicKey, &str> = HashMap::new();
            for p in &h.peers {
                if let Some(other) = names.insert(&p.name, &p.field) {
                    return Err(ConfigError::DuplicatePeer {
                        field: p.field.clone(),
                        what: "name",
                        value: p.name.clone(),
                        other: other.to_string(),
                    });
                }
                if let Some(other) = keys.insert(p.public_key, &p.field) {
                    return Err(ConfigError::DuplicatePeer {
                        field: p.field.clone(),
                        what: "public key",
                        value: p.public_key.to_base64(),
                        other: other.to_string(),
                    });
                }
            }
            let known: HashSet<&str> = h.peers.iter().map(|p| p.name.as_str()).collect();
            for p in &h.peers {
                for name in p.allow.iter().flatten() {
                    if !known.contains(name.as_str()) {
                        return Err(ConfigError::UnknownPeer {
                            field: format!("{}.allow", p.field),
                            name: name.clone(),
                        });
                    }
                }
            }
        }
        let t = &self.tuning;
        if t.workers > 1024 {
            return Err(ConfigError::OutOfRange {
                field: "workers".into(),
                why: "at most 1024".into(),
            });
        }
        if t.handshake_rate == 0 || t.handshake_burst == 0 {
            return Err(ConfigError::OutOfRange {
                field: "handshake_rate".into(),
                why: "handshake_rate and handshake_burst must be positive".into(),
            });
        }
        for (field, bytes) in [
            ("recv_buffer", t.recv_buffer),
            ("send_buffer", t.send_buffer),
        ] {
            if bytes == 0 || bytes > MAX_BUFFER {
                return Err(ConfigError::OutOfRange {
                    field: field.into(),
                    why: format!("{bytes}: a socket buffer must be 1 to {MAX_BUFFER} bytes"),
                });
            }
        }
        Ok(())
    }

    /// Parses and validates a TOML configuration file's text; `path` is used
    /// in error messages.
    pub fn from_toml(path: &str, text: &str) -> Result<Config, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            let message = e.message().trim_end();
            match e.span() {
                Some(span) => ConfigError::File {
                    path: format!("{path}:{}", 1 + text[..span.start].matches('\n').count()),
                    message: match crate::toml_key::key_at(text, span.start) {
                        Some(key) => format!("{key}: {message}"),
                        None => message.to_string(),
                    },
                },
                None => ConfigError::File {
                    path: path.to_string(),
                    message: message.to_string(),
                },
            }
        })?;
        let defaults = Tuning::default();
        let tuning = Tuning {
            workers: file.workers.unwrap_or(defaults.workers),
            pin: file.pin.unwrap_or(defaults.pin),
            gro: file.gro.unwrap_or(defaults.gro),
            gso: file.gso.unwrap_or(defaults.gso),
            recv_buffer: file.recv_buffer.unwrap_or(defaults.recv_buffer),
            send_buffer: file.send_buffer.unwrap_or(defaults.send_buffer),
            handshake_rate: file.handshake_rate.unwrap_or(defaults.handshake_rate),
            handshake_burst: file.handshake_burst.unwrap_or(defaults.handshake_burst),
        };
        let metrics_addr = file
            .metrics_addr
            .as_deref()
            .map(|s| parse_listen("metrics_addr", s).map(|l| l.addr))
            .transpose()?;
        let duration = |field: String, v: Option<&str>, default: Duration| match v {
            None => Ok(default),
            Some(s) => parse_duration(s).ok_or(ConfigError::BadDuration {
                field,
                value: s.to_string(),
            }),
        };
        let listens = |field: &str, v: &[String]| -> Result<Vec<Listen>, ConfigError> {
            v.iter()
                .enumerate()
                .map(|(i, s)| parse_listen(&format!("{field}[{i}]"), s))
                .collect()
        };
        let mut bounce = Vec::new();
        for (i, b) in file.bounce.iter().enumerate() {
            bounce.push(Bounce {
                listen: listens(&format!("bounce[{i}].listen"), &b.listen)?,
                target: b.target.clone(),
                target_field: format!("bounce[{i}].target"),
                idle_timeout: duration(
                    format!("bounce[{i}].idle_timeout"),
                    b.idle_timeout.as_deref(),
                    DEFAULT_IDLE_TIMEOUT,
                )?,
                resolve_interval: duration(
                    format!("bounce[{i}].resolve_interval"),
                    b.resolve_interval.as_deref(),
                    DEFAULT_RESOLVE_INTERVAL,
                )?,
                wireguard_only: b.wireguard_only.unwrap_or(false),
                max_sessions: b.max_sessions.unwrap_or(65536),
            });
        }
        let hub = match &file.hub {
            None => None,
            Some(h) => {
                let mut peers = Vec::new();
                for (i, p) in h.peer.iter().enumerate() {
                    let field = format!("hub.peer[{i}]");
                    let public_key = PublicKey::from_base64(&p.public_key).map_err(|error| {
                        ConfigError::BadKey {
                            field: format!("{field}.public_key"),
                            error,
                        }
                    })?;
                    let endpoint = p
                        .endpoint
                        .as_deref()
                        .map(|s| {
                            s.parse().map_err(|_| ConfigError::BadAddress {
                                field: format!("{field}.endpoint"),
                                value: s.to_string(),
                                why: "expected ip:port",
                            })
                        })
                        .transpose()?;
                    peers.push(HubPeer {
                        name: p.name.clone().unwrap_or_else(|| format!("peer{i}")),
                        public_key,
                        allow: p.allow.clone(),
                        endpoint,
                        field,
                    });
                }
                Some(Hub {
                    listen: listens("hub.listen", &h.listen)?,
                    peers,
                    max_indices: h.max_indices.unwrap_or(65536),
                })
            }
        };
        let config = Config {
            bounce,
            hub,
            tuning,
            metrics_addr,
        };
        config.validate()?;
        Ok(config)
    }
}

/// One difference between two configurations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// `field: old -> new`, or `hub.peer "nas": added`.
    pub text: String,
    /// Whether a running relay applies it ([`crate::Relay::reconfigure`]);
    /// otherwise it needs a restart.
    pub live: bool,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Top-level fields a running relay applies (besides the hub's peers).
const LIVE_FIELDS: [&str; 3] = ["handshake_rate", "handshake_burst", "hub.max_indices"];

impl Config {
    /// What differs from `self` in `new`, one line per field, as
    /// `field: old -> new` (hub peers by name: `hub.peer "nas": added`).
    /// Empty when nothing changed. For logging a re-read file.
    pub fn changes(&self, new: &Config) -> Vec<Change> {
        let mut out = Vec::new();
        let mut field = |name: &str, old: String, new: String| {
            if old != new {
                out.push(Change {
                    text: format!("{name}: {old} -> {new}"),
                    live: LIVE_FIELDS.contains(&name),
                });
            }
        };
        let (t, u) = (&self.tuning, &new.tuning);
        field("workers", t.workers.to_string(), u.workers.to_string());
        field("pin", t.pin.to_string(), u.pin.to_string());
        field("gro", t.gro.to_string(), u.gro.to_string());
        field("gso", t.gso.to_string(), u.gso.to_string());
        field(
            "recv_buffer",
            t.recv_buffer.to_string(),
            u.recv_buffer.to_string(),
        );
        field(
            "send_buffer",
            t.send_buffer.to_string(),
            u.send_buffer.to_string(),
        );
        field(
            "handshake_rate",
            t.handshake_rate.to_string(),
            u.handshake_rate.to_string(),
        );
        field(
            "handshake_burst",
            t.handshake_burst.to_string(),
            u.handshake_burst.to_string(),
        );
        field(
            "metrics_addr",
            or_none(self.metrics_addr),
            or_none(new.metrics_addr),
        );
        field(
            "bounce",
            format!("{} entries", self.bounce.len()),
            format!("{} entries", new.bounce.len()),
        );
        for (i, (a, b)) in self.bounce.iter().zip(&new.bounce).enumerate() {
            field(
                &format!("bounce[{i}].listen"),
                listens(&a.listen),
                listens(&b.listen),
            );
            field(
                &format!("bounce[{i}].target"),
                a.target.clone(),
                b.target.clone(),
            );
            field(
                &format!("bounce[{i}].idle_timeout"),
                format!("{:?}", a.idle_timeout),
                format!("{:?}", b.idle_timeout),
            );
            field(
                &format!("bounce[{i}].resolve_interval"),
                format!("{:?}", a.resolve_interval),
                format!("{:?}", b.resolve_interval),
            );
            field(
                &format!("bounce[{i}].wireguard_only"),
                a.wireguard_only.to_string(),
                b.wireguard_only.to_string(),
            );
            field(
                &format!("bounce[{i}].max_sessions"),
                a.max_sessions.to_string(),
                b.max_sessions.to_string(),
            );
        }
        match (&self.hub, &new.hub) {
            (None, None) => {}
            (Some(_), None) => out.push(Change {
                text: "hub: removed".into(),
                live: false,
            }),
            (None, Some(_)) => out.push(Change {
                text: "hub: added".into(),
                live: false,
            }),
            (Some(a), Some(b)) => {
                field("hub.listen", listens(&a.listen), listens(&b.listen));
                field(
                    "hub.max_indices",
                    a.max_indices.to_string(),
                    b.max_indices.to_string(),
                );
                let mut peer_change = |text: String| out.push(Change { text, live: true });
                for p in &a.peers {
                    let name = &p.name;
                    match b.peers.iter().find(|q| q.name == p.name) {
                        None => peer_change(format!("hub.peer {name:?}: removed")),
                        Some(q) => {
                            let mut peer = |what: &str, old: String, new: String| {
                                if old != new {
                                    peer_change(format!(
                                        "hub.peer {name:?}.{what}: {old} -> {new}"
                                    ));
                                }
                            };
                            peer(
                                "public_key",
                                p.public_key.to_base64(),
                                q.public_key.to_base64(),
                            );
                            peer("allow", allow(&p.allow), allow(&q.allow));
                            peer("endpoint", or_none(p.endpoint), or_none(q.endpoint));
                        }
                    }
                }
                for q in &b.peers {
                    if !a.peers.iter().any(|p| p.name == q.name) {
                        peer_change(format!("hub.peer {:?}: added", q.name));
                    }
                }
            }
        }
        out
    }

    /// The configuration a relay started with `self` runs after applying
    /// `new` ([`crate::Relay::reconfigure`]): `new`'s live parts, `self`'s
    /// everything else, so that what still needs a restart keeps showing
    /// as a change.
    pub fn with_live_parts_of(&self, new: &Config) -> Config {
        let mut out = self.clone();
        out.tuning.handshake_rate = new.tuning.handshake_rate;
        out.tuning.handshake_burst = new.tuning.handshake_burst;
        if let (Some(h), Some(n)) = (&mut out.hub, &new.hub) {
            h.peers = n.peers.clone();
            h.max_indices = n.max_indices;
        }
        out
    }
}

fn or_none(addr: Option<SocketAddr>) -> String {
    addr.map_or("none".into(), |a| a.to_string())
}

fn listens(l: &[Listen]) -> String {
    let addrs: Vec<String> = l.iter().map(|l| l.addr.to_string()).collect();
    format!("[{}]", addrs.join(", "))
}

fn allow(names: &Option<Vec<String>>) -> String {
    match names {
        None => "every peer".into(),
        Some(n) => format!("[{}]", n.join(", ")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    workers: Option<usize>,
    pin: Option<bool>,
    gro: Option<bool>,
    gso: Option<bool>,
    recv_buffer: Option<usize>,
    send_buffer: Option<usize>,
    handshake_rate: Option<u32>,
    handshake_burst: Option<u32>,
    metrics_addr: Option<String>,
    #[serde(default)]
    bounce: Vec<FileBounce>,
    hub: Option<FileHub>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBounce {
    listen: Vec<String>,
    target: String,
    idle_timeout: Option<String>,
    resolve_interval: Option<String>,
    wireguard_only: Option<bool>,
    max_sessions: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHub {
    listen: Vec<String>,
    max_indices: Option<usize>,
    #[serde(default)]
    peer: Vec<FilePeer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePeer {
    name: Option<String>,
    public_key: String,
    allow: Option<Vec<String>>,
    endpoint: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "QJcvjTS0st3gR6WLSR9Rytg2QjCqcj+5hws4jAMiE1I=";
    const B: &str = "2U8lQNjeBL0yOxqE5T323qgIdDE7NgTDB370HDIKG0s=";

    #[test]
    fn durations() {
        assert_eq!(parse_duration("3m"), Some(Duration::from_secs(180)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("1x"), None);
        assert_eq!(parse_duration(""), None);
    }

    #[test]
    fn listen_and_target_syntax() {
        assert_eq!(
            parse_listen("--listen", ":51820").unwrap().addr,
            "[::]:51820".parse().unwrap()
        );
        assert_eq!(
            parse_listen("--listen", "10.0.0.1:1").unwrap().addr,
            "10.0.0.1:1".parse().unwrap()
        );
        let e = parse_listen("--listen", "nope").unwrap_err().to_string();
        assert!(e.starts_with("--listen: \"nope\""), "{e}");
        assert!(check_target("--target", "vpn.example.com:51820").is_ok());
        assert!(check_target("--target", "[2001:db8::1]:51820").is_ok());
        assert!(check_target("--target", "vpn.example.com").is_err());
        assert!(check_target("--target", "host:0").is_err());
        assert!(check_target("--target", "2001:db8::1:51820").is_err());
    }

    #[test]
    fn full_file_parses() {
        let text = format!(
            r#"
workers = 2
gro = false
metrics_addr = "127.0.0.1:9101"

[[bounce]]
listen = [":51820", "127.0.0.1:51821"]
target = "home.example.net:51820"
idle_timeout = "90s"

[hub]
listen = [":51830"]

[[hub.peer]]
name = "laptop"
public_key = "{A}"
allow = ["nas"]

[[hub.peer]]
name = "nas"
public_key = "{B}"
endpoint = "192.0.2.10:51820"
"#
        );
        let c = Config::from_toml("relay.toml", &text).unwrap();
        assert_eq!(c.tuning.workers, 2);
        assert!(!c.tuning.gro);
        assert!(c.tuning.gso);
        assert_eq!(c.bounce.len(), 1);
        assert_eq!(c.bounce[0].listen.len(), 2);
        assert_eq!(c.bounce[0].listen[1].field, "bounce[0].listen[1]");
        assert_eq!(c.bounce[0].idle_timeout, Duration::from_secs(90));
        assert_eq!(c.bounce[0].resolve_interval, DEFAULT_RESOLVE_INTERVAL);
        let h = c.hub.unwrap();
        assert_eq!(h.peers[0].allow.as_deref(), Some(&["nas".to_string()][..]));
        assert_eq!(
            h.peers[1].endpoint,
            Some("192.0.2.10:51820".parse().unwrap())
        );
    }

    #[test]
    fn errors_name_the_field() {
        let err = |text: &str| Config::from_toml("f.toml", text).unwrap_err().to_string();
        let e = err("[[bounce]]\nlisten = [\":1\"]\ntarget = \"x\"\n");
        assert!(e.starts_with("bounce[0].target:"), "{e}");
        let e = err("[[bounce]]\nlisten = [\":1\"]\ntarget = \"x:1\"\nidle_timeout = \"soon\"\n");
        assert!(e.starts_with("bounce[0].idle_timeout:"), "{e}");
        let e = err("[[bounce]]\nlisten = [\":1\"]\ntarget = \"x:1\"\ncolour = 1\n");
        assert!(
            e.starts_with("f.toml:4: bounce[0].colour: unknown field `colour`"),
            "{e}"
        );
        let e = err("[[bounce]]\nlisten = [\":1\"]\ntarget = \"x:1\"\nmax_sessions = \"x\"\n");
        assert!(
            e.starts_with("f.toml:4: bounce[0].max_sessions: invalid type"),
            "{e}"
        );
        let e = err(&format!(
            "[[bounce]]\nlisten = [\":1\"]\ntarget = \"x:1\"\n[hub]\nlisten = [\":1\"]\n[[hub.peer]]\npublic_key = \"{A}\"\n[[hub.peer]]\npublic_key = \"{B}\"\n"
        ));
        assert!(
            e.starts_with("hub.listen[0]:") && e.contains("bounce[0].listen[0]"),
            "{e}"
        );
        let e = err(&format!(
            "[hub]\nlisten = [\":1\"]\n[[hub.peer]]\npublic_key = \"{A}\"\n[[hub.peer]]\npublic_key = \"short\"\n"
        ));
        assert!(e.starts_with("hub.peer[1].public_key:"), "{e}");
        let e = err(&format!(
            "[hub]\nlisten = [\":1\"]\n[[hub.peer]]\npublic_key = \"{A}\"\n[[hub.peer]]\npublic_key = \"{A}\"\n"
        ));
        assert!(
            e.starts_with("hub.peer[1]:") && e.contains("hub.peer[0]"),
            "{e}"
        );
        let e = err(&format!(
            "[hub]\nlisten = [\":1\"]\n[[hub.peer]]\npublic_key = \"{A}\"\nallow = [\"ghost\"]\n[[hub.peer]]\npublic_key = \"{B}\"\n"
        ));
        assert!(
            e.starts_with("hub.peer[0].allow:") && e.contains("ghost"),
            "{e}"
        );
        let e = err(&format!(
            "[hub]\nlisten = [\":1\"]\n[[hub.peer]]\npublic_key = \"{A}\"\n"
        ));
        assert!(e.starts_with("hub.peer:"), "{e}");
        assert!(err("").contains("nothing to relay"));
        let e = err("send_buffer = 0\n[[bounce]]\nlisten = [\":1\"]\ntarget = \"x:1\"\n");
        assert!(e.starts_with("send_buffer: 0:"), "{e}");
        let e = err("recv_buffer = 4294967296\n[[bounce]]\nlisten = [\":1\"]\ntarget = \"x:1\"\n");
        assert!(
            e.starts_with("recv_buffer: 4294967296: a socket buffer must be"),
            "{e}"
        );
    }

    #[test]
    fn changes_name_each_field() {
        let file = |rate: u32, nas_allow: &str, extra: &str| {
            format!(
                "handshake_rate = {rate}\n[hub]\nlisten = [\":51830\"]\n\
                 [[hub.peer]]\nname = \"laptop\"\npublic_key = \"{A}\"\n\
                 [[hub.peer]]\nname = \"nas\"\npublic_key = \"{B}\"\n{nas_allow}\n{extra}"
            )
        };
        let old = Config::from_toml("f", &file(20, "", "")).unwrap();
        assert!(old.changes(&old).is_empty());
        let text = |c: Vec<Change>| -> Vec<(String, bool)> {
            c.into_iter().map(|c| (c.text, c.live)).collect()
        };
        const C: &str = "+J8YptlHwfXAAv/hvlXWeHdkjXZXvgpFtN8T/nPcWEo=";
        let new = Config::from_toml(
            "f",
            &file(
                30,
                "allow = [\"laptop\"]",
                &format!("[[hub.peer]]\nname = \"phone\"\npublic_key = \"{C}\"\n"),
            ),
        )
        .unwrap();
        assert_eq!(
            text(old.changes(&new)),
            [
                ("handshake_rate: 20 -> 30".into(), true),
                (
                    "hub.peer \"nas\".allow: every peer -> [laptop]".into(),
                    true
                ),
                ("hub.peer \"phone\": added".into(), true),
            ]
        );
        assert_eq!(new.changes(&old)[2].text, "hub.peer \"phone\": removed");
        // Listening addresses need a restart, so they still differ after
        // the live parts were taken.
        let moved = Config::from_toml("f", &file(30, "", "").replace(":51830", ":51831")).unwrap();
        assert_eq!(
            text(old.changes(&moved)),
            [
                ("handshake_rate: 20 -> 30".into(), true),
                ("hub.listen: [[::]:51830] -> [[::]:51831]".into(), false),
            ]
        );
        let running = old.with_live_parts_of(&moved);
        assert_eq!(
            text(running.changes(&moved)),
            [("hub.listen: [[::]:51830] -> [[::]:51831]".into(), false)]
        );
    }
}
