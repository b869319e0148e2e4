//! Hostile clients against a relay shard's per-connection queues and its
//! relay sessions, on the simulated driver with simulated time: whatever
//! one client sends, its own connection is refused or closed, never
//! another's; every queue it can fill, and the heap, stay bounded.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_derp::shard::MeshNews;
use ferry_derp::DerpConfig;
use ferry_engine::sim::Reader;
use ferry_engine::Slot;
use ferry_proto::frame::{self, FrameType};
use ferry_proto::handshake::ClientInfo;
use ferry_proto::key::{MeshKey, NodePrivate, NodePublic};
use ferry_proto::relay_session::{self as rs, SessionOffer};
use ferry_proto::websocket;
use ferry_udp::session::{Limits, Sessions};
use support::sim::{allocate, meshed, ws_client, ws_frames, Sim, MS};
use support::Scrape;

/// One test at a time: some measure the heap.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn relay_info() -> ClientInfo {
    ClientInfo {
        ferry_derp: 1,
        ..support::info(None)
    }
}

/// A shard whose relay sessions are a real session table (its socket taken
/// as bound at a documentation address: no UDP here), with `tweak`.
fn with_sessions(tweak: impl FnOnce(&mut DerpConfig)) -> (Sim, Arc<Sessions>) {
    let sessions = Arc::new(Sessions::new(Limits::default()));
    sessions.set_bound("192.0.2.200:3479".parse().unwrap());
    let service = sessions.clone();
    let s = Sim::new(move |cfg| {
        cfg.relay_sessions = Some(service);
        tweak(cfg);
    });
    (s, sessions)
}

/// A client that asks for relay sessions connects with `key`.
fn relay_client(s: &mut Sim, key: &NodePrivate) -> Slot {
    let slot = s.connect();
    s.greet_with(slot, key, &relay_info(), &[]);
    let types: Vec<u8> = s.frames(slot).iter().map(|f| f.0).collect();
    assert_eq!(
        types,
        [FrameType::ServerKey as u8, FrameType::ServerInfo as u8]
    );
    slot
}

/// The relaySession frames among `frames`.
fn offers(frames: &[(u8, Vec<u8>)]) -> Vec<SessionOffer> {
    frames
        .iter()
        .filter(|(ty, _)| *ty == frame::RELAY_SESSION)
        .map(|(_, p)| rs::parse_session(p).expect("a relaySession parses"))
        .collect()
}

/// The peer on `slot` reads up to `n` bytes of the send in flight, as a
/// slow reader does; a send taken whole completes.
fn read_slowly(s: &mut Sim, slot: Slot, n: usize) {
    if s.d.send_in_flight(slot) && s.d.take_part(slot, n) < n {
        s.d.complete_send(slot, Ok(()));
    }
}

/// Bytes the C allocator has handed out and not had back.
fn heap_in_use() -> Option<u64> {
    let h = ferry_sys::heap::heap_stats();
    if h.is_none() {
        eprintln!("SKIP heap bound: no mallinfo2 (not glibc)");
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI runs on glibc"
        );
    }
    h.map(|h| h.in_use)
}

/// The flood a reviewer measured: once two keys share a session, every
/// repeated relayAllocate used to queue a 122-byte offer on both clients'
/// control queues, uncapped and ahead of data. Here A sends 100,000 of
/// them (4.1 MB) in 100 ms and reads nothing; B reads 2 MB/s. B must stay
/// connected and hear nothing more; A is closed for its own queue; the
/// queues and the heap stay bounded all along.
#[test]
fn an_allocate_flood_closes_the_flooder_and_spares_its_peer() {
    let _one = serial();
    let (mut s, sessions) = with_sessions(|cfg| cfg.write_timeout = Some(Duration::from_secs(2)));
    let (ak, bk) = (NodePrivate::generate(), NodePrivate::generate());
    let a = relay_client(&mut s, &ak);
    let b = relay_client(&mut s, &bk);
    s.d.receive(a, &allocate(&bk.public(), 1));
    s.settle();
    assert_eq!(offers(&s.frames(a)).len(), 1, "A's answer");
    assert_eq!(offers(&s.frames(b)).len(), 1, "B's offer");

    s.d.set_reader(a, Reader::Stuck);
    s.d.set_reader(b, Reader::Stuck);
    let chunk: Vec<u8> = (0..1000)
        .flat_map(|i| allocate(&bk.public(), 2 + i))
        .collect();
    let heap_before = heap_in_use();
    let (mut peak_heap, mut peak_queued) = (0u64, 0f64);
    let mut b_offers = 0;
    for ms in 0..5000 {
        if ms < 100 {
            s.d.receive(a, &chunk);
        }
        s.advance(MS);
        read_slowly(&mut s, b, 2000);
        b_offers += offers(&s.frames(b)).len();
        peak_queued = peak_queued.max(s.metric("ferry_queued_bytes"));
        if let Some(h) = heap_in_use() {
            peak_heap = peak_heap.max(h);
        }
    }

    let grew = heap_before.map(|h| peak_heap.saturating_sub(h));
    eprintln!("flood: heap grew by {grew:?} bytes at most, queued bytes peaked at {peak_queued}");
    assert!(s.d.is_open(b), "the peer was cut off");
    assert_eq!(b_offers, 0, "the peer heard of the session again");
    assert!(!s.d.is_open(a), "the flooder is still connected");
    assert_eq!(
        s.metric("ferry_connections_closed_total{reason=\"control_queue_full\"}"),
        1.0
    );
    assert_eq!(s.metric("derp_sclient_write_timeouts"), 0.0);
    assert!(s.metric("ferry_relay_allocate_refused_total{reason=\"rate\"}") > 0.0);
    let mut text = String::new();
    sessions.render(&mut text);
    assert_eq!(
        Scrape::parse(text)
            .value("ferry_udp_relay_session_events_total{event=\"repeat_unanswered\"}"),
        31.0,
        "the rest of the burst: repeats within the interval, unanswered"
    );
    assert!(
        peak_queued <= 256.0 * 1024.0,
        "queued bytes reached {peak_queued}"
    );
    if let Some(grew) = grew {
        assert!(grew < 4 << 20, "the heap grew by {grew} bytes");
    }
}

/// A repeated relayAllocate answers the asker at most once per interval
/// and tells the peer again only on a new connection of the peer's key.
#[test]
fn the_peer_hears_of_a_session_again_only_on_a_new_connection() {
    let _one = serial();
    let (mut s, _sessions) = with_sessions(|_| {});
    let (ak, bk) = (NodePrivate::generate(), NodePrivate::generate());
    let a = relay_client(&mut s, &ak);
    let b = relay_client(&mut s, &bk);
    s.d.receive(a, &allocate(&bk.public(), 1));
    s.settle();
    let first = offers(&s.frames(b));
    assert_eq!(first.len(), 1);
    assert_eq!(offers(&s.frames(a)).len(), 1);
    // At once again: nobody hears anything.
    s.d.receive(a, &allocate(&bk.public(), 2));
    s.settle();
    assert!(
        offers(&s.frames(a)).is_empty(),
        "answered within the interval"
    );
    assert!(offers(&s.frames(b)).is_empty(), "the peer was told again");
    // After the interval the asker gets its answer; the peer nothing.
    s.advance(Duration::from_secs(2));
    s.d.receive(a, &allocate(&bk.public(), 3));
    s.settle();
    let again = offers(&s.frames(a));
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].request_id, again[0].slot), (3, 0));
    assert!(offers(&s.frames(b)).is_empty(), "the peer was told again");
    // B asks itself: answered (as asker) although it was told as peer.
    s.d.receive(b, &allocate(&ak.public(), 9));
    s.settle();
    let own = offers(&s.frames(b));
    assert_eq!(own.len(), 1);
    assert_eq!((own[0].request_id, own[0].slot), (9, 1));
    assert!(offers(&s.frames(a)).is_empty());
    // B comes back on a new connection: the next ask tells it, once.
    s.d.peer_closes(b);
    s.settle();
    let b2 = relay_client(&mut s, &bk);
    s.advance(Duration::from_secs(2));
    s.d.receive(a, &allocate(&bk.public(), 4));
    s.settle();
    let told = offers(&s.frames(b2));
    assert_eq!(told.len(), 1, "the new connection is told");
    assert_eq!((told[0].request_id, told[0].vni), (0, first[0].vni));
    assert_eq!(offers(&s.frames(a)).len(), 1);
}

/// peerGone notices are caused by other clients leaving: to a client that
/// does not read they stop at their cap (dropped and counted) instead of
/// growing its queue, and the client is not closed for them. The leavers
/// are clients of another node of the region (no handshake each): they
/// send to V through a mesh peer, and the node's link says they left.
#[test]
fn notices_to_a_client_that_does_not_read_stop_at_their_cap() {
    let _one = serial();
    let mesh_key = MeshKey([7; 32]);
    let (mut s, _rings, _) = meshed(1, 64 * 1024, |cfg| {
        cfg.mesh_key = Some(mesh_key.clone());
        cfg.write_timeout = Some(Duration::from_secs(60));
    });
    let vk = NodePrivate::generate();
    let v = s.client(&vk);
    let peer = s.mesh_client(&NodePrivate::generate(), &mesh_key);
    s.d.set_reader(v, Reader::Stuck);
    const LEAVERS: usize = 1200;
    for i in 0..LEAVERS {
        let mut k = [0xee; 32];
        k[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let k = NodePublic::from_bytes(k);
        s.news(0, MeshNews::Present(k));
        let mut fwd = Vec::new();
        frame::put_forward_packet(&mut fwd, &k, &vk.public(), &[i as u8; 8]);
        s.d.receive(peer, &fwd);
        s.settle();
        s.news(0, MeshNews::Gone(k));
    }
    assert!(s.d.is_open(v), "closed for what others did");
    let queued = s.metric("ferry_queued_bytes");
    s.d.set_reader(v, Reader::Reads);
    s.d.complete_send(v, Ok(()));
    s.advance(Duration::from_millis(10));
    let gone = s
        .frames(v)
        .iter()
        .filter(|(ty, _)| *ty == FrameType::PeerGone as u8)
        .count();
    // Half of the 64 KiB control cap in 38-byte frames, one past it, and
    // one that went out with the first send.
    let cap = 32 * 1024 / 38 + 2;
    assert!(
        gone <= cap,
        "{gone} of {LEAVERS} peerGone notices were queued"
    );
    // And their packets (45 bytes each), in the data queue.
    let bound = (LEAVERS * 45 + cap * 38) as f64;
    assert!(queued <= bound, "{queued} bytes queued");
    let dropped = s.metric("ferry_control_frames_dropped_total{frame=\"peer_gone\"}");
    assert_eq!(gone + dropped as usize, LEAVERS);
    assert_eq!(s.metric("derp_peer_gone_disconnected_frames"), gone as f64);
}

/// A WebSocket client that pings and does not read gets one pong, for its
/// latest ping (RFC 6455 §5.5.3 allows answering only the latest): its
/// pings cannot grow a queue.
#[test]
fn a_websocket_client_that_does_not_read_gets_one_pong() {
    let _one = serial();
    let mut s = Sim::new(|cfg| cfg.write_timeout = Some(Duration::from_secs(60)));
    let wk = NodePrivate::generate();
    let w = ws_client(&mut s, &wk);
    let r = s.client(&NodePrivate::generate());
    s.d.set_reader(w, Reader::Stuck);
    s.send(r, &wk.public(), b"in flight");
    s.settle();
    assert!(s.d.send_in_flight(w));
    let m = [3, 1, 4, 1];
    for i in 0..2000u32 {
        let ping = websocket::client_frame(true, 0x9, &i.to_be_bytes(), m);
        s.d.receive(w, &ping);
    }
    s.settle();
    assert!(s.d.is_open(w));
    s.d.set_reader(w, Reader::Reads);
    s.settle();
    let pongs: Vec<Vec<u8>> = ws_frames(&s.d.take_output(w))
        .into_iter()
        .filter(|(op, _)| *op == 0xA)
        .map(|(_, p)| p)
        .collect();
    assert_eq!(pongs.len(), 1, "pongs for 2,000 pings");
    assert_eq!(pongs[0], 1999u32.to_be_bytes(), "the latest ping's");
}

/// A mesh watcher is sent every presence change on the server. One that
/// does not read is closed once its queue passes the watcher cap (it
/// reconnects and is sent the whole state again, rather than keep a view
/// with holes); the clients whose comings and goings filled it, and
/// everyone else, carry on.
#[test]
fn a_watcher_that_does_not_read_is_closed_at_its_cap_and_nobody_else() {
    let _one = serial();
    let mesh_key = MeshKey([7; 32]);
    let mut s = Sim::new(|cfg| {
        cfg.mesh_key = Some(mesh_key.clone());
        cfg.watcher_queue_bytes = 2048;
        cfg.mesh_write_timeout = Duration::from_secs(60);
    });
    let w = s.mesh_client(&NodePrivate::generate(), &mesh_key);
    let mut watch = Vec::new();
    frame::put_watch_conns(&mut watch);
    s.d.receive(w, &watch);
    s.settle();
    let present: Vec<u8> = s.frames(w).iter().map(|f| f.0).collect();
    assert_eq!(present, [FrameType::PeerPresent as u8], "the state: itself");
    let ck = NodePrivate::generate();
    let c = s.client(&ck);
    s.d.set_reader(w, Reader::Stuck);
    // Clients come and go: 56 bytes of peerPresent and 38 of peerGone
    // each; 2 KiB hold about 22 of them.
    let mut churned = 0;
    while s.d.is_open(w) {
        assert!(churned < 100, "the watcher was never closed");
        let k = s.client(&NodePrivate::generate());
        s.d.peer_closes(k);
        s.settle();
        churned += 1;
    }
    assert!(churned > 20, "closed after {churned} comings and goings");
    assert_eq!(
        s.metric("ferry_connections_closed_total{reason=\"control_queue_full\"}"),
        1.0
    );
    assert_eq!(s.metric("derp_watchers"), 0.0);
    assert!(s.d.is_open(c));
    s.send(c, &ck.public(), b"still here");
    s.settle();
    assert_eq!(s.packets(c).len(), 1);
}

/// Every series this module's limits count exists from the start, at 0.
#[test]
fn the_new_series_exist_from_the_start() {
    let _one = serial();
    let (s, sessions) = with_sessions(|_| {});
    for series in [
        "ferry_connections_closed_total{reason=\"control_queue_full\"}",
        "ferry_control_frames_dropped_total{frame=\"peer_gone\"}",
        "ferry_control_frames_dropped_total{frame=\"relay_session\"}",
        "ferry_relay_allocate_refused_total{reason=\"peer_not_here\"}",
        "ferry_relay_allocate_refused_total{reason=\"peer_not_capable\"}",
        "ferry_relay_allocate_refused_total{reason=\"limit\"}",
        "ferry_relay_allocate_refused_total{reason=\"off\"}",
        "ferry_relay_allocate_refused_total{reason=\"self\"}",
        "ferry_relay_allocate_refused_total{reason=\"rate\"}",
        "ferry_relay_allocate_refused_total{reason=\"other\"}",
    ] {
        assert_eq!(s.metric(series), 0.0, "{series}");
    }
    let mut text = String::new();
    sessions.render(&mut text);
    let scrape = Scrape::parse(text);
    for series in [
        "ferry_udp_relay_session_events_total{event=\"repeat_unanswered\"}",
        "ferry_udp_relay_session_events_total{event=\"evicted\"}",
        "ferry_udp_relay_session_drops_total{reason=\"rate_limited\"}",
    ] {
        assert_eq!(scrape.value(series), 0.0, "{series}");
    }
}

/// The refusals by reason, on the DERP side: a relayAllocate beyond the
/// connection's burst is refused at once with reason 6 (rate), and the
/// others name theirs.
#[test]
fn refusals_are_counted_by_reason_and_the_rate_refuses_at_once() {
    let _one = serial();
    let (mut s, _sessions) = with_sessions(|_| {});
    let (ak, bk) = (NodePrivate::generate(), NodePrivate::generate());
    let a = relay_client(&mut s, &ak);
    let plain = s.client(&bk);
    let _ = plain;
    let absent = NodePrivate::generate().public();
    let mut burst = Vec::new();
    for i in 0..40u32 {
        burst.extend(allocate(&absent, i));
    }
    s.d.receive(a, &burst);
    s.settle();
    let refused: Vec<(u32, u8)> = s
        .frames(a)
        .iter()
        .filter(|(ty, _)| *ty == frame::RELAY_REFUSED)
        .map(|(_, p)| {
            let r = rs::parse_refused(p).unwrap();
            (r.request_id, r.reason.to_u8())
        })
        .collect();
    assert_eq!(refused.len(), 40);
    assert!(
        refused[..32].iter().all(|&(_, why)| why == 1),
        "{refused:?}"
    );
    assert!(
        refused[32..].iter().all(|&(_, why)| why == 6),
        "{refused:?}"
    );
    assert_eq!(
        s.metric("ferry_relay_allocate_refused_total{reason=\"peer_not_here\"}"),
        32.0
    );
    assert_eq!(
        s.metric("ferry_relay_allocate_refused_total{reason=\"rate\"}"),
        8.0
    );
    // A quarter of a second later, one more token.
    s.advance(Duration::from_millis(250));
    s.d.receive(a, &allocate(&bk.public(), 99));
    s.settle();
    let r: Vec<_> = s
        .frames(a)
        .iter()
        .filter(|(ty, _)| *ty == frame::RELAY_REFUSED)
        .map(|(_, p)| rs::parse_refused(p).unwrap().reason)
        .collect();
    assert_eq!(r, [rs::RefuseReason::PeerNotCapable]);
    assert!(s.d.is_open(a));
}

/// A mesh peer that asked for the Ferry mesh extension floods meshSession
/// frames of every sort: each is dropped and counted by reason (a
/// well-formed one as `no_connection`: this relay has no link to it), and the
/// mesh connection stays open and keeps forwarding. From a mesh peer that
/// did not ask, the frame is an unknown one, as derper sees it.
#[test]
fn a_mesh_peer_flooding_mesh_sessions_is_counted_and_kept() {
    use ferry_proto::mesh_session::{self as ms, MeshMsg, MeshSession};
    let mesh_key = MeshKey([7; 32]);
    let key = mesh_key.clone();
    let mut s = Sim::new(move |cfg| cfg.mesh_key = Some(key));
    let vk = NodePrivate::generate();
    let v = s.client(&vk);
    let asked = ClientInfo {
        ferry_mesh: ms::VERSION,
        ..support::info(Some(mesh_key.clone()))
    };
    let peer = s.connect();
    s.greet_with(peer, &NodePrivate::generate(), &asked, &[]);
    let _ = s.frames(peer);
    let mut valid = Vec::new();
    ms::put_mesh_session(
        &mut valid,
        &MeshSession {
            dst: vk.public(),
            msg: MeshMsg::State {
                flags: ms::STATE_SESSIONS_ON,
                hosted: 1,
            },
        },
    );
    let mut unknown = valid.clone();
    unknown[frame::HEADER_LEN + 32] = 9;
    let mut malformed = Vec::new();
    frame::put_frame(
        &mut malformed,
        ms::MESH_SESSION,
        &valid[frame::HEADER_LEN..valid.len() - 1],
    );
    let mut oversize = Vec::new();
    frame::put_frame(&mut oversize, ms::MESH_SESSION, &[0; ms::MAX_BODY_LEN + 1]);
    const ROUNDS: usize = 50;
    for _ in 0..ROUNDS {
        for f in [&valid, &unknown, &malformed, &oversize] {
            s.d.receive(peer, f);
        }
        s.settle();
    }
    for (reason, n) in [
        ("no_connection", ROUNDS),
        ("unknown_kind", ROUNDS),
        ("malformed", ROUNDS),
        ("oversize", ROUNDS),
    ] {
        let series = format!("ferry_mesh_session_dropped_total{{reason=\"{reason}\"}}");
        assert_eq!(s.metric(&series), n as f64, "{series}");
    }
    assert!(s.d.is_open(peer), "the mesh connection was closed");
    let src = NodePublic::from_bytes([0xab; 32]);
    let mut fwd = Vec::new();
    frame::put_forward_packet(&mut fwd, &src, &vk.public(), b"still forwards");
    s.d.receive(peer, &fwd);
    s.settle();
    assert_eq!(s.packets(v), [(src, b"still forwards".to_vec())]);

    // A mesh peer that did not ask: an unknown frame, skipped unread.
    let plain = s.mesh_client(&NodePrivate::generate(), &mesh_key);
    let mut ping = Vec::new();
    frame::put_frame(&mut ping, FrameType::Ping as u8, b"12345678");
    s.d.receive(plain, &[valid.as_slice(), &ping].concat());
    s.settle();
    assert!(s.d.is_open(plain));
    let types: Vec<u8> = s.frames(plain).iter().map(|f| f.0).collect();
    assert_eq!(types, [FrameType::Pong as u8]);
    assert_eq!(
        s.metric("ferry_mesh_session_dropped_total{reason=\"no_connection\"}"),
        ROUNDS as f64
    );
}
