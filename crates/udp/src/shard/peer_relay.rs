//! The peer-relay port on a shard: every datagram of a batch goes through
//! the shared table ([`crate::peer_relay`]), locked once per batch:
//! data forwarded between an endpoint's two bound addresses, binds
//! answered in place with their challenge, answers binding their slot.
//!
//! What relay sessions do and this does not yet: binds are opened under
//! the lock here (one box open each), with no per-source rate limit
//! before the crypto, and every datagram is looked up (no train fast
//! path).

use std::os::fd::AsFd;

use super::recv::{each_datagram, each_train};
use super::send::{Out, Run};
use super::{Shard, ROUNDS};
use crate::peer_relay::Verdict;

impl Shard {
    /// Datagrams on the peer-relay port (see the module doc).
    pub(super) fn peer_relay_in(&mut self, li: usize) -> bool {
        let Some(relays) = self.peer_relays.clone() else {
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
                        match table.handle(now, src, &mut buf[at..at + n]) {
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
        more
    }
}
