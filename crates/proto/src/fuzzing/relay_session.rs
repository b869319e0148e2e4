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

/// Version 2's session frames and the meshSession frame between Ferry
/// nodes (`relay_session::v2`, `mesh_session`): the whole input as a
/// meshSession body, and the input after its first byte as a
/// relaySession2 (first byte even) or relaySessionEnd (odd) body. What
/// parses re-encodes to exactly the input; what does not is refused with
/// a reason, never a panic.
pub fn mesh_session(data: &[u8]) {
    use crate::mesh_session as ms;
    use crate::relay_session::v2::{self, Frame2};
    match ms::parse_mesh_session(data) {
        Ok(m) => {
            let mut again = Vec::new();
            ms::put_mesh_session(&mut again, &m);
            assert_eq!(again[0], ms::MESH_SESSION);
            assert!(again.len() <= ms::MAX_FRAME_LEN);
            assert_eq!(&again[HEADER_LEN..], data);
        }
        Err(e) => assert!(!e.label().is_empty()),
    }
    let Some((&ctl, body)) = data.split_first() else {
        return;
    };
    let ty = if ctl & 1 == 0 {
        v2::RELAY_SESSION2
    } else {
        v2::RELAY_SESSION_END
    };
    let Some(Ok(parsed)) = v2::parse_frame2(ty, body) else {
        return;
    };
    let mut again = Vec::new();
    match &parsed {
        Frame2::Session(s) => v2::put_session2(&mut again, s),
        Frame2::End(e) => v2::put_end(&mut again, e),
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
