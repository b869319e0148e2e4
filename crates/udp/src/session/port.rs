//! A shard's bind messages on the session port, handled outside the
//! table's lock.
//!
//! The shard hands a batch's data datagrams to the table under the lock
//! (once per batch) and sets its bind messages aside ([`Binds::defer`]).
//! After unlocking, [`Binds::run`] takes them through the steps of
//! [`control`](super::control):
//!
//! 1. per source (an IPv4 address or an IPv6 /64), a token bucket in a
//!    fixed table ([`SourceLimiter`]): over [`Limits::bind_rate`], a
//!    message is dropped before any MAC is computed;
//! 2. the shape and the cookie, against a copy of the secrets refreshed
//!    only when they rotate (one atomic load per batch otherwise);
//! 3. the lock once for the batch's remaining messages: sessions looked
//!    up, binds challenged, answers' tokens copied;
//! 4. the proofs, then the lock once more, only if some answer proved
//!    itself, to bind.
//!
//! So a flood of forged answers never takes the lock, and a flood of
//! well-formed binds takes it once per batch for a hash lookup each.
//! Replies are written over the datagrams that caused them.

use std::net::SocketAddr;
use std::time::Instant;

use super::allocate::source_key;
use super::{Checked, Drop, Limits, Secrets, Sessions};
use crate::ratelimit::SourceLimiter;

/// Sources whose buckets a shard keeps (a fixed table; a source that takes
/// over an entry takes its bucket as it is: see [`SourceLimiter`]).
const SOURCES: usize = 4096;

/// What became of a checked message under the lock.
#[derive(Clone, Copy)]
enum Step {
    /// Send the reply.
    Reply,
    /// An answer to prove with this token.
    Prove([u8; 32]),
    /// An answer proved with this token, to bind.
    Bind([u8; 32]),
    /// Dropped (and counted).
    Dropped,
}

struct Item {
    /// The source as received (where a reply goes).
    src: SocketAddr,
    at: usize,
    len: usize,
    checked: Checked,
    step: Step,
}

/// One shard's bind messages for the session port (see the module doc).
pub(crate) struct Binds {
    /// Set aside this batch: source, offset and length in the buffer.
    deferred: Vec<(SocketAddr, usize, usize)>,
    /// Those that passed steps 1 and 2.
    items: Vec<Item>,
    limiter: SourceLimiter,
    /// The secrets' generation and the copy of them.
    secrets: Option<(u64, Secrets)>,
    /// Drops decided here, by [`Drop`] index, added to the table's
    /// account once per batch.
    drops: [u64; Drop::ALL.len()],
}

impl Binds {
    /// Nothing set aside; sources limited as `limits` say.
    pub(crate) fn new(limits: &Limits) -> Binds {
        Binds {
            deferred: Vec::new(),
            items: Vec::new(),
            limiter: SourceLimiter::new(
                SOURCES,
                f64::from(limits.bind_rate),
                f64::from(limits.bind_burst),
            ),
            secrets: None,
            drops: [0; Drop::ALL.len()],
        }
    }

    /// Whether `datagram` is for this path: a bind message (control bit
    /// set), not data for the table.
    #[inline]
    pub(crate) fn is_bind(datagram: &[u8]) -> bool {
        datagram.get(1).is_some_and(|b| b & 0x80 != 0)
    }

    /// Sets aside the `len` bytes at `at` in the batch buffer, from `src`.
    pub(crate) fn defer(&mut self, src: SocketAddr, at: usize, len: usize) {
        self.deferred.push((src, at, len));
    }

    /// Handles what was set aside at `now` (see the module doc): replies
    /// are written over their datagrams in `buf` and handed to `reply`
    /// (destination, offset, length).
    pub(crate) fn run(
        &mut self,
        sessions: &Sessions,
        now: Instant,
        buf: &mut [u8],
        mut reply: impl FnMut(SocketAddr, usize, usize),
    ) {
        if self.deferred.is_empty() {
            return;
        }
        let secrets = self.secrets(sessions);
        self.items.clear();
        for &(src, at, len) in &self.deferred {
            if !self.limiter.allow(source_key(src.ip()), now) {
                self.drops[Drop::RateLimited.index()] += 1;
                continue;
            }
            match Checked::new(&secrets, src, &buf[at..at + len]) {
                Ok(checked) => self.items.push(Item {
                    src,
                    at,
                    len,
                    checked,
                    step: Step::Dropped,
                }),
                Err(why) => self.drops[why.index()] += 1,
            }
        }
        self.deferred.clear();
        if !self.items.is_empty() {
            let mut table = sessions.lock();
            for item in &mut self.items {
                item.step = match table.look_up(&item.checked) {
                    Ok(None) => Step::Reply,
                    Ok(Some(token)) => Step::Prove(token),
                    Err(_) => Step::Dropped,
                };
            }
        }
        let mut proven = false;
        for item in &mut self.items {
            if let Step::Prove(token) = item.step {
                item.step = if item.checked.proven(&token) {
                    proven = true;
                    Step::Bind(token)
                } else {
                    self.drops[Drop::BadProof.index()] += 1;
                    Step::Dropped
                };
            }
        }
        if proven {
            let mut table = sessions.lock();
            for item in &mut self.items {
                if let Step::Bind(token) = item.step {
                    item.step = match table.bind_proven(now, &item.checked, &token) {
                        Ok(()) => Step::Reply,
                        Err(_) => Step::Dropped,
                    };
                }
            }
        }
        for item in &self.items {
            if let Step::Reply = item.step {
                item.checked.reply(&mut buf[item.at..item.at + item.len]);
                reply(item.src, item.at, item.len);
            }
        }
        sessions.add_late_drops(&mut self.drops);
    }

    /// The secrets, refreshed if they rotated since the last batch.
    fn secrets(&mut self, sessions: &Sessions) -> Secrets {
        let generation = sessions.secrets_generation();
        match self.secrets {
            Some((seen, secrets)) if seen == generation => secrets,
            _ => {
                let (generation, secrets) = sessions.secrets();
                self.secrets = Some((generation, secrets));
                secrets
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::key::NodePublic;
    use ferry_proto::relay_session::{BindKind, BindMsg, Binder, SessionOffer, BIND_LEN};

    const RELAY: &str = "192.0.2.1:3479";

    /// A batch of bind messages laid out as a shard's buffer holds them.
    struct Batch {
        buf: Vec<u8>,
        at: Vec<(SocketAddr, usize)>,
    }

    impl Batch {
        fn of(msgs: &[(SocketAddr, [u8; BIND_LEN])]) -> Batch {
            let mut b = Batch {
                buf: Vec::new(),
                at: Vec::new(),
            };
            for (src, m) in msgs {
                b.at.push((*src, b.buf.len()));
                b.buf.extend_from_slice(m);
            }
            b
        }

        /// Runs it through `binds`; the replies, by source.
        fn run(&mut self, binds: &mut Binds, s: &Sessions) -> Vec<(SocketAddr, BindMsg)> {
            for &(src, at) in &self.at {
                assert!(Binds::is_bind(&self.buf[at..at + BIND_LEN]));
                binds.defer(src, at, BIND_LEN);
            }
            let mut sent = Vec::new();
            binds.run(s, Instant::now(), &mut self.buf, |to, at, n| {
                sent.push((to, at, n))
            });
            sent.into_iter()
                .map(|(to, at, n)| (to, BindMsg::parse(&self.buf[at..at + n]).unwrap()))
                .collect()
        }
    }

    /// Binds are challenged and answers bound through the shard's path;
    /// forged answers and unknown sessions are dropped and counted, and a
    /// source over its rate is dropped before anything else.
    #[test]
    fn binds_are_challenged_answers_bound_and_the_rest_counted() {
        let limits = Limits {
            bind_burst: 4,
            bind_rate: 1,
            ..Limits::default()
        };
        let s = Sessions::new(limits);
        let now = Instant::now();
        let (k1, k2) = (NodePublic([1; 32]), NodePublic([2; 32]));
        let al = s
            .lock()
            .allocate(&k1, &k2, "203.0.113.9".parse().unwrap(), now)
            .unwrap();
        let offer = SessionOffer {
            request_id: 0,
            vni: al.vni,
            peer: k2,
            slot: 0,
            token: al.tokens[0],
            endpoints: vec![RELAY.parse().unwrap()],
            bind_lifetime: limits.bind_lifetime,
            idle_lifetime: limits.idle_lifetime,
        };
        let mut binder = Binder::new(&offer, RELAY.parse().unwrap(), 1, now);
        let mut binds = Binds::new(&limits);
        let (a, b): (SocketAddr, SocketAddr) = (
            "198.51.100.1:1000".parse().unwrap(),
            "198.51.100.2:2000".parse().unwrap(),
        );
        let unknown = BindMsg::new(BindKind::Bind, al.vni ^ 1, 0, 1).to_bytes();
        let bind = binder.poll_transmit(now).unwrap();
        let replies = Batch::of(&[(a, bind), (b, unknown)]).run(&mut binds, &s);
        assert_eq!(replies.len(), 1);
        assert_eq!((replies[0].0, replies[0].1.kind), (a, BindKind::Challenge));
        assert!(binder.handle(now, &replies[0].1.to_bytes()));
        let answer = binder.poll_transmit(now).unwrap();
        let mut forged = BindMsg::parse(&answer).unwrap();
        forged.proof = [9; 32];
        let replies =
            Batch::of(&[(a, answer), (a, forged.to_bytes()), (b, answer)]).run(&mut binds, &s);
        assert_eq!(replies.len(), 1, "{replies:?}");
        assert_eq!((replies[0].0, replies[0].1.kind), (a, BindKind::Bound));
        // Source a has a burst of 4: its repeated answer is answered again,
        // the one after it dropped unread.
        let replies = Batch::of(&[(a, answer), (a, answer)]).run(&mut binds, &s);
        assert_eq!(replies.len(), 1, "{replies:?}");
        assert_eq!(replies[0].1.kind, BindKind::Bound);
        for (why, n) in [
            (Drop::UnknownVni, 1),
            (Drop::BadProof, 1),
            (Drop::BadCookie, 1),
            (Drop::RateLimited, 1),
        ] {
            assert_eq!(s.dropped(why), n, "{why:?}");
        }
        let c = *s.lock().counters();
        assert_eq!((c.challenges, c.binds), (1, 1));
    }
}
