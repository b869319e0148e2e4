//! The relay tests' server harness. The blocking DERP client (and the
//! numbered packets and floods of the backpressure tests), the TLS
//! verifier, the bounded waits and metric reading come from
//! `ferry-testkit`, re-exported here under the names the tests use.
//!
//! The back end of every relay started here is the one of the test's
//! case ([`ferry_testkit::per_backend!`] runs each case on epoll and on
//! io_uring), and the relay must report that it runs on it.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;

pub(crate) mod region;
pub(crate) mod sim;

use ferry_derp::{DerpConfig, ListenerKind, ListenerSpec, Server, ServerOptions};
use ferry_proto::key::NodePrivate;
pub(crate) use ferry_testkit::derp::{
    config, connect_tls, dial, info, recv_numbered, send_numbered, tls_over, Client, Flood, Tls,
    Transport,
};
pub(crate) use ferry_testkit::http::http;
pub(crate) use ferry_testkit::metrics::{metric, metric_in, Scrape};
pub(crate) use ferry_testkit::wait::eventually;

/// A relay on 127.0.0.1 with `workers` shards and `tweak` applied.
pub(crate) fn start(workers: usize, tweak: impl FnOnce(&mut DerpConfig)) -> (Server, SocketAddr) {
    start_on("127.0.0.1:0".parse().unwrap(), workers, tweak)
}

/// A relay listening on `addr` (STUN on the same IP).
pub(crate) fn start_on(
    addr: SocketAddr,
    workers: usize,
    tweak: impl FnOnce(&mut DerpConfig),
) -> (Server, SocketAddr) {
    start_with_stun(addr, SocketAddr::new(addr.ip(), 0), workers, tweak)
}

/// A relay listening on `addr` with STUN on `stun`.
pub(crate) fn start_with_stun(
    addr: SocketAddr,
    stun: SocketAddr,
    workers: usize,
    tweak: impl FnOnce(&mut DerpConfig),
) -> (Server, SocketAddr) {
    let mut cfg = DerpConfig::new(NodePrivate::generate());
    tweak(&mut cfg);
    let server = Server::start(ServerOptions {
        config: cfg,
        listeners: vec![ListenerSpec {
            addr,
            kind: ListenerKind::Derp,
        }],
        workers,
        pin: false,
        stun: Some(stun),
        metrics_addr: None,
        io: io_mode(),
        inherited: Vec::new(),
    })
    .expect("server starts");
    check_backend(&server);
    let addr = server.listen_addrs[0];
    (server, addr)
}

/// A relay with two shards and a metrics listener; returns it, its DERP
/// address and its metrics address.
pub(crate) fn start_with_metrics() -> (Server, SocketAddr, SocketAddr) {
    let server = Server::start(ServerOptions {
        config: DerpConfig::new(NodePrivate::generate()),
        listeners: vec![ListenerSpec {
            addr: "127.0.0.1:0".parse().unwrap(),
            kind: ListenerKind::Derp,
        }],
        workers: 2,
        pin: false,
        stun: None,
        metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
        io: io_mode(),
        inherited: Vec::new(),
    })
    .expect("server starts");
    check_backend(&server);
    let (addr, metrics) = (server.listen_addrs[0], server.metrics_addr.unwrap());
    (server, addr, metrics)
}

/// Checks that `server` runs on the back end its test asked for.
pub(crate) fn check_backend(server: &Server) {
    ferry_testkit::backend::check(
        &ferry_testkit::skip::test_name(env!("CARGO_PKG_NAME"), module_path!()),
        "in-process relay",
        io_mode(),
        server.metrics().backend,
    );
}

/// A fresh self-signed TLS set-up for "localhost" with `cfg`'s key in its
/// meta certificate (nothing written to disk).
pub(crate) fn self_signed_tls(cfg: &DerpConfig) -> ferry_derp::certs::CertSetup {
    ferry_derp::certs::server_config(
        &ferry_derp::certs::CertMode::SelfSigned {
            hostname: "localhost".into(),
            certdir: None,
        },
        *cfg.public_key.as_bytes(),
    )
    .expect("self-signed TLS")
}

/// The back end under test: the case's ([`ferry_testkit::per_backend!`]),
/// else `FERRY_TEST_IO`'s, else auto.
pub(crate) fn io_mode() -> ferry_engine::IoMode {
    ferry_testkit::backend::mode()
}

/// Open connections on `transport` (`plain`, or the TLS record layer:
/// `rustls`, `ferry_records`, `ktls`), read in-process (a TLS-only
/// listener serves no plain metrics page).
pub(crate) fn on_transport(server: &Server, transport: &str) -> f64 {
    metric_in(
        &server.metrics().render(),
        &format!("ferry_connections_by_transport{{transport=\"{transport}\"}}"),
    )
}

/// Stops a relay and waits for it.
pub(crate) fn stop(server: Server) {
    server.shutdown();
    server.wait().expect("clean stop");
}
