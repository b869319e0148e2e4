//! The peer-relay port's control path in batches (see
//! [`peer_relay_controls`]).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferry_proto::disco::{self, AllocateRequest, BindBody, Message};
use ferry_proto::key::NodePublic;
use ferry_proto::peer_relay as pr;
use ferry_proto::udp_header::Header;

use super::peer_relay::{keys, Keys};
use super::MAX_OPS;
use crate::peer_relay::port::Controls;
use crate::peer_relay::{Limits, PeerRelayTable};

/// What a datagram of the batch is, for the checks after it ran.
#[derive(Clone, Copy)]
enum Sent {
    /// A bind from client `client` for `vni`.
    Bind { client: usize, vni: u32 },
    /// An answer that may bind: the challenge for `vni` as received,
    /// echoed from the source it was challenged at.
    Honest { vni: u32 },
    /// Anything else: a forged or displaced answer, bytes.
    Other,
}

/// Drives the port's control path (the crate's `Controls`: per-source limit, shape,
/// look-up under the table, opening without it, binding under it again)
/// over batches of control datagrams against a table of two endpoints
/// (clients 0 and 1, 2 and 3). The input is 4-byte operations (op, a, b,
/// c): a client's bind (for its endpoint or the other one) from one of
/// eight sources; the answer to the last challenge a client got, echoed
/// honestly, with its challenge altered, or from another source;
/// arbitrary bytes behind a control header; running the batch (now, or
/// with one endpoint freed and made again between the look-up and the
/// binding); time passing (secret rotation, expiry). After each batch it
/// checks:
///
/// - every reply is a challenge of [`pr::CONTROL_LEN`] bytes written over
///   a bind of this batch, sent back to that bind's source, that its
///   client opens for the bind's VNI;
/// - binds happen only for honest answers (altered or displaced ones,
///   and arbitrary bytes, never bind), and none for an endpoint freed
///   between the look-up and the binding;
/// - the table holds at most its two endpoints;
/// - nothing panics.
pub fn peer_relay_controls(data: &[u8]) {
    let Keys {
        clients,
        server,
        boxes,
    } = keys();
    let source =
        |i: u8| SocketAddr::from((Ipv4Addr::new(10, 2, 0, i % 8), 5000 + u16::from(i % 8)));
    let limits = Limits {
        bind_rate: 8,
        bind_burst: 16,
        ..Limits::default()
    };
    let mut now = Instant::now();
    let mut table = PeerRelayTable::with_seed(server.clone(), limits, 7, 0, now);
    let relay = [SocketAddr::from(([192, 0, 2, 10], 40000))];
    // The endpoint of clients (0, 1) and of (2, 3), made again when gone.
    let mut vnis = [0u32; 2];
    let ensure = |table: &mut PeerRelayTable, vnis: &mut [u32; 2], now: Instant| {
        for (e, vni) in vnis.iter_mut().enumerate() {
            if *vni != 0 && table.has_endpoint(*vni) {
                continue;
            }
            let req = AllocateRequest {
                client_disco: [clients[2 * e].public(), clients[2 * e + 1].public()],
                generation: 1,
            };
            let requester = NodePublic([e as u8 + 1; 32]);
            *vni = table
                .allocate(&requester, &req, &relay, now)
                .map_or(0, |a| a.response.endpoint.vni);
        }
    };
    ensure(&mut table, &mut vnis, now);
    let mut controls = Controls::new(&limits);
    let mut buf: Vec<u8> = Vec::new();
    let mut batch: Vec<(SocketAddr, usize, usize, Sent)> = Vec::new();
    // The last challenge each client got, and where.
    let mut challenges: HashMap<usize, (BindBody, SocketAddr)> = HashMap::new();
    let mut generation = 0u32;
    let seal = |c: usize, vni: u32, msg: &Message| {
        let mut d = Vec::new();
        pr::put_control(&mut d, vni, &boxes[c], &clients[c].public(), &[2; 24], msg);
        d
    };
    for op in data.chunks_exact(4).take(MAX_OPS) {
        let (a, b, c) = (op[1], op[2], op[3]);
        let mut add = |buf: &mut Vec<u8>, src: SocketAddr, d: &[u8], sent: Sent| {
            batch.push((src, buf.len(), d.len(), sent));
            buf.extend_from_slice(d);
        };
        match op[0] % 5 {
            0 => {
                // A bind from client a%4 for its endpoint (b even) or the
                // other (b odd), from source c.
                let client = usize::from(a % 4);
                let e = (client / 2) ^ usize::from(b & 1);
                let vni = vnis[e];
                generation = generation.wrapping_add(1).max(1);
                let body = BindBody {
                    vni,
                    generation,
                    remote_key: clients[client ^ 1].public(),
                    challenge: [0; 32],
                };
                let d = seal(client, vni, &Message::Bind(body));
                let sent = if e == client / 2 {
                    Sent::Bind { client, vni }
                } else {
                    Sent::Other
                };
                add(&mut buf, source(c), &d, sent);
            }
            1 => {
                // The answer to client a%4's last challenge: b%3 == 0
                // honest, 1 altered, 2 from source c.
                let client = usize::from(a % 4);
                let Some(&(mut body, at)) = challenges.get(&client) else {
                    continue;
                };
                let (from, sent) = match b % 3 {
                    0 => (at, Sent::Honest { vni: body.vni }),
                    1 => {
                        body.challenge[usize::from(c) % 32] ^= 1;
                        (at, Sent::Other)
                    }
                    _ if source(c) == at => (at, Sent::Honest { vni: body.vni }),
                    _ => (source(c), Sent::Other),
                };
                let d = seal(client, body.vni, &Message::BindAnswer(body));
                add(&mut buf, from, &d, sent);
            }
            2 => {
                // Bytes behind a control header for endpoint a&1 (or VNI
                // 0x00abcdef), from source b.
                let vni = if a & 2 == 0 {
                    vnis[usize::from(a & 1)]
                } else {
                    0x00ab_cdef
                };
                let mut d = Header::bind(vni).to_bytes().to_vec();
                d.extend(std::iter::repeat_n(c, usize::from(c)));
                add(&mut buf, source(b), &d, Sent::Other);
            }
            3 => {
                // Run the batch, a ms later; a odd: endpoint b&1 freed and
                // made again between the look-up and the binding.
                now += Duration::from_millis(u64::from(a));
                for &(src, at, len, _) in &batch {
                    controls.defer(src, at, &buf[at..at + len], now);
                }
                controls.look_up(&table);
                let freed = if a & 1 == 1 {
                    let e = usize::from(b & 1);
                    let gone = vnis[e];
                    table.revoke(|r| *r != NodePublic([e as u8 + 1; 32]));
                    ensure(&mut table, &mut vnis, now);
                    Some(gone)
                } else {
                    None
                };
                let binds = table.counters().binds;
                if controls.open(&mut buf) {
                    controls.apply(&mut table, now);
                }
                let mut replies = Vec::new();
                controls.finish(|to, at, n| replies.push((to, at, n)));
                for (to, at, n) in replies {
                    let &(src, _, len, sent) = batch
                        .iter()
                        .find(|x| x.1 == at)
                        .expect("a reply over a datagram of the batch");
                    let Sent::Bind { client, vni } = sent else {
                        panic!("a reply to something else than a bind");
                    };
                    assert!(to == src && n == pr::CONTROL_LEN && n <= len);
                    let Ok(Message::BindChallenge(ch)) =
                        disco::open(&boxes[client], &buf[at + 8..at + n])
                    else {
                        panic!("client {client} cannot read its challenge");
                    };
                    assert_eq!(ch.vni, vni);
                    challenges.insert(client, (ch, src));
                }
                // Honest answers, but none for an endpoint freed after
                // the look-up: its slots are gone with it.
                let honest = batch
                    .iter()
                    .filter(|x| matches!(x.3, Sent::Honest { vni } if Some(vni) != freed))
                    .count() as u64;
                let bound = table.counters().binds - binds;
                assert!(
                    bound <= honest,
                    "{bound} binds from {honest} honest answers"
                );
                batch.clear();
                buf.clear();
            }
            _ => {
                now += Duration::from_secs(u64::from(a) * 4);
                table.rotate(now);
                table.expire(now);
                ensure(&mut table, &mut vnis, now);
            }
        }
        assert!(table.len() <= 2);
    }
}
