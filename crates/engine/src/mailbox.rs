//! Rings between shards, and the doorbell that wakes a parked shard.
//!
//! Every ordered pair of shards (A, B) has two single-producer,
//! single-consumer rings from A to B:
//!
//! - a byte ring ([`ByteTx`]/[`ByteRx`]) carrying length-prefixed records,
//!   used for packets: a record is copied in once by A and read in place by
//!   B, so crossing shards allocates nothing;
//! - a typed ring ([`MsgTx`]/[`MsgRx`]) for control messages that own
//!   things (a migrating connection) or must not be lost.
//!
//! Wake-ups are batched: the producer pushes a whole turn's worth of
//! records and then calls [`Doorbell::notify`] once. The doorbell only
//! makes a system call when the consumer is actually parked, which is
//! announced with [`Doorbell::park`] before it blocks. Both sides put a
//! `SeqCst` fence between their store and their load, so either the
//! producer sees the consumer parked or the consumer sees the new records.
//! `tests/loom_doorbell.rs` checks that protocol under every interleaving
//! and memory ordering [loom] explores: built with `--cfg loom`, the
//! doorbell's atomics are loom's.
//!
//! [loom]: https://docs.rs/loom

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicBool, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

/// Wakes one shard.
pub struct Doorbell {
    parked: AtomicBool,
    ring: Arc<dyn Fn() + Send + Sync>,
}

impl Doorbell {
    /// A doorbell that calls `ring` to interrupt the shard's wait.
    pub fn new(ring: Arc<dyn Fn() + Send + Sync>) -> Arc<Self> {
        Arc::new(Doorbell {
            parked: AtomicBool::new(false),
            ring,
        })
    }

    /// Producer side: call after pushing a batch.
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::Relaxed) && self.parked.swap(false, Ordering::AcqRel) {
            (self.ring)();
        }
    }

    /// Rings unconditionally (shutdown, configuration changes).
    pub fn ring(&self) {
        self.parked.store(false, Ordering::Release);
        (self.ring)();
    }

    /// Consumer side: announce the intent to block. The caller must check
    /// its rings again after this and skip blocking if any has records.
    pub fn park(&self) {
        // A swap, not a store: the same `xchg` on x86 (where a SeqCst store
        // is one), and a read-modify-write orders this write after a
        // producer's `swap(false)` that cleared the previous park, which
        // loom's partial modification order needs to see what the fences
        // guarantee (with a plain store it reports a lost wake-up that the
        // memory model rules out).
        self.parked.swap(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Consumer side: no longer blocked.
    pub fn unpark(&self) {
        self.parked.store(false, Ordering::Relaxed);
    }
}

const LEN_PREFIX: usize = 4;

/// Creates a byte ring holding `capacity` bytes (records and their 4-byte
/// length prefixes).
pub fn byte_ring(capacity: usize) -> (ByteTx, ByteRx) {
    let (p, c) = rtrb::RingBuffer::new(capacity);
    (ByteTx { p }, ByteRx { c })
}

/// Producer end of a byte ring.
pub struct ByteTx {
    p: rtrb::Producer<u8>,
}

impl ByteTx {
    /// Appends one record made of the concatenation of `parts`, or nothing
    /// (returning `false`) when it does not fit now.
    pub fn try_push(&mut self, parts: &[&[u8]]) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let Ok(len32) = u32::try_from(len) else {
            return false;
        };
        if self.p.slots() < LEN_PREFIX + len {
            return false;
        }
        // The consumer waits for a record's last byte before reading it, so
        // committing the parts one by one is invisible to it.
        let pushed = self.p.push_entire_slice(&len32.to_le_bytes()).is_ok()
            && parts
                .iter()
                .all(|part| self.p.push_entire_slice(part).is_ok());
        debug_assert!(pushed, "space was checked and only we produce");
        pushed
    }

    /// Bytes free right now.
    pub fn free(&self) -> usize {
        self.p.slots()
    }

    /// Whether a record of `len` bytes would fit right now.
    pub fn fits(&self, len: usize) -> bool {
        self.p.slots() >= LEN_PREFIX + len
    }

    /// Total size of the ring.
    pub fn capacity(&self) -> usize {
        self.p.buffer().capacity()
    }
}

/// Consumer end of a byte ring.
pub struct ByteRx {
    c: rtrb::Consumer<u8>,
}

impl ByteRx {
    /// Hands the next complete record to `f` as two slices (the record may
    /// wrap around the end of the ring) and releases it. Returns `false`
    /// when no complete record is there.
    pub fn pop_with<R>(&mut self, f: impl FnOnce(&[u8], &[u8]) -> R) -> Option<R> {
        let len = {
            let head = self.c.read_chunk(LEN_PREFIX).ok()?;
            let (a, b) = head.as_slices();
            let mut prefix = [0u8; LEN_PREFIX];
            prefix[..a.len()].copy_from_slice(a);
            prefix[a.len()..].copy_from_slice(b);
            u32::from_le_bytes(prefix) as usize
            // Not committed: this only peeks at the prefix.
        };
        let chunk = self.c.read_chunk(LEN_PREFIX + len).ok()?;
        let (a, b) = chunk.as_slices();
        let (a, b) = if a.len() >= LEN_PREFIX {
            (&a[LEN_PREFIX..], b)
        } else {
            (&b[LEN_PREFIX - a.len()..], &[][..])
        };
        let r = f(a, b);
        chunk.commit_all();
        Some(r)
    }

    /// Hands records to `f`, as [`ByteRx::pop_with`] does, until `budget`
    /// bytes (records and their prefixes) have been read or no complete
    /// record is left; returns the bytes read. With `budget` set to
    /// [`ByteRx::len`] beforehand, a consumer reads what was there and no
    /// more, so a producer that refills as fast as it reads cannot keep it
    /// in the loop.
    pub fn pop_until(&mut self, budget: usize, mut f: impl FnMut(&[u8], &[u8])) -> usize {
        let mut read = 0;
        while read < budget {
            match self.pop_with(|a, b| {
                f(a, b);
                LEN_PREFIX + a.len() + b.len()
            }) {
                Some(n) => read += n,
                None => break,
            }
        }
        read
    }

    /// Whether no bytes are waiting.
    pub fn is_empty(&self) -> bool {
        self.c.is_empty()
    }

    /// Bytes waiting (records and prefixes).
    pub fn len(&self) -> usize {
        self.c.slots()
    }

    /// Total size of the ring.
    pub fn capacity(&self) -> usize {
        self.c.buffer().capacity()
    }
}

/// Creates a typed ring of `capacity` messages.
pub fn msg_ring<M>(capacity: usize) -> (MsgTx<M>, MsgRx<M>) {
    let (p, c) = rtrb::RingBuffer::new(capacity);
    (
        MsgTx {
            p,
            overflow: std::collections::VecDeque::new(),
        },
        MsgRx { c },
    )
}

/// Producer end of a typed ring. Messages that do not fit wait in a local
/// overflow queue and go out, in order, on the next [`MsgTx::flush`]:
/// control messages are never dropped.
pub struct MsgTx<M> {
    p: rtrb::Producer<M>,
    overflow: std::collections::VecDeque<M>,
}

impl<M> MsgTx<M> {
    /// Sends `msg`, or keeps it for the next flush if the ring is full.
    pub fn send(&mut self, msg: M) {
        if self.overflow.is_empty() {
            if let Err(rtrb::PushError::Full(msg)) = self.p.push(msg) {
                self.overflow.push_back(msg);
            }
        } else {
            self.overflow.push_back(msg);
        }
    }

    /// Moves overflowed messages into the ring as space allows; returns
    /// whether any are still waiting.
    pub fn flush(&mut self) -> bool {
        while let Some(msg) = self.overflow.pop_front() {
            if let Err(rtrb::PushError::Full(msg)) = self.p.push(msg) {
                self.overflow.push_front(msg);
                return true;
            }
        }
        false
    }

    /// Messages waiting for space.
    pub fn backlog(&self) -> usize {
        self.overflow.len()
    }
}

/// Consumer end of a typed ring.
pub struct MsgRx<M> {
    c: rtrb::Consumer<M>,
}

impl<M> MsgRx<M> {
    /// The next message, if any.
    pub fn recv(&mut self) -> Option<M> {
        self.c.pop().ok()
    }

    /// Whether no messages are waiting.
    pub fn is_empty(&self) -> bool {
        self.c.is_empty()
    }
}

// The unit tests use the doorbell outside a loom model.
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn records_round_trip_across_wraparound() {
        let (mut tx, mut rx) = byte_ring(64);
        for round in 0..200u32 {
            let body = vec![(round % 251) as u8; (round % 40) as usize];
            assert!(tx.try_push(&[&round.to_be_bytes(), &body]));
            let got = rx
                .pop_with(|a, b| {
                    let mut v = a.to_vec();
                    v.extend_from_slice(b);
                    v
                })
                .expect("record");
            assert_eq!(&got[..4], &round.to_be_bytes());
            assert_eq!(&got[4..], &body[..]);
        }
        assert!(rx.pop_with(|_, _| ()).is_none());
    }

    #[test]
    fn pop_until_reads_what_was_there_and_no_more() {
        let (mut tx, mut rx) = byte_ring(256);
        for i in 0..3u8 {
            assert!(tx.try_push(&[&[i; 10]]));
        }
        let there = rx.len();
        assert_eq!(there, 3 * (4 + 10));
        // Records pushed after the snapshot wait for the next call.
        assert!(tx.try_push(&[&[9; 10]]));
        let mut seen = Vec::new();
        assert_eq!(rx.pop_until(there, |a, _| seen.push(a[0])), there);
        assert_eq!(seen, [0, 1, 2]);
        // A budget that ends inside a record still takes that record whole.
        assert!(tx.try_push(&[&[10; 10]]));
        seen.clear();
        assert_eq!(rx.pop_until(1, |a, _| seen.push(a[0])), 14);
        assert_eq!(seen, [9]);
        assert_eq!(rx.pop_until(usize::MAX, |a, _| seen.push(a[0])), 14);
        assert_eq!(seen, [9, 10]);
        assert_eq!(rx.pop_until(usize::MAX, |_, _| ()), 0);
    }

    #[test]
    fn full_ring_refuses_whole_records() {
        let (mut tx, mut rx) = byte_ring(32);
        assert!(tx.try_push(&[&[1; 20]]));
        assert!(!tx.try_push(&[&[2; 20]]), "would not fit");
        assert_eq!(rx.pop_with(|a, b| a.len() + b.len()), Some(20));
        assert!(tx.try_push(&[&[2; 20]]));
    }

    #[test]
    fn threads_see_every_record_in_order() {
        let (mut tx, mut rx) = byte_ring(1 << 12);
        const N: u32 = 100_000;
        let producer = std::thread::spawn(move || {
            let mut i = 0u32;
            while i < N {
                let len = (i % 97) as usize;
                if tx.try_push(&[&i.to_le_bytes(), &vec![0xab; len]]) {
                    i += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        });
        let mut next = 0u32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while next < N {
            assert!(
                std::time::Instant::now() < deadline,
                "consumer stalled at {next}"
            );
            let got = rx.pop_with(|a, b| {
                let mut v = a.to_vec();
                v.extend_from_slice(b);
                v
            });
            match got {
                Some(v) => {
                    assert_eq!(u32::from_le_bytes(v[..4].try_into().unwrap()), next);
                    assert_eq!(v.len() - 4, (next % 97) as usize);
                    assert!(v[4..].iter().all(|&x| x == 0xab));
                    next += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        producer.join().unwrap();
    }

    #[test]
    fn msg_overflow_keeps_order() {
        let (mut tx, mut rx) = msg_ring::<u32>(4);
        for i in 0..10 {
            tx.send(i);
        }
        assert_eq!(tx.backlog(), 6);
        let mut got = Vec::new();
        while got.len() < 10 {
            while let Some(m) = rx.recv() {
                got.push(m);
            }
            tx.flush();
        }
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn doorbell_rings_only_when_parked() {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let bell = Doorbell::new(Arc::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
        }));
        bell.notify();
        assert_eq!(count.load(Ordering::SeqCst), 0);
        bell.park();
        bell.notify();
        bell.notify();
        assert_eq!(count.load(Ordering::SeqCst), 1, "one wake per park");
        bell.unpark();
        bell.notify();
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}
