use super::*;
use crate::key::DiscoPrivate;

struct Keys {
    server: DiscoPrivate,
    a: DiscoPrivate,
    b: DiscoPrivate,
}

fn keys() -> Keys {
    Keys {
        server: DiscoPrivate::from_bytes([0x41; 32]),
        a: DiscoPrivate::from_bytes([0x01; 32]),
        b: DiscoPrivate::from_bytes([0x21; 32]),
    }
}

const VNI: u32 = 0x12_3456;
const SECRET: [u8; 32] = [7; 32];

fn src() -> SocketAddr {
    "192.0.2.1:41641".parse().unwrap()
}

fn body(k: &Keys, generation: u32, challenge: [u8; 32]) -> BindBody {
    BindBody {
        vni: VNI,
        generation,
        remote_key: k.b.public(),
        challenge,
    }
}

/// A datagram from client a: `msg` sealed to the relay.
fn from_a(k: &Keys, vni: u32, msg: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    let key = k.a.shared(&k.server.public());
    put_control(&mut out, vni, &key, &k.a.public(), &[1; 24], msg);
    out
}

#[test]
fn bind_challenge_answer() {
    let k = keys();
    let relay_key = k.server.shared(&k.a.public());
    let mut d = from_a(&k, VNI, &Message::Bind(body(&k, 9, [0; 32])));
    assert_eq!(d.len(), CONTROL_LEN);
    assert_eq!(d.len(), 160);
    // Step 1.
    let c = parse_control(&d).unwrap();
    assert_eq!(
        c,
        Control {
            vni: VNI,
            sender: k.a.public()
        }
    );
    // Step 2.
    let step = open_bind(&relay_key, &mut d, VNI, &k.b.public()).unwrap();
    assert_eq!(step, BindStep::Bind(body(&k, 9, [0; 32])));
    // Step 3: the challenge, written in place, opens for the client.
    let cookie = challenge(&SECRET, VNI, 0, 9, src());
    let n = write_challenge(
        &mut d,
        &relay_key,
        &k.server.public(),
        &[2; 24],
        step.body(),
        cookie,
    );
    assert_eq!(n, 160);
    let h = Header::parse(&d).unwrap();
    assert_eq!(h, Header::bind(VNI));
    assert_eq!(disco::sender(&d[8..]), Some(k.server.public()));
    let client_key = k.a.shared(&k.server.public());
    let msg = disco::open(&client_key, &d[8..n]).unwrap();
    assert_eq!(msg, Message::BindChallenge(body(&k, 9, cookie)));
    // The client echoes it: a valid answer from this source only.
    let Message::BindChallenge(echo) = msg else {
        unreachable!()
    };
    let mut answer = from_a(&k, VNI, &Message::BindAnswer(echo));
    parse_control(&answer).unwrap();
    let step = open_bind(&relay_key, &mut answer, VNI, &k.b.public()).unwrap();
    let BindStep::Answer(got) = step else {
        panic!("{step:?}")
    };
    assert!(answer_is_valid(&SECRET, None, 0, &got, src()));
    // The IPv4-mapped form of the source is the same source.
    let mapped: SocketAddr = "[::ffff:192.0.2.1]:41641".parse().unwrap();
    assert!(answer_is_valid(&SECRET, None, 0, &got, mapped));
    // Under the previous secret after a rotation.
    assert!(answer_is_valid(&[8; 32], Some(&SECRET), 0, &got, src()));
    // Not from elsewhere, nor for the other slot, nor under other secrets.
    let other: SocketAddr = "192.0.2.1:41642".parse().unwrap();
    assert!(!answer_is_valid(&SECRET, None, 0, &got, other));
    assert!(!answer_is_valid(&SECRET, None, 1, &got, src()));
    assert!(!answer_is_valid(&[8; 32], Some(&[9; 32]), 0, &got, src()));
    let wrong_gen = BindBody {
        generation: 10,
        ..got
    };
    assert!(!answer_is_valid(&SECRET, None, 0, &wrong_gen, src()));
}

#[test]
fn checks_of_the_sealed_bind() {
    let k = keys();
    let relay_key = k.server.shared(&k.a.public());
    let open = |msg: &Message, vni: u32| {
        // The relay checks against the header's VNI.
        let mut d = from_a(&k, vni, msg);
        open_bind(&relay_key, &mut d, vni, &k.b.public())
    };
    // Sealed VNI differs from the header's.
    assert_eq!(
        open(&Message::Bind(body(&k, 1, [0; 32])), VNI + 1),
        Err(BindError::VniMismatch)
    );
    let mut wrong_remote = body(&k, 1, [0; 32]);
    wrong_remote.remote_key = k.a.public();
    assert_eq!(
        open(&Message::Bind(wrong_remote), VNI),
        Err(BindError::WrongRemoteKey)
    );
    assert_eq!(
        open(&Message::Bind(body(&k, 0, [0; 32])), VNI),
        Err(BindError::ZeroGeneration)
    );
    // A challenge sent to the relay, or any other type, is not a bind.
    assert_eq!(
        open(&Message::BindChallenge(body(&k, 1, [0; 32])), VNI),
        Err(BindError::WrongType)
    );
    let ping = Message::Ping(disco::Ping {
        tx_id: [0; 12],
        node_key: None,
        padding: 60,
    });
    assert_eq!(open(&ping, VNI), Err(BindError::WrongType));
    // Sealed by someone else than the claimed sender.
    let mut d = Vec::new();
    let forger = DiscoPrivate::from_bytes([0x61; 32]);
    put_control(
        &mut d,
        VNI,
        &forger.shared(&k.server.public()),
        &k.a.public(),
        &[1; 24],
        &Message::Bind(body(&k, 1, [0; 32])),
    );
    assert_eq!(parse_control(&d).unwrap().sender, k.a.public());
    let before = d.clone();
    assert_eq!(
        open_bind(&relay_key, &mut d, VNI, &k.b.public()),
        Err(BindError::BadBox)
    );
    assert_eq!(d, before);
}

#[test]
fn step_one_refuses_before_any_crypto() {
    let k = keys();
    let bind = from_a(&k, VNI, &Message::Bind(body(&k, 1, [0; 32])));
    assert_eq!(parse_control(&bind[..159]), Err(BindError::BadLength(159)));
    let mut long = bind.clone();
    long.resize(MAX_CONTROL_LEN, 0);
    assert!(parse_control(&long).is_ok());
    long.push(0);
    assert_eq!(parse_control(&long), Err(BindError::BadLength(257)));
    let mut data = bind.clone();
    data[1] = 0; // control bit clear: data, not a bind
    assert_eq!(parse_control(&data), Err(BindError::BadHeader));
    let mut payload = bind.clone();
    payload[3] = 0x12; // WireGuard protocol
    assert_eq!(parse_control(&payload), Err(BindError::BadHeader));
    let mut zero = bind.clone();
    zero[4..7].fill(0);
    assert_eq!(parse_control(&zero), Err(BindError::ZeroVni));
    let mut magic = bind.clone();
    magic[8] ^= 1;
    assert_eq!(parse_control(&magic), Err(BindError::NotDisco));
    assert_eq!(parse_control(&[]), Err(BindError::BadHeader));
}

#[test]
fn generations_compare_in_serial_order() {
    assert!(generation_is_current(5, 5));
    assert!(generation_is_current(6, 5));
    assert!(!generation_is_current(4, 5));
    assert!(generation_is_current(1, u32::MAX), "the counter wrapped");
    assert!(!generation_is_current(u32::MAX, 1));
    assert!(generation_is_current(1, 0), "nothing bound yet");
}

#[test]
fn a_tailscale_bind_opens() {
    // interop/testdata/disco-vectors.txt: `sealed_bind` is a bind that
    // tailscale.com/disco sealed from key 0x01.. to the relay's 0x41..;
    // behind its header it is what a relay receives.
    let vectors = include_str!("../../../../interop/testdata/disco-vectors.txt");
    let hex = vectors
        .lines()
        .find_map(|l| l.strip_prefix("sealed_bind "))
        .unwrap();
    let seq = |s: u8| -> [u8; 32] { core::array::from_fn(|i| s + i as u8) };
    let (a, b, server) = (
        DiscoPrivate::from_bytes(seq(0x01)),
        DiscoPrivate::from_bytes(seq(0x21)),
        DiscoPrivate::from_bytes(seq(0x41)),
    );
    let mut d = Header::bind(0x12_3456).to_bytes().to_vec();
    d.extend_from_slice(&crate::testutil::unhex(hex));
    let c = parse_control(&d).unwrap();
    assert_eq!(c.sender, a.public());
    let step = open_bind(&server.shared(&a.public()), &mut d, c.vni, &b.public()).unwrap();
    assert_eq!(step.body().generation, 7);
}
