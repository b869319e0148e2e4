//! Control messages (`cmsg`) as plain bytes.
//!
//! The kernel's control buffer is a run of `cmsghdr` headers, each followed
//! by its data and padded to the next `size_t` boundary. Decoding and
//! encoding it here, in safe code over byte slices, keeps the pointer work
//! of `recvmsg`/`sendmsg` down to handing the kernel one buffer, and lets
//! the parsers be tested on hand-built buffers.
//!
//! Layout (Linux, glibc and musl on little-endian targets alike): the
//! length as a native-endian `size_t` (musl's 32-bit length plus its zero
//! padding reads the same), then level and type as `int`, then the data.

/// Size of `struct cmsghdr`.
pub(crate) const CMSG_HDR: usize = std::mem::size_of::<libc::cmsghdr>();
const CMSG_ALIGN: usize = std::mem::size_of::<usize>();

/// `CMSG_ALIGN`: rounds up to the header alignment.
pub(crate) const fn align(n: usize) -> usize {
    (n + CMSG_ALIGN - 1) & !(CMSG_ALIGN - 1)
}

/// `CMSG_SPACE`: bytes one control message with `data_len` bytes of data
/// takes in a buffer.
pub(crate) const fn space(data_len: usize) -> usize {
    CMSG_HDR + align(data_len)
}

/// Iterates over the control messages in `buf` as (level, type, data).
/// Stops at the first header that is cut short or states an impossible
/// length.
pub(crate) fn iter(mut buf: &[u8]) -> impl Iterator<Item = (i32, i32, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < CMSG_HDR {
            return None;
        }
        let len = usize::from_ne_bytes(buf[..8].try_into().expect("8 bytes"));
        if len < CMSG_HDR || len > buf.len() {
            return None;
        }
        let level = i32::from_ne_bytes(buf[8..12].try_into().expect("4 bytes"));
        let ty = i32::from_ne_bytes(buf[12..16].try_into().expect("4 bytes"));
        let data = &buf[CMSG_HDR..len];
        buf = &buf[align(len).min(buf.len())..];
        Some((level, ty, data))
    })
}

/// Writes one control message at the start of `buf` and returns the bytes
/// used ([`space`] of the data length). Panics if `buf` is smaller.
pub(crate) fn encode(buf: &mut [u8], level: i32, ty: i32, data: &[u8]) -> usize {
    let len = CMSG_HDR + data.len();
    let used = space(data.len());
    buf[..used].fill(0);
    buf[..8].copy_from_slice(&len.to_ne_bytes());
    buf[8..12].copy_from_slice(&level.to_ne_bytes());
    buf[12..16].copy_from_slice(&ty.to_ne_bytes());
    buf[CMSG_HDR..len].copy_from_slice(data);
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_matches_libc() {
        assert_eq!(CMSG_HDR, 16);
        // SAFETY: CMSG_SPACE and CMSG_LEN only compute sizes.
        let (space1, len1) = unsafe { (libc::CMSG_SPACE(1), libc::CMSG_LEN(1)) };
        assert_eq!(space(1), space1 as usize);
        assert_eq!(CMSG_HDR + 1, len1 as usize);
    }

    #[test]
    fn encode_then_iterate() {
        let mut buf = [0xffu8; 64];
        let a = encode(&mut buf, 1, 2, &[9]);
        let b = encode(&mut buf[a..], 3, 4, &7u32.to_ne_bytes());
        let got: Vec<_> = iter(&buf[..a + b]).collect();
        assert_eq!(
            got,
            vec![(1, 2, &[9u8][..]), (3, 4, &7u32.to_ne_bytes()[..])]
        );
    }

    #[test]
    fn truncated_and_bogus_headers_end_iteration() {
        let mut buf = [0u8; 32];
        let n = encode(&mut buf, 1, 2, &[1, 2, 3]);
        assert_eq!(iter(&buf[..CMSG_HDR - 1]).count(), 0);
        // Length beyond the buffer.
        assert_eq!(iter(&buf[..n - 6]).count(), 0);
        // Length smaller than a header.
        buf[..8].copy_from_slice(&3usize.to_ne_bytes());
        assert_eq!(iter(&buf[..n]).count(), 0);
    }
}
