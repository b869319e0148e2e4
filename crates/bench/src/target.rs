//! The server under test: where to dial, and how (plain or TLS).
//!
//! A target is given as a URL, `http://127.0.0.1:3340` or
//! `https://localhost:8443` (a `/derp` path is implied). Over `https` the
//! client sends the URL's host as SNI and verifies the server's certificate
//! against `--ca` (a PEM file holding the CA or the self-signed certificate
//! itself); `--insecure` skips the chain check (the handshake's signatures
//! are still verified, so the server must hold the key of the certificate
//! it shows) and is recorded as such in every report.
//!
//! The TLS client prefers AES-128-GCM, as Go's TLS stack does on hardware
//! with AES instructions, so that a Go server (which picks its own
//! preference) and a rustls server (which honours the client's) negotiate
//! the same cipher suite and the comparison is like for like. Session
//! resumption is off: every connection pays a full handshake, as Tailscale
//! clients do against a relay.

use anyhow::{anyhow, bail, Context, Result};
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A DERP server to connect to.
#[derive(Clone)]
pub struct Target {
    /// The URL as given (normalised to end in `/derp`).
    pub url: String,
    /// The address dialled.
    pub addr: SocketAddr,
    /// Host for the `Host` header and SNI.
    pub host: String,
    /// TLS client configuration; `None` for plain HTTP.
    pub tls: Option<Arc<ClientConfig>>,
    /// SNI / verification name (TLS only).
    pub server_name: Option<ServerName<'static>>,
    /// Certificate verification is disabled.
    pub insecure: bool,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &self.url)
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .field("insecure", &self.insecure)
            .finish()
    }
}

/// The parts of a server URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedUrl {
    /// `https`.
    pub tls: bool,
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// Port (default 80 / 443).
    pub port: u16,
}

/// Parses `http://host[:port][/derp]` or `https://…`.
pub fn parse_url(url: &str) -> Result<ParsedUrl> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        bail!("server URL {url:?}: expected http://host:port or https://host:port");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if !(path.is_empty() || path == "/" || path == "/derp") {
        bail!("server URL {url:?}: the path must be /derp (or nothing)");
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| anyhow!("server URL {url:?}: unclosed [ in the host"))?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        bail!("server URL {url:?}: no host");
    }
    let port = match port {
        Some(p) => p
            .parse()
            .map_err(|_| anyhow!("server URL {url:?}: bad port {p:?}"))?,
        None if tls => 443,
        None => 80,
    };
    Ok(ParsedUrl {
        tls,
        host: host.to_owned(),
        port,
    })
}

impl Target {
    /// The error for a server that cannot be reached at all, with `why`.
    pub fn unreachable(&self, why: impl std::fmt::Display) -> anyhow::Error {
        anyhow!(
            "cannot reach the server at {} ({}): {why}",
            self.addr,
            self.url
        )
    }

    /// Resolves `url` (or dials `connect` instead) and builds the TLS
    /// configuration for `https`: trusting the certificates in `ca`, or
    /// none at all with `insecure`.
    pub fn new(
        url: &str,
        connect: Option<SocketAddr>,
        ca: Option<&Path>,
        insecure: bool,
    ) -> Result<Self> {
        let u = parse_url(url)?;
        let addr = match connect {
            Some(a) => a,
            None => resolve(&u.host, u.port)?,
        };
        let (tls, server_name) = if u.tls {
            let name = ServerName::try_from(u.host.clone()).with_context(|| {
                format!(
                    "server URL {url:?}: {:?} is not a valid TLS server name",
                    u.host
                )
            })?;
            let config = client_config(ca, insecure)?;
            (Some(Arc::new(config)), Some(name))
        } else {
            if ca.is_some() || insecure {
                bail!("--ca and --insecure only apply to https:// servers");
            }
            (None, None)
        };
        let host = if u.host.contains(':') {
            format!("[{}]", u.host)
        } else {
            u.host.clone()
        };
        let default_port = if u.tls { 443 } else { 80 };
        let host = if u.port == default_port {
            host
        } else {
            format!("{host}:{}", u.port)
        };
        Ok(Target {
            url: format!("{}://{}/derp", if u.tls { "https" } else { "http" }, host),
            addr,
            host,
            tls,
            server_name,
            insecure,
        })
    }

    /// Connects to the server over a socket whose receive buffer is
    /// `rcvbuf` bytes, set before the connect so the window the client
    /// advertises never grows past it (a stuck receiver's buffer fills at
    /// once). The connect itself blocks, for at most `timeout`; the socket
    /// is returned non-blocking, ready for [`crate::conn::Link::connect_over`].
    pub fn dial_with_rcvbuf(
        &self,
        rcvbuf: usize,
        timeout: Duration,
    ) -> std::io::Result<mio::net::TcpStream> {
        let sock = Socket::new(
            Domain::for_address(self.addr),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        sock.set_recv_buffer_size(rcvbuf)?;
        sock.connect_timeout(&self.addr.into(), timeout)?;
        sock.set_nonblocking(true)?;
        Ok(mio::net::TcpStream::from_std(sock.into()))
    }
}

/// Resolves a host, preferring IPv4 (servers under test listen on
/// 127.0.0.1; `localhost` may resolve to ::1 first).
fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {host:?}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| anyhow!("{host:?} resolves to no address"))
}

/// The crypto provider with AES-128-GCM first (see the module docs).
fn provider() -> CryptoProvider {
    let mut p = aws_lc_rs::default_provider();
    let rank = |s: &rustls::SupportedCipherSuite| match s.suite() {
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 3,
        _ => 4,
    };
    p.cipher_suites.sort_by_key(rank);
    p
}

fn client_config(ca: Option<&Path>, insecure: bool) -> Result<ClientConfig> {
    let provider = Arc::new(provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS configuration")?;
    let mut config = match (ca, insecure) {
        (Some(_), true) => bail!("give either --ca or --insecure, not both"),
        (None, false) => bail!(
            "an https:// server needs --ca FILE (PEM certificate or CA to trust) or --insecure (no verification)"
        ),
        (None, true) => builder
            .dangerous()
            // Accepts any chain; handshake signatures are still checked, so
            // the server must hold the key of the certificate it shows.
            .with_custom_certificate_verifier(Arc::new(ferry_client::ChainVerifier::accept_any(provider)))
            .with_no_client_auth(),
        (Some(path), false) => {
            let mut roots = RootCertStore::empty();
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .with_context(|| format!("--ca {}: cannot read", path.display()))?
                .collect::<Result<_, _>>()
                .with_context(|| format!("--ca {}: not a PEM certificate file", path.display()))?;
            if certs.is_empty() {
                bail!("--ca {}: no certificate in the file", path.display());
            }
            for c in certs {
                roots
                    .add(c)
                    .with_context(|| format!("--ca {}: unusable certificate", path.display()))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("http://127.0.0.1:3340").unwrap();
        assert_eq!(
            u,
            ParsedUrl {
                tls: false,
                host: "127.0.0.1".into(),
                port: 3340
            }
        );
        let u = parse_url("https://localhost/derp").unwrap();
        assert_eq!(
            u,
            ParsedUrl {
                tls: true,
                host: "localhost".into(),
                port: 443
            }
        );
        let u = parse_url("http://[::1]:80/").unwrap();
        assert_eq!(u.host, "::1");
        assert!(parse_url("ftp://x").is_err());
        assert!(parse_url("http://x:99999").is_err());
        assert!(parse_url("http://x/other").is_err());
        assert!(parse_url("http://:80").is_err());
    }

    #[test]
    fn targets() {
        let t = Target::new("http://127.0.0.1:3340", None, None, false).unwrap();
        assert_eq!(t.addr, "127.0.0.1:3340".parse().unwrap());
        assert_eq!(t.url, "http://127.0.0.1:3340/derp");
        assert_eq!(t.host, "127.0.0.1:3340", "the Host header of the upgrade");
        let err = Target::new("https://localhost:1", None, None, false).unwrap_err();
        assert!(err.to_string().contains("--ca"), "{err}");
        let t = Target::new(
            "https://localhost:8443",
            Some("127.0.0.1:8443".parse().unwrap()),
            None,
            true,
        )
        .unwrap();
        assert!(t.tls.is_some() && t.insecure);
        assert!(Target::new("http://127.0.0.1:1", None, None, true).is_err());
        let suites = provider().cipher_suites;
        assert_eq!(
            suites[0].suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        );
    }
}
