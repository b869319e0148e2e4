//! One DERP connection: dial (resolve, TCP, TLS), then drive
//! [`ferry_proto::client::Client`] through the upgrade and handshake. The
//! established [`Conn`] is handed to the client's driver task, which moves
//! frames between it and the application.
//!
//! Fast start (§4.4): over TLS 1.3, when the server's chain carries the
//! DERP meta-certificate, the server key is known before the request, so
//! the request and `clientInfo` leave together and no `101` is awaited.
//!
//! WebSocket (§4.5, [`Options::websocket`]): the upgrade asks for
//! `websocket` with the `derp` subprotocol; after the `101` the DERP stream
//! travels in binary messages, which [`Conn::flush`] frames (masked, at most
//! [`websocket::MAX_SERVER_MESSAGE`] bytes each, as derper reads at most
//! 32 KiB per message) and [`decode`] unframes, answering pings; a close
//! frame ends the stream. There is no fast start over WebSocket.

use crate::target::Target;
use crate::tls::meta_server_key;
use crate::{Error, Options};
use ferry_proto::client::{self as derp, BoxKey};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::nacl;
use ferry_proto::websocket::{self, ControlFrame};
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
    /// WebSocket framing, when the connection uses it.
    pub(crate) ws: Option<Ws>,
    /// The server's TCP address.
    pub(crate) server_addr: Option<std::net::SocketAddr>,
    /// The relay-session port serverInfo offered, if any.
    pub(crate) relay_port: Option<u16>,
}

/// The WebSocket layer of a connection.
pub(crate) struct Ws {
    decoder: websocket::Decoder,
    /// DERP bytes decoded from the last read.
    plain: Vec<u8>,
    /// Frames to write: control answers first, then DERP bytes.
    framed: Vec<u8>,
}

impl Ws {
    fn new() -> Ws {
        Ws {
            decoder: websocket::Decoder::for_client(),
            plain: Vec::with_capacity(READ_CHUNK),
            framed: Vec::with_capacity(READ_CHUNK),
        }
    }
}

/// What a read brought, for the protocol state machine.
pub(crate) struct Input<'a> {
    /// DERP stream bytes.
    pub(crate) bytes: &'a [u8],
    /// The stream ended (TCP EOF, or a WebSocket close).
    pub(crate) eof: bool,
}

/// Turns `raw` bytes just read into DERP stream bytes: as they are, or out
/// of WebSocket frames (pings answered with pongs queued in the framed
/// output; a close frame ends the stream).
pub(crate) fn decode<'a>(
    ws: &'a mut Option<Ws>,
    raw: &'a [u8],
    label: &str,
) -> Result<Input<'a>, Error> {
    let Some(ws) = ws else {
        return Ok(Input {
            bytes: raw,
            eof: raw.is_empty(),
        });
    };
    ws.plain.clear();
    let mut eof = raw.is_empty();
    let framed = &mut ws.framed;
    ws.decoder
        .feed(raw, &mut ws.plain, |c| match c {
            ControlFrame::Ping(p) => websocket::put_client_frame(
                framed,
                true,
                websocket::OPCODE_PONG,
                &p,
                rand::random(),
            ),
            ControlFrame::Pong => {}
            ControlFrame::Close(_) => eof = true,
        })
        .map_err(|source| Error::WebSocket {
            server: label.to_owned(),
            source,
        })?;
    Ok(Input {
        bytes: &ws.plain,
        eof,
    })
}

impl Conn {
    /// Writes out whatever the state machine and the commands queued (and,
    /// over WebSocket, the answers to pings), framed as the transport needs.
    pub(crate) async fn flush(&mut self) -> Result<(), Error> {
        self.derp.poll_transmit(&mut self.out);
        let bytes = match &mut self.ws {
            None => &self.out,
            Some(ws) => {
                for chunk in self.out.chunks(websocket::MAX_SERVER_MESSAGE) {
                    websocket::put_client_frame(
                        &mut ws.framed,
                        true,
                        websocket::OPCODE_BINARY,
                        chunk,
                        rand::random(),
                    );
                }
                self.out.clear();
                &ws.framed
            }
        };
        if bytes.is_empty() {
            return Ok(());
        }
        let r = async {
            self.io.write_all(bytes).await?;
            self.io.flush().await
        }
        .await;
        self.out.clear();
        if let Some(ws) = &mut self.ws {
            ws.framed.clear();
        }
        r.map_err(|e| Error::io(&self.label, e))
    }
}

/// Opens a connection to `target` and completes the DERP handshake, all
/// within `options.connect_timeout`; with `others` (other targets to try
/// after this one), each address's TCP connect within
/// `options.target_connect_timeout`.
pub(crate) async fn dial(
    target: &Target,
    tls: Option<&TlsParams>,
    key: &NodePrivate,
    options: &Options,
    box_key: Option<BoxKey>,
    others: bool,
) -> Result<Conn, Error> {
    let limit = options.connect_timeout;
    let within = async {
        let label = target.label();
        let tcp = connect_tcp(target, others, options.target_connect_timeout).await?;
        let server_addr = tcp.peer_addr().ok();
        // Small frames (pings, short packets) must not wait for Nagle.
        tcp.set_nodelay(true).map_err(|e| Error::io(&label, e))?;
        let (mut io, fast_start): (Box<dyn Stream>, Option<NodePublic>) = match tls {
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
        let leftover = if options.websocket {
            Some(websocket_upgrade(&mut io, target, &label).await?)
        } else {
            None
        };
        let mut config = derp::Config::new(key.clone(), target.host_header());
        config.fast_start = fast_start;
        config.ideal_node = target.ideal_node.clone();
        config.handshake_timeout = limit;
        config.keepalive_timeout = options.keepalive_timeout;
        config.box_key = box_key;
        if options.relay_sessions {
            // Version 2 (offers that name their host); a server of
            // version 1 answers 1 and sends version 1's frames.
            config.info.ferry_derp = ferry_proto::relay_session::v2::VERSION;
        }
        let client = match leftover {
            None => derp::Client::new(config, now(), nacl::random_nonce()),
            Some(_) => derp::Client::new_upgraded(config, now(), nacl::random_nonce()),
        }
        .map_err(|e| Error::protocol(&label, e))?;
        let mut conn = Conn {
            io,
            derp: client,
            label,
            out: Vec::with_capacity(READ_CHUNK),
            rbuf: vec![0; READ_CHUNK].into_boxed_slice(),
            early: Vec::new(),
            server_key: NodePublic::from_bytes([0; 32]),
            fast_start: fast_start.is_some() && leftover.is_none(),
            ws: leftover.is_some().then(Ws::new),
            server_addr,
            relay_port: None,
        };
        handshake(&mut conn, leftover.unwrap_or_default()).await?;
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

/// The TCP connection to the first of `target`'s addresses that takes
/// it; each address gets `each` when there is another to try (another
/// address, or `others`: other targets).
async fn connect_tcp(
    target: &Target,
    others: bool,
    each: std::time::Duration,
) -> Result<TcpStream, Error> {
    let mut last = None;
    let addrs = target.resolve().await?;
    let bounded = others || addrs.len() > 1;
    for addr in addrs {
        let tried = if bounded {
            tokio::time::timeout(each, TcpStream::connect(addr))
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {each:?}"),
                    ))
                })
        } else {
            TcpStream::connect(addr).await
        };
        match tried {
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

/// Runs the upgrade and the handshake until `serverInfo` has opened;
/// `leftover` is what followed a WebSocket `101` in the same read.
async fn handshake(conn: &mut Conn, mut leftover: Vec<u8>) -> Result<(), Error> {
    let mut server_key = None;
    let mut relay_port = None;
    loop {
        conn.flush().await?;
        if let Some(key) = server_key {
            conn.server_key = key;
            conn.relay_port = relay_port;
            return Ok(());
        }
        let Conn {
            io,
            derp,
            rbuf,
            early,
            label,
            ws,
            ..
        } = conn;
        let raw: &[u8] = if leftover.is_empty() {
            let n = io.read(rbuf).await.map_err(|e| Error::io(label, e))?;
            &rbuf[..n]
        } else {
            leftover.as_slice()
        };
        let input = decode(ws, raw, label)?;
        let mut on_event = |e: derp::Event<&[u8]>| match e {
            derp::Event::Connected {
                server_key: k,
                info,
            } => {
                server_key = Some(k);
                relay_port = info
                    .ferry_derp
                    .filter(|r| r.version >= ferry_proto::relay_session::VERSION && r.port != 0)
                    .map(|r| r.port);
            }
            other => early.push(other.into_owned()),
        };
        derp.handle_bytes(now(), input.bytes, &mut on_event)
            .map_err(|e| Error::protocol(label, e))?;
        if input.eof {
            derp.handle_eof(&mut on_event)
                .map_err(|e| Error::protocol(label, e))?;
        }
        leftover.clear();
    }
}

/// Asks for the WebSocket upgrade and reads the `101`; returns the bytes
/// that followed it.
async fn websocket_upgrade(
    io: &mut Box<dyn Stream>,
    target: &Target,
    label: &str,
) -> Result<Vec<u8>, Error> {
    let ws_error = |source| Error::WebSocket {
        server: label.to_owned(),
        source,
    };
    let key = websocket::client_key(rand::random());
    let request = websocket::upgrade_request(&target.host_header(), derp::DEFAULT_USER_AGENT, &key)
        .ok_or_else(|| {
            ws_error(websocket::WsError::Upgrade(
                "the host name holds CR or LF".into(),
            ))
        })?;
    io.write_all(&request)
        .await
        .map_err(|e| Error::io(label, e))?;
    io.flush().await.map_err(|e| Error::io(label, e))?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = io.read(&mut chunk).await.map_err(|e| Error::io(label, e))?;
        if n == 0 {
            return Err(Error::ServerClosed {
                server: label.to_owned(),
            });
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(len) = websocket::parse_upgrade_response(&head, &key).map_err(ws_error)? {
            return Ok(head.split_off(len));
        }
    }
}
