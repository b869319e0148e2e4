//! The peer-relay table shared by the control half (a tailnet node's
//! thread, which allocates) and whatever serves the UDP port (which binds
//! and forwards): one [`PeerRelayTable`] behind a lock, and the addresses
//! the relay offers in its answers.

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::Instant;

use ferry_proto::disco::AllocateRequest;
use ferry_proto::key::{DiscoPrivate, DiscoPublic, NodePublic};

use super::{Allocated, Drop, Limits, PeerRelayTable, Refusal, StunProbe};
use crate::session::service::family;
use ferry_engine::stat::exposition::Kind;

/// The relay's peer-relay endpoints, shared.
pub struct PeerRelays {
    table: Mutex<PeerRelayTable>,
    server: DiscoPublic,
    /// Where clients reach the relay's port (configured, discovered).
    addrs: Mutex<Vec<SocketAddr>>,
    bound: OnceLock<SocketAddr>,
    stun: StunProbe,
}

impl PeerRelays {
    /// An empty table serving with the disco key `server` (fresh per
    /// process) and no address yet (allocations are refused as not ready
    /// until [`PeerRelays::set_addrs`]).
    pub fn new(server: DiscoPrivate, limits: Limits) -> PeerRelays {
        PeerRelays {
            server: server.public(),
            table: Mutex::new(PeerRelayTable::new(server, limits, Instant::now())),
            addrs: Mutex::new(Vec::new()),
            bound: OnceLock::new(),
            stun: StunProbe::default(),
        }
    }

    /// The relay's disco key for binds (`ServerDisco`).
    pub fn server_disco(&self) -> DiscoPublic {
        self.server
    }

    /// Records the address the port's socket is bound to (once, at start).
    pub fn set_bound(&self, addr: SocketAddr) {
        let _ = self.bound.set(addr);
    }

    /// The address the port's socket is bound to (`None` before start).
    pub fn bound(&self) -> Option<SocketAddr> {
        self.bound.get().copied()
    }

    /// Sets the addresses offered in answers from now on.
    pub fn set_addrs(&self, addrs: Vec<SocketAddr>) {
        *self.addrs.lock().unwrap_or_else(|e| e.into_inner()) = addrs;
    }

    /// The addresses offered now: those set, and the one STUN
    /// discovered (when on, see [`PeerRelays::stun`]) first if new.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        let mut addrs = self.addrs.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(a) = self.stun.learned() {
            if !addrs.contains(&a) {
                addrs.insert(0, a);
            }
        }
        addrs
    }

    /// Address discovery for the port (off unless enabled).
    pub fn stun(&self) -> &StunProbe {
        &self.stun
    }

    /// The table, locked.
    pub fn lock(&self) -> MutexGuard<'_, PeerRelayTable> {
        // A holder that panicked left a table whose every step is
        // complete: keep using it.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers an allocation request from `requester` (a node the caller
    /// has checked holds the grant, whose disco key is in the request's
    /// pair): [`PeerRelayTable::allocate`] with the current addresses.
    pub fn allocate(
        &self,
        requester: &NodePublic,
        request: &AllocateRequest,
        now: Instant,
    ) -> Result<Allocated, Refusal> {
        let addrs = self.addrs();
        self.lock().allocate(requester, request, &addrs, now)
    }

    /// Frees the endpoints of requesters `keep` refuses (a withdrawn
    /// grant); returns how many.
    pub fn revoke(&self, keep: impl FnMut(&NodePublic) -> bool) -> usize {
        self.lock().revoke(keep)
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        *self.lock().limits()
    }

    /// Appends the endpoints' metrics in Prometheus text form
    /// (`ferry_udp_peer_relay*`).
    pub fn render(&self, o: &mut String) {
        let (states, c) = {
            let t = self.lock();
            (t.states(), *t.counters())
        };
        family(
            o,
            "ferry_udp_peer_relay_endpoints",
            Kind::Gauge,
            "Peer-relay endpoints, by state (connecting: not bound on both sides; open).",
            "state",
            &[
                ("connecting", states.connecting as u64),
                ("open", states.open as u64),
            ],
        );
        family(
            o,
            "ferry_udp_peer_relay_events_total",
            Kind::Counter,
            "Peer-relay allocations (new, existing, refused), challenges, binds and frees.",
            "event",
            &[
                ("allocated", c.allocated),
                ("existing", c.existing),
                ("refused", c.refused),
                ("challenged", c.challenges),
                ("bound", c.binds),
                ("freed_bind_timeout", c.freed_bind_timeout),
                ("freed_idle", c.freed_idle),
                ("freed_revoked", c.freed_revoked),
            ],
        );
        family(
            o,
            "ferry_udp_peer_relay_forwarded_total",
            Kind::Counter,
            "Datagrams forwarded between the two sides of peer-relay endpoints.",
            "",
            &[("", c.forwarded_packets)],
        );
        family(
            o,
            "ferry_udp_peer_relay_forwarded_bytes_total",
            Kind::Counter,
            "Bytes forwarded between the two sides of peer-relay endpoints.",
            "",
            &[("", c.forwarded_bytes)],
        );
        let drops = Drop::ALL.map(|why| (why.label(), c.dropped(why)));
        family(
            o,
            "ferry_udp_peer_relay_drops_total",
            Kind::Counter,
            "Datagrams on the peer-relay port dropped, by reason.",
            "reason",
            &drops,
        );
    }

    /// Timers: rotates the cookie secret when due and frees expired
    /// endpoints. A table busy now is left for the next tick.
    pub fn tick(&self, now: Instant) {
        let mut t = match self.table.try_lock() {
            Ok(t) => t,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        t.rotate(now);
        t.expire(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn allocations_wait_for_an_address() {
        let relays = PeerRelays::new(DiscoPrivate::generate(), Limits::default());
        let req = AllocateRequest {
            client_disco: [
                DiscoPrivate::generate().public(),
                DiscoPrivate::generate().public(),
            ],
            generation: 3,
        };
        let node = NodePublic([1; 32]);
        let now = Instant::now();
        assert_eq!(relays.allocate(&node, &req, now), Err(Refusal::NotReady));
        let addr: SocketAddr = "192.0.2.10:40000".parse().unwrap();
        relays.set_addrs(vec![addr]);
        let a = relays.allocate(&node, &req, now).unwrap();
        assert_eq!(a.response.generation, 3);
        assert_eq!(a.response.endpoint.server_disco, relays.server_disco());
        assert_eq!(a.response.endpoint.endpoints, vec![addr]);
        // An address STUN discovered is offered too, first.
        let public: SocketAddr = "203.0.113.9:61000".parse().unwrap();
        relays.stun().enable();
        relays
            .stun()
            .probe("192.0.2.1:3478".parse().unwrap(), [5; 12], now);
        let mut answer = [0u8; ferry_proto::stun::MAX_RESPONSE_LEN];
        let n = ferry_proto::stun::write_binding_response(&[5; 12], public, &mut answer);
        let learned = relays
            .stun()
            .answer("192.0.2.1:3478".parse().unwrap(), &answer[..n], now);
        assert_eq!(learned, Some(public));
        assert_eq!(relays.addrs(), vec![public, addr]);
        relays.tick(now + Duration::from_secs(30));
        assert!(relays.lock().is_empty(), "unbound for 30 s: freed");
        let mut text = String::new();
        relays.render(&mut text);
        for line in [
            "ferry_udp_peer_relay_endpoints{state=\"connecting\"} 0",
            "ferry_udp_peer_relay_events_total{event=\"allocated\"} 1",
            "ferry_udp_peer_relay_events_total{event=\"refused\"} 1",
            "ferry_udp_peer_relay_events_total{event=\"freed_bind_timeout\"} 1",
            "ferry_udp_peer_relay_drops_total{reason=\"rate_limited\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in:\n{text}");
        }
    }
}
