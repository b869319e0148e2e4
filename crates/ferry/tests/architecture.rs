//! `docs/architecture.md` against the code it describes:
//!
//! - its crate table lists every crate under `crates/`, and the Ferry
//!   crates each one may depend on are exactly those of its `Cargo.toml`
//!   (normal dependencies; dev-dependencies are free);
//! - (the DERP crate's layer rules are checked by its own
//!   `tests/layers.rs`);
//! - every module, type and file the page names exists, so a rename that
//!   forgets the page fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ferry_testkit::{repo_file, workspace_root as root};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn page() -> String {
    repo_file("docs/architecture.md")
}

/// The cells of the markdown table row `line`, trimmed.
fn cells(line: &str) -> Vec<String> {
    let t = line.trim();
    let t = t.strip_prefix('|').unwrap_or(t);
    let t = t.strip_suffix('|').unwrap_or(t);
    t.split('|').map(|c| c.trim().to_owned()).collect()
}

/// The rows of the table whose header row starts with `first_header`.
fn table(md: &str, first_header: &str) -> Vec<Vec<String>> {
    let mut lines = md.lines().skip_while(|l| {
        !(l.trim_start().starts_with('|') && cells(l).first().is_some_and(|c| c == first_header))
    });
    assert!(
        lines.next().is_some(),
        "no table starting with a {first_header:?} column"
    );
    lines
        .skip(1) // the |---| row
        .take_while(|l| l.trim_start().starts_with('|'))
        .map(cells)
        .collect()
}

/// Every `code span` of `text`.
fn code_spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The `ferry-*` names in the `[dependencies]` section of a manifest.
fn normal_ferry_deps(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if inside && line.starts_with("ferry") {
            let name = line
                .split(|c: char| c == '=' || c == '.' || c.is_whitespace())
                .next()
                .unwrap();
            out.insert(name.to_owned());
        }
    }
    out
}

#[test]
fn the_crate_table_is_the_manifests() {
    let rows = table(&page(), "Crate");
    let mut listed = BTreeSet::new();
    for row in &rows {
        let name = code_spans(&row[0])
            .into_iter()
            .next()
            .expect("a crate name in code");
        let dir = code_spans(&row[1])
            .into_iter()
            .next()
            .expect("a directory in code");
        let manifest = read(&root().join(&dir).join("Cargo.toml"));
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{dir}/Cargo.toml is not the crate {name}"
        );
        let documented: BTreeSet<String> = if row[3] == "none" {
            BTreeSet::new()
        } else {
            code_spans(&row[3]).into_iter().collect()
        };
        assert_eq!(
            documented,
            normal_ferry_deps(&manifest),
            "docs/architecture.md's dependencies of {name} differ from {dir}/Cargo.toml"
        );
        listed.insert(dir.trim_end_matches('/').to_owned());
    }
    let on_disk: BTreeSet<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| format!("crates/{}", e.file_name().to_string_lossy()))
        .collect();
    assert_eq!(
        listed, on_disk,
        "crates missing from (or extra in) docs/architecture.md"
    );
}

/// The file of module `segments` under `src`, if it exists.
fn module_file(src: &Path, segments: &[&str]) -> Option<PathBuf> {
    let mut dir = src.to_path_buf();
    let mut file = src.join("lib.rs");
    for s in segments {
        let flat = dir.join(format!("{s}.rs"));
        let nested = dir.join(s).join("mod.rs");
        file = if flat.exists() {
            flat
        } else if nested.exists() {
            nested
        } else {
            return None;
        };
        dir = dir.join(s);
    }
    Some(file)
}

/// Does `file` declare or re-export the public item `name`?
fn declares(file: &Path, name: &str) -> bool {
    let text = read(file);
    let has_word = |s: &str| {
        s.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == name)
    };
    // A declaration on its line, or a re-export that may span lines up to
    // its semicolon.
    text.lines().any(|l| {
        let l = l.trim_start();
        (l.starts_with("pub ") || l.starts_with("pub(crate) ")) && has_word(l)
    }) || text
        .match_indices("pub use ")
        .any(|(i, _)| has_word(text[i..].split(';').next().unwrap()))
}

#[test]
fn every_name_on_the_page_exists() {
    let md = page();
    let crates: Vec<(String, String)> = table(&md, "Crate")
        .iter()
        .map(|r| {
            let name = code_spans(&r[0]).remove(0).replace('-', "_");
            (name, code_spans(&r[1]).remove(0))
        })
        .collect();
    let mut checked = 0;
    for span in code_spans(&md) {
        if span.starts_with("crates/") || span.starts_with("docs/") || span.starts_with("bench/") {
            assert!(
                root().join(&span).exists(),
                "docs/architecture.md names {span}, which does not exist"
            );
            checked += 1;
            continue;
        }
        let mut parts = span.split("::");
        let first = parts.next().unwrap();
        let rest: Vec<&str> = parts.collect();
        let Some((_, dir)) = crates.iter().find(|(n, _)| n == first) else {
            continue;
        };
        if rest.is_empty() {
            continue;
        }
        let src = root().join(dir).join("src");
        // The longest prefix that is a module; what follows is one item.
        let modules = (0..=rest.len())
            .rev()
            .find(|&n| module_file(&src, &rest[..n]).is_some())
            .unwrap();
        let file = module_file(&src, &rest[..modules]).unwrap();
        match &rest[modules..] {
            [] => {}
            [item] => assert!(
                declares(&file, item),
                "docs/architecture.md names {span}: no public {item} in {}",
                file.display()
            ),
            more => panic!(
                "docs/architecture.md names {span}: no module {:?} in {dir}",
                more
            ),
        }
        checked += 1;
    }
    assert!(
        checked >= 20,
        "only {checked} names checked: the page's format changed?"
    );
}

/// No source file over 1,000 lines: a file that long holds more than one
/// concern, and the next change to it should split it.
#[test]
fn no_source_file_is_over_1000_lines() {
    const SKIP: &[&str] = &[".git", "target", "corpus", "artifacts"];
    // Downloaded programs and sources, and stored benchmark output.
    const NOT_OURS: &[&str] = &["interop/bin", "bench/bin", "bench/results"];
    const CODE: &[&str] = &["rs", "go", "py", "sh"];
    let mut long = Vec::new();
    let mut seen = 0;
    let mut dirs = vec![root()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                let not_ours = NOT_OURS.iter().any(|d| path.ends_with(d));
                if !not_ours && !SKIP.iter().any(|s| entry.file_name() == *s) {
                    dirs.push(path);
                }
            } else if path
                .extension()
                .is_some_and(|e| CODE.iter().any(|c| e == *c))
            {
                seen += 1;
                let lines = read(&path).lines().count();
                if lines > 1000 {
                    let rel = path.strip_prefix(root()).unwrap().display().to_string();
                    long.push(format!("{rel}: {lines} lines"));
                }
            }
        }
    }
    assert!(seen > 100, "the walk found only {seen} source files");
    assert!(long.is_empty(), "split these by concern: {long:?}");
}
