//! What the SDK's tests share beyond the servers of
//! `ferry-testkit-servers` (Ferry in this process, `derper`, the test
//! CA): waiting for a DERP client's events, trusting the test CA, and a
//! TCP relay that can go silent.
#![allow(dead_code)]

use ferry_client::{DerpClient, Event};
// Each test file uses some of them.
#[allow(unused_imports)]
pub(crate) use ferry_testkit_servers::{kinds, Kind, SessionRelay, TestCa, TestServer};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Client TLS roots trusting `ca` alone.
pub(crate) fn roots(ca: &TestCa) -> ferry_client::TlsRoots {
    ferry_client::TlsRoots::Custom(Arc::new(ca.root_store()))
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
