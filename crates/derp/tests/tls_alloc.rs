//! What the userspace-TLS packet path allocates, on each record layer:
//! on Ferry's own (the default), which opens records in the read buffer
//! and seals them in place, nothing per record or packet; on rustls's
//! (`--tls-records rustls`, TLS 1.2, sessions kept out of the kernel), one
//! buffer per TLS record, nothing per packet.
//!
//! Its own test binary with a counting global allocator and a single test,
//! so nothing else runs in the process while it counts: each layer on each
//! back end in turn. The relay serves TLS (kernel TLS off), and the test
//! checks that every session is on the layer it measures. The clients
//! allocate nothing while the relay
//! is counted: each sender's bursts are encrypted before they start (all
//! of a burst's frames written to rustls at once, so it cuts them into
//! full 16 KiB records) and written to the socket as raw bytes; each
//! receiver reads raw ciphertext into a buffer sized beforehand and counts
//! the records by their headers. Only after counting are the receivers'
//! bytes decrypted and checked: every frame, exact, in order.
//!
//! Two warm-up bursts let queues, send buffers and the record layer's own
//! buffers reach their working size; then one burst is counted.
//!
//! Ferry's layer may allocate only where a buffer grows past its earlier
//! high-water mark (a queue deeper than before, a longer unread tail), as
//! on plain TCP (`alloc.rs`): at most [`GROWTHS_PER_CONNECTION`] per
//! connection, which one allocation per record (about 940 records here),
//! let alone per packet (32,000), exceeds many times over.
//!
//! rustls's buffered
//! API, as the relay drives it, allocates one buffer per record it
//! decrypts (the plaintext it hands over) and one per record it encrypts
//! (the record itself). Besides, its input buffer shrinks back to 4 KiB
//! whenever a read leaves it empty, which can only happen at the end of
//! an input record, and grows back in at most three steps (a shrink and
//! three reallocations). Each sender's writes end inside a record (the
//! last byte of a burst is held back for the next write), so that happens
//! only where a read of the relay's ends on a record boundary by chance.
//! So the relay may allocate at most `records out + 5 × records in`, both
//! counted here, and nothing else; any buffer of the relay's own growing
//! past an earlier high-water mark counts against the same budget. With
//! small packets (about seventy to a 16 KiB record) one allocation per
//! packet would exceed that several times over.

mod support;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ferry_derp::config::TlsRecords;
use ferry_proto::frame;
use ferry_proto::key::NodePublic;

#[global_allocator]
static GLOBAL: ferry_sys::alloc_count::Counting = ferry_sys::alloc_count::Counting;

const PAIRS: usize = 4;
/// What Ferry's record layer may allocate per connection: each connection
/// has three buffers that can grow (the frame reader's held input, the
/// data queue, the send buffer), plus the shard's shared plaintext buffer.
const GROWTHS_PER_CONNECTION: usize = 4;
const PACKETS: usize = 8000;
const SIZE: usize = 200;
/// Two warm-ups, then the measured burst.
const BURSTS: usize = 3;
/// A TLS 1.3 record's header; inside the record, after the plaintext, its
/// real content type (1 byte) and the AEAD tag (16 bytes).
const HEADER: usize = 5;
const INNER_OVERHEAD: usize = 17;
/// What a receiver gets per burst: PACKETS recvPacket frames.
const PLAIN_PER_BURST: usize = PACKETS * (frame::HEADER_LEN + frame::KEY_LEN + SIZE);

/// Complete TLS records in `bytes` from `at`: (records, plaintext bytes
/// they carry, where the first incomplete one starts). Allocation-free.
fn records(bytes: &[u8], mut at: usize) -> (usize, usize, usize) {
    let (mut n, mut plain) = (0, 0);
    while at + HEADER <= bytes.len() {
        let len = usize::from(u16::from_be_bytes([bytes[at + 3], bytes[at + 4]]));
        if at + HEADER + len > bytes.len() {
            break;
        }
        assert_eq!(bytes[at], 0x17, "a TLS 1.3 application-data record");
        n += 1;
        plain += len - INNER_OVERHEAD;
        at += HEADER + len;
    }
    (n, plain, at)
}

/// One receiver: its TLS session (used only after the bursts) and the
/// ciphertext read so far.
struct Receiver {
    sock: TcpStream,
    tls: rustls::ClientConnection,
    buf: Vec<u8>,
    len: usize,
    parsed: usize,
    plain: usize,
    records: usize,
}

impl Receiver {
    /// Reads until `plain` bytes of frames in all have arrived.
    /// Allocation-free.
    fn read_through(&mut self, plain: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.plain < plain {
            assert!(Instant::now() < deadline, "burst did not arrive");
            assert!(self.len < self.buf.len(), "more ciphertext than expected");
            let n = self.sock.read(&mut self.buf[self.len..]).expect("receive");
            assert!(n > 0, "relay closed a receiver");
            self.len += n;
            let (records, plain, at) = records(&self.buf[..self.len], self.parsed);
            self.records += records;
            self.plain += plain;
            self.parsed = at;
        }
    }

    /// Decrypts everything read: the plaintext.
    fn decrypt(&mut self) -> Vec<u8> {
        let mut rest = &self.buf[..self.len];
        let mut plain = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        while !rest.is_empty() {
            self.tls.read_tls(&mut rest).expect("buffer TLS");
            self.tls.process_new_packets().expect("decrypt");
            loop {
                match self.tls.reader().read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => plain.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("reading plaintext: {e}"),
                }
            }
        }
        plain
    }
}

#[test]
fn tls_forwarding_allocates_per_connection_on_ferrys_records_and_per_record_on_rustls() {
    // One layer and back end after the other: the count is the process's.
    ferry_testkit::on_each_backend!(|| measure(TlsRecords::Ferry));
    ferry_testkit::on_each_backend!(|| measure(TlsRecords::Rustls));
}

fn measure(layer: TlsRecords) {
    // One shard: what is measured is the record layer. Across shards, a
    // full ring pauses the sender's input, and on a busy machine the bytes
    // read meanwhile are stashed, one allocation per such pause (counted
    // per burst, not per packet, but dependent on scheduling alone).
    let (server, addr) = support::start(1, |cfg| {
        cfg.tls = Some(support::self_signed_tls(cfg).config);
        cfg.tls_records = layer;
        // Large enough that these bursts never trip backpressure.
        cfg.send_queue_bytes = 64 << 20;
        cfg.keepalive = Duration::from_secs(3600);
    });
    // Each sender's bursts, encrypted now, as the writes that carry them.
    let mut senders: Vec<(TcpStream, Vec<Vec<u8>>, NodePublic)> = Vec::new();
    let mut receivers = Vec::new();
    let mut records_in = 0;
    for _ in 0..PAIRS {
        let s = support::connect_tls(addr);
        let r = support::connect_tls(addr);
        let mut plain = Vec::new();
        for _ in 0..PACKETS {
            frame::put_send_packet(&mut plain, &r.public, &[0x5a; SIZE]);
        }
        let (mut tls, sock) = (s.stream.conn, s.stream.sock);
        tls.set_buffer_limit(None);
        let encrypted: Vec<Vec<u8>> = (0..BURSTS)
            .map(|_| {
                tls.writer().write_all(&plain).unwrap();
                let mut out = Vec::new();
                while tls.wants_write() {
                    tls.write_tls(&mut out).unwrap();
                }
                out
            })
            .collect();
        let (n, p, end) = records(&encrypted[BURSTS - 1], 0);
        assert_eq!((p, end), (plain.len(), encrypted[BURSTS - 1].len()));
        records_in += n;
        // Each write holds back the last byte of its burst, sent first in
        // the next write (the last one after counting): rustls's input
        // buffer is never left empty at the end of a burst, which would
        // make it shrink to 4 KiB and grow back (once per burst, not per
        // packet or record, but an allocation all the same). The measured
        // write thus completes the previous burst's last record and all
        // of its own but the last: as many records as a burst.
        let mut writes: Vec<Vec<u8>> = Vec::new();
        let mut held: Vec<u8> = Vec::new();
        for e in &encrypted {
            let (body, last) = e.split_at(e.len() - 1);
            writes.push([&held[..], body].concat());
            held = last.to_vec();
        }
        writes.push(held);
        senders.push((sock, writes, s.public));
        receivers.push(Receiver {
            sock: r.stream.sock,
            tls: r.stream.conn,
            // Room for every burst with one record per frame, the most
            // records (so overhead) the relay could make of it.
            buf: vec![0; BURSTS * (PLAIN_PER_BURST + PACKETS * (HEADER + INNER_OVERHEAD))],
            len: 0,
            parsed: 0,
            plain: 0,
            records: 0,
        });
    }
    for r in &receivers {
        r.sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
    }
    // Frames that reach the receivers per write: all of a burst's but
    // those in its last record, which the held-back byte completes.
    let last_record_plain = {
        let e = &senders[0].1[0];
        let mut at = 0;
        let mut last = 0;
        while at + HEADER <= e.len() {
            last = usize::from(u16::from_be_bytes([e[at + 3], e[at + 4]]));
            at += HEADER + last;
        }
        last - INNER_OVERHEAD
    };
    let frame_len = frame::HEADER_LEN + frame::KEY_LEN + SIZE;
    let whole = (PLAIN_PER_BURST - last_record_plain) / frame_len;
    // Delivered plaintext once write `k` (0-based) has arrived.
    let through = |k: usize| (k * PACKETS + whole.min(PACKETS)) * frame_len;
    // Senders are spawned once and released per burst by a barrier (futex
    // based, allocation-free), so the harness allocates nothing while the
    // relay is being counted.
    let go = std::sync::Barrier::new(PAIRS + 1);
    let mut records_out = 0;
    let (allocs, sizes) = std::thread::scope(|scope| {
        for (sock, writes, _) in senders.iter_mut() {
            let go = &go;
            scope.spawn(move || {
                for w in writes.iter() {
                    go.wait();
                    sock.write_all(w).expect("send");
                }
            });
        }
        for k in 0..BURSTS - 1 {
            go.wait();
            for r in receivers.iter_mut() {
                r.read_through(through(k)); // warm-up
            }
        }
        let before: usize = receivers.iter().map(|r| r.records).sum();
        ferry_sys::alloc_count::start_recording();
        go.wait();
        for r in receivers.iter_mut() {
            r.read_through(through(BURSTS - 1));
        }
        let counted = ferry_sys::alloc_count::stop_recording();
        records_out = receivers.iter().map(|r| r.records).sum::<usize>() - before;
        // The held-back byte of the last burst.
        go.wait();
        for r in receivers.iter_mut() {
            r.read_through(BURSTS * PLAIN_PER_BURST);
        }
        counted
    });

    for (r, (_, _, src)) in receivers.iter_mut().zip(&senders) {
        let mut want = Vec::new();
        frame::put_recv_packet(&mut want, src, &[0x5a; SIZE]);
        let got = r.decrypt();
        assert_eq!(got.len(), BURSTS * PLAIN_PER_BURST, "only whole frames");
        assert!(
            got.chunks(want.len()).all(|f| f == want),
            "every frame arrives exact"
        );
    }
    let relayed = support::metric_in(&server.metrics().render(), "derp_packets_sent");
    assert_eq!(relayed, (BURSTS * PAIRS * PACKETS) as f64);
    let layer_name = match layer {
        TlsRecords::Ferry => "ferry_records",
        TlsRecords::Rustls => "rustls",
    };
    assert_eq!(
        support::on_transport(&server, layer_name),
        (2 * PAIRS) as f64,
        "every session on the layer measured"
    );
    let bound = match layer {
        TlsRecords::Ferry => GROWTHS_PER_CONNECTION * 2 * PAIRS,
        TlsRecords::Rustls => records_out + 5 * records_in,
    };
    println!(
        "{layer_name} on {:?}: {} packets in {records_in} records, out in {records_out}: \
         {allocs} allocations (bound {bound}; sizes of the first: {sizes:?})",
        support::io_mode(),
        PAIRS * PACKETS,
    );
    assert!(
        records_in + records_out < PAIRS * PACKETS / 4,
        "records carry many packets each, or the bound proves nothing"
    );
    assert!(
        allocs <= bound as u64,
        "the relay allocated {allocs} times forwarding {} packets over TLS on {layer_name}, \
         which came in {records_in} records and went out in {records_out}: more than {bound} \
         (sizes of the first: {sizes:?})",
        PAIRS * PACKETS
    );
    support::stop(server);
}
