//! The committed fuzz corpora (`fuzz/corpus/<target>/`), replayed by the
//! tests of every crate with a fuzz target, with bounded mutations of
//! their seeds, so the ordinary suite catches what the fuzzers would.

use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    crate::workspace_root().join("fuzz/corpus").join(target)
}

/// Every file of a target's corpus, sorted by name. Panics if the directory
/// is missing or empty: a corpus that silently vanished would make the
/// replay test pass vacuously.
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
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

/// Runs `run` over every seed of `target`; a panic names the seed.
pub fn replay(target: &str, run: fn(&[u8])) {
    for (name, data) in seeds(target) {
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(
            outcome.is_ok(),
            "fuzz target {target} panicked on corpus file {name}"
        );
    }
}

/// A small deterministic generator (splitmix64) for the mutations, so
/// that a failing case reproduces from its number.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// Runs `run` over `cases` inputs that a fuzzer's first rounds would make
/// of the seeds of a stateful target: `prefix` header bytes, then 4-byte
/// operations. Each case is a seed (or, one case in four, random
/// operations) with a few changes: a byte changed, a run of operations
/// spliced in from another seed, an operation dropped, another header.
pub fn mutate_ops(target: &str, run: fn(&[u8]), seed: u64, cases: usize, prefix: usize) {
    let seeds: Vec<Vec<u8>> = seeds(target).into_iter().map(|(_, d)| d).collect();
    let mut rng = Rng(seed);
    for case in 0..cases {
        let mut data = if case % 4 == 3 {
            let len = prefix + 4 * rng.below(200);
            (0..len).map(|_| rng.byte()).collect()
        } else {
            seeds[rng.below(seeds.len())].clone()
        };
        for _ in 0..1 + rng.below(7) {
            let len = data.len();
            let ops = len.saturating_sub(prefix) / 4;
            match rng.below(4) {
                0 if len > 0 => data[rng.below(len)] = rng.byte(),
                1 => {
                    let other = &seeds[rng.below(seeds.len())];
                    let from = (prefix + 4 * rng.below(other.len() / 4 + 1)).min(other.len());
                    let at = (prefix + 4 * rng.below(ops + 1)).min(len);
                    let ops = &other[from..(from + 16).min(other.len())];
                    data.splice(at..at, ops.iter().copied());
                }
                2 if ops > 0 => {
                    let at = prefix + 4 * rng.below(ops);
                    data.drain(at..(at + 4).min(len));
                }
                _ if prefix > 0 && len >= prefix => data[rng.below(prefix)] = rng.byte(),
                _ => {}
            }
        }
        check(target, run, case, &data);
    }
}

/// Runs `run` over `cases` byte-level mutations of the seeds: bytes
/// changed, inserted and removed, and runs spliced in from another seed.
pub fn mutate_bytes(target: &str, run: fn(&[u8]), seed: u64, cases: usize) {
    let seeds: Vec<Vec<u8>> = seeds(target).into_iter().map(|(_, d)| d).collect();
    let mut rng = Rng(seed);
    for case in 0..cases {
        let mut data = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(5) {
            let len = data.len();
            match rng.below(4) {
                0 if len > 0 => data[rng.below(len)] = rng.byte(),
                1 => data.insert(rng.below(len + 1), rng.byte()),
                2 if len > 1 => {
                    let at = rng.below(len);
                    let n = 1 + rng.below((len - at).min(16));
                    data.drain(at..at + n);
                }
                _ => {
                    let other = &seeds[rng.below(seeds.len())];
                    let from = rng.below(other.len() + 1);
                    let bytes = &other[from..(from + 32).min(other.len())];
                    let at = rng.below(len + 1);
                    data.splice(at..at, bytes.iter().copied());
                }
            }
        }
        check(target, run, case, &data);
    }
}

fn check(target: &str, run: fn(&[u8]), case: usize, data: &[u8]) {
    let outcome = std::panic::catch_unwind(|| run(data));
    assert!(
        outcome.is_ok(),
        "case {case}: {target} panicked on {} bytes: {:02x?}",
        data.len(),
        &data[..data.len().min(1024)]
    );
}
