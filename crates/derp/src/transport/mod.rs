//! How a connection's bytes are carried under DERP: plain TCP, TLS in
//! userspace (rustls), TLS 1.3 whose record layer moved to Ferry's own
//! after the handshake ([`records`]), or TLS whose record layer moved into
//! the kernel ([`kernel`]). Both moves leave rustls at a record boundary
//! the same way ([`handoff`]).
//!
//! One enum instead of a set of `Option`s, so that a connection is always
//! exactly one of them: a TLS connection starts in [`Transport::Tls`] and
//! may move to [`Transport::Kernel`] (see `shard::handoff`) or to
//! [`Transport::Records`] (see `shard::input`), never back. DERP over
//! WebSocket is not a transport of its own but a layer above any of them
//! (`conn::WsLink`, `shard::websocket`).
//!
//! This module knows neither the connection (`conn`) nor the shard that
//! drives it.

pub mod handoff;
pub mod kernel;
pub mod records;

use handoff::RecordBoundary;
use kernel::KernelTls;
use records::RecordLayer;

/// A connection's transport.
pub enum Transport {
    /// Plain TCP: HTTP, or DERP on a plain listener.
    Plain,
    /// TLS in userspace.
    Tls(Box<UserTls>),
    /// TLS whose record layer is in the kernel: the socket carries
    /// plaintext both ways, and only control records (alerts, KeyUpdate)
    /// come up as `ferry_engine::Completion::Record`.
    Kernel(Box<KernelTls>),
    /// TLS 1.3 after the handshake on Ferry's own record layer: two AEAD
    /// keys and their counters, no rustls.
    Records(Box<RecordLayer>),
}

/// rustls in userspace.
pub struct UserTls {
    /// The session.
    pub conn: rustls::ServerConnection,
    /// While a move into the kernel is still possible: where the TLS
    /// records read so far end (a move is only safe at a record boundary).
    pub boundary: Option<RecordBoundary>,
    /// The session moves to Ferry's own record layer after the handshake
    /// (rustls is then fed whole records only, so that the move happens
    /// on a record boundary, tracked by `boundary`).
    pub own_records: bool,
    /// rustls ended the session with an error: only its own bytes (the
    /// alert it queued) go out before the connection closes, no frames.
    pub failed: bool,
}

impl Transport {
    /// A userspace TLS session; `ktls` keeps the record boundary so that
    /// it may move into the kernel later, `own_records` so that it moves
    /// to Ferry's record layer once the handshake is over.
    pub fn tls(conn: rustls::ServerConnection, ktls: bool, own_records: bool) -> Transport {
        Transport::Tls(Box::new(UserTls {
            conn,
            boundary: (ktls || own_records).then(RecordBoundary::new),
            own_records,
            failed: false,
        }))
    }

    /// Whether bytes are TLS-protected (in userspace or in the kernel).
    pub fn is_tls(&self) -> bool {
        !matches!(self, Transport::Plain)
    }

    /// The userspace session, if that is what this is.
    pub fn user(&mut self) -> Option<&mut UserTls> {
        match self {
            Transport::Tls(t) => Some(t),
            _ => None,
        }
    }

    /// The kernel session, if that is what this is.
    pub fn kernel(&mut self) -> Option<&mut KernelTls> {
        match self {
            Transport::Kernel(k) => Some(k),
            _ => None,
        }
    }

    /// Whether the record layer is in the kernel.
    pub fn is_kernel(&self) -> bool {
        matches!(self, Transport::Kernel(_))
    }

    /// Whether the record layer is Ferry's own.
    pub fn is_records(&self) -> bool {
        matches!(self, Transport::Records(_))
    }

    /// Takes the userspace session out (leaving [`Transport::Plain`]) so
    /// that it can be driven while the connection is borrowed elsewhere;
    /// [`Transport::put_user`] puts it back.
    pub fn take_user(&mut self) -> Option<Box<UserTls>> {
        match std::mem::replace(self, Transport::Plain) {
            Transport::Tls(t) => Some(t),
            other => {
                *self = other;
                None
            }
        }
    }

    /// Puts back what [`Transport::take_user`] took.
    pub fn put_user(&mut self, tls: Box<UserTls>) {
        *self = Transport::Tls(tls);
    }

    /// Takes Ferry's record layer out (leaving [`Transport::Plain`]);
    /// [`Transport::put_records`] puts it back.
    pub fn take_records(&mut self) -> Option<Box<RecordLayer>> {
        match std::mem::replace(self, Transport::Plain) {
            Transport::Records(r) => Some(r),
            other => {
                *self = other;
                None
            }
        }
    }

    /// Puts back what [`Transport::take_records`] took.
    pub fn put_records(&mut self, records: Box<RecordLayer>) {
        *self = Transport::Records(records);
    }

    /// Ferry's record layer, if that is what this is.
    pub fn records(&mut self) -> Option<&mut RecordLayer> {
        match self {
            Transport::Records(r) => Some(r),
            _ => None,
        }
    }

    /// Whether the userspace session has bytes of its own to write (a
    /// handshake message, an alert, session tickets written before a move
    /// to Ferry's record layer).
    pub fn wants_write(&self) -> bool {
        match self {
            Transport::Tls(t) => t.conn.wants_write(),
            Transport::Records(r) => r.has_pending(),
            _ => false,
        }
    }
}
