//! DERP over TLS through the relay, with the move into kernel TLS switched
//! on. Where the kernel has no TLS ULP (this machine) every connection must
//! be refused, counted, and keep relaying in userspace; where it has one,
//! the sessions move into the kernel and relay the same way. A fast-start
//! client (request and clientInfo in one write, no 101) relays too.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ferry_proto::key::NodePrivate;
use support::{connect_tls, tls_over};

#[test]
fn tls_relays_with_kernel_tls_switched_on() {
    let (server, addr) = support::start(2, |cfg| {
        let setup = support::self_signed_tls(cfg);
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
    for r in ferry_relay::metrics::KtlsRefusal::ALL
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
