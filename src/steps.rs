//! The per-step list: one line per denoising step, in decode order, with the texts it committed
//! (`unmask steps`, the TUI's Steps panel). Pure: events in, lines out.
//!
//! Numbering, as people (and SDAR, SGLang, JetEngine) count: the step over the decode and the
//! step within its block are 1-based; the block is the trace's block index (0-based, prompt
//! blocks included), the same number the TUI's grid labels rows with; positions are the trace's
//! absolute positions.

use serde::Serialize;

use crate::events::{Event, StepEvent};
use crate::settings::DecodeSettings;
use crate::store::{CellState, Run};

/// One denoising step as a person reads it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepLine {
    /// 1-based step over the whole decode.
    pub step: usize,
    /// Block index as in the trace (0-based, prompt blocks included).
    pub block: usize,
    /// 1-based step within the block.
    pub block_step: usize,
    /// The most steps the block may take (`--steps`, at most the block length, for strategies
    /// that follow the schedule; one a position for those that loop until no mask is left); a
    /// dynamic strategy may finish a block in fewer.
    pub block_steps: usize,
    /// Running count of forward passes, this one included.
    pub forward: usize,
    /// Absolute positions committed, ascending.
    pub pos: Vec<usize>,
    /// Their texts, in the same (position) order.
    pub texts: Vec<String>,
    /// Their confidences, in the same order.
    pub conf: Vec<f32>,
}

impl StepLine {
    /// `step 13 · block 3 · step 1/4 · fwd 13  ["To", " find"]`: the texts as a JSON array.
    pub fn text(&self) -> String {
        let texts: Vec<String> =
            self.texts.iter().map(|t| serde_json::to_string(t).expect("a string serialises")).collect();
        format!(
            "step {} · block {} · step {}/{} · fwd {}  [{}]",
            self.step,
            self.block,
            self.block_step,
            self.block_steps,
            self.forward,
            texts.join(", ")
        )
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("a step line serialises")
    }
}

/// Turns events into step lines as they come, so a live decode prints each step at once.
#[derive(Debug, Default)]
pub struct StepLines {
    /// Settings in force for the current block (a step event carries them when they change).
    settings: Option<DecodeSettings>,
    /// Steps seen since the last header.
    count: usize,
}

impl StepLines {
    pub fn new() -> Self {
        StepLines::default()
    }

    /// The line for `ev` if it is a step; a header (a new run) restarts the count.
    pub fn push(&mut self, ev: &Event) -> Option<StepLine> {
        match ev {
            Event::Header(h) => {
                *self = StepLines { settings: Some(h.settings.clone()), count: 0 };
                None
            }
            Event::Step(s) => Some(self.line(s)),
            _ => None,
        }
    }

    fn line(&mut self, s: &StepEvent) -> StepLine {
        if let Some(new) = &s.settings {
            self.settings = Some(new.clone());
        }
        self.count += 1;
        let budget = self.settings.as_ref().map_or(0, DecodeSettings::step_budget);
        let mut committed: Vec<_> = s.committed.iter().collect();
        committed.sort_by_key(|c| c.pos);
        StepLine {
            step: self.count,
            block: s.block,
            block_step: s.step + 1,
            block_steps: budget.max(s.step + 1),
            forward: s.forward,
            pos: committed.iter().map(|c| c.pos).collect(),
            // A token holding part of a character shows its bytes (`<E2 89>`), as the grid's
            // candidates do, not the `�` its own text decodes to.
            texts: committed.iter().map(|c| c.bytes.as_deref().map_or_else(|| c.text.clone(), crate::detok::hex)).collect(),
            conf: committed.iter().map(|c| c.conf).collect(),
        }
    }
}

/// The line of step index `k` (0-based over the decode) from the store: what the TUI's Steps
/// panel shows, equal to what `lines` makes of the same events.
pub fn from_run(run: &Run, k: usize) -> Option<StepLine> {
    let s = run.step(k)?;
    let b = run.block_length();
    let committed: Vec<_> = (s.block * b..(s.block + 1) * b)
        .filter_map(|pos| match run.cell(pos, Some(k)) {
            CellState::Decoded(d) if d.at == k => Some((pos, d)),
            _ => None,
        })
        .collect();
    Some(StepLine {
        step: k + 1,
        block: s.block,
        block_step: s.step + 1,
        block_steps: run.settings_for(s.block).0.step_budget().max(s.step + 1),
        forward: s.forward,
        pos: committed.iter().map(|(p, _)| *p).collect(),
        texts: committed.iter().map(|(_, d)| run.token_label(d.token).into_owned()).collect(),
        conf: committed.iter().map(|(_, d)| d.conf).collect(),
    })
}

/// Every step line of the events (restarts included, each run counted from 1).
pub fn lines(events: &[Event]) -> Vec<StepLine> {
    let mut s = StepLines::new();
    events.iter().filter_map(|e| s.push(e)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Committed;
    use crate::synth::{self, Synth};

    fn commit(pos: usize, text: &str) -> Committed {
        Committed { pos, token: pos as u32, text: text.into(), bytes: None, conf: 0.5, entropy: 0.1, top: vec![], routes: vec![] }
    }

    #[test]
    fn a_step_reads_as_the_seed_wrote_it() {
        let l = StepLine {
            step: 13,
            block: 3,
            block_step: 1,
            block_steps: 4,
            forward: 13,
            pos: vec![12, 13],
            texts: vec!["To".into(), " find".into()],
            conf: vec![0.9, 0.8],
        };
        assert_eq!(l.text(), r#"step 13 · block 3 · step 1/4 · fwd 13  ["To", " find"]"#);
        assert_eq!(
            l.json(),
            r#"{"step":13,"block":3,"block_step":1,"block_steps":4,"forward":13,"pos":[12,13],"texts":["To"," find"],"conf":[0.9,0.8]}"#
        );
    }

    #[test]
    fn texts_are_in_position_order_and_escaped_as_json() {
        let mut events = synth::trace(&Synth::small());
        let Some(Event::Step(s)) = events.iter_mut().find(|e| matches!(e, Event::Step(_))) else { panic!() };
        s.committed = vec![commit(7, "."), commit(5, "\n"), commit(6, "say \"hi\"")];
        let l = &lines(&events)[0];
        assert_eq!(l.pos, vec![5, 6, 7]);
        assert!(l.text().ends_with(r#"  ["\n", "say \"hi\"", "."]"#), "{}", l.text());
    }

    #[test]
    fn steps_count_from_one_over_the_decode_and_restart_with_a_new_run() {
        let events = synth::trace(&Synth::small());
        let ls = lines(&events);
        let n = events.iter().filter(|e| matches!(e, Event::Step(_))).count();
        assert_eq!(ls.iter().map(|l| l.step).collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>());
        assert!(ls.iter().all(|l| (1..=l.block_steps).contains(&l.block_step)));
        let twice: Vec<Event> = events.iter().chain(&events).cloned().collect();
        let ls2 = lines(&twice);
        assert_eq!(ls2.len(), 2 * n);
        assert_eq!(ls2[n].step, 1);
    }

    #[test]
    fn the_store_gives_the_same_lines_as_the_events() {
        let mut cfg = Synth::small();
        cfg.change_at = Some((cfg.prompt.len() / cfg.block_length + 2, 2));
        let events = synth::trace(&cfg);
        let store = crate::store::Store::from_events(events.clone());
        let run = store.run().unwrap();
        let from_store: Vec<StepLine> = (0..run.steps().len()).map(|k| from_run(run, k).unwrap()).collect();
        assert_eq!(from_store, lines(&events));
        assert_eq!(from_run(run, run.steps().len()), None);
    }

    #[test]
    fn a_settings_change_changes_the_step_budget_from_its_block_on() {
        let mut cfg = Synth::small();
        let change = cfg.prompt.len() / cfg.block_length + 2;
        cfg.change_at = Some((change, 2));
        let ls = lines(&synth::trace(&cfg));
        assert!(ls.iter().filter(|l| l.block < change).all(|l| l.block_steps == cfg.steps));
        assert!(ls.iter().filter(|l| l.block >= change).all(|l| l.block_steps == 2));
    }

    /// Strategies that loop until no mask is left may take one step a position, whatever
    /// `--steps` says (entropy_bounded showed "step 2/1").
    #[test]
    fn the_budget_of_a_strategy_that_ignores_the_schedule_is_one_step_a_position() {
        use crate::settings::Strategy;
        let s = |strategy, steps| DecodeSettings { strategy, steps, block_length: 4, ..DecodeSettings::default() };
        assert_eq!(s(Strategy::EntropyBounded, 1).step_budget(), 4);
        assert_eq!(s(Strategy::LowConfidenceStatic, 2).step_budget(), 2);
        assert_eq!(s(Strategy::LowConfidenceDynamic, 8).step_budget(), 4);
        assert_eq!(s(Strategy::Sequential, 3).step_budget(), 3);
    }
}
