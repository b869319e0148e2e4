//! The driver: one control session after another, with backoff between
//! them. A session opens the channel, registers if needed and holds the
//! streaming map poll until it fails.

use crate::channel::{self, LoginServer};
use crate::{Config, Error, Netmap, Shared, State, Status};
use bytes::Bytes;
use ferry_proto::key::NodePrivate;
use ferry_proto::tailnet::map_frame::{self, MAX_MAP_FRAME};
use ferry_proto::tailnet::tailcfg::{
    Hostinfo, MapRequest, MapResponse, NetInfo, RegisterAuth, RegisterRequest, RegisterResponse,
};
use ferry_proto::tailnet::CAPABILITY_VERSION;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// No map message (keep-alives included) for this long: the poll is dead.
const WATCHDOG: Duration = Duration::from_secs(120);
/// Largest register (or other non-streaming) response body read.
const MAX_BODY: usize = 1024 * 1024;
/// Backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

pub(crate) struct Driver {
    /// The peer relay's task, started with the runtime.
    pub(crate) relay: Option<crate::relay::Node>,
    pub(crate) config: Config,
    pub(crate) server: LoginServer,
    pub(crate) state: State,
    pub(crate) shared: Arc<Shared>,
    pub(crate) derp: watch::Receiver<u32>,
    /// The version of the last netmap published (versions keep growing
    /// across sessions).
    pub(crate) version: u64,
}

type Sender = SendRequest<Full<Bytes>>;

impl Driver {
    pub(crate) fn run(mut self, mut stop: watch::Receiver<bool>) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!("tailnet: no runtime: {e}");
                self.shared.set_status(Status::Stopped);
                return;
            }
        };
        rt.block_on(async {
            if let Some(relay) = self.relay.take() {
                tokio::spawn(relay.run());
            }
            let mut attempt = 0u32;
            loop {
                let mut mapped = false;
                let result = tokio::select! {
                    r = self.session(&mut mapped) => r,
                    _ = stop.wait_for(|s| *s) => break,
                };
                if mapped {
                    attempt = 0;
                }
                let error = match result {
                    Ok(()) => "the control server ended the map poll".to_owned(),
                    Err(e) => e.to_string(),
                };
                tracing::warn!(login_server = %self.config.login_server, "tailnet: {error}");
                self.shared.set_status(Status::Backoff { error });
                let delay = backoff(attempt);
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        });
        self.shared.set_status(Status::Stopped);
    }

    fn hostinfo(&self) -> Hostinfo {
        let derp = *self.derp.borrow();
        Hostinfo {
            hostname: self.config.hostname.clone(),
            os: "linux".into(),
            ipn_version: format!("ferry-{}", env!("CARGO_PKG_VERSION")),
            net_info: (derp != 0).then_some(NetInfo {
                preferred_derp: derp,
            }),
        }
    }

    fn save(&self) {
        if let Err(e) = self.state.save(&self.config.state_path) {
            tracing::warn!("tailnet: saving {}: {e}", self.config.state_path.display());
        }
    }

    async fn session(&mut self, mapped: &mut bool) -> Result<(), Error> {
        self.shared.set_status(Status::Connecting);
        let roots = &self.config.tls_roots;
        let key = channel::fetch_server_key(&self.server, roots).await?;
        let pipe = channel::open(&self.server, &key, &self.state.machine, roots).await?;
        let mut h2 = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        h2.max_header_list_size(16 * 1024)
            .max_frame_size(16 * 1024)
            .max_concurrent_reset_streams(16)
            .max_send_buf_size(256 * 1024);
        let (mut sender, conn) = h2.handshake(TokioIo::new(pipe)).await?;
        let conn = tokio::spawn(conn);
        let result = self.serve(&mut sender, mapped).await;
        conn.abort();
        result
    }

    async fn serve(&mut self, sender: &mut Sender, mapped: &mut bool) -> Result<(), Error> {
        if !self.state.registered {
            self.register(sender).await?;
        }
        let body = match self.poll(sender).await {
            Err(Error::Status { .. }) => {
                // The saved node key is unknown (or no longer valid) here:
                // register it with the auth key and poll again.
                self.state.registered = false;
                self.register(sender).await?;
                self.poll(sender).await?
            }
            r => r?,
        };
        self.stream(sender, body, mapped).await
    }

    async fn register(&mut self, sender: &mut Sender) -> Result<(), Error> {
        let req = RegisterRequest {
            version: CAPABILITY_VERSION.into(),
            node_key: self.state.node.public(),
            auth: Some(RegisterAuth {
                auth_key: self.config.auth_key.clone(),
            }),
            hostinfo: self.hostinfo(),
        };
        let (status, body) =
            request(sender, &self.server, "/machine/register", req.to_json()).await?;
        let body = read_body(body).await?;
        if status != 200 {
            return Err(status_error("/machine/register", status, &body));
        }
        let r = RegisterResponse::from_json(&body)
            .map_err(|e| Error::Protocol(format!("register response: {e}")))?;
        if !r.error.is_empty() {
            return Err(Error::Protocol(format!("register refused: {}", r.error)));
        }
        if r.node_key_expired {
            // Start over with a new node key next time.
            self.state.node = NodePrivate::generate();
            self.save();
            return Err(Error::Protocol("node key expired".into()));
        }
        if !r.machine_authorized {
            return Err(Error::Protocol(format!(
                "not authorised (login URL {:?}); is the auth key valid?",
                r.auth_url
            )));
        }
        self.shared.count_registration();
        self.state.registered = true;
        self.save();
        tracing::info!(node_key = %self.state.node.public(), "tailnet: registered");
        Ok(())
    }

    fn map_request(&self, stream: bool) -> MapRequest {
        MapRequest {
            version: CAPABILITY_VERSION.into(),
            keep_alive: stream,
            node_key: self.state.node.public(),
            disco_key: self.state.disco.public(),
            stream,
            omit_peers: !stream,
            hostinfo: self.hostinfo(),
            endpoints: Vec::new(),
        }
    }

    async fn poll(&mut self, sender: &mut Sender) -> Result<hyper::body::Incoming, Error> {
        let json = self.map_request(true).to_json();
        let (status, body) = request(sender, &self.server, "/machine/map", json).await?;
        if status != 200 {
            let body = read_body(body).await.unwrap_or_default();
            return Err(status_error("/machine/map", status, &body));
        }
        Ok(body)
    }

    async fn stream(
        &mut self,
        sender: &mut Sender,
        mut body: hyper::body::Incoming,
        mapped: &mut bool,
    ) -> Result<(), Error> {
        // Each session starts from nothing (its first response is a full
        // one), numbered after the last published netmap.
        let mut netmap = Netmap {
            version: self.version,
            ..Netmap::default()
        };
        let mut buf = Vec::new();
        let mut derp = self.derp.clone();
        derp.mark_unchanged();
        let mut derp_open = true;
        loop {
            let frame = tokio::select! {
                f = tokio::time::timeout(WATCHDOG, body.frame()) => f,
                changed = derp.changed(), if derp_open => {
                    match changed {
                        Ok(()) => self.lite_update(sender).await?,
                        Err(_) => derp_open = false,
                    }
                    continue;
                }
            };
            let Ok(frame) = frame else {
                return Err(Error::Timeout("map poll silent for 120 s"));
            };
            let Some(frame) = frame else {
                return Ok(());
            };
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            while let Some((msg, used)) = map_frame::next_frame(&buf, MAX_MAP_FRAME)
                .map_err(|e| Error::Protocol(e.to_string()))?
            {
                let m = MapResponse::from_json(msg)
                    .map_err(|e| Error::Protocol(format!("map response: {e}")))?;
                buf.drain(..used);
                self.on_map(&mut netmap, m, mapped);
            }
        }
    }

    fn on_map(&mut self, netmap: &mut Netmap, m: MapResponse, mapped: &mut bool) {
        let first = !*mapped;
        *mapped = true;
        if netmap.apply(m) || first {
            if let Some(id) = netmap.self_node.as_ref().map(|n| n.id) {
                if id != self.state.node_id {
                    self.state.node_id = id;
                    self.save();
                }
            }
            if netmap.version == self.version {
                netmap.version += 1;
            }
            self.version = netmap.version;
            self.shared.set_netmap(netmap.clone());
        }
        if first {
            self.shared.set_status(Status::Polling);
        }
    }

    /// A Hostinfo-only map request (no stream, no peers).
    async fn lite_update(&mut self, sender: &mut Sender) -> Result<(), Error> {
        let json = self.map_request(false).to_json();
        let (status, body) = request(sender, &self.server, "/machine/map", json).await?;
        let body = read_body(body).await?;
        if status != 200 {
            return Err(status_error("/machine/map", status, &body));
        }
        Ok(())
    }
}

fn status_error(path: &'static str, status: u16, body: &[u8]) -> Error {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    Error::Status {
        path,
        status,
        body: text.trim().to_owned(),
    }
}

async fn request(
    sender: &mut Sender,
    server: &LoginServer,
    path: &'static str,
    json: Vec<u8>,
) -> Result<(u16, hyper::body::Incoming), Error> {
    sender.ready().await?;
    let req = hyper::Request::post(format!("https://{}{path}", server.authority()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json)))
        .map_err(|e| Error::Protocol(format!("building {path}: {e}")))?;
    let resp = tokio::time::timeout(channel::STEP_TIMEOUT, sender.send_request(req))
        .await
        .map_err(|_| Error::Timeout("a control request"))??;
    Ok((resp.status().as_u16(), resp.into_body()))
}

async fn read_body(body: hyper::body::Incoming) -> Result<Vec<u8>, Error> {
    let collected = tokio::time::timeout(
        channel::STEP_TIMEOUT,
        Limited::new(body, MAX_BODY).collect(),
    )
    .await
    .map_err(|_| Error::Timeout("a control response body"))?
    .map_err(|e| Error::Protocol(format!("response body: {e}")))?;
    Ok(collected.to_bytes().to_vec())
}

/// The delay before attempt `n + 1`: doubling from 1 s to 60 s, times a
/// random factor in [0.5, 1).
fn backoff(attempt: u32) -> Duration {
    let base = BACKOFF_MIN
        .saturating_mul(1u32 << attempt.min(6))
        .min(BACKOFF_MAX);
    let factor: f64 = 0.5 + rand::random::<f64>() / 2.0;
    base.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        for attempt in 0..40 {
            let d = backoff(attempt);
            let base = BACKOFF_MIN
                .saturating_mul(1 << attempt.min(6))
                .min(BACKOFF_MAX);
            assert!(d >= base / 2 && d < base, "{attempt}: {d:?}");
        }
        assert!(backoff(30) <= BACKOFF_MAX);
    }
}
