//! The relay-session limits the README states, with the defaults `ferry
//! --relay-port` uses: a key takes part in at most 32 sessions, one source asks
//! for at most 256, and sessions not bound within 30 s or idle for 60 s are
//! freed. (The mechanism with other limits is tested in the crate's unit
//! tests; this pins the numbers.)

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ferry_proto::key::NodePublic;
use ferry_proto::relay_session::RefuseReason;
use ferry_udp::session::{Limits, SessionTable};

/// `n` distinct keys after `first`: the table only compares them.
fn keys(first: u16, n: u16) -> Vec<NodePublic> {
    (first..first + n)
        .map(|i| {
            let mut k = [0u8; 32];
            k[..2].copy_from_slice(&i.to_be_bytes());
            NodePublic::from_bytes(k)
        })
        .collect()
}

#[test]
fn a_key_is_in_at_most_32_sessions_and_an_ip_asks_for_at_most_256() {
    let limits = Limits::default();
    assert_eq!(
        (limits.bind_lifetime, limits.idle_lifetime),
        (Duration::from_secs(30), Duration::from_secs(60))
    );
    let now = Instant::now();
    let mut t = SessionTable::new(limits, now);
    // One key asking for sessions with 33 peers, each time from another
    // address (sessions others open with a key count against it only once
    // it joins them: `crates/udp/src/session/tests.rs`).
    let popular = keys(0, 1)[0];
    for (i, peer) in keys(1, 33).iter().enumerate() {
        let ip = IpAddr::from([198, 51, 100, i as u8]);
        let got = t.allocate(&popular, peer, ip, now);
        if i < 32 {
            assert!(got.is_ok(), "session {i}: {got:?}");
        } else {
            assert_eq!(got.err(), Some(RefuseReason::Limit), "the 33rd");
        }
    }
    assert_eq!(t.sessions_of(&popular), 32);
    // 256 sessions between fresh keys, all asked from one address.
    let ip: IpAddr = [203, 0, 113, 7].into();
    let pairs = keys(100, 2 * 257);
    for (i, pair) in pairs.chunks(2).enumerate() {
        let got = t.allocate(&pair[0], &pair[1], ip, now);
        if i < 256 {
            assert!(got.is_ok(), "session {i} from {ip}: {got:?}");
        } else {
            assert_eq!(got.err(), Some(RefuseReason::Limit), "the 257th from {ip}");
        }
    }
    assert_eq!(t.len(), 32 + 256);
    // Never bound: all freed 30 s on.
    t.expire(now + Duration::from_secs(29));
    assert_eq!(t.len(), 32 + 256, "kept for 30 s");
    t.expire(now + Duration::from_secs(31));
    assert!(t.is_empty(), "freed after 30 s unbound");
}
