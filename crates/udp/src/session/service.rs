//! The session table shared by the relay's shards and the DERP server that
//! allocates sessions: one [`SessionTable`] behind a lock, taken once per
//! received batch by a shard (not per datagram) and once per allocation by
//! a DERP shard. Sessions see little allocation traffic and a batch holds
//! the lock for the few hundred nanoseconds its lookups take, so shards
//! rarely meet on it; what the lock buys is that a bind on one shard is
//! seen by the next datagram on any other (the kernel spreads a session's
//! two clients over shards by their addresses), with no replication lag.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use ferry_proto::key::NodePublic;
use ferry_proto::relay_session::{RefuseReason, SessionOffer};

use super::{Drop, Limits, SessionTable};

/// The relay's sessions, shared by every shard and the DERP side.
pub struct Sessions {
    table: Mutex<SessionTable>,
    limits: Limits,
    bound: OnceLock<SocketAddr>,
}

impl Sessions {
    /// An empty table with these limits.
    pub fn new(limits: Limits) -> Sessions {
        Sessions {
            table: Mutex::new(SessionTable::new(limits, Instant::now())),
            limits,
            bound: OnceLock::new(),
        }
    }

    /// The table, locked.
    pub fn lock(&self) -> MutexGuard<'_, SessionTable> {
        // A shard that panicked holding the lock left a table whose
        // every step is complete: keep using it.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the address the session socket is bound to (once, at start).
    pub fn set_bound(&self, addr: SocketAddr) {
        let _ = self.bound.set(addr);
    }

    /// The address the session socket is bound to (`None` before start).
    pub fn bound(&self) -> Option<SocketAddr> {
        self.bound.get().copied()
    }

    /// The session socket's port (0 before start).
    pub fn port(&self) -> u16 {
        self.bound().map_or(0, |a| a.port())
    }

    /// Finds or makes the session of `asker` and `peer` and returns the
    /// asker's offer (with `request_id`) and the peer's (request id 0).
    /// The endpoint is the session socket's address; an unspecified one
    /// (`0.0.0.0`, `::`) means the address the client reached the DERP
    /// server at (`docs/relay-sessions.md` §2).
    pub fn allocate(
        &self,
        asker: &NodePublic,
        peer: &NodePublic,
        ip: IpAddr,
        request_id: u32,
    ) -> Result<[SessionOffer; 2], RefuseReason> {
        let Some(endpoint) = self.bound() else {
            return Err(RefuseReason::Off);
        };
        let a = self.lock().allocate(asker, peer, ip, Instant::now())?;
        let offer = |request_id, slot: u8, peer: &NodePublic| SessionOffer {
            request_id,
            vni: a.vni,
            peer: *peer,
            slot,
            token: a.tokens[usize::from(slot)],
            endpoints: vec![endpoint],
            bind_lifetime: self.limits.bind_lifetime,
            idle_lifetime: self.limits.idle_lifetime,
        };
        Ok([offer(request_id, a.slot, peer), offer(0, 1 - a.slot, asker)])
    }

    /// Timers: rotates the cookie secret when due and frees expired
    /// sessions.
    pub fn tick(&self, now: Instant) {
        let mut t = self.lock();
        t.rotate(now);
        t.expire(now);
    }

    /// Appends the sessions' metrics in Prometheus text form
    /// (`ferry_udp_relay_session*`).
    pub fn render(&self, o: &mut String) {
        let (states, c) = {
            let t = self.lock();
            (t.states(), *t.counters())
        };
        let family = |o: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            o,
            "ferry_udp_relay_sessions",
            "gauge",
            "Relay sessions, by state (allocated: no side bound; half_bound; bound: forwarding).",
        );
        for (state, n) in [
            ("allocated", states.allocated),
            ("half_bound", states.half_bound),
            ("bound", states.bound),
        ] {
            let _ = writeln!(o, "ferry_udp_relay_sessions{{state=\"{state}\"}} {n}");
        }
        family(
            o,
            "ferry_udp_relay_session_events_total",
            "counter",
            "Relay session allocations, refusals, binds and frees.",
        );
        for (event, n) in [
            ("allocated", c.allocated),
            ("reused", c.reused),
            ("refused_limit", c.refused_limit),
            ("challenged", c.challenges),
            ("bound", c.binds),
            ("freed_bind_timeout", c.freed_bind_timeout),
            ("freed_idle", c.freed_idle),
        ] {
            let _ = writeln!(
                o,
                "ferry_udp_relay_session_events_total{{event=\"{event}\"}} {n}"
            );
        }
        family(
            o,
            "ferry_udp_relay_session_forwarded_total",
            "counter",
            "Datagrams forwarded between the two sides of relay sessions.",
        );
        let _ = writeln!(
            o,
            "ferry_udp_relay_session_forwarded_total {}",
            c.forwarded_packets
        );
        family(
            o,
            "ferry_udp_relay_session_forwarded_bytes_total",
            "counter",
            "Bytes forwarded between the two sides of relay sessions.",
        );
        let _ = writeln!(
            o,
            "ferry_udp_relay_session_forwarded_bytes_total {}",
            c.forwarded_bytes
        );
        family(
            o,
            "ferry_udp_relay_session_drops_total",
            "counter",
            "Datagrams on the relay-session port dropped, by reason.",
        );
        for why in Drop::ALL {
            let _ = writeln!(
                o,
                "ferry_udp_relay_session_drops_total{{reason=\"{}\"}} {}",
                why.label(),
                c.dropped(why)
            );
        }
    }
}

/// The DERP server's view of the table: the inherent methods above.
impl ferry_proto::relay_session::SessionService for Sessions {
    fn port(&self) -> u16 {
        Sessions::port(self)
    }

    fn allocate(
        &self,
        asker: &NodePublic,
        peer: &NodePublic,
        ip: IpAddr,
        request_id: u32,
    ) -> Result<[SessionOffer; 2], RefuseReason> {
        Sessions::allocate(self, asker, peer, ip, request_id)
    }
}
