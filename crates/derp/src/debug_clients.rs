//! `/debug/clients/`, derper v1.104's page of connected clients: its
//! query language ([`query`]: filter, sort, page size and cursor), one
//! connection's snapshot ([`row`]), the choice of one page with a bounded
//! heap ([`page`]) and the answers ([`render`]).
//!
//! Every shard walks its own connections and chooses its page under the
//! query (at most the limit); the shard that got the request then
//! chooses the page among those pages the same way ([`merge`]), so a
//! request costs each shard one walk and never a sort of every
//! connection.

pub mod page;
pub mod query;
pub mod render;
pub mod row;

use query::Query;
use row::Part;

/// One page out of every shard's page (each already past the cursor and
/// at most `q.limit` long): the best `q.limit` rows, and the counts
/// summed.
pub fn merge(q: &Query, parts: impl IntoIterator<Item = Part>) -> Part {
    let mut all = Part::default();
    let mut rows = Vec::new();
    for p in parts {
        all.conns += p.conns;
        all.keys += p.keys;
        all.remaining += p.remaining;
        rows.extend(p.rows);
    }
    let page = page::select(q, rows, |r| r.sort_value(q.sort));
    all.remaining += page.remaining;
    all.rows = page.rows;
    all
}
