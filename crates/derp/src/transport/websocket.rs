//! DERP over WebSocket: the framing between a connection's transport and
//! its DERP stream. Client frames are decoded (`ferry_proto::websocket`)
//! and their payload handed on as DERP bytes; the queued DERP output is
//! framed into binary messages at flush, after any raw WebSocket bytes
//! (the 101, the pong for the latest ping, a close).

use ferry_proto::server::ServerConn;
use ferry_proto::websocket::{self, ControlFrame, Decoder, WsError};

/// A connection's WebSocket framing.
#[derive(Debug, Default)]
pub struct WsFraming {
    /// Reads the client's frames.
    decoder: Decoder,
    /// Raw bytes for the socket, ahead of the next framed output (the 101
    /// response, a pong, a close frame).
    out: Vec<u8>,
    /// The pong in `out` not yet written, if one waits.
    pong: PendingPong,
}

/// Where in [`WsFraming`]'s raw output the pong not yet written starts, if
/// one waits.
#[derive(Debug, Default)]
struct PendingPong(Option<usize>);

impl PendingPong {
    /// Queues in `out` the pong for a ping whose payload is `ping`, in
    /// place of the pong still waiting for an earlier one, if any (RFC
    /// 6455 §5.5.3 lets an endpoint answer only the latest ping): a
    /// client's pings cannot grow the queue, whether or not it reads.
    fn queue(&mut self, out: &mut Vec<u8>, ping: &[u8]) {
        match self.0 {
            Some(at) => out.truncate(at),
            None => self.0 = Some(out.len()),
        }
        websocket::put_pong(out, ping);
    }
}

impl WsFraming {
    /// Framing that first writes `response` (the 101 that accepted the
    /// upgrade).
    pub fn new(response: Vec<u8>) -> WsFraming {
        WsFraming {
            out: response,
            ..WsFraming::default()
        }
    }

    /// Decodes the client's frames in `data`, appending the DERP bytes
    /// they carry to `payload`; a ping queues its pong. `Ok(Some(code))`:
    /// the client sent a close frame (answered with `code`); `Err`: a
    /// protocol error, which ends the connection
    /// ([`WsError::close_code`] says with what).
    pub fn decode(&mut self, data: &[u8], payload: &mut Vec<u8>) -> Result<Option<u16>, WsError> {
        let mut close = None;
        let (out, pong) = (&mut self.out, &mut self.pong);
        self.decoder.feed(data, payload, |c| match c {
            ControlFrame::Ping(p) => pong.queue(out, &p),
            ControlFrame::Pong => {}
            ControlFrame::Close(_) => close = Some(websocket::close_code::NORMAL),
        })?;
        Ok(close)
    }

    /// Queues a close frame with `code`.
    pub fn close(&mut self, code: u16) {
        websocket::put_close(&mut self.out, code);
    }

    /// Whether raw bytes wait.
    pub fn has_out(&self) -> bool {
        !self.out.is_empty()
    }

    /// Before a flush: the raw WebSocket bytes, then `derp`'s queued
    /// frames as binary messages, all become `derp`'s control queue;
    /// `scratch` (emptied) ends up with the old control queue's memory.
    pub fn frame_output(&mut self, derp: &mut ServerConn, scratch: &mut Vec<u8>) {
        scratch.clear();
        scratch.append(&mut self.out);
        self.pong = PendingPong::default();
        derp.rewrap_output(scratch, |out, parts| {
            websocket::put_binary_parts(out, &parts)
        });
    }
}
