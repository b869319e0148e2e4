//! Replays the fuzz corpora through `ferry_proto::fuzzing`, and throws a
//! bounded number of mutated seeds and random inputs at each entry point, so
//! the ordinary test suite catches regressions the fuzzers would.

mod corpus;

use corpus::seeds;
use ferry_proto::fuzzing;
use proptest::prelude::*;
use std::sync::OnceLock;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 6] = [
    ("deframer", fuzzing::deframer),
    ("http_request", fuzzing::http_request),
    ("client_info", fuzzing::client_info),
    ("stun", fuzzing::stun),
    ("wireguard", fuzzing::wireguard),
    ("tls_record", fuzzing::tls_record),
];

#[test]
fn replay_corpora() {
    for (target, run) in TARGETS {
        for (name, data) in seeds(target) {
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(
                outcome.is_ok(),
                "fuzz target {target} panicked on corpus file {name}"
            );
        }
    }
}

fn all_seeds() -> &'static [Vec<Vec<u8>>; 6] {
    static SEEDS: OnceLock<[Vec<Vec<u8>>; 6]> = OnceLock::new();
    SEEDS.get_or_init(|| TARGETS.map(|(t, _)| seeds(t).into_iter().map(|(_, d)| d).collect()))
}

/// One edit applied to a seed.
#[derive(Debug, Clone)]
enum Edit {
    Flip {
        at: usize,
        mask: u8,
    },
    Set {
        at: usize,
        byte: u8,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Delete {
        at: usize,
        len: usize,
    },
    Truncate {
        at: usize,
    },
    Splice {
        at: usize,
        other: usize,
        from: usize,
    },
    Repeat {
        at: usize,
        len: usize,
        times: u8,
    },
}

fn edit() -> impl Strategy<Value = Edit> {
    let at = any::<usize>();
    prop_oneof![
        (at, 1u8..).prop_map(|(at, mask)| Edit::Flip { at, mask }),
        (
            at,
            prop_oneof![Just(0u8), Just(0xff), Just(0x7f), Just(0x80), any::<u8>()]
        )
            .prop_map(|(at, byte)| Edit::Set { at, byte }),
        (at, proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Edit::Insert { at, bytes }),
        (at, 1usize..32).prop_map(|(at, len)| Edit::Delete { at, len }),
        at.prop_map(|at| Edit::Truncate { at }),
        (at, any::<usize>(), any::<usize>()).prop_map(|(at, other, from)| Edit::Splice {
            at,
            other,
            from
        }),
        (at, 1usize..64, 2u8..8).prop_map(|(at, len, times)| Edit::Repeat { at, len, times }),
    ]
}

fn apply(data: &mut Vec<u8>, e: &Edit, pool: &[Vec<u8>]) {
    let pos = |at: usize, len: usize| if len == 0 { 0 } else { at % (len + 1) };
    match e {
        Edit::Flip { at, mask } if !data.is_empty() => {
            let i = at % data.len();
            data[i] ^= mask;
        }
        Edit::Set { at, byte } if !data.is_empty() => {
            let i = at % data.len();
            data[i] = *byte;
        }
        Edit::Insert { at, bytes } => {
            let i = pos(*at, data.len());
            data.splice(i..i, bytes.iter().copied());
        }
        Edit::Delete { at, len } if !data.is_empty() => {
            let i = at % data.len();
            let end = (i + len).min(data.len());
            data.drain(i..end);
        }
        Edit::Truncate { at } => data.truncate(pos(*at, data.len())),
        Edit::Splice { at, other, from } => {
            let src = &pool[other % pool.len()];
            let i = pos(*at, data.len());
            let f = pos(*from, src.len());
            data.truncate(i);
            data.extend_from_slice(&src[f..]);
        }
        Edit::Repeat { at, len, times } if !data.is_empty() => {
            let i = at % data.len();
            let end = (i + len).min(data.len());
            let chunk = data[i..end].to_vec();
            for _ in 1..*times {
                data.splice(end..end, chunk.iter().copied());
            }
        }
        _ => {}
    }
}

fn mutated(target: usize) -> impl Strategy<Value = Vec<u8>> {
    let pool = &all_seeds()[target];
    prop_oneof![
        4 => (0..pool.len(), proptest::collection::vec(edit(), 1..8)).prop_map(move |(i, edits)| {
            let mut data = pool[i].clone();
            for e in &edits {
                apply(&mut data, e, pool);
            }
            data
        }),
        1 => proptest::collection::vec(any::<u8>(), 0..512),
    ]
}

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: 1500,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn mutated_deframer(data in mutated(0)) {
        fuzzing::deframer(&data);
    }

    #[test]
    fn mutated_http_request(data in mutated(1)) {
        fuzzing::http_request(&data);
    }

    #[test]
    fn mutated_client_info(data in mutated(2)) {
        fuzzing::client_info(&data);
    }

    #[test]
    fn mutated_stun(data in mutated(3)) {
        fuzzing::stun(&data);
    }

    #[test]
    fn mutated_wireguard(data in mutated(4)) {
        fuzzing::wireguard(&data);
    }

    #[test]
    fn mutated_tls_record(data in mutated(5)) {
        fuzzing::tls_record(&data);
    }
}
