//! Over real sockets on loopback: the fallback on this kernel and, where
//! the kernel has the TLS ULP, a real kTLS exchange.

use super::*;

// ----- over real sockets -----

fn loopback_listener() -> TcpListener {
    TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap()
}

/// A socket that tells a [`RecordBoundary`] what rustls read from it, as
/// the shard would.
struct Tap<'a> {
    sock: &'a mut TcpStream,
    boundary: &'a mut RecordBoundary,
}

impl Read for Tap<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.sock.read(buf)?;
        self.boundary.feed(&buf[..n]);
        Ok(n)
    }
}

impl Write for Tap<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sock.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

/// Accepts one connection and finishes the server side of the handshake
/// on it with a buffered rustls connection, every byte written.
fn accept_handshake(
    listener: &TcpListener,
    config: Arc<ServerConfig>,
) -> (TcpStream, ServerConnection) {
    let (mut sock, _) = listener.accept().unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut server = ServerConnection::new(config).unwrap();
    let mut boundary = RecordBoundary::new();
    let mut tap = Tap {
        sock: &mut sock,
        boundary: &mut boundary,
    };
    while server.is_handshaking() {
        server.complete_io(&mut tap).unwrap();
    }
    while server.wants_write() {
        server.write_tls(&mut tap).unwrap();
    }
    assert!(boundary.at_boundary(), "rustls read part of a record");
    (sock, server)
}

/// The same with an unbuffered rustls connection.
fn accept_handshake_unbuffered(
    listener: &TcpListener,
    config: Arc<ServerConfig>,
) -> (TcpStream, UnbufferedServerConnection) {
    let (mut sock, _) = listener.accept().unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut server = UnbufferedServerConnection::new(config).unwrap();
    let (mut incoming, mut outgoing) = (Vec::new(), Vec::new());
    let (mut nothing, mut got) = (Vec::new(), Vec::new());
    loop {
        drive(
            &mut server,
            &mut incoming,
            &mut outgoing,
            &mut nothing,
            &mut got,
        );
        sock.write_all(&outgoing).unwrap();
        outgoing.clear();
        if !server.handshaking() {
            break;
        }
        let mut buf = [0u8; 16 * 1024];
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0, "client left during the handshake");
        incoming.extend_from_slice(&buf[..n]);
    }
    // Our own buffer is the record boundary check here.
    assert!(incoming.is_empty() && got.is_empty());
    (sock, server)
}

/// The client's side: handshake, wait for the server's first message (so
/// nothing of ours is read before a hand-off), then a scripted exchange.
/// Returns what it read, as text, for the server to check.
fn client_script(config: Arc<ClientConfig>, addr: SocketAddr, key_update: bool) -> Vec<String> {
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut conn = ClientConnection::new(config, localhost()).unwrap();
    let mut log = Vec::new();
    let read_some = |conn: &mut ClientConnection, sock: &mut TcpStream, log: &mut Vec<String>| {
        let mut buf = [0u8; 256];
        match rustls::Stream::new(conn, sock).read(&mut buf) {
            Ok(0) => log.push("eof".to_owned()),
            Ok(n) => log.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) => log.push(format!("error: {e}")),
        }
    };
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).unwrap();
    }
    read_some(&mut conn, &mut sock, &mut log); // "ready"
    rustls::Stream::new(&mut conn, &mut sock)
        .write_all(b"ping")
        .unwrap();
    if key_update {
        // A KeyUpdate asking for ours, then data under the new key.
        conn.refresh_traffic_keys().unwrap();
        rustls::Stream::new(&mut conn, &mut sock)
            .write_all(b"after update")
            .unwrap();
        read_some(&mut conn, &mut sock, &mut log); // "pong", or the end
    }
    conn.send_close_notify();
    let _ = conn.complete_io(&mut sock);
    read_some(&mut conn, &mut sock, &mut log); // the server's close_notify
    log
}

#[test]
fn fallback_on_this_kernel_keeps_the_connection_in_userspace() {
    let suite = tls13_suites()[0];
    let listener = loopback_listener();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || client_script(client_config(suite), addr, false));
    let (mut sock, server) = accept_handshake(&listener, server_config(suite));

    let mut server = match (
        sys::tls_ulp_available(),
        KernelTls::start(server, sock.as_fd()),
    ) {
        (Err(reason), Err(Refused::Usable { conn, reason: got })) => {
            println!("kernel TLS unavailable, staying in userspace: {got}");
            assert!(matches!(got, Refusal::Kernel(r) if r == reason), "{got}");
            conn
        }
        (Ok(()), Ok(_)) => {
            drop(sock);
            let _ = client.join();
            return ferry_testkit::skip_expected!(
                "this kernel has kTLS, so there is no fallback to test here"
            );
        }
        (probe, other) => panic!("probe says {probe:?} but start gave {other:?}"),
    };

    // The same connection goes on with rustls over the socket.
    server.writer().write_all(b"ready").unwrap();
    server.complete_io(&mut sock).unwrap();
    let mut got = Vec::new();
    while got.len() < 4 {
        server.complete_io(&mut sock).unwrap();
        got.extend(read_all(&mut server.reader()));
    }
    assert_eq!(got, b"ping");
    // The client's close_notify, then ours.
    while !server.process_new_packets().unwrap().peer_has_closed() {
        server.read_tls(&mut sock).unwrap();
    }
    server.send_close_notify();
    server.complete_io(&mut sock).unwrap();
    assert_eq!(client.join().unwrap(), vec!["ready", "eof"]);
}

#[derive(Debug, PartialEq)]
enum Event {
    Data(Vec<u8>),
    Record(u8, Vec<u8>),
    Closed(Option<io::ErrorKind>),
}

/// Reads one connection through the epoll driver, one event at a time.
struct Reader {
    d: EpollDriver,
    pending: std::collections::VecDeque<Event>,
    /// Sends the driver reported finished.
    sent: usize,
}

impl Reader {
    fn next(&mut self) -> Event {
        let start = Instant::now();
        while self.pending.is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no event within 10 s"
            );
            self.turn();
        }
        self.pending.pop_front().unwrap()
    }

    /// One driver turn, its completions noted.
    fn turn(&mut self) {
        let (pending, sent) = (&mut self.pending, &mut self.sent);
        self.d
            .turn(Some(Duration::from_millis(20)), &mut |c| match c {
                Completion::Received { data, .. } => pending.push_back(Event::Data(data.to_vec())),
                Completion::Sent { .. } => *sent += 1,
                Completion::Record {
                    record_type, data, ..
                } => pending.push_back(Event::Record(record_type, data.to_vec())),
                Completion::RecvClosed { error, .. } => {
                    pending.push_back(Event::Closed(error.map(|e| e.kind())))
                }
                _ => {}
            })
            .unwrap();
    }

    /// Application data until `len` bytes arrived.
    fn data(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while out.len() < len {
            match self.next() {
                Event::Data(b) => out.extend(b),
                other => panic!("expected data, got {other:?}"),
            }
        }
        out
    }
}

#[test]
fn real_kernel_tls_over_loopback() {
    if let Err(reason) = sys::tls_ulp_available() {
        return ferry_testkit::skip_unless_required!(KTLS_REQUIRED, "{reason}");
    }
    let supported = |suite: SupportedCipherSuite| match sys::kernel_supports(
        version_of(suite).1,
        cipher_of(suite),
    ) {
        Ok(()) => true,
        Err(reason) => {
            ferry_testkit::skip_unless_required!(KTLS_REQUIRED, "{suite:?}: {reason}");
            false
        }
    };
    for suite in tls13_suites() {
        if supported(suite) {
            real_exchange(suite, true, true);
        }
    }
    // A buffered session cannot follow a KeyUpdate and says goodbye.
    real_exchange(tls13_suites()[0], false, true);
    for suite in tls12_suites() {
        if supported(suite) {
            real_exchange(suite, false, false);
        }
    }
}

/// One connection through kTLS both ways: plaintext written to the socket
/// reaches the rustls client, the client's records arrive as plaintext
/// through the epoll driver, a KeyUpdate is followed (TLS 1.3 from an
/// unbuffered server, where the kernel can rekey) or answered with a clean
/// close, and close_notify ends it.
fn real_exchange(suite: SupportedCipherSuite, unbuffered: bool, key_update: bool) {
    let listener = loopback_listener();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || client_script(client_config(suite), addr, key_update));
    let what = format!("{suite:?}, unbuffered: {unbuffered}");
    let (mut sock, mut session) = if unbuffered {
        let (sock, server) = accept_handshake_unbuffered(&listener, server_config(suite));
        assert!(server.ready().is_ok());
        let session = KernelTls::start(server, sock.as_fd())
            .unwrap_or_else(|r| panic!("{what}: hand-off refused: {r:?}"));
        (sock, session)
    } else {
        let (sock, server) = accept_handshake(&listener, server_config(suite));
        assert!(server.ready().is_ok());
        let session = KernelTls::start(server, sock.as_fd())
            .unwrap_or_else(|r| panic!("{what}: hand-off refused: {r:?}"));
        (sock, session)
    };
    assert_eq!(session.can_rekey(), unbuffered && key_update);
    // The kernel encrypts a plain write.
    sock.write_all(b"ready").unwrap();

    let mut d = EpollDriver::new().unwrap();
    d.attach(0, sock).unwrap();
    d.set_ktls_rx(0).unwrap();
    let mut r = Reader {
        d,
        pending: Default::default(),
        sent: 0,
    };
    assert_eq!(r.data(4), b"ping", "{what}");

    let mut rekeyed = false;
    if key_update {
        match r.next() {
            Event::Record(22, msg) => {
                assert_eq!(msg, KEY_UPDATE_REQUESTED, "{what}");
                match session.on_record(r.d.fd(0).unwrap(), 22, &msg) {
                    Ok(RecordOutcome::KeyUpdated) => rekeyed = true,
                    Err(HandoffError::CannotRekey(reason)) => {
                        println!("{what}: KeyUpdate not followed: {reason}");
                        assert!(
                            !unbuffered || sys::kernel_can_rekey().is_err(),
                            "{what}: {reason}"
                        );
                    }
                    other => panic!("{what}: KeyUpdate: {other:?}"),
                }
            }
            other => panic!("{what}: expected the client's KeyUpdate, got {other:?}"),
        }
        if rekeyed {
            assert!(!session.key_update_due());
            assert_eq!(r.data(12), b"after update", "{what}");
            r.d.send(0, b"pong".to_vec());
            session.note_sent(4).unwrap();
        }
    }
    if !key_update || rekeyed {
        match r.next() {
            Event::Record(21, alert) => assert_eq!(
                session.on_record(r.d.fd(0).unwrap(), 21, &alert).unwrap(),
                RecordOutcome::Closed,
                "{what}"
            ),
            other => panic!("{what}: expected close_notify, got {other:?}"),
        }
    }
    session.send_close_notify(r.d.fd(0).unwrap()).unwrap();
    // Let the pending send (the pong) finish before closing, and keep
    // reading for a moment: what the client sent after its KeyUpdate must
    // leave our receive queue, or closing the socket sends a reset instead
    // of a FIN and the client's last read fails with a broken pipe instead
    // of the end of the stream it checks for.
    let start = Instant::now();
    while r.sent < usize::from(rekeyed) || start.elapsed() < Duration::from_millis(200) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: the pong was not sent within 10 s"
        );
        r.turn();
    }
    r.d.close(0);
    let log = client.join().unwrap();
    let expected: Vec<&str> = match (key_update, rekeyed) {
        (false, _) => vec!["ready", "eof"],
        (true, true) => vec!["ready", "pong", "eof"],
        // We said goodbye instead of following the update.
        (true, false) => vec!["ready", "eof", "eof"],
    };
    assert_eq!(log, expected, "{what}");
}
