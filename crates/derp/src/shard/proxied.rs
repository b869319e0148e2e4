//! The real client behind a proxy: the PROXY header a trusted proxy puts
//! before the client's bytes (`--proxy-protocol`), and the
//! `X-Forwarded-For` / `Forwarded` headers of a trusted HTTP proxy.
//!
//! A connection from a trusted proxy must start with a valid header; one
//! from anyone else must not start with one (it would be a client claiming
//! another address). Either failure ends the handshake with its own reason
//! and a log line. The address a header names replaces the socket's peer
//! for everything after: admission, `peerPresent`, logs.

use std::net::{IpAddr, SocketAddr};

use ferry_proto::{forwarded, proxy};

use crate::conn::ProxyPrelude;

use super::*;

impl Shard {
    /// Where a connection should start: a PROXY header expected, refused,
    /// or neither.
    pub(super) fn proxy_prelude_for(&self, peer: &SocketAddr) -> ProxyPrelude {
        let cfg = &self.shared.config;
        if !cfg.proxy_protocol {
            ProxyPrelude::Done
        } else if cfg.trusted_proxies.contains(peer.ip()) {
            ProxyPrelude::Expect
        } else {
            ProxyPrelude::Refuse
        }
    }

    /// Takes a connection's first bytes while its PROXY check is due:
    /// collects them until the header (or its absence) is certain, then
    /// passes what follows it on as the connection's stream.
    pub(super) fn proxy_prelude(&mut self, slot: Slot, data: &[u8]) {
        let conn = &mut self.conns[slot];
        conn.head_mut().extend_from_slice(data);
        let peer = conn.peer();
        match conn.proxy() {
            ProxyPrelude::Expect => match proxy::parse(conn.head()) {
                Ok(None) => {}
                Ok(Some(header)) => {
                    let mut rest = conn.take_head();
                    rest.drain(..header.len);
                    if let Some(a) = header.addresses {
                        conn.set_peer(a.source);
                        conn_log!(self, debug, proxy = %peer, client = %a.source, "PROXY header");
                    }
                    self.conns[slot].set_proxy(ProxyPrelude::Done);
                    if !rest.is_empty() {
                        self.on_received(slot, &rest);
                    }
                }
                Err(proxy::ProxyError::NotProxy) => self.fail_handshake(
                    slot,
                    HandshakeFailure::ProxyHeader,
                    &format_args!("no PROXY header from trusted proxy {peer}"),
                ),
                Err(e) => self.fail_handshake(
                    slot,
                    HandshakeFailure::ProxyHeader,
                    &format_args!("bad PROXY header from trusted proxy {peer}: {e}"),
                ),
            },
            ProxyPrelude::Refuse => match proxy::starts_with_header(conn.head()) {
                None => {}
                Some(false) => {
                    let rest = conn.take_head();
                    conn.set_proxy(ProxyPrelude::Done);
                    self.on_received(slot, &rest);
                }
                Some(true) => self.fail_handshake(
                    slot,
                    HandshakeFailure::ProxyUntrusted,
                    &format_args!(
                        "PROXY header from an untrusted peer {peer} (not in --trusted-proxies)"
                    ),
                ),
            },
            ProxyPrelude::Done => {
                conn.take_head();
                self.on_received(slot, data);
            }
        }
    }

    /// After a request head: the client a trusted HTTP proxy names, if the
    /// connection comes from one. The port is unknown then (0).
    pub(super) fn forwarded_client(&mut self, slot: Slot, req: &http::Request) {
        let trusted = &self.shared.config.trusted_proxies;
        if trusted.is_empty() || (req.x_forwarded_for.is_none() && req.forwarded.is_none()) {
            return;
        }
        let conn = &mut self.conns[slot];
        let ip = forwarded::client_address(
            conn.peer().ip(),
            trusted,
            req.x_forwarded_for.as_deref(),
            req.forwarded.as_deref(),
        );
        if ip != canonical(conn.peer().ip()) {
            let proxy = conn.peer();
            conn.set_peer(SocketAddr::new(ip, 0));
            conn_log!(self, debug, %proxy, client = %ip, "forwarded-for header");
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}
