use super::*;
use crate::key::DiscoPrivate;

/// The vectors tailscale.com/disco wrote (interop/discovectors).
const VECTORS: &str = include_str!("../../../../interop/testdata/disco-vectors.txt");

fn vector(name: &str) -> Vec<u8> {
    let line = VECTORS
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no vector {name}"));
    crate::testutil::unhex(line)
}

fn seq<const N: usize>(start: u8) -> [u8; N] {
    core::array::from_fn(|i| start.wrapping_add(i as u8))
}

/// The keys of the vectors: clamped from 32 bytes counting up from 0x01,
/// 0x21 and 0x41.
fn keys() -> [DiscoPrivate; 3] {
    [0x01, 0x21, 0x41].map(|s| DiscoPrivate::from_bytes(seq(s)))
}

fn endpoint() -> RelayEndpoint {
    let [a, b, s] = keys();
    let mut pair = [a.public(), b.public()];
    pair.sort();
    RelayEndpoint {
        server_disco: s.public(),
        client_disco: pair,
        lamport_id: 0x0102_0304_0506_0708,
        vni: 0xab_cdef,
        bind_lifetime: Duration::from_secs(30),
        steady_state_lifetime: Duration::from_secs(300),
        endpoints: vec![
            "192.0.2.10:40000".parse().unwrap(),
            "[2001:db8::10]:40000".parse().unwrap(),
        ],
    }
}

fn bind_body(challenge: [u8; 32]) -> BindBody {
    BindBody {
        vni: 0x12_3456,
        generation: 7,
        remote_key: keys()[1].public(),
        challenge,
    }
}

fn messages() -> Vec<(&'static str, Message)> {
    let [a, b, _] = keys();
    let tx = seq(0);
    let response = Message::AllocateResponse(AllocateResponse {
        generation: 0x0102_0304,
        endpoint: endpoint(),
    });
    vec![
        (
            "ping",
            Message::Ping(Ping {
                tx_id: tx,
                node_key: Some(NodePublic(seq(0xa0))),
                padding: 3,
            }),
        ),
        (
            "ping_no_key",
            Message::Ping(Ping {
                tx_id: tx,
                node_key: None,
                padding: 0,
            }),
        ),
        (
            "pong",
            Message::Pong(Pong {
                tx_id: tx,
                src: "192.0.2.1:41641".parse().unwrap(),
            }),
        ),
        (
            "pong_v6",
            Message::Pong(Pong {
                tx_id: tx,
                src: "[2001:db8::1]:12345".parse().unwrap(),
            }),
        ),
        (
            "call_me_maybe",
            Message::CallMeMaybe(vec![
                "192.0.2.1:41641".parse().unwrap(),
                "[2001:db8::2]:41642".parse().unwrap(),
            ]),
        ),
        ("call_me_maybe_empty", Message::CallMeMaybe(Vec::new())),
        ("bind", Message::Bind(bind_body([0; 32]))),
        (
            "bind_challenge",
            Message::BindChallenge(bind_body(seq(0x80))),
        ),
        ("bind_answer", Message::BindAnswer(bind_body(seq(0x80)))),
        ("call_me_maybe_via", Message::CallMeMaybeVia(endpoint())),
        (
            "allocate_request",
            Message::AllocateRequest(AllocateRequest {
                client_disco: [b.public(), a.public()],
                generation: 0x0102_0304,
            }),
        ),
        ("allocate_response", response),
    ]
}

#[test]
fn plaintexts_are_tailscales_byte_for_byte() {
    let all = messages();
    for (name, msg) in &all {
        let want = vector(name);
        assert_eq!(msg.to_vec(), want, "{name}");
        assert_eq!(Message::parse(&want).as_ref(), Ok(msg), "{name}");
    }
    // Every plaintext line of the file is covered.
    let lines = VECTORS
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("sealed_") && !l.is_empty())
        .count();
    assert_eq!(lines, all.len());
}

#[test]
fn sealed_packets_are_tailscales_byte_for_byte() {
    let [a, _, s] = keys();
    let msgs = messages();
    let msg = |n: &str| msgs.iter().find(|(m, _)| *m == n).unwrap().1.clone();
    let cases = [
        ("sealed_bind", &a, &s, msg("bind"), 0x00),
        (
            "sealed_allocate_response",
            &s,
            &a,
            msg("allocate_response"),
            0x30,
        ),
    ];
    for (name, from, to, m, nonce) in cases {
        let want = vector(name);
        let mut got = Vec::new();
        seal(
            &mut got,
            &from.shared(&to.public()),
            &from.public(),
            &seq(nonce),
            &m,
        );
        assert_eq!(got, want, "{name}");
        assert_eq!(sender(&want), Some(from.public()));
        let key = to.shared(&from.public());
        assert_eq!(open(&key, &want), Ok(m.clone()), "{name}");
        let mut buf = want.clone();
        let plain = open_in_place(&key, &mut buf).unwrap();
        assert_eq!(Message::parse(plain), Ok(m), "{name}");
    }
    // A bind in its UDP header is the 160 bytes a relay sees.
    assert_eq!(crate::udp_header::LEN + vector("sealed_bind").len(), 160);
    assert_eq!(BIND_PACKET_LEN, 152);
}

#[test]
fn tampered_or_misaddressed_packets_do_not_open() {
    let [a, b, s] = keys();
    let mut p = vector("sealed_bind");
    let key = s.shared(&a.public());
    for i in [HEADER_LEN, HEADER_LEN + 24, HEADER_LEN + 40, p.len() - 1] {
        p[i] ^= 1;
        assert_eq!(open(&key, &p), Err(DiscoError::BadBox), "byte {i}");
        let before = p.clone();
        assert_eq!(open_in_place(&key, &mut p), Err(DiscoError::BadBox));
        assert_eq!(p, before);
        p[i] ^= 1;
    }
    // Sealed to S, not to B.
    assert_eq!(open(&b.shared(&a.public()), &p), Err(DiscoError::BadBox));
    p[0] ^= 1;
    assert_eq!(sender(&p), None);
    assert_eq!(open(&key, &p), Err(DiscoError::NotDisco));
    p[0] ^= 1;
    assert_eq!(sender(&p[..OVERHEAD - 1]), None);
    assert_eq!(open(&key, &p[..OVERHEAD]), Err(DiscoError::BadBox));
}

#[test]
fn malformed_plaintexts_are_refused() {
    let short = |ty: u8, len: usize| Err(DiscoError::Short { ty, len });
    assert_eq!(Message::parse(&[]), short(0, 0));
    assert_eq!(Message::parse(&[1]), short(1, 1));
    assert_eq!(Message::parse(&[1, 0, 1, 2]), short(1, 4));
    assert_eq!(Message::parse(&[2, 0, 0]), short(2, 3));
    assert_eq!(
        Message::parse(&[0x0a, 0]),
        Err(DiscoError::UnknownType(0x0a))
    );
    assert_eq!(Message::parse(&[0, 0]), Err(DiscoError::UnknownType(0)));
    let bind = vector("bind");
    assert_eq!(Message::parse(&bind[..73]), short(4, 73));
    // Trailing bytes after a fixed-size body are ignored, as Tailscale does.
    let mut longer = bind.clone();
    longer.extend_from_slice(&[9; 5]);
    assert_eq!(Message::parse(&longer), Message::parse(&bind));
    // The version matters only to 03, 07, 08 and 09.
    let mut v1 = bind.clone();
    v1[1] = 1;
    assert!(Message::parse(&v1).is_ok());
    for name in [
        "call_me_maybe",
        "call_me_maybe_via",
        "allocate_request",
        "allocate_response",
    ] {
        let mut m = vector(name);
        m[1] = 2;
        assert_eq!(
            Message::parse(&m),
            Err(DiscoError::Version {
                ty: m[0],
                version: 2
            }),
            "{name}"
        );
    }
    // Endpoint lists: whole endpoints only; at least one in an endpoint.
    let cmm = vector("call_me_maybe");
    assert_eq!(
        Message::parse(&cmm[..cmm.len() - 1]),
        Err(DiscoError::Endpoints { ty: 3 })
    );
    let resp = vector("allocate_response");
    let fixed = 2 + 4 + RELAY_ENDPOINT_FIXED_LEN;
    assert_eq!(
        Message::parse(&resp[..fixed]),
        Err(DiscoError::Endpoints { ty: 9 })
    );
    assert_eq!(Message::parse(&resp[..fixed - 1]), short(9, fixed - 1 - 6));
    let mut negative = resp.clone();
    negative[2 + 4 + 108] = 0x80;
    assert_eq!(Message::parse(&negative), Err(DiscoError::NegativeLifetime));
}

#[test]
fn lifetimes_are_go_durations() {
    let resp = vector("allocate_response");
    // 30 s and 5 min in nanoseconds.
    let at = 2 + 4 + 108;
    assert_eq!(resp[at..at + 8], 30_000_000_000u64.to_be_bytes());
    assert_eq!(resp[at + 8..at + 16], 300_000_000_000u64.to_be_bytes());
    let mut e = endpoint();
    e.bind_lifetime = Duration::MAX;
    let mut out = Vec::new();
    Message::CallMeMaybeVia(e).append_to(&mut out);
    assert_eq!(out[2 + 108..2 + 116], (i64::MAX as u64).to_be_bytes());
}
