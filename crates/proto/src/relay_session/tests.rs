use super::*;

pub(super) fn key(b: u8) -> NodePublic {
    NodePublic([b; 32])
}

pub(super) fn offer() -> SessionOffer {
    SessionOffer {
        request_id: 7,
        vni: 0x12_3456,
        peer: key(0xbb),
        slot: 0,
        token: TOKEN,
        endpoints: vec![
            "192.0.2.1:3479".parse().unwrap(),
            "[2001:db8::1]:3479".parse().unwrap(),
        ],
        bind_lifetime: Duration::from_secs(30),
        idle_lifetime: Duration::from_secs(60),
    }
}

// The fixed inputs of docs/relay-sessions.md §7.
const SECRET: [u8; 32] = [0x11; 32];
const TOKEN: [u8; 32] = [0x22; 32];
const VNI: u32 = 0x12_3456;
const GENERATION: u32 = 1;

fn client() -> SocketAddr {
    "198.51.100.7:41641".parse().unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn hmac_matches_rfc_4231_case_2() {
    // Key "Jefe": HMAC pads a short key with zeros to the block, so the
    // 32-byte zero-padded key is the same key.
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(b"Jefe");
    assert_eq!(
        hex(&hmac_sha256(&k, &[b"what do ya want ", b"for nothing?"])),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

#[test]
fn vectors_from_the_protocol_document() {
    // docs/relay-sessions.md §7: each line there is checked here.
    let c = cookie(&SECRET, VNI, 0, GENERATION, client());
    assert_eq!(
        hex(&c),
        "a6cba355b9cd1477ebf825efa9d43f5f89bd743a5be42c912c01ad816b0cff8e"
    );
    let p = proof(&TOKEN, VNI, 0, GENERATION, &c);
    assert_eq!(
        hex(&p),
        "1f4ff0b5ca7ce249fa7332dd89e9cd50264e69549012cf9888adb82cba1280ce"
    );
    let bind = BindMsg::new(BindKind::Bind, VNI, 0, GENERATION);
    let challenge = BindMsg {
        cookie: c,
        ..BindMsg::new(BindKind::Challenge, VNI, 0, GENERATION)
    };
    let answer = BindMsg {
        cookie: c,
        proof: p,
        ..BindMsg::new(BindKind::Answer, VNI, 0, GENERATION)
    };
    let bound = BindMsg::new(BindKind::Bound, VNI, 0, GENERATION);
    let zeros = "00".repeat(32);
    let head = "00807a1112345600";
    assert_eq!(
        hex(&bind.to_bytes()),
        format!("{head}010000000001{zeros}{zeros}")
    );
    assert_eq!(
        hex(&challenge.to_bytes()),
        format!("{head}020000000001{}{zeros}", hex(&c))
    );
    assert_eq!(
        hex(&answer.to_bytes()),
        format!("{head}030000000001{}{}", hex(&c), hex(&p))
    );
    assert_eq!(
        hex(&bound.to_bytes()),
        format!("{head}040000000001{zeros}{zeros}")
    );
    for m in [bind, challenge, answer, bound] {
        assert_eq!(BindMsg::parse(&m.to_bytes()), Ok(m));
    }

    let mut out = Vec::new();
    put_allocate(
        &mut out,
        &Allocate {
            peer: key(0xbb),
            request_id: 7,
        },
    );
    assert_eq!(hex(&out), format!("f000000024{}00000007", "bb".repeat(32)));
    out.clear();
    put_session(&mut out, &offer());
    assert_eq!(
        hex(&out),
        format!(
            "f100000075\
             00000007\
             00123456\
             {}\
             00\
             {}\
             00007530\
             0000ea60\
             00000000000000000000ffffc0000201 0d97\
             20010db8000000000000000000000001 0d97",
            "bb".repeat(32),
            "22".repeat(32)
        )
        .replace(' ', "")
    );
    out.clear();
    put_refused(
        &mut out,
        &Refused {
            request_id: 7,
            peer: key(0xbb),
            reason: RefuseReason::PeerNotCapable,
        },
    );
    assert_eq!(
        hex(&out),
        format!("f20000002500000007{}02", "bb".repeat(32))
    );
}

#[test]
fn frames_round_trip() {
    let mut out = Vec::new();
    let a = Allocate {
        peer: key(3),
        request_id: u32::MAX,
    };
    put_allocate(&mut out, &a);
    assert_eq!(
        parse_frame(out[0], &out[frame::HEADER_LEN..]),
        Some(Ok(RelayFrame::Allocate(a)))
    );
    out.clear();
    put_session(&mut out, &offer());
    assert_eq!(
        parse_frame(out[0], &out[frame::HEADER_LEN..]),
        Some(Ok(RelayFrame::Session(offer())))
    );
    for reason in 0..=255u8 {
        out.clear();
        let r = Refused {
            request_id: 1,
            peer: key(4),
            reason: RefuseReason::from_u8(reason),
        };
        assert_eq!(r.reason.to_u8(), reason);
        put_refused(&mut out, &r);
        assert_eq!(parse_refused(&out[frame::HEADER_LEN..]), Ok(r));
    }
    assert_eq!(parse_frame(0x04, &[]), None);
}

#[test]
fn malformed_frames_are_refused() {
    assert!(parse_allocate(&[0; ALLOCATE_LEN - 1]).is_err());
    assert!(parse_allocate(&[0; ALLOCATE_LEN + 1]).is_err());
    assert!(parse_refused(&[0; REFUSED_LEN + 1]).is_err());
    let mut out = Vec::new();
    put_session(&mut out, &offer());
    let body = out[frame::HEADER_LEN..].to_vec();
    // No endpoint, a partial endpoint, too many endpoints.
    assert!(parse_session(&body[..SESSION_FIXED_LEN]).is_err());
    assert!(parse_session(&body[..body.len() - 1]).is_err());
    let mut long = body[..SESSION_FIXED_LEN].to_vec();
    long.resize(SESSION_FIXED_LEN + (MAX_ENDPOINTS + 1) * ENDPOINT_LEN, 0);
    assert!(parse_session(&long).is_err());
    // VNI 0, VNI over 24 bits, slot 2.
    for (at, v) in [(7, 0u8), (4, 1), (8 + KEY_LEN, 2)] {
        let mut b = body.clone();
        if at == 7 {
            b[5..8].fill(0);
        } else {
            b[at] = v;
        }
        assert!(parse_session(&b).is_err(), "patch at {at}");
    }
}

#[test]
fn malformed_bind_messages_are_refused() {
    let good = BindMsg::new(BindKind::Bind, VNI, 1, 9).to_bytes();
    assert_eq!(BindMsg::parse(&good[..77]), Err(BindError::Length(77)));
    let mut long = good.to_vec();
    long.push(0);
    assert_eq!(BindMsg::parse(&long), Err(BindError::Length(79)));
    let mut data = good;
    data[1] = 0;
    assert_eq!(BindMsg::parse(&data), Err(BindError::NotControl));
    let mut kind = good;
    kind[8] = 5;
    assert_eq!(BindMsg::parse(&kind), Err(BindError::Kind(5)));
    for (at, v) in [(9, 2u8), (13, 0), (20, 1), (60, 1)] {
        let mut b = good;
        b[at] = v;
        if at == 13 {
            b[10..14].fill(0);
        }
        assert_eq!(BindMsg::parse(&b), Err(BindError::Field), "patch at {at}");
    }
    let mut vni0 = good;
    vni0[4..7].fill(0);
    assert_eq!(BindMsg::parse(&vni0), Err(BindError::Field));
}

/// A relay's side of the handshake for these tests: what
/// `docs/relay-sessions.md` §4 says it does.
fn relay_reply(msg: &[u8], from: SocketAddr) -> Option<[u8; BIND_LEN]> {
    let m = BindMsg::parse(msg).ok()?;
    match m.kind {
        BindKind::Bind => Some(
            BindMsg {
                cookie: cookie(&SECRET, m.vni, m.slot, m.generation, from),
                ..BindMsg::new(BindKind::Challenge, m.vni, m.slot, m.generation)
            }
            .to_bytes(),
        ),
        BindKind::Answer => {
            let c = cookie(&SECRET, m.vni, m.slot, m.generation, from);
            let ok = mac_eq(&m.cookie, &c)
                && mac_eq(&m.proof, &proof(&TOKEN, m.vni, m.slot, m.generation, &c));
            ok.then(|| BindMsg::new(BindKind::Bound, m.vni, m.slot, m.generation).to_bytes())
        }
        _ => None,
    }
}

#[test]
fn binder_binds_through_a_challenge() {
    let now = Instant::now();
    let relay: SocketAddr = "192.0.2.1:3479".parse().unwrap();
    let mut b = Binder::new(&offer(), relay, GENERATION, now);
    assert_eq!(b.poll_timeout(), Some(now));
    let bind = b.poll_transmit(now).expect("a bind is due at once");
    assert_eq!(BindMsg::parse(&bind).unwrap().kind, BindKind::Bind);
    assert_eq!(b.poll_transmit(now), None, "nothing more until the timer");
    let challenge = relay_reply(&bind, client()).unwrap();
    assert!(b.handle(now, &challenge));
    let answer = b.poll_transmit(now).expect("the answer goes at once");
    assert_eq!(
        hex(&answer),
        hex(&{
            let c = cookie(&SECRET, VNI, 0, GENERATION, client());
            BindMsg {
                cookie: c,
                proof: proof(&TOKEN, VNI, 0, GENERATION, &c),
                ..BindMsg::new(BindKind::Answer, VNI, 0, GENERATION)
            }
            .to_bytes()
        })
    );
    assert!(!b.is_bound());
    let bound = relay_reply(&answer, client()).unwrap();
    assert!(b.handle(now, &bound));
    assert!(b.is_bound());
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(b.poll_transmit(now + Duration::from_secs(5)), None);
}

#[test]
fn binder_retransmits_with_backoff_and_gives_up() {
    let t0 = Instant::now();
    let relay: SocketAddr = "192.0.2.1:3479".parse().unwrap();
    let mut b = Binder::new(&offer(), relay, GENERATION, t0);
    let mut sent = Vec::new();
    let mut now = t0;
    for _ in 0..1000 {
        if let Some(m) = b.poll_transmit(now) {
            assert_eq!(BindMsg::parse(&m).unwrap().kind, BindKind::Bind);
            sent.push(now.duration_since(t0).as_millis());
        }
        match b.poll_timeout() {
            Some(t) => now = t,
            None => break,
        }
    }
    assert!(b.is_failed());
    // 0, +250, +500, +1000, then every 2 s up to the 30 s bind lifetime.
    assert_eq!(&sent[..5], &[0, 250, 750, 1750, 3750]);
    assert_eq!(*sent.last().unwrap(), 29_750);
    assert!(sent.windows(2).all(|w| w[1] - w[0] <= 2000));
}

#[test]
fn binder_timeout_checks_the_lifetime_and_leaves_a_due_bind_due() {
    let t0 = Instant::now();
    let relay: SocketAddr = "192.0.2.1:3479".parse().unwrap();
    let mut b = Binder::new(&offer(), relay, GENERATION, t0);
    assert!(b.poll_transmit(t0).is_some());
    let due = b.poll_timeout().unwrap();
    b.handle_timeout(due);
    assert!(!b.is_failed());
    assert_eq!(b.poll_timeout(), Some(due), "the schedule is unchanged");
    assert!(b.poll_transmit(due).is_some(), "the due bind is still sent");
    b.handle_timeout(t0 + offer().bind_lifetime);
    assert!(b.is_failed());
    assert_eq!(b.poll_timeout(), None);
}

#[test]
fn binder_ignores_other_sessions_slots_and_generations() {
    let now = Instant::now();
    let relay: SocketAddr = "192.0.2.1:3479".parse().unwrap();
    let mut b = Binder::new(&offer(), relay, 5, now);
    let _ = b.poll_transmit(now);
    let c = [9u8; 32];
    let challenge = |vni, slot, generation| {
        BindMsg {
            cookie: c,
            ..BindMsg::new(BindKind::Challenge, vni, slot, generation)
        }
        .to_bytes()
    };
    assert!(!b.handle(now, &challenge(VNI + 1, 0, 5)));
    assert!(!b.handle(now, &challenge(VNI, 1, 5)));
    assert!(!b.handle(now, b"not a bind message"));
    // A stale generation is ours but changes nothing.
    assert!(b.handle(now, &challenge(VNI, 0, 4)));
    assert_eq!(b.poll_transmit(now), None);
    // A bound before any answer is ignored.
    assert!(b.handle(now, &BindMsg::new(BindKind::Bound, VNI, 0, 5).to_bytes()));
    assert!(!b.is_bound());
    assert!(b.handle(now, &challenge(VNI, 0, 5)));
    assert_eq!(
        BindMsg::parse(&b.poll_transmit(now).unwrap()).unwrap().kind,
        BindKind::Answer
    );
}

#[test]
fn rebind_raises_the_generation_and_starts_over() {
    let now = Instant::now();
    let relay: SocketAddr = "192.0.2.1:3479".parse().unwrap();
    let mut b = Binder::new(&offer(), relay, GENERATION, now);
    let bind = b.poll_transmit(now).unwrap();
    b.handle(now, &relay_reply(&bind, client()).unwrap());
    let answer = b.poll_transmit(now).unwrap();
    b.handle(now, &relay_reply(&answer, client()).unwrap());
    assert!(b.is_bound());
    let other: SocketAddr = "[2001:db8::1]:3479".parse().unwrap();
    let later = now + Duration::from_secs(40);
    b.rebind(later, other, 1);
    assert_eq!(b.generation(), 2);
    assert_eq!(b.relay(), other);
    assert!(!b.is_bound() && !b.is_failed());
    let m = BindMsg::parse(&b.poll_transmit(later).unwrap()).unwrap();
    assert_eq!((m.kind, m.generation), (BindKind::Bind, 2));
    // A bound for the old generation does not count.
    assert!(b.handle(later, &relay_reply(&answer, client()).unwrap()));
    assert!(!b.is_bound());
    b.rebind(later, other, 10);
    assert_eq!(b.generation(), 10);
}

#[test]
fn a_cookie_is_bound_to_the_source_and_the_secret() {
    let a = cookie(&SECRET, VNI, 0, 1, client());
    assert_ne!(
        a,
        cookie(&SECRET, VNI, 0, 1, "198.51.100.7:41642".parse().unwrap())
    );
    assert_ne!(a, cookie(&SECRET, VNI, 1, 1, client()));
    assert_ne!(a, cookie(&SECRET, VNI, 0, 2, client()));
    assert_ne!(a, cookie(&[0x12; 32], VNI, 0, 1, client()));
    // An IPv4 source and its IPv4-mapped form are one address.
    assert_eq!(
        a,
        cookie(
            &SECRET,
            VNI,
            0,
            1,
            "[::ffff:198.51.100.7]:41641".parse().unwrap()
        )
    );
    assert!(mac_eq(&a, &a.clone()));
    let mut b = a;
    b[31] ^= 1;
    assert!(!mac_eq(&a, &b));
}
