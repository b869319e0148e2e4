//! Authenticated probes used against the endpoint: a peer's pong replayed
//! from another address, and a call-me-maybe arriving on UDP. Neither may
//! make an address a direct candidate (a path the endpoint then pings and
//! takes payloads from): only a fresh ping's source, a pong that answers a
//! ping sent to that very address, and call-me-maybe over DERP do.

use super::reflexive_tests::{addr, manager, pings, PEER};
use super::*;

const STRANGER: &str = "203.0.113.66:6666";

fn direct_paths(m: &Paths, peer: &NodePublic) -> Vec<PathAddr> {
    m.status(peer)
        .unwrap()
        .paths
        .iter()
        .map(|p| p.addr)
        .filter(|a| a.kind() == PathKind::Direct)
        .collect()
}

/// A pong that answered a ping on the peer's address, captured and sent
/// again from a stranger's: the stranger's address is no candidate, is
/// never pinged, owns nothing; the peer's path stays as the first pong
/// left it (confirmed once, the replay confirms nothing more).
#[test]
fn a_replayed_pong_from_another_address_is_no_candidate() {
    let now = Instant::now();
    let (mut m, peer) = manager(now);
    let real = PathAddr::Direct(addr(PEER));
    let tx = pings(&mut m, now)
        .into_iter()
        .find(|(p, _)| *p == real)
        .expect("the announced address is pinged")
        .1;
    let pong = Probe::Pong {
        tx,
        observed: addr("10.0.0.1:1000"),
    };
    let t = now + Duration::from_millis(20);
    m.handle_probe(t, &peer, real, pong.clone());
    assert_eq!(m.status(&peer).unwrap().active, Some(real));
    let stranger = PathAddr::Direct(addr(STRANGER));
    for i in 0..3 {
        m.handle_probe(t + Duration::from_millis(i), &peer, stranger, pong.clone());
    }
    // A pong with a tx id never sent, from the stranger: nothing either.
    m.handle_probe(
        t,
        &peer,
        stranger,
        Probe::Pong {
            tx: [0xee; TX_ID_LEN],
            observed: addr("10.0.0.1:1000"),
        },
    );
    assert_eq!(direct_paths(&m, &peer), vec![real]);
    assert_eq!(m.owner(&stranger), None);
    let later = t + Timing::default().discover_interval;
    assert!(
        pings(&mut m, later).iter().all(|(p, _)| *p != stranger),
        "the stranger's address was pinged"
    );
    let st = m.status(&peer).unwrap();
    let path = st.paths.iter().find(|p| p.addr == real).unwrap();
    assert_eq!(path.stats.pongs, 1);
}

/// Call-me-maybe travels over DERP; one on UDP (replayed from anywhere)
/// adds neither its source nor its addresses.
#[test]
fn call_me_maybe_counts_only_over_derp() {
    let now = Instant::now();
    let (mut m, peer) = manager(now);
    let stranger = PathAddr::Direct(addr(STRANGER));
    m.handle_probe(
        now,
        &peer,
        stranger,
        Probe::CallMeMaybe {
            endpoints: vec![addr("198.51.100.1:1"), addr("198.51.100.2:2")],
        },
    );
    m.handle_probe(
        now,
        &peer,
        PathAddr::RelaySession {
            vni: 7,
            addr: addr("10.0.0.9:3478"),
        },
        Probe::CallMeMaybe {
            endpoints: vec![addr("198.51.100.3:3")],
        },
    );
    assert_eq!(direct_paths(&m, &peer), vec![PathAddr::Direct(addr(PEER))]);
    assert_eq!(m.owner(&stranger), None);
}

/// A fresh ping still makes its source a candidate (how a peer behind a
/// NAT is found), and the pong that answers the ping sent back there
/// confirms it.
#[test]
fn a_fresh_ping_still_makes_its_source_a_candidate() {
    let now = Instant::now();
    let (mut m, peer) = manager(now);
    let nat = PathAddr::Direct(addr("198.51.100.9:40000"));
    m.handle_probe(now, &peer, nat, Probe::Ping { tx: [9; TX_ID_LEN] });
    assert_eq!(m.owner(&nat), Some(peer));
    let tx = pings(&mut m, now)
        .into_iter()
        .find(|(p, _)| *p == nat)
        .expect("probed back at once")
        .1;
    m.handle_probe(
        now + Duration::from_millis(5),
        &peer,
        nat,
        Probe::Pong {
            tx,
            observed: addr("10.0.0.1:1000"),
        },
    );
    let st = m.status(&peer).unwrap();
    let p = st.paths.iter().find(|p| p.addr == nat).unwrap();
    assert_eq!(p.state, PathState::Working);
}
