//! The DERP frame splitter ([`crate::frame::Deframer`]) under the server's
//! admission policy.

use super::*;

type Frames = Vec<(u8, Vec<u8>)>;

/// Checks one delivered frame: it parses (the policy admitted it), and frames
/// with a canonical encoding re-encode to exactly the delivered bytes.
fn check_delivered(ty: u8, payload: &[u8]) {
    let parsed = parse_client_frame(ty, payload)
        .unwrap_or_else(|e| panic!("admitted frame failed to parse: {e}"));
    let mut again = Vec::new();
    match parsed {
        ClientFrame::SendPacket { dst, packet } => frame::put_send_packet(&mut again, &dst, packet),
        ClientFrame::ForwardPacket { src, dst, packet } => {
            frame::put_forward_packet(&mut again, &src, &dst, packet)
        }
        ClientFrame::ClosePeer(k) => frame::put_close_peer(&mut again, &k),
        ClientFrame::WatchConns => frame::put_watch_conns(&mut again),
        ClientFrame::NotePreferred(p) if payload[0] <= 1 => {
            frame::put_note_preferred(&mut again, p)
        }
        ClientFrame::Ping(d) if payload.len() == 8 => frame::put_ping(&mut again, &d),
        ClientFrame::Other {
            ty: frame::RELAY_ALLOCATE,
        } => {
            // Delivered only under `relay_sessions`, and then exactly 36
            // bytes: it parses.
            let a = crate::relay_session::parse_allocate(payload)
                .unwrap_or_else(|e| panic!("admitted relayAllocate failed to parse: {e}"));
            crate::relay_session::put_allocate(&mut again, &a)
        }
        _ => return,
    }
    assert_eq!(again[0], ty);
    assert_eq!(&again[HEADER_LEN..], payload);
}

/// Feeds `stream` in one call with no pauses: the reference result.
fn reference(stream: &[u8], policy: &ServerFramePolicy) -> (Frames, Option<FrameError>) {
    let mut frames = Vec::new();
    let mut d = Deframer::new();
    let r = d.feed(stream, policy, |ty, p| {
        frames.push((ty, p.to_vec()));
        ControlFlow::Continue(())
    });
    match r {
        Ok(fed) => {
            assert_eq!(fed, Fed::Drained);
            assert!(d.buffered_len() < MAX_BUFFERED_FRAME);
            (frames, None)
        }
        Err(e) => (frames, Some(e)),
    }
}

/// Splits the stream (`data[1..]`) into frames under [`ServerFramePolicy`].
///
/// `data[0]` chooses: bit 0 mesh on/off; bit 5 relay sessions on/off
/// (relayAllocate buffered or skipped); bit 6 the Ferry mesh extension
/// on/off (meshSession buffered or skipped); bits 1–2 the chunking (single
/// bytes, up to 16, up to 4 096, up to the whole stream); bits 3–4 how often
/// the callback breaks (never, 1 in 8, 1 in 2, always); it also seeds the
/// generator. The frames delivered, and the error if any, must equal a
/// single uninterrupted feed of the whole stream.
pub fn deframer(data: &[u8]) {
    let Some((&ctl, stream)) = data.split_first() else {
        return;
    };
    let policy = ServerFramePolicy {
        mesh: ctl & 1 != 0,
        relay_sessions: ctl & 0x20 != 0,
        ferry_mesh: ctl & 0x40 != 0,
    };
    let (want_frames, want_err) = reference(stream, &policy);

    let mut rng = XorShift(0x9e37_79b9 ^ u32::from(ctl).wrapping_mul(0x0101_0101) | 1);
    let max_chunk = max_chunk(ctl >> 1, stream.len());
    let break_one_in = match (ctl >> 3) & 3 {
        0 => 0,
        1 => 8,
        2 => 2,
        _ => 1,
    };

    let mut got: Frames = Vec::new();
    let mut d = Deframer::new();
    let mut err = None;
    let mut rest = stream;
    let mut paused = false;
    let mut brk = XorShift(rng.next_u32() | 1);
    let mut on_frame = |ty: u8, p: &[u8]| {
        check_delivered(ty, p);
        got.push((ty, p.to_vec()));
        if break_one_in != 0 && brk.below(break_one_in) == 0 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    while err.is_none() {
        // While paused, sometimes resume and sometimes feed more right away:
        // held bytes must be processed first either way.
        let result = if paused && rng.below(2) == 0 {
            d.resume(&policy, &mut on_frame)
        } else if rest.is_empty() {
            if !paused {
                break;
            }
            d.resume(&policy, &mut on_frame)
        } else {
            let n = 1 + rng.below(max_chunk.min(rest.len()));
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            d.feed(chunk, &policy, &mut on_frame)
        };
        match result {
            Ok(Fed::Paused) => paused = true,
            Ok(Fed::Drained) => {
                paused = false;
                assert!(d.buffered_len() < MAX_BUFFERED_FRAME);
                if break_one_in == 0 {
                    assert!(d.capacity() <= MAX_BUFFERED_FRAME.max(8));
                }
            }
            Err(e) => err = Some(e),
        }
    }
    if let Some(e) = &err {
        // A poisoned deframer keeps failing the same way.
        assert_eq!(
            d.resume(&policy, |_, _| ControlFlow::Continue(())).as_ref(),
            Err(e)
        );
        assert_eq!(d.buffered_len(), 0);
    } else {
        assert!(!paused);
    }
    assert_eq!(got, want_frames);
    assert_eq!(err, want_err);
    d.shrink_if_idle();
}
