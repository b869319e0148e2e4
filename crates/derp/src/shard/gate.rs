//! What holds a connection's input ([`Gate`](crate::conn::Gate): a ring stall, backpressure
//! from the destinations it feeds, migration, closing), the backpressure
//! budget (see the shard module's doc), and resuming input once nothing
//! holds it.

use super::*;
use crate::conn::AckedMark;

impl Shard {
    /// Holds `slot`'s input for `why`, stopping its socket's reads.
    pub(super) fn hold_input(&mut self, slot: Slot, why: Hold) {
        if self.conns[slot].hold(why) {
            self.ops.push(Op::SetRecv(slot, false));
        }
    }

    /// Lifts `why` from `slot`'s input; reading resumes if nothing else
    /// holds it.
    pub(super) fn release_input(&mut self, slot: Slot, why: Hold) {
        self.conns[slot].release(why);
        self.try_resume(slot);
    }

    /// Stops reading a local sender until every destination that paused
    /// it has drained.
    pub(super) fn pause_sender(&mut self, slot: Slot) {
        if !self.conns[slot].holds(Hold::Backpressure) {
            let m = &self.m;
            m.backpressure_pauses.inc();
            m.senders_paused.add(1);
        }
        self.hold_input(slot, Hold::Backpressure);
    }

    /// A destination that paused `r` drained or left.
    pub(super) fn resume_sender(&mut self, r: ConnRef) {
        if r.shard != self.id {
            self.mail(r.shard, Mail::Resume(r));
            return;
        }
        let Some(slot) = self.live(r) else { return };
        if self.conns[slot].holds(Hold::Backpressure) {
            self.m.senders_paused.add(-1);
        }
        self.release_input(slot, Hold::Backpressure);
    }

    /// Resumes input if it is stopped and nothing holds it any more.
    pub(super) fn try_resume(&mut self, slot: Slot) {
        let conn = &self.conns[slot];
        if conn.may_resume() && conn.phase() == Phase::Active && !self.ended(slot) {
            self.resume_input(slot);
        }
    }

    /// Lets every sender waiting on `slot` go.
    pub(super) fn release_waiters(&mut self, slot: Slot) {
        if !self.conns[slot].has_waiters() {
            return;
        }
        // Reuse the list's memory; senders resumed here may queue again
        // (and wait again) while it is being walked.
        let mut waiting = self.conns[slot].take_waiters();
        for r in waiting.drain(..) {
            self.resume_sender(r);
        }
        self.conns[slot].recycle_waiters(waiting);
    }

    /// Releases the senders held by destinations that took nothing from
    /// their sockets for the backpressure budget (see the module doc).
    pub(super) fn enforce_budget(&mut self, driver: &mut dyn DriverOps) {
        let now = self.now;
        let budget = self.shared.config.backpressure_budget;
        let half = budget / 2;
        let mut probe = false;
        let mut i = 0;
        while i < self.holders.len() {
            let (slot, gen) = self.holders[i];
            let conn = match self.conns.get_mut(slot) {
                Some(c) if c.gen() == gen && c.closed().is_none() && c.has_waiters() => c,
                Some(c) if c.gen() == gen => {
                    c.stop_holding();
                    self.holders.swap_remove(i);
                    continue;
                }
                _ => {
                    self.holders.swap_remove(i);
                    continue;
                }
            };
            let held = now.saturating_duration_since(conn.held_since());
            if held < half {
                i += 1;
                continue;
            }
            let mark = conn.acked_mark();
            if mark == AckedMark::NotRead {
                // Half the budget gone: note how far the peer has read, and
                // how far the other long-pending sends' peers have.
                conn.mark_acked(driver.bytes_acked(slot), None);
                probe = true;
                i += 1;
                continue;
            }
            if held < budget {
                i += 1;
                continue;
            }
            let acked = driver.bytes_acked(slot);
            if matches!((mark, acked), (AckedMark::Bytes(m), Some(a)) if a != m) {
                // It reads, just slowly: a new half-budget window.
                conn.mark_acked(acked, Some(now - half));
                i += 1;
                continue;
            }
            conn.mark_not_draining();
            let key = conn.key();
            self.announce_draining(key, true);
            let conn = &self.conns[slot];
            self.holders.swap_remove(i);
            let (peer, key, held_for) = (conn.peer(), conn.key(), held);
            self.m.backpressure_expired.inc();
            conn_log!(self, info, %peer, client = %key, held_ms = held_for.as_millis() as u64,
                "client is taking nothing from its socket; dropping its packets instead of pausing the senders feeding it");
            self.release_waiters(slot);
        }
        if probe {
            self.probe_pending_sends(driver);
        }
    }

    /// Reads the acknowledged bytes of every connection whose send has
    /// been in flight for half a budget and that holds nobody (see
    /// `Conn::probe`). Runs only when some hold has lasted half a budget,
    /// which a relay whose readers read never sees, and at most once per
    /// half budget, so that clients that make themselves slow on purpose
    /// cannot make the shard walk all its connections more often.
    fn probe_pending_sends(&mut self, driver: &mut dyn DriverOps) {
        let now = self.now;
        let half = self.shared.config.backpressure_budget / 2;
        if self
            .last_probe
            .is_some_and(|at| now.saturating_duration_since(at) < half)
        {
            return;
        }
        self.last_probe = Some(now);
        for (slot, c) in self.conns.iter_mut() {
            if c.wants_probe(now, half) {
                c.set_probe(now, driver.bytes_acked(slot));
            }
        }
    }

    /// Tells the other shards that `key`'s connection stopped draining
    /// (`stuck`) or drains again, so that they drop or send its packets.
    pub(super) fn announce_draining(&mut self, key: NodePublic, stuck: bool) {
        for shard in 0..self.shards {
            if shard != self.id {
                self.mail(shard, Mail::NotDraining { key, stuck });
            }
        }
    }

    /// When the next hold reaches a point [`Shard::enforce_budget`] acts on.
    pub(super) fn next_budget_check(&self) -> Option<Instant> {
        let budget = self.shared.config.backpressure_budget;
        self.holders
            .iter()
            .filter_map(|&(slot, _)| self.conns.get(slot))
            .filter_map(|c| c.budget_check_at(budget))
            .min()
    }
}
