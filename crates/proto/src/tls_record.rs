//! TLS record framing over a raw byte stream, without decrypting anything.
//!
//! A TLS stream is a sequence of records, each a 5-byte header (content
//! type, legacy version, 16-bit big-endian body length) followed by that
//! many body bytes. The relay hands a connection's record layer to the
//! kernel (kTLS) after the handshake, and may only do so when the bytes it
//! already read from the socket end exactly on a record boundary: a partial
//! record read into userspace cannot be given back, and the kernel would
//! fail on its tail. [`RecordBoundary`] follows the headers of the bytes
//! read so far to answer that question.
//!
//! The bytes come from the peer, so the tracker must hold for any input:
//! it never fails, never allocates, and its answer does not depend on how
//! the stream was split into reads (the `tls_record` fuzz target checks
//! this against a single pass over the whole stream).

/// Bytes in a TLS record header.
pub const HEADER_LEN: usize = 5;

/// Follows TLS record framing over a stream of ciphertext, to tell whether
/// the bytes fed so far end on a record boundary.
///
/// Feed it exactly the bytes the TLS library consumed. Only the 5-byte
/// record headers are looked at; the TLS library validates everything else
/// (a length beyond what TLS allows is followed like any other: the
/// library rejects that record, and the connection ends before a hand-off).
#[derive(Clone, Debug, Default)]
pub struct RecordBoundary {
    /// Header bytes of the current record seen so far (0..5).
    header: [u8; HEADER_LEN],
    header_len: u8,
    /// Body bytes of the current record still to come.
    body_left: usize,
}

impl RecordBoundary {
    /// A tracker at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accounts for `bytes`, the next bytes of the stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let have = usize::from(self.header_len);
            let n = (HEADER_LEN - have).min(bytes.len());
            self.header[have..have + n].copy_from_slice(&bytes[..n]);
            self.header_len += n as u8;
            bytes = &bytes[n..];
            if usize::from(self.header_len) == HEADER_LEN {
                self.header_len = 0;
                self.body_left = usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
            }
        }
    }

    /// Whether the bytes fed so far are whole records.
    pub fn at_boundary(&self) -> bool {
        self.header_len == 0 && self.body_left == 0
    }

    /// Bytes that the current record still needs before anything is known
    /// about what follows: the rest of its header if that is incomplete
    /// (ask again after feeding them: then the body's length is known),
    /// else the rest of its body. 0 at a boundary. Feeding exactly this
    /// many bytes, repeatedly, never reads past the record's end.
    pub fn bytes_to_next(&self) -> usize {
        if self.header_len > 0 {
            HEADER_LEN - usize::from(self.header_len)
        } else {
            self.body_left
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(body: usize) -> Vec<u8> {
        let mut r = vec![23, 3, 3];
        r.extend_from_slice(&(body as u16).to_be_bytes());
        r.extend(std::iter::repeat_n(0xab, body));
        r
    }

    /// Three records (3-byte, empty and 300-byte bodies) and where each
    /// ends.
    fn three_records() -> (Vec<u8>, [usize; 3]) {
        let stream = [record(3), record(0), record(300)].concat();
        (stream, [8, 13, 318])
    }

    #[test]
    fn feeding_what_is_needed_stops_at_each_record_end() {
        let (stream, ends) = three_records();
        for cut in 0..=stream.len() {
            let mut b = RecordBoundary::new();
            b.feed(&stream[..cut]);
            let mut at = cut;
            // At most a header's rest and then a body per record.
            for _ in 0..2 {
                let need = b.bytes_to_next();
                if need == 0 {
                    break;
                }
                b.feed(&stream[at..at + need]);
                at += need;
            }
            assert!(b.at_boundary(), "cut at {cut}: ended at {at}");
            assert_eq!(b.bytes_to_next(), 0);
            let next_end = ends.iter().copied().find(|&e| e >= cut).unwrap_or(cut);
            assert_eq!(at, if cut == 0 { 0 } else { next_end }, "cut at {cut}");
        }
    }

    #[test]
    fn follows_headers_in_any_chunking() {
        let (stream, ends) = three_records();
        for chunk in 1..=stream.len() {
            let mut b = RecordBoundary::new();
            assert!(b.at_boundary());
            let mut fed = 0;
            for piece in stream.chunks(chunk) {
                b.feed(piece);
                fed += piece.len();
                assert_eq!(
                    b.at_boundary(),
                    ends.contains(&fed),
                    "chunk {chunk}, fed {fed}"
                );
            }
        }
    }

    #[test]
    fn a_split_at_every_byte_gives_the_whole_feed_answer() {
        let (stream, ends) = three_records();
        for cut in 0..=stream.len() {
            let mut b = RecordBoundary::new();
            b.feed(&stream[..cut]);
            assert_eq!(
                b.at_boundary(),
                cut == 0 || ends.contains(&cut),
                "after {cut} bytes"
            );
            b.feed(&stream[cut..]);
            assert!(
                b.at_boundary(),
                "split at {cut}: the whole stream is records"
            );
        }
        // Byte by byte, every position is checked.
        let mut b = RecordBoundary::new();
        for (i, byte) in stream.iter().enumerate() {
            b.feed(std::slice::from_ref(byte));
            assert_eq!(b.at_boundary(), ends.contains(&(i + 1)), "after byte {i}");
        }
    }

    #[test]
    fn an_oversized_length_is_followed_to_its_end() {
        // 0xffff is far beyond TLS's 2^14 + 256, but the tracker only
        // counts: it must neither overflow nor report a boundary early.
        let mut stream = vec![23, 3, 3, 0xff, 0xff];
        stream.resize(HEADER_LEN + 0xffff, 0);
        let mut b = RecordBoundary::new();
        b.feed(&stream[..stream.len() - 1]);
        assert!(!b.at_boundary());
        b.feed(&stream[stream.len() - 1..]);
        assert!(b.at_boundary());
        // A record after it is framed as usual.
        b.feed(&record(2)[..6]);
        assert!(!b.at_boundary());
        b.feed(&[0]);
        assert!(b.at_boundary());
    }

    #[test]
    fn boundary_holds_only_after_exact_records() {
        let mut b = RecordBoundary::new();
        b.feed(&[record(16), record(1)].concat());
        assert!(b.at_boundary());
        // Part of a header is not a boundary; the whole header of an empty
        // record is.
        b.feed(&[22, 3, 3, 0]);
        assert!(!b.at_boundary());
        b.feed(&[0]);
        assert!(b.at_boundary(), "a complete header of an empty record");
        // One byte short, one byte over.
        b.feed(&record(10)[..14]);
        assert!(!b.at_boundary());
        b.feed(&[0xab, 23]);
        assert!(!b.at_boundary());
    }
}
