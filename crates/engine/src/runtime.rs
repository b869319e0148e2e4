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
use std::time::Duration;

use crate::driver::{Completion, Driver};
use crate::mailbox::Doorbell;

/// The per-shard logic a driver's completions are fed to.
pub trait Handler<D: Driver> {
    /// One completion. The driver is busy: record what must be done.
    fn on_completion(&mut self, c: Completion<'_>);
    /// After each turn: drain mail, run timers, submit sends and closes.
    fn after_turn(&mut self, driver: &mut D);
    /// How long the next turn may block: `None` until something happens,
    /// `Some(Duration::ZERO)` when work is already pending.
    fn timeout(&mut self) -> Option<Duration>;
    /// Whether another shard left mail (checked after parking).
    fn has_mail(&self) -> bool;
    /// Whether the shard is done and its loop should return.
    fn finished(&self) -> bool;
}

/// Runs a shard until its handler says it is finished.
pub fn run_shard<D: Driver, H: Handler<D>>(
    driver: &mut D,
    bell: &Doorbell,
    handler: &mut H,
) -> io::Result<()> {
    while !handler.finished() {
        let mut timeout = handler.timeout();
        if timeout != Some(Duration::ZERO) {
            bell.park();
            if handler.has_mail() {
                timeout = Some(Duration::ZERO);
            }
        }
        let result = driver.turn(timeout, &mut |c| handler.on_completion(c));
        bell.unpark();
        result?;
        handler.after_turn(driver);
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
