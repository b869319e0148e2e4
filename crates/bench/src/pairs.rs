//! Who sends to whom: the flows of a run.
//!
//! Peers are numbered from 0. By default `N` peers form `N/2` pairs, peer
//! `2i` sending to peer `2i+1` (and back, with `--bidirectional`). A pair
//! file gives any other pattern, one flow per line:
//!
//! ```text
//! # src dst   (peer indices; src sends to dst)
//! 0 1
//! 2 1        # fan-in: 0 and 2 both send to 1
//! 1 0
//! ```
//!
//! Blank lines and `#` comments are ignored. The run has `max index + 1`
//! peers; a peer named by no flow still connects and idles.

use std::collections::HashSet;
use thiserror::Error;

/// Most peers one pair file may name (indices are below this).
pub const MAX_PEERS: usize = 1_000_000;

/// One direction of traffic between two peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// Sending peer.
    pub src: usize,
    /// Receiving peer.
    pub dst: usize,
}

/// The peers of a run and the flows between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Number of peers (connections).
    pub peers: usize,
    /// Directed flows.
    pub flows: Vec<Flow>,
}

/// Why a pair file or a peer count was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TopologyError {
    /// A line is not two peer indices.
    #[error("{file}:{line}: expected `<src> <dst>` (two peer indices), found {text:?}")]
    Syntax {
        /// File name as given.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The offending line.
        text: String,
    },
    /// An index is out of range.
    #[error("{file}:{line}: peer index {index} is too large (limit {max})", max = MAX_PEERS - 1)]
    TooLarge {
        /// File name as given.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The index.
        index: u64,
    },
    /// A peer sends to itself.
    #[error("{file}:{line}: peer {peer} cannot send to itself")]
    SelfFlow {
        /// File name as given.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The peer.
        peer: usize,
    },
    /// The same flow twice.
    #[error("{file}:{line}: flow {src} -> {dst} is listed twice")]
    Duplicate {
        /// File name as given.
        file: String,
        /// 1-based line number.
        line: usize,
        /// Sender.
        src: usize,
        /// Receiver.
        dst: usize,
    },
    /// No flows at all.
    #[error("{file}: no flows (expected lines of `<src> <dst>`)")]
    Empty {
        /// File name as given.
        file: String,
    },
    /// Pairs need an even, non-zero number of peers.
    #[error("--peers {0}: pairs need an even number of peers, at least 2")]
    OddPeers(usize),
}

impl Topology {
    /// `peers` peers in `peers / 2` pairs: `2i → 2i+1`, plus `2i+1 → 2i`
    /// when `bidirectional`.
    pub fn pairs(peers: usize, bidirectional: bool) -> Result<Self, TopologyError> {
        if peers < 2 || !peers.is_multiple_of(2) || peers > MAX_PEERS {
            return Err(TopologyError::OddPeers(peers));
        }
        let mut flows = Vec::with_capacity(if bidirectional { peers } else { peers / 2 });
        for i in 0..peers / 2 {
            flows.push(Flow {
                src: 2 * i,
                dst: 2 * i + 1,
            });
            if bidirectional {
                flows.push(Flow {
                    src: 2 * i + 1,
                    dst: 2 * i,
                });
            }
        }
        Ok(Topology { peers, flows })
    }

    /// Parses a pair file's text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, TopologyError> {
        let mut flows = Vec::new();
        let mut seen = HashSet::new();
        let mut peers = 0;
        for (n, raw) in text.lines().enumerate() {
            let line = n + 1;
            let body = raw.split('#').next().unwrap_or("").trim();
            if body.is_empty() {
                continue;
            }
            let syntax = || TopologyError::Syntax {
                file: file.to_owned(),
                line,
                text: raw.trim().to_owned(),
            };
            let mut fields = body.split_whitespace();
            let (Some(a), Some(b), None) = (fields.next(), fields.next(), fields.next()) else {
                return Err(syntax());
            };
            let index = |s: &str| -> Result<usize, TopologyError> {
                let v: u64 = s.parse().map_err(|_| syntax())?;
                if v >= MAX_PEERS as u64 {
                    return Err(TopologyError::TooLarge {
                        file: file.to_owned(),
                        line,
                        index: v,
                    });
                }
                Ok(v as usize)
            };
            let (src, dst) = (index(a)?, index(b)?);
            if src == dst {
                return Err(TopologyError::SelfFlow {
                    file: file.to_owned(),
                    line,
                    peer: src,
                });
            }
            if !seen.insert((src, dst)) {
                return Err(TopologyError::Duplicate {
                    file: file.to_owned(),
                    line,
                    src,
                    dst,
                });
            }
            peers = peers.max(src + 1).max(dst + 1);
            flows.push(Flow { src, dst });
        }
        if flows.is_empty() {
            return Err(TopologyError::Empty {
                file: file.to_owned(),
            });
        }
        Ok(Topology { peers, flows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_pairs() {
        let t = Topology::pairs(4, false).unwrap();
        assert_eq!(t.peers, 4);
        assert_eq!(
            t.flows,
            vec![Flow { src: 0, dst: 1 }, Flow { src: 2, dst: 3 }]
        );
        let b = Topology::pairs(2, true).unwrap();
        assert_eq!(
            b.flows,
            vec![Flow { src: 0, dst: 1 }, Flow { src: 1, dst: 0 }]
        );
        assert_eq!(Topology::pairs(3, false), Err(TopologyError::OddPeers(3)));
        assert_eq!(Topology::pairs(0, false), Err(TopologyError::OddPeers(0)));
    }

    #[test]
    fn parses_a_pair_file() {
        let text = "# fan-in\n0 1\n\n2 1   # second sender\n 1\t0 \n";
        let t = Topology::parse("p.txt", text).unwrap();
        assert_eq!(t.peers, 3);
        assert_eq!(
            t.flows,
            vec![
                Flow { src: 0, dst: 1 },
                Flow { src: 2, dst: 1 },
                Flow { src: 1, dst: 0 }
            ]
        );
    }

    #[test]
    fn explains_bad_pair_files() {
        let err = |text: &str| Topology::parse("p.txt", text).unwrap_err().to_string();
        assert_eq!(
            err("0 1\n0 x\n"),
            "p.txt:2: expected `<src> <dst>` (two peer indices), found \"0 x\""
        );
        assert!(err("0 1 2\n").contains("p.txt:1: expected"));
        assert!(err("5\n").contains("p.txt:1: expected"));
        assert_eq!(err("3 3\n"), "p.txt:1: peer 3 cannot send to itself");
        assert_eq!(err("0 1\n0 1\n"), "p.txt:2: flow 0 -> 1 is listed twice");
        assert_eq!(
            err("# nothing\n\n"),
            "p.txt: no flows (expected lines of `<src> <dst>`)"
        );
        assert!(err("0 1000000\n").contains("too large"));
        assert!(err("-1 2\n").contains("expected"));
    }
}
