//! DERP over WebSocket on the shard: the same connection, deframer,
//! routing and backpressure as raw DERP, with the framing
//! (`transport::websocket`) between the transport and the DERP stream.
//! Here: what the decoded payload and a client's close or protocol error
//! do to the connection. A protocol error answers with a close frame and
//! ends the connection.

use super::*;

impl Shard {
    /// Decodes WebSocket frames from `data` and feeds their payload to the
    /// DERP deframer.
    pub(super) fn ws_input(&mut self, slot: Slot, data: &[u8]) -> ControlFlow<()> {
        let Some(mut ws) = self.conns[slot].take_ws() else {
            return self.deframe(slot, data);
        };
        let mut payload = std::mem::take(&mut self.ws_payload);
        payload.clear();
        let result = ws.decode(data, &mut payload);
        let wrote = ws.has_out();
        self.conns[slot].put_ws(ws);
        if wrote {
            self.mark_dirty(slot);
        }
        let flow = if payload.is_empty() {
            ControlFlow::Continue(())
        } else {
            self.deframe(slot, &payload)
        };
        self.ws_payload = payload;
        match result {
            Err(e) => {
                let peer = self.conns[slot].peer();
                conn_log!(self, info, %peer, error = %e, "WebSocket protocol error; closing connection");
                self.ws_close(slot, e.close_code(), CloseReason::FrameError);
                ControlFlow::Break(())
            }
            Ok(Some(code)) => {
                self.ws_close(slot, code, CloseReason::Eof);
                ControlFlow::Break(())
            }
            Ok(None) => flow,
        }
    }

    /// Sends a close frame and ends the connection once it is written.
    fn ws_close(&mut self, slot: Slot, code: u16, reason: CloseReason) {
        if self.ended(slot) {
            return;
        }
        if let Some(ws) = self.conns[slot].ws_mut() {
            ws.close(code);
        }
        if self.conns[slot].phase() == Phase::Active {
            self.finish(slot, reason);
        } else {
            self.m.handshake_failures[HandshakeFailure::BadFirstFrame as usize].inc();
            let conn = &mut self.conns[slot];
            conn.set_phase(Phase::Responding);
            conn.close_when_flushed(CloseReason::Handshake);
            self.mark_dirty(slot);
        }
    }

    /// Before a flush: the queued DERP bytes become binary messages, after
    /// the raw WebSocket bytes, all in the control queue.
    pub(super) fn ws_frame_output(&mut self, slot: Slot) {
        let (ws, derp) = self.conns[slot].ws_and_derp();
        if let Some(ws) = ws {
            ws.frame_output(derp, &mut self.ws_out);
        }
    }
}
