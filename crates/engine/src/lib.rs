//! Ferry's shard engine: the TCP completion driver and the pieces every
//! shard uses.
//!
//! A shard is one thread, pinned to one core, that owns its sockets, its
//! buffers and its slice of the routing table. The DERP server's shards
//! (TCP) are written against this crate's completion driver; the UDP
//! relay's shards drive their sockets themselves (`recvmmsg`/`sendmmsg`
//! under mio) and use only the shard utilities. Nothing here is
//! DERP-specific.
//!
//! The TCP completion driver:
//!
//! - [`driver`]: the completion-shaped I/O interface a shard is written
//!   against ("these bytes arrived on slot 7", "the send on slot 3 finished,
//!   here is your buffer back"), with three back ends behind it: [`uring`],
//!   where the kernel produces the completions (multishot receives into
//!   provided buffers, one `io_uring_enter` per loop turn); [`epoll`],
//!   which emulates them on top of mio; and [`sim`], whose completions a
//!   test scripts, for handlers driven with simulated time.
//!   `tests/driver.rs` holds one conformance suite that io_uring and epoll
//!   both pass.
//! - [`backend`]: choosing io_uring or epoll at start-up, with the reason.
//! - [`runtime`]: the loop that ties a driver, a doorbell and a handler
//!   together.
//!
//! Shard utilities, for TCP and UDP shards alike:
//!
//! - [`mailbox`]: bounded single-producer/single-consumer rings between every
//!   pair of shards — a byte ring for packets and a typed ring for control
//!   messages — and the [`mailbox::Doorbell`] that wakes a parked shard once
//!   per batch instead of once per packet.
//! - [`runtime::spawn_pinned`]: starting a shard thread pinned to a core.
//! - [`stat`]: single-writer counters and gauges for shard metrics, the
//!   Prometheus text writer, and the `/metrics` listener.
//! - [`limit`]: the token bucket every rate limit uses.
//!
//! [`fuzzing`] drives the `/metrics` listener's request reading for the
//! `scrape_request` fuzz target.

#![deny(unsafe_code)]

pub mod backend;
pub mod driver;
pub mod epoll;
pub mod fuzzing;
pub mod limit;
pub mod mailbox;
pub mod runtime;
pub mod sim;
pub mod stat;
pub mod uring;

pub use backend::{Backend, IoMode};
pub use driver::{Completion, Driver, RecvBuffers, Slot};
pub use epoll::EpollDriver;
pub use mailbox::{ByteRx, ByteTx, Doorbell, MsgRx, MsgTx};
pub use runtime::{run_shard, run_shard_polling, BusyPoll, Handler, Wait};
pub use uring::UringDriver;
