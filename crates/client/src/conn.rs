//! One DERP connection: dial (resolve, TCP, TLS), then drive
//! [`ferry_proto::client::Client`] through the upgrade and handshake. The
//! established [`Conn`] is handed to the client's driver task, which moves
//! frames between it and the application.
//!
//! Fast start (§4.4): over TLS 1.3, when the server's chain carries the
//! DERP meta-certificate, the server key is known before the request, so
//! the request and `clientInfo` leave together and no `101` is awaited.

use crate::target::Target;
use crate::tls::meta_server_key;
use crate::{Error, Options};
use ferry_proto::client::{self as derp, BoxKey};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::nacl;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bytes read per `read` call.
const READ_CHUNK: usize = 64 * 1024;

/// A byte stream to the server: TCP, or TLS over TCP.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> Stream for T {}

/// The TLS half of a target, built once per client.
pub(crate) type TlsParams = (Arc<ClientConfig>, ServerName<'static>);

/// The time as tokio's clock has it (paused in tests), for the protocol
/// state machine.
pub(crate) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// An established DERP connection.
pub(crate) struct Conn {
    pub(crate) io: Box<dyn Stream>,
    pub(crate) derp: derp::Client,
    /// `host:port`, for errors.
    pub(crate) label: String,
    /// Bytes waiting to be written.
    pub(crate) out: Vec<u8>,
    pub(crate) rbuf: Box<[u8]>,
    /// Events that arrived in the same read as `serverInfo`.
    pub(crate) early: Vec<derp::Event>,
    pub(crate) server_key: NodePublic,
    /// Whether the handshake used fast start.
    pub(crate) fast_start: bool,
}

impl Conn {
    /// Writes out whatever the state machine and the commands queued.
    pub(crate) async fn flush(&mut self) -> Result<(), Error> {
        self.derp.poll_transmit(&mut self.out);
        if self.out.is_empty() {
            return Ok(());
        }
        let r = async {
            self.io.write_all(&self.out).await?;
            self.io.flush().await
        }
        .await;
        self.out.clear();
        r.map_err(|e| Error::io(&self.label, e))
    }
}

/// Opens a connection to `target` and completes the DERP handshake, all
/// within `options.connect_timeout`.
pub(crate) async fn dial(
    target: &Target,
    tls: Option<&TlsParams>,
    key: &NodePrivate,
    options: &Options,
    box_key: Option<BoxKey>,
) -> Result<Conn, Error> {
    let limit = options.connect_timeout;
    let within = async {
        let label = target.label();
        let tcp = connect_tcp(target).await?;
        // Small frames (pings, short packets) must not wait for Nagle.
        tcp.set_nodelay(true).map_err(|e| Error::io(&label, e))?;
        let (io, fast_start): (Box<dyn Stream>, Option<NodePublic>) = match tls {
            None => (Box::new(tcp), None),
            Some((config, name)) => {
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| Error::Tls {
                        host: target.host.clone(),
                        source: Arc::new(e),
                    })?;
                let session = tls.get_ref().1;
                // Go uses the meta-certificate only over TLS 1.3 (§4.1).
                let fast = (options.fast_start
                    && session.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3))
                .then(|| session.peer_certificates().and_then(meta_server_key))
                .flatten();
                (Box::new(tls), fast)
            }
        };
        let mut config = derp::Config::new(key.clone(), target.host_header());
        config.fast_start = fast_start;
        config.ideal_node = target.ideal_node.clone();
        config.handshake_timeout = limit;
        config.keepalive_timeout = options.keepalive_timeout;
        config.box_key = box_key;
        let client = derp::Client::new(config, now(), nacl::random_nonce())
            .map_err(|e| Error::protocol(&label, e))?;
        let mut conn = Conn {
            io,
            derp: client,
            label,
            out: Vec::with_capacity(READ_CHUNK),
            rbuf: vec![0; READ_CHUNK].into_boxed_slice(),
            early: Vec::new(),
            server_key: NodePublic::from_bytes([0; 32]),
            fast_start: fast_start.is_some(),
        };
        handshake(&mut conn).await?;
        Ok(conn)
    };
    tokio::time::timeout(limit, within)
        .await
        .unwrap_or_else(|_| {
            Err(Error::ConnectTimeout {
                server: target.label(),
                limit,
            })
        })
}

async fn connect_tcp(target: &Target) -> Result<TcpStream, Error> {
    let mut last = None;
    for addr in target.resolve().await? {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => {
                last = Some(Error::Connect {
                    addr,
                    source: Arc::new(e),
                })
            }
        }
    }
    Err(last.unwrap_or_else(|| Error::Resolve {
        host: target.host.clone(),
        source: Arc::new(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the name has no addresses",
        )),
    }))
}

/// Runs the upgrade and the handshake until `serverInfo` has opened.
async fn handshake(conn: &mut Conn) -> Result<(), Error> {
    let mut server_key = None;
    loop {
        conn.flush().await?;
        if let Some(key) = server_key {
            conn.server_key = key;
            return Ok(());
        }
        let n = conn
            .io
            .read(&mut conn.rbuf)
            .await
            .map_err(|e| Error::io(&conn.label, e))?;
        let Conn {
            derp,
            rbuf,
            early,
            label,
            ..
        } = conn;
        let result = if n == 0 {
            derp.handle_eof(|_| {})
        } else {
            derp.handle_bytes(now(), &rbuf[..n], |e| match e {
                derp::Event::Connected { server_key: k, .. } => server_key = Some(k),
                other => early.push(other.into_owned()),
            })
        };
        result.map_err(|e| Error::protocol(label, e))?;
    }
}
