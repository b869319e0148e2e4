//! The ceiling: the least a DERP relay can do on this machine.
//!
//! A single thread with one mio loop. It speaks just enough of the protocol
//! for the same load generator to drive it — the `101` upgrade, `serverKey`,
//! open `clientInfo`, seal `serverInfo` — and then does nothing but turn
//! each `sendPacket` into a `recvPacket` for the destination: the two frames
//! have the same length, so forwarding is a copy of the frame into the
//! destination's output buffer with the type byte and the 32-byte key
//! rewritten. No TLS, no metrics, no per-client queues beyond one output
//! buffer per socket (capped; a sender whose destination is full stops being
//! read until it drains, which is TCP back-pressure end to end), no
//! keepalives, no peerGone, no pings. Outputs are flushed once per loop
//! turn, one `write` per socket: the same syscall pattern a relay uses.
//!
//! Whatever a real relay adds costs something; the distance between it and
//! this loop is what that costs.

use ferry_proto::frame::{self, FrameType, HEADER_LEN, KEY_LEN, MAX_PACKET_SIZE};
use ferry_proto::handshake::{self, ServerInfo};
use ferry_proto::http;
use ferry_proto::key::NodePrivate;
use ferry_proto::nacl;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const LISTENER: Token = Token(usize::MAX);
/// Input buffer per connection: larger than any frame, so a whole frame
/// always fits after compaction.
const IN_CAP: usize = 256 * 1024;
/// Bytes read from one socket per event before others get a turn.
const READ_BUDGET: usize = 1 << 20;
/// Largest frame accepted from a client (a full sendPacket).
const MAX_FRAME: usize = KEY_LEN + MAX_PACKET_SIZE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Head,
    ClientInfo,
    Ready,
}

struct Conn {
    sock: TcpStream,
    stage: Stage,
    inbuf: Box<[u8]>,
    start: usize,
    filled: usize,
    out: Vec<u8>,
    out_pos: usize,
    key: [u8; 32],
    /// Not read while a destination it feeds is full.
    paused: bool,
    /// Connections paused on this one's output.
    waiters: Vec<usize>,
    dirty: bool,
}

impl Conn {
    fn pending(&self) -> usize {
        self.out.len() - self.out_pos
    }
}

/// The ceiling forwarder. See the module docs.
pub struct CeilingServer {
    listener: TcpListener,
    poll: Poll,
    key: NodePrivate,
    out_cap: usize,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    keys: HashMap<[u8; 32], usize>,
    runnable: Vec<usize>,
    dirty: Vec<usize>,
}

impl CeilingServer {
    /// Listens on `addr`. `out_cap` bounds each connection's output buffer.
    pub fn bind(addr: SocketAddr, out_cap: usize) -> io::Result<Self> {
        let mut listener = TcpListener::bind(addr)?;
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(CeilingServer {
            listener,
            poll,
            key: NodePrivate::generate(),
            out_cap: out_cap.max(64 * 1024),
            conns: Vec::new(),
            free: Vec::new(),
            keys: HashMap::new(),
            runnable: Vec::new(),
            dirty: Vec::new(),
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` is set (checked at least every 100 ms).
    pub fn run(mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut todo: Vec<(Token, bool, bool)> = Vec::with_capacity(1024);
        let mut freed: Vec<usize> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            self.free.append(&mut freed);
            let timeout = if self.runnable.is_empty() {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            };
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            todo.clear();
            todo.extend(events.iter().map(|e| {
                (
                    e.token(),
                    e.is_readable() || e.is_read_closed() || e.is_error(),
                    e.is_writable(),
                )
            }));
            for &(token, readable, writable) in &todo {
                if token == LISTENER {
                    self.accept_all();
                    continue;
                }
                let id = token.0;
                if writable {
                    self.mark_dirty(id);
                }
                if readable && !self.drive(id) {
                    self.close(id, &mut freed);
                }
            }
            let runnable = std::mem::take(&mut self.runnable);
            for id in runnable {
                if self.conns.get(id).is_some_and(|c| c.is_some()) && !self.drive(id) {
                    self.close(id, &mut freed);
                }
            }
            self.flush_dirty(&mut freed);
        }
        Ok(())
    }

    fn accept_all(&mut self) {
        for _ in 0..1024 {
            match self.listener.accept() {
                Ok((mut sock, _)) => {
                    let _ = sock.set_nodelay(true);
                    let id = self.free.pop().unwrap_or_else(|| {
                        self.conns.push(None);
                        self.conns.len() - 1
                    });
                    if self
                        .poll
                        .registry()
                        .register(
                            &mut sock,
                            Token(id),
                            Interest::READABLE | Interest::WRITABLE,
                        )
                        .is_err()
                    {
                        self.free.push(id);
                        continue;
                    }
                    self.conns[id] = Some(Conn {
                        sock,
                        stage: Stage::Head,
                        inbuf: vec![0; IN_CAP].into_boxed_slice(),
                        start: 0,
                        filled: 0,
                        out: Vec::new(),
                        out_pos: 0,
                        key: [0; 32],
                        paused: false,
                        waiters: Vec::new(),
                        dirty: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => return,
            }
        }
    }

    fn mark_dirty(&mut self, id: usize) {
        if let Some(Some(c)) = self.conns.get_mut(id) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(id);
            }
        }
    }

    /// Processes buffered input and reads more, until the socket is drained,
    /// the budget is spent or a destination is full. `false`: close it.
    fn drive(&mut self, id: usize) -> bool {
        let Some(mut conn) = self.conns[id].take() else {
            return true;
        };
        let alive = self.drive_conn(id, &mut conn);
        self.conns[id] = Some(conn);
        if self.conns[id].as_ref().is_some_and(|c| c.pending() > 0) {
            self.mark_dirty(id);
        }
        alive
    }

    fn drive_conn(&mut self, id: usize, conn: &mut Conn) -> bool {
        if !self.process(id, conn) {
            return false;
        }
        let mut read = 0;
        while !conn.paused {
            if read >= READ_BUDGET {
                self.runnable.push(id);
                break;
            }
            if conn.start > 0 {
                conn.inbuf.copy_within(conn.start..conn.filled, 0);
                conn.filled -= conn.start;
                conn.start = 0;
            }
            let n = match conn.sock.read(&mut conn.inbuf[conn.filled..]) {
                Ok(0) => return false,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            };
            read += n;
            conn.filled += n;
            if !self.process(id, conn) {
                return false;
            }
        }
        true
    }

    /// Handles every complete frame (or the handshake) in the buffer.
    fn process(&mut self, id: usize, conn: &mut Conn) -> bool {
        loop {
            let avail = &conn.inbuf[conn.start..conn.filled];
            match conn.stage {
                Stage::Head => {
                    let Some(end) = avail.windows(4).position(|w| w == b"\r\n\r\n") else {
                        return avail.len() < http::MAX_HEAD;
                    };
                    conn.start += end + 4;
                    let server = self.key.public();
                    conn.out
                        .extend_from_slice(&http::switching_protocols(&server));
                    conn.out
                        .extend_from_slice(&handshake::server_key_frame(&server));
                    conn.stage = Stage::ClientInfo;
                }
                Stage::ClientInfo | Stage::Ready => {
                    let Some((ty, len)) = frame::decode_header(avail) else {
                        return true;
                    };
                    let len = len as usize;
                    let limit = if conn.stage == Stage::ClientInfo {
                        IN_CAP - HEADER_LEN
                    } else {
                        MAX_FRAME
                    };
                    if len > limit {
                        return false;
                    }
                    if avail.len() < HEADER_LEN + len {
                        return true;
                    }
                    if conn.stage == Stage::ClientInfo {
                        if ty != FrameType::ClientInfo as u8 {
                            return false;
                        }
                        let payload = &avail[HEADER_LEN..HEADER_LEN + len];
                        let Ok((client, _info, shared)) =
                            handshake::open_client_info_keyed(&self.key, payload)
                        else {
                            return false;
                        };
                        conn.key = *client.as_bytes();
                        conn.out
                            .extend_from_slice(&handshake::seal_server_info_keyed(
                                &shared,
                                &ServerInfo::current(),
                                &nacl::random_nonce(),
                            ));
                        self.keys.insert(conn.key, id);
                        conn.stage = Stage::Ready;
                    } else if ty == FrameType::SendPacket as u8
                        && len >= KEY_LEN
                        && !self.forward(id, conn, HEADER_LEN + len)
                    {
                        return true; // paused: the frame stays buffered
                    }
                    conn.start += HEADER_LEN + len;
                }
            }
        }
    }

    /// Copies the sendPacket at the front of `conn`'s buffer to its
    /// destination as a recvPacket. `false` if the destination is full
    /// (`conn` is then paused until it drains).
    fn forward(&mut self, id: usize, conn: &mut Conn, total: usize) -> bool {
        let range = conn.start..conn.start + total;
        let key_at = conn.start + HEADER_LEN;
        let dst_key: [u8; 32] = conn.inbuf[key_at..key_at + KEY_LEN]
            .try_into()
            .expect("32 bytes");
        let Some(&dst_id) = self.keys.get(&dst_key) else {
            return true; // unknown destination: dropped
        };
        if dst_id == id {
            // A peer sending to itself (`drive` holds this connection out of
            // the table). When its own output is full the packet is dropped:
            // pausing it on itself would never end.
            if conn.pending() < self.out_cap {
                let Conn {
                    inbuf, out, key, ..
                } = conn;
                let at = out.len();
                out.extend_from_slice(&inbuf[range]);
                rewrite(&mut out[at..], key);
            }
            return true;
        }
        let Some(Some(d)) = self.conns.get_mut(dst_id) else {
            return true;
        };
        if d.pending() >= self.out_cap {
            d.waiters.push(id);
            conn.paused = true;
            return false;
        }
        let at = d.out.len();
        d.out.extend_from_slice(&conn.inbuf[range]);
        rewrite(&mut d.out[at..], &conn.key);
        if !d.dirty {
            d.dirty = true;
            self.dirty.push(dst_id);
        }
        true
    }

    /// Writes every dirty connection's output once; wakes senders paused on
    /// connections that drained.
    fn flush_dirty(&mut self, freed: &mut Vec<usize>) {
        let dirty = std::mem::take(&mut self.dirty);
        for id in dirty {
            let (dead, waiters) = {
                let Some(Some(c)) = self.conns.get_mut(id) else {
                    continue;
                };
                c.dirty = false;
                let dead = write_out(c);
                let drained = c.pending() < self.out_cap / 2;
                (
                    dead,
                    if drained {
                        std::mem::take(&mut c.waiters)
                    } else {
                        Vec::new()
                    },
                )
            };
            if dead {
                self.close(id, freed);
                continue;
            }
            for w in waiters {
                if let Some(Some(wc)) = self.conns.get_mut(w) {
                    if wc.paused {
                        wc.paused = false;
                        self.runnable.push(w);
                    }
                }
            }
        }
    }

    fn close(&mut self, id: usize, freed: &mut Vec<usize>) {
        let Some(mut c) = self.conns.get_mut(id).and_then(|c| c.take()) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut c.sock);
        if c.stage == Stage::Ready && self.keys.get(&c.key) == Some(&id) {
            self.keys.remove(&c.key);
        }
        for w in c.waiters {
            if let Some(Some(wc)) = self.conns.get_mut(w) {
                wc.paused = false;
                self.runnable.push(w);
            }
        }
        freed.push(id);
    }
}

/// Writes as much of `c`'s output as the socket takes; `true` if the
/// connection is dead.
fn write_out(c: &mut Conn) -> bool {
    while c.out_pos < c.out.len() {
        match c.sock.write(&c.out[c.out_pos..]) {
            Ok(0) => return true,
            Ok(n) => c.out_pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
    if c.out_pos == c.out.len() {
        c.out.clear();
        c.out_pos = 0;
    } else if c.out_pos * 2 > c.out.len() {
        c.out.drain(..c.out_pos);
        c.out_pos = 0;
    }
    false
}

/// Turns a copied sendPacket frame into a recvPacket from `src`.
fn rewrite(frame_bytes: &mut [u8], src: &[u8; 32]) {
    frame_bytes[0] = FrameType::RecvPacket as u8;
    frame_bytes[HEADER_LEN..HEADER_LEN + KEY_LEN].copy_from_slice(src);
}
