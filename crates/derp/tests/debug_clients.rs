//! `/debug/clients/` (`docs/operating.md`): pages over 300 connections
//! spread over three shards (every sort's cursor walks the
//! whole set exactly once), the filters, the traffic counters, derper's
//! 400 answers, local access only; and the field names and JSON types
//! against derper v1.104.7's page. Each case on each back end (the list
//! at the end), except the derper comparison, which runs once.

mod support;

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;

use ferry_proto::handshake::ClientInfo;
use ferry_proto::key::NodePrivate;
use serde_json::Value;
use support::{eventually, http, info, start, stop, Client};

const T: Duration = Duration::from_secs(5);
/// Clients in the paging case (two sockets each, on each back end at
/// once: the soft file limit is raised to the hard one first).
const N: usize = 300;

/// The status code and body of `GET path`.
fn get(addr: SocketAddr, path: &str, headers: &str) -> (u16, String) {
    let r = http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n"),
    );
    let status = r
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {r:?}"));
    let body = r.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

/// The JSON of `/debug/clients/?query` (which must answer 200).
fn page(addr: SocketAddr, query: &str) -> Value {
    let (status, body) = get(addr, &format!("/debug/clients/{query}"), "");
    assert_eq!(status, 200, "{query}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{query}: {e}: {body}"))
}

fn clients(v: &Value) -> &Vec<Value> {
    v["clients"].as_array().expect("clients array")
}

fn named(name: Option<&str>) -> ClientInfo {
    ClientInfo {
        app_name: name.map(str::to_owned),
        ..info(None)
    }
}

/// The app name of client `i` of the paging case.
fn app_of(i: usize) -> Option<&'static str> {
    [Some("alpha"), Some("beta"), None][i % 3]
}

fn connect_many(addr: SocketAddr, n: usize) -> Vec<Client> {
    (0..n)
        .map(|i| Client::connect_as(addr, NodePrivate::generate(), named(app_of(i))))
        .collect()
}

/// Following `next` from the first page visits every connection exactly
/// once, in the walk order, for each sort and both directions; the
/// counts and `remaining` agree with what is left.
fn pages_walk_every_connection_exactly_once() {
    ferry_sys::raise_nofile_limit().expect("raising the file limit");
    let (server, addr) = start(3, |_| {});
    let _clients = connect_many(addr, N);
    assert!(eventually(T, || page(addr, "?all&format=json&limit=1")
        ["conns"]
        == N));
    for sort in [
        "key",
        "-key",
        "ip",
        "-ip",
        "conn",
        "-conn",
        "connected",
        "-connected",
        "-rx",
        "txpkts",
    ] {
        let mut next = format!("?all&format=json&limit=16&sort={sort}");
        let mut seen: Vec<i64> = Vec::new();
        let mut order: Vec<String> = Vec::new();
        for _ in 0..N {
            let v = page(addr, &next);
            assert_eq!(v["conns"], N, "{sort}");
            assert_eq!(v["keys"], N, "{sort}");
            let rows = clients(&v);
            assert!(rows.len() <= 16, "{sort}: {} rows", rows.len());
            for r in rows {
                seen.push(r["connNum"].as_i64().expect("connNum"));
                order.push(match sort.trim_start_matches('-') {
                    "key" => r["key"].as_str().unwrap().to_owned(),
                    "ip" => {
                        let a: SocketAddr = r["remote"].as_str().unwrap().parse().unwrap();
                        format!("{:?}", (a.ip(), a.port()))
                    }
                    _ => format!("{:020}", r["connNum"].as_i64().unwrap()),
                });
            }
            assert_eq!(v["remaining"], N - seen.len(), "{sort}");
            match v["next"].as_str() {
                Some(n) => next = n.to_owned(),
                None => break,
            }
        }
        let unique: HashSet<i64> = seen.iter().copied().collect();
        assert_eq!(seen.len(), N, "{sort}: {seen:?}");
        assert_eq!(unique.len(), N, "{sort}: a connection came twice");
        if matches!(sort.trim_start_matches('-'), "key" | "ip" | "conn") {
            let mut want = order.clone();
            want.sort();
            if sort.starts_with('-') {
                want.reverse();
            }
            assert_eq!(order, want, "{sort}: not in walk order");
        }
    }
    stop(server);
}

/// `app=` (repeatable, empty for nameless clients), `key=`, `ip=` and
/// `cidr=` choose the connections they name.
fn filters_choose_their_connections() {
    let (server, addr) = start(3, |_| {});
    let clients_ = connect_many(addr, 30);
    assert!(eventually(T, || page(addr, "?all&format=json")["conns"] == 30));
    let count = |q: &str| page(addr, &format!("{q}&format=json&limit=1000"))["conns"].clone();
    assert_eq!(count("?app=alpha"), 10);
    assert_eq!(count("?app="), 10);
    assert_eq!(count("?app=alpha&app=beta"), 20);
    assert_eq!(count("?ip=127.0.0.1"), 30);
    assert_eq!(count("?cidr=127.0.0.0/8&app=beta"), 10);
    assert_eq!(count("?cidr=10.0.0.0/8"), 0);
    for r in clients(&page(addr, "?app=beta&format=json")) {
        assert_eq!(r["appName"], "beta");
    }
    let one = &clients_[4];
    let v = page(addr, &format!("?key={}&format=json", one.public));
    let rows = clients(&v);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["key"], one.public.to_string());
    assert_eq!(rows[0]["appName"], "beta");
    assert_eq!(rows[0]["active"], true);
    assert_eq!(rows[0]["dup"], false);
    assert_eq!(rows[0]["version"], info(None).version);
    // The HTML page lists the same rows.
    let (status, html) = get(addr, "/debug/clients/?app=beta", "");
    assert_eq!(status, 200);
    assert_eq!(html.matches("<tr><td>").count(), 10, "{html}");
    // Two connections of one key: both dup, the newer one active.
    let k = NodePrivate::generate();
    let _first = Client::connect_as(addr, k.clone(), info(None));
    let _second = Client::connect_as(addr, k.clone(), info(None));
    let q = format!("?key={}&format=json&sort=conn", k.public());
    assert!(eventually(T, || clients(&page(addr, &q)).len() == 2));
    let v = page(addr, &q);
    let rows = clients(&v);
    assert_eq!(v["keys"], 1);
    assert!(rows.iter().all(|r| r["dup"] == true), "{rows:?}");
    assert_eq!(rows[0]["active"], false, "{rows:?}");
    assert_eq!(rows[1]["active"], true, "{rows:?}");
    stop(server);
}

/// rxPkts/rxBytes count what a client sent to be relayed, txPkts/txBytes
/// what was queued to it; the counter sorts follow them.
fn counters_follow_traffic() {
    let (server, addr) = start(2, |_| {});
    let mut a = Client::connect(addr);
    let mut b = Client::connect(addr);
    let _idle = Client::connect(addr);
    for _ in 0..3 {
        a.send(&b.public, &[7u8; 100]);
    }
    for _ in 0..3 {
        b.recv_packet(T).expect("a packet from a");
    }
    let row = |k: &ferry_proto::key::NodePublic| {
        clients(&page(addr, &format!("?key={k}&format=json")))[0].clone()
    };
    let ra = row(&a.public);
    assert_eq!(
        (&ra["rxPkts"], &ra["rxBytes"]),
        (&Value::from(3), &Value::from(300))
    );
    let rb = row(&b.public);
    assert_eq!(
        (&rb["txPkts"], &rb["txBytes"]),
        (&Value::from(3), &Value::from(300))
    );
    let top = |sort: &str| {
        clients(&page(
            addr,
            &format!("?all&format=json&sort={sort}&limit=1"),
        ))[0]["key"]
            .clone()
    };
    assert_eq!(top("-rx"), a.public.to_string());
    assert_eq!(top("-txpkts"), b.public.to_string());
    a.ping(*b"counters");
    let _ = a.next_meaningful(T);
    stop(server);
}

/// Without a filter: the counts; bad queries: derper's 400 texts; the
/// HTML counts page.
fn counts_and_bad_queries() {
    let (server, addr) = start(2, |_| {});
    let _c = connect_many(addr, 4);
    assert!(eventually(T, || get(
        addr,
        "/debug/clients/?format=json",
        ""
    )
    .1 == "{\"conns\":4,\"keys\":4}\n"));
    let (status, html) = get(addr, "/debug/clients/", "");
    assert_eq!(status, 200);
    assert!(html.contains("4 connections"), "{html}");
    for (q, want) in bad_queries() {
        let (status, body) = get(addr, &format!("/debug/clients/{q}"), "");
        assert_eq!(status, 400, "{q}: {body}");
        assert!(body.starts_with(want), "{q}: {body:?}, want {want:?}");
    }
    stop(server);
}

/// Queries derper refuses, and how its answer starts.
fn bad_queries() -> [(&'static str, &'static str); 6] {
    [
        ("?all&ip=1.2.3.4", "only one of all, ip, cidr, or key may be given\n"),
        ("?all&format=xml", "bad format \"xml\"; want json or html\n"),
        ("?all&limit=0", "bad limit \"0\"\n"),
        ("?all&sort=bogus", "bad sort \"bogus\"; want key, ip, conn, connected, rx, tx, rxpkts, or txpkts, optionally with a leading -\n"),
        ("?ip=nope", "bad ip \"nope\": "),
        ("?all&sort=conn&after=x", "bad after \"x\" for sort by conn: "),
    ]
}

/// Like every `/debug` page: not for a client that is not local.
fn non_local_clients_are_refused() {
    let (server, addr) = start(1, |_| {});
    for q in ["", "?all", "?all&format=json"] {
        let (status, _) = get(
            addr,
            &format!("/debug/clients/{q}"),
            "X-Forwarded-For: 1.2.3.4\r\n",
        );
        assert_eq!(status, 403, "{q}");
    }
    assert_eq!(get(addr, "/debug/clients/?all", "").0, 200);
    stop(server);
}

ferry_testkit::per_backend!(
    pages_walk_every_connection_exactly_once,
    filters_choose_their_connections,
    counters_follow_traffic,
    counts_and_bad_queries,
    non_local_clients_are_refused,
);

/// derper v1.104 or later: `FERRY_DERPER104_BIN`, else
/// `interop/bin/derper` when it says it is at least 1.104.
fn derper_104() -> Result<PathBuf, String> {
    let version = |p: &PathBuf| -> Option<(u32, u32)> {
        let out = std::process::Command::new(p)
            .arg("--version")
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut it = text.trim().split(['.', '-']);
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    };
    let at_least = |p: &PathBuf| version(p).is_some_and(|v| v >= (1, 104));
    if let Some(p) = std::env::var_os("FERRY_DERPER104_BIN") {
        let p = PathBuf::from(p);
        return if at_least(&p) {
            Ok(p)
        } else {
            Err(format!(
                "FERRY_DERPER104_BIN={} is not derper 1.104 or later",
                p.display()
            ))
        };
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../interop/bin/derper");
    match version(&p) {
        Some(v) if v >= (1, 104) => Ok(p),
        Some(v) => Err(format!(
            "{} is derper {}.{}, not 1.104 or later; set FERRY_DERPER104_BIN",
            p.display(),
            v.0,
            v.1
        )),
        None => Err(format!(
            "no derper at {}; set FERRY_DERPER104_BIN",
            p.display()
        )),
    }
}

/// A pretty-printed JSON text with each value replaced by its type: the
/// field names, their order, their types and the layout.
fn skeleton(body: &str) -> Vec<String> {
    body.lines()
        .map(|l| match l.split_once("\": ") {
            Some((k, v)) => {
                let comma = if v.ends_with(',') { "," } else { "" };
                let t = match v.chars().next() {
                    Some('"') => "string",
                    Some('t' | 'f') => "bool",
                    Some('[' | '{') => &v[..1],
                    _ => "number",
                };
                format!("{k}\": {t}{comma}")
            }
            None => l.to_owned(),
        })
        .collect()
}

/// Ferry's page has derper v1.104.7's fields in its order, with its JSON
/// types and layout; the counts page and the 400 answers match too.
#[test]
fn fields_match_derper_v1_104() {
    let bin = match derper_104() {
        Ok(b) => b,
        Err(why) => return ferry_testkit::skip!("{why}"),
    };
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let state = ferry_testkit::tempdir::TempDir::new("debug-clients-derper");
    let derper = ferry_testkit::derper::Derper::start_bin(&bin, port, state.path(), None);
    let (server, ferry) = start(2, |_| {});
    let mut shapes = Vec::new();
    for addr in [port, ferry] {
        let _c = Client::connect_as(addr, NodePrivate::generate(), named(Some("shape")));
        let _d = Client::connect_as(addr, NodePrivate::generate(), named(None));
        assert!(eventually(T, || clients(&page(addr, "?all&format=json"))
            .len()
            == 2));
        let (status, body) = get(addr, "/debug/clients/?all&format=json&limit=1", "");
        assert_eq!(status, 200, "{body}");
        let counts = get(addr, "/debug/clients/?format=json", "").1;
        let counts = counts.replace(|c: char| c.is_ascii_digit(), "#");
        let errors: Vec<(u16, String)> = bad_queries()
            .iter()
            .take(4)
            .map(|(q, _)| get(addr, &format!("/debug/clients/{q}"), ""))
            .collect();
        // The description and next-page link (numbers masked: connection
        // numbers and counters differ between the two servers).
        let links: Vec<(Value, String)> = [
            "?all&format=json&limit=1&sort=-conn",
            "?app=shape&app=&format=json&limit=1&sort=connected",
            "?cidr=127.0.0.1/8&format=json&limit=1&sort=-rx",
            "?ip=127.0.0.1&format=json&limit=1&sort=ip",
        ]
        .iter()
        .map(|q| {
            let v = page(addr, q);
            let next = v["next"]
                .as_str()
                .unwrap_or("")
                .replace(|c: char| c.is_ascii_digit(), "#");
            (v["query"].clone(), next)
        })
        .collect();
        shapes.push((skeleton(&body), counts, errors, links));
    }
    assert_eq!(
        shapes[1],
        shapes[0],
        "Ferry (left) against derper (right); derper log: {}",
        derper.log()
    );
    stop(server);
}
