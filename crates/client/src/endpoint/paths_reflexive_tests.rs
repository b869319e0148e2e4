//! This side's addresses as peers' pongs report them: announced beside the
//! local candidates, deduplicated, at most four, only from pongs that
//! answer a ping on a direct path.

use super::*;
use ferry_proto::key::NodePrivate;

const LOCAL: &str = "10.0.0.1:1000";
pub(super) const PEER: &str = "10.0.0.2:2000";

pub(super) fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A manager with one peer that announced `PEER`, and the peer's key.
pub(super) fn manager(now: Instant) -> (Paths, NodePublic) {
    let peer = NodePrivate::from_bytes([2; 32]).public();
    let mut m = Paths::new(Timing::default(), Some(1));
    m.add_peer(now, peer, Policy::default());
    m.set_local_candidates(now, vec![addr(LOCAL)]);
    m.handle_probe(
        now,
        &peer,
        PathAddr::Derp,
        Probe::CallMeMaybe {
            endpoints: vec![addr(PEER)],
        },
    );
    (m, peer)
}

/// The tx ids of the pings due now, by path; the rest of the queue is
/// dropped.
pub(super) fn pings(m: &mut Paths, now: Instant) -> Vec<(PathAddr, [u8; TX_ID_LEN])> {
    m.handle_timeout(now);
    let mut out = Vec::new();
    while let Some(t) = m.poll_transmit() {
        if let Probe::Ping { tx } = t.probe {
            out.push((t.path, tx));
        }
    }
    out
}

/// Answers the ping on `path` due at `now` with a pong that reports
/// `observed`.
fn pong(m: &mut Paths, peer: &NodePublic, now: Instant, path: PathAddr, observed: SocketAddr) {
    let (_, tx) = pings(m, now)
        .into_iter()
        .find(|(p, _)| *p == path)
        .expect("a ping on the path");
    m.handle_probe(now, peer, path, Probe::Pong { tx, observed });
}

#[test]
fn a_direct_pong_adds_the_observed_address_to_the_candidates() {
    let now = Instant::now();
    let (mut m, peer) = manager(now);
    let direct = PathAddr::Direct(addr(PEER));
    let nat = addr("203.0.113.7:4000");
    pong(&mut m, &peer, now, direct, nat);
    assert_eq!(m.local_candidates(), [addr(LOCAL), nat]);
    // Announced at once: a call-me-maybe with it is due now.
    m.handle_timeout(now);
    let mut cmm = None;
    while let Some(t) = m.poll_transmit() {
        if let Probe::CallMeMaybe { endpoints } = t.probe {
            cmm = Some(endpoints);
        }
    }
    assert_eq!(cmm, Some(vec![addr(LOCAL), nat]));
    // The same again, or the local address itself: nothing new.
    let later = now + Duration::from_secs(3);
    pong(&mut m, &peer, later, direct, nat);
    let later = later + Duration::from_secs(3);
    pong(&mut m, &peer, later, direct, addr(LOCAL));
    assert_eq!(m.local_candidates(), [addr(LOCAL), nat]);
    // An IPv4-mapped report is the IPv4 address.
    let later = later + Duration::from_secs(3);
    pong(
        &mut m,
        &peer,
        later,
        direct,
        addr("[::ffff:203.0.113.8]:4000"),
    );
    assert!(m.local_candidates().contains(&addr("203.0.113.8:4000")));
    assert_eq!(m.local_candidates().len(), 3);
}

#[test]
fn only_answering_direct_pongs_count_and_at_most_four_are_kept() {
    let now = Instant::now();
    let (mut m, peer) = manager(now);
    // A pong on DERP reports nothing of this side's UDP address.
    pong(&mut m, &peer, now, PathAddr::Derp, addr("198.51.100.1:1"));
    // A pong that answers no ping is ignored.
    let direct = PathAddr::Direct(addr(PEER));
    m.handle_probe(
        now,
        &peer,
        direct,
        Probe::Pong {
            tx: [9; TX_ID_LEN],
            observed: addr("198.51.100.2:2"),
        },
    );
    // Unspecified, port 0, multicast: not addresses to announce. (The
    // ignored pong re-armed nothing: the path's next ping is a discovery
    // interval after the first; once confirmed, every probe interval.)
    let mut at = now + Timing::default().discover_interval - Duration::from_millis(500);
    for bad in ["0.0.0.0:5", "198.51.100.3:0", "224.0.0.1:5"] {
        at += Duration::from_millis(500);
        pong(&mut m, &peer, at, direct, addr(bad));
    }
    assert_eq!(m.local_candidates(), [addr(LOCAL)]);
    // Six different reports: the latest four stay.
    for i in 1..=6u16 {
        at += Duration::from_millis(500);
        pong(
            &mut m,
            &peer,
            at,
            direct,
            SocketAddr::from(([203, 0, 113, 1], i)),
        );
    }
    let mut want = vec![addr(LOCAL)];
    want.extend((3..=6u16).map(|i| SocketAddr::from(([203, 0, 113, 1], i))));
    want.sort();
    assert_eq!(m.local_candidates(), want);
}
