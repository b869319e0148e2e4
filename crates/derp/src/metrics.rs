//! Counters and their Prometheus text form.
//!
//! Each shard owns one [`ShardMetrics`] and is its only writer, so an
//! increment is a relaxed load and store on a cache line no other core
//! writes — no locked instruction, no contention. A scrape (from any
//! thread) sums the shards. Names follow `derper` where the concept is
//! shared (`derp_packets_dropped{reason,kind}` …), so dashboards and tests
//! written for derper read Ferry unchanged; Ferry's own additions are
//! prefixed `ferry_`.
//!
//! The page is written with [`ferry_engine::stat::exposition`], the text
//! writer every Ferry service shares: with single-writer atomics summed at
//! scrape time there is nothing for a metrics library's registry to hold.
//! Each family the server writes itself is declared once in `families.rs`
//! and rendered in `render.rs`.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::health::Health;

pub use ferry_engine::stat::exposition::{Exposition, Family};
use ferry_engine::stat::scrape::Pages;
pub use ferry_engine::stat::{Counter, Gauge};
pub use ferry_proto::frame::PacketKind;
pub use limits::{AllocateRefusal, MeshSessionDrop, MeshSessionSent, Notice};

macro_rules! labelled {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $label:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name { $($(#[$vdoc])* $variant),+ }
        impl $name {
            /// Every value, in label order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// Number of values.
            pub const COUNT: usize = Self::ALL.len();
            /// The Prometheus label value.
            pub fn label(self) -> &'static str {
                match self { $($name::$variant => $label),+ }
            }
        }
    };
}

labelled!(
    /// Why a packet was not delivered (derper's reasons).
    DropReason {
        /// The destination key is not connected.
        UnknownDest => "unknown_dest",
        /// A mesh-forwarded packet's destination is not connected here.
        UnknownDestOnFwd => "unknown_dest_on_fwd",
        /// The destination disconnected with the packet still queued.
        GoneDisconnected => "gone_disconnected",
        /// The oldest queued packet was dropped to make room.
        QueueHead => "queue_head",
        /// The destination's queue was full.
        QueueTail => "queue_tail",
        /// Writing to the destination failed.
        WriteError => "write_error",
        /// All connections of the key are disabled by the duplicate policy.
        DupClient => "dup_client",
    }
);

labelled!(
    /// Why a connection ended.
    CloseReason {
        /// The client closed its side.
        Eof => "eof",
        /// A socket error.
        IoError => "io_error",
        /// A frame broke the protocol (too long, mesh-only, bad length).
        FrameError => "frame_error",
        /// The client did not read for the write timeout.
        WriteTimeout => "write_timeout",
        /// The handshake failed; see `ferry_handshake_failures_total`.
        Handshake => "handshake",
        /// A plain HTTP request was answered.
        HttpDone => "http_done",
        /// A mesh peer asked for it (closePeer).
        ClosePeer => "close_peer",
        /// The server is shutting down.
        Shutdown => "shutdown",
        /// Its control queue went over its cap with frames it caused
        /// itself (answers to its requests it did not read), or, for a
        /// watcher, with presence changes it did not read.
        ControlQueueFull => "control_queue_full",
    }
);

labelled!(
    /// Why a connection failed before it was registered.
    HandshakeFailure {
        /// The TLS handshake failed.
        Tls => "tls",
        /// The HTTP request could not be parsed.
        HttpMalformed => "http_malformed",
        /// The HTTP request head was too large.
        HttpTooLarge => "http_too_large",
        /// The client did not finish in time.
        Timeout => "timeout",
        /// The client closed during the handshake.
        Eof => "eof",
        /// The first frame was not clientInfo, or had a bad length.
        BadFirstFrame => "bad_first_frame",
        /// The clientInfo box did not open.
        BoxOpen => "box_open",
        /// The clientInfo JSON was invalid.
        BadJson => "bad_json",
        /// The client key was all zeros.
        ZeroKey => "zero_key",
        /// The clientInfo's `AppName` was not a valid application name
        /// (longer than 32 bytes, or a byte outside printable ASCII).
        InvalidAppName => "invalid_app_name",
        /// The clientInfo's `AppName` is one `--disallow-app-names` refuses
        /// (mesh peers are exempt).
        DisallowedAppName => "disallowed_app_name",
        /// A trusted proxy's connection did not start with a valid PROXY
        /// header.
        ProxyHeader => "proxy_header",
        /// A peer that is not a trusted proxy sent a PROXY header.
        ProxyUntrusted => "proxy_untrusted",
        /// Admission refused the client (`ferry_admission_decisions_total`
        /// says why).
        Admission => "admission",
    }
);

labelled!(
    /// What a plain HTTP request asked for.
    Route {
        /// `/derp` upgrade.
        Derp => "derp",
        /// `/derp` without an upgrade header (426).
        DerpNoUpgrade => "derp_no_upgrade",
        /// `/derp/probe`, `/derp/latency-check`.
        Probe => "probe",
        /// `/generate_204`.
        Generate204 => "generate_204",
        /// `/`.
        Home => "home",
        /// `/robots.txt`.
        Robots => "robots",
        /// `/debug/varz` and friends.
        Debug => "debug",
        /// Port-80 redirect to HTTPS.
        Redirect => "redirect",
        /// `/healthz`.
        Health => "healthz",
        /// `/bootstrap-dns`.
        BootstrapDns => "bootstrap_dns",
        /// `/.well-known/acme-challenge/` (HTTP-01).
        AcmeChallenge => "acme_challenge",
        /// Anything else (404).
        NotFound => "not_found",
    }
);

labelled!(
    /// Why a TLS session stayed in userspace, or was lost, when moving it
    /// into the kernel: [`crate::transport::handoff::Refusal`]'s reasons plus the
    /// shard's own.
    KtlsRefusal {
        /// The TLS handshake was not finished.
        Handshaking => "handshaking",
        /// rustls held TLS output not yet written.
        UnsentTls => "unsent_tls",
        /// rustls held received data not yet read.
        PendingInput => "pending_input",
        /// The negotiated version or suite has no kernel counterpart.
        UnsupportedSuite => "unsupported_suite",
        /// The kernel has no TLS ULP or refused the version and cipher.
        Kernel => "kernel",
        /// Attaching the TLS ULP to the socket failed.
        Ulp => "ulp",
        /// The I/O back end cannot read kernel-TLS records.
        Backend => "backend",
        /// The move failed half-way; the connection was closed.
        Failed => "failed",
    }
);

/// The counters of one shard. Only that shard writes them.
#[derive(Default, Debug)]
#[repr(align(128))]
pub struct ShardMetrics {
    /// TCP connections accepted.
    pub tcp_accepts: Counter,
    /// TCP connections closed at once by `--accept-connection-limit`.
    pub accept_rejects: Counter,
    /// DERP-over-WebSocket upgrades accepted.
    pub websocket_accepts: Counter,
    /// Bytes of HTTP request heads looked at (scanned for their end and
    /// parsed): about twice the head's size however it was cut into reads.
    pub head_bytes_scanned: Counter,
    /// Times a client's input was held by its receive rate limit.
    pub rate_limit_waits: Counter,
    /// Connections that asked for the DERP upgrade.
    pub accepts: Counter,
    /// Connections that used fast start.
    pub fast_starts: Counter,
    /// Registered DERP connections on this shard.
    pub current_connections: Gauge,
    /// Of those, connections whose client sent a non-empty `Ideal-Node`.
    pub current_notideal: Gauge,
    /// Registered connections that said this is their home.
    pub current_home_connections: Gauge,
    /// Open sockets of any phase on this shard.
    pub open_sockets: Gauge,
    /// Of those, on TLS (in userspace or in the kernel).
    pub tls_sockets: Gauge,
    /// Of those, with the TLS record layer in the kernel.
    pub ktls_sockets: Gauge,
    /// Of those, on Ferry's own TLS record layer (the rest of the TLS
    /// sockets are on rustls's).
    pub records_sockets: Gauge,
    /// Moves into kernel TLS that did not happen, by reason.
    pub ktls_refused: [Counter; KtlsRefusal::COUNT],
    /// Keys with more than one connection.
    pub current_dup_client_keys: Gauge,
    /// Connections in such sets.
    pub current_dup_client_conns: Gauge,
    /// Connections registered while their key already had one.
    pub total_dup_client_conns: Counter,
    /// Connections that sent watchConns.
    pub watchers: Gauge,
    /// sendPacket frames received.
    pub packets_received: Counter,
    /// Their payload bytes.
    pub bytes_received: Counter,
    /// sendPacket frames received by kind.
    pub packets_received_kind: [Counter; PacketKind::COUNT],
    /// recvPacket frames queued to clients.
    pub packets_sent: Counter,
    /// Their payload bytes.
    pub bytes_sent: Counter,
    /// Dropped packets by reason and kind.
    pub packets_dropped: [[Counter; PacketKind::COUNT]; DropReason::COUNT],
    /// Dropped bytes by reason and kind.
    pub bytes_dropped: [[Counter; PacketKind::COUNT]; DropReason::COUNT],
    /// forwardPacket frames received from mesh peers.
    pub packets_forwarded_in: Counter,
    /// forwardPacket frames sent on (or queued for) the mesh links.
    pub packets_forwarded_out: Counter,
    /// Keys other nodes of the region announced that are not connected
    /// here.
    pub remote_keys: Gauge,
    /// Keys that got a second mesh link announcing them.
    pub multiforwarder_created: Counter,
    /// Keys back to one announcing link from several.
    pub multiforwarder_deleted: Counter,
    /// peerGone from a link that had not announced the key.
    pub forwarder_delete_other: Counter,
    /// peerGone(Disconnected) frames queued.
    pub peer_gone_disconnected_frames: Counter,
    /// peerGone(NotHere) frames queued.
    pub peer_gone_not_here_frames: Counter,
    /// ping frames received.
    pub got_ping: Counter,
    /// pong frames queued.
    pub sent_pong: Counter,
    /// notePreferred(true) after the first 5 s of a connection.
    pub home_moves_in: Counter,
    /// notePreferred(false) after the first 5 s of a connection.
    pub home_moves_out: Counter,
    /// Connections cut off because they stopped reading.
    pub sclient_write_timeouts: Counter,
    /// Frames skipped as unknown or not meant for a server.
    pub unknown_frames: Counter,
    /// Handshake failures by reason.
    pub handshake_failures: [Counter; HandshakeFailure::COUNT],
    /// Connection ends by reason.
    pub closes: [Counter; CloseReason::COUNT],
    /// Control frames other clients caused, dropped over the cap.
    pub notices_dropped: [Counter; Notice::COUNT],
    /// relayAllocate refusals by reason.
    pub allocate_refused: [Counter; AllocateRefusal::COUNT],
    /// meshSession frames dropped by reason.
    pub mesh_session_dropped: [Counter; MeshSessionDrop::COUNT],
    /// meshSession frames this shard sent (or could not), by result.
    pub mesh_session_sent: [Counter; MeshSessionSent::COUNT],
    /// HTTP requests by route.
    pub http_requests: [Counter; Route::COUNT],
    /// Packets this shard handed to another shard.
    pub cross_shard_out: Counter,
    /// Times a sender was paused because the ring to another shard was full.
    pub ring_stalls: Counter,
    /// Times a sender was paused because a destination was backed up.
    pub backpressure_pauses: Counter,
    /// Senders paused right now for that reason.
    pub senders_paused: Gauge,
    /// Destinations that held senders for the backpressure budget without
    /// taking a byte, and switched to dropping their own packets.
    pub backpressure_expired: Counter,
    /// Connections moved here from the shard that accepted them.
    pub migrations_in: Counter,
    /// Bytes waiting in connections' send queues on this shard.
    pub queued_bytes: Gauge,
    /// Bytes of receive buffers the I/O back end holds (io_uring).
    pub recv_buffer_bytes: Gauge,
    /// Receives that found every back-end buffer in use (io_uring ENOBUFS).
    pub recv_buffer_exhausted: Gauge,
    /// Times the back end's receive-buffer pool grew.
    pub recv_buffer_growths: Gauge,
    /// Loop turns.
    pub turns: Counter,
    /// Nanoseconds spent outside the wait for I/O.
    pub busy_ns: Counter,
}

impl ShardMetrics {
    /// Counts one dropped packet of `len` bytes.
    pub fn dropped(&self, reason: DropReason, kind: PacketKind, len: usize) {
        self.packets_dropped[reason as usize][kind as usize].inc();
        self.bytes_dropped[reason as usize][kind as usize].add(len as u64);
    }
}

/// Counters of the STUN responder thread.
#[derive(Default, Debug)]
pub struct StunMetrics {
    /// Answered binding requests.
    pub success: Counter,
    /// Datagrams that were not a valid Tailscale binding request.
    pub not_stun: Counter,
    /// Receive errors.
    pub read_error: Counter,
    /// Send errors.
    pub write_error: Counter,
    /// Requests from IPv4 clients.
    pub ipv4: Counter,
    /// Requests from IPv6 clients.
    pub ipv6: Counter,
}

/// Everything a scrape reads.
pub struct Metrics {
    /// One per shard, indexed by shard id.
    pub shards: Vec<ShardMetrics>,
    /// The STUN responder.
    pub stun: StunMetrics,
    /// The I/O back end in use.
    pub backend: &'static str,
    /// Why that back end was chosen.
    pub backend_reason: String,
    started: Instant,
    started_unix: f64,
    /// Set when a graceful shutdown begins (`/healthz` turns 503).
    draining: AtomicBool,
    /// Parts that keep their own counters (admission, bootstrap DNS),
    /// rendered after the relay's own.
    sources: Mutex<Vec<Source>>,
    /// App names of refused clients as the log shows them (quoted), the
    /// first [`REFUSED_NAMES_PER_REASON`] per reason, with their counts.
    refused_names: Mutex<Vec<(HandshakeFailure, String, u64)>>,
}

/// App names kept per refusal reason in
/// `ferry_refused_app_names_total` (later names are counted only in
/// `ferry_handshake_failures_total`).
pub const REFUSED_NAMES_PER_REASON: usize = 4;

/// A part of the server that writes its own metrics into a scrape (with an
/// [`Exposition`] over the page, or [`write_counter`] and
/// [`write_gauge`]).
pub type Source = Box<dyn Fn(&mut String) + Send + Sync>;

/// Writes one counter without labels.
pub fn write_counter(w: &mut String, name: &str, help: &str, v: u64) {
    Exposition::new(w).counter(name, help, v);
}

/// Writes one gauge without labels.
pub fn write_gauge(w: &mut String, name: &str, help: &str, v: i64) {
    Exposition::new(w).gauge(name, help, v);
}

impl Metrics {
    /// Metrics for `shards` shards.
    pub fn new(shards: usize, backend: &'static str, backend_reason: String) -> Arc<Self> {
        Arc::new(Metrics {
            shards: (0..shards).map(|_| ShardMetrics::default()).collect(),
            stun: StunMetrics::default(),
            backend,
            backend_reason,
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            draining: AtomicBool::new(false),
            sources: Mutex::new(Vec::new()),
            refused_names: Mutex::new(Vec::new()),
        })
    }

    /// Adds a part that renders its own metrics into every scrape.
    pub fn add_source(&self, source: Source) {
        self.sources
            .lock()
            .expect("metrics sources lock")
            .push(source);
    }

    /// Records that a graceful shutdown has begun.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// What `/healthz` reports now.
    pub fn health(&self) -> Health {
        Health {
            draining: self.draining.load(Ordering::Relaxed),
            backend: self.backend,
            uptime: self.started.elapsed(),
        }
    }

    fn sum(&self, f: impl Fn(&ShardMetrics) -> u64) -> u64 {
        self.shards.iter().map(f).sum()
    }

    fn sum_gauge(&self, f: impl Fn(&ShardMetrics) -> i64) -> i64 {
        self.shards.iter().map(f).sum()
    }

    /// Counts a client refused for `reason` that gave the app name
    /// `shown` (quoted, as the log shows it); a reason keeps only its
    /// first few names.
    pub fn note_refused_name(&self, reason: HandshakeFailure, shown: &str) {
        let mut names = self.refused_names.lock().expect("refused names lock");
        if let Some(e) = names.iter_mut().find(|e| e.0 == reason && e.1 == shown) {
            e.2 += 1;
        } else if names.iter().filter(|e| e.0 == reason).count() < REFUSED_NAMES_PER_REASON {
            names.push((reason, shown.to_owned(), 1));
        }
    }

    /// The kept names of refused clients: reason, name, count.
    pub fn refused_names(&self) -> Vec<(HandshakeFailure, String, u64)> {
        self.refused_names
            .lock()
            .expect("refused names lock")
            .clone()
    }

    /// Registered connections, and the distinct keys they belong to.
    pub fn local_counts(&self) -> (i64, i64) {
        let conns = self.sum_gauge(|s| s.current_connections.get());
        let keys = conns
            - self
                .sum_gauge(|s| s.current_dup_client_conns.get() - s.current_dup_client_keys.get());
        (conns, keys)
    }
}

/// Serves `--metrics-addr` until `stop`: `/metrics` and `/debug/varz`
/// with the page, `/healthz` with the server's health, through the
/// listener every service shares (its limits keep a slow or hostile
/// scraper from holding it).
pub(crate) fn serve(listener: TcpListener, metrics: Arc<Metrics>, stop: &AtomicBool) {
    let page = metrics.clone();
    let mut pages = Pages::metrics(move || page.render());
    pages.other = Box::new(move |path| match path {
        "/healthz" => Some(metrics.health().response()),
        "/debug/varz" => Some(ferry_proto::http::response(
            200,
            "OK",
            &[("Content-Type", "text/plain; version=0.0.4; charset=utf-8")],
            metrics.render().as_bytes(),
        )),
        _ => None,
    });
    ferry_engine::stat::scrape::serve(listener, Arc::new(pages), stop);
}

mod families;
mod limits;
mod render;
#[cfg(test)]
mod tests;
