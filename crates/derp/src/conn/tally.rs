//! A connection's own traffic counts, shown on `/debug/clients/`.

/// Data packets (and their payload bytes) a client sent to be relayed
/// and that were queued to it, as derper counts them per client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Packets received from the client (sendPacket, forwardPacket).
    pub rx_pkts: u64,
    /// Their payload bytes.
    pub rx_bytes: u64,
    /// Packets queued to the client (recvPacket).
    pub tx_pkts: u64,
    /// Their payload bytes.
    pub tx_bytes: u64,
}

impl Tally {
    /// One packet of `len` bytes received from the client.
    #[inline]
    pub fn received(&mut self, len: usize) {
        self.rx_pkts += 1;
        self.rx_bytes += len as u64;
    }

    /// One packet of `len` bytes queued to the client.
    #[inline]
    pub fn queued(&mut self, len: usize) {
        self.tx_pkts += 1;
        self.tx_bytes += len as u64;
    }
}
