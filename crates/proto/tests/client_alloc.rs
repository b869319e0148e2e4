//! A connected `proto::client::Client` receives packets, pings and
//! keepalives, whole or split across reads, and answers the pings, without
//! allocating: the load generator's receive path relies on it. (One test in
//! this binary, so no other test's allocations are counted.)

use ferry_proto::client::{Client, Config, Event};
use ferry_proto::frame;
use ferry_proto::handshake::{seal_server_info, server_key_frame, ServerInfo};
use ferry_proto::http::switching_protocols;
use ferry_proto::key::NodePrivate;
use ferry_sys::alloc_count::{allocations, last_size, Counting};
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_receive_allocates_nothing() {
    let server = NodePrivate::generate();
    let key = NodePrivate::generate();
    let peer = NodePrivate::generate().public();
    let t0 = Instant::now();
    let mut client = Client::new(Config::new(key.clone(), "localhost"), t0, [7; 24]).unwrap();
    let mut hello = switching_protocols(&server.public());
    hello.extend_from_slice(&server_key_frame(&server.public()));
    hello.extend_from_slice(&seal_server_info(
        &server,
        &key.public(),
        &ServerInfo::current(),
        &[9; 24],
    ));
    client.handle_bytes(t0, &hello, |_| {}).unwrap();
    assert!(client.is_connected());

    let mut stream = Vec::new();
    for i in 0..64u32 {
        frame::put_recv_packet(&mut stream, &peer, &vec![i as u8; 1200 + i as usize]);
        if i % 8 == 0 {
            frame::put_ping(&mut stream, &[i as u8; 8]);
            frame::put_keepalive(&mut stream);
        }
    }
    let mut out = Vec::with_capacity(4096);
    // Reads of a size that splits frames everywhere, whole frames too.
    let run = |client: &mut Client, out: &mut Vec<u8>, round: u64| {
        let now = t0 + Duration::from_millis(round);
        let mut packets = 0;
        for chunk in stream.chunks(1000 + 7 * round as usize % 3000) {
            client
                .handle_bytes(now, chunk, |e| {
                    if let Event::Packet { packet, .. } = e {
                        packets += packet.len();
                    }
                })
                .unwrap();
            out.clear();
            client.poll_transmit(out);
        }
        packets
    };
    // Warm up: buffers reach their working size.
    let want = run(&mut client, &mut out, 0);
    run(&mut client, &mut out, 1);

    let before = allocations();
    for round in 2..50 {
        assert_eq!(run(&mut client, &mut out, round), want);
    }
    let allocated = allocations() - before;
    assert_eq!(
        allocated,
        0,
        "{allocated} allocations while receiving (last one {} bytes)",
        last_size()
    );
}
