//! A tailnet node's control channel, without I/O.
//!
//! A node talks to its control server (a coordination server such as
//! Headscale) over the "ts2021" channel:
//!
//! 1. `GET /key?v=<capver>` names the server's machine key (plain JSON,
//!    outside this module).
//! 2. [`upgrade`]: `POST /ts2021` with the Noise initiation in a header,
//!    answered by `101`.
//! 3. [`noise`]: the Noise IK handshake's response, then records both ways.
//! 4. [`early`]: the server's optional early payload, before HTTP/2.
//! 5. HTTP/2 with prior knowledge inside the records (not here: the driver
//!    uses an HTTP/2 client), carrying [`tailcfg`] JSON: register, then a
//!    streaming map poll whose body [`map_frame`] splits.
//!
//! [`filter`] answers whether a peer holds a capability on this node from
//! the packet filter's capability grants.

pub mod early;
pub mod filter;
pub mod map_frame;
pub mod noise;
pub mod tailcfg;
pub mod upgrade;

/// The capability version Ferry claims. At least 121 (peer-relay
/// allocation over disco) and inside the window the pinned Headscale
/// accepts (its minimum is 113).
pub const CAPABILITY_VERSION: u16 = 130;

#[cfg(test)]
mod tests {
    #[test]
    fn capability_version_is_in_headscales_window() {
        const HEADSCALE_MIN: u16 = 113;
        const PEER_RELAY_MIN: u16 = 121;
        let v = super::CAPABILITY_VERSION;
        assert!(v >= HEADSCALE_MIN, "Headscale refuses {v}");
        assert!(v >= PEER_RELAY_MIN, "{v} predates peer relays");
    }
}
