//! Send buffers shared by a shard's connections (an idle connection holds
//! none).
//!
//! A connection takes a buffer for a send when it has none of its own
//! and gives it back once the send is done and nothing else waits, so a
//! buffer belongs to a connection only while its bytes are in flight.
//! Connections that keep sending keep theirs from send to send, as
//! before; large buffers (past [`SHARE_UP_TO`]) are never shared and are
//! released by the keepAlive's idle check instead. Taking and giving back
//! move a `Vec`, so a connection that goes quiet and wakes again between
//! packets (a ping answered, a packet now and then) allocates nothing.

/// The largest buffer that goes back to the pool; larger ones stay with
/// their connection (they are a busy receiver's).
pub(super) const SHARE_UP_TO: usize = 64 * 1024;
/// The most memory the pool keeps; buffers given back past it are freed.
const POOL_BYTES: usize = 4 << 20;

use crate::conn::ServerConn;

/// Free send buffers, emptied, most recently given back first.
#[derive(Default)]
pub(super) struct SendPool {
    free: Vec<Vec<u8>>,
    bytes: usize,
}

impl SendPool {
    /// A buffer for a send: a pooled one if there is any, else a new
    /// empty one (which allocates as it is filled).
    pub(super) fn take(&mut self) -> Vec<u8> {
        match self.free.pop() {
            Some(buf) => {
                self.bytes -= buf.capacity();
                buf
            }
            None => Vec::new(),
        }
    }

    /// Takes back the send buffer of a connection with nothing in flight
    /// and nothing queued (see [`ServerConn::release_idle_send_buffer`]).
    #[inline]
    pub(super) fn release_idle(&mut self, derp: &mut ServerConn) {
        if let Some(buf) = derp.release_idle_send_buffer(SHARE_UP_TO) {
            self.give(buf);
        }
    }

    /// Gives back a buffer no connection needs now.
    pub(super) fn give(&mut self, mut buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap == 0 || cap > SHARE_UP_TO || self.bytes + cap > POOL_BYTES {
            return;
        }
        buf.clear();
        self.bytes += cap;
        self.free.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_in_turn_and_large_ones_are_freed() {
        let mut pool = SendPool::default();
        assert_eq!(
            pool.take().capacity(),
            0,
            "an empty pool hands out new buffers"
        );
        let mut small = Vec::with_capacity(4096);
        small.extend_from_slice(b"stale");
        pool.give(small);
        pool.give(Vec::with_capacity(SHARE_UP_TO + 1));
        assert_eq!(pool.bytes, 4096);
        let again = pool.take();
        assert!(again.is_empty(), "given back emptied");
        assert_eq!(again.capacity(), 4096);
        assert_eq!(pool.take().capacity(), 0, "the large buffer was not kept");
    }

    #[test]
    fn the_pool_keeps_at_most_its_budget() {
        let mut pool = SendPool::default();
        for _ in 0..POOL_BYTES / SHARE_UP_TO + 3 {
            pool.give(Vec::with_capacity(SHARE_UP_TO));
        }
        assert_eq!(pool.bytes, POOL_BYTES);
        assert_eq!(pool.free.len(), POOL_BYTES / SHARE_UP_TO);
    }
}
