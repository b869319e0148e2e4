//! One datagram at a time with the local address it was sent to
//! (`IP_PKTINFO`, `IPV6_PKTINFO`).
//!
//! A socket bound to a wildcard address answers, by default, from whichever
//! local address the route to the asker prefers. On a host with several
//! addresses that is not always the address the asker sent to, and a NAT
//! or firewall in between then drops the answer as unrelated. Receiving
//! with [`recv`] and answering with [`send`] keeps the answer on the
//! address the request came in on.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::mmsg::{decode_addr, encode_addr, NAME_LEN};
use crate::{cmsg, msghdr, sockopt};

/// Bytes of `struct in_pktinfo`: interface index, local address, header
/// destination address.
const IN_PKTINFO: usize = 12;
/// Bytes of `struct in6_pktinfo`: address, interface index.
const IN6_PKTINFO: usize = 20;
/// Room for one control message of either kind.
const CTRL: usize = cmsg::space(IN6_PKTINFO) + cmsg::space(IN_PKTINFO);

/// Where a datagram arrived: the address it was sent to and the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    /// The destination address of the datagram (one of this host's).
    pub addr: IpAddr,
    /// The interface it arrived on (needed to answer from a link-local
    /// IPv6 address).
    pub ifindex: u32,
}

/// A datagram received by [`recv`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Bytes written to the buffer.
    pub len: usize,
    /// The sender.
    pub from: SocketAddr,
    /// Where it arrived, when the kernel said (always, once [`enable`]d).
    pub local: Option<Local>,
}

/// Asks the kernel to report each datagram's local address. An IPv6 socket
/// asks for both families, so that IPv4 datagrams on a dual-stack socket
/// are reported too.
pub fn enable(fd: BorrowedFd<'_>, ipv6_socket: bool) -> io::Result<()> {
    if ipv6_socket {
        sockopt::set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
        // Refused only on IPv6-only sockets, which never see IPv4.
        let _ = sockopt::set_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1);
        Ok(())
    } else {
        sockopt::set_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)
    }
}

/// Receives one datagram into `buf` (blocking as the socket is set up to:
/// a read timeout gives `WouldBlock`/`TimedOut`).
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let mut name = [0u8; NAME_LEN + 4];
    let mut ctrl = [0u8; CTRL];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut h = msghdr::empty();
    h.msg_name = name.as_mut_ptr().cast();
    h.msg_namelen = NAME_LEN as libc::socklen_t;
    msghdr::set_iov(&mut h, &mut iov, 1);
    msghdr::set_control(&mut h, ctrl.as_mut_ptr().cast(), CTRL);
    // SAFETY: `h` points at `name`, `iov` (which covers exactly `buf`) and
    // `ctrl`, all alive and exclusively borrowed for this call, with the
    // lengths stated in the header; the kernel writes only within them.
    let rc = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut h, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let name_len = (h.msg_namelen as usize).min(NAME_LEN);
    let from = decode_addr(&name[..name_len])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "datagram without a sender"))?;
    let ctrl_len = msghdr::control_len(&h).min(CTRL);
    Ok(Received {
        len: rc as usize,
        from,
        local: parse_local(&ctrl[..ctrl_len]),
    })
}

/// Reads the local address out of a control buffer.
fn parse_local(ctrl: &[u8]) -> Option<Local> {
    for (level, ty, data) in cmsg::iter(ctrl) {
        match (level, ty) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) if data.len() >= IN_PKTINFO => {
                let ifindex = i32::from_ne_bytes(data[..4].try_into().expect("4 bytes"));
                let addr: [u8; 4] = data[8..12].try_into().expect("4 bytes");
                return Some(Local {
                    addr: IpAddr::V4(Ipv4Addr::from(addr)),
                    ifindex: ifindex.max(0) as u32,
                });
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if data.len() >= IN6_PKTINFO => {
                let addr: [u8; 16] = data[..16].try_into().expect("16 bytes");
                let ifindex = u32::from_ne_bytes(data[16..20].try_into().expect("4 bytes"));
                return Some(Local {
                    addr: IpAddr::V6(Ipv6Addr::from(addr)),
                    ifindex,
                });
            }
            _ => {}
        }
    }
    None
}

/// Writes the control message that makes a datagram leave from `local`;
/// returns the bytes used. An IPv4 address (or an IPv4-mapped one, on a
/// dual-stack socket) goes out as `IP_PKTINFO`, with the interface left to
/// the route; an IPv6 address as `IPV6_PKTINFO` with its interface.
fn encode_local(local: Local, out: &mut [u8]) -> usize {
    let v4 = match local.addr {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(a) => a.to_ipv4_mapped(),
    };
    match (v4, local.addr) {
        (Some(a), _) => {
            let mut data = [0u8; IN_PKTINFO];
            data[4..8].copy_from_slice(&a.octets());
            cmsg::encode(out, libc::IPPROTO_IP, libc::IP_PKTINFO, &data)
        }
        (None, IpAddr::V6(a)) => {
            let mut data = [0u8; IN6_PKTINFO];
            data[..16].copy_from_slice(&a.octets());
            data[16..20].copy_from_slice(&local.ifindex.to_ne_bytes());
            cmsg::encode(out, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &data)
        }
        (None, IpAddr::V4(_)) => unreachable!("an IPv4 address maps to itself"),
    }
}

/// Sends `data` to `to`, from `local` when given (else as the kernel
/// chooses).
pub fn send(
    fd: BorrowedFd<'_>,
    data: &[u8],
    to: SocketAddr,
    local: Option<Local>,
) -> io::Result<usize> {
    let mut name = [0u8; NAME_LEN + 4];
    let name_len = encode_addr(to, &mut name);
    let mut ctrl = [0u8; CTRL];
    let ctrl_len = local.map_or(0, |l| encode_local(l, &mut ctrl));
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut h = msghdr::empty();
    h.msg_name = name.as_mut_ptr().cast();
    h.msg_namelen = name_len as libc::socklen_t;
    msghdr::set_iov(&mut h, &mut iov, 1);
    if ctrl_len > 0 {
        msghdr::set_control(&mut h, ctrl.as_mut_ptr().cast(), ctrl_len);
    }
    // SAFETY: `h` points at `name`, `iov` (covering exactly `data`, which
    // the kernel only reads) and `ctrl`, all alive for this call, with the
    // lengths stated in the header.
    let rc = unsafe { libc::sendmsg(fd.as_raw_fd(), &h, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;
    use std::time::Duration;

    #[test]
    fn control_messages_round_trip() {
        for local in [
            Local {
                addr: "192.0.2.7".parse().unwrap(),
                ifindex: 0,
            },
            Local {
                addr: "2001:db8::7".parse().unwrap(),
                ifindex: 3,
            },
        ] {
            let mut buf = [0u8; CTRL];
            let n = encode_local(local, &mut buf);
            // An outgoing IP_PKTINFO carries the address as the local one
            // (spec_dst); the kernel reports the destination in the last
            // field. Mirror it there to read it back.
            if local.addr.is_ipv4() {
                let a: [u8; 4] = buf[cmsg::CMSG_HDR + 4..cmsg::CMSG_HDR + 8]
                    .try_into()
                    .unwrap();
                buf[cmsg::CMSG_HDR + 8..cmsg::CMSG_HDR + 12].copy_from_slice(&a);
            }
            assert_eq!(parse_local(&buf[..n]), Some(local));
        }
        assert_eq!(parse_local(&[0u8; 8]), None);
    }

    #[test]
    fn answers_leave_from_the_address_asked() {
        // 127.0.0.2 is as local as 127.0.0.1, but a wildcard socket's
        // answer to a 127.0.0.1 sender would leave from 127.0.0.1.
        let server = UdpSocket::bind("0.0.0.0:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        enable(server.as_fd(), false).unwrap();
        let port = server.local_addr().unwrap().port();
        let asked: SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        client.send_to(b"ping", asked).unwrap();
        let mut buf = [0u8; 16];
        let got = recv(server.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..got.len], b"ping");
        assert_eq!(got.from, client.local_addr().unwrap());
        assert_eq!(got.local.map(|l| l.addr), Some(asked.ip()));
        send(server.as_fd(), b"pong", got.from, got.local).unwrap();
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"pong"[..], asked));
    }
}
