//! Where a connection goes: a server named by a URL, or a node of a DERP
//! map (protocol reference §4.7, §15), reduced to what dialling needs.

use crate::Error;
use ferry_proto::derp_map::{AddrField, Node};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// How a TLS server's certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verify {
    /// WebPKI validation against the trusted roots, for this name (the
    /// host name, or a DERP node's `CertName`).
    Name(String),
    /// `CertName = "sha256-raw:<hex>"`: exactly one certificate besides the
    /// meta-certificate, whose SHA-256 is this, within its validity
    /// period; no CA involved.
    Pin([u8; 32]),
    /// A DERP node with `InsecureForTests`: any certificate.
    Insecure,
}

/// One DERP server to dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// TLS (`https://`, or a DERP map node) or plain HTTP.
    pub(crate) tls: Option<Verify>,
    /// The host name: `Host` header, TLS SNI, and what is resolved when no
    /// literal address is given.
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Literal addresses to dial instead of resolving `host`.
    pub(crate) addrs: Vec<IpAddr>,
    /// `Ideal-Node` header.
    pub(crate) ideal_node: Option<String>,
}

impl Target {
    /// A server named by `http://host[:port]/derp` (plain, port 80 by
    /// default) or `https://host[:port]/derp` (TLS, port 443), its
    /// certificate checked for `host`. The path may be `/derp` or empty.
    pub fn from_url(url: &str) -> Result<Target, Error> {
        let bad = |reason| Error::InvalidUrl {
            url: url.to_owned(),
            reason,
        };
        let (scheme, rest) = url.split_once("://").ok_or(bad("no scheme"))?;
        let (tls, default_port) = if scheme.eq_ignore_ascii_case("https") {
            (true, 443)
        } else if scheme.eq_ignore_ascii_case("http") {
            (false, 80)
        } else {
            return Err(bad("the scheme must be http or https"));
        };
        let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        if !matches!(path, "" | "/" | "/derp") {
            return Err(bad("the path must be /derp"));
        }
        if authority.contains('@') {
            return Err(bad("user information is not supported"));
        }
        let (host, port) = split_host_port(authority).ok_or(bad("malformed host or port"))?;
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = port.unwrap_or(default_port);
        let addrs = host
            .parse::<IpAddr>()
            .map(|ip| vec![ip])
            .unwrap_or_default();
        Ok(Target {
            tls: tls.then(|| Verify::Name(host.to_owned())),
            host: host.to_owned(),
            port,
            addrs,
            ideal_node: None,
        })
    }

    /// A DERP map node: TLS on `DERPPort` (443 when 0) unless
    /// `plain_http` (the equivalent of Go's `TS_DEBUG_USE_DERP_HTTP`, for
    /// development servers: port 3340 when `DERPPort` is 0). Literal
    /// `IPv4`/`IPv6` addresses are dialled, IPv4 first; otherwise
    /// `HostName` is resolved. The certificate is checked for `CertName`
    /// (a name or a `sha256-raw:` pin) or else `HostName`, or not at all
    /// with `InsecureForTests`.
    pub fn from_node(node: &Node, plain_http: bool) -> Result<Target, Error> {
        let no_address = || Error::NoAddress {
            node: node.name.clone(),
        };
        if node.stun_only {
            return Err(no_address());
        }
        let mut addrs = Vec::new();
        if let AddrField::Literal(a) = node.ipv4 {
            addrs.push(IpAddr::V4(a));
        }
        if let AddrField::Literal(a) = node.ipv6 {
            addrs.push(IpAddr::V6(a));
        }
        let resolve = node.ipv4 == AddrField::Resolve || node.ipv6 == AddrField::Resolve;
        if addrs.is_empty() && (!resolve || node.host_name.is_empty()) {
            return Err(no_address());
        }
        let host = if node.host_name.is_empty() {
            addrs[0].to_string()
        } else {
            node.host_name.clone()
        };
        let tls = if plain_http {
            None
        } else if node.insecure_for_tests {
            Some(Verify::Insecure)
        } else if let Some(hex) = node.cert_name.strip_prefix("sha256-raw:") {
            let pin = decode_pin(hex).ok_or_else(|| Error::TlsSetup {
                host: host.clone(),
                reason: format!("CertName pin {hex:?} is not 64 hex digits"),
            })?;
            Some(Verify::Pin(pin))
        } else if !node.cert_name.is_empty() {
            Some(Verify::Name(node.cert_name.clone()))
        } else {
            Some(Verify::Name(host.clone()))
        };
        let port = match (node.derp_port, plain_http) {
            (0, true) => 3340,
            _ => node.port(),
        };
        Ok(Target {
            tls,
            host,
            port,
            addrs,
            ideal_node: None,
        })
    }

    /// Whether the connection uses TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The host name (SNI, `Host` header).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `host:port`, as errors name the server.
    pub fn label(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The `Host` header: the host, with the port when it is not the
    /// scheme's default.
    pub(crate) fn host_header(&self) -> String {
        let default = if self.tls.is_some() { 443 } else { 80 };
        match (self.port == default, self.host.contains(':')) {
            (true, false) => self.host.clone(),
            (true, true) => format!("[{}]", self.host),
            (false, _) => self.label(),
        }
    }

    /// The addresses to try, in order.
    pub(crate) async fn resolve(&self) -> Result<Vec<SocketAddr>, Error> {
        if !self.addrs.is_empty() {
            return Ok(self
                .addrs
                .iter()
                .map(|ip| SocketAddr::new(*ip, self.port))
                .collect());
        }
        let found = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|e| Error::Resolve {
                host: self.host.clone(),
                source: Arc::new(e),
            })?;
        // IPv4 first, as the node's literal addresses are.
        let mut addrs: Vec<SocketAddr> = found.collect();
        addrs.sort_by_key(|a| a.is_ipv6());
        Ok(addrs)
    }
}

/// Splits `host[:port]` or `[v6][:port]`.
fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
        Some(_) => return None,
    };
    Some((host, port))
}

fn decode_pin(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::derp_map::DerpMap;

    #[test]
    fn urls() {
        let t = Target::from_url("http://127.0.0.1:3340/derp").unwrap();
        assert_eq!(
            (t.tls.is_none(), t.port, t.host_header()),
            (true, 3340, "127.0.0.1:3340".into())
        );
        assert_eq!(t.addrs, ["127.0.0.1".parse::<IpAddr>().unwrap()]);
        let t = Target::from_url("https://derp.example.com/derp").unwrap();
        assert_eq!(t.tls, Some(Verify::Name("derp.example.com".into())));
        assert_eq!((t.port, t.host_header()), (443, "derp.example.com".into()));
        assert!(t.addrs.is_empty());
        let t = Target::from_url("HTTPS://[::1]:8443").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.host_header()),
            ("::1", 8443, "[::1]:8443".into())
        );
        for bad in [
            "derp.example.com",
            "ftp://x/derp",
            "http://x/other",
            "http://u@x/derp",
            "http://x:99999/derp",
            "http://x:/derp",
            "http://:80/derp",
            "http://[::1/derp",
            "http://x/derp?q",
        ] {
            assert!(Target::from_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nodes() {
        let map = DerpMap::from_json(
            br#"{"Regions":{"1":{"Nodes":[
              {"Name":"a","HostName":"d.example","IPv4":"192.0.2.1","IPv6":"none"},
              {"Name":"b","HostName":"d.example","CertName":"other.example","DERPPort":8443},
              {"Name":"c","HostName":"d.example","IPv4":"none","IPv6":"none"},
              {"Name":"d","HostName":"d.example","CertName":"sha256-raw:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"},
              {"Name":"e","HostName":"d.example","InsecureForTests":true},
              {"Name":"f","HostName":"d.example","STUNOnly":true}
            ]}}}"#,
        )
        .unwrap();
        let n = &map.regions[&1].nodes;
        let a = Target::from_node(&n[0], false).unwrap();
        assert_eq!((a.port, a.addrs.len()), (443, 1));
        assert_eq!(a.tls, Some(Verify::Name("d.example".into())));
        let b = Target::from_node(&n[1], false).unwrap();
        assert_eq!((b.port, b.host.as_str()), (8443, "d.example"));
        assert_eq!(b.tls, Some(Verify::Name("other.example".into())));
        assert!(matches!(
            Target::from_node(&n[2], false),
            Err(Error::NoAddress { .. })
        ));
        let d = Target::from_node(&n[3], false).unwrap();
        assert!(matches!(d.tls, Some(Verify::Pin(p)) if p[1] == 0x11));
        assert_eq!(
            Target::from_node(&n[4], false).unwrap().tls,
            Some(Verify::Insecure)
        );
        assert!(Target::from_node(&n[5], false).is_err());
        let plain = Target::from_node(&n[0], true).unwrap();
        assert_eq!((plain.tls.is_none(), plain.port), (true, 3340));
    }
}
