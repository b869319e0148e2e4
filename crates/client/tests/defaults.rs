//! The SDK's defaults that the README states, so that changing one fails
//! here until the README says the new value (how each is applied is
//! tested where it acts: the backoff schedule in `backoff.rs`, the path
//! schedule in `paths_tests.rs`, the session retries in `sessions.rs`).

use std::time::Duration;

use ferry_client::{BackoffOptions, EndpointOptions, Options};
use ferry_proto::key::NodePrivate;

#[test]
fn reconnects_back_off_from_100_ms_to_10_s_and_connections_die_after_120_s_of_silence() {
    let o = Options::default();
    let BackoffOptions {
        initial, max, seed, ..
    } = o.backoff;
    assert_eq!(
        (initial, max, seed),
        (Duration::from_millis(100), Duration::from_secs(10), None)
    );
    assert_eq!(o.keepalive_timeout, Duration::from_secs(120));
}

#[test]
fn the_endpoint_asks_for_4_mib_socket_buffers() {
    let o = EndpointOptions::new(NodePrivate::generate(), Vec::new());
    assert_eq!(o.socket_buffer, 4 << 20);
}

#[test]
fn paths_are_probed_every_500_ms_dead_after_1_5_s_and_discovered_every_2_s() {
    let t = EndpointOptions::new(NodePrivate::generate(), Vec::new()).timing;
    assert_eq!(
        (t.probe_interval, t.dead_after, t.discover_interval),
        (
            Duration::from_millis(500),
            Duration::from_millis(1500),
            Duration::from_secs(2)
        )
    );
}

#[test]
fn relay_sessions_are_asked_for_again_after_10_s_doubling_to_about_5_minutes() {
    let t = EndpointOptions::new(NodePrivate::generate(), Vec::new()).session_timing;
    assert_eq!(
        (t.retry, t.retry_max),
        (Duration::from_secs(10), Duration::from_secs(320))
    );
}
