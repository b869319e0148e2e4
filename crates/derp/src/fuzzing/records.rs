//! The `tls_records` fuzz target: Ferry's TLS 1.3 record layer
//! ([`RecordLayer`]) on fixed keys, both ways, against a sealer and an
//! opener written here on the AEAD directly (no rustls, no sockets).
//!
//! Input: `data[0]` picks the cipher (bit 0: AES-256-GCM or
//! ChaCha20-Poly1305), how the client's records are cut into reads
//! (bits 1-2: single bytes, up to 16, up to 4 096, all at once), the first
//! sequence numbers (bit 3) and the transmit key's record limit (bits 4-5:
//! none, or one to three records past the first). The rest is a list of
//! records the client seals: a 4-byte head (content type selector,
//! padding, content length) and the content itself, taken from the input;
//! the head's selector may also flip one bit of the sealed record
//! (header, ciphertext or tag). What remains after the last whole record
//! is what the server sends, cut into three parts.
//!
//! Checked:
//!
//! - reading the client's records never panics, and gives the same data
//!   and the same end whatever the cutting of the reads;
//! - the data read is the content of the application-data records as
//!   sealed, in order, nothing else (a record sealed with content type 0
//!   is what its last non-zero content byte says): at least every record
//!   before the first one that is tampered with, oversized, empty or of
//!   another type, and all of it when there is no such record;
//! - a tampered record gives nothing, and nothing after it is read;
//! - what the server seals opens, record by record, to exactly the parts
//!   it was given, in records of at most 2^14 bytes of content; once the
//!   record limit is reached a close_notify is the last record, and
//!   nothing is sealed after it or after a queued alert.

use aws_lc_rs::aead::{
    Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, CHACHA20_POLY1305, NONCE_LEN,
};
use ferry_proto::tls13::{alert, content_type, HEADER_LEN, MAX_CIPHERTEXT, MAX_PLAINTEXT, TAG_LEN};
use rustls::crypto::cipher::{AeadKey, Iv};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};

use super::{chunks, max_chunk, XorShift};
use crate::transport::records::{Content, RecordLayer, PLAINTEXT_BUFFER};

/// Records read from one input at most.
const MAX_RECORDS: usize = 64;
/// The client's (server's receive) and the server's transmit keys and IVs.
const CLIENT_KEY: [u8; 32] = [0x11; 32];
const CLIENT_IV: [u8; NONCE_LEN] = [0x21; NONCE_LEN];
const SERVER_KEY: [u8; 32] = [0x12; 32];
const SERVER_IV: [u8; NONCE_LEN] = [0x22; NONCE_LEN];

/// One direction's keys as the test's own peer holds them.
struct Peer {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Peer {
    fn new(chacha: bool, key: &[u8; 32], iv: [u8; NONCE_LEN], seq: u64) -> Peer {
        let alg = if chacha {
            &CHACHA20_POLY1305
        } else {
            &AES_256_GCM
        };
        Peer {
            key: LessSafeKey::new(UnboundKey::new(alg, key).expect("a 32-byte key")),
            iv,
            seq,
        }
    }

    fn nonce(&mut self) -> Nonce {
        let mut n = self.iv;
        for (b, s) in n[NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(n)
    }

    /// Seals `content || ty || zeros` as one record.
    fn seal(&mut self, ty: u8, content: &[u8], padding: usize) -> Vec<u8> {
        let mut body = content.to_vec();
        body.push(ty);
        body.resize(body.len() + padding, 0);
        let len = u16::try_from(body.len() + TAG_LEN).expect("a length the header can carry");
        let [hi, lo] = len.to_be_bytes();
        let header = [content_type::APPLICATION_DATA, 3, 3, hi, lo];
        let nonce = self.nonce();
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut body)
            .expect("sealable");
        [&header[..], &body, tag.as_ref()].concat()
    }

    /// Opens every record of `wire`: (content type, content) of each.
    fn open_all(&mut self, mut wire: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while !wire.is_empty() {
            assert!(wire.len() > HEADER_LEN, "a record cut short");
            let header: [u8; HEADER_LEN] = wire[..HEADER_LEN].try_into().expect("5 bytes");
            assert_eq!(header[..3], [content_type::APPLICATION_DATA, 3, 3]);
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            assert!(
                len <= MAX_PLAINTEXT + 1 + TAG_LEN,
                "a record of {len} bytes"
            );
            let mut body = wire[HEADER_LEN..HEADER_LEN + len].to_vec();
            let nonce = self.nonce();
            let plain = self
                .key
                .open_in_place(nonce, Aad::from(header), &mut body)
                .expect("the server's records open");
            let (&ty, content) = plain.split_last().expect("a content type");
            out.push((ty, content.to_vec()));
            wire = &wire[HEADER_LEN + len..];
        }
        out
    }
}

fn secrets(chacha: bool, key: [u8; 32], iv: [u8; NONCE_LEN]) -> ConnectionTrafficSecrets {
    let (key, iv) = (AeadKey::from(key), Iv::from(iv));
    if chacha {
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv }
    } else {
        ConnectionTrafficSecrets::Aes256Gcm { key, iv }
    }
}

/// One record the client sealed, and what the server may make of it.
struct Sealed {
    wire: Vec<u8>,
    /// Application data content, when the record is one and untampered.
    data: Option<Vec<u8>>,
    /// Every reader must deliver it and go on: application data with
    /// content, within the limits, untampered.
    clean: bool,
    tampered: bool,
}

/// Reads `wire` in pieces of at most `max` bytes: the data, and how it
/// ended (`None`: input used up; `Some(true)`: close_notify;
/// `Some(false)`: an error, whose alert is also asked for).
fn read(layer: &mut RecordLayer, wire: &[u8], max: usize, seed: u32) -> (Vec<u8>, Option<bool>) {
    let mut rng = XorShift::new(seed);
    let mut plain = vec![0; PLAINTEXT_BUFFER];
    let mut got = Vec::new();
    for mut input in chunks(wire, max, &mut rng) {
        loop {
            match layer.read(&mut input, &mut plain) {
                Ok(Some(Content::Data(d))) => {
                    assert!(!d.is_empty(), "Data is never empty");
                    got.extend_from_slice(d);
                }
                Ok(Some(Content::Closed)) => return (got, Some(true)),
                Ok(None) => {
                    assert!(input.is_empty(), "None only once the input is used");
                    break;
                }
                Err(e) => {
                    let _ = e.alert();
                    return (got, Some(false));
                }
            }
        }
    }
    layer.release();
    (got, None)
}

/// Drives the record layer with `data` (see the module doc).
pub fn tls_records(data: &[u8]) {
    let Some((&ctl, mut rest)) = data.split_first() else {
        return;
    };
    let chacha = ctl & 1 != 0;
    let (rx_seq, tx_seq) = if ctl & 8 != 0 { (7, 1000) } else { (0, 0) };
    let tx_limit = match (ctl >> 4) & 3 {
        0 => u64::MAX,
        n => tx_seq + u64::from(n),
    };
    let layer = || {
        let secrets = ExtractedSecrets {
            tx: (tx_seq, secrets(chacha, SERVER_KEY, SERVER_IV)),
            rx: (rx_seq, secrets(chacha, CLIENT_KEY, CLIENT_IV)),
        };
        RecordLayer::from_secrets(secrets, tx_limit).expect("fixed keys make a layer")
    };

    // The client's records.
    let mut client = Peer::new(chacha, &CLIENT_KEY, CLIENT_IV, rx_seq);
    let mut records: Vec<Sealed> = Vec::new();
    while records.len() < MAX_RECORDS {
        let [sel, pad, lo, hi, tail @ ..] = rest else {
            break;
        };
        let len = usize::from(u16::from_le_bytes([*lo, *hi])) % (MAX_PLAINTEXT + 64);
        if tail.len() < len {
            break;
        }
        let (content, after) = tail.split_at(len);
        rest = after;
        let ty = match sel & 7 {
            0..=3 => content_type::APPLICATION_DATA,
            4 => content_type::ALERT,
            5 => content_type::HANDSHAKE,
            _ => sel >> 3,
        };
        // Padding up to about 16 KiB, kept within what a header can say.
        let padding = (usize::from(*pad) * if sel & 8 != 0 { 64 } else { 1 })
            .min(usize::from(u16::MAX) - TAG_LEN - 1 - len);
        let mut wire = client.seal(ty, content, padding);
        // Bit 7 of the selector: flip one bit, chosen by the padding byte.
        let tampered = sel & 0x80 != 0;
        if tampered {
            let at = (usize::from(*pad) * 7 + len) % wire.len();
            wire[at] ^= 1 << (sel & 7);
        }
        let fits =
            len + 1 + padding <= MAX_PLAINTEXT && len + 1 + padding + TAG_LEN <= MAX_CIPHERTEXT;
        // What the record is to the reader: with type 0 the content's last
        // non-zero byte is the type (RFC 8446 §5.4).
        let (ty, content) = match (ty, content.iter().rposition(|&b| b != 0)) {
            (0, Some(at)) => (content[at], &content[..at]),
            (0, None) => (0, &[][..]),
            _ => (ty, content),
        };
        let appdata = ty == content_type::APPLICATION_DATA && !tampered;
        records.push(Sealed {
            wire,
            data: appdata.then(|| content.to_vec()),
            clean: appdata && !content.is_empty() && fits,
            tampered,
        });
    }
    let wire: Vec<u8> = records
        .iter()
        .flat_map(|r| r.wire.iter().copied())
        .collect();
    let whole = read(&mut layer(), &wire, wire.len().max(1), 1);
    let cut = read(
        &mut layer(),
        &wire,
        max_chunk(ctl >> 1, wire.len()),
        0x9e37_79b9 ^ u32::from(ctl),
    );
    assert_eq!(cut, whole, "the records read depend on how they were cut");

    // What must have been read: every clean record before the first other
    // one; what may have been: application data up to the first tampered
    // record.
    let first_other = records
        .iter()
        .position(|r| !r.clean)
        .unwrap_or(records.len());
    let must: Vec<u8> = records[..first_other]
        .iter()
        .flat_map(|r| r.data.iter().flatten().copied())
        .collect();
    let first_tampered = records
        .iter()
        .position(|r| r.tampered)
        .unwrap_or(records.len());
    let may: Vec<u8> = records[..first_tampered]
        .iter()
        .flat_map(|r| r.data.iter().flatten().copied())
        .collect();
    let (got, end) = whole;
    assert!(got.starts_with(&must), "a clean record was not read");
    assert!(may.starts_with(&got), "read data that was not sealed");
    if first_other == records.len() {
        assert_eq!((got, end), (must, None), "only clean records");
    }

    // The server's records: the rest of the input in three parts, sealed
    // once or twice (the second time after the limit or an alert).
    let mut layer = layer();
    let mut opener = Peer::new(chacha, &SERVER_KEY, SERVER_IV, tx_seq);
    let a = rest.len() / 3;
    let parts: [&[u8]; 3] = [&rest[..a], &rest[a..2 * a], &rest[2 * a..]];
    let mut buf = Vec::new();
    let worn = layer.seal(&mut buf, parts).is_err();
    let opened = opener.open_all(&buf);
    let (alerts, data): (Vec<_>, Vec<_>) = opened
        .iter()
        .partition(|(ty, _)| *ty == content_type::ALERT);
    let sent: Vec<u8> = data
        .iter()
        .flat_map(|(ty, c)| {
            assert_eq!(*ty, content_type::APPLICATION_DATA);
            assert!(!c.is_empty() && c.len() <= MAX_PLAINTEXT);
            c.iter().copied()
        })
        .collect();
    assert_eq!(sent, parts.concat(), "the records hold the parts");
    assert_eq!(worn, layer.ended(), "a worn key ends the layer");
    if worn {
        assert_eq!(alerts.len(), 1);
        assert_eq!(
            opened.last().map(|(_, c)| c.as_slice()),
            Some(&[1, alert::CLOSE_NOTIFY][..])
        );
    } else {
        assert!(alerts.is_empty());
        // An alert queued now goes out alone, and ends the layer.
        layer.queue_alert(alert::DECODE_ERROR);
    }
    let mut more = Vec::new();
    let _ = layer.seal(&mut more, parts);
    let after = opener.open_all(&more);
    if worn {
        assert!(after.is_empty(), "sealed after the close_notify");
    } else {
        assert_eq!(
            after,
            vec![(content_type::ALERT, vec![2, alert::DECODE_ERROR])]
        );
    }
    assert!(layer.ended());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the server reads of `records` (sealed by the client on
    /// AES-256-GCM from sequence number 0), fed at once.
    fn server_reads(records: &[(u8, &[u8], usize)]) -> (Vec<u8>, Option<bool>) {
        let mut client = Peer::new(false, &CLIENT_KEY, CLIENT_IV, 0);
        let wire: Vec<u8> = records
            .iter()
            .flat_map(|&(ty, c, pad)| client.seal(ty, c, pad))
            .collect();
        let secrets = ExtractedSecrets {
            tx: (0, secrets(false, SERVER_KEY, SERVER_IV)),
            rx: (0, secrets(false, CLIENT_KEY, CLIENT_IV)),
        };
        let mut layer = RecordLayer::from_secrets(secrets, u64::MAX).expect("a layer");
        read(&mut layer, &wire, 7, 1)
    }

    #[test]
    fn the_test_peer_and_the_layer_agree() {
        let data = content_type::APPLICATION_DATA;
        assert_eq!(
            server_reads(&[(data, b"one", 0), (data, b"two", 40)]),
            (b"onetwo".to_vec(), None)
        );
        assert_eq!(
            server_reads(&[(data, b"bye", 0), (content_type::ALERT, &[1, 0], 0)]),
            (b"bye".to_vec(), Some(true))
        );
        assert_eq!(
            server_reads(&[(content_type::HANDSHAKE, &[24, 0, 0, 1, 0], 0)]),
            (Vec::new(), Some(false))
        );
    }
}
