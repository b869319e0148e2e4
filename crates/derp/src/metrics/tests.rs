use super::*;

#[test]
fn shards_are_summed_and_labels_preinitialised() {
    let m = Metrics::new(2, "epoll", "test".into());
    m.shards[0].packets_received.add(3);
    m.shards[1].packets_received.add(4);
    m.shards[1].packets_dropped[DropReason::QueueTail as usize][PacketKind::Other as usize].inc();
    let text = m.render();
    assert!(text.contains("\nderp_packets_received 7\n"), "{text}");
    assert!(text.contains("derp_packets_dropped{kind=\"other\",reason=\"queue_tail\"} 1"));
    assert!(text.contains("derp_packets_dropped{kind=\"disco\",reason=\"unknown_dest\"} 0"));
    assert!(text.contains("ferry_shard_packets_received_total{shard=\"1\"} 4"));
}

#[test]
fn gauges_may_move_between_shards() {
    let m = Metrics::new(2, "epoll", String::new());
    m.shards[0].current_connections.add(1);
    m.shards[1].current_connections.add(-1);
    m.shards[1].current_connections.add(2);
    assert!(m.render().contains("\nderp_current_connections 2\n"));
}

#[test]
fn the_page_is_sound_and_declares_each_family_once() {
    use ferry_engine::stat::exposition::check;
    let m = Metrics::new(3, "epoll", "a \"quoted\" \\ reason\nover two lines".into());
    m.add_source(Box::new(|w| {
        write_counter(w, "t_source_total", "A part's own counter.", 1)
    }));
    let text = m.render();
    assert_eq!(check(&text), Vec::<String>::new(), "{text}");
    assert!(
        text.contains(
            "\nferry_io_backend{backend=\"epoll\",reason=\"a \\\"quoted\\\" \\\\ reason\\nover two lines\"} 1\n"
        ),
        "{text}"
    );
    assert!(text.ends_with("t_source_total 1\n"), "{text}");
}
