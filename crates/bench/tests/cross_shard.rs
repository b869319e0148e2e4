//! `throughput --cross-shard`: peers placed on a two-shard Ferry relay (in
//! this process, keys spread by its random hash as in production) so that
//! the requested share of packets crosses shards, proved by the relay's own
//! counters.

mod support;

use ferry_bench::report::{ModeResult, Report};
use ferry_proto::key::NodePrivate;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferry-bench"))
        .args(args)
        .output()
        .expect("run ferry-bench")
}

fn run(url: &str, pct: &str) -> Output {
    bench(&[
        "throughput",
        "-q",
        "-s",
        url,
        "-n",
        "8",
        "--total-rate",
        "40M",
        "--metrics",
        "--cross-shard",
        pct,
        "--warmup",
        "200ms",
        "-d",
        "800ms",
        "--drain",
        "2s",
    ])
}

#[test]
fn the_requested_share_crosses_shards() {
    let server = support::relay_with_workers(
        ferry_derp::DerpConfig::new(NodePrivate::generate()),
        "127.0.0.1:0",
        2,
    );
    let url = format!("http://{}", server.listen_addrs[0]);
    for (pct, across) in [("0", 0), ("50", 2), ("100", 4)] {
        let out = run(&url, pct);
        assert!(
            out.status.success(),
            "--cross-shard {pct}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: Report = serde_json::from_slice(&out.stdout).expect("a JSON report");
        let ModeResult::Throughput(t) = &r.result else {
            panic!("not a throughput result: {:?}", r.result)
        };
        let c = t.cross_shard.clone().expect("the cross-shard figures");
        assert_eq!((c.shards, c.flows_across), (2, across), "{c:?}");
        let want: f64 = pct.parse::<f64>().unwrap() / 100.0;
        assert!(
            (c.measured - want).abs() <= 0.05,
            "--cross-shard {pct}: measured {}",
            c.measured
        );
        assert!(c.probes >= 8, "every shard needed 4 keys: {c:?}");
        assert!(t.packets_delivered > 0, "{t:?}");
    }
    server.shutdown();
    server.wait().expect("relay stops cleanly");
}

#[test]
fn one_shard_cannot_give_a_cross_share() {
    let server = support::relay(
        ferry_derp::DerpConfig::new(NodePrivate::generate()),
        "127.0.0.1:0",
    );
    let url = format!("http://{}", server.listen_addrs[0]);
    let out = run(&url, "50");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("at least two shards"), "{err}");
    // Zero is what one shard gives, and is measured as such.
    let out = run(&url, "0");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.shutdown();
    server.wait().expect("relay stops cleanly");
}

#[test]
fn placement_waits_for_an_earlier_runs_connections_to_leave() {
    // Connections of an earlier run that are still closing when the
    // placement starts must not be counted as the probes'.
    use ferry_bench::conn::PeerKey;
    use ferry_bench::placement;
    use ferry_bench::pool::Pool;
    use std::time::{Duration, Instant};

    let server = support::relay_with_workers(
        ferry_derp::DerpConfig::new(NodePrivate::generate()),
        "127.0.0.1:0",
        2,
    );
    let url = format!("http://{}", server.listen_addrs[0]);
    let target =
        std::sync::Arc::new(ferry_bench::target::Target::new(&url, None, None, false).unwrap());
    let mut pool = Pool::new(Duration::from_secs(5)).unwrap();
    for _ in 0..6 {
        pool.connect(&target, PeerKey::generate()).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut events = Vec::new();
    while pool.ready() < 6 {
        assert!(
            Instant::now() < deadline,
            "the earlier connections never got ready"
        );
        pool.turn(Duration::from_millis(5), &mut events).unwrap();
    }
    // Until the server has registered all six, so their leaving is what
    // the placement sees.
    while ferry_bench::varz::scrape(&target, "/debug/varz").unwrap()["derp_current_connections"]
        < 6.0
    {
        assert!(
            Instant::now() < deadline,
            "the server never registered them"
        );
        pool.turn(Duration::from_millis(5), &mut events).unwrap();
    }
    // They leave just after the placement has started (its first reading
    // of the counts takes a few milliseconds; probing 32 keys takes far
    // longer than 30 ms), as an earlier run's connections still being
    // closed would.
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        pool.close_all();
    });
    let (keys, probes) = placement::learn(&target, &[16, 16], Duration::from_secs(3))
        .expect("the placement is not misled by connections that leave");
    assert_eq!(keys.iter().map(Vec::len).collect::<Vec<_>>(), vec![16, 16]);
    assert!(probes >= 32);
    closer.join().unwrap();
    server.shutdown();
    server.wait().expect("relay stops cleanly");
}
