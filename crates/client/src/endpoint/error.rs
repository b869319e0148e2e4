//! What can go wrong with an [`Endpoint`]: binding it, adding a peer,
//! sending a datagram (one by one or by the batch), receiving.

use super::paths::PathKind;
#[cfg(doc)]
use super::{Endpoint, PathMtu, PeerOptions, MAX_DATAGRAM};
use crate::Error;
use std::net::SocketAddr;

/// Why [`Endpoint::bind`] failed, or why [`Endpoint::recv`] has nothing
/// more.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The UDP socket could not be bound.
    #[error("binding UDP {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A DERP server's URL or TLS setup is unusable (a server that cannot
    /// be reached is retried in the background instead).
    #[error("DERP server {name}: {source}")]
    Derp {
        /// The server's name.
        name: String,
        /// Why.
        source: Error,
    },
    /// The endpoint was closed ([`Endpoint::close`]) and everything
    /// received before was taken.
    #[error("endpoint closed")]
    Closed,
    /// [`super::EndpointOptions::home`] names no DERP server.
    #[error("home DERP server {home} does not exist: the endpoint has {relays}")]
    UnknownHome {
        /// The index asked for.
        home: usize,
        /// How many servers the endpoint has.
        relays: usize,
    },
}

/// Why [`Endpoint::add_peer`] refused a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddPeerError {
    /// [`PeerOptions::relay`] names no DERP server of the endpoint.
    #[error("DERP server {relay} does not exist: the endpoint has {relays}")]
    UnknownRelay {
        /// The index asked for.
        relay: usize,
        /// How many DERP servers the endpoint has.
        relays: usize,
    },
}

/// Why a datagram was not sent. Each is counted in
/// [`super::EndpointStats::send_dropped`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The key was never added with [`Endpoint::add_peer`] (or was
    /// removed).
    #[error("unknown peer")]
    UnknownPeer,
    /// No allowed path can carry it now: under [`PeerOptions::only`] none
    /// of that kind works, or the active path is DERP and the peer's DERP
    /// server is not connected (it is being reconnected).
    #[error("no allowed path to the peer works now")]
    NoPath,
    /// Longer than the active path carries ([`PathMtu::max`]; never for
    /// datagrams of [`MAX_DATAGRAM`] bytes or less).
    #[error("datagram of {len} bytes, but the {path:?} path carries at most {max}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The path's limit.
        max: usize,
        /// The active path's kind.
        path: PathKind,
    },
    /// The path's queue is full: the UDP socket's send buffer, or the DERP
    /// server's queue ([`super::EndpointOptions::queue`]). Only from the
    /// `try_` calls: [`Endpoint::send`] and [`Endpoint::send_batch`] wait
    /// for room instead.
    #[error("the {path:?} path's queue is full")]
    QueueFull {
        /// The active path's kind.
        path: PathKind,
    },
    /// The endpoint is closed.
    #[error("the endpoint is closed")]
    Closed,
    /// The system refused the datagram (an unreachable network, a
    /// firewall).
    #[error("sending on the {path:?} path failed: {kind}")]
    Io {
        /// The active path's kind.
        path: PathKind,
        /// The system's error.
        kind: std::io::ErrorKind,
    },
}

/// What [`Endpoint::send_batch`] or [`Endpoint::try_send_batch`] did with
/// a batch: every datagram is counted once, as sent or under the
/// [`SendError`] that [`Endpoint::send`] (or [`Endpoint::try_send`]) would
/// have returned for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendReport {
    /// Handed to the socket or queued for DERP.
    pub sent: usize,
    /// [`SendError::UnknownPeer`].
    pub unknown_peer: usize,
    /// [`SendError::NoPath`].
    pub no_path: usize,
    /// [`SendError::TooLarge`].
    pub too_large: usize,
    /// [`SendError::QueueFull`] (`try_send_batch` only).
    pub queue_full: usize,
    /// [`SendError::Closed`].
    pub closed: usize,
    /// [`SendError::Io`].
    pub io: usize,
}

impl SendReport {
    /// Datagrams not sent.
    pub fn failed(&self) -> usize {
        self.unknown_peer + self.no_path + self.too_large + self.queue_full + self.closed + self.io
    }

    /// Counts one datagram that was not sent.
    pub(super) fn count(&mut self, e: &SendError) {
        let n = match e {
            SendError::UnknownPeer => &mut self.unknown_peer,
            SendError::NoPath => &mut self.no_path,
            SendError::TooLarge { .. } => &mut self.too_large,
            SendError::QueueFull { .. } => &mut self.queue_full,
            SendError::Closed => &mut self.closed,
            SendError::Io { .. } => &mut self.io,
        };
        *n += 1;
    }
}
