//! Batched UDP: `recvmmsg` and `sendmmsg` with the control messages the
//! UDP relay uses.
//!
//! One `recvmmsg` fills up to [`MAX_BATCH`] equal slots of a caller-owned
//! buffer; for each datagram it reports the source address, the length,
//! the GRO segment size (when the kernel coalesced several datagrams of one
//! flow into the slot, see [`crate::gso`]) and the socket's cumulative drop
//! counter (`SO_RXQ_OVFL`). One `sendmmsg` sends messages whose bytes are
//! spans of a caller-owned buffer — typically the very buffer `recvmmsg`
//! filled, so forwarding copies nothing in user space — each optionally
//! with a GSO segment size, so a run of equal datagrams to one destination
//! leaves in a single message.
//!
//! Safety layout: the structures the kernel reads pointers from (`mmsghdr`,
//! `iovec`) are built on the stack for the duration of one call and point
//! only into buffers borrowed by that call. Socket addresses and control
//! messages are kept as plain byte arrays and encoded or decoded in safe
//! code (the `cmsg` module), so the only `unsafe` is the two system calls.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;

use crate::{cmsg, msghdr};

/// Most datagrams one call receives or sends.
pub const MAX_BATCH: usize = 64;

/// Room for a `sockaddr_in6`, the largest address we use.
pub(crate) const NAME_LEN: usize = 28;
/// Room for the control messages we ask for: UDP_GRO (int) and SO_RXQ_OVFL
/// (u32), each a 16-byte header plus data padded to 8.
const CTRL_LEN: usize = 2 * cmsg::space(4) + 16;

#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct NameBuf([u8; NAME_LEN + 4]);

#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CtrlBuf([u8; CTRL_LEN]);

/// What one received datagram (or GRO-coalesced run of datagrams) was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvMeta {
    /// Bytes written into the slot.
    pub len: usize,
    /// The sender, if the kernel reported an IPv4 or IPv6 address.
    pub src: Option<SocketAddr>,
    /// Size of each datagram in the slot: equal to `len` for a single
    /// datagram; with GRO, every datagram but the last has this size.
    pub segment: usize,
    /// The datagram did not fit the slot and was cut (`MSG_TRUNC`).
    pub truncated: bool,
    /// The socket's cumulative count of datagrams the kernel dropped for
    /// lack of receive buffer, when `SO_RXQ_OVFL` is on and it is non-zero.
    pub drops: Option<u32>,
}

/// Reusable address and control-message space for [`RecvBatch::recv`].
pub struct RecvBatch {
    names: Vec<NameBuf>,
    ctrls: Vec<CtrlBuf>,
}

impl Default for RecvBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl RecvBatch {
    /// Space for [`MAX_BATCH`] datagrams.
    pub fn new() -> Self {
        RecvBatch {
            names: vec![NameBuf([0; NAME_LEN + 4]); MAX_BATCH],
            ctrls: vec![CtrlBuf([0; CTRL_LEN]); MAX_BATCH],
        }
    }

    /// Receives up to `meta.len()` (at most [`MAX_BATCH`]) datagrams without
    /// blocking: datagram `i` lands in `buf[i * slot .. (i + 1) * slot]` and
    /// is described by `meta[i]`. Returns how many arrived; `WouldBlock`
    /// when none were waiting.
    pub fn recv(
        &mut self,
        fd: BorrowedFd<'_>,
        buf: &mut [u8],
        slot: usize,
        meta: &mut [RecvMeta],
    ) -> io::Result<usize> {
        if slot == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "slot size is zero",
            ));
        }
        let n = meta.len().min(MAX_BATCH).min(buf.len() / slot);
        if n == 0 {
            return Ok(0);
        }
        let mut iovs: [libc::iovec; MAX_BATCH] = [libc::iovec {
            iov_base: ptr::null_mut(),
            iov_len: 0,
        }; MAX_BATCH];
        let mut hdrs: [libc::mmsghdr; MAX_BATCH] = std::array::from_fn(|_| msghdr::empty_mmsg());
        for (iov, chunk) in iovs.iter_mut().zip(buf.chunks_exact_mut(slot).take(n)) {
            *iov = libc::iovec {
                iov_base: chunk.as_mut_ptr().cast(),
                iov_len: slot,
            };
        }
        // Pointers into `iovs` are taken only after its last write.
        let iov_base = iovs.as_mut_ptr();
        for (i, (name, ctrl)) in self
            .names
            .iter_mut()
            .zip(&mut self.ctrls)
            .take(n)
            .enumerate()
        {
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = name.0.as_mut_ptr().cast();
            h.msg_namelen = NAME_LEN as libc::socklen_t;
            msghdr::set_iov(h, iov_base.wrapping_add(i), 1);
            msghdr::set_control(h, ctrl.0.as_mut_ptr().cast(), CTRL_LEN);
        }
        // SAFETY: `hdrs[..n]` are initialised headers whose name, iovec and
        // control pointers point into `self.names`, `iovs`, `self.ctrls` and
        // `buf`, all alive and exclusively borrowed for this call, with the
        // lengths stated in each header (every iovec covers exactly one
        // `slot`-sized chunk inside `buf`). The kernel writes only within
        // those lengths. A null timeout is allowed.
        let rc = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT as _, // `int` on glibc, `unsigned` on musl
                ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = rc as usize;
        for i in 0..got {
            let h = &hdrs[i];
            let len = h.msg_len as usize;
            let name_len = (h.msg_hdr.msg_namelen as usize).min(NAME_LEN);
            let ctrl_len = msghdr::control_len(&h.msg_hdr).min(CTRL_LEN);
            let mut m = RecvMeta {
                len,
                src: decode_addr(&self.names[i].0[..name_len]),
                segment: len,
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                drops: None,
            };
            for (level, ty, data) in cmsg::iter(&self.ctrls[i].0[..ctrl_len]) {
                match (level, ty) {
                    (libc::SOL_UDP, libc::UDP_GRO) if data.len() >= 4 => {
                        let seg = i32::from_ne_bytes(data[..4].try_into().expect("4 bytes"));
                        if seg > 0 {
                            m.segment = (seg as usize).min(len.max(1));
                        }
                    }
                    (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) if data.len() >= 4 => {
                        m.drops = Some(u32::from_ne_bytes(data[..4].try_into().expect("4 bytes")));
                    }
                    _ => {}
                }
            }
            meta[i] = m;
        }
        Ok(got)
    }
}

/// A run of bytes inside the buffer given to [`SendBatch::send`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Offset of the first byte.
    pub start: usize,
    /// Number of bytes.
    pub len: usize,
}

/// One message for [`SendBatch::send`]: the concatenation of
/// `spans[first .. first + count]`, to `dst` (or the connected peer when
/// `None`), cut by the kernel into `segment`-byte datagrams when `segment`
/// is non-zero and smaller than the total (UDP GSO).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutMsg {
    /// Destination; `None` on a connected socket.
    pub dst: Option<SocketAddr>,
    /// Index of the message's first span.
    pub first: usize,
    /// Number of spans (at least one).
    pub count: usize,
    /// GSO segment size, or 0 for a single datagram.
    pub segment: u16,
}

/// Reusable address and control-message space for [`SendBatch::send`].
pub struct SendBatch {
    names: Vec<NameBuf>,
    ctrls: Vec<CtrlBuf>,
}

impl Default for SendBatch {
    fn default() -> Self {
        Self::new()
    }
}

/// Most spans one [`SendBatch::send`] call may reference in total.
pub const MAX_SPANS: usize = 256;

impl SendBatch {
    /// Space for [`MAX_BATCH`] messages.
    pub fn new() -> Self {
        SendBatch {
            names: vec![NameBuf([0; NAME_LEN + 4]); MAX_BATCH],
            ctrls: vec![CtrlBuf([0; CTRL_LEN]); MAX_BATCH],
        }
    }

    /// Sends `msgs` (at most [`MAX_BATCH`], referencing at most
    /// [`MAX_SPANS`] spans) without blocking. Returns how many messages the
    /// kernel took, which may be fewer than given; the error is that of the
    /// first message not sent when none was. Spans outside `buf` are an
    /// `InvalidInput` error before anything is sent.
    pub fn send(
        &mut self,
        fd: BorrowedFd<'_>,
        buf: &[u8],
        spans: &[Span],
        msgs: &[OutMsg],
    ) -> io::Result<usize> {
        let n = msgs.len().min(MAX_BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut iovs: [libc::iovec; MAX_SPANS] = [libc::iovec {
            iov_base: ptr::null_mut(),
            iov_len: 0,
        }; MAX_SPANS];
        let mut next_iov = 0;
        let mut iov_starts = [0usize; MAX_BATCH];
        let mut hdrs: [libc::mmsghdr; MAX_BATCH] = std::array::from_fn(|_| msghdr::empty_mmsg());
        for (i, m) in msgs[..n].iter().enumerate() {
            let chosen = m
                .first
                .checked_add(m.count)
                .and_then(|end| spans.get(m.first..end))
                .filter(|s| !s.is_empty())
                .ok_or_else(|| invalid("message references spans that do not exist"))?;
            if next_iov + chosen.len() > MAX_SPANS {
                return Err(invalid("too many spans in one batch"));
            }
            let iov_start = next_iov;
            let mut total = 0usize;
            for s in chosen {
                let end = s
                    .start
                    .checked_add(s.len)
                    .filter(|&e| e <= buf.len())
                    .ok_or_else(|| invalid("span outside the buffer"))?;
                let bytes = &buf[s.start..end];
                // The kernel only reads through this pointer (sendmmsg).
                iovs[next_iov] = libc::iovec {
                    iov_base: bytes.as_ptr().cast_mut().cast(),
                    iov_len: bytes.len(),
                };
                next_iov += 1;
                total += s.len;
            }
            iov_starts[i] = iov_start;
            let h = &mut hdrs[i].msg_hdr;
            // The pointer is set below, once `iovs` is complete.
            msghdr::set_iov(h, ptr::null_mut(), chosen.len());
            if let Some(dst) = m.dst {
                let len = encode_addr(dst, &mut self.names[i].0);
                h.msg_name = self.names[i].0.as_mut_ptr().cast();
                h.msg_namelen = len as libc::socklen_t;
            }
            if m.segment != 0 && usize::from(m.segment) < total {
                let len = cmsg::encode(
                    &mut self.ctrls[i].0,
                    libc::SOL_UDP,
                    libc::UDP_SEGMENT,
                    &m.segment.to_ne_bytes(),
                );
                msghdr::set_control(h, self.ctrls[i].0.as_mut_ptr().cast(), len);
            }
        }
        // Pointers into `iovs` are taken only after its last write.
        let iov_base = iovs.as_mut_ptr();
        for (h, &start) in hdrs.iter_mut().zip(&iov_starts).take(n) {
            h.msg_hdr.msg_iov = iov_base.wrapping_add(start);
        }
        // SAFETY: `hdrs[..n]` are initialised headers; their name, control
        // and iovec pointers point into `self.names`, `self.ctrls` and
        // `iovs` (alive for this call) with the lengths stated, and every
        // iovec was bounds-checked to lie inside `buf`, which is borrowed
        // for the call. sendmmsg only reads through them.
        let rc = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT as _, // `int` on glibc, `unsigned` on musl
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc as usize)
        }
    }
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// Encodes `addr` as a `sockaddr_in` or `sockaddr_in6` into `out`; returns
/// its length.
pub(crate) fn encode_addr(addr: SocketAddr, out: &mut [u8]) -> usize {
    out.fill(0);
    match addr {
        SocketAddr::V4(a) => {
            out[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..8].copy_from_slice(&a.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            out[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            out[8..24].copy_from_slice(&a.ip().octets());
            out[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    }
}

/// Decodes a `sockaddr_in` or `sockaddr_in6`; IPv4-mapped IPv6 addresses
/// stay IPv6 (the socket's own family).
pub(crate) fn decode_addr(b: &[u8]) -> Option<SocketAddr> {
    if b.len() < 2 {
        return None;
    }
    let family = i32::from(u16::from_ne_bytes([b[0], b[1]]));
    match family {
        libc::AF_INET if b.len() >= 8 => Some(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::new(b[4], b[5], b[6], b[7]),
            u16::from_be_bytes([b[2], b[3]]),
        ))),
        libc::AF_INET6 if b.len() >= 28 => {
            let ip: [u8; 16] = b[8..24].try_into().expect("16 bytes");
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                u16::from_be_bytes([b[2], b[3]]),
                u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
                u32::from_ne_bytes(b[24..28].try_into().expect("4 bytes")),
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    #[test]
    fn addresses_round_trip() {
        let mut buf = [0u8; NAME_LEN + 4];
        for a in [
            "192.0.2.7:51820",
            "[2001:db8::1]:443",
            "[fe80::1%3]:9",
            "[::ffff:10.0.0.1]:1",
        ] {
            let addr: SocketAddr = a.parse().unwrap();
            let n = encode_addr(addr, &mut buf);
            assert_eq!(decode_addr(&buf[..n]), Some(addr), "{a}");
        }
        assert_eq!(decode_addr(&[0; 4]), None);
    }

    #[test]
    fn batches_cross_loopback() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let payload: Vec<u8> = (0..200u8).collect();
        let spans = [
            Span { start: 0, len: 10 },
            Span { start: 10, len: 90 },
            Span {
                start: 100,
                len: 100,
            },
        ];
        let msgs = [
            OutMsg {
                dst: Some(to),
                first: 0,
                count: 1,
                segment: 0,
            },
            OutMsg {
                dst: Some(to),
                first: 1,
                count: 2,
                segment: 0,
            },
        ];
        let mut sb = SendBatch::new();
        assert_eq!(sb.send(tx.as_fd(), &payload, &spans, &msgs).unwrap(), 2);

        let mut rb = RecvBatch::new();
        let mut buf = vec![0u8; 4 * 256];
        let mut meta = [RecvMeta::default(); 4];
        let mut got = 0;
        for _ in 0..100 {
            match rb.recv(rx.as_fd(), &mut buf[got * 256..], 256, &mut meta[got..]) {
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            if got == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(got, 2);
        assert_eq!(meta[0].len, 10);
        assert_eq!(meta[0].src, Some(tx.local_addr().unwrap()));
        assert_eq!(&buf[..10], &payload[..10]);
        assert_eq!(meta[1].len, 190);
        assert_eq!(meta[1].segment, 190);
        assert_eq!(&buf[256..256 + 190], &payload[10..]);
        assert!(matches!(
            rb.recv(rx.as_fd(), &mut buf, 256, &mut meta),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        ));

        let bad = [OutMsg {
            dst: Some(to),
            first: 0,
            count: 1,
            segment: 0,
        }];
        let outside = [Span {
            start: 150,
            len: 100,
        }];
        assert!(sb.send(tx.as_fd(), &payload, &outside, &bad).is_err());
        let missing = [OutMsg {
            dst: Some(to),
            first: 5,
            count: 1,
            segment: 0,
        }];
        assert!(sb.send(tx.as_fd(), &payload, &spans, &missing).is_err());
    }
}
