//! One client connection as a shard sees it.
//!
//! A connection moves through phases: TLS handshake (if any), the HTTP
//! request, the DERP handshake (waiting for clientInfo), and then either
//! `Active` on the shard that owns its key or `Migrating` to that shard.
//!
//! Output is staged in three plaintext queues that are drained into one
//! send buffer per flush, in this order: control frames (serverKey,
//! serverInfo, pong, peerGone, keepAlive, peerPresent), disco packets, other
//! packets. Control frames are never dropped and are bounded by what can
//! cause them; disco and other packets have their own caps, so bulk data
//! cannot crowd out NAT-traversal traffic.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use ferry_engine::Slot;
use ferry_proto::frame::Deframer;
use ferry_proto::key::NodePublic;

use crate::config::ListenerKind;
use crate::metrics::CloseReason;
use crate::transport::Transport;
use ferry_engine::limit::Bucket;

/// A reference to a connection on some shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnRef {
    /// Shard id.
    pub shard: usize,
    /// Slot on that shard.
    pub slot: Slot,
    /// Generation of the connection in that slot.
    pub gen: u32,
}

/// A reason to hold a connection's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Hold {
    /// A packet waits for room in the ring to another shard.
    Ring = 1,
    /// A destination it feeds is over its queue cap (backpressure).
    Backpressure = 2,
    /// Moving to the shard that owns its key.
    Migrating = 4,
    /// On its way out: writing a last response or farewell.
    Closing = 8,
    /// Waiting for admission (tailscaled or the admission controller).
    Admission = 16,
    /// Over its receive rate limit until its bucket refills.
    RateLimit = 32,
}

/// The reasons holding a connection's input; input flows when there are
/// none. Each reason is set and lifted by the code that owns it, so one
/// reason going away never lets input through while another holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gate(u8);

impl Gate {
    /// Adds a reason.
    pub fn hold(&mut self, why: Hold) {
        self.0 |= why as u8;
    }

    /// Lifts a reason; `true` if it was held.
    pub fn release(&mut self, why: Hold) -> bool {
        let held = self.holds(why);
        self.0 &= !(why as u8);
        held
    }

    /// Whether `why` holds input now.
    pub fn holds(&self, why: Hold) -> bool {
        self.0 & why as u8 != 0
    }

    /// Whether nothing holds input.
    pub fn is_open(&self) -> bool {
        self.0 == 0
    }
}

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

/// DERP over WebSocket: the frame decoder, and raw WebSocket bytes to
/// write before the framed DERP output (the 101 response, pongs, close).
#[derive(Debug, Default)]
pub struct WsLink {
    /// Reads the client's frames.
    pub decoder: ferry_proto::websocket::Decoder,
    /// Raw bytes for the socket, ahead of the next framed output.
    pub out: Vec<u8>,
}

/// A client connection.
pub struct Conn {
    /// Distinguishes this connection from later ones in the same slot.
    pub gen: u32,
    /// The socket while it travels between shards (detached from a driver).
    pub stream: Option<TcpStream>,
    /// Remote address: the socket's peer, or the client a trusted proxy
    /// named (PROXY header, `X-Forwarded-For`, `Forwarded`).
    pub peer: SocketAddr,
    /// The PROXY protocol check still due on the first bytes.
    pub proxy: ProxyPrelude,
    /// Its receive limit (`--rate-config`); none for mesh peers or when
    /// limits are off.
    pub rate: Option<Bucket>,
    /// DERP carried in WebSocket messages (after an `Upgrade: websocket`).
    pub ws: Option<Box<WsLink>>,
    /// What the listener that accepted it serves.
    pub listener: ListenerKind,
    /// Plain, TLS in userspace, or kernel TLS.
    pub transport: Transport,
    /// Life phase.
    pub phase: Phase,
    /// The HTTP request head read so far.
    pub head: Vec<u8>,
    /// DERP frames read so far.
    pub deframer: Deframer,
    /// Raw bytes received while input was paused.
    pub stash: Vec<u8>,
    /// Input is stopped: the socket is not read (TCP pushes back on the
    /// peer) and bytes already read wait in `stash`. It restarts once
    /// `gate` holds nothing.
    pub paused: bool,
    /// Why input is held.
    pub gate: Gate,
    /// With [`Hold::Ring`]: the shard whose ring had no room ...
    pub stalled_to: Option<usize>,
    /// ... and the packet record that waits for it (its memory is kept for
    /// the next stall).
    pub stall_record: Vec<u8>,
    /// Senders paused because this connection's queue is over its cap;
    /// resumed when it drains or goes away.
    pub waiters: Vec<ConnRef>,
    /// On the shard's list of connections holding senders (`waiters` may
    /// have emptied since; the list is pruned lazily).
    pub holding: bool,
    /// When `waiters` last went from empty to not empty, or when the
    /// socket was last seen taking bytes while holding them.
    pub held_since: Instant,
    /// The socket's acknowledged-bytes count, read once half the
    /// backpressure budget has passed while holding senders: `None` until
    /// read in this hold, `Some(None)` where the back end cannot tell.
    pub acked_mark: Option<Option<u64>>,
    /// An acknowledged-bytes reading taken, while this connection held
    /// nobody, because its send had been in flight for half a budget when
    /// another destination's hold was checked: a hold that starts later
    /// counts from half a budget before it, so a second stuck receiver is
    /// recognised at once instead of after a budget of its own. Cleared
    /// when a send completes.
    pub probe: Option<(Instant, Option<u64>)>,
    /// Held its senders for the whole backpressure budget without its
    /// socket taking a byte: until a write to it completes, its queue
    /// drops its own new packets over the cap instead of pausing senders.
    pub not_draining: bool,

    /// Client key (valid from the end of the handshake).
    pub key: NodePublic,
    /// Presented the mesh key.
    pub mesh: bool,
    /// Said it is a prober.
    pub prober: bool,
    /// Asked for relay sessions, which this relay offers.
    pub relay_sessions: bool,
    /// The upgrade request carried an `Ideal-Node` header.
    pub not_ideal: bool,
    /// The client calls this server home.
    pub preferred: bool,
    /// Subscribed to connection changes (watchConns).
    pub watcher: bool,
    /// Member of a key with several connections.
    pub dup: bool,
    /// Activity sequence number for the duplicate policy.
    pub last_active: u64,
    /// When the connection was accepted.
    pub accepted_at: Instant,
    /// When it registered.
    pub registered_at: Instant,
    /// Handshake must finish by then (phases before `Active`).
    pub deadline: Instant,
    /// Next keepAlive is due then.
    pub next_keepalive: Instant,

    /// Control frames to write.
    pub ctrl: Vec<u8>,
    /// Disco packets to write, as recvPacket frames.
    pub disco: Vec<u8>,
    /// How many.
    pub disco_n: u32,
    /// Other packets to write, as recvPacket frames.
    pub data: Vec<u8>,
    /// How many.
    pub data_n: u32,
    /// The send buffer when no send is in flight.
    pub spare: Vec<u8>,
    /// A send is in flight since then.
    pub in_flight: Option<Instant>,
    /// Plaintext bytes in that send (for the queued-bytes gauge).
    pub in_flight_bytes: usize,
    /// What this connection adds to its shard's queued-bytes gauge now.
    /// The gauge is the sum of these, so it cannot go below zero.
    pub gauged_bytes: usize,
    /// On the shard's list of connections to flush.
    pub dirty: bool,
    /// A pong is queued and not yet flushed (further pings are ignored).
    pub pong_pending: bool,
    /// Close once everything queued is written.
    pub close_after_flush: Option<CloseReason>,
    /// Closed; waiting for the driver to let go of the socket.
    pub closing: Option<CloseReason>,

    /// Tokens for peerGone(NotHere) notices (1/s, burst 3).
    pub not_here: Bucket,
    /// The last source this connection received from (skips the set lookup).
    pub last_src: Option<NodePublic>,
    /// Every source this connection received from, for peerGone.
    pub recv_from: HashSet<NodePublic>,
}

/// Burst of peerGone(NotHere) notices per connection.
pub const NOT_HERE_BURST: f64 = 3.0;

impl Conn {
    /// A freshly accepted connection.
    pub fn new(
        gen: u32,
        peer: SocketAddr,
        listener: ListenerKind,
        now: Instant,
        deadline: Instant,
    ) -> Self {
        Conn {
            gen,
            stream: None,
            peer,
            proxy: ProxyPrelude::Done,
            rate: None,
            ws: None,
            listener,
            transport: Transport::Plain,
            phase: Phase::Http,
            head: Vec::new(),
            deframer: Deframer::new(),
            stash: Vec::new(),
            paused: false,
            gate: Gate::default(),
            stalled_to: None,
            stall_record: Vec::new(),
            waiters: Vec::new(),
            holding: false,
            held_since: now,
            acked_mark: None,
            probe: None,
            not_draining: false,
            key: NodePublic::from_bytes([0; 32]),
            mesh: false,
            prober: false,
            relay_sessions: false,
            not_ideal: false,
            preferred: false,
            watcher: false,
            dup: false,
            last_active: 0,
            accepted_at: now,
            registered_at: now,
            deadline,
            next_keepalive: deadline,
            ctrl: Vec::new(),
            disco: Vec::new(),
            disco_n: 0,
            data: Vec::new(),
            data_n: 0,
            spare: Vec::new(),
            in_flight: None,
            in_flight_bytes: 0,
            gauged_bytes: 0,
            dirty: false,
            pong_pending: false,
            close_after_flush: None,
            closing: None,
            not_here: Bucket::new(1.0, NOT_HERE_BURST),
            last_src: None,
            recv_from: HashSet::new(),
        }
    }

    /// Whether anything waits to be written.
    pub fn has_output(&self) -> bool {
        !self.ctrl.is_empty()
            || !self.disco.is_empty()
            || !self.data.is_empty()
            || self.transport.wants_write()
            || self.ws.as_ref().is_some_and(|w| !w.out.is_empty())
    }

    /// Bytes of queued plaintext.
    pub fn queued_bytes(&self) -> usize {
        self.ctrl.len() + self.disco.len() + self.data.len()
    }

    /// Brings this connection's share of the queued-bytes gauge up to date
    /// (queued plus in flight; nothing once it is closing) and returns the
    /// change to apply to the gauge.
    pub fn regauge(&mut self) -> i64 {
        let now = if self.closing.is_some() {
            0
        } else {
            self.queued_bytes() + self.in_flight_bytes
        };
        let delta = now as i64 - self.gauged_bytes as i64;
        self.gauged_bytes = now;
        delta
    }

    /// Takes one peerGone(NotHere) token if available.
    pub fn take_not_here_token(&mut self, now: Instant) -> bool {
        self.not_here.try_take_one(now)
    }

    /// The flags byte of peerPresent for this connection.
    pub fn presence_flags(&self) -> u8 {
        use ferry_proto::frame::{
            PEER_PRESENT_IS_MESH_PEER, PEER_PRESENT_IS_PROBER, PEER_PRESENT_IS_REGULAR,
            PEER_PRESENT_NOT_IDEAL,
        };
        let mut flags = 0;
        if self.mesh {
            flags |= PEER_PRESENT_IS_MESH_PEER;
        }
        if self.prober {
            flags |= PEER_PRESENT_IS_PROBER;
        }
        if self.not_ideal {
            flags |= PEER_PRESENT_NOT_IDEAL;
        }
        if flags == 0 {
            flags = PEER_PRESENT_IS_REGULAR;
        }
        flags
    }
}
