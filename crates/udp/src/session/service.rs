//! The session table shared by the relay's shards and the DERP server that
//! allocates sessions: one [`SessionTable`] behind a lock, taken once per
//! received batch by a shard for its data datagrams (not per datagram),
//! at most twice more per batch for its bind messages (with no MAC
//! computed under it: see [`control`](super::control)) and once per
//! allocation by a DERP shard. Sessions see little allocation traffic and
//! a batch holds the lock for the few hundred nanoseconds its lookups
//! take, so shards rarely meet on it; what the lock buys is that a bind on
//! one shard is seen by the next datagram on any other (the kernel spreads
//! a session's two clients over shards by their addresses), with no
//! replication lag. The cookie secrets are published apart from the
//! table, so that a shard checks cookies against a copy it refreshes only
//! when they rotate.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::Instant;

use ferry_engine::stat::exposition::{Exposition, Family, Kind};
use ferry_proto::relay_session::{
    AllocateRequest, Ended, Hosted, Offers, RefuseReason, SessionOffer, SessionService, Via,
};

use super::{Drop, Limits, Secrets, SessionTable};
use crate::published::Published;

/// The relay's sessions, shared by every shard and the DERP side.
pub struct Sessions {
    table: Mutex<SessionTable>,
    limits: Limits,
    bound: OnceLock<SocketAddr>,
    /// The endpoints offers name instead of the bound address, if set
    /// (`ferry derp --relay-advertise`).
    advertised: OnceLock<Vec<SocketAddr>>,
    /// The endpoints offers of a pair split across nodes name when
    /// nothing is advertised and the socket is bound to an unspecified
    /// address (the host's interface addresses, set at start).
    cross_node_default: OnceLock<Vec<SocketAddr>>,
    /// The table's cookie secrets, republished when they rotate.
    secrets: Published<Secrets>,
    /// Drops the shards decided without the table, by [`Drop`] index.
    late_drops: [AtomicU64; Drop::ALL.len()],
}

impl Sessions {
    /// An empty table with these limits.
    pub fn new(limits: Limits) -> Sessions {
        let table = SessionTable::new(limits, Instant::now());
        Sessions {
            secrets: Published::new(table.secrets()),
            table: Mutex::new(table),
            limits,
            bound: OnceLock::new(),
            advertised: OnceLock::new(),
            cross_node_default: OnceLock::new(),
            late_drops: Default::default(),
        }
    }

    /// The table, locked. (Its secrets rotate through [`Sessions::tick`],
    /// which publishes them to the shards.)
    pub fn lock(&self) -> MutexGuard<'_, SessionTable> {
        // A shard that panicked holding the lock left a table whose
        // every step is complete: keep using it.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The cookie secrets as published, and their generation (which
    /// changes when they rotate).
    pub fn secrets(&self) -> (u64, Secrets) {
        let generation = self.secrets.generation();
        (generation, *self.secrets.get())
    }

    /// The generation of the published secrets (one atomic load).
    pub fn secrets_generation(&self) -> u64 {
        self.secrets.generation()
    }

    /// Adds drops a shard decided without the table (`counts` by [`Drop`]
    /// index) and zeroes `counts`.
    pub fn add_late_drops(&self, counts: &mut [u64; Drop::ALL.len()]) {
        for (total, n) in self.late_drops.iter().zip(counts.iter_mut()) {
            if *n > 0 {
                total.fetch_add(std::mem::take(n), Ordering::Relaxed);
            }
        }
    }

    /// Drops for `why` so far: the table's and the shards'.
    pub fn dropped(&self, why: Drop) -> u64 {
        self.lock().counters().dropped(why) + self.late_drops[why.index()].load(Ordering::Relaxed)
    }

    /// Records the address the session socket is bound to (once, at start).
    pub fn set_bound(&self, addr: SocketAddr) {
        let _ = self.bound.set(addr);
    }

    /// Sets the endpoints every offer names from now on, instead of the
    /// bound address (once, at start; an empty list is ignored): the
    /// addresses, as clients of every node of the region reach this one,
    /// at which the session socket receives (`--relay-advertise`).
    pub fn set_advertised(&self, endpoints: Vec<SocketAddr>) {
        if !endpoints.is_empty() {
            let _ = self.advertised.set(endpoints);
        }
    }

    /// The endpoints offers name: the advertised ones, else the bound
    /// address (`None` before start).
    pub fn endpoints(&self) -> Option<Vec<SocketAddr>> {
        match self.advertised.get() {
            Some(a) => Some(a.clone()),
            None => self.bound().map(|b| vec![b]),
        }
    }

    /// Sets the endpoints that offers of a pair split across nodes name
    /// while nothing is advertised and the socket is bound to an
    /// unspecified address (once, at start; an empty list is ignored):
    /// the host's own addresses, where clients of the region's other
    /// nodes may reach it. Offers to pairs on this node keep the bound
    /// address ("where you reached DERP").
    pub fn set_cross_node_default(&self, endpoints: Vec<SocketAddr>) {
        if !endpoints.is_empty() {
            let _ = self.cross_node_default.set(endpoints);
        }
    }

    /// The endpoints offers of a pair split across nodes name: the
    /// advertised ones, else a specific bound address, else the default
    /// set at start, else the bound address (`None` before start).
    pub fn cross_node_endpoints(&self) -> Option<Vec<SocketAddr>> {
        match (
            self.advertised.get(),
            self.bound(),
            self.cross_node_default.get(),
        ) {
            (Some(a), _, _) => Some(a.clone()),
            (None, Some(b), Some(d)) if b.ip().is_unspecified() => Some(d.clone()),
            (None, b, _) => b.map(|b| vec![b]),
        }
    }

    /// The address the session socket is bound to (`None` before start).
    pub fn bound(&self) -> Option<SocketAddr> {
        self.bound.get().copied()
    }

    /// Timers: rotates the cookie secret when due (publishing it) and frees
    /// expired sessions. A table busy now is left for the next tick: the
    /// caller (a shard) never waits for it.
    pub fn tick(&self, now: Instant) {
        let mut t = match self.table.try_lock() {
            Ok(t) => t,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        if t.rotate(now) {
            self.secrets.set(t.secrets());
        }
        t.expire(now);
    }

    /// Appends the sessions' metrics in Prometheus text form
    /// (`ferry_udp_relay_session*`).
    pub fn render(&self, o: &mut String) {
        let (states, c) = {
            let t = self.lock();
            (t.states(), *t.counters())
        };
        family(
            o,
            "ferry_udp_relay_sessions",
            Kind::Gauge,
            "Relay sessions, by state (allocated: no side bound; half_bound; bound: forwarding).",
            "state",
            &[
                ("allocated", states.allocated as u64),
                ("half_bound", states.half_bound as u64),
                ("bound", states.bound as u64),
            ],
        );
        family(
            o,
            "ferry_udp_relay_session_events_total",
            Kind::Counter,
            "Relay session allocations (and repeats left unanswered), refusals (refused_link: of those for the cap per mesh link), evictions, binds and frees.",
            "event",
            &[
                ("allocated", c.allocated),
                ("reused", c.reused),
                ("repeat_unanswered", c.repeats_unanswered),
                ("refused_limit", c.refused_limit),
                ("refused_link", c.refused_link),
                ("evicted", c.evicted),
                ("challenged", c.challenges),
                ("bound", c.binds),
                ("freed_bind_timeout", c.freed_bind_timeout),
                ("freed_idle", c.freed_idle),
                ("freed_mesh", c.freed_mesh),
            ],
        );
        family(
            o,
            "ferry_udp_relay_session_forwarded_total",
            Kind::Counter,
            "Datagrams forwarded between the two sides of relay sessions.",
            "",
            &[("", c.forwarded_packets)],
        );
        family(
            o,
            "ferry_udp_relay_session_forwarded_bytes_total",
            Kind::Counter,
            "Bytes forwarded between the two sides of relay sessions.",
            "",
            &[("", c.forwarded_bytes)],
        );
        let drops = Drop::ALL.map(|why| {
            let late = self.late_drops[why.index()].load(Ordering::Relaxed);
            (why.label(), c.dropped(why) + late)
        });
        family(
            o,
            "ferry_udp_relay_session_drops_total",
            Kind::Counter,
            "Datagrams on the relay-session port dropped, by reason.",
            "reason",
            &drops,
        );
    }
}

/// Appends one metric family: its help and type lines, then one sample per
/// `(value of label, number)`; an empty `label` writes the one sample
/// without labels.
pub(crate) fn family(
    o: &mut String,
    name: &str,
    kind: Kind,
    help: &str,
    label: &str,
    samples: &[(&str, u64)],
) {
    let labels: &[&str] = if label.is_empty() {
        &[]
    } else {
        std::slice::from_ref(&label)
    };
    let mut w = Exposition::new(o);
    let mut f = w.family(&Family::new(name, help, kind).labels(labels));
    for (value, n) in samples {
        if label.is_empty() {
            f.value(*n);
        } else {
            f.sample(&[value], *n);
        }
    }
}

/// What the DERP server asks of the table: the session socket's port to
/// offer, and allocations.
impl SessionService for Sessions {
    /// The session socket's port (0 before start).
    fn port(&self) -> u16 {
        self.bound().map_or(0, |a| a.port())
    }

    /// Finds or makes the session of the request's asker and peer and
    /// returns the offers to send: the asker's (with its request id) and
    /// the peer's (request id 0), each only if it is to be told (see
    /// [`SessionTable::allocate_on`]). The endpoints are the advertised
    /// ones, else the session socket's address; an unspecified one
    /// (`0.0.0.0`, `::`) means the address the client reached the DERP
    /// server at (`docs/relay-sessions.md` §2).
    fn allocate(&self, r: &AllocateRequest, now: Instant) -> Result<Offers, RefuseReason> {
        self.allocate_at(r, None, now)
    }

    /// [`SessionService::allocate`] counted against mesh link `via.link`
    /// ([`SessionTable::allocate_via`]).
    fn allocate_via(
        &self,
        r: &AllocateRequest,
        via: Via,
        now: Instant,
    ) -> Result<Offers, RefuseReason> {
        self.allocate_at(r, Some(via), now)
    }

    /// [`SessionTable::link_down`].
    fn link_down(&self, link: u16) -> Vec<Ended> {
        self.lock().link_down(link)
    }

    /// [`SessionTable::end_remote`].
    fn end_remote(&self, vni: u32, via: Via, bound_too: bool) -> Option<Ended> {
        self.lock().end_remote(vni, via, bound_too)
    }

    /// [`SessionTable::hosted`].
    fn hosted(&self) -> Vec<Hosted> {
        self.lock().hosted()
    }

    /// Whether the endpoints of cross-node offers are all specific
    /// addresses.
    fn hosts_cross_node(&self) -> bool {
        self.cross_node_endpoints()
            .is_some_and(|e| !e.is_empty() && e.iter().all(|a| !a.ip().is_unspecified()))
    }
}

impl Sessions {
    /// An allocation, behind mesh link `via` if any (see
    /// [`SessionService::allocate`]).
    fn allocate_at(
        &self,
        r: &AllocateRequest,
        via: Option<Via>,
        now: Instant,
    ) -> Result<Offers, RefuseReason> {
        let endpoints = if via.is_some() {
            self.cross_node_endpoints()
        } else {
            self.endpoints()
        };
        let Some(endpoints) = endpoints else {
            return Err(RefuseReason::Off);
        };
        let a = self
            .lock()
            .allocate_via(&r.asker, &r.peer, r.ip, r.conns, via, now)?;
        let offer = |request_id, slot: u8, peer| SessionOffer {
            request_id,
            vni: a.vni,
            peer,
            slot,
            token: a.tokens[usize::from(slot)],
            endpoints: endpoints.clone(),
            bind_lifetime: self.limits.bind_lifetime,
            idle_lifetime: self.limits.idle_lifetime,
        };
        Ok(Offers {
            asker: a.tell_asker.then(|| offer(r.request_id, a.slot, r.peer)),
            peer: a.tell_peer.then(|| offer(0, 1 - a.slot, r.asker)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_writes_every_family_and_sample() {
        let mut o = String::new();
        Sessions::new(Limits::default()).render(&mut o);
        let samples: Vec<&str> = o.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            [
                "ferry_udp_relay_sessions{state=\"allocated\"} 0",
                "ferry_udp_relay_sessions{state=\"half_bound\"} 0",
                "ferry_udp_relay_sessions{state=\"bound\"} 0",
                "ferry_udp_relay_session_events_total{event=\"allocated\"} 0",
                "ferry_udp_relay_session_events_total{event=\"reused\"} 0",
                "ferry_udp_relay_session_events_total{event=\"repeat_unanswered\"} 0",
                "ferry_udp_relay_session_events_total{event=\"refused_limit\"} 0",
                "ferry_udp_relay_session_events_total{event=\"refused_link\"} 0",
                "ferry_udp_relay_session_events_total{event=\"evicted\"} 0",
                "ferry_udp_relay_session_events_total{event=\"challenged\"} 0",
                "ferry_udp_relay_session_events_total{event=\"bound\"} 0",
                "ferry_udp_relay_session_events_total{event=\"freed_bind_timeout\"} 0",
                "ferry_udp_relay_session_events_total{event=\"freed_idle\"} 0",
                "ferry_udp_relay_session_events_total{event=\"freed_mesh\"} 0",
                "ferry_udp_relay_session_forwarded_total 0",
                "ferry_udp_relay_session_forwarded_bytes_total 0",
                "ferry_udp_relay_session_drops_total{reason=\"bad_header\"} 0",
                "ferry_udp_relay_session_drops_total{reason=\"bad_bind\"} 0",
                "ferry_udp_relay_session_drops_total{reason=\"unknown_vni\"} 0",
                "ferry_udp_relay_session_drops_total{reason=\"bad_cookie\"} 0",
                "ferry_udp_relay_session_drops_total{reason=\"bad_proof\"} 0",
                "ferry_udp_relay_session_drops_total{reason=\"stale_generation\"} 0",
                "ferry_udp_relay_session_drops_total{reason=\"unbound\"} 0",
                "ferry_udp_relay_session_drops_total{reason=\"wrong_source\"} 0",
                "ferry_udp_relay_session_drops_total{reason=\"rate_limited\"} 0",
            ]
        );
        assert!(o.contains(
            "# HELP ferry_udp_relay_session_forwarded_total Datagrams forwarded between the two sides of relay sessions.\n# TYPE ferry_udp_relay_session_forwarded_total counter\n"
        ));
        // Before start there is nothing to offer.
        assert_eq!(SessionService::port(&Sessions::new(Limits::default())), 0);
    }

    /// The endpoints of the asker's offer when the key `[b; 32]` asks for
    /// `[b + 1; 32]`, a key behind mesh link 0 if `split`.
    fn endpoints_offered(s: &Sessions, b: u8, split: bool) -> Vec<SocketAddr> {
        let key = |b| ferry_proto::key::NodePublic::from_bytes([b; 32]);
        let r = AllocateRequest {
            asker: key(b),
            peer: key(b + 1),
            ip: "192.0.2.9".parse().unwrap(),
            request_id: 1,
            conns: [1, 2],
        };
        let offers = if split {
            let via = Via {
                link: 0,
                key: key(b + 1),
            };
            s.allocate_via(&r, via, Instant::now())
        } else {
            s.allocate(&r, Instant::now())
        };
        offers.unwrap().asker.unwrap().endpoints
    }

    /// Offers name the advertised endpoints when set, else the bound
    /// address; only specific ones make sessions usable across nodes.
    #[test]
    fn offers_name_the_advertised_endpoints_and_only_specific_ones_cross_nodes() {
        let ask = |s: &Sessions, b| endpoints_offered(s, b, false);
        let s = Sessions::new(Limits::default());
        assert!(!s.hosts_cross_node(), "not started");
        s.set_bound("0.0.0.0:3479".parse().unwrap());
        assert_eq!(ask(&s, 1), ["0.0.0.0:3479".parse().unwrap()]);
        assert!(!s.hosts_cross_node(), "unspecified");
        s.set_advertised(Vec::new());
        assert!(!s.hosts_cross_node(), "an empty list is ignored");
        let advertised: Vec<SocketAddr> = vec![
            "198.51.100.1:3479".parse().unwrap(),
            "[2001:db8::1]:3479".parse().unwrap(),
        ];
        s.set_advertised(advertised.clone());
        assert_eq!(ask(&s, 3), advertised);
        assert!(s.hosts_cross_node());
        let s = Sessions::new(Limits::default());
        s.set_bound("192.0.2.1:3479".parse().unwrap());
        assert!(s.hosts_cross_node(), "bound to a specific address");
    }

    /// A node bound to an unspecified address hosts split pairs with the
    /// default set at start (its interface addresses), named only in
    /// offers of split pairs; advertised endpoints win over it.
    #[test]
    fn split_pairs_get_the_default_endpoints_and_local_pairs_the_bound_one() {
        let ask = endpoints_offered;
        let s = Sessions::new(Limits::default());
        s.set_bound("0.0.0.0:3479".parse().unwrap());
        let default: Vec<SocketAddr> = vec!["10.0.0.7:3479".parse().unwrap()];
        s.set_cross_node_default(default.clone());
        assert!(s.hosts_cross_node());
        assert_eq!(ask(&s, 1, false), ["0.0.0.0:3479".parse().unwrap()]);
        assert_eq!(ask(&s, 3, true), default);
        let advertised: Vec<SocketAddr> = vec!["198.51.100.1:3479".parse().unwrap()];
        s.set_advertised(advertised.clone());
        assert_eq!(ask(&s, 5, true), advertised);
        assert_eq!(ask(&s, 7, false), advertised);
    }
}
