//! Two decodes of the same prompt, compared: where the outputs diverge, what each spent in
//! forwards and steps, block by block, and cell by cell which output tokens differ and which
//! are the same token decoded at another step. Pure: two event lists in, a comparison out.
//!
//! With token editing a position's token can change after its commit: every judgment here is
//! on the final tokens (the finish event's output, the block events' tokens) and the step that
//! set each (its commit, or its last edit), and the cells either side edited are listed.

use std::collections::HashMap;

use crate::trace::events::{Event, FinishEvent, Header};

#[derive(Clone, Debug, PartialEq)]
pub struct RunSummary {
    pub settings: String,
    pub output_ids: Vec<u32>,
    pub forwards: usize,
    pub steps: usize,
    pub blocks: usize,
    pub reason: String,
    pub elapsed_ms: f64,
    /// Whether this run sampled (temperature > 0): then its tokens also depend on random draws.
    pub sampled: bool,
}

impl RunSummary {
    pub fn tokens_per_forward(&self) -> f64 {
        if self.forwards == 0 {
            0.0
        } else {
            self.output_ids.len() as f64 / self.forwards as f64
        }
    }
}

/// One block as both runs decoded it.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockPair {
    pub block: usize,
    /// Denoising steps each run took on this block (`None`: that run never reached it).
    pub steps: [Option<usize>; 2],
    /// Whether both runs committed the same tokens in this block.
    pub same_tokens: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub runs: [RunSummary; 2],
    /// Index (into the output) of the first token where the two differ; `None` if one output
    /// is a prefix of the other.
    pub first_divergence: Option<usize>,
    pub blocks: Vec<BlockPair>,
    /// Output cells both runs decoded to the same token, at a different step of its block.
    pub other_step: Vec<CellPair>,
    /// Output cells where the runs decoded different tokens.
    pub other_token: Vec<CellPair>,
    /// Output cells that either run edited (replaced the token of after its commit).
    pub edited: Vec<CellEdits>,
    /// Edits each run made, over every position.
    pub edits: [usize; 2],
}

/// An output cell that a run edited: how many times each replaced its token.
#[derive(Clone, Debug, PartialEq)]
pub struct CellEdits {
    pub index: usize,
    /// Absolute position in run A.
    pub pos: usize,
    pub edits: [usize; 2],
}

impl Comparison {
    /// Whether either side sampled: the two then differ by their random draws too, not only
    /// by their settings.
    pub fn sampled(&self) -> bool {
        self.runs.iter().any(|r| r.sampled)
    }
}

/// One output cell as both runs decoded it.
#[derive(Clone, Debug, PartialEq)]
pub struct CellPair {
    /// Index among the output tokens (0: the first token after the prompt).
    pub index: usize,
    /// Absolute position in each run (they differ only if the prompts do).
    pub pos: usize,
    pub tokens: [u32; 2],
    /// The step within its block (0-based) at which each run set its final token (committed
    /// it, or last edited it); `None` where the trace has no step event that did.
    pub steps: [Option<usize>; 2],
}

/// What one run did: header, blocks, the step (within its block) that set each position's
/// final token and how many edits it had, finish.
struct RunEvents<'a> {
    header: Option<&'a Header>,
    blocks: Vec<BlockRow>,
    committed_at: HashMap<usize, usize>,
    edits_of: HashMap<usize, usize>,
    edits: usize,
    finish: Option<&'a FinishEvent>,
}

/// A block as one run committed it: (index, steps taken, tokens).
type BlockRow = (usize, usize, Vec<u32>);

fn last_run(events: &[Event]) -> RunEvents<'_> {
    let start = events.iter().rposition(|e| matches!(e, Event::Header(_))).unwrap_or(0);
    let mut run = RunEvents {
        header: None,
        blocks: Vec::new(),
        committed_at: HashMap::new(),
        edits_of: HashMap::new(),
        edits: 0,
        finish: None,
    };
    for e in &events[start..] {
        match e {
            Event::Header(h) => run.header = Some(h),
            Event::Block(b) => run.blocks.push((b.block, b.steps, b.tokens.clone())),
            Event::Finish(f) => run.finish = Some(f),
            Event::Step(s) => {
                run.committed_at.extend(s.committed.iter().map(|c| (c.pos, s.step)));
                // A later edit's step is the final token's.
                run.committed_at.extend(s.edited.iter().map(|c| (c.pos, s.step)));
                for c in &s.edited {
                    *run.edits_of.entry(c.pos).or_default() += 1;
                }
                run.edits += s.edited.len();
            }
        }
    }
    run
}

impl RunEvents<'_> {
    fn prompt_len(&self) -> usize {
        self.header.map_or(0, |h| h.prompt_ids.len())
    }
}

/// The output cells both runs have, split into same token at another step and other token.
fn cell_pairs(a: &RunEvents, b: &RunEvents, out: [&[u32]; 2]) -> (Vec<CellPair>, Vec<CellPair>) {
    let (mut other_step, mut other_token) = (Vec::new(), Vec::new());
    for (index, (&x, &y)) in out[0].iter().zip(out[1]).enumerate() {
        let [pa, pb] = [a.prompt_len() + index, b.prompt_len() + index];
        let steps = [a.committed_at.get(&pa).copied(), b.committed_at.get(&pb).copied()];
        let pair = CellPair { index, pos: pa, tokens: [x, y], steps };
        if x != y {
            other_token.push(pair);
        } else if steps[0] != steps[1] {
            other_step.push(pair);
        }
    }
    (other_step, other_token)
}

fn summary(header: Option<&Header>, blocks: usize, finish: Option<&FinishEvent>) -> RunSummary {
    RunSummary {
        settings: header.map(|h| h.settings.summary()).unwrap_or_default(),
        output_ids: finish.map(|f| f.output_ids.clone()).unwrap_or_default(),
        forwards: finish.map_or(0, |f| f.forwards),
        steps: finish.map_or(0, |f| f.steps),
        blocks,
        reason: finish
            .map(|f| format!("{:?}", f.reason).to_lowercase())
            .unwrap_or_else(|| "unfinished".into()),
        elapsed_ms: finish.map_or(0.0, |f| f.elapsed_ms),
        sampled: header.is_some_and(|h| !h.settings.sampling.is_greedy()),
    }
}

pub fn compare(a: &[Event], b: &[Event]) -> Comparison {
    let (ra, rb) = (last_run(a), last_run(b));
    let runs = [
        summary(ra.header, ra.blocks.len(), ra.finish),
        summary(rb.header, rb.blocks.len(), rb.finish),
    ];
    let (other_step, other_token) =
        cell_pairs(&ra, &rb, [&runs[0].output_ids, &runs[1].output_ids]);
    let out = runs[0].output_ids.len().max(runs[1].output_ids.len());
    let edited = (0..out)
        .filter_map(|index| {
            let [pa, pb] = [ra.prompt_len() + index, rb.prompt_len() + index];
            let edits = [
                ra.edits_of.get(&pa).copied().filter(|_| index < runs[0].output_ids.len()),
                rb.edits_of.get(&pb).copied().filter(|_| index < runs[1].output_ids.len()),
            ];
            (edits != [None, None]).then(|| CellEdits {
                index,
                pos: pa,
                edits: edits.map(|e| e.unwrap_or(0)),
            })
        })
        .collect();
    let (ba, bb) = (&ra.blocks, &rb.blocks);
    let first_divergence =
        runs[0].output_ids.iter().zip(&runs[1].output_ids).position(|(x, y)| x != y);
    let last = ba.iter().chain(bb.iter()).map(|b| b.0).max();
    let first = ba.iter().chain(bb.iter()).map(|b| b.0).min();
    let blocks = match (first, last) {
        (Some(first), Some(last)) => (first..=last)
            .map(|block| {
                let x = ba.iter().find(|b| b.0 == block);
                let y = bb.iter().find(|b| b.0 == block);
                BlockPair {
                    block,
                    steps: [x.map(|b| b.1), y.map(|b| b.1)],
                    same_tokens: matches!((x, y), (Some(x), Some(y)) if x.2 == y.2),
                }
            })
            .collect(),
        _ => vec![],
    };
    Comparison {
        runs,
        first_divergence,
        blocks,
        other_step,
        other_token,
        edited,
        edits: [ra.edits, rb.edits],
    }
}

/// How many cells the headless summary lists by position.
const LISTED: usize = 5;

/// `12 (first: pos 40 steps 2/3, pos 41 steps 1/2, …)`: a count and the first cells, steps
/// 1-based as A/B.
fn cell_list(cells: &[CellPair], with_steps: bool) -> String {
    if cells.is_empty() {
        return "0".into();
    }
    let step = |s: Option<usize>| s.map_or("-".to_string(), |s| (s + 1).to_string());
    let shown: Vec<String> = cells
        .iter()
        .take(LISTED)
        .map(|c| match with_steps {
            true => format!("pos {} steps {}/{}", c.pos, step(c.steps[0]), step(c.steps[1])),
            false => format!("pos {}", c.pos),
        })
        .collect();
    let more = if cells.len() > LISTED { ", …" } else { "" };
    format!("{} (first: {}{more})", cells.len(), shown.join(", "))
}

/// `3 (first: pos 6 edits 1/0, pos 9 edits 2/1)`: output cells either side edited, and how
/// many times each did.
fn edited_list(cells: &[CellEdits]) -> String {
    if cells.is_empty() {
        return "0".into();
    }
    let shown: Vec<String> = cells
        .iter()
        .take(LISTED)
        .map(|c| format!("pos {} edits {}/{}", c.pos, c.edits[0], c.edits[1]))
        .collect();
    let more = if cells.len() > LISTED { ", …" } else { "" };
    format!("{} (first: {}{more})", cells.len(), shown.join(", "))
}

/// The line that says the sides' random draws differ too, when either samples.
pub const SAMPLED_NOTE: &str =
    "sampled (temperature > 0): the sides also differ by their random draws";

/// The comparison as a plain-text table (`unmask compare --headless`).
pub fn table(c: &Comparison, texts: [&str; 2]) -> String {
    let [a, b] = &c.runs;
    let w = a.settings.len().max(12) + 2;
    let row = |name: &str, x: String, y: String| format!("{name:<18} {x:<w$} {y}\n");
    let mut s = row("", "A".into(), "B".into());
    s += &row("settings", a.settings.clone(), b.settings.clone());
    s += &row("tokens", a.output_ids.len().to_string(), b.output_ids.len().to_string());
    s += &row("forwards", a.forwards.to_string(), b.forwards.to_string());
    s += &row("steps", a.steps.to_string(), b.steps.to_string());
    s += &row("blocks", a.blocks.to_string(), b.blocks.to_string());
    s += &row(
        "tokens/forward",
        format!("{:.3}", a.tokens_per_forward()),
        format!("{:.3}", b.tokens_per_forward()),
    );
    s += &row("finish", a.reason.clone(), b.reason.clone());
    s += &row("elapsed ms", format!("{:.1}", a.elapsed_ms), format!("{:.1}", b.elapsed_ms));
    s += &match c.first_divergence {
        // counted from 1, as steps are on screen ("the 1st output token")
        Some(i) => format!("outputs diverge at output token {}\n", i + 1),
        None if a.output_ids == b.output_ids => "outputs are identical\n".to_string(),
        None => "one output is a prefix of the other\n".to_string(),
    };
    let differing: Vec<String> =
        c.blocks.iter().filter(|p| !p.same_tokens).map(|p| p.block.to_string()).collect();
    s += &format!(
        "blocks that differ: {}\n",
        if differing.is_empty() { "none".to_string() } else { differing.join(" ") }
    );
    s += "steps per block (A/B): ";
    s += &c
        .blocks
        .iter()
        .map(|p| {
            let f = |x: Option<usize>| x.map_or("-".to_string(), |v| v.to_string());
            format!("{}:{}/{}", p.block, f(p.steps[0]), f(p.steps[1]))
        })
        .collect::<Vec<_>>()
        .join(" ");
    s += "\n";
    s += &format!("same token, other step (A/B): {}\n", cell_list(&c.other_step, true));
    s += &format!("different token: {}\n", cell_list(&c.other_token, false));
    if c.edits != [0, 0] {
        s += &format!("edits (A/B): {}/{}\n", c.edits[0], c.edits[1]);
        s += &format!("edited output cells: {}\n", edited_list(&c.edited));
    }
    if c.sampled() {
        s += SAMPLED_NOTE;
        s += "\n";
    }
    for (name, t) in ["A", "B"].iter().zip(texts) {
        s += &format!("--- {name}\n{t}\n");
    }
    s
}

/// The comparison as one JSON object (`compare --headless --json`): what [`table`] prints, in
/// fields. Counted as people count, like every export: `first_divergence` and each cell's
/// `index` from 1 (the 1st output token), each `block_step` from 1; `block` and `pos` are the
/// trace's (0-based, absolute).
pub fn json(c: &Comparison, texts: [&str; 2]) -> serde_json::Value {
    use serde_json::json;
    let side = |r: &RunSummary, text: &str| {
        json!({
            "settings": r.settings,
            "finish": r.reason,
            "output_tokens": r.output_ids.len(),
            "forwards": r.forwards,
            "steps": r.steps,
            "blocks": r.blocks,
            "tokens_per_forward": r.tokens_per_forward(),
            "elapsed_ms": r.elapsed_ms,
            "sampled": r.sampled,
            "output_ids": r.output_ids,
            "text": text,
        })
    };
    let cells = |cells: &[CellPair]| -> Vec<serde_json::Value> {
        cells
            .iter()
            .map(|p| {
                json!({
                    "index": p.index + 1,
                    "pos": p.pos,
                    "tokens": p.tokens,
                    "block_step": p.steps.map(|s| s.map(|s| s + 1)),
                })
            })
            .collect()
    };
    let [a, b] = &c.runs;
    json!({
        "a": side(a, texts[0]),
        "b": side(b, texts[1]),
        "identical": a.output_ids == b.output_ids,
        "first_divergence": c.first_divergence.map(|i| i + 1),
        "blocks": c.blocks.iter().map(|p| json!({
            "block": p.block,
            "steps": p.steps,
            "same_tokens": p.same_tokens,
        })).collect::<Vec<_>>(),
        "same_token_other_step": cells(&c.other_step),
        "different_token": cells(&c.other_token),
        "edits": c.edits,
        "edited": c.edited.iter().map(|e| json!({
            "index": e.index + 1,
            "pos": e.pos,
            "edits": e.edits,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::settings::DecodeSettings;
    use crate::trace::events::{BlockEvent, FinishReason, ModelInfo};

    fn run(blocks: &[(usize, usize, [u32; 2])], reason: FinishReason) -> Vec<Event> {
        let header = Header {
            version: 1,
            model: ModelInfo {
                source: "s".into(),
                model_type: "sdar".into(),
                vocab_size: 9,
                hidden_size: 1,
                num_layers: 1,
                num_params: 1,
                dtype: "f32".into(),
                compute: None,
                moe: None,
            },
            settings: DecodeSettings { block_length: 2, ..DecodeSettings::default() },
            mask_token_id: 9,
            eos_ids: vec![],
            prompt: String::new(),
            prompt_ids: vec![1, 2],
            prompt_pieces: vec![],
            prompt_bytes: None,
            first_block: 1,
            max_len: 8,
            device: "cpu".into(),
            chat: None,
            sources: Default::default(),
        };
        let mut ev = vec![Event::Header(Box::new(header))];
        let mut out = vec![];
        let mut fwd = 0;
        for &(block, steps, tokens) in blocks {
            fwd += steps;
            out.extend(tokens);
            ev.push(Event::Block(BlockEvent {
                block,
                start: block * 2,
                tokens: tokens.to_vec(),
                texts: None,
                steps,
                forward: fwd,
                t_ms: 0.0,
            }));
        }
        let steps = blocks.iter().map(|b| b.1).sum();
        ev.push(Event::Finish(FinishEvent {
            reason,
            output_ids: out,
            text: String::new(),
            forwards: fwd,
            blocks: blocks.len(),
            steps,
            elapsed_ms: 1.0,
            error: None,
        }));
        ev
    }

    #[test]
    fn finds_the_first_divergence_and_the_blocks_that_differ() {
        let a = run(&[(1, 2, [3, 4]), (2, 2, [5, 6]), (3, 1, [7, 8])], FinishReason::Length);
        let b = run(&[(1, 1, [3, 4]), (2, 2, [5, 0])], FinishReason::Eos);
        let c = compare(&a, &b);
        assert_eq!(c.first_divergence, Some(3));
        assert_eq!(
            c.blocks,
            vec![
                BlockPair { block: 1, steps: [Some(2), Some(1)], same_tokens: true },
                BlockPair { block: 2, steps: [Some(2), Some(2)], same_tokens: false },
                BlockPair { block: 3, steps: [Some(1), None], same_tokens: false },
            ]
        );
        assert_eq!((c.runs[0].forwards, c.runs[1].forwards), (5, 3));
        assert!((c.runs[1].tokens_per_forward() - 4.0 / 3.0).abs() < 1e-9);
        let t = table(&c, ["x", "y"]);
        assert!(t.contains("outputs diverge at output token 4\n"), "{t}");
        assert!(t.contains("blocks that differ: 2 3"), "{t}");
        assert!(t.contains("steps per block (A/B): 1:2/1 2:2/2 3:1/-"), "{t}");
        assert!(t.contains("finish             length"), "{t}");
    }

    #[test]
    fn json_holds_the_table_counted_from_one() {
        let a = run(&[(1, 2, [3, 4]), (2, 2, [5, 6]), (3, 1, [7, 8])], FinishReason::Length);
        let b = run(&[(1, 1, [3, 4]), (2, 2, [5, 0])], FinishReason::Eos);
        let c = compare(&a, &b);
        let v = json(&c, ["ta", "tb"]);
        assert_eq!(v["first_divergence"], 4, "the 4th output token, as the table says");
        assert_eq!(v["identical"], false);
        assert_eq!(
            (v["a"]["finish"].as_str(), v["b"]["finish"].as_str()),
            (Some("length"), Some("eos"))
        );
        assert_eq!(
            (v["a"]["text"].as_str(), v["b"]["output_tokens"].as_u64()),
            (Some("ta"), Some(4))
        );
        assert_eq!(
            v["blocks"][2],
            serde_json::json!({"block": 3, "steps": [1, null], "same_tokens": false})
        );
        let (x, y) = same_tokens_other_steps();
        let c = compare(&x, &y);
        let v = json(&c, ["", ""]);
        let cells = v["same_token_other_step"].as_array().unwrap();
        assert_eq!(cells.len(), c.other_step.len());
        for (j, p) in cells.iter().zip(&c.other_step) {
            assert_eq!(j["index"], p.index + 1);
            assert_eq!(j["block_step"][0], p.steps[0].unwrap() + 1);
            assert_eq!(j["block_step"][1], p.steps[1].unwrap() + 1);
        }
        assert!(table(&c, ["", ""]).contains(&format!("{}", c.other_step[0].index + 1)));
    }

    #[test]
    fn identical_runs_say_so() {
        let a = run(&[(1, 2, [3, 4])], FinishReason::Length);
        let c = compare(&a, &a);
        assert_eq!(c.first_divergence, None);
        assert!(table(&c, ["", ""]).contains("outputs are identical"));
    }

    /// Two synthetic decodes of one prompt that commit the same tokens, B in half the steps.
    fn same_tokens_other_steps() -> (Vec<Event>, Vec<Event>) {
        use crate::trace::synth::{trace, Synth};
        let a = trace(&Synth { new_tokens: 10, ..Synth::small() });
        let b = trace(&Synth { new_tokens: 10, steps: 2, ..Synth::small() });
        (a, b)
    }

    /// The step (within its block, 0-based) that committed `pos`, read straight off the events.
    fn step_of(events: &[Event], pos: usize) -> usize {
        events
            .iter()
            .find_map(|e| match e {
                Event::Step(s) if s.committed.iter().any(|c| c.pos == pos) => Some(s.step),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn same_tokens_at_other_steps_are_found_and_counted() {
        let (a, b) = same_tokens_other_steps();
        let c = compare(&a, &b);
        assert_eq!(c.runs[0].output_ids, c.runs[1].output_ids);
        assert_eq!(c.first_divergence, None);
        assert!(c.other_token.is_empty());
        // Every output cell decoded at a different step is listed, and only those.
        let expected: Vec<usize> = (6..16).filter(|&p| step_of(&a, p) != step_of(&b, p)).collect();
        assert!(!expected.is_empty());
        assert_eq!(c.other_step.iter().map(|p| p.pos).collect::<Vec<_>>(), expected);
        for p in &c.other_step {
            assert_eq!(p.steps, [Some(step_of(&a, p.pos)), Some(step_of(&b, p.pos))]);
            assert_eq!(p.index, p.pos - 6);
        }
        assert!(!c.sampled());
    }

    #[test]
    fn a_different_token_is_counted_apart_from_other_steps() {
        let (a, mut b) = same_tokens_other_steps();
        // B commits another token at position 9 (same step as before).
        for e in &mut b {
            match e {
                Event::Step(s) => {
                    s.committed.iter_mut().filter(|c| c.pos == 9).for_each(|c| c.token = 0)
                }
                Event::Finish(f) => f.output_ids[3] = 0,
                _ => {}
            }
        }
        let c = compare(&a, &b);
        assert_eq!(c.first_divergence, Some(3));
        assert_eq!(c.other_token.len(), 1);
        let d = &c.other_token[0];
        assert_eq!((d.pos, d.index, d.tokens[1]), (9, 3, 0));
        assert!(c.other_step.iter().all(|p| p.pos != 9));
        assert!(table(&c, ["", ""]).contains("\ndifferent token: 1 (first: pos 9)\n"));
    }

    #[test]
    fn headless_table_lists_both_kinds_of_cell_exactly() {
        let (a, b) = same_tokens_other_steps();
        let t = table(&compare(&a, &b), ["x", "y"]);
        let expected = r"                   A                                                        B
settings           low_confidence_dynamic block 4 steps 4 thr=0.85 greedy   low_confidence_dynamic block 4 steps 2 thr=0.85 greedy
tokens             10                                                       10
forwards           10                                                       5
steps              10                                                       5
blocks             3                                                        3
tokens/forward     1.000                                                    2.000
finish             length                                                   length
elapsed ms         75.0                                                     37.5
outputs are identical
blocks that differ: none
steps per block (A/B): 1:2/1 2:4/2 3:4/2
same token, other step (A/B): 5 (first: pos 6 steps 2/1, pos 8 steps 4/2, pos 9 steps 3/1, pos 13 steps 4/2, pos 15 steps 3/1)
different token: 0
--- A
x
--- B
y
";
        assert_eq!(t, expected);
        // Past five cells the list ends in an ellipsis.
        let many: Vec<CellPair> = (0..7)
            .map(|i| CellPair { index: i, pos: 6 + i, tokens: [1, 1], steps: [Some(0), None] })
            .collect();
        assert_eq!(
            cell_list(&many, true),
            "7 (first: pos 6 steps 1/-, pos 7 steps 1/-, pos 8 steps 1/-, pos 9 steps 1/-, pos 10 steps 1/-, …)"
        );
    }

    /// A decode that edits against one that does not, same final tokens: identical outputs,
    /// no cell of another token (the drafts were replaced), the steps those of the final
    /// tokens, and the edited cells listed.
    #[test]
    fn edits_are_judged_by_the_final_tokens_and_listed() {
        use crate::trace::synth::{trace, Synth};
        let a = trace(&Synth::small());
        let b = trace(&Synth::small_edits());
        let c = compare(&a, &b);
        assert_eq!(c.first_divergence, None);
        assert!(c.other_token.is_empty());
        assert!(c.blocks.iter().all(|p| p.same_tokens));
        // Position 7 is committed at step 1 in both, then B edits it at step 2.
        let p7 = c.other_step.iter().find(|p| p.pos == 7).unwrap();
        assert_eq!(p7.steps, [Some(0), Some(1)]);
        assert_eq!(c.edits, [0, 9]);
        // Output cells only: block 7's edit is of a cell past max_new_tokens.
        let listed: Vec<(usize, [usize; 2])> = c.edited.iter().map(|e| (e.pos, e.edits)).collect();
        assert_eq!(listed[..3], [(7, [0, 1]), (10, [0, 1]), (11, [0, 2])]);
        assert_eq!(listed.len(), 6);
        let t = table(&c, ["", ""]);
        assert!(t.contains("\nedits (A/B): 0/9\nedited output cells: 6 (first: pos 7 edits 0/1, pos 10 edits 0/1, pos 11 edits 0/2, "), "{t}");
        // Without edits on either side the table says nothing of them.
        assert!(!table(&compare(&a, &a), ["", ""]).contains("edit"));
    }

    #[test]
    fn sampled_sides_are_announced() {
        let (a, mut b) = same_tokens_other_steps();
        if let Event::Header(h) = &mut b[0] {
            h.settings.sampling.temperature = 0.7;
        }
        let c = compare(&a, &b);
        assert!(c.sampled());
        assert!(table(&c, ["", ""]).contains(&format!("\n{SAMPLED_NOTE}\n")));
        assert!(!table(&compare(&a, &a), ["", ""]).contains("random draws"));
    }
}
