//! Every family the DERP server writes itself, declared once, in the order
//! a scrape shows them. Names follow derper where the concept is shared
//! (dashboards and alerts written for derper read Ferry unchanged);
//! Ferry's own are prefixed `ferry_`. Parts with counters of their own
//! (admission, mesh, bootstrap DNS, limits) declare theirs beside them.

use ferry_engine::stat::exposition::Family;

pub(super) const DERP_ACCEPTS: Family = Family::counter(
    "derp_accepts",
    "Connections that asked for the DERP upgrade.",
);
pub(super) const DERP_CURRENT_CONNECTIONS: Family =
    Family::gauge("derp_current_connections", "Registered DERP connections.");
pub(super) const DERP_CURRENT_HOME_CONNECTIONS: Family = Family::gauge(
    "derp_current_home_connections",
    "Connections whose client calls this server home.",
);
pub(super) const DERP_CURRENT_DUP_CLIENT_KEYS: Family = Family::gauge(
    "derp_current_dup_client_keys",
    "Keys with more than one connection.",
);
pub(super) const DERP_CURRENT_DUP_CLIENT_CONNS: Family = Family::gauge(
    "derp_current_dup_client_conns",
    "Connections of keys with more than one connection.",
);
pub(super) const DERP_TOTAL_DUP_CLIENT_CONNS: Family = Family::counter(
    "derp_total_dup_client_conns",
    "Connections registered while their key already had one.",
);
pub(super) const DERP_WATCHERS: Family = Family::gauge("derp_watchers", "Mesh watchers.");
pub(super) const DERP_CLIENTS_LOCAL: Family =
    Family::gauge("derp_clients_local", "Distinct keys connected here.");
pub(super) const DERP_CLIENTS_REMOTE: Family = Family::gauge(
    "derp_clients_remote",
    "Distinct keys known to be connected to mesh peers and not here.",
);
pub(super) const DERP_CLIENTS_TOTAL: Family = Family::gauge(
    "derp_clients_total",
    "Distinct keys connected here or to mesh peers.",
);
pub(super) const DERP_CURRENT_NOTIDEAL_CONNECTIONS: Family = Family::gauge(
    "derp_current_notideal_connections",
    "Registered connections whose client named another node as ideal.",
);
pub(super) const DERP_PACKETS_RECEIVED: Family =
    Family::counter("derp_packets_received", "sendPacket frames received.");
pub(super) const DERP_BYTES_RECEIVED: Family =
    Family::counter("derp_bytes_received", "sendPacket payload bytes received.");
pub(super) const DERP_PACKETS_RECEIVED_KIND: Family = Family::counter(
    "derp_packets_received_kind",
    "sendPacket frames received by kind.",
)
.labels(&["kind"]);
pub(super) const DERP_PACKETS_SENT: Family =
    Family::counter("derp_packets_sent", "recvPacket frames sent.");
pub(super) const DERP_BYTES_SENT: Family =
    Family::counter("derp_bytes_sent", "recvPacket payload bytes sent.");
pub(super) const DERP_PACKETS_DROPPED: Family = Family::counter(
    "derp_packets_dropped",
    "Packets not delivered, by reason and kind.",
)
.labels(&["kind", "reason"]);
pub(super) const DERP_BYTES_DROPPED: Family = Family::counter(
    "derp_bytes_dropped",
    "Bytes not delivered, by reason and kind.",
)
.labels(&["kind", "reason"]);
pub(super) const DERP_PACKETS_FORWARDED_IN: Family = Family::counter(
    "derp_packets_forwarded_in",
    "forwardPacket frames received from mesh peers.",
);
pub(super) const DERP_PACKETS_FORWARDED_OUT: Family = Family::counter(
    "derp_packets_forwarded_out",
    "Packets forwarded to mesh peers.",
);
pub(super) const DERP_MULTIFORWARDER_CREATED: Family = Family::counter(
    "derp_multiforwarder_created",
    "Keys announced by a second mesh peer.",
);
pub(super) const DERP_MULTIFORWARDER_DELETED: Family = Family::counter(
    "derp_multiforwarder_deleted",
    "Keys back to one announcing mesh peer from several.",
);
pub(super) const DERP_PACKET_FORWARDER_DELETE_OTHER_VALUE: Family = Family::counter(
    "derp_packet_forwarder_delete_other_value",
    "peerGone from a mesh peer that had not announced the key.",
);
pub(super) const DERP_PEER_GONE_DISCONNECTED_FRAMES: Family = Family::counter(
    "derp_peer_gone_disconnected_frames",
    "peerGone(disconnected) frames sent.",
);
pub(super) const DERP_PEER_GONE_NOT_HERE_FRAMES: Family = Family::counter(
    "derp_peer_gone_not_here_frames",
    "peerGone(not here) frames sent.",
);
pub(super) const DERP_GOT_PING: Family = Family::counter("derp_got_ping", "ping frames received.");
pub(super) const DERP_SENT_PONG: Family = Family::counter("derp_sent_pong", "pong frames sent.");
pub(super) const DERP_HOME_MOVES_IN: Family =
    Family::counter("derp_home_moves_in", "Clients that made this server home.");
pub(super) const DERP_HOME_MOVES_OUT: Family = Family::counter(
    "derp_home_moves_out",
    "Clients that stopped calling this server home.",
);
pub(super) const DERP_SCLIENT_WRITE_TIMEOUTS: Family = Family::counter(
    "derp_sclient_write_timeouts",
    "Connections cut off for not reading.",
);
pub(super) const DERP_UNKNOWN_FRAMES: Family =
    Family::counter("derp_unknown_frames", "Frames skipped as unknown.");
pub(super) const DERP_CURRENT_FILE_DESCRIPTORS: Family =
    Family::gauge("derp_current_file_descriptors", "Open file descriptors.");
pub(super) const PROCESS_OPEN_FDS: Family =
    Family::gauge("process_open_fds", "Open file descriptors.");
pub(super) const FERRY_HEAP_IN_USE_BYTES: Family = Family::gauge(
    "ferry_heap_in_use_bytes",
    "Heap bytes allocated and not freed (glibc mallinfo2).",
);
pub(super) const FERRY_HEAP_FREE_BYTES: Family = Family::gauge(
    "ferry_heap_free_bytes",
    "Heap bytes freed but held by the allocator's arenas.",
);
pub(super) const FERRY_HEAP_ARENA_BYTES: Family = Family::gauge(
    "ferry_heap_arena_bytes",
    "Bytes the allocator's arenas obtained from the system.",
);
pub(super) const FERRY_HEAP_MMAPPED_BYTES: Family = Family::gauge(
    "ferry_heap_mmapped_bytes",
    "Heap bytes in separate mappings (large allocations).",
);
pub(super) const PROCESS_CPU_SECONDS_TOTAL: Family =
    Family::counter("process_cpu_seconds_total", "User and system CPU time.");
pub(super) const PROCESS_MAX_FDS: Family =
    Family::gauge("process_max_fds", "Limit on open file descriptors.");
pub(super) const PROCESS_VIRTUAL_MEMORY_BYTES: Family =
    Family::gauge("process_virtual_memory_bytes", "Virtual memory size.");
pub(super) const PROCESS_VIRTUAL_MEMORY_MAX_BYTES: Family = Family::gauge(
    "process_virtual_memory_max_bytes",
    "Limit on virtual memory.",
);
pub(super) const PROCESS_NETWORK_RECEIVE_BYTES_TOTAL: Family = Family::counter(
    "process_network_receive_bytes_total",
    "Bytes received on the namespace's interfaces.",
);
pub(super) const PROCESS_NETWORK_TRANSMIT_BYTES_TOTAL: Family = Family::counter(
    "process_network_transmit_bytes_total",
    "Bytes sent on the namespace's interfaces.",
);
pub(super) const NODE_BOOT_TIME_SECONDS: Family = Family::gauge(
    "node_boot_time_seconds",
    "When the machine booted (Unix seconds).",
);
pub(super) const PROCESS_START_TIME_SECONDS: Family =
    Family::gauge("process_start_time_seconds", "Start time (Unix seconds).");
pub(super) const VERSION: Family =
    Family::gauge("version", "Version of the running binary.").labels(&["version", "binary"]);
pub(super) const FERRY_TCP_ACCEPTS_TOTAL: Family =
    Family::counter("ferry_tcp_accepts_total", "TCP connections accepted.");
pub(super) const FERRY_HTTP_HEAD_BYTES_SCANNED_TOTAL: Family = Family::counter(
    "ferry_http_head_bytes_scanned_total",
    "Bytes of HTTP request heads looked at, scanning for their end and parsing them.",
);
pub(super) const DERP_WEBSOCKET_ACCEPTS: Family = Family::counter(
    "derp_websocket_accepts",
    "DERP-over-WebSocket upgrades accepted.",
);
pub(super) const TLS_LISTENER_ACCEPTED_CONNECTIONS: Family = Family::counter(
    "tls_listener_accepted_connections",
    "Connections accepted on the DERP listener (derper: its TLS listener).",
);
pub(super) const TLS_LISTENER_REJECTED_CONNECTIONS: Family = Family::counter(
    "tls_listener_rejected_connections",
    "Connections closed at once by --accept-connection-limit.",
);
pub(super) const DERP_RATE_LIMIT_PER_CLIENT_WAITED: Family = Family::counter(
    "derp_rate_limit_per_client_waited",
    "Times a client's input was held by --rate-config.",
);
pub(super) const FERRY_FAST_START_TOTAL: Family = Family::counter(
    "ferry_fast_start_total",
    "DERP connections that used fast start.",
);
pub(super) const FERRY_OPEN_SOCKETS: Family =
    Family::gauge("ferry_open_sockets", "Open client sockets in any phase.");
pub(super) const FERRY_CONNECTIONS_BY_TRANSPORT: Family = Family::gauge(
    "ferry_connections_by_transport",
    "Open client sockets by transport: plain TCP, or TLS whose record layer is rustls's (the handshake, TLS 1.2, --tls-records rustls, a session kept out of the kernel), Ferry's own, or the kernel's.",
)
.labels(&["transport"]);
pub(super) const FERRY_KTLS_REFUSED_TOTAL: Family = Family::counter(
    "ferry_ktls_refused_total",
    "TLS sessions kept in userspace (or lost) when moving them into the kernel, by reason.",
)
.labels(&["reason"]);
pub(super) const FERRY_HANDSHAKE_FAILURES_TOTAL: Family = Family::counter(
    "ferry_handshake_failures_total",
    "Connections that failed before registering, by reason.",
)
.labels(&["reason"]);
pub(super) const FERRY_REFUSED_APP_NAMES_TOTAL: Family = Family::counter(
    "ferry_refused_app_names_total",
    "Clients refused for their app name, by reason and name (quoted; the first four names per reason).",
)
.labels(&["reason", "app_name"]);
pub(super) const FERRY_CONNECTIONS_CLOSED_TOTAL: Family = Family::counter(
    "ferry_connections_closed_total",
    "Connection ends by reason.",
)
.labels(&["reason"]);
pub(super) const FERRY_HTTP_REQUESTS_TOTAL: Family =
    Family::counter("ferry_http_requests_total", "Plain HTTP requests by route.")
        .labels(&["route"]);
pub(super) const FERRY_QUEUED_BYTES: Family = Family::gauge(
    "ferry_queued_bytes",
    "Bytes queued for clients or being written to them.",
);
pub(super) const FERRY_BACKPRESSURE_PAUSES_TOTAL: Family = Family::counter(
    "ferry_backpressure_pauses_total",
    "Senders paused because a destination's queue was over its cap.",
);
pub(super) const FERRY_BACKPRESSURE_BUDGET_EXPIRED_TOTAL: Family = Family::counter(
    "ferry_backpressure_budget_expired_total",
    "Destinations that held paused senders for the backpressure budget while taking nothing from their sockets, and switched to dropping their own packets.",
);
pub(super) const FERRY_SENDERS_PAUSED: Family = Family::gauge(
    "ferry_senders_paused",
    "Senders paused right now by backpressure.",
);
pub(super) const FERRY_RING_STALLS_TOTAL: Family = Family::counter(
    "ferry_ring_stalls_total",
    "Senders paused because a cross-shard ring was full.",
);
pub(super) const FERRY_SHARD_CONNECTIONS: Family = Family::gauge(
    "ferry_shard_connections",
    "Registered connections per shard.",
)
.labels(&["shard"]);
pub(super) const FERRY_SHARD_PACKETS_RECEIVED_TOTAL: Family = Family::counter(
    "ferry_shard_packets_received_total",
    "Packets read per shard.",
)
.labels(&["shard"]);
pub(super) const FERRY_SHARD_PACKETS_SENT_TOTAL: Family = Family::counter(
    "ferry_shard_packets_sent_total",
    "Packets queued to clients per shard.",
)
.labels(&["shard"]);
pub(super) const FERRY_SHARD_CROSS_PACKETS_TOTAL: Family = Family::counter(
    "ferry_shard_cross_packets_total",
    "Packets handed to another shard.",
)
.labels(&["shard"]);
pub(super) const FERRY_SHARD_TURNS_TOTAL: Family =
    Family::counter("ferry_shard_turns_total", "Event loop turns per shard.").labels(&["shard"]);
pub(super) const FERRY_SHARD_MIGRATIONS_IN_TOTAL: Family = Family::counter(
    "ferry_shard_migrations_in_total",
    "Connections moved onto the shard after their handshake.",
)
.labels(&["shard"]);
pub(super) const FERRY_SHARD_RECV_BUFFER_BYTES: Family = Family::gauge(
    "ferry_shard_recv_buffer_bytes",
    "Receive buffers the I/O back end holds (io_uring's provided buffers; 0 on epoll, where the kernel keeps received bytes).",
)
.labels(&["shard"]);
pub(super) const FERRY_SHARD_RECV_BUFFER_EXHAUSTED_TOTAL: Family = Family::counter(
    "ferry_shard_recv_buffer_exhausted_total",
    "Receives that found every provided buffer in use and were re-armed (io_uring ENOBUFS).",
)
.labels(&["shard"]);
pub(super) const FERRY_SHARD_RECV_BUFFER_GROWTHS_TOTAL: Family = Family::counter(
    "ferry_shard_recv_buffer_growths_total",
    "Times the provided-buffer pool grew after running out.",
)
.labels(&["shard"]);
pub(super) const FERRY_SHARD_BUSY_SECONDS_TOTAL: Family = Family::counter(
    "ferry_shard_busy_seconds_total",
    "Time each shard spent working rather than waiting.",
)
.labels(&["shard"]);
pub(super) const FERRY_IO_BACKEND: Family =
    Family::gauge("ferry_io_backend", "The I/O back end in use and why.")
        .labels(&["backend", "reason"]);
pub(super) const STUN_REQUESTS: Family =
    Family::counter("stun_requests", "STUN datagrams by disposition.").labels(&["disposition"]);
pub(super) const STUN_ADDRFAMILY: Family =
    Family::counter("stun_addrfamily", "STUN requests by address family.").labels(&["family"]);
pub(super) const PROCESS_RESIDENT_MEMORY_BYTES: Family =
    Family::gauge("process_resident_memory_bytes", "Resident memory.");
pub(super) const PROCESS_START_UNIX_TIME: Family =
    Family::gauge("process_start_unix_time", "Start time.");
pub(super) const UPTIME_SEC: Family = Family::counter("uptime_sec", "Seconds since start.");
