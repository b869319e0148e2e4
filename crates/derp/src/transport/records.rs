//! Ferry's own TLS 1.3 record layer after the handshake.
//!
//! rustls does the handshake. Once it is over, at a record boundary and
//! with rustls holding no received plaintext (the same hand-off point as
//! kernel TLS, see [`super::kernel`]), [`RecordLayer::start`] takes the
//! traffic keys and sequence numbers out of rustls and drops it: the
//! connection keeps only two AEAD keys, two counters and, while a read ends
//! inside a record, that record's bytes.
//!
//! - **Receive**: a record that lies whole in a read is opened straight
//!   from the read buffer into the shard's plaintext buffer (one pass, the
//!   driver lends its buffer read-only); a record cut by the end of a read
//!   is held ([`ferry_proto::tls13::RecordReader`]) and opened in place
//!   once whole. The plaintext goes to the same input path as plain TCP.
//!   Alerts, post-handshake messages, padding, size limits and bad tags
//!   are handled as RFC 8446 §5 and §6 ask ([`RecordFailure::alert`]);
//!   as in rustls, more than 32 records without content in a row end the
//!   connection.
//! - **Send**: the queued frames are encrypted straight from the queue into
//!   the send buffer (one pass, no copy of the plaintext first), in full
//!   16 KiB records where the queue has that much; the content type byte
//!   and the tag follow. Only a record that spans two of the queue's parts
//!   (control, disco, data) is gathered into the send buffer first and
//!   sealed in place.
//! - **KeyUpdate and the record limit**: as for a kernel session started
//!   from rustls's buffered connection, which keeps no key schedule
//!   ([`super::kernel`], "Buffered or unbuffered rustls"): a peer's KeyUpdate
//!   ends the connection cleanly (close_notify), and so does the transmit
//!   key reaching half its confidentiality limit
//!   (`handoff::past_record_limit`).
//!
//! TLS 1.2 sessions, and servers run with `--tls-records rustls`, stay on
//! rustls for the whole connection.

use std::fmt;

use aws_lc_rs::aead::{
    Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305, NONCE_LEN,
};
use ferry_proto::tls13::{
    self, alert, content_type, EmptyRun, RecordError, RecordReader, Step, HEADER_LEN,
    MAX_CIPHERTEXT, MAX_PLAINTEXT, TAG_LEN,
};
use ferry_sys::ktls::Version;
use rustls::{
    AlertDescription, ConnectionTrafficSecrets, ExtractedSecrets, ServerConfig, ServerConnection,
};

use super::handoff::{self, HandoffError, Refusal, Refused};

/// Lets rustls give up a session's keys after the handshake (what
/// [`RecordLayer::start`] needs).
pub fn allow_own_records(config: &mut ServerConfig) {
    config.enable_secret_extraction = true;
}

/// Bytes a plaintext buffer for [`RecordLayer::read`] needs.
pub const PLAINTEXT_BUFFER: usize = MAX_CIPHERTEXT;

/// One direction's key, IV and next sequence number.
struct Keys {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Keys {
    fn new(seq: u64, secrets: &ConnectionTrafficSecrets) -> Result<Keys, HandoffError> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => {
                return Err(HandoffError::Secrets(
                    "keys for an AEAD other than AES-GCM or ChaCha20-Poly1305",
                ))
            }
        };
        let iv: [u8; NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| HandoffError::Secrets("an IV that is not 12 bytes"))?;
        let key = UnboundKey::new(alg, key.as_ref())
            .map_err(|_| HandoffError::Secrets("a key of the wrong length for its cipher"))?;
        Ok(Keys {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The next record's nonce (RFC 8446 §5.3: the IV XOR the sequence
    /// number), counting the record.
    fn next_nonce(&mut self) -> Nonce {
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *n ^= s;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(nonce)
    }
}

/// Why a connection on [`RecordLayer`] ends (other than the peer's
/// close_notify). [`RecordFailure::alert`] says what to send first.
#[derive(Debug, thiserror::Error)]
pub enum RecordFailure {
    /// A record that breaks the record protocol.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The peer sent an alert other than close_notify.
    #[error("peer sent TLS alert {description:?} (level {level})")]
    PeerAlert {
        /// The alert level byte.
        level: u8,
        /// The alert.
        description: AlertDescription,
    },
    /// An alert record that is not two bytes.
    #[error("malformed TLS alert record ({0} bytes)")]
    BadAlert(usize),
    /// A post-handshake handshake message: a KeyUpdate, which this layer
    /// cannot follow (no key schedule), or one that has no place here.
    #[error(transparent)]
    Handshake(HandoffError),
    /// A record of a content type that has no place after the handshake.
    #[error("unexpected TLS record of content type {0} after the handshake")]
    UnexpectedRecord(u8),
}

impl RecordFailure {
    /// The alert to send before closing (`None`: the peer already ended
    /// the session with its own alert).
    pub fn alert(&self) -> Option<u8> {
        match self {
            RecordFailure::Record(e) => Some(e.alert()),
            RecordFailure::PeerAlert { .. } => None,
            RecordFailure::BadAlert(_) => Some(alert::DECODE_ERROR),
            // The peer's KeyUpdate was well formed; we end cleanly.
            RecordFailure::Handshake(HandoffError::CannotRekey(_)) => Some(alert::CLOSE_NOTIFY),
            RecordFailure::Handshake(HandoffError::Malformed(_)) => Some(alert::DECODE_ERROR),
            RecordFailure::Handshake(_) | RecordFailure::UnexpectedRecord(_) => {
                Some(alert::UNEXPECTED_MESSAGE)
            }
        }
    }
}

/// What [`RecordLayer::read`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Content<'a> {
    /// Application data (never empty).
    Data(&'a [u8]),
    /// The peer's close_notify: it sends nothing more.
    Closed,
}

/// The transmit key reached its record limit and cannot be renewed: send
/// nothing more but a close_notify, and close.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct LimitReached(HandoffError);

/// A TLS 1.3 session after the handshake, without rustls.
pub struct RecordLayer {
    rx: Keys,
    tx: Keys,
    /// When the transmit key is worn (half its confidentiality limit).
    tx_limit: u64,
    reader: RecordReader,
    /// Records without content received in a row.
    empty: EmptyRun,
    /// The held record was opened and handed out: clear it before reading
    /// on.
    held_used: bool,
    /// TLS records rustls wrote before the move (session tickets), to go
    /// out before anything sealed here.
    pending: Vec<u8>,
    /// An alert was sealed: nothing more is.
    ended: bool,
}

impl fmt::Debug for RecordLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordLayer")
            .field("rx_seq", &self.rx.seq)
            .field("tx_seq", &self.tx.seq)
            .field("held", &self.reader.held_len())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl RecordLayer {
    /// Takes a finished TLS 1.3 session out of rustls. TLS output rustls
    /// still holds (session tickets) is kept to go out first. Everything
    /// that can refuse without harm is checked first and hands `conn` back
    /// ([`Refused::Usable`]: the handshake is not over, rustls holds
    /// received plaintext, TLS 1.2); a failure after that is
    /// [`Refused::Dead`]. Call it only where the bytes given to rustls end
    /// on a record boundary.
    // The connection is handed back on a refusal, as `KernelTls::start`
    // does.
    #[allow(clippy::result_large_err)]
    pub fn start(mut conn: ServerConnection) -> Result<RecordLayer, Refused<ServerConnection>> {
        // Everything that can refuse is checked before TLS output is taken
        // out of rustls (which could not be given back): TLS 1.2 finishes
        // its handshake with a flight still to write.
        let negotiated = if conn.is_handshaking() {
            Err(Refusal::Handshaking)
        } else if !conn.wants_read() {
            Err(Refusal::PendingInput)
        } else {
            handoff::negotiated(&conn).and_then(|(version, _, limit)| {
                if version == Version::Tls13 {
                    Ok(limit)
                } else {
                    Err(Refusal::Unsupported {
                        version: conn.protocol_version(),
                        suite: conn.negotiated_cipher_suite().map(|s| s.suite()),
                    })
                }
            })
        };
        let tx_limit = match negotiated {
            Ok(limit) => limit,
            Err(reason) => return Err(Refused::Usable { conn, reason }),
        };
        let mut pending = Vec::new();
        while conn.wants_write() {
            if conn.write_tls(&mut pending).is_err() {
                break;
            }
        }
        let secrets = conn
            .dangerous_extract_secrets()
            .map_err(|e| Refused::Dead(HandoffError::Extract(e)))?;
        let mut layer = RecordLayer::from_secrets(secrets, tx_limit).map_err(Refused::Dead)?;
        layer.pending = pending;
        Ok(layer)
    }

    /// A session on exported keys (the receive keys are the peer's
    /// transmit keys).
    pub(crate) fn from_secrets(
        secrets: ExtractedSecrets,
        tx_limit: u64,
    ) -> Result<RecordLayer, HandoffError> {
        Ok(RecordLayer {
            rx: Keys::new(secrets.rx.0, &secrets.rx.1)?,
            tx: Keys::new(secrets.tx.0, &secrets.tx.1)?,
            tx_limit,
            reader: RecordReader::new(),
            empty: EmptyRun::default(),
            held_used: false,
            pending: Vec::new(),
            ended: false,
        })
    }

    /// Whether TLS bytes from before the move wait to go out.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Reads records from `input` (advanced past what was used) until one
    /// holds application data or an end; `Ok(None)` when `input` is used
    /// up (a partial record is held). `plain` must hold
    /// [`PLAINTEXT_BUFFER`] bytes; the data returned lies in it or in the
    /// held record, valid until the next call.
    pub fn read<'a>(
        &'a mut self,
        input: &mut &[u8],
        plain: &'a mut [u8],
    ) -> Result<Option<Content<'a>>, RecordFailure> {
        if std::mem::take(&mut self.held_used) {
            self.reader.clear_held();
        }
        // Where the content is (in `plain` or held), found without holding
        // a borrow across the loop.
        let (kind, len, held) = loop {
            match self.reader.next(input)? {
                Step::More => return Ok(None),
                Step::Whole(record) => {
                    let (header, body) = record.split_at(HEADER_LEN);
                    let (ciphertext, tag) = body.split_at(body.len() - TAG_LEN);
                    let out = &mut plain[..ciphertext.len()];
                    let nonce = self.rx.next_nonce();
                    self.rx
                        .key
                        .open_separate_gather(nonce, Aad::from(header), ciphertext, tag, out)
                        .map_err(|_| RecordError::BadTag)?;
                    let (ty, len) = tls13::inner_plaintext(out)?;
                    self.empty.note(len)?;
                    if let Some(kind) = content(ty, len)? {
                        break (kind, len, false);
                    }
                }
                Step::Held => {
                    let record = self.reader.held_mut();
                    let (header, body) = record.split_at_mut(HEADER_LEN);
                    let (ciphertext, tag) = body.split_at_mut(body.len() - TAG_LEN);
                    let nonce = self.rx.next_nonce();
                    self.rx
                        .key
                        .open_in_place_separate_tag(nonce, Aad::from(&*header), tag, ciphertext)
                        .map_err(|_| RecordError::BadTag)?;
                    let (ty, len) = tls13::inner_plaintext(ciphertext)?;
                    self.empty.note(len)?;
                    match content(ty, len)? {
                        Some(kind) => break (kind, len, true),
                        None => self.reader.clear_held(),
                    }
                }
            }
        };
        let data: &'a [u8] = if held {
            self.held_used = true;
            &self.reader.held_mut()[HEADER_LEN..HEADER_LEN + len]
        } else {
            &plain[..len]
        };
        kind.of(data).map(Some)
    }

    /// Gives back the memory of a held record once none is held.
    pub fn release(&mut self) {
        if std::mem::take(&mut self.held_used) {
            self.reader.clear_held();
        }
        self.reader.release();
    }

    /// Seals `parts` (one stream of plaintext) into `buf` as records of up
    /// to 16 KiB each. After an alert was sealed, or once the transmit
    /// key is worn out ([`LimitReached`]: send `buf`, then close), nothing
    /// more is sealed.
    pub fn seal(&mut self, buf: &mut Vec<u8>, parts: [&[u8]; 3]) -> Result<(), LimitReached> {
        if !self.pending.is_empty() {
            buf.extend_from_slice(&self.pending);
            self.pending = Vec::new();
        }
        if self.ended {
            return Ok(());
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let records = total.div_ceil(MAX_PLAINTEXT);
        let mut at = buf.len();
        // The records' room, zeroed once: the cipher writes into it
        // straight from the queue.
        buf.resize(at + total + records * RECORD_OVERHEAD, 0);
        let mut queue = Queue::new(parts);
        let mut left = total;
        while left > 0 {
            let len = left.min(MAX_PLAINTEXT);
            let record = &mut buf[at..at + len + RECORD_OVERHEAD];
            at += record.len();
            let (header, rest) = record.split_at_mut(HEADER_LEN);
            header.copy_from_slice(&tls13::header_for(len));
            let (body, type_and_tag) = rest.split_at_mut(len);
            let nonce = self.tx.next_nonce();
            let aad = Aad::from(&*header);
            let sealed = match queue.whole(len) {
                // The common case: the record's plaintext lies in one
                // part; it is encrypted where it lies, in one pass.
                Some(plain) => self.tx.key.seal_out_of_place_scatter(
                    nonce,
                    aad,
                    plain,
                    body,
                    &[content_type::APPLICATION_DATA],
                    type_and_tag,
                ),
                // A record that spans parts is gathered first.
                None => {
                    queue.gather(body);
                    self.tx.key.seal_in_place_scatter(
                        nonce,
                        aad,
                        body,
                        &[content_type::APPLICATION_DATA],
                        type_and_tag,
                    )
                }
            };
            sealed.expect("a record within the AEAD's size limit");
            left -= len;
        }
        debug_assert_eq!(at, buf.len());
        match handoff::past_record_limit(self.tx.seq, self.tx_limit, false) {
            Ok(_) => Ok(()),
            Err(e) => {
                self.seal_alert(buf, alert::CLOSE_NOTIFY);
                Err(LimitReached(e))
            }
        }
    }

    /// Seals an alert to go out before anything else still queued (which
    /// is then dropped: nothing is sealed after an alert).
    pub fn queue_alert(&mut self, description: u8) {
        let mut pending = std::mem::take(&mut self.pending);
        self.seal_alert(&mut pending, description);
        self.pending = pending;
    }

    /// Seals an alert (close_notify at level warning, anything else fatal)
    /// into `buf`; nothing is sealed after it.
    pub fn seal_alert(&mut self, buf: &mut Vec<u8>, description: u8) {
        if self.ended {
            return;
        }
        let level = if description == alert::CLOSE_NOTIFY {
            1
        } else {
            2
        };
        let start = buf.len();
        buf.extend_from_slice(&tls13::header_for(2));
        buf.extend_from_slice(&[level, description, content_type::ALERT]);
        self.seal_record(buf, start);
        self.ended = true;
    }

    /// Seals the record that starts at `start` (header, then plaintext with
    /// its content type) in place and appends its tag.
    fn seal_record(&mut self, buf: &mut Vec<u8>, start: usize) {
        let nonce = self.tx.next_nonce();
        let (header, body) = buf[start..].split_at_mut(HEADER_LEN);
        let tag = self
            .tx
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(&*header), body)
            .expect("a record within the AEAD's size limit");
        buf.extend_from_slice(tag.as_ref());
    }

    /// Whether an alert was sealed (the session is over for sending).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Seals one record of any content type and padding (tests play a
    /// misbehaving peer with it).
    #[cfg(test)]
    fn seal_raw(&mut self, buf: &mut Vec<u8>, ty: u8, content: &[u8], padding: usize) {
        let start = buf.len();
        // Any length, over the limits too.
        let len = (content.len() + 1 + padding + TAG_LEN) as u16;
        buf.extend_from_slice(&[content_type::APPLICATION_DATA, 3, 3]);
        buf.extend_from_slice(&len.to_be_bytes());
        buf.extend_from_slice(content);
        buf.push(ty);
        buf.extend(std::iter::repeat_n(0, padding));
        self.seal_record(buf, start);
    }
}

/// Bytes a record adds to its content: header, content type, tag.
const RECORD_OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;

/// The queued frames as one stream, taken a record at a time.
struct Queue<'a> {
    parts: [&'a [u8]; 3],
    /// The part being taken from (the ones before it are used up).
    at: usize,
}

impl<'a> Queue<'a> {
    fn new(parts: [&'a [u8]; 3]) -> Self {
        Queue { parts, at: 0 }
    }

    /// The next `len` bytes where they lie in one part, taken; `None`
    /// (nothing taken) when they span parts.
    fn whole(&mut self, len: usize) -> Option<&'a [u8]> {
        while self.at < self.parts.len() && self.parts[self.at].is_empty() {
            self.at += 1;
        }
        let part: &'a [u8] = self.parts.get(self.at)?;
        let (head, rest) = part.split_at_checked(len)?;
        self.parts[self.at] = rest;
        Some(head)
    }

    /// Fills `out` with the next bytes, across parts. The queue must hold
    /// that many.
    fn gather(&mut self, mut out: &mut [u8]) {
        while !out.is_empty() {
            let part: &'a [u8] = self.parts[self.at];
            let n = out.len().min(part.len());
            let (head, rest) = part.split_at(n);
            let (dst, more) = out.split_at_mut(n);
            dst.copy_from_slice(head);
            self.parts[self.at] = rest;
            out = more;
            if rest.is_empty() {
                self.at += 1;
            }
        }
    }
}

/// What an opened record's content type means here: `Ok(None)` for an
/// empty application data record (skipped).
fn content(ty: u8, len: usize) -> Result<Option<Kind>, RecordFailure> {
    match ty {
        content_type::APPLICATION_DATA if len == 0 => Ok(None),
        content_type::APPLICATION_DATA => Ok(Some(Kind::Data)),
        content_type::ALERT => Ok(Some(Kind::Alert)),
        content_type::HANDSHAKE => Ok(Some(Kind::Handshake)),
        other => Err(RecordFailure::UnexpectedRecord(other)),
    }
}

enum Kind {
    Data,
    Alert,
    Handshake,
}

impl Kind {
    fn of(self, data: &[u8]) -> Result<Content<'_>, RecordFailure> {
        match self {
            Kind::Data => Ok(Content::Data(data)),
            Kind::Alert => match *data {
                [_, alert::CLOSE_NOTIFY] => Ok(Content::Closed),
                [level, description] => Err(RecordFailure::PeerAlert {
                    level,
                    description: AlertDescription::from(description),
                }),
                _ => Err(RecordFailure::BadAlert(data.len())),
            },
            // A KeyUpdate parses, and then cannot be followed: the same
            // outcome as a kernel session started from a buffered rustls
            // connection.
            Kind::Handshake => Err(RecordFailure::Handshake(
                match handoff::parse_key_update(data) {
                    Ok(_) => HandoffError::CannotRekey(handoff::NO_KEY_SCHEDULE),
                    Err(e) => e,
                },
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_testkit::tls::{provider, Verifier};
    use rustls::crypto::CryptoProvider;
    use rustls::{ClientConfig, ClientConnection, SupportedCipherSuite};
    use std::io::{Read, Write};
    use std::sync::Arc;

    const SUITES: [rustls::CipherSuite; 3] = [
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ];

    fn suite(s: rustls::CipherSuite) -> SupportedCipherSuite {
        *provider()
            .cipher_suites
            .iter()
            .find(|c| c.suite() == s)
            .expect("the provider has the suite")
    }

    /// A rustls client offering only `s`, a rustls server, the handshake
    /// between them in memory, and the server moved to a record layer.
    /// The client also gets the session tickets the server wrote before
    /// the move (so the layer's first own record is not record 0). The
    /// last value is the client's own keys, for a test peer that breaks
    /// the rules.
    fn pair(s: rustls::CipherSuite) -> (ClientConnection, RecordLayer) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into()),
            )
            .unwrap();
        allow_own_records(&mut server);
        let only = Arc::new(CryptoProvider {
            cipher_suites: vec![suite(s)],
            ..(*provider()).clone()
        });
        let mut client = ClientConfig::builder_with_provider(only.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Verifier::accept_any(only)))
            .with_no_client_auth();
        client.enable_secret_extraction = true;
        let mut c =
            ClientConnection::new(Arc::new(client), "localhost".try_into().unwrap()).unwrap();
        let mut sv = ServerConnection::new(Arc::new(server)).unwrap();
        for _ in 0..10 {
            let mut wire = Vec::new();
            c.write_tls(&mut wire).unwrap();
            sv.read_tls(&mut &wire[..]).unwrap();
            sv.process_new_packets().unwrap();
            if !sv.is_handshaking() {
                break;
            }
            let mut wire = Vec::new();
            sv.write_tls(&mut wire).unwrap();
            c.read_tls(&mut &wire[..]).unwrap();
            c.process_new_packets().unwrap();
        }
        assert!(!sv.is_handshaking() && !c.is_handshaking());
        assert_eq!(sv.negotiated_cipher_suite().unwrap().suite(), s);
        let mut layer = RecordLayer::start(sv).expect("a finished TLS 1.3 session moves");
        assert!(layer.has_pending(), "session tickets wait to go out");
        let mut tickets = Vec::new();
        layer.seal(&mut tickets, [&[] as &[u8], &[], &[]]).unwrap();
        c.read_tls(&mut &tickets[..]).unwrap();
        c.process_new_packets().unwrap();
        (c, layer)
    }

    /// A record sealed by [`RecordLayer::seal_raw`]: content type, content,
    /// padding.
    type Raw<'a> = (u8, &'a [u8], usize);

    /// A client's keys as a record layer of its own: a peer that can send
    /// what rustls would not.
    fn peer_of(c: ClientConnection) -> RecordLayer {
        RecordLayer::from_secrets(c.dangerous_extract_secrets().unwrap(), u64::MAX).unwrap()
    }

    /// Everything `layer` makes of `wire`, read in pieces cut at `cuts`.
    fn read_cut(layer: &mut RecordLayer, wire: &[u8], cuts: &[usize]) -> Result<Vec<u8>, String> {
        let mut plain = vec![0; PLAINTEXT_BUFFER];
        let mut got = Vec::new();
        let mut at = 0;
        for &end in cuts.iter().chain([&wire.len()]) {
            let mut input = &wire[at..end];
            at = end;
            loop {
                match layer.read(&mut input, &mut plain) {
                    Ok(Some(Content::Data(d))) => got.extend_from_slice(d),
                    Ok(Some(Content::Closed)) => return Err("closed".into()),
                    Ok(None) => break,
                    Err(e) => return Err(format!("{e} / alert {:?}", e.alert())),
                }
            }
        }
        Ok(got)
    }

    /// What a rustls client reads from `wire`, or its error.
    fn client_reads(c: &mut ClientConnection, wire: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let mut input = wire;
        let mut got = Vec::new();
        while !input.is_empty() {
            c.read_tls(&mut input).unwrap();
            c.process_new_packets()?;
            match c.reader().read_to_end(&mut got) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        Ok(got)
    }

    #[test]
    fn rustls_records_open_here_and_ours_open_in_rustls_for_every_suite() {
        for s in SUITES {
            let (mut c, mut layer) = pair(s);
            // Client to server: records split at every byte position (each
            // a new record, so sequence numbers run well past 1).
            let msg = b"derp frames from the client";
            let record_len = HEADER_LEN + msg.len() + 1 + TAG_LEN;
            for cut in 0..=record_len {
                let mut wire = Vec::new();
                c.writer().write_all(msg).unwrap();
                c.write_tls(&mut wire).unwrap();
                assert_eq!(
                    read_cut(&mut layer, &wire, &[cut]).unwrap(),
                    msg,
                    "{s:?} cut {cut}"
                );
            }
            // Several records in one read, the last cut a byte at a time.
            let big: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
            let mut wire = Vec::new();
            c.writer().write_all(&big).unwrap();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            let cuts: Vec<usize> = (wire.len() - 300..wire.len()).collect();
            assert_eq!(read_cut(&mut layer, &wire, &cuts).unwrap(), big, "{s:?}");

            // Server to client: parts joined into full records.
            for round in 0..3 {
                let parts: [&[u8]; 3] = [b"ctrl", &big[..20_000], &big[20_000..]];
                let mut buf = Vec::new();
                layer.seal(&mut buf, parts).unwrap();
                assert_eq!(buf.len(), 4 + 40_000 + 3 * (HEADER_LEN + 1 + TAG_LEN));
                let got = client_reads(&mut c, &buf).unwrap();
                assert_eq!(got, parts.concat(), "{s:?} round {round}");
            }
        }
    }

    /// A record's plaintext that lies in one part is handed out where it
    /// lies (the cipher reads it there: no copy); one that spans parts is
    /// not, and is gathered in order.
    #[test]
    fn the_queue_lends_records_within_a_part_and_gathers_the_rest() {
        let (ctrl, data) = (b"ctrl".to_vec(), vec![9u8; 100]);
        let mut queue = Queue::new([&ctrl, &[], &data]);
        let head = queue.whole(3).unwrap();
        assert_eq!(head.as_ptr(), ctrl.as_ptr());
        assert!(queue.whole(2).is_none(), "spans ctrl and data");
        let mut out = [0; 2];
        queue.gather(&mut out);
        assert_eq!(out, [b'l', 9]);
        let rest = queue.whole(99).unwrap();
        assert_eq!(rest.as_ptr(), data[1..].as_ptr());
        assert!(queue.whole(1).is_none(), "used up");
    }

    /// Records sealed from where the frames lie and records gathered
    /// across the queue's parts, in any mix (parts empty, shorter than a
    /// record, ending on a record boundary or one byte either side), are
    /// the same stream to a rustls client, and take exactly their room.
    #[test]
    fn records_within_a_part_and_across_parts_open_in_rustls() {
        let stream: Vec<u8> = (0..3 * MAX_PLAINTEXT as u32 + 7)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let sizes = [0, 1, 5, MAX_PLAINTEXT - 1, MAX_PLAINTEXT, MAX_PLAINTEXT + 1];
        for s in SUITES {
            let (mut c, mut layer) = pair(s);
            let mut buf = Vec::new();
            let mut sent = Vec::new();
            for a in sizes {
                for b in sizes {
                    let c_len = (a + b) % 3 * MAX_PLAINTEXT / 2 + 3;
                    let parts: [&[u8]; 3] = [
                        &stream[..a],
                        &stream[a..a + b],
                        &stream[a + b..a + b + c_len],
                    ];
                    let total = a + b + c_len;
                    let before = buf.len();
                    layer.seal(&mut buf, parts).unwrap();
                    assert_eq!(
                        buf.len() - before,
                        total + total.div_ceil(MAX_PLAINTEXT) * RECORD_OVERHEAD,
                        "{s:?} {a}+{b}+{c_len}"
                    );
                    sent.extend_from_slice(&stream[..total]);
                }
            }
            assert_eq!(client_reads(&mut c, &buf).unwrap(), sent, "{s:?}");
        }
    }

    #[test]
    fn bad_records_end_with_the_right_alert() {
        for s in SUITES {
            // A flipped bit: bad_record_mac, and the rustls client reads
            // our alert as that.
            let (mut c, mut layer) = pair(s);
            let mut wire = Vec::new();
            c.writer().write_all(b"hello").unwrap();
            c.write_tls(&mut wire).unwrap();
            wire[HEADER_LEN + 1] ^= 1;
            let err = read_cut(&mut layer, &wire, &[]).unwrap_err();
            assert!(
                err.contains("failed authentication / alert Some(20)"),
                "{err}"
            );
            layer.queue_alert(alert::BAD_RECORD_MAC);
            let mut buf = Vec::new();
            layer
                .seal(&mut buf, [b"dropped after the alert" as &[u8], &[], &[]])
                .unwrap();
            assert_eq!(
                client_reads(&mut c, &buf).unwrap_err(),
                rustls::Error::AlertReceived(AlertDescription::BadRecordMac)
            );

            // Oversize: record_overflow, from the header alone.
            let (_, mut layer) = pair(s);
            let err = read_cut(&mut layer, &[23, 3, 3, 0x41, 0x01], &[]).unwrap_err();
            assert!(err.contains("alert Some(22)"), "{err}");

            // Records a rustls client would not send, from its own keys:
            // (content type, content, padding) of each, what the last
            // one ends with. Padding and an empty data record are fine.
            let cases: [(&[Raw], &str); 4] = [
                (
                    &[(23, b"padded", 100), (23, b"", 0), (99, b"?", 0)],
                    "content type 99 after the handshake / alert Some(10)",
                ),
                (
                    &[(content_type::HANDSHAKE, &[4, 0, 0, 0], 0)],
                    "type 4 after the handshake / alert Some(10)",
                ),
                (&[(0, b"", 20)], "all padding) / alert Some(10)"),
                (
                    &[(content_type::ALERT, &[2, 40], 0)],
                    "HandshakeFailure (level 2) / alert None",
                ),
            ];
            for (records, expected) in cases {
                let (c, mut layer) = pair(s);
                let mut peer = peer_of(c);
                let mut wire = Vec::new();
                for &(ty, content, padding) in records {
                    peer.seal_raw(&mut wire, ty, content, padding);
                }
                let err = read_cut(&mut layer, &wire, &[7]).unwrap_err();
                assert!(err.contains(expected), "{s:?}: {err}");
            }
        }
    }

    /// RFC 8446 §5.4: the whole inner plaintext (content, type and
    /// padding) is at most 2^14 + 1 bytes; past it, record_overflow.
    #[test]
    fn padding_counts_against_the_plaintext_limit() {
        let most = MAX_PLAINTEXT + 1;
        for (content, padding, ok) in [
            (10, most - 11, true),
            (10, most - 10, false),
            (0, most - 1, true),
            (0, most, false),
            (MAX_PLAINTEXT, 0, true),
            (MAX_PLAINTEXT, 1, false),
        ] {
            let (c, mut layer) = pair(SUITES[0]);
            let mut peer = peer_of(c);
            let mut wire = Vec::new();
            peer.seal_raw(&mut wire, 23, &vec![7; content], padding);
            peer.seal_raw(&mut wire, 23, b"after", 0);
            let got = read_cut(&mut layer, &wire, &[9]);
            if ok {
                assert_eq!(got.unwrap().len(), content + 5, "{content}+{padding}");
            } else {
                let err = got.unwrap_err();
                assert!(
                    err.ends_with("alert Some(22)"),
                    "{content}+{padding}: {err}"
                );
            }
        }
    }

    /// As rustls: at most 32 empty records in a row (no content, with or
    /// without padding); the next is unexpected_message. Data in between
    /// starts the count again, across reads too.
    #[test]
    fn a_run_of_empty_records_is_bounded() {
        let empty = |peer: &mut RecordLayer, wire: &mut Vec<u8>, n: usize| {
            for i in 0..n {
                peer.seal_raw(wire, 23, b"", i % 3);
            }
        };
        let (c, mut layer) = pair(SUITES[2]);
        let mut peer = peer_of(c);
        let mut wire = Vec::new();
        empty(&mut peer, &mut wire, tls13::MAX_EMPTY_RUN);
        peer.seal_raw(&mut wire, 23, b"x", 0);
        empty(&mut peer, &mut wire, tls13::MAX_EMPTY_RUN);
        peer.seal_raw(&mut wire, 23, b"y", 0);
        let cuts: Vec<usize> = (1..wire.len()).step_by(97).collect();
        assert_eq!(read_cut(&mut layer, &wire, &cuts).unwrap(), b"xy");

        let mut wire = Vec::new();
        empty(&mut peer, &mut wire, tls13::MAX_EMPTY_RUN + 1);
        peer.seal_raw(&mut wire, 23, b"never", 0);
        let err = read_cut(&mut layer, &wire, &[40]).unwrap_err();
        assert!(
            err.contains("empty TLS records in a row") && err.ends_with("alert Some(10)"),
            "{err}"
        );
    }

    #[test]
    fn close_notify_ends_and_a_key_update_closes_cleanly() {
        let (mut c, mut layer) = pair(SUITES[0]);
        c.send_close_notify();
        let mut wire = Vec::new();
        c.write_tls(&mut wire).unwrap();
        assert_eq!(read_cut(&mut layer, &wire, &[3]).unwrap_err(), "closed");

        let (mut c, mut layer) = pair(SUITES[1]);
        c.refresh_traffic_keys().unwrap();
        c.writer().write_all(b"under new keys").unwrap();
        let mut wire = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut wire).unwrap();
        }
        let err = read_cut(&mut layer, &wire, &[]).unwrap_err();
        assert!(
            err.contains("cannot change TLS keys") && err.ends_with("alert Some(0)"),
            "{err}"
        );
        layer.queue_alert(alert::CLOSE_NOTIFY);
        let mut buf = Vec::new();
        layer.seal(&mut buf, [&[] as &[u8], &[], &[]]).unwrap();
        client_reads(&mut c, &buf).unwrap();
        assert!(c.process_new_packets().unwrap().peer_has_closed());
    }

    #[test]
    fn a_worn_key_ends_with_close_notify() {
        let (mut c, mut layer) = pair(SUITES[0]);
        let mut buf = Vec::new();
        layer.tx_limit = layer.tx.seq + 2;
        layer.seal(&mut buf, [b"one" as &[u8], &[], &[]]).unwrap();
        assert!(layer.seal(&mut buf, [b"two" as &[u8], &[], &[]]).is_err());
        assert!(layer.ended());
        layer.seal(&mut buf, [b"never" as &[u8], &[], &[]]).unwrap();
        assert_eq!(client_reads(&mut c, &buf).unwrap(), b"onetwo");
        assert!(c.process_new_packets().unwrap().peer_has_closed());
    }
}
