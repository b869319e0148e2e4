//! The documentation against what it documents, so a doc cannot drift
//! from the binary and the code without a test failing:
//!
//! - every flag `ferry --help` lists (and each subcommand's, and the
//!   aliases clap does not print) has a row in its doc's flag table, and
//!   every subcommand is named in the docs;
//! - a default the help prints is the default that row gives, and the UDP
//!   relay's documented defaults are its configuration's;
//! - every relative link in the README, `docs/` and `bench/` points at a
//!   file (and heading) that exists;
//! - the test vectors of `docs/derp-protocol.md` §15 and §17 are the bytes
//!   `ferry_proto` writes;
//! - the README stays short, says what the first build takes and where
//!   the printed DERP map goes, and no doc cites an issue number.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use ferry_proto::frame::{self, PeerGoneReason};
use ferry_proto::key::NodePrivate;

use ferry_testkit::{repo_file as read, workspace_root as root};

/// `ferry ARGS --help`, with no `FERRY_*` variable of the test's
/// environment turned into a flag.
fn help(args: &[&str]) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("FERRY_") || k.to_string_lossy().starts_with("DERP_") {
            c.env_remove(k);
        }
    }
    let out = c.args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "ferry {args:?} --help: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Which doc holds the flags of which command.
const COMMANDS: &[(&[&str], &str)] = &[
    (&[], "docs/operating.md"),
    (&["status"], "docs/operating.md"),
    (&["check-config"], "docs/operating.md"),
    (&["udp-relay"], "docs/udp-relay.md"),
    (&["link"], "docs/link.md"),
    (&["link", "status"], "docs/link.md"),
    (&["link", "pubkey"], "docs/link.md"),
];

/// Each command of [`COMMANDS`] as `ferry ARGS`, its doc, that doc's
/// tables, and the flags its help lists.
fn commands() -> Vec<(String, &'static str, Vec<Table>, Vec<HelpFlag>)> {
    COMMANDS
        .iter()
        .map(|(args, doc)| {
            let name = std::iter::once("ferry")
                .chain(args.iter().copied())
                .collect::<Vec<_>>()
                .join(" ");
            (name, *doc, tables(&read(doc)), help_flags(&help(args)))
        })
        .collect()
}

/// A flag's entry in a help text: its names (`--stun-port`, `-a`) and the
/// default clap prints, if any.
#[derive(Debug)]
struct HelpFlag {
    names: Vec<String>,
    default: Option<String>,
}

/// The flags of one `--help` output, `--help` and `--version` left out.
/// A flag's line is indented by fewer than eight spaces and starts with
/// `-`; its description (and `[default: …]`) runs to the next such line.
fn help_flags(text: &str) -> Vec<HelpFlag> {
    let mut flags: Vec<HelpFlag> = Vec::new();
    let mut block = String::new();
    let mut current: Option<Vec<String>> = None;
    let finish = |names: Option<Vec<String>>, block: &str, flags: &mut Vec<HelpFlag>| {
        if let Some(names) = names {
            let default = block
                .split("[default: ")
                .nth(1)
                .map(|rest| rest.split(']').next().unwrap().to_string());
            flags.push(HelpFlag { names, default });
        }
    };
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let is_flag = indent > 0 && indent < 8 && trimmed.starts_with('-');
        let is_section = indent == 0 && !trimmed.is_empty();
        if is_flag || is_section {
            finish(current.take(), &block, &mut flags);
            block.clear();
        }
        if is_flag {
            // The names end where the description starts (two spaces).
            let spec = trimmed.split("  ").next().unwrap();
            let names: Vec<String> = spec
                .split([',', ' '])
                .filter(|t| t.starts_with('-') && t.len() > 1)
                .map(|t| t.split(['=', '[', '<']).next().unwrap().to_string())
                .filter(|t| !matches!(t.as_str(), "-h" | "--help" | "-V" | "--version"))
                .collect();
            if !names.is_empty() {
                current = Some(names);
            }
        }
        block.push_str(line);
        block.push('\n');
    }
    finish(current, &block, &mut flags);
    flags
}

/// The commands a help text lists under `Commands:`, `help` left out.
fn help_commands(text: &str) -> Vec<String> {
    let Some(rest) = text.split("Commands:\n").nth(1) else {
        return Vec::new();
    };
    rest.lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// One markdown table: its header cells and rows.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Splits a table line into cells, keeping `|` that is escaped (`\|`) or
/// inside a code span.
fn cells(line: &str) -> Vec<String> {
    let line = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut code = false;
    let mut prev = ' ';
    for c in line.chars() {
        if c == '`' {
            code = !code;
        }
        if c == '|' && !code && prev != '\\' {
            out.push(cell.trim().to_string());
            cell.clear();
        } else {
            cell.push(c);
        }
        prev = c;
    }
    out.push(cell.trim().to_string());
    out
}

/// The lines of a markdown text outside fenced code blocks (the fences
/// left out too).
fn unfenced(md: &str) -> Vec<&str> {
    let mut fenced = false;
    md.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The tables of a markdown text, outside fenced code blocks.
fn tables(md: &str) -> Vec<Table> {
    let is_separator = |l: &str| {
        l.trim().starts_with('|') && l.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
    };
    let mut out = Vec::new();
    let mut lines = unfenced(md).into_iter().peekable();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with('|') && lines.peek().is_some_and(|l| is_separator(l)) {
            lines.next();
            let header = cells(line);
            let mut rows = Vec::new();
            while let Some(l) = lines.next_if(|l| l.trim_start().starts_with('|')) {
                rows.push(cells(l));
            }
            out.push(Table { header, rows });
        }
    }
    out
}

/// Whether `cell` holds `` `token` `` as a code span of its own.
fn has_code(cell: &str, token: &str) -> bool {
    cell.split('`').skip(1).step_by(2).any(|span| span == token)
}

/// The row of a flag table (its first column is `Flag`) that names
/// `token` (as `` `token` ``) in a cell before its `Default` column, with
/// that column's cell; `None` when no flag table names it.
fn documented<'a>(tables: &'a [Table], token: &str) -> Option<(&'a Vec<String>, Option<&'a str>)> {
    tables
        .iter()
        .filter(|t| t.header[0] == "Flag")
        .find_map(|t| {
            let default = t.header.iter().position(|h| h == "Default");
            let names_end = default.unwrap_or(1);
            t.rows
                .iter()
                .find(|row| row.iter().take(names_end).any(|c| has_code(c, token)))
                .map(|row| (row, default.and_then(|i| row.get(i)).map(String::as_str)))
        })
}

/// Aliases in the flag definitions (`visible_alias = "a"`, and any clap
/// does not print), per source file, with the doc their command's flags
/// live in.
fn hidden_aliases() -> Vec<(String, &'static str, String)> {
    let mut out = Vec::new();
    let mut files = vec![root().join("crates/ferry/src")];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let rel = path.strip_prefix(root()).unwrap().display().to_string();
        let doc = if rel.contains("/link/") {
            "docs/link.md"
        } else if rel.ends_with("/udp_relay.rs") {
            "docs/udp-relay.md"
        } else {
            "docs/operating.md"
        };
        let text = std::fs::read_to_string(&path).unwrap();
        // `alias = "x"`, `visible_alias = "x"`, `aliases = ["x", "y"]`, in
        // attributes that may span lines.
        for part in text.split("alias").skip(1) {
            let part = part.strip_prefix("es").unwrap_or(part);
            let Some(value) = part.trim_start().strip_prefix('=') else {
                continue;
            };
            let value = value.trim_start();
            let list = match value.strip_prefix('[') {
                Some(list) => &list[..list.find(']').unwrap()],
                None => value.split([',', ')']).next().unwrap(),
            };
            for name in list.split(',').map(|s| s.trim().trim_matches('"')) {
                if !name.is_empty() {
                    out.push((format!("--{name}"), doc, rel.clone()));
                }
            }
        }
    }
    assert!(
        out.iter().any(|(n, _, _)| n == "--a"),
        "no alias found in crates/ferry/src: the scan is broken ({out:?})"
    );
    out
}

/// derper's flags that `ferry` refuses by name (parsed before clap, so the
/// help does not list them): the `name: "…"` entries of
/// `UNSUPPORTED_DERPER_FLAGS` in `cmd/derp/derper.rs`.
fn unsupported_derper_flags() -> Vec<String> {
    let cli = read("crates/ferry/src/cmd/derp/derper.rs");
    let start = cli
        .find("UNSUPPORTED_DERPER_FLAGS")
        .expect("derper.rs names UNSUPPORTED_DERPER_FLAGS");
    let body = &cli[start..];
    let body = &body[..body.find("];").expect("the table ends")];
    let names: Vec<String> = body
        .split("name: \"")
        .skip(1)
        .map(|s| format!("--{}", s.split('"').next().unwrap()))
        .collect();
    assert!(names.len() >= 3, "too few derper flags found: {names:?}");
    names
}

#[test]
fn every_flag_of_the_help_has_a_row_in_its_doc() {
    let mut missing = Vec::new();
    let mut seen = 0;
    for (command, doc, tables, flags) in commands() {
        for flag in flags {
            for name in &flag.names {
                seen += 1;
                if documented(&tables, name).is_none() {
                    missing.push(format!("{command} {name}: no row in {doc}"));
                }
            }
        }
    }
    for (alias, doc, file) in hidden_aliases() {
        if documented(&tables(&read(doc)), &alias).is_none() {
            missing.push(format!("{alias} (an alias in {file}): no row in {doc}"));
        }
    }
    let operating = read("docs/operating.md");
    for name in unsupported_derper_flags() {
        if !operating.contains(&format!("`{name}`")) {
            missing.push(format!(
                "derper's {name}, refused by ferry: not in docs/operating.md"
            ));
        }
    }
    // Sanity: the parser found the flags (the DERP server alone has over 40).
    assert!(seen > 60, "only {seen} flags found in the help texts");
    assert!(
        missing.is_empty(),
        "flags without documentation:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_subcommand_is_named_in_the_docs() {
    let mut docs = read("README.md");
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push_str(&std::fs::read_to_string(path).unwrap());
        }
    }
    let mut missing = Vec::new();
    let mut seen = 0;
    for prefix in [&[][..], &["link"][..]] {
        for command in help_commands(&help(prefix)) {
            seen += 1;
            let words: Vec<&str> = prefix.iter().copied().chain([command.as_str()]).collect();
            let named = format!("`ferry {}", words.join(" "));
            if !docs.contains(&named) {
                missing.push(named);
            }
        }
    }
    assert!(seen >= 6, "only {seen} subcommands found");
    assert!(missing.is_empty(), "subcommands no doc names: {missing:?}");
}

#[test]
fn defaults_in_the_docs_are_the_ones_the_help_prints() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (_, doc, tables, flags) in commands() {
        for flag in flags {
            let (Some(default), Some(name)) = (&flag.default, flag.names.last()) else {
                continue;
            };
            checked += 1;
            match documented(&tables, name) {
                Some((_, Some(cell))) if has_code(cell, default) => {}
                Some((row, _)) => wrong.push(format!(
                    "{doc}: {name}: the help says the default is `{default}`, the row says {row:?}"
                )),
                None => wrong.push(format!("{doc}: {name}: no row")),
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} defaults found in the help texts"
    );
    assert!(
        wrong.is_empty(),
        "defaults that differ:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn udp_relay_defaults_in_the_doc_are_the_configurations() {
    use ferry_udp::config::Config;
    let c = Config::from_toml(
        "defaults.toml",
        r#"
[[bounce]]
listen = ["127.0.0.1:5000"]
target = "127.0.0.1:5001"

[hub]
listen = ["127.0.0.1:5002"]
[[hub.peer]]
public_key = "QJcvjTS0st3gR6WLSR9Rytg2QjCqcj+5hws4jAMiE1I="
[[hub.peer]]
public_key = "2U8lQNjeBL0yOxqE5T323qgIdDE7NgTDB370HDIKG0s="
"#,
    )
    .unwrap();
    let (b, h, t) = (&c.bounce[0], c.hub.as_ref().unwrap(), &c.tuning);
    let tables = tables(&read("docs/udp-relay.md"));
    let default = |token: &str| -> String {
        let (row, cell) = documented(&tables, token)
            .unwrap_or_else(|| panic!("docs/udp-relay.md: no row for {token}"));
        let cell = cell.unwrap_or_else(|| panic!("{token}: no Default column: {row:?}"));
        cell.split('`')
            .nth(1)
            .unwrap_or_else(|| panic!("{token}: the default is not in backticks: {cell}"))
            .to_string()
    };
    let duration = |token: &str| {
        let text = default(token);
        ferry_proto::godur::parse(&text).unwrap_or_else(|| panic!("{token}: {text} is no duration"))
    };
    let number = |token: &str| -> u64 {
        let text = default(token);
        text.parse()
            .unwrap_or_else(|_| panic!("{token}: {text} is no number"))
    };
    let boolean = |token: &str| -> bool {
        let text = default(token);
        text.parse()
            .unwrap_or_else(|_| panic!("{token}: {text} is no boolean"))
    };
    assert_eq!(duration("--idle-timeout"), b.idle_timeout);
    assert_eq!(duration("--resolve-interval"), b.resolve_interval);
    assert_eq!(boolean("--wireguard-only"), b.wireguard_only);
    assert_eq!(number("--max-sessions"), b.max_sessions as u64);
    assert_eq!(number("hub.max_indices"), h.max_indices as u64);
    assert_eq!(number("--workers"), t.workers as u64);
    assert_eq!(boolean("--pin"), t.pin);
    assert_eq!(boolean("--gro"), t.gro);
    assert_eq!(boolean("--gso"), t.gso);
    assert_eq!(number("--recv-buffer"), t.recv_buffer as u64);
    assert_eq!(number("--send-buffer"), t.send_buffer as u64);
    assert_eq!(number("--handshake-rate"), u64::from(t.handshake_rate));
    assert_eq!(number("--handshake-burst"), u64::from(t.handshake_burst));
}

/// Files whose links are checked: the README, `docs/`, and `bench/`'s
/// READMEs and journal.
/// Every file under the workspace root except build output, Git's own
/// directory and downloaded binaries.
fn repository_text_files() -> Vec<PathBuf> {
    const SKIP: &[&str] = &[".git", "target", "corpus", "artifacts"];
    const DOWNLOADS: &[&str] = &["interop/bin", "bench/bin", "fuzz/coverage"];
    let mut out = Vec::new();
    let mut dirs = vec![root()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = entry.file_name();
            let file_type = entry.file_type().unwrap();
            if file_type.is_dir() {
                let downloads = DOWNLOADS.iter().any(|d| path.ends_with(d));
                if !downloads && !SKIP.iter().any(|s| name == *s) {
                    dirs.push(path);
                }
            } else if file_type.is_file() && name != "Cargo.lock" && name != "go.sum" {
                out.push(path);
            }
        }
    }
    out
}

fn linked_docs() -> Vec<PathBuf> {
    let mut out = vec![
        root().join("README.md"),
        root().join("bench/README.md"),
        root().join("bench/JOURNAL.md"),
    ];
    for dir in ["docs", "bench"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") && !out.contains(&path) {
                out.push(path);
            } else if path.join("README.md").is_file() {
                out.push(path.join("README.md"));
            }
        }
    }
    out
}

/// GitHub's anchors for a markdown text's headings.
fn anchors(md: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in unfenced(md).into_iter().filter(|l| l.starts_with('#')) {
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 1;
        while out.contains(&unique) {
            unique = format!("{slug}-{n}");
            n += 1;
        }
        out.insert(unique);
    }
    out
}

/// The targets of a markdown text's inline links and images, outside
/// fenced code blocks.
fn link_targets(md: &str) -> Vec<String> {
    unfenced(md)
        .into_iter()
        .flat_map(|line| line.split("](").skip(1))
        .filter_map(|part| part.find(')').map(|end| part[..end].to_string()))
        .collect()
}

#[test]
fn relative_links_point_at_what_exists() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in linked_docs() {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let Ok(dest) = dest.canonicalize() else {
                broken.push(format!("{rel}: ({target}): no such file"));
                continue;
            };
            if let Some(anchor) = anchor {
                if dest.extension().is_some_and(|e| e == "md") {
                    let heads = anchors(&std::fs::read_to_string(&dest).unwrap());
                    if !heads.contains(anchor) {
                        broken.push(format!("{rel}: ({target}): no heading #{anchor}"));
                    }
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Hex digits of `s`, ignoring white space, `|` and `\`.
fn unhex(s: &str) -> Vec<u8> {
    let digits: String = s
        .chars()
        .filter(|c| !c.is_whitespace() && !matches!(c, '|' | '\\'))
        .collect();
    assert!(
        digits.len().is_multiple_of(2) && digits.chars().all(|c| c.is_ascii_hexdigit()),
        "not hex: {s:?}"
    );
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

/// The text of one `### N.M` section of a markdown text.
fn section<'a>(md: &'a str, number: &str) -> &'a str {
    let head = format!("\n### {number} ");
    let start = md
        .find(&head)
        .unwrap_or_else(|| panic!("no section {number}"))
        + 1;
    let rest = &md[start..];
    let end = rest[1..].find("\n#").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// The code span of the table row whose first cell is `name`.
fn vector<'a>(tables: &'a [Table], name: &str) -> &'a str {
    let row = tables
        .iter()
        .flat_map(|t| &t.rows)
        .find(|r| r[0] == name)
        .unwrap_or_else(|| panic!("no vector {name:?}"));
    row[1].trim_matches('`')
}

/// The hex of the fenced block lines that follow `marker` in `text`,
/// skipping words that are not hex (labels such as `nonce`).
fn block_after(text: &str, marker: &str) -> Vec<u8> {
    let from = text.find(marker).unwrap_or_else(|| panic!("no {marker:?}"));
    let block = text[from..].split("```").nth(1).unwrap();
    let hex: Vec<&str> = block
        .split_whitespace()
        .filter(|w| {
            w.len() > 1 && w.len().is_multiple_of(2) && w.chars().all(|c| c.is_ascii_hexdigit())
        })
        .collect();
    unhex(&hex.join(""))
}

#[test]
fn the_protocol_notes_vectors_are_the_codes() {
    let doc = read("docs/derp-protocol.md");
    let t = tables(section(&doc, "17.1"));
    let key = |name: &str| vector(&t, name).to_string();
    let private = |name: &str| -> NodePrivate { format!("privkey:{}", key(name)).parse().unwrap() };
    let (server, client, peer) = (
        private("server private"),
        private("client private"),
        private("peer private"),
    );
    assert_eq!(server.public().to_hex(), key("server public `S`"));
    assert_eq!(client.public().to_hex(), key("client public `C`"));
    assert_eq!(peer.public().to_hex(), key("peer public `P`"));
    let (s, c, p) = (server.public(), client.public(), peer.public());

    let t = tables(section(&doc, "17.2"));
    let built = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut out = Vec::new();
        f(&mut out);
        out
    };
    let ping = [1, 2, 3, 4, 5, 6, 7, 8];
    for (name, bytes) in [
        ("keepAlive", built(&|o| frame::put_keepalive(o))),
        (
            "notePreferred(true)",
            built(&|o| frame::put_note_preferred(o, true)),
        ),
        (
            "notePreferred(false)",
            built(&|o| frame::put_note_preferred(o, false)),
        ),
        ("watchConns", built(&|o| frame::put_watch_conns(o))),
        (
            "ping `0102030405060708`",
            built(&|o| frame::put_ping(o, &ping)),
        ),
        (
            "pong `0102030405060708`",
            built(&|o| frame::put_pong(o, &ping)),
        ),
        ("health \"BAD\"", built(&|o| frame::put_health(o, "BAD"))),
        ("health cleared", built(&|o| frame::put_health(o, ""))),
        (
            "restarting 2,500 ms / 10,000 ms",
            built(&|o| frame::put_restarting(o, 2500, 10_000)),
        ),
    ] {
        assert_eq!(unhex(vector(&t, name)), bytes, "§17.2 {name}");
    }

    let s173 = section(&doc, "17.3");
    assert_eq!(
        block_after(s173, "serverKey"),
        ferry_proto::handshake::server_key_frame(&s).to_vec(),
        "§17.3 serverKey"
    );
    let info = ferry_proto::handshake::ClientInfo {
        version: 2,
        can_ack_pings: true,
        ..Default::default()
    };
    let nonce: [u8; 24] = std::array::from_fn(|i| i as u8);
    assert_eq!(
        block_after(s173, "clientInfo with"),
        ferry_proto::handshake::seal_client_info(&client, &s, &info, &nonce),
        "§17.3 clientInfo"
    );
    let info = ferry_proto::handshake::ServerInfo {
        version: 2,
        ..Default::default()
    };
    let nonce: [u8; 24] = std::array::from_fn(|i| 0xa0 + i as u8);
    assert_eq!(
        block_after(s173, "serverInfo with"),
        ferry_proto::handshake::seal_server_info(&server, &c, &info, &nonce),
        "§17.3 serverInfo"
    );

    let s174 = section(&doc, "17.4");
    let line = |name: &str| -> Vec<u8> {
        let l = s174
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("§17.4: no line {name:?}"));
        unhex(&l[name.len()..])
    };
    let hello = b"hello";
    let addr = |s: &str| Some(s.parse().unwrap());
    for (name, bytes) in [
        (
            "sendPacket C->P \"hello\"",
            built(&|o| frame::put_send_packet(o, &p, hello)),
        ),
        (
            "recvPacket at P from C \"hello\"",
            built(&|o| frame::put_recv_packet(o, &c, hello)),
        ),
        (
            "forwardPacket C->P \"hello\"",
            built(&|o| frame::put_forward_packet(o, &c, &p, hello)),
        ),
        (
            "peerGone C, disconnected",
            built(&|o| frame::put_peer_gone(o, &c, PeerGoneReason::Disconnected)),
        ),
        (
            "peerGone P, not here",
            built(&|o| frame::put_peer_gone(o, &p, PeerGoneReason::NotHere)),
        ),
        (
            "peerPresent C 198.51.100.23:41641, regular",
            built(&|o| {
                frame::put_peer_present(
                    o,
                    &c,
                    addr("198.51.100.23:41641"),
                    frame::PEER_PRESENT_IS_REGULAR,
                    "",
                )
            }),
        ),
        (
            "peerPresent C 198.51.100.23:41641, regular, app \"ferry\"",
            built(&|o| {
                frame::put_peer_present(
                    o,
                    &c,
                    addr("198.51.100.23:41641"),
                    frame::PEER_PRESENT_IS_REGULAR,
                    "ferry",
                )
            }),
        ),
        (
            "peerPresent P [2001:db8::2]:443, mesh peer",
            built(&|o| {
                frame::put_peer_present(
                    o,
                    &p,
                    addr("[2001:db8::2]:443"),
                    frame::PEER_PRESENT_IS_MESH_PEER,
                    "",
                )
            }),
        ),
        ("closePeer P", built(&|o| frame::put_close_peer(o, &p))),
    ] {
        assert_eq!(line(name), bytes, "§17.4 {name}");
    }

    let t = tables(section(&doc, "17.6"));
    let txid: [u8; 12] = std::array::from_fn(|i| 0x10 + i as u8);
    assert_eq!(
        unhex(vector(&t, "Tailscale's Binding Request (40)")),
        ferry_proto::stun::binding_request(&txid).to_vec()
    );
    for (name, at) in [
        (
            "answer for 203.0.113.7:41641, family 01 (32)",
            "203.0.113.7:41641",
        ),
        ("answer for [2001:db8::1]:41641 (44)", "[2001:db8::1]:41641"),
    ] {
        let mut out = [0; ferry_proto::stun::MAX_RESPONSE_LEN];
        let n = ferry_proto::stun::write_binding_response(&txid, at.parse().unwrap(), &mut out);
        assert_eq!(unhex(vector(&t, name)), out[..n].to_vec(), "§17.6 {name}");
    }

    use ferry_proto::udp_header::{Header, Protocol};
    let t = tables(section(&doc, "17.7"));
    for (name, header) in [
        ("control, disco, VNI 1", Header::bind(1)),
        (
            "data, WireGuard, VNI 0x123456",
            Header::data(Protocol::Payload, 0x12_3456),
        ),
        ("data, disco, VNI 1", Header::data(Protocol::Control, 1)),
    ] {
        assert_eq!(
            unhex(vector(&t, name)),
            header.to_bytes().to_vec(),
            "§17.7 {name}"
        );
    }
}

/// Whether `docs/derp-protocol.md` has section `number` (`4`, `4.1`), or,
/// for `19.N`, item N of §19's list.
fn has_section(doc: &str, number: &str) -> bool {
    if let Some(item) = number.strip_prefix("19.") {
        let list = &doc[doc.find("\n## 19. ").unwrap()..];
        let list = &list[..list[1..].find("\n## ").map_or(list.len(), |i| i + 1)];
        return list.lines().any(|l| l.starts_with(&format!("{item}. ")));
    }
    let head = if number.contains('.') {
        format!("\n### {number} ")
    } else {
        format!("\n## {number}. ")
    };
    doc.contains(&head)
}

#[test]
fn code_citing_the_protocol_notes_cites_sections_that_exist() {
    let doc = read("docs/derp-protocol.md");
    let markers = ["protocol reference", "derp-protocol.md"];
    let mut files = vec![
        root().join("crates"),
        root().join("interop"),
        root().join("fuzz"),
        root().join("docs"),
    ];
    let mut bad = Vec::new();
    let mut cited = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            if !path.ends_with("target") && !path.ends_with("corpus") {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            }
            continue;
        }
        if !path
            .extension()
            .is_some_and(|e| ["rs", "go", "md"].contains(&e.to_str().unwrap()))
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let line = line.to_lowercase();
            let Some(at) = markers.iter().filter_map(|m| line.find(m)).min() else {
                continue;
            };
            // Every `§N` or `§N.M` after the marker on that line.
            for part in line[at..].split('§').skip(1) {
                let number: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect();
                let number = number.trim_end_matches('.');
                if number.is_empty() {
                    continue;
                }
                cited += 1;
                if !has_section(&doc, number) {
                    let rel = path.strip_prefix(root()).unwrap().display();
                    bad.push(format!("{rel}:{}: §{number}", n + 1));
                }
            }
        }
    }
    assert!(cited >= 9, "only {cited} citations found");
    assert!(
        bad.is_empty(),
        "citations of sections docs/derp-protocol.md lacks:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_protocol_notes_derp_map_is_the_fuzz_seed() {
    let doc = read("docs/derp-protocol.md");
    let s15 = &doc[doc.find("\n## 15. ").expect("§15")..];
    let json = s15
        .split("```json\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let seed = read("fuzz/corpus/derp_map/section15_example.json");
    assert_eq!(
        json.trim(),
        seed.trim(),
        "§15's example and the derp_map seed differ"
    );
    let map =
        ferry_proto::derp_map::DerpMap::from_json(json.as_bytes()).expect("§15's example parses");
    assert!(format!("{map:?}").contains("derp.example.com"), "{map:?}");
}

/// The text of `md` from the heading line `heading` to the next heading
/// of the same or a higher level.
fn heading_section<'a>(md: &'a str, heading: &str) -> &'a str {
    let start = md
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    let level = heading.split(' ').next().unwrap();
    let body = &md[start + heading.len() + 2..];
    let end = body
        .lines()
        .filter(|l| l.starts_with('#'))
        .find(|l| l.split(' ').next().is_some_and(|h| h.len() <= level.len()))
        .and_then(|l| body.find(&format!("\n{l}\n")))
        .unwrap_or(body.len());
    &body[..end]
}

#[test]
fn the_run_section_says_what_the_first_build_takes_and_where_the_map_goes() {
    let readme = read("README.md");
    let run = heading_section(&readme, "## Run it");
    assert!(run.contains("first build"), "{run}");
    assert!(
        run.contains("docs/operating.md#handing-the-derp-map-to-tailscaled"),
        "{run}"
    );
    // The lower-case field names said to be Headscale's YAML names are
    // the printed map's keys.
    let ops = read("docs/operating.md");
    let handing = heading_section(&ops, "### Handing the DERP map to tailscaled");
    let banner = read("crates/ferry/src/cmd/derp/banner.rs").to_lowercase();
    for name in [
        "regions", "regionid", "nodes", "hostname", "ipv4", "derpport", "stunport",
    ] {
        assert!(
            handing.contains(&format!("`{name}`")),
            "{name} in {handing}"
        );
        assert!(
            banner.contains(&format!("\"{name}\"")),
            "the printed map has no key {name}"
        );
    }
}

#[test]
fn the_readme_stays_short() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; keep it under 200 and move detail into docs/"
    );
}

#[test]
fn no_file_cites_an_issue_number() {
    // Every text file of the repository: docs, code, scripts, stored
    // results. Describe the behaviour instead of pointing at a tracker.
    let mut found = Vec::new();
    let files = repository_text_files();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("crates/bench/src/bin/udp_gen.rs")),
        "the walk found no source files"
    );
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue; // not UTF-8 text (fuzz seeds, images)
        };
        let lower = text.to_lowercase();
        for (i, _) in lower.match_indices("issue") {
            let after = lower[i + "issue".len()..].trim_start_matches(['s', ' ', '-', '#']);
            if after.starts_with(|c: char| c.is_ascii_digit()) {
                let line = text[..i].lines().count();
                found.push(format!(
                    "{}:{line}",
                    file.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "issue numbers cited (describe the behaviour instead): {found:?}"
    );
}

#[test]
fn the_help_parser_reads_clap_output() {
    // What the other tests rely on, shown on a fixed text: names, aliases
    // on the flag line, defaults, possible values, and the end of a block.
    let text = "Usage: x\n\nOptions:\n  -a, --a <ADDR>\n          Listen [default: :443]\n      --dev [<DEV>]\n          Dev [default: false] [possible values: true, false]\n      --kind <KIND>\n          Which\n\n          Possible values:\n          - auto:      Decide\n\n          [default: auto]\n      --json               One object\n  -h, --help\n          Print help\n";
    let flags = help_flags(text);
    let got: Vec<(Vec<String>, Option<String>)> =
        flags.into_iter().map(|f| (f.names, f.default)).collect();
    let want = vec![
        (
            vec!["-a".to_string(), "--a".to_string()],
            Some(":443".to_string()),
        ),
        (vec!["--dev".to_string()], Some("false".to_string())),
        (vec!["--kind".to_string()], Some("auto".to_string())),
        (vec!["--json".to_string()], None),
    ];
    assert_eq!(got, want);
}
