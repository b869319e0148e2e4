//! The train rules, checked on the plan (no sockets), the fallback with a
//! scripted `sendmmsg`, and sends over loopback.

use super::*;
use std::net::UdpSocket;
use std::os::fd::AsFd;

fn v4(port: u16) -> Option<SocketAddr> {
    Some(SocketAddr::from(([192, 0, 2, 1], port)))
}

fn v6() -> Option<SocketAddr> {
    Some("[2001:db8::1]:1".parse().unwrap())
}

/// The datagrams of every queued message, as (destination, start, len),
/// in order.
fn datagrams(t: &Trains) -> Vec<(Option<SocketAddr>, usize, usize)> {
    let mut out = Vec::new();
    for m in t.msgs() {
        let seg = usize::from(m.segment);
        for s in &t.spans()[m.first..m.first + m.count] {
            if seg == 0 {
                out.push((m.dst, s.start, s.len));
                continue;
            }
            let mut at = s.start;
            while at < s.start + s.len {
                let n = seg.min(s.start + s.len - at);
                out.push((m.dst, at, n));
                at += n;
            }
        }
    }
    out
}

/// Panics unless every queued message keeps the rules of the module doc.
fn check_rules(t: &Trains) {
    for m in t.msgs() {
        let spans = &t.spans()[m.first..m.first + m.count];
        let (dgrams, bytes) = shape(t.spans(), m);
        if m.segment == 0 {
            assert_eq!((m.count, dgrams), (1, 1), "{m:?}");
            continue;
        }
        let seg = usize::from(m.segment);
        assert!(seg <= max_segment(m.dst), "segment {seg} to {:?}", m.dst);
        assert!(dgrams as usize <= MAX_SEGMENTS && bytes as usize <= MAX_GSO_BYTES);
        // Every datagram full but the very last.
        let (last, rest) = spans.split_last().unwrap();
        assert!(rest.iter().all(|s| s.len % seg == 0), "{m:?} {spans:?}");
        assert!(last.len > 0);
    }
}

#[test]
fn equal_datagrams_to_one_destination_share_a_train() {
    let mut t = Trains::new();
    for i in 0..10 {
        t.push(v4(1), i * 2000, 1452, 1452, true);
    }
    t.push(v4(1), 20_000, 100, 100, true); // shorter: ends the train
    t.push(v4(1), 30_000, 1452, 1452, true); // after a short one: a new train
    assert_eq!(t.msgs().len(), 2);
    assert_eq!((t.msgs()[0].segment, t.msgs()[0].count), (1452, 11));
    assert_eq!(shape(t.spans(), &t.msgs()[0]), (11, 10 * 1452 + 100));
    assert_eq!(t.msgs()[1].first, 11);
    // A longer one cannot follow either.
    let mut t = Trains::new();
    t.push(v4(1), 0, 100, 100, true);
    t.push(v4(1), 100, 120, 120, true);
    assert_eq!(t.msgs().len(), 2);
    check_rules(&t);
}

#[test]
fn contiguous_runs_merge_into_one_span() {
    let mut t = Trains::new();
    // A GRO slot of 5 × 1000 + 300.
    t.push(v4(1), 0, 5300, 1000, true);
    assert_eq!(
        t.spans(),
        [Span {
            start: 0,
            len: 5300
        }]
    );
    // Split one by one (as the hub does), contiguous: still one span.
    let mut t = Trains::new();
    for k in 0..5 {
        t.push(v4(1), k * 1000, 1000, 1000, true);
    }
    assert_eq!(
        t.spans(),
        [Span {
            start: 0,
            len: 5000
        }]
    );
    assert_eq!(shape(t.spans(), &t.msgs()[0]), (5, 5000));
}

#[test]
fn limits_split_trains() {
    let mut t = Trains::new();
    // 100 segments of 100 bytes: more than 64 segments.
    t.push(v4(1), 0, 10_000, 100, true);
    assert_eq!(t.msgs().len(), 2);
    assert_eq!(shape(t.spans(), &t.msgs()[0]), (64, 6400));
    // 1452-byte segments: at most 45 fit in 64 KiB.
    let mut t = Trains::new();
    for i in 0..60 {
        t.push(v4(1), i * 1452, 1452, 1452, true);
    }
    let (d0, b0) = shape(t.spans(), &t.msgs()[0]);
    assert!(b0 as usize <= MAX_GSO_BYTES && d0 == 45, "{d0} {b0}");
    // Another destination never joins.
    let mut t = Trains::new();
    t.push(v4(1), 0, 1000, 1000, true);
    t.push(v4(2), 1000, 1000, 1000, true);
    assert_eq!(t.msgs().len(), 2);
    // A chosen train length.
    let mut t = Trains::with_max_segments(46);
    for i in 0..100 {
        t.push(v4(1), i * 1400, 1400, 1400, true);
    }
    assert_eq!(shape(t.spans(), &t.msgs()[0]).0, 46);
    check_rules(&t);
}

#[test]
fn without_gso_every_datagram_is_a_message() {
    let mut t = Trains::new();
    t.push(v4(1), 0, 2500, 1000, false);
    t.push(v4(1), 2500, 0, 0, false);
    assert_eq!(t.msgs().len(), 4);
    assert!(t.msgs().iter().all(|m| m.segment == 0 && m.count == 1));
    assert_eq!(
        t.spans()[2],
        Span {
            start: 2000,
            len: 500
        }
    );
    assert_eq!(
        t.spans()[3],
        Span {
            start: 2500,
            len: 0
        }
    );
}

/// The loss this module exists to prevent: a datagram larger than one
/// frame's segment, and the shorter one after it, in one train. It goes
/// alone, and so does each datagram of a run over the limit (a GRO slot
/// received on a jumbo-frame network); the limit follows the family.
#[test]
fn a_datagram_over_the_segment_limit_goes_alone() {
    let mut t = Trains::new();
    t.push(v4(1), 0, 9000, 9000, true);
    t.push(v4(1), 9000, 100, 100, true);
    t.push(v4(1), 9100, 1472, 1472, true);
    t.push(v4(1), 10_572, 1473, 1473, true);
    t.push(v4(1), 12_045, 1472, 1472, true);
    let shapes: Vec<_> = t.msgs().iter().map(|m| (m.segment, m.count)).collect();
    assert_eq!(shapes, [(0, 1), (100, 1), (1472, 1), (0, 1), (1472, 1)]);
    // A run of 2000-byte datagrams: one message each.
    let mut t = Trains::new();
    t.push(v4(1), 0, 5000, 2000, true);
    assert_eq!(
        datagrams(&t),
        [(v4(1), 0, 2000), (v4(1), 2000, 2000), (v4(1), 4000, 1000)]
    );
    assert!(t.msgs().iter().all(|m| m.segment == 0));
    // 1460 bytes: a train to IPv4 (also IPv4-mapped), alone to IPv6 or to
    // a connected peer of unknown family.
    let mapped: Option<SocketAddr> = Some("[::ffff:192.0.2.1]:1".parse().unwrap());
    for (dst, train) in [(v4(1), true), (mapped, true), (v6(), false), (None, false)] {
        let mut t = Trains::new();
        t.push(dst, 0, 2920, 1460, true);
        assert_eq!(t.msgs().len(), if train { 1 } else { 2 }, "{dst:?}");
        check_rules(&t);
    }
}

/// Sizes from 1 byte to the largest IPv4 UDP payload, in a pseudo-random
/// order to two destinations, pushed as single datagrams and as runs:
/// every message keeps the rules, and the datagrams come out whole, in
/// order.
#[test]
fn every_plan_keeps_the_rules_and_the_order() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..50 {
        let mut t = Trains::new();
        let (mut want, mut at) = (Vec::new(), 0);
        for _ in 0..200 {
            let dst = if next(4) == 0 { v4(2) } else { v4(1) };
            let len = match next(6) {
                0 => 1 + next(100) as usize,
                1 => 1400 + next(100) as usize,
                2 => 1472,
                3 => 1473 + next(10_000) as usize,
                4 => 65_507 - next(3) as usize,
                _ => 1 + next(1472) as usize,
            };
            let run = if len <= 2000 && next(3) == 0 {
                1 + next(5) as usize
            } else {
                1
            };
            let tail = if run > 1 {
                next(len as u64) as usize
            } else {
                0
            };
            let total = len * (run - 1) + if tail > 0 { tail } else { len };
            t.push(dst, at, total, len, round % 5 != 0);
            let mut k = at;
            while k < at + total {
                let n = len.min(at + total - k);
                want.push((dst, k, n));
                k += n;
            }
            at += total;
        }
        check_rules(&t);
        assert_eq!(datagrams(&t), want, "round {round}");
    }
}

/// A scripted `sendmmsg`: refuses trains with `train_error`, single
/// datagrams with `single_error` from the `full_after`-th call on, and
/// records what it took.
struct Script {
    train_error: i32,
    full_after: usize,
    calls: usize,
    took: Vec<(Option<SocketAddr>, usize, usize)>,
}

impl Script {
    fn sys(&mut self, spans: &[Span], msgs: &[OutMsg]) -> io::Result<usize> {
        self.calls += 1;
        if self.calls > self.full_after {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        for (i, m) in msgs.iter().enumerate() {
            let (d, _) = shape(spans, m);
            if d > 1 {
                return if i == 0 {
                    Err(io::Error::from_raw_os_error(self.train_error))
                } else {
                    Ok(i)
                };
            }
            let s = spans[m.first];
            self.took.push((m.dst, s.start, s.len));
        }
        Ok(msgs.len())
    }
}

#[test]
fn a_refused_train_is_sent_again_one_datagram_at_a_time() {
    for (code, no_gso) in [
        (libc::EMSGSIZE, false),
        (libc::EINVAL, false),
        (libc::EIO, true),
    ] {
        let mut t = Trains::new();
        t.push(v4(1), 0, 10, 10, true);
        t.push(v4(2), 10, 3000, 1000, true);
        t.push(v4(2), 3010, 500, 500, true);
        t.push(v4(1), 3510, 7, 7, true);
        let want = datagrams(&t);
        let mut s = Script {
            train_error: code,
            full_after: usize::MAX,
            calls: 0,
            took: Vec::new(),
        };
        let sent = t.send(|spans, msgs| s.sys(spans, msgs));
        assert_eq!(s.took, want, "errno {code}");
        assert_eq!(
            (
                sent.sent,
                sent.failed,
                sent.unsent,
                sent.fallbacks,
                sent.gso_refused
            ),
            (6, 0, 0, 1, no_gso),
            "errno {code}"
        );
        assert!(t.is_empty());
    }
}

#[test]
fn a_full_buffer_stops_and_says_what_is_left() {
    let mut t = Trains::new();
    for i in 0..4 {
        t.push(v4(1), i * 2000, 2000, 2000, true); // alone each
    }
    t.push(v4(1), 8000, 3000, 1000, true); // a train of three
    let mut s = Script {
        train_error: libc::EMSGSIZE,
        full_after: 2,
        calls: 0,
        took: Vec::new(),
    };
    let sent = t.send(|spans, msgs| s.sys(spans, msgs));
    // Call 1 takes the four singles, call 2 refuses the train, call 3
    // (its first datagram alone) finds the buffer full.
    assert_eq!(
        (sent.sent, sent.failed, sent.unsent, sent.consumed()),
        (4, 0, 3, 4)
    );
    assert_eq!(sent.calls, 3);
}

#[test]
fn flush_sends_and_counts() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = Some(rx.local_addr().unwrap());
    let buf = vec![7u8; 10_000];
    let mut t = Trains::new();
    let gso = crate::gso::probe(tx_sock.as_fd()).gso;
    for i in 0..5 {
        t.push(to, i * 1000, 1000, 1000, gso);
    }
    let mut tx = SendBatch::new();
    let f = t.flush(tx_sock.as_fd(), &buf, &mut tx);
    assert_eq!((f.sent, f.bytes, f.failed, f.unsent), (5, 5000, 0, 0));
    assert_eq!(f.gso_messages, u64::from(gso));
    assert!(t.is_empty());
    rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut b = [0u8; 2000];
    for _ in 0..5 {
        assert_eq!(rx.recv(&mut b).unwrap(), 1000);
    }
}
