//! Socket options that `std` and `socket2` do not cover: forced buffer
//! sizes and the receive-queue overflow counter.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Sets an `int` socket option.
pub fn set_int(fd: BorrowedFd<'_>, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: we pass a pointer to a live `c_int` and its exact size; the
    // kernel only reads that many bytes.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads an `int` socket option.
pub fn get_int(fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
    let mut value: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live, writable and correctly sized; the
    // kernel writes at most `len` bytes into `value` and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut i32).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The kernel's `TCP_INFO` of a TCP socket and how many of its bytes the
/// kernel filled.
fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<(libc::tcp_info, usize)> {
    // SAFETY: `tcp_info` is a plain C struct of integers, for which all
    // zero bytes are a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are live, writable and correctly sized; the
    // kernel writes at most `len` bytes into `info` and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((info, len as usize))
}

/// The kernel's smoothed round-trip time of a TCP connection (`tcpi_rtt`).
pub fn tcp_rtt(fd: BorrowedFd<'_>) -> io::Result<std::time::Duration> {
    let (info, _) = tcp_info(fd)?;
    Ok(std::time::Duration::from_micros(u64::from(info.tcpi_rtt)))
}

/// Bytes of a TCP connection's outgoing stream that the peer has
/// acknowledged (`tcpi_bytes_acked` from `TCP_INFO`, Linux 4.1 and later).
///
/// A receiver that stops reading fills its window, and the count stands
/// still; one that reads slowly keeps moving it. That is what tells the two
/// apart while a large send is in flight for a long time either way.
pub fn tcp_bytes_acked(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let (info, len) = tcp_info(fd)?;
    let end = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + std::mem::size_of::<u64>();
    if len < end {
        // A kernel older than the field.
        return Err(io::ErrorKind::Unsupported.into());
    }
    Ok(info.tcpi_bytes_acked)
}

/// The largest receive buffer the kernel grows a TCP socket to (the third
/// field of `net.ipv4.tcp_rmem`), or `None` where it cannot be read.
pub fn tcp_rmem_max() -> Option<usize> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
        .ok()?
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// Which buffer [`set_buffer`] sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    /// The receive buffer (`SO_RCVBUF`).
    Receive,
    /// The send buffer (`SO_SNDBUF`).
    Send,
}

/// The outcome of [`set_buffer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSize {
    /// What the kernel reports now (it doubles the request for its own
    /// bookkeeping, and caps it at `net.core.[rw]mem_max` unless forced).
    pub effective: usize,
    /// Whether the `*BUFFORCE` option (CAP_NET_ADMIN) was accepted, so the
    /// system-wide maximum did not apply.
    pub forced: bool,
}

/// Asks for `bytes` of buffer: first with `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE`
/// (which ignores `net.core.rmem_max`/`wmem_max` but needs CAP_NET_ADMIN),
/// then, if that is refused, with the ordinary option, which the kernel
/// caps silently. Reports what the socket ended up with.
pub fn set_buffer(fd: BorrowedFd<'_>, which: Buffer, bytes: usize) -> io::Result<BufferSize> {
    let (force, plain) = match which {
        Buffer::Receive => (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        Buffer::Send => (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    };
    let want = i32::try_from(bytes).unwrap_or(i32::MAX);
    let forced = set_int(fd, libc::SOL_SOCKET, force, want).is_ok();
    if !forced {
        set_int(fd, libc::SOL_SOCKET, plain, want)?;
    }
    let effective = get_int(fd, libc::SOL_SOCKET, plain)?;
    Ok(BufferSize {
        effective: usize::try_from(effective).unwrap_or(0),
        forced,
    })
}

/// Caps a TCP socket's receive buffer at about `bytes` as the kernel
/// counts it (data and the kernel's bookkeeping for it), which also stops
/// the kernel from growing it: asks `SO_RCVBUF` for half, which the kernel
/// doubles. Data in large segments fills up to about `bytes`, in small
/// ones about half of it. Returns the buffer the socket reports afterwards.
pub fn cap_recv_buffer(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let ask = i32::try_from(bytes / 2).unwrap_or(i32::MAX);
    set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, ask)?;
    let now = get_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?;
    Ok(usize::try_from(now).unwrap_or(0))
}

/// Turns on `SO_RXQ_OVFL`: every received datagram then carries the
/// socket's cumulative count of datagrams dropped for lack of buffer
/// (see [`crate::mmsg::RecvMeta::drops`]).
pub fn enable_drop_counter(fd: BorrowedFd<'_>) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    #[test]
    fn buffers_grow() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = get_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF).unwrap();
        let got = set_buffer(s.as_fd(), Buffer::Receive, 1 << 20).unwrap();
        assert!(got.effective >= usize::try_from(before).unwrap().min(1 << 20));
        if got.forced {
            assert!(got.effective >= 1 << 20, "{got:?}");
        }
        set_buffer(s.as_fd(), Buffer::Send, 1 << 20).unwrap();
        enable_drop_counter(s.as_fd()).unwrap();
        assert_eq!(
            get_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_RXQ_OVFL).unwrap(),
            1
        );
    }
}
