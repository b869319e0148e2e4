//! Model check of the cross-shard doorbell ([`ferry_engine::Doorbell`]).
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p ferry-engine --release
//! --test loom_doorbell` (in its own target directory: the flag rebuilds
//! every crate). Without `--cfg loom` this file is empty.
//!
//! The property: a shard about to sleep parks, checks its rings one last
//! time, and sleeps only if they are empty; a producer pushes records and
//! then notifies. Whatever the interleaving and whatever loom's memory
//! model lets each load see, a record pushed after that last check is never
//! stranded: either the sleeper sees it, or the doorbell rings and the
//! sleeper wakes. A lost wake-up leaves the sleeper blocked with every
//! other thread finished, which loom reports as a deadlock.
//!
//! The pieces around the doorbell are modelled as they behave in a shard:
//! a ring is a record counter the producer publishes with `Release` and the
//! consumer reads with `Acquire` (as `rtrb` does), and the wake-up is
//! sticky like the driver's eventfd (a ring before the sleep makes the
//! sleep return at once).
#![cfg(loom)]

use ferry_engine::Doorbell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Condvar, Mutex};
use std::sync::Arc;

/// Every interleaving with up to this many preemptions is explored (most
/// concurrency bugs need two or three). 4 takes about 12 s in release; 5
/// takes 90 s, and unbounded, two producers take many minutes.
const PREEMPTIONS: usize = 4;

/// The driver's wake-up: a sticky flag (an eventfd's counter).
#[derive(Default)]
struct Wakeup {
    rung: Mutex<bool>,
    cv: Condvar,
}

impl Wakeup {
    fn ring(&self) {
        *self.rung.lock().unwrap() = true;
        self.cv.notify_one();
    }

    /// Blocks until rung, and consumes the ring.
    fn sleep(&self) {
        let mut rung = self.rung.lock().unwrap();
        while !*rung {
            rung = self.cv.wait(rung).unwrap();
        }
        *rung = false;
    }
}

/// One shard's inbox: records from each producer, and its doorbell.
struct Shard {
    rings: Vec<AtomicUsize>,
    wakeup: Arc<Wakeup>,
    bell: Arc<Doorbell>,
}

impl Shard {
    fn new(producers: usize) -> Arc<Shard> {
        let wakeup = Arc::new(Wakeup::default());
        let w = wakeup.clone();
        Arc::new(Shard {
            rings: (0..producers).map(|_| AtomicUsize::new(0)).collect(),
            wakeup,
            bell: Doorbell::new(Arc::new(move || w.ring())),
        })
    }

    /// Records waiting in all rings (the consumer's view).
    fn pending(&self, taken: usize) -> usize {
        self.rings
            .iter()
            .map(|r| r.load(Ordering::Acquire))
            .sum::<usize>()
            - taken
    }

    /// Producer `p`: push one record, then notify (one batch).
    fn push(&self, p: usize) {
        self.rings[p].fetch_add(1, Ordering::Release);
        self.bell.notify();
    }

    /// The consumer's loop (as `runtime::run_shard` turns): take what is
    /// there; when nothing is, park, check once more, and sleep only if
    /// that check finds nothing. Returns once `want` records were taken.
    /// `check_after_park: false` is the broken order (check, then park).
    fn consume(&self, want: usize, check_after_park: bool) {
        let mut taken = 0;
        while taken < want {
            let n = self.pending(taken);
            if n > 0 {
                taken += n;
                continue;
            }
            if check_after_park {
                self.bell.park();
                if self.pending(taken) > 0 {
                    self.bell.unpark();
                    continue;
                }
            } else {
                self.bell.park();
            }
            self.wakeup.sleep();
            self.bell.unpark();
        }
    }
}

fn run(producers: usize, batches: usize, check_after_park: bool) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(PREEMPTIONS);
    model.check(move || {
        let shard = Shard::new(producers);
        let threads: Vec<_> = (0..producers)
            .map(|p| {
                let s = shard.clone();
                loom::thread::spawn(move || (0..batches).for_each(|_| s.push(p)))
            })
            .collect();
        shard.consume(producers * batches, check_after_park);
        threads.into_iter().for_each(|t| t.join().unwrap());
    });
}

#[test]
fn a_notify_after_the_last_check_is_never_lost() {
    run(1, 2, true);
}

#[test]
fn two_producers_never_strand_a_record() {
    run(2, 1, true);
}

/// The model has teeth: a consumer that checks its rings before parking
/// (so a push can fall between the check and the park) sleeps through it.
#[test]
#[should_panic(expected = "deadlock")]
fn checking_before_parking_loses_wakeups() {
    // Without `check_after_park`, the only check is the one at the top of
    // the loop, before `park`.
    run(1, 1, false);
}
