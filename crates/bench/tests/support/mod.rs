//! What the integration tests share: scratch directories and in-process
//! Ferry relays.

use std::path::PathBuf;

/// A per-test scratch directory, removed when the guard drops.
#[allow(dead_code)] // not every test binary needs one
pub(crate) struct Scratch(pub(crate) PathBuf);

#[allow(dead_code)]
impl Scratch {
    pub(crate) fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("ferry-bench-test-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// A file in it.
    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An in-process Ferry relay with one shard and one DERP listener on
/// `addr` (`127.0.0.1:0` for any port), on the back end `FERRY_TEST_IO`
/// names (else the default), which it must report.
#[allow(dead_code)]
pub(crate) fn relay(config: ferry_derp::DerpConfig, addr: &str) -> ferry_derp::Server {
    relay_with_workers(config, addr, 1)
}

/// [`relay`] with `workers` shards (not pinned).
pub(crate) fn relay_with_workers(
    config: ferry_derp::DerpConfig,
    addr: &str,
    workers: usize,
) -> ferry_derp::Server {
    let io = ferry_testkit::backend::mode();
    let server = ferry_derp::Server::start(ferry_derp::ServerOptions {
        config,
        listeners: vec![ferry_derp::ListenerSpec {
            addr: addr.parse().unwrap(),
            kind: ferry_derp::ListenerKind::Derp,
        }],
        workers,
        pin: false,
        stun: None,
        metrics_addr: None,
        io,
        inherited: Vec::new(),
    })
    .expect("relay starts");
    ferry_testkit::backend::check(
        &ferry_testkit::skip::test_name(env!("CARGO_PKG_NAME"), module_path!()),
        "in-process relay",
        io,
        server.metrics().backend,
    );
    server
}
