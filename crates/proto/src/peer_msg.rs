//! Messages between two SDK peers (`docs/relay-sessions.md`, §6): payload
//! datagrams and the sealed probes (ping, pong, call-me-maybe) that confirm
//! and measure every path.
//!
//! Every peer message starts with the 8-byte [`udp_header`]
//! with the control bit clear, whatever carries it: direct UDP (VNI 0), a
//! relay session (the session's VNI) or a DERP packet (VNI 0). So one
//! [`parse`] serves every path:
//!
//! ```text
//! payload  header(7a12) ‖ application bytes
//! probe    header(7a11) ‖ "FRY1" ‖ sender key (32) ‖ box(nonce ‖ tag ‖ type u8 ‖ body)
//! ```
//!
//! The box is DERP's ([`nacl::SharedKey`]) with the sender's private key and
//! the receiver's public key. [`parse`] only splits the bytes; a probe is
//! believed once [`open_probe`] opened it with the key shared with the
//! sender it claims, which the caller checks is a configured peer.

use crate::key::{NodePublic, KEY_LEN};
use crate::nacl::{self, SharedKey};
use crate::relay_session::{endpoint_at, put_endpoint, ENDPOINT_LEN};
use crate::udp_header::{self, Header, HeaderError, Protocol};
use std::net::SocketAddr;

/// The four bytes that open a probe after the header.
pub const MAGIC: [u8; 4] = *b"FRY1";
/// Length of a ping's transaction id.
pub const TX_ID_LEN: usize = 12;
/// Zero bytes after a ping's tx id, so a ping is as large as the pong it
/// draws (no amplification by a replayed ping).
pub const PING_PADDING: usize = ENDPOINT_LEN;
/// Most addresses a call-me-maybe may carry (more is refused, so a peer
/// cannot make this side probe without bound).
pub const MAX_ENDPOINTS: usize = 32;
/// Bytes in front of the box: header, magic, sender key.
pub const PROBE_PREFIX_LEN: usize = udp_header::LEN + MAGIC.len() + KEY_LEN;

const PING: u8 = 1;
const PONG: u8 = 2;
const CALL_ME_MAYBE: u8 = 3;

/// A probe's content (what the box holds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Asks for a pong on the same path.
    Ping {
        /// Chosen by the sender, echoed in the pong.
        tx: [u8; TX_ID_LEN],
    },
    /// Answers a ping.
    Pong {
        /// The ping's transaction id.
        tx: [u8; TX_ID_LEN],
        /// The address the ping came from, as the answering side saw it
        /// (for DERP, whatever the sender chose; unused).
        observed: SocketAddr,
    },
    /// The sender's candidate direct addresses.
    CallMeMaybe {
        /// At most [`MAX_ENDPOINTS`].
        endpoints: Vec<SocketAddr>,
    },
}

/// One peer message split from a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerMessage<'a> {
    /// Application bytes.
    Payload(&'a [u8]),
    /// A probe, still sealed.
    Probe {
        /// The key the sender claims; open with the key shared with it.
        sender: NodePublic,
        /// `nonce ‖ tag ‖ ciphertext`.
        sealed: &'a [u8],
    },
}

/// Why bytes are not a peer message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerMsgError {
    /// The 8-byte header did not parse.
    #[error("peer message header: {0}")]
    Header(#[from] HeaderError),
    /// The control bit is for bind messages between a client and a relay.
    #[error("control bit set on a peer message")]
    Control,
    /// A probe shorter than its fixed prefix and box overhead.
    #[error("probe too short: {len} bytes")]
    Short {
        /// The datagram's length.
        len: usize,
    },
    /// A probe without the `FRY1` magic.
    #[error("probe without the FRY1 magic")]
    Magic,
    /// The box did not open with the claimed sender's key.
    #[error("probe box: {0}")]
    Box(#[from] nacl::BoxError),
    /// The opened box holds an unknown type or a body of the wrong size.
    #[error("probe type {kind} with a {len}-byte body")]
    Body {
        /// The type byte (0 for an empty box).
        kind: u8,
        /// The body's length.
        len: usize,
    },
}

/// Splits a datagram into its header and message. Nothing is authenticated
/// yet: a probe must go through [`open_probe`], and a payload is only as
/// trustworthy as the path it came on.
pub fn parse(datagram: &[u8]) -> Result<(Header, PeerMessage<'_>), PeerMsgError> {
    let header = Header::parse(datagram)?;
    if header.control {
        return Err(PeerMsgError::Control);
    }
    let rest = &datagram[udp_header::LEN..];
    let msg = match header.protocol {
        Protocol::Payload => PeerMessage::Payload(rest),
        Protocol::Control => {
            if datagram.len() < PROBE_PREFIX_LEN + nacl::OVERHEAD + 1 {
                return Err(PeerMsgError::Short {
                    len: datagram.len(),
                });
            }
            if rest[..MAGIC.len()] != MAGIC {
                return Err(PeerMsgError::Magic);
            }
            let key: [u8; KEY_LEN] = rest[MAGIC.len()..MAGIC.len() + KEY_LEN]
                .try_into()
                .expect("length checked");
            PeerMessage::Probe {
                sender: NodePublic::from_bytes(key),
                sealed: &datagram[PROBE_PREFIX_LEN..],
            }
        }
    };
    Ok((header, msg))
}

/// Opens a probe's box with the key shared with its claimed sender and
/// reads what it holds.
pub fn open_probe(key: &SharedKey, sealed: &[u8]) -> Result<Probe, PeerMsgError> {
    let plain = key.open(sealed)?;
    let (&kind, body) = plain
        .split_first()
        .ok_or(PeerMsgError::Body { kind: 0, len: 0 })?;
    let bad = || PeerMsgError::Body {
        kind,
        len: body.len(),
    };
    match kind {
        PING if body.len() == TX_ID_LEN + PING_PADDING
            && body[TX_ID_LEN..] == [0; PING_PADDING] =>
        {
            Ok(Probe::Ping {
                tx: body[..TX_ID_LEN].try_into().expect("length checked"),
            })
        }
        PONG if body.len() == TX_ID_LEN + ENDPOINT_LEN => Ok(Probe::Pong {
            tx: body[..TX_ID_LEN].try_into().expect("length checked"),
            observed: endpoint_at(&body[TX_ID_LEN..]),
        }),
        CALL_ME_MAYBE
            if body.len() % ENDPOINT_LEN == 0 && body.len() / ENDPOINT_LEN <= MAX_ENDPOINTS =>
        {
            Ok(Probe::CallMeMaybe {
                endpoints: body.chunks_exact(ENDPOINT_LEN).map(endpoint_at).collect(),
            })
        }
        _ => Err(bad()),
    }
}

/// Appends a payload datagram: header (VNI `vni`) ‖ `data`.
pub fn put_payload(out: &mut Vec<u8>, vni: u32, data: &[u8]) {
    out.reserve(udp_header::LEN + data.len());
    out.extend_from_slice(&Header::data(Protocol::Payload, vni).to_bytes());
    out.extend_from_slice(data);
}

/// Appends a sealed probe from `sender`, sealed with `key` (the sender's
/// private key and the receiver's public key) under `nonce`. Panics if a
/// call-me-maybe holds more than [`MAX_ENDPOINTS`] addresses (the caller's
/// bug: the receiver would refuse it).
pub fn put_probe(
    out: &mut Vec<u8>,
    vni: u32,
    sender: &NodePublic,
    key: &SharedKey,
    nonce: &[u8; nacl::NONCE_LEN],
    probe: &Probe,
) {
    let mut plain = Vec::with_capacity(1 + TX_ID_LEN + ENDPOINT_LEN);
    match probe {
        Probe::Ping { tx } => {
            plain.push(PING);
            plain.extend_from_slice(tx);
            plain.extend_from_slice(&[0; PING_PADDING]);
        }
        Probe::Pong { tx, observed } => {
            plain.push(PONG);
            plain.extend_from_slice(tx);
            put_endpoint(&mut plain, *observed);
        }
        Probe::CallMeMaybe { endpoints } => {
            assert!(
                endpoints.len() <= MAX_ENDPOINTS,
                "call-me-maybe with {} addresses, at most {MAX_ENDPOINTS}",
                endpoints.len()
            );
            plain.push(CALL_ME_MAYBE);
            for e in endpoints {
                put_endpoint(&mut plain, *e);
            }
        }
    }
    out.extend_from_slice(&Header::data(Protocol::Control, vni).to_bytes());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(sender.as_bytes());
    key.seal_into(out, nonce, &plain);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex::encode as hex_of;
    use crate::key::NodePrivate;
    use crate::testutil::{client_private, server_private, unhex};

    fn sealed(vni: u32, probe: &Probe) -> Vec<u8> {
        let mut out = Vec::new();
        let nonce: [u8; 24] = core::array::from_fn(|i| i as u8);
        let key = SharedKey::new(&client_private(), &server_private().public());
        put_probe(
            &mut out,
            vni,
            &client_private().public(),
            &key,
            &nonce,
            probe,
        );
        out
    }

    fn open(datagram: &[u8]) -> Result<(NodePublic, Probe), PeerMsgError> {
        let (_, msg) = parse(datagram)?;
        let PeerMessage::Probe { sender, sealed } = msg else {
            panic!("not a probe: {msg:?}");
        };
        let key = SharedKey::new(&server_private(), &sender);
        Ok((sender, open_probe(&key, sealed)?))
    }

    #[test]
    fn vectors_from_the_protocol_document() {
        // docs/relay-sessions.md §7, "Peer messages": the client key of
        // `docs/derp-protocol.md` §17.1 sends to its server key with nonce
        // 00 01 … 17.
        let ping = sealed(0, &Probe::Ping { tx: [0xaa; 12] });
        let pong = sealed(
            0x12_3456,
            &Probe::Pong {
                tx: [0xaa; 12],
                observed: "192.0.2.1:41641".parse().unwrap(),
            },
        );
        let cmm = sealed(
            0,
            &Probe::CallMeMaybe {
                endpoints: vec![
                    "192.0.2.1:41641".parse().unwrap(),
                    "[2001:db8::1]:41641".parse().unwrap(),
                ],
            },
        );
        let mut payload = Vec::new();
        put_payload(&mut payload, 0, b"hello");
        let doc = include_str!("../../../docs/relay-sessions.md");
        for (name, bytes) in [
            ("payload", &payload),
            ("ping", &ping),
            ("pong", &pong),
            ("call-me-maybe", &cmm),
        ] {
            let line = doc
                .lines()
                .find(|l| l.starts_with(&format!("peer {name}: ")))
                .unwrap_or_else(|| panic!("no `peer {name}:` vector in the document"));
            let want = unhex(line.split_once(": ").unwrap().1);
            assert_eq!(*bytes, want, "peer {name}: {}", hex_of(bytes));
        }
        assert_eq!(ping.len(), pong.len(), "a ping draws no larger answer");
        assert_eq!(
            payload,
            unhex("00007a12 00000000 68656c6c6f"),
            "the payload vector by hand"
        );
        assert_eq!(
            open(&ping).unwrap(),
            (client_private().public(), Probe::Ping { tx: [0xaa; 12] })
        );
    }

    #[test]
    fn probes_round_trip() {
        let a = NodePrivate::generate();
        let b = NodePrivate::generate();
        let probes = [
            Probe::Ping { tx: [7; 12] },
            Probe::Pong {
                tx: [9; 12],
                observed: "[2001:db8::5]:1".parse().unwrap(),
            },
            Probe::CallMeMaybe { endpoints: vec![] },
            Probe::CallMeMaybe {
                endpoints: (0..MAX_ENDPOINTS as u16)
                    .map(|p| SocketAddr::from(([10, 0, 0, 1], p)))
                    .collect(),
            },
        ];
        for vni in [0, 5, udp_header::MAX_VNI] {
            for p in &probes {
                let mut out = Vec::new();
                let seal = SharedKey::new(&a, &b.public());
                put_probe(&mut out, vni, &a.public(), &seal, &nacl::random_nonce(), p);
                let (h, msg) = parse(&out).unwrap();
                assert_eq!(h, Header::data(Protocol::Control, vni));
                let PeerMessage::Probe { sender, sealed } = msg else {
                    panic!("{msg:?}")
                };
                assert_eq!(sender, a.public());
                let got = open_probe(&SharedKey::new(&b, &a.public()), sealed).unwrap();
                assert_eq!(&got, p);
            }
        }
    }

    #[test]
    fn payload_round_trips() {
        let mut out = Vec::new();
        put_payload(&mut out, 77, b"");
        assert_eq!(
            parse(&out).unwrap(),
            (
                Header::data(Protocol::Payload, 77),
                PeerMessage::Payload(b"")
            )
        );
    }

    #[test]
    fn refuses_what_is_not_a_peer_message() {
        let ping = sealed(0, &Probe::Ping { tx: [1; 12] });
        // Bind messages (control bit) are the relay's business.
        let mut bind = ping.clone();
        bind[1] = 0x80;
        assert_eq!(parse(&bind), Err(PeerMsgError::Control));
        assert_eq!(
            parse(&ping[..7]),
            Err(PeerMsgError::Header(HeaderError::Short))
        );
        let mut magic = ping.clone();
        magic[8] = b'X';
        assert_eq!(parse(&magic), Err(PeerMsgError::Magic));
        assert_eq!(
            parse(&ping[..PROBE_PREFIX_LEN + nacl::OVERHEAD]),
            Err(PeerMsgError::Short {
                len: PROBE_PREFIX_LEN + nacl::OVERHEAD
            })
        );
        // A claimed sender whose key does not open the box.
        let mut forged = ping.clone();
        forged[12] ^= 1;
        assert_eq!(
            open(&forged),
            Err(PeerMsgError::Box(nacl::BoxError::AuthFailed))
        );
        let mut tampered = ping.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert_eq!(
            open(&tampered),
            Err(PeerMsgError::Box(nacl::BoxError::AuthFailed))
        );
    }

    #[test]
    fn refuses_bad_bodies_inside_a_good_box() {
        let a = client_private();
        let key = SharedKey::new(&a, &server_private().public());
        let open_key = SharedKey::new(&server_private(), &a.public());
        let mut too_many = vec![CALL_ME_MAYBE];
        too_many.extend(std::iter::repeat_n(0u8, ENDPOINT_LEN * (MAX_ENDPOINTS + 1)));
        for (plain, kind, len) in [
            (vec![], 0, 0),
            (vec![PING; 13], PING, 12),
            (vec![PING; 31], PING, 30),
            (vec![PONG; 13], PONG, 12),
            (vec![CALL_ME_MAYBE; 18], CALL_ME_MAYBE, 17),
            (vec![9, 0, 0], 9, 2),
            (too_many, CALL_ME_MAYBE, ENDPOINT_LEN * (MAX_ENDPOINTS + 1)),
        ] {
            let sealed = key.seal(&nacl::random_nonce(), &plain);
            assert_eq!(
                open_probe(&open_key, &sealed),
                Err(PeerMsgError::Body { kind, len })
            );
        }
    }
}
