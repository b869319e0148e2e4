//! The data path: WireGuard's datagrams to and from the peers, over the
//! SDK's [`Endpoint`] (direct UDP, a relay session or DERP, whichever
//! works best now).
//!
//! ```text
//! local WireGuard ──UDP──▶ peer socket (its Endpoint) ──▶ Endpoint::send ──path──▶ peer's ferry link
//! local WireGuard ◀──UDP── peer socket ◀── Endpoint::recv ◀──path── peer's ferry link
//! ```
//!
//! Each peer has one UDP socket, bound to the address the local WireGuard
//! knows as that peer's endpoint; both directions use it, so WireGuard
//! sees one stable endpoint per peer whatever the path. The `Endpoint`
//! picks the path per peer and switches it; this module logs every switch
//! with its reason and counts. A datagram that cannot go out now is dropped
//! and counted, never held: WireGuard retransmits its handshakes, and TCP
//! inside the tunnel its data. Nothing is decrypted or parsed: the bytes go
//! through as they came.
//!
//! Both directions move batches: a peer socket is read with `recvmmsg`
//! and UDP GRO (WireGuard's trains come in whole and are cut at their
//! segment size) and each batch goes to [`Endpoint::send_batch`] in one
//! call; what [`Endpoint::recv_batch`] hands over goes to WireGuard with
//! `sendmmsg`, runs of equal size as UDP GSO trains.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use std::os::fd::AsFd;

use anyhow::{Context, Result};
use ferry_client::endpoint::{gro_segments, Datagrams, UdpBatchSender};
use ferry_client::{
    DerpServerOptions, Endpoint, EndpointOptions, EventKind, Events, Options, PathEvent, PathKind,
    PathMtu, PeerOptions,
};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_sys::mmsg::{RecvBatch, RecvMeta};
use ferry_sys::sockopt::{set_buffer, Buffer};
use tokio::io::Interest;
use tokio::net::UdpSocket;

use super::config::Config;
use super::metrics::{self, kind_label, DropReason, Metrics, PeerStats};

/// How often the endpoint's counters are looked at: for the first
/// datagrams rejected as not from a configured peer, and for peers that
/// have not answered.
const REJECTED_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// A peer none of whose paths has answered a probe this long after the
/// start is logged as not answering (once): its link is not running, not
/// connected to the relay, or does not know this side's link key. A
/// relay says nothing of a key that never connected.
const UNANSWERED_AFTER: Duration = Duration::from_secs(10);

/// Socket buffer asked for on each peer socket, each way: WireGuard sends
/// in bursts (a TCP window at a time), and a datagram the kernel drops for
/// lack of room is lost before anything can count it.
const SOCKET_BUFFER: usize = 4 << 20;

/// Receive slots per `recvmmsg` on a peer socket, and each slot's size
/// (a whole GRO train, or the largest datagram).
const RECV_SLOTS: usize = 16;
const RECV_SLOT: usize = 1 << 16;

/// What the tasks know of one peer.
struct PeerCtx {
    name: String,
    key: NodePublic,
    relay: usize,
    wireguard: SocketAddr,
    socket: Arc<UdpSocket>,
    /// Whether the socket takes UDP GSO trains (asked once, at the bind).
    gso: bool,
    stats: Arc<PeerStats>,
}

/// Binds one peer's socket, sized for WireGuard's bursts, with UDP GRO on
/// (best effort: without it each datagram takes a slot of its own, and
/// the kernel cuts every train WireGuard sends back into datagrams before
/// the socket gets them). Returns it with whether it takes GSO trains,
/// asked before GRO is turned on so that the asking cannot turn it off.
async fn peer_socket(addr: SocketAddr, name: &str) -> std::io::Result<(UdpSocket, bool)> {
    let socket = UdpSocket::bind(addr).await?;
    for which in [Buffer::Receive, Buffer::Send] {
        if let Err(e) = set_buffer(socket.as_fd(), which, SOCKET_BUFFER) {
            tracing::warn!(peer = %name, error = %e, "could not size the peer socket's buffer");
        }
    }
    let gso = ferry_sys::gso::probe(socket.as_fd()).gso;
    let _ = ferry_sys::gso::set_gro(socket.as_fd(), true);
    Ok((socket, gso))
}

/// Binds every socket (errors name the configuration key), starts the
/// tasks, and runs until `stop` resolves.
pub(crate) async fn run(
    cfg: Config,
    key: NodePrivate,
    options: Vec<Options>,
    metrics: Arc<Metrics>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let mut peers = Vec::with_capacity(cfg.peers.len());
    for (i, p) in cfg.peers.iter().enumerate() {
        let (socket, gso) = peer_socket(p.endpoint, &p.name)
            .await
            .with_context(|| format!("{}.endpoint: binding {}", p.field, p.endpoint))?;
        peers.push(PeerCtx {
            name: p.name.clone(),
            key: p.link_key,
            relay: p.relay,
            wireguard: p.wireguard,
            socket: Arc::new(socket),
            gso,
            stats: metrics.peer(i),
        });
    }
    let peers: Arc<[PeerCtx]> = peers.into();
    let mut tasks = tokio::task::JoinSet::new();
    // Served from threads of its own until this function returns.
    let _scrapes = match cfg.metrics_addr {
        Some(addr) => {
            let listener = std::net::TcpListener::bind(addr)
                .with_context(|| format!("metrics_addr: binding {addr}"))?;
            tracing::info!(url = %format!("http://{addr}/metrics"), "metrics");
            Some(
                metrics::serve(listener, metrics.clone())
                    .context("starting the metrics listener")?,
            )
        }
        None => None,
    };
    for (p, cp) in peers.iter().zip(&cfg.peers) {
        tracing::info!(
            peer = %p.name,
            link_key = %p.key,
            endpoint = %cp.endpoint,
            wireguard = %p.wireguard,
            relay = %cfg.relays[p.relay].name,
            prefer = %cp.prefer.map_or("none", kind_label),
            only = %cp.only.map_or("none", kind_label),
            "peer: its WireGuard endpoint here is {}",
            cp.endpoint
        );
    }
    // The endpoint once it is up; datagrams before that are dropped.
    let endpoint: Arc<OnceLock<Arc<Endpoint>>> = Arc::default();
    for i in 0..peers.len() {
        tasks.spawn(outbound(
            peers.clone(),
            i,
            endpoint.clone(),
            metrics.clone(),
            // Half the DERP queue a batch: the writer drains it between two.
            (cfg.queue / 2).max(1),
        ));
    }
    let relays: Vec<DerpServerOptions> = cfg
        .relays
        .iter()
        .zip(options)
        .map(|(r, options)| {
            let d = DerpServerOptions::new(r.name.clone(), r.url.clone())
                .with_fallback_urls(r.fallback_urls.clone())
                .with_options(options);
            match r.stun {
                Some(stun) => d.with_stun(stun),
                None => d,
            }
        })
        .collect();
    let mut opts = EndpointOptions::new(key, relays);
    opts.bind = cfg.bind;
    opts.queue = cfg.queue;
    opts.home = cfg.home;
    // Probing of the active UDP path faster than the SDK's default, for
    // the TCP inside the tunnel (see `Timing::for_tunnels`).
    opts.timing = ferry_client::endpoint::Timing::for_tunnels();
    // A relay that cannot be reached does not fail this: the endpoint
    // retries it in the background and says so (its log lines, events).
    let bound = Endpoint::bind(opts);
    tokio::pin!(stop);
    let ep = tokio::select! {
        ep = bound => ep.context("starting the endpoint")?,
        () = &mut stop => {
            tasks.shutdown().await;
            return Ok(());
        }
    };
    let candidates: Vec<String> = ep
        .local_candidates()
        .iter()
        .map(ToString::to_string)
        .collect();
    tracing::info!(udp = %ep.local_addr(), candidates = %candidates.join(" "), "paths: direct and relay sessions from this UDP socket, DERP as the floor");
    tracing::info!(
        mtu = wireguard_mtu(),
        "WireGuard interface MTU to set: at most {}, so that its packets cross every path without IP fragmentation",
        wireguard_mtu()
    );
    for (p, cp) in peers.iter().zip(&cfg.peers) {
        let mut o = PeerOptions::new().relay(p.relay);
        o.prefer = cp.prefer;
        o.only = cp.only;
        ep.add_peer(p.key, o)
            .with_context(|| format!("peer {}", p.name))?;
    }
    let ep = Arc::new(ep);
    // Subscribed before anything else runs, so no event is missed.
    let events = ep.events();
    metrics.set_endpoint(ep.clone());
    let _ = endpoint.set(ep.clone());
    let by_key: Arc<HashMap<NodePublic, usize>> =
        Arc::new(peers.iter().enumerate().map(|(i, p)| (p.key, i)).collect());
    tasks.spawn(inbound(ep.clone(), peers.clone(), by_key.clone()));
    tasks.spawn(react(ep, events, peers.clone(), by_key, metrics));
    stop.await;
    tasks.shutdown().await;
    Ok(())
}

/// What WireGuard adds to each packet it tunnels: its data message's
/// 16-byte header and 16-byte tag.
const WIREGUARD_OVERHEAD: usize = 32;

/// The largest WireGuard interface MTU whose packets every path carries
/// without IP fragmentation on a 1,500-byte network: the smallest
/// unfragmented limit of the SDK's paths (a relay session's, whose far
/// leg may be IPv6) less WireGuard's overhead.
fn wireguard_mtu() -> usize {
    let paths = [
        PathMtu::RELAY_SESSION,
        PathMtu::direct(std::net::SocketAddr::from((
            std::net::Ipv6Addr::LOCALHOST,
            1,
        ))),
        PathMtu::DERP,
    ];
    paths
        .iter()
        .map(|m| m.unfragmented)
        .min()
        .expect("three paths")
        - WIREGUARD_OVERHEAD
}

/// Local WireGuard → the endpoint: what one `recvmmsg` brings goes to
/// [`Endpoint::send_batch`] in batches of at most `chunk` datagrams, the
/// task yielding after each so that the endpoint's other tasks (the DERP
/// writer draining its queue) run between two.
async fn outbound(
    peers: Arc<[PeerCtx]>,
    index: usize,
    endpoint: Arc<OnceLock<Arc<Endpoint>>>,
    metrics: Arc<Metrics>,
    chunk: usize,
) {
    let peer = &peers[index];
    let relay = metrics.relay(peer.relay);
    let mut rx = RecvBatch::new();
    let mut buf = vec![0u8; RECV_SLOTS * RECV_SLOT];
    let mut meta = vec![RecvMeta::default(); RECV_SLOTS];
    let mut batch = Datagrams::new();
    let mut warned_foreign = false;
    loop {
        let received = match peer.socket.readable().await {
            Ok(()) => peer.socket.try_io(Interest::READABLE, || {
                rx.recv(peer.socket.as_fd(), &mut buf, RECV_SLOT, &mut meta)
            }),
            Err(e) => Err(e),
        };
        let n = match received {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::debug!(peer = %peer.name, error = %e, "receive error on the peer's socket");
                continue;
            }
        };
        batch.clear();
        for (i, m) in meta[..n].iter().enumerate() {
            let slot = &buf[i * RECV_SLOT..i * RECV_SLOT + m.len];
            if m.src != Some(peer.wireguard) {
                let datagrams = gro_segments(slot, m.segment).count();
                peer.stats.count_drops(DropReason::NotWireguard, datagrams);
                if !std::mem::replace(&mut warned_foreign, true) {
                    tracing::warn!(
                        peer = %peer.name,
                        from = %m.src.map_or_else(|| "unknown".to_owned(), |a| a.to_string()),
                        wireguard = %peer.wireguard,
                        "dropping datagrams sent to the peer's endpoint from an address other than the local WireGuard's (counted as not_wireguard; logged once)"
                    );
                }
                continue;
            }
            for datagram in gro_segments(slot, m.segment) {
                batch.push(&peer.key, datagram);
                if batch.len() >= chunk {
                    if !to_endpoint(peer, &endpoint, &relay, &mut batch) {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            }
        }
        if !to_endpoint(peer, &endpoint, &relay, &mut batch) {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Sends `batch` (one peer's datagrams) on, counts what was dropped, and
/// empties it; `false` when the endpoint no longer knows the peer.
fn to_endpoint(
    peer: &PeerCtx,
    endpoint: &OnceLock<Arc<Endpoint>>,
    relay: &metrics::RelayStats,
    batch: &mut Datagrams,
) -> bool {
    let n = batch.len();
    if n == 0 {
        return true;
    }
    let ep = match endpoint.get() {
        // On DERP with the relay down the datagrams could only wait.
        Some(ep)
            if peer.stats.current() != Some(PathKind::Derp) || relay.connected.load(Relaxed) =>
        {
            ep
        }
        _ => {
            peer.stats.count_drops(DropReason::RelayDown, n);
            batch.clear();
            return true;
        }
    };
    let r = ep.try_send_batch(batch);
    batch.clear();
    peer.stats.count_drops(DropReason::TooLarge, r.too_large);
    peer.stats.count_drops(DropReason::NoPath, r.no_path);
    peer.stats
        .count_drops(DropReason::QueueFull, r.queue_full + r.closed + r.io);
    r.unknown_peer == 0
}

/// The endpoint → the local WireGuard, from the sender's socket: each
/// received batch's runs of one peer's datagrams leave in `sendmmsg`
/// calls (GSO trains where sizes allow). Nothing here waits for a peer
/// socket ([`deliver`]), so one peer whose socket is full never holds up
/// the others.
async fn inbound(
    ep: Arc<Endpoint>,
    peers: Arc<[PeerCtx]>,
    by_key: Arc<HashMap<NodePublic, usize>>,
) {
    let mut batch = Datagrams::new();
    let mut senders = senders(&peers);
    let mut run: Vec<(SocketAddr, Range<usize>)> = Vec::new();
    while ep.recv_batch(&mut batch).await.is_ok() {
        deliver_batch(&peers, &mut senders, &by_key, &batch, &mut run);
    }
}

/// One sender per peer socket, towards the local WireGuard.
fn senders(peers: &[PeerCtx]) -> Vec<UdpBatchSender> {
    peers
        .iter()
        .map(|p| UdpBatchSender::with_gso(p.gso))
        .collect()
}

/// Hands one batch from the endpoint to the local WireGuard: each run of
/// one peer's datagrams leaves from that peer's socket.
fn deliver_batch(
    peers: &[PeerCtx],
    senders: &mut [UdpBatchSender],
    by_key: &HashMap<NodePublic, usize>,
    batch: &Datagrams,
    run: &mut Vec<(SocketAddr, Range<usize>)>,
) {
    let mut current = None;
    for (key, range) in batch.ranges() {
        // The endpoint delivers only its peers' datagrams.
        let Some(&i) = by_key.get(key) else { continue };
        if current != Some(i) {
            if let Some(c) = current {
                deliver(&peers[c], &mut senders[c], batch.bytes(), run);
            }
            current = Some(i);
        }
        run.push((peers[i].wireguard, range));
    }
    if let Some(c) = current {
        deliver(&peers[c], &mut senders[c], batch.bytes(), run);
    }
}

/// Hands `run` (ranges of `bytes`) to the local WireGuard from the peer's
/// socket, and empties it. It never waits for the socket: what the socket
/// will not take now (its send buffer is full: the way to the local
/// WireGuard holds what was sent before) is dropped and counted as
/// `local_socket_full`, as a full queue towards a peer is, so that one
/// peer's full socket cannot hold up the delivery to every other peer.
fn deliver(
    peer: &PeerCtx,
    sender: &mut UdpBatchSender,
    bytes: &[u8],
    run: &mut Vec<(SocketAddr, Range<usize>)>,
) {
    let (mut sent, mut done) = (0, 0);
    while done < run.len() {
        let r = sender.send(&peer.socket, bytes, &run[done..]);
        sent += r.sent;
        done += r.consumed;
        peer.stats
            .deliver_gso_fallbacks
            .fetch_add(r.fallbacks as u64, Relaxed);
        if r.consumed == 0 {
            // The socket would block.
            break;
        }
    }
    let (full, failed) = (run.len() - done, done - sent);
    peer.stats.count_drops(DropReason::LocalSocketFull, full);
    peer.stats.count_drops(DropReason::DeliverFailed, failed);
    if full + failed > 0 {
        tracing::debug!(peer = %peer.name, full, failed, "could not hand datagrams to the local WireGuard");
    }
    if sent > 0 && !peer.stats.heard.swap(true, Relaxed) {
        tracing::info!(peer = %peer.name, "peer reachable: its datagrams arrive");
    }
    run.clear();
}

/// Reacts to the endpoint's events: every path switch one log line with
/// its reason and the counters; the relays' state copied to the metrics
/// at each change (the endpoint logs the changes themselves); peers gone
/// from their relay and back, by name. A sender over DERP whose link key
/// is no configured peer is logged once, with its key; datagrams rejected
/// otherwise are logged once, the first time; after that
/// `ferry_link_rejected_total` counts them.
async fn react(
    ep: Arc<Endpoint>,
    mut events: Events,
    peers: Arc<[PeerCtx]>,
    by_key: Arc<HashMap<NodePublic, usize>>,
    metrics: Arc<Metrics>,
) {
    // What happened before the subscription (the first attempts).
    relays_changed(&ep, &metrics);
    let mut rejected_logged = false;
    let mut rejected_before = 0u64;
    let started = tokio::time::Instant::now();
    let mut answered = vec![false; peers.len()];
    let mut tick = tokio::time::interval(REJECTED_LOG_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ev = tokio::select! {
            ev = events.recv() => ev,
            _ = tick.tick() => {
                // One line; ferry_link_rejected_total has the rest. It
                // waits a tick, so that the endpoint's event naming an
                // unknown key (counted first, published right after) comes
                // first and stands for it.
                let rejected = ep.stats().rejected.total();
                if !rejected_logged && rejected_before > 0 {
                    rejected_logged = true;
                    tracing::warn!(
                        "dropped datagrams that were not from a configured peer (not a peer message, or from an unknown address or link key); logged once, counted in ferry_link_rejected_total"
                    );
                }
                rejected_before = rejected;
                if started.elapsed() >= UNANSWERED_AFTER {
                    unanswered(&ep, &peers, &mut answered);
                }
                continue;
            }
        };
        let Some(ev) = ev else { return };
        match ev.kind {
            EventKind::Lagged { missed } => {
                tracing::warn!(missed, "endpoint events came faster than they were handled");
                relays_changed(&ep, &metrics);
            }
            EventKind::Path(ev) => {
                if let Some(&i) = by_key.get(&ev.peer) {
                    switched(&peers[i], &ev);
                }
            }
            EventKind::RelayUp { .. } | EventKind::RelayDown { .. } => {
                relays_changed(&ep, &metrics);
            }
            EventKind::PeerGone { peer, reason } => {
                if let Some(&i) = by_key.get(&peer) {
                    tracing::warn!(
                        peer = %peers[i].name,
                        link_key = %peer,
                        ?reason,
                        "peer not connected to its relay (not started, gone, or a wrong link_key); its probes continue and its datagrams are sent as they come"
                    );
                }
            }
            EventKind::UnknownSender { key } => {
                // The endpoint reports each key once.
                rejected_logged = true;
                tracing::warn!(
                    link_key = %key,
                    "messages over the relay from a link key that is no configured peer: a peer whose ferry link runs with another key than its link_key here (or one not configured here); logged once per key, counted in ferry_link_rejected_total"
                );
            }
            EventKind::PeerPresent { peer } => {
                if let Some(&i) = by_key.get(&peer) {
                    tracing::info!(peer = %peers[i].name, "peer back on its relay");
                }
            }
            _ => {}
        }
    }
}

/// Logs, once each, the peers none of whose paths has answered yet.
fn unanswered(ep: &Endpoint, peers: &[PeerCtx], answered: &mut [bool]) {
    for (p, done) in peers.iter().zip(answered.iter_mut()) {
        if *done {
            continue;
        }
        *done = true;
        let heard = ep
            .peer_status(&p.key)
            .is_some_and(|st| st.paths.iter().any(|path| path.stats.pongs > 0));
        if !heard {
            tracing::warn!(
                peer = %p.name,
                link_key = %p.key,
                this_side = %ep.public_key(),
                "peer not answering after {} s: is its ferry link running and connected to the relay, with this side's link key in its configuration (and is this link_key its own)? probing continues",
                UNANSWERED_AFTER.as_secs()
            );
        }
    }
}

/// The relays' state and counters as the endpoint has them now.
fn relays_changed(ep: &Endpoint, metrics: &Metrics) {
    for (i, r) in ep.relay_status().into_iter().enumerate() {
        let s = metrics.relay(i);
        s.connected.store(r.connected, Relaxed);
        let node = r.node.and_then(|u| s.nodes.iter().position(|n| *n == u));
        s.node.store(node.map_or(0, |i| i as u64 + 1), Relaxed);
        s.connects.store(r.connects, Relaxed);
        s.disconnects.store(r.failures, Relaxed);
    }
}

/// One path switch: a log line with the reason, and the counters.
fn switched(peer: &PeerCtx, ev: &PathEvent) {
    peer.stats.switched(ev);
    let show = |p: &Option<ferry_client::PathAddr>| p.map_or("none".to_owned(), |p| p.to_string());
    tracing::info!(
        peer = %peer.name,
        from = %show(&ev.from),
        to = %show(&ev.to),
        reason = metrics::reason_label(ev.reason),
        possibly_lost = ev.lost,
        "path switch: {} -> {} ({})",
        ev.from.map_or("none", |p| kind_label(p.kind())),
        ev.to.map_or("none", |p| kind_label(p.kind())),
        metrics::reason_text(ev.reason),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs `ip` with `args` inside namespace `ns`.
    fn ip(ns: &str, args: &[&str]) {
        let out = Command::new("ip")
            .args(["-n", ns])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
    }

    fn peer(name: &str, socket: UdpSocket, wireguard: SocketAddr) -> PeerCtx {
        PeerCtx {
            name: name.into(),
            key: NodePrivate::generate().public(),
            relay: 0,
            wireguard,
            gso: ferry_sys::gso::probe(socket.as_fd()).gso,
            socket: Arc::new(socket),
            stats: Arc::default(),
        }
    }

    /// WireGuard's burst, sent as one GSO train to a peer socket set up
    /// as the link sets it up (bound, then its sender made), is read by
    /// one `recvmmsg` as one GRO message cut at the segment size: the
    /// kernel did not cut it into datagrams on the way in.
    #[tokio::test]
    async fn a_peer_socket_reads_a_wireguard_train_whole() {
        use ferry_sys::mmsg::{OutMsg, SendBatch, Span};
        let wireguard = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let offloads = ferry_sys::gso::probe(wireguard.as_fd());
        if !(offloads.gso && offloads.gro) {
            return ferry_testkit::skip!("this kernel lacks UDP GSO or GRO ({offloads:?})");
        }
        let (socket, gso) = peer_socket("127.0.0.1:0".parse().unwrap(), "p")
            .await
            .unwrap();
        assert!(gso, "GSO as on the socket WireGuard sends from");
        let peers = [PeerCtx {
            name: "p".into(),
            key: NodePrivate::generate().public(),
            relay: 0,
            wireguard: wireguard.local_addr().unwrap(),
            socket: Arc::new(socket),
            gso,
            stats: Arc::default(),
        }];
        let _senders = senders(&peers);
        const SIZE: usize = 1000;
        let bytes: Vec<u8> = (0..10 * SIZE).map(|i| (i % 251) as u8).collect();
        let spans: Vec<Span> = (0..10)
            .map(|i| Span {
                start: i * SIZE,
                len: SIZE,
            })
            .collect();
        let msgs = [OutMsg {
            dst: Some(peers[0].socket.local_addr().unwrap()),
            first: 0,
            count: spans.len(),
            segment: SIZE as u16,
        }];
        let sent = SendBatch::new()
            .send(wireguard.as_fd(), &bytes, &spans, &msgs)
            .unwrap();
        assert_eq!(sent, 1, "one GSO message");
        let socket = &peers[0].socket;
        let mut rx = RecvBatch::new();
        let mut buf = vec![0u8; RECV_SLOTS * RECV_SLOT];
        let mut meta = vec![RecvMeta::default(); RECV_SLOTS];
        let n = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                socket.readable().await.unwrap();
                match socket.try_io(Interest::READABLE, || {
                    rx.recv(socket.as_fd(), &mut buf, RECV_SLOT, &mut meta)
                }) {
                    Ok(n) => return n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await
        .expect("the train arrives");
        assert_eq!(
            (n, meta[0].len, meta[0].segment),
            (1, bytes.len(), SIZE),
            "one message holding the whole train, cut at {SIZE} bytes"
        );
        assert_eq!(&buf[..bytes.len()], &bytes[..]);
    }

    /// Peer "stuck"'s local WireGuard sits behind a neighbour that never
    /// answers (a veth whose other end has no address, probed once every
    /// ten minutes), and its socket has the smallest send buffer: after a
    /// datagram or two every send would block. Peer "fine" delivers on
    /// loopback. One batch holds both peers' datagrams, stuck's first;
    /// every one of fine's must be with its WireGuard when the batch has
    /// been handed over, which must not wait for stuck's socket.
    #[test]
    fn one_full_local_socket_does_not_hold_up_the_other_peers() {
        let Some(ns) = ferry_testkit::netns::Netns::new("link-full", 65536) else {
            return;
        };
        let name = ns.name().to_string();
        ip(
            &name,
            &["link", "add", "v0", "type", "veth", "peer", "name", "v1"],
        );
        ip(&name, &["addr", "add", "10.99.0.1/24", "dev", "v0"]);
        ip(&name, &["link", "set", "v0", "up"]);
        ip(&name, &["link", "set", "v1", "up"]);
        const EACH: usize = 32;
        let (stuck_dropped, stuck_full, fine_got, fine_dropped) = ns.run(|| {
            std::fs::write("/proc/sys/net/ipv4/neigh/v0/retrans_time_ms", "600000").unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let stuck_socket = UdpSocket::bind("10.99.0.1:0").await.unwrap();
                set_buffer(stuck_socket.as_fd(), Buffer::Send, 1).unwrap();
                let stuck = peer("stuck", stuck_socket, "10.99.0.2:51820".parse().unwrap());
                let wireguard = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                wireguard.set_nonblocking(true).unwrap();
                let fine_socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
                let fine = peer("fine", fine_socket, wireguard.local_addr().unwrap());
                let mut batch = Datagrams::new();
                // Sizes all different: no GSO train (one buffer) forms.
                for i in 0..EACH {
                    batch.push(&stuck.key, &vec![i as u8; 1000 + i]);
                }
                for i in 0..EACH {
                    batch.push(&fine.key, &[i as u8; 100]);
                }
                let peers = [stuck, fine];
                let by_key: HashMap<NodePublic, usize> =
                    peers.iter().enumerate().map(|(i, p)| (p.key, i)).collect();
                let mut senders: Vec<UdpBatchSender> = peers
                    .iter()
                    .map(|p| UdpBatchSender::new(&p.socket))
                    .collect();
                // Seen writable by the reactor, as a running link's sockets are.
                for p in &peers {
                    p.socket.writable().await.unwrap();
                }
                let mut run = Vec::new();
                // A bound for the test only: handing a batch over waits
                // for no socket, so it takes microseconds.
                let handed = tokio::time::timeout(Duration::from_secs(10), async {
                    deliver_batch(&peers, &mut senders, &by_key, &batch, &mut run)
                })
                .await;
                assert!(
                    handed.is_ok(),
                    "handing the batch over waited for the stuck peer's socket"
                );
                let mut got = 0;
                let mut buf = [0u8; 2048];
                while wireguard.recv(&mut buf).is_ok() {
                    got += 1;
                }
                let dropped = |p: &PeerCtx| {
                    DropReason::ALL
                        .iter()
                        .map(|&why| p.stats.dropped(why))
                        .sum::<u64>()
                };
                let full = peers[0].stats.dropped(DropReason::LocalSocketFull);
                (dropped(&peers[0]), full, got, dropped(&peers[1]))
            })
        });
        assert_eq!((fine_got, fine_dropped), (EACH, 0));
        assert!(
            stuck_dropped > 0 && stuck_dropped <= EACH as u64,
            "the stuck peer's datagrams the socket would not take are counted: {stuck_dropped}"
        );
        assert_eq!(stuck_full, stuck_dropped, "as local_socket_full");
    }

    /// The MTU `ferry link` advises is the one docs/link.md gives.
    #[test]
    fn the_advised_wireguard_mtu_is_1412() {
        assert_eq!(super::wireguard_mtu(), 1412);
    }
}
