//! UDP segmentation offloads: GRO on receive, GSO on send.
//!
//! With `UDP_GRO` on, the kernel may hand one `recvmsg` several datagrams
//! of the same flow and size glued together, with their size in a control
//! message ([`crate::mmsg::RecvMeta::segment`]). With a `UDP_SEGMENT`
//! control message on send, one `sendmsg` carries up to
//! [`MAX_SEGMENTS`] datagrams of equal size (the last may be shorter) to one
//! destination and the kernel (or the NIC) cuts them apart. Both appeared in
//! Linux 4.18 (GSO) and 5.0 (GRO); [`probe`] asks the kernel rather than
//! trusting a version number.

use std::io;
use std::os::fd::BorrowedFd;

use crate::sockopt::{get_int, set_int};

/// Most segments one GSO send may carry (the kernel's `UDP_MAX_SEGMENTS`
/// on the oldest kernels that have GSO).
pub const MAX_SEGMENTS: usize = 64;

/// Largest payload one GSO send may carry: the IP length field's limit less
/// the IPv6 and UDP headers.
pub const MAX_GSO_BYTES: usize = 65535 - 40 - 8;

/// What the kernel supports, as seen on one socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offloads {
    /// `UDP_GRO` can be turned on.
    pub gro: bool,
    /// `UDP_SEGMENT` is understood.
    pub gso: bool,
}

/// Asks the kernel, on a UDP socket, which offloads it understands. Leaves
/// GRO as it found it where the kernel can say (getting `UDP_GRO` needs
/// Linux 5.12; before that it leaves GRO off), and the socket's default
/// segment size at zero. Turning GRO off behind a caller's back would make
/// the kernel cut every train arriving at the socket into datagrams again.
pub fn probe(fd: BorrowedFd<'_>) -> Offloads {
    let was = gro(fd).unwrap_or(false);
    let gro = set_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok()
        && set_int(fd, libc::SOL_UDP, libc::UDP_GRO, i32::from(was)).is_ok();
    let gso = set_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 1200).is_ok()
        && get_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT).is_ok_and(|v| v == 1200)
        && set_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok();
    Offloads { gro, gso }
}

/// Whether GRO is on for a UDP socket (Linux 5.12 and later can say).
pub fn gro(fd: BorrowedFd<'_>) -> io::Result<bool> {
    get_int(fd, libc::SOL_UDP, libc::UDP_GRO).map(|v| v != 0)
}

/// Turns GRO on or off for a UDP socket.
pub fn set_gro(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_int(fd, libc::SOL_UDP, libc::UDP_GRO, i32::from(on))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmsg::{OutMsg, RecvBatch, RecvMeta, SendBatch, Span};
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    /// Probing a socket whose GRO is on leaves it on (and one whose GRO is
    /// off, off): callers probe sockets they have already set up.
    #[test]
    fn probing_leaves_gro_as_it_was() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        if !probe(sock.as_fd()).gro {
            return ferry_testkit::skip!("no UDP GRO on this kernel");
        }
        let on = || gro(sock.as_fd());
        if on().is_err() {
            return ferry_testkit::skip!("this kernel cannot say whether GRO is on (before 5.12)");
        }
        assert!(!on().unwrap(), "off after probing a fresh socket");
        set_gro(sock.as_fd(), true).unwrap();
        assert!(probe(sock.as_fd()).gro);
        assert!(on().unwrap(), "GRO turned on before probing stays on");
    }

    /// On a kernel with both offloads, ten datagrams sent as one GSO
    /// message arrive intact, either one by one or coalesced by GRO.
    #[test]
    fn gso_send_arrives_as_datagrams() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let off = probe(tx.as_fd());
        if !off.gso {
            return ferry_testkit::skip!("no UDP GSO on this kernel");
        }
        if off.gro {
            set_gro(rx.as_fd(), true).unwrap();
        }
        let payload: Vec<u8> = (0..10 * 100 + 40).map(|i| (i % 251) as u8).collect();
        let spans = [Span {
            start: 0,
            len: payload.len(),
        }];
        let msgs = [OutMsg {
            dst: Some(rx.local_addr().unwrap()),
            first: 0,
            count: 1,
            segment: 100,
        }];
        assert_eq!(
            SendBatch::new()
                .send(tx.as_fd(), &payload, &spans, &msgs)
                .unwrap(),
            1
        );

        let mut rb = RecvBatch::new();
        let mut buf = vec![0u8; 16 * 65536];
        let mut meta = [RecvMeta::default(); 16];
        let mut seen = Vec::new();
        for _ in 0..200 {
            match rb.recv(rx.as_fd(), &mut buf, 65536, &mut meta) {
                Ok(n) => {
                    for (i, m) in meta[..n].iter().enumerate() {
                        let slot = &buf[i * 65536..i * 65536 + m.len];
                        seen.extend(slot.chunks(m.segment).map(|c| c.to_vec()));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if seen.len() == 11 {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(seen.len(), 11);
        assert_eq!(seen.concat(), payload);
        assert_eq!(seen[10].len(), 40);
    }
}
