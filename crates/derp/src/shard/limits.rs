//! Limits: each client's receive rate (`--rate-config`) and the accept
//! rate (`--accept-connection-limit`).
//!
//! A client over its rate is not dropped from: its input is held (the
//! socket is not read, so TCP pushes back on it) until its bucket is out
//! of debt, exactly as long as the frames it sent cost. Every frame counts
//! with its header, as derper counts it; mesh peers are exempt. New limits
//! (SIGHUP) reach every shard through its inbox and give every client a
//! full bucket of the new size.
//!
//! Holding input alone would leave the waiting to the kernel's receive
//! buffer, which grows (up to `tcp_rmem`'s max, megabytes) whenever the
//! relay takes a large read at once, and then holds seconds of the
//! client's traffic. So a limited client's socket, from its registration
//! (or from new limits), gets a fixed receive buffer of [`recv_cap`]: what
//! waits on the relay's side is then at most that in the kernel plus what
//! one turn read before the hold landed. A tenth of a second of the
//! rate beyond what its round trips need (TCP advertises about half the
//! buffer as its window, and a window smaller than the rate times the
//! round trip would hold a distant client under its rate), at least twice
//! the burst, is enough for the client to reach its rate: a relay that
//! comes late to the socket costs the client whatever refill its bucket
//! could not keep (past the burst), whatever the buffer, and the buffer
//! holds more than the burst; a client late to refill the buffer has its
//! own send buffer to draw on. A larger buffer only adds to its packets'
//! latency. The round trip counted is at most [`MAX_RTT`]: a client that
//! delays its acknowledgements to look distant gets no more than that
//! (and never more than the kernel's `rmem_max`). Reading is not slowed
//! further. Lifting the limits leaves the buffer as it is until the
//! client reconnects.

use super::*;

/// Bytes of a DERP frame header, counted with its payload.
const FRAME_HEADER: usize = 5;

/// How much of a limited client's traffic its socket's receive buffer
/// holds, in time at its rate.
const RECV_TIME: Duration = Duration::from_millis(100);

/// The longest round trip [`recv_cap`] sizes a buffer for (farther than
/// any path on Earth).
const MAX_RTT: Duration = Duration::from_millis(500);

/// The receive buffer (as the kernel counts it, with its bookkeeping) of a
/// limited client's socket whose connection has round trip `rtt` (at most
/// [`MAX_RTT`] counted): its rate over two round trips (a window of one)
/// and [`RECV_TIME`], and room for its burst even in small segments (twice
/// the burst) when that is more.
pub(super) fn recv_cap(rate: &RateConfig, rtt: Duration) -> usize {
    let time = 2.0 * rtt.min(MAX_RTT).as_secs_f64() + RECV_TIME.as_secs_f64();
    ((rate.bytes_per_sec as f64 * time) as usize).max(2 * rate.burst_bytes as usize)
}

/// The bucket a client gets under `rate`.
pub(super) fn bucket_for(rate: &RateConfig, mesh: bool) -> Option<Bucket> {
    (rate.is_limited() && !mesh)
        .then(|| Bucket::new(rate.bytes_per_sec as f64, rate.burst_bytes as f64))
}

impl Shard {
    /// Charges a frame of `payload` bytes to `slot`'s bucket; holds its
    /// input when the bucket goes into debt. `flow` is what handling the
    /// frame decided.
    pub(super) fn charge_frame(
        &mut self,
        slot: Slot,
        payload: usize,
        flow: ControlFlow<()>,
    ) -> ControlFlow<()> {
        let now = self.now;
        let conn = &mut self.conns[slot];
        let Some(bucket) = conn.rate_mut() else {
            return flow;
        };
        let Some(wait) = bucket.take((FRAME_HEADER + payload) as f64, now) else {
            return flow;
        };
        if conn.is_closed() {
            return flow;
        }
        let gen = conn.gen();
        self.m.rate_limit_waits.inc();
        self.hold_input(slot, Hold::RateLimit);
        self.rate_held.push((slot, gen, now + wait));
        ControlFlow::Break(())
    }

    /// Lets go the clients whose buckets are out of debt.
    pub(super) fn release_rate_held(&mut self) {
        let now = self.now;
        let mut due = Vec::new();
        self.rate_held.retain(|&(slot, gen, at)| {
            if at <= now {
                due.push((slot, gen));
                false
            } else {
                true
            }
        });
        for (slot, gen) in due {
            if self.conns.get(slot).is_some_and(|c| c.gen() == gen) {
                self.release_input(slot, Hold::RateLimit);
            }
        }
    }

    /// New limits: every registered client gets a fresh bucket (or none),
    /// and those held by the old limit are let go.
    pub(super) fn set_rate(&mut self, rate: RateConfig) {
        self.rate = rate;
        let mut held = Vec::new();
        for (slot, conn) in self.conns.iter_mut() {
            if conn.phase() == Phase::Active {
                let bucket = bucket_for(&rate, conn.is_mesh());
                if bucket.is_some() {
                    self.ops.push(Op::LimitRecv(slot));
                }
                conn.set_rate(bucket);
                if conn.holds(Hold::RateLimit) {
                    held.push(slot);
                }
            }
        }
        self.rate_held.clear();
        for slot in held {
            self.release_input(slot, Hold::RateLimit);
        }
    }

    /// Whether `--accept-connection-limit` lets one more connection in.
    pub(super) fn accept_allowed(&self) -> bool {
        match &self.shared.accept_limit {
            None => true,
            Some(bucket) => bucket
                .lock()
                .expect("accept limit lock")
                .try_take_one(self.now),
        }
    }
}
