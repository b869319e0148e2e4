//! The NaCl box used by the DERP handshake (`docs/derp-protocol.md` §3).
//!
//! `crypto_box_curve25519xsalsa20poly1305`: X25519, then HSalsa20 to derive a
//! symmetric key (done once in [`SharedKey::new`]), then XSalsa20-Poly1305.
//! On the wire a sealed message is `nonce (24) ‖ tag (16) ‖ ciphertext`, so it
//! is always [`OVERHEAD`] bytes longer than the plaintext. Only `clientInfo`
//! and `serverInfo` are boxed; steady-state frames are not.

use crate::key::{NodePrivate, NodePublic};
use crypto_box::aead::generic_array::GenericArray;
use crypto_box::aead::AeadInPlace;
use std::fmt;

/// Nonce length in bytes.
pub const NONCE_LEN: usize = 24;
/// Poly1305 tag length in bytes.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed message adds to its plaintext (nonce + tag).
pub const OVERHEAD: usize = NONCE_LEN + TAG_LEN;

/// Why a sealed message could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoxError {
    /// Shorter than nonce + tag, so it cannot be a box at all.
    #[error("sealed box too short: {len} bytes, need at least {OVERHEAD}")]
    TooShort {
        /// Length of the sealed input.
        len: usize,
    },
    /// The tag did not verify: wrong keys, or the bytes were altered.
    #[error("sealed box failed authentication")]
    AuthFailed,
}

/// The precomputed box key for one (my private, their public) pair.
pub struct SharedKey(crypto_box::SalsaBox);

impl SharedKey {
    /// Performs X25519 and HSalsa20 once; seal and open then cost only the
    /// symmetric cipher.
    pub fn new(my: &NodePrivate, their: &NodePublic) -> Self {
        let public = crypto_box::PublicKey::from_bytes(*their.as_bytes());
        SharedKey(crypto_box::SalsaBox::new(&public, &my.secret_key()))
    }

    /// [`SharedKey::new`] from raw keys (`my` a clamped private key), for
    /// the other Curve25519 key types of the same box (disco keys).
    pub(crate) fn from_raw(my: &[u8; 32], their: &[u8; 32]) -> Self {
        let public = crypto_box::PublicKey::from_bytes(*their);
        let secret = crypto_box::SecretKey::from_bytes(*my);
        SharedKey(crypto_box::SalsaBox::new(&public, &secret))
    }

    /// Seals `plaintext` with `nonce`, returning `nonce ‖ tag ‖ ciphertext`.
    pub fn seal(&self, nonce: &[u8; NONCE_LEN], plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plaintext.len() + OVERHEAD);
        self.seal_into(&mut out, nonce, plaintext);
        out
    }

    /// Appends `nonce ‖ tag ‖ ciphertext` to `out` (no intermediate buffer).
    pub fn seal_into(&self, out: &mut Vec<u8>, nonce: &[u8; NONCE_LEN], plaintext: &[u8]) {
        out.reserve(plaintext.len() + OVERHEAD);
        out.extend_from_slice(nonce);
        let tag_at = out.len();
        out.extend_from_slice(&[0u8; TAG_LEN]);
        let body_at = out.len();
        out.extend_from_slice(plaintext);
        let tag = self
            .0
            .encrypt_in_place_detached(GenericArray::from_slice(nonce), b"", &mut out[body_at..])
            // Only non-empty associated data can make encryption fail.
            .expect("crypto_box encryption without associated data is infallible");
        out[tag_at..body_at].copy_from_slice(&tag);
    }

    /// Seals in place: `buf` is `nonce ‖ tag ‖ plaintext` with room for
    /// the nonce and tag at its start; `nonce` is written there, the
    /// plaintext encrypted over itself and the tag put before it.
    /// Panics if `buf` is shorter than [`OVERHEAD`] (a caller's bug).
    pub fn seal_in_place(&self, nonce: &[u8; NONCE_LEN], buf: &mut [u8]) {
        let (head, body) = buf.split_at_mut(OVERHEAD);
        head[..NONCE_LEN].copy_from_slice(nonce);
        let tag = self
            .0
            .encrypt_in_place_detached(GenericArray::from_slice(nonce), b"", body)
            .expect("crypto_box encryption without associated data is infallible");
        head[NONCE_LEN..].copy_from_slice(&tag);
    }

    /// Opens `nonce ‖ tag ‖ ciphertext` in place: on success the plaintext
    /// stands in `sealed[OVERHEAD..]` (returned); on failure the bytes are
    /// left as they were.
    pub fn open_in_place<'a>(&self, sealed: &'a mut [u8]) -> Result<&'a mut [u8], BoxError> {
        if sealed.len() < OVERHEAD {
            return Err(BoxError::TooShort { len: sealed.len() });
        }
        let (head, body) = sealed.split_at_mut(OVERHEAD);
        let (nonce, tag) = head.split_at(NONCE_LEN);
        self.0
            .decrypt_in_place_detached(
                GenericArray::from_slice(nonce),
                b"",
                body,
                GenericArray::from_slice(tag),
            )
            .map_err(|_| BoxError::AuthFailed)?;
        Ok(body)
    }

    /// Opens `nonce ‖ tag ‖ ciphertext`, returning the plaintext.
    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, BoxError> {
        if sealed.len() < OVERHEAD {
            return Err(BoxError::TooShort { len: sealed.len() });
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let (tag, ciphertext) = rest.split_at(TAG_LEN);
        let mut plain = ciphertext.to_vec();
        self.0
            .decrypt_in_place_detached(
                GenericArray::from_slice(nonce),
                b"",
                &mut plain,
                GenericArray::from_slice(tag),
            )
            .map_err(|_| BoxError::AuthFailed)?;
        Ok(plain)
    }
}

impl fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedKey(<redacted>)")
    }
}

/// A fresh random nonce from the operating system's CSPRNG.
pub fn random_nonce() -> [u8; NONCE_LEN] {
    use rand::RngCore;
    let mut n = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{client_private as client, server_private as server, unhex};

    #[test]
    fn client_info_box_vector() {
        // `docs/derp-protocol.md` §17.3: the box inside the clientInfo frame,
        // after the 32-byte key.
        let nonce: [u8; 24] = core::array::from_fn(|i| i as u8);
        let expected = unhex(
            "000102030405060708090a0b0c0d0e0f1011121314151617
             176bdffac6239dc06abd2678210731e1
             69d7ad3c284e14bd97d07b31d36052dc1b4b776d33dac1529db871ecd021683e",
        );
        let json = br#"{"version":2,"CanAckPings":true}"#;
        let sealed = SharedKey::new(&client(), &server().public()).seal(&nonce, json);
        assert_eq!(sealed, expected);
        let opened = SharedKey::new(&server(), &client().public())
            .open(&expected)
            .unwrap();
        assert_eq!(opened, json);
    }

    #[test]
    fn server_info_box_vector() {
        let nonce: [u8; 24] = core::array::from_fn(|i| 0xa0 + i as u8);
        let expected = unhex(
            "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7
             72af1f39b485ad626eebed2deb909582
             358210dd5f19ea382d6c234826",
        );
        let sealed =
            SharedKey::new(&server(), &client().public()).seal(&nonce, br#"{"version":2}"#);
        assert_eq!(sealed, expected);
        let opened = SharedKey::new(&client(), &server().public())
            .open(&expected)
            .unwrap();
        assert_eq!(opened, br#"{"version":2}"#);
    }

    #[test]
    fn open_rejects_tampering_and_short_input() {
        let k = SharedKey::new(&client(), &server().public());
        let mut sealed = k.seal(&random_nonce(), b"hello");
        assert_eq!(sealed.len(), 5 + OVERHEAD);
        assert_eq!(k.open(&sealed).unwrap(), b"hello");
        for i in [0, 24, 40, sealed.len() - 1] {
            sealed[i] ^= 1;
            assert_eq!(k.open(&sealed), Err(BoxError::AuthFailed), "byte {i}");
            sealed[i] ^= 1;
        }
        assert_eq!(k.open(&sealed[..39]), Err(BoxError::TooShort { len: 39 }));
        // An empty plaintext is a valid 40-byte box.
        let empty = k.seal(&[7; 24], b"");
        assert_eq!(k.open(&empty).unwrap(), b"");
        // A third party cannot open it.
        let other = NodePrivate::generate();
        let wrong = SharedKey::new(&other, &server().public());
        assert_eq!(wrong.open(&sealed), Err(BoxError::AuthFailed));
    }

    #[test]
    fn in_place_matches_the_copying_forms() {
        let k = SharedKey::new(&client(), &server().public());
        let nonce = [9; NONCE_LEN];
        let mut buf = vec![0u8; OVERHEAD];
        buf.extend_from_slice(b"in place");
        k.seal_in_place(&nonce, &mut buf);
        assert_eq!(buf, k.seal(&nonce, b"in place"));
        let mut tampered = buf.clone();
        tampered[OVERHEAD] ^= 1;
        let before = tampered.clone();
        assert_eq!(k.open_in_place(&mut tampered), Err(BoxError::AuthFailed));
        assert_eq!(tampered, before, "a failed open leaves the bytes");
        assert_eq!(k.open_in_place(&mut buf).unwrap(), b"in place");
        assert_eq!(
            k.open_in_place(&mut [0; 39]),
            Err(BoxError::TooShort { len: 39 })
        );
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(random_nonce(), random_nonce());
    }
}
