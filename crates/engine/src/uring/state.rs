//! What the io_uring driver knows about each socket and listener, and how
//! the ring's completions change it: operation tags, per-socket receive
//! and send states, closing sockets, and [`State::on_event`], which turns
//! the ring's events into [`Completion`]s.

use std::collections::HashMap;
use std::io;
use std::net::{TcpListener, TcpStream};

use ferry_sys::uring::errno::{
    EAGAIN, EALREADY, ECANCELED, ECONNABORTED, ECONNRESET, EINTR, ENOBUFS, EPERM, EPROTO,
};
use ferry_sys::uring::Event;

use crate::driver::{Completion, Slot};

const KIND_SHIFT: u32 = 56;
const GEN_SHIFT: u32 = 24;
const SLOT_BITS: u32 = 24;
/// Largest slot (and listener index) a tag can carry.
pub(super) const MAX_SLOT: usize = (1 << SLOT_BITS) - 1;

/// What an operation is, in the top byte of its tag.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(super) enum Kind {
    Recv = 1,
    Send = 2,
    /// Cancels a receive (pause, detach); nothing to do on completion.
    RecvCancel = 3,
    /// Cancels everything on a closing socket; counts as one of its ops.
    CloseCancel = 4,
    Accept = 5,
    AcceptBackoff = 6,
    /// Cancels a listener's accept ([`crate::Driver::stop_accepting`]).
    AcceptCancel = 7,
}

pub(super) fn tag(kind: Kind, slot: usize, gen: u32) -> u64 {
    (kind as u64) << KIND_SHIFT | u64::from(gen) << GEN_SHIFT | slot as u64
}

fn untag(tag: u64) -> (u8, usize, u32) {
    (
        (tag >> KIND_SHIFT) as u8,
        (tag & MAX_SLOT as u64) as usize,
        (tag >> GEN_SHIFT) as u32,
    )
}

/// Identifies one attachment of a socket: slot and generation.
pub(super) fn key(slot: usize, gen: u32) -> u64 {
    u64::from(gen) << GEN_SHIFT | slot as u64
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum RecvState {
    /// No receive in the ring.
    Idle,
    /// To be armed when the turn starts, if still wanted then (so that a
    /// socket attached and paused in the same turn is never read).
    Queued,
    /// A multishot receive is armed.
    Armed,
    /// Its cancellation is queued; the final completion is still to come.
    Cancelling,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum SendState {
    Idle,
    /// The buffer is in the ring.
    InRing,
    /// The completion is already decided and waits in `local`.
    Local,
}

pub(super) struct Sock {
    pub(super) stream: TcpStream,
    pub(super) gen: u32,
    pub(super) recv: RecvState,
    /// The handler wants bytes (not paused).
    pub(super) want_recv: bool,
    /// End of stream or an error was reported; nothing more to read.
    pub(super) recv_done: bool,
    pub(super) send: SendState,
}

/// A closed socket whose operations have not all completed yet.
pub(super) struct Closing {
    /// Held open until `ops` reaches zero; dropping it closes the socket.
    pub(super) stream: TcpStream,
    pub(super) ops: u32,
}

/// A completion decided outside the ring (a send that could not be queued).
pub(super) enum Local {
    Sent {
        slot: Slot,
        gen: u32,
        buf: Vec<u8>,
        result: io::Result<()>,
    },
    RecvClosed {
        slot: Slot,
        gen: u32,
        error: io::Error,
    },
}

/// A listener and the state of its accept.
pub(super) struct Listen {
    /// `None` once stopped and its accept ended: closed.
    pub(super) socket: Option<TcpListener>,
    /// A multishot accept is in the ring (its final completion is still
    /// to come).
    pub(super) armed: bool,
    /// [`crate::Driver::stop_accepting`] was called: not re-armed, closed when
    /// the accept in the ring ends.
    pub(super) stopping: bool,
}

impl Listen {
    /// Whether an accept should be (re-)armed now; closes a stopped
    /// listener whose accept is out of the ring.
    pub(super) fn wants_accept(&mut self) -> bool {
        if self.stopping {
            if !self.armed {
                self.socket = None;
            }
            return false;
        }
        !self.armed && self.socket.is_some()
    }
}

/// Everything but the ring, so that completions can be handled while the
/// ring lends out a buffer.
pub(super) struct State {
    pub(super) socks: Vec<Option<Sock>>,
    pub(super) closing: HashMap<u64, Closing>,
    pub(super) listeners: Vec<Listen>,
    pub(super) next_gen: u32,
    pub(super) local: Vec<Local>,
    /// Receives to arm when the next turn starts.
    pub(super) to_arm: Vec<(Slot, u32)>,
    /// Receives whose cancellation found them running; cancelled again.
    pub(super) recancel: Vec<(Slot, u32)>,
    /// Found while reading completions, done right after.
    pub(super) resend: Vec<(Slot, u32, Vec<u8>, usize)>,
    pub(super) accept_now: Vec<usize>,
    pub(super) accept_later: Vec<usize>,
    /// Accept cancellations that found the accept running; sent again.
    pub(super) accept_recancel: Vec<usize>,
    /// Receives that ran out of buffers during this turn.
    pub(super) dry_now: u32,
    pub(super) enobufs: u64,
    pub(super) growths: u64,
}

impl State {
    pub(super) fn is_live(&self, slot: Slot, gen: u32) -> bool {
        matches!(self.socks.get(slot), Some(Some(s)) if s.gen == gen)
    }

    /// Queues the receive of a live, idle socket that wants bytes.
    pub(super) fn queue_arm(&mut self, slot: Slot) {
        let Some(sock) = self.socks.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if sock.recv == RecvState::Idle && sock.want_recv && !sock.recv_done {
            sock.recv = RecvState::Queued;
            self.to_arm.push((slot, sock.gen));
        }
    }

    /// One operation of a closing socket ended; the last one closes it.
    fn closing_op_done(&mut self, slot: Slot, gen: u32) {
        let k = key(slot, gen);
        if let Some(c) = self.closing.get_mut(&k) {
            c.ops -= 1;
            if c.ops == 0 {
                self.closing.remove(&k);
            }
        }
    }

    pub(super) fn on_event(&mut self, ev: Event<'_>, on: &mut dyn FnMut(Completion<'_>)) {
        match ev {
            Event::Woken => on(Completion::Woken),
            Event::Completed {
                tag,
                result,
                more,
                data,
            } => {
                let (kind, slot, gen) = untag(tag);
                if kind == Kind::Recv as u8 {
                    self.on_recv(slot, gen, result, more, data, on);
                } else if kind == Kind::RecvCancel as u8 {
                    // Found the receive mid-flight: it keeps going, so the
                    // pause would not hold. Ask again.
                    if result == -EALREADY
                        && matches!(self.socks.get(slot), Some(Some(s)) if s.gen == gen && s.recv == RecvState::Cancelling)
                    {
                        self.recancel.push((slot, gen));
                    }
                } else if kind == Kind::CloseCancel as u8 {
                    if result == -EALREADY {
                        // An operation could not be stopped mid-flight:
                        // ending the connection ends it.
                        if let Some(c) = self.closing.get(&key(slot, gen)) {
                            let _ = c.stream.shutdown(std::net::Shutdown::Both);
                        }
                    }
                    self.closing_op_done(slot, gen);
                } else if kind == Kind::AcceptBackoff as u8 {
                    self.accept_now.push(slot);
                } else if kind == Kind::AcceptCancel as u8 && result == -EALREADY {
                    // Found the accept mid-flight: ask again.
                    self.accept_recancel.push(slot);
                }
            }
            Event::Accepted { tag, result, more } => {
                let (_, idx, _) = untag(tag);
                if !more {
                    self.listeners[idx].armed = false;
                }
                let errno = match result {
                    Ok(fd) => {
                        let stream = TcpStream::from(fd);
                        // A connection reset before we asked has no peer
                        // address any more; dropping it closes it.
                        if let Ok(peer) = stream.peer_addr() {
                            on(Completion::Accepted {
                                listener: idx,
                                stream,
                                peer,
                            });
                        }
                        None
                    }
                    Err(errno) => Some(errno),
                };
                if !more && self.listeners[idx].stopping {
                    // Stopped: let go of the descriptor now that nothing
                    // in the ring uses it.
                    self.listeners[idx].socket = None;
                } else if !more {
                    match errno {
                        Some(ECANCELED) => {}
                        None
                        | Some(ECONNABORTED | ECONNRESET | EINTR | EAGAIN | EPROTO | EPERM) => {
                            self.accept_now.push(idx)
                        }
                        Some(errno) => {
                            let e = io::Error::from_raw_os_error(errno);
                            tracing::warn!(listener = idx, error = %e, "accept failed; retrying shortly");
                            self.accept_later.push(idx);
                        }
                    }
                }
            }
            Event::Sent {
                tag,
                result,
                buf,
                offset,
            } => {
                let (_, slot, gen) = untag(tag);
                self.on_sent(slot, gen, result, buf, offset, on);
            }
        }
    }

    fn on_recv(
        &mut self,
        slot: Slot,
        gen: u32,
        result: i32,
        more: bool,
        data: &[u8],
        on: &mut dyn FnMut(Completion<'_>),
    ) {
        if !self.is_live(slot, gen) {
            if !more {
                self.closing_op_done(slot, gen);
            }
            return;
        }
        if result > 0 {
            on(Completion::Received { slot, data });
        }
        if more {
            return;
        }
        let sock = self.socks[slot].as_mut().expect("live");
        sock.recv = RecvState::Idle;
        match result {
            r if r > 0 => self.queue_arm(slot),
            0 => {
                if sock.want_recv {
                    sock.recv_done = true;
                    on(Completion::RecvClosed { slot, error: None });
                }
                // Paused: the receive armed on resume reads the end again.
            }
            r => match -r {
                ENOBUFS => {
                    self.enobufs += 1;
                    self.dry_now += 1;
                    self.queue_arm(slot);
                }
                ECANCELED | EINTR | EAGAIN => self.queue_arm(slot),
                errno => {
                    sock.recv_done = true;
                    on(Completion::RecvClosed {
                        slot,
                        error: Some(io::Error::from_raw_os_error(errno)),
                    });
                }
            },
        }
    }

    fn on_sent(
        &mut self,
        slot: Slot,
        gen: u32,
        result: i32,
        mut buf: Vec<u8>,
        offset: usize,
        on: &mut dyn FnMut(Completion<'_>),
    ) {
        if !self.is_live(slot, gen) {
            self.closing_op_done(slot, gen);
            return;
        }
        let written = offset + usize::try_from(result).unwrap_or(0);
        // The rest of a short write, or a retry after an interruption.
        let again = (result > 0 && written < buf.len()) || result == -EINTR || result == -EAGAIN;
        let outcome = if again {
            None
        } else if result < 0 {
            Some(Err(io::Error::from_raw_os_error(-result)))
        } else if written < buf.len() {
            Some(Err(io::ErrorKind::WriteZero.into()))
        } else {
            Some(Ok(()))
        };
        match outcome {
            None => self.resend.push((slot, gen, buf, written)),
            Some(result) => {
                self.socks[slot].as_mut().expect("live").send = SendState::Idle;
                buf.clear();
                on(Completion::Sent { slot, buf, result });
            }
        }
    }
}
