//! The port's control path in simulated time, its three steps driven
//! one by one with the table used by others in between.

use super::*;
use std::time::Duration;

use ferry_proto::disco::{self, AllocateRequest, Message};
use ferry_proto::key::{DiscoPrivate, NodePublic};
use ferry_proto::udp_header::{Header, Protocol};

use crate::peer_relay::{States, Verdict};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn key(b: u8) -> DiscoPrivate {
    DiscoPrivate::from_bytes([b; 32])
}

fn control(t: &PeerRelayTable, from: &DiscoPrivate, vni: u32, msg: &Message) -> Vec<u8> {
    let mut d = Vec::new();
    let k = from.shared(&t.server_disco());
    pr::put_control(&mut d, vni, &k, &from.public(), &[7; 24], msg);
    d
}

fn bind(vni: u32, generation: u32, remote: &DiscoPrivate) -> BindBody {
    BindBody {
        vni,
        generation,
        remote_key: remote.public(),
        challenge: [0; 32],
    }
}

fn data(vni: u32) -> Vec<u8> {
    let mut d = Header::data(Protocol::Payload, vni).to_bytes().to_vec();
    d.extend_from_slice(&[4, 0, 0, 0, 1, 2, 3]);
    d
}

/// A batch as a shard's buffer holds it: datagrams and their sources.
#[derive(Default)]
struct Batch {
    buf: Vec<u8>,
    at: Vec<(SocketAddr, usize, usize)>,
}

impl Batch {
    fn add(&mut self, src: SocketAddr, d: &[u8]) {
        self.at.push((src, self.buf.len(), d.len()));
        self.buf.extend_from_slice(d);
    }

    fn defer(&self, c: &mut Controls, now: Instant) {
        for &(src, at, len) in &self.at {
            assert!(Controls::is_control(&self.buf[at..at + len]));
            c.defer(src, at, &self.buf[at..at + len], now);
        }
    }
}

/// Binds and answers are looked up under the table, opened and
/// challenged without it (the table forwards another endpoint's data and
/// frees an endpoint meanwhile), and applied under it again: challenges
/// go back to their sources, valid answers bind, an answer for the
/// endpoint freed meanwhile binds nothing, and forgeries are counted.
#[test]
fn controls_are_opened_between_two_short_holds_of_the_table() {
    let now = Instant::now();
    let limits = Limits {
        bind_burst: 1000,
        ..Limits::default()
    };
    let mut t = PeerRelayTable::with_seed(key(0x41), limits, 1, 1000, now);
    let (a, b, c, d) = (key(1), key(2), key(3), key(4));
    let relay = [addr("192.0.2.10:40000")];
    let (pa, pb, pc, pd) = (
        addr("192.0.2.1:1"),
        addr("192.0.2.2:2"),
        addr("192.0.2.3:3"),
        addr("192.0.2.4:4"),
    );
    let endpoint = |t: &mut PeerRelayTable, x: &DiscoPrivate, y: &DiscoPrivate, by: u8| {
        let req = AllocateRequest {
            client_disco: [x.public(), y.public()],
            generation: 1,
        };
        t.allocate(&NodePublic([by; 32]), &req, &relay, now)
            .unwrap()
            .response
            .endpoint
            .vni
    };
    let (ab, cd) = (endpoint(&mut t, &a, &b, 1), endpoint(&mut t, &c, &d, 2));
    let who = |src: SocketAddr| {
        [(&a, pa), (&b, pb), (&c, pc), (&d, pd)]
            .into_iter()
            .find(|(_, p)| *p == src)
            .unwrap()
            .0
    };
    let mut ctl = Controls::new(&limits);
    // Round 1: binds from all four, one forged (sealed with the wrong
    // key), one for an unknown endpoint.
    let mut batch = Batch::default();
    for (k, vni, remote, src) in [
        (&a, ab, &b, pa),
        (&b, ab, &a, pb),
        (&c, cd, &d, pc),
        (&d, cd, &c, pd),
    ] {
        batch.add(
            src,
            &control(&t, k, vni, &Message::Bind(bind(vni, 1, remote))),
        );
    }
    let mut forged = control(&t, &a, ab, &Message::Bind(bind(ab, 1, &b)));
    forged[100] ^= 1;
    batch.add(pa, &forged);
    batch.add(
        pa,
        &control(
            &t,
            &a,
            ab ^ cd ^ 1,
            &Message::Bind(bind(ab ^ cd ^ 1, 1, &b)),
        ),
    );
    batch.defer(&mut ctl, now);
    ctl.look_up(&t);
    assert_eq!(
        ctl.items.len(),
        5,
        "the unknown endpoint is dropped at the lookup"
    );
    // Unheld: the table serves others.
    assert_eq!(
        t.handle(now, pa, &mut data(ab)),
        Verdict::Drop(crate::peer_relay::Drop::Unbound)
    );
    assert!(ctl.open(&mut batch.buf));
    ctl.apply(&mut t, now);
    let challenges: Vec<(SocketAddr, BindBody)> = ctl
        .items
        .iter()
        .filter_map(|i| match i.step {
            Step::Reply(n) => Some((i.src, i.at, n)),
            _ => None,
        })
        .map(|(src, at, n)| {
            match disco::open(
                &who(src).shared(&t.server_disco()),
                &batch.buf[at + 8..at + n],
            )
            .unwrap()
            {
                Message::BindChallenge(body) => (src, body),
                m => panic!("{m:?}"),
            }
        })
        .collect();
    assert_eq!(challenges.len(), 4, "{challenges:?}");
    let cn = *t.counters();
    assert_eq!(cn.challenges, 4);
    assert_eq!(cn.dropped(Drop::BadBox), 1);
    assert_eq!(cn.dropped(Drop::UnknownVni), 1);
    // Round 2: the four answers, one of them forged. Between the lookup
    // and the binding, the table is free: it frees cd (its requester's
    // grant withdrawn, say), whose answers then bind nothing.
    let mut batch = Batch::default();
    for (src, body) in &challenges {
        let answer = control(&t, who(*src), body.vni, &Message::BindAnswer(*body));
        batch.add(*src, &answer);
    }
    let forged = BindBody {
        challenge: [1; 32],
        ..challenges[0].1
    };
    batch.add(
        challenges[0].0,
        &control(
            &t,
            who(challenges[0].0),
            forged.vni,
            &Message::BindAnswer(forged),
        ),
    );
    batch.defer(&mut ctl, now);
    ctl.look_up(&t);
    assert_eq!(t.revoke(|r| *r != NodePublic([2; 32])), 1);
    assert!(ctl.open(&mut batch.buf));
    ctl.apply(&mut t, now);
    assert_eq!(
        t.states(),
        States {
            connecting: 0,
            open: 1
        }
    );
    let cn = *t.counters();
    assert_eq!(cn.binds, 2, "ab's two answers bound");
    assert_eq!(
        cn.dropped(Drop::UnknownVni),
        3,
        "cd's answers found no endpoint"
    );
    assert_eq!(cn.dropped(Drop::BadChallenge), 1);
    assert!(
        ctl.items.iter().all(|i| !matches!(i.step, Step::Reply(_))),
        "answers get no reply"
    );
    assert_eq!(t.handle(now, pa, &mut data(ab)), Verdict::Forward(pb));
}

/// A flood of forged binds, garbage and oversize control datagrams from
/// many sources: every one is counted by its reason, none is answered,
/// and each reason makes one log line per interval, not one per
/// datagram or per batch.
#[test]
fn a_flood_of_bad_controls_is_counted_and_logged_once_per_interval() {
    let t0 = Instant::now();
    let limits = Limits {
        bind_rate: 1,
        bind_burst: 4,
        ..Limits::default()
    };
    let relays = PeerRelays::new(key(0x41), limits);
    relays.set_addrs(vec![addr("192.0.2.10:40000")]);
    let (a, b, stranger) = (key(1), key(2), key(3));
    let req = AllocateRequest {
        client_disco: [a.public(), b.public()],
        generation: 1,
    };
    let vni = relays
        .allocate(&NodePublic([1; 32]), &req, t0)
        .unwrap()
        .response
        .endpoint
        .vni;
    let forged = control(
        &relays.lock(),
        &stranger,
        vni,
        &Message::Bind(bind(vni, 1, &a)),
    );
    let mut oversize = control(&relays.lock(), &a, vni, &Message::Bind(bind(vni, 1, &b)));
    oversize.resize(1400, 0);
    let mut garbage = Header::bind(vni).to_bytes().to_vec();
    garbage.extend_from_slice(&[0x55; 60]);
    let mut ctl = Controls::new(&limits);
    let mut replies = 0;
    // 100 batches of 30 over 10 s, each datagram from its own source (so
    // that the per-source limit lets them through), then 100 more over
    // the next 10 s from one source.
    for round in 0..200u32 {
        let now = t0 + Duration::from_millis(u64::from(round) * 100);
        let mut batch = Batch::default();
        for i in 0..30u32 {
            let n = if round < 100 { round * 30 + i } else { 0 };
            let src = SocketAddr::from(([10, (n >> 16) as u8, (n >> 8) as u8, n as u8], 9));
            batch.add(src, [&forged, &oversize, &garbage][i as usize % 3]);
        }
        batch.defer(&mut ctl, now);
        ctl.run(&relays, now, &mut batch.buf, |_, _, _| replies += 1);
    }
    let cn = *relays.lock().counters();
    assert_eq!(replies, 0, "bad input was answered");
    let [sender, shape, limited] =
        [Drop::UnknownSender, Drop::BadControl, Drop::RateLimited].map(|d| cn.dropped(d));
    assert_eq!(sender + shape + limited, 6_000, "every datagram counted");
    assert!(sender >= 1_000 && shape >= 2_000, "{sender} {shape}");
    // One source: its burst of 4, then one a second.
    assert!(limited >= 3_000 - 4 - 10, "{limited}");
    assert_eq!(cn.binds + cn.challenges, 0);
    // Lines: UnknownSender and BadControl at 0 s, again at 10 s (the
    // single source's first datagrams), RateLimited at 10 s; nothing
    // else in the 20 s.
    assert_eq!(
        ctl.lines,
        2 + 2 + 1,
        "log lines for 6 000 dropped datagrams"
    );
}
