//! Time the process ran: wall time less the time it spent stopped by job control
//! (`crate::tui::terminal::suspend`, Ctrl-Z then `fg`). A decode's `t_ms`, and so the TUI's
//! elapsed, tok/s and fwd/s, are read on it: a decode suspended for a minute did not run
//! for that minute. (A stop the program does not see, `kill -STOP` from outside, still counts.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds the process has spent stopped, in total.
static STOPPED_NS: AtomicU64 = AtomicU64::new(0);

/// Adds a stop of `d` (the suspension's caller measures it around the stop).
pub fn add_stopped(d: Duration) {
    STOPPED_NS.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::SeqCst);
}

fn stopped() -> Duration {
    Duration::from_nanos(STOPPED_NS.load(Ordering::SeqCst))
}

/// A point in time to measure running time from.
#[derive(Clone, Copy, Debug)]
pub struct Start {
    at: Instant,
    stopped: Duration,
}

impl Start {
    pub fn now() -> Self {
        Start { at: Instant::now(), stopped: stopped() }
    }

    /// The time since `self` that the process was not stopped.
    pub fn running(&self) -> Duration {
        self.at.elapsed().saturating_sub(stopped().saturating_sub(self.stopped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_after_the_start_is_left_out_and_one_before_is_not() {
        add_stopped(Duration::from_secs(5)); // before: not this start's
        let s = Start::now();
        std::thread::sleep(Duration::from_millis(20));
        add_stopped(Duration::from_millis(15));
        let r = s.running();
        // 20 ms and more elapsed, 15 of them stopped (other tests may add more: at most less)
        assert!(r < Duration::from_millis(20) && r >= Duration::ZERO, "{r:?}");
        assert!(s.at.elapsed() >= Duration::from_millis(20));
    }
}
