//! Relay-session helpers shared by the tests that drive SDK clients
//! against `ferry --relay-port` (`relay_sessions.rs`,
//! `relay_sessions_netns.rs`).

use ferry_client::{DerpClient, Event, Options};
use ferry_proto::relay_session::SessionOffer;
use ferry_proto::udp_header::{Header, Protocol};

use super::T;

/// Client options, asking for relay sessions or not.
pub(crate) fn options(relay_sessions: bool) -> Options {
    let mut o = Options::default();
    o.relay_sessions = relay_sessions;
    o
}

/// The next event `pick` accepts, skipping others; bounded by [`T`].
pub(crate) async fn next<R>(c: &mut DerpClient, mut pick: impl FnMut(Event) -> Option<R>) -> R {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let e = tokio::time::timeout_at(deadline, c.recv())
            .await
            .expect("event within the deadline")
            .expect("client running");
        if let Some(r) = pick(e) {
            return r;
        }
    }
}

/// The next relay-session offer `c` gets; bounded by [`T`].
pub(crate) async fn offer(c: &mut DerpClient) -> SessionOffer {
    next(c, |e| match e {
        Event::RelaySession(o) => Some(o),
        _ => None,
    })
    .await
}

/// A data datagram of session `vni` carrying `body`.
pub(crate) fn data(vni: u32, body: &[u8]) -> Vec<u8> {
    let mut d = Header::data(Protocol::Payload, vni).to_bytes().to_vec();
    d.extend_from_slice(body);
    d
}
