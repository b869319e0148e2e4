//! What happened to an endpoint, as its subscribers see it: each
//! [`EndpointEvent`] stamped with the wall-clock time, delivered to every
//! [`Events`] subscription. A subscription holds
//! [`super::EndpointOptions::event_queue`] events (256 by default); one
//! that falls further behind loses the oldest and is told how many, in
//! order, by an [`EventKind::Lagged`] event before the ones it still has.

use super::paths::PathEvent;
use ferry_proto::frame::PeerGoneReason;
use ferry_proto::key::NodePublic;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use tokio::sync::broadcast;

/// Something that happened to an endpoint, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointEvent {
    /// When it happened, by the wall clock (a path switch: as its
    /// [`PathEvent::at`]).
    pub at: SystemTime,
    /// What happened.
    pub kind: EventKind,
}

/// What happened, in an [`EndpointEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// A peer's active path changed.
    Path(PathEvent),
    /// A DERP connection is up (the first one, or again).
    RelayUp {
        /// Index into [`super::EndpointOptions::relays`].
        relay: usize,
        /// The relay-session port it offers.
        relay_port: Option<u16>,
    },
    /// A DERP connection was lost, or an attempt failed; the next one is
    /// due in `retry_in`.
    RelayDown {
        /// Index into [`super::EndpointOptions::relays`].
        relay: usize,
        /// Why.
        error: String,
        /// Delay before the next attempt.
        retry_in: Duration,
        /// Whether the connection had been up (lost) or not (an attempt
        /// failed).
        was_up: bool,
    },
    /// A peer's DERP server says the peer is not connected to it. Servers
    /// (Ferry and derper alike) send this when a peer leaves only to the
    /// clients that received packets from it; a peer this endpoint only
    /// sent to can leave unannounced.
    PeerGone {
        /// The peer.
        peer: NodePublic,
        /// As the server said.
        reason: PeerGoneReason,
    },
    /// A peer reported gone is back: its server said so (`peerPresent`),
    /// or an authenticated message from it arrived.
    PeerPresent {
        /// The peer.
        peer: NodePublic,
    },
    /// A DERP packet or probe came from `key`, which is not a peer (a
    /// peer that runs with another key than the one added here, or one
    /// not added yet). Sent once per key, for the first 64 keys; every
    /// such message is counted in [`super::Rejected`].
    UnknownSender {
        /// The sender's key, as its DERP server vouches for it.
        key: NodePublic,
    },
    /// This endpoint's address as a DERP server's STUN server sees it
    /// changed.
    PublicAddr {
        /// Index into [`super::EndpointOptions::relays`].
        relay: usize,
        /// The address.
        addr: SocketAddr,
    },
    /// This subscription fell behind by more than its queue holds: the
    /// `missed` oldest events were dropped for it (other subscriptions
    /// got them). The events after this one are in order again.
    Lagged {
        /// How many it missed.
        missed: u64,
    },
}

/// A subscription to an endpoint's events ([`super::Endpoint::events`]):
/// every event from the moment it was made, in order.
#[derive(Debug)]
pub struct Events {
    rx: broadcast::Receiver<EndpointEvent>,
}

impl Events {
    /// The next event, waiting for one; `None` once the endpoint is closed
    /// (or dropped) and every event before that was taken. A subscription
    /// that lagged gets [`EventKind::Lagged`] first. Cancel-safe.
    pub async fn recv(&mut self) -> Option<EndpointEvent> {
        match self.rx.recv().await {
            Ok(e) => Some(e),
            Err(broadcast::error::RecvError::Lagged(missed)) => Some(lagged(missed)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event if one is waiting, without waiting.
    pub fn try_recv(&mut self) -> Option<EndpointEvent> {
        match self.rx.try_recv() {
            Ok(e) => Some(e),
            Err(broadcast::error::TryRecvError::Lagged(missed)) => Some(lagged(missed)),
            Err(_) => None,
        }
    }
}

fn lagged(missed: u64) -> EndpointEvent {
    tracing::debug!(missed, "an event subscriber lagged");
    EndpointEvent {
        at: SystemTime::now(),
        kind: EventKind::Lagged { missed },
    }
}

/// The sending side: a broadcast channel of `capacity` events per
/// subscriber, dropped when the endpoint closes (so subscribers end).
#[derive(Debug)]
pub(super) struct Publisher {
    tx: Mutex<Option<broadcast::Sender<EndpointEvent>>>,
}

impl Publisher {
    pub(super) fn new(capacity: usize) -> Publisher {
        Publisher {
            tx: Mutex::new(Some(broadcast::channel(capacity.max(1)).0)),
        }
    }

    /// A new subscription (one that ends at once when closed).
    pub(super) fn subscribe(&self) -> Events {
        let rx = match &*self.tx.lock().expect("not poisoned") {
            Some(tx) => tx.subscribe(),
            None => broadcast::channel(1).1,
        };
        Events { rx }
    }

    /// Sends `kind` stamped `at` to every subscriber (none is fine).
    pub(super) fn publish_at(&self, at: SystemTime, kind: EventKind) {
        if let Some(tx) = &*self.tx.lock().expect("not poisoned") {
            let _ = tx.send(EndpointEvent { at, kind });
        }
    }

    /// Sends `kind`, stamped now.
    pub(super) fn publish(&self, kind: EventKind) {
        self.publish_at(SystemTime::now(), kind);
    }

    /// No more events: subscriptions end once they have taken the rest.
    pub(super) fn close(&self) {
        self.tx.lock().expect("not poisoned").take();
    }
}
