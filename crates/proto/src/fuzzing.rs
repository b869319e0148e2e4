//! Entry points for fuzzing the parsers of untrusted bytes.
//!
//! Each function drives real parsers with arbitrary input and asserts
//! invariants that must hold for *every* input (round trips, agreement
//! between equivalent ways of feeding the same bytes). A panic here is a bug.
//! They are called by the `cargo fuzz` targets in `fuzz/` and by the corpus
//! replay test, so the ordinary test suite exercises them too.

use crate::admission;
use crate::client::{self as derp_client, ClientError, Event, Stage};
use crate::forwarded::{self, TrustedProxies};
use crate::frame::{
    self, canonical_addr, parse_client_frame, parse_server_frame, ClientFrame, Deframer, Fed,
    FrameError, FrameType, ServerFrame, ServerFramePolicy, HEADER_LEN, KEY_LEN, MAX_PACKET_SIZE,
};
use crate::handshake::{self, ClientInfo, HandshakeError, ServerInfo};
use crate::http;
use crate::key::{NodePrivate, NodePublic};
use crate::nacl::SharedKey;
use crate::proxy;
use crate::stun;
use crate::tls_record::{RecordBoundary, HEADER_LEN as TLS_HEADER_LEN};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::ops::ControlFlow;
use std::sync::OnceLock;
use std::time::Instant;

mod deframer;
mod disco;
mod relay_session;
mod server;
mod tailnet;
pub use deframer::deframer;
pub use disco::{disco, peer_relay_bind};
pub use relay_session::{bind_message, mesh_session, relay_frames};
pub use server::server;
pub use tailnet::{
    early_payload, filter_caps, map_frames, map_response, noise_client, register_response,
    ts2021_upgrade,
};

/// Largest frame (header included) [`ServerFramePolicy`] ever buffers.
const MAX_BUFFERED_FRAME: usize = HEADER_LEN + 2 * KEY_LEN + MAX_PACKET_SIZE;

/// A tiny deterministic generator for chunk sizes and break decisions
/// (the other crates' fuzzing modules use it too).
pub struct XorShift(u32);

impl XorShift {
    /// A generator from `seed` (any value: a zero state is avoided).
    pub fn new(seed: u32) -> XorShift {
        XorShift(seed | 1)
    }

    /// The next value.
    pub fn next_u32(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u32() as usize) % n.max(1)
    }
}

/// The largest piece a two-bit selector picks for a stream of `len`
/// bytes: single bytes, up to 16, up to 4 096, or everything.
pub fn max_chunk(sel: u8, len: usize) -> usize {
    match sel & 3 {
        0 => 1,
        1 => 16,
        2 => 4096,
        _ => len.max(1),
    }
}

/// Cuts `stream` into pieces of 1 ..= `max` bytes drawn from `rng`.
pub fn chunks<'a>(
    stream: &'a [u8],
    max: usize,
    rng: &'a mut XorShift,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut rest = stream;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = 1 + rng.below(max.min(rest.len()));
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        Some(chunk)
    })
}

/// Parses an HTTP request head and checks that the head alone parses the
/// same, that a truncated head is incomplete, and that responses built from
/// its fields cannot be split by injected line breaks. Read as it arrives
/// ([`http::HeadScan`], in pieces the input's length chooses), it gives
/// the answer a parse of the bytes at hand gives, never one where the
/// whole input parses, and within linear work.
pub fn http_request(data: &[u8]) {
    let step = 1 + data.len() % 13;
    let mut scan = http::HeadScan::new();
    let mut end = 0;
    let mut answer = (Ok(None), 0);
    while end < data.len() {
        end = (end + step).min(data.len());
        let got = scan.advance(&data[..end]);
        if got != Ok(None) {
            answer = (got, end);
            break;
        }
    }
    let whole = http::parse_request(data);
    match &answer {
        (Ok(None), _) => {
            assert!(!matches!(whole, Ok(Some(_))), "the scan missed a head");
            assert!(data.len() < http::MAX_HEAD || data.is_empty());
        }
        (got, at) => assert_eq!(got, &http::parse_request(&data[..*at]), "at {at}"),
    }
    if let Ok(Some(req)) = &whole {
        assert_eq!(answer.0.as_ref(), Ok(&Some(req.clone())));
    }
    assert!(scan.work() <= 4 * data.len().min(http::MAX_HEAD) + 4);

    match http::parse_request(data) {
        Ok(Some(req)) => {
            assert!(req.head_len <= data.len() && req.head_len <= http::MAX_HEAD);
            assert_eq!(
                http::parse_request(&data[..req.head_len]),
                Ok(Some(req.clone()))
            );
            if req.head_len > 0 {
                assert!(!matches!(
                    http::parse_request(&data[..req.head_len - 1]),
                    Ok(Some(_))
                ));
            }
            let resp = http::generate_204(req.challenge.as_deref());
            let echoed = req.challenge.as_deref().is_some_and(http::valid_challenge);
            assert_eq!(
                echoed,
                resp.windows(b"X-Tailscale-Response".len())
                    .any(|w| w == b"X-Tailscale-Response")
            );
            let host = req.host.as_deref().unwrap_or_default();
            let resp = http::response(
                404,
                &req.method,
                &[("X-Path", &req.path), ("X-Host", host)],
                b"",
            );
            let blank_lines = resp.windows(4).filter(|w| w == b"\r\n\r\n").count();
            assert_eq!(blank_lines, 1, "response head was split");
        }
        Ok(None) => assert!(data.len() < http::MAX_HEAD),
        Err(_) => {}
    }
}

struct Keys {
    server: NodePrivate,
    client: NodePublic,
    client_to_server: SharedKey,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let server = NodePrivate::from_bytes(core::array::from_fn(|i| i as u8));
        let client = NodePrivate::from_bytes(core::array::from_fn(|i| 0x20 + i as u8));
        Keys {
            client_to_server: SharedKey::new(&client, &server.public()),
            client: client.public(),
            server,
        }
    })
}

/// Decodes `data` as clientInfo JSON and as a raw clientInfo payload, and
/// checks that sealing `data` in a real box and opening it on the server
/// agrees with decoding it directly, but for an invalid `AppName`, which
/// only the server refuses.
pub fn client_info(data: &[u8]) {
    let direct = ClientInfo::from_json(data);
    if let Ok(info) = &direct {
        let json = info.to_json();
        assert_eq!(ClientInfo::from_json(&json).as_ref(), Ok(info));
    }

    let k = keys();
    match handshake::open_client_info(&k.server, data) {
        // Forging a box for a fixed key is infeasible for random input, but
        // whatever opens must have come with a non-zero key.
        Ok((who, _)) => assert!(!who.is_zero()),
        Err(HandshakeError::TooShort { .. } | HandshakeError::TooLong { .. }) => {
            assert!(
                data.len() < frame::MIN_CLIENT_INFO_LEN || data.len() > frame::MAX_CLIENT_INFO_LEN
            )
        }
        Err(_) => {}
    }

    if KEY_LEN + crate::nacl::OVERHEAD + data.len() <= frame::MAX_CLIENT_INFO_LEN {
        let mut payload = k.client.as_bytes().to_vec();
        k.client_to_server
            .seal_into(&mut payload, &[0x5a; 24], data);
        let name_ok = |info: &ClientInfo| {
            crate::app_name::valid_app_name(info.app_name.as_deref().unwrap_or("").as_bytes())
        };
        match (handshake::open_client_info(&k.server, &payload), direct) {
            (Ok((who, info)), Ok(want)) => {
                assert_eq!(who, k.client);
                assert!(name_ok(&info), "opened with an invalid AppName");
                assert_eq!(info, want);
            }
            (Err(HandshakeError::InvalidAppName { shown }), Ok(want)) => {
                assert!(!name_ok(&want), "refused a valid AppName {shown}");
                assert!(shown.len() >= 2 && shown.starts_with('"') && shown.ends_with('"'));
            }
            (Err(HandshakeError::Json { .. }), Err(HandshakeError::Json { .. })) => {}
            (sealed, direct) => panic!("sealed {sealed:?} vs direct {direct:?}"),
        }
    }
}

/// Parses `data` as a STUN binding request and response; an accepted
/// request's answer must decode back to the same transaction and address,
/// and a request built from `data`'s first 12 bytes must be accepted.
pub fn stun(data: &[u8]) {
    let addr = match data.len() {
        n if n >= 18 && data[0] & 1 == 0 => {
            let octets: [u8; 16] = core::array::from_fn(|i| data[i]);
            SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(octets)),
                u16::from_be_bytes([data[16], data[17]]),
            )
        }
        n if n >= 6 => SocketAddr::new(
            IpAddr::from([data[0], data[1], data[2], data[3]]),
            u16::from_be_bytes([data[4], data[5]]),
        ),
        _ => "192.0.2.1:41641".parse().expect("literal address"),
    };

    if let Ok(txid) = stun::parse_binding_request(data) {
        assert_eq!(&data[8..20], &txid);
        let mut out = [0u8; stun::MAX_RESPONSE_LEN];
        let n = stun::write_binding_response(&txid, addr, &mut out);
        assert!(n == 32 || n == 44);
        assert_eq!(
            stun::parse_binding_response(&out[..n]),
            Ok((txid, canonical_addr(addr)))
        );
    }
    let _ = stun::parse_binding_response(data);

    if let Some(head) = data.get(..12) {
        let txid: [u8; 12] = head.try_into().expect("12 bytes");
        assert_eq!(
            stun::parse_binding_request(&stun::binding_request(&txid)),
            Ok(txid)
        );
    }
}

/// Splits `data` as a peer message (`docs/relay-sessions.md` §6). A payload
/// re-encodes to the same bytes; a probe that opens with the
/// `docs/derp-protocol.md` §17.1 keys (the seeds are sealed with them) re-seals
/// to the same bytes under its own nonce. Then `data` as a box's plaintext:
/// whatever [`crate::peer_msg::open_probe`] accepts must survive a seal, parse
/// and open unchanged.
pub fn peer_msg(data: &[u8]) {
    use crate::peer_msg::{self, PeerMessage};
    let k = vector_keys();
    let client = k.client.public();
    let client_to_server = SharedKey::new(&k.client, &k.server.public());
    match peer_msg::parse(data) {
        Ok((header, PeerMessage::Payload(bytes))) => {
            let mut again = Vec::new();
            peer_msg::put_payload(&mut again, header.vni, bytes);
            assert_eq!(again, data);
        }
        Ok((header, PeerMessage::Probe { sender, sealed })) if sender == client => {
            let opened = SharedKey::new(&k.server, &sender);
            if let Ok(probe) = peer_msg::open_probe(&opened, sealed) {
                let nonce: [u8; 24] = sealed[..24].try_into().expect("a box is longer");
                let mut again = Vec::new();
                peer_msg::put_probe(
                    &mut again,
                    header.vni,
                    &sender,
                    &client_to_server,
                    &nonce,
                    &probe,
                );
                assert_eq!(again, data);
            }
        }
        Ok(_) | Err(_) => {}
    }

    let boxed = client_to_server.seal(&VECTOR_NONCE, data);
    let opened = SharedKey::new(&k.server, &client);
    if let Ok(probe) = peer_msg::open_probe(&opened, &boxed) {
        let mut out = Vec::new();
        peer_msg::put_probe(
            &mut out,
            9,
            &client,
            &client_to_server,
            &VECTOR_NONCE,
            &probe,
        );
        let Ok((_, PeerMessage::Probe { sender, sealed })) = peer_msg::parse(&out) else {
            panic!("a built probe does not parse: {probe:?}");
        };
        assert_eq!(sender, client);
        assert_eq!(peer_msg::open_probe(&opened, sealed), Ok(probe));
    }
}

/// Classifies `data` as a WireGuard datagram and checks what the relay
/// relies on: accepted messages have their kind's exact size (transport: at
/// least 32 bytes), the indices are the bytes at their offsets, MAC1 sealed
/// with one key verifies with that key only and breaks when a covered byte
/// changes; a text input that parses as a key prints back the same.
pub fn wireguard(data: &[u8]) {
    use crate::wireguard::{self as wg, Message};
    let le = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"));
    let shaped = data.len() >= 4
        && data[1..4] == [0; 3]
        && match data[0] {
            1 => data.len() == wg::INITIATION_LEN,
            2 => data.len() == wg::RESPONSE_LEN,
            3 => data.len() == wg::COOKIE_REPLY_LEN,
            4 => data.len() >= wg::TRANSPORT_MIN_LEN,
            _ => false,
        };
    let classified = wg::classify(data);
    assert_eq!(classified.is_ok(), shaped, "{classified:?}");
    match classified {
        Ok(Message::Initiation { sender }) => assert_eq!(sender, le(4)),
        Ok(Message::Response { sender, receiver }) => {
            assert_eq!((sender, receiver), (le(4), le(8)))
        }
        Ok(Message::CookieReply { receiver }) => assert_eq!(receiver, le(4)),
        Ok(Message::Transport { receiver, counter }) => {
            assert_eq!(receiver, le(4));
            assert_eq!(counter.to_le_bytes(), data[8..16]);
        }
        Err(_) => {}
    }

    static MAC_KEYS: OnceLock<[wg::Mac1Key; 2]> = OnceLock::new();
    let [k1, k2] = MAC_KEYS.get_or_init(|| {
        [1u8, 2].map(|seed| wg::Mac1Key::new(&wg::PublicKey::from_bytes([seed; 32])))
    });
    let _ = wg::verify_mac1(data, k1);
    let mut sealed = data.to_vec();
    if wg::seal_mac1(&mut sealed, k1) {
        assert!(matches!(
            wg::classify(&sealed),
            Ok(Message::Initiation { .. } | Message::Response { .. })
        ));
        assert!(wg::verify_mac1(&sealed, k1));
        assert!(!wg::verify_mac1(&sealed, k2));
        let at = usize::from(data[data.len() - 1]) % 60;
        sealed[at] ^= 0x80;
        assert!(!wg::verify_mac1(&sealed, k1));
    } else {
        assert_eq!(sealed, data, "a refused seal leaves the bytes alone");
    }

    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(key) = wg::PublicKey::from_base64(text) {
            assert_eq!(key.to_base64(), text.trim());
        }
    }
}

/// Follows TLS record framing over `data[1..]`, split into reads as
/// `data[0]` chooses (it seeds the generator; its low 2 bits pick single
/// bytes, up to 8, up to 600 or up to the whole stream per read), and
/// checks after every read that [`RecordBoundary::at_boundary`] agrees with
/// a single pass over the stream that walks from header to header: the
/// answer is the same however the bytes were split, and at the end it is
/// the same as for one feed of everything.
pub fn tls_record(data: &[u8]) {
    let Some((&ctl, stream)) = data.split_first() else {
        return;
    };
    // The reference: every offset where a record ends.
    let mut ends = vec![0];
    let mut at = 0usize;
    while let Some(header) = stream.get(at..at + TLS_HEADER_LEN) {
        at += TLS_HEADER_LEN + usize::from(u16::from_be_bytes([header[3], header[4]]));
        if at > stream.len() {
            break;
        }
        ends.push(at);
    }

    let mut whole = RecordBoundary::new();
    whole.feed(stream);
    assert_eq!(whole.at_boundary(), ends.last() == Some(&stream.len()));

    let (max_read, mut rng) = read_sizes(ctl, stream.len(), 0x2545_f491);
    let mut split = RecordBoundary::new();
    let mut fed = 0;
    while fed < stream.len() {
        let n = 1 + rng.below(max_read.min(stream.len() - fed));
        // An empty read changes nothing.
        split.feed(&[]);
        split.feed(&stream[fed..fed + n]);
        fed += n;
        assert_eq!(
            split.at_boundary(),
            ends.binary_search(&fed).is_ok(),
            "after {fed} of {} bytes",
            stream.len()
        );
    }
    assert_eq!(split.at_boundary(), whole.at_boundary());
}

/// The largest read and the generator of read sizes a control byte picks
/// for a stream of `len` bytes: single bytes, a few, hundreds, or any.
fn read_sizes(ctl: u8, len: usize, seed: u32) -> (usize, XorShift) {
    let max_read = match ctl & 3 {
        0 => 1,
        1 => 8,
        2 => 600,
        _ => len.max(1),
    };
    let rng = XorShift(seed ^ u32::from(ctl).wrapping_mul(0x0101_0101) | 1);
    (max_read, rng)
}

/// TLS 1.3 protected records (`tls13`): the stream after the first byte,
/// cut into reads of sizes the first byte chooses, gives the same records
/// and the same error as one pass over the whole stream; an opened
/// record's inner plaintext (each record body, read as if it were one)
/// never panics, names a type byte that is really there and is within the
/// limit, and the run of empty ones stays bounded.
pub fn tls13(data: &[u8]) {
    use crate::tls13::{inner_plaintext, EmptyRun, RecordReader, Step, MAX_EMPTY_RUN};
    let Some((&ctl, stream)) = data.split_first() else {
        return;
    };
    let read = |max_read: usize, rng: &mut XorShift| {
        let mut reader = RecordReader::new();
        let mut records: Vec<Vec<u8>> = Vec::new();
        let mut fed = 0;
        while fed < stream.len() {
            let n = 1 + rng.below(max_read.min(stream.len() - fed));
            let mut input = &stream[fed..fed + n];
            fed += n;
            loop {
                match reader.next(&mut input) {
                    Ok(Step::Whole(r)) => records.push(r.to_vec()),
                    Ok(Step::Held) => {
                        records.push(reader.held_mut().to_vec());
                        reader.clear_held();
                    }
                    Ok(Step::More) => break,
                    Err(e) => return (records, Some(e), 0),
                }
            }
            assert!(input.is_empty(), "More leaves no input behind");
        }
        (records, None, reader.held_len())
    };
    let whole = read(stream.len().max(1), &mut XorShift(1));
    let (max_read, mut rng) = read_sizes(ctl, stream.len(), 0x9e37_79b9);
    let split = read(max_read, &mut rng);
    assert_eq!(split, whole);
    let mut at = 0;
    let (mut empty, mut run, mut ended) = (EmptyRun::default(), 0, false);
    for r in &whole.0 {
        assert_eq!(
            &stream[at..at + r.len()],
            &r[..],
            "records are the stream's bytes"
        );
        at += r.len();
        if let Ok((ty, len)) = inner_plaintext(&r[TLS_HEADER_LEN..]) {
            assert_eq!(r[TLS_HEADER_LEN + len], ty);
            assert_ne!(ty, 0);
            assert!(r.len() - TLS_HEADER_LEN <= crate::tls13::MAX_PLAINTEXT + 1);
            if !ended {
                run = if len == 0 { run + 1 } else { 0 };
                let noted = empty.note(len);
                assert_eq!(noted.is_err(), run > MAX_EMPTY_RUN, "run of {run}");
                ended = noted.is_err();
            }
        }
    }
    assert!(at + whole.2 <= stream.len());
}

/// The `docs/derp-protocol.md` §17.1 keys, so seeds can carry the §17.3
/// handshake vectors, with the box keys both ways.
struct VectorKeys {
    server: NodePrivate,
    client: NodePrivate,
    server_to_client: SharedKey,
}

fn vector_keys() -> &'static VectorKeys {
    static KEYS: OnceLock<VectorKeys> = OnceLock::new();
    KEYS.get_or_init(|| {
        // 00 02 03 … 1f 60 and 20 22 23 … 3f 40, as printed in
        // `docs/derp-protocol.md` §17.1.
        let server = NodePrivate::from_bytes(core::array::from_fn(|i| match i {
            0 => 0x00,
            31 => 0x60,
            i => i as u8 + 1,
        }));
        let client = NodePrivate::from_bytes(core::array::from_fn(|i| match i {
            0 => 0x20,
            31 => 0x40,
            i => 0x21 + i as u8,
        }));
        VectorKeys {
            server_to_client: SharedKey::new(&server, &client.public()),
            server,
            client,
        }
    })
}

/// The `clientInfo` nonce of the `docs/derp-protocol.md` §17.3 vector.
const VECTOR_NONCE: [u8; 24] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
];

fn base_instant() -> Instant {
    static T0: OnceLock<Instant> = OnceLock::new();
    *T0.get_or_init(Instant::now)
}

/// A client with the `docs/derp-protocol.md` §17 keys: classic upgrade, or
/// fast start to their server key.
fn vector_client(fast_start: bool) -> derp_client::Client {
    let k = vector_keys();
    let mut config = derp_client::Config::new(k.client.clone(), "derp.example.com");
    config.fast_start = fast_start.then(|| k.server.public());
    derp_client::Client::new(config, base_instant(), VECTOR_NONCE).expect("valid configuration")
}

/// What a client made of a stream.
#[derive(Debug, PartialEq, Eq)]
struct ClientRun {
    events: Vec<Event>,
    /// The first error, or the outcome of the end of the stream.
    end: Result<(), ClientError>,
    sent: Vec<u8>,
    stage: Stage,
    server_key: Option<NodePublic>,
}

fn run_client<'a>(fast_start: bool, chunks: impl Iterator<Item = &'a [u8]>) -> ClientRun {
    let mut c = vector_client(fast_start);
    let mut sent = Vec::new();
    c.poll_transmit(&mut sent);
    let mut events = Vec::new();
    let mut end = Ok(());
    for chunk in chunks {
        end = c.handle_bytes(base_instant(), chunk, |e| events.push(e.into_owned()));
        c.poll_transmit(&mut sent);
        if end.is_err() {
            break;
        }
    }
    if end.is_ok() {
        end = c.handle_eof(|e| events.push(e.into_owned()));
    }
    assert_eq!(c.pending_len(), 0);
    ClientRun {
        events,
        end,
        sent,
        stage: c.stage(),
        server_key: c.server_key(),
    }
}

/// Feeds arbitrary server bytes (`data[1..]`) to a client right after
/// construction. `data[0]`: bit 0 fast start (else classic); bits 1–2 the
/// chunking (single bytes, up to 16, up to 4 096, all at once); the rest seeds
/// the chunk sizes. Every chunking must give what one read gives, `Connected`
/// can only come first, and the client may only have sent its request,
/// `clientInfo` (once it knows the server key) and one pong per server ping.
/// Seeds use the `docs/derp-protocol.md` §17 keys, so they get past the
/// handshake.
pub fn client(data: &[u8]) {
    let Some((&ctl, stream)) = data.split_first() else {
        return;
    };
    let fast_start = ctl & 1 != 0;
    let reference = run_client(fast_start, std::iter::once(stream));

    let mut rng = XorShift(0x2545_f491 ^ u32::from(ctl).wrapping_mul(0x0101_0101) | 1);
    let cut = chunks(stream, max_chunk(ctl >> 1, stream.len()), &mut rng);
    assert_eq!(run_client(fast_start, cut), reference);

    let connected = reference
        .events
        .iter()
        .filter(|e| matches!(e, Event::Connected { .. }))
        .count();
    assert!(connected <= 1);
    if connected == 1 {
        assert!(matches!(reference.events[0], Event::Connected { .. }));
    } else {
        assert!(reference.events.is_empty(), "events before serverInfo");
    }

    let k = vector_keys();
    let mut want = Vec::new();
    vector_client(fast_start).poll_transmit(&mut want);
    if let (false, Some(server)) = (fast_start, reference.server_key) {
        want.extend_from_slice(&handshake::seal_client_info(
            &k.client,
            &server,
            &derp_client::Config::new(k.client.clone(), "").info,
            &VECTOR_NONCE,
        ));
    }
    for e in &reference.events {
        if let Event::Ping(data) = e {
            frame::put_pong(&mut want, data);
        }
    }
    assert_eq!(reference.sent, want);
}

/// Parses `data` as a `serverKey` payload: the steady-state parser agrees
/// with the handshake one, an accepted key re-encodes to the same first 40
/// bytes, and a classic client given the frame after a 101 acts on exactly
/// that result.
pub fn server_key(data: &[u8]) {
    let parsed = handshake::parse_server_key(data);
    if let Ok(key) = parsed {
        assert_eq!(
            parse_server_frame(FrameType::ServerKey as u8, data),
            Ok(ServerFrame::ServerKey(key))
        );
        assert_eq!(
            handshake::server_key_frame(&key)[HEADER_LEN..],
            data[..handshake::MIN_SERVER_KEY_LEN]
        );
    }

    let mut stream = b"HTTP/1.1 101 Switching Protocols\r\n\r\n".to_vec();
    frame::put_frame(&mut stream, FrameType::ServerKey as u8, data);
    let run = run_client(false, std::iter::once(&stream[..]));
    match (parsed, run.end) {
        (_, Err(ClientError::Frame { source, .. })) => assert_eq!(
            source,
            FrameError::TooLong {
                frame: FrameType::ServerKey as u8,
                len: data.len(),
                max: handshake::MAX_SERVER_KEY_LEN
            }
        ),
        (Ok(key), Err(ClientError::ClosedDuringHandshake { stage })) => {
            assert_eq!(stage, Stage::AwaitServerInfo);
            assert_eq!(run.server_key, Some(key));
        }
        (Err(want), Err(ClientError::Handshake(got))) => assert_eq!(got, want),
        (parsed, end) => panic!("parse_server_key {parsed:?}, client {end:?}"),
    }
}

/// Opens `data` as a `serverInfo` payload with the `docs/derp-protocol.md` §17
/// keys, directly and through a fast-start client (which must agree), and
/// checks that sealing `data` in a real box and opening it agrees with decoding
/// it as JSON.
pub fn server_info(data: &[u8]) {
    let k = vector_keys();
    let opened = handshake::open_server_info(&k.client, &k.server.public(), data);
    let mut stream = Vec::new();
    frame::put_frame(&mut stream, FrameType::ServerInfo as u8, data);
    let run = run_client(true, std::iter::once(&stream[..]));
    match (&opened, &run.end) {
        (Ok(info), Err(ClientError::ClosedDuringHandshake { .. })) => panic!("{info:?} not seen"),
        (Ok(info), _) => assert_eq!(
            run.events.first(),
            Some(&Event::Connected {
                server_key: k.server.public(),
                info: *info
            })
        ),
        (Err(e), end) => assert_eq!(end, &Err(ClientError::Handshake(e.clone()))),
    }

    let mut sealed = Vec::new();
    k.server_to_client.seal_into(&mut sealed, &[0x5a; 24], data);
    let direct = ServerInfo::from_json(data);
    match (
        handshake::open_server_info(&k.client, &k.server.public(), &sealed),
        direct,
    ) {
        (Ok(info), Ok(want)) => {
            assert_eq!(info, want);
            assert_eq!(ServerInfo::from_json(&info.to_json()), Ok(info));
        }
        (Err(HandshakeError::Json { .. }), Err(HandshakeError::Json { .. })) => {}
        (Err(HandshakeError::TooLong { .. }), _) => {
            assert!(sealed.len() > handshake::MAX_SERVER_INFO_LEN)
        }
        (sealed, direct) => panic!("sealed {sealed:?} vs direct {direct:?}"),
    }
}

/// The PROXY protocol header parser: never panics; a complete header lies
/// within the input and parses the same from exactly its own bytes; every
/// proper prefix of it is incomplete (so a reader that waits for more bytes
/// always reaches the same answer); an error stays an error with more bytes.
pub fn proxy_header(data: &[u8]) {
    match proxy::parse(data) {
        Ok(Some(h)) => {
            assert!(
                h.len <= data.len() && h.len >= 15,
                "header length {}",
                h.len
            );
            assert_eq!(proxy::parse(&data[..h.len]), Ok(Some(h)));
            for n in [0, 1, h.len / 2, h.len - 1] {
                assert_eq!(proxy::parse(&data[..n]), Ok(None), "prefix of {n}");
            }
            if let Some(a) = h.addresses {
                assert_eq!(a.source.is_ipv4(), a.destination.is_ipv4());
            }
        }
        Ok(None) => assert!(data.len() < proxy::V2_MAX_LEN),
        Err(e) => {
            let mut more = data.to_vec();
            more.extend_from_slice(b"\r\n\0\0\0\0");
            assert!(
                proxy::parse(&more).is_err(),
                "{e} became valid with more bytes"
            );
        }
    }
}

/// The forwarded-address rules: the first line is a trusted-proxy list, the
/// second the peer, the third `X-Forwarded-For`, the rest `Forwarded`. The
/// answer is always the peer or an address written in the headers, and an
/// untrusted peer is always its own answer.
pub fn forwarded(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.splitn(4, '\n');
    let trusted: TrustedProxies = lines.next().unwrap_or_default().parse().unwrap_or_default();
    let peer: IpAddr = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(IpAddr::V6(Ipv6Addr::LOCALHOST));
    let xff = lines.next();
    let fwd = lines.next();
    let got = forwarded::client_address(peer, &trusted, xff, fwd);
    if let Some(known) = forwarded::known_client_address(peer, &trusted, xff, fwd) {
        assert_eq!(known, got, "a known client is the client");
    }
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    if !trusted.contains(peer) {
        assert_eq!(got, canonical(peer));
    }
    let written = [xff, fwd]
        .into_iter()
        .flatten()
        .flat_map(|h| h.split([',', ';', '=', '"', ' ', '\t', '[', ']']))
        .map(str::trim)
        .filter_map(|t| {
            t.parse::<IpAddr>()
                .ok()
                .or_else(|| t.parse::<SocketAddr>().ok().map(|s| s.ip()))
        })
        .any(|ip| canonical(ip) == got);
    assert!(
        got == canonical(peer) || written,
        "answer {got} appears nowhere"
    );
}

/// The admission controller's answer: never panics; only the first
/// [`admission::MAX_RESPONSE_BODY`] bytes matter; "allow" needs an `Allow`
/// key (any case) set to `true` somewhere in them. Read as it arrives, a
/// prefix that holds a verdict holds the whole body's verdict.
pub fn admission_response(data: &[u8]) {
    let got = admission::parse_response(data);
    let cut = &data[..data.len().min(admission::MAX_RESPONSE_BODY)];
    assert_eq!(got, admission::parse_response(cut));
    if got == Ok(true) {
        let text = String::from_utf8_lossy(cut).to_ascii_lowercase();
        assert!(
            text.contains("allow") && text.contains("true"),
            "admitted by {text:?}"
        );
    }
    // Some prefixes (each parse reads the whole prefix: not all of them).
    let step = (cut.len() / 32).max(1);
    for n in (0..=cut.len()).step_by(step).chain([cut.len()]) {
        if let Some(allow) = admission::verdict_so_far(&cut[..n]) {
            assert_eq!(Ok(allow), got, "prefix {n} of {}", cut.len());
        }
    }
}

/// The WebSocket decoder, in both roles (the server reading masked client
/// frames, the client reading unmasked server frames): never panics;
/// feeding the stream whole or in arbitrary pieces gives the same payload
/// bytes, the same control frames and the same error; the payload never
/// exceeds the input. The client's check of the upgrade response never
/// panics and never claims more bytes than it was given.
pub fn websocket(data: &[u8]) {
    use crate::websocket::{parse_upgrade_response, Decoder};
    websocket_role(data, Decoder::new);
    websocket_role(data, Decoder::for_client);
    if let Ok(Some(len)) = parse_upgrade_response(data, "dGhlIHNhbXBsZSBub25jZQ==") {
        assert!(len <= data.len());
    }
}

fn websocket_role(data: &[u8], decoder: fn() -> crate::websocket::Decoder) {
    let run = |pieces: &mut dyn Iterator<Item = &[u8]>| {
        let mut d = decoder();
        let (mut out, mut ctrl) = (Vec::new(), Vec::new());
        let mut result = Ok(());
        for p in pieces {
            result = d.feed(p, &mut out, |c| ctrl.push(c));
            if result.is_err() {
                break;
            }
        }
        (result, out, ctrl)
    };
    let whole = run(&mut std::iter::once(data));
    let mut rng = XorShift(data.len() as u32 | 1);
    let mut rest = data;
    let mut chunks = Vec::new();
    while !rest.is_empty() {
        let n = 1 + rng.below(rest.len().min(64));
        chunks.push(&rest[..n]);
        rest = &rest[n..];
    }
    let pieces = run(&mut chunks.into_iter());
    assert_eq!(whole, pieces);
    assert!(whole.1.len() <= data.len());
}

/// The DERP map parser: never panics; what it accepts stays within its
/// limits, keeps every region under its own ID, and round-trips through
/// [`DerpMap::to_json`](crate::derp_map::DerpMap::to_json) unchanged.
pub fn derp_map(data: &[u8]) {
    use crate::derp_map::{DerpMap, MAX_NODES, MAX_REGIONS, MAX_REGION_ID};
    let Ok(map) = DerpMap::from_json(data) else {
        return;
    };
    assert!(map.regions.len() <= MAX_REGIONS);
    for (id, region) in &map.regions {
        assert!((1..=MAX_REGION_ID).contains(id));
        assert_eq!(region.region_id, *id);
        assert!(region.nodes.len() <= MAX_NODES);
        assert!(region.derp_nodes().all(|n| !n.stun_only && n.port() != 0));
    }
    let text = map.to_json();
    let again = DerpMap::from_json(text.as_bytes())
        .unwrap_or_else(|e| panic!("re-encoded map refused: {e}\n{text}"));
    assert_eq!(again, map);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_keys_are_the_section_17_keys() {
        let k = vector_keys();
        assert_eq!(k.server.public(), crate::testutil::key_s());
        assert_eq!(k.client.public(), crate::testutil::key_c());
    }

    #[test]
    fn smoke() {
        for f in [
            deframer,
            http_request,
            client_info,
            stun,
            wireguard,
            tls_record,
            tls13,
            client,
            server_key,
            server_info,
            derp_map,
            relay_frames,
            mesh_session,
            bind_message,
            peer_msg,
            noise_client,
            ts2021_upgrade,
            early_payload,
            map_frames,
            map_response,
            register_response,
            filter_caps,
            disco,
            peer_relay_bind,
        ] {
            f(b"");
            f(&[0]);
            f(&[0xff; 100]);
            f(b"GET /derp HTTP/1.1\r\nUpgrade: DERP\r\n\r\n");
            f(br#"{"version":2,"CanAckPings":true}"#);
        }
    }
}
