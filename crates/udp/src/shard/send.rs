//! The send side of a shard: datagrams bound for one place gathered into
//! runs (one GSO message each), and what a flush of an outbox counts.

use std::net::SocketAddr;

use ferry_sys::train::{Sent, Trains};

use super::recv::each_datagram;
use super::Shard;
use crate::metrics::Drop;

/// Consecutive datagrams of one train that go to the same place, gathered
/// into one span so they are queued with one
/// [`Trains::push`](ferry_sys::train::Trains::push) (one GSO
/// message) instead of one each.
pub(super) struct Run<K> {
    pub(super) to: K,
    pub(super) start: usize,
    pub(super) len: usize,
}

impl<K: Copy + PartialEq> Run<K> {
    /// Adds the datagram at `start` (`len` bytes) bound for `to`: to this
    /// run if it continues it, else it starts a new run and the finished
    /// one is handed to `queue`.
    pub(super) fn add(
        run: &mut Option<Self>,
        to: K,
        start: usize,
        len: usize,
        queue: impl FnOnce(Self),
    ) {
        if let Some(r) = run {
            if r.to == to && r.start + r.len == start {
                r.len += len;
                return;
            }
        }
        if let Some(done) = run.replace(Run { to, start, len }) {
            queue(done);
        }
    }
}

/// Queues the datagrams of a received train (`len` bytes at `start`,
/// `seg` bytes each but the last) on `out` where `route(offset, length)`
/// sends each: a destination and how many of its bytes (a reply written
/// over it may be shorter), or `None`. Consecutive datagrams for one
/// destination leave as one run (one GSO message). The relay-session and
/// peer-relay ports share it; the table behind `route` skips its lookup
/// within a run of one endpoint ([`Train`](crate::forward::Train)).
pub(super) fn route_train(
    out: &mut Trains,
    gso: bool,
    (start, len, seg): (usize, usize, usize),
    mut route: impl FnMut(usize, usize) -> Option<(SocketAddr, usize)>,
) {
    let mut run = None;
    each_datagram(start, len, seg, |at, n| {
        if let Some((to, sent)) = route(at, n) {
            Run::add(&mut run, to, at, sent, |r| {
                out.push(Some(r.to), r.start, r.len, seg, gso)
            });
        }
    });
    if let Some(r) = run {
        out.push(Some(r.to), r.start, r.len, seg, gso);
    }
}

/// Which flow a flush counts in.
#[derive(Clone, Copy)]
pub(super) enum Out {
    Client,
    Target,
    Hub,
    RelaySessions,
    /// The peer-relay port (its datagrams are counted by its table).
    PeerRelay,
}

impl Shard {
    pub(super) fn account(&mut self, f: &Sent, out: Out) {
        self.metrics.send_calls.add(f.calls);
        self.metrics.gso_messages.add(f.gso_messages);
        match out {
            Out::Client => self.metrics.to_client.add(f.sent, f.bytes),
            Out::Target => self.metrics.to_target.add(f.sent, f.bytes),
            Out::Hub => self.metrics.hub_out.add(f.sent, f.bytes),
            Out::RelaySessions => self.metrics.relay_session_out.add(f.sent, f.bytes),
            Out::PeerRelay => {}
        }
        if f.unsent > 0 {
            self.metrics.count_drop(Drop::SendBufferFull, f.unsent);
        }
        self.metrics.gso_fallbacks.add(f.fallbacks);
        if f.failed > 0 {
            self.metrics.count_drop(Drop::SendFailed, f.failed);
        }
        if f.gso_refused && self.gso {
            self.gso = false;
            tracing::warn!(
                shard = self.id,
                "the network device refused a GSO send: sending datagrams one by one from now on"
            );
        }
    }
}
