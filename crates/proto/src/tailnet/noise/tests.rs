use super::responder::respond;
use super::*;

fn keys() -> (MachinePrivate, MachinePrivate) {
    (
        MachinePrivate::from_bytes([1; 32]),
        MachinePrivate::from_bytes([2; 32]),
    )
}

fn pair() -> (Transport, Transport) {
    let (client, server) = keys();
    let init = Initiator::new(&client, &server.public(), 130, [3; 32]).unwrap();
    let (resp, st, peer) = respond(&server, init.initiation(), [4; 32]).unwrap();
    assert_eq!(peer, client.public());
    let (ct, used) = init.read_response(&resp).unwrap().unwrap();
    assert_eq!(used, RESPONSE_LEN);
    assert_eq!(ct.handshake_hash(), st.handshake_hash());
    (ct, st)
}

#[test]
fn initiation_layout() {
    let (client, server) = keys();
    let init = Initiator::new(&client, &server.public(), 130, [3; 32]).unwrap();
    let m = init.initiation();
    assert_eq!(&m[..5], &[0, 130, 1, 0, 96]);
    assert_eq!(
        &m[5..37],
        MachinePrivate::from_bytes([3; 32]).public().as_bytes()
    );
    // The machine key is sealed, never in the clear.
    assert!(!m.windows(32).any(|w| w == client.public().as_bytes()));
}

#[test]
fn response_is_read_only_when_whole() {
    let (client, server) = keys();
    let init = Initiator::new(&client, &server.public(), 130, [3; 32]).unwrap();
    let (resp, _, _) = respond(&server, init.initiation(), [4; 32]).unwrap();
    for n in 0..RESPONSE_LEN {
        assert!(init.read_response(&resp[..n]).unwrap().is_none(), "{n}");
    }
    let mut bad = resp;
    bad[50] ^= 1;
    assert_eq!(init.read_response(&bad).err(), Some(NoiseError::Decrypt));
    let mut bad = resp;
    bad[2] = 47;
    assert_eq!(
        init.read_response(&bad).err(),
        Some(NoiseError::BadResponseLength(47))
    );
    assert_eq!(
        init.read_response(&[4, 0, 48]).err(),
        Some(NoiseError::UnexpectedType(4))
    );
    assert!(init.read_response(b"\x03\x00\x05bad").unwrap().is_none());
    assert_eq!(
        init.read_response(b"\x03\x00\x03bad").err(),
        Some(NoiseError::ServerError("bad".into()))
    );
    // A server with another key cannot answer.
    let other = MachinePrivate::from_bytes([9; 32]);
    assert!(respond(&other, init.initiation(), [4; 32]).is_err());
}

#[test]
fn records_both_ways_at_the_frame_edges() {
    for len in [
        0,
        1,
        MAX_PLAINTEXT,
        MAX_PLAINTEXT + 1,
        3 * MAX_PLAINTEXT + 7,
    ] {
        let (mut c, mut s) = pair();
        let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut wire = Vec::new();
        c.seal(&data, &mut wire).unwrap();
        let records = len.div_ceil(MAX_PLAINTEXT).max(1);
        assert_eq!(wire.len(), len + records * (HEADER_LEN + TAG_LEN), "{len}");
        // Fed one byte short, the last record waits and the rest opens.
        let last = HEADER_LEN + TAG_LEN + (len - (records - 1) * MAX_PLAINTEXT);
        let mut out = Vec::new();
        let short = wire.len() - 1;
        let used = s.open(&mut wire[..short], &mut out).unwrap();
        assert_eq!(used, wire.len() - last, "{len}");
        assert_eq!(out, data[..(records - 1) * MAX_PLAINTEXT]);
        let used2 = s.open(&mut wire[used..], &mut out).unwrap();
        assert_eq!(used + used2, wire.len());
        assert_eq!(out, data);
        let mut back = Vec::new();
        s.seal(&data, &mut back).unwrap();
        let mut got = Vec::new();
        assert_eq!(c.open(&mut back, &mut got).unwrap(), back.len());
        assert_eq!(got, data);
    }
}

#[test]
fn nonce_counter_is_big_endian() {
    let (mut c, mut s) = pair();
    let mut wire = Vec::new();
    c.seal(b"first", &mut wire).unwrap();
    c.seal(b"second", &mut wire).unwrap();
    // Open the second record by hand with nonce 00000000 ‖ 00..01 (big
    // endian); a little-endian counter would put the 1 in byte 4.
    let first_len = HEADER_LEN + 5 + TAG_LEN;
    let mut out = Vec::new();
    assert_eq!(
        s.open(&mut wire[..first_len].to_vec(), &mut out).unwrap(),
        first_len
    );
    let mut n = [0u8; 12];
    n[11] = 1;
    let key = &s.rx.key;
    let mut body = wire[first_len + HEADER_LEN..].to_vec();
    let plain = key
        .open_in_place(Nonce::assume_unique_for_key(n), Aad::empty(), &mut body)
        .unwrap();
    assert_eq!(plain, b"second");
}

#[test]
fn bad_records_are_refused() {
    let (mut c, mut s) = pair();
    let mut wire = Vec::new();
    c.seal(b"hello", &mut wire).unwrap();
    let mut tampered = wire.clone();
    tampered[4] ^= 1;
    assert_eq!(
        s.open(&mut tampered, &mut Vec::new()),
        Err(NoiseError::Decrypt)
    );
    let (_, mut s) = pair();
    assert_eq!(
        s.open(&mut [4, 0x0f, 0xfe], &mut Vec::new()),
        Err(NoiseError::FrameTooLarge(4097))
    );
    assert_eq!(
        s.open(&mut [4, 0, 15], &mut Vec::new()),
        Err(NoiseError::ShortRecord(15))
    );
    assert_eq!(
        s.open(&mut [2, 0, 16], &mut Vec::new()),
        Err(NoiseError::UnexpectedType(2))
    );
    // The largest legal frame header waits for its body.
    assert_eq!(s.open(&mut [4, 0x0f, 0xfd], &mut Vec::new()), Ok(0));
}

#[test]
fn low_order_server_key_is_refused() {
    let (client, _) = keys();
    assert_eq!(
        Initiator::new(&client, &MachinePublic::default(), 130, [3; 32]).err(),
        Some(NoiseError::LowOrderKey)
    );
}
