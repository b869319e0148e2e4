use super::*;

fn page(f: impl FnOnce(&mut Exposition<'_>)) -> String {
    let mut out = String::new();
    f(&mut Exposition::new(&mut out));
    out
}

#[test]
fn label_values_escape_backslash_quote_and_newline() {
    const F: Family = Family::gauge("t_info", "Info.").labels(&["reason"]);
    let text = page(|w| {
        w.family(&F).sample(&["a\\b \"c\"\nd"], 1u8);
    });
    assert_eq!(
        text,
        "# HELP t_info Info.\n# TYPE t_info gauge\nt_info{reason=\"a\\\\b \\\"c\\\"\\nd\"} 1\n"
    );
    assert_eq!(check(&text), Vec::<String>::new());
}

#[test]
fn help_escapes_backslash_and_newline_but_not_quotes() {
    let text = page(|w| w.counter("t_total", "Say \"hi\"\\\nthen go.", 2u64));
    assert_eq!(
        text,
        "# HELP t_total Say \"hi\"\\\\\\nthen go.\n# TYPE t_total counter\nt_total 2\n"
    );
}

#[test]
fn a_family_without_samples_is_its_head_alone() {
    const F: Family = Family::counter("t_none_total", "Nothing yet.").labels(&["peer"]);
    let text = page(|w| {
        w.family(&F);
    });
    assert_eq!(
        text,
        "# HELP t_none_total Nothing yet.\n# TYPE t_none_total counter\n"
    );
    assert!(check(&text).is_empty());
}

#[test]
fn counters_and_gauges_carry_their_type_and_name_unchanged() {
    // derper's counters have no _total; Ferry's have it. The writer keeps
    // each name as declared and writes the type it was declared with.
    let text = page(|w| {
        w.counter("derp_accepts", "Accepted.", 3u64);
        w.counter("ferry_tcp_accepts_total", "Accepted.", 4u64);
        w.gauge("derp_current_connections", "Now.", -1i64);
    });
    assert_eq!(
        text,
        "# HELP derp_accepts Accepted.\n# TYPE derp_accepts counter\nderp_accepts 3\n\
         # HELP ferry_tcp_accepts_total Accepted.\n# TYPE ferry_tcp_accepts_total counter\nferry_tcp_accepts_total 4\n\
         # HELP derp_current_connections Now.\n# TYPE derp_current_connections gauge\nderp_current_connections -1\n"
    );
}

#[test]
fn labels_are_written_in_declared_order() {
    const F: Family = Family::counter("t_total", "T.").labels(&["kind", "reason"]);
    let text = page(|w| {
        w.family(&F)
            .sample(&["disco", "queue_tail"], 1u64)
            .sample(&["other", "queue_tail"], 0u64);
    });
    assert!(text.contains("\nt_total{kind=\"disco\",reason=\"queue_tail\"} 1\n"));
    assert!(text.ends_with("t_total{kind=\"other\",reason=\"queue_tail\"} 0\n"));
}

#[test]
fn floats_keep_their_form() {
    let text = page(|w| {
        const F: Family = Family::gauge("t_seconds", "S.").labels(&["k"]);
        w.family(&F)
            .sample(&["shortest"], 0.25f64)
            .sample(&["fixed"], Fixed(1.5, 3))
            .sample(&["whole"], Fixed(1700000000.4, 0))
            .sample(&["nan"], f64::NAN)
            .sample(&["inf"], f64::INFINITY)
            .sample(&["ninf"], Fixed(f64::NEG_INFINITY, 2));
    });
    for want in [
        "{k=\"shortest\"} 0.25\n",
        "{k=\"fixed\"} 1.500\n",
        "{k=\"whole\"} 1700000000\n",
        "{k=\"nan\"} NaN\n",
        "{k=\"inf\"} +Inf\n",
        "{k=\"ninf\"} -Inf\n",
    ] {
        assert!(text.contains(want), "no {want:?} in {text}");
    }
    assert!(check(&text).is_empty(), "{:?}", check(&text));
}

#[test]
#[should_panic(expected = "not a valid metric family name")]
fn a_bad_family_name_is_refused() {
    let name = String::from("ferry-bad name");
    let _ = Family::counter(&name, "Bad.");
}

#[test]
#[should_panic(expected = "not a valid metric family name")]
fn an_empty_family_name_is_refused() {
    let _ = Family::gauge(std::hint::black_box(""), "Bad.");
}

#[test]
#[should_panic(expected = "not a valid label name")]
fn a_label_name_with_a_colon_is_refused() {
    let label = String::from("a:b");
    let _ = Family::counter("t_total", "T.").labels(&[&label]);
}

#[test]
#[should_panic(expected = "reserved")]
fn a_reserved_label_name_is_refused() {
    let label = String::from("__name__");
    let _ = Family::counter("t_total", "T.").labels(&[&label]);
}

#[test]
#[should_panic(expected = "a label name twice")]
fn a_label_name_twice_is_refused() {
    let label = String::from("peer");
    let _ = Family::counter("t_total", "T.").labels(&[&label, "peer"]);
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "label values")]
fn a_sample_with_too_few_label_values_is_refused() {
    const F: Family = Family::counter("t_total", "T.").labels(&["a", "b"]);
    page(|w| {
        w.family(&F).sample(&["x"], 1u64);
    });
}

#[test]
fn colons_digits_and_underscores_are_valid_names() {
    let f = Family::counter("a:b_9", "T.").labels(&["_x9"]);
    assert_eq!(f.name(), "a:b_9");
    assert_eq!(f.label_names(), &["_x9"]);
}

#[test]
fn check_reports_what_a_scraper_would_refuse() {
    let twice = "# HELP a A.\n# TYPE a counter\na 1\n# HELP a A.\n# TYPE a counter\na 2\n";
    assert!(check(twice).iter().any(|p| p.contains("declared twice")));
    let outside = "# HELP a A.\n# TYPE a counter\nb 1\n";
    assert!(check(outside)
        .iter()
        .any(|p| p.contains("outside its family")));
    let unescaped = "# HELP a A.\n# TYPE a gauge\na{x=\"q\"q\"} 1\n";
    assert!(!check(unescaped).is_empty());
    let not_number = "# HELP a A.\n# TYPE a gauge\na{x=\"q\"} one\n";
    assert!(check(not_number).iter().any(|p| p.contains("not a number")));
    let same_series = "# HELP a A.\n# TYPE a gauge\na{x=\"q\"} 1\na{x=\"q\"} 2\n";
    assert!(check(same_series).iter().any(|p| p.contains("twice")));
    let fine = "# HELP a A.\n# TYPE a gauge\na{x=\"q\\\"\",y=\"\"} 1\na 2\n";
    assert_eq!(check(fine), Vec::<String>::new());
}
