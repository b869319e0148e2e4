//! The body of a streaming map poll: repeated u32 **little-endian** length
//! ‖ that many bytes of JSON (one `MapResponse` each; no compression, as
//! Ferry never asks for it).

/// Largest map response accepted, in bytes. A full netmap of a large
/// tailnet is a few MiB; anything bigger is refused and the poll dropped.
pub const MAX_MAP_FRAME: usize = 16 * 1024 * 1024;

/// A frame over the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("map response of {len} bytes exceeds the {max}-byte limit")]
pub struct FrameTooLarge {
    /// The announced length.
    pub len: u64,
    /// The limit in force.
    pub max: usize,
}

/// Finds the first whole frame at the start of `buf` with the limit `max`:
/// `Ok(Some((body, bytes consumed)))`, or `Ok(None)` while incomplete.
pub fn next_frame(buf: &[u8], max: usize) -> Result<Option<(&[u8], usize)>, FrameTooLarge> {
    let Some(h) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    if u64::from(len) > max as u64 {
        return Err(FrameTooLarge {
            len: len.into(),
            max,
        });
    }
    let end = 4 + len as usize;
    Ok(buf.get(4..end).map(|body| (body, end)))
}

/// Appends one frame holding `body` (for tests and simulated servers).
pub fn put_frame(body: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(body.len()).expect("map frame under 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_and_limit() {
        let mut wire = Vec::new();
        put_frame(b"{}", &mut wire);
        put_frame(b"", &mut wire);
        assert_eq!(&wire[..4], &[2, 0, 0, 0]);
        for n in 0..6 {
            assert_eq!(next_frame(&wire[..n], 10), Ok(None), "{n}");
        }
        let (body, used) = next_frame(&wire, 10).unwrap().unwrap();
        assert_eq!((body, used), (&b"{}"[..], 6));
        assert_eq!(next_frame(&wire[6..], 10), Ok(Some((&b""[..], 4))));
        assert_eq!(next_frame(&wire, 2).unwrap().unwrap().1, 6);
        assert_eq!(next_frame(&wire, 1), Err(FrameTooLarge { len: 2, max: 1 }));
        assert_eq!(
            next_frame(&[0xff; 4], MAX_MAP_FRAME),
            Err(FrameTooLarge {
                len: u32::MAX.into(),
                max: MAX_MAP_FRAME
            })
        );
    }
}
