//! Where the view stands among the recorded steps: following the live head, pinned to a step,
//! or playing forward at a pace. Pure: time comes in as durations, so the pacer (given the
//! time elapsed and the pace, which step is shown) is tested without sleeping.

use std::fmt;
use std::time::Duration;

use crate::trace::store::Run;

/// How fast the view walks through recorded steps. The engine never waits for it: the view
/// falls behind the head and catches up at this pace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// As fast as events come: the view jumps to the head.
    Unlimited,
    /// Steps per second; always finite and positive (see [`Pace::new`]).
    PerSecond(f64),
}

/// The paces `+`/`-` walk through; past the last comes `Unlimited`.
pub const LADDER: [f64; 10] = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

/// Ten steps a second: the embedded model's ~200 steps unfold over about 20 s, slow enough to
/// follow a block filling in, fast enough not to bore.
pub const DEFAULT_PACE: Pace = Pace::PerSecond(10.0);

impl Pace {
    /// `--pace`: 0 is unlimited, a positive number is steps per second.
    pub fn new(per_second: f64) -> Result<Pace, String> {
        match per_second {
            0.0 => Ok(Pace::Unlimited),
            p if p.is_finite() && p > 0.0 => Ok(Pace::PerSecond(p)),
            p => Err(format!("--pace {p}: must be 0 (as fast as the decode goes) or a positive number of steps per second")),
        }
    }

    pub fn per_second(self) -> Option<f64> {
        match self {
            Pace::Unlimited => None,
            Pace::PerSecond(p) => Some(p),
        }
    }

    /// The next pace up the ladder.
    pub fn faster(self) -> Pace {
        match self {
            Pace::Unlimited => Pace::Unlimited,
            Pace::PerSecond(p) => {
                LADDER.iter().find(|&&l| l > p).map_or(Pace::Unlimited, |&l| Pace::PerSecond(l))
            }
        }
    }

    /// The next pace down the ladder; the slowest stays.
    pub fn slower(self) -> Pace {
        let p = self.per_second().unwrap_or(f64::INFINITY);
        LADDER.iter().rev().find(|&&l| l < p).map_or(self, |&l| Pace::PerSecond(l))
    }
}

impl fmt::Display for Pace {
    /// `10/s`, `2.5/s`, `unlimited`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Pace::Unlimited => write!(f, "unlimited"),
            Pace::PerSecond(p) => write!(f, "{p}/s"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Always at the newest step.
    Live,
    /// Held at a step while the store keeps growing.
    Paused,
    /// Moving forward at the pace; becomes `Live` on reaching the head.
    Playing,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Cursor {
    pub mode: Mode,
    /// The step shown when not live.
    at: usize,
    pub pace: Pace,
    /// Fraction of a step accumulated by playback.
    carry: f64,
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor { mode: Mode::Live, at: 0, pace: DEFAULT_PACE, carry: 0.0 }
    }
}

impl Cursor {
    /// From the first step at `pace`: playing, or live when the pace is unlimited.
    pub fn paced(pace: Pace) -> Self {
        let mode = if pace == Pace::Unlimited { Mode::Live } else { Mode::Playing };
        Cursor { mode, pace, ..Cursor::default() }
    }

    /// A cursor that plays the run from its first step at the default pace.
    pub fn playing() -> Self {
        Cursor::paced(DEFAULT_PACE)
    }

    /// The step index the view shows, given the run's head; `None` before any step.
    pub fn at(&self, head: Option<usize>) -> Option<usize> {
        let head = head?;
        Some(match self.mode {
            Mode::Live => head,
            _ => self.at.min(head),
        })
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

    /// Plays on from where the view stands, or goes live if the pace is unlimited.
    fn play(&mut self) {
        self.mode = if self.pace == Pace::Unlimited { Mode::Live } else { Mode::Playing };
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
            Mode::Paused => self.play(),
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
        let target =
            if k > start { start } else { run.block_steps(block.saturating_sub(1)).start.min(k) };
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

    /// `r`: play from the first step at the current pace.
    pub fn replay(&mut self) {
        *self = Cursor { at: 0, ..self.clone() };
        self.play();
    }

    pub fn faster(&mut self) {
        self.pace = self.pace.faster();
        if self.mode == Mode::Playing && self.pace == Pace::Unlimited {
            self.play();
        }
    }

    pub fn slower(&mut self) {
        self.pace = self.pace.slower();
    }

    /// Advances playback by `dt`; true if the shown step changed.
    pub fn tick(&mut self, dt: Duration, head: Option<usize>) -> bool {
        let (Mode::Playing, Some(head)) = (self.mode, head) else { return false };
        let before = self.at;
        match self.pace.per_second() {
            Some(sps) => {
                self.carry += dt.as_secs_f64() * sps;
                let n = self.carry.floor();
                self.carry -= n;
                self.at = (self.at + n as usize).min(head);
            }
            None => self.at = head,
        }
        if self.at >= head {
            self.mode = Mode::Live;
            self.carry = 0.0;
        }
        self.at != before || self.mode == Mode::Live
    }

    /// How long until playback next moves a step, if it is playing.
    pub fn next_tick(&self) -> Option<Duration> {
        if self.mode != Mode::Playing {
            return None;
        }
        let left = match self.pace.per_second() {
            Some(sps) => (1.0 - self.carry).max(0.0) / sps,
            None => 0.0,
        };
        Some(Duration::from_secs_f64(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::store::Store;
    use crate::trace::synth::{self, Synth};

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
        assert!(c.tick(Duration::from_millis(200), r.head()), "10 steps/s for 0.2 s is two steps");
        assert_eq!(c.at(r.head()), Some(2));
        c.toggle_pause(r);
        assert_eq!(c.mode, Mode::Paused);
        assert!(!c.tick(Duration::from_secs(10), r.head()), "paused does not move");
        c.toggle_pause(r);
        c.tick(Duration::from_secs(60), r.head());
        assert_eq!(c.mode, Mode::Live);
    }

    #[test]
    fn replay_restarts_at_the_chosen_pace() {
        let s = store();
        let r = s.run().unwrap();
        let mut c = Cursor::default();
        c.faster();
        c.faster();
        c.replay();
        assert_eq!(c.at(r.head()), Some(0));
        assert_eq!(c.pace, Pace::PerSecond(50.0));
        assert!(!c.tick(Duration::from_millis(10), r.head()), "half a step: nothing yet");
        assert!(c.tick(Duration::from_millis(10), r.head()));
        assert_eq!(c.at(r.head()), Some(1));
        assert!(c.next_tick().unwrap() <= Duration::from_millis(20));
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
    fn pace_walks_the_ladder_to_unlimited_and_back() {
        let mut p = Pace::new(3.0).unwrap();
        p = p.faster();
        assert_eq!(p, Pace::PerSecond(5.0), "from off the ladder to the next rung up");
        for _ in 0..20 {
            p = p.slower();
        }
        assert_eq!(p, Pace::PerSecond(1.0), "the slowest stays");
        for _ in 0..9 {
            p = p.faster();
        }
        assert_eq!(p, Pace::PerSecond(1000.0));
        assert_eq!(p.faster(), Pace::Unlimited);
        assert_eq!(Pace::Unlimited.faster(), Pace::Unlimited);
        assert_eq!(Pace::Unlimited.slower(), Pace::PerSecond(1000.0));
        assert_eq!(Pace::new(0.5).unwrap().slower(), Pace::PerSecond(0.5));
        assert_eq!(
            (Pace::PerSecond(10.0).to_string(), Pace::PerSecond(2.5).to_string()),
            ("10/s".into(), "2.5/s".into())
        );
    }

    #[test]
    fn pace_flag_values() {
        assert_eq!(Pace::new(0.0), Ok(Pace::Unlimited));
        assert_eq!(Pace::new(8.0), Ok(Pace::PerSecond(8.0)));
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let e = Pace::new(bad).unwrap_err();
            assert!(e.starts_with(&format!("--pace {bad}: must be 0")), "{e}");
        }
    }

    /// The pacer: a decode whose 26 steps all arrived at once is shown one step per 1/pace
    /// seconds, whatever the ticks' spacing, and goes live on reaching the head.
    #[test]
    fn the_view_follows_the_head_at_the_pace() {
        let s = store();
        let r = s.run().unwrap();
        let head = r.head();
        let mut c = Cursor::paced(Pace::PerSecond(8.0));
        assert_eq!((c.mode, c.at(head)), (Mode::Playing, Some(0)));
        for (dt_ms, want) in [(100, 0), (30, 1), (250, 3), (1000, 11), (1, 11)] {
            c.tick(Duration::from_millis(dt_ms), head);
            assert_eq!(c.at(head), Some(want), "after another {dt_ms} ms");
        }
        assert_eq!(c.behind(head), 25 - 11);
        assert!(c.tick(Duration::from_secs(2), head));
        assert_eq!((c.mode, c.at(head)), (Mode::Live, head), "caught up: live");
        // Before the first step there is nothing to walk, and no time is banked.
        let mut c = Cursor::paced(Pace::PerSecond(8.0));
        assert!(!c.tick(Duration::from_secs(5), None));
        assert_eq!(c.at(head), Some(0));
        assert_eq!(Cursor::paced(Pace::Unlimited).mode, Mode::Live);
    }

    #[test]
    fn faster_past_the_ladder_goes_live() {
        let s = store();
        let r = s.run().unwrap();
        let mut c = Cursor::paced(Pace::PerSecond(1000.0));
        c.faster();
        assert_eq!((c.mode, c.at(r.head())), (Mode::Live, r.head()));
        c.slower();
        assert_eq!(c.pace, Pace::PerSecond(1000.0));
    }
}
