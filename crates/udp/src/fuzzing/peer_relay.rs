//! The peer-relay table as a state machine (see [`peer_relay_port`]).

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferry_proto::disco::{self, AllocateRequest, BindBody, Message};
use ferry_proto::frame::canonical_addr;
use ferry_proto::key::{DiscoPrivate, NodePublic};
use ferry_proto::nacl::SharedKey;
use ferry_proto::peer_relay as pr;
use ferry_proto::udp_header::{Header, Protocol};

use super::MAX_OPS;
use crate::peer_relay::{Drop, Limits, PeerRelayTable, Verdict};

/// The clients' and the relay's keys, and each client's box key with the
/// relay, made once (X25519 is slow in unoptimised builds).
pub(super) struct Keys {
    pub(super) clients: Vec<DiscoPrivate>,
    pub(super) server: DiscoPrivate,
    pub(super) boxes: Vec<SharedKey>,
}

pub(super) fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let clients: Vec<DiscoPrivate> = (1u8..=4)
            .map(|b| DiscoPrivate::from_bytes([b; 32]))
            .collect();
        let server = DiscoPrivate::from_bytes([9; 32]);
        let boxes = clients.iter().map(|c| c.shared(&server.public())).collect();
        Keys {
            clients,
            server,
            boxes,
        }
    })
}

/// Drives a peer-relay table ([`PeerRelayTable`]) as a state machine: the
/// input is a sequence of 4-byte operations (op, a, b, c) over four
/// clients' disco keys and eight source addresses (one written
/// IPv4-mapped, one IPv6): allocations, honest clients binding (bind,
/// challenge, answer), answers with forged challenges, the last honest
/// answer replayed from another source, data with known or unknown VNIs
/// from any source, arbitrary control bytes, and time passing (expiry,
/// secret rotation). After each operation it checks:
///
/// - a challenge is written over the bind and is no longer than it;
/// - only an honest client's answer from the source it bound from binds:
///   forged and replayed ones never do;
/// - data goes only between two addresses honest clients bound in that
///   endpoint, never back to its source;
/// - the table holds no more endpoints than its limit, its states add up,
///   and every allocated endpoint is in it or counted as freed;
/// - nothing panics.
pub fn peer_relay_port(data: &[u8]) {
    let Keys {
        clients,
        server,
        boxes,
    } = keys();
    let source = |i: u8| match i % 8 {
        6 => SocketAddr::from((Ipv4Addr::new(10, 1, 0, 1).to_ipv6_mapped(), 4001)),
        7 => SocketAddr::from((Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7), 4007)),
        n => SocketAddr::from((Ipv4Addr::new(10, 1, 0, n), 4000 + u16::from(n))),
    };
    let limits = Limits {
        per_requester: 3,
        per_disco: 2,
        total: 4,
        ..Limits::default()
    };
    let mut now = Instant::now();
    let mut table = PeerRelayTable::with_seed(server.clone(), limits, 5, 0, now);
    // Endpoints the table gave: vni -> pair of client indices (sorted as
    // the table sorts the keys).
    let mut endpoints: Vec<(u32, [usize; 2])> = Vec::new();
    // What honest clients bound: (vni, slot) -> source.
    let mut bound: HashMap<(u32, usize), SocketAddr> = HashMap::new();
    let mut generation = 0u32;
    let mut last_answer: Option<(Vec<u8>, SocketAddr)> = None;
    let seal = |c: usize, vni: u32, msg: &Message| {
        let mut d = Vec::new();
        pr::put_control(&mut d, vni, &boxes[c], &clients[c].public(), &[1; 24], msg);
        d
    };
    for op in data.chunks_exact(4).take(MAX_OPS) {
        let (a, b, c) = (op[1], op[2], op[3]);
        let pick = |i: u8| {
            endpoints
                .get(usize::from(i) % endpoints.len().max(1))
                .copied()
        };
        match op[0] % 7 {
            0 => {
                let (x, y) = (usize::from(a % 4), usize::from(b % 4));
                let req = AllocateRequest {
                    client_disco: [clients[x].public(), clients[y].public()],
                    generation: u32::from(c),
                };
                let addrs = [source(0)];
                if let Ok(al) = table.allocate(&NodePublic([c % 2; 32]), &req, &addrs, now) {
                    let e = &al.response.endpoint;
                    assert_eq!(al.response.generation, u32::from(c));
                    assert!(x != y && e.vni != 0);
                    let mut pair = [x, y];
                    pair.sort_by_key(|&i| clients[i].public());
                    assert_eq!(e.client_disco, pair.map(|i| clients[i].public()));
                    if !endpoints.iter().any(|&(v, _)| v == e.vni) {
                        endpoints.push((e.vni, pair));
                    }
                }
            }
            1 | 2 => {
                // An honest bind of slot a%2, from source b; op 2 then
                // forges the challenge.
                let Some((vni, pair)) = pick(c) else { continue };
                let slot = usize::from(a % 2);
                let from = source(b);
                generation = generation.wrapping_add(1).max(1);
                let body = BindBody {
                    vni,
                    generation,
                    remote_key: clients[pair[1 - slot]].public(),
                    challenge: [0; 32],
                };
                let mut d = seal(pair[slot], vni, &Message::Bind(body));
                let len = d.len();
                let Verdict::Reply(n) = table.handle(now, from, &mut d) else {
                    continue; // the endpoint expired
                };
                assert!(n == pr::CONTROL_LEN && n <= len);
                let key = &boxes[pair[slot]];
                let Ok(Message::BindChallenge(mut ch)) = disco::open(key, &d[8..n]) else {
                    panic!("the client cannot read its challenge");
                };
                let honest = op[0] % 7 == 1;
                if !honest {
                    ch.challenge[usize::from(c) % 32] ^= 1;
                }
                let mut answer = seal(pair[slot], vni, &Message::BindAnswer(ch));
                let copy = answer.clone();
                match table.handle(now, from, &mut answer) {
                    Verdict::Bound => {
                        assert!(honest, "a forged challenge bound");
                        bound.insert((vni, slot), canonical_addr(from));
                        last_answer = Some((copy, from));
                    }
                    Verdict::Drop(Drop::BadChallenge) => assert!(!honest),
                    v => panic!("an answer got {v:?}"),
                }
            }
            3 => {
                // The last honest answer, replayed from source a.
                let Some((mut d, orig)) = last_answer.clone() else {
                    continue;
                };
                let from = source(a);
                let v = table.handle(now, from, &mut d);
                if canonical_addr(from) != canonical_addr(orig) {
                    assert_ne!(v, Verdict::Bound, "a replay from elsewhere bound");
                }
            }
            4 | 5 => {
                // Data (op 4) or arbitrary control bytes (op 5) from
                // source a for endpoint b (or an unknown VNI).
                let vni = pick(b).map_or(0x00ab_cdef, |(v, _)| v);
                let from = canonical_addr(source(a));
                let mut d = if op[0] % 7 == 4 {
                    Header::data(Protocol::Payload, vni).to_bytes().to_vec()
                } else {
                    Header::bind(vni).to_bytes().to_vec()
                };
                d.extend(std::iter::repeat_n(c, usize::from(c)));
                match table.handle(now, from, &mut d) {
                    Verdict::Forward(to) => {
                        let ends = [0, 1].map(|s| bound.get(&(vni, s)).copied());
                        assert!(
                            from != to && ends.contains(&Some(from)) && ends.contains(&Some(to)),
                            "forwarded {from} -> {to} in {vni:#x}, bound {ends:?}"
                        );
                    }
                    Verdict::Bound | Verdict::Reply(_) => {
                        panic!("bytes no client sealed were taken as a bind")
                    }
                    Verdict::Drop(_) => {}
                }
            }
            _ => {
                now += Duration::from_secs(u64::from(a) * 4);
                table.rotate(now);
                table.expire(now);
                endpoints.retain(|&(v, _)| table.has_endpoint(v));
                bound.retain(|&(v, _), _| table.has_endpoint(v));
            }
        }
        let s = table.states();
        assert_eq!(s.connecting + s.open, table.len());
        assert!(table.len() <= limits.total);
        let n = table.counters();
        assert_eq!(
            n.allocated,
            table.len() as u64 + n.freed_bind_timeout + n.freed_idle + n.freed_revoked,
            "endpoints neither in the table nor freed"
        );
    }
}
