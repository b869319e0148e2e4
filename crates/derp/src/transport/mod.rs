//! How a connection's bytes are carried under DERP: plain TCP, TLS in
//! userspace ([`rustls`]), TLS 1.3 whose record layer moved
//! to Ferry's own after the handshake ([`records`]), or TLS whose record
//! layer moved into the kernel ([`kernel`]). Both moves leave rustls at a
//! record boundary the same way ([`handoff`]). Which cipher suite a
//! session gets, where the client leaves it free, is the server's choice
//! ([`suites`]).
//!
//! One enum instead of a set of `Option`s, so that a connection is always
//! exactly one of them: a TLS connection starts in [`Transport::Rustls`]
//! and may move to [`Transport::Records`] (during a read, once the
//! handshake is over) or to [`Transport::Kernel`]
//! ([`Transport::move_into_kernel`], when the shard finds it safe: see
//! `shard::handoff`), never back. DERP over WebSocket is not a transport
//! of its own but a framing above any of them ([`websocket`]).
//!
//! The shard drives it with one read per receive and one write per flush:
//! [`Transport::read`] takes the socket's bytes and hands the DERP bytes
//! to a [`Sink`] (the connection's current phase) without copying them
//! out first where that can be avoided (rustls's own buffer, the record
//! just opened, or the socket's bytes themselves), and
//! [`Transport::write`] moves a connection's queued frames into its send
//! buffer ([`ServerConn::poll_output`], where plain TCP and kernel TLS
//! take a data queue without a copy).
//!
//! This module knows neither the connection (`conn`) nor the shard that
//! drives it.

pub mod handoff;
pub mod kernel;
pub mod records;
pub mod rustls;
pub mod suites;
pub mod websocket;

use std::io;
use std::ops::ControlFlow;

use ferry_proto::server::ServerConn;

use self::rustls::{Step, UserTls};
use handoff::{HandoffError, Refusal, Refused};
use kernel::{KernelSocket, KernelTls};
use records::{Content, LimitReached, RecordFailure, RecordLayer, PLAINTEXT_BUFFER};

/// A connection's transport.
pub enum Transport {
    /// Plain TCP: HTTP, or DERP on a plain listener.
    Plain,
    /// TLS in userspace.
    Rustls(Box<UserTls>),
    /// TLS whose record layer is in the kernel: the socket carries
    /// plaintext both ways, and only control records (alerts, KeyUpdate)
    /// come up as `ferry_engine::Completion::Record`.
    Kernel(Box<KernelTls>),
    /// TLS 1.3 after the handshake on Ferry's own record layer: two AEAD
    /// keys and their counters, no rustls.
    Records(Box<RecordLayer>),
}

/// Where a transport's plaintext goes: the connection's current phase.
pub trait Sink {
    /// Whether plaintext is taken now (input is not paused and the
    /// connection not closed).
    fn open(&self) -> bool;
    /// Takes `plain`, all of it (what the protocol does not consume yet it
    /// keeps); `Break` ends the read.
    fn deliver(&mut self, plain: &[u8]) -> ControlFlow<()>;
}

/// How a [`Transport::read`] went.
#[derive(Debug)]
pub struct Read {
    /// Bytes at the end of the input that were not read (the sink stopped
    /// taking plaintext): the caller keeps them for later, unless the
    /// session ended.
    pub unread: usize,
    /// The session moved from rustls to Ferry's record layer.
    pub moved: bool,
    /// What ended the session, if something did.
    pub end: Option<End>,
}

/// What ended a session during a read.
#[derive(Debug)]
pub enum End {
    /// The peer's close_notify: an orderly end.
    Closed,
    /// rustls could not take or give the bytes (nothing is queued to go
    /// out).
    Io(io::Error),
    /// rustls rejected the peer's bytes and queued its alert: that goes
    /// out, nothing else, then the connection closes.
    Rustls(::rustls::Error),
    /// Ferry's record layer rejected a record; the alert it calls for
    /// ([`RecordFailure::alert`]) is queued, to go out alone before the
    /// connection closes.
    Records(RecordFailure),
    /// The move to Ferry's record layer failed after rustls was consumed.
    Handoff(HandoffError),
}

/// What [`Transport::move_into_kernel`] did.
#[derive(Debug)]
pub enum KernelMove {
    /// The session is in the kernel.
    Moved,
    /// Not a session in rustls (any more).
    NotRustls,
    /// The session stays in rustls, for good (no more moves are tried).
    Refused(Refusal),
    /// rustls was consumed and the kernel did not take the keys: the
    /// connection must close.
    Failed(HandoffError),
}

impl Transport {
    /// A session in rustls; `ktls` keeps the record boundary so that it
    /// may move into the kernel later, `own_records` so that it moves to
    /// Ferry's record layer once the handshake is over.
    pub fn rustls(conn: ::rustls::ServerConnection, ktls: bool, own_records: bool) -> Transport {
        Transport::Rustls(Box::new(UserTls::new(
            conn,
            ktls || own_records,
            own_records,
        )))
    }

    /// Whether bytes are TLS-protected (in userspace or in the kernel).
    pub fn is_tls(&self) -> bool {
        !matches!(self, Transport::Plain)
    }

    /// The session in rustls, if that is what this is.
    pub fn user(&mut self) -> Option<&mut UserTls> {
        match self {
            Transport::Rustls(t) => Some(t),
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

    /// Ferry's record layer, if that is what this is.
    pub fn records(&mut self) -> Option<&mut RecordLayer> {
        match self {
            Transport::Records(r) => Some(r),
            _ => None,
        }
    }

    /// Whether the transport has bytes of its own to write (a handshake
    /// message, an alert, session tickets written before a move to
    /// Ferry's record layer).
    pub fn wants_write(&self) -> bool {
        match self {
            Transport::Rustls(t) => t.conn.wants_write(),
            Transport::Records(r) => r.has_pending(),
            _ => false,
        }
    }

    /// Whether the session is in rustls, its handshake over, and may still
    /// move into the kernel.
    pub fn may_hand_off(&self) -> bool {
        matches!(self, Transport::Rustls(t) if t.may_hand_off())
    }

    /// Reads `wire`, the socket's bytes, and hands the DERP bytes in them
    /// to `sink`: as they are (plain TCP, kernel TLS), where rustls keeps
    /// them, or opened into `plain` (Ferry's record layer: a record that
    /// lies whole in `wire` is opened straight into it; grown to
    /// [`PLAINTEXT_BUFFER`] once). A session that moves from rustls to
    /// Ferry's record layer does so here, and the read goes on on the new
    /// layer. An empty `wire` hands on what rustls still holds.
    pub fn read(&mut self, wire: &[u8], plain: &mut Vec<u8>, sink: &mut impl Sink) -> Read {
        let mut input = wire;
        let mut moved = false;
        let mut may_move = true;
        loop {
            let end = match self {
                Transport::Plain | Transport::Kernel(_) => {
                    if !input.is_empty() {
                        // The phase keeps whatever it does not consume.
                        let _ = sink.deliver(input);
                        input = &[];
                    }
                    None
                }
                Transport::Rustls(tls) => match tls.read(&mut input, sink, may_move) {
                    Step::Done => None,
                    Step::End(end) => Some(end),
                    Step::Move => match self.move_to_records() {
                        Ok(true) => {
                            moved = true;
                            continue;
                        }
                        Ok(false) => {
                            // Refused for now: read on in rustls first.
                            may_move = false;
                            continue;
                        }
                        Err(e) => Some(End::Handoff(e)),
                    },
                },
                Transport::Records(records) => read_records(records, &mut input, plain, sink),
            };
            return Read {
                unread: input.len(),
                moved,
                end,
            };
        }
    }

    /// Moves a finished TLS 1.3 session from rustls to Ferry's record
    /// layer (the bytes given to rustls end on a record boundary, and it
    /// holds no plaintext). `Ok(true)`: moved; `Ok(false)`: it stays in
    /// rustls (for good on TLS 1.2; a transient refusal is tried again on
    /// later input); `Err`: rustls was consumed and the session is lost
    /// (the transport is left plain).
    fn move_to_records(&mut self) -> Result<bool, HandoffError> {
        let Transport::Rustls(tls) = std::mem::replace(self, Transport::Plain) else {
            unreachable!("only a session in rustls moves to Ferry's record layer");
        };
        let UserTls { conn, boundary, .. } = *tls;
        match RecordLayer::start(conn) {
            Ok(layer) => {
                *self = Transport::Records(Box::new(layer));
                Ok(true)
            }
            Err(Refused::Usable { conn, reason }) => {
                // TLS 1.2 (not transient): rustls for the whole connection.
                let own_records = reason.is_transient();
                *self = Transport::Rustls(Box::new(UserTls {
                    conn,
                    boundary: boundary.filter(|_| own_records),
                    own_records,
                    failed: false,
                }));
                Ok(false)
            }
            Err(Refused::Dead(e)) => Err(e),
        }
    }

    /// Moves a session in rustls into the kernel on `sock` (see
    /// [`kernel`] for when that is safe). On a refusal the session stays
    /// in rustls and no more moves are tried; after a failure the
    /// transport is left plain and the connection must close.
    pub fn move_into_kernel<S: KernelSocket>(&mut self, sock: S) -> KernelMove {
        let Transport::Rustls(tls) = std::mem::replace(self, Transport::Plain) else {
            return KernelMove::NotRustls;
        };
        let UserTls { conn, .. } = *tls;
        match KernelTls::start(conn, sock) {
            Ok(session) => {
                *self = Transport::Kernel(Box::new(session));
                KernelMove::Moved
            }
            Err(Refused::Usable { conn, reason }) => {
                *self = Transport::Rustls(Box::new(UserTls::new(conn, false, false)));
                KernelMove::Refused(reason)
            }
            Err(Refused::Dead(e)) => KernelMove::Failed(e),
        }
    }

    /// Moves `derp`'s queued frames into `out`, the send buffer, with
    /// whatever the transport has to write of its own: as they are (plain
    /// TCP and kernel TLS; with only data queued and `out` empty, the
    /// queue itself becomes the send buffer, no copy), sealed into records
    /// in `out` (Ferry's record layer: encrypted from the queue in one
    /// pass), or through rustls.
    /// `Err`: the transmit key is worn and cannot be renewed; what was
    /// sealed ends with a close_notify, and nothing more is sent.
    pub fn write(&mut self, derp: &mut ServerConn, out: &mut Vec<u8>) -> Result<(), LimitReached> {
        match self {
            Transport::Plain | Transport::Kernel(_) => {
                derp.poll_output(out);
                Ok(())
            }
            Transport::Records(records) => {
                let mut sealed = Ok(());
                derp.poll_output_with(|parts| sealed = records.seal(out, parts));
                sealed
            }
            Transport::Rustls(tls) => {
                tls.write(derp, out);
                Ok(())
            }
        }
    }
}

/// Opens records from `input` into `plain` and hands their data to `sink`
/// while it takes them.
fn read_records(
    records: &mut RecordLayer,
    input: &mut &[u8],
    plain: &mut Vec<u8>,
    sink: &mut impl Sink,
) -> Option<End> {
    if plain.len() < PLAINTEXT_BUFFER {
        plain.resize(PLAINTEXT_BUFFER, 0);
    }
    loop {
        if !sink.open() {
            return None;
        }
        match records.read(input, plain) {
            Ok(Some(Content::Data(data))) => {
                // The phase keeps whatever it does not consume, so the
                // record is used either way.
                let _ = sink.deliver(data);
            }
            Ok(Some(Content::Closed)) => return Some(End::Closed),
            Ok(None) => return None,
            Err(e) => {
                if let Some(alert) = e.alert() {
                    records.queue_alert(alert);
                }
                return Some(End::Records(e));
            }
        }
    }
}
