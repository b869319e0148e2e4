//! A UDP port forwarder: datagrams that arrive on a local UDP port go to
//! the peer, whose forwarder hands them to an application on its side;
//! the answers come back the same way.
//!
//! ```text
//! # on the side of the application (a game server, a DNS server…)
//! cargo run -p ferry-client --example forward -- https://derp.example.com/derp 127.0.0.1:7000 --to 127.0.0.1:53
//! # on the side of its client, which then talks to 127.0.0.1:7000
//! cargo run -p ferry-client --example forward -- https://derp.example.com/derp 127.0.0.1:7000
//! ```
//!
//! Each prints its key (`me: nodekey:…`) and reads the peer's key as the
//! first line of its input; it runs until its input ends. With `--to`,
//! what comes from the peer goes to that address; without, to the last
//! local address that sent something (the client's side).

use ferry_client::{
    DerpServerOptions, Endpoint, EndpointOptions, NodePrivate, NodePublic, PeerOptions,
    MAX_DATAGRAM,
};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UdpSocket;

fn usage() -> ! {
    eprintln!("usage: forward <DERP URL> <local UDP address> [--to <application address>]");
    std::process::exit(2);
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, local) = match &args[..] {
        [url, local, ..] => (url.clone(), local.parse::<SocketAddr>()?),
        _ => usage(),
    };
    let to: Option<SocketAddr> = match &args[2..] {
        [] => None,
        [flag, addr] if flag == "--to" => Some(addr.parse()?),
        _ => usage(),
    };
    let socket = Arc::new(UdpSocket::bind(local).await?);
    let options = EndpointOptions::new(
        NodePrivate::generate(),
        vec![DerpServerOptions::new("derp", url)],
    );
    let endpoint = Arc::new(Endpoint::bind(options).await?);
    println!("me: {}", endpoint.public_key());
    println!("listening: {}", socket.local_addr()?);

    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let Some(line) = lines.next_line().await? else {
        return Ok(());
    };
    let peer: NodePublic = line.trim().parse()?;
    endpoint.add_peer(peer, PeerOptions::new())?;
    println!("peer: {peer}");

    // The local side that sent last: where the peer's datagrams go
    // without --to.
    let last: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let outbound = tokio::spawn({
        let (socket, endpoint, last) = (socket.clone(), endpoint.clone(), last.clone());
        async move {
            let mut buf = vec![0; MAX_DATAGRAM + 1];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                *last.lock().expect("not poisoned") = Some(from);
                // Waits for room on the path; refused only when it cannot
                // go (too large for the path, no path, closed).
                if let Err(e) = endpoint.send(&peer, &buf[..n]).await {
                    eprintln!("dropped a datagram of {n} bytes: {e}");
                }
            }
        }
    });
    let inbound = tokio::spawn({
        let (socket, endpoint) = (socket.clone(), endpoint.clone());
        async move {
            while let Ok(d) = endpoint.recv().await {
                let dst = to.or(*last.lock().expect("not poisoned"));
                if let Some(dst) = dst {
                    let _ = socket.send_to(&d.data, dst).await;
                }
            }
        }
    });
    // Until the input ends.
    while lines.next_line().await?.is_some() {}
    endpoint.close().await;
    outbound.abort();
    let _ = inbound.await;
    Ok(())
}
