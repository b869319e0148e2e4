//! `/debug/clients/` across the shards. The shard that read the request
//! walks its own connections and mails the query to every other shard;
//! each walks its connections once (a filter, a cursor test and at most a
//! heap operation per connection) and mails back its page (at most the
//! limit) with its counts; the asking shard chooses the page among those
//! (`debug_clients::merge`) and answers. A shard waits on a few requests
//! at a time and answers more with 503.

use std::cell::Cell;

use super::*;
use crate::debug_clients::page::{select, SortValue};
use crate::debug_clients::query::{Filter, Query, SortBy};
use crate::debug_clients::row::{canonical_remote, Part, Row};
use crate::debug_clients::{merge, render};

/// `/debug/clients/` requests one shard waits on at a time.
pub(super) const MAX_ASKS: usize = 4;

/// A request waiting for the other shards' pages.
pub(super) struct Ask {
    to: ConnRef,
    query: Arc<Query>,
    waiting: usize,
    parts: Vec<Part>,
}

/// `/debug/clients/` mail between shards.
pub enum DebugMail {
    /// Walk your connections under this query and answer `from`.
    Ask {
        /// The connection that asked (on the asking shard).
        from: ConnRef,
        /// The query.
        query: Arc<Query>,
    },
    /// One shard's page for the request of `to`.
    Part {
        /// The connection that asked.
        to: ConnRef,
        /// The page and counts.
        part: Part,
    },
}

impl Shard {
    /// Wall-clock time of `at`, Unix nanoseconds, counted from the
    /// server's epoch (so one instant always reads the same).
    pub(super) fn wall_ns(&self, at: Instant) -> i128 {
        let (mono, wall) = self.shared.epoch;
        let base = wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        if at >= mono {
            base + at.duration_since(mono).as_nanos() as i128
        } else {
            base - mono.duration_since(at).as_nanos() as i128
        }
    }

    /// Starts answering `/debug/clients/` under `q` to the connection in
    /// `slot`, which waits (reading nothing) until every shard answered.
    pub(super) fn ask_debug_clients(&mut self, slot: Slot, q: Box<Query>) {
        if self.debug_asks.len() >= MAX_ASKS {
            self.respond(
                slot,
                http::response(
                    503,
                    "Service Unavailable",
                    &[("Content-Type", "text/plain; charset=utf-8")],
                    b"too many /debug/clients/ requests at once\n",
                ),
            );
            return;
        }
        let query: Arc<Query> = Arc::from(q);
        let part = self.debug_part(&query);
        let to = self.conn_ref(slot);
        self.conns[slot].set_phase(Phase::Responding);
        let ask = Ask {
            to,
            query: query.clone(),
            waiting: self.shards - 1,
            parts: vec![part],
        };
        if ask.waiting == 0 {
            self.answer_debug_clients(ask);
            return;
        }
        self.debug_asks.push(ask);
        let me = self.id;
        for shard in (0..self.shards).filter(|&s| s != me) {
            let query = query.clone();
            self.mail(
                shard,
                Mail::DebugClients(Box::new(DebugMail::Ask { from: to, query })),
            );
        }
    }

    pub(super) fn on_debug_mail(&mut self, mail: DebugMail) {
        match mail {
            DebugMail::Ask { from, query } => {
                let part = self.debug_part(&query);
                self.mail(
                    from.shard,
                    Mail::DebugClients(Box::new(DebugMail::Part { to: from, part })),
                );
            }
            DebugMail::Part { to, part } => {
                let Some(i) = self.debug_asks.iter().position(|a| a.to == to) else {
                    return;
                };
                let ask = &mut self.debug_asks[i];
                ask.parts.push(part);
                ask.waiting -= 1;
                if ask.waiting == 0 {
                    let ask = self.debug_asks.swap_remove(i);
                    self.answer_debug_clients(ask);
                }
            }
        }
    }

    /// Every shard answered: the page goes to the asker, if still there.
    fn answer_debug_clients(&mut self, ask: Ask) {
        let Some(slot) = self.live(ask.to) else {
            return;
        };
        let page = merge(&ask.query, ask.parts);
        let body = render::page(&ask.query, &page);
        self.respond(
            slot,
            http::response(
                200,
                "OK",
                &[("Content-Type", body.content_type)],
                &body.bytes,
            ),
        );
    }

    /// What a connection is sorted by under `sort`, and its number.
    fn debug_sort_value(&self, slot: Slot, sort: SortBy) -> (SortValue, i64) {
        let c = &self.conns[slot];
        let t = c.tally();
        let v = match sort {
            SortBy::Key => SortValue::key(&c.key()),
            SortBy::Ip => SortValue::Addr(canonical_remote(c.peer())),
            SortBy::Conn => SortValue::Conn,
            SortBy::Connected => SortValue::Time(self.wall_ns(c.registered_at())),
            SortBy::RxBytes => SortValue::Counter(t.rx_bytes),
            SortBy::TxBytes => SortValue::Counter(t.tx_bytes),
            SortBy::RxPkts => SortValue::Counter(t.rx_pkts),
            SortBy::TxPkts => SortValue::Counter(t.tx_pkts),
        };
        (v, c.num())
    }

    /// This shard's page under `q`: one walk of its registered
    /// connections, rows made only for the chosen ones.
    pub(super) fn debug_part(&self, q: &Query) -> Part {
        let conns = Cell::new(0usize);
        let keys = Cell::new(0usize);
        let matches = |slot: &Slot| {
            let c = &self.conns[*slot];
            !c.is_closed() && q.matches_addr(c.peer().ip()) && q.matches_app(c.app())
        };
        let entries: Box<dyn Iterator<Item = &KeyEntry>> = match &q.filter {
            Filter::Key(k) => Box::new(self.keys.get(k).into_iter()),
            _ => Box::new(self.keys.values()),
        };
        let candidates = entries.flat_map(|e| {
            let n = e.conns.iter().filter(|s| matches(s)).count();
            if n > 0 {
                conns.set(conns.get() + n);
                keys.set(keys.get() + 1);
            }
            e.conns
                .iter()
                .filter(move |s| n > 0 && matches(s))
                .map(move |&s| (s, e))
        });
        let page = select(q, candidates, |&(slot, _)| {
            self.debug_sort_value(slot, q.sort)
        });
        let rows = page
            .rows
            .into_iter()
            .map(|(slot, e)| self.debug_row(slot, e))
            .collect();
        Part {
            rows,
            conns: conns.get(),
            keys: keys.get(),
            remaining: page.remaining,
        }
    }

    fn debug_row(&self, slot: Slot, e: &KeyEntry) -> Row {
        let c = &self.conns[slot];
        let up = self.now.saturating_duration_since(c.registered_at());
        // Rounded to whole seconds, halves up, as derper shows it.
        let connected = ((up.as_nanos() + 500_000_000) / 1_000_000_000 * 1_000_000_000) as i64;
        let t = *c.tally();
        Row {
            conn_num: c.num(),
            key: c.key(),
            remote: canonical_remote(c.peer()),
            connected_at: self.wall_ns(c.registered_at()),
            connected,
            active: e.active == Some(slot),
            dup: e.conns.len() > 1,
            disabled: e.conns.len() > 1 && e.active.is_none(),
            home: c.is_preferred(),
            mesh_peer: c.is_mesh(),
            not_ideal: c.is_not_ideal(),
            prober: c.is_prober(),
            version: c.version(),
            app_name: c.app_name(),
            rx_pkts: t.rx_pkts,
            rx_bytes: t.rx_bytes,
            tx_pkts: t.tx_pkts,
            tx_bytes: t.tx_bytes,
        }
    }
}
