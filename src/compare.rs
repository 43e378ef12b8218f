//! Two decodes of the same prompt, compared: where the outputs diverge, what each spent in
//! forwards and steps, block by block. Pure: two event lists in, a comparison out.

use crate::events::{Event, FinishEvent, Header};

#[derive(Clone, Debug, PartialEq)]
pub struct RunSummary {
    pub settings: String,
    pub output_ids: Vec<u32>,
    pub forwards: usize,
    pub steps: usize,
    pub blocks: usize,
    pub reason: String,
    pub elapsed_ms: f64,
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
}

/// A block as one run committed it: (index, steps taken, tokens).
type BlockRow = (usize, usize, Vec<u32>);

fn last_run(events: &[Event]) -> (Option<&Header>, Vec<BlockRow>, Option<&FinishEvent>) {
    let start = events.iter().rposition(|e| matches!(e, Event::Header(_))).unwrap_or(0);
    let mut header = None;
    let mut blocks = Vec::new();
    let mut finish = None;
    for e in &events[start..] {
        match e {
            Event::Header(h) => header = Some(h),
            Event::Block(b) => blocks.push((b.block, b.steps, b.tokens.clone())),
            Event::Finish(f) => finish = Some(f),
            Event::Step(_) => {}
        }
    }
    (header.map(|h| &**h), blocks, finish)
}

fn summary(header: Option<&Header>, blocks: usize, finish: Option<&FinishEvent>) -> RunSummary {
    RunSummary {
        settings: header.map(|h| h.settings.summary()).unwrap_or_default(),
        output_ids: finish.map(|f| f.output_ids.clone()).unwrap_or_default(),
        forwards: finish.map_or(0, |f| f.forwards),
        steps: finish.map_or(0, |f| f.steps),
        blocks,
        reason: finish.map(|f| format!("{:?}", f.reason).to_lowercase()).unwrap_or_else(|| "unfinished".into()),
        elapsed_ms: finish.map_or(0.0, |f| f.elapsed_ms),
    }
}

pub fn compare(a: &[Event], b: &[Event]) -> Comparison {
    let (ha, ba, fa) = last_run(a);
    let (hb, bb, fb) = last_run(b);
    let runs = [summary(ha, ba.len(), fa), summary(hb, bb.len(), fb)];
    let first_divergence = runs[0]
        .output_ids
        .iter()
        .zip(&runs[1].output_ids)
        .position(|(x, y)| x != y);
    let last = ba.iter().chain(&bb).map(|b| b.0).max();
    let first = ba.iter().chain(&bb).map(|b| b.0).min();
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
    Comparison { runs, first_divergence, blocks }
}

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
    s += &row("tokens/forward", format!("{:.3}", a.tokens_per_forward()), format!("{:.3}", b.tokens_per_forward()));
    s += &row("finish", a.reason.clone(), b.reason.clone());
    s += &row("elapsed ms", format!("{:.1}", a.elapsed_ms), format!("{:.1}", b.elapsed_ms));
    s += &match c.first_divergence {
        Some(i) => format!("outputs diverge at token {i}\n"),
        None if a.output_ids == b.output_ids => "outputs are identical\n".to_string(),
        None => "one output is a prefix of the other\n".to_string(),
    };
    let differing: Vec<String> = c
        .blocks
        .iter()
        .filter(|p| !p.same_tokens)
        .map(|p| p.block.to_string())
        .collect();
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
    for (name, t) in ["A", "B"].iter().zip(texts) {
        s += &format!("--- {name}\n{t}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{BlockEvent, FinishReason, ModelInfo};
    use crate::settings::DecodeSettings;

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
            ev.push(Event::Block(BlockEvent { block, start: block * 2, tokens: tokens.to_vec(), texts: None, steps, forward: fwd, t_ms: 0.0 }));
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
        assert!(t.contains("outputs diverge at token 3"), "{t}");
        assert!(t.contains("blocks that differ: 2 3"), "{t}");
        assert!(t.contains("steps per block (A/B): 1:2/1 2:2/2 3:1/-"), "{t}");
        assert!(t.contains("finish             length"), "{t}");
    }

    #[test]
    fn identical_runs_say_so() {
        let a = run(&[(1, 2, [3, 4])], FinishReason::Length);
        let c = compare(&a, &a);
        assert_eq!(c.first_divergence, None);
        assert!(table(&c, ["", ""]).contains("outputs are identical"));
    }
}
