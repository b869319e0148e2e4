//! Kernel TLS hand-off: after the rustls handshake, the record layer of a
//! connection moves into the kernel, and the socket carries plaintext.
//!
//! rustls does the handshake as always. Once it is over and rustls holds
//! nothing in flight, [`KtlsSession::start`] takes the rustls connection,
//! extracts the traffic keys and sequence numbers, and installs them on the
//! socket (`TCP_ULP "tls"`, then `TLS_TX` and `TLS_RX`; see
//! [`ferry_sys::ktls`]). From then on the kernel encrypts every write and
//! decrypts every read: **application data crosses the socket as plaintext
//! in both directions**, and the DERP code above it is the same as without
//! TLS. What the kernel does not handle comes back as typed records (the
//! driver's `Completion::Record`): alerts, and TLS 1.3 KeyUpdate messages,
//! which [`KtlsSession::on_record`] answers with new keys from rustls's
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
//!      on a TLS record boundary: nothing stashed, and a [`RecordBoundary`]
//!      fed with what was given to `read_tls` reports
//!      [`RecordBoundary::at_boundary`]. Bytes still in the socket are
//!      fine, the kernel decrypts them; a partial record already read into
//!      userspace cannot be given back, and the kernel would fail on its
//!      tail (`EBADMSG`). A peer that keeps sending may never leave a read
//!      on a boundary (reads end wherever its writes or the read size
//!      fall), so the shard reads the rest of that record itself, and not
//!      a byte more ([`RecordBoundary::bytes_to_next`]), between turns
//!      and only on a back end that reads kTLS records (step 3 first);
//!    - no receive is pending in the back end (epoll: between turns;
//!      io_uring: receive cancelled and its completion seen).
//! 3. `driver.set_ktls_rx(slot)` first: a back end that cannot read typed
//!    records says `Unsupported`, and the connection stays in userspace. (On
//!    epoll, the mode is harmless on a plain socket.)
//! 4. [`KtlsSession::start`]`(conn, driver.fd(slot))`:
//!    - `Ok(session)`: rustls is gone; keep the session with the
//!      connection. Received bytes are plaintext; sends are plaintext.
//!    - `Err(Refused::Usable { conn, reason })`: keep using `conn` in
//!      userspace; [`RefuseReason::is_transient`] says whether a later
//!      attempt may succeed. Count `reason.label()`.
//!    - `Err(Refused::Dead(e))`: close the socket; nothing can be sent.
//! 5. `Completion::Record { record_type, data }`: copy the (small) record
//!    and call [`KtlsSession::on_record`] **after the turn and before the
//!    next one**: after a KeyUpdate the kernel decrypts nothing until the
//!    new keys are set (a read fails with `EKEYEXPIRED`). `Ok(Closed)` is
//!    the peer's close_notify (an orderly end, like EOF); `Ok(KeyUpdated)`
//!    needs nothing more; `Err(e)`: log `e`, call
//!    [`KtlsSession::send_close_notify`] (it knows whether the keys still
//!    agree with the peer's) and close.
//! 6. Around every send: first, if [`KtlsSession::key_update_due`], call
//!    [`KtlsSession::rekey_tx`] (`Ok(false)`: the send buffer is full, hold
//!    the send and try again later); after handing the buffer to the
//!    driver, [`KtlsSession::note_sent`] (it counts records against the
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

/// Where the shard tracks the record boundary before a hand-off (the
/// tracker is a parser of the peer's bytes, so it lives, and is fuzzed, in
/// `ferry-proto`).
pub use ferry_proto::tls_record::RecordBoundary;
use ferry_sys::ktls::{self as sys, record_type, Cipher, CryptoInfo, Direction, Version};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::{
    AlertDescription, CipherSuite, CommonState, ConnectionTrafficSecrets, ExtractedSecrets,
    ProtocolVersion, ServerConfig, ServerConnection, SupportedCipherSuite,
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

mod sealed {
    use super::*;

    /// The secrets, and rustls's key schedule where the type keeps one.
    pub(super) type IntoKernel = Result<
        (
            ExtractedSecrets,
            Option<KernelConnection<ServerConnectionData>>,
        ),
        rustls::Error,
    >;

    /// What [`super::KtlsSession::start`] needs from a rustls server
    /// connection; implemented for the two rustls types only.
    pub trait Sealed {
        fn common(&self) -> &CommonState;
        /// The secrets, and rustls's key schedule where this type keeps it.
        fn into_kernel(self) -> IntoKernel;
    }

    impl Sealed for ServerConnection {
        fn common(&self) -> &CommonState {
            self
        }

        fn into_kernel(self) -> IntoKernel {
            // rustls 0.23 offers `dangerous_into_kernel_connection` on the
            // unbuffered connection only.
            Ok((self.dangerous_extract_secrets()?, None))
        }
    }

    impl Sealed for UnbufferedServerConnection {
        fn common(&self) -> &CommonState {
            self
        }

        fn into_kernel(self) -> IntoKernel {
            let (secrets, kernel) = self.dangerous_into_kernel_connection()?;
            Ok((secrets, Some(kernel)))
        }
    }
}

/// A rustls server connection that can be handed to the kernel:
/// [`ServerConnection`] (no key updates afterwards) or
/// [`UnbufferedServerConnection`] (key updates supported).
pub trait Handoff: sealed::Sealed + Sized {
    /// Whether rustls holds nothing that a hand-off now would lose: the
    /// handshake is over, no TLS output is waiting to be written, and no
    /// received plaintext or close_notify is waiting to be read. (It cannot
    /// see bytes the caller holds: see the module's calling sequence.)
    fn ready(&self) -> Result<(), RefuseReason> {
        let common = self.common();
        if common.is_handshaking() {
            Err(RefuseReason::Handshaking)
        } else if common.wants_write() {
            Err(RefuseReason::UnsentTls)
        } else if !common.wants_read() {
            // After the handshake, rustls stops wanting input only while
            // it holds plaintext for the reader or has seen close_notify.
            Err(RefuseReason::PendingInput)
        } else {
            Ok(())
        }
    }
}

impl Handoff for ServerConnection {}
impl Handoff for UnbufferedServerConnection {}

/// Why a connection stays on userspace TLS.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RefuseReason {
    /// The handshake is not finished.
    #[error("the TLS handshake is not finished")]
    Handshaking,
    /// rustls holds TLS records not yet written to the socket.
    #[error("rustls holds TLS output not yet written")]
    UnsentTls,
    /// rustls holds received plaintext not yet read, or the peer's
    /// close_notify.
    #[error("rustls holds received data not yet read")]
    PendingInput,
    /// The negotiated version or cipher suite has no kernel counterpart.
    #[error("kernel TLS does not cover {version:?} with {suite:?}")]
    Unsupported {
        /// The negotiated protocol version.
        version: Option<ProtocolVersion>,
        /// The negotiated cipher suite.
        suite: Option<CipherSuite>,
    },
    /// The kernel has no TLS ULP, or refuses this version and cipher.
    #[error("{0}")]
    Kernel(&'static str),
    /// Attaching the TLS ULP to this socket failed (the socket is
    /// untouched).
    #[error("attaching the TLS ULP: {0}")]
    Ulp(#[source] io::Error),
}

impl RefuseReason {
    /// The reason as the metrics count it.
    pub fn refusal(&self) -> crate::metrics::KtlsRefusal {
        use crate::metrics::KtlsRefusal as K;
        match self {
            RefuseReason::Handshaking => K::Handshaking,
            RefuseReason::UnsentTls => K::UnsentTls,
            RefuseReason::PendingInput => K::PendingInput,
            RefuseReason::Unsupported { .. } => K::UnsupportedSuite,
            RefuseReason::Kernel(_) => K::Kernel,
            RefuseReason::Ulp(_) => K::Ulp,
        }
    }

    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        self.refusal().label()
    }

    /// Whether a later attempt on the same connection may succeed (once
    /// rustls has written or been read out).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RefuseReason::Handshaking | RefuseReason::UnsentTls | RefuseReason::PendingInput
        )
    }
}

/// [`KtlsSession::start`] did not hand the connection over.
pub enum Refused<C> {
    /// Nothing was consumed: go on with `conn` in userspace.
    Usable {
        /// The rustls connection, as it was.
        conn: C,
        /// Why.
        reason: RefuseReason,
    },
    /// rustls was consumed but the kernel did not take the keys: the
    /// connection cannot go on and must be closed.
    Dead(KtlsError),
}

impl<C> fmt::Debug for Refused<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Usable { reason, .. } => f
                .debug_struct("Usable")
                .field("reason", reason)
                .finish_non_exhaustive(),
            Refused::Dead(e) => f.debug_tuple("Dead").field(e).finish(),
        }
    }
}

/// Failures after a hand-off began, and while a session runs. Every one
/// ends the connection; [`KtlsSession::send_close_notify`] says goodbye
/// where the keys still allow it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KtlsError {
    /// rustls would not give up the session's secrets (most likely the
    /// configuration lacks [`allow_kernel_tls`]).
    #[error("rustls refused to export the TLS session keys: {0}")]
    Extract(#[source] rustls::Error),
    /// rustls exported keys of a kind this module does not know.
    #[error("rustls exported {0}, which kernel TLS is not given")]
    Secrets(&'static str),
    /// A socket option or record send failed.
    #[error("{what}: {source}")]
    Socket {
        /// What was being done.
        what: &'static str,
        /// The kernel's error.
        source: io::Error,
    },
    /// The peer sent an alert other than close_notify.
    #[error("peer sent TLS alert {description:?} (level {level})")]
    Alert {
        /// The alert level byte (1 warning, 2 fatal).
        level: u8,
        /// The alert.
        description: AlertDescription,
    },
    /// A record of a type that has no place after the handshake.
    #[error("unexpected TLS record of content type {record_type} after the handshake")]
    UnexpectedRecord {
        /// The record's content type.
        record_type: u8,
    },
    /// A post-handshake message other than KeyUpdate (or any handshake
    /// message on TLS 1.2, which would start a renegotiation).
    #[error("unexpected TLS handshake message of type {msg_type} after the handshake")]
    UnexpectedHandshake {
        /// The handshake message type.
        msg_type: u8,
    },
    /// An alert or handshake record that does not parse.
    #[error("malformed TLS {0}")]
    Malformed(&'static str),
    /// Keys need replacing and cannot be: TLS 1.2, a session started from a
    /// buffered connection, or a kernel without rekey support.
    #[error("cannot change TLS keys: {0}")]
    CannotRekey(&'static str),
    /// rustls's key schedule failed.
    #[error("deriving the next TLS keys: {0}")]
    KeySchedule(#[source] rustls::Error),
}

/// What [`KtlsSession::on_record`] made of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordOutcome {
    /// The peer's close_notify: it sends nothing more (an orderly end).
    Closed,
    /// The peer's KeyUpdate was applied; if the peer asked for ours too,
    /// it was sent, or [`KtlsSession::key_update_due`] says it still is.
    KeyUpdated,
}

/// Largest TLS plaintext record.
const MAX_RECORD: usize = 16 * 1024;
/// KeyUpdate message type.
const KEY_UPDATE: u8 = 24;
/// Our KeyUpdate: type, 24-bit length 1, `update_not_requested`.
const KEY_UPDATE_NOT_REQUESTED: [u8; 5] = [KEY_UPDATE, 0, 0, 1, 0];
/// Alert description close_notify.
const CLOSE_NOTIFY: u8 = 0;
pub(crate) const NO_KEY_SCHEDULE: &str =
    "the session came from a buffered rustls connection, which keeps no key schedule";

/// A connection whose TLS record layer runs in the kernel.
pub struct KtlsSession {
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
}

impl fmt::Debug for KtlsSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KtlsSession")
            .field("version", &self.version)
            .field("cipher", &self.cipher)
            .field("can_rekey", &self.kernel.is_some())
            .field("tx_records", &self.tx_records)
            .field("key_update_due", &self.key_update_due)
            .finish_non_exhaustive()
    }
}

impl KtlsSession {
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
    ) -> Result<KtlsSession, Refused<C>> {
        let (version, cipher, limit) = match conn.ready().and_then(|()| negotiated(conn.common())) {
            Ok(v) => v,
            Err(reason) => return Err(Refused::Usable { conn, reason }),
        };
        if let Err(why) = sock.supports(version, cipher) {
            return Err(Refused::Usable {
                conn,
                reason: RefuseReason::Kernel(why),
            });
        }
        if let Err(e) = sock.enable_ulp() {
            return Err(Refused::Usable {
                conn,
                reason: RefuseReason::Ulp(e),
            });
        }

        // rustls is consumed from here on.
        let (secrets, kernel) = conn
            .into_kernel()
            .map_err(|e| Refused::Dead(KtlsError::Extract(e)))?;
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
        Ok(KtlsSession {
            kernel,
            version,
            cipher,
            tx_records: tx_seq,
            tx_limit: limit,
            key_update_due: false,
            tx_in_step: true,
        })
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
    ) -> Result<RecordOutcome, KtlsError> {
        match record_type {
            record_type::ALERT => match *data {
                [_, CLOSE_NOTIFY] => Ok(RecordOutcome::Closed),
                [level, description] => Err(KtlsError::Alert {
                    level,
                    description: AlertDescription::from(description),
                }),
                _ => Err(KtlsError::Malformed("alert record (not two bytes)")),
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
            record_type::HANDSHAKE => Err(KtlsError::UnexpectedHandshake {
                msg_type: data.first().copied().unwrap_or(0),
            }),
            other => Err(KtlsError::UnexpectedRecord { record_type: other }),
        }
    }

    /// Installs the peer's next keys after its KeyUpdate.
    fn rekey_rx<S: KernelSocket>(&mut self, sock: &mut S) -> Result<(), KtlsError> {
        let kernel = self
            .kernel
            .as_mut()
            .ok_or(KtlsError::CannotRekey(NO_KEY_SCHEDULE))?;
        sock.can_rekey().map_err(KtlsError::CannotRekey)?;
        let (seq, secrets) = kernel.update_rx_secret().map_err(KtlsError::KeySchedule)?;
        let info = crypto_info(self.version, seq, &secrets)?;
        sock.set_crypto_info(Direction::Rx, &info)
            .map_err(|source| socket_error("replacing the TLS_RX keys", source))
    }

    /// Whether our KeyUpdate is owed: call [`KtlsSession::rekey_tx`] before
    /// the next send.
    pub fn key_update_due(&self) -> bool {
        self.key_update_due
    }

    /// Sends our KeyUpdate and switches the kernel to our next transmit
    /// keys. `Ok(false)` when the socket's send buffer is full: nothing
    /// changed, and the update is still due.
    pub fn rekey_tx<S: KernelSocket>(&mut self, mut sock: S) -> Result<bool, KtlsError> {
        if !self.tx_in_step {
            return Err(KtlsError::CannotRekey(
                "the transmit keys are already out of step with the peer",
            ));
        }
        if self.version != Version::Tls13 {
            return Err(KtlsError::CannotRekey("TLS 1.2 has no KeyUpdate"));
        }
        let Some(kernel) = self.kernel.as_mut() else {
            return Err(KtlsError::CannotRekey(NO_KEY_SCHEDULE));
        };
        sock.can_rekey().map_err(KtlsError::CannotRekey)?;
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
        let (seq, secrets) = kernel.update_tx_secret().map_err(KtlsError::KeySchedule)?;
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
    /// a key update becomes due ([`KtlsSession::key_update_due`]); where
    /// keys cannot be renewed, this returns an error: close the
    /// connection cleanly.
    pub fn note_sent(&mut self, len: usize) -> Result<(), KtlsError> {
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

/// The record-limit policy of every record layer after a hand-off (kernel
/// or Ferry's own): `records` sent under a transmit key whose renewal is
/// due at `limit`. `Ok(true)`: renew it now; `Ok(false)`: not yet; where
/// keys cannot be renewed, an error: end the session cleanly.
pub(crate) fn past_record_limit(
    records: u64,
    limit: u64,
    can_rekey: bool,
) -> Result<bool, KtlsError> {
    if records < limit {
        Ok(false)
    } else if can_rekey {
        Ok(true)
    } else {
        Err(KtlsError::CannotRekey(
            "the transmit key reached its record limit and cannot be renewed",
        ))
    }
}

fn socket_error(what: &'static str, source: io::Error) -> KtlsError {
    KtlsError::Socket { what, source }
}

/// The negotiated version and cipher in kernel terms, and when to renew
/// the transmit key.
pub(crate) fn negotiated(common: &CommonState) -> Result<(Version, Cipher, u64), RefuseReason> {
    let unsupported = || RefuseReason::Unsupported {
        version: common.protocol_version(),
        suite: common.negotiated_cipher_suite().map(|s| s.suite()),
    };
    let version = match common.protocol_version() {
        Some(ProtocolVersion::TLSv1_3) => Version::Tls13,
        Some(ProtocolVersion::TLSv1_2) => Version::Tls12,
        _ => return Err(unsupported()),
    };
    let suite = common.negotiated_cipher_suite().ok_or_else(unsupported)?;
    let cipher = match suite.suite() {
        CipherSuite::TLS13_AES_128_GCM_SHA256
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => Cipher::Aes128Gcm,
        CipherSuite::TLS13_AES_256_GCM_SHA384
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => Cipher::Aes256Gcm,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => Cipher::Chacha20Poly1305,
        _ => return Err(unsupported()),
    };
    let common = match suite {
        SupportedCipherSuite::Tls12(s) => &s.common,
        SupportedCipherSuite::Tls13(s) => &s.common,
    };
    let limit = common.confidentiality_limit / 2;
    Ok((version, cipher, limit))
}

/// The kernel's view of one direction's keys, from what rustls exported:
/// `seq` is the sequence number of the next record in that direction.
pub fn crypto_info(
    version: Version,
    seq: u64,
    secrets: &ConnectionTrafficSecrets,
) -> Result<CryptoInfo, KtlsError> {
    let (cipher, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Cipher::Aes128Gcm, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Cipher::Aes256Gcm, key, iv),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            (Cipher::Chacha20Poly1305, key, iv)
        }
        _ => {
            return Err(KtlsError::Secrets(
                "keys for an AEAD other than AES-GCM or ChaCha20-Poly1305",
            ))
        }
    };
    let iv: &[u8; sys::NONCE_LEN] = iv
        .as_ref()
        .try_into()
        .map_err(|_| KtlsError::Secrets("an IV that is not 12 bytes"))?;
    CryptoInfo::new(version, cipher, key.as_ref(), iv, seq)
        .map_err(|_| KtlsError::Secrets("a key of the wrong length for its cipher"))
}

/// Reads a TLS 1.3 post-handshake record that must hold exactly one
/// KeyUpdate; returns its `update_requested` flag.
pub(crate) fn parse_key_update(data: &[u8]) -> Result<bool, KtlsError> {
    let [msg_type, l0, l1, l2, body @ ..] = data else {
        return Err(KtlsError::Malformed(
            "handshake record (shorter than a message header)",
        ));
    };
    if *msg_type != KEY_UPDATE {
        return Err(KtlsError::UnexpectedHandshake {
            msg_type: *msg_type,
        });
    }
    let len = u32::from_be_bytes([0, *l0, *l1, *l2]) as usize;
    if len != 1 {
        return Err(KtlsError::Malformed("KeyUpdate (body is not one byte)"));
    }
    // RFC 8446 §5.1: a message before a key change ends its record, and
    // a KeyUpdate split across records is not worth supporting.
    match body {
        [0] => Ok(false),
        [1] => Ok(true),
        [_] => Err(KtlsError::Malformed(
            "KeyUpdate (request_update not 0 or 1)",
        )),
        [] => Err(KtlsError::Malformed("KeyUpdate (split across records)")),
        _ => Err(KtlsError::Malformed("KeyUpdate (more data in its record)")),
    }
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
    fn key_updates_parse() {
        assert!(!parse_key_update(&[24, 0, 0, 1, 0]).unwrap());
        assert!(parse_key_update(&[24, 0, 0, 1, 1]).unwrap());
        let err = |d: &[u8]| parse_key_update(d).unwrap_err().to_string();
        assert_eq!(
            err(&[4, 0, 0, 1, 0]),
            "unexpected TLS handshake message of type 4 after the handshake"
        );
        assert!(err(&[24, 0, 0]).contains("shorter than a message header"));
        assert!(err(&[24, 0, 0, 2, 0, 0]).contains("body is not one byte"));
        assert!(err(&[24, 0, 0, 1, 2]).contains("request_update not 0 or 1"));
        assert!(err(&[24, 0, 0, 1]).contains("split across records"));
        assert!(err(&[24, 0, 0, 1, 0, 24, 0, 0, 1, 0]).contains("more data in its record"));
    }

    #[test]
    fn refuse_reasons_are_labelled() {
        assert!(RefuseReason::UnsentTls.is_transient());
        assert!(!RefuseReason::Kernel("no").is_transient());
        assert_eq!(RefuseReason::Kernel("no TLS ULP").to_string(), "no TLS ULP");
        assert_eq!(RefuseReason::PendingInput.label(), "pending_input");
    }

    #[test]
    fn sessions_can_move_between_shards() {
        fn is_send<T: Send>() {}
        is_send::<KtlsSession>();
    }
}
