//! The small states a connection passes through: its phase, the PROXY
//! protocol check still due, and its acknowledged-bytes mark while its
//! senders are held.

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Reading the HTTP request head (after TLS, if any).
    Http,
    /// Upgraded; waiting for the clientInfo frame.
    ClientInfo,
    /// clientInfo read; waiting for the admission verdict.
    Admitting,
    /// Handshake done; waiting to move to the shard that owns its key.
    Migrating,
    /// Registered and relaying.
    Active,
    /// A plain HTTP response is being written; the connection then closes.
    Responding,
}

/// What the first bytes of a connection must (not) hold on a listener that
/// speaks the PROXY protocol (`--proxy-protocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyPrelude {
    /// Nothing to check: no PROXY protocol, or checked already.
    Done,
    /// From a trusted proxy: a PROXY header must come first.
    Expect,
    /// From anyone else: the first bytes must not be a PROXY header.
    Refuse,
}

/// A connection's acknowledged-bytes reading in a hold of its senders
/// (see the shard's backpressure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckedMark {
    /// Not read yet in this hold.
    NotRead,
    /// Read, but the back end cannot tell how far the peer has read.
    Unknown,
    /// Read: the socket's acknowledged bytes then.
    Bytes(u64),
}

impl From<Option<u64>> for AckedMark {
    fn from(acked: Option<u64>) -> AckedMark {
        acked.map_or(AckedMark::Unknown, AckedMark::Bytes)
    }
}
