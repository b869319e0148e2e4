//! Sending a burst of datagrams the way WireGuard hands one over, and the
//! mix of sizes the over-MTU tests send.

use std::net::SocketAddr;
use std::os::fd::AsFd;

use ferry_sys::mmsg::{OutMsg, SendBatch, Span, MAX_BATCH};

/// Sends `dgrams` from the UDP socket `from` to `to` with `sendmmsg`, one
/// datagram per message, as many per call as one takes (a burst, as
/// WireGuard sends it); panics on an error.
pub fn send_burst(from: &impl AsFd, to: SocketAddr, dgrams: &[Vec<u8>]) {
    let bytes = dgrams.concat();
    let mut spans = Vec::with_capacity(dgrams.len());
    let mut at = 0;
    for d in dgrams {
        spans.push(Span {
            start: at,
            len: d.len(),
        });
        at += d.len();
    }
    let msgs: Vec<OutMsg> = (0..spans.len())
        .map(|i| OutMsg {
            dst: Some(to),
            first: i,
            count: 1,
            segment: 0,
        })
        .collect();
    let mut tx = SendBatch::new();
    let mut done = 0;
    while done < msgs.len() {
        let end = (done + MAX_BATCH).min(msgs.len());
        done += tx
            .send(from.as_fd(), &bytes, &spans, &msgs[done..end])
            .expect("sendmmsg");
    }
}

/// Payload sizes for a burst that tests a path's handling of the MTU,
/// each clamped to `min..=max`: the largest first, over-MTU ones with
/// shorter ones right after them, runs of equal ones (GSO trains), the
/// largest GSO segments of IPv4 and IPv6 (1,472 and 1,452) and of them
/// less an 8-byte header, one past each, and the smallest.
pub fn mixed_sizes(min: usize, max: usize) -> Vec<usize> {
    [
        max, 1, 9000, 100, 1472, 1473, 1464, 1465, 1452, 1453, 1444, 1445, 1400, 1400, 1400, 64,
        20_000, 1472, 1472, 1472, 8, 3000, 1500, 9000, 9000, 200, 65_000, 1000, 1000, 999, 2,
        40_000,
    ]
    .into_iter()
    .map(|n| n.clamp(min, max))
    .collect()
}

/// A relay session for `a` and `b` straight from the session table (no
/// DERP connection): the offers for `a` (the asker) and `b`, as a new
/// session gives both.
pub fn allocate_pair(
    sessions: &dyn ferry_proto::relay_session::SessionService,
    a: ferry_proto::key::NodePublic,
    b: ferry_proto::key::NodePublic,
) -> (
    ferry_proto::relay_session::SessionOffer,
    ferry_proto::relay_session::SessionOffer,
) {
    let request = ferry_proto::relay_session::AllocateRequest {
        asker: a,
        peer: b,
        ip: std::net::Ipv4Addr::LOCALHOST.into(),
        request_id: 0,
        // Connection numbers no DERP connection has (the DERP server's are
        // a shard index, under 1024, above a generation count), so the
        // clients' own relayAllocates later count as new connections.
        conns: [u64::MAX - 1, u64::MAX],
    };
    let offers = sessions
        .allocate(&request, std::time::Instant::now())
        .expect("a session for the pair");
    (
        offers.asker.expect("the asker's offer"),
        offers.peer.expect("the peer's offer"),
    )
}
