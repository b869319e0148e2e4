//! Sets up the relay sessions for the packet-rate benchmark's `session`
//! case (bench/udp/pps.sh): per flow, two SDK clients allocate a session
//! over DERP (`docs/relay-sessions.md`), slot 0 is bound from a generator
//! port and slot 1 from the sink's port, and `udp_gen send --shape session`
//! then sends the flow's datagrams (with the session's header) from that
//! port through the relay to the sink.
//!
//! ```sh
//! session_pps --derp http://10.77.21.1:8080/derp --from 10.77.21.2 \
//!     --sink 10.77.21.2:6000 [--flows 8] [--seconds 60] --out FILE
//! ```
//!
//! Flow `i`'s generator side is bound from `--from` on a port the system
//! picks, its sink side from `--sink` port `+ i`. Both sockets are closed
//! once bound (the relay binds addresses, not sockets), so the generator
//! and the sink can open the same ports. `FILE` gets one line per flow,
//! `VNI SOURCE_PORT`, written when every session is bound; the DERP
//! connections stay up for `--seconds` after that (the sessions belong to
//! them), and the datagrams keep the sessions from idling out.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use ferry_client::{DerpClient, Event, Options};
use ferry_proto::key::NodePrivate;
use ferry_proto::relay_session::{Binder, SessionOffer};

/// Bound on every wait for the relay (an offer, a bind).
const WAIT: Duration = Duration::from_secs(10);

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn parse<T: std::str::FromStr>(args: &[String], name: &str, default: Option<&str>) -> T {
    let text = arg(args, name)
        .or(default)
        .unwrap_or_else(|| usage(&format!("{name} is required")));
    text.parse()
        .unwrap_or_else(|_| usage(&format!("{name}: cannot parse {text}")))
}

fn usage(why: &str) -> ! {
    eprintln!("session_pps: {why}\nusage: session_pps --derp URL --from IP --sink ADDR [--flows N] [--seconds S] --out FILE");
    std::process::exit(2);
}

/// The next relay-session offer `c` gets, within [`WAIT`].
async fn offer(c: &mut DerpClient) -> SessionOffer {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, c.recv()).await {
            Err(_) => panic!("no relay session offered within {WAIT:?}"),
            Ok(Err(e)) => panic!("DERP client: {e}"),
            Ok(Ok(Event::RelaySession(o))) => return o,
            Ok(Ok(Event::RelayRefused { reason, .. })) => panic!("relay refused: {reason:?}"),
            Ok(Ok(_)) => {}
        }
    }
}

/// Binds `offer`'s slot from a socket at `from`; returns the bound
/// address. Blocking: the binder's retransmits bound it by the bind
/// lifetime, [`WAIT`] bounds it here.
fn bind(offer: &SessionOffer, relay: SocketAddr, from: SocketAddr) -> SocketAddr {
    let sock = UdpSocket::bind(from).unwrap_or_else(|e| panic!("bind {from}: {e}"));
    let mut b = Binder::new(offer, relay, 1, Instant::now());
    let deadline = Instant::now() + WAIT;
    let mut buf = [0u8; 1500];
    while !b.is_bound() {
        let now = Instant::now();
        assert!(
            now < deadline && !b.is_failed(),
            "slot {} of session {} not bound within {WAIT:?}",
            offer.slot,
            offer.vni
        );
        if let Some(msg) = b.poll_transmit(now) {
            sock.send_to(&msg, relay).expect("send a bind message");
        }
        let wait = b
            .poll_timeout()
            .map_or(Duration::from_millis(1), |t| {
                t.saturating_duration_since(now)
            })
            .max(Duration::from_millis(1));
        sock.set_read_timeout(Some(wait)).expect("read timeout");
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            b.handle(Instant::now(), &buf[..n]);
        }
    }
    sock.local_addr().expect("local address")
}

async fn run(args: &[String]) {
    let url: String = parse(args, "--derp", None);
    let from: std::net::IpAddr = parse(args, "--from", None);
    let sink: SocketAddr = parse(args, "--sink", None);
    let flows: u16 = parse(args, "--flows", Some("8"));
    let hold = Duration::from_secs_f64(parse(args, "--seconds", Some("60")));
    let out: String = parse(args, "--out", None);
    let mut opts = Options::default();
    opts.relay_sessions = true;
    let mut lines = String::new();
    let mut clients = Vec::new();
    for i in 0..flows {
        let (ka, kb) = (NodePrivate::generate(), NodePrivate::generate());
        let connect = |k: NodePrivate| DerpClient::connect(&url, k, opts.clone());
        let mut a = connect(ka).await.expect("connect to the DERP server");
        let mut b = connect(kb.clone())
            .await
            .expect("connect to the DERP server");
        a.allocate(&kb.public()).await.expect("allocate");
        let (oa, ob) = (offer(&mut a).await, offer(&mut b).await);
        let relay = a.relay_endpoint(&oa).expect("the relay's session endpoint");
        let port = bind(&oa, relay, SocketAddr::new(from, 0)).port();
        bind(&ob, relay, SocketAddr::new(sink.ip(), sink.port() + i));
        lines.push_str(&format!("{} {port}\n", oa.vni));
        clients.push(a);
        clients.push(b);
    }
    let tmp = format!("{out}.tmp");
    std::fs::write(&tmp, lines).expect("write the session file");
    std::fs::rename(&tmp, &out).expect("rename the session file");
    eprintln!("session_pps: {flows} sessions bound, holding them for {hold:?}");
    // Keep reading every connection (keepalives, pings) until `hold` ends.
    let drain = clients.into_iter().map(|mut c| {
        tokio::spawn(async move {
            let e = loop {
                if let Err(e) = c.recv().await {
                    break e;
                }
            };
            eprintln!("session_pps: a DERP connection ended while its session was in use: {e}");
            std::process::exit(1);
        })
    });
    let tasks: Vec<_> = drain.collect();
    tokio::time::sleep(hold).await;
    for t in tasks {
        t.abort();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run(&args));
}
