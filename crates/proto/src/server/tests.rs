//! Unit tests of [`ServerConn`] and its [`Reader`].

use super::*;
use crate::frame::{FrameType, PeerGoneReason, DISCO_MAGIC};

fn policy(mesh: bool) -> ServerFramePolicy {
    ServerFramePolicy {
        mesh,
        relay_sessions: false,
        ferry_mesh: false,
    }
}

const CAPS: Caps = Caps {
    disco_packets: 2,
    data_bytes: 200,
    hard_bytes: 400,
};

fn key(b: u8) -> NodePublic {
    NodePublic::from_bytes([b; 32])
}

fn frame_bytes(ty: FrameType, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::put_frame(&mut out, ty as u8, payload);
    out
}

/// Every server frame in `bytes`, as (type, payload).
fn frames(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (ty, len) = frame::decode_header(rest).expect("header");
        let end = frame::HEADER_LEN + len as usize;
        out.push((ty, rest[frame::HEADER_LEN..end].to_vec()));
        rest = &rest[end..];
    }
    out
}

/// What `s` did with `packet` from key `src`.
fn queue(s: &mut ServerConn, src: u8, packet: &[u8], kind: PacketKind, overshoot: bool) -> Queued {
    s.queue_packet(&key(src), packet, kind, &CAPS, overshoot).0
}

fn drain(s: &mut ServerConn) -> Vec<(u8, Vec<u8>)> {
    let mut buf = s.take_send_buffer();
    s.poll_output(&mut buf);
    frames(&buf)
}

fn established(now: Instant) -> ServerConn {
    let mut s = ServerConn::new(now + Duration::from_secs(10));
    s.establish(
        now + Duration::from_secs(60),
        Duration::from_secs(60),
        Some(Duration::from_secs(10)),
    );
    s
}

#[test]
fn handshake_deadline_fires_exactly_at_the_deadline() {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(5);
    let mut s = ServerConn::new(deadline);
    assert_eq!(s.poll_timeout(), Some(deadline));
    let no_jitter = || panic!("no keepalive before the handshake");
    assert_eq!(
        s.handle_timeout(deadline - Duration::from_millis(1), no_jitter),
        None
    );
    assert_eq!(
        s.handle_timeout(deadline, no_jitter),
        Some(Timeout::Deadline)
    );
    // Established, the deadline no longer applies.
    s.establish(t0 + Duration::from_secs(60), Duration::from_secs(60), None);
    assert_eq!(s.handle_timeout(deadline, no_jitter), None);
    // A farewell brings a deadline back.
    let bye = t0 + Duration::from_secs(7);
    s.set_deadline(bye);
    assert_eq!(s.poll_timeout(), Some(bye));
    assert_eq!(s.handle_timeout(bye, no_jitter), Some(Timeout::Deadline));
}

#[test]
fn a_quiet_connection_gives_up_its_send_buffer_and_the_handshakes_room() {
    let t0 = Instant::now();
    let mut s = established(t0);
    s.control_mut().extend_from_slice(&[0u8; 512]);
    let mut buf = s.take_send_buffer();
    s.poll_output(&mut buf);
    s.start_send(t0, buf.len());
    assert_eq!(
        s.release_idle_send_buffer(usize::MAX),
        None,
        "a send in flight keeps its buffer"
    );
    s.handle_sent(buf);
    s.answer_ping(&[1; PING_LEN]);
    assert_eq!(s.release_idle_send_buffer(usize::MAX), None, "output waits");
    let mut buf = s.take_send_buffer();
    s.poll_output(&mut buf);
    s.handle_sent(buf);
    assert_eq!(s.release_idle_send_buffer(16), None, "too large to share");
    let released = s.release_idle_send_buffer(usize::MAX).expect("quiet");
    assert!(released.capacity() >= 512);
    assert!(s.ctrl.capacity() <= IDLE_CONTROL_KEEP);
    assert_eq!(s.spare.capacity(), 0);
}

#[test]
fn keepalive_is_queued_when_due_and_rescheduled_with_the_jitter() {
    let t0 = Instant::now();
    let mut s = established(t0);
    let first = t0 + Duration::from_secs(60);
    assert_eq!(s.poll_timeout(), Some(first));
    assert_eq!(
        s.handle_timeout(first - Duration::from_millis(1), || Duration::ZERO),
        None
    );
    assert!(!s.has_output());
    let jitter = Duration::from_millis(1234);
    assert_eq!(s.handle_timeout(first, || jitter), Some(Timeout::KeepAlive));
    assert_eq!(
        s.poll_timeout(),
        Some(first + Duration::from_secs(60) + jitter)
    );
    assert_eq!(drain(&mut s), vec![(FrameType::KeepAlive as u8, vec![])]);
}

#[test]
fn write_timeout_counts_from_the_start_of_the_send_in_flight() {
    let t0 = Instant::now();
    let mut s = established(t0);
    s.queue_packet(&key(1), b"data", PacketKind::Other, &CAPS, true);
    let mut buf = s.take_send_buffer();
    s.poll_output(&mut buf);
    let at = t0 + Duration::from_secs(1);
    s.start_send(at, buf.len());
    assert_eq!(s.sending_since(), Some(at));
    assert_eq!(s.poll_timeout(), Some(at + Duration::from_secs(10)));
    let none = || Duration::ZERO;
    assert_eq!(
        s.handle_timeout(at + Duration::from_millis(9_999), none),
        None
    );
    assert_eq!(
        s.handle_timeout(at + Duration::from_secs(10), none),
        Some(Timeout::WriteTimeout)
    );
    // A finished send stops the clock and returns the buffer.
    s.handle_sent(buf);
    assert_eq!(s.sending_since(), None);
    assert_eq!(s.handle_timeout(at + Duration::from_secs(10), none), None);
}

#[test]
fn output_goes_control_then_disco_then_data_and_control_is_never_dropped() {
    let mut s = established(Instant::now());
    let mut disco = DISCO_MAGIC.to_vec();
    disco.extend_from_slice(&[0; 40]);
    assert_eq!(
        queue(&mut s, 1, b"data-1", PacketKind::Other, true),
        Queued::Yes
    );
    for _ in 0..CAPS.disco_packets {
        assert_eq!(
            queue(&mut s, 2, &disco, PacketKind::Disco, true),
            Queued::Yes
        );
    }
    // The disco cap counts packets: the next one is dropped.
    assert_eq!(
        queue(&mut s, 2, &disco, PacketKind::Disco, true),
        Queued::Dropped
    );
    // Control frames go first whatever is queued.
    for _ in 0..100 {
        assert!(s.queue_control(usize::MAX, |q| frame::put_peer_gone(
            q,
            &key(3),
            PeerGoneReason::Disconnected
        )));
    }
    assert_eq!(s.queued_packets(), (2, 1));
    let out = drain(&mut s);
    assert_eq!(out.len(), 100 + 2 + 1);
    assert!(out[..100]
        .iter()
        .all(|(ty, _)| *ty == FrameType::PeerGone as u8));
    assert!(out[100..102]
        .iter()
        .all(|(ty, p)| *ty == FrameType::RecvPacket as u8 && p[32..] == disco[..]));
    assert_eq!(out[102].1[32..], b"data-1"[..]);
    assert_eq!(s.queued_packets(), (0, 0));
    assert!(!s.has_output());
}

#[test]
fn control_frames_stop_at_the_cap_they_are_queued_under() {
    let mut s = established(Instant::now());
    let gone = |q: &mut Vec<u8>| frame::put_peer_gone(q, &key(3), PeerGoneReason::Disconnected);
    // 38-byte frames under a 100-byte cap: three fit (the third goes
    // past it), the fourth does not.
    let queued = (0..10).filter(|_| s.queue_control(100, gone)).count();
    assert_eq!(queued, 3);
    assert_eq!(s.queued_bytes(), 3 * 38);
    // A larger cap takes more; a flush empties the queue.
    assert!(s.queue_control(1000, gone));
    assert_eq!(drain(&mut s).len(), 4);
    assert!(s.queue_control(100, gone));
}

#[test]
fn data_over_its_cap_pauses_the_sender_up_to_the_hard_cap_or_drops() {
    let mut s = established(Instant::now());
    let packet = [7u8; 100]; // 137-byte frames
    assert_eq!(
        s.queue_packet(&key(1), &packet, PacketKind::Other, &CAPS, true),
        (Queued::Yes, 137)
    );
    // Over the 200-byte cap: queued if the sender can be paused ...
    assert_eq!(
        queue(&mut s, 1, &packet, PacketKind::Other, true),
        Queued::OverCap
    );
    // ... dropped if it cannot (mesh-forwarded, or not draining) ...
    assert_eq!(
        queue(&mut s, 1, &packet, PacketKind::Other, false),
        Queued::Dropped
    );
    // ... and dropped past the hard cap whatever the sender.
    assert_eq!(
        queue(&mut s, 1, &packet, PacketKind::Other, true),
        Queued::Dropped
    );
    assert_eq!(s.queued_bytes(), 2 * 137);
    assert_eq!(s.queued_packets(), (0, 2));
}

#[test]
fn only_data_queued_swaps_the_queue_into_the_send_buffer() {
    let mut s = established(Instant::now());
    s.queue_packet(&key(1), b"x", PacketKind::Other, &CAPS, true);
    let mut buf = s.take_send_buffer();
    s.poll_output(&mut buf);
    assert!(
        buf.capacity() >= QUEUE_START,
        "the queue itself became the buffer"
    );
    assert_eq!(frames(&buf).len(), 1);
}

#[test]
fn one_pong_per_flush_and_the_next_ping_after_it() {
    let mut s = established(Instant::now());
    let mut reader = s.take_reader();
    let mut input = frame_bytes(FrameType::Ping, &[1; 8]);
    input.extend(frame_bytes(FrameType::Ping, &[2; 8]));
    let fed = reader.handle_bytes(&input, policy(false), |_, a| {
        match a {
            Action::Ping(data) => {
                s.answer_ping(&data);
            }
            other => panic!("unexpected {other:?}"),
        }
        ControlFlow::Continue(())
    });
    s.put_reader(reader);
    assert_eq!(fed, Ok(Fed::Drained));
    assert_eq!(drain(&mut s), vec![(FrameType::Pong as u8, vec![1; 8])]);
    assert!(s.answer_ping(&[3; 8]));
    assert_eq!(drain(&mut s), vec![(FrameType::Pong as u8, vec![3; 8])]);
}

#[test]
fn frames_become_actions_and_skipped_frames_none() {
    let mut reader = Reader::default();
    let mut input = Vec::new();
    frame::put_send_packet(&mut input, &key(9), b"hello");
    input.extend(frame_bytes(FrameType::NotePreferred, &[1]));
    input.extend(frame_bytes(FrameType::Pong, &[0; 8]));
    let mut seen = Vec::new();
    let fed = reader.handle_bytes(&input, policy(false), |len, a| {
        seen.push(format!("{len} {a:?}"));
        ControlFlow::Continue(())
    });
    assert_eq!(fed, Ok(Fed::Drained));
    assert_eq!(
        seen,
        vec![
            format!(
                "37 {:?}",
                Action::Send {
                    dst: key(9),
                    packet: b"hello"
                }
            ),
            format!("1 {:?}", Action::NotePreferred(true)),
            // A client's pong is skipped by the frame policy unread.
        ]
    );
}

#[test]
fn a_pause_keeps_the_rest_for_resume() {
    let mut reader = Reader::default();
    let mut input = frame_bytes(FrameType::NotePreferred, &[1]);
    input.extend(frame_bytes(FrameType::NotePreferred, &[0]));
    let fed = reader.handle_bytes(&input, policy(false), |_, _| ControlFlow::Break(()));
    assert_eq!(fed, Ok(Fed::Paused));
    assert!(reader.buffered_len() > 0);
    let mut rest = Vec::new();
    let fed = reader.resume(policy(false), |_, a| {
        rest.push(a == Action::NotePreferred(false));
        ControlFlow::Continue(())
    });
    assert_eq!((fed, rest), (Ok(Fed::Drained), vec![true]));
}

#[test]
fn malformed_or_forbidden_frames_end_the_session() {
    // A sendPacket too short to hold its destination key.
    let mut reader = Reader::default();
    let input = frame_bytes(FrameType::SendPacket, &[1; 31]);
    let r = reader.handle_bytes(&input, policy(false), |_, a| {
        panic!("no action for a bad frame: {a:?}")
    });
    assert!(matches!(r, Err(FrameError::TooShort { .. })), "{r:?}");
    // A mesh-only frame from a client that is not a mesh peer.
    let mut reader = Reader::default();
    let input = frame_bytes(FrameType::WatchConns, &[]);
    let r = reader.handle_bytes(&input, policy(false), |_, a| {
        panic!("no action for a bad frame: {a:?}")
    });
    assert_eq!(
        r,
        Err(FrameError::MeshOnly {
            frame: FrameType::WatchConns as u8
        })
    );
    // The same frame from a mesh peer.
    let mut reader = Reader::default();
    let mut got = None;
    let r = reader.handle_bytes(&input, policy(true), |_, a| {
        got = Some(a == Action::WatchConns);
        ControlFlow::Continue(())
    });
    assert_eq!((r, got), (Ok(Fed::Drained), Some(true)));
}

#[test]
fn restarting_goes_after_queued_data() {
    let mut s = established(Instant::now());
    s.queue_packet(&key(1), b"last", PacketKind::Other, &CAPS, true);
    s.queue_restarting(1000, 5000);
    let out = drain(&mut s);
    let kinds: Vec<u8> = out.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        kinds,
        vec![FrameType::RecvPacket as u8, FrameType::Restarting as u8]
    );
}
