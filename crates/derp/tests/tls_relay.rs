//! DERP over TLS through the relay, with the move into kernel TLS switched
//! on. Where the kernel has no TLS ULP (this machine), or the back end
//! cannot read kTLS records (io_uring), every connection must be refused,
//! counted, and keep relaying in userspace; where both can, the sessions
//! move into the kernel and relay the same way (the kernel test VM,
//! scripts/test.d/55-vm.sh, runs this on both back ends). A session refused
//! by the kernel stays on rustls's record layer (Ferry's own layer is only
//! for sessions that never try kTLS). A fast-start client (request and
//! clientInfo in one write, no 101) relays too.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ferry_proto::key::NodePrivate;
use support::{connect_tls, tls_over};

fn tls_relays_with_kernel_tls_switched_on() {
    let (server, addr) = support::start(2, |cfg| {
        let setup = support::self_signed_tls(cfg);
        let mut server_config = (*setup.config).clone();
        ferry_derp::transport::kernel::allow_kernel_tls(&mut server_config);
        cfg.tls = Some(Arc::new(server_config));
        cfg.ktls = true;
    });
    let kernel = ferry_sys::ktls::tls_ulp_available();
    let mut a = connect_tls(addr);
    let mut b = connect_tls(addr);
    for i in 0..200u32 {
        let mut payload = vec![0u8; 1400];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        a.send(&b.public, &payload);
        let (src, got) = b.recv_packet(Duration::from_secs(5)).expect("packet");
        assert_eq!((src, got), (a.public, payload));
    }
    // The listener speaks TLS only: read the counters in-process.
    let text = server.metrics().render();
    let ktls = support::metric_in(&text, "ferry_connections_by_transport{transport=\"ktls\"}");
    for r in ferry_derp::metrics::KtlsRefusal::ALL
        .iter()
        .map(|r| r.label())
    {
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
    // The kernel test VM (scripts/test.d/55-vm.sh) sets FERRY_REQUIRE_KTLS:
    // its kernel has kTLS, so the fallback would be a failure there.
    let required = std::env::var_os("FERRY_REQUIRE_KTLS").is_some_and(|v| v == "1");
    match kernel {
        Ok(()) if backend == "epoll" => {
            assert_eq!(ktls, 2.0, "both sessions moved into the kernel");
            assert_eq!(support::on_transport(&server, "rustls"), 0.0);
        }
        Err(why) if required => panic!("FERRY_REQUIRE_KTLS=1, but {why}"),
        _ => {
            let why = kernel.err().unwrap_or("the back end reads no TLS records");
            println!("TLS stays in userspace on {backend} ({why}): checking the fallback");
            assert_eq!(ktls, 0.0);
            assert_eq!(
                refused, 2.0,
                "each connection tried, was refused for {expected:?}, and was counted"
            );
            assert_eq!(
                (
                    support::on_transport(&server, "rustls"),
                    support::on_transport(&server, "ferry_records")
                ),
                (2.0, 0.0),
                "sessions refused by the kernel stay on rustls"
            );
        }
    }
    support::stop(server);
}

/// Fast start (`docs/derp-protocol.md` §4.4) as tailscaled does it once the
/// meta-certificate gave it the server key: request and clientInfo in one
/// write, no 101, and the relay goes straight to serverKey and serverInfo.
fn fast_start_client_over_tls() {
    let mut server_key = None;
    let (server, addr) = support::start(2, |cfg| {
        server_key = Some(cfg.public_key);
        cfg.tls = Some(support::self_signed_tls(cfg).config);
    });
    let server_key = server_key.expect("configured");
    let fast = |addr| {
        let mut config = support::config(NodePrivate::generate(), support::info(None));
        config.fast_start = Some(server_key);
        tls_over(support::dial(addr, None), config)
    };
    let mut a = fast(addr);
    let mut b = connect_tls(addr);
    assert_eq!(a.server_key, server_key);
    a.send(&b.public, b"fast start");
    assert_eq!(
        b.recv_packet(Duration::from_secs(5)).unwrap(),
        (a.public, b"fast start".to_vec())
    );
    b.send(&a.public, b"and back");
    assert_eq!(
        a.recv_packet(Duration::from_secs(5)).unwrap(),
        (b.public, b"and back".to_vec())
    );
    support::stop(server);
}

/// DERP over WebSocket over TLS: the upgrade, the DERP handshake in masked
/// binary frames, and packets both ways with a raw DERP-over-TLS client.
fn websocket_over_tls_relays_with_raw_clients() {
    use std::io::{Read, Write};
    use std::ops::ControlFlow;

    use ferry_proto::frame::{self, ClientFramePolicy, Deframer, ServerFrame};
    use ferry_proto::{handshake, websocket};

    let (server, addr) = support::start(2, |cfg| {
        cfg.tls = Some(support::self_signed_tls(cfg).config);
    });
    let config = ferry_testkit::tls::accept_any_config();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    let mut ws = rustls::StreamOwned::new(conn, tcp);
    ws.write_all(
        b"GET /derp HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Protocol: derp\r\n\r\n",
    )
    .unwrap();

    // Reads server frames into DERP frames until `want` of them arrived.
    let mut raw = Vec::new();
    let mut head_done = false;
    let mut payload = Vec::new();
    let mut deframer = Deframer::new();
    let mut frames: Vec<(u8, Vec<u8>)> = Vec::new();
    let mut read_frames = |ws: &mut rustls::StreamOwned<_, _>, want: usize| -> Vec<(u8, Vec<u8>)> {
        let mut buf = [0u8; 16 * 1024];
        while frames.len() < want {
            let n = ws.read(&mut buf).expect("reading from the relay");
            assert!(n > 0, "the relay closed the connection");
            raw.extend_from_slice(&buf[..n]);
            if !head_done {
                let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&raw[..end]).into_owned();
                assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
                assert!(
                    head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
                    "{head}"
                );
                raw.drain(..end + 4);
                head_done = true;
            }
            // Whole WebSocket frames: unmasked, final, binary.
            loop {
                if raw.len() < 2 {
                    break;
                }
                assert_eq!(raw[0], 0x82, "a final binary frame");
                let (len, at) = match raw[1] {
                    126 if raw.len() >= 4 => (usize::from(u16::from_be_bytes([raw[2], raw[3]])), 4),
                    126 => break,
                    127 => panic!("no 64-bit lengths expected"),
                    n => (usize::from(n), 2),
                };
                if raw.len() < at + len {
                    break;
                }
                payload.extend_from_slice(&raw[at..at + len]);
                raw.drain(..at + len);
            }
            deframer
                .feed(&payload, &ClientFramePolicy, |ty, p| {
                    frames.push((ty, p.to_vec()));
                    ControlFlow::Continue(())
                })
                .unwrap();
            payload.clear();
        }
        frames.drain(..want).collect()
    };

    let first = read_frames(&mut ws, 1);
    let ServerFrame::ServerKey(server_public) =
        frame::parse_server_frame(first[0].0, &first[0].1).unwrap()
    else {
        panic!("first frame {first:?}");
    };
    let me = NodePrivate::generate();
    let info = handshake::seal_client_info(&me, &server_public, &support::info(None), &[7; 24]);
    ws.write_all(&websocket::client_frame(true, 0x2, &info, [4, 3, 2, 1]))
        .unwrap();
    let second = read_frames(&mut ws, 1);
    assert!(matches!(
        frame::parse_server_frame(second[0].0, &second[0].1),
        Ok(ServerFrame::ServerInfo(_))
    ));

    let mut raw_client = connect_tls(addr);
    let packet = vec![0xabu8; 30_000];
    raw_client.send(&me.public(), &packet);
    let got = read_frames(&mut ws, 1);
    match frame::parse_server_frame(got[0].0, &got[0].1).unwrap() {
        ServerFrame::RecvPacket { src, packet: p } => {
            assert_eq!(src, raw_client.public);
            assert_eq!(p, &packet[..]);
        }
        other => panic!("{other:?}"),
    }
    let mut send = Vec::new();
    frame::put_send_packet(&mut send, &raw_client.public, b"over websocket and TLS");
    ws.write_all(&websocket::client_frame(true, 0x2, &send, [9, 9, 9, 9]))
        .unwrap();
    let (src, got) = raw_client
        .recv_packet(Duration::from_secs(10))
        .expect("packet");
    assert_eq!(
        (src, got.as_slice()),
        (me.public(), &b"over websocket and TLS"[..])
    );
    support::stop(server);
}

ferry_testkit::per_backend!(
    tls_relays_with_kernel_tls_switched_on,
    fast_start_client_over_tls,
    websocket_over_tls_relays_with_raw_clients,
);
