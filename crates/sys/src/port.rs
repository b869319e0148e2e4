//! Claiming a listening port for one process, although its shards share it.
//!
//! Every Ferry service binds one socket per shard to the same address with
//! `SO_REUSEPORT`, and the kernel spreads traffic over them. The option has
//! a side effect: a *second* Ferry (same user) asking for the same address
//! with the same option joins the group instead of failing, and the kernel
//! then splits clients between two unrelated relays without a word.
//!
//! [`ensure_unclaimed`] closes that gap. Before a group is made, it binds a
//! plain socket of the same type, without `SO_REUSEPORT`, to the address
//! once and closes it again. The kernel refuses that bind with `EADDRINUSE`
//! whenever any socket holds the address, with or without the option, so a
//! port taken by another process (Ferry or not) is found before anything
//! joins it. (TCP probes set `SO_REUSEADDR`, so connections of an earlier
//! run lingering in `TIME_WAIT` do not count as a holder.)
//!
//! [`bind_hint`] adds what an operator needs to act on a failed bind.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// The kind of socket a port is claimed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A TCP listener.
    Tcp,
    /// A UDP socket.
    Udp,
}

/// A socket of `transport` for `addr`, non-blocking; `[::]` also serves
/// IPv4 where the host allows it, like Go's `":port"`.
pub fn new_socket(addr: SocketAddr, transport: Transport) -> io::Result<Socket> {
    let (ty, proto) = match transport {
        Transport::Tcp => (Type::STREAM, Protocol::TCP),
        Transport::Udp => (Type::DGRAM, Protocol::UDP),
    };
    let s = Socket::new(Domain::for_address(addr), ty, Some(proto))?;
    if addr.is_ipv6() {
        s.set_only_v6(false)?;
    }
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Makes sure no socket of another group holds `addr`, by binding a
/// socket without `SO_REUSEPORT` to it once (see the module doc).
///
/// Returns the address the group should bind: `addr` itself, or
/// `0.0.0.0:port` when `addr` is `[::]:port` on a host without IPv6.
/// Port 0 is returned unchanged without a probe (the kernel picks a free
/// port). An address in use fails with [`io::ErrorKind::AddrInUse`].
pub fn ensure_unclaimed(addr: SocketAddr, transport: Transport) -> io::Result<SocketAddr> {
    let mut addr = addr;
    let probe = match new_socket(addr, transport) {
        Err(e)
            if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                && e.raw_os_error() == Some(libc::EAFNOSUPPORT) =>
        {
            addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
            new_socket(addr, transport)
        }
        r => r,
    }?;
    if addr.port() == 0 {
        return Ok(addr);
    }
    if transport == Transport::Tcp {
        probe.set_reuse_address(true)?;
    }
    probe.bind(&addr.into())?;
    Ok(addr)
}

/// What an operator can do about a failed bind of `addr`, when there is
/// something specific to say: the capability that ports below 1024 need,
/// or that another process holds the port.
pub fn bind_hint(addr: SocketAddr, err: &io::Error) -> Option<&'static str> {
    match err.kind() {
        io::ErrorKind::PermissionDenied if addr.port() < 1024 => Some(
            "ports below 1024 need root or the CAP_NET_BIND_SERVICE capability: \
             `setcap cap_net_bind_service=+ep /path/to/ferry`, or \
             AmbientCapabilities=CAP_NET_BIND_SERVICE in a systemd unit",
        ),
        io::ErrorKind::AddrInUse => Some(
            "another program (or another ferry) holds this address; \
             stop it or choose another port",
        ),
        _ => None,
    }
}

/// [`bind_hint`] as text to append to an error message: `"; hint"`, or
/// nothing.
pub fn hint_suffix(addr: SocketAddr, err: &io::Error) -> String {
    bind_hint(addr, err).map_or(String::new(), |h| format!("; {h}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reuseport_group_of_another_owner_is_found() {
        for transport in [Transport::Tcp, Transport::Udp] {
            let free = ensure_unclaimed("127.0.0.1:0".parse().unwrap(), transport).unwrap();
            assert_eq!(free.port(), 0);
            // Someone else's group, with SO_REUSEPORT set.
            let other = new_socket("127.0.0.1:0".parse().unwrap(), transport).unwrap();
            other.set_reuse_port(true).unwrap();
            other
                .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
                .unwrap();
            if transport == Transport::Tcp {
                other.listen(8).unwrap();
            }
            let taken = other.local_addr().unwrap().as_socket().unwrap();
            let err = ensure_unclaimed(taken, transport).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{transport:?}");
            assert!(bind_hint(taken, &err).unwrap().contains("another"));
            drop(other);
            assert_eq!(ensure_unclaimed(taken, transport).unwrap(), taken);
        }
    }

    #[test]
    fn low_ports_hint_at_the_capability() {
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        let hint = bind_hint("0.0.0.0:443".parse().unwrap(), &denied).unwrap();
        assert!(hint.contains("CAP_NET_BIND_SERVICE"));
        assert!(bind_hint("0.0.0.0:8443".parse().unwrap(), &denied).is_none());
    }
}
