//! Opening the control channel: the server's key (`GET /key`), TCP (and
//! TLS for an `https://` login server), the `/ts2021` upgrade, the Noise handshake, the early payload, and a pump
//! that moves plaintext between the Noise records on the socket and an
//! in-memory pipe HTTP/2 reads and writes.

use crate::Error;
use ferry_client::TlsRoots;
use ferry_proto::key::{MachinePrivate, MachinePublic};
use ferry_proto::tailnet::early::{self, Early};
use ferry_proto::tailnet::noise::{Initiator, Transport, MAX_PLAINTEXT};
use ferry_proto::tailnet::{upgrade, CAPABILITY_VERSION};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::TcpStream;

/// Longest answer to `GET /key` read.
const MAX_KEY_RESPONSE: usize = 64 * 1024;
/// Time allowed for each step of opening the channel.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Capacity of the in-memory pipe between the pump and HTTP/2.
const PIPE: usize = 64 * 1024;

/// A byte stream to the login server: TCP, or TLS over TCP.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A login server URL, `http://host[:port]` or `https://host[:port]` (a
/// path is ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginServer {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// `https://`: TLS, the certificate checked for `host` against the
    /// system's CA certificates (`SSL_CERT_FILE` and `SSL_CERT_DIR`
    /// honoured).
    pub tls: bool,
}

impl LoginServer {
    /// Parses `http://host[:port][/…]` (port 80 by default) or
    /// `https://host[:port][/…]` (443).
    pub fn parse(url: &str) -> Result<LoginServer, Error> {
        let bad = |why: &str| Error::Config(format!("login server {url:?}: {why}"));
        let (rest, tls) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (rest, false),
            (_, Some(rest)) => (rest, true),
            _ => return Err(bad("only http:// and https:// URLs are supported")),
        };
        let authority = rest.split('/').next().unwrap_or_default();
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, tail) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            (h, tail.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || host.contains(['\r', '\n', ' ', '@']) {
            return Err(bad("bad host"));
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| bad("bad port"))?,
            None if tls => 443,
            None => 80,
        };
        Ok(LoginServer {
            host: host.to_owned(),
            port,
            tls,
        })
    }

    /// `host:port` as the Host header and `:authority` carry it.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// TCP to the server, and TLS over it for `https://` (the
    /// certificate checked for the host against `roots`).
    async fn connect(&self, roots: &TlsRoots) -> Result<Box<dyn Stream>, Error> {
        let s = tokio::time::timeout(
            STEP_TIMEOUT,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| Error::Timeout("connecting to the login server"))??;
        s.set_nodelay(true)?;
        if !self.tls {
            return Ok(Box::new(s));
        }
        let (config, name) = ferry_client::https_client_config(roots, &self.host)
            .map_err(|e| Error::Config(format!("TLS to the login server: {e}")))?;
        let tls = tokio::time::timeout(
            STEP_TIMEOUT,
            tokio_rustls::TlsConnector::from(config).connect(name, s),
        )
        .await
        .map_err(|_| Error::Timeout("the login server's TLS handshake"))?
        .map_err(|e| Error::Protocol(format!("TLS to {}: {e}", self.authority())))?;
        Ok(Box::new(tls))
    }
}

/// `GET /key?v=<capver>`: the control server's machine public key.
pub(crate) async fn fetch_server_key(
    server: &LoginServer,
    roots: &TlsRoots,
) -> Result<MachinePublic, Error> {
    let mut s = server.connect(roots).await?;
    let req = format!(
        "GET /key?v={CAPABILITY_VERSION} HTTP/1.1\r\nHost: {}\r\nUser-Agent: ferry\r\nConnection: close\r\n\r\n",
        server.authority()
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(STEP_TIMEOUT, async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).await?;
            if n == 0 || buf.len() + n > MAX_KEY_RESPONSE {
                return Ok::<_, std::io::Error>(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .map_err(|_| Error::Timeout("reading /key"))??;
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(&buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err(Error::Protocol("malformed /key response".into())),
    };
    if resp.code != Some(200) {
        return Err(Error::Protocol(format!("/key answered {:?}", resp.code)));
    }
    let chunked = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("Transfer-Encoding") && h.value.eq_ignore_ascii_case(b"chunked")
    });
    let body = &buf[head..];
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    #[derive(serde::Deserialize)]
    struct Key {
        #[serde(rename = "publicKey")]
        public_key: String,
    }
    let k: Key =
        serde_json::from_slice(&body).map_err(|e| Error::Protocol(format!("/key body: {e}")))?;
    k.public_key
        .parse()
        .map_err(|e| Error::Protocol(format!("/key publicKey: {e}")))
}

/// Decodes a chunked body (whole, already read).
fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, Error> {
    let bad = || Error::Protocol("bad chunked /key body".into());
    let mut out = Vec::new();
    for _ in 0..1024 {
        let line_end = b.windows(2).position(|w| w == b"\r\n").ok_or_else(bad)?;
        let size_text = std::str::from_utf8(&b[..line_end]).map_err(|_| bad())?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad())?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(b.get(..size).ok_or_else(bad)?);
        b = b.get(size + 2..).ok_or_else(bad)?;
    }
    Err(bad())
}

/// Opens the Noise channel and returns the plaintext side of the pipe for
/// HTTP/2, with the pump running as a task of the current runtime.
pub(crate) async fn open(
    server: &LoginServer,
    server_key: &MachinePublic,
    machine: &MachinePrivate,
    roots: &TlsRoots,
) -> Result<DuplexStream, Error> {
    let mut s = server.connect(roots).await?;
    let mut ephemeral = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut ephemeral);
    let init = Initiator::new(machine, server_key, CAPABILITY_VERSION, ephemeral)?;
    let mut req = Vec::new();
    upgrade::put_request(&server.authority(), init.initiation(), &mut req)?;
    s.write_all(&req).await?;
    let mut buf = Vec::new();
    let (transport, used) = tokio::time::timeout(STEP_TIMEOUT, async {
        let mut head_len = None;
        loop {
            if head_len.is_none() {
                head_len = upgrade::parse_response(&buf)?;
            }
            if let Some(h) = head_len {
                if let Some((t, n)) = init.read_response(&buf[h..])? {
                    return Ok::<_, Error>((t, h + n));
                }
            }
            read_more(&mut s, &mut buf).await?;
        }
    })
    .await
    .map_err(|_| Error::Timeout("the control handshake"))??;
    buf.drain(..used);
    let (ours, theirs) = tokio::io::duplex(PIPE);
    tokio::spawn(pump(s, transport, buf, theirs));
    Ok(ours)
}

/// Appends what one read from `s` gives to `buf`; the end of the stream
/// is an error (the server never closes first on purpose).
async fn read_more<R: tokio::io::AsyncRead + Unpin>(
    s: &mut R,
    buf: &mut Vec<u8>,
) -> Result<(), Error> {
    let mut chunk = [0u8; 8192];
    let n = s.read(&mut chunk).await?;
    if n == 0 {
        return Err(Error::Protocol(
            "control server closed the connection".into(),
        ));
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

/// Moves bytes between the socket (records) and the pipe (plaintext)
/// until either side closes or fails; the early payload is dropped before
/// HTTP/2 sees the stream.
async fn pump(s: Box<dyn Stream>, t: Transport, wire: Vec<u8>, pipe: DuplexStream) {
    let (sock_r, sock_w) = tokio::io::split(s);
    let (pipe_r, pipe_w) = tokio::io::split(pipe);
    let (tx_records, rx_records) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let result = tokio::select! {
        r = plaintext_out(pipe_r, tx_records) => r,
        r = records(sock_r, sock_w, t, wire, pipe_w, rx_records) => r,
    };
    if let Err(e) = result {
        tracing::debug!("control channel closed: {e}");
    }
}

/// Hands what HTTP/2 writes to [`records`] in pieces of at most one
/// record's plaintext.
async fn plaintext_out(
    mut pipe_r: tokio::io::ReadHalf<DuplexStream>,
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
) -> Result<(), Error> {
    let mut plain = vec![0u8; MAX_PLAINTEXT];
    loop {
        let n = pipe_r.read(&mut plain).await?;
        if n == 0 || tx.send(plain[..n].to_vec()).await.is_err() {
            return Ok(());
        }
    }
}

/// Opens the server's records into the pipe (dropping the early payload
/// first) and seals the pieces from [`plaintext_out`] onto the socket.
async fn records(
    mut sock_r: tokio::io::ReadHalf<Box<dyn Stream>>,
    mut sock_w: tokio::io::WriteHalf<Box<dyn Stream>>,
    mut t: Transport,
    mut wire: Vec<u8>,
    mut pipe_w: tokio::io::WriteHalf<DuplexStream>,
    mut rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
) -> Result<(), Error> {
    let mut plain = Vec::new();
    let mut early_done = false;
    loop {
        let used = t.open(&mut wire, &mut plain)?;
        wire.drain(..used);
        if !early_done {
            match early::parse(&plain)? {
                Early::NeedMore => {}
                Early::Absent => early_done = true,
                Early::Present { len, .. } => {
                    plain.drain(..len);
                    early_done = true;
                }
            }
        }
        if early_done && !plain.is_empty() {
            pipe_w.write_all(&plain).await?;
            plain.clear();
        }
        tokio::select! {
            r = read_more(&mut sock_r, &mut wire) => r?,
            msg = rx.recv() => {
                let Some(msg) = msg else { return Ok(()) };
                let mut out = Vec::with_capacity(msg.len() + 32);
                t.seal(&msg, &mut out)?;
                sock_w.write_all(&out).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_server_urls() {
        let s = LoginServer::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!((s.host.as_str(), s.port), ("127.0.0.1", 8080));
        assert_eq!(s.authority(), "127.0.0.1:8080");
        let s = LoginServer::parse("http://[::1]:9/x").unwrap();
        assert_eq!((s.host.as_str(), s.port), ("::1", 9));
        assert_eq!(s.authority(), "[::1]:9");
        assert_eq!(LoginServer::parse("http://hs.example").unwrap().port, 80);
        let s = LoginServer::parse("https://hs.example").unwrap();
        assert_eq!((s.port, s.tls), (443, true));
        assert!(!LoginServer::parse("http://hs.example").unwrap().tls);
        assert!(LoginServer::parse("ftp://hs.example").is_err());
        assert!(LoginServer::parse("http://:80").is_err());
        assert!(LoginServer::parse("http://h:x").is_err());
    }

    #[test]
    fn chunked_key_body() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n1\r\nd\r\n0\r\n\r\n").unwrap(),
            b"abcd"
        );
        assert!(dechunk(b"5\r\nab").is_err());
    }
}

#[cfg(test)]
mod tls_tests {
    use super::*;
    use ferry_testkit::certs::TestCa;
    use std::sync::Arc;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::PrivateKeyDer;
    use tokio_rustls::rustls::{self, ServerConfig};

    /// A loopback TLS server with the test CA's `localhost` certificate
    /// that answers each `GET /key` with `key`; its port.
    async fn key_server(ca: &TestCa, key: MachinePublic) -> u16 {
        let pem = std::fs::read(ca.dir.path().join("localhost.key")).unwrap();
        let private = PrivateKeyDer::from_pem_slice(&pem).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![ca.leaf.clone()], private)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    continue;
                };
                let mut req = Vec::new();
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    if read_more(&mut tls, &mut req).await.is_err() {
                        break;
                    }
                }
                let body = format!("{{\"publicKey\":\"{key}\"}}");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.shutdown().await;
            }
        });
        port
    }

    #[test]
    fn an_https_login_server_is_reached_over_tls_and_its_certificate_checked() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ca = TestCa::new();
            let key = MachinePublic([7; 32]);
            let port = key_server(&ca, key).await;
            let server = LoginServer::parse(&format!("https://localhost:{port}")).unwrap();
            let trusted = TlsRoots::Custom(Arc::new(ca.root_store()));
            assert_eq!(fetch_server_key(&server, &trusted).await.unwrap(), key);
            // A certificate from a CA the client does not trust: refused.
            let other = TlsRoots::Custom(Arc::new(TestCa::new().root_store()));
            let e = fetch_server_key(&server, &other).await.unwrap_err();
            assert!(e.to_string().contains("TLS to localhost"), "{e}");
            // Plain HTTP to the TLS port gets no key.
            let plain = LoginServer::parse(&format!("http://localhost:{port}")).unwrap();
            assert!(fetch_server_key(&plain, &trusted).await.is_err());
        });
    }
}
