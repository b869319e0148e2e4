//! The provided-buffer ring a multishot receive picks its buffers from.
//!
//! Two anonymous mappings: a ring of `io_uring_buf` descriptors shared with
//! the kernel (`IORING_REGISTER_PBUF_RING`), and the buffers themselves.
//! The descriptor ring has room for the most buffers the ring may ever hold
//! (`max`), so a buffer can always be handed back without checking for
//! space; only `published` of them exist at first, and [`BufRing::grow`]
//! publishes more when receives run dry. The buffer mapping is reserved for
//! `max` buffers up front with `MAP_NORESERVE`: pages are committed only
//! when a buffer is first written, so an unused reserve costs address space,
//! not memory.
//!
//! Ownership of a buffer alternates: while its descriptor sits between the
//! kernel's head and our tail the kernel may fill it at any time; once a
//! completion names it (`IORING_CQE_F_BUFFER`) it is ours until
//! [`BufRing::recycle`] writes its descriptor back and [`BufRing::publish`]
//! moves the tail past it. Data is only ever read from buffers in the second
//! state.

use std::io;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU16, Ordering};

/// `struct io_uring_buf` from the kernel ABI. The ring's tail shares the
/// memory of entry 0's `resv` field, so entries are written field by field
/// and `resv` is never touched.
#[repr(C)]
struct RawBuf {
    addr: u64,
    len: u32,
    bid: u16,
    resv: u16,
}

/// Offset of the tail within the descriptor ring (entry 0's `resv`).
const TAIL_OFFSET: usize = 14;

/// An anonymous private mapping, unmapped on drop unless leaked.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    leaked: bool,
}

impl Mapping {
    fn new(len: usize, noreserve: bool) -> io::Result<Mapping> {
        let flags = libc::MAP_PRIVATE
            | libc::MAP_ANONYMOUS
            | if noreserve { libc::MAP_NORESERVE } else { 0 };
        // SAFETY: an anonymous mapping at an address of the kernel's choosing
        // aliases no existing memory; the arguments are plain values.
        let ptr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping {
            ptr,
            len,
            leaked: false,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.leaked {
            return;
        }
        // SAFETY: `ptr`/`len` describe a mapping created in `Mapping::new`
        // and unmapped only here; the owner marks the mapping leaked
        // whenever the kernel might still use it.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Provided buffers for one buffer group.
pub(super) struct BufRing {
    ring: Mapping,
    data: Mapping,
    /// Descriptor slots in the ring (a power of two, at least `max`).
    entries: u16,
    buf_size: u32,
    /// Buffers that exist (ids `0..published`).
    published: u16,
    /// Most buffers the ring may hold.
    max: u16,
    /// Our tail, ahead of the shared one until [`BufRing::publish`].
    tail: u16,
    /// Whether `tail` moved since the last publish.
    dirty: bool,
}

impl BufRing {
    /// Maps room for `max` buffers of `buf_size` bytes and queues the first
    /// `initial` of them (not yet visible to the kernel: call
    /// [`BufRing::publish`] after registering).
    pub(super) fn new(buf_size: u32, initial: u16, max: u16) -> io::Result<BufRing> {
        if buf_size == 0 || initial == 0 || max < initial || max > 1 << 15 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "provided buffers: size {buf_size}, initial {initial}, max {max} (1..=32768)"
                ),
            ));
        }
        let entries = max.next_power_of_two();
        let page = page_size();
        let ring_len =
            (usize::from(entries) * std::mem::size_of::<RawBuf>()).next_multiple_of(page);
        let ring = Mapping::new(ring_len, false)?;
        let data = Mapping::new(usize::from(max) * buf_size as usize, true)?;
        let mut bufs = BufRing {
            ring,
            data,
            entries,
            buf_size,
            published: 0,
            max,
            tail: 0,
            dirty: false,
        };
        bufs.add(initial);
        Ok(bufs)
    }

    /// Address of the descriptor ring, for registration.
    pub(super) fn ring_addr(&self) -> u64 {
        self.ring.ptr.as_ptr() as u64
    }

    /// Descriptor slots, for registration.
    pub(super) fn entries(&self) -> u16 {
        self.entries
    }

    /// Buffers that exist now.
    pub(super) fn count(&self) -> u16 {
        self.published
    }

    /// Bytes per buffer.
    pub(super) fn buf_size(&self) -> u32 {
        self.buf_size
    }

    /// Creates `n` more buffers and queues them for the kernel.
    fn add(&mut self, n: u16) {
        let first = self.published;
        let last = first.saturating_add(n).min(self.max);
        for bid in first..last {
            self.published = bid + 1;
            self.recycle(bid);
        }
    }

    /// Doubles the number of buffers (up to the maximum); `false` when
    /// already at the maximum.
    pub(super) fn grow(&mut self) -> bool {
        if self.published >= self.max {
            return false;
        }
        self.add(self.published);
        true
    }

    /// The first `len` bytes of buffer `bid`, which a completion handed to
    /// us. `None` for an id we never published.
    pub(super) fn data(&self, bid: u16, len: usize) -> Option<&[u8]> {
        if bid >= self.published {
            return None;
        }
        let len = len.min(self.buf_size as usize);
        let off = usize::from(bid) * self.buf_size as usize;
        // SAFETY: `bid < published <= max`, so `off + len` lies inside the
        // data mapping (`max * buf_size` bytes). The kernel handed this
        // buffer back in a completion and does not write to it again until
        // `recycle` re-queues it, which needs `&mut self` and so cannot
        // happen while this borrow lives. The mapping was zero-filled, so
        // every byte is initialized.
        Some(unsafe { std::slice::from_raw_parts(self.data.ptr.as_ptr().add(off), len) })
    }

    /// Hands buffer `bid` back to the kernel (visible after `publish`).
    pub(super) fn recycle(&mut self, bid: u16) {
        if bid >= self.published {
            return;
        }
        let idx = usize::from(self.tail & (self.entries - 1));
        let addr = self.data.ptr.as_ptr() as u64 + u64::from(bid) * u64::from(self.buf_size);
        // SAFETY: `idx < entries`, so the descriptor lies inside the ring
        // mapping. The slot is beyond the tail the kernel has seen, so the
        // kernel does not read it until `publish`; at most `max <= entries`
        // buffers exist, so the slot is not one the kernel has yet to
        // consume. Fields are written through the raw pointer without
        // forming a reference, leaving `resv` (entry 0's is the shared
        // tail) untouched.
        unsafe {
            let e = self.ring.ptr.as_ptr().cast::<RawBuf>().add(idx);
            ptr::addr_of_mut!((*e).addr).write(addr);
            ptr::addr_of_mut!((*e).len).write(self.buf_size);
            ptr::addr_of_mut!((*e).bid).write(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        self.dirty = true;
    }

    /// Makes every recycled buffer visible to the kernel.
    pub(super) fn publish(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        // SAFETY: the tail is the u16 at byte 14 of the page-aligned ring
        // mapping, so the pointer is in bounds and 2-aligned. The kernel
        // only reads it; the release store orders the descriptor writes in
        // `recycle` before the kernel can observe the new tail.
        let tail =
            unsafe { AtomicU16::from_ptr(self.ring.ptr.as_ptr().add(TAIL_OFFSET).cast::<u16>()) };
        tail.store(self.tail, Ordering::Release);
    }

    /// Gives up the memory without unmapping it: the kernel might still
    /// write into it.
    pub(super) fn leak(&mut self) {
        self.ring.leaked = true;
        self.data.leaked = true;
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_max_and_no_further() {
        let mut b = BufRing::new(1024, 4, 12).unwrap();
        assert_eq!(b.entries(), 16);
        assert_eq!(b.count(), 4);
        assert!(b.grow());
        assert_eq!(b.count(), 8);
        assert!(b.grow());
        assert_eq!(b.count(), 12);
        assert!(!b.grow());
        assert_eq!(b.tail, 12);
        b.publish();
        assert!(b.data(11, 2048).is_some_and(|d| d.len() == 1024));
        assert!(b.data(12, 1).is_none());
    }
}
