//! The data path: every datagram's way into the hub ([`Hub::route`],
//! [`Hub::route_in_train`]), and transport messages routed by receiver
//! index, with the roaming rule that moves a peer's endpoint only after
//! data with fresh counters from its new address, and the note that a
//! peer was heard from its endpoint ([`Event::Heard`]).

use std::net::SocketAddr;
use std::time::Instant;

use ferry_proto::wireguard::{self as wg, Index, Message};

use super::{
    DropReason, Endpoint, Event, Hub, PeerId, Train, TrainRun, Verdict, HEARD_PERIOD,
    ROAM_CONFIRMATIONS,
};

impl Hub {
    /// Decides where `datagram`, received from `src` on listening socket
    /// `via`, goes. Events it causes are queued for [`Hub::take_events`].
    pub fn route(&mut self, now: Instant, src: SocketAddr, via: u16, datagram: &[u8]) -> Verdict {
        let mut train = Train::default();
        let v = self.route_in_train(now, src, via, datagram, &mut train);
        self.end_train(&mut train);
        v
    }

    /// [`Hub::route`] for one datagram of a received train (the datagrams
    /// of one source that GRO glued into one receive; `train` starts empty
    /// for each, and [`Hub::end_train`] closes it). Every datagram is
    /// classified and its receiver index read; a transport message to the
    /// index of the one before it, which came from its session partner's
    /// endpoint, goes the same way without another lookup (nothing else
    /// can change the replica in between: any other datagram ends the
    /// run), and the highest counter of the run is recorded when it ends.
    pub fn route_in_train(
        &mut self,
        now: Instant,
        src: SocketAddr,
        via: u16,
        datagram: &[u8],
        train: &mut Train,
    ) -> Verdict {
        let msg = wg::classify(datagram);
        if let (Some(run), Ok(Message::Transport { receiver, counter })) = (&mut train.run, &msg) {
            if *receiver == run.receiver {
                run.max_counter = run.max_counter.max(*counter);
                return Verdict::Forward(run.dest);
            }
        }
        self.end_train(train);
        let Ok(msg) = msg else {
            return Verdict::Drop(DropReason::NotWireGuard);
        };
        let from = Endpoint { addr: src, via };
        match msg {
            Message::Transport { receiver, counter } => {
                let (v, home) = match self.transport(now, from, receiver, counter) {
                    (Verdict::Drop(DropReason::UnknownIndex), _) => {
                        self.sync();
                        self.transport(now, from, receiver, counter)
                    }
                    v => v,
                };
                if let (Verdict::Forward(dest), Some(way)) = (v, home) {
                    train.run = Some(TrainRun {
                        receiver,
                        way,
                        dest,
                        max_counter: counter,
                    });
                }
                v
            }
            _ if !self.limiter.allow(src.ip(), now) => Verdict::Drop(DropReason::RateLimited),
            // Handshake messages are rare and rate-limited: bring the
            // replica up to date before deciding on one.
            Message::Initiation { sender } => {
                self.sync();
                self.initiation(now, from, sender, datagram)
            }
            Message::Response { sender, receiver } => {
                self.sync();
                self.response(now, from, sender, receiver, datagram)
            }
            Message::CookieReply { receiver } => {
                self.sync();
                self.cookie(from, receiver)
            }
        }
    }

    /// Ends a train's run of transport messages: records its highest
    /// counter on the session entry, as routing each of them one by one
    /// would have.
    pub fn end_train(&mut self, train: &mut Train) {
        let Some(run) = train.run.take() else {
            return;
        };
        if let Some(s) = self
            .wg_sessions
            .get_mut(&run.receiver)
            .and_then(|b| b[run.way].as_mut())
        {
            s.max_counter = s.max_counter.max(run.max_counter);
        }
    }

    /// Routes a transport message; with the way of its entry when it came
    /// from the partner's committed endpoint (the common case, which a
    /// train's next datagrams may repeat without a lookup).
    pub(super) fn transport(
        &mut self,
        now: Instant,
        from: Endpoint,
        receiver: Index,
        counter: u64,
    ) -> (Verdict, Option<usize>) {
        let endpoints = &self.endpoints;
        let Some(bucket) = self.wg_sessions.get_mut(&receiver) else {
            return (Verdict::Drop(DropReason::UnknownIndex), None);
        };
        let at = |p: PeerId| endpoints[usize::from(p)].map(|(e, _)| e);
        // Which entry: the one whose partner sends from here; failing that
        // (a roaming partner), the only entry.
        let mut way = None;
        let mut live = 0;
        for (i, s) in bucket.iter().enumerate() {
            if let Some(s) = s {
                live += 1;
                if at(s.partner).is_some_and(|e| e.addr == from.addr) {
                    way = Some((i, true));
                }
            }
        }
        if way.is_none() {
            if self.by_addr.contains_key(&from.addr) {
                // A known peer may not use an index of a session it is not in.
                return (Verdict::Drop(DropReason::WrongSource), None);
            }
            if live > 1 {
                return (Verdict::Drop(DropReason::IndexCollision), None);
            }
            way = bucket.iter().position(|s| s.is_some()).map(|i| (i, false));
        }
        let Some((i, at_home)) = way else {
            return (Verdict::Drop(DropReason::UnknownIndex), None);
        };
        let s = bucket[i].as_mut().expect("chosen entry exists");
        let Some(dest) = at(s.owner) else {
            return (Verdict::Drop(DropReason::NoEndpoint), None);
        };
        if at_home {
            let fresh = counter > s.max_counter;
            s.max_counter = s.max_counter.max(counter);
            s.roam = None;
            let partner = s.partner;
            if fresh {
                self.heard_from(partner, now);
            }
            return (Verdict::Forward(dest), Some(i));
        }
        // From a new address: forward only what could be fresh, and move
        // the endpoint once it has proven itself a few times.
        let floor = match s.roam {
            Some((ep, last, _)) if ep == from => last,
            _ => s.max_counter,
        };
        if counter <= floor && !(counter == 0 && s.max_counter == 0 && s.roam.is_none()) {
            return (Verdict::Drop(DropReason::StaleCounter), None);
        }
        let seen = match s.roam {
            Some((ep, _, n)) if ep == from => n + 1,
            _ => 1,
        };
        s.roam = Some((from, counter, seen));
        if seen >= ROAM_CONFIRMATIONS {
            s.max_counter = s.max_counter.max(counter);
            s.roam = None;
            let partner = s.partner;
            self.commit_endpoint(partner, from);
        }
        (Verdict::Forward(dest), None)
    }

    /// Notes that `peer` sent fresh data from its endpoint; tells the
    /// other replicas at most once per [`HEARD_PERIOD`].
    fn heard_from(&mut self, peer: PeerId, now: Instant) {
        let last = self.heard[usize::from(peer)];
        if last.is_none_or(|t| now.saturating_duration_since(t) >= HEARD_PERIOD) {
            self.emit(Event::Heard { peer, at: now });
        }
    }
}
