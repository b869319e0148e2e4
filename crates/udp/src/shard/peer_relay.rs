//! The peer-relay port on a shard: a batch's data datagrams go through
//! the shared table ([`crate::peer_relay`]), locked once per batch (and
//! only for a batch with data), forwarded between an endpoint's two bound
//! addresses; within a GRO train, the data of one endpoint is looked up
//! once ([`Train`]) and leaves as one GSO message. Control datagrams
//! (binds, answers) are handled before the batch's data, so that data a
//! client sends right after its answer finds it bound, their boxes opened
//! and challenges sealed without the lock ([`Controls`]); a STUN answer to
//! the port's own address probe goes to [`StunProbe`].

use std::os::fd::AsFd;

use super::recv::{each_datagram, each_train};
use super::send::{route_train, Out};
use super::{Shard, ROUNDS};
use crate::forward::Train;
use crate::peer_relay::port::Controls;
use crate::peer_relay::{StunProbe, Verdict};

impl Shard {
    /// Datagrams on the peer-relay port (see the module doc).
    pub(super) fn peer_relay_in(&mut self, li: usize) -> bool {
        let (Some(relays), Some(mut controls)) =
            (self.peer_relays.clone(), self.peer_relay_controls.take())
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
            let mut table = None;
            let out = &mut self.listeners[li].outbox;
            let (buf, now, gso) = (&mut self.buf, self.now, self.gso);
            // Control datagrams first: a client's answer and the data it
            // sends right after it often arrive in one batch (one GRO
            // train, even), and the data must find the side bound.
            for (i, m) in self.meta[..n].iter().enumerate() {
                let Some(src) = m.src.filter(|_| !m.truncated) else {
                    continue;
                };
                each_datagram(i * self.slot, m.len, m.segment.max(1), |at, n| {
                    let datagram = &buf[at..at + n];
                    if Controls::is_control(datagram) {
                        controls.defer(src, at, datagram, now);
                    }
                });
            }
            controls.run(&relays, now, buf, |to, at, n| {
                out.push(Some(to), at, n, n, gso)
            });
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
                        if Controls::is_control(datagram) {
                            // Handled above (its reply, if any, is
                            // written over it: a control datagram too).
                            return None;
                        }
                        let table = table.get_or_insert_with(|| relays.lock());
                        match table.handle_in_train(now, src, datagram, &mut train) {
                            Verdict::Forward(to) => Some((to, n)),
                            // Dropped, counted by the table (control
                            // datagrams do not come here).
                            Verdict::Reply(_) | Verdict::Bound | Verdict::Drop(_) => None,
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
        self.peer_relay_controls = Some(controls);
        more
    }
}
