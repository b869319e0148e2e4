//! DERP over TLS through the relay, with the move into kernel TLS switched
//! on. Where the kernel has no TLS ULP (this machine) every connection must
//! be refused, counted, and keep relaying in userspace; where it has one,
//! the sessions move into the kernel and relay the same way. A fast-start
//! client (request and clientInfo in one write, no 101) relays too.

mod support;

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use ferry_proto::key::NodePrivate;
use ferry_relay::tls::{self, CertMode};
use support::Client;

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A DERP client over TLS that accepts the relay's self-signed certificate.
fn connect_tls(addr: SocketAddr) -> Client<Tls> {
    connect_tls_with(
        addr,
        support::config(NodePrivate::generate(), support::info(None)),
    )
}

fn connect_tls_with(addr: SocketAddr, derp: ferry_proto::client::Config) -> Client<Tls> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ferry_bench::target::NoVerification(provider)))
        .with_no_client_auth();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    let io = rustls::StreamOwned::new(conn, tcp);
    Client::over(io, derp)
}

#[test]
fn tls_relays_with_kernel_tls_switched_on() {
    let (server, addr) = support::start(2, |cfg| {
        let setup = tls::server_config(
            &CertMode::SelfSigned {
                hostname: "localhost".into(),
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

/// Fast start (§4.4) as tailscaled does it once the meta-certificate gave
/// it the server key: request and clientInfo in one write, no 101, and the
/// relay goes straight to serverKey and serverInfo.
#[test]
fn fast_start_client_over_tls() {
    let mut server_key = None;
    let (server, addr) = support::start(2, |cfg| {
        server_key = Some(cfg.public_key);
        let setup = tls::server_config(
            &CertMode::SelfSigned {
                hostname: "localhost".into(),
            },
            *cfg.public_key.as_bytes(),
        )
        .expect("self-signed TLS");
        cfg.tls = Some(setup.config.clone());
    });
    let server_key = server_key.expect("configured");
    let fast = |addr| {
        let mut config = support::config(NodePrivate::generate(), support::info(None));
        config.fast_start = Some(server_key);
        connect_tls_with(addr, config)
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
