//! The peer-relay port on a shard: every datagram of a batch goes through
//! the shared table ([`crate::peer_relay`]), locked once per batch:
//! data forwarded between an endpoint's two bound addresses, binds
//! answered in place with their challenge, answers binding their slot.
//!
//! Control datagrams (binds, answers) are limited per source (an IPv4
//! address or an IPv6 /64) before they reach the table: over the rate,
//! they are dropped and counted without any crypto. A STUN answer to the
//! port's own address probe goes to [`StunProbe`] instead. What relay sessions
//! do and this does not yet: binds are opened under the lock here (one
//! box open each), and every datagram is looked up (no train fast path).

use std::os::fd::AsFd;

use super::recv::{each_datagram, each_train};
use super::send::{Out, Run};
use super::{Shard, ROUNDS};
use crate::peer_relay::{Drop, StunProbe, Verdict};
use crate::session::allocate::source_key;

impl Shard {
    /// Datagrams on the peer-relay port (see the module doc).
    pub(super) fn peer_relay_in(&mut self, li: usize) -> bool {
        let (Some(relays), Some(mut limiter)) =
            (self.peer_relays.clone(), self.peer_relay_limiter.take())
        else {
            return false;
        };
        let mut more = true;
        for _ in 0..ROUNDS {
            let n = self.recv(Some(li), None);
            if n == 0 || n == usize::MAX {
                more = false;
                break;
            }
            let mut table = relays.lock();
            let out = &mut self.listeners[li].outbox;
            let (buf, now, gso) = (&mut self.buf, self.now, self.gso);
            each_train(
                &self.meta[..n],
                self.slot,
                &self.metrics,
                |src, start, len, seg| {
                    let mut run = None;
                    each_datagram(start, len, seg, |at, n| {
                        let datagram = &mut buf[at..at + n];
                        if StunProbe::is_answer(datagram) {
                            if let Some(a) = relays.stun().answer(src, datagram, now) {
                                tracing::info!(addr = %a, "peer relay: STUN names the port's public address");
                            }
                            return;
                        }
                        let control = datagram.get(1).is_some_and(|b| b & 0x80 != 0);
                        if control && !limiter.allow(source_key(src.ip()), now) {
                            table.count_drop(Drop::RateLimited);
                            return;
                        }
                        match table.handle(now, src, datagram) {
                            Verdict::Forward(to) => Run::add(&mut run, to, at, n, |r| {
                                out.push(Some(r.to), r.start, r.len, seg, gso)
                            }),
                            // A challenge, no longer than the bind it
                            // was written over: back to the source alone.
                            Verdict::Reply(len) => out.push(Some(src), at, len, len, gso),
                            // Bound, or dropped: counted by the table.
                            Verdict::Bound | Verdict::Drop(_) => {}
                        }
                    });
                    if let Some(r) = run {
                        out.push(Some(r.to), r.start, r.len, seg, gso);
                    }
                },
            );
            drop(table);
            let l = &mut self.listeners[li];
            let f = l.outbox.flush(l.sock.as_fd(), &self.buf, &mut self.tx);
            self.account(&f, Out::PeerRelay);
            if n < self.asked {
                more = false;
                break;
            }
        }
        self.peer_relay_limiter = Some(limiter);
        more
    }
}
