//! The relay tests' server harness. The blocking DERP client, the TLS
//! verifier and the bounded waits come from `ferry-testkit`, re-exported
//! here under the names the tests use.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;

use ferry_proto::key::NodePrivate;
use ferry_relay::{ListenerKind, ListenerSpec, RelayConfig, Server, ServerOptions};
pub(crate) use ferry_testkit::derp::{
    config, connect_tls, dial, info, tls_over, Client, Tls, Transport,
};
pub(crate) use ferry_testkit::http::http;
pub(crate) use ferry_testkit::metrics::{metric, metric_in, Scrape};
pub(crate) use ferry_testkit::wait::eventually;

/// A relay on 127.0.0.1 with `workers` shards and `tweak` applied.
pub(crate) fn start(workers: usize, tweak: impl FnOnce(&mut RelayConfig)) -> (Server, SocketAddr) {
    start_on("127.0.0.1:0".parse().unwrap(), workers, tweak)
}

/// A relay listening on `addr` (STUN on the same IP).
pub(crate) fn start_on(
    addr: SocketAddr,
    workers: usize,
    tweak: impl FnOnce(&mut RelayConfig),
) -> (Server, SocketAddr) {
    let mut cfg = RelayConfig::new(NodePrivate::generate());
    tweak(&mut cfg);
    let server = Server::start(ServerOptions {
        config: cfg,
        listeners: vec![ListenerSpec {
            addr,
            kind: ListenerKind::Derp,
        }],
        workers,
        pin: false,
        stun: Some(SocketAddr::new(addr.ip(), 0)),
        metrics_addr: None,
        io: io_mode(),
        inherited: Vec::new(),
    })
    .expect("server starts");
    let addr = server.listen_addrs[0];
    (server, addr)
}

/// A fresh self-signed TLS set-up for "localhost" with `cfg`'s key in its
/// meta certificate (nothing written to disk).
pub(crate) fn self_signed_tls(cfg: &RelayConfig) -> ferry_relay::tls::TlsSetup {
    ferry_relay::tls::server_config(
        &ferry_relay::tls::CertMode::SelfSigned {
            hostname: "localhost".into(),
            certdir: None,
        },
        *cfg.public_key.as_bytes(),
    )
    .expect("self-signed TLS")
}

/// The back end under test: `FERRY_IO` (auto, uring, epoll), default auto.
pub(crate) fn io_mode() -> ferry_engine::IoMode {
    std::env::var("FERRY_IO")
        .ok()
        .map(|v| v.parse().expect("FERRY_IO: auto, uring or epoll"))
        .unwrap_or_default()
}

/// Stops a relay and waits for it.
pub(crate) fn stop(server: Server) {
    server.shutdown();
    server.wait().expect("clean stop");
}
