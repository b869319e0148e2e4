//! Ferry's client SDK: a DERP client on tokio that works against Ferry and
//! against Tailscale's `derper`.
//!
//! The protocol itself (upgrade request, handshake, frames, keepalive
//! deadlines) is [`ferry_proto::client::Client`], a state machine without
//! I/O; this crate gives it sockets, TLS, a clock and a task:
//!
//! - [`DerpClient::connect`] dials `http://host:port/derp` or
//!   `https://host/derp` (server certificate checked against the system's
//!   roots, or [`TlsRoots`] of the caller's choosing), runs the HTTP
//!   upgrade, or fast start when a TLS 1.3 server shows the DERP
//!   meta-certificate, or a WebSocket upgrade ([`Options::websocket`]), and
//!   returns once the handshake is done.
//! - [`DerpClient::send`] sends to a key; [`DerpClient::recv`] returns the
//!   next [`Event`]: packets, `peerGone`, `peerPresent`, health,
//!   `restarting`, pongs, and connection changes. [`DerpClient::ping`]
//!   measures the round trip to the server.
//! - A lost connection (server closed, error, or nothing heard for
//!   [`Options::keepalive_timeout`]) is replaced by itself after an
//!   exponential backoff with jitter ([`BackoffOptions`], seeded by the
//!   caller if wanted), or at the time a `restarting` frame named. All
//!   timing uses tokio's clock, so tests can pause it.
//! - [`home`] measures the regions of a DERP map
//!   ([`ferry_proto::derp_map::DerpMap`]) and connects to the fastest.
//! - [`Endpoint`] sends datagrams to peers by key over the best path that
//!   works now (direct UDP confirmed by sealed probes, a relay session,
//!   DERP as the floor), switching when one goes silent or a better one
//!   answers ([`endpoint::paths`] decides, without I/O).
//! - [`fuzzing`] drives the path manager as a state machine for the
//!   `paths` fuzz target and the corpus replay test.
//!
//! ```no_run
//! use ferry_client::{DerpClient, Event, NodePrivate, NodePublic, Options};
//!
//! # async fn run(peer: NodePublic) -> Result<(), ferry_client::Error> {
//! let mut client =
//!     DerpClient::connect("https://derp.example.com/derp", NodePrivate::generate(), Options::default())
//!         .await?;
//! client.send(&peer, b"hello".to_vec()).await?;
//! println!("rtt {:?}", client.ping().await?);
//! loop {
//!     match client.recv().await? {
//!         Event::Packet { src, data } => println!("{} bytes from {src}", data.len()),
//!         other => println!("{other:?}"),
//!     }
//! }
//! # }
//! ```

#![forbid(unsafe_code)]

mod backoff;
mod client;
mod conn;
pub mod endpoint;
mod error;
pub mod fuzzing;
pub mod home;
mod target;
mod tls;

pub use backoff::BackoffOptions;
pub use client::{DerpClient, DerpSender, Event, Options, Stats};
pub use endpoint::{
    AddPeerError, Datagram, Datagrams, DerpServerOptions, Endpoint, EndpointError, EndpointEvent,
    EndpointOptions, EndpointStats, EventKind, Events, PathAddr, PathEvent, PathKind, PathMtu,
    PathState, PathStats, PathStatus, PeerOptions, PeerStatus, PeerTotals, Rejected, RelayStatus,
    SendError, SendReport, SessionTiming, SwitchReason, Timing, MAX_DATAGRAM, MAX_DERP_DATAGRAM,
};
pub use error::Error;
/// The DERP map [`home`] measures and connects by.
pub use ferry_proto::derp_map::{DerpMap, Node, Region};
/// Why a DERP server says a peer is gone ([`EventKind::PeerGone`],
/// [`Event::PeerGone`]).
pub use ferry_proto::frame::PeerGoneReason;
/// Keys: an endpoint's own ([`NodePrivate`]) and its peers'
/// ([`NodePublic`], also their DERP addresses).
pub use ferry_proto::key::{KeyError, NodePrivate, NodePublic};
pub use target::{Target, Verify};
pub use tls::TlsRoots;
