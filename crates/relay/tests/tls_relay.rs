//! DERP over TLS through the relay, with the move into kernel TLS switched
//! on. Where the kernel has no TLS ULP (this machine) every connection must
//! be refused, counted, and keep relaying in userspace; where it has one,
//! the sessions move into the kernel and relay the same way.

mod support;

use std::io::Write;
use std::sync::Arc;

use ferry_proto::frame;
use support::peer::Peer;

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
    let mut a = Peer::connect(addr, true, None);
    let mut b = Peer::connect(addr, true, None);
    for i in 0..200u32 {
        let mut out = Vec::new();
        let mut payload = vec![0u8; 1400];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        frame::put_send_packet(&mut out, &b.public, &payload);
        a.io.write_all(&out).unwrap();
        let (src, got) = b.recv_packet().unwrap();
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
