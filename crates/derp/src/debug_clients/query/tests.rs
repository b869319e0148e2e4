use super::*;

const KEY: &str = "nodekey:5869aff450549732cbaaed5e5df9b30a6da31cb0e5742bad5ad4a1a768f1a67b";

fn ok(raw: &str) -> Query {
    parse(raw, 0)
        .unwrap()
        .unwrap_or_else(|| panic!("{raw}: no query"))
}

fn err(raw: &str) -> String {
    parse(raw, 0).unwrap_err().0
}

#[test]
fn no_filter_means_counts_only() {
    assert_eq!(parse("", 0), Ok(None));
    assert_eq!(parse("format=json", 0), Ok(None));
    assert_eq!(parse("sort=-rx&limit=5", 0), Ok(None));
    // An empty ip= is no filter, as Go's Get reads it.
    assert_eq!(parse("ip=", 0), Ok(None));
}

#[test]
fn defaults_and_one_filter() {
    let q = ok("all");
    assert_eq!(q.filter, Filter::All);
    assert_eq!(
        (q.sort, q.desc, q.limit, q.json),
        (SortBy::Key, false, 100, false)
    );
    assert_eq!(
        (q.after.clone(), q.after_conn, q.apps.clone()),
        (None, None, None)
    );
    assert_eq!(
        ok("ip=::ffff:10.0.0.1").filter,
        Filter::Ip("10.0.0.1".parse().unwrap())
    );
    assert_eq!(
        ok("cidr=10.1.2.3/8").filter,
        Filter::Cidr("10.0.0.0".parse().unwrap(), 8)
    );
    assert_eq!(
        ok(&format!("key={KEY}")).filter,
        Filter::Key(KEY.parse().unwrap())
    );
    assert_eq!(
        err("all&ip=10.0.0.1"),
        "only one of all, ip, cidr, or key may be given"
    );
}

#[test]
fn app_filters_repeat_and_alone_mean_all() {
    let q = ok("app=ferry&app=&app=a+b&app=%7E");
    assert_eq!(q.filter, Filter::All);
    assert_eq!(
        q.apps.as_deref(),
        Some(&["ferry".to_string(), String::new(), "a b".into(), "~".into()][..])
    );
    assert!(q.matches_app("") && q.matches_app("ferry") && !q.matches_app("other"));
    assert!(ok("all").matches_app("anything"));
}

#[test]
fn sort_limit_and_format() {
    let q = ok("all&sort=-txpkts&limit=7&format=json");
    assert_eq!(
        (q.sort, q.desc, q.limit, q.json),
        (SortBy::TxPkts, true, 7, true)
    );
    assert_eq!(ok("all&limit=1").limit, 1);
    assert_eq!(ok("all&limit=1000").limit, 1000);
    assert_eq!(ok("all&limit=1001").limit, 1000);
    assert!(!ok("all&format=html").json);
    assert_eq!(err("all&limit=0"), "bad limit \"0\"");
    assert_eq!(err("all&limit=x"), "bad limit \"x\"");
    assert_eq!(
        err("all&format=xml"),
        "bad format \"xml\"; want json or html"
    );
    assert_eq!(
        err("all&sort=size"),
        "bad sort \"size\"; want key, ip, conn, connected, rx, tx, rxpkts, or txpkts, optionally with a leading -"
    );
    for (name, s) in SortBy::NAMES {
        assert_eq!(ok(&format!("all&sort={s}")).sort, name);
    }
}

#[test]
fn cursors_per_sort() {
    assert_eq!(
        ok(&format!("all&after={KEY}")).after,
        Some(After::Key(KEY.parse().unwrap()))
    );
    assert_eq!(
        ok("all&sort=ip&after=10.0.0.1:80").after,
        Some(After::Addr("10.0.0.1:80".parse().unwrap()))
    );
    assert_eq!(
        ok("all&sort=ip&after=10.0.0.1").after,
        Some(After::Addr("10.0.0.1:65535".parse().unwrap()))
    );
    assert_eq!(
        ok("all&sort=-ip&after=10.0.0.1").after,
        Some(After::Addr("10.0.0.1:0".parse().unwrap()))
    );
    assert_eq!(ok("all&sort=conn&after=42").after, Some(After::Conn(42)));
    assert_eq!(
        ok("all&sort=connected&after=1700000000000000000").after,
        Some(After::ConnectedAt(1_700_000_000_000_000_000))
    );
    let q = parse("all&sort=connected&after=30m", 10_000_000_000_000)
        .unwrap()
        .unwrap();
    assert_eq!(
        q.after,
        Some(After::ConnectedAt(10_000_000_000_000 - 1_800_000_000_000))
    );
    assert_eq!(ok("all&sort=rx&after=99").after, Some(After::Counter(99)));
    // The tie-break, except for the conn sort, and only with a cursor.
    assert_eq!(ok("all&sort=rx&after=99&afterconn=3").after_conn, Some(3));
    assert_eq!(ok("all&sort=conn&after=9&afterconn=3").after_conn, None);
    assert_eq!(ok("all&afterconn=3").after_conn, None);
    assert!(err("all&sort=rx&after=-1").starts_with("bad after \"-1\" for sort by rx: "));
    assert!(err("all&after=nodekey:12").starts_with("bad after \"nodekey:12\" for sort by key: "));
    assert_eq!(
        err("all&sort=connected&after=soon"),
        "bad after \"soon\" for sort by connected; want Unix nanoseconds or a duration"
    );
    assert!(err("all&sort=rx&after=1&afterconn=x").starts_with("bad afterconn \"x\": "));
}

#[test]
fn bad_filters_name_the_parameter() {
    assert!(err("ip=10.0.0").starts_with("bad ip \"10.0.0\": "));
    assert!(err("cidr=10.0.0.0").starts_with("bad cidr \"10.0.0.0\": "));
    assert!(err("cidr=10.0.0.0/33").starts_with("bad cidr \"10.0.0.0/33\": "));
    assert!(err("key=abc").starts_with("bad key \"abc\": "));
}

#[test]
fn address_filters_match_canonical_addresses() {
    let q = ok("cidr=10.0.0.0/8");
    assert!(q.matches_addr("10.9.9.9".parse().unwrap()));
    assert!(q.matches_addr("::ffff:10.9.9.9".parse().unwrap()));
    assert!(!q.matches_addr("11.0.0.1".parse().unwrap()));
    assert!(!q.matches_addr("::a00:1".parse().unwrap()));
    let q = ok("ip=2001:db8::1");
    assert!(q.matches_addr("2001:db8::1".parse().unwrap()));
    assert!(!q.matches_addr("2001:db8::2".parse().unwrap()));
    assert!(ok("cidr=::/0").matches_addr("::1".parse().unwrap()));
    assert!(ok("cidr=0.0.0.0/0").matches_addr("1.2.3.4".parse().unwrap()));
}

#[test]
fn undecodable_pairs_are_skipped() {
    assert_eq!(parse("ip=%zz", 0), Ok(None));
    assert_eq!(ok("all&app=%4").apps, None);
}
