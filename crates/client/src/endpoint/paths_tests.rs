//! The path manager under simulated time: two managers joined by a
//! simulated network whose paths the tests cut and restore, and single
//! managers fed probes by hand. No sockets, no sleeps.

use super::*;
use ferry_proto::key::NodePrivate;

const A_ADDR: &str = "10.0.0.1:1000";
const B_ADDR: &str = "10.0.0.2:2000";
const RELAY: &str = "10.0.0.9:3478";
const VNI: u32 = 0x42;
/// One-way delay of every simulated path.
const LATENCY: Duration = Duration::from_millis(5);
/// The application sends a datagram this often in the pair tests.
const SEND_EVERY: Duration = Duration::from_millis(20);

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn key(n: u8) -> NodePublic {
    NodePrivate::from_bytes([n; 32]).public()
}

/// A message in flight.
struct Flight {
    at: Instant,
    to_b: bool,
    path: PathAddr,
    what: Carried,
}

enum Carried {
    Probe(Probe),
    Payload(u64),
}

/// Two managers, A and B, and the network between them.
struct Pair {
    now: Instant,
    a: Paths,
    b: Paths,
    ka: NodePublic,
    kb: NodePublic,
    direct_up: bool,
    relay_up: bool,
    flights: Vec<Flight>,
    /// Datagram ids A sent, with the path, and the ones B received.
    sent: Vec<(u64, PathAddr, Instant)>,
    received: Vec<u64>,
    next_send: Instant,
    sending: bool,
    events_a: Vec<PathEvent>,
    /// One-way delay of every path.
    latency: Duration,
    /// The next this many probes on a direct path (either way) are lost.
    lose_direct_probes: usize,
}

impl Pair {
    fn new(policy_a: Policy, relay: bool) -> Pair {
        Pair::with(policy_a, relay, Timing::default(), LATENCY)
    }

    /// A pair with a relay session and direct UDP cut, run until A
    /// sends on the relay session.
    fn on_relay_session() -> Pair {
        let mut p = Pair::new(Policy::default(), true);
        p.direct_up = false;
        p.run_for(Duration::from_secs(3));
        assert_eq!(p.active_a().unwrap().kind(), PathKind::RelaySession);
        p
    }

    fn with(policy_a: Policy, relay: bool, timing: Timing, latency: Duration) -> Pair {
        let now = Instant::now();
        let (ka, kb) = (key(1), key(2));
        let mut a = Paths::new(timing.clone(), Some(1));
        let mut b = Paths::new(timing, Some(2));
        a.add_peer(now, kb, policy_a);
        b.add_peer(now, ka, Policy::default());
        a.set_local_candidates(now, vec![addr(A_ADDR)]);
        b.set_local_candidates(now, vec![addr(B_ADDR)]);
        if relay {
            a.set_relay(now, &kb, Some((VNI, addr(RELAY))));
            b.set_relay(now, &ka, Some((VNI, addr(RELAY))));
        }
        Pair {
            now,
            a,
            b,
            ka,
            kb,
            direct_up: true,
            relay_up: true,
            flights: Vec::new(),
            sent: Vec::new(),
            received: Vec::new(),
            next_send: now,
            sending: false,
            events_a: Vec::new(),
            latency,
            lose_direct_probes: 0,
        }
    }

    /// Whether the network carries a datagram on `path` towards `to_b`.
    fn carries(&self, to_b: bool, path: &PathAddr) -> bool {
        match path {
            PathAddr::Derp => true,
            PathAddr::RelaySession { vni, addr: a } => {
                self.relay_up && *vni == VNI && *a == addr(RELAY)
            }
            PathAddr::Direct(a) => self.direct_up && *a == addr(if to_b { B_ADDR } else { A_ADDR }),
        }
    }

    /// The path as the receiver sees it (a direct datagram comes from the
    /// sender's address).
    fn arrives_on(to_b: bool, path: PathAddr) -> PathAddr {
        match path {
            PathAddr::Direct(_) => PathAddr::Direct(addr(if to_b { A_ADDR } else { B_ADDR })),
            other => other,
        }
    }

    fn drain(&mut self) {
        for to_b in [true, false] {
            let m = if to_b { &mut self.a } else { &mut self.b };
            let mut out = Vec::new();
            while let Some(t) = m.poll_transmit() {
                out.push(t);
            }
            while let Some(e) = m.poll_event() {
                if to_b {
                    self.events_a.push(e);
                }
            }
            for t in out {
                if t.path.kind() == PathKind::Direct && self.lose_direct_probes > 0 {
                    self.lose_direct_probes -= 1;
                    continue;
                }
                if self.carries(to_b, &t.path) {
                    self.flights.push(Flight {
                        at: self.now + self.latency,
                        to_b,
                        path: t.path,
                        what: Carried::Probe(t.probe),
                    });
                }
            }
        }
    }

    /// Runs the simulation up to `until`, in steps to the next thing that
    /// happens.
    fn run_until(&mut self, until: Instant) {
        for _ in 0..1_000_000 {
            self.drain();
            let next = [
                self.a.poll_timeout(),
                self.b.poll_timeout(),
                self.flights.iter().map(|f| f.at).min(),
                self.sending.then_some(self.next_send),
            ]
            .into_iter()
            .flatten()
            .min()
            .expect("something is always scheduled");
            if next > until {
                self.now = until;
                return;
            }
            self.now = self.now.max(next);
            let now = self.now;
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.flights)
                .into_iter()
                .partition(|f| f.at <= now);
            self.flights = later;
            for f in due {
                let (m, from) = if f.to_b {
                    (&mut self.b, self.ka)
                } else {
                    (&mut self.a, self.kb)
                };
                let path = Pair::arrives_on(f.to_b, f.path);
                match f.what {
                    Carried::Probe(p) => m.handle_probe(now, &from, path, p),
                    Carried::Payload(id) => {
                        m.on_receive(&from, &path, 100);
                        self.received.push(id);
                    }
                }
            }
            if self.sending && self.next_send <= now {
                self.next_send = now + SEND_EVERY;
                let id = self.sent.len() as u64;
                if let Ok(path) = self.a.on_send(&self.kb, 100) {
                    self.sent.push((id, path, now));
                    if self.carries(true, &path) {
                        self.flights.push(Flight {
                            at: now + self.latency,
                            to_b: true,
                            path,
                            what: Carried::Payload(id),
                        });
                    }
                }
            }
            self.a.handle_timeout(now);
            self.b.handle_timeout(now);
        }
        panic!("simulation did not reach its end");
    }

    fn run_for(&mut self, d: Duration) {
        self.run_until(self.now + d);
    }

    fn active_a(&self) -> Option<PathAddr> {
        self.a.status(&self.kb).unwrap().active
    }

    fn active_b(&self) -> Option<PathAddr> {
        self.b.status(&self.ka).unwrap().active
    }

    /// Runs until A's active path is `want` (checked every 10 ms); the
    /// time from now to the switch.
    fn until_active(&mut self, want: PathKind, limit: Duration) -> Duration {
        let start = self.now;
        let step = Duration::from_millis(10);
        while self.active_a().map(|p| p.kind()) != Some(want) {
            assert!(
                self.now - start <= limit,
                "A not on {want:?} within {limit:?}: {:?}",
                self.a.status(&self.kb)
            );
            self.run_for(step);
        }
        let start = self.a.wall_time(start);
        let switched = self.a.status(&self.kb).unwrap().last_switch.map(|e| e.at);
        let switched = switched.unwrap_or(start).max(start);
        switched
            .duration_since(start)
            .expect("not before the start")
    }
}

#[test]
fn a_pair_goes_direct_and_measures_the_round_trip() {
    let mut p = Pair::new(Policy::default(), false);
    assert_eq!(p.active_a(), Some(PathAddr::Derp), "DERP from the start");
    p.run_for(Duration::from_secs(1));
    assert_eq!(p.active_a(), Some(PathAddr::Direct(addr(B_ADDR))));
    assert_eq!(p.active_b(), Some(PathAddr::Direct(addr(A_ADDR))));
    let st = p.a.status(&p.kb).unwrap();
    let direct = st
        .paths
        .iter()
        .find(|s| s.addr.kind() == PathKind::Direct)
        .unwrap();
    assert_eq!(direct.state, PathState::Working);
    assert_eq!(direct.rtt, Some(2 * LATENCY));
    let ev = &p.events_a[0];
    assert_eq!(
        (ev.from, ev.to, ev.reason, ev.lost),
        (
            Some(PathAddr::Derp),
            Some(PathAddr::Direct(addr(B_ADDR))),
            SwitchReason::Better,
            0
        )
    );
    assert_eq!(st.last_switch.as_ref(), Some(ev));
    // Kept alive: still direct a minute later, one switch only.
    p.run_for(Duration::from_secs(60));
    assert_eq!(p.active_a(), Some(PathAddr::Direct(addr(B_ADDR))));
    assert_eq!(p.events_a.len(), 1, "{:?}", p.events_a);
    let pings = p.a.status(&p.kb).unwrap().paths[1].stats.pings;
    assert!((115..=125).contains(&pings), "a ping every 500 ms: {pings}");
}

#[test]
fn switches_down_within_two_seconds_of_silence_whenever_it_starts() {
    // Every phase of the 500 ms probe cycle, in 10 ms steps.
    for offset_ms in (0..500).step_by(10) {
        let mut p = Pair::new(Policy::default(), false);
        p.sending = true;
        p.run_for(Duration::from_secs(2));
        assert_eq!(p.active_a().unwrap().kind(), PathKind::Direct);
        p.run_for(Duration::from_millis(offset_ms));
        let cut = p.now;
        p.direct_up = false;
        p.until_active(PathKind::Derp, Duration::from_secs(2));
        let ev = p.events_a.last().unwrap().clone();
        let took = ev.at.duration_since(p.a.wall_time(cut)).unwrap();
        assert!(
            took <= Duration::from_secs(2),
            "offset {offset_ms}: {took:?}"
        );
        assert_eq!(ev.reason, SwitchReason::Silent);
        // What A sent directly after the cut never arrived; the estimate
        // covers it, and nothing more than was sent directly.
        let direct_sent: Vec<_> = p
            .sent
            .iter()
            .filter(|(_, path, _)| path.kind() == PathKind::Direct)
            .collect();
        // (One sent at the very instant of the cut still went out.)
        let lost = direct_sent.iter().filter(|(_, _, t)| *t > cut).count() as u64;
        assert!(
            lost > 0,
            "offset {offset_ms}: the test sent during the silence"
        );
        assert!(
            ev.lost >= lost && ev.lost <= direct_sent.len() as u64,
            "offset {offset_ms}: reported {} for {lost} lost",
            ev.lost
        );
        // Nothing arrives twice; everything sent after the switch arrives.
        p.run_for(Duration::from_secs(1));
        let mut got = p.received.clone();
        got.sort();
        got.dedup();
        assert_eq!(
            got.len(),
            p.received.len(),
            "a datagram was delivered twice"
        );
        let after: Vec<_> = p
            .sent
            .iter()
            .filter(|(_, _, t)| p.a.wall_time(*t) >= ev.at)
            .map(|s| s.0)
            .collect();
        assert!(after.iter().all(|id| got.contains(id)));
        assert!(
            after
                .iter()
                .all(|id| p.sent[*id as usize].1 == PathAddr::Derp),
            "offset {offset_ms}: after the switch everything goes by DERP"
        );
    }
}

/// `ferry link`'s schedule, as the link takes it.
fn link_timing() -> Timing {
    Timing::for_tunnels()
}

#[test]
fn the_tunnel_schedule_switches_down_within_one_and_a_quarter_seconds() {
    // Every phase of the 250 ms probe cycle, in 10 ms steps: down within
    // the dead time and one probe interval, the "about 1¼ s" `ferry link`
    // promises.
    let t = link_timing();
    let bound = t.dead_after + t.probe_interval;
    assert_eq!(bound, Duration::from_millis(1250));
    for offset_ms in (0..250).step_by(10) {
        let mut p = Pair::with(Policy::default(), false, t.clone(), LATENCY);
        p.sending = true;
        p.until_active(PathKind::Direct, Duration::from_secs(3));
        p.run_for(Duration::from_millis(1000 + offset_ms));
        let cut = p.now;
        p.direct_up = false;
        p.until_active(PathKind::Derp, bound);
        let took = p
            .events_a
            .last()
            .unwrap()
            .at
            .duration_since(p.a.wall_time(cut))
            .unwrap();
        assert!(took <= bound, "offset {offset_ms}: {took:?}");
    }
}

#[test]
fn link_timing_keeps_a_long_round_trip_path_and_still_drops_a_dead_one_within_two_seconds() {
    for rtt_ms in [150u64, 300, 500] {
        let mut p = Pair::with(
            Policy::default(),
            false,
            link_timing(),
            Duration::from_millis(rtt_ms / 2),
        );
        p.sending = true;
        p.until_active(PathKind::Direct, Duration::from_secs(3));
        let switches = p.events_a.len();
        // A minute on a working path with a round trip of up to half the
        // dead time: no switch.
        p.run_for(Duration::from_secs(60));
        assert_eq!(p.active_a().unwrap().kind(), PathKind::Direct);
        assert_eq!(
            p.events_a.len(),
            switches,
            "rtt {rtt_ms} ms: {:?}",
            p.events_a
        );
        // Cut: down to DERP within 2 s, even with pongs still in flight.
        let cut = p.now;
        p.direct_up = false;
        p.until_active(PathKind::Derp, Duration::from_secs(2));
        let took = p
            .events_a
            .last()
            .unwrap()
            .at
            .duration_since(p.a.wall_time(cut))
            .unwrap();
        assert!(took <= Duration::from_secs(2), "rtt {rtt_ms} ms: {took:?}");
    }
}

#[test]
fn probes_lost_under_load_do_not_kill_a_path_that_answers_again() {
    // Two probes in a row lost (a ping and its pong, or two pings) at
    // every phase of the 250 ms cycle: the path stays, with traffic on it.
    for offset_ms in (0..250).step_by(25) {
        let mut p = Pair::with(Policy::default(), false, link_timing(), LATENCY);
        p.sending = true;
        p.until_active(PathKind::Direct, Duration::from_secs(3));
        let switches = p.events_a.len();
        p.run_for(Duration::from_millis(1000 + offset_ms));
        p.lose_direct_probes = 2;
        p.run_for(Duration::from_secs(5));
        assert_eq!(p.lose_direct_probes, 0, "the probes were lost");
        assert_eq!(
            p.events_a.len(),
            switches,
            "offset {offset_ms}: {:?}",
            p.events_a
        );
        assert_eq!(p.active_a().unwrap().kind(), PathKind::Direct);
    }
}

#[test]
fn switches_up_within_ten_seconds_of_a_path_appearing_whenever_it_appears() {
    for offset_ms in (0..2000).step_by(50) {
        let mut p = Pair::new(Policy::default(), false);
        p.direct_up = false;
        p.run_for(Duration::from_secs(5));
        assert_eq!(p.active_a(), Some(PathAddr::Derp));
        p.run_for(Duration::from_millis(offset_ms));
        p.direct_up = true;
        let took = p.until_active(PathKind::Direct, Duration::from_secs(10));
        // The bound is 10 s; the schedule gives one discovery interval
        // and a round trip.
        assert!(
            took <= Timing::default().discover_interval + 2 * LATENCY,
            "offset {offset_ms}: {took:?}"
        );
        assert_eq!(p.events_a.last().unwrap().reason, SwitchReason::Better);
        assert_eq!(p.events_a.last().unwrap().lost, 0);
    }
}

#[test]
fn relay_session_between_direct_and_derp() {
    let mut p = Pair::new(Policy::default(), true);
    p.direct_up = false;
    assert_eq!(p.a.relay_state(&p.kb), Some(PathState::Unconfirmed));
    p.run_for(Duration::from_secs(3));
    assert_eq!(p.a.relay_state(&p.kb), Some(PathState::Working));
    let relay = PathAddr::RelaySession {
        vni: VNI,
        addr: addr(RELAY),
    };
    assert_eq!(p.active_a(), Some(relay));
    assert_eq!(p.active_b(), Some(relay));
    p.direct_up = true;
    let up = p.until_active(PathKind::Direct, Duration::from_secs(10));
    assert!(up <= Duration::from_secs(10));
    // Direct dies: down to the relay session (still confirmed), not DERP.
    p.direct_up = false;
    let down = p.until_active(PathKind::RelaySession, Duration::from_secs(2));
    assert!(down <= Duration::from_secs(2));
    p.relay_up = false;
    let down = p.until_active(PathKind::Derp, Duration::from_secs(2));
    assert!(down <= Duration::from_secs(2));
    let kinds: Vec<_> = p
        .events_a
        .iter()
        .map(|e| (e.from.map(|f| f.kind()), e.to.map(|t| t.kind()), e.reason))
        .collect();
    let (derp, relay, direct) = (
        Some(PathKind::Derp),
        Some(PathKind::RelaySession),
        Some(PathKind::Direct),
    );
    use SwitchReason::{Better, Silent};
    assert_eq!(
        kinds,
        [
            (derp, relay, Better),
            (relay, direct, Better),
            (direct, relay, Silent),
            (relay, derp, Silent),
        ]
    );
}

#[test]
fn a_removed_relay_session_hands_over_with_its_unanswered_datagrams() {
    let mut p = Pair::on_relay_session();
    for _ in 0..3 {
        p.a.on_send(&p.kb, 10).unwrap();
    }
    p.a.set_relay(p.now, &p.kb, None);
    assert_eq!(p.active_a(), Some(PathAddr::Derp));
    let ev = p.a.poll_event().unwrap();
    assert_eq!((ev.reason, ev.lost), (SwitchReason::Removed, 3));
    assert!(p
        .a
        .owner(&PathAddr::RelaySession {
            vni: VNI,
            addr: addr(RELAY)
        })
        .is_none());
}

#[test]
fn prefer_puts_a_kind_first() {
    let mut p = Pair::new(
        Policy {
            prefer: Some(PathKind::Derp),
            only: None,
        },
        true,
    );
    p.run_for(Duration::from_secs(5));
    assert_eq!(p.active_a(), Some(PathAddr::Derp));
    assert!(p.events_a.is_empty(), "{:?}", p.events_a);
    // The other paths are still confirmed and measured.
    let st = p.a.status(&p.kb).unwrap();
    assert!(
        st.paths.iter().all(|s| s.state == PathState::Working),
        "{st:?}"
    );
    // Preferring relay: relay even though direct works.
    p.a.add_peer(
        p.now,
        p.kb,
        Policy {
            prefer: Some(PathKind::RelaySession),
            only: None,
        },
    );
    assert_eq!(p.active_a().unwrap().kind(), PathKind::RelaySession);
    assert_eq!(p.a.poll_event().unwrap().reason, SwitchReason::Policy);
    // The preferred kind dies: the next best, direct.
    p.relay_up = false;
    p.until_active(PathKind::Direct, Duration::from_secs(2));
}

#[test]
fn only_restricts_to_one_kind_and_drops_while_it_does_not_work() {
    let mut p = Pair::new(
        Policy {
            prefer: None,
            only: Some(PathKind::Direct),
        },
        false,
    );
    assert_eq!(p.active_a(), None);
    assert_eq!(p.a.on_send(&p.kb, 1), Err(NoPath::NoneAllowed));
    p.direct_up = false;
    p.run_for(Duration::from_secs(5));
    assert_eq!(p.a.on_send(&p.kb, 1), Err(NoPath::NoneAllowed));
    p.direct_up = true;
    p.until_active(PathKind::Direct, Duration::from_secs(10));
    assert_eq!(p.a.on_send(&p.kb, 1), Ok(PathAddr::Direct(addr(B_ADDR))));
    assert_eq!(p.events_a[0].from, None);
    p.direct_up = false;
    p.run_for(Duration::from_secs(2));
    assert_eq!(p.active_a(), None, "not DERP: only direct");
    assert_eq!(p.events_a.last().unwrap().to, None);
    assert_eq!(p.a.on_send(&key(9), 1), Err(NoPath::UnknownPeer));
    // only = DERP ignores working direct paths.
    let mut q = Pair::new(
        Policy {
            prefer: None,
            only: Some(PathKind::Derp),
        },
        true,
    );
    q.run_for(Duration::from_secs(5));
    assert_eq!(q.active_a(), Some(PathAddr::Derp));
    assert!(q.events_a.is_empty());
}

/// A manager with one peer, its first pings taken.
fn single() -> (Paths, NodePublic, Instant) {
    let now = Instant::now();
    let mut m = Paths::new(Timing::default(), Some(7));
    let peer = key(2);
    m.add_peer(now, peer, Policy::default());
    (m, peer, now)
}

fn pings(m: &mut Paths) -> Vec<(PathAddr, [u8; TX_ID_LEN])> {
    let mut out = Vec::new();
    while let Some(t) = m.poll_transmit() {
        if let Probe::Ping { tx } = t.probe {
            out.push((t.path, tx));
        }
    }
    out
}

#[test]
fn only_a_pong_to_a_ping_on_the_same_path_confirms_it() {
    let (mut m, peer, now) = single();
    let a = PathAddr::Direct(addr("192.0.2.1:1"));
    let b = PathAddr::Direct(addr("192.0.2.2:2"));
    m.handle_probe(
        now,
        &peer,
        PathAddr::Derp,
        Probe::CallMeMaybe {
            endpoints: vec![addr("192.0.2.1:1"), addr("192.0.2.2:2")],
        },
    );
    m.handle_timeout(now);
    let sent = pings(&mut m);
    let tx_a = sent.iter().find(|(p, _)| *p == a).unwrap().1;
    let t = now + Duration::from_millis(30);
    // a's tx id answered on b, an unknown tx id on a, a pong from a stranger.
    m.handle_probe(
        t,
        &peer,
        b,
        Probe::Pong {
            tx: tx_a,
            observed: addr(A_ADDR),
        },
    );
    m.handle_probe(
        t,
        &peer,
        a,
        Probe::Pong {
            tx: [0; 12],
            observed: addr(A_ADDR),
        },
    );
    m.handle_probe(
        t,
        &key(3),
        a,
        Probe::Pong {
            tx: tx_a,
            observed: addr(A_ADDR),
        },
    );
    let st = m.status(&peer).unwrap();
    assert!(
        st.paths.iter().all(|s| s.state == PathState::Unconfirmed),
        "{st:?}"
    );
    assert_eq!(st.active, Some(PathAddr::Derp));
    m.handle_probe(
        t,
        &peer,
        a,
        Probe::Pong {
            tx: tx_a,
            observed: addr(A_ADDR),
        },
    );
    let st = m.status(&peer).unwrap();
    assert_eq!(st.active, Some(a));
    assert_eq!(
        st.paths.iter().find(|s| s.addr == a).unwrap().rtt,
        Some(Duration::from_millis(30))
    );
    // The same pong again confirms nothing more (its id is used up).
    let pongs = st.paths.iter().find(|s| s.addr == a).unwrap().stats.pongs;
    m.handle_probe(
        t,
        &peer,
        a,
        Probe::Pong {
            tx: tx_a,
            observed: addr(A_ADDR),
        },
    );
    assert_eq!(
        m.status(&peer)
            .unwrap()
            .paths
            .iter()
            .find(|s| s.addr == a)
            .unwrap()
            .stats
            .pongs,
        pongs
    );
}

#[test]
fn a_ping_is_answered_on_its_path_and_its_source_becomes_a_candidate() {
    let (mut m, peer, now) = single();
    let src = PathAddr::Direct(addr("198.51.100.7:4242"));
    m.handle_probe(now, &peer, src, Probe::Ping { tx: [5; 12] });
    assert_eq!(
        m.poll_transmit(),
        Some(Transmit {
            peer,
            path: src,
            probe: Probe::Pong {
                tx: [5; 12],
                observed: addr("198.51.100.7:4242")
            }
        })
    );
    assert_eq!(m.owner(&src), Some(peer));
    // Probed back at once.
    m.handle_timeout(now);
    assert!(pings(&mut m).iter().any(|(p, _)| *p == src));
    // A DERP ping is answered over DERP with no address.
    m.handle_probe(now, &peer, PathAddr::Derp, Probe::Ping { tx: [6; 12] });
    let t = m.poll_transmit().unwrap();
    assert_eq!(t.path, PathAddr::Derp);
    assert!(matches!(t.probe, Probe::Pong { observed, .. } if observed.ip().is_unspecified()));
    // The same ping again (a replay, from anywhere): no pong, no candidate.
    let elsewhere = PathAddr::Direct(addr("203.0.113.9:1"));
    m.handle_probe(now, &peer, elsewhere, Probe::Ping { tx: [5; 12] });
    assert_eq!(m.poll_transmit(), None);
    assert_eq!(m.owner(&elsewhere), None);
    // Probes from someone who is not a peer: nothing.
    m.handle_probe(now, &key(9), src, Probe::Ping { tx: [7; 12] });
    assert_eq!(m.poll_transmit(), None);
}

#[test]
fn call_me_maybe_goes_out_at_once_on_change_and_then_on_schedule() {
    let (mut m, peer, now) = single();
    let cmm = |m: &mut Paths| {
        let mut n = 0;
        while let Some(t) = m.poll_transmit() {
            if let Probe::CallMeMaybe { endpoints } = t.probe {
                assert_eq!((t.peer, t.path), (peer, PathAddr::Derp));
                assert_eq!(endpoints, m.local_candidates());
                n += 1;
            }
        }
        n
    };
    m.handle_timeout(now);
    assert_eq!(cmm(&mut m), 0, "no candidates yet: nothing to say");
    let t1 = now + Duration::from_secs(1);
    m.set_local_candidates(t1, vec![addr(A_ADDR)]);
    assert_eq!(m.poll_timeout(), Some(t1));
    m.handle_timeout(t1);
    assert_eq!(cmm(&mut m), 1);
    // The same set again changes nothing.
    m.set_local_candidates(t1, vec![addr(A_ADDR), addr(A_ADDR)]);
    m.handle_timeout(t1 + Duration::from_secs(9));
    assert_eq!(cmm(&mut m), 0);
    m.handle_timeout(t1 + Duration::from_secs(10));
    assert_eq!(cmm(&mut m), 1);
}

#[test]
fn candidates_are_capped_and_forgotten_when_stale() {
    let (mut m, peer, now) = single();
    let many: Vec<_> = (0..40u16)
        .map(|i| SocketAddr::from(([192, 0, 2, 1], 1000 + i)))
        .collect();
    for chunk in many.chunks(MAX_ENDPOINTS) {
        m.handle_probe(
            now,
            &peer,
            PathAddr::Derp,
            Probe::CallMeMaybe {
                endpoints: chunk.to_vec(),
            },
        );
    }
    let direct = |m: &Paths| {
        m.status(&peer)
            .unwrap()
            .paths
            .iter()
            .filter(|s| s.addr.kind() == PathKind::Direct)
            .count()
    };
    assert_eq!(direct(&m), MAX_CANDIDATES);
    // Unusable addresses are not candidates.
    m.remove_peer(&peer);
    m.add_peer(now, peer, Policy::default());
    m.handle_probe(
        now,
        &peer,
        PathAddr::Derp,
        Probe::CallMeMaybe {
            endpoints: vec![
                addr("0.0.0.0:1"),
                addr("192.0.2.1:0"),
                addr("224.0.0.1:5"),
                addr("[::]:5"),
            ],
        },
    );
    assert_eq!(direct(&m), 0);
    m.handle_probe(
        now,
        &peer,
        PathAddr::Derp,
        Probe::CallMeMaybe {
            endpoints: vec![addr("192.0.2.1:1")],
        },
    );
    assert_eq!(direct(&m), 1);
    let lifetime = Timing::default().candidate_lifetime;
    m.handle_timeout(now + lifetime - Duration::from_millis(1));
    assert_eq!(direct(&m), 1);
    m.handle_timeout(now + lifetime);
    assert_eq!(direct(&m), 0);
    assert!(m.owner(&PathAddr::Direct(addr("192.0.2.1:1"))).is_none());
}

#[test]
fn one_address_belongs_to_one_peer() {
    let (mut m, peer, now) = single();
    let other = key(3);
    m.add_peer(now, other, Policy::default());
    let shared = PathAddr::Direct(addr("192.0.2.1:1"));
    m.handle_probe(now, &peer, shared, Probe::Ping { tx: [1; 12] });
    m.handle_probe(now, &other, shared, Probe::Ping { tx: [2; 12] });
    assert_eq!(m.owner(&shared), Some(peer));
    assert!(m
        .status(&other)
        .unwrap()
        .paths
        .iter()
        .all(|s| s.addr != shared));
}

#[test]
fn the_timeout_is_never_in_the_past_after_handling_it() {
    let mut p = Pair::new(Policy::default(), true);
    for step in 0..200 {
        p.run_for(Duration::from_millis(37));
        if step == 50 {
            p.direct_up = false;
        }
        if step == 120 {
            p.relay_up = false;
        }
        for m in [&mut p.a, &mut p.b] {
            m.handle_timeout(p.now);
            assert!(m.poll_timeout().unwrap() > p.now);
        }
    }
}

/// A relay session bound by A first and by B half a second later: the
/// relay drops A's first pings (B's side is not bound yet), and A's path
/// is confirmed one round trip after B's bind, because B's ping makes A
/// ping again at once, not at A's next discovery ping 2 s after its own.
#[test]
fn a_relay_session_is_confirmed_one_round_trip_after_the_second_bind() {
    let mut p = Pair::new(Policy::default(), false);
    p.direct_up = false;
    p.relay_up = false;
    let session = Some((VNI, addr(RELAY)));
    let (ka, kb) = (p.ka, p.kb);
    p.a.set_relay(p.now, &kb, session);
    p.run_for(Duration::from_millis(500));
    assert_eq!(p.a.relay_state(&kb), Some(PathState::Unconfirmed));
    // B binds: from now on the relay carries both ways.
    p.relay_up = true;
    let bound = p.now;
    p.b.set_relay(p.now, &ka, session);
    let deadline = bound + Duration::from_secs(3);
    while p.a.relay_state(&kb) != Some(PathState::Working) {
        assert!(p.now < deadline, "A's relay session never confirmed");
        p.run_for(Duration::from_millis(1));
    }
    let took = p.now - bound;
    assert!(
        took <= LATENCY * 4 + Duration::from_millis(2),
        "A confirmed its relay session {took:?} after B bound"
    );
    assert_eq!(p.b.relay_state(&ka), Some(PathState::Working));
}

/// A peer's totals by kind of path outlive its paths: a relay session
/// that is removed takes its own counters with it, not the peer's.
#[test]
fn totals_by_kind_survive_the_removal_of_a_path() {
    let mut p = Pair::on_relay_session();
    for _ in 0..3 {
        p.a.on_send(&p.kb, 10).unwrap();
    }
    let before = p.a.status(&p.kb).unwrap().totals;
    assert_eq!(
        (
            before.relay_session.tx_packets,
            before.relay_session.tx_bytes
        ),
        (3, 30)
    );
    assert!(before.relay_session.pongs > 0, "{before:?}");
    p.a.set_relay(p.now, &p.kb, None);
    let st = p.a.status(&p.kb).unwrap();
    assert!(st
        .paths
        .iter()
        .all(|x| x.addr.kind() != PathKind::RelaySession));
    assert_eq!(st.totals.relay_session, before.relay_session);
    p.a.on_send(&p.kb, 7).unwrap();
    let after = p.a.status(&p.kb).unwrap().totals;
    assert_eq!(after.derp.tx_packets, before.derp.tx_packets + 1);
    assert_eq!(after.all().tx_packets, before.all().tx_packets + 1);
}

/// A datagram longer than the active path carries is refused with the
/// path's limit and counted nowhere; DERP carries what UDP paths cannot.
#[test]
fn a_datagram_over_the_path_limit_is_refused_and_not_counted() {
    use crate::endpoint::{MAX_DATAGRAM, MAX_DERP_DATAGRAM};
    let mut p = Pair::new(Policy::default(), false);
    p.run_for(Duration::from_secs(3));
    let active = p.active_a().unwrap();
    assert_eq!(active.kind(), PathKind::Direct);
    let max = active.mtu().max;
    assert_eq!(max, MAX_DATAGRAM, "IPv4 direct path");
    let before = p.a.status(&p.kb).unwrap().totals;
    assert_eq!(
        p.a.on_send(&p.kb, max + 1),
        Err(NoPath::TooLarge {
            len: max + 1,
            max,
            path: PathKind::Direct
        })
    );
    assert_eq!(p.a.status(&p.kb).unwrap().totals, before);
    assert_eq!(p.a.on_send(&p.kb, max), Ok(active));
    let only_derp = Policy {
        prefer: None,
        only: Some(PathKind::Derp),
    };
    let mut d = Pair::new(only_derp, false);
    assert_eq!(d.a.on_send(&d.kb, max + 1), Ok(PathAddr::Derp));
    assert_eq!(
        d.a.on_send(&d.kb, MAX_DERP_DATAGRAM + 1),
        Err(NoPath::TooLarge {
            len: MAX_DERP_DATAGRAM + 1,
            max: MAX_DERP_DATAGRAM,
            path: PathKind::Derp
        })
    );
}
