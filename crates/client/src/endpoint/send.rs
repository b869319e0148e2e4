//! Sending: one datagram or a batch, waiting for room
//! ([`Endpoint::send`], [`Endpoint::send_batch`]) or not
//! ([`Endpoint::try_send`], [`Endpoint::try_send_batch`]).
//!
//! Each datagram takes its peer's active path at the moment it is sent:
//! the UDP socket (direct, relay session) or the DERP server's queue. Room
//! means the socket's send buffer, or a free place in that queue
//! ([`super::EndpointOptions::queue`]). The `try_` calls never wait: a
//! full one is [`SendError::QueueFull`]. The others wait for room (a
//! datagram that waited takes the active path of the moment it goes), so
//! a sender that outpaces its path is slowed to the path's pace instead of
//! spinning; every other failure returns at once.

use super::batch::Datagrams;
use super::inner::{derp_payload, send_error, vni_of, ToRelay};
use super::paths::{PathAddr, PathKind};
use super::{Endpoint, SendError, SendReport};
use ferry_proto::key::NodePublic;
use std::sync::atomic::Ordering;

impl Endpoint {
    /// Sends `data` to `peer` on its active path, waiting while that
    /// path's queue is full. Cancel-safe: cancelled while waiting, the
    /// datagram was not sent.
    pub async fn send(&self, peer: &NodePublic, data: &[u8]) -> Result<(), SendError> {
        let inner = &self.inner;
        let result = loop {
            let path = match inner.route(peer, data.len()) {
                Ok(p) => p,
                Err(e) => break Err(e),
            };
            if path == PathAddr::Derp {
                // Wait for a place in the server's queue.
                let r = match inner.derp_for(peer) {
                    Ok(relay) => relay
                        .out
                        .send(ToRelay::Packet(*peer, derp_payload(data)))
                        .await
                        .map_err(|_| SendError::Closed),
                    Err(e) => Err(e),
                };
                if r.is_err() {
                    inner.unroute(peer, &path, data.len());
                }
                break r;
            }
            match inner.try_send_payload(peer, &path, data) {
                Err(SendError::QueueFull { path: kind }) => {
                    inner.unroute(peer, &path, data.len());
                    if let Err(e) = inner.socket.writable().await {
                        break Err(SendError::Io {
                            path: kind,
                            kind: e.kind(),
                        });
                    }
                }
                Err(e) => {
                    inner.unroute(peer, &path, data.len());
                    break Err(e);
                }
                Ok(()) => break Ok(()),
            }
        };
        if result.is_err() {
            inner.send_dropped.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Sends `data` to `peer` on its active path without waiting: a full
    /// queue is [`SendError::QueueFull`], and nothing is sent.
    pub fn try_send(&self, peer: &NodePublic, data: &[u8]) -> Result<(), SendError> {
        let inner = &self.inner;
        let result = inner.route(peer, data.len()).and_then(|path| {
            inner
                .try_send_payload(peer, &path, data)
                .inspect_err(|_| inner.unroute(peer, &path, data.len()))
        });
        if result.is_err() {
            inner.send_dropped.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Sends every datagram of `batch` to its peer on the peer's active
    /// path, as [`Endpoint::send`] would one by one (waiting for room), but
    /// with one lock of the path table and few system calls: the
    /// datagrams bound for the UDP socket leave in `sendmmsg` batches,
    /// runs of equal size to one address as UDP GSO trains. `batch` is
    /// left as it was (its header room now written), to be cleared and
    /// refilled.
    pub async fn send_batch(&self, batch: &mut Datagrams) -> SendReport {
        let mut report = self.route_batch(batch);
        let total = batch.udp.len();
        let mut done = 0;
        while done < total {
            done = self.udp_round(batch, &mut report, done);
            if done == total {
                break;
            }
            if let Err(e) = self.inner.socket.writable().await {
                tracing::debug!(error = %e, "UDP socket failed while waiting for room");
                report.io += total - done;
                self.udp_unsent(batch, done);
                break;
            }
        }
        for k in 0..batch.derp.len() {
            let i = batch.derp[k];
            let (peer, len) = batch.item(i);
            let r = match self.inner.derp_for(&peer) {
                Ok(relay) => {
                    let msg = batch.seal(i, 0);
                    let packet = ToRelay::Packet(peer, batch.bytes()[msg].to_vec());
                    relay.out.send(packet).await.map_err(|_| SendError::Closed)
                }
                Err(e) => Err(e),
            };
            self.derp_sent(&peer, len, r, &mut report);
        }
        self.batch_done(&report);
        report
    }

    /// [`Endpoint::send_batch`] without waiting: what finds its queue
    /// full is counted in [`SendReport::queue_full`] and not sent.
    pub fn try_send_batch(&self, batch: &mut Datagrams) -> SendReport {
        let mut report = self.route_batch(batch);
        let total = batch.udp.len();
        let done = if total > 0 {
            self.udp_round(batch, &mut report, 0)
        } else {
            0
        };
        report.queue_full += total - done;
        self.udp_unsent(batch, done);
        for k in 0..batch.derp.len() {
            let i = batch.derp[k];
            let (peer, len) = batch.item(i);
            let r = self.inner.derp_for(&peer).and_then(|relay| {
                let msg = batch.seal(i, 0);
                let packet = ToRelay::Packet(peer, batch.bytes()[msg].to_vec());
                relay.out.try_send(packet).map_err(|e| match e {
                    tokio::sync::mpsc::error::TrySendError::Full(_) => SendError::QueueFull {
                        path: PathKind::Derp,
                    },
                    tokio::sync::mpsc::error::TrySendError::Closed(_) => SendError::Closed,
                })
            });
            self.derp_sent(&peer, len, r, &mut report);
        }
        self.batch_done(&report);
        report
    }

    /// Picks every datagram's path under one lock of the path table: the
    /// UDP ones sealed into `batch.udp`, the DERP ones listed in
    /// `batch.derp`; the refused ones counted.
    fn route_batch(&self, batch: &mut Datagrams) -> SendReport {
        let mut report = SendReport::default();
        let mut udp = std::mem::take(&mut batch.udp);
        let mut index = std::mem::take(&mut batch.udp_index);
        let mut derp = std::mem::take(&mut batch.derp);
        udp.clear();
        index.clear();
        derp.clear();
        if self.inner.is_closed() {
            report.closed = batch.len();
        } else {
            let mut paths = self.inner.lock_paths();
            for i in 0..batch.len() {
                let (peer, len) = batch.item(i);
                match paths.on_send(&peer, len) {
                    Err(e) => report.count(&send_error(e)),
                    Ok(PathAddr::Derp) => derp.push(i),
                    Ok(path @ (PathAddr::Direct(addr) | PathAddr::RelaySession { addr, .. })) => {
                        udp.push((self.inner.wire_addr(addr), batch.seal(i, vni_of(&path))));
                        index.push((i, path));
                    }
                }
            }
        }
        batch.udp = udp;
        batch.udp_index = index;
        batch.derp = derp;
        report
    }

    /// Sends the batch's UDP datagrams from `from` on until the socket
    /// would block; returns the index of the first not dealt with. The
    /// ones the system refused are counted (though which ones is not
    /// known, to take them back from the path counters).
    fn udp_round(&self, batch: &Datagrams, report: &mut SendReport, from: usize) -> usize {
        let inner = &self.inner;
        let r = inner
            .lock_sender()
            .send(&inner.socket, batch.bytes(), &batch.udp[from..]);
        report.sent += r.sent;
        report.io += r.consumed - r.sent;
        inner
            .gso_fallbacks
            .fetch_add(r.fallbacks as u64, Ordering::Relaxed);
        from + r.consumed
    }

    /// The batch's UDP datagrams from `from` on did not go: taken back
    /// from the path counters.
    fn udp_unsent(&self, batch: &Datagrams, from: usize) {
        if from == batch.udp.len() {
            return;
        }
        let mut paths = self.inner.lock_paths();
        for (i, path) in &batch.udp_index[from..] {
            let (peer, len) = batch.item(*i);
            paths.unsend(&peer, path, len);
        }
    }

    /// Counts one DERP datagram of a batch.
    fn derp_sent(
        &self,
        peer: &NodePublic,
        len: usize,
        r: Result<(), SendError>,
        report: &mut SendReport,
    ) {
        match r {
            Ok(()) => report.sent += 1,
            Err(e) => {
                self.inner.unroute(peer, &PathAddr::Derp, len);
                report.count(&e);
            }
        }
    }

    fn batch_done(&self, report: &SendReport) {
        self.inner
            .send_dropped
            .fetch_add(report.failed() as u64, Ordering::Relaxed);
    }
}
