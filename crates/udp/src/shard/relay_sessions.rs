//! The relay-session port on a shard: data datagrams forwarded under the
//! shared table's lock (taken once per batch, and only for a batch with
//! data), bind messages set aside and handled after it, their MACs
//! computed without the lock (see [`crate::session::port`]).

use std::os::fd::AsFd;

use super::recv::each_train;
use super::send::{route_train, Out};
use super::{Shard, ROUNDS};
use crate::session::{self, port::Binds};

impl Shard {
    /// Datagrams on the relay-session port: data forwarded between a
    /// session's two bound addresses, the shared table locked once per
    /// batch (and only if the batch has data); bind messages set aside and
    /// answered in place after it, their MACs computed without the lock
    /// (see [`crate::session::port`]).
    pub(super) fn relay_sessions_in(&mut self, li: usize) -> bool {
        let (Some(sessions), Some(mut binds)) =
            (self.relay_sessions.clone(), self.relay_session_binds.take())
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
            each_train(
                &self.meta[..n],
                self.slot,
                &self.metrics,
                |src, start, len, seg| {
                    self.metrics
                        .relay_session_in
                        .add(len.div_ceil(seg) as u64, len as u64);
                    let mut train = session::Train::default();
                    route_train(out, gso, (start, len, seg), |at, n| {
                        let datagram = &mut buf[at..at + n];
                        if Binds::is_bind(datagram) {
                            binds.defer(src, at, n);
                            return None;
                        }
                        let table = table.get_or_insert_with(|| sessions.lock());
                        match table.handle_in_train(now, src, datagram, &mut train) {
                            session::Verdict::Forward(to) => Some((to, n)),
                            session::Verdict::Reply => Some((src, n)),
                            // Counted by the table, by reason.
                            session::Verdict::Drop(_) => None,
                        }
                    });
                },
            );
            drop(table);
            binds.run(&sessions, now, buf, |to, at, n| {
                out.push(Some(to), at, n, n, gso)
            });
            let l = &mut self.listeners[li];
            let f = l.outbox.flush(l.sock.as_fd(), &self.buf, &mut self.tx);
            self.account(&f, Out::RelaySessions);
            if n < self.asked {
                more = false;
                break;
            }
        }
        self.relay_session_binds = Some(binds);
        more
    }
}
