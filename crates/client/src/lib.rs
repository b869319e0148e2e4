//! Ferry's client SDK: datagrams between peers by key over the best path
//! that works ([`Endpoint`]), and a DERP client that works against Ferry
//! and against Tailscale's `derper` ([`DerpClient`]), on tokio.
//!
//! # Quick start
//!
//! Two endpoints exchange a datagram through a DERP server (here a Ferry
//! server started in this process on loopback, as the tests do; yours is
//! `https://your.derp.host/derp`):
//!
//! ```
//! use ferry_client::{DerpServerOptions, Endpoint, EndpointOptions, NodePrivate, PeerOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = ferry_testkit_servers::TestServer::start(ferry_testkit_servers::Kind::Ferry, None);
//! # let url = server.url();
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! // Each side: its own key, its DERP server, a UDP socket (here on
//! // loopback, as this example stays on this machine).
//! let options = |url: &str| {
//!     let mut o = EndpointOptions::new(
//!         NodePrivate::generate(),
//!         vec![DerpServerOptions::new("my-derp", url)],
//!     );
//!     o.bind = "127.0.0.1:0".parse().unwrap();
//!     o
//! };
//! let alice = Endpoint::bind(options(&url)).await?;
//! let bob = Endpoint::bind(options(&url)).await?;
//!
//! // Each names the other by its public key (exchanged out of band).
//! alice.add_peer(bob.public_key(), PeerOptions::new())?;
//! bob.add_peer(alice.public_key(), PeerOptions::new())?;
//!
//! // DERP carries the first datagrams; direct UDP or a relay session
//! // takes over once confirmed.
//! alice.send(&bob.public_key(), b"hello").await?;
//! let got = bob.recv().await?;
//! assert_eq!((got.peer, &got.data[..]), (alice.public_key(), &b"hello"[..]));
//! println!("{} bytes from {} over {}", got.data.len(), got.peer, got.path);
//!
//! alice.close().await;
//! bob.close().await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```
//!
//! To depend on it (it is on no registry yet: by path, or by git from
//! where you got Ferry), with the tokio features a program needs:
//!
//! ```toml
//! [dependencies]
//! ferry-client = { path = "../ferry/crates/client" }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! Everything the API takes or returns is exported here: keys
//! ([`NodePrivate`], [`NodePublic`]), limits ([`MAX_DATAGRAM`],
//! [`PathMtu`]), errors. The [`guide`] explains the concepts a page each:
//! [paths](guide::paths), [relay sessions](guide::relay_sessions),
//! [events](guide::events), [backpressure](guide::backpressure),
//! [MTU](guide::mtu), [shutdown](guide::shutdown). Two programs to copy
//! are in `examples/`: `chat` (a chat over datagrams) and `forward` (a UDP
//! port forwarder).
//!
//! # The DERP client
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
pub mod guide;
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
/// A client's application name, as a DERP server reports it to watchers
/// ([`Event::PeerPresent`]).
pub use ferry_proto::app_name::AppName;
/// The DERP map [`home`] measures and connects by.
pub use ferry_proto::derp_map::{DerpMap, Node, Region};
/// Why a DERP server says a peer is gone ([`EventKind::PeerGone`],
/// [`Event::PeerGone`]).
pub use ferry_proto::frame::PeerGoneReason;
/// Keys: an endpoint's own ([`NodePrivate`]) and its peers'
/// ([`NodePublic`], also their DERP addresses).
pub use ferry_proto::key::{KeyError, NodePrivate, NodePublic};
pub use target::{Target, Verify};
pub use tls::{https_client_config, ChainVerifier, TlsRoots};
