//! The Noise IK initiator of the control channel and its record layer.
//!
//! The control channel is `Noise_IK_25519_ChaChaPoly_BLAKE2s` with two
//! details of its own: the prologue is `"Tailscale Control Protocol v"`
//! followed by the decimal protocol version, and the transport nonce is four
//! zero bytes then a **big-endian** 64-bit counter (standard Noise writes the
//! counter little-endian).
//!
//! Wire frames (all lengths big-endian u16):
//!
//! | frame | layout | size |
//! |---|---|---|
//! | initiation | version (2) ‖ `01` ‖ len=96 ‖ e (32) ‖ sealed s (48) ‖ tag (16) | 101 |
//! | response | `02` ‖ len=48 ‖ e (32) ‖ tag (16) | 51 |
//! | error | `03` ‖ len ‖ text (not authenticated) | 3 + len |
//! | record | `04` ‖ len ‖ ciphertext (plaintext + 16-byte tag) | ≤ 4096 |
//!
//! Everything here is pure: [`Initiator`] makes the initiation from keys
//! and an ephemeral secret the caller draws, reads the server's answer from
//! a byte buffer and yields a [`Transport`], which seals plaintext into
//! records and opens whole records out of a buffer.

use crate::key::{MachinePrivate, MachinePublic};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use curve25519_dalek::montgomery::MontgomeryPoint;

const PROTOCOL_NAME: &[u8] = b"Noise_IK_25519_ChaChaPoly_BLAKE2s";
const PROLOGUE_PREFIX: &str = "Tailscale Control Protocol v";

/// Bytes of a frame header (type ‖ length).
pub const HEADER_LEN: usize = 3;
/// Largest frame on the wire, header included.
pub const MAX_FRAME: usize = 4096;
/// Poly1305 tag length.
pub const TAG_LEN: usize = 16;
/// Largest plaintext one record carries.
pub const MAX_PLAINTEXT: usize = MAX_FRAME - HEADER_LEN - TAG_LEN;
/// Length of the initiation message.
pub const INITIATION_LEN: usize = 101;
/// Length of the response message.
pub const RESPONSE_LEN: usize = 51;

const TYPE_INITIATION: u8 = 1;
const TYPE_RESPONSE: u8 = 2;
const TYPE_ERROR: u8 = 3;
const TYPE_RECORD: u8 = 4;

/// Why the handshake or a record failed. Every error ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoiseError {
    /// The server sent an error frame instead of its response.
    #[error("control server refused the handshake: {0:?}")]
    ServerError(String),
    /// A frame type other than the one expected.
    #[error("unexpected frame type {0}")]
    UnexpectedType(u8),
    /// The response frame's length field is not 48.
    #[error("handshake response has length {0}, want 48")]
    BadResponseLength(usize),
    /// A frame longer than 4096 bytes was announced.
    #[error("frame of {0} bytes exceeds the 4096-byte limit")]
    FrameTooLarge(usize),
    /// A record too short to hold its tag.
    #[error("record of {0} bytes is shorter than its tag")]
    ShortRecord(usize),
    /// Authentication failed (wrong keys or tampered bytes).
    #[error("decryption failed")]
    Decrypt,
    /// A Diffie-Hellman result was all zero (a low-order public key).
    #[error("low-order public key")]
    LowOrderKey,
    /// The 2^64 - 1 nonces of a direction are used up.
    #[error("cipher exhausted")]
    Exhausted,
}

/// X25519 of a (clamped) private key and a public key; all-zero results
/// (low-order points) are refused, as Go's `curve25519.X25519` does.
fn dh(private: &[u8; 32], public: &[u8; 32]) -> Result<[u8; 32], NoiseError> {
    let shared = MontgomeryPoint(*public).mul_clamped(*private).to_bytes();
    if shared == [0; 32] {
        return Err(NoiseError::LowOrderKey);
    }
    Ok(shared)
}

fn blake2s(parts: &[&[u8]]) -> [u8; 32] {
    let mut state = blake2s_simd::State::new();
    for p in parts {
        state.update(p);
    }
    *state.finalize().as_array()
}

/// HMAC-BLAKE2s (64-byte block) with a 32-byte key.
fn hmac(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for (i, k) in key.iter().enumerate() {
        ipad[i] ^= k;
        opad[i] ^= k;
    }
    let mut inner = blake2s_simd::State::new();
    inner.update(&ipad);
    for p in parts {
        inner.update(p);
    }
    blake2s(&[&opad, inner.finalize().as_bytes()])
}

/// HKDF-BLAKE2s with salt `ck`, two 32-byte outputs.
fn hkdf2(ck: &[u8; 32], input: &[u8]) -> ([u8; 32], [u8; 32]) {
    let prk = hmac(ck, &[input]);
    let t1 = hmac(&prk, &[&[1]]);
    let t2 = hmac(&prk, &[&t1, &[2]]);
    (t1, t2)
}

fn aead_key(k: &[u8; 32]) -> LessSafeKey {
    // A 32-byte key is always valid for ChaCha20-Poly1305.
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, k).expect("32-byte key"))
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The handshake's symmetric state (`h`, `ck`).
#[derive(Clone)]
struct Symmetric {
    h: [u8; 32],
    ck: [u8; 32],
}

impl Symmetric {
    fn new(version: u16) -> Symmetric {
        let h = blake2s(&[PROTOCOL_NAME]);
        let mut s = Symmetric { h, ck: h };
        s.mix_hash(format!("{PROLOGUE_PREFIX}{version}").as_bytes());
        s
    }

    fn mix_hash(&mut self, data: &[u8]) {
        self.h = blake2s(&[&self.h, data]);
    }

    /// MixKey(DH(private, public)): the new chaining key and a one-use
    /// cipher key.
    fn mix_dh(&mut self, private: &[u8; 32], public: &[u8; 32]) -> Result<[u8; 32], NoiseError> {
        let (ck, k) = hkdf2(&self.ck, &dh(private, public)?);
        self.ck = ck;
        Ok(k)
    }

    /// Seals `plaintext` with nonce 0 and AD = h into `out` (plaintext
    /// length + 16 bytes), then mixes the ciphertext into h.
    fn encrypt_and_hash(&mut self, k: &[u8; 32], plaintext: &[u8], out: &mut [u8]) {
        let (body, tag_out) = out.split_at_mut(plaintext.len());
        body.copy_from_slice(plaintext);
        let tag = aead_key(k)
            .seal_in_place_separate_tag(nonce(0), Aad::from(&self.h), body)
            .expect("sealing a short buffer cannot fail");
        tag_out.copy_from_slice(tag.as_ref());
        self.mix_hash(out);
    }

    /// Opens `ciphertext` (nonce 0, AD = h), then mixes it into h.
    fn decrypt_and_hash(&mut self, k: &[u8; 32], ciphertext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        let mut buf = ciphertext.to_vec();
        let n = aead_key(k)
            .open_in_place(nonce(0), Aad::from(&self.h), &mut buf)
            .map_err(|_| NoiseError::Decrypt)?
            .len();
        buf.truncate(n);
        self.mix_hash(ciphertext);
        Ok(buf)
    }
}

/// The client side of the handshake, between the initiation and the
/// server's response.
pub struct Initiator {
    sym: Symmetric,
    machine: MachinePrivate,
    ephemeral: MachinePrivate,
    initiation: [u8; INITIATION_LEN],
}

impl Initiator {
    /// Starts a handshake as `machine` with the control server `server`,
    /// for protocol `version` (the capability version), with the ephemeral
    /// secret `ephemeral` (32 random bytes the caller draws).
    pub fn new(
        machine: &MachinePrivate,
        server: &MachinePublic,
        version: u16,
        ephemeral: [u8; 32],
    ) -> Result<Initiator, NoiseError> {
        let ephemeral = MachinePrivate::from_bytes(ephemeral);
        let mut sym = Symmetric::new(version);
        sym.mix_hash(server.as_bytes());
        let mut msg = [0u8; INITIATION_LEN];
        msg[..2].copy_from_slice(&version.to_be_bytes());
        msg[2] = TYPE_INITIATION;
        msg[3..5].copy_from_slice(&96u16.to_be_bytes());
        let e_pub = ephemeral.public();
        msg[5..37].copy_from_slice(e_pub.as_bytes());
        sym.mix_hash(e_pub.as_bytes());
        let k = sym.mix_dh(ephemeral.as_bytes(), server.as_bytes())?;
        sym.encrypt_and_hash(&k, machine.public().as_bytes(), &mut msg[37..85]);
        let k = sym.mix_dh(machine.as_bytes(), server.as_bytes())?;
        sym.encrypt_and_hash(&k, &[], &mut msg[85..101]);
        Ok(Initiator {
            sym,
            machine: machine.clone(),
            ephemeral,
            initiation: msg,
        })
    }

    /// The 101-byte initiation message to send (base64 in the upgrade
    /// request's `X-Tailscale-Handshake` header).
    pub fn initiation(&self) -> &[u8; INITIATION_LEN] {
        &self.initiation
    }

    /// Reads the server's answer from the start of `buf`. `Ok(None)` while
    /// it is incomplete; on success the transport and the bytes consumed
    /// (the records that follow belong to the transport).
    pub fn read_response(&self, buf: &[u8]) -> Result<Option<(Transport, usize)>, NoiseError> {
        let Some((ty, len)) = header(buf) else {
            return Ok(None);
        };
        match ty {
            TYPE_RESPONSE => {}
            TYPE_ERROR => {
                let Some(text) = buf.get(HEADER_LEN..HEADER_LEN + len) else {
                    return Ok(None);
                };
                return Err(NoiseError::ServerError(
                    String::from_utf8_lossy(text).into_owned(),
                ));
            }
            other => return Err(NoiseError::UnexpectedType(other)),
        }
        if len != RESPONSE_LEN - HEADER_LEN {
            return Err(NoiseError::BadResponseLength(len));
        }
        let Some(msg) = buf.get(..RESPONSE_LEN) else {
            return Ok(None);
        };
        let mut sym = self.sym.clone();
        let e: [u8; 32] = msg[3..35].try_into().expect("32 bytes");
        sym.mix_hash(&e);
        sym.mix_dh(self.ephemeral.as_bytes(), &e)?;
        let k = sym.mix_dh(self.machine.as_bytes(), &e)?;
        sym.decrypt_and_hash(&k, &msg[35..51])?;
        let (k1, k2) = hkdf2(&sym.ck, &[]);
        let transport = Transport {
            tx: Direction::new(&k1),
            rx: Direction::new(&k2),
            handshake_hash: sym.h,
        };
        Ok(Some((transport, RESPONSE_LEN)))
    }
}

/// A frame header at the start of `buf`: (type, payload length).
fn header(buf: &[u8]) -> Option<(u8, usize)> {
    let h = buf.get(..HEADER_LEN)?;
    Some((h[0], usize::from(u16::from_be_bytes([h[1], h[2]]))))
}

struct Direction {
    key: LessSafeKey,
    counter: u64,
}

impl Direction {
    fn new(k: &[u8; 32]) -> Direction {
        Direction {
            key: aead_key(k),
            counter: 0,
        }
    }

    fn next_nonce(&mut self) -> Result<Nonce, NoiseError> {
        if self.counter == u64::MAX {
            return Err(NoiseError::Exhausted);
        }
        let n = nonce(self.counter);
        self.counter += 1;
        Ok(n)
    }
}

/// The established channel: seals outgoing plaintext into records, opens
/// incoming records. A failed open leaves the receive side unusable (the
/// caller must drop the connection).
pub struct Transport {
    tx: Direction,
    rx: Direction,
    handshake_hash: [u8; 32],
}

impl Transport {
    /// The final handshake hash (binds messages to this connection).
    pub fn handshake_hash(&self) -> &[u8; 32] {
        &self.handshake_hash
    }

    /// Appends `plaintext` to `out` as records of at most
    /// [`MAX_PLAINTEXT`] bytes each; an empty `plaintext` makes one empty
    /// record.
    pub fn seal(&mut self, plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), NoiseError> {
        let mut rest = plaintext;
        loop {
            let take = rest.len().min(MAX_PLAINTEXT);
            let (chunk, tail) = rest.split_at(take);
            let nonce = self.tx.next_nonce()?;
            let len = u16::try_from(take + TAG_LEN).expect("bounded by MAX_FRAME");
            out.push(TYPE_RECORD);
            out.extend_from_slice(&len.to_be_bytes());
            let start = out.len();
            out.extend_from_slice(chunk);
            let tag = self
                .tx
                .key
                .seal_in_place_separate_tag(nonce, Aad::empty(), &mut out[start..])
                .map_err(|_| NoiseError::Exhausted)?;
            out.extend_from_slice(tag.as_ref());
            rest = tail;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }

    /// Opens every whole record at the start of `buf`, appending their
    /// plaintext to `out`; returns the bytes consumed (a trailing partial
    /// record stays for the next call). `buf` is decrypted in place.
    pub fn open(&mut self, buf: &mut [u8], out: &mut Vec<u8>) -> Result<usize, NoiseError> {
        let mut used = 0;
        while let Some((ty, len)) = header(&buf[used..]) {
            if ty != TYPE_RECORD {
                return Err(NoiseError::UnexpectedType(ty));
            }
            if HEADER_LEN + len > MAX_FRAME {
                return Err(NoiseError::FrameTooLarge(HEADER_LEN + len));
            }
            if len < TAG_LEN {
                return Err(NoiseError::ShortRecord(len));
            }
            let end = used + HEADER_LEN + len;
            let Some(body) = buf.get_mut(used + HEADER_LEN..end) else {
                break;
            };
            let nonce = self.rx.next_nonce()?;
            let plain = self
                .rx
                .key
                .open_in_place(nonce, Aad::empty(), body)
                .map_err(|_| NoiseError::Decrypt)?;
            out.extend_from_slice(plain);
            used = end;
        }
        Ok(used)
    }
}

/// A test-only responder: the control server's side of the handshake, for
/// round trips inside this crate and the fuzz targets.
pub(crate) mod responder {
    use super::*;

    /// Answers `init` as the server `server` with ephemeral `ephemeral`:
    /// the 51-byte response and the server's transport (tx and rx swapped).
    pub(crate) fn respond(
        server: &MachinePrivate,
        init: &[u8],
        ephemeral: [u8; 32],
    ) -> Result<([u8; RESPONSE_LEN], Transport, MachinePublic), NoiseError> {
        if init.len() != INITIATION_LEN || init[2] != TYPE_INITIATION {
            return Err(NoiseError::UnexpectedType(
                init.get(2).copied().unwrap_or(0),
            ));
        }
        let version = u16::from_be_bytes([init[0], init[1]]);
        let mut sym = Symmetric::new(version);
        sym.mix_hash(server.public().as_bytes());
        let e: [u8; 32] = init[5..37].try_into().expect("32 bytes");
        sym.mix_hash(&e);
        let k = sym.mix_dh(server.as_bytes(), &e)?;
        let s = sym.decrypt_and_hash(&k, &init[37..85])?;
        let s: [u8; 32] = s.try_into().map_err(|_| NoiseError::Decrypt)?;
        let k = sym.mix_dh(server.as_bytes(), &s)?;
        sym.decrypt_and_hash(&k, &init[85..101])?;
        let eph = MachinePrivate::from_bytes(ephemeral);
        let mut resp = [0u8; RESPONSE_LEN];
        resp[0] = TYPE_RESPONSE;
        resp[1..3].copy_from_slice(&48u16.to_be_bytes());
        resp[3..35].copy_from_slice(eph.public().as_bytes());
        sym.mix_hash(eph.public().as_bytes());
        sym.mix_dh(eph.as_bytes(), &e)?;
        let k = sym.mix_dh(eph.as_bytes(), &s)?;
        sym.encrypt_and_hash(&k, &[], &mut resp[35..51]);
        let (k1, k2) = hkdf2(&sym.ck, &[]);
        let t = Transport {
            tx: Direction::new(&k2),
            rx: Direction::new(&k1),
            handshake_hash: sym.h,
        };
        Ok((resp, t, MachinePublic(s)))
    }
}

#[cfg(test)]
mod tests;
