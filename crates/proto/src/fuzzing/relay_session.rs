//! Fuzz entry points for the relay-session messages: the DERP frames
//! that allocate a session and the UDP bind messages (see the parent
//! module for how the entry points are used).

use std::net::SocketAddr;
use std::time::Instant;

use crate::frame::{self, HEADER_LEN};
use crate::key::NodePublic;

/// The relay-session DERP frames (`relay_session`, 0xf0–0xf2): `data[0]`
/// picks the type (`0xf0 + data[0] % 3`), the rest is the body. What
/// parses re-encodes to exactly the same frame (every field is kept and
/// the encoding is canonical, IPv4-mapped endpoints included).
pub fn relay_frames(data: &[u8]) {
    use crate::relay_session::{self as rs, RelayFrame};
    let Some((&ctl, body)) = data.split_first() else {
        return;
    };
    let ty = frame::RELAY_ALLOCATE + ctl % 3;
    let Some(parsed) = rs::parse_frame(ty, body) else {
        panic!("0x{ty:02x} is a relay-session frame");
    };
    let Ok(parsed) = parsed else {
        return;
    };
    let mut again = Vec::new();
    match &parsed {
        RelayFrame::Allocate(a) => rs::put_allocate(&mut again, a),
        RelayFrame::Session(s) => {
            assert!(!s.endpoints.is_empty() && s.endpoints.len() <= rs::MAX_ENDPOINTS);
            assert!(s.vni != 0 && s.vni <= crate::udp_header::MAX_VNI && s.slot <= 1);
            rs::put_session(&mut again, s)
        }
        RelayFrame::Refused(r) => rs::put_refused(&mut again, r),
    }
    assert_eq!(again[0], ty);
    assert_eq!(&again[HEADER_LEN..], body);
}

/// Bind messages (`relay_session::BindMsg`) and the client's
/// [`Binder`](crate::relay_session::Binder) fed them: what parses is 78
/// bytes and re-encodes to exactly the input; a binder handed any datagram
/// never panics, only claims bind messages of its own session and slot,
/// and never sends anything but 78-byte binds and answers.
pub fn bind_message(data: &[u8]) {
    use crate::relay_session::{BindKind, BindMsg, Binder, SessionOffer, BIND_LEN};
    use std::time::Duration;
    if let Ok(m) = BindMsg::parse(data) {
        assert_eq!(data.len(), BIND_LEN);
        assert_eq!(&m.to_bytes()[..], data);
    }
    let offer = SessionOffer {
        request_id: 0,
        vni: 1,
        peer: NodePublic([1; 32]),
        slot: data.first().map_or(0, |b| b & 1),
        token: [2; 32],
        endpoints: vec![SocketAddr::from(([127, 0, 0, 1], 1))],
        bind_lifetime: Duration::from_secs(30),
        idle_lifetime: Duration::from_secs(60),
    };
    let t0 = Instant::now();
    let mut b = Binder::new(&offer, offer.endpoints[0], 1, t0);
    let _ = b.poll_transmit(t0);
    // The datagram as sent, then as a reply to each of the binder's
    // states (bytes 8.. reused as body under this session's header).
    for (i, d) in data.chunks(BIND_LEN).enumerate() {
        let now = t0 + Duration::from_millis(i as u64 * 100);
        let claimed = b.handle(now, d);
        if claimed {
            let m = BindMsg::parse(d).expect("a claimed datagram parses");
            assert_eq!((m.vni, m.slot), (1, offer.slot));
            assert!(matches!(m.kind, BindKind::Challenge | BindKind::Bound));
        }
        if let Some(out) = b.poll_transmit(now) {
            let m = BindMsg::parse(&out).expect("the binder sends bind messages");
            assert!(matches!(m.kind, BindKind::Bind | BindKind::Answer));
            assert_eq!(m.generation, b.generation());
        }
    }
}
