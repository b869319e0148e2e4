//! `struct msghdr` built and read the same way under glibc and musl.
//!
//! The C libraries lay it out differently: glibc's `msg_iovlen` and
//! `msg_controllen` are `size_t`; musl's are `int` and `socklen_t`, each
//! followed by private padding (`__pad1`, `__pad2`) that a struct literal
//! cannot name. Headers therefore start zeroed ([`empty`]) and their
//! lengths go through [`set_iov`], [`set_control`] and [`control_len`],
//! which convert between `usize` and whichever type the field has.

/// A header with no name, no iovecs, no control buffer and no flags.
pub(crate) fn empty() -> libc::msghdr {
    // SAFETY: `msghdr` holds only raw pointers and integers (plus, on
    // musl, integer padding), for which all-zero bytes are valid values:
    // null pointers, zero lengths and flags.
    unsafe { std::mem::zeroed() }
}

/// A `mmsghdr` whose header is [`empty`] and whose length is zero.
pub(crate) fn empty_mmsg() -> libc::mmsghdr {
    libc::mmsghdr {
        msg_hdr: empty(),
        msg_len: 0,
    }
}

/// Points `h` at `len` iovecs starting at `iov`. (The `as _` is a no-op on
/// glibc and narrows on musl; the callers' counts are a few dozen at most.)
pub(crate) fn set_iov(h: &mut libc::msghdr, iov: *mut libc::iovec, len: usize) {
    h.msg_iov = iov;
    h.msg_iovlen = len as _;
}

/// Points `h` at a control buffer of `len` bytes at `buf` (at most a few
/// hundred bytes).
pub(crate) fn set_control(h: &mut libc::msghdr, buf: *mut libc::c_void, len: usize) {
    h.msg_control = buf;
    h.msg_controllen = len as _;
}

/// The control bytes the kernel reported in `h`.
#[allow(clippy::unnecessary_cast)] // `size_t` on glibc already
pub(crate) fn control_len(h: &libc::msghdr) -> usize {
    h.msg_controllen as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_round_trip() {
        let mut h = empty();
        assert!(h.msg_name.is_null() && h.msg_iov.is_null() && h.msg_control.is_null());
        let mut iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut ctrl = [0u8; 64];
        set_iov(&mut h, &mut iov, 3);
        set_control(&mut h, ctrl.as_mut_ptr().cast(), ctrl.len());
        assert_eq!(h.msg_iovlen, 3);
        assert_eq!(control_len(&h), 64);
        assert_eq!(empty_mmsg().msg_len, 0);
    }
}
