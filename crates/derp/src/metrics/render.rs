//! The DERP server's page: its counters summed over the shards, the
//! process's own figures, then the parts that render themselves.

use ferry_engine::stat::exposition::{Exposition, Family, Fixed};

use super::families::*;
use super::{
    CloseReason, DropReason, HandshakeFailure, KtlsRefusal, Metrics, PacketKind, Route,
    ShardMetrics,
};

/// A family summed over the shards and how to read one shard's value.
type Summed = (&'static Family<'static>, fn(&ShardMetrics) -> u64);
/// A gauge summed over the shards.
type SummedGauge = (&'static Family<'static>, fn(&ShardMetrics) -> i64);

impl Metrics {
    /// Renders the Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let mut w = Exposition::new(&mut out);
        self.render_clients(&mut w);
        self.render_packets(&mut w);
        self.render_process(&mut w);
        self.render_connections(&mut w);
        self.render_shards(&mut w);
        self.render_stun(&mut w);
        self.render_limits(&mut w);
        for source in self.sources.lock().expect("metrics sources lock").iter() {
            source(&mut out);
        }
        out
    }

    fn summed(&self, w: &mut Exposition<'_>, rows: &[Summed]) {
        for (family, read) in rows {
            w.single(family, self.sum(read));
        }
    }

    fn summed_gauges(&self, w: &mut Exposition<'_>, rows: &[SummedGauge]) {
        for (family, read) in rows {
            w.single(family, self.sum_gauge(read));
        }
    }

    fn render_clients(&self, w: &mut Exposition<'_>) {
        w.single(&DERP_ACCEPTS, self.sum(|s| s.accepts.get()));
        self.summed_gauges(
            w,
            &[
                (&DERP_CURRENT_CONNECTIONS, |s| s.current_connections.get()),
                (&DERP_CURRENT_HOME_CONNECTIONS, |s| {
                    s.current_home_connections.get()
                }),
                (&DERP_CURRENT_DUP_CLIENT_KEYS, |s| {
                    s.current_dup_client_keys.get()
                }),
                (&DERP_CURRENT_DUP_CLIENT_CONNS, |s| {
                    s.current_dup_client_conns.get()
                }),
            ],
        );
        w.single(
            &DERP_TOTAL_DUP_CLIENT_CONNS,
            self.sum(|s| s.total_dup_client_conns.get()),
        );
        w.single(&DERP_WATCHERS, self.sum_gauge(|s| s.watchers.get()));
        let (_, local) = self.local_counts();
        let remote = self.sum_gauge(|s| s.remote_keys.get());
        w.single(&DERP_CLIENTS_LOCAL, local);
        w.single(&DERP_CLIENTS_REMOTE, remote);
        w.single(&DERP_CLIENTS_TOTAL, local + remote);
        w.single(
            &DERP_CURRENT_NOTIDEAL_CONNECTIONS,
            self.sum_gauge(|s| s.current_notideal.get()),
        );
    }

    fn render_packets(&self, w: &mut Exposition<'_>) {
        self.summed(
            w,
            &[
                (&DERP_PACKETS_RECEIVED, |s| s.packets_received.get()),
                (&DERP_BYTES_RECEIVED, |s| s.bytes_received.get()),
            ],
        );
        let mut f = w.family(&DERP_PACKETS_RECEIVED_KIND);
        for k in PacketKind::ALL {
            f.sample(
                &[k.label()],
                self.sum(|s| s.packets_received_kind[*k as usize].get()),
            );
        }
        self.summed(
            w,
            &[
                (&DERP_PACKETS_SENT, |s| s.packets_sent.get()),
                (&DERP_BYTES_SENT, |s| s.bytes_sent.get()),
            ],
        );
        for (family, packets) in [(&DERP_PACKETS_DROPPED, true), (&DERP_BYTES_DROPPED, false)] {
            let mut f = w.family(family);
            for r in DropReason::ALL {
                for k in PacketKind::ALL {
                    let v = self.sum(|s| {
                        let table = if packets {
                            &s.packets_dropped
                        } else {
                            &s.bytes_dropped
                        };
                        table[*r as usize][*k as usize].get()
                    });
                    f.sample(&[k.label(), r.label()], v);
                }
            }
        }
        self.summed(
            w,
            &[
                (&DERP_PACKETS_FORWARDED_IN, |s| s.packets_forwarded_in.get()),
                (&DERP_PACKETS_FORWARDED_OUT, |s| {
                    s.packets_forwarded_out.get()
                }),
                (&DERP_MULTIFORWARDER_CREATED, |s| {
                    s.multiforwarder_created.get()
                }),
                (&DERP_MULTIFORWARDER_DELETED, |s| {
                    s.multiforwarder_deleted.get()
                }),
                (&DERP_PACKET_FORWARDER_DELETE_OTHER_VALUE, |s| {
                    s.forwarder_delete_other.get()
                }),
                (&DERP_PEER_GONE_DISCONNECTED_FRAMES, |s| {
                    s.peer_gone_disconnected_frames.get()
                }),
                (&DERP_PEER_GONE_NOT_HERE_FRAMES, |s| {
                    s.peer_gone_not_here_frames.get()
                }),
                (&DERP_GOT_PING, |s| s.got_ping.get()),
                (&DERP_SENT_PONG, |s| s.sent_pong.get()),
                (&DERP_HOME_MOVES_IN, |s| s.home_moves_in.get()),
                (&DERP_HOME_MOVES_OUT, |s| s.home_moves_out.get()),
                (&DERP_SCLIENT_WRITE_TIMEOUTS, |s| {
                    s.sclient_write_timeouts.get()
                }),
                (&DERP_UNKNOWN_FRAMES, |s| s.unknown_frames.get()),
            ],
        );
    }

    /// What the process and the machine say (a family is left out where
    /// the system does not tell).
    fn render_process(&self, w: &mut Exposition<'_>) {
        if let Some(fds) = ferry_sys::open_fds() {
            w.single(&DERP_CURRENT_FILE_DESCRIPTORS, fds);
            w.single(&PROCESS_OPEN_FDS, fds);
        }
        if let Some(h) = ferry_sys::heap::heap_stats() {
            w.single(&FERRY_HEAP_IN_USE_BYTES, h.in_use);
            w.single(&FERRY_HEAP_FREE_BYTES, h.free);
            w.single(&FERRY_HEAP_ARENA_BYTES, h.arena);
            w.single(&FERRY_HEAP_MMAPPED_BYTES, h.mmapped);
        }
        let p = ferry_sys::process::process_stats();
        if let Some(cpu) = p.cpu_seconds {
            w.single(&PROCESS_CPU_SECONDS_TOTAL, cpu);
        }
        for (family, v) in [
            (&PROCESS_MAX_FDS, p.max_fds),
            (&PROCESS_VIRTUAL_MEMORY_BYTES, p.virtual_bytes),
            (&PROCESS_VIRTUAL_MEMORY_MAX_BYTES, p.virtual_max_bytes),
            (&PROCESS_NETWORK_RECEIVE_BYTES_TOTAL, p.net_rx_bytes),
            (&PROCESS_NETWORK_TRANSMIT_BYTES_TOTAL, p.net_tx_bytes),
            (&NODE_BOOT_TIME_SECONDS, p.boot_time),
        ] {
            if let Some(v) = v {
                w.single(family, v);
            }
        }
        w.single(&PROCESS_START_TIME_SECONDS, Fixed(self.started_unix, 0));
        w.family(&VERSION)
            .sample(&[env!("CARGO_PKG_VERSION"), "ferry"], 1u8);
    }

    fn render_connections(&self, w: &mut Exposition<'_>) {
        w.single(&FERRY_TCP_ACCEPTS_TOTAL, self.sum(|s| s.tcp_accepts.get()));
        w.single(
            &FERRY_HTTP_HEAD_BYTES_SCANNED_TOTAL,
            self.sum(|s| s.head_bytes_scanned.get()),
        );
        w.single(
            &DERP_WEBSOCKET_ACCEPTS,
            self.sum(|s| s.websocket_accepts.get()),
        );
        w.single(
            &TLS_LISTENER_ACCEPTED_CONNECTIONS,
            self.sum(|s| s.tcp_accepts.get() - s.accept_rejects.get()),
        );
        w.single(
            &TLS_LISTENER_REJECTED_CONNECTIONS,
            self.sum(|s| s.accept_rejects.get()),
        );
        w.single(
            &DERP_RATE_LIMIT_PER_CLIENT_WAITED,
            self.sum(|s| s.rate_limit_waits.get()),
        );
        w.single(&FERRY_FAST_START_TOTAL, self.sum(|s| s.fast_starts.get()));
        let open = self.sum_gauge(|s| s.open_sockets.get());
        w.single(&FERRY_OPEN_SOCKETS, open);
        let tls = self.sum_gauge(|s| s.tls_sockets.get());
        let ktls = self.sum_gauge(|s| s.ktls_sockets.get());
        let records = self.sum_gauge(|s| s.records_sockets.get());
        w.family(&FERRY_CONNECTIONS_BY_TRANSPORT)
            .sample(&["rustls"], tls - ktls - records)
            .sample(&["ferry_records"], records)
            .sample(&["ktls"], ktls)
            .sample(&["plain"], open - tls);
        let mut f = w.family(&FERRY_KTLS_REFUSED_TOTAL);
        for r in KtlsRefusal::ALL {
            f.sample(
                &[r.label()],
                self.sum(|s| s.ktls_refused[*r as usize].get()),
            );
        }
        let mut f = w.family(&FERRY_HANDSHAKE_FAILURES_TOTAL);
        for r in HandshakeFailure::ALL {
            f.sample(
                &[r.label()],
                self.sum(|s| s.handshake_failures[*r as usize].get()),
            );
        }
        let mut f = w.family(&FERRY_REFUSED_APP_NAMES_TOTAL);
        for (reason, name, n) in self.refused_names() {
            f.sample(&[reason.label(), &name], n);
        }
        let mut f = w.family(&FERRY_CONNECTIONS_CLOSED_TOTAL);
        for r in CloseReason::ALL {
            f.sample(&[r.label()], self.sum(|s| s.closes[*r as usize].get()));
        }
        let mut f = w.family(&FERRY_HTTP_REQUESTS_TOTAL);
        for r in Route::ALL {
            f.sample(
                &[r.label()],
                self.sum(|s| s.http_requests[*r as usize].get()),
            );
        }
        w.single(
            &FERRY_QUEUED_BYTES,
            self.sum_gauge(|s| s.queued_bytes.get()),
        );
        w.single(
            &FERRY_BACKPRESSURE_PAUSES_TOTAL,
            self.sum(|s| s.backpressure_pauses.get()),
        );
        w.single(
            &FERRY_BACKPRESSURE_BUDGET_EXPIRED_TOTAL,
            self.sum(|s| s.backpressure_expired.get()),
        );
        w.single(
            &FERRY_SENDERS_PAUSED,
            self.sum_gauge(|s| s.senders_paused.get()),
        );
        w.single(&FERRY_RING_STALLS_TOTAL, self.sum(|s| s.ring_stalls.get()));
    }

    fn render_shards(&self, w: &mut Exposition<'_>) {
        let per_shard: [SummedGauge; 9] = [
            (&FERRY_SHARD_CONNECTIONS, |s| s.current_connections.get()),
            (&FERRY_SHARD_PACKETS_RECEIVED_TOTAL, |s| {
                s.packets_received.get() as i64
            }),
            (&FERRY_SHARD_PACKETS_SENT_TOTAL, |s| {
                s.packets_sent.get() as i64
            }),
            (&FERRY_SHARD_CROSS_PACKETS_TOTAL, |s| {
                s.cross_shard_out.get() as i64
            }),
            (&FERRY_SHARD_TURNS_TOTAL, |s| s.turns.get() as i64),
            (&FERRY_SHARD_MIGRATIONS_IN_TOTAL, |s| {
                s.migrations_in.get() as i64
            }),
            (&FERRY_SHARD_RECV_BUFFER_BYTES, |s| {
                s.recv_buffer_bytes.get()
            }),
            (&FERRY_SHARD_RECV_BUFFER_EXHAUSTED_TOTAL, |s| {
                s.recv_buffer_exhausted.get()
            }),
            (&FERRY_SHARD_RECV_BUFFER_GROWTHS_TOTAL, |s| {
                s.recv_buffer_growths.get()
            }),
        ];
        let ids: Vec<String> = (0..self.shards.len()).map(|i| i.to_string()).collect();
        for (family, read) in per_shard {
            let mut f = w.family(family);
            for (id, s) in ids.iter().zip(&self.shards) {
                f.sample(&[id.as_str()], read(s));
            }
        }
        let mut f = w.family(&FERRY_SHARD_BUSY_SECONDS_TOTAL);
        for (id, s) in ids.iter().zip(&self.shards) {
            f.sample(&[id.as_str()], Fixed(s.busy_ns.get() as f64 / 1e9, 6));
        }
        w.family(&FERRY_IO_BACKEND)
            .sample(&[self.backend, self.backend_reason.as_str()], 1u8);
    }

    fn render_stun(&self, w: &mut Exposition<'_>) {
        let stun = &self.stun;
        w.family(&STUN_REQUESTS)
            .sample(&["success"], stun.success.get())
            .sample(&["not_stun"], stun.not_stun.get())
            .sample(&["read_error"], stun.read_error.get())
            .sample(&["write_error"], stun.write_error.get());
        w.family(&STUN_ADDRFAMILY)
            .sample(&["ipv4"], stun.ipv4.get())
            .sample(&["ipv6"], stun.ipv6.get());
        if let Some(rss) = ferry_sys::rss_bytes() {
            w.single(&PROCESS_RESIDENT_MEMORY_BYTES, rss);
        }
        w.single(&PROCESS_START_UNIX_TIME, Fixed(self.started_unix, 0));
        w.single(&UPTIME_SEC, self.started.elapsed().as_secs());
    }
}
