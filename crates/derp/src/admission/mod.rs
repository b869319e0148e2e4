//! Client admission: whether a node key may use this relay (derper's
//! `--verify-clients` and `--verify-client-url`).
//!
//! Two checks, both optional, run after a client's `clientInfo` is opened
//! and before it is registered; mesh peers skip them. The local check runs
//! first:
//!
//! - **the local tailscaled** (`--verify-clients`): its LocalAPI, on a Unix
//!   socket, is asked `GET /localapi/v0/whois?addr=nodekey:<hex>`; 200
//!   admits, 404 means the key is no peer of this node's tailnet, anything
//!   else (including no answer) rejects;
//! - **an admission controller** (`--verify-client-url`, Headscale's
//!   `/verify` among them): the JSON of [`ferry_proto::admission`] is
//!   posted; HTTP 200 with `Allow: true` admits, any other answer rejects,
//!   and a controller that cannot be reached admits or rejects as
//!   `--verify-client-url-fail-open` says. "Cannot be reached" means no
//!   status line came back (refused, DNS, TLS, the timeout before an
//!   answer); once a 200 has come, the verdict is the body's first JSON
//!   value, read as it arrives, and a body that breaks off, stalls past
//!   the timeout or ends before that value is whole rejects (derper's
//!   decoder fails the same way).
//!
//! None of this runs on a shard. [`Admission`] owns a small pool of threads
//! and a bounded queue; a shard hands it a question with [`Admission::ask`]
//! and gets the verdict back later through the `deliver` function it was
//! started with (which posts it to the shard's inbox). A slow or dead
//! controller delays only the clients waiting for it, each under its own
//! handshake deadline; when the queue is full, new clients are refused at
//! once ([`Rejection::Busy`]) rather than queued without bound. A full
//! queue is shared fairly between sources (an IPv4 address, an IPv6 /64):
//! a question from a source with fewer waiting takes the place of the
//! newest question of the source with the most, which is refused as busy,
//! so one source flooding the relay with clients cannot lock out the rest. Verdicts
//! may be kept for a while (`--verify-client-cache`, off by default; only
//! answers are kept, never failures to get one).
//!
//! The controller's URL may carry credentials (a user and password, a
//! token in the query). They are sent as Go's client sends them (Basic
//! authorization, the query as it is) and shown nowhere: [`redact_url`]
//! is what logs, errors and the configuration's debug form show.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_engine::stat::exposition::{Exposition, Family, Fixed};
use ferry_proto::admission::{self as wire, ResponseError};
use ferry_proto::key::NodePublic;

use crate::config::AdmissionConfig;

mod redact;
pub use redact::redact_url;
use redact::scrub;

/// Most verdicts kept when caching is on; past it, expired ones are
/// dropped, then all.
const CACHE_CAP: usize = 65_536;
/// Most bytes read of a LocalAPI answer.
const MAX_LOCAL_ANSWER: usize = 1 << 20;
/// The capability version sent to tailscaled (that of the pinned client).
const TAILSCALE_CAP: u32 = 142;

impl std::fmt::Debug for AdmissionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionConfig")
            .field("local_socket", &self.local_socket)
            .field("url", &self.url.as_deref().map(redact_url))
            .field("fail_open", &self.fail_open)
            .field("timeout", &self.timeout)
            .field("concurrency", &self.concurrency)
            .field("max_waiting", &self.max_waiting)
            .field("cache_for", &self.cache_for)
            .finish()
    }
}

/// What admission decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The client may register.
    Admit,
    /// The client is closed without `serverInfo`.
    Reject(Rejection),
}

/// Why a client was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The local tailscaled knows no peer with this key.
    #[error("not found in the local tailscaled's tailnet")]
    NotInTailnet,
    /// The local tailscaled could not be asked or gave an unexpected answer.
    #[error("local tailscaled: {0}")]
    LocalApi(String),
    /// The controller answered 200 without `Allow: true`.
    #[error("admission controller did not allow it")]
    Denied,
    /// The controller answered another status.
    #[error("admission controller answered HTTP {0}")]
    Status(u16),
    /// The controller's 200 answer was not the expected JSON.
    #[error("admission controller: {0}")]
    Answer(ResponseError),
    /// The controller's 200 answer broke off, or stalled past the
    /// timeout, before its verdict was whole.
    #[error("admission controller's answer broke off: {0}")]
    BrokenAnswer(String),
    /// The controller could not be reached (and fail-open is off).
    #[error("admission controller unreachable: {0}")]
    Unreachable(String),
    /// Too many clients already wait for admission.
    #[error("{0} clients already wait for admission")]
    Busy(usize),
}

impl Rejection {
    /// Short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::NotInTailnet => "not_in_tailnet",
            Rejection::LocalApi(_) => "local_api_error",
            Rejection::Denied => "denied",
            Rejection::Status(_) => "bad_status",
            Rejection::Answer(_) => "bad_answer",
            Rejection::Unreachable(_) => "unreachable",
            Rejection::Busy(_) => "busy",
            Rejection::BrokenAnswer(_) => "broken_answer",
        }
    }

    /// Every label, for metrics.
    pub const LABELS: [&'static str; 8] = [
        "not_in_tailnet",
        "local_api_error",
        "denied",
        "bad_status",
        "bad_answer",
        "unreachable",
        "busy",
        "broken_answer",
    ];
}

/// Counters of what admission did; read by the metrics page.
#[derive(Debug, Default)]
pub struct AdmissionStats {
    /// Clients admitted.
    pub admitted: AtomicU64,
    /// Of those, admitted only because the controller was unreachable and
    /// fail-open is on.
    pub admitted_fail_open: AtomicU64,
    /// Clients refused, by [`Rejection::LABELS`] index.
    pub rejected: [AtomicU64; Rejection::LABELS.len()],
    /// Verdicts answered from the cache.
    pub cache_hits: AtomicU64,
    /// Questions waiting or being asked now.
    pub in_flight: AtomicU64,
    /// Questions asked (not from the cache), and their total time in
    /// microseconds.
    pub asked: AtomicU64,
    /// Total time of those questions, in microseconds.
    pub asked_micros: AtomicU64,
}

impl AdmissionStats {
    /// Writes the counters (Ferry's names; derper exports none for this).
    pub fn render_metrics(&self, w: &mut String) {
        const DECISIONS: Family = Family::counter(
            "ferry_admission_decisions_total",
            "Admission verdicts by result and reason.",
        )
        .labels(&["result", "reason"]);
        const CHECK_SECONDS: Family = Family::counter(
            "ferry_admission_check_seconds_total",
            "Time spent on those questions.",
        );
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut w = Exposition::new(w);
        let mut f = w.family(&DECISIONS);
        f.sample(
            &["admit", ""],
            get(&self.admitted) - get(&self.admitted_fail_open),
        );
        f.sample(&["admit", "fail_open"], get(&self.admitted_fail_open));
        for (label, n) in Rejection::LABELS.iter().zip(&self.rejected) {
            f.sample(&["reject", label], get(n));
        }
        w.counter(
            "ferry_admission_cache_hits_total",
            "Verdicts answered from --verify-client-cache.",
            get(&self.cache_hits),
        );
        w.gauge(
            "ferry_admission_in_flight",
            "Clients waiting for an admission verdict.",
            get(&self.in_flight) as i64,
        );
        w.counter(
            "ferry_admission_checks_total",
            "Questions asked of tailscaled or the admission controller.",
            get(&self.asked),
        );
        w.single(
            &CHECK_SECONDS,
            Fixed(get(&self.asked_micros) as f64 / 1e6, 6),
        );
    }

    fn count(&self, v: &Verdict) {
        match v {
            Verdict::Admit => self.admitted.fetch_add(1, Ordering::Relaxed),
            Verdict::Reject(r) => {
                let i = Rejection::LABELS
                    .iter()
                    .position(|l| *l == r.label())
                    .expect("every label is listed");
                self.rejected[i].fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// A question waiting for a thread.
struct Question<T> {
    ticket: T,
    key: NodePublic,
    source: IpAddr,
}

struct Queue<T> {
    waiting: VecDeque<Question<T>>,
    /// Questions waiting per source network ([`source_net`]).
    per_source: HashMap<IpAddr, usize>,
    stopping: bool,
}

impl<T> Queue<T> {
    fn push(&mut self, question: Question<T>) {
        *self
            .per_source
            .entry(source_net(question.source))
            .or_default() += 1;
        self.waiting.push_back(question);
    }

    fn pop(&mut self) -> Option<Question<T>> {
        let question = self.waiting.pop_front()?;
        self.forget(question.source);
        Some(question)
    }

    fn forget(&mut self, source: IpAddr) {
        let net = source_net(source);
        if let Some(n) = self.per_source.get_mut(&net) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&net);
            }
        }
    }

    /// For a question from `source` when the queue is full: takes out the
    /// newest question of the source with the most waiting, if that is
    /// more than `source` would have with this one.
    fn make_room_for(&mut self, source: IpAddr) -> Option<Question<T>> {
        let mine = self
            .per_source
            .get(&source_net(source))
            .copied()
            .unwrap_or(0);
        let (&busiest, &most) = self.per_source.iter().max_by_key(|(_, n)| **n)?;
        if most <= mine + 1 {
            return None;
        }
        let at = self
            .waiting
            .iter()
            .rposition(|q| source_net(q.source) == busiest)?;
        let question = self.waiting.remove(at)?;
        self.forget(question.source);
        Some(question)
    }
}

/// The network a source counts as for the queue's fair share: an IPv4
/// address, or an IPv6 /64 (what one host or site gets).
fn source_net(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

struct Inner<T> {
    cfg: AdmissionConfig,
    queue: Mutex<Queue<T>>,
    ready: Condvar,
    cache: Mutex<HashMap<(NodePublic, IpAddr), (Verdict, Instant)>>,
    agent: Option<ureq::Agent>,
    deliver: Box<dyn Fn(T, Verdict) + Send + Sync>,
    stats: Arc<AdmissionStats>,
}

/// The admission pool. Dropping it stops its threads once they finish the
/// question at hand.
pub struct Admission<T: Send + 'static> {
    inner: Arc<Inner<T>>,
    threads: Vec<JoinHandle<()>>,
}

/// Why admission could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// `--verify-client-url` is not an http or https URL.
    #[error("--verify-client-url {url:?}: must be an http:// or https:// URL")]
    Url {
        /// The URL as given, credentials redacted ([`redact_url`]).
        url: String,
    },
    /// The system's CA certificates could not be loaded.
    #[error("loading CA certificates for --verify-client-url: {0}")]
    Roots(String),
    /// A thread could not be started.
    #[error("starting admission threads: {0}")]
    Thread(#[from] std::io::Error),
}

impl<T: Send + 'static> Admission<T> {
    /// Starts the threads. `deliver` gets every verdict that
    /// [`Admission::ask`] did not return at once, on an admission thread.
    pub fn start(
        cfg: AdmissionConfig,
        stats: Arc<AdmissionStats>,
        deliver: impl Fn(T, Verdict) + Send + Sync + 'static,
    ) -> Result<Self, AdmissionError> {
        let agent = match &cfg.url {
            Some(url) => Some(agent_for(url, cfg.timeout)?),
            None => None,
        };
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                per_source: HashMap::new(),
                stopping: false,
            }),
            ready: Condvar::new(),
            cache: Mutex::new(HashMap::new()),
            agent,
            deliver: Box::new(deliver),
            stats,
            cfg,
        });
        let mut threads = Vec::new();
        for i in 0..inner.cfg.concurrency.max(1) {
            let inner = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("ferry-admit-{i}"))
                    .spawn(move || inner.work())?,
            );
        }
        Ok(Admission { inner, threads })
    }

    /// Asks whether `key`, connecting from `source`, may register. Returns
    /// the verdict when it is known at once (from the cache, or a refusal
    /// because too many wait); otherwise the verdict comes later through
    /// `deliver` with `ticket`. A question that a full queue makes room
    /// for ([`Admission`]'s fair share) sends the one it displaced its
    /// refusal through `deliver`, from this call.
    pub fn ask(&self, ticket: T, key: NodePublic, source: IpAddr, now: Instant) -> Option<Verdict> {
        let inner = &self.inner;
        if let Some(ttl) = inner.cfg.cache_for {
            let cache = inner.cache.lock().expect("admission cache lock");
            if let Some((v, at)) = cache.get(&(key, source)) {
                if now.saturating_duration_since(*at) < ttl {
                    inner.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                    inner.stats.count(v);
                    return Some(v.clone());
                }
            }
        }
        let mut q = inner.queue.lock().expect("admission queue lock");
        let busy = inner.stats.in_flight.load(Ordering::Relaxed) as usize;
        let mut displaced = None;
        if q.waiting.len() >= inner.cfg.max_waiting {
            displaced = q.make_room_for(source);
            if displaced.is_none() {
                drop(q);
                let v = Verdict::Reject(Rejection::Busy(busy));
                inner.stats.count(&v);
                return Some(v);
            }
        }
        q.push(Question {
            ticket,
            key,
            source,
        });
        drop(q);
        match displaced {
            Some(old) => {
                let v = Verdict::Reject(Rejection::Busy(busy));
                inner.stats.count(&v);
                tracing::debug!(key = %old.key, source = %old.source, "admission: gave a busy source's place in the queue to another");
                (inner.deliver)(old.ticket, v);
            }
            None => {
                inner.stats.in_flight.fetch_add(1, Ordering::Relaxed);
                inner.ready.notify_one();
            }
        }
        None
    }
}

impl<T: Send + 'static> Drop for Admission<T> {
    fn drop(&mut self) {
        self.inner
            .queue
            .lock()
            .expect("admission queue lock")
            .stopping = true;
        self.inner.ready.notify_all();
        // The last reference may go on one of the pool's own threads (a
        // delivery that outlived the server): never join oneself.
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

impl<T: Send + 'static> Inner<T> {
    fn work(&self) {
        loop {
            let question = {
                let mut q = self.queue.lock().expect("admission queue lock");
                loop {
                    if q.stopping {
                        return;
                    }
                    if let Some(question) = q.pop() {
                        break question;
                    }
                    q = self.ready.wait(q).expect("admission queue lock");
                }
            };
            let started = Instant::now();
            let (verdict, answered) = self.decide(&question.key, question.source);
            let took = started.elapsed();
            self.stats.asked.fetch_add(1, Ordering::Relaxed);
            self.stats
                .asked_micros
                .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
            self.stats.count(&verdict);
            match &verdict {
                Verdict::Admit => {
                    tracing::debug!(key = %question.key, source = %question.source, ?took, "client admitted")
                }
                Verdict::Reject(why) => tracing::info!(
                    key = %question.key,
                    source = %question.source,
                    reason = why.label(),
                    %why,
                    ?took,
                    "client refused by admission"
                ),
            }
            if answered {
                self.remember(question.key, question.source, &verdict);
            }
            self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
            (self.deliver)(question.ticket, verdict);
        }
    }

    /// The verdict, and whether it is an answer worth caching (not a
    /// failure to get one).
    fn decide(&self, key: &NodePublic, source: IpAddr) -> (Verdict, bool) {
        if let Some(socket) = &self.cfg.local_socket {
            match ask_tailscaled(socket, key, self.cfg.timeout) {
                Ok(true) => {}
                Ok(false) => return (Verdict::Reject(Rejection::NotInTailnet), true),
                Err(e) => return (Verdict::Reject(Rejection::LocalApi(e)), false),
            }
        }
        let (Some(url), Some(agent)) = (&self.cfg.url, &self.agent) else {
            return (Verdict::Admit, true);
        };
        match ask_controller(agent, url, key, source) {
            Ok(Ok(true)) => (Verdict::Admit, true),
            Ok(Ok(false)) => (Verdict::Reject(Rejection::Denied), true),
            Ok(Err(why)) => (Verdict::Reject(why), false),
            Err(unreachable) if self.cfg.fail_open => {
                tracing::warn!(%key, error = %unreachable, "admission controller unreachable; admitting (fail-open)");
                self.stats
                    .admitted_fail_open
                    .fetch_add(1, Ordering::Relaxed);
                (Verdict::Admit, false)
            }
            Err(unreachable) => (Verdict::Reject(Rejection::Unreachable(unreachable)), false),
        }
    }

    fn remember(&self, key: NodePublic, source: IpAddr, verdict: &Verdict) {
        if self.cfg.cache_for.is_none() {
            return;
        }
        let now = Instant::now();
        let ttl = self.cfg.cache_for.unwrap_or_default();
        let mut cache = self.cache.lock().expect("admission cache lock");
        if cache.len() >= CACHE_CAP {
            cache.retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
            if cache.len() >= CACHE_CAP {
                cache.clear();
            }
        }
        cache.insert((key, source), (verdict.clone(), now));
    }
}

/// The HTTP client for the controller: the given timeout for the whole
/// exchange, the system's CA certificates (honouring `SSL_CERT_FILE`), no
/// status treated as an error (the status is the answer).
fn agent_for(url: &str, timeout: Duration) -> Result<ureq::Agent, AdmissionError> {
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(AdmissionError::Url {
            url: redact_url(url),
        });
    }
    let mut tls = ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(
            Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        );
    if lower.starts_with("https://") {
        let found = rustls_native_certs::load_native_certs();
        if found.certs.is_empty() {
            let why = found
                .errors
                .first()
                .map_or_else(|| "no certificates found".to_owned(), |e| e.to_string());
            return Err(AdmissionError::Roots(why));
        }
        let roots: Vec<ureq::tls::Certificate<'static>> = found
            .certs
            .iter()
            .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
            .collect();
        tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&roots));
    }
    Ok(ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .tls_config(tls.build())
        .build()
        .new_agent())
}

/// Posts the question. `Err` when the controller could not be reached (no
/// status line came back); `Ok(Err)` when it answered but not with a
/// verdict.
fn ask_controller(
    agent: &ureq::Agent,
    url: &str,
    key: &NodePublic,
    source: IpAddr,
) -> Result<Result<bool, Rejection>, String> {
    let body = wire::request_body(key, source);
    let mut response = agent
        .post(url)
        .header("Content-Type", "application/json")
        .send(&body[..])
        .map_err(|e| scrub(&e.to_string(), url))?;
    let status = response.status().as_u16();
    if status != 200 {
        return Ok(Err(Rejection::Status(status)));
    }
    Ok(
        read_verdict(response.body_mut().as_reader()).map_err(|why| match why {
            Rejection::BrokenAnswer(e) => Rejection::BrokenAnswer(scrub(&e, url)),
            other => other,
        }),
    )
}

/// Reads a 200 answer's body until its first JSON value is whole (then
/// the rest is not waited for) or the body ends. A read error, the agent's
/// timeout among them, before that is a broken answer.
fn read_verdict(mut body: impl Read) -> Result<bool, Rejection> {
    let mut answer = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    loop {
        let room = (wire::MAX_RESPONSE_BODY - answer.len()).min(chunk.len());
        let n = match body.read(&mut chunk[..room]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Rejection::BrokenAnswer(format!(
                    "after {} bytes of the body: {e}",
                    answer.len()
                )))
            }
        };
        if n == 0 {
            return wire::parse_response(&answer).map_err(Rejection::Answer);
        }
        answer.extend_from_slice(&chunk[..n]);
        if answer.len() == wire::MAX_RESPONSE_BODY {
            return wire::parse_response(&answer).map_err(Rejection::Answer);
        }
        // A JSON object can only become whole at a `}`: parse again only
        // then, so a body sent a byte at a time is not parsed once per byte.
        if chunk[..n].contains(&b'}') {
            if let Some(allow) = wire::verdict_so_far(&answer) {
                return Ok(allow);
            }
        }
    }
}

/// Asks the local tailscaled whether `key` is a peer: `Ok(true)` on 200,
/// `Ok(false)` on 404, `Err` otherwise.
fn ask_tailscaled(socket: &PathBuf, key: &NodePublic, timeout: Duration) -> Result<bool, String> {
    let mut stream = UnixStream::connect(socket)
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    // HTTP/1.0: the answer comes whole, without chunking, and the
    // connection ends after it.
    let request = format!(
        "GET /localapi/v0/whois?addr=nodekey%3A{} HTTP/1.0\r\nHost: local-tailscaled.sock\r\nTailscale-Cap: {TAILSCALE_CAP}\r\n\r\n",
        key.to_hex()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("asking {}: {e}", socket.display()))?;
    let deadline = Instant::now() + timeout;
    let mut answer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        if Instant::now() >= deadline {
            return Err(format!(
                "no answer from {} within {timeout:?}",
                socket.display()
            ));
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&chunk[..n]);
                if answer.len() > MAX_LOCAL_ANSWER {
                    return Err(format!("answer over {MAX_LOCAL_ANSWER} bytes"));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(&answer) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err("answer ended inside its head".to_owned()),
        Err(e) => return Err(format!("answer is not HTTP: {e}")),
    };
    let body = &answer[head..];
    match response.code {
        Some(200) => match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(serde_json::Value::Object(_)) => Ok(true),
            _ => Err("whois answer is not a JSON object".to_owned()),
        },
        Some(404) => Ok(false),
        Some(code) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
            let text = text.trim();
            if text.contains("invalid 'addr' parameter") {
                return Err("tailscaled is too old to look up node keys".to_owned());
            }
            Err(format!("HTTP {code}: {text}"))
        }
        None => Err("answer has no status".to_owned()),
    }
}
