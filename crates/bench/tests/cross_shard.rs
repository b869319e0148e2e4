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
