//! The examples a user copies, run as a user runs them: two processes of
//! each against a Ferry DERP server in this process, on loopback, driven
//! through their input and output, bounded in time. `cargo test` builds
//! the examples before it runs this.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::UdpSocket;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{Kind, TestServer};

/// Generous bound for what should take milliseconds.
const QUICK: Duration = Duration::from_secs(20);

/// The built example `name` (`target/<profile>/examples/<name>`, beside
/// this test's own `deps` directory).
fn example(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("the test's path");
    let profile = me
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let path = profile.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo test -p ferry-client` (which builds the examples) or `cargo build -p ferry-client --examples`",
        path.display()
    );
    path
}

/// A running example: its input, its output lines as they come, killed
/// on drop.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(name: &str, args: &[&str]) -> Running {
        let mut child = Command::new(example(name))
            .args(args)
            .env("RUST_LOG", "off")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Running {
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The rest of the first output line from now on that starts with
    /// `prefix`, within [`QUICK`].
    fn line(&mut self, prefix: &str) -> String {
        let line = self.line_where(prefix, |l| l.starts_with(prefix));
        line[prefix.len()..].to_owned()
    }

    /// The first output line from now on that `want` accepts, within
    /// [`QUICK`].
    fn line_where(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + QUICK;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                Err(e) => panic!("no line `{what}` ({e}); output so far: {:?}", self.seen),
            }
        }
    }

    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("input open");
        writeln!(stdin, "{line}").expect("writing to the example");
        stdin.flush().expect("flushing");
    }

    /// Ends the input; the example must exit successfully within
    /// [`QUICK`].
    fn finish(mut self) {
        self.stdin = None;
        let deadline = Instant::now() + QUICK;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting") {
                assert!(status.success(), "exited with {status}: {:?}", self.seen);
                return;
            }
            assert!(Instant::now() < deadline, "still running: {:?}", self.seen);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn two_chats_exchange_lines() {
    let server = TestServer::start(Kind::Ferry, None);
    let url = server.url();
    let mut a = Running::start("chat", &[&url]);
    let mut b = Running::start("chat", &[&url]);
    let (ka, kb) = (a.line("me: "), b.line("me: "));
    a.say(&format!("/peer {kb}"));
    b.say(&format!("/peer {ka}"));
    assert_eq!(a.line("peer: "), kb);
    assert_eq!(b.line("peer: "), ka);
    a.say("hello from a");
    b.line_where("…: hello from a", |l| l.ends_with(": hello from a"));
    b.say("hello from b");
    a.line_where("…: hello from b", |l| l.ends_with(": hello from b"));
    a.finish();
    b.finish();
}

#[test]
fn two_forwarders_carry_an_exchange_both_ways() {
    let server = TestServer::start(Kind::Ferry, None);
    let url = server.url();
    // The application and its client, on loopback.
    let app = UdpSocket::bind("127.0.0.1:0").unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    for s in [&app, &client] {
        s.set_read_timeout(Some(QUICK)).unwrap();
    }
    let app_addr = app.local_addr().unwrap().to_string();
    let mut near_app = Running::start("forward", &[&url, "127.0.0.1:0", "--to", &app_addr]);
    let mut near_client = Running::start("forward", &[&url, "127.0.0.1:0"]);
    let (ka, kb) = (near_app.line("me: "), near_client.line("me: "));
    let entry = near_client.line("listening: ");
    near_app.line("listening: ");
    near_app.say(&kb);
    near_client.say(&ka);
    near_app.line("peer: ");
    near_client.line("peer: ");
    // The client's request reaches the application through both…
    let mut buf = [0u8; 2048];
    let mut got = None;
    let deadline = Instant::now() + QUICK;
    // The first datagram may come before the far side added its peer (it
    // is then dropped there): send until one arrives, bounded.
    app.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    while got.is_none() {
        assert!(
            Instant::now() < deadline,
            "no request through the forwarders"
        );
        client.send_to(b"request", &entry).unwrap();
        if let Ok((n, from)) = app.recv_from(&mut buf) {
            got = Some((buf[..n].to_vec(), from));
        }
    }
    let (request, from) = got.unwrap();
    assert_eq!(request, b"request");
    // …and the answer comes back to the client.
    app.send_to(b"answer", from).unwrap();
    let (n, _) = client
        .recv_from(&mut buf)
        .expect("the answer within the bound");
    assert_eq!(&buf[..n], b"answer");
    near_app.finish();
    near_client.finish();
}
