//! One set of conformance tests for every I/O back end.
//!
//! Each case is a function generic over [`Driver`] that takes a constructor;
//! the `conformance!` macro at the bottom instantiates every case once per
//! back end: epoll, io_uring with its default sizes, io_uring with a tiny
//! buffer ring (two 4 KiB buffers growing to eight) so that buffer
//! exhaustion (`ENOBUFS`), re-arming and growth happen all the time, and
//! io_uring without `DEFER_TASKRUN` (the set-up older kernels get), where
//! completions can appear at any system call — which also drives
//! [`Driver::detach`] through its "bytes arrived, not now" path.
//!
//! The io_uring variants run when io_uring works here. When it does not,
//! they skip with the reason (`ferry_testkit::skip!`), which fails them
//! under `CI=true`.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ferry_engine::uring::{UringDriver, UringOptions};
use ferry_engine::{Completion, Driver, EpollDriver, Slot};

type Make<D> = fn() -> io::Result<D>;

/// A completion, owned.
#[derive(Debug)]
enum Ev {
    Accepted(usize, TcpStream),
    Recv(Slot, Vec<u8>),
    Closed(Slot, Option<io::ErrorKind>),
    Sent(Slot, Vec<u8>, Result<(), io::ErrorKind>),
    Woken,
}

fn turn<D: Driver>(d: &mut D, timeout: Option<Duration>) -> Vec<Ev> {
    let mut out = Vec::new();
    d.turn(timeout, &mut |c| {
        out.push(match c {
            Completion::Accepted {
                listener, stream, ..
            } => Ev::Accepted(listener, stream),
            Completion::Received { slot, data } => {
                assert!(!data.is_empty(), "empty Received on slot {slot}");
                Ev::Recv(slot, data.to_vec())
            }
            Completion::RecvClosed { slot, error } => Ev::Closed(slot, error.map(|e| e.kind())),
            Completion::Sent { slot, buf, result } => {
                Ev::Sent(slot, buf, result.map_err(|e| e.kind()))
            }
            Completion::Record {
                slot, record_type, ..
            } => {
                panic!("TLS record {record_type} on slot {slot} without kernel TLS")
            }
            Completion::Woken => Ev::Woken,
        })
    })
    .expect("turn");
    out
}

/// Turns until `done` says so (checked after every turn) or `limit` passes;
/// returns every event seen.
fn pump<D: Driver>(d: &mut D, limit: Duration, mut done: impl FnMut(&[Ev]) -> bool) -> Vec<Ev> {
    let start = Instant::now();
    let mut all = Vec::new();
    while start.elapsed() < limit {
        all.extend(turn(d, Some(Duration::from_millis(20))));
        if done(&all) {
            return all;
        }
    }
    panic!(
        "condition not reached within {limit:?}; events: {}",
        summary(&all)
    );
}

/// Turns for `dur`; returns every event seen.
fn run_for<D: Driver>(d: &mut D, dur: Duration) -> Vec<Ev> {
    let start = Instant::now();
    let mut all = Vec::new();
    while start.elapsed() < dur {
        all.extend(turn(d, Some(Duration::from_millis(10))));
    }
    all
}

fn summary(evs: &[Ev]) -> String {
    let parts: Vec<String> = evs
        .iter()
        .map(|e| match e {
            Ev::Accepted(l, _) => format!("accepted {l}"),
            Ev::Recv(s, d) => format!("recv {s} {}B", d.len()),
            Ev::Closed(s, e) => format!("closed {s} {e:?}"),
            Ev::Sent(s, _, r) => format!("sent {s} {r:?}"),
            Ev::Woken => "woken".into(),
        })
        .collect();
    parts.join(", ")
}

/// Bytes received per slot, in order.
fn received(evs: &[Ev]) -> HashMap<Slot, Vec<u8>> {
    let mut m: HashMap<Slot, Vec<u8>> = HashMap::new();
    for e in evs {
        if let Ev::Recv(s, d) = e {
            m.entry(*s).or_default().extend_from_slice(d);
        }
    }
    m
}

fn bytes_for(evs: &[Ev], slot: Slot) -> Vec<u8> {
    received(evs).remove(&slot).unwrap_or_default()
}

fn closed(evs: &[Ev], slot: Slot) -> Vec<Option<io::ErrorKind>> {
    evs.iter()
        .filter_map(|e| match e {
            Ev::Closed(s, k) if *s == slot => Some(*k),
            _ => None,
        })
        .collect()
}

fn sent(evs: &[Ev], slot: Slot) -> Vec<&Result<(), io::ErrorKind>> {
    evs.iter()
        .filter_map(|e| match e {
            Ev::Sent(s, _, r) if *s == slot => Some(r),
            _ => None,
        })
        .collect()
}

/// A non-blocking listener, as the relay hands them over.
fn listener() -> TcpListener {
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
    l.set_nonblocking(true).unwrap();
    l
}

/// A connected (client, server) pair on loopback; the server side is
/// non-blocking, as accepted sockets are.
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (server, _) = l.accept().unwrap();
    server.set_nonblocking(true).unwrap();
    (client, server)
}

/// `n` bytes of a pattern that shows reordering, loss and duplication.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8 ^ seed)
        .collect()
}

/// Writes `data` in chunks of `chunk` bytes on a thread, then closes the
/// write side.
fn write_in_background(
    mut c: TcpStream,
    data: Vec<u8>,
    chunk: usize,
) -> std::thread::JoinHandle<TcpStream> {
    std::thread::spawn(move || {
        for piece in data.chunks(chunk) {
            c.write_all(piece).unwrap();
        }
        c.shutdown(Shutdown::Write).unwrap();
        c
    })
}

const LONG: Duration = Duration::from_secs(20);

// ----- cases -----

fn accept_receive_send_close<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let l = listener();
    let addr = l.local_addr().unwrap();
    assert_eq!(d.add_listener(l).unwrap(), 0);
    let mut client = TcpStream::connect(addr).unwrap();
    let evs = pump(&mut d, LONG, |e| {
        e.iter().any(|e| matches!(e, Ev::Accepted(..)))
    });
    let stream = evs
        .into_iter()
        .find_map(|e| match e {
            Ev::Accepted(0, s) => Some(s),
            _ => None,
        })
        .expect("accepted on listener 0");
    assert_eq!(stream.peer_addr().unwrap(), client.local_addr().unwrap());
    d.attach(3, stream).unwrap();

    client.write_all(b"hello").unwrap();
    let evs = pump(&mut d, LONG, |e| bytes_for(e, 3).len() >= 5);
    assert_eq!(bytes_for(&evs, 3), b"hello");

    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(b"world");
    d.send(3, buf);
    let evs = pump(&mut d, LONG, |e| !sent(e, 3).is_empty());
    assert_eq!(sent(&evs, 3), [&Ok(())]);
    let returned = evs
        .iter()
        .find_map(|e| match e {
            Ev::Sent(3, b, _) => Some(b),
            _ => None,
        })
        .unwrap();
    assert!(
        returned.is_empty() && returned.capacity() >= 64,
        "buffer comes back cleared, capacity kept"
    );
    let mut got = [0u8; 5];
    client.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"world");

    drop(client);
    let evs = pump(&mut d, LONG, |e| !closed(e, 3).is_empty());
    assert_eq!(closed(&evs, 3), [None], "{}", summary(&evs));
    // The end is reported once.
    let evs = run_for(&mut d, Duration::from_millis(200));
    assert!(closed(&evs, 3).is_empty(), "{}", summary(&evs));
}

fn stream_arrives_whole_and_in_order<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (client, server) = pair();
    d.attach(0, server).unwrap();
    let data = pattern(4 << 20, 1);
    let writer = write_in_background(client, data.clone(), 7000);
    let evs = pump(&mut d, LONG, |e| !closed(e, 0).is_empty());
    assert_eq!(closed(&evs, 0), [None]);
    let got = bytes_for(&evs, 0);
    assert_eq!(got.len(), data.len());
    assert!(got == data, "bytes reordered or corrupted");
    writer.join().unwrap();
}

fn paused_socket_is_not_read_until_resumed<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (mut client, server) = pair();
    d.attach(0, server).unwrap();
    d.set_recv(0, false);
    client.write_all(b"queued").unwrap();
    let evs = run_for(&mut d, Duration::from_millis(200));
    assert!(
        evs.iter().all(|e| !matches!(e, Ev::Recv(..))),
        "{}",
        summary(&evs)
    );
    d.set_recv(0, true);
    d.set_recv(0, true); // resuming twice is harmless
    let evs = pump(&mut d, LONG, |e| bytes_for(e, 0).len() >= 6);
    assert_eq!(bytes_for(&evs, 0), b"queued");
}

/// Pausing and resuming on every turn while a sender streams: every byte
/// arrives exactly once and in order; nothing is reported closed until the
/// sender is done.
fn pause_and_resume_lose_nothing<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (client, server) = pair();
    d.attach(0, server).unwrap();
    let data = pattern(2 << 20, 2);
    let writer = write_in_background(client, data.clone(), 1500);
    let start = Instant::now();
    let mut all = Vec::new();
    let mut on = true;
    while closed(&all, 0).is_empty() {
        assert!(
            start.elapsed() < LONG,
            "stalled after {} bytes",
            bytes_for(&all, 0).len()
        );
        on = !on;
        d.set_recv(0, on);
        all.extend(turn(&mut d, Some(Duration::from_millis(5))));
        if !on {
            // A turn or two while paused; bytes may still trickle in from
            // before the pause took effect, but the end of stream must not
            // be reported while paused.
            let evs = turn(&mut d, Some(Duration::from_millis(1)));
            assert!(closed(&evs, 0).is_empty(), "end reported while paused");
            all.extend(evs);
        }
    }
    assert_eq!(closed(&all, 0), [None]);
    let got = bytes_for(&all, 0);
    assert_eq!(got.len(), data.len());
    assert!(got == data, "bytes reordered or duplicated");
    writer.join().unwrap();
}

fn end_of_stream_while_paused_waits_for_resume<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (mut client, server) = pair();
    d.attach(0, server).unwrap();
    d.set_recv(0, false);
    client.write_all(b"bye").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let evs = run_for(&mut d, Duration::from_millis(200));
    assert!(closed(&evs, 0).is_empty(), "{}", summary(&evs));
    d.set_recv(0, true);
    let mut all = evs;
    all.extend(pump(&mut d, LONG, |e| !closed(e, 0).is_empty()));
    assert_eq!(bytes_for(&all, 0), b"bye");
    assert_eq!(closed(&all, 0), [None]);
}

fn reset_is_reported_as_an_error<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (client, server) = pair();
    d.attach(0, server).unwrap();
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(client); // RST
    let evs = pump(&mut d, LONG, |e| !closed(e, 0).is_empty());
    assert_eq!(
        closed(&evs, 0),
        [Some(io::ErrorKind::ConnectionReset)],
        "{}",
        summary(&evs)
    );
}

fn waker_interrupts_turn<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    // A wake before the turn is reported by the next turn.
    d.waker()();
    let evs = pump(&mut d, LONG, |e| e.iter().any(|e| matches!(e, Ev::Woken)));
    assert!(evs.iter().any(|e| matches!(e, Ev::Woken)));
    // A wake during an unbounded wait ends it.
    for _ in 0..3 {
        let wake = d.waker();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            wake();
        });
        let start = Instant::now();
        let mut woken = false;
        while !woken {
            assert!(start.elapsed() < LONG, "not woken");
            woken = turn(&mut d, None).iter().any(|e| matches!(e, Ev::Woken));
        }
        t.join().unwrap();
    }
}

fn turn_honours_its_timeout<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (_client, server) = pair();
    d.attach(0, server).unwrap();
    turn(&mut d, Some(Duration::ZERO));
    let start = Instant::now();
    let evs = turn(&mut d, Some(Duration::from_millis(60)));
    let took = start.elapsed();
    assert!(evs.is_empty(), "{}", summary(&evs));
    assert!(took >= Duration::from_millis(50), "returned after {took:?}");
    assert!(took < Duration::from_secs(2), "returned after {took:?}");
    let start = Instant::now();
    turn(&mut d, Some(Duration::ZERO));
    assert!(start.elapsed() < Duration::from_millis(500));
}

fn large_send_completes_after_peer_drains<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (client, server) = pair();
    d.attach(1, server).unwrap();
    let payload = pattern(8 << 20, 3);
    d.send(1, payload.clone());
    let reader = std::thread::spawn(move || {
        let mut client = client;
        let mut got = vec![0u8; 8 << 20];
        client.read_exact(&mut got).unwrap();
        got
    });
    let evs = pump(&mut d, LONG, |e| !sent(e, 1).is_empty());
    assert_eq!(sent(&evs, 1), [&Ok(())]);
    let buf = evs
        .iter()
        .find_map(|e| match e {
            Ev::Sent(1, b, _) => Some(b),
            _ => None,
        })
        .unwrap();
    assert!(buf.is_empty() && buf.capacity() >= 8 << 20);
    assert!(reader.join().unwrap() == payload);
}

/// `bytes_acked` moves while a large send is partly taken and stands still
/// while the peer reads nothing: the shard tells a slow reader from a
/// stopped one by it.
fn bytes_acked_follows_the_reader<D: Driver>(make: Make<D>) {
    const TOTAL: usize = 32 << 20;
    const FIRST: usize = 4 << 20;
    let mut d = make().unwrap();
    let (client, server) = pair();
    d.attach(1, server).unwrap();
    assert_eq!(d.bytes_acked(1), Some(0));
    assert_eq!(d.bytes_acked(2), None);
    let payload = pattern(TOTAL, 5);
    d.send(1, payload.clone());
    // The peer reads nothing: the count rises until its window is full,
    // then stands still for a whole 100 ms.
    let start = Instant::now();
    let mut last = (d.bytes_acked(1).unwrap(), Instant::now());
    let stalled = loop {
        assert!(start.elapsed() < LONG, "bytes_acked never settled");
        let evs = turn(&mut d, Some(Duration::from_millis(10)));
        assert!(sent(&evs, 1).is_empty(), "the send cannot finish yet");
        let now = d.bytes_acked(1).unwrap();
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= Duration::from_millis(100) {
            break now;
        }
    };
    assert!(stalled > 0 && (stalled as usize) < TOTAL, "{stalled}");
    // The peer takes 4 MiB: the count moves on, the send stays in flight.
    let mut client = client;
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; FIRST];
        client.read_exact(&mut got).unwrap();
        (client, got)
    });
    let evs = pump(&mut d, LONG, |_| reader.is_finished());
    assert!(sent(&evs, 1).is_empty());
    let (mut client, first) = reader.join().unwrap();
    assert!(first == payload[..FIRST]);
    let start = Instant::now();
    while d.bytes_acked(1).unwrap() <= stalled {
        assert!(
            start.elapsed() < LONG,
            "bytes_acked did not move after a read"
        );
        let evs = turn(&mut d, Some(Duration::from_millis(10)));
        assert!(sent(&evs, 1).is_empty());
    }
    // The rest: the send completes and every byte is acknowledged.
    let reader = std::thread::spawn(move || {
        let mut rest = vec![0u8; TOTAL - FIRST];
        client.read_exact(&mut rest).unwrap();
        rest
    });
    let evs = pump(&mut d, LONG, |e| !sent(e, 1).is_empty());
    assert_eq!(sent(&evs, 1), [&Ok(())]);
    assert!(reader.join().unwrap() == payload[FIRST..]);
    let start = Instant::now();
    while d.bytes_acked(1) != Some(TOTAL as u64) {
        assert!(start.elapsed() < LONG, "not every byte was acknowledged");
        turn(&mut d, Some(Duration::from_millis(10)));
    }
}

/// One turn never reports more for one socket than the driver says it
/// can (the shard sizes its queues' overshoot by it).
fn one_turn_stays_within_max_turn_bytes<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let bound = d.max_turn_bytes();
    assert!(bound > 0);
    let (client, server) = pair();
    d.attach(1, server).unwrap();
    let total = 3 * bound.min(16 << 20) + 1;
    let writer = write_in_background(client, pattern(total, 9), 1 << 20);
    let mut got = 0;
    let start = Instant::now();
    while got < total {
        assert!(
            start.elapsed() < LONG,
            "only {got} of {total} bytes arrived"
        );
        let evs = turn(&mut d, Some(Duration::from_millis(20)));
        let this_turn = bytes_for(&evs, 1).len();
        assert!(
            this_turn <= bound,
            "{this_turn} bytes in one turn; bound {bound}"
        );
        got += this_turn;
    }
    writer.join().unwrap();
}

fn send_to_a_vanished_peer_fails<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (client, server) = pair();
    d.attach(0, server).unwrap();
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(client);
    let _ = pump(&mut d, LONG, |e| !closed(e, 0).is_empty());
    d.send(0, vec![1u8; 1 << 20]);
    let evs = pump(&mut d, LONG, |e| !sent(e, 0).is_empty());
    assert!(sent(&evs, 0)[0].is_err(), "{}", summary(&evs));
}

/// Closing a socket with a receive armed and a send stuck on a peer that
/// does not read: no completion follows for it, the peer sees the
/// connection end, and the slot can be reused at once without the new
/// socket seeing anything of the old one.
fn close_cancels_and_slot_reuse_is_clean<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (mut old_client, old_server) = pair();
    d.attach(0, old_server).unwrap();
    d.send(0, vec![9u8; 32 << 20]); // far more than the socket buffers hold
    let evs = run_for(&mut d, Duration::from_millis(100));
    assert!(
        sent(&evs, 0).is_empty(),
        "a 32 MiB send to a non-reader finished?"
    );

    d.close(0);
    let (mut new_client, new_server) = pair();
    d.attach(0, new_server).unwrap();
    let _ = old_client.write_all(b"old"); // may fail once the close lands
    new_client.write_all(b"new").unwrap();
    d.send(0, b"hi".to_vec());

    let evs = pump(&mut d, LONG, |e| {
        bytes_for(e, 0).len() >= 3 && !sent(e, 0).is_empty()
    });
    assert_eq!(bytes_for(&evs, 0), b"new");
    assert_eq!(sent(&evs, 0), [&Ok(())], "{}", summary(&evs));
    assert!(closed(&evs, 0).is_empty(), "{}", summary(&evs));
    let mut hi = [0u8; 2];
    new_client.read_exact(&mut hi).unwrap();
    assert_eq!(&hi, b"hi");

    // The old peer drains what was written and then sees the end.
    old_client
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let start = Instant::now();
    let mut sink = vec![0u8; 1 << 20];
    loop {
        assert!(start.elapsed() < LONG, "old connection never ended");
        turn(&mut d, Some(Duration::ZERO));
        match old_client.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break, // reset
        }
    }
    let evs = run_for(&mut d, Duration::from_millis(100));
    assert!(
        sent(&evs, 0).is_empty() && closed(&evs, 0).is_empty(),
        "{}",
        summary(&evs)
    );
}

fn detach_waits_for_the_send<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (client, server) = pair();
    d.attach(2, server).unwrap();
    d.send(2, vec![5u8; 16 << 20]);
    turn(&mut d, Some(Duration::from_millis(20)));
    assert!(d.detach(2).is_none(), "detached with a send in flight");
    let reader = std::thread::spawn(move || {
        let mut client = client;
        let mut got = vec![0u8; 16 << 20];
        client.read_exact(&mut got).unwrap();
        client
    });
    let evs = pump(&mut d, LONG, |e| !sent(e, 2).is_empty());
    assert_eq!(sent(&evs, 2), [&Ok(())]);
    let stream = d.detach(2).expect("detached once the send is done");
    let mut client = reader.join().unwrap();
    // The stream still works, and the driver forgot the slot.
    let mut stream = stream;
    stream.set_nonblocking(false).unwrap();
    client.write_all(b"direct").unwrap();
    let mut got = [0u8; 6];
    stream.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"direct");
    assert!(d.detach(2).is_none());
    let evs = run_for(&mut d, Duration::from_millis(100));
    assert!(
        evs.iter().all(|e| matches!(e, Ev::Woken)),
        "{}",
        summary(&evs)
    );
}

/// A connection moves between two drivers while its peer streams: pause,
/// detach (retrying while the driver has bytes to report first), attach
/// elsewhere. Together the two see every byte exactly once, in order.
fn migration_between_drivers_loses_nothing<D: Driver>(make: Make<D>) {
    let mut a = make().unwrap();
    let mut b = make().unwrap();
    let (client, server) = pair();
    a.attach(5, server).unwrap();
    let data = pattern(3 << 20, 4);
    let writer = write_in_background(client, data.clone(), 1000);
    let mut got = Vec::new();
    // Some bytes arrive on the first driver.
    let evs = pump(&mut a, LONG, |e| bytes_for(e, 5).len() >= 64 << 10);
    got.extend(bytes_for(&evs, 5));
    a.set_recv(5, false);
    let start = Instant::now();
    let stream = loop {
        assert!(start.elapsed() < LONG, "detach never succeeded");
        if let Some(s) = a.detach(5) {
            break s;
        }
        let evs = turn(&mut a, Some(Duration::from_millis(5)));
        assert!(closed(&evs, 5).is_empty(), "{}", summary(&evs));
        got.extend(bytes_for(&evs, 5));
    };
    // Nothing more for slot 5 from the first driver.
    let evs = run_for(&mut a, Duration::from_millis(100));
    assert!(
        bytes_for(&evs, 5).is_empty() && closed(&evs, 5).is_empty(),
        "{}",
        summary(&evs)
    );
    b.attach(7, stream).unwrap();
    let evs = pump(&mut b, LONG, |e| !closed(e, 7).is_empty());
    got.extend(bytes_for(&evs, 7));
    assert_eq!(got.len(), data.len());
    assert!(
        got == data,
        "bytes lost, duplicated or reordered across the move"
    );
    writer.join().unwrap();
}

/// Bytes that reach the socket just before a pause and detach are either
/// reported by the driver (whose detach then says "not now" until they
/// were) or still in the detached socket: never lost, never doubled.
fn detach_right_after_pause_keeps_every_byte<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let (mut client, server) = pair();
    d.attach(0, server).unwrap();
    turn(&mut d, Some(Duration::ZERO));
    client.write_all(b"abc").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    d.set_recv(0, false);
    let mut got = Vec::new();
    let start = Instant::now();
    let mut stream = loop {
        assert!(start.elapsed() < LONG, "detach never succeeded");
        if let Some(s) = d.detach(0) {
            break s;
        }
        let evs = turn(&mut d, Some(Duration::ZERO));
        assert!(closed(&evs, 0).is_empty(), "{}", summary(&evs));
        got.extend(bytes_for(&evs, 0));
    };
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut rest = [0u8; 3];
    while got.len() < 3 {
        let n = stream
            .read(&mut rest[..3 - got.len()])
            .expect("rest of the bytes");
        assert!(n > 0);
        got.extend_from_slice(&rest[..n]);
    }
    assert_eq!(got, b"abc");
    let evs = run_for(&mut d, Duration::from_millis(100));
    assert!(bytes_for(&evs, 0).is_empty(), "{}", summary(&evs));
}

/// Many connections with data at once: with the tiny buffer ring this runs
/// out of buffers on most turns.
fn many_connections_at_once<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let l = listener();
    let addr = l.local_addr().unwrap();
    d.add_listener(l).unwrap();
    const N: usize = 200;
    // Connect from a thread: beyond the listen backlog, connects wait for
    // the driver to accept.
    let connector = std::thread::spawn(move || {
        (0..N)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect::<Vec<_>>()
    });
    let mut accepted = Vec::new();
    let start = Instant::now();
    while accepted.len() < N {
        assert!(start.elapsed() < LONG, "accepted {} of {N}", accepted.len());
        for e in turn(&mut d, Some(Duration::from_millis(20))) {
            if let Ev::Accepted(0, s) = e {
                accepted.push(s);
            }
        }
    }
    let clients = connector.join().unwrap();
    // Slot i serves the client whose local port matches.
    let mut by_port = HashMap::new();
    for (i, s) in accepted.into_iter().enumerate() {
        by_port.insert(s.peer_addr().unwrap().port(), i);
        d.attach(i, s).unwrap();
    }
    let mut want = HashMap::new();
    for (n, mut c) in clients.into_iter().enumerate() {
        let slot = by_port[&c.local_addr().unwrap().port()];
        let msg = pattern(3000 + n * 37, n as u8);
        c.write_all(&msg).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        want.insert(slot, msg);
    }
    let evs = pump(&mut d, LONG, |e| (0..N).all(|s| !closed(e, s).is_empty()));
    let got = received(&evs);
    for (slot, msg) in want {
        assert!(
            got.get(&slot) == Some(&msg),
            "slot {slot} got the wrong bytes"
        );
        assert_eq!(closed(&evs, slot), [None]);
    }
}

/// Dropping a driver with operations in flight neither hangs nor leaves
/// the peers connected.
fn drop_with_operations_in_flight<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let l = listener();
    d.add_listener(l).unwrap();
    let (mut c1, s1) = pair();
    let (c2, s2) = pair();
    d.attach(0, s1).unwrap();
    d.attach(1, s2).unwrap();
    d.send(1, vec![1u8; 32 << 20]);
    turn(&mut d, Some(Duration::from_millis(20)));
    let start = Instant::now();
    drop(d);
    assert!(start.elapsed() < Duration::from_secs(5));
    c1.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(c1.read(&mut b), Ok(0) | Err(_)));
    drop(c2);
}

// ----- instantiation -----

/// A stopped listener takes no more connections: they wait in the
/// socket's backlog for another holder of the socket (the next process
/// under socket activation), which accepts them.
fn stop_accepting_leaves_new_connections_to_the_backlog<D: Driver>(make: Make<D>) {
    let mut d = make().unwrap();
    let l = listener();
    let addr = l.local_addr().unwrap();
    let other = l.try_clone().unwrap();
    assert_eq!(d.add_listener(l).unwrap(), 0);
    let _first = TcpStream::connect(addr).unwrap();
    pump(&mut d, LONG, |e| {
        e.iter().any(|e| matches!(e, Ev::Accepted(0, _)))
    });
    assert!(d.accepting(0));

    d.stop_accepting(0);
    let start = Instant::now();
    while d.accepting(0) {
        assert!(start.elapsed() < LONG, "the stop did not take effect");
        let evs = turn(&mut d, Some(Duration::from_millis(20)));
        assert!(
            !evs.iter().any(|e| matches!(e, Ev::Accepted(..))),
            "{}",
            summary(&evs)
        );
    }
    assert!(!d.accepting(1), "an unknown listener does not accept");
    let late = TcpStream::connect(addr).unwrap();
    let evs = run_for(&mut d, Duration::from_millis(200));
    assert!(
        !evs.iter().any(|e| matches!(e, Ev::Accepted(..))),
        "{}",
        summary(&evs)
    );
    // The connection waits in the backlog for the socket's other holder.
    other.set_nonblocking(false).unwrap();
    let (_, peer) = other.accept().unwrap();
    assert_eq!(peer, late.local_addr().unwrap());
}

fn epoll() -> io::Result<EpollDriver> {
    EpollDriver::new()
}

fn uring() -> io::Result<UringDriver> {
    UringDriver::new()
}

fn uring_tiny() -> io::Result<UringDriver> {
    UringDriver::with_options(&UringOptions {
        sq_entries: 64,
        cq_entries: 256,
        buf_size: 4096,
        bufs_initial: 2,
        bufs_max: 8,
        defer_taskrun: true,
    })
}

/// The set-up used where `DEFER_TASKRUN` is missing (Linux 6.0):
/// completions are posted whenever the thread enters the kernel, not only
/// when it waits on the ring.
fn uring_coop() -> io::Result<UringDriver> {
    let d = UringDriver::with_options(&UringOptions {
        defer_taskrun: false,
        ..UringOptions::default()
    })?;
    assert!(!d.stats().setup.contains("defer"), "{}", d.stats().setup);
    Ok(d)
}

/// Whether the io_uring cases can run; where they cannot, the case skips
/// (a failure under CI, whose kernels have io_uring).
fn uring_usable() -> bool {
    match ferry_engine::uring::probe() {
        Ok(()) => true,
        Err(why) => {
            ferry_testkit::skip!("io_uring is not usable here: {why}");
            false
        }
    }
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod epoll {
            $(#[test] fn $case() { super::$case(super::epoll) })*
        }
        mod uring {
            $(#[test] fn $case() { if super::uring_usable() { super::$case(super::uring) } })*
        }
        mod uring_tiny_buffers {
            $(#[test] fn $case() { if super::uring_usable() { super::$case(super::uring_tiny) } })*
        }
        mod uring_without_defer_taskrun {
            $(#[test] fn $case() { if super::uring_usable() { super::$case(super::uring_coop) } })*
        }
    };
}

conformance!(
    accept_receive_send_close,
    stream_arrives_whole_and_in_order,
    paused_socket_is_not_read_until_resumed,
    pause_and_resume_lose_nothing,
    end_of_stream_while_paused_waits_for_resume,
    reset_is_reported_as_an_error,
    waker_interrupts_turn,
    turn_honours_its_timeout,
    large_send_completes_after_peer_drains,
    bytes_acked_follows_the_reader,
    one_turn_stays_within_max_turn_bytes,
    send_to_a_vanished_peer_fails,
    close_cancels_and_slot_reuse_is_clean,
    detach_waits_for_the_send,
    migration_between_drivers_loses_nothing,
    detach_right_after_pause_keeps_every_byte,
    many_connections_at_once,
    drop_with_operations_in_flight,
    stop_accepting_leaves_new_connections_to_the_backlog,
);

// ----- io_uring only -----

#[test]
fn uring_buffer_ring_grows_when_receives_run_dry() {
    if !uring_usable() {
        return;
    }
    let mut d = uring_tiny().unwrap();
    assert_eq!(d.stats().buffers, 2);
    let mut clients = Vec::new();
    for slot in 0..16 {
        let (c, s) = pair();
        d.attach(slot, s).unwrap();
        clients.push(c);
    }
    turn(&mut d, Some(Duration::ZERO));
    for c in &mut clients {
        c.write_all(&[7u8; 10_000]).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
    }
    let evs = pump(&mut d, LONG, |e| (0..16).all(|s| !closed(e, s).is_empty()));
    for slot in 0..16 {
        assert_eq!(bytes_for(&evs, slot), vec![7u8; 10_000]);
    }
    let stats = d.stats();
    assert!(stats.enobufs > 0, "{stats:?}");
    assert!(stats.buffer_growths > 0 && stats.buffers > 2, "{stats:?}");
    assert!(stats.buffers <= 8, "{stats:?}");
    // What the relay exports as metrics is the same, through the trait.
    let b = d.recv_buffers();
    assert_eq!(b.exhausted, stats.enobufs);
    assert_eq!(b.growths, stats.buffer_growths);
    assert_eq!(
        b.bytes,
        u64::from(stats.buffers) * u64::from(stats.buffer_size)
    );
}

#[test]
fn uring_probe_is_cached_and_auto_agrees() {
    let first = ferry_engine::uring::probe();
    assert_eq!(first, ferry_engine::uring::probe());
    let (backend, why) = ferry_engine::backend::select(ferry_engine::IoMode::Auto).unwrap();
    match first {
        Ok(()) => assert_eq!(backend, ferry_engine::Backend::Uring, "{why}"),
        Err(reason) => {
            assert_eq!(backend, ferry_engine::Backend::Epoll);
            assert!(why.contains(&reason), "{why}");
        }
    }
}

#[test]
fn uring_driver_reports_its_setup() {
    if !uring_usable() {
        return;
    }
    let d = uring().unwrap();
    assert_eq!(d.name(), "uring");
    let stats = d.stats();
    assert!(!stats.setup.is_empty());
    assert_eq!(stats.closing, 0);
}
