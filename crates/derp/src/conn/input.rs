//! Whether a connection's socket is read: its input states and every
//! transition between them.
//!
//! ```text
//!            hold(why)                 release(last reason)
//!   Reading ───────────▶ Held(gate) ─────────────────────▶ Released
//!      ▲                  │  ▲  hold(another) / release(one of several)
//!      │                  └──┘                               │
//!      │            resume() (the shard drained the stash)   │
//!      └─────────────────────────────────────────────────────┘
//!                    hold(why) from Released: Held again
//! ```
//!
//! While input is not `Reading` the socket is not read (TCP pushes back on
//! the peer) and bytes already read wait in the connection's stash.
//! Releasing the last reason does not read again by itself: the shard
//! resumes the connection, which feeds the stash first, so bytes keep
//! their order.

/// A reason to hold a connection's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Hold {
    /// A packet waits for room in the ring to another shard.
    Ring = 1,
    /// A destination it feeds is over its queue cap (backpressure).
    Backpressure = 2,
    /// Moving to the shard that owns its key.
    Migrating = 4,
    /// On its way out: writing a last response or farewell.
    Closing = 8,
    /// Waiting for admission (tailscaled or the admission controller).
    Admission = 16,
    /// Over its receive rate limit until its bucket refills.
    RateLimit = 32,
}

/// The reasons holding a connection's input, never empty inside
/// [`Input::Held`]. Each reason is set and lifted by the code that owns
/// it, so one reason going away never lets input through while another
/// holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate(u8);

impl Gate {
    /// Whether `why` is among the reasons.
    pub fn holds(&self, why: Hold) -> bool {
        self.0 & why as u8 != 0
    }
}

/// A connection's input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Input {
    /// The socket is read.
    #[default]
    Reading,
    /// Stopped for the reasons in the gate.
    Held(Gate),
    /// Stopped, and nothing holds it any more: waiting for the shard to
    /// resume it.
    Released,
}

impl Input {
    /// Holds input for `why`; `true` if it was being read (the socket's
    /// reads must stop).
    pub fn hold(&mut self, why: Hold) -> bool {
        let (gate, was_reading) = match *self {
            Input::Reading => (0, true),
            Input::Held(Gate(g)) => (g, false),
            Input::Released => (0, false),
        };
        *self = Input::Held(Gate(gate | why as u8));
        was_reading
    }

    /// Lifts `why`; `true` if it held input. Lifting the last reason
    /// leaves input [`Input::Released`].
    pub fn release(&mut self, why: Hold) -> bool {
        let Input::Held(gate) = *self else {
            return false;
        };
        if !gate.holds(why) {
            return false;
        }
        let rest = gate.0 & !(why as u8);
        *self = if rest == 0 {
            Input::Released
        } else {
            Input::Held(Gate(rest))
        };
        true
    }

    /// Whether `why` holds input.
    pub fn holds(&self, why: Hold) -> bool {
        matches!(self, Input::Held(gate) if gate.holds(why))
    }

    /// Reading again, from [`Input::Released`] (or already reading);
    /// `false`, and nothing changes, while a reason still holds it.
    pub fn resume(&mut self) -> bool {
        match *self {
            Input::Held(_) => false,
            Input::Reading | Input::Released => {
                *self = Input::Reading;
                true
            }
        }
    }

    /// Whether the socket is not read.
    pub fn is_stopped(&self) -> bool {
        !matches!(self, Input::Reading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_is_read_again_only_after_every_reason_is_lifted_and_a_resume() {
        let mut input = Input::default();
        assert!(input.hold(Hold::Ring), "the first hold stops reads");
        assert!(!input.hold(Hold::RateLimit), "already stopped");
        assert!(input.holds(Hold::Ring) && input.holds(Hold::RateLimit));
        assert!(!input.release(Hold::Backpressure), "never held");
        assert!(input.release(Hold::Ring));
        assert!(!input.resume(), "the rate limit still holds it");
        assert_eq!(input, Input::Held(Gate(Hold::RateLimit as u8)));
        assert!(input.release(Hold::RateLimit));
        assert_eq!(input, Input::Released);
        assert!(input.is_stopped(), "released is not reading yet");
        assert!(!input.holds(Hold::RateLimit));
        assert!(!input.hold(Hold::Closing), "held again before resuming");
        assert!(input.release(Hold::Closing));
        assert!(input.resume());
        assert_eq!(input, Input::Reading);
        assert!(!input.release(Hold::Closing));
        assert!(input.hold(Hold::Migrating), "reading, so reads stop");
    }
}
