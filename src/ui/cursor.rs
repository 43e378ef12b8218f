//! Where the view stands among the recorded steps: following the live head, pinned to a step,
//! or playing forward at a chosen speed. Pure: time comes in as durations.

use std::time::Duration;

use crate::store::Run;

/// Playback speeds in steps per second (`+`/`-` walk this ladder).
pub const SPEEDS: [f64; 10] = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];
const DEFAULT_SPEED: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Always at the newest step.
    Live,
    /// Held at a step while the store keeps growing.
    Paused,
    /// Moving forward at `SPEEDS[speed]`; becomes `Live` on reaching the head.
    Playing,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Cursor {
    pub mode: Mode,
    /// The step shown when not live.
    at: usize,
    pub speed: usize,
    /// Fraction of a step accumulated by playback.
    carry: f64,
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor { mode: Mode::Live, at: 0, speed: DEFAULT_SPEED, carry: 0.0 }
    }
}

impl Cursor {
    /// Following the head, keeping a chosen playback speed.
    pub fn with_speed(speed: usize) -> Self {
        Cursor { speed: speed.min(SPEEDS.len() - 1), ..Cursor::default() }
    }

    /// A cursor that plays the run from its first step.
    pub fn playing() -> Self {
        Cursor { mode: Mode::Playing, ..Cursor::default() }
    }

    /// The step index the view shows, given the run's head; `None` before any step.
    pub fn at(&self, head: Option<usize>) -> Option<usize> {
        let head = head?;
        Some(match self.mode {
            Mode::Live => head,
            _ => self.at.min(head),
        })
    }

    pub fn steps_per_second(&self) -> f64 {
        SPEEDS[self.speed]
    }

    /// How many steps the view is behind the live head.
    pub fn behind(&self, head: Option<usize>) -> usize {
        match (head, self.at(head)) {
            (Some(h), Some(a)) => h - a,
            _ => 0,
        }
    }

    fn pin(&mut self, run: &Run, k: usize) {
        let head = run.head().unwrap_or(0);
        self.at = k.min(head);
        self.mode = Mode::Paused;
        self.carry = 0.0;
    }

    /// `space`: pause the view where it is, or resume: play on towards the head.
    pub fn toggle_pause(&mut self, run: &Run) {
        match self.mode {
            Mode::Live | Mode::Playing => {
                let k = self.at(run.head()).unwrap_or(0);
                self.pin(run, k);
            }
            Mode::Paused if Some(self.at) >= run.head() => self.mode = Mode::Live,
            Mode::Paused => self.mode = Mode::Playing,
        }
    }

    pub fn step_back(&mut self, run: &Run) {
        if let Some(k) = self.at(run.head()) {
            self.pin(run, k.saturating_sub(1));
        }
    }

    pub fn step_forward(&mut self, run: &Run) {
        if let Some(k) = self.at(run.head()) {
            self.pin(run, k + 1);
        }
    }

    /// `[`: to the first step of this block, or of the previous one if already there.
    pub fn block_back(&mut self, run: &Run) {
        let Some(k) = self.at(run.head()) else { return };
        let block = run.active_block(Some(k));
        let start = run.block_steps(block).start;
        let target = if k > start { start } else { run.block_steps(block.saturating_sub(1)).start.min(k) };
        self.pin(run, target);
    }

    /// `]`: to the first step of the next block (or the head if it has not started).
    pub fn block_forward(&mut self, run: &Run) {
        let Some(k) = self.at(run.head()) else { return };
        let next = run.block_steps(run.active_block(Some(k)) + 1);
        let target = if next.is_empty() { run.head().unwrap_or(k) } else { next.start };
        self.pin(run, target);
    }

    pub fn home(&mut self, run: &Run) {
        self.pin(run, 0);
    }

    /// Holds the view at step `k` (capped at the head): recordings and compare mode place the
    /// cursor directly.
    pub fn goto(&mut self, run: &Run, k: usize) {
        self.pin(run, k);
    }

    pub fn end(&mut self) {
        self.mode = Mode::Live;
        self.carry = 0.0;
    }

    /// `r`: play from the first step at the current speed.
    pub fn replay(&mut self) {
        *self = Cursor { mode: Mode::Playing, speed: self.speed, ..Cursor::default() };
    }

    pub fn faster(&mut self) {
        self.speed = (self.speed + 1).min(SPEEDS.len() - 1);
    }

    pub fn slower(&mut self) {
        self.speed = self.speed.saturating_sub(1);
    }

    /// Advances playback by `dt`; true if the shown step changed.
    pub fn tick(&mut self, dt: Duration, head: Option<usize>) -> bool {
        let (Mode::Playing, Some(head)) = (self.mode, head) else { return false };
        self.carry += dt.as_secs_f64() * self.steps_per_second();
        let n = self.carry.floor();
        self.carry -= n;
        let before = self.at;
        self.at = (self.at + n as usize).min(head);
        if self.at >= head {
            self.mode = Mode::Live;
            self.carry = 0.0;
        }
        self.at != before || self.mode == Mode::Live
    }

    /// How long until playback next moves a step, if it is playing.
    pub fn next_tick(&self) -> Option<Duration> {
        (self.mode == Mode::Playing).then(|| {
            let left = (1.0 - self.carry).max(0.0) / self.steps_per_second();
            Duration::from_secs_f64(left)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::synth::{self, Synth};

    fn store() -> Store {
        Store::from_events(synth::trace(&Synth::small()))
    }

    #[test]
    fn live_follows_the_head() {
        let s = store();
        let r = s.run().unwrap();
        let c = Cursor::default();
        assert_eq!(c.at(r.head()), r.head());
        assert_eq!(c.at(None), None);
        assert_eq!(c.behind(r.head()), 0);
    }

    #[test]
    fn stepping_back_crosses_a_block_boundary() {
        let s = store();
        let r = s.run().unwrap();
        let second = r.blocks()[1].clone();
        let mut c = Cursor::default();
        c.pin(r, second.first_step);
        c.step_back(r);
        let k = c.at(r.head()).unwrap();
        assert_eq!(k, second.first_step - 1);
        assert_eq!(r.active_block(Some(k)), second.block - 1);
        // ...and forward again lands on the next block's first step.
        c.step_forward(r);
        assert_eq!(c.at(r.head()), Some(second.first_step));
        assert_eq!(c.mode, Mode::Paused);
    }

    #[test]
    fn stepping_stops_at_both_ends() {
        let s = store();
        let r = s.run().unwrap();
        let mut c = Cursor::default();
        c.home(r);
        c.step_back(r);
        assert_eq!(c.at(r.head()), Some(0));
        c.end();
        c.step_forward(r);
        assert_eq!(c.at(r.head()), r.head());
        assert_eq!(c.mode, Mode::Paused);
    }

    #[test]
    fn block_jumps() {
        let s = store();
        let r = s.run().unwrap();
        let b = r.blocks().to_vec();
        let mut c = Cursor::default();
        c.pin(r, b[2].first_step + 1);
        c.block_back(r);
        assert_eq!(c.at(r.head()), Some(b[2].first_step), "to the start of this block first");
        c.block_back(r);
        assert_eq!(c.at(r.head()), Some(b[1].first_step), "then the previous block");
        c.block_forward(r);
        c.block_forward(r);
        assert_eq!(c.at(r.head()), Some(b[3].first_step));
        c.pin(r, b.last().unwrap().first_step);
        c.block_forward(r);
        assert_eq!(c.at(r.head()), r.head(), "no next block: the head");
        c.home(r);
        c.block_back(r);
        assert_eq!(c.at(r.head()), Some(0));
    }

    #[test]
    fn pause_then_resume_plays_to_the_head_and_goes_live() {
        let s = store();
        let r = s.run().unwrap();
        let mut c = Cursor::default();
        c.home(r);
        c.toggle_pause(r);
        assert_eq!(c.mode, Mode::Playing);
        assert!(c.tick(Duration::from_millis(100), r.head()), "20 steps/s for 0.1 s is two steps");
        assert_eq!(c.at(r.head()), Some(2));
        c.toggle_pause(r);
        assert_eq!(c.mode, Mode::Paused);
        assert!(!c.tick(Duration::from_secs(10), r.head()), "paused does not move");
        c.toggle_pause(r);
        c.tick(Duration::from_secs(60), r.head());
        assert_eq!(c.mode, Mode::Live);
    }

    #[test]
    fn replay_restarts_at_the_chosen_speed() {
        let s = store();
        let r = s.run().unwrap();
        let mut c = Cursor::default();
        c.faster();
        c.faster();
        c.replay();
        assert_eq!(c.at(r.head()), Some(0));
        assert_eq!(c.steps_per_second(), 100.0);
        assert!(!c.tick(Duration::from_millis(5), r.head()), "half a step: nothing yet");
        assert!(c.tick(Duration::from_millis(5), r.head()));
        assert_eq!(c.at(r.head()), Some(1));
        assert!(c.next_tick().unwrap() <= Duration::from_millis(10));
    }

    #[test]
    fn pausing_at_the_head_and_resuming_goes_live_at_once() {
        let s = store();
        let r = s.run().unwrap();
        let mut c = Cursor::default();
        c.toggle_pause(r);
        assert_eq!(c.mode, Mode::Paused);
        c.toggle_pause(r);
        assert_eq!(c.mode, Mode::Live);
    }

    #[test]
    fn speed_is_clamped() {
        let mut c = Cursor::default();
        for _ in 0..20 {
            c.slower();
        }
        assert_eq!(c.steps_per_second(), 1.0);
        for _ in 0..20 {
            c.faster();
        }
        assert_eq!(c.steps_per_second(), 1000.0);
    }
}
