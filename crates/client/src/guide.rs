//! How an [`Endpoint`](crate::Endpoint) works, one concept a page. No
//! code lives here: each page explains what the API's types do together.
//!
//! - [`paths`]: the three kinds of path, their order, and how a path is
//!   confirmed and given up.
//! - [`relay_sessions`]: UDP through a Ferry server when direct UDP does
//!   not get through.
//! - [`events`]: what a subscription sees, when, and what it is told when
//!   it falls behind.
//! - [`backpressure`]: what happens when a sender outpaces its path, or a
//!   receiver its peer.
//! - [`mtu`]: how large a datagram each path carries, and fragmentation.
//! - [`shutdown`]: closing an endpoint, and what each call does after.

pub mod paths {
    //! # Paths and their order
    //!
    //! A datagram to a peer takes one of three kinds of path
    //! ([`PathKind`]), the best that works now:
    //!
    //! 1. **Direct** UDP between the two endpoints' sockets. Each side
    //!    announces its candidate addresses (its local addresses, the
    //!    public address a DERP server's STUN service sees, addresses
    //!    given in [`EndpointOptions::advertise`]) to the peer over DERP;
    //!    both ping every candidate.
    //! 2. A **relay session** through a Ferry DERP server's UDP relay
    //!    ([`super::relay_sessions`]), when direct UDP does not get
    //!    through (two NATs that do not let it).
    //! 3. **DERP**: over the TCP (or TLS) connection to the peer's DERP
    //!    server. Always there, used from the first datagram, and the
    //!    floor the others fall back to.
    //!
    //! A UDP path counts once a sealed pong answers a ping sent on that
    //! same path; it is given up when no pong came for
    //! [`Timing::dead_after`] (1.5 s by default), and the choice moves to
    //! the next best within about 2 s of the path going silent. The
    //! datagrams sent on a path since its last pong are reported as
    //! possibly lost when it dies ([`PathEvent::lost`]).
    //!
    //! [`PeerOptions::prefer`] moves one kind first; [`PeerOptions::only`]
    //! allows one kind alone (sends fail with [`SendError::NoPath`] while
    //! it does not work). [`Endpoint::peer_status`] shows every path, its
    //! state, round trip, limits and counters, and the peer's totals by
    //! kind of path, which outlive the paths.
    //!
    //! Only probes are authenticated. On a UDP path a payload is taken as
    //! the peer's when it comes from the peer's confirmed address or relay
    //! session; over DERP the server vouches for the sender's key.
    //! Authenticate your data end to end (as WireGuard does).
    //!
    //! [`PathKind`]: crate::PathKind
    //! [`EndpointOptions::advertise`]: crate::EndpointOptions::advertise
    //! [`Timing::dead_after`]: crate::Timing::dead_after
    //! [`PathEvent::lost`]: crate::PathEvent::lost
    //! [`PeerOptions::prefer`]: crate::PeerOptions::prefer
    //! [`PeerOptions::only`]: crate::PeerOptions::only
    //! [`SendError::NoPath`]: crate::SendError::NoPath
    //! [`Endpoint::peer_status`]: crate::Endpoint::peer_status
}

pub mod relay_sessions {
    //! # Relay sessions
    //!
    //! A Ferry DERP server started with a UDP relay port offers relay
    //! sessions: a slot on its UDP socket, shared by two keys, that
    //! forwards datagrams between them. An endpoint asks for one when the
    //! server offers them and [`Options::relay_sessions`] is on for that
    //! server (the one switch, on by default, in
    //! [`DerpServerOptions::options`]). Both sides ask the same server,
    //! the home of the lower key ([`EndpointOptions::home`]: this side's
    //! own home when its key is the lower, else the peer's server), so a
    //! pair whose homes differ still makes one session; both sides then
    //! bind their end from their UDP socket, and the session becomes the
    //! peer's relay-session path, confirmed by the same pings as a direct
    //! path. The side that binds first is answered one round trip after
    //! the other side binds (the peer's ping through the session makes it
    //! ping at once).
    //!
    //! A server that does not offer them (Tailscale's `derper`, Ferry
    //! without a relay port) is still used for DERP. A peer that never
    //! takes part is asked again after [`SessionTiming::retry`] (10 s),
    //! the wait doubling up to [`SessionTiming::retry_max`].
    //!
    //! [`Options::relay_sessions`]: crate::Options::relay_sessions
    //! [`DerpServerOptions::options`]: crate::DerpServerOptions::options
    //! [`EndpointOptions::home`]: crate::EndpointOptions::home
    //! [`SessionTiming::retry`]: crate::SessionTiming::retry
    //! [`SessionTiming::retry_max`]: crate::SessionTiming::retry_max
}

pub mod events {
    //! # Events
    //!
    //! [`Endpoint::events`] is a subscription to what happens from then
    //! on: path switches ([`EventKind::Path`]), DERP servers up and down
    //! (with the error and when the next attempt is due), peers gone from
    //! their DERP server and back, and public address changes. Every
    //! [`EndpointEvent`] carries the wall-clock time it happened
    //! ([`EndpointEvent::at`]), to log or compare across processes.
    //!
    //! Each subscription holds [`EndpointOptions::event_queue`] events (256
    //! by default). One that falls further behind loses the oldest and is
    //! told so by an [`EventKind::Lagged`] event with how many it missed,
    //! before the ones it still has; other subscriptions are not affected.
    //! Subscribe before adding peers to see their first switch.
    //!
    //! [`Endpoint::events`]: crate::Endpoint::events
    //! [`EventKind::Path`]: crate::EventKind::Path
    //! [`EventKind::Lagged`]: crate::EventKind::Lagged
    //! [`EndpointEvent`]: crate::EndpointEvent
    //! [`EndpointEvent::at`]: crate::EndpointEvent::at
    //! [`EndpointOptions::event_queue`]: crate::EndpointOptions::event_queue
}

pub mod backpressure {
    //! # Backpressure
    //!
    //! **Sending.** [`Endpoint::send`] waits while the active path's queue
    //! is full (the UDP socket's send buffer, or the DERP server's queue
    //! of [`EndpointOptions::queue`] datagrams), so a sender that outpaces
    //! its path is slowed to the path's pace. [`Endpoint::try_send`] never
    //! waits: a full queue is [`SendError::QueueFull`] and nothing is
    //! sent; try again later. [`Endpoint::send_batch`] and
    //! [`Endpoint::try_send_batch`] do the same for a batch, and report
    //! per reason what they did not send ([`SendReport`]). Every other
    //! failure ([`SendError::UnknownPeer`], [`SendError::NoPath`],
    //! [`SendError::TooLarge`], [`SendError::Closed`]) returns at once.
    //!
    //! **Receiving.** The endpoint holds up to [`EndpointOptions::queue`]
    //! received datagrams (and [`EndpointOptions::queue_bytes`] bytes of
    //! them) for [`Endpoint::recv`]; what arrives while that is full is
    //! dropped and counted ([`EndpointStats::recv_dropped`]). Probes go on
    //! regardless, so paths stay up while the application lags.
    //!
    //! [`Endpoint::send`]: crate::Endpoint::send
    //! [`Endpoint::try_send`]: crate::Endpoint::try_send
    //! [`Endpoint::send_batch`]: crate::Endpoint::send_batch
    //! [`Endpoint::try_send_batch`]: crate::Endpoint::try_send_batch
    //! [`Endpoint::recv`]: crate::Endpoint::recv
    //! [`EndpointOptions::queue`]: crate::EndpointOptions::queue
    //! [`EndpointOptions::queue_bytes`]: crate::EndpointOptions::queue_bytes
    //! [`EndpointStats::recv_dropped`]: crate::EndpointStats::recv_dropped
    //! [`SendReport`]: crate::SendReport
    //! [`SendError::QueueFull`]: crate::SendError::QueueFull
    //! [`SendError::UnknownPeer`]: crate::SendError::UnknownPeer
    //! [`SendError::NoPath`]: crate::SendError::NoPath
    //! [`SendError::TooLarge`]: crate::SendError::TooLarge
    //! [`SendError::Closed`]: crate::SendError::Closed
}

pub mod mtu {
    //! # MTU: how large a datagram each path carries
    //!
    //! Every datagram travels with an 8-byte header. What fits, in the
    //! application's bytes ([`PathMtu`], [`PathAddr::mtu`],
    //! [`Endpoint::path_mtu`]):
    //!
    //! | Path | Longest datagram | Longest without IP fragmentation (1,500-byte network) |
    //! |---|---|---|
    //! | direct, IPv4 | 65,499 | 1,464 |
    //! | direct, IPv6 | 65,519 | 1,444 |
    //! | relay session | 65,499 | 1,444 |
    //! | DERP | 65,528 | 65,528 (TCP carries it) |
    //!
    //! A datagram up to [`MAX_DATAGRAM`] (65,499) bytes is never refused
    //! as too large, whatever the path. Longer than what the network
    //! carries in one packet, a UDP datagram leaves as IP fragments, which
    //! arrive whole or not at all and which some networks drop: keep
    //! datagrams under the unfragmented limit where loss matters (a
    //! tunnel's inner MTU, as `ferry link` advises). One longer than the
    //! active path takes is refused with [`SendError::TooLarge`], which
    //! carries the path's limit, before anything is sent or counted.
    //!
    //! [`PathMtu`]: crate::PathMtu
    //! [`PathAddr::mtu`]: crate::PathAddr::mtu
    //! [`Endpoint::path_mtu`]: crate::Endpoint::path_mtu
    //! [`MAX_DATAGRAM`]: crate::MAX_DATAGRAM
    //! [`SendError::TooLarge`]: crate::SendError::TooLarge
}

pub mod shutdown {
    //! # Shutdown
    //!
    //! [`Endpoint::close`] stops the endpoint's tasks (no more probes, no
    //! more datagrams read), closes its DERP connections and returns once
    //! they have stopped. After it, every send fails with
    //! [`SendError::Closed`]; [`Endpoint::recv`] returns what was received
    //! before and then [`EndpointError::Closed`]; event subscriptions end
    //! (`None`) once they have taken the events from before. Dropping the
    //! endpoint stops its tasks too, without waiting; the UDP socket is
    //! released when the endpoint is dropped. [`Endpoint::remove_peer`]
    //! forgets one peer: its datagrams are no longer accepted.
    //!
    //! [`Endpoint::close`]: crate::Endpoint::close
    //! [`Endpoint::recv`]: crate::Endpoint::recv
    //! [`Endpoint::remove_peer`]: crate::Endpoint::remove_peer
    //! [`SendError::Closed`]: crate::SendError::Closed
    //! [`EndpointError::Closed`]: crate::EndpointError::Closed
}
