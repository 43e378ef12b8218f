//! Unmasking strategies: which masked positions of a block a denoising step commits.
//!
//! Where SDAR's generate.py (`block_diffusion_generate`) and lmdeploy
//! (`pytorch/strategies/dllm/unmasking.py`) disagree, [`Schedule`] picks one:
//! - static: SDAR spreads `masked % steps` over the first steps; lmdeploy commits
//!   `max(1, block_length / steps)` every step.
//! - dynamic: SDAR takes every position over the threshold only if there are at least the
//!   scheduled count of them, else the top scheduled count; lmdeploy ignores the schedule and
//!   takes the best position plus every one at or over the threshold.
//! - SDAR can pick already-decoded positions when the count exceeds the masks left; here the
//!   count is capped, and only masked positions are ever candidates.

use crate::settings::{Schedule, Strategy};

/// What a strategy knows about one position of the block at this step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cell {
    pub masked: bool,
    pub conf: f32,
    pub entropy: f32,
}

/// Everything a strategy needs besides the cells.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepRule {
    pub strategy: Strategy,
    pub schedule: Schedule,
    pub threshold: f32,
    pub eb_threshold: f32,
    pub block_length: usize,
    pub steps: usize,
}

impl StepRule {
    /// The part of the decode settings a strategy reads.
    pub fn from_settings(s: &crate::settings::DecodeSettings) -> Self {
        StepRule {
            strategy: s.strategy,
            schedule: s.schedule,
            threshold: s.threshold,
            eb_threshold: s.eb_threshold,
            block_length: s.block_length,
            steps: s.steps,
        }
    }

    /// Whether the strategy follows the per-step counts of the schedule.
    pub fn follows_schedule(&self) -> bool {
        match self.strategy {
            Strategy::Sequential | Strategy::LowConfidenceStatic => true,
            Strategy::LowConfidenceDynamic => self.schedule == Schedule::Sdar,
            Strategy::EntropyBounded => false,
        }
    }

    /// Positions to commit at step `step` of a block that had `masked_at_start` masks.
    /// `k` is the scheduled count; the result is never empty while a mask is left.
    pub fn scheduled(&self, step: usize, masked_at_start: usize) -> usize {
        match self.schedule {
            Schedule::Sdar => {
                let budget = self.steps.min(masked_at_start).max(1);
                let (base, extra) = (masked_at_start / budget, masked_at_start % budget);
                base + usize::from(step < extra)
            }
            Schedule::Lmdeploy => (self.block_length / self.steps).max(1),
        }
    }

    /// Indices (into `cells`) to commit, ascending. Empty only when no cell is masked.
    pub fn select(&self, cells: &[Cell], step: usize, masked_at_start: usize) -> Vec<usize> {
        let masked: Vec<usize> = (0..cells.len()).filter(|&i| cells[i].masked).collect();
        if masked.is_empty() {
            return vec![];
        }
        let k = self.scheduled(step, masked_at_start).clamp(1, masked.len());
        let mut picked = match self.strategy {
            Strategy::Sequential => masked[..k].to_vec(),
            Strategy::LowConfidenceStatic => top_by_confidence(cells, &masked, k),
            Strategy::LowConfidenceDynamic => self.dynamic(cells, &masked, k),
            Strategy::EntropyBounded => self.entropy_bounded(cells, &masked),
        };
        picked.sort_unstable();
        picked
    }

    fn dynamic(&self, cells: &[Cell], masked: &[usize], k: usize) -> Vec<usize> {
        match self.schedule {
            Schedule::Sdar => {
                let over: Vec<usize> =
                    masked.iter().copied().filter(|&i| cells[i].conf > self.threshold).collect();
                if over.len() >= k {
                    over
                } else {
                    top_by_confidence(cells, masked, k)
                }
            }
            Schedule::Lmdeploy => {
                let best = top_by_confidence(cells, masked, 1)[0];
                let mut picked: Vec<usize> = masked
                    .iter()
                    .copied()
                    .filter(|&i| i != best && cells[i].conf >= self.threshold)
                    .collect();
                picked.push(best);
                picked
            }
        }
    }

    fn entropy_bounded(&self, cells: &[Cell], masked: &[usize]) -> Vec<usize> {
        let mut order = masked.to_vec();
        order.sort_by(|&a, &b| cells[a].entropy.total_cmp(&cells[b].entropy).then(a.cmp(&b)));
        let mut cum = 0.0f32;
        let mut take = 0;
        for &i in &order {
            cum += cells[i].entropy;
            if cum > self.eb_threshold {
                break;
            }
            take += 1;
        }
        order.truncate(take.max(1));
        order
    }
}

/// The `k` masked positions of highest confidence; a tie goes to the lower position and NaN
/// ranks last.
fn top_by_confidence(cells: &[Cell], masked: &[usize], k: usize) -> Vec<usize> {
    let key = |i: usize| if cells[i].conf.is_nan() { f32::NEG_INFINITY } else { cells[i].conf };
    let mut order = masked.to_vec();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order.truncate(k);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(strategy: Strategy, schedule: Schedule) -> StepRule {
        StepRule {
            strategy,
            schedule,
            threshold: 0.5,
            eb_threshold: 0.35,
            block_length: 4,
            steps: 4,
        }
    }

    fn cells(confs: &[f32], masked: &[bool]) -> Vec<Cell> {
        confs
            .iter()
            .zip(masked)
            .map(|(&conf, &masked)| Cell { masked, conf, entropy: 1.0 - conf })
            .collect()
    }

    const ALL_MASKED: [bool; 4] = [true; 4];

    #[test]
    fn sdar_schedule_spreads_the_remainder_over_the_first_steps() {
        let r = StepRule { block_length: 8, steps: 3, ..rule(Strategy::Sequential, Schedule::Sdar) };
        let counts: Vec<usize> = (0..3).map(|s| r.scheduled(s, 8)).collect();
        assert_eq!(counts, vec![3, 3, 2]);
        // a prompt tail left 2 masks: the budget shrinks to 2 steps of 1.
        let counts: Vec<usize> = (0..2).map(|s| r.scheduled(s, 2)).collect();
        assert_eq!(counts, vec![1, 1]);
    }

    #[test]
    fn lmdeploy_schedule_is_flat_and_at_least_one() {
        let r = StepRule { block_length: 8, steps: 3, ..rule(Strategy::Sequential, Schedule::Lmdeploy) };
        assert_eq!(r.scheduled(0, 8), 2);
        assert_eq!(r.scheduled(5, 8), 2);
        let r = StepRule { block_length: 4, steps: 8, ..r };
        assert_eq!(r.scheduled(0, 4), 1);
    }

    #[test]
    fn sequential_goes_left_to_right_over_masks() {
        let r = rule(Strategy::Sequential, Schedule::Sdar);
        let c = cells(&[0.9, 0.1, 0.8, 0.2], &[false, true, true, true]);
        assert_eq!(r.select(&c, 0, 3), vec![1]);
        let c = cells(&[0.9, 0.1, 0.8, 0.2], &[false, false, true, true]);
        assert_eq!(r.select(&c, 1, 3), vec![2]);
    }

    #[test]
    fn static_takes_most_confident_masked_positions() {
        let r = rule(Strategy::LowConfidenceStatic, Schedule::Sdar);
        let c = cells(&[0.2, 0.9, 0.4, 0.7], &ALL_MASKED);
        assert_eq!(r.select(&c, 0, 4), vec![1]);
        // a decoded cell is never picked, however confident.
        let c = cells(&[0.2, 0.99, 0.4, 0.7], &[true, false, true, true]);
        assert_eq!(r.select(&c, 1, 4), vec![3]);
        // B=8, S=3 -> 3 at step 0.
        let r8 = StepRule { block_length: 8, steps: 3, ..r };
        let c8 = cells(&[0.1, 0.5, 0.9, 0.3, 0.8, 0.2, 0.7, 0.0], &[true; 8]);
        assert_eq!(r8.select(&c8, 0, 8), vec![2, 4, 6]);
    }

    #[test]
    fn static_ties_go_to_the_lower_position_and_nan_ranks_last() {
        let r = rule(Strategy::LowConfidenceStatic, Schedule::Sdar);
        let c = cells(&[0.5, 0.5, 0.5, 0.5], &ALL_MASKED);
        assert_eq!(r.select(&c, 0, 4), vec![0]);
        let c = cells(&[f32::NAN, 0.01, f32::NAN, 0.0], &ALL_MASKED);
        assert_eq!(r.select(&c, 0, 4), vec![1]);
    }

    #[test]
    fn count_is_capped_at_the_masks_left() {
        // lmdeploy B=4 S=1 -> k=4, only 2 masks left.
        let r = StepRule { steps: 1, ..rule(Strategy::LowConfidenceStatic, Schedule::Lmdeploy) };
        let c = cells(&[0.9, 0.1, 0.8, 0.2], &[false, true, false, true]);
        assert_eq!(r.select(&c, 0, 2), vec![1, 3]);
    }

    #[test]
    fn sdar_dynamic_takes_all_over_threshold_or_falls_back_to_top_k() {
        let r = rule(Strategy::LowConfidenceDynamic, Schedule::Sdar);
        let c = cells(&[0.6, 0.9, 0.4, 0.7], &ALL_MASKED);
        assert_eq!(r.select(&c, 0, 4), vec![0, 1, 3]);
        // none over: the scheduled single best.
        let c = cells(&[0.1, 0.3, 0.2, 0.05], &ALL_MASKED);
        assert_eq!(r.select(&c, 0, 4), vec![1]);
        // threshold is strict in SDAR mode.
        let c = cells(&[0.5, 0.5, 0.1, 0.1], &ALL_MASKED);
        assert_eq!(r.select(&c, 0, 4), vec![0]);
        // B=8 S=2 -> k=4 but only 2 over: top 4 instead.
        let r8 = StepRule { block_length: 8, steps: 2, ..r };
        let c8 = cells(&[0.9, 0.8, 0.1, 0.4, 0.3, 0.2, 0.0, 0.45], &[true; 8]);
        assert_eq!(r8.select(&c8, 0, 8), vec![0, 1, 3, 7]);
    }

    #[test]
    fn lmdeploy_dynamic_takes_best_plus_all_at_threshold() {
        let r = rule(Strategy::LowConfidenceDynamic, Schedule::Lmdeploy);
        let c = cells(&[0.5, 0.2, 0.49, 0.3], &ALL_MASKED);
        assert_eq!(r.select(&c, 0, 4), vec![0]);
        let c = cells(&[0.1, 0.2, 0.3, 0.25], &ALL_MASKED);
        assert_eq!(r.select(&c, 0, 4), vec![2], "at least one");
        let c = cells(&[0.5, 0.9, 0.5, 0.3], &[true, true, true, false]);
        assert_eq!(r.select(&c, 0, 3), vec![0, 1, 2]);
        assert!(!r.follows_schedule());
    }

    #[test]
    fn entropy_bounded_takes_the_low_entropy_prefix() {
        let r = rule(Strategy::EntropyBounded, Schedule::Sdar);
        let mut c = cells(&[0.0; 4], &ALL_MASKED);
        for (cell, h) in c.iter_mut().zip([0.3, 0.05, 2.0, 0.1]) {
            cell.entropy = h;
        }
        // sorted: 1 (0.05), 3 (0.15 cum), 0 (0.45 cum > 0.35): take 1 and 3.
        assert_eq!(r.select(&c, 0, 4), vec![1, 3]);
        // everything above the bound still commits one.
        for cell in &mut c {
            cell.entropy = 5.0;
        }
        assert_eq!(r.select(&c, 0, 4), vec![0]);
        assert!(!r.follows_schedule());
    }

    #[test]
    fn nothing_masked_selects_nothing() {
        for s in Strategy::ALL {
            let r = rule(s, Schedule::Sdar);
            assert!(r.select(&cells(&[0.5; 4], &[false; 4]), 0, 0).is_empty());
        }
    }
}
