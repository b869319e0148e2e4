//! Kernel TLS hand-off: after the rustls handshake, the record layer of a
//! connection moves into the kernel, and the socket carries plaintext.
//!
//! rustls does the handshake as always. Once it is over and rustls holds
//! nothing in flight, [`KernelTls::start`] takes the rustls connection,
//! extracts the traffic keys and sequence numbers, and installs them on the
//! socket (`TCP_ULP "tls"`, then `TLS_TX` and `TLS_RX`; see
//! [`ferry_sys::ktls`]). From then on the kernel encrypts every write and
//! decrypts every read: **application data crosses the socket as plaintext
//! in both directions**, and the DERP code above it is the same as without
//! TLS. What the kernel does not handle comes back as typed records (the
//! driver's `Completion::Record`): alerts, and TLS 1.3 KeyUpdate messages,
//! which [`KernelTls::on_record`] answers with new keys from rustls's
//! key schedule. Where the kernel cannot take the session (no TLS ULP, a
//! cipher it lacks) nothing is consumed: [`Refused::Usable`] hands the
//! rustls connection back and it goes on in userspace.
//!
//! # Calling sequence for the shard
//!
//! 1. Build the `ServerConfig` with [`allow_kernel_tls`] (secret extraction
//!    on, no TLS 1.3 session tickets). At start-up, [`KtlsMode::resolve`]
//!    says whether to try at all (and fails `--ktls on` on a kernel without
//!    the ULP).
//! 2. Hand a connection over only when **all** of these hold, otherwise try
//!    again later (after the next receive or send completion):
//!    - the handshake is done and rustls has nothing left to say:
//!      [`Handoff::ready`] checks `!is_handshaking()`, `!wants_write()` and
//!      that rustls holds no received plaintext or close_notify (drain
//!      `reader()` until `WouldBlock` first);
//!    - every TLS byte rustls produced is **on the wire**: no send is in
//!      flight on the driver (its `Sent` completion came back). Bytes
//!      written after `TLS_TX` is set are encrypted again by the kernel;
//!    - every byte read from the socket so far went into rustls and ended
//!      on a TLS record boundary: nothing stashed, and a [`RecordBoundary`](super::handoff::RecordBoundary)
//!      fed with what was given to `read_tls` reports
//!      [`at_boundary`](super::handoff::RecordBoundary::at_boundary). Bytes still in the socket are
//!      fine, the kernel decrypts them; a partial record already read into
//!      userspace cannot be given back, and the kernel would fail on its
//!      tail (`EBADMSG`). A peer that keeps sending may never leave a read
//!      on a boundary (reads end wherever its writes or the read size
//!      fall), so the shard reads the rest of that record itself, and not
//!      a byte more ([`bytes_to_next`](super::handoff::RecordBoundary::bytes_to_next)), between turns
//!      and only on a back end that reads kTLS records (step 3 first);
//!    - no receive is pending in the back end (epoll: between turns;
//!      io_uring: receive cancelled and its completion seen).
//! 3. `driver.set_ktls_rx(slot)` first: a back end that cannot read typed
//!    records says `Unsupported`, and the connection stays in userspace. (On
//!    epoll, the mode is harmless on a plain socket.)
//! 4. [`KernelTls::start`]`(conn, driver.fd(slot))`:
//!    - `Ok(session)`: rustls is gone; keep the session with the
//!      connection. Received bytes are plaintext; sends are plaintext.
//!    - `Err(Refused::Usable { conn, reason })`: keep using `conn` in
//!      userspace; [`Refusal::is_transient`] says whether a later
//!      attempt may succeed. Count `reason.label()`.
//!    - `Err(Refused::Dead(e))`: close the socket; nothing can be sent.
//! 5. `Completion::Record { record_type, data }`: copy the (small) record
//!    and call [`KernelTls::on_record`] **after the turn and before the
//!    next one**: after a KeyUpdate the kernel decrypts nothing until the
//!    new keys are set (a read fails with `EKEYEXPIRED`). `Ok(Closed)` is
//!    the peer's close_notify (an orderly end, like EOF); `Ok(KeyUpdated)`
//!    needs nothing more; `Err(e)`: log `e`, call
//!    [`KernelTls::send_close_notify`] (it knows whether the keys still
//!    agree with the peer's) and close.
//! 6. Around every send: first, if [`KernelTls::key_update_due`], call
//!    [`KernelTls::rekey_tx`] (`Ok(false)`: the send buffer is full, hold
//!    the send and try again later); after handing the buffer to the
//!    driver, [`KernelTls::note_sent`] (it counts records against the
//!    cipher's confidentiality limit and schedules a key update, or, where
//!    keys cannot be renewed, returns an error: close cleanly).
//! 7. A connection that moves to another shard keeps its kernel state with
//!    the socket; the new shard calls `set_ktls_rx` after attaching it.
//!
//! # Buffered or unbuffered rustls
//!
//! Both connection types can be handed over ([`Handoff`]). Only the
//! unbuffered `UnbufferedServerConnection` gives up a rustls
//! `KernelConnection`, which derives the next keys for a KeyUpdate; the
//! buffered `ServerConnection` (what the shard uses today) only exports the
//! current keys. A session started from it cannot rekey: a peer's KeyUpdate
//! ends the connection cleanly (close_notify, then close), and so does
//! reaching an AES-GCM key's record limit. Go's `crypto/tls`, which
//! Tailscale clients use, answers key updates but, as far as its source
//! shows, never starts one; rustls clients start one near a key's limit.

use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::str::FromStr;

use ferry_sys::ktls::{self as sys, record_type, Cipher, CryptoInfo, Direction, Version};
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{AlertDescription, ConnectionTrafficSecrets, ServerConfig};

use super::handoff::{
    negotiated, parse_key_update, past_record_limit, Handoff, HandoffError, Refusal, Refused,
    KEY_UPDATE, NO_KEY_SCHEDULE,
};

/// `--ktls`: whether connections move into kernel TLS after the handshake.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KtlsMode {
    /// Use kTLS where the kernel supports it, userspace TLS elsewhere.
    #[default]
    Auto,
    /// Require the kernel's TLS ULP at start-up (a connection whose cipher
    /// the kernel refuses still falls back, and is counted).
    On,
    /// Always userspace TLS.
    Off,
}

impl KtlsMode {
    /// Decides at start-up: `Ok(true)` to try kTLS on every connection,
    /// `Ok(false)` to stay in userspace (`Off`, or `Auto` on a kernel
    /// without the ULP: [`ferry_sys::ktls::tls_ulp_available`] says why),
    /// `Err(reason)` for `On` on a kernel that cannot.
    pub fn resolve(self) -> Result<bool, &'static str> {
        match self {
            KtlsMode::Off => Ok(false),
            KtlsMode::Auto => Ok(sys::tls_ulp_available().is_ok()),
            KtlsMode::On => sys::tls_ulp_available().map(|()| true),
        }
    }
}

impl FromStr for KtlsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(KtlsMode::Auto),
            "on" => Ok(KtlsMode::On),
            "off" => Ok(KtlsMode::Off),
            other => Err(format!(
                "invalid kTLS mode {other:?}: expected auto, on or off"
            )),
        }
    }
}

impl fmt::Display for KtlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KtlsMode::Auto => "auto",
            KtlsMode::On => "on",
            KtlsMode::Off => "off",
        })
    }
}

/// Prepares a server configuration for kTLS hand-offs: rustls then lets
/// the traffic secrets be extracted, and sends no TLS 1.3 session tickets
/// (tickets queued after the handshake would have to be flushed first, and
/// a session handed to the kernel cannot issue more).
pub fn allow_kernel_tls(config: &mut ServerConfig) {
    config.enable_secret_extraction = true;
    config.send_tls13_tickets = 0;
}

/// The socket operations a hand-off needs, so that the sequence can be
/// tested without a kernel that has kTLS. Implemented for [`BorrowedFd`]
/// with [`ferry_sys::ktls`].
pub trait KernelSocket {
    /// Whether the kernel takes keys of this version and cipher.
    fn supports(&self, version: Version, cipher: Cipher) -> Result<(), &'static str>;
    /// Whether the kernel can replace TLS 1.3 keys (KeyUpdate).
    fn can_rekey(&self) -> Result<(), &'static str>;
    /// Attaches the TLS ULP (the socket stays plain TCP until keys are set).
    fn enable_ulp(&mut self) -> io::Result<()>;
    /// Installs (or replaces) the keys of one direction.
    fn set_crypto_info(&mut self, dir: Direction, info: &CryptoInfo) -> io::Result<()>;
    /// Sends one record of the given content type.
    fn send_record(&mut self, record_type: u8, data: &[u8]) -> io::Result<usize>;
}

impl KernelSocket for BorrowedFd<'_> {
    fn supports(&self, version: Version, cipher: Cipher) -> Result<(), &'static str> {
        sys::kernel_supports(version, cipher)
    }

    fn can_rekey(&self) -> Result<(), &'static str> {
        sys::kernel_can_rekey()
    }

    fn enable_ulp(&mut self) -> io::Result<()> {
        sys::enable_tls_ulp(*self)
    }

    fn set_crypto_info(&mut self, dir: Direction, info: &CryptoInfo) -> io::Result<()> {
        sys::set_crypto_info(*self, dir, info)
    }

    fn send_record(&mut self, record_type: u8, data: &[u8]) -> io::Result<usize> {
        sys::send_record(*self, record_type, data)
    }
}

impl<T: KernelSocket + ?Sized> KernelSocket for &mut T {
    fn supports(&self, version: Version, cipher: Cipher) -> Result<(), &'static str> {
        (**self).supports(version, cipher)
    }

    fn can_rekey(&self) -> Result<(), &'static str> {
        (**self).can_rekey()
    }

    fn enable_ulp(&mut self) -> io::Result<()> {
        (**self).enable_ulp()
    }

    fn set_crypto_info(&mut self, dir: Direction, info: &CryptoInfo) -> io::Result<()> {
        (**self).set_crypto_info(dir, info)
    }

    fn send_record(&mut self, record_type: u8, data: &[u8]) -> io::Result<usize> {
        (**self).send_record(record_type, data)
    }
}

/// What [`KernelTls::on_record`] made of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordOutcome {
    /// The peer's close_notify: it sends nothing more (an orderly end).
    Closed,
    /// The peer's KeyUpdate was applied; if the peer asked for ours too,
    /// it was sent, or [`KernelTls::key_update_due`] says it still is.
    KeyUpdated,
}

/// Largest TLS plaintext record.
const MAX_RECORD: usize = 16 * 1024;
/// Our KeyUpdate: type, 24-bit length 1, `update_not_requested`.
const KEY_UPDATE_NOT_REQUESTED: [u8; 5] = [KEY_UPDATE, 0, 0, 1, 0];
/// Alert description close_notify.
const CLOSE_NOTIFY: u8 = 0;

/// A connection whose TLS record layer runs in the kernel.
pub struct KernelTls {
    /// rustls's key schedule; `None` when started from a buffered
    /// connection.
    kernel: Option<KernelConnection<ServerConnectionData>>,
    version: Version,
    cipher: Cipher,
    /// Estimated records sent under the current transmit key (an upper
    /// bound).
    tx_records: u64,
    /// When the transmit key must be renewed.
    tx_limit: u64,
    /// Our KeyUpdate is owed (the peer asked, or the key is worn).
    key_update_due: bool,
    /// Our transmit keys are the ones the peer expects (false once a
    /// KeyUpdate went out and the new keys could not be installed).
    tx_in_step: bool,
    /// Control records that came up in a turn, acted on after it
    /// ([`KernelTls::hold_record`]).
    held: Vec<(u8, Vec<u8>)>,
}

impl fmt::Debug for KernelTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelTls")
            .field("version", &self.version)
            .field("cipher", &self.cipher)
            .field("can_rekey", &self.kernel.is_some())
            .field("tx_records", &self.tx_records)
            .field("key_update_due", &self.key_update_due)
            .finish_non_exhaustive()
    }
}

impl KernelTls {
    /// Moves a finished rustls session into the kernel on `sock` (the
    /// connection's socket, e.g. `driver.fd(slot)`).
    ///
    /// Everything that can refuse without harm is checked first and hands
    /// `conn` back ([`Refused::Usable`]): [`Handoff::ready`], a version and
    /// cipher kTLS covers, the kernel's support, attaching the ULP. Only
    /// then is rustls consumed; a failure after that is [`Refused::Dead`].
    /// See the module doc for when it is safe to call.
    pub fn start<C: Handoff, S: KernelSocket>(
        conn: C,
        mut sock: S,
    ) -> Result<KernelTls, Refused<C>> {
        let (version, cipher, limit) = match conn.ready().and_then(|()| negotiated(conn.common())) {
            Ok(v) => v,
            Err(reason) => return Err(Refused::Usable { conn, reason }),
        };
        if let Err(why) = sock.supports(version, cipher) {
            return Err(Refused::Usable {
                conn,
                reason: Refusal::Kernel(why),
            });
        }
        if let Err(e) = sock.enable_ulp() {
            return Err(Refused::Usable {
                conn,
                reason: Refusal::Ulp(e),
            });
        }

        // rustls is consumed from here on.
        let (secrets, kernel) = conn
            .into_kernel()
            .map_err(|e| Refused::Dead(HandoffError::Extract(e)))?;
        let tx_seq = secrets.tx.0;
        let tx = crypto_info(version, secrets.tx.0, &secrets.tx.1).map_err(Refused::Dead)?;
        let rx = crypto_info(version, secrets.rx.0, &secrets.rx.1).map_err(Refused::Dead)?;
        drop(secrets);
        sock.set_crypto_info(Direction::Tx, &tx)
            .map_err(|source| socket_error("setting TLS_TX", source))
            .map_err(Refused::Dead)?;
        sock.set_crypto_info(Direction::Rx, &rx)
            .map_err(|source| socket_error("setting TLS_RX", source))
            .map_err(Refused::Dead)?;
        Ok(KernelTls {
            kernel,
            version,
            cipher,
            tx_records: tx_seq,
            tx_limit: limit,
            key_update_due: false,
            tx_in_step: true,
            held: Vec::new(),
        })
    }

    /// Keeps a control record that came up during a turn (copied: the
    /// driver lends it only for the turn) for [`KernelTls::on_record`]
    /// after it, when the socket is at hand; `true` for the first one held
    /// (the caller then notes the connection).
    pub fn hold_record(&mut self, record_type: u8, data: &[u8]) -> bool {
        self.held.push((record_type, data.to_vec()));
        self.held.len() == 1
    }

    /// The records held since the last call, in arrival order.
    pub fn take_held(&mut self) -> Vec<(u8, Vec<u8>)> {
        std::mem::take(&mut self.held)
    }

    /// The session's protocol version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The session's cipher.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// Whether this session can derive new keys (TLS 1.3, started from an
    /// unbuffered connection). The kernel must also allow it
    /// ([`KernelSocket::can_rekey`]).
    pub fn can_rekey(&self) -> bool {
        self.kernel.is_some() && self.version == Version::Tls13
    }

    /// Acts on a record the kernel did not pass through as application
    /// data (`Completion::Record`): an alert or a post-handshake message.
    /// Call it before the socket is read again.
    pub fn on_record<S: KernelSocket>(
        &mut self,
        mut sock: S,
        record_type: u8,
        data: &[u8],
    ) -> Result<RecordOutcome, HandoffError> {
        match record_type {
            record_type::ALERT => match *data {
                [_, CLOSE_NOTIFY] => Ok(RecordOutcome::Closed),
                [level, description] => Err(HandoffError::Alert {
                    level,
                    description: AlertDescription::from(description),
                }),
                _ => Err(HandoffError::Malformed("alert record (not two bytes)")),
            },
            record_type::HANDSHAKE if self.version == Version::Tls13 => {
                let update_requested = parse_key_update(data)?;
                self.rekey_rx(&mut sock)?;
                if update_requested {
                    self.key_update_due = true;
                    self.rekey_tx(&mut sock)?;
                }
                Ok(RecordOutcome::KeyUpdated)
            }
            record_type::HANDSHAKE => Err(HandoffError::UnexpectedHandshake {
                msg_type: data.first().copied().unwrap_or(0),
            }),
            other => Err(HandoffError::UnexpectedRecord { record_type: other }),
        }
    }

    /// Installs the peer's next keys after its KeyUpdate.
    fn rekey_rx<S: KernelSocket>(&mut self, sock: &mut S) -> Result<(), HandoffError> {
        let kernel = self
            .kernel
            .as_mut()
            .ok_or(HandoffError::CannotRekey(NO_KEY_SCHEDULE))?;
        sock.can_rekey().map_err(HandoffError::CannotRekey)?;
        let (seq, secrets) = kernel
            .update_rx_secret()
            .map_err(HandoffError::KeySchedule)?;
        let info = crypto_info(self.version, seq, &secrets)?;
        sock.set_crypto_info(Direction::Rx, &info)
            .map_err(|source| socket_error("replacing the TLS_RX keys", source))
    }

    /// Whether our KeyUpdate is owed: call [`KernelTls::rekey_tx`] before
    /// the next send.
    pub fn key_update_due(&self) -> bool {
        self.key_update_due
    }

    /// Sends our KeyUpdate and switches the kernel to our next transmit
    /// keys. `Ok(false)` when the socket's send buffer is full: nothing
    /// changed, and the update is still due.
    pub fn rekey_tx<S: KernelSocket>(&mut self, mut sock: S) -> Result<bool, HandoffError> {
        if !self.tx_in_step {
            return Err(HandoffError::CannotRekey(
                "the transmit keys are already out of step with the peer",
            ));
        }
        if self.version != Version::Tls13 {
            return Err(HandoffError::CannotRekey("TLS 1.2 has no KeyUpdate"));
        }
        let Some(kernel) = self.kernel.as_mut() else {
            return Err(HandoffError::CannotRekey(NO_KEY_SCHEDULE));
        };
        sock.can_rekey().map_err(HandoffError::CannotRekey)?;
        match sock.send_record(record_type::HANDSHAKE, &KEY_UPDATE_NOT_REQUESTED) {
            Ok(n) if n == KEY_UPDATE_NOT_REQUESTED.len() => {}
            Ok(_) => {
                // Part of a record went out: the stream is corrupt.
                self.tx_in_step = false;
                return Err(socket_error(
                    "sending our KeyUpdate",
                    io::ErrorKind::WriteZero.into(),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(source) => return Err(socket_error("sending our KeyUpdate", source)),
        }
        // The peer now expects the next keys; until they are installed,
        // anything we send is garbage to it.
        self.tx_in_step = false;
        let (seq, secrets) = kernel
            .update_tx_secret()
            .map_err(HandoffError::KeySchedule)?;
        let info = crypto_info(self.version, seq, &secrets)?;
        sock.set_crypto_info(Direction::Tx, &info)
            .map_err(|source| socket_error("replacing the TLS_TX keys", source))?;
        self.tx_in_step = true;
        self.tx_records = seq;
        self.key_update_due = false;
        Ok(true)
    }

    /// Counts a send of `len` plaintext bytes against the transmit key's
    /// confidentiality limit (2^24 records for AES-GCM; the count is an
    /// upper bound and the key is renewed at half the limit). Past that,
    /// a key update becomes due ([`KernelTls::key_update_due`]); where
    /// keys cannot be renewed, this returns an error: close the
    /// connection cleanly.
    pub fn note_sent(&mut self, len: usize) -> Result<(), HandoffError> {
        // Each write the kernel takes ends its record, and a send may be
        // written in several pieces: one extra record per send covers the
        // usual split.
        let records = len.div_ceil(MAX_RECORD) as u64 + 1;
        self.tx_records = self.tx_records.saturating_add(records);
        if past_record_limit(self.tx_records, self.tx_limit, self.can_rekey())? {
            self.key_update_due = true;
        }
        Ok(())
    }

    /// Sends a close_notify alert, if our keys still agree with the peer's
    /// (otherwise there is no way to say goodbye, and this does nothing).
    pub fn send_close_notify<S: KernelSocket>(&mut self, mut sock: S) -> io::Result<()> {
        if !self.tx_in_step {
            return Ok(());
        }
        // Level warning, as rustls and Go send it.
        sock.send_record(record_type::ALERT, &[1, CLOSE_NOTIFY])
            .map(|_| ())
    }
}

fn socket_error(what: &'static str, source: io::Error) -> HandoffError {
    HandoffError::Socket { what, source }
}

/// The kernel's view of one direction's keys, from what rustls exported:
/// `seq` is the sequence number of the next record in that direction.
pub fn crypto_info(
    version: Version,
    seq: u64,
    secrets: &ConnectionTrafficSecrets,
) -> Result<CryptoInfo, HandoffError> {
    let (cipher, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Cipher::Aes128Gcm, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Cipher::Aes256Gcm, key, iv),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            (Cipher::Chacha20Poly1305, key, iv)
        }
        _ => {
            return Err(HandoffError::Secrets(
                "keys for an AEAD other than AES-GCM or ChaCha20-Poly1305",
            ))
        }
    };
    let iv: &[u8; sys::NONCE_LEN] = iv
        .as_ref()
        .try_into()
        .map_err(|_| HandoffError::Secrets("an IV that is not 12 bytes"))?;
    CryptoInfo::new(version, cipher, key.as_ref(), iv, seq)
        .map_err(|_| HandoffError::Secrets("a key of the wrong length for its cipher"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for (text, mode) in [
            ("auto", KtlsMode::Auto),
            ("on", KtlsMode::On),
            ("off", KtlsMode::Off),
        ] {
            assert_eq!(text.parse::<KtlsMode>().unwrap(), mode);
            assert_eq!(mode.to_string(), text);
        }
        let err = "yes".parse::<KtlsMode>().unwrap_err();
        assert_eq!(err, "invalid kTLS mode \"yes\": expected auto, on or off");
        assert_eq!(KtlsMode::default(), KtlsMode::Auto);
    }

    #[test]
    fn modes_resolve_against_this_kernel() {
        assert_eq!(KtlsMode::Off.resolve(), Ok(false));
        match sys::tls_ulp_available() {
            Ok(()) => {
                assert_eq!(KtlsMode::Auto.resolve(), Ok(true));
                assert_eq!(KtlsMode::On.resolve(), Ok(true));
            }
            Err(reason) => {
                assert_eq!(KtlsMode::Auto.resolve(), Ok(false));
                assert_eq!(KtlsMode::On.resolve(), Err(reason));
            }
        }
    }

    #[test]
    fn sessions_can_move_between_shards() {
        fn is_send<T: Send>() {}
        is_send::<KernelTls>();
    }
}
