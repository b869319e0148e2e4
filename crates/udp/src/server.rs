//! Starting and running the UDP relay: [`Relay::start`] validates a
//! [`Config`], resolves bounce targets (one that does not resolve yet is
//! retried with backoff while the rest runs), probes the kernel's offloads,
//! binds every listening group (naming the config field of whatever
//! fails), wires the shards' replication rings, and starts the shard
//! threads, the resolver thread and the metrics listener. A [`Relay`]
//! applies reloads ([`Relay::reconfigure`]) and stops everything when
//! shut down or dropped.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_engine::mailbox::msg_ring;
use thiserror::Error;

use crate::config::{self, Change, Config, ConfigError};
use crate::hub::HubSettings;
use crate::live::{self, SourceRate};
use crate::metrics::{Metrics, MetricsServer, ShardMetrics, StartInfo};
use crate::peer_relay::PeerRelays;
use crate::published::Published;
use crate::session::Sessions;
use crate::shard::{ClientCap, HubPart, Role, Route, Shard, ShardSetup, TargetCell};
use crate::socket::{self, BindError, SocketOptions};

/// The one port a relay started for the DERP side serves.
enum Port {
    /// Relay sessions.
    Sessions(Arc<Sessions>),
    /// Tailscale peer-relay endpoints.
    PeerRelay(Arc<PeerRelays>),
}

/// Events a replication ring holds before the producer's overflow queue
/// takes over.
const RING_CAPACITY: usize = 4096;

/// Why the relay did not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listening address could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The metrics listener could not be bound.
    #[error("metrics_addr (--metrics-addr): cannot listen on {addr}: {source}{}", ferry_sys::port::hint_suffix(*addr, source))]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// The system's error.
        source: io::Error,
    },
    /// Anything else the system refused.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The system's error.
        source: io::Error,
    },
}

/// Turns `host:port` into addresses. The relay uses the system resolver;
/// tests substitute their own.
pub trait Resolve: Send + Sync {
    /// Every address `target` stands for, in preference order.
    fn resolve(&self, target: &str) -> io::Result<Vec<SocketAddr>>;
}

/// The system resolver (`getaddrinfo`).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, target: &str) -> io::Result<Vec<SocketAddr>> {
        Ok(target.to_socket_addrs()?.collect())
    }
}

/// Every address `target` stands for, or why there is none.
fn lookup(resolver: &dyn Resolve, target: &str) -> Result<Vec<SocketAddr>, String> {
    match resolver.resolve(target) {
        Ok(found) if !found.is_empty() => Ok(found),
        Ok(_) => Err("no addresses".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Picks the address to use: the current one while it is still listed
/// (round-robin DNS must not make sessions hop), else the first.
fn choose(current: Option<SocketAddr>, found: &[SocketAddr]) -> Option<SocketAddr> {
    match current {
        Some(c) if found.contains(&c) => Some(c),
        _ => found.first().copied(),
    }
}

/// A running relay.
pub struct Relay {
    bound: Vec<(String, SocketAddr)>,
    hub_settings: Option<Arc<Published<HubSettings>>>,
    source_rate: Arc<Published<SourceRate>>,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<mio::Waker>>,
    shards: Vec<JoinHandle<()>>,
    resolver: Option<JoinHandle<()>>,
    metrics_server: Option<MetricsServer>,
}

impl Relay {
    /// Starts a relay with the system resolver.
    pub fn start(config: &Config) -> Result<Relay, StartError> {
        Self::start_with(config, Arc::new(SystemResolver))
    }

    /// Starts a relay that resolves bounce targets with `resolver`.
    pub fn start_with(config: &Config, resolver: Arc<dyn Resolve>) -> Result<Relay, StartError> {
        Self::start_inner(config, resolver, None)
    }

    /// Starts relay sessions' socket group alone (no bounce, no hub) on
    /// `listen` (`field` names it in errors) with `tuning`, serving the
    /// table `sessions`, which learns the bound address.
    pub fn start_sessions(
        field: &str,
        listen: SocketAddr,
        sessions: Arc<Sessions>,
        tuning: config::Tuning,
    ) -> Result<Relay, StartError> {
        Self::start_port(field, listen, Port::Sessions(sessions), tuning)
    }

    /// Starts the peer-relay port alone (no bounce, no hub) on `listen`
    /// (`field` names it in errors) with `tuning`, serving the shared table
    /// `relays`, which learns the bound address.
    pub fn start_peer_relay(
        field: &str,
        listen: SocketAddr,
        relays: Arc<PeerRelays>,
        tuning: config::Tuning,
    ) -> Result<Relay, StartError> {
        Self::start_port(field, listen, Port::PeerRelay(relays), tuning)
    }

    fn start_port(
        field: &str,
        listen: SocketAddr,
        port: Port,
        tuning: config::Tuning,
    ) -> Result<Relay, StartError> {
        let config = Config {
            bounce: Vec::new(),
            hub: None,
            tuning,
            metrics_addr: None,
        };
        let bind = config::Listen {
            addr: listen,
            field: field.to_string(),
        };
        Self::start_inner(&config, Arc::new(SystemResolver), Some((bind, port)))
    }

    fn start_inner(
        config: &Config,
        resolver: Arc<dyn Resolve>,
        sessions: Option<(config::Listen, Port)>,
    ) -> Result<Relay, StartError> {
        if sessions.is_none() {
            config.validate()?;
        }
        let t = &config.tuning;
        let workers = if t.workers == 0 {
            ferry_sys::available_cpus().len().max(1)
        } else {
            t.workers
        };

        // Targets first. One that does not resolve yet is no reason to stay
        // down: its clients' datagrams are dropped (and counted) until the
        // resolver thread, retrying with backoff, finds an address.
        let mut routes = Vec::new();
        let mut unresolved = Vec::new();
        for (r, b) in config.bounce.iter().enumerate() {
            let addr = match lookup(&*resolver, &b.target) {
                Ok(found) => choose(None, &found),
                Err(reason) => {
                    tracing::warn!(
                        "{}: cannot resolve {:?}: {reason}; its clients are dropped until it resolves (next try in {}s)",
                        b.target_field,
                        b.target,
                        FIRST_RETRY.as_secs()
                    );
                    unresolved.push(r);
                    None
                }
            };
            routes.push(Route {
                target: Arc::new(TargetCell::new(addr)),
                idle_timeout: b.idle_timeout,
                wireguard_only: b.wireguard_only,
                clients: ClientCap::new(b.max_sessions),
            });
        }
        let routes = Arc::new(routes);

        let probe = UdpSocket::bind("127.0.0.1:0").map_err(|source| StartError::Io {
            what: "probing UDP offloads",
            source,
        })?;
        let offloads = ferry_sys::gso::probe(probe.as_fd());
        drop(probe);
        let gro = t.gro && offloads.gro;
        let gso = t.gso && offloads.gso;
        let socket_options = SocketOptions {
            recv_buffer: t.recv_buffer,
            send_buffer: t.send_buffer,
            gro,
        };

        let mut per_shard: Vec<Vec<(UdpSocket, Role)>> = (0..workers).map(|_| Vec::new()).collect();
        let mut bound = Vec::new();
        let mut granted = None;
        let mut bind = |field: &str, addr, role| -> Result<(), StartError> {
            let (socks, addr, g) = socket::bind_group(field, addr, workers, &socket_options)?;
            for (k, s) in socks.into_iter().enumerate() {
                per_shard[k].push((s, role));
            }
            bound.push((field.to_string(), addr));
            granted = Some(g);
            Ok(())
        };
        for (r, b) in config.bounce.iter().enumerate() {
            for l in &b.listen {
                bind(&l.field, l.addr, Role::Bounce(r))?;
            }
        }
        if let Some(h) = &config.hub {
            for (via, l) in h.listen.iter().enumerate() {
                bind(&l.field, l.addr, Role::Hub(via as u16))?;
            }
        }
        match &sessions {
            Some((l, Port::Sessions(s))) => {
                bind(&l.field, l.addr, Role::RelaySessions)?;
                s.set_bound(bound.last().expect("just bound").1);
            }
            Some((l, Port::PeerRelay(p))) => {
                bind(&l.field, l.addr, Role::PeerRelay)?;
                p.set_bound(bound.last().expect("just bound").1);
            }
            None => {}
        }
        let granted = granted.unwrap_or_default();

        let hub_settings = match &config.hub {
            Some(h) => Some(Arc::new(Published::new(live::hub_settings(h, t, None)?))),
            None => None,
        };
        let source_rate = Arc::new(Published::new(live::source_rate(t)));
        // Rings between every ordered pair of shards, for hub events.
        let mut txs: Vec<Vec<_>> = (0..workers).map(|_| Vec::new()).collect();
        let mut rxs: Vec<Vec<_>> = (0..workers).map(|_| Vec::new()).collect();
        if hub_settings.is_some() {
            for (from, tx_list) in txs.iter_mut().enumerate() {
                for (to, rx_list) in rxs.iter_mut().enumerate() {
                    if from != to {
                        let (tx, rx) = msg_ring(RING_CAPACITY);
                        tx_list.push(tx);
                        rx_list.push(rx);
                    }
                }
            }
        }

        let shard_metrics: Vec<Arc<ShardMetrics>> = (0..workers).map(|_| Arc::default()).collect();
        let metrics = Arc::new(Metrics {
            shards: shard_metrics.clone(),
            info: StartInfo {
                gro,
                gso,
                recv_buffer: granted.recv,
                send_buffer: granted.send,
                buffers_forced: granted.forced,
            },
            ..Default::default()
        });
        let stop = Arc::new(AtomicBool::new(false));
        let cpus = ferry_sys::available_cpus();
        let mut wakers = Vec::new();
        let mut shards = Vec::new();
        let mut setups = Vec::with_capacity(workers);
        for (id, ((listeners, tx), rx)) in per_shard.into_iter().zip(txs).zip(rxs).enumerate() {
            let poll = mio::Poll::new().map_err(|source| StartError::Io {
                what: "creating a poller",
                source,
            })?;
            let waker = Shard::waker(&poll).map_err(|source| StartError::Io {
                what: "creating a waker",
                source,
            })?;
            wakers.push(Arc::new(waker));
            setups.push(ShardSetup {
                id,
                listeners,
                routes: routes.clone(),
                hub: hub_settings
                    .clone()
                    .map(|settings| HubPart { settings, tx, rx }),
                relay_sessions: match &sessions {
                    Some((_, Port::Sessions(s))) => Some(s.clone()),
                    _ => None,
                },
                peer_relays: match &sessions {
                    Some((_, Port::PeerRelay(p))) => Some(p.clone()),
                    _ => None,
                },
                socket_options,
                gso,
                source_rate: source_rate.clone(),
                metrics: shard_metrics[id].clone(),
                stop: stop.clone(),
                poll,
            });
        }
        for setup in setups {
            let id = setup.id;
            let cpu = (t.pin && !cpus.is_empty()).then(|| cpus[id % cpus.len()]);
            let spawned =
                ferry_engine::runtime::spawn_pinned(format!("ferry-udp-{id}"), cpu, move || {
                    match Shard::new(setup) {
                        Ok(shard) => shard.run(),
                        Err(e) => tracing::error!(shard = id, error = %e, "shard could not start"),
                    }
                });
            match spawned {
                Ok(h) => shards.push(h),
                Err(source) => {
                    stop.store(true, Ordering::Relaxed);
                    wakers.iter().for_each(|w| {
                        let _ = w.wake();
                    });
                    return Err(StartError::Io {
                        what: "starting a shard thread",
                        source,
                    });
                }
            }
        }

        if let Some(h) = &config.hub {
            metrics
                .hub_peers
                .store(h.peers.len() as u64, Ordering::Relaxed);
        }
        let mut relay = Relay {
            bound,
            hub_settings,
            source_rate,
            metrics: metrics.clone(),
            stop: stop.clone(),
            wakers,
            shards,
            resolver: None,
            metrics_server: None,
        };
        let now = Instant::now();
        let watched: Vec<Watched> = config
            .bounce
            .iter()
            .zip(routes.iter())
            .enumerate()
            .filter_map(|(r, (b, route))| {
                let retry = unresolved.contains(&r).then_some(FIRST_RETRY);
                let by_name =
                    !b.resolve_interval.is_zero() && b.target.parse::<SocketAddr>().is_err();
                (retry.is_some() || by_name).then(|| Watched {
                    target: b.target.clone(),
                    field: b.target_field.clone(),
                    every: b.resolve_interval,
                    cell: route.target.clone(),
                    due: now + retry.unwrap_or(b.resolve_interval),
                    retry,
                })
            })
            .collect();
        if !watched.is_empty() {
            let wakers = relay.wakers.clone();
            let stop = stop.clone();
            let m = metrics.clone();
            relay.resolver = Some(
                std::thread::Builder::new()
                    .name("ferry-udp-resolve".into())
                    .spawn(move || resolve_loop(watched, resolver, m, wakers, stop))
                    .map_err(|source| StartError::Io {
                        what: "starting the resolver thread",
                        source,
                    })?,
            );
        }
        if let Some(addr) = config.metrics_addr {
            relay.metrics_server = Some(
                MetricsServer::start(addr, metrics)
                    .map_err(|source| StartError::Metrics { addr, source })?,
            );
        }
        let on = |b: bool| if b { "on" } else { "off" };
        tracing::info!(
            workers,
            gro = on(gro),
            gso = on(gso),
            recv_buffer = granted.recv,
            send_buffer = granted.send,
            buffers_forced = if granted.forced {
                "yes (CAP_NET_ADMIN)"
            } else {
                "no"
            },
            "UDP relay running"
        );
        let asked = socket::Asked {
            recv: t.recv_buffer,
            send: t.send_buffer,
        };
        if let Some(advice) = socket::buffer_advice(asked, socket::buffer_limits(), &granted) {
            tracing::warn!("{advice}");
        }
        Ok(relay)
    }

    /// Each listening field and the address it is bound to (with the real
    /// port when the configuration asked for port 0).
    pub fn bound(&self) -> &[(String, SocketAddr)] {
        &self.bound
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Where metrics are served, if anywhere.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_server.as_ref().map(|m| m.addr)
    }

    /// Applies what can change while running from `new`, the relay
    /// running `running`: the hub's peers (added, removed, their allow
    /// lists and fixed endpoints), `hub.max_indices`, and the per-source
    /// handshake limits. Returns every difference, each marked applied
    /// ([`Change::live`]) or needing a restart; nothing is applied when
    /// `new` is not valid. See [`Config::with_live_parts_of`] for the
    /// configuration then running.
    pub fn reconfigure(&self, running: &Config, new: &Config) -> Result<Vec<Change>, ConfigError> {
        new.validate()?;
        let hub = match (&self.hub_settings, &running.hub, &new.hub) {
            (Some(cell), Some(_), Some(h)) => {
                Some((cell, live::hub_settings(h, &new.tuning, Some(&cell.get()))?))
            }
            _ => None,
        };
        let changes = running.changes(new);
        if changes.is_empty() {
            return Ok(changes);
        }
        if let Some((cell, settings)) = hub {
            let active = settings.peers.iter().filter(|p| p.active).count();
            cell.set(settings);
            self.metrics
                .hub_peers
                .store(active as u64, Ordering::Relaxed);
        }
        let rate = live::source_rate(&new.tuning);
        if *self.source_rate.get() != rate {
            self.source_rate.set(rate);
        }
        for w in &self.wakers {
            let _ = w.wake();
        }
        Ok(changes)
    }

    /// Stops every thread and waits for them.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for w in &self.wakers {
            let _ = w.wake();
        }
        for h in self.shards.drain(..) {
            let _ = h.join();
        }
        if let Some(r) = self.resolver.take() {
            r.thread().unpark();
            let _ = r.join();
        }
        self.metrics_server = None;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// The first retry of a target that did not resolve at start.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The longest wait between retries of a target that never resolved.
const LAST_RETRY: Duration = Duration::from_secs(60);

/// The wait after a retry that waited `last` failed: twice as long, at
/// most [`LAST_RETRY`].
fn next_retry(last: Duration) -> Duration {
    (last * 2).min(LAST_RETRY)
}

/// A bounce target the resolver thread looks after.
struct Watched {
    target: String,
    /// Its configuration field, for the log.
    field: String,
    /// The re-resolution interval once it has resolved (zero: never).
    every: Duration,
    cell: Arc<TargetCell>,
    due: Instant,
    /// While it has never resolved: the wait before the next try.
    retry: Option<Duration>,
}

/// Resolves targets that did not resolve at start (retrying with
/// backoff), re-resolves DNS targets on their intervals, and publishes
/// changes.
fn resolve_loop(
    mut watched: Vec<Watched>,
    resolver: Arc<dyn Resolve>,
    metrics: Arc<Metrics>,
    wakers: Vec<Arc<mio::Waker>>,
    stop: Arc<AtomicBool>,
) {
    let wake = || {
        for w in &wakers {
            let _ = w.wake();
        }
    };
    while !stop.load(Ordering::Relaxed) && !watched.is_empty() {
        let now = Instant::now();
        for w in watched.iter_mut().filter(|w| now >= w.due) {
            let found = match lookup(&*resolver, &w.target) {
                Ok(found) => found,
                Err(reason) => {
                    metrics.resolves_failed.fetch_add(1, Ordering::Relaxed);
                    match &mut w.retry {
                        Some(wait) => {
                            *wait = next_retry(*wait);
                            w.due = now + *wait;
                            tracing::warn!(
                                "{}: still cannot resolve {:?}: {reason}; next try in {}s",
                                w.field,
                                w.target,
                                wait.as_secs()
                            );
                        }
                        None => {
                            w.due = now + w.every;
                            tracing::warn!(target = %w.target, %reason, "re-resolving the bounce target failed; keeping the old address");
                        }
                    }
                    continue;
                }
            };
            metrics.resolves_ok.fetch_add(1, Ordering::Relaxed);
            w.due = now + w.every;
            let current = *w.cell.get();
            let Some(next) = choose(current, &found) else {
                continue;
            };
            match current {
                None => {
                    tracing::info!(target = %w.target, to = %next, "bounce target resolved; relaying its clients");
                    w.retry = None;
                }
                Some(from) if from != next => {
                    tracing::info!(target = %w.target, %from, to = %next, "bounce target moved");
                    metrics.target_changes.fetch_add(1, Ordering::Relaxed);
                }
                Some(_) => continue,
            }
            w.cell.set(Some(next));
            wake();
        }
        // A target that resolved and is not to be re-resolved is done.
        watched.retain(|w| w.retry.is_some() || !w.every.is_zero());
        let next = watched
            .iter()
            .map(|w| w.due)
            .min()
            .unwrap_or(now + Duration::from_secs(1));
        std::thread::park_timeout(
            next.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(500)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_from_one_second_up_to_a_minute() {
        let mut wait = FIRST_RETRY;
        let mut waits = vec![wait.as_secs()];
        for _ in 0..8 {
            wait = next_retry(wait);
            waits.push(wait.as_secs());
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}
