//! The STUN responder: answers Tailscale's binding requests with the
//! client's address as seen here, ignores everything else.
//!
//! It runs on a thread of its own with a blocking socket: one datagram in,
//! at most one out, no state. The short read timeout only serves to notice
//! a shutdown. Each answer leaves from the address its request was sent to
//! (as derper does since v1.104): on a host with several addresses, an
//! answer from another one would be dropped by the asker's NAT.

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferry_proto::stun;
use ferry_sys::pktinfo;

use crate::metrics::StunMetrics;

/// Serves STUN on `sock` until `stop` is set.
pub fn serve(sock: UdpSocket, metrics: &StunMetrics, stop: &AtomicBool) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(250)));
    // Without it answers still go out, from the kernel's choice of address.
    let ipv6 = sock.local_addr().is_ok_and(|a| a.is_ipv6());
    let _ = pktinfo::enable(sock.as_fd(), ipv6);
    let mut buf = [0u8; 1500];
    let mut out = [0u8; 44];
    while !stop.load(Ordering::Relaxed) {
        let (n, from, local) = match pktinfo::recv(sock.as_fd(), &mut buf) {
            Ok(got) => (got.len, got.from, got.local),
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
        match pktinfo::send(sock.as_fd(), &out[..len], from, local) {
            Ok(_) => metrics.success.inc(),
            Err(_) => metrics.write_error.inc(),
        }
    }
}
