//! What an idle TLS connection keeps in the relay's heap (at most 8 KiB
//! of server memory each): with Ferry's own record layer after the
//! handshake (the default) and with rustls for the whole
//! connection (`--tls-records rustls`), each against its bar ([`BAR`],
//! [`RUSTLS_BAR`]).
//!
//! Its own test binary, so that nothing else runs in the process. The
//! figure is glibc's own account of the heap in use (`mallinfo2`, as the
//! `ferry_heap_in_use_bytes` gauge reads it): every block with its
//! header and rounding, whoever allocated it (Rust code, and aws-lc's
//! AES-GCM key schedules, which the C library allocates). The clients run
//! in a child process (this same binary, told so by an environment
//! variable), so that only the relay allocates in this one: the child
//! opens the connections over TLS, completes the DERP handshake on each,
//! pings each and waits for the pong (so the relay has handled everything
//! the client sent and sent its answer), then says it is ready and holds
//! them. A first batch of as many connections warms up what the relay
//! grows once (rustls' shared state, the metrics) and brings its tables
//! to the size where the measured batch doubles them: what that doubling
//! adds is one table entry per measured connection, as in steady state.
//! The heap in use before and after the measured batch, divided by its
//! connections, must stay within the bar.
//!
//! The bench's idle suite (`ferry-bench idle`) measures the server's RSS
//! instead, which also holds what the arenas keep free. Kernel socket
//! buffers are in neither.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_derp::config::TlsRecords;
use ferry_proto::client::Event;

/// Set in the child: the relay's address and how many clients to hold.
const CHILD_ENV: &str = "FERRY_TEST_IDLE_CLIENTS";
/// The child's line once its clients are connected and quiet.
const READY: &str = "idle-clients-ready";
/// Connections of the warm-up batch and of the measured one.
const WARM: usize = 256;
const HELD: usize = 256;
/// The bar with Ferry's record layer: bytes of heap per idle TLS
/// connection. 2,493 B measured: rustls is dropped after the handshake, and
/// what is left is aws-lc's two AEAD contexts (about 1.2 KiB), the record
/// layer's keys and counters (under 200 B) and the relay's own share,
/// mostly the connection's slab entry (about 850 B) and its registry
/// entries.
const BAR: i64 = 3 * 1024 + 512;
/// The bar with rustls for the whole connection. About 8.7 KiB (8,906 B
/// measured), of which rustls' buffered `ServerConnection` holds 4 KiB in
/// its input buffer (grown back to 4 KiB before every read and never
/// released) and about 2 KiB in its own state.
const RUSTLS_BAR: i64 = 9 * 1024;

#[test]
fn idle_tls_connection_stays_under_its_bar() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        hold_clients(&spec);
        return;
    }
    // One back end after the other: the heap is the whole process's.
    ferry_testkit::on_each_backend!(both_layers);
}

fn both_layers() {
    for (records, bar) in [(TlsRecords::Ferry, BAR), (TlsRecords::Rustls, RUSTLS_BAR)] {
        let per_conn = per_idle_connection(records);
        println!(
            "idle TLS connection, {records} records on {:?}: {per_conn} B of the relay's heap each",
            support::io_mode()
        );
        assert!(
            per_conn <= bar,
            "an idle TLS connection ({records} records) keeps {per_conn} B of the relay's heap, more than {bar} B"
        );
    }
}

/// Heap in use per idle TLS connection of a relay with this record layer.
fn per_idle_connection(records: TlsRecords) -> i64 {
    let (server, addr) = support::start(1, |cfg| {
        cfg.tls = Some(support::self_signed_tls(cfg).config);
        cfg.tls_records = records;
        cfg.keepalive = Duration::from_secs(3600);
    });
    let metrics = server.metrics();
    let connections = || {
        metrics
            .shards
            .iter()
            .map(|s| s.current_connections.get())
            .sum::<i64>()
    };
    let warm = Clients::start(addr, WARM);
    settle(|| connections() == WARM as i64);
    let before = heap_in_use();
    let held = Clients::start(addr, HELD);
    settle(|| connections() == (WARM + HELD) as i64);
    let per_conn = (heap_in_use() - before) / HELD as i64;
    drop(held);
    drop(warm);
    support::stop(server);
    per_conn
}

/// Waits (bounded) until `ready` holds and the live heap stops changing
/// from one look to the next: the relay has finished with what the
/// clients sent.
fn settle(ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = heap_in_use();
    let mut steady = 0;
    while steady < 3 {
        assert!(Instant::now() < deadline, "the relay did not settle");
        std::thread::sleep(Duration::from_millis(20));
        let now = heap_in_use();
        steady = if ready() && now == last {
            steady + 1
        } else {
            0
        };
        last = now;
    }
}

/// glibc's heap in use, bytes.
fn heap_in_use() -> i64 {
    let stats = ferry_sys::heap::heap_stats().expect("glibc's mallinfo2");
    i64::try_from(stats.in_use).expect("heap size")
}

/// A child process holding idle clients until dropped.
struct Clients {
    child: std::process::Child,
    /// Its output, kept open so that what it still prints does not fail.
    _stdout: BufReader<ChildStdout>,
}

impl Clients {
    /// Starts the child and waits until its `n` clients are connected
    /// and quiet.
    fn start(addr: SocketAddr, n: usize) -> Clients {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "idle_tls_connection_stays_under_its_bar",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{addr} {n}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("client process");
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        // The child ends its output (or dies) within its own bounded
        // connects; lines are read until the ready line or the end.
        let mut line = String::new();
        while out.read_line(&mut line).expect("child output") > 0 {
            if line.contains(READY) {
                return Clients {
                    child,
                    _stdout: out,
                };
            }
            line.clear();
        }
        let status = child.wait().expect("child");
        panic!("the client process ended before its clients were ready: {status}");
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        // Closing its stdin lets the child close its connections and end.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The child's part: connects, pings each client and waits for the pong,
/// says it is ready, and holds the connections until stdin closes.
fn hold_clients(spec: &str) {
    let (addr, n) = spec.split_once(' ').expect("address and count");
    let addr: SocketAddr = addr.parse().expect("address");
    let n: usize = n.parse().expect("count");
    let mut clients: Vec<_> = (0..n).map(|_| support::connect_tls(addr)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        let data = (i as u64).to_be_bytes();
        c.ping(data);
        match c.next_meaningful(Duration::from_secs(10)) {
            Ok(Event::Pong(got)) => assert_eq!(got, data, "pong for the ping"),
            other => panic!("expected a pong, got {other:?}"),
        }
    }
    println!("{READY}");
    let _ = std::io::stdin().read(&mut [0u8; 1]);
    drop(clients);
}
