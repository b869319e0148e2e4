//! Kernel TLS (kTLS): the socket options and record calls that move a TLS
//! session's record layer into the kernel.
//!
//! After a TLS handshake done in userspace, a TCP socket can be switched
//! to kTLS in two steps: attach the `tls` upper-layer protocol
//! ([`enable_tls_ulp`]), then hand the kernel the traffic keys of each
//! direction ([`set_crypto_info`] with a [`CryptoInfo`]). From then on the
//! kernel encrypts what is written and decrypts what is read: application
//! data crosses the socket as plaintext. Other records are typed
//! explicitly: [`recv_record`] reports the content type of what it read
//! (the kernel refuses a plain `read` of a non-data record), and
//! [`send_record`] sends one record of a given type (an alert, a
//! KeyUpdate).
//!
//! Whether the kernel can do any of this is decided once per process by
//! [`tls_ulp_available`], [`kernel_supports`] and [`kernel_can_rekey`]: a
//! probe on throwaway loopback connections, cached. Kernels without `CONFIG_TLS`, or with the
//! `tls` module not loaded and no right to load it (most containers), fail
//! it, and the caller stays on userspace TLS.
//!
//! Key material: a [`CryptoInfo`] is wiped when dropped and never printed.
//! The kernel copies the keys during `setsockopt`, so the value can be
//! dropped right after.
//!
//! Layout notes (`include/uapi/linux/tls.h`): each cipher has its own
//! struct, `{version, cipher_type}` followed by `iv`, `key`, `salt` and
//! `rec_seq` byte arrays. For AES-GCM the 12-byte nonce base splits into a
//! 4-byte salt and an 8-byte iv; ChaCha20-Poly1305 keeps all 12 bytes in
//! `iv` and has no salt. `rec_seq` is the big-endian sequence number of the
//! next record.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::OnceLock;

use crate::{cmsg, msghdr};

/// TLS record content types (RFC 8446 §5.1).
pub mod record_type {
    /// `change_cipher_spec` (never sent after a TLS 1.3 handshake).
    pub const CHANGE_CIPHER_SPEC: u8 = 20;
    /// `alert`: a two-byte level and description.
    pub const ALERT: u8 = 21;
    /// `handshake`: post-handshake messages such as KeyUpdate.
    pub const HANDSHAKE: u8 = 22;
    /// `application_data`: what kTLS passes through as plain bytes.
    pub const APPLICATION_DATA: u8 = 23;
}

/// Which half of the connection a [`CryptoInfo`] is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// What this side sends (`TLS_TX`).
    Tx,
    /// What this side receives (`TLS_RX`).
    Rx,
}

/// TLS protocol version of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

impl Version {
    const ALL: [Version; 2] = [Version::Tls12, Version::Tls13];

    fn raw(self) -> u16 {
        match self {
            Version::Tls12 => libc::TLS_1_2_VERSION,
            Version::Tls13 => libc::TLS_1_3_VERSION,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Version::Tls12 => "TLS 1.2",
            Version::Tls13 => "TLS 1.3",
        })
    }
}

/// The AEAD of a session; the ciphers rustls's default provider offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cipher {
    /// AES-128-GCM.
    Aes128Gcm,
    /// AES-256-GCM.
    Aes256Gcm,
    /// ChaCha20-Poly1305.
    Chacha20Poly1305,
}

impl Cipher {
    const ALL: [Cipher; 3] = [
        Cipher::Aes128Gcm,
        Cipher::Aes256Gcm,
        Cipher::Chacha20Poly1305,
    ];

    /// Key length in bytes.
    pub const fn key_len(self) -> usize {
        match self {
            Cipher::Aes128Gcm => libc::TLS_CIPHER_AES_GCM_128_KEY_SIZE,
            Cipher::Aes256Gcm => libc::TLS_CIPHER_AES_GCM_256_KEY_SIZE,
            Cipher::Chacha20Poly1305 => libc::TLS_CIPHER_CHACHA20_POLY1305_KEY_SIZE,
        }
    }
}

impl fmt::Display for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cipher::Aes128Gcm => "AES-128-GCM",
            Cipher::Aes256Gcm => "AES-256-GCM",
            Cipher::Chacha20Poly1305 => "ChaCha20-Poly1305",
        })
    }
}

/// Length of the per-direction nonce base ("IV") TLS derives for every
/// AEAD here.
pub const NONCE_LEN: usize = 12;

/// A key of the wrong length for its cipher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLengthError {
    /// The cipher the key was for.
    pub cipher: Cipher,
    /// The length it needs.
    pub expected: usize,
    /// The length given.
    pub got: usize,
}

impl fmt::Display for KeyLengthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} needs a {}-byte key, got {} bytes",
            self.cipher, self.expected, self.got
        )
    }
}

impl std::error::Error for KeyLengthError {}

#[derive(Clone, Copy)]
enum Raw {
    Aes128(libc::tls12_crypto_info_aes_gcm_128),
    Aes256(libc::tls12_crypto_info_aes_gcm_256),
    Chacha(libc::tls12_crypto_info_chacha20_poly1305),
}

/// The keys of one direction of a TLS session, in the layout the kernel's
/// `TLS_TX`/`TLS_RX` socket options take.
pub struct CryptoInfo {
    version: Version,
    cipher: Cipher,
    raw: Raw,
}

impl CryptoInfo {
    /// Builds the kernel's view of one direction: `key` for `cipher`, the
    /// 12-byte nonce base `iv` as TLS derives it (rustls's `Iv`; for TLS
    /// 1.2 AES-GCM that is the 4-byte salt followed by the 8-byte explicit
    /// nonce), and `seq`, the sequence number of the next record.
    pub fn new(
        version: Version,
        cipher: Cipher,
        key: &[u8],
        iv: &[u8; NONCE_LEN],
        seq: u64,
    ) -> Result<CryptoInfo, KeyLengthError> {
        if key.len() != cipher.key_len() {
            return Err(KeyLengthError {
                cipher,
                expected: cipher.key_len(),
                got: key.len(),
            });
        }
        let info = libc::tls_crypto_info {
            version: version.raw(),
            cipher_type: 0,
        };
        let rec_seq = seq.to_be_bytes();
        let raw = match cipher {
            Cipher::Aes128Gcm => {
                let mut s = libc::tls12_crypto_info_aes_gcm_128 {
                    info: libc::tls_crypto_info {
                        cipher_type: libc::TLS_CIPHER_AES_GCM_128,
                        ..info
                    },
                    iv: [0; 8],
                    key: [0; 16],
                    salt: [0; 4],
                    rec_seq,
                };
                s.salt.copy_from_slice(&iv[..4]);
                s.iv.copy_from_slice(&iv[4..]);
                s.key.copy_from_slice(key);
                Raw::Aes128(s)
            }
            Cipher::Aes256Gcm => {
                let mut s = libc::tls12_crypto_info_aes_gcm_256 {
                    info: libc::tls_crypto_info {
                        cipher_type: libc::TLS_CIPHER_AES_GCM_256,
                        ..info
                    },
                    iv: [0; 8],
                    key: [0; 32],
                    salt: [0; 4],
                    rec_seq,
                };
                s.salt.copy_from_slice(&iv[..4]);
                s.iv.copy_from_slice(&iv[4..]);
                s.key.copy_from_slice(key);
                Raw::Aes256(s)
            }
            Cipher::Chacha20Poly1305 => {
                let mut s = libc::tls12_crypto_info_chacha20_poly1305 {
                    info: libc::tls_crypto_info {
                        cipher_type: libc::TLS_CIPHER_CHACHA20_POLY1305,
                        ..info
                    },
                    iv: *iv,
                    key: [0; 32],
                    salt: [],
                    rec_seq,
                };
                s.key.copy_from_slice(key);
                Raw::Chacha(s)
            }
        };
        Ok(CryptoInfo {
            version,
            cipher,
            raw,
        })
    }

    /// The protocol version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The cipher.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        match &self.raw {
            Raw::Aes128(s) => &s.key,
            Raw::Aes256(s) => &s.key,
            Raw::Chacha(s) => &s.key,
        }
    }

    /// The kernel's `iv` field: the last 8 bytes of the nonce base for
    /// AES-GCM, all 12 for ChaCha20-Poly1305.
    pub fn iv(&self) -> &[u8] {
        match &self.raw {
            Raw::Aes128(s) => &s.iv,
            Raw::Aes256(s) => &s.iv,
            Raw::Chacha(s) => &s.iv,
        }
    }

    /// The kernel's `salt` field: the first 4 bytes of the nonce base for
    /// AES-GCM, empty for ChaCha20-Poly1305.
    pub fn salt(&self) -> &[u8] {
        match &self.raw {
            Raw::Aes128(s) => &s.salt,
            Raw::Aes256(s) => &s.salt,
            Raw::Chacha(s) => &s.salt,
        }
    }

    /// The sequence number of the next record.
    pub fn seq(&self) -> u64 {
        let rec_seq = match &self.raw {
            Raw::Aes128(s) => s.rec_seq,
            Raw::Aes256(s) => s.rec_seq,
            Raw::Chacha(s) => s.rec_seq,
        };
        u64::from_be_bytes(rec_seq)
    }

    /// The 12-byte nonce base this was built from (salt then iv).
    pub fn nonce_base(&self) -> [u8; NONCE_LEN] {
        let mut out = [0u8; NONCE_LEN];
        let salt = self.salt();
        out[..salt.len()].copy_from_slice(salt);
        out[salt.len()..].copy_from_slice(self.iv());
        out
    }

    /// The `tls_crypto_info` header: (version, cipher type) as the kernel
    /// reads them.
    pub fn header(&self) -> (u16, u16) {
        let info = match &self.raw {
            Raw::Aes128(s) => s.info,
            Raw::Aes256(s) => s.info,
            Raw::Chacha(s) => s.info,
        };
        (info.version, info.cipher_type)
    }

    /// Pointer and size of the struct for `setsockopt`.
    fn as_sockopt(&self) -> (*const libc::c_void, libc::socklen_t) {
        fn of<T>(s: &T) -> (*const libc::c_void, libc::socklen_t) {
            (
                (s as *const T).cast(),
                std::mem::size_of::<T>() as libc::socklen_t,
            )
        }
        match &self.raw {
            Raw::Aes128(s) => of(s),
            Raw::Aes256(s) => of(s),
            Raw::Chacha(s) => of(s),
        }
    }
}

impl fmt::Debug for CryptoInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CryptoInfo")
            .field("version", &self.version)
            .field("cipher", &self.cipher)
            .field("seq", &self.seq())
            .finish_non_exhaustive()
    }
}

impl Drop for CryptoInfo {
    fn drop(&mut self) {
        let key: &mut [u8] = match &mut self.raw {
            Raw::Aes128(s) => &mut s.key,
            Raw::Aes256(s) => &mut s.key,
            Raw::Chacha(s) => &mut s.key,
        };
        for b in key {
            // SAFETY: `b` is a valid, aligned, exclusive reference to a byte
            // of `self`; the volatile write only keeps the compiler from
            // dropping the wipe as a dead store.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// Attaches the `tls` upper-layer protocol to a connected TCP socket.
///
/// Until keys are set, the socket still behaves as plain TCP, so a caller
/// that attaches the ULP and then decides against kTLS can go on using the
/// socket as before. Fails with `ENOENT` when the kernel has no TLS ULP,
/// `ENOTCONN` on a socket that is not connected, `EEXIST` when a ULP is
/// already attached.
pub fn enable_tls_ulp(fd: BorrowedFd<'_>) -> io::Result<()> {
    const NAME: &[u8] = b"tls";
    // SAFETY: `NAME` is a live static byte string and we pass its exact
    // length; the kernel copies at most that many bytes.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_ULP,
            NAME.as_ptr().cast(),
            NAME.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Hands the kernel the keys of one direction (`TLS_TX` or `TLS_RX`).
///
/// Requires [`enable_tls_ulp`] first. Setting a direction a second time is
/// a TLS 1.3 rekey, which only recent kernels accept (older ones fail with
/// `EBUSY`).
pub fn set_crypto_info(fd: BorrowedFd<'_>, dir: Direction, info: &CryptoInfo) -> io::Result<()> {
    let name = match dir {
        Direction::Tx => libc::TLS_TX,
        Direction::Rx => libc::TLS_RX,
    };
    let (ptr, len) = info.as_sockopt();
    // SAFETY: `ptr` points to the live crypto-info struct inside `info`
    // and `len` is its exact size; the kernel only reads from it.
    let rc = unsafe { libc::setsockopt(fd.as_raw_fd(), libc::SOL_TLS, name, ptr, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What one [`recv_record`] call read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvRecord {
    /// Bytes written into the buffer; 0 at end of stream.
    pub len: usize,
    /// Content type of the record(s) read; one call never mixes types.
    pub record_type: u8,
}

/// Room for the one control message kTLS attaches (a 1-byte record type),
/// with slack.
const CTRL_LEN: usize = 64;

#[repr(C, align(8))]
struct CtrlBuf([u8; CTRL_LEN]);

/// Reads from a kTLS socket: decrypted bytes of one or more records of a
/// single content type, and that type.
///
/// Application data may span several records and be cut short by `buf`;
/// a non-data record comes back alone and must fit (use a buffer of at
/// least 16 KiB, the largest record). Blocks or not as the socket does.
/// On a socket without kTLS receive keys this is an ordinary read whose
/// bytes are reported as application data.
pub fn recv_record(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<RecvRecord> {
    let mut ctrl = CtrlBuf([0; CTRL_LEN]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut msg = msghdr::empty();
    msghdr::set_iov(&mut msg, &mut iov, 1);
    msghdr::set_control(&mut msg, ctrl.0.as_mut_ptr().cast(), CTRL_LEN);
    // SAFETY: `msg` points at `iov` (covering exactly `buf`) and at `ctrl`
    // with their true lengths, all alive and exclusively borrowed for the
    // call; the kernel writes only within them and updates `msg`'s
    // lengths and flags.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let ctrl_len = msghdr::control_len(&msg).min(CTRL_LEN);
    Ok(RecvRecord {
        len: n as usize,
        record_type: parse_record_type_cmsg(&ctrl.0[..ctrl_len])
            .unwrap_or(record_type::APPLICATION_DATA),
    })
}

/// Finds kTLS's record-type control message (`SOL_TLS`,
/// `TLS_GET_RECORD_TYPE`) in a control buffer as `recvmsg` filled it.
/// `None` when there is none, which means application data.
pub fn parse_record_type_cmsg(control: &[u8]) -> Option<u8> {
    cmsg::iter(control).find_map(|(level, ty, data)| {
        (level == libc::SOL_TLS && ty == libc::TLS_GET_RECORD_TYPE)
            .then(|| data.first().copied())
            .flatten()
    })
}

/// Sends `data` as one TLS record of type `record_type` through a socket
/// with kTLS transmit keys (an alert, a KeyUpdate). Returns the bytes
/// taken; a control record is taken whole or not at all (`WouldBlock` on
/// a full non-blocking socket).
///
/// Only for sockets with `TLS_TX` keys set: plain TCP ignores the
/// record-type control message and would send `data` as it is.
pub fn send_record(fd: BorrowedFd<'_>, record_type: u8, data: &[u8]) -> io::Result<usize> {
    let mut ctrl = CtrlBuf([0; CTRL_LEN]);
    let ctrl_len = cmsg::encode(
        &mut ctrl.0,
        libc::SOL_TLS,
        libc::TLS_SET_RECORD_TYPE,
        &[record_type],
    );
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    let mut msg = msghdr::empty();
    msghdr::set_iov(&mut msg, &mut iov, 1);
    msghdr::set_control(&mut msg, ctrl.0.as_mut_ptr().cast(), ctrl_len);
    // SAFETY: `msg` points at `iov` (covering exactly `data`, which the
    // kernel only reads despite the `*mut` in `iovec`) and at `ctrl_len`
    // initialised bytes of `ctrl`, all alive for the call.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// What the kernel of this machine can do, found once.
struct Probe {
    ulp: Result<(), String>,
    /// Indexed by [`suite_index`].
    suites: Vec<Result<(), String>>,
    /// Whether TLS 1.3 keys can be replaced (KeyUpdate).
    rekey: Result<(), String>,
}

fn suite_index(version: Version, cipher: Cipher) -> usize {
    let v = Version::ALL
        .iter()
        .position(|&x| x == version)
        .expect("listed");
    let c = Cipher::ALL
        .iter()
        .position(|&x| x == cipher)
        .expect("listed");
    v * Cipher::ALL.len() + c
}

static PROBE: OnceLock<Probe> = OnceLock::new();

fn probe() -> &'static Probe {
    PROBE.get_or_init(run_probe)
}

/// Whether this kernel can take a TLS session: the `tls` ULP attaches to a
/// TCP socket and accepts TLS 1.3 AES-128-GCM keys in both directions.
///
/// Probed once per process on throwaway loopback connections (attaching
/// the ULP may load the `tls` module when the process is allowed to). The
/// error says what is missing, for the log.
pub fn tls_ulp_available() -> Result<(), &'static str> {
    let p = probe();
    p.ulp.as_ref().map_err(String::as_str)?;
    p.suites[suite_index(Version::Tls13, Cipher::Aes128Gcm)]
        .as_ref()
        .map(|_| ())
        .map_err(String::as_str)
}

/// Whether this kernel accepts keys of `version` and `cipher` in both
/// directions (ChaCha20-Poly1305 came later than AES-GCM, for instance).
/// Probed once per process like [`tls_ulp_available`].
pub fn kernel_supports(version: Version, cipher: Cipher) -> Result<(), &'static str> {
    let p = probe();
    p.ulp.as_ref().map_err(String::as_str)?;
    p.suites[suite_index(version, cipher)]
        .as_ref()
        .map(|_| ())
        .map_err(String::as_str)
}

/// Whether this kernel can replace the keys of a TLS 1.3 session
/// (setting `TLS_TX`/`TLS_RX` again after a KeyUpdate), which Linux added
/// in 6.14; older kernels refuse with `EBUSY`. Probed once per process by
/// setting transmit keys twice on a throwaway connection.
pub fn kernel_can_rekey() -> Result<(), &'static str> {
    tls_ulp_available()?;
    probe().rekey.as_ref().map(|_| ()).map_err(String::as_str)
}

/// A connected loopback TCP pair; only the client end is used, the server
/// end keeps the connection established.
fn loopback_pair() -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    Ok((client, server))
}

fn run_probe() -> Probe {
    let unknown = |why: &str| Probe {
        ulp: Err(why.to_owned()),
        suites: Vec::new(),
        rekey: Err(why.to_owned()),
    };
    let (client, _server) = match loopback_pair() {
        Ok(pair) => pair,
        Err(e) => {
            return unknown(&format!(
                "cannot open a loopback TCP connection to probe for kernel TLS: {e}"
            ))
        }
    };
    if let Err(e) = enable_tls_ulp(client.as_fd()) {
        return unknown(&ulp_missing_reason(&e, available_ulps().as_deref()));
    }
    let suites = Version::ALL
        .iter()
        .flat_map(|&v| Cipher::ALL.iter().map(move |&c| (v, c)))
        .map(|(v, c)| probe_suite(v, c, false))
        .collect();
    let rekey = probe_suite(Version::Tls13, Cipher::Aes128Gcm, true);
    Probe {
        ulp: Ok(()),
        suites,
        rekey,
    }
}

/// Sets dummy keys of one kind in both directions on a fresh connection;
/// with `rekey`, sets the transmit keys a second time.
fn probe_suite(version: Version, cipher: Cipher, rekey: bool) -> Result<(), String> {
    let what = |dir: &str, e: &dyn fmt::Display| {
        format!("the kernel refuses {version} {cipher} keys ({dir}): {e}")
    };
    let (client, _server) = loopback_pair().map_err(|e| what("probe connection", &e))?;
    let fd = client.as_fd();
    enable_tls_ulp(fd).map_err(|e| what("TCP_ULP", &e))?;
    let key = [0u8; 32];
    let info = CryptoInfo::new(
        version,
        cipher,
        &key[..cipher.key_len()],
        &[0; NONCE_LEN],
        0,
    )
    .expect("key length matches the cipher");
    set_crypto_info(fd, Direction::Tx, &info).map_err(|e| what("TLS_TX", &e))?;
    set_crypto_info(fd, Direction::Rx, &info).map_err(|e| what("TLS_RX", &e))?;
    if rekey {
        set_crypto_info(fd, Direction::Tx, &info).map_err(|e| {
            format!("the kernel cannot replace {version} keys (KeyUpdate; Linux 6.14+): {e}")
        })?;
    }
    Ok(())
}

/// `/proc/sys/net/ipv4/tcp_available_ulp`, trimmed; `None` if unreadable.
fn available_ulps() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The log line for a failed `TCP_ULP` probe.
fn ulp_missing_reason(e: &io::Error, available: Option<&str>) -> String {
    let listed = match available {
        Some("") => " (tcp_available_ulp is empty)".to_owned(),
        Some(list) => format!(" (tcp_available_ulp: {list})"),
        None => String::new(),
    };
    if e.raw_os_error() == Some(libc::ENOENT) {
        format!(
            "the kernel has no TLS ULP{listed}: build it with CONFIG_TLS or load it with `modprobe tls`"
        )
    } else {
        format!("attaching the TLS ULP to a TCP socket failed{listed}: {e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn struct_layouts_match_the_kernel_uapi() {
        // include/uapi/linux/tls.h: a 4-byte header, then iv, key, salt,
        // rec_seq as byte arrays without padding.
        assert_eq!(size_of::<libc::tls_crypto_info>(), 4);
        assert_eq!(
            size_of::<libc::tls12_crypto_info_aes_gcm_128>(),
            4 + 8 + 16 + 4 + 8
        );
        assert_eq!(
            size_of::<libc::tls12_crypto_info_aes_gcm_256>(),
            4 + 8 + 32 + 4 + 8
        );
        assert_eq!(
            size_of::<libc::tls12_crypto_info_chacha20_poly1305>(),
            4 + 12 + 32 + 8
        );
        assert_eq!(offset_of!(libc::tls12_crypto_info_aes_gcm_128, iv), 4);
        assert_eq!(offset_of!(libc::tls12_crypto_info_aes_gcm_128, key), 12);
        assert_eq!(offset_of!(libc::tls12_crypto_info_aes_gcm_128, salt), 28);
        assert_eq!(offset_of!(libc::tls12_crypto_info_aes_gcm_128, rec_seq), 32);
        assert_eq!(offset_of!(libc::tls12_crypto_info_aes_gcm_256, key), 12);
        assert_eq!(offset_of!(libc::tls12_crypto_info_aes_gcm_256, salt), 44);
        assert_eq!(offset_of!(libc::tls12_crypto_info_aes_gcm_256, rec_seq), 48);
        assert_eq!(
            offset_of!(libc::tls12_crypto_info_chacha20_poly1305, key),
            16
        );
        assert_eq!(
            offset_of!(libc::tls12_crypto_info_chacha20_poly1305, rec_seq),
            48
        );
        assert_eq!(libc::TLS_1_2_VERSION, 0x0303);
        assert_eq!(libc::TLS_1_3_VERSION, 0x0304);
        assert_eq!(
            (
                libc::TLS_CIPHER_AES_GCM_128,
                libc::TLS_CIPHER_AES_GCM_256,
                libc::TLS_CIPHER_CHACHA20_POLY1305
            ),
            (51, 52, 54)
        );
        assert_eq!((libc::SOL_TLS, libc::TCP_ULP), (282, 31));
        assert_eq!((libc::TLS_TX, libc::TLS_RX), (1, 2));
        assert_eq!(
            (libc::TLS_SET_RECORD_TYPE, libc::TLS_GET_RECORD_TYPE),
            (1, 2)
        );
    }

    fn nonce() -> [u8; NONCE_LEN] {
        std::array::from_fn(|i| 0xa0 + i as u8)
    }

    #[test]
    fn aes_gcm_splits_the_nonce_into_salt_and_iv() {
        for (cipher, id, size) in [
            (Cipher::Aes128Gcm, libc::TLS_CIPHER_AES_GCM_128, 40),
            (Cipher::Aes256Gcm, libc::TLS_CIPHER_AES_GCM_256, 56),
        ] {
            let key: Vec<u8> = (0..cipher.key_len() as u8).collect();
            let info = CryptoInfo::new(
                Version::Tls13,
                cipher,
                &key,
                &nonce(),
                0x0102_0304_0506_0708,
            )
            .unwrap();
            assert_eq!(info.header(), (0x0304, id));
            assert_eq!(info.key(), &key[..]);
            assert_eq!(info.salt(), &nonce()[..4]);
            assert_eq!(info.iv(), &nonce()[4..]);
            assert_eq!(info.nonce_base(), nonce());
            assert_eq!(info.seq(), 0x0102_0304_0506_0708);
            assert_eq!(info.as_sockopt().1 as usize, size);
            let rec_seq = match &info.raw {
                Raw::Aes128(s) => s.rec_seq,
                Raw::Aes256(s) => s.rec_seq,
                Raw::Chacha(_) => unreachable!(),
            };
            assert_eq!(rec_seq, [1, 2, 3, 4, 5, 6, 7, 8], "big-endian");
        }
    }

    #[test]
    fn chacha_keeps_the_whole_nonce_in_iv() {
        let key = [7u8; 32];
        let info =
            CryptoInfo::new(Version::Tls12, Cipher::Chacha20Poly1305, &key, &nonce(), 5).unwrap();
        assert_eq!(info.header(), (0x0303, libc::TLS_CIPHER_CHACHA20_POLY1305));
        assert_eq!(info.iv(), &nonce()[..]);
        assert!(info.salt().is_empty());
        assert_eq!(info.nonce_base(), nonce());
        assert_eq!(info.seq(), 5);
        assert_eq!(info.as_sockopt().1 as usize, 56);
    }

    #[test]
    fn wrong_key_length_is_refused() {
        let err =
            CryptoInfo::new(Version::Tls13, Cipher::Aes256Gcm, &[0; 16], &nonce(), 0).unwrap_err();
        assert_eq!(
            err,
            KeyLengthError {
                cipher: Cipher::Aes256Gcm,
                expected: 32,
                got: 16
            }
        );
        assert_eq!(
            err.to_string(),
            "AES-256-GCM needs a 32-byte key, got 16 bytes"
        );
    }

    #[test]
    fn debug_does_not_print_keys() {
        let info =
            CryptoInfo::new(Version::Tls13, Cipher::Aes128Gcm, &[0x5a; 16], &nonce(), 3).unwrap();
        let text = format!("{info:?}");
        assert!(
            text.contains("Aes128Gcm") && text.contains("seq: 3"),
            "{text}"
        );
        assert!(!text.contains("90"), "{text}"); // 0x5a
    }

    fn record_type_cmsg(ty: u8) -> Vec<u8> {
        let mut buf = vec![0u8; cmsg::space(1)];
        cmsg::encode(&mut buf, libc::SOL_TLS, libc::TLS_GET_RECORD_TYPE, &[ty]);
        buf
    }

    #[test]
    fn record_type_cmsg_is_found() {
        assert_eq!(parse_record_type_cmsg(&record_type_cmsg(21)), Some(21));
        assert_eq!(parse_record_type_cmsg(&record_type_cmsg(23)), Some(23));
        // As the kernel lays it out: len = 17, padded to 24.
        let buf = record_type_cmsg(22);
        assert_eq!(buf.len(), 24);
        assert_eq!(usize::from_ne_bytes(buf[..8].try_into().unwrap()), 17);
        assert_eq!(buf[16], 22);
    }

    #[test]
    fn record_type_cmsg_after_another_message() {
        let mut buf = vec![0u8; 64];
        let n = cmsg::encode(
            &mut buf,
            libc::SOL_SOCKET,
            libc::SO_RXQ_OVFL,
            &9u32.to_ne_bytes(),
        );
        let m = cmsg::encode(
            &mut buf[n..],
            libc::SOL_TLS,
            libc::TLS_GET_RECORD_TYPE,
            &[22],
        );
        assert_eq!(parse_record_type_cmsg(&buf[..n + m]), Some(22));
    }

    #[test]
    fn missing_or_malformed_record_type_cmsg() {
        assert_eq!(parse_record_type_cmsg(&[]), None);
        // Another level, or another type at SOL_TLS.
        let mut buf = vec![0u8; 24];
        cmsg::encode(&mut buf, libc::SOL_SOCKET, libc::TLS_GET_RECORD_TYPE, &[21]);
        assert_eq!(parse_record_type_cmsg(&buf), None);
        cmsg::encode(&mut buf, libc::SOL_TLS, libc::TLS_SET_RECORD_TYPE, &[21]);
        assert_eq!(parse_record_type_cmsg(&buf), None);
        // No data byte.
        cmsg::encode(&mut buf, libc::SOL_TLS, libc::TLS_GET_RECORD_TYPE, &[]);
        assert_eq!(parse_record_type_cmsg(&buf[..16]), None);
        // Cut short (controllen smaller than the header says).
        let buf = record_type_cmsg(21);
        assert_eq!(parse_record_type_cmsg(&buf[..16]), None);
        // A length field pointing past the buffer.
        let mut buf = record_type_cmsg(21);
        buf[..8].copy_from_slice(&100usize.to_ne_bytes());
        assert_eq!(parse_record_type_cmsg(&buf), None);
    }

    #[test]
    fn recv_record_on_a_plain_socket_reads_application_data() {
        use std::io::Write;
        let (mut client, server) = loopback_pair().unwrap();
        client.write_all(b"plain bytes").unwrap();
        let mut buf = [0u8; 64];
        let got = recv_record(server.as_fd(), &mut buf).unwrap();
        assert_eq!(
            got,
            RecvRecord {
                len: 11,
                record_type: record_type::APPLICATION_DATA
            }
        );
        assert_eq!(&buf[..11], b"plain bytes");
        drop(client);
        assert_eq!(recv_record(server.as_fd(), &mut buf).unwrap().len, 0);
    }

    #[test]
    fn keys_need_the_ulp_and_plain_tcp_ignores_record_types() {
        use std::io::Read;
        let (client, mut server) = loopback_pair().unwrap();
        let info =
            CryptoInfo::new(Version::Tls13, Cipher::Aes128Gcm, &[0; 16], &nonce(), 0).unwrap();
        assert!(set_crypto_info(client.as_fd(), Direction::Tx, &info).is_err());
        // Without kTLS keys, TCP ignores the record-type control message
        // and sends the bytes as they are: `send_record` is only for
        // sockets with `TLS_TX` set.
        assert_eq!(
            send_record(client.as_fd(), record_type::ALERT, &[1, 0]).unwrap(),
            2
        );
        let mut got = [0u8; 2];
        server.read_exact(&mut got).unwrap();
        assert_eq!(got, [1, 0]);
    }

    #[test]
    fn probe_agrees_with_this_kernel() {
        let listed = available_ulps().unwrap_or_default();
        match tls_ulp_available() {
            Ok(()) => {
                // With the ULP, at least the baseline suite works both ways.
                kernel_supports(Version::Tls13, Cipher::Aes128Gcm).unwrap();
                println!(
                    "kernel TLS available (tcp_available_ulp: {listed}); rekey: {:?}",
                    kernel_can_rekey()
                );
            }
            Err(reason) => {
                println!("kernel TLS unavailable: {reason}");
                assert!(!reason.is_empty());
                if reason.contains("no TLS ULP") {
                    assert!(!listed.split_whitespace().any(|u| u == "tls"), "{listed}");
                }
                // Every suite reports the same reason, and attaching the
                // ULP to a fresh socket fails as the probe said.
                for v in Version::ALL {
                    for c in Cipher::ALL {
                        assert_eq!(kernel_supports(v, c), Err(reason));
                    }
                }
                assert_eq!(kernel_can_rekey(), Err(reason));
                let (client, _server) = loopback_pair().unwrap();
                if reason.contains("no TLS ULP") {
                    let e = enable_tls_ulp(client.as_fd()).unwrap_err();
                    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
                }
            }
        }
        // Cached: the same answer again.
        assert_eq!(tls_ulp_available(), tls_ulp_available());
    }

    #[test]
    fn reasons_say_what_is_missing() {
        let enoent = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(
            ulp_missing_reason(&enoent, Some("mptcp")),
            "the kernel has no TLS ULP (tcp_available_ulp: mptcp): build it with \
             CONFIG_TLS or load it with `modprobe tls`"
        );
        assert!(ulp_missing_reason(&enoent, Some("")).contains("tcp_available_ulp is empty"));
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        let text = ulp_missing_reason(&eperm, None);
        assert!(
            text.starts_with("attaching the TLS ULP to a TCP socket failed: "),
            "{text}"
        );
    }
}
