//! ferry-bench: a load generator for DERP relays, and the ceiling it is
//! measured against.
//!
//! Every performance figure Ferry publishes comes from this tool, run
//! against Ferry and Tailscale's `derper` on the same machine, the same
//! cores and the same load (see `bench/` for the suite). The generator must
//! never be the bottleneck, so it is built like a relay: one mio event loop
//! per thread, many peers per loop, packets copied from pre-built frames
//! with only their sequence number and timestamp patched in, all frames of
//! a loop turn written with one syscall per connection, no allocation per
//! packet. Each report includes the generator's own CPU use so a reader can
//! check that claim for every run.
//!
//! How the pieces fit:
//!
//! - [`target`]: where the server is and how to reach it (plain or TLS;
//!   `ferry_client::ChainVerifier::accept_any` for `--insecure`).
//! - [`conn`]: one DERP client connection as a non-blocking state machine
//!   (TCP, TLS, HTTP upgrade, serverKey/clientInfo/serverInfo).
//! - [`traffic`]: the multi-threaded engine behind `throughput` and
//!   `latency`: flows between peers, [`pacing`], [`stamp`]ed packets,
//!   loss and latency accounting over a measured window ([`histogram`]).
//! - [`pool`]: a single-threaded set of handshake-only connections, behind
//!   [`idle`] and [`churn`].
//! - [`placement`]: peers put on a Ferry server's shards, for runs with a
//!   chosen share of cross-shard traffic.
//! - [`ceiling`]: the minimal forwarder, for "how close to the machine".
//! - [`report`]: the JSON schema; [`procstat`] and [`varz`] observe the
//!   server; [`runs`] ties a command line to a report.
//!
//! The crate's other binaries are the load generators of the other suites
//! (`src/bin/`, see `bench/README.md`): `udp_gen` (the UDP relay's
//! generator, sink and latency probe), `endpoint_bench` (two SDK endpoints
//! per path) and `session_pps` (relay sessions set up over DERP for
//! `udp_gen`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ceiling;
pub mod churn;
pub mod cli;
pub mod clock;
pub mod conn;
pub mod histogram;
pub mod idle;
pub mod pacing;
pub mod pairs;
pub mod placement;
pub mod pool;
pub mod procstat;
pub mod progress;
pub mod report;
pub mod runs;
pub mod stamp;
pub mod target;
pub mod traffic;
pub mod units;
pub mod varz;
