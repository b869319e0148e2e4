//! The index table's entries and the bucket operations on them: each
//! index holds up to [`WAYS`] entries (WireGuard peers pick indices at
//! random, so two may collide), pending handshakes and WireGuard sessions
//! in maps of their own, each with a FIFO expiry queue.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use ferry_proto::wireguard::Index;

use super::{Endpoint, PeerId};

/// Entries one index can hold (collisions beyond that evict the oldest).
pub(super) const WAYS: usize = 2;

/// An initiation forwarded and waiting for its response, under the
/// initiator's sender index.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    /// Where the initiation came from.
    pub(super) src: Endpoint,
    /// The initiator, if its address was already known.
    pub(super) initiator: Option<PeerId>,
    /// The recipient its MAC1 named.
    pub(super) responder: PeerId,
    /// When.
    pub(super) at: Instant,
}

/// One side of a WireGuard session, under the index its owner picked:
/// data to this index goes to `owner` and comes from `partner`.
#[derive(Clone, Copy, Debug)]
pub(super) struct WgSession {
    pub(super) owner: PeerId,
    pub(super) partner: PeerId,
    /// When the handshake completed.
    pub(super) at: Instant,
    /// The highest counter seen on this index.
    pub(super) max_counter: u64,
    /// A new address of the partner being confirmed: the address, the
    /// last counter from it and how many fresh packets it sent.
    pub(super) roam: Option<(Endpoint, u64, u8)>,
}

/// The entries of one index.
pub(super) type Bucket<T> = [Option<T>; WAYS];

/// Puts `e` into `bucket`: over an entry `same` matches, else into a free
/// way, else over the oldest. Returns (a way was filled, an entry of
/// another owner was evicted).
pub(super) fn insert<T: Copy>(
    bucket: &mut Bucket<T>,
    e: T,
    same: impl Fn(&T) -> bool,
    age: impl Fn(&T) -> Instant,
) -> (bool, bool) {
    if let Some(slot) = bucket.iter_mut().find(|s| s.as_ref().is_some_and(&same)) {
        *slot = Some(e);
        return (false, false);
    }
    if let Some(slot) = bucket.iter_mut().find(|s| s.is_none()) {
        *slot = Some(e);
        return (true, false);
    }
    let oldest = (0..WAYS)
        .min_by_key(|&i| bucket[i].as_ref().map(&age))
        .unwrap_or(0);
    bucket[oldest] = Some(e);
    (false, true)
}

/// Pops the due entries of an expiry queue, `(deadline, index, made at)`
/// in deadline order, and removes each from `map` unless it was replaced
/// since (its time changed). Returns how many entries were removed.
pub(super) fn expire_queue<T>(
    queue: &mut VecDeque<(Instant, Index, Instant)>,
    map: &mut HashMap<Index, Bucket<T>>,
    now: Instant,
    made_at: impl Fn(&T) -> Instant,
) -> usize {
    let mut removed = 0;
    while let Some(&(deadline, index, at)) = queue.front() {
        if deadline > now {
            break;
        }
        queue.pop_front();
        removed += usize::from(remove_where(map, index, |e| made_at(e) == at));
    }
    removed
}

/// Removes every entry `pred` matches, and the buckets left empty.
/// Returns how many entries were removed.
pub(super) fn remove_all<T: Copy>(
    map: &mut HashMap<Index, Bucket<T>>,
    pred: impl Fn(&T) -> bool,
) -> usize {
    let mut removed = 0;
    map.retain(|_, bucket| {
        for slot in bucket.iter_mut() {
            if slot.as_ref().is_some_and(&pred) {
                *slot = None;
                removed += 1;
            }
        }
        bucket.iter().any(Option::is_some)
    });
    removed
}

/// Removes the first entry of `index` that `pred` matches; drops the
/// bucket when it empties. Returns whether one was removed.
pub(super) fn remove_where<T>(
    map: &mut HashMap<Index, Bucket<T>>,
    index: Index,
    pred: impl Fn(&T) -> bool,
) -> bool {
    let Some(bucket) = map.get_mut(&index) else {
        return false;
    };
    let Some(slot) = bucket.iter_mut().find(|s| s.as_ref().is_some_and(&pred)) else {
        return false;
    };
    *slot = None;
    if bucket.iter().all(|s| s.is_none()) {
        map.remove(&index);
    }
    true
}
