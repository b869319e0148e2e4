//! The mesh peers this relay dials: derper's `--mesh-with` list, parsed.

use std::fmt;

/// One `--mesh-with` entry: `host[:port]`, or `name[:port]/dialhost` to
/// connect to `dialhost` while naming `name` in TLS and `Host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshPeer {
    /// TLS server name and `Host` header, without the port.
    pub name: String,
    /// Where to connect (host name or IP), without the port.
    pub dial: String,
    /// TCP port (443 unless the name gives one).
    pub port: u16,
}

/// A malformed `--mesh-with` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--mesh-with entry {entry:?}: {why}")]
pub struct MeshPeerError {
    entry: String,
    why: &'static str,
}

impl MeshPeer {
    /// Parses derper's `--mesh-with` list: comma-separated entries, each
    /// `host[:port]` or `name[:port]/dialhost`. Empty entries are skipped.
    pub fn parse_list(list: &str) -> Result<Vec<MeshPeer>, MeshPeerError> {
        list.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(MeshPeer::parse)
            .collect()
    }

    /// Parses one entry.
    pub fn parse(entry: &str) -> Result<MeshPeer, MeshPeerError> {
        let err = |why| MeshPeerError {
            entry: entry.to_owned(),
            why,
        };
        let mut parts = entry.split('/');
        let named = parts.next().unwrap_or_default();
        let dial = parts.next();
        if parts.next().is_some() {
            return Err(err("too many '/' (expected host or name/dialhost)"));
        }
        let (name, port) = split_port(named).ok_or_else(|| err("bad port"))?;
        if name.is_empty() {
            return Err(err("empty host name"));
        }
        let dial = match dial {
            Some("") => return Err(err("empty dial host")),
            Some(d) => d.trim_start_matches('[').trim_end_matches(']').to_owned(),
            None => name.clone(),
        };
        Ok(MeshPeer {
            name,
            dial,
            port: port.unwrap_or(443),
        })
    }

    /// The `Host` header: the name, with the port unless it is 443.
    pub fn host_header(&self) -> String {
        let name = if self.name.contains(':') {
            format!("[{}]", self.name)
        } else {
            self.name.clone()
        };
        if self.port == 443 {
            name
        } else {
            format!("{name}:{}", self.port)
        }
    }
}

impl fmt::Display for MeshPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.host_header())?;
        if self.dial != self.name {
            write!(f, " via {}", self.dial)?;
        }
        Ok(())
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address.
fn split_port(s: &str) -> Option<(String, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host.to_owned(), None)),
            p => Some((host.to_owned(), Some(p.strip_prefix(':')?.parse().ok()?))),
        };
    }
    match s.matches(':').count() {
        0 => Some((s.to_owned(), None)),
        1 => {
            let (h, p) = s.split_once(':')?;
            Some((h.to_owned(), Some(p.parse().ok()?)))
        }
        _ => Some((s.to_owned(), None)), // a bare IPv6 address
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_derpers_mesh_with_syntax() {
        let peers = MeshPeer::parse_list(
            "a.example.com, b.example.com:8443,c.example.com/10.0.0.3,,[::1]:444/::1",
        )
        .unwrap();
        assert_eq!(
            peers,
            vec![
                MeshPeer {
                    name: "a.example.com".into(),
                    dial: "a.example.com".into(),
                    port: 443
                },
                MeshPeer {
                    name: "b.example.com".into(),
                    dial: "b.example.com".into(),
                    port: 8443
                },
                MeshPeer {
                    name: "c.example.com".into(),
                    dial: "10.0.0.3".into(),
                    port: 443
                },
                MeshPeer {
                    name: "::1".into(),
                    dial: "::1".into(),
                    port: 444
                },
            ]
        );
        assert_eq!(peers[1].host_header(), "b.example.com:8443");
        assert_eq!(peers[0].host_header(), "a.example.com");
        assert_eq!(peers[3].host_header(), "[::1]:444");
        assert_eq!(peers[2].to_string(), "c.example.com via 10.0.0.3");
    }

    #[test]
    fn refuses_malformed_entries() {
        for bad in ["a/b/c", "a:notaport", "/x", "a/", ":443"] {
            let e = MeshPeer::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("--mesh-with entry"), "{bad}: {e}");
        }
    }
}
