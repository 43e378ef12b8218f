//! Synthetic traces: deterministic event sequences for the UI's tests, snapshots and benchmark.
//!
//! They follow the schema and the shape of a real decode (docs/decoding.md: SDAR schedule,
//! most confident masked cells first, a block stored by the next block's first pass) but need no model, and their
//! timings are fixed so that rendered rates never change between runs. Their vocabulary holds
//! the awkward tokens a view must draw correctly: newlines, tabs, control characters, wide and
//! combining characters.

use crate::engine::settings::DecodeSettings;
use crate::trace::events::{
    BlockEvent, Candidate, Committed, Edited, Event, FinishEvent, FinishReason, Header, ModelInfo,
    MoeInfo, Route, StepEvent, TopCandidate, TRACE_VERSION,
};

/// The vocabulary; a token id is an index. The mask and EOS ids follow it.
pub const VOCAB: &[&str] = &[
    "ROMEO",
    ":",
    "\n",
    "The",
    " cat",
    " sat",
    " on",
    " the",
    " mat",
    ".",
    " It",
    " was",
    " warm",
    ",",
    " and",
    " purr",
    "ed",
    " softly",
    "\t",
    " dream",
    "ing",
    " of",
    " fish",
    " 日本",
    " cafe\u{301}",
    "\u{301}",
    " 🦀",
    "\u{7}",
    " —",
    " \"",
    "\"",
    "  ",
];
/// What the decode finally says, position by position (cycling): readable prose with the
/// awkward tokens mixed in.
const STORY: &[u32] = &[
    3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 7, 4, 15, 16, 17, 13, 2, 18, 19, 20, 21, 22, 28, 29,
    23, 24, 26, 30, 25, 27, 9, 2,
];
pub const MASK_ID: u32 = VOCAB.len() as u32;
pub const EOS_ID: u32 = VOCAB.len() as u32 + 1;

/// What to synthesise.
#[derive(Clone, Debug)]
pub struct Synth {
    /// Prompt token ids (indices into `VOCAB`).
    pub prompt: Vec<u32>,
    pub block_length: usize,
    pub steps: usize,
    pub new_tokens: usize,
    /// From this block on, use this many steps (a settings change mid-run).
    pub change_at: Option<(usize, usize)>,
    /// Put an EOS at this absolute position (the decode stops after its block).
    pub eos_at: Option<usize>,
    pub seed: u64,
    /// Token editing, in the shape `--strategy joint_threshold` writes (the header says that
    /// strategy, with [`SYNTH_POST_STEPS`] passes after a block's last mask): of every three
    /// decode blocks, the first commits a draft at its first step and replaces it at its next
    /// step; the second commits drafts at its first two steps, replaces one of them again at
    /// its last unmasking step, and replaces both with their final tokens in a step after its
    /// last mask (a post-step, which only edits); the third does not edit. Every block then
    /// ends as the engine ends one, on a post-step that edits nothing. The last replacement is
    /// always the final token, so blocks, output and text are those of the same trace without
    /// edits. (Which positions commit at a step still follows the schedule: a test double.)
    pub edits: bool,
}

impl Synth {
    /// Six prompt tokens (the first decode block starts with a two-token prompt tail), blocks of
    /// 4, 4 steps, 24 new tokens: seven decode blocks.
    pub fn small() -> Self {
        Synth {
            prompt: STORY[..6].to_vec(),
            block_length: 4,
            steps: 4,
            new_tokens: 24,
            change_at: None,
            eos_at: None,
            seed: 7,
            edits: false,
        }
    }

    /// A long decode for the benchmark.
    pub fn long(new_tokens: usize, block_length: usize, steps: usize) -> Self {
        Synth {
            prompt: vec![0, 1, 2],
            block_length,
            steps,
            new_tokens,
            change_at: None,
            eos_at: None,
            seed: 11,
            edits: false,
        }
    }

    /// [`Synth::small`] with token edits: blocks 1, 4 and 7 edit at their next step, blocks 2
    /// and 5 edit a position twice, the second time in a post-step (the fixture trace
    /// `tests/fixtures/traces/edits.jsonl`).
    pub fn small_edits() -> Self {
        Synth { edits: true, ..Synth::small() }
    }

    fn settings(&self) -> DecodeSettings {
        let base = DecodeSettings {
            block_length: self.block_length,
            steps: self.steps,
            max_new_tokens: self.new_tokens,
            ..DecodeSettings::default()
        };
        match self.edits {
            true => DecodeSettings {
                strategy: crate::engine::settings::Strategy::JointThreshold,
                max_post_steps: SYNTH_POST_STEPS,
                ..base
            },
            false => base,
        }
    }
}

/// Passes an editing synthetic block may take after its last mask: the one that edits and the
/// one that finds nothing left to edit.
pub const SYNTH_POST_STEPS: usize = 2;

/// A small, fast, deterministic hash (splitmix64) to pick tokens and confidences.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn unit(seed: u64, a: usize, b: usize) -> f32 {
    (mix(seed ^ mix(a as u64 ^ mix(b as u64))) >> 40) as f32 / (1u64 << 24) as f32
}

fn piece(id: u32) -> String {
    match id {
        MASK_ID => "<|MASK|>".into(),
        EOS_ID => "<|endoftext|>".into(),
        id => VOCAB[id as usize % VOCAB.len()].into(),
    }
}

/// The token a position finally gets.
fn final_token(cfg: &Synth, pos: usize) -> u32 {
    if cfg.eos_at == Some(pos) {
        return EOS_ID;
    }
    STORY[pos % STORY.len()]
}

fn header(cfg: &Synth) -> Header {
    Header {
        version: TRACE_VERSION,
        model: ModelInfo {
            source: "synthetic".into(),
            model_type: "sdar".into(),
            vocab_size: VOCAB.len() + 2,
            hidden_size: 64,
            num_layers: 2,
            num_params: 131_712,
            dtype: "f32".into(),
            compute: None,
            moe: None,
        },
        settings: cfg.settings(),
        mask_token_id: MASK_ID,
        eos_ids: vec![EOS_ID],
        prompt: cfg.prompt.iter().map(|&t| piece(t)).collect(),
        prompt_ids: cfg.prompt.clone(),
        prompt_pieces: cfg.prompt.iter().map(|&t| piece(t)).collect(),
        prompt_bytes: None,
        first_block: cfg.prompt.len() / cfg.block_length,
        max_len: cfg.prompt.len() + cfg.new_tokens,
        device: "cpu".into(),
        chat: None,
        sources: Default::default(),
    }
}

/// Every event of a synthetic decode, header to finish.
pub fn trace(cfg: &Synth) -> Vec<Event> {
    let h = header(cfg);
    let (b, p) = (cfg.block_length, cfg.prompt.len());
    let end_blocks = h.max_len.div_ceil(b);
    let mut events = vec![Event::Header(Box::new(h.clone()))];
    let mut forward = 0;
    let (mut steps_total, mut blocks, mut output) = (0, 0, Vec::new());
    let mut reason = FinishReason::Length;
    let mut steps_now = cfg.steps;
    for block in h.first_block..end_blocks {
        let mut changed = None;
        if let Some((at, s)) = cfg.change_at.filter(|&(at, _)| at == block) {
            steps_now = s;
            changed = Some(DecodeSettings { steps: s, ..cfg.settings() });
            debug_assert!(at == block);
        }
        let taken = decode_block(cfg, block, steps_now, changed, &mut forward, &mut events);
        steps_total += taken;
        let tokens: Vec<u32> = (block * b..(block + 1) * b)
            .map(|q| if q < p { cfg.prompt[q] } else { final_token(cfg, q) })
            .collect();
        events.push(Event::Block(BlockEvent {
            block,
            start: block * b,
            tokens: tokens.clone(),
            texts: None,
            steps: taken,
            forward,
            t_ms: ms(forward),
        }));
        blocks += 1;
        let generated = (block * b).max(p)..((block + 1) * b).min(h.max_len);
        let eos = generated.clone().find(|&q| final_token(cfg, q) == EOS_ID);
        output.extend(
            generated.take_while(|&q| eos.is_none_or(|e| q <= e)).map(|q| final_token(cfg, q)),
        );
        if eos.is_some() {
            reason = FinishReason::Eos;
            break;
        }
    }
    events.push(Event::Finish(FinishEvent {
        reason,
        text: output.iter().map(|&t| piece(t)).collect(),
        output_ids: output,
        forwards: forward,
        blocks,
        steps: steps_total,
        elapsed_ms: ms(forward),
        error: None,
    }));
    events
}

/// `events` with `k` candidates on every committed and masked entry, as `--candidates k` writes
/// them: the entry's own token first with its confidence, then other tokens of the vocabulary,
/// each half as likely as the one before (within what the first leaves).
pub fn with_candidates(mut events: Vec<Event>, k: usize) -> Vec<Event> {
    let top = |token: u32, conf: f32| -> Vec<TopCandidate> {
        let rest = (1.0 - conf).min(conf);
        (0..k)
            .map(|i| {
                let t = if i == 0 { token } else { (token + 7 * i as u32) % VOCAB.len() as u32 };
                let p = if i == 0 { conf } else { rest / (1u32 << i) as f32 };
                TopCandidate { token: t, text: piece(t), bytes: None, p }
            })
            .collect()
    };
    for ev in &mut events {
        if let Event::Step(s) = ev {
            s.committed.iter_mut().for_each(|c| c.top = top(c.token, c.conf));
            s.edited.iter_mut().for_each(|c| c.top = top(c.token, c.conf));
            s.masked.iter_mut().for_each(|c| c.top = top(c.token, c.conf));
        }
    }
    events
}

/// SDAR-30B-A3B's routing layout: 128 experts, 8 per row, all 48 layers sparse.
pub fn sdar_moe_layout() -> MoeInfo {
    MoeInfo { experts: 128, top_k: 8, sparse_layers: (0..48).collect() }
}

/// `events` as `--routing` writes them for a model of `moe`'s layout: every committed entry
/// routed in every sparse layer (distinct experts, descending weights that sum to 1, drawn
/// from the position and layer), every step with its distinct-expert counts.
pub fn with_routes(mut events: Vec<Event>, moe: &MoeInfo) -> Vec<Event> {
    let (n, k) = (moe.experts as u64, moe.top_k);
    let route = |pos: usize, layer: usize| -> Route {
        let mut experts: Vec<u32> = Vec::with_capacity(k);
        let mut x = mix((pos as u64) << 16 | layer as u64);
        while experts.len() < k {
            let e = (x % n) as u32;
            if !experts.contains(&e) {
                experts.push(e);
            }
            x = mix(x);
        }
        let raw: Vec<f32> = (0..k)
            .map(|i| 1.0 / (i as f32 + 0.2 + ((pos + layer) % 7) as f32 * 0.4).powi(2))
            .collect();
        let sum: f32 = raw.iter().sum();
        Route { experts, weights: raw.iter().map(|w| w / sum).collect() }
    };
    for ev in &mut events {
        match ev {
            Event::Header(h) => {
                let layers = moe.sparse_layers.last().map_or(0, |l| l + 1);
                h.model.num_layers = h.model.num_layers.max(layers);
                h.model.moe = Some(moe.clone());
            }
            Event::Step(s) => {
                s.committed.iter_mut().for_each(|c| {
                    c.routes = moe.sparse_layers.iter().map(|&l| route(c.pos, l)).collect()
                });
                s.edited.iter_mut().for_each(|c| {
                    c.routes = moe.sparse_layers.iter().map(|&l| route(c.pos + 1, l)).collect()
                });
                let rows = (s.committed.len() + s.masked.len()).max(1);
                s.distinct_experts = moe
                    .sparse_layers
                    .iter()
                    .map(|&l| {
                        (((rows * k) as u64).min(n) as u32).saturating_sub((l % 3) as u32).max(1)
                    })
                    .collect();
            }
            _ => {}
        }
    }
    events
}

/// Fixed timings: 7.5 ms per forward pass.
fn ms(forward: usize) -> f64 {
    forward as f64 * 7.5
}

/// A token a synthetic decode commits first and replaces later: never the final one.
fn draft(cfg: &Synth, pos: usize, n: usize) -> u32 {
    ((final_token(cfg, pos) as usize + 5 + 3 * n) % VOCAB.len()) as u32
}

/// A replacement the block will make: at `step`, `pos` gets `token`.
struct Planned {
    step: usize,
    pos: usize,
    token: u32,
}

/// The denoising steps of one block; returns how many it took.
fn decode_block(
    cfg: &Synth,
    block: usize,
    steps: usize,
    mut changed: Option<DecodeSettings>,
    forward: &mut usize,
    events: &mut Vec<Event>,
) -> usize {
    let (b, p) = (cfg.block_length, cfg.prompt.len());
    let mut masked: Vec<usize> = (block * b..(block + 1) * b).filter(|&q| q >= p).collect();
    // generate.py's counts from (block_length, steps), capped at the masks left.
    let (base, extra) = (b / steps, b % steps);
    let count = |step: usize| (base + usize::from(step < extra)).max(1);
    // The step that commits the block's last mask, for the edits planned around it.
    let last_unmask = {
        let (mut left, mut step) = (masked.len(), 0);
        while left > count(step) {
            left -= count(step);
            step += 1;
        }
        step
    };
    let plan = if cfg.edits { (block - p / b) % 3 } else { 2 };
    let mut planned: Vec<Planned> = Vec::new();
    let mut held: Vec<(usize, u32)> = Vec::new();
    let mut step = 0;
    // As the engine's loop: a strategy that edits goes on after the last mask while its passes
    // edit, and ends the block on the first that does not (or at its post-step cap).
    let mut post = 0;
    loop {
        let masks_left = !masked.is_empty();
        if !masks_left {
            post += 1;
            if !cfg.edits || post > SYNTH_POST_STEPS {
                break;
            }
        }
        *forward += 1;
        let k = count(step);
        // Most confident first, like low_confidence_static.
        let conf = |q: usize| 0.15 + 0.85 * unit(cfg.seed, q, step);
        masked.sort_by(|&x, &y| conf(y).total_cmp(&conf(x)).then(x.cmp(&y)));
        let picked: Vec<usize> = masked.drain(..k.min(masked.len())).collect();
        masked.sort_unstable();
        let committed: Vec<Committed> = picked
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                // The block's first commit of its first step (and, in the second plan, of its
                // second) is a draft that a later step replaces.
                let drafted = i == 0 && (step == 0 && plan < 2 || step == 1 && plan == 1);
                let token = if drafted { draft(cfg, q, 0) } else { final_token(cfg, q) };
                if drafted {
                    let fin = final_token(cfg, q);
                    let again = last_unmask.max(1);
                    match (plan, step) {
                        (0, _) => planned.push(Planned { step: 1, pos: q, token: fin }),
                        (_, 0) => {
                            planned.push(Planned { step: again, pos: q, token: draft(cfg, q, 1) });
                            planned.push(Planned { step: again + 1, pos: q, token: fin });
                        }
                        _ => planned.push(Planned { step: again + 1, pos: q, token: fin }),
                    }
                }
                held.push((q, token));
                let c = if drafted { 0.3 + 0.2 * unit(cfg.seed ^ 3, q, step) } else { conf(q) };
                Committed {
                    pos: q,
                    token,
                    text: piece(token),
                    bytes: None,
                    conf: c,
                    entropy: 2.0 * (1.0 - c),
                    top: vec![],
                    routes: vec![],
                }
            })
            .collect();
        let mut edited: Vec<Edited> = planned
            .iter()
            .filter(|e| e.step == step)
            .map(|e| {
                let slot = held.iter_mut().find(|h| h.0 == e.pos).expect("committed before");
                let from = std::mem::replace(&mut slot.1, e.token);
                let c = 0.8 + 0.15 * unit(cfg.seed ^ 4, e.pos, step);
                Edited {
                    pos: e.pos,
                    from,
                    token: e.token,
                    text: piece(e.token),
                    bytes: None,
                    conf: c,
                    entropy: 2.0 * (1.0 - c),
                    top: vec![],
                    routes: vec![],
                }
            })
            .collect();
        edited.sort_by_key(|e| e.pos);
        let cands = masked
            .iter()
            .map(|&q| {
                // Early guesses wander; the last guess before the commit is usually the final token.
                let token = if unit(cfg.seed ^ 1, q, step) < 0.6 {
                    final_token(cfg, q)
                } else {
                    (mix(q as u64 + step as u64) % VOCAB.len() as u64) as u32
                };
                Candidate {
                    pos: q,
                    token,
                    text: piece(token),
                    bytes: None,
                    conf: 0.1 + 0.6 * unit(cfg.seed ^ 2, q, step),
                    top: vec![],
                }
            })
            .collect();
        // A pass begun with no mask that replaced nothing ends the block.
        let settled = !masks_left && edited.is_empty();
        events.push(Event::Step(StepEvent {
            block,
            step,
            forward: *forward,
            committed,
            edited,
            masked: cands,
            t_ms: ms(*forward),
            settings: if step == 0 { changed.take() } else { None },
            distinct_experts: vec![],
        }));
        step += 1;
        if settled {
            break;
        }
    }
    step
}

/// Byte-level tokens that split `≈ ∑ 你好 🤖` across tokens, as a real BPE vocabulary does
/// (Qwen3 splits every one of them); `SPLIT_MASK` and `SPLIT_EOS` follow.
pub const SPLIT_VOCAB: &[&[u8]] = &[
    b"x",
    b" \xE2\x89", // ≈ is E2 89 88
    b"\x88",
    b" \xE2", // ∑ is E2 88 91
    b"\x88\x91",
    b" \xE4\xBD", // 你 is E4 BD A0
    b"\xA0\xE5",  // 好 is E5 A5 BD
    b"\xA5\xBD",
    b" \xF0\x9F", // 🤖 is F0 9F A4 96
    b"\xA4\x96",
    b" ok",
];
pub const SPLIT_MASK: u32 = SPLIT_VOCAB.len() as u32;
const SPLIT_EOS: u32 = SPLIT_MASK + 1;

/// A real decode (the engine loop, `low_confidence_static`, B4 S4) over a scripted model
/// whose tokens split characters: prompt `x ≈ ∑`, output ` 你好 🤖 okx`. The rightmost mask is
/// always the most confident, so a cell's right neighbour is decoded before it and the bytes
/// of a split character wait on a masked cell mid-block.
pub fn split_trace() -> Vec<Event> {
    use crate::engine::{decode, Denoiser, Detok, Pass, Request};
    use crate::sampler::PosSample;

    struct Bytes;
    impl Detok for Bytes {
        fn piece(&self, id: u32) -> String {
            String::from_utf8_lossy(&self.bytes(id)).into_owned()
        }
        fn decode(&self, ids: &[u32]) -> String {
            String::from_utf8_lossy(&ids.iter().flat_map(|&i| self.bytes(i)).collect::<Vec<u8>>())
                .into_owned()
        }
        fn bytes(&self, id: u32) -> Vec<u8> {
            match id {
                SPLIT_MASK => b"<|MASK|>".to_vec(),
                SPLIT_EOS => b"<|endoftext|>".to_vec(),
                id => SPLIT_VOCAB[id as usize].to_vec(),
            }
        }
    }
    /// Position `p` always proposes `OUTPUT[p - 5]`, more confidently further right.
    struct Script {
        cached: usize,
    }
    const OUTPUT: [u32; 7] = [5, 6, 7, 8, 9, 10, 0];
    impl Denoiser for Script {
        fn reset(&mut self, _: usize) -> anyhow::Result<()> {
            self.cached = 0;
            Ok(())
        }
        fn denoise(
            &mut self,
            pass: Pass<'_>,
            _: &crate::engine::settings::SamplerSpec,
            _: &[f32],
        ) -> anyhow::Result<Vec<PosSample>> {
            self.cached += pass.store.len();
            Ok((0..pass.block.len())
                .map(|i| {
                    let pos = self.cached + i;
                    let token = OUTPUT.get(pos.wrapping_sub(5)).copied().unwrap_or(0);
                    PosSample {
                        token,
                        conf: 0.5 + pos as f32 / 100.0,
                        entropy: 0.5 - pos as f32 / 100.0,
                    }
                })
                .collect())
        }
    }
    let settings = DecodeSettings {
        strategy: crate::engine::settings::Strategy::LowConfidenceStatic,
        block_length: 4,
        steps: 4,
        max_new_tokens: OUTPUT.len(),
        ..DecodeSettings::default()
    };
    let req = Request {
        prompt: "x ≈ ∑".into(),
        prompt_ids: vec![0, 1, 2, 3, 4],
        settings,
        mask_id: SPLIT_MASK,
        eos_ids: vec![SPLIT_EOS],
        model: ModelInfo {
            source: "synthetic".into(),
            model_type: "sdar".into(),
            vocab_size: SPLIT_VOCAB.len() + 2,
            hidden_size: 1,
            num_layers: 1,
            num_params: 1,
            dtype: "f32".into(),
            compute: None,
            moe: None,
        },
        device: "cpu".into(),
        chat: None,
        sources: Default::default(),
        candidates: 1,
        routing: false,
    };
    let mut events = vec![];
    decode(&mut Script { cached: 0 }, &Bytes, &req, &mut |e| events.push(e), None);
    // Fixed timings, so rendered rates never change between runs.
    for e in &mut events {
        match e {
            Event::Step(s) => s.t_ms = ms(s.forward),
            Event::Block(b) => b.t_ms = ms(b.forward),
            Event::Finish(f) => f.elapsed_ms = ms(f.forwards),
            Event::Header(_) => {}
        }
    }
    events
}

/// [`split_trace`] with token 6 (A0 E5) made FC, never UTF-8: " E4 BD" before it and "A5 BD"
/// after it are then invalid too. Cells read `<E4 BD>`, `<FC>`, `<A5 BD>` at positions 5 to 7.
pub fn invalid_split_trace() -> Vec<Event> {
    let mut events = split_trace();
    for e in &mut events {
        if let Event::Step(s) = e {
            let cells = s.committed.iter_mut().map(|c| (c.token, &mut c.text, &mut c.bytes));
            let masked = s.masked.iter_mut().map(|c| (c.token, &mut c.text, &mut c.bytes));
            for (_, text, bytes) in cells.chain(masked).filter(|c| c.0 == 6) {
                (*text, *bytes) = ("\u{FFFD}".into(), Some(vec![0xFC]));
            }
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_trace_spells_every_character_whole() {
        let ev = split_trace();
        let Some(Event::Header(h)) = ev.first() else { panic!() };
        assert_eq!(h.prompt_pieces, ["x", " ", "≈", " ", "∑"]);
        assert_eq!(h.prompt_pieces.concat(), h.prompt);
        assert!(h.prompt_bytes.is_some());
        let texts: Vec<String> = ev
            .iter()
            .filter_map(|e| if let Event::Block(b) = e { b.texts.clone() } else { None })
            .flatten()
            .collect();
        // Block 1 holds the prompt's last token (∑'s last bytes), then the output.
        assert_eq!(texts, ["∑", " ", "你", "好", " ", "🤖", " ok", "x"]);
        let Some(Event::Finish(f)) = ev.last() else { panic!() };
        assert_eq!(texts[1..].concat(), f.text);
        // A token alone is `�`; its bytes travel with it.
        let c = ev
            .iter()
            .find_map(|e| if let Event::Step(s) = e { s.committed.first().cloned() } else { None })
            .unwrap();
        assert_eq!(
            (c.pos, c.text.as_str(), c.bytes.as_deref()),
            (7, "\u{FFFD}\u{FFFD}", Some(&b"\xA5\xBD"[..]))
        );
    }

    #[test]
    fn small_trace_has_the_expected_shape() {
        let ev = trace(&Synth::small());
        assert!(matches!(ev[0], Event::Header(_)));
        assert!(
            matches!(ev.last(), Some(Event::Finish(f)) if f.output_ids.len() == 24 && f.blocks == 7)
        );
        let steps = ev.iter().filter(|e| matches!(e, Event::Step(_))).count();
        // Block 1 has two masks (two steps); the six others four each.
        assert_eq!(steps, 2 + 6 * 4);
    }

    #[test]
    fn every_generated_position_is_committed_once() {
        let ev = trace(&Synth::small());
        let mut seen: Vec<usize> = ev
            .iter()
            .filter_map(|e| {
                if let Event::Step(s) = e {
                    Some(s.committed.iter().map(|c| c.pos))
                } else {
                    None
                }
            })
            .flatten()
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (6..32).collect::<Vec<_>>());
    }

    /// Every block's tokens, and the finish event, of a trace.
    fn ends(ev: &[Event]) -> (Vec<Vec<u32>>, Option<FinishEvent>) {
        let blocks = ev
            .iter()
            .filter_map(|e| if let Event::Block(b) = e { Some(b.tokens.clone()) } else { None })
            .collect();
        let fin =
            ev.iter().find_map(|e| if let Event::Finish(f) = e { Some(f.clone()) } else { None });
        (blocks, fin)
    }

    /// The editing trace replaces drafts in later steps of their block, some twice, some in a
    /// post-step (after the block's last mask: no commit, no mask, only edits); every block
    /// ends on a post-step that edits nothing, as the engine's do; the trace ends on the tokens
    /// of the trace without edits, and the reader's checks accept it.
    #[test]
    fn edits_replace_drafts_and_end_on_the_final_tokens() {
        let ev = trace(&Synth::small_edits());
        let (blocks, fin) = ends(&ev);
        let (plain_blocks, plain_fin) = ends(&trace(&Synth::small()));
        assert_eq!(blocks, plain_blocks);
        let (fin, plain_fin) = (fin.unwrap(), plain_fin.unwrap());
        assert_eq!((&fin.output_ids, &fin.text), (&plain_fin.output_ids, &plain_fin.text));
        assert!(fin.steps > plain_fin.steps, "post-steps add steps");
        let mut held = std::collections::HashMap::new();
        let mut edits = std::collections::HashMap::new();
        let (mut post, mut settle, mut in_block) = (0, 0, 0);
        for e in &ev {
            match e {
                Event::Step(s) => {
                    for x in &s.edited {
                        assert_eq!(held.insert(x.pos, x.token), Some(x.from), "{x:?}");
                        *edits.entry(x.pos).or_insert(0) += 1;
                    }
                    if s.committed.is_empty() && s.masked.is_empty() {
                        match s.edited.is_empty() {
                            true => settle += 1,
                            false => post += 1,
                        }
                    } else if !s.edited.is_empty() {
                        in_block += 1;
                    }
                    held.extend(s.committed.iter().map(|c| (c.pos, c.token)));
                }
                Event::Block(b) => {
                    for (i, &t) in b.tokens.iter().enumerate().filter(|(i, _)| b.start + i >= 6) {
                        assert_eq!(held[&(b.start + i)], t, "pos {}", b.start + i);
                    }
                }
                _ => {}
            }
        }
        assert_eq!(
            (post, settle, in_block),
            (2, 7, 5),
            "blocks 2 and 5 edit after their last mask"
        );
        assert!(edits.values().any(|&n| n == 2), "a position is edited twice");
        let mut check = crate::limits::TraceCheck::default();
        assert_eq!(ev.iter().try_for_each(|e| check.check(e)), Ok(()));
        // With candidates and routes too.
        let routed = with_routes(with_candidates(ev, 3), &sdar_moe_layout());
        let mut check = crate::limits::TraceCheck::default();
        assert_eq!(routed.iter().try_for_each(|e| check.check(e)), Ok(()));
    }

    /// `tests/fixtures/traces/edits.jsonl` is [`Synth::small_edits`]'s trace, line for line;
    /// `UNMASK_WRITE_FIXTURES=1` rewrites it after a deliberate change.
    #[test]
    fn the_edits_fixture_is_the_synthetic_editing_trace() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/traces/edits.jsonl");
        let text: String = trace(&Synth::small_edits())
            .iter()
            .map(|e| serde_json::to_string(e).expect("serialises") + "\n")
            .collect();
        if std::env::var_os("UNMASK_WRITE_FIXTURES").is_some() {
            std::fs::write(&path, &text).expect("the fixture is writable");
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(want == text, "{} is stale: UNMASK_WRITE_FIXTURES=1 rewrites it", path.display());
    }

    #[test]
    fn eos_stops_after_its_block() {
        let mut cfg = Synth::small();
        cfg.eos_at = Some(13);
        let ev = trace(&cfg);
        let Some(Event::Finish(f)) = ev.last() else { panic!() };
        assert_eq!(f.reason, FinishReason::Eos);
        assert_eq!(f.output_ids.len(), 13 - 6 + 1);
        assert_eq!(*f.output_ids.last().unwrap(), EOS_ID);
    }
}
