//! Running the built `ferry` binary on loopback: spawn it, watch its log,
//! signal it, wait for it to exit. Every wait is bounded.
//!
//! The binary turns every `FERRY_<FLAG>` (and derper images' `DERP_*`)
//! variable into a flag, so the processes started here get none of the
//! test's own: only what a test sets. Their I/O back end is the default
//! (`--io auto`) unless `FERRY_TEST_IO` names one (passed on as
//! `FERRY_IO`) or the test gives `--io`; every DERP server started here
//! must log that it runs on the back end that asks for
//! ([`ferry_testkit::backend`]): a silent fallback from io_uring fails.
#![allow(dead_code)]

pub(crate) mod sessions;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_testkit::backend::IoMode;

/// How long any single wait in these tests may take.
pub(crate) const T: Duration = Duration::from_secs(20);

/// The binary under test, with none of the test environment's variables
/// that it would read as flags, and the back end `FERRY_TEST_IO` names.
pub(crate) fn ferry() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("FERRY_") || name.starts_with("DERP_") {
            c.env_remove(&*name);
        }
    }
    if let Some(backend) = ferry_testkit::backend::from_env() {
        c.env("FERRY_IO", backend.name());
    }
    c.stdin(Stdio::null());
    c
}

/// The subcommands, which start no DERP server (and read no `FERRY_*`).
const SUBCOMMANDS: [&str; 4] = ["udp-relay", "status", "check-config", "link"];

/// The back end `c` asks for, if it starts a DERP server: its last `--io`,
/// else the `FERRY_IO` it is given, else `auto`. `None` for a subcommand
/// or a value the binary refuses (a test of that refusal).
fn requested_io(c: &Command) -> Option<IoMode> {
    let args: Vec<String> = c
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args
        .first()
        .is_some_and(|a| SUBCOMMANDS.contains(&a.as_str()))
    {
        return None;
    }
    let from_args = args
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a.strip_prefix("--io") {
            Some("") => args.get(i + 1).cloned(),
            Some(v) => v.strip_prefix('=').map(str::to_owned),
            None => None,
        })
        .next_back();
    let from_env = c
        .get_envs()
        .find(|(k, _)| *k == "FERRY_IO")
        .and_then(|(_, v)| v)
        .map(|v| v.to_string_lossy().into_owned());
    match from_args.or(from_env) {
        Some(v) => v.parse().ok(),
        None => Some(IoMode::Auto),
    }
}

/// The back end named in a line that states it (`I/O back end`, `ferry
/// relay running`), text or JSON.
fn backend_in(line: &str) -> Option<String> {
    if !(line.contains("I/O back end") || line.contains("ferry relay running")) {
        return None;
    }
    if line.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        return v["fields"]["backend"].as_str().map(str::to_owned);
    }
    field_in(line, "backend")
}

/// Runs the command as `nobody` when the tests run as root (the child then
/// has no capabilities); unchanged otherwise.
pub(crate) fn unprivileged(c: &mut Command) -> &mut Command {
    if ferry_sys::is_root() {
        c.uid(65534).gid(65534);
    }
    c
}

/// A directory of its own, removed on drop. Open to everyone, so an
/// unprivileged child can write into it.
pub(crate) struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        use std::os::unix::fs::PermissionsExt;
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ferry-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        TempDir(dir)
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `c` to completion (bounded by [`T`]); returns its status and
/// standard error.
pub(crate) fn run(c: &mut Command) -> (ExitStatus, String) {
    let mut f = Ferry::spawn(c);
    let status = f.wait_exit(T).expect("ferry exits");
    (status, f.log())
}

/// A running ferry whose standard error is collected.
pub(crate) struct Ferry {
    child: Child,
    log: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
    /// The back end it must run on, while not yet checked.
    io: Option<IoMode>,
    /// The back end its log names, once it did.
    backend: Arc<Mutex<Option<String>>>,
    /// The test that started it.
    test: String,
}

impl Ferry {
    pub(crate) fn spawn(c: &mut Command) -> Ferry {
        let io = requested_io(c);
        let mut child = c
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ferry starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let backend = Arc::new(Mutex::new(None));
        let (sink, named) = (log.clone(), backend.clone());
        let reader = std::thread::spawn(move || {
            let mut lines = BufReader::new(stderr);
            let mut line = String::new();
            while lines.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                if let Some(b) = backend_in(&line) {
                    named.lock().unwrap().get_or_insert(b);
                }
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        Ferry {
            child,
            log,
            reader: Some(reader),
            io,
            backend,
            test: ferry_testkit::skip::test_name(env!("CARGO_PKG_NAME"), module_path!()),
        }
    }

    /// Once the log names the back end: checks that it is the one asked
    /// for (panics otherwise), once.
    fn check_backend(&mut self) {
        let Some(io) = self.io else { return };
        let Some(got) = self.backend.lock().unwrap().clone() else {
            return;
        };
        self.io = None;
        let relay = format!("ferry (pid {})", self.pid());
        ferry_testkit::backend::check(&self.test, &relay, io, &got);
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything logged so far.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Everything logged so far, once the back end was checked if the log
    /// names it already.
    fn checked_log(&mut self) -> String {
        self.check_backend();
        self.log()
    }

    /// Waits until the log holds `needle` at least `count` times; returns
    /// the log, or panics with it after [`T`].
    pub(crate) fn wait_log_n(&mut self, needle: &str, count: usize) -> String {
        let deadline = Instant::now() + T;
        loop {
            let log = self.checked_log();
            if log.matches(needle).count() >= count {
                return log;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader catch up with the last lines.
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                let log = self.checked_log();
                if log.matches(needle).count() >= count {
                    return log;
                }
                panic!("ferry exited ({status}) before logging {needle:?}:\n{log}");
            }
            if Instant::now() > deadline {
                panic!("no {needle:?} in ferry's log within {T:?}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn wait_log(&mut self, needle: &str) -> String {
        self.wait_log_n(needle, 1)
    }

    /// The value of `key=` in the first log line holding `message`.
    pub(crate) fn field(&mut self, message: &str, key: &str) -> String {
        let log = self.wait_log(message);
        let line = log.lines().find(|l| l.contains(message)).unwrap();
        field_in(line, key).unwrap_or_else(|| panic!("no {key}= in {line}"))
    }

    pub(crate) fn signal(&self, sig: i32) {
        ferry_sys::signal::send(self.pid(), sig).expect("signal sent");
    }

    /// Waits up to `timeout` for the process to exit.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                self.check_backend();
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits for a clean exit.
    pub(crate) fn stop(mut self) -> String {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit(T).expect("ferry stops on SIGTERM");
        let log = self.log();
        assert!(status.success(), "{status}:\n{log}");
        log
    }
}

impl Drop for Ferry {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if !std::thread::panicking() {
            self.check_backend();
        }
    }
}

/// `key=value` or `key="value"` from a log line.
pub(crate) fn field_in(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    let rest = &line[start..];
    if let Some(quoted) = rest.strip_prefix('"') {
        return quoted.split('"').next().map(str::to_string);
    }
    rest.split_whitespace().next().map(str::to_string)
}

/// A plain-HTTP DERP server (`ferry` without a subcommand) on a free
/// loopback port with one shard, STUN on a free port and its key in `dir`,
/// plus `extra` flags; [`serving`] starts it.
pub(crate) fn derp_server(dir: &TempDir, extra: &[&str]) -> Command {
    let mut c = ferry();
    c.args(["-a", "127.0.0.1:0", "--stun-port", "0", "--workers", "1"])
        .args(["-c", &dir.path("ferry.key")])
        .args(extra);
    c
}

/// Starts `c` and waits until it serves; returns it and its DERP address.
pub(crate) fn serving(c: &mut Command) -> (Ferry, SocketAddr) {
    let mut f = Ferry::spawn(c);
    let url = f.field("ferry relay running", "url");
    (f, url_addr(&url))
}

/// The address in a URL such as `http://127.0.0.1:1234/derp`.
pub(crate) fn url_addr(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).unwrap_or(url);
    rest.split('/').next().unwrap().parse().unwrap()
}

/// A plain HTTP GET; returns the whole response.
pub(crate) fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, T).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = Vec::new();
    let _ = s.read_to_end(&mut body);
    String::from_utf8_lossy(&body).into_owned()
}

/// Asks `addr` for `/healthz` and checks the answer both relays give:
/// 200 and the JSON status, version, back end and uptime; returns the
/// back end.
pub(crate) fn check_healthz(addr: SocketAddr) -> String {
    let r = get(addr, "/healthz");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("Content-Type: application/json"), "{r}");
    let body = r.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["status"], "ok", "{r}");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["backend"] == "uring" || v["backend"] == "epoll", "{r}");
    assert!(v["uptime_seconds"].is_u64(), "{r}");
    v["backend"].as_str().unwrap().to_owned()
}

/// A loopback TCP port that was free a moment ago.
pub(crate) fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
