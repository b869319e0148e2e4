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

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use std::os::fd::AsFd;

use anyhow::{Context, Result};
use ferry_client::{
    Endpoint, EndpointError, EndpointOptions, Options, PathKind, PeerOptions, RelayOptions,
    SendError,
};
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_sys::sockopt::{set_buffer, Buffer};
use tokio::net::{TcpListener, UdpSocket};

use super::config::Config;
use super::metrics::{self, kind_label, DropReason, Metrics, PeerStats};

/// First and longest delay between attempts to reach the relays before
/// the first connection (afterwards the SDK reconnects by itself).
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(10);

/// How often the relays' state and the rejected count are looked at (the
/// SDK reports them as state, not as events).
const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// Probing of the active UDP path, faster than the SDK's default (500 ms,
/// dead after 1.5 s): a TCP connection inside the tunnel retransmits
/// 0.2, 0.6 and 1.4 s after a loss (its RTO doubling from 200 ms), so a
/// path declared dead within 1.25 s has the 1.4 s retransmission go out on
/// the next path, and the transfer stalls for about 1.5 s rather than 3.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);
const DEAD_AFTER: Duration = Duration::from_secs(1);

/// Socket buffer asked for on each peer socket, each way: WireGuard sends
/// in bursts (a TCP window at a time), and a datagram the kernel drops for
/// lack of room is lost before anything can count it.
const SOCKET_BUFFER: usize = 4 << 20;

/// What the tasks know of one peer.
struct PeerCtx {
    name: String,
    key: NodePublic,
    relay: usize,
    wireguard: SocketAddr,
    socket: Arc<UdpSocket>,
    stats: Arc<PeerStats>,
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
        let socket = UdpSocket::bind(p.endpoint)
            .await
            .with_context(|| format!("{}.endpoint: binding {}", p.field, p.endpoint))?;
        for which in [Buffer::Receive, Buffer::Send] {
            if let Err(e) = set_buffer(socket.as_fd(), which, SOCKET_BUFFER) {
                tracing::warn!(peer = %p.name, error = %e, "could not size the peer socket's buffer");
            }
        }
        peers.push(PeerCtx {
            name: p.name.clone(),
            key: p.link_key,
            relay: p.relay,
            wireguard: p.wireguard,
            socket: Arc::new(socket),
            stats: metrics.peer(i),
        });
    }
    let peers: Arc<[PeerCtx]> = peers.into();
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = cfg.metrics_addr {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("metrics_addr: binding {addr}"))?;
        tracing::info!(url = %format!("http://{addr}/metrics"), "metrics");
        tasks.spawn(metrics::serve(listener, metrics.clone()));
    }
    for (p, cp) in peers.iter().zip(&cfg.peers) {
        tracing::info!(
            peer = %p.name,
            link_key = %p.key,
            endpoint = %cp.endpoint,
            wireguard = %p.wireguard,
            relay = %cfg.relays[p.relay].name,
            prefer = ?cp.prefer,
            only = ?cp.only,
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
        ));
    }
    let relays: Vec<RelayOptions> = cfg
        .relays
        .iter()
        .zip(options)
        .map(|(r, options)| RelayOptions {
            name: r.name.clone(),
            url: r.url.clone(),
            options,
            stun: r.stun,
        })
        .collect();
    let mut opts = EndpointOptions::new(key, relays);
    opts.bind = cfg.bind;
    opts.queue = cfg.queue;
    opts.timing.probe_interval = PROBE_INTERVAL;
    opts.timing.dead_after = DEAD_AFTER;
    let bound = bind(opts, &metrics);
    tokio::pin!(stop);
    let ep = tokio::select! {
        ep = bound => ep?,
        () = &mut stop => {
            tasks.shutdown().await;
            return Ok(());
        }
    };
    tracing::info!(udp = %ep.local_addr(), candidates = ?ep.local_candidates(), "paths: direct and relay sessions from this UDP socket, DERP as the floor");
    for (p, cp) in peers.iter().zip(&cfg.peers) {
        ep.add_peer(
            p.key,
            PeerOptions {
                relay: p.relay,
                prefer: cp.prefer,
                only: cp.only,
            },
        );
    }
    let ep = Arc::new(ep);
    metrics.set_endpoint(ep.clone());
    let _ = endpoint.set(ep.clone());
    let by_key: Arc<HashMap<NodePublic, usize>> =
        Arc::new(peers.iter().enumerate().map(|(i, p)| (p.key, i)).collect());
    tasks.spawn(inbound(ep.clone(), peers.clone(), by_key.clone()));
    tasks.spawn(switches(ep.clone(), peers.clone(), by_key));
    tasks.spawn(watch(ep, metrics));
    stop.await;
    tasks.shutdown().await;
    Ok(())
}

/// Binds the endpoint, retrying with backoff while a relay cannot be
/// reached for the first time.
async fn bind(opts: EndpointOptions, metrics: &Metrics) -> Result<Endpoint> {
    let mut delay = FIRST_RETRY;
    loop {
        match Endpoint::bind(opts.clone()).await {
            Ok(ep) => return Ok(ep),
            Err(EndpointError::Derp { name, source }) => {
                if let Some(i) = opts.relays.iter().position(|r| r.name == name) {
                    metrics.relay(i).disconnects.fetch_add(1, Relaxed);
                }
                tracing::warn!(relay = %name, error = %source, retry_in = ?delay, "relay unreachable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY);
            }
            Err(e @ EndpointError::Bind { .. }) => return Err(e).context("bind"),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Local WireGuard → the endpoint.
async fn outbound(
    peers: Arc<[PeerCtx]>,
    index: usize,
    endpoint: Arc<OnceLock<Arc<Endpoint>>>,
    metrics: Arc<Metrics>,
) {
    let peer = &peers[index];
    let relay = metrics.relay(peer.relay);
    let mut buf = vec![0u8; 1 << 16];
    let mut warned_foreign = false;
    loop {
        let (n, from) = match peer.socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(peer = %peer.name, error = %e, "receive error on the peer's socket");
                continue;
            }
        };
        if from != peer.wireguard {
            peer.stats.count_drop(DropReason::NotWireguard);
            if !std::mem::replace(&mut warned_foreign, true) {
                tracing::warn!(
                    peer = %peer.name,
                    %from,
                    wireguard = %peer.wireguard,
                    "dropping datagrams sent to the peer's endpoint from an address other than the local WireGuard's (counted as not_wireguard; logged once)"
                );
            }
            continue;
        }
        let Some(ep) = endpoint.get() else {
            peer.stats.count_drop(DropReason::RelayDown);
            continue;
        };
        // On DERP with the relay down the datagram could only wait.
        if peer.stats.current() == Some(PathKind::Derp) && !relay.connected.load(Relaxed) {
            peer.stats.count_drop(DropReason::RelayDown);
            continue;
        }
        match ep.send(&peer.key, &buf[..n]) {
            Ok(()) => {}
            Err(SendError::TooLarge { .. }) => peer.stats.count_drop(DropReason::TooLarge),
            Err(SendError::NoPath) => peer.stats.count_drop(DropReason::NoPath),
            Err(SendError::Dropped) => peer.stats.count_drop(DropReason::QueueFull),
            Err(SendError::UnknownPeer) => return,
        }
    }
}

/// The endpoint → the local WireGuard, from the sender's socket.
async fn inbound(
    ep: Arc<Endpoint>,
    peers: Arc<[PeerCtx]>,
    by_key: Arc<HashMap<NodePublic, usize>>,
) {
    while let Ok((src, data)) = ep.recv().await {
        // The endpoint delivers only its peers' datagrams.
        let Some(&i) = by_key.get(&src) else { continue };
        let peer = &peers[i];
        match peer.socket.send_to(&data, peer.wireguard).await {
            Ok(_) => {
                if !peer.stats.heard.swap(true, Relaxed) {
                    tracing::info!(peer = %peer.name, "peer reachable: its datagrams arrive");
                }
            }
            Err(e) => {
                peer.stats.count_drop(DropReason::DeliverFailed);
                tracing::debug!(peer = %peer.name, error = %e, "could not hand a datagram to the local WireGuard");
            }
        }
    }
}

/// Every path switch: one log line with the reason, and the counters.
async fn switches(
    ep: Arc<Endpoint>,
    peers: Arc<[PeerCtx]>,
    by_key: Arc<HashMap<NodePublic, usize>>,
) {
    let mut events = ep.subscribe();
    loop {
        let ev = match events.recv().await {
            Ok(ev) => ev,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "path switches came faster than they were logged"
                );
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        let Some(&i) = by_key.get(&ev.peer) else {
            continue;
        };
        let peer = &peers[i];
        peer.stats.switched(&ev);
        let show =
            |p: &Option<ferry_client::PathAddr>| p.map_or("none".to_owned(), |p| p.to_string());
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
}

/// The relays' connection state and the endpoint's rejected count, as
/// log lines and counters.
async fn watch(ep: Arc<Endpoint>, metrics: Arc<Metrics>) {
    let mut rejected_logged = 0u64;
    let mut tick = tokio::time::interval(WATCH_INTERVAL);
    loop {
        tick.tick().await;
        for (i, r) in ep.relay_status().into_iter().enumerate() {
            let s = metrics.relay(i);
            let was = s.connected.swap(r.connected, Relaxed);
            match (was, r.connected) {
                (false, true) => {
                    s.connects.fetch_add(1, Relaxed);
                    tracing::info!(relay = %r.name, url = %r.url, stun = ?r.stun, "relay connected");
                }
                (true, false) => {
                    s.disconnects.fetch_add(1, Relaxed);
                    tracing::warn!(relay = %r.name, "relay connection lost; reconnecting");
                }
                _ => {}
            }
            let public = r.public_addr;
            if s.note_public(public) {
                tracing::info!(relay = %r.name, public = ?public, "this side's address as the relay's STUN server sees it");
            }
        }
        let rejected = ep.stats().rejected;
        let before = metrics.rejected.swap(rejected, Relaxed);
        // A few lines; the counter has the rest.
        if rejected > before && rejected_logged < 16 {
            rejected_logged += 1;
            tracing::warn!(
                count = rejected - before,
                "dropped datagrams that were not from a configured peer (an unknown link key, or not a peer message)"
            );
        }
    }
}
