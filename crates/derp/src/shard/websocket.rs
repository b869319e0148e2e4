//! DERP over WebSocket: the same connection, deframer, routing and
//! backpressure as raw DERP, with one layer between the transport and the
//! DERP stream. Client frames are decoded (`ferry_proto::websocket`) and
//! their payload fed to the deframer; what the shard writes is framed into
//! binary messages at flush, after any raw WebSocket bytes (the 101, the
//! pong for the latest ping, a close). A protocol error answers with a close frame and ends the
//! connection.

use ferry_proto::websocket::{self, ControlFrame};

use super::*;

impl Shard {
    /// Decodes WebSocket frames from `data` and feeds their payload to the
    /// DERP deframer.
    pub(super) fn ws_input(&mut self, slot: Slot, data: &[u8]) -> ControlFlow<()> {
        let Some(mut link) = self.conns[slot].take_ws() else {
            return self.deframe(slot, data);
        };
        let mut payload = std::mem::take(&mut self.ws_payload);
        payload.clear();
        let mut close = None;
        let result = link.decoder.feed(data, &mut payload, |c| match c {
            ControlFrame::Ping(p) => link.pong.queue(&mut link.out, &p),
            ControlFrame::Pong => {}
            ControlFrame::Close(_) => close = Some(websocket::close_code::NORMAL),
        });
        let wrote = link.has_out();
        self.conns[slot].put_ws(link);
        if wrote {
            self.mark_dirty(slot);
        }
        let flow = if payload.is_empty() {
            ControlFlow::Continue(())
        } else {
            self.deframe(slot, &payload)
        };
        self.ws_payload = payload;
        if let Err(e) = result {
            let peer = self.conns[slot].peer();
            conn_log!(self, info, %peer, error = %e, "WebSocket protocol error; closing connection");
            self.ws_close(slot, e.close_code(), CloseReason::FrameError);
            return ControlFlow::Break(());
        }
        if let Some(code) = close {
            self.ws_close(slot, code, CloseReason::Eof);
            return ControlFlow::Break(());
        }
        flow
    }

    /// Sends a close frame and ends the connection once it is written.
    fn ws_close(&mut self, slot: Slot, code: u16, reason: CloseReason) {
        if self.ended(slot) {
            return;
        }
        if let Some(link) = self.conns[slot].ws_mut() {
            websocket::put_close(&mut link.out, code);
        }
        if self.conns[slot].phase() == Phase::Active {
            self.finish(slot, reason);
        } else {
            self.m().handshake_failures[HandshakeFailure::BadFirstFrame as usize].inc();
            let conn = &mut self.conns[slot];
            conn.set_phase(Phase::Responding);
            conn.close_when_flushed(CloseReason::Handshake);
            self.mark_dirty(slot);
        }
    }

    /// Before a flush: the queued DERP bytes become binary messages, after
    /// the raw WebSocket bytes, all in the control queue.
    pub(super) fn ws_frame_output(&mut self, slot: Slot) {
        let out = &mut self.plain_out;
        let conn = &mut self.conns[slot];
        let Some(link) = conn.ws_mut() else { return };
        out.clear();
        link.take_out(out);
        conn.derp_mut()
            .rewrap_output(out, |out, parts| websocket::put_binary_parts(out, &parts));
    }
}
