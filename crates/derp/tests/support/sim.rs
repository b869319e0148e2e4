//! One relay shard on a simulated driver with simulated time
//! (`ferry_engine::sim`), and the clients a test plays against it: no
//! sockets are read or written and nothing sleeps.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ferry_derp::metrics::Metrics;
use ferry_derp::shard::{Control, Inbox, MeshNews, MeshShared, Rings, Shard, Shared};
use ferry_derp::{DerpConfig, ListenerKind};
use ferry_engine::limit::Bucket;
use ferry_engine::sim::{SimDriver, SIM_TURN_BYTES};
use ferry_engine::Slot;
use ferry_proto::frame::{self, ClientFramePolicy, Deframer, FrameType, ServerFrame};
use ferry_proto::handshake;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_proto::websocket;

/// The shard's sweep period: deadlines are acted on at the first sweep at
/// or after them.
pub(crate) const SWEEP: Duration = Duration::from_millis(250);
pub(crate) const MS: Duration = Duration::from_millis(1);

/// One shard on a simulated driver, and the clients the test plays.
pub(crate) struct Sim {
    pub(crate) shard: Shard,
    pub(crate) d: SimDriver,
    pub(crate) shared: Arc<Shared>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) now: Instant,
    /// Per slot: the client's frame reader and whether the HTTP response
    /// head was consumed.
    readers: HashMap<Slot, (Deframer, bool)>,
    next_port: u16,
}

impl Sim {
    pub(crate) fn new(tweak: impl FnOnce(&mut DerpConfig)) -> Sim {
        Sim::with_mesh(tweak, Vec::new(), None)
    }

    /// A shard with mesh links: `mesh_tx` are its ends of the links'
    /// rings, `mesh` what the mesh thread would share.
    pub(crate) fn with_mesh(
        tweak: impl FnOnce(&mut DerpConfig),
        mesh_tx: Vec<ferry_engine::mailbox::ByteTx>,
        mesh: Option<MeshShared>,
    ) -> Sim {
        let mut cfg = DerpConfig::new(NodePrivate::generate());
        tweak(&mut cfg);
        let metrics = Metrics::new(1, "sim", "simulated driver".into());
        let now = Instant::now();
        let accept_limit = cfg
            .accept_limit
            .map(|(rate, burst)| std::sync::Mutex::new(Bucket::new(rate, burst)));
        let shared = Arc::new(Shared {
            config: Arc::new(cfg),
            metrics: metrics.clone(),
            doorbells: OnceLock::new(),
            hasher: std::hash::RandomState::new(),
            shutdown: AtomicBool::new(false),
            listener_kinds: vec![ListenerKind::Derp],
            inboxes: vec![Inbox::default()],
            admission: OnceLock::new(),
            accept_limit,
            mesh,
            conn_nums: Default::default(),
            epoch: (now, std::time::SystemTime::now()),
        });
        let rings = Rings {
            bytes_tx: vec![None],
            bytes_rx: vec![None],
            msg_tx: vec![None],
            msg_rx: vec![None],
            mesh_tx,
        };
        Sim {
            shard: Shard::new(0, 1, shared.clone(), rings, now, 7, SIM_TURN_BYTES),
            d: SimDriver::new().unwrap(),
            shared,
            metrics,
            now,
            readers: HashMap::new(),
            next_port: 40_000,
        }
    }

    pub(crate) fn step(&mut self) -> Option<Duration> {
        self.d.step(&mut self.shard, self.now)
    }

    /// One turn, then the turns that would follow at once in the real
    /// loop: the shard asks for one (zero timeout: operations to submit,
    /// output to flush), or the driver has completions to report.
    pub(crate) fn settle(&mut self) {
        for _ in 0..100 {
            if self.step() != Some(Duration::ZERO) && !self.d.has_pending() {
                return;
            }
        }
        panic!("the shard keeps asking for another turn");
    }

    /// Moves time on by `by` in steps of at most 1 ms, settling the shard
    /// at each (as a loop whose timeouts fire on time would).
    pub(crate) fn advance(&mut self, by: Duration) {
        let end = self.now + by;
        while self.now < end {
            self.now = (self.now + MS).min(end);
            self.settle();
        }
    }

    /// The value of series `name` (with its labels) now; a series the
    /// scrape lacks fails the test (it is never read as 0).
    pub(crate) fn metric(&self, name: &str) -> f64 {
        super::Scrape::parse(self.metrics.render()).value(name)
    }

    /// The sum of every series of family `name`, whatever their labels; a
    /// family the scrape lacks fails the test.
    pub(crate) fn family_total(&self, name: &str) -> f64 {
        super::Scrape::parse(self.metrics.render()).family(name)
    }

    /// A TCP connection arrives; returns its slot.
    pub(crate) fn connect(&mut self) -> Slot {
        let before = self.d.slots();
        self.next_port += 1;
        let peer = SocketAddr::from(([192, 0, 2, 1], self.next_port));
        self.d.connect(0, peer).unwrap();
        self.settle();
        let slot = *self
            .d
            .slots()
            .iter()
            .find(|s| !before.contains(s))
            .expect("the shard attached the new connection");
        self.readers.insert(slot, (Deframer::new(), false));
        slot
    }

    /// A client with `key` connects and finishes the DERP handshake.
    pub(crate) fn client(&mut self, key: &NodePrivate) -> Slot {
        let slot = self.hello(key, &[]);
        let frames = self.frames(slot);
        let types: Vec<u8> = frames.iter().map(|f| f.0).collect();
        assert_eq!(
            types,
            [FrameType::ServerKey as u8, FrameType::ServerInfo as u8]
        );
        slot
    }

    /// A mesh peer with `key` presenting `mesh` connects and finishes the
    /// handshake.
    pub(crate) fn mesh_client(
        &mut self,
        key: &NodePrivate,
        mesh: &ferry_proto::key::MeshKey,
    ) -> Slot {
        let slot = self.hello_with(key, Some(mesh.clone()), &[]);
        let types: Vec<u8> = self.frames(slot).iter().map(|f| f.0).collect();
        assert_eq!(
            types,
            [FrameType::ServerKey as u8, FrameType::ServerInfo as u8]
        );
        slot
    }

    /// A client with `key` connects and sends its upgrade request and
    /// clientInfo, followed by `then` in the same read.
    pub(crate) fn hello(&mut self, key: &NodePrivate, then: &[u8]) -> Slot {
        self.hello_with(key, None, then)
    }

    pub(crate) fn hello_with(
        &mut self,
        key: &NodePrivate,
        mesh: Option<ferry_proto::key::MeshKey>,
        then: &[u8],
    ) -> Slot {
        let slot = self.connect();
        self.greet(slot, key, mesh, then);
        slot
    }

    /// The client on `slot` sends its upgrade request and clientInfo,
    /// followed by `then` in the same read.
    pub(crate) fn greet(
        &mut self,
        slot: Slot,
        key: &NodePrivate,
        mesh: Option<ferry_proto::key::MeshKey>,
        then: &[u8],
    ) {
        self.greet_with(slot, key, &super::info(mesh), then);
    }

    /// The client on `slot` sends its upgrade request and `info` as its
    /// clientInfo, followed by `then` in the same read.
    pub(crate) fn greet_with(
        &mut self,
        slot: Slot,
        key: &NodePrivate,
        info: &handshake::ClientInfo,
        then: &[u8],
    ) {
        let server = self.shared.config.public_key;
        let mut hello =
            b"GET /derp HTTP/1.1\r\nHost: x\r\nUpgrade: DERP\r\nConnection: Upgrade\r\n\r\n"
                .to_vec();
        hello.extend_from_slice(&handshake::seal_client_info(key, &server, info, &[9; 24]));
        hello.extend_from_slice(then);
        self.d.receive(slot, &hello);
        self.settle();
    }

    /// Frames the client on `slot` has read since the last call.
    pub(crate) fn frames(&mut self, slot: Slot) -> Vec<(u8, Vec<u8>)> {
        let mut out = self.d.take_output(slot);
        let (deframer, head_done) = self.readers.get_mut(&slot).expect("known slot");
        if !*head_done {
            let end = out
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .expect("an HTTP response head first");
            assert!(out.starts_with(b"HTTP/1.1 101"));
            out.drain(..end + 4);
            *head_done = true;
        }
        let mut frames = Vec::new();
        deframer
            .feed(&out, &ClientFramePolicy, |ty, p| {
                frames.push((ty, p.to_vec()));
                ControlFlow::Continue(())
            })
            .unwrap();
        frames
    }

    /// Packets the client on `slot` has read since the last call.
    pub(crate) fn packets(&mut self, slot: Slot) -> Vec<(NodePublic, Vec<u8>)> {
        self.frames(slot)
            .into_iter()
            .filter_map(|(ty, p)| match frame::parse_server_frame(ty, &p) {
                Ok(ServerFrame::RecvPacket { src, packet }) => Some((src, packet.to_vec())),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn send(&mut self, from: Slot, to: &NodePublic, packet: &[u8]) {
        let mut out = Vec::new();
        frame::put_send_packet(&mut out, to, packet);
        self.d.receive(from, &out);
    }
}

/// Reads server WebSocket frames from `out`: (opcode, payload) each, all
/// unmasked and final.
pub(crate) fn ws_frames(mut out: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while !out.is_empty() {
        assert_eq!(out[0] & 0xf0, 0x80, "final, no reserved bits");
        assert_eq!(out[1] & 0x80, 0, "server frames are not masked");
        let (len, at) = match out[1] {
            126 => (usize::from(u16::from_be_bytes([out[2], out[3]])), 4),
            127 => (
                u64::from_be_bytes(out[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (usize::from(n), 2),
        };
        frames.push((out[0] & 0x0f, out[at..at + len].to_vec()));
        out = &out[at + len..];
    }
    frames
}

/// A WebSocket client on the sim: upgrade, then clientInfo in one masked
/// binary frame. Returns its slot after checking the 101.
pub(crate) fn ws_client(s: &mut Sim, key: &NodePrivate) -> Slot {
    let slot = s.connect();
    s.d.receive(
        slot,
        b"GET /derp HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Protocol: derp\r\n\r\n",
    );
    s.settle();
    let out = s.d.take_output(slot);
    let end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&out[..end]).into_owned();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(
        head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
        "{head}"
    );
    assert!(head.contains("Sec-WebSocket-Protocol: derp\r\n"), "{head}");
    let frames = ws_frames(&out[end..]);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].1[0], FrameType::ServerKey as u8);
    let info = handshake::seal_client_info(
        key,
        &s.shared.config.public_key,
        &super::info(None),
        &[9; 24],
    );
    s.d.receive(
        slot,
        &websocket::client_frame(true, 0x2, &info, [1, 2, 3, 4]),
    );
    s.settle();
    let frames = ws_frames(&s.d.take_output(slot));
    assert_eq!(frames[0].1[0], FrameType::ServerInfo as u8);
    slot
}

/// A shard with `peers` mesh conns whose rings hold `ring` bytes; the
/// mesh thread's ends of the rings, and how often it was woken.
pub(crate) fn meshed(
    peers: usize,
    ring: usize,
    tweak: impl FnOnce(&mut DerpConfig),
) -> (
    Sim,
    Vec<ferry_engine::mailbox::ByteRx>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let wakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = wakes.clone();
    let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        w.fetch_add(1, Ordering::Relaxed);
    });
    let (tx, rx): (Vec<_>, Vec<_>) = (0..peers)
        .map(|_| ferry_engine::mailbox::byte_ring(ring))
        .unzip();
    let s = Sim::with_mesh(tweak, tx, Some(MeshShared::new(peers, 1, wake)));
    (s, rx, wakes)
}

impl Sim {
    /// What the mesh conn to peer `peer` learned, as the mesh thread posts it.
    pub(crate) fn news(&mut self, peer: usize, news: MeshNews) {
        self.shared.post(0, Control::Mesh { peer, news });
        self.settle();
    }
}

/// A relayAllocate frame asking for `peer`.
pub(crate) fn allocate(peer: &NodePublic, request_id: u32) -> Vec<u8> {
    let mut f = Vec::new();
    ferry_proto::relay_session::put_allocate(
        &mut f,
        &ferry_proto::relay_session::Allocate {
            peer: *peer,
            request_id,
        },
    );
    f
}
