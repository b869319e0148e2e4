//! Choosing one page of connections under a [`Query`]: the `limit` first
//! in the walk order past the cursor, kept in a bounded heap while the
//! connections stream by, so a page costs O(n log limit) and never a sort
//! of every connection.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::net::SocketAddr;

use super::query::{After, Query, SortBy};
use ferry_proto::key::NodePublic;

/// What a connection is sorted by, under one [`SortBy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SortValue {
    /// The key's bytes (the order of its hex text).
    Key([u8; 32]),
    /// The remote address (IPv4 before IPv6, then bytes) and port.
    Addr(SocketAddr),
    /// Only the connection number counts.
    Conn,
    /// Connection time, Unix nanoseconds.
    Time(i128),
    /// A traffic counter's value, read once.
    Counter(u64),
}

impl SortValue {
    /// The value of a key under the key sort.
    pub fn key(k: &NodePublic) -> SortValue {
        SortValue::Key(*k.as_bytes())
    }

    /// The cursor's value, in the same terms.
    fn of_cursor(after: &After) -> SortValue {
        match after {
            After::Key(k) => SortValue::key(k),
            After::Addr(a) => SortValue::Addr(*a),
            After::Conn(_) => SortValue::Conn,
            After::ConnectedAt(t) => SortValue::Time(*t),
            After::Counter(n) => SortValue::Counter(*n),
        }
    }
}

/// One page: the chosen connections in walk order, and how many more
/// past the cursor matched but did not fit.
#[derive(Debug)]
pub struct Page<T> {
    /// At most `limit` entries, in the walk order.
    pub rows: Vec<T>,
    /// Matching entries past the cursor left for later pages.
    pub remaining: usize,
}

struct Entry<T> {
    value: SortValue,
    conn: i64,
    desc: bool,
    item: T,
}

impl<T> Entry<T> {
    /// The walk order: ascending (value, conn), or its reverse.
    fn walk_cmp(&self, other: &Self) -> Ordering {
        let o = (self.value, self.conn).cmp(&(other.value, other.conn));
        if self.desc {
            o.reverse()
        } else {
            o
        }
    }
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.walk_cmp(other) == Ordering::Equal
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.walk_cmp(other)
    }
}

/// Whether `(value, conn)` lies strictly past the query's cursor in the
/// walk order. Without a tie-break (`afterconn`), every entry at the
/// cursor's value is skipped; the conn sort's cursor is the number itself.
fn past_cursor(q: &Query, value: SortValue, conn: i64) -> bool {
    let Some(after) = &q.after else { return true };
    let o = match after {
        After::Conn(n) => conn.cmp(n),
        a => {
            let cv = SortValue::of_cursor(a);
            match q.after_conn {
                Some(cc) => (value, conn).cmp(&(cv, cc)),
                None if value == cv => return false,
                None => value.cmp(&cv),
            }
        }
    };
    if q.desc {
        o == Ordering::Less
    } else {
        o == Ordering::Greater
    }
}

/// The page of `items` (already filtered) under `q`; `value` gives each
/// item's sort value under `q.sort` and its connection number.
pub fn select<T>(
    q: &Query,
    items: impl IntoIterator<Item = T>,
    value: impl Fn(&T) -> (SortValue, i64),
) -> Page<T> {
    let limit = q.limit.max(1);
    // The heap's top is the worst kept entry (last in walk order).
    let mut heap: BinaryHeap<Entry<T>> = BinaryHeap::with_capacity(limit + 1);
    let mut matched = 0usize;
    for item in items {
        let (value, conn) = value(&item);
        let value = if q.sort == SortBy::Conn {
            SortValue::Conn
        } else {
            value
        };
        if !past_cursor(q, value, conn) {
            continue;
        }
        matched += 1;
        heap.push(Entry {
            value,
            conn,
            desc: q.desc,
            item,
        });
        if heap.len() > limit {
            heap.pop();
        }
    }
    let rows: Vec<T> = heap.into_sorted_vec().into_iter().map(|e| e.item).collect();
    Page {
        remaining: matched - rows.len(),
        rows,
    }
}

#[cfg(test)]
mod tests;
