//! `/healthz` for the DERP server: answered on the DERP listener (and its
//! port-80 companion) by [`crate::front`] and on the `--metrics-addr`
//! listener by the server's metrics thread. The JSON rendering is shared
//! with `ferry udp-relay` ([`ferry_proto::health`]).

pub use ferry_proto::health::Health;
