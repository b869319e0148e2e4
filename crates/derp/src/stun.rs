//! The STUN responder: answers Tailscale's binding requests with the
//! client's address as seen here, ignores everything else.
//!
//! It runs on a thread of its own with a blocking socket: one datagram in,
//! at most one out, no state. The short read timeout only serves to notice
//! a shutdown.

use std::io;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferry_proto::stun;

use crate::metrics::StunMetrics;

/// Serves STUN on `sock` until `stop` is set.
pub fn serve(sock: UdpSocket, metrics: &StunMetrics, stop: &AtomicBool) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(250)));
    let mut buf = [0u8; 1500];
    let mut out = [0u8; 44];
    while !stop.load(Ordering::Relaxed) {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(v) => v,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(_) => {
                metrics.read_error.inc();
                continue;
            }
        };
        let Ok(txid) = stun::parse_binding_request(&buf[..n]) else {
            metrics.not_stun.inc();
            continue;
        };
        let is_v4 = match from.ip() {
            std::net::IpAddr::V4(_) => true,
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
        };
        if is_v4 {
            metrics.ipv4.inc();
        } else {
            metrics.ipv6.inc();
        }
        let len = stun::write_binding_response(&txid, from, &mut out);
        match sock.send_to(&out[..len], from) {
            Ok(_) => metrics.success.inc(),
            Err(_) => metrics.write_error.inc(),
        }
    }
}
