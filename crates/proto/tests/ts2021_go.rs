//! The control channel's Noise layer against Tailscale's own server side
//! (`tailscale.com/control/controlbase`, run by `interop/cmd/ts2021-echo`):
//! Ferry's initiator completes the handshake with Go's responder, and
//! records cross both ways at the frame edges (empty, 1, 4077 and 4078
//! plaintext bytes, and more than one frame's worth), Go splitting its
//! echo into its own frames.

use ferry_proto::key::{MachinePrivate, MachinePublic};
use ferry_proto::tailnet::noise::{Initiator, Transport, HEADER_LEN, MAX_FRAME, MAX_PLAINTEXT};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Echo(Child);

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop")
}

/// Builds the Go program into a directory of this process; `None` when
/// there is no Go toolchain.
fn build_echo() -> Option<PathBuf> {
    let out = std::env::temp_dir().join(format!("ferry-ts2021-echo-{}", std::process::id()));
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg("./cmd/ts2021-echo")
        .current_dir(interop_dir())
        .status();
    match status {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("running go build: {e}"),
        Ok(s) => {
            assert!(s.success(), "go build ./cmd/ts2021-echo failed: {s}");
            Some(out)
        }
    }
}

/// Reads records until `want` plaintext bytes arrived; returns them and
/// the plaintext length of every record seen.
fn read_plain(
    stream: &mut TcpStream,
    t: &mut Transport,
    buf: &mut Vec<u8>,
    want: usize,
) -> (Vec<u8>, Vec<usize>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut plain = Vec::new();
    let mut records = Vec::new();
    while plain.len() < want {
        assert!(Instant::now() < deadline, "echo timed out");
        // Note each whole record's size before opening it.
        let mut at = 0;
        while let Some(h) = buf.get(at..at + HEADER_LEN) {
            let len = usize::from(u16::from_be_bytes([h[1], h[2]]));
            if buf.len() < at + HEADER_LEN + len {
                break;
            }
            assert!(HEADER_LEN + len <= MAX_FRAME);
            records.push(len - 16);
            at += HEADER_LEN + len;
        }
        let used = t
            .open(&mut buf[..at], &mut plain)
            .expect("Go's records open");
        assert_eq!(used, at);
        buf.drain(..used);
        if plain.len() >= want {
            break;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).expect("read");
        assert!(n > 0, "echo closed early");
        buf.extend_from_slice(&chunk[..n]);
    }
    (plain, records)
}

#[test]
fn noise_records_against_go_controlbase() {
    let Some(bin) = build_echo() else {
        return ferry_testkit::skip!("no Go toolchain (go) on PATH");
    };
    let mut child = Command::new(&bin)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start ts2021-echo");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _echo = Echo(child);
    let _ = std::fs::remove_file(&bin);
    let (addr, key) = line.trim().split_once(' ').expect("address and key");
    let server: MachinePublic = key.parse().expect("server key");

    let machine = MachinePrivate::generate();
    let init = Initiator::new(&machine, &server, 130, rand_bytes()).unwrap();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(init.initiation()).unwrap();
    let mut buf = Vec::new();
    let mut t = loop {
        let mut chunk = [0u8; 256];
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "server closed during the handshake");
        buf.extend_from_slice(&chunk[..n]);
        if let Some((t, used)) = init.read_response(&buf).expect("Go accepts the handshake") {
            buf.drain(..used);
            break t;
        }
    };

    // An empty record is legal and yields nothing; the byte after it comes
    // back alone.
    let mut wire = Vec::new();
    t.seal(b"", &mut wire).unwrap();
    t.seal(b"x", &mut wire).unwrap();
    stream.write_all(&wire).unwrap();
    let (plain, _) = read_plain(&mut stream, &mut t, &mut buf, 1);
    assert_eq!(plain, b"x");

    for len in [1, MAX_PLAINTEXT, MAX_PLAINTEXT + 1, 3 * MAX_PLAINTEXT + 100] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let mut wire = Vec::new();
        t.seal(&data, &mut wire).unwrap();
        stream.write_all(&wire).unwrap();
        let (plain, records) = read_plain(&mut stream, &mut t, &mut buf, len);
        assert_eq!(plain, data, "echo of {len} bytes");
        assert!(records.iter().all(|&r| r <= MAX_PLAINTEXT), "{records:?}");
        if len > MAX_PLAINTEXT {
            assert!(records.len() >= 2, "{len} bytes in {records:?}");
        }
    }
}

fn rand_bytes() -> [u8; 32] {
    *MachinePrivate::generate().as_bytes()
}
