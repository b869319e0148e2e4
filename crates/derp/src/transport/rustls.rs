//! rustls in userspace: every TLS connection's handshake, and the whole
//! connection where the record layer stays with rustls (TLS 1.2,
//! `--tls-records rustls`, a kernel hand-off not made).
//!
//! - **Receive**: the socket's bytes go to rustls, and its plaintext is
//!   handed on where rustls keeps it (one chunk per record) instead of
//!   being copied out first. Before a move to Ferry's record layer, rustls
//!   is fed whole records only (a header, then its body), so that the move
//!   finds it at a record boundary.
//! - **Send**: one plaintext write per flush, cut into full records (many
//!   small frames share one; a record that spans two of the queues is
//!   handed to rustls as two slices, not gathered first). Each record is
//!   copied into the send buffer right after rustls encrypted it, while it
//!   is still in cache, and rustls reuses its memory for the next one.

use std::io::{self, BufRead, IoSlice, Write};
use std::ops::ControlFlow;

use ferry_proto::server::ServerConn;
use ferry_proto::tls_record::HEADER_LEN;
use rustls::ServerConnection;

use super::handoff::RecordBoundary;
use super::{End, Sink};

/// Plaintext bytes in a full TLS record (the protocol's limit).
const RECORD_PLAINTEXT: usize = 16 * 1024;

/// A TLS session in rustls.
pub struct UserTls {
    /// The session.
    pub conn: ServerConnection,
    /// While a move out of rustls is still possible: where the TLS records
    /// read so far end (a move is only safe at a record boundary).
    pub boundary: Option<RecordBoundary>,
    /// The session moves to Ferry's own record layer after the handshake
    /// (rustls is then fed whole records only, so that the move happens on
    /// a record boundary, tracked by `boundary`).
    pub own_records: bool,
    /// rustls ended the session with an error: only its own bytes (the
    /// alert it queued) go out before the connection closes, no frames.
    pub failed: bool,
}

/// Where [`UserTls::read`] stopped.
pub(super) enum Step {
    /// The input is used up, or the sink stopped taking plaintext.
    Done,
    /// The handshake is over at a record boundary, on a session that moves
    /// to Ferry's record layer: move it, then read on.
    Move,
    /// The session ended.
    End(End),
}

impl UserTls {
    /// A session; `boundary` keeps track of record boundaries so that it
    /// can leave rustls later (into the kernel, or to Ferry's record layer
    /// when `own_records`).
    pub fn new(conn: ServerConnection, boundary: bool, own_records: bool) -> UserTls {
        UserTls {
            conn,
            boundary: boundary.then(RecordBoundary::new),
            own_records,
            failed: false,
        }
    }

    /// Whether the handshake is over and the session may still move into
    /// the kernel.
    pub fn may_hand_off(&self) -> bool {
        !self.conn.is_handshaking() && self.boundary.is_some() && !self.own_records
    }

    /// Feeds `input` to rustls (advancing it past what rustls took) and
    /// hands the plaintext to `sink`, until the input is used up, the sink
    /// stops, the session ends or (with `may_move`) the session is ready
    /// to move to Ferry's record layer.
    pub(super) fn read(
        &mut self,
        input: &mut &[u8],
        sink: &mut impl Sink,
        mut may_move: bool,
    ) -> Step {
        loop {
            match self.drain(sink) {
                ControlFlow::Continue(()) => {}
                ControlFlow::Break(None) => return Step::Done,
                ControlFlow::Break(Some(end)) => return Step::End(end),
            }
            if may_move
                && self.own_records
                && !self.conn.is_handshaking()
                && self.boundary.as_ref().is_some_and(|b| b.at_boundary())
            {
                return Step::Move;
            }
            may_move = true;
            if input.is_empty() {
                return Step::Done;
            }
            let before = *input;
            // Before a move to Ferry's record layer, rustls gets whole
            // records only, so that the move finds it at a record boundary.
            let mut chunk = match self.boundary.as_ref().filter(|_| self.own_records) {
                Some(b) => {
                    let upto = match b.bytes_to_next() {
                        0 => HEADER_LEN,
                        n => n,
                    };
                    &before[..upto.min(before.len())]
                }
                None => before,
            };
            match self.conn.read_tls(&mut chunk) {
                Ok(n) => {
                    *input = &before[n..];
                    if let Some(b) = self.boundary.as_mut() {
                        b.feed(&before[..n]);
                    }
                }
                Err(e) => return Step::End(End::Io(e)),
            }
            if let Err(e) = self.conn.process_new_packets() {
                // rustls queued its alert: that goes out, then the end.
                self.failed = true;
                return Step::End(End::Rustls(e));
            }
        }
    }

    /// Hands the plaintext rustls holds to `sink`, parsed where rustls
    /// keeps it. `Continue`: rustls holds no more; `Break(None)`: the sink
    /// stopped taking it; `Break(Some(end))`: the session ended.
    fn drain(&mut self, sink: &mut impl Sink) -> ControlFlow<Option<End>> {
        loop {
            if !sink.open() {
                return ControlFlow::Break(None);
            }
            match self.conn.reader().into_first_chunk() {
                // close_notify: an orderly end.
                Ok([]) => return ControlFlow::Break(Some(End::Closed)),
                Ok(chunk) => {
                    let n = chunk.len();
                    // The sink keeps whatever the protocol does not consume
                    // (partial frame, stash), so the whole chunk is used
                    // either way.
                    let flow = sink.deliver(chunk);
                    self.conn.reader().consume(n);
                    if flow.is_break() {
                        return ControlFlow::Break(None);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return ControlFlow::Continue(()),
                Err(e) => return ControlFlow::Break(Some(End::Io(e))),
            }
        }
    }

    /// Moves the queued frames through rustls into `out` (none while the
    /// handshake runs or after rustls failed), then whatever rustls has to
    /// say of its own (handshake messages, an alert).
    pub(super) fn write(&mut self, derp: &mut ServerConn, out: &mut Vec<u8>) {
        if !self.failed && !self.conn.is_handshaking() {
            let tls = &mut self.conn;
            derp.poll_output_with(|parts| write_records(tls, parts, out));
        }
        flush(&mut self.conn, out);
    }
}

/// Writes `parts` (in order) to rustls in full records, each encrypted
/// into `out` before the next is written.
fn write_records(tls: &mut ServerConnection, parts: [&[u8]; 3], out: &mut Vec<u8>) {
    let mut record: [IoSlice<'_>; 3] = [IoSlice::new(&[]); 3];
    let mut n = 0;
    let mut room = RECORD_PLAINTEXT;
    for part in parts {
        let mut part = part;
        while !part.is_empty() {
            let take = part.len().min(room);
            record[n] = IoSlice::new(&part[..take]);
            n += 1;
            room -= take;
            part = &part[take..];
            if room == 0 {
                seal(tls, &record[..n], out);
                n = 0;
                room = RECORD_PLAINTEXT;
            }
        }
    }
    if n > 0 {
        seal(tls, &record[..n], out);
    }
}

/// One record's plaintext (one slice, or two or three that rustls reads in
/// turn) into rustls, and the record out into `out`.
fn seal(tls: &mut ServerConnection, record: &[IoSlice<'_>], out: &mut Vec<u8>) {
    // Without a buffer limit rustls takes everything.
    let _ = match record {
        [one] => tls.writer().write(one),
        more => tls.writer().write_vectored(more),
    };
    flush(tls, out);
}

/// Appends the TLS bytes rustls holds to `out`.
fn flush(tls: &mut ServerConnection, out: &mut Vec<u8>) {
    while tls.wants_write() {
        if tls.write_tls(out).is_err() {
            break;
        }
    }
}
