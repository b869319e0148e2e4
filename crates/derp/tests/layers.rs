//! The crate's layer rules, read from its sources: the settings are a
//! leaf, the transport knows no connection or shard, and a connection
//! knows no shard. Each rule names the file and line that breaks it.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`, in a stable order.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    assert!(!out.is_empty(), "no sources below {}", dir.display());
    out
}

/// The sources of a module: `src/<name>.rs` and/or `src/<name>/`.
fn module(name: &str) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let file = src.join(format!("{name}.rs"));
    if file.exists() {
        files.push(file);
    }
    let dir = src.join(name);
    if dir.is_dir() {
        files.extend(sources(&dir));
    }
    assert!(
        !files.is_empty(),
        "module {name} not found in {}",
        src.display()
    );
    files
}

/// A line without its `//` comment (doc comments included).
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |i| &line[..i])
}

/// The first-level names a path starting at `rest` (just after `crate::`
/// or a chain of `super::`) reaches: `conn` for `conn::Conn`, `conn` and
/// `metrics` for `{conn::Conn, metrics}`.
fn first_names(rest: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = rest.trim_start().strip_prefix('{') else {
        return vec![ident(rest)];
    };
    let mut names = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                names.push(ident(&group[start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                names.push(ident(&group[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    names
}

/// Where `files` name a module of `banned` through `crate::` or `super::`
/// (a `use` group may span lines), as `file:line: text`.
fn naming(files: &[PathBuf], banned: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let lines: Vec<&str> = text.lines().map(code).collect();
        let joined = lines.join("\n");
        for prefix in ["crate::", "super::"] {
            for (at, _) in joined.match_indices(prefix) {
                if joined[..at].ends_with("super::") {
                    continue; // the rest of a chain already read
                }
                let mut rest = &joined[at + prefix.len()..];
                while let Some(r) = rest.strip_prefix("super::") {
                    rest = r;
                }
                if first_names(rest)
                    .iter()
                    .any(|n| banned.contains(&n.as_str()))
                {
                    let line = joined[..at].matches('\n').count();
                    found.push(format!(
                        "{}:{}: {}",
                        file.display(),
                        line + 1,
                        lines[line].trim()
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn config_names_nothing_of_the_crate() {
    let mut found = Vec::new();
    for file in module("config") {
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (n, line) in text.lines().enumerate() {
            if line.contains("crate::") {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "config must be a leaf (no `crate::`, not even in docs):\n{}",
        found.join("\n")
    );
}

#[test]
fn transport_names_neither_conn_nor_shard() {
    let found = naming(&module("transport"), &["conn", "shard"]);
    assert!(
        found.is_empty(),
        "the transport is below the connection and the shard:\n{}",
        found.join("\n")
    );
}

#[test]
fn conn_names_no_shard() {
    let found = naming(&module("conn"), &["shard"]);
    assert!(
        found.is_empty(),
        "a connection is below the shard:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_path_reader_sees_groups_and_super_chains() {
    assert_eq!(first_names("conn::Conn;"), ["conn"]);
    assert_eq!(
        first_names("{metrics::X, shard::{A, B}, conn};"),
        ["metrics", "shard", "conn"]
    );
    let dir = std::env::temp_dir().join(format!("ferry-layers-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join("probe.rs");
    fs::write(
        &file,
        "// crate::shard in a comment is fine\nuse crate::{\n    metrics,\n    shard::Shared,\n};\nuse super::super::conn::Conn;\nuse super::handoff;\n",
    )
    .unwrap();
    let found = naming(std::slice::from_ref(&file), &["conn", "shard"]);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].ends_with(":2: use crate::{"), "{found:?}");
    assert!(
        found[1].ends_with(":6: use super::super::conn::Conn;"),
        "{found:?}"
    );
}
