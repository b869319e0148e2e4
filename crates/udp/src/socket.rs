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

/// The buffer sizes the configuration asks for (`recv_buffer`,
/// `send_buffer`).
#[derive(Clone, Copy, Debug)]
pub struct Asked {
    /// Receive buffer, bytes.
    pub recv: usize,
    /// Send buffer, bytes.
    pub send: usize,
}

/// The system's caps on ordinary buffer requests: `net.core.rmem_max` and
/// `net.core.wmem_max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `net.core.rmem_max`, bytes.
    pub rmem_max: usize,
    /// `net.core.wmem_max`, bytes.
    pub wmem_max: usize,
}

/// Reads [`Limits`] from `/proc/sys/net/core`; `None` where they cannot
/// be read (some containers hide them).
pub fn buffer_limits() -> Option<Limits> {
    let read = |name: &str| -> Option<usize> {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(Limits {
        rmem_max: read("rmem_max")?,
        wmem_max: read("wmem_max")?,
    })
}

/// The one warning to log at start when the system's limits keep the
/// sockets below what the configuration asks for, or `None` when they do
/// not: buffers were forced past the limits (CAP_NET_ADMIN), or the limits
/// are at least the sizes asked for.
///
/// Without CAP_NET_ADMIN, Linux caps an `SO_RCVBUF`/`SO_SNDBUF` request at
/// `net.core.rmem_max`/`wmem_max` and then doubles it, keeping the extra
/// half for its own bookkeeping; `getsockopt` (and
/// `ferry_udp_socket_buffer_bytes`) reports the doubled value. So a limit
/// of at least the size asked for is what it takes, and the `sysctl -w`
/// lines set exactly that. Where the limits could not be read, what the
/// sockets reported decides (less than twice the request is short).
pub fn buffer_advice(asked: Asked, limits: Option<Limits>, granted: &Granted) -> Option<String> {
    if granted.forced {
        return None;
    }
    let (recv_cap, send_cap) = match limits {
        Some(l) => (l.rmem_max, l.wmem_max),
        None => (granted.recv / 2, granted.send / 2),
    };
    let recv_short = recv_cap < asked.recv;
    let send_short = send_cap < asked.send;
    if !recv_short && !send_short {
        return None;
    }
    let mut fix = Vec::new();
    let mut what = Vec::new();
    if recv_short {
        fix.push(format!("sysctl -w net.core.rmem_max={}", asked.recv));
        what.push(format!(
            "receive: asked {} bytes, net.core.rmem_max allows {recv_cap}",
            asked.recv
        ));
    }
    if send_short {
        fix.push(format!("sysctl -w net.core.wmem_max={}", asked.send));
        what.push(format!(
            "send: asked {} bytes, net.core.wmem_max allows {send_cap}",
            asked.send
        ));
    }
    Some(format!(
        "UDP socket buffers are smaller than asked ({}): without CAP_NET_ADMIN the kernel caps each \
         request at net.core.rmem_max/wmem_max, and bursts beyond the buffer are dropped \
         (ferry_udp_socket_drops_total). Fix, as root: {} (persist them in /etc/sysctl.d/), or give \
         ferry CAP_NET_ADMIN to force the sizes. The kernel then reports twice each size \
         (ferry_udp_socket_buffer_bytes, now {} and {}): it doubles every request and keeps half \
         for its own bookkeeping",
        what.join("; "),
        fix.join(" && "),
        granted.recv,
        granted.send,
    ))
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
    fn buffer_advice_compares_the_sysctl_limits_with_the_request() {
        const MB16: usize = 16 << 20;
        let asked = Asked {
            recv: MB16,
            send: MB16,
        };
        let capped = Granted {
            recv: 2 * 212_992,
            send: 2 * 212_992,
            forced: false,
        };
        let defaults = Limits {
            rmem_max: 212_992,
            wmem_max: 212_992,
        };
        let w = buffer_advice(asked, Some(defaults), &capped).unwrap();
        assert!(
            w.contains(
                "sysctl -w net.core.rmem_max=16777216 && sysctl -w net.core.wmem_max=16777216"
            ),
            "{w}"
        );
        assert!(
            w.contains("receive: asked 16777216 bytes, net.core.rmem_max allows 212992"),
            "{w}"
        );
        assert!(w.contains("twice") && w.contains("425984"), "{w}");
        // Only the short side is named.
        let w = buffer_advice(
            asked,
            Some(Limits {
                rmem_max: MB16,
                wmem_max: 212_992,
            }),
            &capped,
        )
        .unwrap();
        assert!(
            !w.contains("rmem_max=") && w.contains("sysctl -w net.core.wmem_max=16777216"),
            "{w}"
        );
        // Enough, exactly enough, or forced: nothing to say.
        let big = Limits {
            rmem_max: MB16,
            wmem_max: 1 << 30,
        };
        assert_eq!(buffer_advice(asked, Some(big), &capped), None);
        let forced = Granted {
            forced: true,
            ..capped
        };
        assert_eq!(buffer_advice(asked, Some(defaults), &forced), None);
        // Limits unknown: the sockets' reports decide.
        assert!(buffer_advice(asked, None, &capped).is_some());
        let full = Granted {
            recv: 2 * MB16,
            send: 2 * MB16,
            forced: false,
        };
        assert_eq!(buffer_advice(asked, None, &full), None);
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
