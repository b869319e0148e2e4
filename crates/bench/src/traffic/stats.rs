//! What a run measures: counters per kind of traffic, the stretches
//! without packets at the receivers, and the outcome the workers' figures
//! merge into.

use super::Timeline;
use crate::histogram::Histogram;

/// Counters for one kind of traffic, summed over workers.
#[derive(Debug, Default, Clone)]
pub struct FlowStats {
    /// Packets stamped inside the window.
    pub sent_window: u64,
    /// Payload bytes stamped inside the window.
    pub sent_bytes_window: u64,
    /// Packets the schedule skipped inside the window because the
    /// connection was blocked (paced flows only).
    pub skipped_window: u64,
    /// Packets sent over the whole run.
    pub sent_total: u64,
    /// Packets stamped inside the window that arrived (for pings: whose
    /// pong came back).
    pub delivered_of_window: u64,
    /// Packets that arrived inside the window (by arrival time).
    pub arrived_in_window: u64,
    /// Payload bytes that arrived inside the window.
    pub arrived_bytes_in_window: u64,
    /// Packets received over the whole run.
    pub received_total: u64,
    /// One-way latency (data) or round-trip time (pings) of the window's
    /// packets, nanoseconds.
    pub latency: Histogram,
}

impl FlowStats {
    pub(super) fn merge(&mut self, o: &FlowStats) {
        self.sent_window += o.sent_window;
        self.sent_bytes_window += o.sent_bytes_window;
        self.skipped_window += o.skipped_window;
        self.sent_total += o.sent_total;
        self.delivered_of_window += o.delivered_of_window;
        self.arrived_in_window += o.arrived_in_window;
        self.arrived_bytes_in_window += o.arrived_bytes_in_window;
        self.received_total += o.received_total;
        self.latency.merge(&o.latency);
    }
}

/// Which counters a flow's packets go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// Data between healthy peers.
    Data,
    /// Pings and their pongs.
    Ping,
    /// Data to a stuck receiver.
    Stuck,
}

/// The counters of each [`Class`].
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) data: FlowStats,
    pub(super) ping: FlowStats,
    pub(super) stuck: FlowStats,
}

impl Tally {
    pub(super) fn of(&mut self, class: Class) -> &mut FlowStats {
        match class {
            Class::Data => &mut self.data,
            Class::Ping => &mut self.ping,
            Class::Stuck => &mut self.stuck,
        }
    }
}

/// The stretches without packets that a worker's receivers saw inside the
/// window, per flow: from the window's start (or the flow's last packet) to
/// its next packet, and from its last packet to the window's end.
#[derive(Debug)]
pub struct Gaps {
    /// When each flow's last packet arrived (run clock; 0 before the first).
    last: Vec<u64>,
    /// Every stretch, nanoseconds; packets read together count as 0.
    pub(super) stretches: Histogram,
}

impl Gaps {
    /// Tracks flows `0..flows`.
    pub fn new(flows: usize) -> Self {
        Gaps {
            last: vec![0; flows],
            stretches: Histogram::new(),
        }
    }

    /// A packet of `flow` arrived at `t`: records the stretch since the
    /// flow's last packet, as far as it lies inside the window.
    #[inline]
    pub fn arrival(&mut self, flow: usize, t: u64, tl: &Timeline) {
        let Some(last) = self.last.get_mut(flow) else {
            return;
        };
        if *last < tl.we && t >= tl.ws {
            self.stretches.record(tl.overlap(*last, t));
        }
        *last = t;
    }

    /// Ends the window for `flows`: each one that had no packet since the
    /// window's end gets the stretch from its last packet to that end.
    pub fn close(&mut self, flows: impl IntoIterator<Item = usize>, tl: &Timeline) {
        for flow in flows {
            if self.last.get(flow).is_some_and(|&l| l < tl.we) {
                self.arrival(flow, tl.we, tl);
            }
        }
    }

    /// All stretches recorded, nanoseconds; the maximum is the longest a
    /// receiver went without a packet.
    pub fn stretches(&self) -> &Histogram {
        &self.stretches
    }
}

/// Everything a run measured.
#[derive(Debug, Default)]
pub struct TrafficOutcome {
    /// Data flows between healthy peers.
    pub data: FlowStats,
    /// Ping flows (round trips).
    pub ping: FlowStats,
    /// Data flows to stuck receivers (delivered: read after the window).
    pub stuck: FlowStats,
    /// Stretches without packets at the healthy data receivers, within the
    /// window, nanoseconds (see [`Gaps`]).
    pub gaps: Histogram,
    /// Stuck receivers the server had closed by the end of the run.
    pub stuck_cut_off: u64,
    /// Pings echoed by receivers.
    pub echoed: u64,
    /// Per data flow: packets of the window delivered.
    pub per_flow_delivered: Vec<u64>,
    /// Window length, seconds.
    pub window_s: f64,
    /// Frames other than recvPacket (keepalives, peerGone, …).
    pub other_frames: u64,
    /// recvPacket frames that were not ours.
    pub foreign_packets: u64,
    /// Healthy connections lost after the handshake.
    pub disconnects: u64,
    /// First disconnect error, if any.
    pub first_disconnect: Option<String>,
    /// Negotiated TLS version and suite.
    pub tls: Option<(String, String)>,
    /// Time for all peers to connect, seconds.
    pub connect_s: f64,
    /// Seconds the workers spent working (not waiting for, or spinning on,
    /// an empty poll) during the window, summed over threads.
    pub work_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window from 1000 to 2000 ns.
    fn timeline() -> Timeline {
        Timeline {
            start: 0,
            ws: 1000,
            we: 2000,
            end: 3000,
        }
    }

    fn recorded(g: &Gaps) -> (u64, u64, u64) {
        let h = g.stretches();
        (
            h.count(),
            h.quantile(0.0).unwrap_or(0),
            h.quantile(1.0).unwrap_or(0),
        )
    }

    #[test]
    fn gaps_are_the_stretches_without_packets_inside_the_window() {
        let tl = timeline();
        let mut g = Gaps::new(3);
        // Flow 0: a packet in the warm-up counts nothing; inside the window
        // the stretches run from the window's start, then packet to packet,
        // then to the window's end.
        g.arrival(0, 500, &tl);
        assert_eq!(recorded(&g).0, 0);
        g.arrival(0, 1100, &tl); // 100, from the window's start
        g.arrival(0, 1100, &tl); // 0, read together
        g.arrival(0, 1900, &tl); // 800
                                 // Flow 2: its stall runs past the window's end; the packet after
                                 // the window closes it at the end.
        g.arrival(2, 1500, &tl); // 500
        g.arrival(2, 2500, &tl); // 500, cut at the end
        g.arrival(2, 2600, &tl); // nothing: wholly after the window
        assert_eq!(recorded(&g), (5, 0, 800));
        // Closing adds flow 0's last stretch and flow 1's whole window;
        // flow 2 is already closed.
        g.close([0, 1, 2], &tl);
        assert_eq!(recorded(&g), (7, 0, 1000));
        let h = g.stretches();
        let mean = h.percentiles().mean * 1e3;
        // 100 + 0 + 800 + 500 + 500, then 100 and 1000.
        assert!((mean - 3000.0 / 7.0).abs() < 1e-6, "{mean}");
    }

    #[test]
    fn gaps_ignore_flows_they_do_not_track() {
        let tl = timeline();
        let mut g = Gaps::new(1);
        g.arrival(7, 1500, &tl);
        g.close([7], &tl);
        assert_eq!(recorded(&g).0, 0);
    }
}
