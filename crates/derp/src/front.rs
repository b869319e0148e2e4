//! The HTTP surface around `/derp`: what each plain request gets.
//!
//! The request head is parsed by `ferry_proto::http`; this module decides
//! the answer. It is pure: the shard writes the bytes and closes the
//! connection afterwards (every plain response carries `Connection: close`).

use std::net::{IpAddr, SocketAddr};

use ferry_proto::forwarded::{self, TrustedProxies};
use ferry_proto::http::{self, Request, Upgrade};

use crate::config::{DerpConfig, HomePage, ListenerKind};
use crate::debug_clients::query::{self, Query};
use crate::debug_clients::render;
use crate::metrics::{Metrics, Route};

/// What to do with a request.
pub enum Answer {
    /// Switch to DERP (classic when `fast_start` is false: send a 101 first).
    Upgrade {
        /// The client sent `Derp-Fast-Start: 1`: no HTTP response at all.
        fast_start: bool,
        /// DERP in WebSocket messages: answer with the WebSocket 101 for
        /// this `Sec-WebSocket-Key`.
        websocket: Option<String>,
    },
    /// Write this response and close.
    Respond(Route, Vec<u8>),
    /// A page of `/debug/clients/`: the shards' connections under this
    /// query (asked of every shard; see `debug_clients`).
    DebugClients(Box<Query>),
}

const HOME_PAGE: &str = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Ferry DERP relay</title></head>\n\
<body><h1>Ferry</h1>\n<p>This is a DERP relay for Tailscale and WireGuard traffic. It forwards end-to-end encrypted \
packets between peers that cannot reach each other directly; there is nothing to see here in a browser.</p>\n\
<p>Relay clients connect to <code>/derp</code>.</p>\n</body></html>\n";

const SECURITY_HEADERS: &[(&str, &str)] = &[
    (
        "Strict-Transport-Security",
        "max-age=63072000; includeSubDomains",
    ),
    (
        "Content-Security-Policy",
        "default-src 'none'; frame-ancestors 'none'; form-action 'none'; base-uri 'self'",
    ),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
];

/// Whether debug pages may be shown to the client of `req`, which came
/// from `peer` (the socket's peer, or the client a PROXY header named):
/// loopback clients only. A request with `X-Forwarded-For` or `Forwarded`
/// says it was forwarded for someone else: from a peer that is not a
/// trusted proxy it is not local, whatever the peer's address; from a
/// trusted proxy, each of those headers present must name a known
/// loopback client (the proxy wrote one of them, and the client may have
/// written the other).
pub fn debug_allowed(peer: &SocketAddr, trusted: &TrustedProxies, req: &Request) -> bool {
    let local = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        IpAddr::V4(v4) => v4.is_loopback(),
    };
    let (xff, fwd) = (req.x_forwarded_for.as_deref(), req.forwarded.as_deref());
    if xff.is_none() && fwd.is_none() {
        return local(peer.ip());
    }
    if !trusted.contains(peer.ip()) {
        return false;
    }
    let named = [
        xff.map(|x| forwarded::known_client_address(peer.ip(), trusted, Some(x), None)),
        fwd.map(|f| forwarded::known_client_address(peer.ip(), trusted, None, Some(f))),
    ];
    named.into_iter().flatten().all(|c| c.is_some_and(local))
}

/// `/debug/clients/` without a filter (the counts), with a bad query
/// (400, derper's text), or the query for the shards.
fn debug_clients(metrics: &Metrics, req: &Request, now_ns: i128) -> Answer {
    let raw = req.query.as_deref().unwrap_or("");
    match query::parse(raw, now_ns) {
        Ok(Some(q)) => Answer::DebugClients(Box::new(q)),
        Ok(None) => {
            let json = query::is_json(raw);
            let (conns, keys) = metrics.local_counts();
            let body = render::counts(json, conns, keys);
            Answer::Respond(
                Route::Debug,
                http::response(
                    200,
                    "OK",
                    &[("Content-Type", body.content_type)],
                    &body.bytes,
                ),
            )
        }
        Err(e) => Answer::Respond(
            Route::Debug,
            http::response(
                400,
                "Bad Request",
                &[
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("X-Content-Type-Options", "nosniff"),
                ],
                format!("{e}\n").as_bytes(),
            ),
        ),
    }
}

/// Decides the answer to `req` from `peer` (the socket's peer, or the
/// client a PROXY header named; not the one a forwarding header names) on
/// a listener of `kind`. `now_ns` is the wall-clock time (Unix
/// nanoseconds) on the connection-time scale of `/debug/clients/`.
pub fn answer(
    cfg: &DerpConfig,
    metrics: &Metrics,
    kind: ListenerKind,
    peer: &SocketAddr,
    req: &Request,
    now_ns: i128,
) -> Answer {
    let text = |status: u16, reason: &str, body: &str| {
        http::response(
            status,
            reason,
            &[("Content-Type", "text/plain; charset=utf-8")],
            body.as_bytes(),
        )
    };
    let path = req.path.as_str();

    if path == "/healthz" {
        return Answer::Respond(Route::Health, metrics.health().response());
    }
    if path == "/generate_204" {
        return Answer::Respond(
            Route::Generate204,
            http::generate_204(req.challenge.as_deref()),
        );
    }
    if let Some(token) = path.strip_prefix("/.well-known/acme-challenge/") {
        // HTTP-01 (RFC 8555 §8.3), on every plain listener.
        return Answer::Respond(
            Route::AcmeChallenge,
            match cfg.acme.as_ref().and_then(|a| a.http_challenge(token)) {
                Some(key_authorization) => http::response(
                    200,
                    "OK",
                    &[("Content-Type", "text/plain")],
                    key_authorization.as_bytes(),
                ),
                None => text(404, "Not Found", "no such ACME challenge\n"),
            },
        );
    }
    if path.starts_with("/debug/") || path == "/debug" {
        if !debug_allowed(peer, &cfg.trusted_proxies, req) {
            return Answer::Respond(
                Route::Debug,
                text(403, "Forbidden", "debug access denied\n"),
            );
        }
        if path == "/debug/clients/" || path == "/debug/clients" {
            return debug_clients(metrics, req, now_ns);
        }
        return Answer::Respond(
            Route::Debug,
            match path {
                "/debug/varz" | "/debug/metrics" => http::response(
                    200,
                    "OK",
                    &[("Content-Type", "text/plain; version=0.0.4; charset=utf-8")],
                    metrics.render().as_bytes(),
                ),
                "/debug" | "/debug/" => http::response(
                    200,
                    "OK",
                    &[("Content-Type", "text/html; charset=utf-8")],
                    b"<html><body><h1>Ferry debug</h1><ul><li><a href=\"/debug/varz\">/debug/varz</a> (Prometheus metrics)</li><li><a href=\"/debug/clients/\">/debug/clients/</a> (connected clients)</li></ul></body></html>\n",
                ),
                _ => text(404, "Not Found", "no such debug page\n"),
            },
        );
    }

    if kind == ListenerKind::Port80 {
        // derper's port-80 companion: captive-portal checks above, the rest
        // goes to HTTPS.
        if req.method == "GET" || req.method == "HEAD" {
            let host = req
                .host
                .as_deref()
                .unwrap_or("")
                .split(':')
                .next()
                .unwrap_or("");
            let location = format!("https://{host}{path}");
            return Answer::Respond(
                Route::Redirect,
                http::response(302, "Found", &[("Location", &location)], b""),
            );
        }
        return Answer::Respond(Route::Redirect, text(400, "Bad Request", "Use HTTPS\n"));
    }

    match path {
        "/derp" => {
            if !cfg.derp_enabled {
                return Answer::Respond(
                    Route::NotFound,
                    text(404, "Not Found", "derp server disabled\n"),
                );
            }
            match req.upgrade {
                Upgrade::Derp | Upgrade::WebSocketRaw => Answer::Upgrade {
                    fast_start: req.fast_start,
                    websocket: None,
                },
                Upgrade::WebSocketDerp => match req.websocket_key.as_deref() {
                    Some(key) if !key.trim().is_empty() => Answer::Upgrade {
                        fast_start: false,
                        websocket: Some(key.to_owned()),
                    },
                    _ => Answer::Respond(
                        Route::DerpNoUpgrade,
                        text(
                            400,
                            "Bad Request",
                            "WebSocket upgrade without Sec-WebSocket-Key\n",
                        ),
                    ),
                },
                Upgrade::None | Upgrade::Other => Answer::Respond(
                    Route::DerpNoUpgrade,
                    text(
                        426,
                        "Upgrade Required",
                        "DERP requires connection upgrade\n",
                    ),
                ),
            }
        }
        "/derp/probe" | "/derp/latency-check" => {
            if req.method == "GET" || req.method == "HEAD" {
                Answer::Respond(
                    Route::Probe,
                    http::response(200, "OK", &[("Access-Control-Allow-Origin", "*")], b""),
                )
            } else {
                Answer::Respond(
                    Route::Probe,
                    text(405, "Method Not Allowed", "bogus probe method\n"),
                )
            }
        }
        "/" => Answer::Respond(
            Route::Home,
            match &cfg.home {
                HomePage::Default => {
                    let mut headers = vec![("Content-Type", "text/html; charset=utf-8")];
                    headers.extend_from_slice(SECURITY_HEADERS);
                    http::response(200, "OK", &headers, HOME_PAGE.as_bytes())
                }
                HomePage::Blank => {
                    let mut headers = vec![("Content-Type", "text/html; charset=utf-8")];
                    headers.extend_from_slice(SECURITY_HEADERS);
                    http::response(200, "OK", &headers, b"")
                }
                HomePage::Redirect(url) => http::response(302, "Found", &[("Location", url)], b""),
            },
        ),
        "/bootstrap-dns" => Answer::Respond(
            Route::BootstrapDns,
            http::response(
                200,
                "OK",
                &[("Content-Type", "application/json")],
                &cfg.bootstrap_dns
                    .as_ref()
                    .map(|d| d.answer(req.query.as_deref()))
                    .unwrap_or_default(),
            ),
        ),
        "/robots.txt" => Answer::Respond(
            Route::Robots,
            text(200, "OK", "User-agent: *\nDisallow: /\n"),
        ),
        _ => Answer::Respond(
            Route::NotFound,
            text(404, "Not Found", "404 page not found\n"),
        ),
    }
}
