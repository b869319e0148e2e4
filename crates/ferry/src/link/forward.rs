//! The data path: WireGuard's datagrams to and from DERP.
//!
//! ```text
//! local WireGuard ──UDP──▶ peer socket (its Endpoint) ──queue──▶ relay writer ──DERP──▶ peer's link key
//! local WireGuard ◀──UDP── peer socket ◀── relay reader ◀──DERP── peer's link key
//! ```
//!
//! Each peer has one UDP socket, bound to the address the local WireGuard
//! knows as that peer's endpoint; both directions use it, so WireGuard
//! sees one stable endpoint per peer. Each relay has one DERP connection
//! (kept up by the SDK, with backoff), one bounded queue of datagrams
//! waiting to be written, and one reader. A datagram is dropped and
//! counted when the queue is full or the connection is down: WireGuard
//! retransmits its handshakes, and TCP inside the tunnel its data, so
//! nothing is held for a connection that is not there. Nothing is
//! decrypted or parsed: the bytes go through as they came.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use std::os::fd::AsFd;

use anyhow::{Context, Result};
use ferry_client::{DerpClient, DerpSender, Event, Options, Target};
use ferry_proto::frame::MAX_PACKET_SIZE;
use ferry_proto::key::{NodePrivate, NodePublic};
use ferry_sys::sockopt::{set_buffer, Buffer};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::mpsc;

use super::config::{Config, Relay};
use super::metrics::{self, DropReason, Metrics, PeerStats, RelayStats};

/// First and longest delay between attempts to reach a relay that has
/// never answered (afterwards the SDK reconnects by itself).
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(10);

/// Socket buffer asked for on each peer socket, each way: WireGuard sends
/// in bursts (a TCP window at a time), and a datagram the kernel drops for
/// lack of room is lost before anything can count it.
const SOCKET_BUFFER: usize = 4 << 20;

/// What the tasks know of one peer.
struct PeerCtx {
    name: String,
    key: NodePublic,
    wireguard: SocketAddr,
    socket: Arc<UdpSocket>,
    stats: Arc<PeerStats>,
}

/// A datagram waiting for a relay connection: the peer's index and the
/// bytes.
type Queued = (usize, Vec<u8>);

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
    let by_key: Arc<HashMap<NodePublic, usize>> = Arc::new(
        cfg.peers
            .iter()
            .enumerate()
            .map(|(i, p)| (p.link_key, i))
            .collect(),
    );
    let mut queues = Vec::with_capacity(cfg.relays.len());
    for ((i, relay), options) in cfg.relays.iter().enumerate().zip(options) {
        let (tx, rx) = mpsc::channel(cfg.queue);
        queues.push(tx);
        tasks.spawn(relay_task(RelayTask {
            relay: relay.clone(),
            key: key.clone(),
            options,
            queue: rx,
            peers: peers.clone(),
            by_key: by_key.clone(),
            stats: metrics.relay(i),
        }));
    }
    for (i, p) in cfg.peers.iter().enumerate() {
        tracing::info!(
            peer = %p.name,
            link_key = %p.link_key,
            endpoint = %p.endpoint,
            wireguard = %p.wireguard,
            relay = %cfg.relays[p.relay].name,
            "peer: its WireGuard endpoint here is {}; path DERP",
            p.endpoint
        );
        tasks.spawn(outbound(
            peers.clone(),
            i,
            queues[p.relay].clone(),
            metrics.relay(p.relay),
        ));
    }
    stop.await;
    tasks.shutdown().await;
    Ok(())
}

/// Local WireGuard → the peer's relay queue.
async fn outbound(
    peers: Arc<[PeerCtx]>,
    index: usize,
    queue: mpsc::Sender<Queued>,
    relay: Arc<RelayStats>,
) {
    let peer = &peers[index];
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
        if n > MAX_PACKET_SIZE {
            peer.stats.count_drop(DropReason::TooLarge);
            continue;
        }
        if !relay.connected.load(Relaxed) {
            peer.stats.count_drop(DropReason::RelayDown);
            continue;
        }
        match queue.try_send((index, buf[..n].to_vec())) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => peer.stats.count_drop(DropReason::QueueFull),
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}

/// The relay queue → DERP.
async fn writer(sender: DerpSender, mut queue: mpsc::Receiver<Queued>, peers: Arc<[PeerCtx]>) {
    while let Some((i, data)) = queue.recv().await {
        let peer = &peers[i];
        let len = data.len();
        match sender.send(&peer.key, data).await {
            Ok(()) => peer.stats.to_peer.add(len),
            // Not connected (or closing): WireGuard will send again.
            Err(_) => peer.stats.count_drop(DropReason::RelayDown),
        }
    }
}

struct RelayTask {
    relay: Relay,
    key: NodePrivate,
    options: Options,
    queue: mpsc::Receiver<Queued>,
    peers: Arc<[PeerCtx]>,
    by_key: Arc<HashMap<NodePublic, usize>>,
    stats: Arc<RelayStats>,
}

/// One relay: connects (retrying until the first connection is up; the
/// SDK keeps it up from then on), starts the writer, and reads.
async fn relay_task(t: RelayTask) {
    let name = &t.relay.name;
    let mut delay = FIRST_RETRY;
    let mut client = loop {
        let target = match Target::from_url(&t.relay.url) {
            Ok(target) => target,
            Err(e) => {
                // Checked when the file was read; cannot happen.
                tracing::error!(relay = %name, error = %e, "bad relay url");
                return;
            }
        };
        match DerpClient::connect_to(vec![target], t.key.clone(), t.options.clone()).await {
            Ok(c) => break c,
            Err(error) => {
                t.stats.disconnects.fetch_add(1, Relaxed);
                tracing::warn!(relay = %name, url = %t.relay.url, %error, retry_in = ?delay, "relay unreachable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY);
            }
        }
    };
    let writer = tokio::spawn(writer(client.sender(), t.queue, t.peers.clone()));
    let _abort_writer = AbortOnDrop(writer);
    let mut unknown_logged = 0usize;
    loop {
        let event = match client.recv().await {
            Ok(e) => e,
            Err(error) => {
                tracing::error!(relay = %name, %error, "relay client stopped");
                t.stats.connected.store(false, Relaxed);
                return;
            }
        };
        match event {
            Event::Packet { src, data } => {
                let Some(&i) = t.by_key.get(&src) else {
                    t.stats.unknown_sender.fetch_add(1, Relaxed);
                    // A few lines name the keys; the counter has the rest.
                    if unknown_logged < 16 {
                        unknown_logged += 1;
                        tracing::warn!(relay = %name, link_key = %src, "dropped a packet from a link key that is not a configured peer");
                    }
                    continue;
                };
                deliver(&t.peers[i], &data).await;
            }
            Event::Connected {
                server_key,
                server,
                fast_start,
            } => {
                t.stats.connected.store(true, Relaxed);
                t.stats.connects.fetch_add(1, Relaxed);
                tracing::info!(relay = %name, %server, server_key = %server_key, fast_start, "relay connected");
            }
            Event::Disconnected { error, retry_in } => {
                t.stats.disconnects.fetch_add(1, Relaxed);
                if t.stats.connected.swap(false, Relaxed) {
                    tracing::warn!(relay = %name, %error, ?retry_in, "relay connection lost; reconnecting");
                } else {
                    tracing::warn!(relay = %name, %error, ?retry_in, "relay reconnect failed; retrying");
                }
            }
            Event::PeerGone { peer, reason } => {
                let who = t.by_key.get(&peer).map(|&i| &t.peers[i]);
                // Logged when it changes, not on every repeat.
                let fresh = who.is_none_or(|p| {
                    p.stats.gone_notices.fetch_add(1, Relaxed);
                    p.stats.heard.store(false, Relaxed);
                    !p.stats.gone.swap(true, Relaxed)
                });
                if fresh {
                    tracing::info!(
                        relay = %name,
                        peer = who.map_or("(not configured)", |p| p.name.as_str()),
                        link_key = %peer,
                        ?reason,
                        "peer is not connected to the relay"
                    );
                }
            }
            Event::Health { problem: Some(p) } => {
                tracing::warn!(relay = %name, problem = %p, "relay reports a problem")
            }
            Event::Health { problem: None } => {
                tracing::info!(relay = %name, "relay reports healthy")
            }
            Event::Restarting {
                reconnect_in,
                try_for,
            } => {
                tracing::info!(relay = %name, ?reconnect_in, ?try_for, "relay is restarting")
            }
            _ => {}
        }
    }
}

/// DERP → the local WireGuard, from the peer's socket.
async fn deliver(peer: &PeerCtx, data: &[u8]) {
    match peer.socket.send_to(data, peer.wireguard).await {
        Ok(_) => {
            peer.stats.from_peer.add(data.len());
            if !peer.stats.heard.swap(true, Relaxed) {
                peer.stats.gone.store(false, Relaxed);
                tracing::info!(peer = %peer.name, "peer reachable: datagrams arrive over DERP");
            }
        }
        Err(e) => {
            peer.stats.count_drop(DropReason::DeliverFailed);
            tracing::debug!(peer = %peer.name, error = %e, "could not hand a datagram to the local WireGuard");
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
