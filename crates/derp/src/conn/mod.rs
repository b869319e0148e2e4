//! One client connection as a shard sees it.
//!
//! A connection moves through phases: TLS handshake (if any), the HTTP
//! request, the DERP handshake (waiting for clientInfo), and then either
//! `Active` on the shard that owns its key or `Migrating` to that shard.
//!
//! A [`Conn`] is the connection's whole state, its fields private: the
//! shard asks and tells it through methods. The DERP protocol part —
//! frames in, the output queues and their caps, the handshake deadline,
//! keepalives and the write timeout — is its [`ServerConn`]
//! (`ferry_proto::server`), which knows nothing of sockets, shards or the
//! clock. This module never uses the shard's types: the shard drives it.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ferry_engine::Slot;
use ferry_proto::app_name::AppName;
use ferry_proto::frame::ServerFramePolicy;
use ferry_proto::http::{HeadScan, HttpError, Request};
use ferry_proto::key::NodePublic;

use crate::config::ListenerKind;
use crate::metrics::CloseReason;
use crate::transport::websocket::WsFraming;
use crate::transport::Transport;
use ferry_engine::limit::Bucket;

pub use ferry_proto::server::{Action, Caps, Queued, Reader, ServerConn, Timeout};
pub use input::{Gate, Hold, Input};
pub use states::{AckedMark, Phase, ProxyPrelude};
pub use tally::Tally;

mod input;
mod states;
mod tally;

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

/// A client connection.
pub struct Conn {
    /// Distinguishes this connection from later ones in the same slot.
    gen: u32,
    /// The socket while it travels between shards (detached from a driver).
    stream: Option<TcpStream>,
    /// Remote address: the socket's peer, or the client a trusted proxy
    /// named (PROXY header, `X-Forwarded-For`, `Forwarded`).
    peer: SocketAddr,
    /// The PROXY protocol check still due on the first bytes.
    proxy: ProxyPrelude,
    /// Its receive limit (`--rate-config`); none for mesh peers or when
    /// limits are off.
    rate: Option<Bucket>,
    /// DERP carried in WebSocket messages (after an `Upgrade: websocket`).
    ws: Option<Box<WsFraming>>,
    /// What the listener that accepted it serves.
    listener: ListenerKind,
    /// Plain, TLS in userspace, or kernel TLS.
    transport: Transport,
    /// Life phase.
    phase: Phase,
    /// The HTTP request head (or PROXY prelude) read so far.
    head: Vec<u8>,
    /// How far the request head was looked at.
    head_scan: HeadScan,
    /// The DERP protocol: frames in, queues out, its clocks.
    derp: ServerConn,
    /// Raw bytes received while input was stopped.
    stash: Vec<u8>,
    /// Whether the socket is read, and what holds it if not; while it is
    /// not, bytes already read wait in `stash`.
    input: Input,
    /// With [`Hold::Ring`]: the shard whose ring had no room ...
    stalled_to: Option<usize>,
    /// ... and the ring packet that waits for it (its memory is kept for
    /// the next stall).
    stall_packet: Vec<u8>,
    /// Senders paused because this connection's queue is over its cap;
    /// resumed when it drains or goes away.
    waiters: Vec<ConnRef>,
    /// On the shard's list of connections holding senders (`waiters` may
    /// have emptied since; the list is pruned lazily).
    holding: bool,
    /// When `waiters` last went from empty to not empty, or when the
    /// socket was last seen taking bytes while holding them.
    held_since: Instant,
    /// The socket's acknowledged-bytes count, read once half the
    /// backpressure budget has passed while holding senders.
    acked_mark: AckedMark,
    /// An acknowledged-bytes reading taken, while this connection held
    /// nobody, because its send had been in flight for half a budget when
    /// another destination's hold was checked: a hold that starts later
    /// counts from half a budget before it, so a second stuck receiver is
    /// recognised at once instead of after a budget of its own. Cleared
    /// when a send completes.
    probe: Option<(Instant, Option<u64>)>,
    /// Held its senders for the whole backpressure budget without its
    /// socket taking a byte: until a write to it completes, its queue
    /// drops its own new packets over the cap instead of pausing senders.
    not_draining: bool,

    /// Client key (valid from the end of the handshake).
    key: NodePublic,
    /// Presented the mesh key.
    mesh: bool,
    /// Said it is a prober.
    prober: bool,
    /// Its clientInfo `AppName`; `None` (no allocation) without one.
    app_name: Option<Box<str>>,
    /// Asked for relay sessions, which this relay offers: then its
    /// relayAllocate rate (tokens per request).
    relay_sessions: Option<Box<Bucket>>,
    /// The relay-session version agreed with the client (0: none).
    relay_version: u8,
    /// A mesh peer that asked for the Ferry mesh extension.
    ferry_mesh: bool,
    /// The upgrade request carried an `Ideal-Node` header.
    not_ideal: bool,
    /// The client calls this server home.
    preferred: bool,
    /// Subscribed to connection changes (watchConns).
    watcher: bool,
    /// Member of a key with several connections.
    dup: bool,
    /// Activity sequence number for the duplicate policy.
    last_active: u64,
    /// When it registered.
    registered_at: Instant,
    /// The server's number for it, counted at the upgrade to DERP
    /// (derper's `connNum`); 0 before that.
    num: i64,
    /// The protocol version its clientInfo gave.
    version: u32,
    /// Data packets and bytes it sent and was sent.
    tally: Tally,

    /// What this connection adds to its shard's queued-bytes gauge now.
    /// The gauge is the sum of these, so it cannot go below zero.
    gauged_bytes: usize,
    /// On the shard's list of connections to flush.
    dirty: bool,
    /// Close once everything queued is written.
    close_after_flush: Option<CloseReason>,
    /// Closed; waiting for the driver to let go of the socket.
    closing: Option<CloseReason>,

    /// Tokens for peerGone(NotHere) notices (1/s, burst 3).
    not_here: Bucket,
    /// The last source this connection received from (skips the set lookup).
    last_src: Option<NodePublic>,
    /// Every source this connection received from, for peerGone.
    recv_from: HashSet<NodePublic>,
}

/// Burst of peerGone(NotHere) notices per connection.
pub const NOT_HERE_BURST: f64 = 3.0;
/// relayAllocate requests a connection may send at once (as many as the
/// sessions a key may take part in by default, so a client asks for all
/// of them at start) ...
pub const ALLOCATE_BURST: f64 = 32.0;
/// ... and per second after that. More are refused at once with
/// relayRefused reason 6 (rate).
pub const ALLOCATE_RATE: f64 = 4.0;

impl Conn {
    /// A freshly accepted connection whose handshake must finish by
    /// `deadline`.
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
            head_scan: HeadScan::new(),
            derp: ServerConn::new(deadline),
            stash: Vec::new(),
            input: Input::Reading,
            stalled_to: None,
            stall_packet: Vec::new(),
            waiters: Vec::new(),
            holding: false,
            held_since: now,
            acked_mark: AckedMark::NotRead,
            probe: None,
            not_draining: false,
            key: NodePublic::from_bytes([0; 32]),
            mesh: false,
            prober: false,
            app_name: None,
            relay_sessions: None,
            relay_version: 0,
            ferry_mesh: false,
            not_ideal: false,
            preferred: false,
            watcher: false,
            dup: false,
            last_active: 0,
            registered_at: now,
            num: 0,
            version: 0,
            tally: Tally::default(),
            gauged_bytes: 0,
            dirty: false,
            close_after_flush: None,
            closing: None,
            not_here: Bucket::new(1.0, NOT_HERE_BURST),
            last_src: None,
            recv_from: HashSet::new(),
        }
    }

    // ---- identity ----

    /// Its generation in its slot.
    #[inline]
    pub fn gen(&self) -> u32 {
        self.gen
    }

    /// Its remote address.
    #[inline]
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The client a trusted proxy named replaces the socket's peer.
    pub fn set_peer(&mut self, peer: SocketAddr) {
        self.peer = peer;
    }

    /// What the listener that accepted it serves.
    pub fn listener(&self) -> ListenerKind {
        self.listener
    }

    /// The client's key (valid from the end of the handshake).
    #[inline]
    pub fn key(&self) -> NodePublic {
        self.key
    }

    /// Whether it presented the mesh key.
    #[inline]
    pub fn is_mesh(&self) -> bool {
        self.mesh
    }

    /// Whether it said it is a prober.
    pub fn is_prober(&self) -> bool {
        self.prober
    }

    /// Its clientInfo `AppName`, "" for none.
    pub fn app(&self) -> &str {
        self.app_name.as_deref().unwrap_or("")
    }

    /// Whether its upgrade request named another node as ideal.
    pub fn is_not_ideal(&self) -> bool {
        self.not_ideal
    }

    /// Records what the upgrade request said about the ideal node.
    pub fn set_not_ideal(&mut self, not_ideal: bool) {
        self.not_ideal = not_ideal;
    }

    /// What clientInfo said: its key, whether it is a mesh peer (which
    /// admits the mesh-only frames) and whether it is a prober.
    pub fn identify(&mut self, key: NodePublic, mesh: bool, prober: bool) {
        self.key = key;
        self.mesh = mesh;
        self.prober = prober;
    }

    /// Keeps the clientInfo's `AppName` (valid, checked by the handshake).
    pub fn set_app_name(&mut self, name: Option<String>) {
        self.app_name = name.filter(|n| !n.is_empty()).map(String::into_boxed_str);
    }

    /// The clientInfo's `AppName`, for peerPresent.
    pub fn app_name(&self) -> Option<AppName> {
        self.app_name
            .as_deref()
            .and_then(|n| AppName::new(n.as_bytes()))
    }

    /// Records the relay-session version agreed with the client (0: it
    /// did not ask, or this relay offers none; `docs/relay-sessions.md`,
    /// §1 and §9.1).
    pub fn set_relay_sessions(&mut self, version: u8) {
        self.relay_version = version;
        self.relay_sessions =
            (version > 0).then(|| Box::new(Bucket::new(ALLOCATE_RATE, ALLOCATE_BURST)));
    }

    /// The relay-session version agreed with the client (0: none).
    pub fn relay_version(&self) -> u8 {
        self.relay_version
    }

    /// Records whether the client, a mesh peer, asked for the Ferry mesh
    /// extension (`docs/relay-sessions.md` §9.1).
    pub fn set_ferry_mesh(&mut self, on: bool) {
        self.ferry_mesh = on;
    }

    /// Whether the client is a mesh peer that asked for the Ferry mesh
    /// extension.
    pub fn speaks_ferry_mesh(&self) -> bool {
        self.ferry_mesh
    }

    /// Charges one relayAllocate to its rate at `now`: `false` if it asked
    /// too often (or may not ask at all).
    pub fn take_allocate_token(&mut self, now: Instant) -> bool {
        self.relay_sessions
            .as_mut()
            .is_some_and(|b| b.try_take_one(now))
    }

    /// Which frames the client may send: the mesh-only ones for a mesh
    /// peer, relayAllocate for a client with relay sessions.
    pub fn frame_policy(&self) -> ServerFramePolicy {
        ServerFramePolicy {
            mesh: self.mesh,
            relay_sessions: self.relay_sessions.is_some(),
            ferry_mesh: self.ferry_mesh,
        }
    }

    /// Whether the client may allocate relay sessions.
    pub fn has_relay_sessions(&self) -> bool {
        self.relay_sessions.is_some()
    }

    /// Whether the client calls this server home.
    pub fn is_preferred(&self) -> bool {
        self.preferred
    }

    /// notePreferred: `true` if that changed it.
    pub fn note_preferred(&mut self, preferred: bool) -> bool {
        let changed = self.preferred != preferred;
        self.preferred = preferred;
        changed
    }

    /// Whether it watches connection changes.
    pub fn is_watcher(&self) -> bool {
        self.watcher
    }

    /// Makes it a watcher; `true` if it was not one.
    pub fn become_watcher(&mut self) -> bool {
        !std::mem::replace(&mut self.watcher, true)
    }

    /// Whether its key has other connections.
    #[inline]
    pub fn is_dup(&self) -> bool {
        self.dup
    }

    /// Notes whether its key has other connections.
    pub fn set_dup(&mut self, dup: bool) {
        self.dup = dup;
    }

    /// Its activity sequence number (duplicate policy).
    pub fn last_active(&self) -> u64 {
        self.last_active
    }

    /// It was active as the shard's `seq`th activity.
    pub fn note_active(&mut self, seq: u64) {
        self.last_active = seq;
    }

    /// When it registered.
    pub fn registered_at(&self) -> Instant {
        self.registered_at
    }

    /// Its connection number (0 before the upgrade to DERP).
    pub fn num(&self) -> i64 {
        self.num
    }

    /// Numbers it, at the upgrade to DERP.
    pub fn set_num(&mut self, num: i64) {
        self.num = num;
    }

    /// The protocol version its clientInfo gave.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Keeps the clientInfo's protocol version.
    pub fn set_version(&mut self, version: u32) {
        self.version = version;
    }

    /// Its packet and byte counts.
    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Its packet and byte counts, to count in.
    #[inline]
    pub fn tally_mut(&mut self) -> &mut Tally {
        &mut self.tally
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

    // ---- life ----

    /// Its life phase.
    #[inline]
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Moves it to `phase`.
    pub fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
    }

    /// Registered at `now`, with its DERP state established: keepalives from
    /// `first_keepalive` every `keepalive`, the write timeout, and the
    /// receive limit.
    pub fn register(
        &mut self,
        now: Instant,
        first_keepalive: Instant,
        keepalive: Duration,
        write_timeout: Option<Duration>,
        rate: Option<Bucket>,
    ) {
        self.phase = Phase::Active;
        self.registered_at = now;
        self.rate = rate;
        self.derp
            .establish(first_keepalive, keepalive, write_timeout);
    }

    /// Why it was closed, once it is.
    #[inline]
    pub fn closed(&self) -> Option<CloseReason> {
        self.closing
    }

    /// Whether it is closed (waiting for the driver to let go).
    #[inline]
    pub fn is_closed(&self) -> bool {
        self.closing.is_some()
    }

    /// Closes it; `false` if it was closed already.
    pub fn mark_closed(&mut self, reason: CloseReason) -> bool {
        if self.closing.is_some() {
            return false;
        }
        self.closing = Some(reason);
        true
    }

    /// The reason to close it with once its output is written, if set.
    #[inline]
    pub fn close_after_flush(&self) -> Option<CloseReason> {
        self.close_after_flush
    }

    /// Close it with `reason` once everything queued is written.
    pub fn close_when_flushed(&mut self, reason: CloseReason) {
        self.close_after_flush = Some(reason);
    }

    /// Whether it is closed or on its way out.
    #[inline]
    pub fn is_ending(&self) -> bool {
        self.closing.is_some() || self.close_after_flush.is_some()
    }

    // ---- the socket and its bytes ----

    /// Plain, TLS in userspace, or kernel TLS.
    #[inline]
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// The transport, to change.
    #[inline]
    pub fn transport_mut(&mut self) -> &mut Transport {
        &mut self.transport
    }

    /// Whether its socket is detached (travelling between shards).
    #[inline]
    pub fn is_detached(&self) -> bool {
        self.stream.is_some()
    }

    /// Keeps the socket while the connection travels.
    pub fn detach(&mut self, stream: TcpStream) {
        self.stream = Some(stream);
    }

    /// Takes the socket to attach it to a driver.
    pub fn take_stream(&mut self) -> Option<TcpStream> {
        self.stream.take()
    }

    /// The PROXY protocol check still due on the first bytes.
    pub fn proxy(&self) -> ProxyPrelude {
        self.proxy
    }

    /// Sets the PROXY protocol check still due.
    pub fn set_proxy(&mut self, proxy: ProxyPrelude) {
        self.proxy = proxy;
    }

    /// The HTTP request head (or PROXY prelude) read so far.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// The head, to append to (the PROXY prelude; a request head goes
    /// through [`Conn::read_head`]).
    pub fn head_mut(&mut self) -> &mut Vec<u8> {
        &mut self.head
    }

    /// Appends `data` to the request head and says what the head holds so
    /// far ([`HeadScan::advance`]), with the bytes looked at to say it.
    pub fn read_head(&mut self, data: &[u8]) -> (Result<Option<Request>, HttpError>, usize) {
        self.head.extend_from_slice(data);
        let before = self.head_scan.work();
        let got = self.head_scan.advance(&self.head);
        (got, self.head_scan.work() - before)
    }

    /// Takes the head read so far (it is complete).
    pub fn take_head(&mut self) -> Vec<u8> {
        self.head_scan = HeadScan::new();
        std::mem::take(&mut self.head)
    }

    /// Replaces the transport (TLS accepted, or moved into the kernel).
    pub fn set_transport(&mut self, transport: Transport) {
        self.transport = transport;
    }

    /// Takes the transport out (leaving [`Transport::Plain`]) for one
    /// read, which may reach this connection again through the shard;
    /// [`Conn::set_transport`] puts it back.
    #[inline]
    pub fn take_transport(&mut self) -> Transport {
        std::mem::replace(&mut self.transport, Transport::Plain)
    }

    /// Its WebSocket framing, if it speaks DERP over WebSocket.
    pub fn ws_mut(&mut self) -> Option<&mut WsFraming> {
        self.ws.as_deref_mut()
    }

    /// Its WebSocket framing (if any) and DERP state together (a flush
    /// frames the one's output with the other).
    pub fn ws_and_derp(&mut self) -> (Option<&mut WsFraming>, &mut ServerConn) {
        (self.ws.as_deref_mut(), &mut self.derp)
    }

    /// Whether it speaks DERP over WebSocket.
    #[inline]
    pub fn is_websocket(&self) -> bool {
        self.ws.is_some()
    }

    /// Takes the WebSocket framing out while its decoder runs.
    pub fn take_ws(&mut self) -> Option<Box<WsFraming>> {
        self.ws.take()
    }

    /// Puts the WebSocket framing (back).
    pub fn put_ws(&mut self, ws: Box<WsFraming>) {
        self.ws = Some(ws);
    }

    /// Its DERP protocol state.
    #[inline]
    pub fn derp(&self) -> &ServerConn {
        &self.derp
    }

    /// Its DERP protocol state, to change.
    #[inline]
    pub fn derp_mut(&mut self) -> &mut ServerConn {
        &mut self.derp
    }

    /// The transport and the DERP state together (a flush moves the one's
    /// output through the other).
    #[inline]
    pub fn transport_and_derp(&mut self) -> (&mut Transport, &mut ServerConn) {
        (&mut self.transport, &mut self.derp)
    }

    /// Whether anything waits to be written.
    pub fn has_output(&self) -> bool {
        self.derp.has_output()
            || self.transport.wants_write()
            || self.ws.as_ref().is_some_and(|w| w.has_out())
    }

    /// Brings this connection's share of the queued-bytes gauge up to date
    /// (queued plus in flight; nothing once it is closing) and returns the
    /// change to apply to the gauge.
    pub fn regauge(&mut self) -> i64 {
        let now = if self.closing.is_some() {
            0
        } else {
            self.derp.queued_bytes() + self.derp.in_flight_bytes()
        };
        let delta = now as i64 - self.gauged_bytes as i64;
        self.gauged_bytes = now;
        delta
    }

    /// Adds bytes just queued to its share of the gauge (the caller adds
    /// them to the gauge).
    #[inline]
    pub fn gauge_queued(&mut self, bytes: usize) {
        self.gauged_bytes += bytes;
    }

    /// Arrives on a new shard as generation `gen`: on no list there, and
    /// counting nothing in its gauge yet.
    pub fn arrive(&mut self, gen: u32) {
        self.gen = gen;
        self.dirty = false;
        self.gauged_bytes = 0;
    }

    /// Leaves its shard: off its lists; returns what it counted in that
    /// shard's queued-bytes gauge.
    pub fn leave(&mut self) -> usize {
        self.dirty = false;
        std::mem::take(&mut self.gauged_bytes)
    }

    /// Puts it on the flush list: `true` if it was not on it.
    #[inline]
    pub fn mark_dirty(&mut self) -> bool {
        !std::mem::replace(&mut self.dirty, true)
    }

    /// Takes it off the flush list.
    #[inline]
    pub fn clear_dirty(&mut self) {
        self.dirty = false;
    }

    // ---- input held ----

    /// Whether its input is stopped.
    #[inline]
    pub fn is_paused(&self) -> bool {
        self.input.is_stopped()
    }

    /// Holds input for `why`; `true` if input was flowing (its socket's
    /// reads must stop).
    pub fn hold(&mut self, why: Hold) -> bool {
        self.input.hold(why)
    }

    /// Lifts `why`; `true` if it was held.
    pub fn release(&mut self, why: Hold) -> bool {
        self.input.release(why)
    }

    /// Whether `why` holds its input.
    #[inline]
    pub fn holds(&self, why: Hold) -> bool {
        self.input.holds(why)
    }

    /// Whether input is stopped and nothing holds it any more.
    pub fn may_resume(&self) -> bool {
        self.input == Input::Released
    }

    /// Input flows again, unless a reason still holds it (`false`).
    pub fn resume(&mut self) -> bool {
        self.input.resume()
    }

    /// Whether input waits in the stash (or is stopped): new bytes go
    /// behind it.
    #[inline]
    pub fn must_stash(&self) -> bool {
        self.input.is_stopped() || !self.stash.is_empty()
    }

    /// Whether bytes wait in the stash.
    pub fn has_stash(&self) -> bool {
        !self.stash.is_empty()
    }

    /// Keeps bytes read while input is held.
    pub fn stash(&mut self, data: &[u8]) {
        self.stash.extend_from_slice(data);
    }

    /// Takes the stashed bytes.
    pub fn take_stash(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.stash)
    }

    /// Gives back a consumed stash's memory. Bytes stashed again while it
    /// was read (input paused again) move into it when it is the larger:
    /// otherwise the stash would start over from a small buffer after each
    /// such pause and grow again, one allocation per doubling.
    pub fn recycle_stash(&mut self, mut stash: Vec<u8>) {
        if stash.capacity() <= self.stash.capacity() {
            return;
        }
        stash.clear();
        stash.extend_from_slice(&self.stash);
        self.stash = stash;
    }

    /// Keeps the ring packet `parts` (header and packet) for the ring to
    /// `shard`, which had no room.
    pub fn stall(&mut self, shard: usize, parts: [&[u8]; 2]) {
        self.stall_packet.clear();
        for p in parts {
            self.stall_packet.extend_from_slice(p);
        }
        self.stalled_to = Some(shard);
    }

    /// The ring it waits for, with the ring packet to push there.
    pub fn stalled(&self) -> Option<(usize, &[u8])> {
        self.stalled_to.map(|s| (s, &self.stall_packet[..]))
    }

    /// The stalled ring packet went out (or never will).
    pub fn clear_stall(&mut self) {
        self.stalled_to = None;
    }

    /// Its receive limit, if it has one.
    #[inline]
    pub fn rate_mut(&mut self) -> Option<&mut Bucket> {
        self.rate.as_mut()
    }

    /// Whether it has a receive limit.
    #[inline]
    pub fn is_rate_limited(&self) -> bool {
        self.rate.is_some()
    }

    /// Replaces its receive limit.
    pub fn set_rate(&mut self, rate: Option<Bucket>) {
        self.rate = rate;
    }

    // ---- backpressure (see the shard's module doc) ----

    /// Whether senders wait for it to drain.
    #[inline]
    pub fn has_waiters(&self) -> bool {
        !self.waiters.is_empty()
    }

    /// Whether `from` waits for it.
    pub fn is_waiting(&self, from: &ConnRef) -> bool {
        self.waiters.contains(from)
    }

    /// Makes `from` wait for it, starting a hold at `now` if none was on
    /// (or half a budget, `half`, before an earlier reading of its
    /// socket). Returns `true` if it must join the shard's holders list.
    pub fn add_waiter(&mut self, from: ConnRef, now: Instant, half: Duration) -> bool {
        let mut join = false;
        if self.waiters.is_empty() {
            match self.probe.take() {
                Some((at, mark)) => {
                    self.held_since = at.checked_sub(half).unwrap_or(at);
                    self.acked_mark = AckedMark::from(mark);
                }
                None => {
                    self.held_since = now;
                    self.acked_mark = AckedMark::NotRead;
                }
            }
            join = !std::mem::replace(&mut self.holding, true);
        }
        self.waiters.push(from);
        join
    }

    /// Takes the waiting senders (to resume them); give the list's memory
    /// back with [`Conn::recycle_waiters`].
    pub fn take_waiters(&mut self) -> Vec<ConnRef> {
        std::mem::take(&mut self.waiters)
    }

    /// Gives back a drained waiters list, keeping senders added meanwhile.
    pub fn recycle_waiters(&mut self, mut waiting: Vec<ConnRef>) {
        std::mem::swap(&mut self.waiters, &mut waiting);
        self.waiters.append(&mut waiting);
    }

    /// Leaves the shard's holders list.
    pub fn stop_holding(&mut self) {
        self.holding = false;
    }

    /// Since when it holds senders.
    pub fn held_since(&self) -> Instant {
        self.held_since
    }

    /// The acknowledged-bytes reading of this hold, if taken.
    pub fn acked_mark(&self) -> AckedMark {
        self.acked_mark
    }

    /// Notes the socket's acknowledged bytes; `since` starts a new window.
    pub fn mark_acked(&mut self, acked: Option<u64>, since: Option<Instant>) {
        self.acked_mark = AckedMark::from(acked);
        if let Some(at) = since {
            self.held_since = at;
        }
    }

    /// When its next budget check is due, if it holds senders.
    pub fn budget_check_at(&self, budget: Duration) -> Option<Instant> {
        if self.waiters.is_empty() {
            return None;
        }
        Some(
            self.held_since
                + if self.acked_mark == AckedMark::NotRead {
                    budget / 2
                } else {
                    budget
                },
        )
    }

    /// Whether a probe reading may be taken: a send pending for `half`
    /// at `now` while it holds nobody.
    pub fn wants_probe(&self, now: Instant, half: Duration) -> bool {
        let pending = self
            .derp
            .sending_since()
            .is_some_and(|t| now.saturating_duration_since(t) >= half);
        pending
            && self.probe.is_none()
            && self.waiters.is_empty()
            && !self.not_draining
            && self.closing.is_none()
    }

    /// Keeps a probe reading taken at `now`.
    pub fn set_probe(&mut self, now: Instant, acked: Option<u64>) {
        self.probe = Some((now, acked));
    }

    /// Whether it stopped draining (its packets over the cap drop).
    #[inline]
    pub fn is_not_draining(&self) -> bool {
        self.not_draining
    }

    /// It took nothing for the budget: it stops holding senders.
    pub fn mark_not_draining(&mut self) {
        self.not_draining = true;
        self.holding = false;
    }

    /// A send finished at `buf`: it drains, and an earlier reading of its
    /// socket says nothing any more. Returns `true` if it had been marked
    /// not draining.
    pub fn on_sent(&mut self, buf: Vec<u8>) -> bool {
        self.derp.handle_sent(buf);
        self.probe = None;
        std::mem::take(&mut self.not_draining)
    }

    /// Forgets the not-draining mark (it leaves); `true` if it was set.
    pub fn clear_not_draining(&mut self) -> bool {
        std::mem::take(&mut self.not_draining)
    }

    // ---- sources, for peerGone ----

    /// Notes a packet from `src`; `true` the first time `src` is seen.
    #[inline]
    pub fn note_source(&mut self, src: &NodePublic) -> bool {
        if self.last_src == Some(*src) {
            return false;
        }
        self.last_src = Some(*src);
        self.recv_from.insert(*src)
    }

    /// Forgets `src` (it left).
    pub fn forget_source(&mut self, src: &NodePublic) {
        self.recv_from.remove(src);
        if self.last_src == Some(*src) {
            self.last_src = None;
        }
    }

    /// Takes every source it received from (it leaves).
    pub fn take_sources(&mut self) -> HashSet<NodePublic> {
        self.last_src = None;
        std::mem::take(&mut self.recv_from)
    }

    /// Takes one peerGone(NotHere) token if available.
    pub fn take_not_here_token(&mut self, now: Instant) -> bool {
        self.not_here.try_take_one(now)
    }
}
