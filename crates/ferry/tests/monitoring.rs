//! The Grafana dashboard (packaging/grafana/ferry.json) and the Prometheus
//! alert rules (packaging/prometheus/ferry-alerts.yaml) against what a
//! running ferry exports: every metric a dashboard query or an alert
//! expression selects must appear in a real scrape of a DERP server or a
//! UDP relay started here on loopback, and every label value a selector
//! names must appear on that metric. A renamed metric or label value fails
//! here instead of leaving an empty panel or an alert that never fires.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use support::{ferry, get, url_addr, Ferry, TempDir};

/// Names the rules use that no ferry exports, with where they come from.
/// Only the alert rules may use them.
const EXTERNAL: &[(&str, &str)] = &[
    ("up", "Prometheus itself, one series per scrape target"),
    (
        "probe_ssl_earliest_cert_expiry",
        "blackbox_exporter probing the DERP server over TLS (ferry exports no certificate expiry yet)",
    ),
];

/// Labels whose values come from Prometheus's targets or Grafana's
/// variables, not from ferry.
const TARGET_LABELS: &[&str] = &["job", "instance"];

/// One series selector in a PromQL expression: the metric name and its
/// label matchers (label, operator, value).
#[derive(Debug, PartialEq)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
}

/// Words that are PromQL syntax, not metric names: operators, and the
/// aggregations, which may stand before `by (…)` instead of `(`; and
/// [`LABEL_LISTS`].
const KEYWORDS: &[&str] = &[
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "count_values",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Index just past the quoted string starting at `i` (a `"`, `'` or `` ` ``).
fn skip_string(s: &[char], i: usize) -> usize {
    let quote = s[i];
    let mut j = i + 1;
    while j < s.len() && s[j] != quote {
        if s[j] == '\\' && quote != '`' {
            j += 1;
        }
        j += 1;
    }
    j + 1
}

/// Index just past the bracket that closes the one at `i`.
fn skip_group(s: &[char], i: usize, open: char, close: char) -> usize {
    let mut depth = 0;
    let mut j = i;
    while j < s.len() {
        match s[j] {
            '"' | '\'' | '`' => {
                j = skip_string(s, j);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
        j += 1;
    }
    s.len()
}

/// The label matchers between `{` and `}`: `label op "value"`, comma
/// separated.
fn matchers(body: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let s: Vec<char> = body.chars().collect();
    let mut i = 0;
    while i < s.len() {
        if !ident_start(s[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < s.len() && ident_char(s[i]) {
            i += 1;
        }
        let label: String = s[start..i].iter().collect();
        while i < s.len() && s[i] == ' ' {
            i += 1;
        }
        let op_start = i;
        while i < s.len() && "=!~".contains(s[i]) {
            i += 1;
        }
        let op: String = s[op_start..i].iter().collect();
        while i < s.len() && s[i] == ' ' {
            i += 1;
        }
        assert!(
            i < s.len() && "\"'`".contains(s[i]),
            "matcher {label}{op} without a quoted value in {{{body}}}"
        );
        let end = skip_string(&s, i);
        let value: String = s[i + 1..end - 1].iter().collect();
        out.push((label, op, value));
        i = end;
    }
    out
}

/// Every series selector in a PromQL expression (Grafana's `$variables`
/// allowed).
fn selectors(expr: &str) -> Vec<Selector> {
    let s: Vec<char> = expr.chars().collect();
    let mut out: Vec<Selector> = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '[' {
            i = skip_group(&s, i, '[', ']');
        } else if c == '{' {
            let end = skip_group(&s, i, '{', '}');
            let body: String = s[i + 1..end - 1].iter().collect();
            let sel = out
                .last_mut()
                .unwrap_or_else(|| panic!("a selector without a metric name in {expr}"));
            sel.matchers = matchers(&body);
            i = end;
        } else if c == '$' {
            // A Grafana variable: $name, ${name} or $__rate_interval.
            i += 1;
            if i < s.len() && s[i] == '{' {
                i = skip_group(&s, i, '{', '}');
            }
            while i < s.len() && ident_char(s[i]) {
                i += 1;
            }
        } else if c.is_ascii_digit() || (c == '.' && s.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // A number, its exponent, or a duration after offset (5m).
            while i < s.len()
                && (s[i].is_ascii_alphanumeric()
                    || s[i] == '.'
                    || ((s[i] == '+' || s[i] == '-') && matches!(s[i - 1], 'e' | 'E')))
            {
                i += 1;
            }
        } else if ident_start(c) {
            let start = i;
            while i < s.len() && ident_char(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let mut next = i;
            while next < s.len() && s[next].is_whitespace() {
                next += 1;
            }
            let call = next < s.len() && s[next] == '(';
            if LABEL_LISTS.contains(&word.as_str()) && call {
                i = skip_group(&s, next, '(', ')');
            } else if !call
                && !KEYWORDS.contains(&word.to_ascii_lowercase().as_str())
                && !LABEL_LISTS.contains(&word.as_str())
            {
                out.push(Selector {
                    name: word,
                    matchers: Vec::new(),
                });
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The expressions in a rules file: each `expr:` value, on its line or as
/// an indented block scalar (`|`, `>`) below it. The file is kept to that
/// form (promtool checks the rest of its YAML in scripts/test.d/48).
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let item = trimmed.strip_prefix("- ").unwrap_or(trimmed);
        let Some(rest) = item.strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if matches!(rest, "|" | "|-" | ">" | ">-") {
            let indent = line.len() - trimmed.len();
            let body: Vec<&str> = lines[n + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .map(|l| l.trim())
                .collect();
            out.push(body.join(" "));
        } else {
            out.push(rest.trim_matches(|c| c == '"' || c == '\'').to_owned());
        }
    }
    out
}

/// The queries in a Grafana dashboard: every panel target's `expr`, and
/// the metric of each `label_values(metric, label)` variable.
fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    ("query" | "definition", serde_json::Value::String(q))
                        if q.starts_with("label_values(") =>
                    {
                        let args = &q["label_values(".len()..q.len() - 1];
                        let metric = args.rsplit_once(',').map_or(args, |(m, _)| m);
                        out.push(metric.trim().to_owned());
                    }
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// Series in a Prometheus text scrape: metric name to the label sets seen.
fn scrape(text: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut out: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let head = line.rsplit_once(' ').map_or(line, |(h, _)| h);
        let (name, labels) = match head.split_once('{') {
            Some((name, rest)) => (
                name,
                matchers(rest.trim_end_matches('}'))
                    .into_iter()
                    .map(|(k, _, v)| (k, v))
                    .collect(),
            ),
            None => (head, BTreeMap::new()),
        };
        out.entry(name.to_owned()).or_default().push(labels);
    }
    out
}

/// The literal values a matcher admits: the value of `=`/`!=`, or each
/// alternative of a regex made only of words and `|`; none for other
/// regexes and Grafana variables.
fn literal_values(op: &str, value: &str) -> Vec<String> {
    if value.contains('$') {
        return Vec::new();
    }
    match op {
        "=" | "!=" => vec![value.to_owned()],
        _ if value.chars().all(|c| ident_char(c) || c == '|') => {
            value.split('|').map(str::to_owned).collect()
        }
        _ => Vec::new(),
    }
}

/// Everything wrong with `exprs` (from `file`) against the scrape.
fn problems(
    file: &str,
    exprs: &[String],
    scraped: &BTreeMap<String, Vec<BTreeMap<String, String>>>,
    external_allowed: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for expr in exprs {
        for sel in selectors(expr) {
            if EXTERNAL.iter().any(|(n, _)| *n == sel.name) {
                if !external_allowed {
                    out.push(format!(
                        "{file}: {} is not ferry's (only the alert rules may use it): {expr}",
                        sel.name
                    ));
                }
                continue;
            }
            let Some(series) = scraped.get(&sel.name) else {
                out.push(format!(
                    "{file}: {} is in no scrape of ferry: {expr}",
                    sel.name
                ));
                continue;
            };
            for (label, op, value) in &sel.matchers {
                if TARGET_LABELS.contains(&label.as_str()) {
                    continue;
                }
                for want in literal_values(op, value) {
                    if !series.iter().any(|l| l.get(label) == Some(&want)) {
                        out.push(format!(
                            "{file}: no {}{{{label}=\"{want}\"}} in the scrape: {expr}",
                            sel.name
                        ));
                    }
                }
            }
        }
    }
    out
}

use ferry_testkit::repo_file;

/// The body of GET /metrics at the address in `url`.
fn metrics_text(url: &str) -> String {
    let response = get(url_addr(url), "/metrics");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

#[test]
fn selectors_are_found_in_promql() {
    let expr = r#"sum by (instance, reason) (rate(derp_packets_dropped{job="ferry", reason=~"a|b"}[5m] offset 1h))
        / ignoring(reason) group_left sum(rate(derp_packets_received{instance=~"$derp"}[$__rate_interval])) > 1e-2
        and on() vector(1) * 86400 < time() or absent(up{job='x'})"#;
    let got = selectors(expr);
    assert_eq!(
        got,
        vec![
            Selector {
                name: "derp_packets_dropped".into(),
                matchers: vec![
                    ("job".into(), "=".into(), "ferry".into()),
                    ("reason".into(), "=~".into(), "a|b".into()),
                ],
            },
            Selector {
                name: "derp_packets_received".into(),
                matchers: vec![("instance".into(), "=~".into(), "$derp".into())],
            },
            Selector {
                name: "up".into(),
                matchers: vec![("job".into(), "=".into(), "x".into())],
            },
        ]
    );
    assert_eq!(literal_values("=~", "a|b"), ["a", "b"]);
    assert!(literal_values("=~", "a.*").is_empty());
    assert_eq!(
        rule_exprs("  - expr: up == 0\n    expr: |\n      a\n      / b\n    for: 1m\n"),
        ["up == 0", "a / b"]
    );
}

#[test]
fn dashboard_and_alerts_use_only_exported_metrics() {
    let dir = TempDir::new("monitoring");
    // The DERP server with admission and a mesh link configured, so their
    // metrics are there too (nobody connects, so the unreachable
    // controller is never asked; the link's peer is not there either).
    std::fs::write(dir.path("mesh.key"), "ab".repeat(32)).unwrap();
    let roots = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.path("roots.pem"), roots.cert.pem()).unwrap();
    let mut derp = Ferry::spawn(
        ferry()
            .args(["-a", "127.0.0.1:0", "--stun-port", "0", "--workers", "1"])
            .args(["-c", &dir.path("ferry.key")])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(["--verify-client-url", "http://127.0.0.1:1/verify"])
            .args(["--mesh-psk-file", &dir.path("mesh.key")])
            .args(["--mesh-with", "localhost:1/127.0.0.1"])
            .env("SSL_CERT_FILE", dir.path("roots.pem")),
    );
    let derp_metrics = derp.field("ferry relay running", "metrics");
    let mut udp = Ferry::spawn(
        ferry()
            .args(["udp-relay", "--workers", "1"])
            .args(["--recv-buffer", "262144", "--send-buffer", "262144"])
            .args(["--listen", "127.0.0.1:0", "--target", "127.0.0.1:9"])
            .args(["--metrics-addr", "127.0.0.1:0"]),
    );
    udp.wait_log("UDP relay running");
    let udp_log = udp.wait_log("metrics");
    let udp_metrics = udp_log
        .lines()
        .find(|l| l.contains(" metrics "))
        .and_then(|l| support::field_in(l, "url"))
        .unwrap_or_else(|| panic!("no metrics url in:\n{udp_log}"));

    let mut scraped = scrape(&metrics_text(&derp_metrics));
    let derp_names = scraped.len();
    for (name, series) in scrape(&metrics_text(&udp_metrics)) {
        scraped.entry(name).or_default().extend(series);
    }
    assert!(
        derp_names > 50 && scraped.len() > derp_names + 10,
        "scrapes too small: {derp_names} DERP names, {} in all",
        scraped.len()
    );
    assert!(scraped.contains_key("ferry_admission_decisions_total"));

    let dashboard: serde_json::Value =
        serde_json::from_str(&repo_file("packaging/grafana/ferry.json")).expect("dashboard JSON");
    let mut dash_exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut dash_exprs);
    let panels = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
        .count();
    assert!(
        panels >= 15 && dash_exprs.len() > panels,
        "{panels} panels, {} queries",
        dash_exprs.len()
    );

    let rules = repo_file("packaging/prometheus/ferry-alerts.yaml");
    let rule_exprs = rule_exprs(&rules);
    assert_eq!(
        rule_exprs.len(),
        rules.matches("- alert:").count(),
        "one expr per alert: {rule_exprs:?}"
    );

    let mut all = problems("packaging/grafana/ferry.json", &dash_exprs, &scraped, false);
    all.extend(problems(
        "packaging/prometheus/ferry-alerts.yaml",
        &rule_exprs,
        &scraped,
        true,
    ));
    assert!(all.is_empty(), "\n{}", all.join("\n"));

    // What the rules and the dashboard cover, for the log of the run.
    let used: BTreeSet<String> = dash_exprs
        .iter()
        .chain(&rule_exprs)
        .flat_map(|e| selectors(e))
        .map(|s| s.name)
        .collect();
    println!(
        "{} metrics used by {} dashboard queries and {} alert rules, out of {} exported",
        used.len(),
        dash_exprs.len(),
        rule_exprs.len(),
        scraped.len()
    );
    derp.stop();
    udp.stop();
}
