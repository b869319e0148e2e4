//! The shard loop and pinned shard threads.
//!
//! One turn of a shard: decide how long it may block (not at all when work
//! is pending), announce parking on its doorbell, let the driver wait and
//! report completions, then give the handler the driver to submit what the
//! completions asked for. Cross-shard mail, timers and flushing all happen
//! in [`Handler::after_turn`], once per turn, so a turn's sends and wake-ups
//! go out as one batch.

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

/// Runs a shard until its handler says it is finished.
pub fn run_shard<D: Driver, H: Handler<D>>(
    driver: &mut D,
    bell: &Doorbell,
    handler: &mut H,
) -> io::Result<()> {
    while !handler.finished() {
        let mut timeout = handler.timeout(Instant::now());
        if timeout != Some(Duration::ZERO) {
            bell.park();
            if handler.has_mail() {
                timeout = Some(Duration::ZERO);
            }
        }
        let mut now = None;
        let result = driver.turn(timeout, &mut |c| {
            let at = *now.get_or_insert_with(Instant::now);
            handler.on_completion(c, at)
        });
        bell.unpark();
        result?;
        let now = now.unwrap_or_else(Instant::now);
        handler.after_turn(driver, now);
        handler.turn_done(now.elapsed());
    }
    Ok(())
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
