//! The shard loop and pinned shard threads.
//!
//! One turn of a shard: decide how long it may block (not at all when work
//! is pending), announce parking on its doorbell, let the driver wait and
//! report completions, then give the handler the driver to submit what the
//! completions asked for. Cross-shard mail, timers and flushing all happen
//! in [`Handler::after_turn`], once per turn, so a turn's sends and wake-ups
//! go out as one batch. With a busy-poll budget ([`BusyPoll`]) a shard
//! that just had work polls for a while before it parks.

use std::io;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::driver::{Completion, Driver};
use crate::mailbox::Doorbell;

/// The per-shard logic a driver's completions are fed to.
///
/// Time is passed in: the loop reads the clock once per turn, when the
/// driver delivers the turn's first completion (or, for a turn without
/// any, when it returns), and hands the same `now` to every call of that
/// turn. A handler never reads the clock itself, so a test can drive it
/// with simulated time (see [`crate::sim`]).
pub trait Handler<D: Driver> {
    /// One completion. The driver is busy: record what must be done.
    fn on_completion(&mut self, c: Completion<'_>, now: Instant);
    /// After each turn: drain mail, run timers, submit sends and closes.
    fn after_turn(&mut self, driver: &mut D, now: Instant);
    /// How long the next turn may block: `None` until something happens,
    /// `Some(Duration::ZERO)` when work is already pending.
    fn timeout(&mut self, now: Instant) -> Option<Duration>;
    /// Whether another shard left mail (checked after parking).
    fn has_mail(&self) -> bool;
    /// Whether the shard is done and its loop should return.
    fn finished(&self) -> bool;
    /// How long the turn just ended kept the thread busy: from its `now`
    /// to the end of [`Handler::after_turn`]. For load metrics.
    fn turn_done(&mut self, _busy: Duration) {}
}

/// Runs a shard until its handler says it is finished, parking whenever
/// it has nothing to do.
pub fn run_shard<D: Driver, H: Handler<D>>(
    driver: &mut D,
    bell: &Doorbell,
    handler: &mut H,
) -> io::Result<()> {
    run_shard_polling(driver, bell, handler, BusyPoll::new(Duration::ZERO))
}

/// Runs a shard until its handler says it is finished, polling instead of
/// parking as `poll` allows (see [`BusyPoll`]).
pub fn run_shard_polling<D: Driver, H: Handler<D>>(
    driver: &mut D,
    bell: &Doorbell,
    handler: &mut H,
    mut poll: BusyPoll,
) -> io::Result<()> {
    while !handler.finished() {
        turn(driver, bell, handler, &mut poll, &mut Instant::now)?;
    }
    Ok(())
}

/// Adaptive polling before parking (`--busy-poll`).
///
/// After a turn that brought completions (or mail from another shard),
/// the next turns poll the driver without blocking (`epoll_wait` with a
/// zero timeout, an io_uring enter that does not wait) for as long as
/// something keeps arriving within `budget` of the last arrival. Once a
/// whole budget passed in quiet, the shard parks as it does without it. A
/// shard that had nothing to do never starts polling, so an idle relay
/// costs no CPU; a busy one trades up to one budget of spinning after its
/// last packet for not paying a wake-up (and the scheduler's delay) on the
/// next one. A zero budget never polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusyPoll {
    budget: Duration,
    /// Poll instead of parking until then.
    until: Option<Instant>,
}

impl BusyPoll {
    /// Polls for up to `budget` of quiet; zero is off.
    pub fn new(budget: Duration) -> BusyPoll {
        BusyPoll {
            budget,
            until: None,
        }
    }

    /// The budget given to [`BusyPoll::new`].
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Whether a turn starting at `now` should poll rather than park.
    pub fn polling(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// Records the turn that ran at `now`: whether anything arrived in it.
    pub fn note(&mut self, arrived: bool, now: Instant) {
        if self.budget.is_zero() {
            return;
        }
        if arrived {
            self.until = Some(now + self.budget);
        } else if !self.polling(now) {
            self.until = None;
        }
    }
}

/// How one loop turn waited for its completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Work was pending (the handler's or another shard's): the driver was
    /// asked for what was ready, without blocking.
    Pending,
    /// Nothing was pending, but within the busy-poll budget: the driver
    /// was polled without blocking.
    Poll,
    /// Parked: the driver could block this long (`None`: until something
    /// happens).
    Park(Option<Duration>),
}

/// One turn of the shard loop with the clock `clock`: decide how to wait
/// (pending work, busy polling or parking on the doorbell), let the driver
/// report completions, run [`Handler::after_turn`]. [`run_shard`] calls it
/// with the real clock; [`crate::sim::SimDriver::run_turn`] with a
/// simulated one. Returns how the turn waited.
pub fn turn<D: Driver, H: Handler<D>>(
    driver: &mut D,
    bell: &Doorbell,
    handler: &mut H,
    poll: &mut BusyPoll,
    clock: &mut dyn FnMut() -> Instant,
) -> io::Result<Wait> {
    let start = clock();
    let mut timeout = handler.timeout(start);
    let wait = if timeout == Some(Duration::ZERO) {
        Wait::Pending
    } else if poll.polling(start) {
        timeout = Some(Duration::ZERO);
        Wait::Poll
    } else {
        bell.park();
        if handler.has_mail() {
            timeout = Some(Duration::ZERO);
            Wait::Pending
        } else {
            Wait::Park(timeout)
        }
    };
    let mut now = None;
    let result = driver.turn(timeout, &mut |c| {
        let at = *now.get_or_insert_with(&mut *clock);
        handler.on_completion(c, at)
    });
    bell.unpark();
    result?;
    // Mail from other shards counts as arriving work too: while polling,
    // the doorbell is not parked and nobody rings it.
    let arrived = now.is_some() || (!poll.budget().is_zero() && handler.has_mail());
    let now = now.unwrap_or_else(&mut *clock);
    poll.note(arrived, now);
    handler.after_turn(driver, now);
    handler.turn_done(clock().saturating_duration_since(now));
    Ok(wait)
}

/// Spawns a named thread pinned to `cpu` (when given and allowed).
pub fn spawn_pinned<F, T>(name: String, cpu: Option<usize>, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new().name(name.clone()).spawn(move || {
        if let Some(cpu) = cpu {
            if let Err(e) = ferry_sys::pin_current_thread(cpu) {
                tracing::warn!(thread = %name, cpu, error = %e, "could not pin thread to its core");
            }
        }
        f()
    })
}
