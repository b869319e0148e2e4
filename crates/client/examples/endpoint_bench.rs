//! Datagram throughput and round trip between two SDK endpoints on this
//! machine, per path, through a Ferry relay started in this process (or
//! the DERP server at `--url`).
//!
//! ```sh
//! cargo run --release -p ferry-client --example endpoint_bench -- \
//!     --path direct|derp [--count 200000] [--size 1200] [--rtt 2000] [--url http://host:port/derp]
//! ```
//!
//! Throughput: A sends `count` datagrams of `size` bytes as fast as
//! `send` takes them (it never waits; what it drops is counted), B counts
//! what arrives until nothing came for a second. Round trip: `rtt` echoes
//! one at a time, B answering each. Measure on a quiet machine.

use ferry_client::{Endpoint, EndpointOptions, PathKind, PeerOptions, RelayOptions};
use ferry_proto::key::NodePrivate;
use ferry_relay::{ListenerKind, ListenerSpec, RelayConfig, Server, ServerOptions};
use std::net::TcpListener;
use std::time::{Duration, Instant};

struct Args {
    path: PathKind,
    count: u64,
    size: usize,
    rtt: usize,
    url: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        path: PathKind::Direct,
        count: 200_000,
        size: 1200,
        rtt: 2000,
        url: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--path" => {
                a.path = match value.as_str() {
                    "direct" => PathKind::Direct,
                    "derp" => PathKind::Derp,
                    other => return Err(format!("--path {other}: direct or derp")),
                }
            }
            "--count" => a.count = value.parse().map_err(bad)?,
            "--size" => a.size = value.parse().map_err(bad)?,
            "--rtt" => a.rtt = value.parse().map_err(bad)?,
            "--url" => a.url = Some(value),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn start_ferry() -> (Server, String) {
    let addr = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let server = Server::start(ServerOptions {
        config: RelayConfig::new(NodePrivate::generate()),
        listeners: vec![ListenerSpec {
            addr,
            kind: ListenerKind::Derp,
        }],
        workers: 1,
        pin: false,
        stun: None,
        metrics_addr: None,
        io: Default::default(),
        inherited: Vec::new(),
    })
    .expect("ferry starts");
    (server, format!("http://{addr}/derp"))
}

async fn endpoint(url: &str, queue: usize) -> Endpoint {
    let mut relay = RelayOptions::new("bench", url);
    relay.stun = Some("127.0.0.1:9".parse().expect("literal"));
    let mut o = EndpointOptions::new(NodePrivate::generate(), vec![relay]);
    o.bind = "127.0.0.1:0".parse().expect("literal");
    o.queue = queue;
    Endpoint::bind(o).await.expect("endpoint binds")
}

#[tokio::main]
async fn main() {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("endpoint_bench: {e}");
            std::process::exit(2);
        }
    };
    let (_server, url) = match &args.url {
        Some(u) => (None, u.clone()),
        None => {
            let (s, u) = start_ferry();
            (Some(s), u)
        }
    };
    let a = endpoint(&url, 8192).await;
    let b = endpoint(&url, 8192).await;
    let (ka, kb) = (a.public_key(), b.public_key());
    let peer = PeerOptions {
        only: Some(args.path),
        ..PeerOptions::default()
    };
    a.add_peer(kb, peer);
    b.add_peer(ka, peer);
    let deadline = Instant::now() + Duration::from_secs(15);
    while a.peer_status(&kb).and_then(|s| s.active).map(|p| p.kind()) != Some(args.path)
        || b.peer_status(&ka).and_then(|s| s.active).map(|p| p.kind()) != Some(args.path)
    {
        assert!(
            Instant::now() < deadline,
            "no {:?} path within 15 s",
            args.path
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Round trip, one datagram at a time.
    let mut rtts = Vec::with_capacity(args.rtt);
    for i in 0..args.rtt as u64 {
        let t = Instant::now();
        a.send(&kb, &i.to_be_bytes()).expect("send");
        let (_, data) = tokio::time::timeout(Duration::from_secs(2), b.recv())
            .await
            .expect("echo request within 2 s")
            .expect("open");
        b.send(&ka, &data).expect("echo");
        tokio::time::timeout(Duration::from_secs(2), a.recv())
            .await
            .expect("echo within 2 s")
            .expect("open");
        rtts.push(t.elapsed());
    }
    rtts.sort();
    let pct = |p: usize| rtts.get(rtts.len() * p / 100).copied().unwrap_or_default();

    // Throughput, one way.
    let payload = vec![0x5a; args.size];
    let receiver = tokio::spawn(async move {
        let mut got = 0u64;
        let mut first = None;
        let mut last = Instant::now();
        while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), b.recv()).await {
            last = Instant::now();
            first.get_or_insert(last);
            got += 1;
        }
        let lagged = b.stats().recv_dropped;
        (got, first.map(|f| last - f).unwrap_or_default(), lagged)
    });
    let mut dropped = 0u64;
    for i in 0..args.count {
        if a.send(&kb, &payload).is_err() {
            dropped += 1;
        }
        if i % 256 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let (got, took, lagged) = receiver.await.expect("receiver");
    let secs = took.as_secs_f64().max(1e-9);
    println!(
        "path={:?} size={} sent={} dropped_at_send={} dropped_at_recv_queue={} received={} rate={:.0} pkt/s {:.1} Mbit/s rtt_p50={:?} rtt_p99={:?}",
        args.path,
        args.size,
        args.count,
        dropped,
        lagged,
        got,
        got as f64 / secs,
        got as f64 * args.size as f64 * 8.0 / secs / 1e6,
        pct(50),
        pct(99),
    );
}
