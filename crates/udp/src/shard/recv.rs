//! The receive side of a shard: one `recvmmsg` per batch into the shard's
//! buffer, the batch size fitted to the cache, and the walk over what
//! arrived (slots, and the datagrams GRO glued into a slot).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use ferry_sys::mmsg::{RecvMeta, MAX_BATCH};

use super::Shard;
use crate::metrics::{Drop, ShardMetrics};

/// Most bytes one receive batch should bring in. Each datagram is copied
/// into the shard's buffer by `recvmmsg` and out of it by `sendmmsg` in the
/// same turn; a batch that fits the core's L2 cache (512 KiB on the
/// machines we measure) is still there for the second copy. Sixty-four GRO
/// trains of 64 KiB (4 MiB) are not: with trains, fewer slots are asked
/// for ([`batch_slots`]).
const BATCH_BYTES: usize = 512 << 10;
/// Fewest slots one receive asks for.
const MIN_BATCH: usize = 8;

/// How many slots the next receive should ask for, after one that
/// brought `n` slots of `bytes` in all while asking for `asked`: as many as
/// keep a batch of slots that size within [`BATCH_BYTES`], between
/// [`MIN_BATCH`] and [`MAX_BATCH`]. Single datagrams (1.5 KiB a slot) keep
/// the full batch; GRO trains of 64 KiB get eight.
pub(super) fn batch_slots(n: usize, bytes: usize, asked: usize) -> usize {
    if n == 0 || bytes == 0 {
        return asked;
    }
    (BATCH_BYTES * n / bytes).clamp(MIN_BATCH, MAX_BATCH)
}

/// Calls `f(source, offset, length, segment)` for each slot of a received
/// batch (`meta`, slots of `slot` bytes): one datagram, or a GRO train of
/// datagrams of `segment` bytes (the last may be shorter) from one source;
/// truncated slots are counted and skipped.
pub(super) fn each_train(
    meta: &[RecvMeta],
    slot: usize,
    metrics: &ShardMetrics,
    mut f: impl FnMut(SocketAddr, usize, usize, usize),
) {
    for (i, m) in meta.iter().enumerate() {
        let Some(src) = m.src else { continue };
        if m.truncated {
            metrics.count_drop(Drop::Truncated, 1);
            continue;
        }
        f(src, i * slot, m.len, m.segment.max(1));
    }
}

/// Calls `f(offset, length)` for each datagram of a train of `len` bytes
/// at `start`, `seg` bytes each but the last.
pub(super) fn each_datagram(start: usize, len: usize, seg: usize, mut f: impl FnMut(usize, usize)) {
    let mut at = start;
    while at < start + len {
        let n = seg.min(start + len - at);
        f(at, n);
        at += n;
    }
}

impl Shard {
    /// One `recvmmsg` into the shard buffer, on listener `which` or else on
    /// the upstream socket of bounce client `client`: the datagrams
    /// received, 0 for none, `usize::MAX` when an ICMP error was consumed.
    pub(super) fn recv(&mut self, which: Option<usize>, client: Option<usize>) -> usize {
        let sock = match (which, client) {
            (Some(l), _) => &self.listeners[l].sock,
            (None, Some(k)) => &self.clients[k].sock,
            _ => return 0,
        };
        let asked = self.want;
        match self.rx.recv(
            sock.as_fd(),
            &mut self.buf,
            self.slot,
            &mut self.meta[..asked],
        ) {
            Ok(n) => {
                self.metrics.recv_calls.add(1);
                self.asked = asked;
                let bytes = self.meta[..n].iter().map(|m| m.len).sum();
                self.want = batch_slots(n, bytes, asked);
                // The drop counter is cumulative per socket: count the growth.
                let seen = match (which, client) {
                    (Some(l), _) => &mut self.listeners[l].drops_seen,
                    (None, Some(k)) => &mut self.clients[k].drops_seen,
                    _ => unreachable!(),
                };
                for m in &self.meta[..n] {
                    if let Some(d) = m.drops {
                        if d > *seen {
                            self.metrics.socket_drops.add(u64::from(d - *seen));
                            *seen = d;
                        }
                    }
                    if m.segment < m.len {
                        self.metrics
                            .gro_datagrams
                            .add(m.len.div_ceil(m.segment.max(1)) as u64);
                    }
                }
                n
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            // A connected upstream socket reports ICMP errors here; the
            // error is consumed, the socket stays usable.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => usize::MAX,
            Err(e) => {
                self.warn("receiving failed", &e);
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_of_trains_are_cut_to_the_cache_budget() {
        // Single datagrams keep the full batch.
        assert_eq!(
            batch_slots(MAX_BATCH, MAX_BATCH * 1400, MAX_BATCH),
            MAX_BATCH
        );
        // 64 KiB trains: eight slots (512 KiB), and staying there.
        assert_eq!(batch_slots(MAX_BATCH, MAX_BATCH * 65_536, MAX_BATCH), 8);
        assert_eq!(batch_slots(8, 8 * 65_536, 8), 8);
        // 16 KiB trains: 32 slots; back to the full batch when they shrink.
        assert_eq!(batch_slots(8, 8 * 16_384, 8), 32);
        assert_eq!(batch_slots(32, 32 * 1400, 32), MAX_BATCH);
        // Nothing received: ask for as many as before.
        assert_eq!(batch_slots(0, 0, 8), 8);
    }
}
