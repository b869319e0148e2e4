//! `/debug/clients/`, derper v1.104's page of connected clients: so far
//! its query language ([`query`]: filter, sort, page size and cursor) and
//! the choice of one page with a bounded heap ([`page`]); the relay does
//! not serve the page yet.

pub mod page;
pub mod query;
