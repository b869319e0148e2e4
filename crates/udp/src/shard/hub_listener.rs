//! The hub's listening sockets on a shard: each received train routed by
//! the shard's hub replica, the replica's events sent to the other shards
//! before the batch's datagrams leave, and the rings they arrive by.

use std::os::fd::AsFd;
use std::sync::Arc;

use ferry_engine::mailbox::{MsgRx, MsgTx};
use ferry_sys::train::Trains;

use super::recv::{each_datagram, each_train};
use super::send::{Out, Run};
use super::{Listener, Shard, ROUNDS};
use crate::hub::{self, Endpoint, Event, HubSettings, Inbox, Verdict};
use crate::metrics::Drop;
use crate::published::Published;

/// A shard's share of the hub: settings, and the rings to and from every
/// other shard.
pub struct HubPart {
    /// The hub's settings, as published (they change on a reload).
    pub settings: Arc<Published<HubSettings>>,
    /// Rings to the other shards.
    pub tx: Vec<MsgTx<Event>>,
    /// Rings from the other shards.
    pub rx: Vec<MsgRx<Event>>,
}

pub(super) struct RingInbox(pub(super) Vec<MsgRx<Event>>);

impl Inbox for RingInbox {
    fn drain(&mut self, apply: &mut dyn FnMut(Event)) {
        for rx in &mut self.0 {
            while let Some(ev) = rx.recv() {
                apply(ev);
            }
        }
    }
}

/// The outbox of the hub listener through which datagrams for `via` leave.
pub(super) fn hub_outbox<'a>(
    listeners: &'a mut [Listener],
    hub_listeners: &[usize],
    via: u16,
) -> Option<&'a mut Trains> {
    let &out = hub_listeners.get(usize::from(via))?;
    listeners.get_mut(out).map(|l| &mut l.outbox)
}

impl Shard {
    /// Peer datagrams arriving on a hub listener.
    pub(super) fn hub_in(&mut self, li: usize, via: u16) -> bool {
        for _ in 0..ROUNDS {
            let n = self.recv(Some(li), None);
            if n == 0 || n == usize::MAX {
                return false;
            }
            let Some(hub) = self.hub.as_mut() else {
                return false;
            };
            let (listeners, hub_listeners) = (&mut self.listeners, &self.hub_listeners);
            let (buf, metrics, now, gso) = (&self.buf, &self.metrics, self.now, self.gso);
            each_train(
                &self.meta[..n],
                self.slot,
                metrics,
                |src, start, len, seg| {
                    metrics.hub_in.add(len.div_ceil(seg) as u64, len as u64);
                    let mut train = hub::Train::default();
                    let mut run: Option<Run<Endpoint>> = None;
                    let queue = |listeners: &mut [Listener], r: Run<Endpoint>| {
                        if let Some(o) = hub_outbox(listeners, hub_listeners, r.to.via) {
                            o.push(Some(r.to.addr), r.start, r.len, seg, gso);
                        }
                    };
                    each_datagram(start, len, seg, |at, n| {
                        let dgram = &buf[at..at + n];
                        if let Some(&t) = dgram.first() {
                            if (1..=4).contains(&t) {
                                metrics.hub_kinds[usize::from(t)].add(1);
                            }
                        }
                        match hub.route_in_train(now, src, via, dgram, &mut train) {
                            Verdict::Forward(ep) => {
                                Run::add(&mut run, ep, at, n, |r| queue(listeners, r));
                            }
                            Verdict::Flood => {
                                if let Some(r) = run.take() {
                                    queue(listeners, r);
                                }
                                for &ep in hub.flood_targets() {
                                    if let Some(o) = hub_outbox(listeners, hub_listeners, ep.via) {
                                        o.push(Some(ep.addr), at, n, n, gso);
                                    }
                                }
                            }
                            Verdict::Drop(why) => metrics.count_drop(Drop::Hub(why), 1),
                        }
                    });
                    if let Some(r) = run {
                        queue(listeners, r);
                    }
                    hub.end_train(&mut train);
                },
            );
            // Other shards must know what this batch taught us before its
            // datagrams leave: replies to them may land there.
            if hub.has_events() {
                for ev in hub.take_events() {
                    for tx in &mut self.repl_tx {
                        tx.send(ev);
                    }
                }
            }
            for k in 0..self.hub_listeners.len() {
                let out = self.hub_listeners[k];
                if out == usize::MAX || self.listeners[out].outbox.is_empty() {
                    continue;
                }
                let l = &mut self.listeners[out];
                let f = l.outbox.flush(l.sock.as_fd(), &self.buf, &mut self.tx);
                self.account(&f, Out::Hub);
            }
            if n < self.asked {
                return false;
            }
        }
        true
    }
}
