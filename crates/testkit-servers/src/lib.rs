//! DERP servers for the tests of the crates that use one: the SDK
//! (`ferry-client`) and the binary (`ferry link`). Not published.
//!
//! - [`TestServer`]: Ferry's DERP server started in this process, or
//!   Tailscale's `derper` as a child process ([`ferry_testkit::derper`]),
//!   on a free loopback port, plain HTTP or TLS with a certificate from a
//!   test CA ([`TestCa`]); stopped and started again on the same port with
//!   the same key ([`TestServer::restart`]). [`kinds`] lists the servers
//!   a run covers: Ferry always, derper when it is found (a skip
//!   otherwise, which fails under `CI=true`).
//! - [`start`]: Ferry with a configuration of the test's own (STUN, limits).
//! - [`SessionRelay`]: Ferry with relay sessions, the relay-session socket
//!   of `ferry-udp` wired to the DERP shards as the binary wires it.
//! - [`region::SessionRegion`]: two such nodes meshed both ways over TLS
//!   as one region.
//!
//! Ferry runs on the back end `FERRY_TEST_IO` names, else the default, and
//! must report that it does ([`ferry_testkit::backend`]).
//!
//! # Why a crate of its own
//!
//! These helpers start `ferry_derp::Server`, so they depend on
//! `ferry-derp`. `ferry-testkit` cannot: the DERP crate's own tests use
//! `ferry-testkit`, and every crate below the DERP server (`ferry-sys`,
//! `ferry-engine`, `ferry-proto`, `ferry-udp`) would then build the DERP
//! server to run its tests. So what needs no DERP server (the derper
//! launcher, the test CA, skips, back ends) stays in `ferry-testkit`, and
//! this crate, which only the SDK and the binary depend on (as a
//! dev-dependency), adds the in-process Ferry on top. No crate includes
//! another's test files by `#[path]`.

use ferry_derp::{DerpConfig, ListenerKind, ListenerSpec, Server, ServerOptions};
use ferry_proto::key::NodePrivate;
use ferry_testkit::derper::{self, Derper};
use std::net::{SocketAddr, TcpListener};
use std::panic::Location;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod region;

pub use ferry_testkit::certs::TestCa;
pub use ferry_testkit::TempDir;

/// Which server a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Ferry's DERP server, in this process.
    Ferry,
    /// Tailscale's `derper`, a child process.
    Derper,
}

/// `<file of the calling test>::<test>`, for skips and back-end checks
/// made on a test's behalf (libtest names a test's thread after it).
fn test_name(at: &Location<'_>) -> String {
    let thread = std::thread::current();
    format!("{}::{}", at.file(), thread.name().unwrap_or("main"))
}

/// The servers this run covers: Ferry always, derper when it is found
/// (else the derper half is skipped: a failure under `CI=true`).
#[track_caller]
pub fn kinds() -> Vec<Kind> {
    let at = Location::caller();
    match derper::bin() {
        Ok(_) => vec![Kind::Ferry, Kind::Derper],
        Err(why) => {
            ferry_testkit::skip::skip(
                &test_name(at),
                &format!("the derper half of this test: {why}"),
            );
            vec![Kind::Ferry]
        }
    }
}

/// Checks that an in-process Ferry started with `io` runs on the back end
/// that gives.
fn check_backend(at: &Location<'_>, server: &Server, io: ferry_engine::IoMode) {
    ferry_testkit::backend::check(
        &test_name(at),
        "in-process ferry",
        io,
        server.metrics().backend,
    );
}

/// A running DERP server.
pub struct TestServer {
    /// Which one.
    pub kind: Kind,
    /// Where it listens.
    pub addr: SocketAddr,
    tls: Option<Arc<TestCa>>,
    tweak: fn(&mut DerpConfig),
    ferry: Option<Server>,
    derper: Option<Derper>,
    state: TempDir,
    at: &'static Location<'static>,
}

impl TestServer {
    /// Starts `kind` on a free loopback port, TLS when `tls` is given.
    #[track_caller]
    pub fn start(kind: Kind, tls: Option<Arc<TestCa>>) -> TestServer {
        TestServer::launch_new(kind, tls, |_| {}, Location::caller())
    }

    /// Like [`TestServer::start`], with Ferry's configuration changed by
    /// `tweak` (derper has no such knobs).
    #[track_caller]
    pub fn start_with(
        kind: Kind,
        tls: Option<Arc<TestCa>>,
        tweak: fn(&mut DerpConfig),
    ) -> TestServer {
        TestServer::launch_new(kind, tls, tweak, Location::caller())
    }

    fn launch_new(
        kind: Kind,
        tls: Option<Arc<TestCa>>,
        tweak: fn(&mut DerpConfig),
        at: &'static Location<'static>,
    ) -> TestServer {
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let mut s = TestServer {
            kind,
            addr,
            tls,
            tweak,
            ferry: None,
            derper: None,
            state: TempDir::new("test-server"),
            at,
        };
        s.launch();
        s
    }

    /// The URL clients dial.
    pub fn url(&self) -> String {
        match self.tls {
            Some(_) => format!("https://localhost:{}/derp", self.addr.port()),
            None => format!("http://{}/derp", self.addr),
        }
    }

    /// Stops the server: Ferry gracefully (clients get `restarting`),
    /// derper by SIGKILL (it sends nothing).
    pub fn stop(&mut self) {
        if let Some(server) = self.ferry.take() {
            server.shutdown();
            server.wait().expect("ferry stops cleanly");
        }
        self.derper = None;
    }

    /// Stops the server and starts it again on the same port with the
    /// same key.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// What derper logged so far (empty for Ferry).
    pub fn derper_log(&self) -> String {
        self.derper.as_ref().map(Derper::log).unwrap_or_default()
    }

    fn launch(&mut self) {
        match self.kind {
            Kind::Ferry => self.launch_ferry(),
            Kind::Derper => {
                let certs = self.tls.as_ref().map(|ca| ca.dir.path());
                self.derper = Some(Derper::start(self.addr, self.state.path(), certs));
            }
        }
    }

    fn ferry_key(&self) -> NodePrivate {
        // The same key on every start, as derper keeps its key file.
        let path = self.state.path().join("ferry.key");
        match std::fs::read(&path) {
            Ok(bytes) => NodePrivate::from_bytes(bytes.try_into().expect("32 bytes")),
            Err(_) => {
                let key = NodePrivate::generate();
                std::fs::write(&path, key.as_bytes()).expect("writing the key");
                key
            }
        }
    }

    fn launch_ferry(&mut self) {
        let mut cfg = DerpConfig::new(self.ferry_key());
        if let Some(ca) = &self.tls {
            let setup = ferry_derp::certs::server_config(
                &ferry_derp::certs::CertMode::Manual {
                    certdir: ca.dir.path().to_owned(),
                    hostname: "localhost".into(),
                },
                *cfg.public_key.as_bytes(),
            )
            .expect("manual TLS set-up");
            cfg.tls = Some(setup.config);
        }
        (self.tweak)(&mut cfg);
        let options = server_options(cfg, self.addr, None);
        let io = options.io;
        // The port may still be held briefly by the previous instance.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Server::start(options.clone()) {
                Ok(server) => {
                    check_backend(self.at, &server, io);
                    self.ferry = Some(server);
                    return;
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("ferry did not start yet ({e}); retrying");
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("ferry does not start on {}: {e}", self.addr),
            }
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One DERP listener on `addr`, one worker, on the back end the test asks
/// for.
fn server_options(config: DerpConfig, addr: SocketAddr, stun: Option<SocketAddr>) -> ServerOptions {
    ServerOptions {
        config,
        listeners: vec![ListenerSpec {
            addr,
            kind: ListenerKind::Derp,
        }],
        workers: 1,
        pin: false,
        stun,
        metrics_addr: None,
        io: ferry_testkit::backend::mode(),
        inherited: Vec::new(),
    }
}

/// Ferry with `config` on a loopback port, STUN at `stun` if given; the
/// server and its DERP URL.
#[track_caller]
pub fn start(config: DerpConfig, stun: Option<SocketAddr>) -> (Server, String) {
    let at = Location::caller();
    let derp = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let options = server_options(config, derp, stun);
    let io = options.io;
    let server = Server::start(options).expect("ferry starts");
    check_backend(at, &server, io);
    (server, format!("http://{derp}/derp"))
}

/// Ferry with relay sessions: DERP and the session socket on loopback.
/// Shut down on drop.
pub struct SessionRelay {
    server: Option<Server>,
    /// The relay-session socket group (its metrics count what it dropped).
    pub udp: ferry_udp::Relay,
    /// The DERP URL.
    pub url: String,
    /// The relay's session table.
    pub sessions: Arc<ferry_udp::session::Sessions>,
}

impl SessionRelay {
    /// Starts both halves.
    #[track_caller]
    pub fn start() -> SessionRelay {
        let at = Location::caller();
        let derp = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let (server, udp, sessions) =
            start_with_sessions(at, DerpConfig::new(NodePrivate::generate()), derp);
        SessionRelay {
            server: Some(server),
            udp,
            url: format!("http://{derp}/derp"),
            sessions,
        }
    }
}

/// Ferry with `config` on `derp` and relay sessions (a session socket on
/// loopback wired to it): the server, the socket group, the table.
pub(crate) fn start_with_sessions(
    at: &Location<'_>,
    mut config: DerpConfig,
    derp: SocketAddr,
) -> (Server, ferry_udp::Relay, Arc<ferry_udp::session::Sessions>) {
    let sessions = Arc::new(ferry_udp::session::Sessions::new(Default::default()));
    let udp = ferry_udp::Relay::start_sessions(
        "--relay-port",
        "127.0.0.1:0".parse().expect("literal"),
        sessions.clone(),
        Default::default(),
    )
    .expect("session socket");
    config.relay_sessions = Some(sessions.clone());
    let options = server_options(config, derp, None);
    let io = options.io;
    let server = Server::start(options).expect("ferry starts");
    check_backend(at, &server, io);
    (server, udp, sessions)
}

impl Drop for SessionRelay {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
            let _ = s.wait();
        }
    }
}
