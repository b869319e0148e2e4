//! Plain HTTP against a test server: whole responses (metrics: [`crate::metrics`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A plain HTTP request; returns the whole response.
pub fn http(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut body = Vec::new();
    let _ = s.read_to_end(&mut body);
    String::from_utf8_lossy(&body).into_owned()
}
