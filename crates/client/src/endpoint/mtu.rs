//! How large a datagram each path carries ([`PathMtu`]), and the limits
//! every path shares ([`MAX_DATAGRAM`]).
//!
//! Every datagram travels as a peer message: the 8-byte header of
//! `docs/relay-sessions.md` §3 in front of the application's bytes, on
//! every path.
//!
//! - **Direct** UDP: one UDP datagram to the peer. The most it can carry
//!   is what IP allows one UDP datagram (65,507 bytes of payload over
//!   IPv4, 65,527 over IPv6) less the header. Longer than one network
//!   packet (a 1,500-byte path: 1,472 bytes of UDP payload over IPv4,
//!   1,452 over IPv6, [`ferry_sys::train::max_segment`]), the kernel
//!   sends it as IP fragments, which arrive whole or not at all and which
//!   some networks drop: [`PathMtu::unfragmented`] is the longest datagram
//!   that needs none on a 1,500-byte path.
//! - **Relay session**: the same header, to the relay, which forwards the
//!   datagram unchanged to the peer over its own leg, whose address family
//!   this side does not know; so the limits are the smaller of the two
//!   families' (1,444 bytes unfragmented, 65,499 at most).
//! - **DERP**: inside a DERP packet (at most 65,536 bytes, header
//!   included) on the TCP connection to the server, which TCP cuts to the
//!   network's size: never fragmented, up to 65,528 bytes.
//!
//! [`super::Endpoint::send`] refuses a datagram longer than its active
//! path carries with [`super::SendError::TooLarge`] (the path's limit in
//! it), before anything is counted or sent.

use super::paths::PathAddr;
use ferry_proto::udp_header;
use ferry_sys::train::{max_segment, MAX_SEGMENT_V6};
use std::net::SocketAddr;

/// The largest UDP payload over IPv4: 65,535 less the IPv4 and UDP headers.
const UDP_MAX_V4: usize = 65_535 - 20 - 8;
/// The largest UDP payload over IPv6 (without jumbograms): the payload
/// length field counts the UDP header, not the IPv6 header.
const UDP_MAX_V6: usize = 65_535 - 8;

/// The largest datagram every path carries (65,499 bytes: an IPv4 UDP
/// datagram less the header). One this long or shorter is never refused as
/// too large, whatever path the peer is on; longer ones only where the
/// active path takes them ([`PathMtu::max`]).
pub const MAX_DATAGRAM: usize = UDP_MAX_V4 - udp_header::LEN;

/// The largest datagram DERP carries (65,528 bytes: a DERP packet less
/// the header).
pub const MAX_DERP_DATAGRAM: usize = ferry_proto::frame::MAX_PACKET_SIZE - udp_header::LEN;

/// How large a datagram a path carries, in application bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathMtu {
    /// The longest datagram that leaves as one packet of a 1,500-byte
    /// network path (no IP fragmentation). Longer ones up to
    /// [`PathMtu::max`] are sent, fragmented by IP on UDP paths. On DERP
    /// the same as `max`: TCP carries it.
    pub unfragmented: usize,
    /// The longest datagram the path takes; longer ones are refused
    /// ([`super::SendError::TooLarge`]).
    pub max: usize,
}

impl PathMtu {
    /// DERP's limits.
    pub const DERP: PathMtu = PathMtu {
        unfragmented: MAX_DERP_DATAGRAM,
        max: MAX_DERP_DATAGRAM,
    };

    /// The limits of direct UDP to `to` (an IPv4-mapped address is IPv4).
    pub fn direct(to: SocketAddr) -> PathMtu {
        let v4 = match to {
            SocketAddr::V4(_) => true,
            SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
        };
        PathMtu {
            unfragmented: max_segment(Some(to)) - udp_header::LEN,
            max: if v4 { UDP_MAX_V4 } else { UDP_MAX_V6 } - udp_header::LEN,
        }
    }

    /// The limits of a relay session: both families' smaller ones, as the
    /// relay's leg to the peer may be either.
    pub const RELAY_SESSION: PathMtu = PathMtu {
        unfragmented: MAX_SEGMENT_V6 - udp_header::LEN,
        max: MAX_DATAGRAM,
    };

    /// The limits of `path`.
    pub fn of(path: &PathAddr) -> PathMtu {
        match path {
            PathAddr::Direct(to) => PathMtu::direct(*to),
            PathAddr::RelaySession { .. } => PathMtu::RELAY_SESSION,
            PathAddr::Derp => PathMtu::DERP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers the documentation states, each from the header sizes.
    #[test]
    fn every_path_states_its_limits() {
        let v4 = PathMtu::direct("192.0.2.1:9".parse().unwrap());
        let v6 = PathMtu::direct("[2001:db8::1]:9".parse().unwrap());
        let mapped = PathMtu::direct("[::ffff:192.0.2.1]:9".parse().unwrap());
        assert_eq!((v4.unfragmented, v4.max), (1464, 65_499));
        assert_eq!((v6.unfragmented, v6.max), (1444, 65_519));
        assert_eq!(mapped, v4);
        let relay = PathAddr::RelaySession {
            vni: 1,
            addr: "192.0.2.9:3479".parse().unwrap(),
        };
        assert_eq!((relay.mtu().unfragmented, relay.mtu().max), (1444, 65_499));
        assert_eq!(
            (PathMtu::DERP.unfragmented, PathMtu::DERP.max),
            (65_528, 65_528)
        );
        assert_eq!(MAX_DATAGRAM, 65_499);
        // Every path takes MAX_DATAGRAM.
        for m in [v4, v6, relay.mtu(), PathMtu::DERP] {
            assert!(m.max >= MAX_DATAGRAM && m.unfragmented <= m.max, "{m:?}");
        }
    }
}
