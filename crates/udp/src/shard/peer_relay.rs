//! The peer-relay port on a shard: every datagram of a batch goes through
//! the shared table ([`crate::peer_relay`]), locked once per batch:
//! data forwarded between an endpoint's two bound addresses, binds
//! answered in place with their challenge, answers binding their slot.
//!
//! Control datagrams (binds, answers) are limited per source (an IPv4
//! address or an IPv6 /64) before they reach the table: over the rate,
//! they are dropped and counted without any crypto. A STUN answer to the
//! port's own address probe goes to [`StunProbe`] instead. Within a GRO
//! train, the data datagrams of one endpoint are looked up once
//! ([`Train`]) and leave as one GSO message. What relay sessions do and
//! this does not yet: binds are opened under the lock here (one box open
//! each).

use std::os::fd::AsFd;

use super::recv::each_train;
use super::send::{route_train, Out};
use super::{Shard, ROUNDS};
use crate::forward::Train;
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
                    let mut train = Train::default();
                    route_train(out, gso, (start, len, seg), |at, n| {
                        let datagram = &mut buf[at..at + n];
                        if StunProbe::is_answer(datagram) {
                            if let Some(a) = relays.stun().answer(src, datagram, now) {
                                tracing::info!(addr = %a, "peer relay: STUN names the port's public address");
                            }
                            return None;
                        }
                        let control = datagram.get(1).is_some_and(|b| b & 0x80 != 0);
                        if control && !limiter.allow(source_key(src.ip()), now) {
                            table.count_drop(Drop::RateLimited);
                            return None;
                        }
                        match table.handle_in_train(now, src, datagram, &mut train) {
                            Verdict::Forward(to) => Some((to, n)),
                            // A challenge, no longer than the bind it
                            // was written over: back to the source.
                            Verdict::Reply(len) => Some((src, len)),
                            // Bound, or dropped: counted by the table.
                            Verdict::Bound | Verdict::Drop(_) => None,
                        }
                    });
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
