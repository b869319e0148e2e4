//! Making the relay's UDP sockets: one `SO_REUSEPORT` group per listening
//! address (one socket per shard), and one connected upstream socket per
//! bounce client.
//!
//! Every socket gets the same treatment: non-blocking, buffers raised (with
//! the `*BUFFORCE` options when the process may, so `net.core.rmem_max`
//! does not silently cap them), the kernel's drop counter on
//! (`SO_RXQ_OVFL`), and GRO when it is in use.
//!
//! "Port in use" is checked explicitly, as the DERP server does, with
//! [`ferry_sys::port::ensure_unclaimed`]: a socket with `SO_REUSEPORT`
//! would otherwise quietly join a group another Ferry (same user) already
//! has on that port and split its traffic.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use ferry_sys::gso;
use ferry_sys::port::{self, Transport};
use ferry_sys::sockopt::{self, Buffer, BufferSize};
use socket2::{Domain, Protocol, Socket, Type};
use thiserror::Error;

/// Options applied to every socket.
#[derive(Clone, Copy, Debug)]
pub struct SocketOptions {
    /// Receive buffer to ask for.
    pub recv_buffer: usize,
    /// Send buffer to ask for.
    pub send_buffer: usize,
    /// Turn GRO on.
    pub gro: bool,
}

/// What binding a listening address can run into.
#[derive(Debug, Error)]
pub enum BindError {
    /// Another socket holds the port.
    #[error("{field}: {addr} is in use by another program (or another ferry)")]
    PortInUse {
        /// Field of the address.
        field: String,
        /// The address.
        addr: SocketAddr,
    },
    /// Any other failure.
    #[error("{field}: cannot listen on {addr}: {source}{}", port::hint_suffix(*addr, source))]
    Other {
        /// Field of the address.
        field: String,
        /// The address.
        addr: SocketAddr,
        /// The system's error.
        source: io::Error,
    },
}

/// What the kernel granted a socket.
#[derive(Clone, Copy, Debug, Default)]
pub struct Granted {
    /// Receive buffer.
    pub recv: usize,
    /// Send buffer.
    pub send: usize,
    /// Both were forced past the system maximum.
    pub forced: bool,
}

fn new_socket(addr: &SocketAddr) -> io::Result<Socket> {
    port::new_socket(*addr, Transport::Udp)
}

/// Applies buffer sizes, the drop counter and GRO.
pub fn tune(sock: &UdpSocket, opts: &SocketOptions) -> io::Result<Granted> {
    let fd = sock.as_fd();
    let BufferSize {
        effective: recv,
        forced: rf,
    } = sockopt::set_buffer(fd, Buffer::Receive, opts.recv_buffer)?;
    let BufferSize {
        effective: send,
        forced: sf,
    } = sockopt::set_buffer(fd, Buffer::Send, opts.send_buffer)?;
    sockopt::enable_drop_counter(fd)?;
    if opts.gro {
        gso::set_gro(fd, true)?;
    }
    Ok(Granted {
        recv,
        send,
        forced: rf && sf,
    })
}

/// Binds `n` sockets to `addr` as one `SO_REUSEPORT` group, after making
/// sure nobody else holds the port. `[::]` falls back to `0.0.0.0` on a
/// host without IPv6. Returns the sockets, their address (with the real
/// port when `addr` asked for 0) and what the kernel granted.
pub fn bind_group(
    field: &str,
    addr: SocketAddr,
    n: usize,
    opts: &SocketOptions,
) -> Result<(Vec<UdpSocket>, SocketAddr, Granted), BindError> {
    let other = |addr, source| BindError::Other {
        field: field.to_string(),
        addr,
        source,
    };
    let failed = |addr, e: io::Error| match e.kind() {
        io::ErrorKind::AddrInUse => BindError::PortInUse {
            field: field.to_string(),
            addr,
        },
        _ => other(addr, e),
    };
    let mut addr = port::ensure_unclaimed(addr, Transport::Udp).map_err(|e| failed(addr, e))?;
    let mut socks = Vec::with_capacity(n);
    let mut granted = Granted::default();
    for _ in 0..n.max(1) {
        let s = new_socket(&addr).map_err(|e| other(addr, e))?;
        s.set_reuse_port(true).map_err(|e| other(addr, e))?;
        s.bind(&addr.into()).map_err(|e| failed(addr, e))?;
        let s: UdpSocket = s.into();
        if addr.port() == 0 {
            addr = s.local_addr().map_err(|e| other(addr, e))?;
        }
        granted = tune(&s, opts).map_err(|e| other(addr, e))?;
        socks.push(s);
    }
    Ok((socks, addr, granted))
}

/// A socket for one bounce client, connected to `target` so only the
/// target's datagrams come back through it. `port` 0 lets the kernel
/// choose; otherwise that local port is kept (when a session moves to a
/// new target and the server should keep seeing the same port).
pub fn upstream(target: SocketAddr, port: u16, opts: &SocketOptions) -> io::Result<UdpSocket> {
    let bind: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, port).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, port).into(),
    };
    let s = Socket::new(
        Domain::for_address(target),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    s.set_nonblocking(true)?;
    s.bind(&bind.into())?;
    s.connect(&target.into())?;
    let s: UdpSocket = s.into();
    tune(&s, opts)?;
    Ok(s)
}

/// The source address the kernel picks for datagrams to `target` (the
/// preferred source of its route), found by connecting a throwaway socket.
pub fn route_source(target: SocketAddr) -> io::Result<IpAddr> {
    let bind: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(bind)?;
    s.connect(target)?;
    Ok(s.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> SocketOptions {
        SocketOptions {
            recv_buffer: 1 << 20,
            send_buffer: 1 << 20,
            gro: false,
        }
    }

    #[test]
    fn group_shares_one_port_and_refuses_a_taken_one() {
        let (socks, addr, g) =
            bind_group("--listen", "127.0.0.1:0".parse().unwrap(), 3, &opts()).unwrap();
        assert_eq!(socks.len(), 3);
        assert_ne!(addr.port(), 0);
        assert!(socks.iter().all(|s| s.local_addr().unwrap() == addr));
        assert!(g.recv > 0);
        // A second group on the same port would split traffic: refused.
        let err = bind_group("bounce[0].listen[0]", addr, 2, &opts()).unwrap_err();
        assert!(matches!(err, BindError::PortInUse { .. }), "{err}");
        assert!(err
            .to_string()
            .starts_with("bounce[0].listen[0]: 127.0.0.1:"));
        // So is a port a plain socket holds.
        let plain = UdpSocket::bind("127.0.0.1:0").unwrap();
        let err = bind_group("--listen", plain.local_addr().unwrap(), 1, &opts()).unwrap_err();
        assert!(matches!(err, BindError::PortInUse { .. }));
    }

    #[test]
    fn upstream_is_connected() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let up = upstream(server.local_addr().unwrap(), 0, &opts()).unwrap();
        assert_eq!(
            route_source(server.local_addr().unwrap()).unwrap(),
            up.local_addr().unwrap().ip()
        );
        assert_eq!(up.peer_addr().unwrap(), server.local_addr().unwrap());
        up.send(b"x").unwrap();
        let mut b = [0u8; 4];
        server
            .set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let (n, from) = server.recv_from(&mut b).unwrap();
        assert_eq!((n, from.port()), (1, up.local_addr().unwrap().port()));
    }
}
