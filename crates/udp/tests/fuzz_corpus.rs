//! Replays the `hub` and `sessions` fuzz corpora through
//! `ferry_udp::fuzzing`, then a
//! bounded number of mutated seeds and random operation sequences (from a
//! fixed seed, so a failure reproduces), so the ordinary test suite catches
//! regressions the fuzzer would.

#[path = "../../proto/tests/corpus/mod.rs"]
mod corpus;

use ferry_udp::fuzzing;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn replay_corpora() {
    for (target, run) in [
        ("hub", fuzzing::hub as fn(&[u8])),
        ("sessions", fuzzing::sessions),
    ] {
        for (name, data) in corpus::seeds(target) {
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(
                outcome.is_ok(),
                "fuzz target {target} panicked on corpus file {name}"
            );
        }
    }
}

#[test]
fn mutated_and_random_hub_inputs() {
    mutate("hub", fuzzing::hub, 0x4855_4246);
}

#[test]
fn mutated_and_random_sessions_inputs() {
    mutate("sessions", fuzzing::sessions, 0x5345_5353);
}

fn mutate(target: &str, run: fn(&[u8]), seed: u64) {
    let seeds: Vec<Vec<u8>> = corpus::seeds(target).into_iter().map(|(_, d)| d).collect();
    let mut rng = StdRng::seed_from_u64(seed);
    for case in 0..1000 {
        let mut data = if case % 4 == 3 {
            // Random operations: a configuration byte and up to 200 ops.
            let ops = rng.gen_range(0..200) * 4;
            (0..=ops).map(|_| rng.gen()).collect()
        } else {
            seeds[rng.gen_range(0..seeds.len())].clone()
        };
        for _ in 0..rng.gen_range(1..8) {
            let len = data.len();
            match rng.gen_range(0..4) {
                // Change a byte.
                0 if len > 0 => data[rng.gen_range(0..len)] = rng.gen(),
                // Splice in a run of operations from another seed.
                1 => {
                    let other = &seeds[rng.gen_range(0..seeds.len())];
                    let from = 1 + 4 * rng.gen_range(0..other.len().max(1) / 4);
                    let at = (1 + 4 * rng.gen_range(0..len.max(1) / 4 + 1)).min(len);
                    let run = other.get(from..(from + 16).min(other.len())).unwrap_or(&[]);
                    data.splice(at..at, run.iter().copied());
                }
                // Drop an operation.
                2 if len > 5 => {
                    let at = 1 + 4 * rng.gen_range(0..(len - 1) / 4);
                    data.drain(at..(at + 4).min(len));
                }
                // Another configuration.
                _ if len > 0 => data[0] = rng.gen(),
                _ => {}
            }
        }
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(
            outcome.is_ok(),
            "case {case}: {target} panicked on {data:02x?}"
        );
    }
}
