//! Leaving rustls at a record boundary, after the handshake: what the two
//! record layers that take a session over from rustls (the kernel's,
//! [`super::kernel`], and Ferry's own, [`super::records`]) share.
//!
//! A hand-off takes the traffic keys and sequence numbers out of a rustls
//! server connection that holds nothing a move would lose ([`Handoff::ready`]),
//! at a point where every byte read from the socket ended on a TLS record
//! boundary ([`RecordBoundary`]). Where it cannot happen without harm,
//! nothing is consumed and rustls comes back ([`Refused::Usable`], with the
//! [`Refusal`]); once rustls was consumed, a failure ends the connection
//! ([`Refused::Dead`], a [`HandoffError`]). Afterwards both layers follow the
//! same record-limit policy (`past_record_limit`) and read a peer's
//! KeyUpdate the same way (`parse_key_update`).

use std::fmt;
use std::io;

/// Where the shard tracks the record boundary before a hand-off (the
/// tracker is a parser of the peer's bytes, so it lives, and is fuzzed, in
/// `ferry-proto`).
pub use ferry_proto::tls_record::RecordBoundary;
use ferry_sys::ktls::{Cipher, Version};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::{
    AlertDescription, CipherSuite, CommonState, ExtractedSecrets, ProtocolVersion,
    ServerConnection, SupportedCipherSuite,
};

/// KeyUpdate message type.
pub(crate) const KEY_UPDATE: u8 = 24;
/// Why a session cannot renew its keys when it came from rustls's buffered
/// connection.
pub(crate) const NO_KEY_SCHEDULE: &str =
    "the session came from a buffered rustls connection, which keeps no key schedule";

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

    /// What a hand-off needs from a rustls server connection;
    /// implemented for the two rustls types only.
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

/// A rustls server connection that can be handed over:
/// [`ServerConnection`] (no key updates afterwards) or
/// [`UnbufferedServerConnection`] (key updates supported in the kernel).
pub trait Handoff: sealed::Sealed + Sized {
    /// Whether rustls holds nothing that a hand-off now would lose: the
    /// handshake is over, no TLS output is waiting to be written, and no
    /// received plaintext or close_notify is waiting to be read. (It cannot
    /// see bytes the caller holds: see [`super::kernel`]'s calling sequence.)
    fn ready(&self) -> Result<(), Refusal> {
        let common = self.common();
        if common.is_handshaking() {
            Err(Refusal::Handshaking)
        } else if common.wants_write() {
            Err(Refusal::UnsentTls)
        } else if !common.wants_read() {
            // After the handshake, rustls stops wanting input only while
            // it holds plaintext for the reader or has seen close_notify.
            Err(Refusal::PendingInput)
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
pub enum Refusal {
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

impl Refusal {
    /// The reason as the metrics count it.
    pub fn refusal(&self) -> crate::metrics::KtlsRefusal {
        use crate::metrics::KtlsRefusal as K;
        match self {
            Refusal::Handshaking => K::Handshaking,
            Refusal::UnsentTls => K::UnsentTls,
            Refusal::PendingInput => K::PendingInput,
            Refusal::Unsupported { .. } => K::UnsupportedSuite,
            Refusal::Kernel(_) => K::Kernel,
            Refusal::Ulp(_) => K::Ulp,
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
            Refusal::Handshaking | Refusal::UnsentTls | Refusal::PendingInput
        )
    }
}

/// A hand-off ([`KernelTls::start`](super::kernel::KernelTls::start),
/// [`RecordLayer::start`](super::records::RecordLayer::start)) did not
/// happen.
pub enum Refused<C> {
    /// Nothing was consumed: go on with `conn` in userspace.
    Usable {
        /// The rustls connection, as it was.
        conn: C,
        /// Why.
        reason: Refusal,
    },
    /// rustls was consumed but its keys could not be installed: the
    /// connection cannot go on and must be closed.
    Dead(HandoffError),
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
/// ends the connection;
/// [`KernelTls::send_close_notify`](super::kernel::KernelTls::send_close_notify)
/// says goodbye where the keys still allow it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandoffError {
    /// rustls would not give up the session's secrets (most likely the
    /// configuration lacks [`allow_kernel_tls`](super::kernel::allow_kernel_tls)).
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

/// The record-limit policy of every record layer after a hand-off (kernel
/// or Ferry's own): `records` sent under a transmit key whose renewal is
/// due at `limit`. `Ok(true)`: renew it now; `Ok(false)`: not yet; where
/// keys cannot be renewed, an error: end the session cleanly.
pub(crate) fn past_record_limit(
    records: u64,
    limit: u64,
    can_rekey: bool,
) -> Result<bool, HandoffError> {
    if records < limit {
        Ok(false)
    } else if can_rekey {
        Ok(true)
    } else {
        Err(HandoffError::CannotRekey(
            "the transmit key reached its record limit and cannot be renewed",
        ))
    }
}

/// The negotiated version and cipher in kernel terms, and when to renew
/// the transmit key.
pub(crate) fn negotiated(common: &CommonState) -> Result<(Version, Cipher, u64), Refusal> {
    let unsupported = || Refusal::Unsupported {
        version: common.protocol_version(),
        suite: common.negotiated_cipher_suite().map(|s| s.suite()),
    };
    let version = match common.protocol_version() {
        Some(ProtocolVersion::TLSv1_3) => Version::Tls13,
        Some(ProtocolVersion::TLSv1_2) => Version::Tls12,
        _ => return Err(unsupported()),
    };
    let suite = common.negotiated_cipher_suite().ok_or_else(unsupported)?;
    let cipher = cipher_of(suite.suite()).ok_or_else(unsupported)?;
    let common = match suite {
        SupportedCipherSuite::Tls12(s) => &s.common,
        SupportedCipherSuite::Tls13(s) => &s.common,
    };
    let limit = common.confidentiality_limit / 2;
    Ok((version, cipher, limit))
}

/// The AEAD of a TLS 1.3 or TLS 1.2 cipher suite (`None`: one neither
/// record layer after a hand-off carries).
pub(crate) fn cipher_of(suite: CipherSuite) -> Option<Cipher> {
    match suite {
        CipherSuite::TLS13_AES_128_GCM_SHA256
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => Some(Cipher::Aes128Gcm),
        CipherSuite::TLS13_AES_256_GCM_SHA384
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => Some(Cipher::Aes256Gcm),
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
        | CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => {
            Some(Cipher::Chacha20Poly1305)
        }
        _ => None,
    }
}

/// Reads a TLS 1.3 post-handshake record that must hold exactly one
/// KeyUpdate; returns its `update_requested` flag.
pub(crate) fn parse_key_update(data: &[u8]) -> Result<bool, HandoffError> {
    let [msg_type, l0, l1, l2, body @ ..] = data else {
        return Err(HandoffError::Malformed(
            "handshake record (shorter than a message header)",
        ));
    };
    if *msg_type != KEY_UPDATE {
        return Err(HandoffError::UnexpectedHandshake {
            msg_type: *msg_type,
        });
    }
    let len = u32::from_be_bytes([0, *l0, *l1, *l2]) as usize;
    if len != 1 {
        return Err(HandoffError::Malformed("KeyUpdate (body is not one byte)"));
    }
    // RFC 8446 §5.1: a message before a key change ends its record, and
    // a KeyUpdate split across records is not worth supporting.
    match body {
        [0] => Ok(false),
        [1] => Ok(true),
        [_] => Err(HandoffError::Malformed(
            "KeyUpdate (request_update not 0 or 1)",
        )),
        [] => Err(HandoffError::Malformed("KeyUpdate (split across records)")),
        _ => Err(HandoffError::Malformed(
            "KeyUpdate (more data in its record)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn refusals_are_labelled() {
        assert!(Refusal::UnsentTls.is_transient());
        assert!(!Refusal::Kernel("no").is_transient());
        assert_eq!(Refusal::Kernel("no TLS ULP").to_string(), "no TLS ULP");
        assert_eq!(Refusal::PendingInput.label(), "pending_input");
    }
}
