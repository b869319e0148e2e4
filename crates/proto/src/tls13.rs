//! TLS 1.3 protected records after the handshake, without the cryptography.
//!
//! Once a TLS 1.3 handshake is over, every record on the wire is an
//! `application_data` record (RFC 8446 §5.2): a 5-byte header (outer type
//! 23, legacy version, 16-bit length) and an AEAD ciphertext whose
//! plaintext is the content, its real content type and zero padding. The
//! relay opens and seals these records itself after the handshake (see
//! `ferry_derp::transport::records`); this module holds the parts that read the
//! peer's bytes:
//!
//! - [`RecordReader`] cuts a byte stream into whole records: a record that
//!   lies whole in the bytes at hand is returned where it lies, and only a
//!   record cut by the end of a read is copied, into a buffer held until
//!   its rest arrives;
//! - [`parse_header`] checks a header (outer type, the ciphertext limit);
//! - [`inner_plaintext`] finds the content type of an opened record behind
//!   its padding, and checks the plaintext limit (padding included);
//! - [`EmptyRun`] bounds how many records without content come in a row.
//!
//! The bytes come from the peer: nothing here panics or allocates more than
//! one record's size for any input, and the records found do not depend on
//! how the stream was split into reads (the `tls13` fuzz target checks
//! this against one pass over the whole stream).

pub use crate::tls_record::HEADER_LEN;

/// Bytes of the AEAD tag at the end of every record (all three TLS 1.3
/// AEADs: AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305).
pub const TAG_LEN: usize = 16;
/// Largest plaintext of a record (content and content type; RFC 8446 §5.1,
/// 2^14 bytes of content, plus the type byte is allowed by §5.2's
/// `TLSInnerPlaintext` limit of 2^14 + 1).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Largest ciphertext a peer may send (RFC 8446 §5.2: 2^14 + 256).
pub const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// Most records without content a peer may send in a row (zero-length
/// application data, padded or not); the next one ends the connection.
/// Each costs a decryption and carries nothing, so an endless run would
/// be work for nothing; rustls stops at the same count.
pub const MAX_EMPTY_RUN: usize = 32;

/// Record content types (RFC 8446 §5.1).
pub mod content_type {
    /// change_cipher_spec (only in the handshake's compatibility mode).
    pub const CHANGE_CIPHER_SPEC: u8 = 20;
    /// alert.
    pub const ALERT: u8 = 21;
    /// handshake (after the handshake: KeyUpdate, NewSessionTicket).
    pub const HANDSHAKE: u8 = 22;
    /// application_data, and the outer type of every protected record.
    pub const APPLICATION_DATA: u8 = 23;
}

/// Alert descriptions this module's errors map to (RFC 8446 §6).
pub mod alert {
    /// close_notify.
    pub const CLOSE_NOTIFY: u8 = 0;
    /// unexpected_message.
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    /// bad_record_mac.
    pub const BAD_RECORD_MAC: u8 = 20;
    /// record_overflow.
    pub const RECORD_OVERFLOW: u8 = 22;
    /// decode_error.
    pub const DECODE_ERROR: u8 = 50;
}

/// A record that breaks RFC 8446 §5. Each ends the connection with the
/// alert [`RecordError::alert`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A record whose outer type is not application_data.
    #[error("TLS record of outer content type {0} after the handshake")]
    OuterType(u8),
    /// A ciphertext longer than 2^14 + 256 bytes.
    #[error("TLS record of {0} bytes, over the limit of 2^14 + 256")]
    Oversize(usize),
    /// A ciphertext too short to hold a content type and a tag.
    #[error("TLS record of {0} bytes, too short for a content type and a tag")]
    Short(usize),
    /// The AEAD did not authenticate the record.
    #[error("TLS record failed authentication")]
    BadTag,
    /// An inner plaintext (content, type and padding) longer than 2^14 + 1
    /// bytes (RFC 8446 §5.4).
    #[error("TLS inner plaintext of {0} bytes, over the limit of 2^14 + 1")]
    PlaintextOversize(usize),
    /// An opened record holding only zeros: no content type.
    #[error("TLS record without a content type (all padding)")]
    NoContentType,
    /// A zero-length alert or handshake record (RFC 8446 §5.4 allows
    /// zero-length content for application data only).
    #[error("empty TLS record of content type {0}")]
    Empty(u8),
    /// More than [`MAX_EMPTY_RUN`] records without content in a row.
    #[error("more than {} empty TLS records in a row", MAX_EMPTY_RUN)]
    EmptyRun,
}

impl RecordError {
    /// The alert description to send before closing.
    pub fn alert(&self) -> u8 {
        match self {
            RecordError::OuterType(_)
            | RecordError::NoContentType
            | RecordError::Empty(_)
            | RecordError::EmptyRun => alert::UNEXPECTED_MESSAGE,
            RecordError::Oversize(_) | RecordError::PlaintextOversize(_) => alert::RECORD_OVERFLOW,
            RecordError::Short(_) | RecordError::BadTag => alert::BAD_RECORD_MAC,
        }
    }
}

/// Checks a protected record's header; returns the ciphertext's length.
pub fn parse_header(header: &[u8; HEADER_LEN]) -> Result<usize, RecordError> {
    if header[0] != content_type::APPLICATION_DATA {
        return Err(RecordError::OuterType(header[0]));
    }
    // The legacy version is ignored (RFC 8446 §5.1: "MUST be ignored for
    // all purposes").
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len > MAX_CIPHERTEXT {
        return Err(RecordError::Oversize(len));
    }
    if len <= TAG_LEN {
        return Err(RecordError::Short(len));
    }
    Ok(len)
}

/// The content type and content length of an opened record's plaintext
/// (`content || type || zeros`, RFC 8446 §5.2 and §5.4), which may be at
/// most 2^14 + 1 bytes with its padding.
pub fn inner_plaintext(plain: &[u8]) -> Result<(u8, usize), RecordError> {
    if plain.len() > MAX_PLAINTEXT + 1 {
        return Err(RecordError::PlaintextOversize(plain.len()));
    }
    let Some(at) = plain.iter().rposition(|&b| b != 0) else {
        return Err(RecordError::NoContentType);
    };
    let ty = plain[at];
    if at == 0 && ty != content_type::APPLICATION_DATA {
        return Err(RecordError::Empty(ty));
    }
    Ok((ty, at))
}

/// Counts a peer's records without content in a row (see
/// [`MAX_EMPTY_RUN`]).
#[derive(Debug, Default)]
pub struct EmptyRun(u8);

impl EmptyRun {
    /// Notes an opened record with `content_len` bytes of content: an
    /// error when it is one empty record too many.
    pub fn note(&mut self, content_len: usize) -> Result<(), RecordError> {
        if content_len > 0 {
            self.0 = 0;
        } else if usize::from(self.0) >= MAX_EMPTY_RUN {
            return Err(RecordError::EmptyRun);
        } else {
            self.0 += 1;
        }
        Ok(())
    }
}

/// Writes a protected record's header for `plaintext_len` bytes of content
/// (the ciphertext adds the type byte and the tag).
pub fn header_for(plaintext_len: usize) -> [u8; HEADER_LEN] {
    debug_assert!(plaintext_len <= MAX_PLAINTEXT);
    let len = (plaintext_len + 1 + TAG_LEN) as u16;
    let [hi, lo] = len.to_be_bytes();
    [content_type::APPLICATION_DATA, 3, 3, hi, lo]
}

/// What [`RecordReader::next`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// A whole record (header and ciphertext) where it lies in the input.
    Whole(&'a [u8]),
    /// The held record is whole now: [`RecordReader::held_mut`], then
    /// [`RecordReader::clear_held`].
    Held,
    /// The input is used up (any partial record is held).
    More,
}

/// Cuts a stream of protected records into whole records, holding a record
/// that a read cut until the rest arrives.
#[derive(Debug, Default)]
pub struct RecordReader {
    held: Vec<u8>,
}

impl RecordReader {
    /// A reader at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next whole record of `input` (advanced past what was used).
    /// After [`Step::Held`], clear the held record before calling again.
    pub fn next<'a>(&mut self, input: &mut &'a [u8]) -> Result<Step<'a>, RecordError> {
        if self.held.is_empty() {
            let Some(header) = input.first_chunk::<HEADER_LEN>() else {
                if input.is_empty() {
                    return Ok(Step::More);
                }
                self.held.reserve_exact(HEADER_LEN);
                self.held.extend_from_slice(input);
                *input = &[];
                return Ok(Step::More);
            };
            let total = HEADER_LEN + parse_header(header)?;
            if let Some((record, rest)) = input.split_at_checked(total) {
                *input = rest;
                return Ok(Step::Whole(record));
            }
            self.held.reserve_exact(total);
        }
        if self.held.len() < HEADER_LEN {
            let n = (HEADER_LEN - self.held.len()).min(input.len());
            self.take(input, n);
            let Some(header) = self.held.first_chunk::<HEADER_LEN>() else {
                return Ok(Step::More);
            };
            let total = HEADER_LEN + parse_header(header)?;
            self.held.reserve_exact(total - self.held.len());
        }
        let header = self.held.first_chunk::<HEADER_LEN>().expect("held header");
        let total = HEADER_LEN + usize::from(u16::from_be_bytes([header[3], header[4]]));
        let n = (total - self.held.len()).min(input.len());
        self.take(input, n);
        Ok(if self.held.len() == total {
            Step::Held
        } else {
            Step::More
        })
    }

    fn take(&mut self, input: &mut &[u8], n: usize) {
        let (head, rest) = input.split_at(n);
        self.held.extend_from_slice(head);
        *input = rest;
    }

    /// The held record (header and ciphertext), to open in place.
    pub fn held_mut(&mut self) -> &mut [u8] {
        &mut self.held
    }

    /// Forgets the held record, keeping its memory for the next.
    pub fn clear_held(&mut self) {
        self.held.clear();
    }

    /// Bytes of a partial record held.
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Gives back the held buffer's memory when nothing is held (an idle
    /// connection keeps none).
    pub fn release(&mut self) {
        if self.held.is_empty() {
            self.held = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(body: usize) -> Vec<u8> {
        let mut r = vec![23, 3, 3];
        r.extend_from_slice(&(body as u16).to_be_bytes());
        r.extend((0..body).map(|i| i as u8));
        r
    }

    /// Every record of `stream` read in pieces of `step` bytes.
    fn read_all(stream: &[u8], step: usize) -> Result<Vec<Vec<u8>>, RecordError> {
        let mut r = RecordReader::new();
        let mut out = Vec::new();
        for mut chunk in stream.chunks(step) {
            loop {
                match r.next(&mut chunk)? {
                    Step::Whole(rec) => out.push(rec.to_vec()),
                    Step::Held => {
                        out.push(r.held_mut().to_vec());
                        r.clear_held();
                    }
                    Step::More => break,
                }
            }
        }
        assert_eq!(r.held_len(), 0, "a whole stream leaves nothing held");
        Ok(out)
    }

    #[test]
    fn records_are_the_same_for_every_split() {
        let records = [record(17), record(300), record(MAX_CIPHERTEXT), record(40)];
        let stream = records.concat();
        for step in [1, 2, 4, 5, 6, 17, 22, 23, 1000, stream.len()] {
            assert_eq!(read_all(&stream, step).unwrap(), records, "step {step}");
        }
    }

    #[test]
    fn whole_records_are_not_copied() {
        let stream = [record(20), record(30)].concat();
        let mut input = &stream[..];
        let mut r = RecordReader::new();
        let Step::Whole(first) = r.next(&mut input).unwrap() else {
            panic!("whole")
        };
        assert_eq!(first.as_ptr(), stream.as_ptr());
        assert!(matches!(r.next(&mut input).unwrap(), Step::Whole(_)));
        assert_eq!(r.next(&mut input).unwrap(), Step::More);
        r.release();
        assert_eq!(r.held.capacity(), 0);
    }

    #[test]
    fn bad_headers_are_refused() {
        let mut r = RecordReader::new();
        let oversize = [23, 3, 3, 0x41, 0x01];
        assert_eq!(
            r.next(&mut &oversize[..]),
            Err(RecordError::Oversize(MAX_CIPHERTEXT + 1))
        );
        assert_eq!(
            RecordReader::new().next(&mut &[22, 3, 3, 0, 40][..]),
            Err(RecordError::OuterType(22))
        );
        assert_eq!(
            RecordReader::new().next(&mut &[23, 3, 3, 0, 16][..]),
            Err(RecordError::Short(16))
        );
        // Found the same way when the header arrives a byte at a time.
        let mut r = RecordReader::new();
        for b in &oversize[..4] {
            assert_eq!(r.next(&mut &[*b][..]), Ok(Step::More));
        }
        assert_eq!(
            r.next(&mut &oversize[4..]),
            Err(RecordError::Oversize(MAX_CIPHERTEXT + 1))
        );
        assert_eq!(RecordError::Oversize(0).alert(), alert::RECORD_OVERFLOW);
        assert_eq!(RecordError::BadTag.alert(), alert::BAD_RECORD_MAC);
        assert_eq!(RecordError::OuterType(1).alert(), alert::UNEXPECTED_MESSAGE);
    }

    #[test]
    fn inner_plaintext_strips_padding() {
        assert_eq!(inner_plaintext(b"abc\x17"), Ok((23, 3)));
        assert_eq!(inner_plaintext(b"ab\0c\x16\0\0\0"), Ok((22, 4)));
        assert_eq!(inner_plaintext(b"\x17\0\0"), Ok((23, 0)));
        assert_eq!(inner_plaintext(b"\x15"), Err(RecordError::Empty(21)));
        assert_eq!(inner_plaintext(b"\0\0"), Err(RecordError::NoContentType));
        assert_eq!(inner_plaintext(b""), Err(RecordError::NoContentType));
        let mut big = vec![1; MAX_PLAINTEXT];
        big.push(23);
        assert_eq!(inner_plaintext(&big), Ok((23, MAX_PLAINTEXT)));
        big.insert(0, 1);
        assert_eq!(
            inner_plaintext(&big),
            Err(RecordError::PlaintextOversize(MAX_PLAINTEXT + 2))
        );
    }

    /// The limit is on the whole inner plaintext, padding included
    /// (RFC 8446 §5.4): 2^14 + 1 bytes.
    #[test]
    fn padding_counts_against_the_limit() {
        let mut padded = vec![0; MAX_PLAINTEXT + 1];
        padded[0] = 5;
        padded[1] = 23;
        assert_eq!(inner_plaintext(&padded), Ok((23, 1)));
        padded.push(0);
        assert_eq!(
            inner_plaintext(&padded),
            Err(RecordError::PlaintextOversize(MAX_PLAINTEXT + 2))
        );
        assert_eq!(
            RecordError::PlaintextOversize(0).alert(),
            alert::RECORD_OVERFLOW
        );
    }

    #[test]
    fn empty_runs_are_bounded() {
        let mut run = EmptyRun::default();
        for round in 0..3 {
            for i in 0..MAX_EMPTY_RUN {
                assert_eq!(run.note(0), Ok(()), "round {round}, empty {i}");
            }
            run.note(1).unwrap();
        }
        for _ in 0..MAX_EMPTY_RUN {
            run.note(0).unwrap();
        }
        assert_eq!(run.note(0), Err(RecordError::EmptyRun));
        assert_eq!(RecordError::EmptyRun.alert(), alert::UNEXPECTED_MESSAGE);
    }

    #[test]
    fn headers_round_trip() {
        let h = header_for(100);
        assert_eq!(parse_header(&h), Ok(117));
        assert_eq!(
            parse_header(&header_for(MAX_PLAINTEXT)),
            Ok(MAX_PLAINTEXT + 17)
        );
    }
}
