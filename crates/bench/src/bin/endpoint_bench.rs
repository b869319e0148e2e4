//! Datagram goodput and round trip between two SDK endpoints on this
//! machine, over one path (direct UDP, a relay session, or DERP), through
//! the Ferry relay at `--url` (relay sessions on). `bench/sdk/run.sh` runs
//! it per path with the relay as its own process; see bench/README.md.
//!
//! ```sh
//! cargo run --release -p ferry-bench --bin endpoint_bench -- \
//!     --url http://127.0.0.1:3340/derp --path direct|relay|derp \
//!     [--seconds 5] [--size 1200] [--rate 0] [--rtt 2000] [--batch 0] [--json]
//! ```
//!
//! `--batch N` (N > 0, unpaced only): A sends with `send_batch`, N
//! datagrams a call, and B receives with `recv_batch`; 0: `send` and
//! `recv`, one datagram a call.
//!
//! Round trip: `rtt` echoes, one at a time, B answering each.
//!
//! Goodput: A sends datagrams of `size` bytes to B for `seconds`. With
//! `--rate 0` it sends as fast as `send` takes them and backs off (yields,
//! then tries the same datagram again) when `send` reports the path's
//! queue full, so what it offers is what the path accepts; with `--rate R`
//! it offers R Mbit/s, paced, and a datagram `send` refuses is dropped.
//! B counts what arrives until one second after A stopped. Reported:
//! offered (accepted by `send`), delivered, the loss between them, refused
//! at `send`, and goodput = delivered bytes over the time from the first
//! send to the last arrival.

use ferry_client::{
    Datagrams, DerpServerOptions, Endpoint, EndpointOptions, PathKind, PeerOptions, SendError,
};
use ferry_proto::key::NodePrivate;
use std::time::{Duration, Instant};

struct Args {
    url: String,
    path: PathKind,
    seconds: f64,
    size: usize,
    rate: f64,
    rtt: usize,
    batch: usize,
    json: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        url: String::new(),
        path: PathKind::Direct,
        seconds: 5.0,
        size: 1200,
        rate: 0.0,
        rtt: 2000,
        batch: 0,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--json" {
            a.json = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--url" => a.url = value,
            "--path" => {
                a.path = match value.as_str() {
                    "direct" => PathKind::Direct,
                    "relay" => PathKind::RelaySession,
                    "derp" => PathKind::Derp,
                    other => return Err(format!("--path {other}: direct, relay or derp")),
                }
            }
            "--seconds" => a.seconds = value.parse().map_err(|e| bad(&e))?,
            "--size" => a.size = value.parse().map_err(|e| bad(&e))?,
            "--rate" => a.rate = value.parse().map_err(|e| bad(&e))?,
            "--rtt" => a.rtt = value.parse().map_err(|e| bad(&e))?,
            "--batch" => a.batch = value.parse().map_err(|e| bad(&e))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.url.is_empty() {
        return Err(
            "--url http://host:port/derp (a Ferry relay with --relay-port) is required".into(),
        );
    }
    if a.size == 0 || a.seconds <= 0.0 || a.seconds.is_nan() || a.rate < 0.0 {
        return Err("--size at least 1, --seconds above 0, --rate 0 or above".into());
    }
    if a.batch > 0 && a.rate > 0.0 {
        return Err("--batch goes with --rate 0 (unpaced) only".into());
    }
    Ok(a)
}

async fn endpoint(url: &str) -> Endpoint {
    let mut relay = DerpServerOptions::new("bench", url);
    // No STUN: both endpoints are on loopback.
    relay.stun = Some("127.0.0.1:9".parse().expect("literal"));
    let mut o = EndpointOptions::new(NodePrivate::generate(), vec![relay]);
    o.bind = "127.0.0.1:0".parse().expect("literal");
    o.queue = 8192;
    Endpoint::bind(o).await.expect("endpoint binds")
}

/// What one goodput run measured.
struct Goodput {
    offered: u64,
    refused: u64,
    delivered: u64,
    recv_dropped: u64,
    took: Duration,
}

/// A → B for `args.seconds`, as the module documentation says.
async fn goodput(a: &Endpoint, b: std::sync::Arc<Endpoint>, args: &Args) -> Goodput {
    let kb = b.public_key();
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let batched = args.batch > 0;
    let receiver = tokio::spawn(async move {
        let mut got = 0u64;
        let mut received = Datagrams::new();
        let mut last = None;
        let mut stop_at: Option<tokio::time::Instant> = None;
        loop {
            let limit =
                stop_at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                r = b.recv(), if !batched => match r {
                    Ok(_) => { got += 1; last = Some(Instant::now()); }
                    Err(_) => break,
                },
                r = b.recv_batch(&mut received), if batched => match r {
                    Ok(n) => { got += n as u64; last = Some(Instant::now()); }
                    Err(_) => break,
                },
                _ = done_rx.changed(), if stop_at.is_none() => {
                    stop_at = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                }
                _ = tokio::time::sleep_until(limit) => break,
            }
        }
        (got, last, b.stats().recv_dropped)
    });
    let payload = vec![0x5a; args.size];
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.seconds);
    // Paced: datagram i is due at start + i × gap.
    let gap = (args.rate > 0.0)
        .then(|| Duration::from_secs_f64(args.size as f64 * 8.0 / (args.rate * 1e6)));
    let (mut offered, mut refused) = (0u64, 0u64);
    if batched {
        let mut batch = Datagrams::new();
        for _ in 0..args.batch {
            batch.push(&kb, &payload);
        }
        while Instant::now() < end {
            let r = a.try_send_batch(&mut batch);
            assert_eq!(r.unknown_peer + r.too_large, 0, "send_batch: {r:?}");
            offered += r.sent as u64;
            // Queue full, or no path while the blast starves the probes.
            refused += (r.queue_full + r.no_path) as u64;
            tokio::task::yield_now().await;
        }
    }
    let mut i = 0u64;
    while !batched && Instant::now() < end {
        if let Some(gap) = gap {
            let due = start + gap.mul_f64(i as f64);
            if due > Instant::now() {
                tokio::time::sleep_until(due.into()).await;
            }
        }
        i += 1;
        match a.try_send(&kb, &payload) {
            Ok(()) => offered += 1,
            Err(SendError::QueueFull { .. }) => {
                refused += 1;
                if gap.is_none() {
                    // Back off: the path's queue is full; let it drain.
                    tokio::task::yield_now().await;
                }
            }
            Err(e) => panic!("send: {e}"),
        }
        if i.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
    }
    let _ = done_tx.send(true);
    let (delivered, last, recv_dropped) = receiver.await.expect("receiver");
    Goodput {
        offered,
        refused,
        delivered,
        recv_dropped,
        took: last.map_or(Duration::ZERO, |l| l - start),
    }
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
    let a = endpoint(&args.url).await;
    let b = endpoint(&args.url).await;
    let (ka, kb) = (a.public_key(), b.public_key());
    let peer = PeerOptions::new().only(args.path);
    a.add_peer(kb, peer).expect("a peer");
    b.add_peer(ka, peer).expect("a peer");
    let deadline = Instant::now() + Duration::from_secs(15);
    while a.peer_status(&kb).and_then(|s| s.active).map(|p| p.kind()) != Some(args.path)
        || b.peer_status(&ka).and_then(|s| s.active).map(|p| p.kind()) != Some(args.path)
    {
        if Instant::now() >= deadline {
            eprintln!("endpoint_bench: no {:?} path within 15 s", args.path);
            std::process::exit(1);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Round trip, one datagram at a time.
    let mut rtts = Vec::with_capacity(args.rtt);
    for i in 0..args.rtt as u64 {
        let t = Instant::now();
        a.try_send(&kb, &i.to_be_bytes()).expect("send");
        let data = tokio::time::timeout(Duration::from_secs(2), b.recv())
            .await
            .expect("echo request within 2 s")
            .expect("open")
            .data;
        b.try_send(&ka, &data).expect("echo");
        tokio::time::timeout(Duration::from_secs(2), a.recv())
            .await
            .expect("echo within 2 s")
            .expect("open");
        rtts.push(t.elapsed());
    }
    rtts.sort();
    let pct = |p: usize| {
        rtts.get(rtts.len() * p / 100)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };

    // Both endpoints' CPU (this process) during the goodput run.
    let cpu = || ferry_sys::process::process_stats().cpu_seconds;
    let cpu0 = cpu();
    let g = goodput(&a, std::sync::Arc::new(b), &args).await;
    let cpu_s = cpu().zip(cpu0).map_or(0.0, |(c1, c0)| c1 - c0);
    let mbit = |n: u64, secs: f64| n as f64 * args.size as f64 * 8.0 / secs.max(1e-9) / 1e6;
    let loss = if g.offered == 0 {
        0.0
    } else {
        g.offered.saturating_sub(g.delivered) as f64 * 100.0 / g.offered as f64
    };
    // The word --path takes, so that bench/sdk/run.sh finds its runs.
    let path = match args.path {
        PathKind::Direct => "direct",
        PathKind::RelaySession => "relay",
        PathKind::Derp => "derp",
    };
    let (offered_mbit, goodput_mbit) = (
        mbit(g.offered, args.seconds),
        mbit(g.delivered, g.took.as_secs_f64()),
    );
    // Cores busy per Gbit/s delivered (sender and receiver together).
    let cores_per_gbit = if goodput_mbit > 0.0 && !g.took.is_zero() {
        cpu_s / g.took.as_secs_f64() / (goodput_mbit / 1000.0)
    } else {
        0.0
    };
    if args.json {
        println!(
            "{{\"path\":\"{path}\",\"size\":{},\"seconds\":{},\"rate_mbit_s\":{},\"offered\":{},\"refused_at_send\":{},\"delivered\":{},\"dropped_at_recv_queue\":{},\"loss_percent\":{loss:.3},\"offered_mbit_s\":{offered_mbit:.1},\"goodput_mbit_s\":{goodput_mbit:.1},\"rtt_p50_us\":{:.1},\"rtt_p99_us\":{:.1},\"cpu_s\":{cpu_s:.3},\"cores_per_gbit_s\":{cores_per_gbit:.3},\"batch\":{}}}",
            args.size, args.seconds, args.rate, g.offered, g.refused, g.delivered, g.recv_dropped, pct(50), pct(99), args.batch,
        );
    } else {
        println!(
            "path={path} size={} seconds={} offered={} ({offered_mbit:.1} Mbit/s) refused_at_send={} delivered={} loss={loss:.2}% dropped_at_recv_queue={} goodput={goodput_mbit:.1} Mbit/s rtt_p50={:.1}us rtt_p99={:.1}us cpu={cpu_s:.2}s cores_per_gbit_s={cores_per_gbit:.3}",
            args.size, args.seconds, g.offered, g.refused, g.delivered, g.recv_dropped, pct(50), pct(99),
        );
    }
}
