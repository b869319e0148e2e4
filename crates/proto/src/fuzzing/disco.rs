//! Fuzz entry points for Tailscale's disco messages and a peer relay's
//! bind steps (see the parent module for how they are used).

use std::net::SocketAddr;
use std::sync::OnceLock;

use crate::disco::{self, Message};
use crate::key::DiscoPrivate;
use crate::nacl::SharedKey;
use crate::peer_relay::{self as pr, BindStep};
use crate::udp_header::Header;

struct Keys {
    client: DiscoPrivate,
    other: DiscoPrivate,
    server: DiscoPrivate,
    /// client → server, and the server's side of it.
    client_box: SharedKey,
    server_box: SharedKey,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        // The keys of interop/testdata/disco-vectors.txt, so Tailscale's
        // sealed bind is a seed that opens.
        let key = |start: u8| DiscoPrivate::from_bytes(core::array::from_fn(|i| start + i as u8));
        let (client, server) = (key(0x01), key(0x41));
        Keys {
            client_box: client.shared(&server.public()),
            server_box: server.shared(&client.public()),
            other: key(0x21),
            client,
            server,
        }
    })
}

/// Disco plaintexts and packets: what parses re-encodes to a plaintext
/// that parses to the same message; a packet opened in place gives what
/// the copying open gives; a parsed message sealed and opened again is
/// itself.
pub fn disco(data: &[u8]) {
    let k = keys();
    if let Ok(m) = Message::parse(data) {
        let again = m.to_vec();
        assert_eq!(Message::parse(&again).as_ref(), Ok(&m));
        assert!(again.len() <= data.len().max(2 + disco::TX_ID_LEN + 32));
        let mut packet = Vec::new();
        disco::seal(&mut packet, &k.client_box, &k.client.public(), &[5; 24], &m);
        assert_eq!(disco::sender(&packet), Some(k.client.public()));
        assert_eq!(disco::open(&k.server_box, &packet), Ok(m));
    }
    let copied = disco::open(&k.server_box, data);
    let mut buf = data.to_vec();
    match disco::open_in_place(&k.server_box, &mut buf) {
        Ok(plain) => assert_eq!(Message::parse(plain), copied),
        Err(e) => {
            assert_eq!(copied, Err(e));
            assert_eq!(buf, data, "a failed open leaves the bytes");
        }
    }
}

/// A relay's bind steps. `data[0]` picks the input: even, the rest as a
/// whole datagram; odd, the rest as a plaintext the client seals to the
/// relay (so the checks behind the box are reached), behind a bind header
/// whose VNI is 1. Nothing panics; a bind's challenge is exactly
/// [`pr::CONTROL_LEN`] bytes (never more than came in) and opens for the
/// client as a challenge of the same endpoint, and echoing it is a valid
/// answer from the same source only.
pub fn peer_relay_bind(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let k = keys();
    let mut datagram = if sel & 1 == 0 {
        rest.to_vec()
    } else {
        let mut d = Header::bind(1).to_bytes().to_vec();
        d.extend_from_slice(&disco::MAGIC);
        d.extend_from_slice(k.client.public().as_bytes());
        k.client_box.seal_into(&mut d, &[3; 24], rest);
        d
    };
    let Ok(c) = pr::parse_control(&datagram) else {
        return;
    };
    if c.sender != k.client.public() {
        return;
    }
    let len = datagram.len();
    let Ok(step) = pr::open_bind(&k.server_box, &mut datagram, c.vni, &k.other.public()) else {
        return;
    };
    let body = *step.body();
    assert_eq!(body.vni, c.vni);
    assert_ne!(body.generation, 0);
    let src: SocketAddr = ([192, 0, 2, 1], 41641).into();
    let secret = [sel; 32];
    match step {
        BindStep::Bind(_) => {
            let cookie = pr::challenge(&secret, body.vni, 0, body.generation, src);
            let n = pr::write_challenge(
                &mut datagram,
                &k.server_box,
                &k.server.public(),
                &[4; 24],
                &body,
                cookie,
            );
            assert!(n == pr::CONTROL_LEN && n <= len);
            let msg = disco::open(&k.client_box, &datagram[8..n]).expect("the client opens it");
            let Message::BindChallenge(ch) = msg else {
                panic!("not a challenge: {msg:?}");
            };
            assert_eq!(
                ch,
                disco::BindBody {
                    challenge: cookie,
                    ..body
                }
            );
            assert!(pr::answer_is_valid(&secret, None, 0, &ch, src));
            let elsewhere: SocketAddr = ([192, 0, 2, 2], 41641).into();
            assert!(!pr::answer_is_valid(&secret, None, 0, &ch, elsewhere));
        }
        BindStep::Answer(b) => {
            let _ = pr::answer_is_valid(&secret, Some(&[0; 32]), 1, &b, src);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `tailscale_bind` seed of the `peer_relay_bind` corpus must get
    /// through the box and be challenged, or mutations would never reach
    /// the checks behind it.
    #[test]
    fn the_tailscale_seed_reaches_the_challenge() {
        let seed = include_bytes!("../../../../fuzz/corpus/peer_relay_bind/tailscale_bind");
        let mut d = seed[1..].to_vec();
        let c = pr::parse_control(&d).unwrap();
        let k = keys();
        let step = pr::open_bind(&k.server_box, &mut d, c.vni, &k.other.public()).unwrap();
        assert!(matches!(step, BindStep::Bind(_)));
        peer_relay_bind(seed);
    }
}
