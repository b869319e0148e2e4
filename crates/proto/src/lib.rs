//! The DERP wire protocol, without I/O.
//!
//! `ferry-proto` turns bytes into protocol values and back. It owns no sockets,
//! reads no clocks and spawns nothing: the relay server, the client SDK and the
//! test harness feed it bytes they have read and write out the bytes it
//! produces. That keeps every rule of the protocol testable as a pure function.
//!
//! How data moves through the crate on a server connection:
//!
//! 1. [`http::parse_request`] reads the upgrade request head from the raw
//!    stream and says how many bytes it consumed; everything after that belongs
//!    to the DERP stream.
//! 2. [`handshake`] builds the `serverKey` frame, opens the client's sealed
//!    `clientInfo` and seals `serverInfo` (NaCl boxes from [`nacl`], keys from
//!    [`key`]).
//! 3. [`frame::Deframer`] splits the steady-state byte stream into frames,
//!    consulting a [`frame::FramePolicy`] on every header so oversized or
//!    forbidden frames are rejected before their payload is read and ignorable
//!    frames are skipped without being buffered. [`frame::parse_client_frame`]
//!    turns a delivered frame into a typed value.
//! 4. The `frame::put_*` builders append outgoing frames to a caller-owned
//!    `Vec<u8>`, so the hot path performs no allocation per frame.
//!
//! One server connection's DERP state is one object, [`server::ServerConn`]:
//! its frame reader turns client frames into actions, its queues (with
//! their caps) hold the server frames until the owner polls them out, and
//! its clocks say when the handshake deadline, the write timeout or the
//! next keepAlive is due. The client side mirrors it in one object:
//! [`client::Client`] writes the upgrade request, reads the 101 (or
//! nothing, in fast-start mode), answers `serverKey` with `clientInfo`,
//! opens `serverInfo` and then turns server frames into events, all
//! without I/O.
//!
//! [`proxy`] reads the PROXY protocol header a TCP proxy puts before the
//! client's bytes, and [`forwarded`] decides which client address to believe
//! from trusted proxies' `X-Forwarded-For` / `Forwarded` headers.
//!
//! [`derp_map`] reads Tailscale's DERP map JSON (regions and nodes) for
//! clients choosing and dialling a home region. [`health`] renders the
//! `/healthz` answer both relays give.
//!
//! [`udp_header`] is the 8-byte header of relay sessions and direct UDP
//! between SDK peers, and [`relay_session`] the frames, bind messages and
//! client binder of relay sessions (`docs/relay-sessions.md`; version 2's
//! frames in [`relay_session::v2`], and [`mesh_session`] the meshSession
//! frame between Ferry nodes of a region); [`peer_msg`]
//! the payloads and sealed probes two SDK peers exchange behind it.
//!
//! [`tailnet`] is a tailnet node's control channel to its coordination
//! server (Noise, upgrade, early payload, map stream framing, the JSON
//! messages).
//! [`disco`] is Tailscale's disco messages (sealed with disco keys), and
//! [`peer_relay`] the steps a Tailscale peer relay takes on a bind.
//!
//! [`stun`] is the UDP STUN binding responder's codec, [`tls_record`] follows
//! TLS record framing for the kernel-TLS hand-off, and [`fuzzing`] exposes
//! the entry points the fuzz targets and the corpus-replay test drive.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod app_name;
pub mod client;
pub mod date;
pub mod derp_map;
pub mod disco;
pub mod forwarded;
pub mod frame;
pub mod fuzzing;
pub mod godur;
pub mod handshake;
pub mod health;
pub mod http;
pub mod key;
pub mod mesh_session;
pub mod nacl;
pub mod peer_msg;
pub mod peer_relay;
pub mod proxy;
pub mod rate_config;
pub mod relay_session;
pub mod server;
pub mod stun;
pub mod tailnet;
pub mod tls13;
pub mod tls_record;
pub mod udp_header;
pub mod websocket;
pub mod wireguard;

mod hex;
mod json;
#[cfg(test)]
mod testutil;
