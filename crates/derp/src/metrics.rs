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
//! The text format is written by hand: with single-writer atomics summed at
//! scrape time there is nothing for a metrics library's registry to hold,
//! and the exposition format is a few lines.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::health::Health;

pub use ferry_engine::stat::{Counter, Gauge};
pub use ferry_proto::frame::PacketKind;
pub use limits::{AllocateRefusal, Notice};

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

/// A per-shard series: name, type, help, and how to read it.
type ShardSeries = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ShardMetrics) -> i64,
);

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
}

/// A part of the server that writes its own metrics into a scrape (with
/// [`write_counter`] and [`write_gauge`]).
pub type Source = Box<dyn Fn(&mut String) + Send + Sync>;

/// Writes one counter in the Prometheus text format.
pub fn write_counter(w: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

/// Writes one gauge in the Prometheus text format.
pub fn write_gauge(w: &mut String, name: &str, help: &str, v: i64) {
    let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
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

    /// Renders the Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let w = &mut out;
        let counter = write_counter;
        let gauge = write_gauge;

        counter(
            w,
            "derp_accepts",
            "Connections that asked for the DERP upgrade.",
            self.sum(|s| s.accepts.get()),
        );
        gauge(
            w,
            "derp_current_connections",
            "Registered DERP connections.",
            self.sum_gauge(|s| s.current_connections.get()),
        );
        gauge(
            w,
            "derp_current_home_connections",
            "Connections whose client calls this server home.",
            self.sum_gauge(|s| s.current_home_connections.get()),
        );
        gauge(
            w,
            "derp_current_dup_client_keys",
            "Keys with more than one connection.",
            self.sum_gauge(|s| s.current_dup_client_keys.get()),
        );
        gauge(
            w,
            "derp_current_dup_client_conns",
            "Connections of keys with more than one connection.",
            self.sum_gauge(|s| s.current_dup_client_conns.get()),
        );
        counter(
            w,
            "derp_total_dup_client_conns",
            "Connections registered while their key already had one.",
            self.sum(|s| s.total_dup_client_conns.get()),
        );
        gauge(
            w,
            "derp_watchers",
            "Mesh watchers.",
            self.sum_gauge(|s| s.watchers.get()),
        );
        let local = self.sum_gauge(|s| {
            s.current_connections.get() - s.current_dup_client_conns.get()
                + s.current_dup_client_keys.get()
        });
        gauge(
            w,
            "derp_clients_local",
            "Distinct keys connected here.",
            local,
        );
        let remote = self.sum_gauge(|s| s.remote_keys.get());
        gauge(
            w,
            "derp_clients_remote",
            "Distinct keys known to be connected to mesh peers and not here.",
            remote,
        );
        gauge(
            w,
            "derp_clients_total",
            "Distinct keys connected here or to mesh peers.",
            local + remote,
        );
        gauge(
            w,
            "derp_current_notideal_connections",
            "Registered connections whose client named another node as ideal.",
            self.sum_gauge(|s| s.current_notideal.get()),
        );
        counter(
            w,
            "derp_packets_received",
            "sendPacket frames received.",
            self.sum(|s| s.packets_received.get()),
        );
        counter(
            w,
            "derp_bytes_received",
            "sendPacket payload bytes received.",
            self.sum(|s| s.bytes_received.get()),
        );
        let _ = writeln!(w, "# HELP derp_packets_received_kind sendPacket frames received by kind.\n# TYPE derp_packets_received_kind counter");
        for k in PacketKind::ALL {
            let _ = writeln!(
                w,
                "derp_packets_received_kind{{kind=\"{}\"}} {}",
                k.label(),
                self.sum(|s| s.packets_received_kind[*k as usize].get())
            );
        }
        counter(
            w,
            "derp_packets_sent",
            "recvPacket frames sent.",
            self.sum(|s| s.packets_sent.get()),
        );
        counter(
            w,
            "derp_bytes_sent",
            "recvPacket payload bytes sent.",
            self.sum(|s| s.bytes_sent.get()),
        );
        for (name, help, pick) in [
            (
                "derp_packets_dropped",
                "Packets not delivered, by reason and kind.",
                true,
            ),
            (
                "derp_bytes_dropped",
                "Bytes not delivered, by reason and kind.",
                false,
            ),
        ] {
            let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} counter");
            for r in DropReason::ALL {
                for k in PacketKind::ALL {
                    let v = self.sum(|s| {
                        let table = if pick {
                            &s.packets_dropped
                        } else {
                            &s.bytes_dropped
                        };
                        table[*r as usize][*k as usize].get()
                    });
                    let _ = writeln!(
                        w,
                        "{name}{{kind=\"{}\",reason=\"{}\"}} {v}",
                        k.label(),
                        r.label()
                    );
                }
            }
        }
        counter(
            w,
            "derp_packets_forwarded_in",
            "forwardPacket frames received from mesh peers.",
            self.sum(|s| s.packets_forwarded_in.get()),
        );
        counter(
            w,
            "derp_packets_forwarded_out",
            "Packets forwarded to mesh peers.",
            self.sum(|s| s.packets_forwarded_out.get()),
        );
        counter(
            w,
            "derp_multiforwarder_created",
            "Keys announced by a second mesh peer.",
            self.sum(|s| s.multiforwarder_created.get()),
        );
        counter(
            w,
            "derp_multiforwarder_deleted",
            "Keys back to one announcing mesh peer from several.",
            self.sum(|s| s.multiforwarder_deleted.get()),
        );
        counter(
            w,
            "derp_packet_forwarder_delete_other_value",
            "peerGone from a mesh peer that had not announced the key.",
            self.sum(|s| s.forwarder_delete_other.get()),
        );
        counter(
            w,
            "derp_peer_gone_disconnected_frames",
            "peerGone(disconnected) frames sent.",
            self.sum(|s| s.peer_gone_disconnected_frames.get()),
        );
        counter(
            w,
            "derp_peer_gone_not_here_frames",
            "peerGone(not here) frames sent.",
            self.sum(|s| s.peer_gone_not_here_frames.get()),
        );
        counter(
            w,
            "derp_got_ping",
            "ping frames received.",
            self.sum(|s| s.got_ping.get()),
        );
        counter(
            w,
            "derp_sent_pong",
            "pong frames sent.",
            self.sum(|s| s.sent_pong.get()),
        );
        counter(
            w,
            "derp_home_moves_in",
            "Clients that made this server home.",
            self.sum(|s| s.home_moves_in.get()),
        );
        counter(
            w,
            "derp_home_moves_out",
            "Clients that stopped calling this server home.",
            self.sum(|s| s.home_moves_out.get()),
        );
        counter(
            w,
            "derp_sclient_write_timeouts",
            "Connections cut off for not reading.",
            self.sum(|s| s.sclient_write_timeouts.get()),
        );
        counter(
            w,
            "derp_unknown_frames",
            "Frames skipped as unknown.",
            self.sum(|s| s.unknown_frames.get()),
        );
        if let Some(fds) = ferry_sys::open_fds() {
            gauge(
                w,
                "derp_current_file_descriptors",
                "Open file descriptors.",
                fds as i64,
            );
            gauge(w, "process_open_fds", "Open file descriptors.", fds as i64);
        }
        if let Some(h) = ferry_sys::heap::heap_stats() {
            let rows = [
                (
                    "ferry_heap_in_use_bytes",
                    "Heap bytes allocated and not freed (glibc mallinfo2).",
                    h.in_use,
                ),
                (
                    "ferry_heap_free_bytes",
                    "Heap bytes freed but held by the allocator's arenas.",
                    h.free,
                ),
                (
                    "ferry_heap_arena_bytes",
                    "Bytes the allocator's arenas obtained from the system.",
                    h.arena,
                ),
                (
                    "ferry_heap_mmapped_bytes",
                    "Heap bytes in separate mappings (large allocations).",
                    h.mmapped,
                ),
            ];
            for (name, help, v) in rows {
                gauge(w, name, help, v as i64);
            }
        }
        let p = ferry_sys::process::process_stats();
        if let Some(cpu) = p.cpu_seconds {
            let _ = writeln!(w, "# HELP process_cpu_seconds_total User and system CPU time.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {cpu}");
        }
        let rows: [(&str, &str, bool, Option<u64>); 6] = [
            (
                "process_max_fds",
                "Limit on open file descriptors.",
                false,
                p.max_fds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size.",
                false,
                p.virtual_bytes,
            ),
            (
                "process_virtual_memory_max_bytes",
                "Limit on virtual memory.",
                false,
                p.virtual_max_bytes,
            ),
            (
                "process_network_receive_bytes_total",
                "Bytes received on the namespace's interfaces.",
                true,
                p.net_rx_bytes,
            ),
            (
                "process_network_transmit_bytes_total",
                "Bytes sent on the namespace's interfaces.",
                true,
                p.net_tx_bytes,
            ),
            (
                "node_boot_time_seconds",
                "When the machine booted (Unix seconds).",
                false,
                p.boot_time,
            ),
        ];
        for (name, help, is_counter, v) in rows {
            if let Some(v) = v {
                let kind = if is_counter { "counter" } else { "gauge" };
                let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
            }
        }
        let _ = writeln!(
            w,
            "# HELP process_start_time_seconds Start time (Unix seconds).\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {:.0}",
            self.started_unix
        );
        let _ = writeln!(
            w,
            "# HELP version Version of the running binary.\n# TYPE version gauge\nversion{{version=\"{}\",binary=\"ferry\"}} 1",
            env!("CARGO_PKG_VERSION")
        );

        counter(
            w,
            "ferry_tcp_accepts_total",
            "TCP connections accepted.",
            self.sum(|s| s.tcp_accepts.get()),
        );
        counter(
            w,
            "ferry_http_head_bytes_scanned_total",
            "Bytes of HTTP request heads looked at, scanning for their end and parsing them.",
            self.sum(|s| s.head_bytes_scanned.get()),
        );
        counter(
            w,
            "derp_websocket_accepts",
            "DERP-over-WebSocket upgrades accepted.",
            self.sum(|s| s.websocket_accepts.get()),
        );
        counter(
            w,
            "tls_listener_accepted_connections",
            "Connections accepted on the DERP listener (derper: its TLS listener).",
            self.sum(|s| s.tcp_accepts.get() - s.accept_rejects.get()),
        );
        counter(
            w,
            "tls_listener_rejected_connections",
            "Connections closed at once by --accept-connection-limit.",
            self.sum(|s| s.accept_rejects.get()),
        );
        counter(
            w,
            "derp_rate_limit_per_client_waited",
            "Times a client's input was held by --rate-config.",
            self.sum(|s| s.rate_limit_waits.get()),
        );
        counter(
            w,
            "ferry_fast_start_total",
            "DERP connections that used fast start.",
            self.sum(|s| s.fast_starts.get()),
        );
        gauge(
            w,
            "ferry_open_sockets",
            "Open client sockets in any phase.",
            self.sum_gauge(|s| s.open_sockets.get()),
        );
        let _ = writeln!(w, "# HELP ferry_connections_by_transport Open client sockets by transport: plain TCP, or TLS whose record layer is rustls's (the handshake, TLS 1.2, --tls-records rustls, a session kept out of the kernel), Ferry's own, or the kernel's.\n# TYPE ferry_connections_by_transport gauge");
        let tls = self.sum_gauge(|s| s.tls_sockets.get());
        let ktls = self.sum_gauge(|s| s.ktls_sockets.get());
        let records = self.sum_gauge(|s| s.records_sockets.get());
        let _ = writeln!(
            w,
            "ferry_connections_by_transport{{transport=\"rustls\"}} {}",
            tls - ktls - records
        );
        let _ = writeln!(
            w,
            "ferry_connections_by_transport{{transport=\"ferry_records\"}} {records}"
        );
        let _ = writeln!(
            w,
            "ferry_connections_by_transport{{transport=\"ktls\"}} {ktls}"
        );
        let _ = writeln!(
            w,
            "ferry_connections_by_transport{{transport=\"plain\"}} {}",
            self.sum_gauge(|s| s.open_sockets.get()) - tls
        );
        let _ = writeln!(w, "# HELP ferry_ktls_refused_total TLS sessions kept in userspace (or lost) when moving them into the kernel, by reason.\n# TYPE ferry_ktls_refused_total counter");
        for r in KtlsRefusal::ALL {
            let _ = writeln!(
                w,
                "ferry_ktls_refused_total{{reason=\"{}\"}} {}",
                r.label(),
                self.sum(|s| s.ktls_refused[*r as usize].get())
            );
        }
        let _ = writeln!(w, "# HELP ferry_handshake_failures_total Connections that failed before registering, by reason.\n# TYPE ferry_handshake_failures_total counter");
        for r in HandshakeFailure::ALL {
            let _ = writeln!(
                w,
                "ferry_handshake_failures_total{{reason=\"{}\"}} {}",
                r.label(),
                self.sum(|s| s.handshake_failures[*r as usize].get())
            );
        }
        let _ = writeln!(w, "# HELP ferry_connections_closed_total Connection ends by reason.\n# TYPE ferry_connections_closed_total counter");
        for r in CloseReason::ALL {
            let _ = writeln!(
                w,
                "ferry_connections_closed_total{{reason=\"{}\"}} {}",
                r.label(),
                self.sum(|s| s.closes[*r as usize].get())
            );
        }
        let _ = writeln!(w, "# HELP ferry_http_requests_total Plain HTTP requests by route.\n# TYPE ferry_http_requests_total counter");
        for r in Route::ALL {
            let _ = writeln!(
                w,
                "ferry_http_requests_total{{route=\"{}\"}} {}",
                r.label(),
                self.sum(|s| s.http_requests[*r as usize].get())
            );
        }
        gauge(
            w,
            "ferry_queued_bytes",
            "Bytes queued for clients or being written to them.",
            self.sum_gauge(|s| s.queued_bytes.get()),
        );
        counter(
            w,
            "ferry_backpressure_pauses_total",
            "Senders paused because a destination's queue was over its cap.",
            self.sum(|s| s.backpressure_pauses.get()),
        );
        counter(
            w,
            "ferry_backpressure_budget_expired_total",
            "Destinations that held paused senders for the backpressure budget while taking nothing from their sockets, and switched to dropping their own packets.",
            self.sum(|s| s.backpressure_expired.get()),
        );
        gauge(
            w,
            "ferry_senders_paused",
            "Senders paused right now by backpressure.",
            self.sum_gauge(|s| s.senders_paused.get()),
        );
        counter(
            w,
            "ferry_ring_stalls_total",
            "Senders paused because a cross-shard ring was full.",
            self.sum(|s| s.ring_stalls.get()),
        );

        let per_shard: [ShardSeries; 9] = [
            (
                "ferry_shard_connections",
                "gauge",
                "Registered connections per shard.",
                |s| s.current_connections.get(),
            ),
            (
                "ferry_shard_packets_received_total",
                "counter",
                "Packets read per shard.",
                |s| s.packets_received.get() as i64,
            ),
            (
                "ferry_shard_packets_sent_total",
                "counter",
                "Packets queued to clients per shard.",
                |s| s.packets_sent.get() as i64,
            ),
            (
                "ferry_shard_cross_packets_total",
                "counter",
                "Packets handed to another shard.",
                |s| s.cross_shard_out.get() as i64,
            ),
            (
                "ferry_shard_turns_total",
                "counter",
                "Event loop turns per shard.",
                |s| s.turns.get() as i64,
            ),
            (
                "ferry_shard_migrations_in_total",
                "counter",
                "Connections moved onto the shard after their handshake.",
                |s| s.migrations_in.get() as i64,
            ),
            (
                "ferry_shard_recv_buffer_bytes",
                "gauge",
                "Receive buffers the I/O back end holds (io_uring's provided buffers; 0 on epoll, where the kernel keeps received bytes).",
                |s| s.recv_buffer_bytes.get(),
            ),
            (
                "ferry_shard_recv_buffer_exhausted_total",
                "counter",
                "Receives that found every provided buffer in use and were re-armed (io_uring ENOBUFS).",
                |s| s.recv_buffer_exhausted.get(),
            ),
            (
                "ferry_shard_recv_buffer_growths_total",
                "counter",
                "Times the provided-buffer pool grew after running out.",
                |s| s.recv_buffer_growths.get(),
            ),
        ];
        for (name, ty, help, f) in per_shard {
            let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} {ty}");
            for (i, s) in self.shards.iter().enumerate() {
                let _ = writeln!(w, "{name}{{shard=\"{i}\"}} {}", f(s));
            }
        }
        let _ = writeln!(w, "# HELP ferry_shard_busy_seconds_total Time each shard spent working rather than waiting.\n# TYPE ferry_shard_busy_seconds_total counter");
        for (i, s) in self.shards.iter().enumerate() {
            let _ = writeln!(
                w,
                "ferry_shard_busy_seconds_total{{shard=\"{i}\"}} {:.6}",
                s.busy_ns.get() as f64 / 1e9
            );
        }
        let _ = writeln!(
            w,
            "# HELP ferry_io_backend The I/O back end in use and why.\n# TYPE ferry_io_backend gauge\nferry_io_backend{{backend=\"{}\",reason=\"{}\"}} 1",
            self.backend,
            self.backend_reason.replace('\\', "\\\\").replace('"', "\\\"")
        );

        let _ = writeln!(
            w,
            "# HELP stun_requests STUN datagrams by disposition.\n# TYPE stun_requests counter"
        );
        for (d, v) in [
            ("success", self.stun.success.get()),
            ("not_stun", self.stun.not_stun.get()),
            ("read_error", self.stun.read_error.get()),
            ("write_error", self.stun.write_error.get()),
        ] {
            let _ = writeln!(w, "stun_requests{{disposition=\"{d}\"}} {v}");
        }
        let _ = writeln!(w, "# HELP stun_addrfamily STUN requests by address family.\n# TYPE stun_addrfamily counter");
        let _ = writeln!(
            w,
            "stun_addrfamily{{family=\"ipv4\"}} {}",
            self.stun.ipv4.get()
        );
        let _ = writeln!(
            w,
            "stun_addrfamily{{family=\"ipv6\"}} {}",
            self.stun.ipv6.get()
        );

        if let Some(rss) = ferry_sys::rss_bytes() {
            gauge(
                w,
                "process_resident_memory_bytes",
                "Resident memory.",
                rss as i64,
            );
        }
        let _ = writeln!(w, "# HELP process_start_unix_time Start time.\n# TYPE process_start_unix_time gauge\nprocess_start_unix_time {:.0}", self.started_unix);
        let _ = writeln!(
            w,
            "# HELP uptime_sec Seconds since start.\n# TYPE uptime_sec counter\nuptime_sec {}",
            self.started.elapsed().as_secs()
        );
        self.render_limits(w);
        for source in self.sources.lock().expect("metrics sources lock").iter() {
            source(w);
        }
        out
    }
}

mod limits;
#[cfg(test)]
mod tests;
