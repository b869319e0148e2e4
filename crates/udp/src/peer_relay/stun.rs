//! Address discovery for the peer-relay port: the control half asks a
//! STUN server (its home DERP region's) what address the port's packets
//! come from, the port's socket sends the request and hands the answer
//! back, and the address learned joins the addresses offered to clients
//! (for a relay behind NAT without `--peer-relay-endpoints`). No I/O
//! here; times are passed in.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_proto::stun;

/// How long a request waits for its answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The probe's state, shared by the control half and the port.
#[derive(Debug, Default)]
pub struct StunProbe {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    enabled: bool,
    /// Written by the control half, taken by the port.
    unsent: Option<(SocketAddr, [u8; stun::REQUEST_LEN])>,
    /// The request in flight: its transaction ID, server and deadline.
    waiting: Option<([u8; 12], SocketAddr, Instant)>,
    learned: Option<SocketAddr>,
}

impl StunProbe {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Turns discovery on (off by default: configured addresses only).
    pub fn enable(&self) {
        self.lock().enabled = true;
    }

    /// Whether discovery is on.
    pub fn enabled(&self) -> bool {
        self.lock().enabled
    }

    /// Queues a Binding Request with `txid` to `server` (replacing one
    /// not sent yet, and forgetting one in flight). Ignored when off.
    pub fn probe(&self, server: SocketAddr, txid: [u8; 12], now: Instant) {
        let mut g = self.lock();
        if !g.enabled {
            return;
        }
        g.unsent = Some((server, stun::binding_request(&txid)));
        g.waiting = Some((txid, server, now + ANSWER_WITHIN));
    }

    /// The request to send from the port's socket, if one is queued.
    pub fn take_request(&self) -> Option<(SocketAddr, [u8; stun::REQUEST_LEN])> {
        self.lock().unsent.take()
    }

    /// Whether `datagram` looks like a STUN Binding Success Response
    /// (type and magic cookie; the port's own headers start with a zero
    /// byte, so the two never overlap).
    pub fn is_answer(datagram: &[u8]) -> bool {
        datagram.len() >= stun::HEADER_LEN
            && datagram[0..2] == stun::BINDING_SUCCESS.to_be_bytes()
            && datagram[4..8] == stun::MAGIC_COOKIE
    }

    /// A datagram from `src` that [`StunProbe::is_answer`] accepted: the
    /// mapped address when it answers the request in flight (same
    /// server, same transaction ID, in time) and differs from what was
    /// learned before; anything else is ignored.
    pub fn answer(&self, src: SocketAddr, datagram: &[u8], now: Instant) -> Option<SocketAddr> {
        let mut g = self.lock();
        let (txid, server, deadline) = g.waiting?;
        if src != server || now > deadline {
            return None;
        }
        let (got, mapped) = stun::parse_binding_response(datagram).ok()?;
        if got != txid {
            return None;
        }
        g.waiting = None;
        if g.learned == Some(mapped) {
            return None;
        }
        g.learned = Some(mapped);
        Some(mapped)
    }

    /// The address the last answer named.
    pub fn learned(&self) -> Option<SocketAddr> {
        self.lock().learned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's answer to `txid`: `mapped` as XOR-MAPPED-ADDRESS.
    fn answer_to(txid: [u8; 12], mapped: SocketAddr) -> Vec<u8> {
        let mut out = [0u8; stun::MAX_RESPONSE_LEN];
        let n = stun::write_binding_response(&txid, mapped, &mut out);
        out[..n].to_vec()
    }

    #[test]
    fn the_answer_to_the_request_in_flight_is_learned_once() {
        let p = StunProbe::default();
        let server: SocketAddr = "192.0.2.1:3478".parse().unwrap();
        let mapped: SocketAddr = "203.0.113.9:61000".parse().unwrap();
        let now = Instant::now();
        p.probe(server, [1; 12], now);
        assert!(p.take_request().is_none(), "off by default");
        p.enable();
        p.probe(server, [1; 12], now);
        let (to, req) = p.take_request().unwrap();
        assert_eq!(to, server);
        assert_eq!(stun::parse_binding_request(&req).unwrap(), [1; 12]);
        assert!(p.take_request().is_none(), "taken once");

        let good = answer_to([1; 12], mapped);
        assert!(StunProbe::is_answer(&good));
        // Another source, another transaction: ignored.
        assert_eq!(
            p.answer("192.0.2.2:3478".parse().unwrap(), &good, now),
            None
        );
        assert_eq!(p.answer(server, &answer_to([2; 12], mapped), now), None);
        assert_eq!(p.answer(server, &good, now), Some(mapped));
        assert_eq!(p.learned(), Some(mapped));
        // Answered already: a replay is ignored.
        assert_eq!(p.answer(server, &good, now), None);
        // A late answer is ignored.
        p.probe(server, [3; 12], now);
        let late = now + ANSWER_WITHIN + Duration::from_secs(1);
        assert_eq!(p.answer(server, &answer_to([3; 12], mapped), late), None);
        // The port's own headers are never taken for answers.
        assert!(!StunProbe::is_answer(&[
            0, 0x80, 0x7a, 0x11, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
        ]));
    }
}
