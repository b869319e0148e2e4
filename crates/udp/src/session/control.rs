//! Bind messages in steps (`docs/relay-sessions.md` §4), so that the
//! shards compute every MAC without the table's lock:
//!
//! 1. [`Checked::new`], without the table: the message's shape; a bind's
//!    challenge cookie is computed, an answer's cookie checked against the
//!    current and the previous secret ([`Secrets`], a copy). Forged
//!    answers (the bulk of a flood) end here.
//! 2. [`SessionTable::look_up`], with the table: the session must exist; a
//!    bind is then challenged, an answer gets its slot's token (a copy).
//! 3. [`Checked::proven`], without the table: the answer's proof under
//!    that token.
//! 4. [`SessionTable::bind_proven`], with the table: the slot is bound,
//!    unless the session changed meanwhile (freed, its VNI given to a new
//!    session, a newer generation bound).
//!
//! Drops in steps 2 and 4 are counted by the table; in steps 1 and 3 by
//! the caller (the table's own [`SessionTable::handle`] counts them in the
//! table, the shards in [`Sessions`](super::Sessions)).

use std::net::SocketAddr;
use std::time::Instant;

use ferry_proto::relay_session::{self as rs, BindError, BindKind, BindMsg};

use super::{Binding, Drop, SessionTable, Verdict};

/// The cookie secrets bind messages are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Secrets {
    /// The secret challenges are made with.
    pub current: [u8; 32],
    /// The one before it (rotated out less than a rotation ago), still
    /// accepted.
    pub previous: Option<[u8; 32]>,
}

/// The cookie secrets and when they last rotated: a new random secret
/// every [`SECRET_ROTATION`](super::SECRET_ROTATION), the one before it
/// still accepted (relay sessions' and peer-relay endpoints' binds alike).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rotation {
    secrets: Secrets,
    rotated_at: Instant,
}

impl Rotation {
    /// A first secret from `rng`, at `now`.
    pub(crate) fn new(rng: &mut impl rand::Rng, now: Instant) -> Rotation {
        Rotation {
            secrets: Secrets {
                current: rng.gen(),
                previous: None,
            },
            rotated_at: now,
        }
    }

    /// The secrets now.
    pub(crate) fn secrets(&self) -> Secrets {
        self.secrets
    }

    /// Starts a new secret from `rng` if the current one is a rotation
    /// old; the current one becomes the previous. `true` if it rotated.
    pub(crate) fn rotate(&mut self, rng: &mut impl rand::Rng, now: Instant) -> bool {
        if now.saturating_duration_since(self.rotated_at) < super::SECRET_ROTATION {
            return false;
        }
        self.secrets = Secrets {
            current: rng.gen(),
            previous: Some(self.secrets.current),
        };
        self.rotated_at = now;
        true
    }
}

/// A bind or an answer that passed the checks that need no table (step 1):
/// its shape, and for an answer its cookie.
#[derive(Clone, Copy, Debug)]
pub struct Checked {
    /// A bind's cookie is the challenge's, computed here.
    msg: BindMsg,
    /// The source, canonical (IPv4 as IPv4).
    src: SocketAddr,
}

impl Checked {
    /// Step 1: `datagram` from `src` as a bind message, or why it is
    /// dropped: [`Drop::BadHeader`], [`Drop::BadBind`] (not a bind or an
    /// answer, or malformed), [`Drop::BadCookie`] (an answer whose cookie
    /// is not this source's under either secret).
    pub fn new(secrets: &Secrets, src: SocketAddr, datagram: &[u8]) -> Result<Checked, Drop> {
        let mut msg = BindMsg::parse(datagram).map_err(|e| match e {
            BindError::Header(_) => Drop::BadHeader,
            _ => Drop::BadBind,
        })?;
        let src = ferry_proto::frame::canonical_addr(src);
        let cookie = |secret: &[u8; 32]| rs::cookie(secret, msg.vni, msg.slot, msg.generation, src);
        match msg.kind {
            BindKind::Bind => msg.cookie = cookie(&secrets.current),
            BindKind::Answer => {
                let ok = |secret: &[u8; 32]| rs::mac_eq(&msg.cookie, &cookie(secret));
                if !ok(&secrets.current) && !secrets.previous.as_ref().is_some_and(ok) {
                    return Err(Drop::BadCookie);
                }
            }
            BindKind::Challenge | BindKind::Bound => return Err(Drop::BadBind),
        }
        Ok(Checked { msg, src })
    }

    /// Whether it is an answer (a bind otherwise).
    pub fn is_answer(&self) -> bool {
        self.msg.kind == BindKind::Answer
    }

    /// Step 3: whether an answer's proof is that of the slot's `token`.
    pub fn proven(&self, token: &[u8; 32]) -> bool {
        let m = &self.msg;
        rs::mac_eq(
            &m.proof,
            &rs::proof(token, m.vni, m.slot, m.generation, &m.cookie),
        )
    }

    /// Writes the reply over `datagram` (78 bytes, as every bind message):
    /// a challenge for a bind, bound for an answer.
    pub fn reply(&self, datagram: &mut [u8]) {
        let m = &self.msg;
        let reply = match m.kind {
            BindKind::Bind => BindMsg {
                cookie: m.cookie,
                ..BindMsg::new(BindKind::Challenge, m.vni, m.slot, m.generation)
            },
            _ => BindMsg::new(BindKind::Bound, m.vni, m.slot, m.generation),
        };
        datagram.copy_from_slice(&reply.to_bytes());
    }
}

impl SessionTable {
    /// Step 2: a bind for a session that exists is challenged (`None`: send
    /// the reply); an answer gets its slot's token to check the proof
    /// with. Drops are counted.
    pub fn look_up(&mut self, c: &Checked) -> Result<Option<[u8; 32]>, Drop> {
        let Some(s) = self.sessions.get(&c.msg.vni) else {
            return Err(self.count(Drop::UnknownVni));
        };
        if !c.is_answer() {
            self.counters.challenges += 1;
            return Ok(None);
        }
        Ok(Some(s.tokens[usize::from(c.msg.slot)]))
    }

    /// Step 4: binds the slot of an answer whose proof is `token`'s (from
    /// step 2) at `now`: a newer generation, or the same from another
    /// address, rebinds; the same from the same address is a repeat and
    /// changes nothing. Drops are counted.
    pub fn bind_proven(&mut self, now: Instant, c: &Checked, token: &[u8; 32]) -> Result<(), Drop> {
        let (m, slot) = (&c.msg, usize::from(c.msg.slot));
        let Some(s) = self.sessions.get_mut(&m.vni) else {
            return Err(self.count(Drop::UnknownVni));
        };
        if s.tokens[slot] != *token {
            // The session was freed and its VNI given to another since
            // step 2: the proof was for the old one.
            return Err(self.count(Drop::BadProof));
        }
        match s.bound[slot] {
            Some(b) if m.generation < b.generation => {
                return Err(self.count(Drop::StaleGeneration));
            }
            Some(b) if m.generation == b.generation && b.addr == c.src => {
                // A repeated answer: bound again, nothing changes.
            }
            _ => {
                s.bound[slot] = Some(Binding {
                    addr: c.src,
                    generation: m.generation,
                });
                s.joined[slot] = true;
                s.last_active = now;
                self.counters.binds += 1;
            }
        }
        Ok(())
    }

    /// Steps 1 to 4 at once, for a caller that holds the table (drops of
    /// every step counted here): the reply is written over `datagram`.
    pub(super) fn control(
        &mut self,
        now: Instant,
        src: SocketAddr,
        datagram: &mut [u8],
    ) -> Verdict {
        let c = match Checked::new(&self.secrets.secrets(), src, datagram) {
            Ok(c) => c,
            Err(why) => return self.drop(why),
        };
        match self.look_up(&c) {
            Err(why) => return Verdict::Drop(why),
            Ok(None) => {}
            Ok(Some(token)) => {
                if !c.proven(&token) {
                    return self.drop(Drop::BadProof);
                }
                if let Err(why) = self.bind_proven(now, &c, &token) {
                    return Verdict::Drop(why);
                }
            }
        }
        c.reply(datagram);
        Verdict::Reply
    }
}
