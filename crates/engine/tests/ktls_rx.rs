//! Kernel-TLS receive mode of the epoll back end, on a plain socket.
//!
//! This machine's kernel may have no TLS ULP, so these tests check what
//! does not need it: a socket in kTLS receive mode is read with
//! `recvmsg`, and without kTLS keys everything it reads is application
//! data, reported exactly as a plain read would be. Non-data records
//! through the driver are covered by `ferry-derp`'s `tests/ktls.rs`,
//! which runs where the kernel has kTLS and says why it skips otherwise.

use std::io::{ErrorKind, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ferry_engine::{Completion, Driver, EpollDriver};

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (server, _) = l.accept().unwrap();
    (client, server)
}

#[test]
fn ktls_rx_mode_on_a_plain_socket_reads_application_data() {
    let mut d = EpollDriver::new().unwrap();
    let (client, server) = pair();
    d.attach(4, server).unwrap();
    d.set_ktls_rx(4).unwrap();

    // More than one read chunk, so reads continue past full buffers.
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let payload = payload.clone();
        std::thread::spawn(move || {
            let mut client = client;
            client.write_all(&payload).unwrap();
            // Dropping the client ends the stream.
        })
    };

    let mut got = Vec::new();
    let mut closed = None;
    let start = Instant::now();
    while closed.is_none() && start.elapsed() < Duration::from_secs(10) {
        d.turn(Some(Duration::from_millis(20)), &mut |c| match c {
            Completion::Received { slot, data } => {
                assert_eq!(slot, 4);
                got.extend_from_slice(data);
            }
            Completion::RecvClosed { slot, error } => {
                assert_eq!(slot, 4);
                closed = Some(error.map(|e| e.kind()));
            }
            Completion::Record { record_type, .. } => {
                panic!("record type {record_type} from a socket without kTLS keys")
            }
            other => panic!("unexpected {other:?}"),
        })
        .unwrap();
    }
    writer.join().unwrap();
    assert_eq!(closed, Some(None), "orderly end expected");
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "bytes differ");
}

#[test]
fn ktls_rx_mode_needs_an_attached_socket() {
    let mut d = EpollDriver::new().unwrap();
    assert_eq!(d.set_ktls_rx(9).unwrap_err().kind(), ErrorKind::NotFound);
    let (_client, server) = pair();
    d.attach(0, server).unwrap();
    d.close(0);
    assert_eq!(d.set_ktls_rx(0).unwrap_err().kind(), ErrorKind::NotFound);
}
