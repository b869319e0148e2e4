//! A chat over datagrams: lines typed here go to every peer, lines from
//! peers are printed, on whatever path reaches each peer best.
//!
//! ```text
//! cargo run -p ferry-client --example chat -- https://derp.example.com/derp
//! ```
//!
//! It prints this side's key (`me: nodekey:…`). Give each side the other's
//! key with a `/peer nodekey:…` line; every other line is a message. End
//! with end of input (Ctrl-D).
//!
//! Output lines, one event each: `me: <key>`, `peer: <key>` (added),
//! `<short key> via <path>: <text>`, `path: <short key> <from> -> <to>`,
//! `error: <why>`.

use ferry_client::{
    DerpServerOptions, Endpoint, EndpointOptions, EventKind, NodePrivate, NodePublic, PeerOptions,
};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: chat <DERP URL> (http://host:port/derp or https://host/derp)");
        std::process::exit(2);
    };
    let options = EndpointOptions::new(
        NodePrivate::generate(),
        vec![DerpServerOptions::new("derp", url)],
    );
    let endpoint = Arc::new(Endpoint::bind(options).await?);
    println!("me: {}", endpoint.public_key());
    let peers: Arc<Mutex<Vec<NodePublic>>> = Arc::default();

    // Messages and path switches, as they come.
    let incoming = tokio::spawn({
        let endpoint = endpoint.clone();
        async move {
            while let Ok(d) = endpoint.recv().await {
                let text = String::from_utf8_lossy(&d.data);
                println!("{} via {}: {text}", d.peer.short(), d.path);
            }
        }
    });
    let mut events = endpoint.events();
    let switches = tokio::spawn(async move {
        while let Some(e) = events.recv().await {
            if let EventKind::Path(p) = e.kind {
                let show = |a: Option<ferry_client::PathAddr>| {
                    a.map_or_else(|| "none".to_owned(), |a| a.to_string())
                };
                println!(
                    "path: {} {} -> {}",
                    p.peer.short(),
                    show(p.from),
                    show(p.to)
                );
            }
        }
    });

    // Lines typed here.
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        if let Some(key) = line.strip_prefix("/peer ") {
            match key.trim().parse::<NodePublic>() {
                Ok(key) => {
                    endpoint.add_peer(key, PeerOptions::new())?;
                    peers.lock().expect("not poisoned").push(key);
                    println!("peer: {key}");
                }
                Err(e) => println!("error: {key}: {e}"),
            }
            continue;
        }
        let to: Vec<NodePublic> = peers.lock().expect("not poisoned").clone();
        for peer in to {
            // Waits while the path's queue is full; a message longer than
            // the path carries is refused (SendError::TooLarge).
            if let Err(e) = endpoint.send(&peer, line.as_bytes()).await {
                println!("error: to {}: {e}", peer.short());
            }
        }
    }
    endpoint.close().await;
    let _ = incoming.await;
    let _ = switches.await;
    Ok(())
}
