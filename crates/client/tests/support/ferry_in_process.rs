//! Ferry started in this process for the endpoint tests and the endpoint
//! bench: plain DERP on a loopback port, optionally with STUN and with
//! relay sessions (the session socket of `ferry-udp` wired to the DERP
//! shards as `ferry`'s main wires it). On the back end `FERRY_TEST_IO`
//! names, else the default.
#![allow(dead_code)]

use ferry_derp::{DerpConfig, ListenerKind, ListenerSpec, Server, ServerOptions};
use ferry_proto::key::NodePrivate;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

/// Ferry with `config` on a loopback port, STUN at `stun` if given; the
/// server and its DERP URL.
pub(crate) fn start(config: DerpConfig, stun: Option<SocketAddr>) -> (Server, String) {
    let derp = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let io = ferry_testkit::backend::mode();
    let server = Server::start(ServerOptions {
        config,
        listeners: vec![ListenerSpec {
            addr: derp,
            kind: ListenerKind::Derp,
        }],
        workers: 1,
        pin: false,
        stun,
        metrics_addr: None,
        io,
        inherited: Vec::new(),
    })
    .expect("ferry starts");
    crate::support::check_backend(&server, io);
    (server, format!("http://{derp}/derp"))
}

/// Ferry with relay sessions: DERP and the session socket on loopback.
/// Shut down on drop.
pub(crate) struct SessionRelay {
    server: Option<Server>,
    /// The relay-session socket group (its metrics count what it dropped).
    pub(crate) udp: ferry_udp::Relay,
    /// The DERP URL.
    pub(crate) url: String,
    /// The relay's session table.
    pub(crate) sessions: Arc<ferry_udp::session::Sessions>,
}

impl SessionRelay {
    pub(crate) fn start() -> SessionRelay {
        let sessions = Arc::new(ferry_udp::session::Sessions::new(Default::default()));
        let udp = ferry_udp::Relay::start_sessions(
            "--relay-port",
            "127.0.0.1:0".parse().expect("literal"),
            sessions.clone(),
            Default::default(),
        )
        .expect("session socket");
        let mut config = DerpConfig::new(NodePrivate::generate());
        config.relay_sessions = Some(sessions.clone());
        let (server, url) = start(config, None);
        SessionRelay {
            server: Some(server),
            udp,
            url,
            sessions,
        }
    }
}

impl Drop for SessionRelay {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
            let _ = s.wait();
        }
    }
}
