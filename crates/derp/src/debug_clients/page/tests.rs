use super::*;
use crate::debug_clients::query::parse;

/// A connection as the page sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    conn: i64,
    rx: u64,
    addr: SocketAddr,
}

fn rows(n: i64) -> Vec<Row> {
    (0..n)
        .map(|i| Row {
            conn: i,
            // Many ties, so the tie-break matters.
            rx: (i * 7919 % 13) as u64,
            addr: SocketAddr::from(([10, 0, (i % 5) as u8, 1], (i % 3) as u16 + 80)),
        })
        .collect()
}

fn value(sort: SortBy) -> impl Fn(&Row) -> (SortValue, i64) {
    move |r: &Row| {
        let v = match sort {
            SortBy::Ip => SortValue::Addr(r.addr),
            SortBy::Conn => SortValue::Conn,
            _ => SortValue::Counter(r.rx),
        };
        (v, r.conn)
    }
}

/// The page by brute force: sort everything, skip past the cursor, take.
fn oracle(q: &Query, all: &[Row]) -> (Vec<Row>, usize) {
    let f = value(q.sort);
    let mut v: Vec<Row> = all
        .iter()
        .copied()
        .filter(|r| {
            let (val, c) = f(r);
            past_cursor(q, val, c)
        })
        .collect();
    v.sort_by_key(|r| f(r));
    if q.desc {
        v.reverse();
    }
    let n = v.len();
    v.truncate(q.limit);
    let rem = n - v.len();
    (v, rem)
}

fn q(raw: &str) -> Query {
    parse(raw, 0).unwrap().unwrap()
}

#[test]
fn pages_equal_a_full_sort_and_cursors_walk_every_row_once() {
    let all = rows(300);
    for (sort, s) in [
        (SortBy::RxBytes, "rx"),
        (SortBy::Ip, "ip"),
        (SortBy::Conn, "conn"),
    ] {
        for desc in [false, true] {
            let dash = if desc { "-" } else { "" };
            let mut raw = format!("all&sort={dash}{s}&limit=17");
            let mut seen = Vec::new();
            for _ in 0..100 {
                let query = q(&raw);
                let page = select(&query, all.iter().copied(), value(sort));
                let (want, rem) = oracle(&query, &all);
                assert_eq!(page.rows, want, "{raw}");
                assert_eq!(page.remaining, rem, "{raw}");
                seen.extend(page.rows.iter().map(|r| r.conn));
                let Some(last) = page.rows.last() else { break };
                let after = match sort {
                    SortBy::Ip => last.addr.to_string(),
                    SortBy::Conn => last.conn.to_string(),
                    _ => last.rx.to_string(),
                };
                raw = format!(
                    "all&sort={dash}{s}&limit=17&after={after}&afterconn={}",
                    last.conn
                );
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..300).collect::<Vec<_>>(), "sort {dash}{s}");
        }
    }
}

#[test]
fn a_cursor_without_tie_break_skips_its_whole_value() {
    let all = rows(300);
    let query = q("all&sort=rx&after=5&limit=1000");
    let page = select(&query, all.iter().copied(), value(SortBy::RxBytes));
    assert!(page.rows.iter().all(|r| r.rx > 5));
    assert_eq!(page.rows.len(), all.iter().filter(|r| r.rx > 5).count());
    let query = q("all&sort=-ip&after=10.0.2.1&limit=1000");
    let page = select(&query, all.iter().copied(), value(SortBy::Ip));
    assert!(page
        .rows
        .iter()
        .all(|r| r.addr.ip() < "10.0.2.1".parse::<std::net::IpAddr>().unwrap()));
}

#[test]
fn empty_and_small_inputs() {
    let page = select(&q("all"), Vec::<Row>::new(), value(SortBy::Key));
    assert!(page.rows.is_empty() && page.remaining == 0);
    let page = select(&q("all&sort=conn&limit=5"), rows(3), value(SortBy::Conn));
    assert_eq!(
        page.rows.iter().map(|r| r.conn).collect::<Vec<_>>(),
        [0, 1, 2]
    );
}
