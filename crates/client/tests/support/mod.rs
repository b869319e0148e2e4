//! Servers for the SDK's tests: Ferry's relay started in this process, and
//! Tailscale's `derper` started as a child process, both on loopback,
//! plain HTTP or TLS with a certificate from a test CA.
//!
//! derper is looked for in `FERRY_DERPER_BIN`, then `interop/bin/derper`
//! (where the interop suite and `.ci/setup.d/10-derper.sh` build it), then
//! `~/go/bin/derper`. Without it the tests fail under `CI=true` and skip
//! their derper half otherwise (`ferry_testkit::skip!`).
//!
//! Ferry runs on the back end `FERRY_TEST_IO` names, else the default, and
//! must report that it does ([`ferry_testkit::backend`]).
#![allow(dead_code)]

use ferry_client::{DerpClient, Event};
use ferry_derp::{DerpConfig, ListenerKind, ListenerSpec, Server, ServerOptions};
use ferry_proto::key::NodePrivate;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which server a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Ferry,
    Derper,
}

/// The servers this run covers: Ferry always, derper when it is found.
pub(crate) fn kinds() -> Vec<Kind> {
    match derper_bin() {
        Ok(_) => vec![Kind::Ferry, Kind::Derper],
        Err(why) => {
            ferry_testkit::skip!("the derper half of this test: {why}");
            vec![Kind::Ferry]
        }
    }
}

fn derper_bin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FERRY_DERPER_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("FERRY_DERPER_BIN={} is not a file", p.display()))
        };
    }
    let mut candidates =
        vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop/bin/derper")];
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(Path::new(&home).join("go/bin/derper"));
    }
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        format!(
            "no derper binary at {} (build it with .ci/setup.d/10-derper.sh, or set FERRY_DERPER_BIN)",
            candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        )
    })
}

/// A directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "ferry-client-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A test CA and a certificate it issued for `localhost`, written as
/// derper's manual mode reads it (`localhost.crt`, `localhost.key`).
pub(crate) struct TestCa {
    pub(crate) dir: TempDir,
    pub(crate) root: rustls::pki_types::CertificateDer<'static>,
    /// The certificate both servers serve (before the meta-certificate).
    pub(crate) leaf: rustls::pki_types::CertificateDer<'static>,
}

impl TestCa {
    pub(crate) fn new() -> Arc<Self> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "ferry-client test CA");
        let ca = ca.self_signed(&ca_key).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &ca, &ca_key)
            .unwrap();
        let dir = TempDir::new();
        std::fs::write(dir.path().join("localhost.crt"), leaf.pem()).unwrap();
        std::fs::write(dir.path().join("localhost.key"), leaf_key.serialize_pem()).unwrap();
        Arc::new(TestCa {
            dir,
            root: ca.der().clone(),
            leaf: leaf.der().clone(),
        })
    }

    /// Client options trusting this CA only.
    pub(crate) fn roots(&self) -> ferry_client::TlsRoots {
        let mut store = rustls::RootCertStore::empty();
        store.add(self.root.clone()).unwrap();
        ferry_client::TlsRoots::Custom(Arc::new(store))
    }
}

/// Checks that an in-process Ferry started with `io` runs on the back end
/// that gives.
pub(crate) fn check_backend(server: &Server, io: ferry_engine::IoMode) {
    ferry_testkit::backend::check(
        &ferry_testkit::skip::test_name(env!("CARGO_PKG_NAME"), module_path!()),
        "in-process ferry",
        io,
        server.metrics().backend,
    );
}

/// A running DERP server.
pub(crate) struct TestServer {
    pub(crate) kind: Kind,
    pub(crate) addr: SocketAddr,
    tls: Option<Arc<TestCa>>,
    tweak: fn(&mut DerpConfig),
    ferry: Option<Server>,
    derper: Option<Child>,
    state: TempDir,
}

impl TestServer {
    /// Starts `kind` on a free loopback port, TLS when `tls` is given.
    pub(crate) fn start(kind: Kind, tls: Option<Arc<TestCa>>) -> TestServer {
        TestServer::start_with(kind, tls, |_| {})
    }

    /// Like [`TestServer::start`], with Ferry's configuration changed by
    /// `tweak` (derper has no such knobs).
    pub(crate) fn start_with(
        kind: Kind,
        tls: Option<Arc<TestCa>>,
        tweak: fn(&mut DerpConfig),
    ) -> TestServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut s = TestServer {
            kind,
            addr: port,
            tls,
            tweak,
            ferry: None,
            derper: None,
            state: TempDir::new(),
        };
        s.launch();
        s
    }

    /// The URL clients dial.
    pub(crate) fn url(&self) -> String {
        match self.tls {
            Some(_) => format!("https://localhost:{}/derp", self.addr.port()),
            None => format!("http://{}/derp", self.addr),
        }
    }

    /// Stops the server: Ferry gracefully (clients get `restarting`),
    /// derper by SIGKILL (it sends nothing).
    pub(crate) fn stop(&mut self) {
        if let Some(server) = self.ferry.take() {
            server.shutdown();
            server.wait().expect("ferry stops cleanly");
        }
        if let Some(mut child) = self.derper.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts it again on the same port with the
    /// same key.
    pub(crate) fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    fn launch(&mut self) {
        match self.kind {
            Kind::Ferry => self.launch_ferry(),
            Kind::Derper => self.launch_derper(),
        }
    }

    fn ferry_key(&self) -> NodePrivate {
        // The same key on every start, as derper keeps its key file.
        let path = self.state.path().join("ferry.key");
        match std::fs::read(&path) {
            Ok(bytes) => NodePrivate::from_bytes(bytes.try_into().expect("32 bytes")),
            Err(_) => {
                let key = NodePrivate::generate();
                std::fs::write(&path, key.as_bytes()).unwrap();
                key
            }
        }
    }

    fn launch_ferry(&mut self) {
        let mut cfg = DerpConfig::new(self.ferry_key());
        if let Some(ca) = &self.tls {
            let setup = ferry_derp::tls::server_config(
                &ferry_derp::tls::CertMode::Manual {
                    certdir: ca.dir.path().to_owned(),
                    hostname: "localhost".into(),
                },
                *cfg.public_key.as_bytes(),
            )
            .expect("manual TLS set-up");
            cfg.tls = Some(setup.config);
        }
        (self.tweak)(&mut cfg);
        let io = ferry_testkit::backend::mode();
        let options = ServerOptions {
            config: cfg,
            listeners: vec![ListenerSpec {
                addr: self.addr,
                kind: ListenerKind::Derp,
            }],
            workers: 1,
            pin: false,
            stun: None,
            metrics_addr: None,
            io,
            inherited: Vec::new(),
        };
        // The port may still be held briefly by the previous instance.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Server::start(options.clone()) {
                Ok(server) => {
                    check_backend(&server, io);
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

    fn launch_derper(&mut self) {
        let bin = derper_bin().expect("derper was found by kinds()");
        let mut args: Vec<String> = vec![
            "-a".into(),
            self.addr.to_string(),
            "--http-port".into(),
            "-1".into(),
            "--stun=false".into(),
            "-c".into(),
            self.state.path().join("derper.key").display().to_string(),
        ];
        if let Some(ca) = &self.tls {
            args.extend([
                "--certmode".into(),
                "manual".into(),
                "--certdir".into(),
                ca.dir.path().display().to_string(),
                "--hostname".into(),
                "localhost".into(),
            ]);
        }
        let log = std::fs::File::create(self.state.path().join("derper.log")).unwrap();
        let mut child = Command::new(&bin)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        // Ready when the port accepts; bounded, and the process must live.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("derper exited at start ({status}): {}", self.derper_log());
            }
            if TcpStream::connect(self.addr).is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "derper not listening on {} after 15 s: {}",
                self.addr,
                self.derper_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.derper = Some(child);
    }

    /// What derper logged so far.
    pub(crate) fn derper_log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("derper.log")).unwrap_or_default()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Events up to and including the first that `want` accepts, bounded in
/// time and count; panics with what came instead.
pub(crate) async fn wait_for(
    client: &mut DerpClient,
    limit: Duration,
    what: &str,
    mut want: impl FnMut(&Event) -> bool,
) -> (Event, Vec<Event>) {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    for _ in 0..10_000 {
        match tokio::time::timeout_at(deadline, client.recv()).await {
            Ok(Ok(e)) if want(&e) => return (e, seen),
            Ok(Ok(e)) => seen.push(e),
            Ok(Err(e)) => panic!("waiting for {what}: client ended ({e}); before: {seen:?}"),
            Err(_) => panic!("no {what} within {limit:?}; events: {seen:?}"),
        }
    }
    panic!("no {what} among 10000 events");
}

/// A TCP relay between clients and a server that can go silent: after
/// [`Blackhole::silence`], the connections open so far stay open but carry
/// nothing either way (what a dead path looks like); later connections
/// work normally.
pub(crate) struct Blackhole {
    pub(crate) addr: SocketAddr,
    conns: Arc<std::sync::Mutex<Vec<Arc<std::sync::atomic::AtomicBool>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Blackhole {
    pub(crate) async fn start(upstream: SocketAddr) -> Blackhole {
        use std::sync::atomic::AtomicBool;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let list = conns.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let silent = Arc::new(AtomicBool::new(false));
                list.lock().unwrap().push(silent.clone());
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, silent.clone()));
                tokio::spawn(pipe(sr, cw, silent));
            }
        });
        Blackhole { addr, conns, task }
    }

    /// Silences every connection open now.
    pub(crate) fn silence(&self) {
        for c in self.conns.lock().unwrap().iter() {
            c.store(true, Ordering::SeqCst);
        }
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if silent.load(Ordering::SeqCst) {
            // Hold both sockets open and forward nothing, ever.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
