//! The connection to one mesh peer: the socket, TLS and the sans-IO DERP
//! client, read and written as far as the socket takes.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use ferry_proto::client::{Client, ClientError, Event};
use mio::net::TcpStream;
use rustls::ClientConnection;

/// The connection to one mesh peer: the socket, TLS and the DERP client
/// watching its keys.
pub(super) struct MeshConn {
    pub(super) sock: TcpStream,
    pub(super) addr: SocketAddr,
    pub(super) tls: ClientConnection,
    pub(super) client: Client,
    /// The TCP connect has not completed.
    pub(super) connecting: bool,
    /// The DERP handshake is done and watchConns sent.
    pub(super) up: bool,
    /// When the peer's first peerPresent arrived (it accepted the mesh
    /// key): the link counts as up from then.
    pub(super) accepted: Option<Instant>,
    /// When to ping the peer next (once connected).
    pub(super) next_ping: Option<Instant>,
    /// Plaintext waiting for TLS, from `sent` on.
    pub(super) out: Vec<u8>,
    pub(super) sent: usize,
}

impl MeshConn {
    /// Reads what the socket has, collecting the client's events.
    pub(super) fn read(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        events: &mut Vec<Event>,
    ) -> Result<(), String> {
        loop {
            match self.tls.read_tls(&mut self.sock) {
                Ok(0) => {
                    return match self.client.handle_eof(|ev| events.push(ev.into_owned())) {
                        Ok(()) => Err("the peer closed the connection".into()),
                        Err(e) => Err(describe(&e)),
                    }
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("read: {e}")),
            }
            if let Err(e) = self.tls.process_new_packets() {
                // Send the alert, if any, before giving up.
                let _ = self.tls.write_tls(&mut self.sock);
                return Err(format!("TLS: {e}"));
            }
            loop {
                match self.tls.reader().read(buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        self.client
                            .handle_bytes(now, &buf[..n], |ev| events.push(ev.into_owned()))
                            .map_err(|e| describe(&e))?;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(format!("TLS read: {e}")),
                }
            }
        }
    }

    /// Plaintext bytes waiting for TLS.
    pub(super) fn pending(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Moves queued plaintext into TLS and TLS records into the socket,
    /// as far as the socket takes them. `Ok(true)` when the socket pushed
    /// back (a writable edge follows), `Ok(false)` when everything queued
    /// went out or TLS waits for something else (its handshake).
    pub(super) fn write(&mut self) -> io::Result<bool> {
        self.client.poll_transmit(&mut self.out);
        loop {
            let mut progress = false;
            if self.sent < self.out.len() {
                let n = self.tls.writer().write(&self.out[self.sent..])?;
                self.sent += n;
                progress |= n > 0;
            }
            if self.sent == self.out.len() {
                self.out.clear();
                self.sent = 0;
            }
            while self.tls.wants_write() {
                match self.tls.write_tls(&mut self.sock) {
                    Ok(n) => progress |= n > 0,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if self.out.is_empty() || !progress {
                return Ok(false);
            }
        }
    }
}

/// A client error as a log reason, with a hint where one helps.
pub(super) fn describe(e: &ClientError) -> String {
    match e {
        ClientError::ClosedDuringHandshake { .. } => {
            format!("{e} (a wrong mesh key, or the peer refused this relay)")
        }
        other => other.to_string(),
    }
}
