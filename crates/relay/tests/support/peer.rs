//! A blocking DERP client over plain TCP or TLS, for tests that run the
//! same case on both transports.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::frame::{self, ClientFramePolicy, Deframer, ServerFrame};
use ferry_proto::handshake;
use ferry_proto::key::{NodePrivate, NodePublic};

/// Read and write timeout of a peer's socket.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What a peer reads and writes through: a TCP stream or a TLS stream.
pub trait Wire: Read + Write + Send {}
impl<T: Read + Write + Send> Wire for T {}

/// A blocking DERP client over plain TCP or TLS.
pub struct Peer {
    pub io: Box<dyn Wire>,
    pub public: NodePublic,
    deframer: Deframer,
    frames: Vec<(u8, Vec<u8>)>,
}

impl Peer {
    /// Connects and finishes the DERP handshake. `rcvbuf` shrinks the
    /// socket's receive buffer first, so a peer that never reads fills up
    /// fast.
    pub fn connect(addr: SocketAddr, tls: bool, rcvbuf: Option<usize>) -> Peer {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if let Some(n) = rcvbuf {
            sock.set_recv_buffer_size(n).unwrap();
        }
        sock.connect(&addr.into()).unwrap();
        let tcp: TcpStream = sock.into();
        tcp.set_read_timeout(Some(TIMEOUT)).unwrap();
        tcp.set_write_timeout(Some(TIMEOUT)).unwrap();
        let mut io: Box<dyn Wire> = if tls {
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .unwrap()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ferry_bench::target::NoVerification(
                    provider,
                )))
                .with_no_client_auth();
            let conn =
                rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap())
                    .unwrap();
            Box::new(rustls::StreamOwned::new(conn, tcp))
        } else {
            Box::new(tcp)
        };
        io.write_all(
            b"GET /derp HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: DERP\r\n\r\n",
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            io.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"), "{head:?}");
        let key = NodePrivate::generate();
        let mut p = Peer {
            io,
            public: key.public(),
            deframer: Deframer::new(),
            frames: Vec::new(),
        };
        let (ty, payload) = p.next_frame().unwrap();
        assert_eq!(ty, frame::FrameType::ServerKey as u8);
        let server = handshake::parse_server_key(&payload).unwrap();
        let hello = handshake::seal_client_info(
            &key,
            &server,
            &super::info(None),
            &ferry_proto::nacl::random_nonce(),
        );
        p.io.write_all(&hello).unwrap();
        let (ty, _) = p.next_frame().unwrap();
        assert_eq!(ty, frame::FrameType::ServerInfo as u8);
        p
    }

    pub fn next_frame(&mut self) -> std::io::Result<(u8, Vec<u8>)> {
        let mut buf = [0u8; 16 * 1024];
        while self.frames.is_empty() {
            let n = self.io.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let frames = &mut self.frames;
            self.deframer
                .feed(&buf[..n], &ClientFramePolicy, |ty, p| {
                    frames.push((ty, p.to_vec()));
                    ControlFlow::Continue(())
                })
                .unwrap();
        }
        Ok(self.frames.remove(0))
    }

    pub fn send(&mut self, dst: &NodePublic, packet: &[u8], out: &mut Vec<u8>) {
        out.clear();
        frame::put_send_packet(out, dst, packet);
        self.io.write_all(out).expect("the sender stays connected");
    }

    /// The next packet (source and bytes), skipping other frames.
    pub fn recv_packet(&mut self) -> std::io::Result<(NodePublic, Vec<u8>)> {
        loop {
            let (ty, p) = self.next_frame()?;
            if let Ok(ServerFrame::RecvPacket { src, packet }) = frame::parse_server_frame(ty, &p) {
                return Ok((src, packet.to_vec()));
            }
        }
    }
}
