//! DERP over TLS through the relay, with the move into kernel TLS switched
//! on. Where the kernel has no TLS ULP (this machine) every connection must
//! be refused, counted, and keep relaying in userspace; where it has one,
//! the sessions move into the kernel and relay the same way.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::frame::{self, ClientFramePolicy, Deframer, ServerFrame};
use ferry_proto::handshake;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_relay::tls::{self, CertMode};

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

struct TlsClient {
    io: Tls,
    public: NodePublic,
    deframer: Deframer,
    frames: Vec<(u8, Vec<u8>)>,
}

impl TlsClient {
    fn connect(addr: SocketAddr) -> TlsClient {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ferry_bench::target::NoVerification(
                provider,
            )))
            .with_no_client_auth();
        let conn = rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap())
            .unwrap();
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut io = rustls::StreamOwned::new(conn, tcp);
        io.write_all(b"GET /derp HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: DERP\r\n\r\n").unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            io.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"));
        let key = NodePrivate::generate();
        let mut c = TlsClient {
            io,
            public: key.public(),
            deframer: Deframer::new(),
            frames: Vec::new(),
        };
        let (ty, p) = c.next_frame();
        assert_eq!(ty, frame::FrameType::ServerKey as u8);
        let server = handshake::parse_server_key(&p).unwrap();
        let hello = handshake::seal_client_info(
            &key,
            &server,
            &support::info(None),
            &ferry_proto::nacl::random_nonce(),
        );
        c.io.write_all(&hello).unwrap();
        let (ty, _) = c.next_frame();
        assert_eq!(ty, frame::FrameType::ServerInfo as u8);
        c
    }

    fn next_frame(&mut self) -> (u8, Vec<u8>) {
        let mut buf = [0u8; 16 * 1024];
        while self.frames.is_empty() {
            let n = self.io.read(&mut buf).expect("read");
            assert!(n > 0, "closed");
            let frames = &mut self.frames;
            self.deframer
                .feed(&buf[..n], &ClientFramePolicy, |ty, p| {
                    frames.push((ty, p.to_vec()));
                    ControlFlow::Continue(())
                })
                .unwrap();
        }
        self.frames.remove(0)
    }

    fn recv_packet(&mut self) -> (NodePublic, Vec<u8>) {
        loop {
            let (ty, p) = self.next_frame();
            if let Ok(ServerFrame::RecvPacket { src, packet }) = frame::parse_server_frame(ty, &p) {
                return (src, packet.to_vec());
            }
        }
    }
}

#[test]
fn tls_relays_with_kernel_tls_switched_on() {
    let (server, addr) = support::start(2, |cfg| {
        let setup = tls::server_config(
            &CertMode::SelfSigned {
                hostname: "localhost".into(),
                certdir: None,
            },
            *cfg.public_key.as_bytes(),
        )
        .expect("self-signed TLS");
        let mut server_config = (*setup.config).clone();
        ferry_relay::ktls::allow_kernel_tls(&mut server_config);
        cfg.tls = Some(Arc::new(server_config));
        cfg.ktls = true;
    });
    let kernel = ferry_sys::ktls::tls_ulp_available();
    let mut a = TlsClient::connect(addr);
    let mut b = TlsClient::connect(addr);
    for i in 0..200u32 {
        let mut out = Vec::new();
        let mut payload = vec![0u8; 1400];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        frame::put_send_packet(&mut out, &b.public, &payload);
        a.io.write_all(&out).unwrap();
        let (src, got) = b.recv_packet();
        assert_eq!((src, got), (a.public, payload));
    }
    // The listener speaks TLS only: read the counters in-process.
    let text = server.metrics().render();
    let ktls = support::metric_in(&text, "ferry_connections_by_transport{transport=\"ktls\"}");
    for r in ferry_relay::metrics::KTLS_REFUSALS {
        let v = support::metric_in(
            &text,
            &format!("ferry_ktls_refused_total{{reason=\"{r}\"}}"),
        );
        println!("ferry_ktls_refused_total{{reason={r}}} {v}");
    }
    // A back end without record-aware kTLS reads (io_uring for now) keeps
    // TLS in userspace for that reason instead.
    let backend = server.metrics().backend;
    let expected: &[&str] = if backend == "epoll" {
        &["ulp", "kernel"]
    } else {
        &["backend"]
    };
    let refused: f64 = expected
        .iter()
        .map(|r| {
            support::metric_in(
                &text,
                &format!("ferry_ktls_refused_total{{reason=\"{r}\"}}"),
            )
        })
        .sum();
    match kernel {
        Ok(()) => assert_eq!(ktls, 2.0, "both sessions moved into the kernel"),
        Err(why) => {
            println!("no kernel TLS here ({why}): checking the userspace fallback on {backend}");
            assert_eq!(ktls, 0.0);
            assert_eq!(
                refused, 2.0,
                "each connection tried, was refused, and was counted"
            );
        }
    }
    support::stop(server);
}
