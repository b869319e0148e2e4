//! Sending a burst of datagrams the way WireGuard hands one over.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use ferry_sys::mmsg::{OutMsg, SendBatch, Span, MAX_BATCH};

/// Sends `dgrams` from `from` to `to` with `sendmmsg`, one datagram per
/// message, as many per call as one takes (a burst, as WireGuard sends
/// it); panics on an error.
pub fn send_burst(from: &UdpSocket, to: SocketAddr, dgrams: &[Vec<u8>]) {
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
