//! The committed fuzz corpora (`fuzz/corpus/<target>/`), for the replay
//! tests of every crate with a fuzz target (included by `#[path]`).

use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Every file of a target's corpus, sorted by name. Panics if the directory
/// is missing or empty: a corpus that silently vanished would make the
/// replay test pass vacuously.
pub(crate) fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus directory {} missing: {e}", dir.display()));
    let mut files: Vec<(String, Vec<u8>)> = entries
        .map(|e| e.expect("readable corpus entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let data = std::fs::read(&p).expect("readable corpus file");
            (name, data)
        })
        .collect();
    assert!(
        !files.is_empty(),
        "corpus directory {} is empty",
        dir.display()
    );
    files.sort();
    files
}
