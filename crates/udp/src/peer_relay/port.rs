//! A shard's control datagrams on the peer-relay port, opened outside the
//! table's lock.
//!
//! The shard forwards a batch's data under the lock and sets its control
//! datagrams (binds, answers) aside ([`Controls::defer`]). After
//! unlocking, [`Controls::run`] takes them through these steps:
//!
//! 1. per source (an IPv4 address or an IPv6 /64), a token bucket
//!    ([`SourceLimiter`]): over [`Limits::bind_rate`], a datagram is
//!    dropped before any crypto;
//! 2. the shape ([`pr::parse_control`]: length, VNI, disco magic), no
//!    crypto;
//! 3. **the lock**, once for the batch ([`Controls::look_up`]): each
//!    datagram's endpoint and slot found, its box key shared out
//!    ([`Opener`]), the cookie secrets copied;
//! 4. **without the lock** ([`Controls::open`]): every box opened and
//!    checked, binds answered with a challenge sealed in place (nonces from
//!    the shard's own generator), answers' challenges checked;
//! 5. **the lock** once more ([`Controls::apply`]), only if an answer
//!    proved itself or something was counted: slots bound (to the endpoint
//!    that was looked up: one freed and made again meanwhile is not
//!    touched) and the counts added.
//!
//! So the table is held for hash lookups only, however many boxes a
//! batch brings; other endpoints' data is forwarded in between. Every
//! drop is counted; a line is logged at most once per reason per
//! [`DROP_LOG_EVERY`] per shard ([`DropLog`]), naming how many drops of
//! that reason it did not log.

use std::net::SocketAddr;
use std::time::Instant;

use ferry_proto::disco::BindBody;
use ferry_proto::key::DiscoPublic;
use ferry_proto::peer_relay::{self as pr, BindStep};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::table::Opener;
use super::{Drop, DropLog, Limits, PeerRelayTable, PeerRelays, DROP_LOG_EVERY};
use crate::ratelimit::SourceLimiter;
use crate::session::allocate::source_key;
use crate::session::Secrets;

/// Sources whose buckets a shard keeps (a fixed table: see
/// [`SourceLimiter`]).
const SOURCES: usize = 4096;

/// What becomes of a looked-up datagram.
#[derive(Clone, Copy)]
enum Step {
    /// To be opened (step 4).
    Open,
    /// A challenge of this length was written over it: send it back.
    Reply(usize),
    /// A valid answer carrying this body: bind (step 5).
    Bind(BindBody),
    /// Dropped (and counted).
    Dropped,
}

struct Item {
    /// The source as received (where a reply goes).
    src: SocketAddr,
    at: usize,
    len: usize,
    opener: Opener,
    step: Step,
}

/// One shard's control datagrams for the peer-relay port (see the module
/// doc).
pub(crate) struct Controls {
    /// Through steps 1 and 2: source, offset, length, what the shape said.
    shaped: Vec<(SocketAddr, usize, usize, pr::Control)>,
    /// Through step 3.
    items: Vec<Item>,
    limiter: SourceLimiter,
    rng: StdRng,
    /// The secrets and the relay's key, as step 3 copied them.
    secrets: Option<(Secrets, DiscoPublic)>,
    /// Counted outside the lock, added to the table's counters in step 5.
    drops: [u64; Drop::ALL.len()],
    challenges: u64,
    log: DropLog<{ Drop::ALL.len() }>,
    /// Lines logged about drops (for tests).
    lines: u64,
}

impl Controls {
    /// Nothing set aside; sources limited as `limits` say.
    pub(crate) fn new(limits: &Limits) -> Controls {
        Controls {
            shaped: Vec::new(),
            items: Vec::new(),
            limiter: SourceLimiter::new(
                SOURCES,
                f64::from(limits.bind_rate),
                f64::from(limits.bind_burst),
            ),
            rng: StdRng::from_entropy(),
            secrets: None,
            drops: [0; Drop::ALL.len()],
            challenges: 0,
            log: DropLog::new(DROP_LOG_EVERY),
            lines: 0,
        }
    }

    /// Whether `datagram` is a control datagram (the header's control bit),
    /// for this path rather than the table's forwarding.
    #[inline]
    pub(crate) fn is_control(datagram: &[u8]) -> bool {
        datagram.get(1).is_some_and(|b| b & 0x80 != 0)
    }

    /// Steps 1 and 2 for `datagram`, from `src`, at `at` in the batch
    /// buffer: set aside, or dropped and counted.
    pub(crate) fn defer(&mut self, src: SocketAddr, at: usize, datagram: &[u8], now: Instant) {
        if !self.limiter.allow(source_key(src.ip()), now) {
            self.drops[Drop::RateLimited.index()] += 1;
            return;
        }
        match pr::parse_control(datagram) {
            Ok(c) => self.shaped.push((src, at, datagram.len(), c)),
            Err(_) => self.drops[Drop::BadControl.index()] += 1,
        }
    }

    /// Steps 3 to 5 for what was set aside, at `now` (the table locked
    /// at most twice): replies are written over their datagrams in `buf`
    /// and handed to `reply` (destination, offset, length).
    pub(crate) fn run(
        &mut self,
        relays: &PeerRelays,
        now: Instant,
        buf: &mut [u8],
        reply: impl FnMut(SocketAddr, usize, usize),
    ) {
        if self.shaped.is_empty() && self.drops.iter().all(|&n| n == 0) {
            return;
        }
        if !self.shaped.is_empty() {
            self.look_up(&relays.lock());
        }
        if self.open(buf) {
            self.log_drops(now);
            self.apply(&mut relays.lock(), now);
        }
        self.finish(reply);
    }

    /// Hands the replies step 4 wrote to `reply` (destination, offset,
    /// length) and forgets the batch.
    pub(crate) fn finish(&mut self, mut reply: impl FnMut(SocketAddr, usize, usize)) {
        for item in &self.items {
            if let Step::Reply(n) = item.step {
                reply(item.src, item.at, n);
            }
        }
        self.items.clear();
    }

    /// Step 3, under the lock: the endpoints of what was set aside.
    pub(crate) fn look_up(&mut self, table: &PeerRelayTable) {
        self.items.clear();
        for (src, at, len, c) in self.shaped.drain(..) {
            match table.opener(&c) {
                Ok(opener) => self.items.push(Item {
                    src,
                    at,
                    len,
                    opener,
                    step: Step::Open,
                }),
                Err(why) => self.drops[why.index()] += 1,
            }
        }
        self.secrets = Some((table.secrets(), table.server_disco()));
    }

    /// Step 4, without the table: opens what step 3 found, in `buf`;
    /// whether step 5 has anything to do.
    pub(crate) fn open(&mut self, buf: &mut [u8]) -> bool {
        let mut bind = false;
        if let Some((secrets, server)) = self.secrets {
            for item in &mut self.items {
                if !matches!(item.step, Step::Open) {
                    continue;
                }
                let datagram = &mut buf[item.at..item.at + item.len];
                item.step = match item.opener.open(datagram) {
                    Ok(BindStep::Bind(body)) => {
                        let nonce: [u8; 24] = self.rng.gen();
                        self.challenges += 1;
                        Step::Reply(
                            item.opener
                                .challenge(&secrets, &server, &body, item.src, &nonce, datagram),
                        )
                    }
                    Ok(BindStep::Answer(body)) => {
                        if item.opener.answer_is_valid(&secrets, &body, item.src) {
                            bind = true;
                            Step::Bind(body)
                        } else {
                            self.drops[Drop::BadChallenge.index()] += 1;
                            Step::Dropped
                        }
                    }
                    Err(why) => {
                        self.drops[why.index()] += 1;
                        Step::Dropped
                    }
                };
            }
        }
        bind || self.challenges > 0 || self.drops.iter().any(|&n| n > 0)
    }

    /// A line per reason with drops counted in this batch, unless one was
    /// logged less than [`DROP_LOG_EVERY`] ago.
    fn log_drops(&mut self, now: Instant) {
        for (why, &n) in Drop::ALL.iter().zip(&self.drops) {
            if let Some(suppressed) = self.log.note(why.index(), n, now) {
                self.lines += 1;
                tracing::info!(
                    reason = why.label(),
                    suppressed,
                    "peer relay: control datagram dropped"
                );
            }
        }
    }

    /// Step 5, under the lock: binds the answers that proved themselves
    /// and adds what was counted.
    pub(crate) fn apply(&mut self, table: &mut PeerRelayTable, now: Instant) {
        for item in &mut self.items {
            if let Step::Bind(body) = item.step {
                let src = ferry_proto::frame::canonical_addr(item.src);
                table.bind(now, &item.opener, &body, src);
                item.step = Step::Dropped;
            }
        }
        table.add_from_port(&mut self.drops, &mut self.challenges);
    }
}

#[cfg(test)]
mod tests;
