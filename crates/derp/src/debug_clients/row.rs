//! One connection as `/debug/clients/` shows it: a snapshot a shard takes
//! of its own connection, owned, so it can travel to the shard that
//! answers the request.

use std::net::SocketAddr;

use ferry_proto::app_name::AppName;
use ferry_proto::key::NodePublic;

use super::page::SortValue;
use super::query::SortBy;

/// A connection's snapshot (derper's fields; see `docs/operating.md` for
/// the ones Ferry can only approximate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The server's number for it, in upgrade order.
    pub conn_num: i64,
    /// Its key.
    pub key: NodePublic,
    /// Its remote address (IPv4-mapped addresses as IPv4).
    pub remote: SocketAddr,
    /// When it registered, Unix nanoseconds.
    pub connected_at: i128,
    /// How long it has been registered, nanoseconds rounded to seconds.
    pub connected: i64,
    /// It receives the packets for its key.
    pub active: bool,
    /// Its key has more than one connection.
    pub dup: bool,
    /// Its key has several connections and none receives (they fight).
    pub disabled: bool,
    /// The client calls this server home.
    pub home: bool,
    /// A mesh peer.
    pub mesh_peer: bool,
    /// Its upgrade named another node as ideal.
    pub not_ideal: bool,
    /// It said it is a prober.
    pub prober: bool,
    /// Its clientInfo protocol version.
    pub version: u32,
    /// Its clientInfo `AppName`.
    pub app_name: Option<AppName>,
    /// Data packets received from it.
    pub rx_pkts: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Data packets queued to it.
    pub tx_pkts: u64,
    /// Their bytes.
    pub tx_bytes: u64,
}

impl Row {
    /// Its value under `sort`, and its connection number (the tie-break).
    pub fn sort_value(&self, sort: SortBy) -> (SortValue, i64) {
        let v = match sort {
            SortBy::Key => SortValue::key(&self.key),
            SortBy::Ip => SortValue::Addr(self.remote),
            SortBy::Conn => SortValue::Conn,
            SortBy::Connected => SortValue::Time(self.connected_at),
            SortBy::RxBytes => SortValue::Counter(self.rx_bytes),
            SortBy::TxBytes => SortValue::Counter(self.tx_bytes),
            SortBy::RxPkts => SortValue::Counter(self.rx_pkts),
            SortBy::TxPkts => SortValue::Counter(self.tx_pkts),
        };
        (v, self.conn_num)
    }

    /// Its app name, "" for none.
    pub fn app(&self) -> &str {
        self.app_name.as_ref().map_or("", |n| n.as_str())
    }
}

/// A remote address as the page shows and compares it: IPv4-mapped IPv6
/// addresses (a dual-stack listener's IPv4 clients) as IPv4.
pub fn canonical_remote(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// What one shard found for a query: its page (at most the limit, in
/// walk order) and its counts.
#[derive(Debug, Default)]
pub struct Part {
    /// The shard's best rows past the cursor.
    pub rows: Vec<Row>,
    /// Its connections matching the filter (cursor ignored).
    pub conns: usize,
    /// Its keys with at least one matching connection.
    pub keys: usize,
    /// Its matching connections past the cursor not in `rows`.
    pub remaining: usize,
}
