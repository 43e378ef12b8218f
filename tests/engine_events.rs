//! Exact event sequences of the decode loop, over a scripted test double of the model.

use std::sync::mpsc;

use anyhow::Result;
use unmask::engine::settings::{DecodeSettings, SamplerSpec, Sampling, Strategy};
use unmask::engine::{decode, Control, Denoiser, Detok, Pass, Request};
use unmask::sampler::PosSample;
use unmask::trace::events::{Event, FinishReason, ModelInfo};

const MASK: u32 = 99;

/// Test double: every position `pos` of a denoising pass proposes token `pos + 10` (or the
/// scripted token), with confidence from `conf(pass, pos)`. Records every pass it was asked for.
struct ScriptedDenoiser {
    conf: fn(usize, usize) -> f32,
    eos_at: Option<usize>,
    passes: usize,
    cached: usize,
    log: Vec<String>,
}

impl ScriptedDenoiser {
    fn new(conf: fn(usize, usize) -> f32) -> Self {
        ScriptedDenoiser { conf, eos_at: None, passes: 0, cached: 0, log: vec![] }
    }
}

impl Denoiser for ScriptedDenoiser {
    fn reset(&mut self, capacity: usize) -> Result<()> {
        self.log.push(format!("reset {capacity}"));
        self.cached = 0;
        Ok(())
    }
    fn denoise(&mut self, pass: Pass<'_>, _s: &SamplerSpec, _u: &[f32]) -> Result<Vec<PosSample>> {
        assert!(!pass.store.contains(&MASK), "a stored block holds no mask");
        if !pass.store.is_empty() {
            self.log.push(format!("store {} @{}", pass.store.len(), self.cached));
            self.cached += pass.store.len();
        }
        self.log.push(format!("denoise @{}", self.cached));
        let n = self.passes;
        self.passes += 1;
        Ok((0..pass.block.len())
            .map(|i| {
                let pos = self.cached + i;
                let token = if Some(pos) == self.eos_at { 0 } else { pos as u32 + 10 };
                PosSample { token, conf: (self.conf)(n, pos), entropy: 1.0 - (self.conf)(n, pos) }
            })
            .collect())
    }
}

struct Pieces;
impl Detok for Pieces {
    fn piece(&self, id: u32) -> String {
        format!("t{id}")
    }
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|i| format!("t{i}")).collect::<Vec<_>>().join(" ")
    }
}

fn request(prompt_len: usize, settings: DecodeSettings) -> Request {
    Request {
        prompt: "p".into(),
        prompt_ids: (0..prompt_len as u32).map(|i| i + 1).collect(),
        settings,
        mask_id: MASK,
        eos_ids: vec![0],
        model: ModelInfo {
            source: "double".into(),
            model_type: "sdar".into(),
            vocab_size: 100,
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
    }
}

fn settings(strategy: Strategy, max_new: usize) -> DecodeSettings {
    DecodeSettings { strategy, max_new_tokens: max_new, ..DecodeSettings::default() }
}

/// (block, step, committed positions) of every step event, and the other kinds in order.
fn shape(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            Event::Header(h) => {
                format!("header first_block={} max_len={}", h.first_block, h.max_len)
            }
            Event::Step(s) => {
                let pos: Vec<usize> = s.committed.iter().map(|c| c.pos).collect();
                let masked: Vec<usize> = s.masked.iter().map(|c| c.pos).collect();
                format!(
                    "step b{} s{} f{} {:?} masked {:?}",
                    s.block, s.step, s.forward, pos, masked
                )
            }
            Event::Block(b) => {
                format!("block b{} start={} steps={} f{}", b.block, b.start, b.steps, b.forward)
            }
            Event::Finish(f) => {
                format!("finish {:?} n={} f{}", f.reason, f.output_ids.len(), f.forwards)
            }
        })
        .collect()
}

fn run(
    d: &mut ScriptedDenoiser,
    req: &Request,
    control: Option<&mpsc::Receiver<Control>>,
) -> Vec<Event> {
    let mut events = vec![];
    decode(d, &Pieces, req, &mut |e| events.push(e), control);
    events
}

/// Confidence rises with the position from the right: the rightmost mask is always most sure.
fn right_first(_pass: usize, pos: usize) -> f32 {
    pos as f32 / 100.0
}

#[test]
fn static_with_a_prompt_tail_commits_one_per_step_most_confident_first() {
    let mut d = ScriptedDenoiser::new(right_first);
    let req = request(6, settings(Strategy::LowConfidenceStatic, 6));
    let events = run(&mut d, &req, None);
    assert_eq!(
        shape(&events),
        vec![
            "header first_block=1 max_len=12",
            "step b1 s0 f1 [7] masked [6]",
            "step b1 s1 f2 [6] masked []",
            "block b1 start=4 steps=2 f2",
            "step b2 s0 f3 [11] masked [8, 9, 10]",
            "step b2 s1 f4 [10] masked [8, 9]",
            "step b2 s2 f5 [9] masked [8]",
            "step b2 s3 f6 [8] masked []",
            "block b2 start=8 steps=4 f6",
            "finish Length n=6 f6",
        ]
    );
    // The prompt's whole block rides on the first pass, each finished block on the next
    // block's first pass; the last block is never stored.
    assert_eq!(
        d.log,
        [
            "reset 12",
            "store 4 @0",
            "denoise @4",
            "denoise @4",
            "store 4 @4",
            "denoise @8",
            "denoise @8",
            "denoise @8",
            "denoise @8"
        ]
    );
    let Some(Event::Finish(f)) = events.last() else { panic!() };
    assert_eq!(f.output_ids, vec![16, 17, 18, 19, 20, 21]);
    assert_eq!(f.text, "t16 t17 t18 t19 t20 t21");
}

/// generate.py's `get_num_transfer_tokens(block_length, steps)`, computed as the Python does.
fn generate_py_counts(block_length: usize, steps: usize) -> Vec<usize> {
    let mut counts = vec![block_length / steps; steps];
    for c in counts.iter_mut().take(block_length % steps) {
        *c += 1;
    }
    counts
}

/// Committed count of every step of block `block`.
fn counts_of_block(events: &[Event], block: usize) -> Vec<usize> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Step(s) if s.block == block => Some(s.committed.len()),
            _ => None,
        })
        .collect()
}

#[test]
fn sdar_schedule_takes_generate_py_counts_in_the_block_holding_the_prompt_tail() {
    // (B, S, prompt length): the first decoded block holds the prompt's tail.
    for (b, s, p) in [(8, 4, 6), (8, 4, 3), (4, 2, 1), (4, 2, 3)] {
        let counts = generate_py_counts(b, s);
        for strategy in [Strategy::Sequential, Strategy::LowConfidenceStatic] {
            let st = DecodeSettings { block_length: b, steps: s, ..settings(strategy, 2 * b) };
            let events = run(&mut ScriptedDenoiser::new(right_first), &request(p, st), None);
            // generate.py's counts, capped at the masks left, until the block is full.
            let mut left = b - p % b;
            let want: Vec<usize> = counts
                .iter()
                .map_while(|&k| {
                    (left > 0).then(|| {
                        let n = k.min(left);
                        left -= n;
                        n
                    })
                })
                .collect();
            assert_eq!(counts_of_block(&events, p / b), want, "B{b} S{s} P{p} {strategy:?}");
            // later blocks: the counts in full.
            assert_eq!(counts_of_block(&events, p / b + 1), counts, "B{b} S{s} P{p} {strategy:?}");
        }
    }
    // The example (B8 S4, prompt of 6, sequential): 6 and 7 both at step 0.
    let st = DecodeSettings { block_length: 8, steps: 4, ..settings(Strategy::Sequential, 2) };
    let events = run(&mut ScriptedDenoiser::new(right_first), &request(6, st), None);
    assert_eq!(
        shape(&events),
        vec![
            "header first_block=0 max_len=8",
            "step b0 s0 f1 [6, 7] masked []",
            "block b0 start=0 steps=1 f1",
            "finish Length n=2 f1",
        ]
    );
}

#[test]
fn sequential_goes_left_to_right_whatever_the_confidence() {
    let mut d = ScriptedDenoiser::new(right_first);
    let events = run(&mut d, &request(4, settings(Strategy::Sequential, 4)), None);
    let s = shape(&events);
    assert_eq!(
        s[1..5],
        [
            "step b1 s0 f1 [4] masked [5, 6, 7]",
            "step b1 s1 f2 [5] masked [6, 7]",
            "step b1 s2 f3 [6] masked [7]",
            "step b1 s3 f4 [7] masked []"
        ]
    );
}

#[test]
fn dynamic_commits_everything_over_threshold_at_once() {
    // Pass 0: positions 4 and 6 are sure; later passes: everything is.
    fn conf(pass: usize, pos: usize) -> f32 {
        if pass > 0 || pos.is_multiple_of(2) {
            0.95
        } else {
            0.1
        }
    }
    let mut d = ScriptedDenoiser::new(conf);
    let events = run(&mut d, &request(4, settings(Strategy::LowConfidenceDynamic, 4)), None);
    assert_eq!(
        shape(&events),
        vec![
            "header first_block=1 max_len=8",
            "step b1 s0 f1 [4, 6] masked [5, 7]",
            "step b1 s1 f2 [5, 7] masked []",
            "block b1 start=4 steps=2 f2",
            "finish Length n=4 f2",
        ]
    );
}

#[test]
fn eos_stops_after_its_block_and_trims_after_it() {
    let mut d = ScriptedDenoiser::new(right_first);
    d.eos_at = Some(9);
    let events = run(&mut d, &request(4, settings(Strategy::Sequential, 32)), None);
    let Some(Event::Finish(f)) = events.last() else { panic!() };
    assert_eq!(f.reason, FinishReason::Eos);
    assert_eq!(f.output_ids, vec![14, 15, 16, 17, 18, 0]);
    assert_eq!(f.blocks, 2, "the block holding EOS is finished, no block after it");
}

#[test]
fn a_stop_text_ends_the_output_at_the_token_completing_it() {
    let stop = |texts: &[&str], eos_at: Option<usize>| {
        let mut d = ScriptedDenoiser::new(right_first);
        d.eos_at = eos_at;
        let s = DecodeSettings {
            stop: texts.iter().map(|t| t.to_string()).collect(),
            ..settings(Strategy::Sequential, 32)
        };
        let events = run(&mut d, &request(4, s), None);
        let Some(Event::Finish(f)) = events.last().cloned() else { panic!() };
        (f.reason, f.output_ids, f.blocks)
    };
    // "t14t15t16": "5t1" ends inside t16's bytes, so t16 completes it; its block is the last
    assert_eq!(stop(&["5t1"], None), (FinishReason::Stop, vec![14, 15, 16], 1));
    // across a block boundary (t17 | t18), and the earliest end of several texts wins
    assert_eq!(stop(&["t19", "7t18"], None), (FinishReason::Stop, vec![14, 15, 16, 17, 18], 2));
    // an EOS before the stop text ends it first; a stop text completed before the EOS wins
    assert_eq!(stop(&["t30"], Some(9)).0, FinishReason::Eos);
    assert_eq!(stop(&["t17"], Some(9)), (FinishReason::Stop, vec![14, 15, 16, 17], 1));
    assert_eq!(stop(&["zz"], None).0, FinishReason::Length);
}

#[test]
fn length_limit_trims_a_partial_last_block() {
    let mut d = ScriptedDenoiser::new(right_first);
    let events = run(&mut d, &request(4, settings(Strategy::Sequential, 6)), None);
    let Some(Event::Finish(f)) = events.last() else { panic!() };
    assert_eq!((f.reason, f.output_ids.len(), f.blocks), (FinishReason::Length, 6, 2));
}

#[test]
fn empty_prompt_decodes_from_block_zero_without_prefill() {
    let mut d = ScriptedDenoiser::new(right_first);
    let events = run(&mut d, &request(0, settings(Strategy::Sequential, 4)), None);
    assert_eq!(shape(&events)[0], "header first_block=0 max_len=4");
    assert_eq!(d.log[..2], ["reset 4", "denoise @0"]);
}

#[test]
fn settings_sent_mid_block_apply_from_the_next_block_and_are_reported() {
    let (tx, rx) = mpsc::channel();
    let mut d = ScriptedDenoiser::new(right_first);
    let req = request(4, settings(Strategy::Sequential, 8));
    let mut next = req.settings.clone();
    next.strategy = Strategy::LowConfidenceStatic;
    next.block_length = 16; // ignored mid-decode: the layout is fixed
    tx.send(Control::Settings(next)).unwrap();
    let events = run(&mut d, &req, Some(&rx));
    let s = shape(&events);
    // block 1 still sequential (the message is read before its first pass, but applies at block 2).
    assert_eq!(s[1], "step b1 s0 f1 [4] masked [5, 6, 7]");
    assert_eq!(s[6], "step b2 s0 f5 [11] masked [8, 9, 10]");
    let firsts: Vec<Option<Strategy>> = events
        .iter()
        .filter_map(|e| match e {
            Event::Step(s) => Some(s.settings.as_ref().map(|x| x.strategy)),
            _ => None,
        })
        .collect();
    assert_eq!(firsts.iter().filter(|x| x.is_some()).count(), 1);
    assert_eq!(firsts[4], Some(Strategy::LowConfidenceStatic));
}

#[test]
fn cancel_ends_the_decode_with_reason_cancelled() {
    let (tx, rx) = mpsc::channel();
    tx.send(Control::Cancel).unwrap();
    let mut d = ScriptedDenoiser::new(right_first);
    let events = run(&mut d, &request(4, settings(Strategy::Sequential, 8)), Some(&rx));
    assert_eq!(shape(&events), vec!["header first_block=1 max_len=12", "finish Cancelled n=0 f0"]);
}

#[test]
fn pause_blocks_the_engine_until_resume() {
    let (tx, rx) = mpsc::channel();
    tx.send(Control::Pause).unwrap();
    let handle = std::thread::spawn(move || {
        let mut d = ScriptedDenoiser::new(right_first);
        run(&mut d, &request(4, settings(Strategy::Sequential, 4)), Some(&rx)).len()
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!handle.is_finished(), "a paused engine must not run");
    tx.send(Control::Resume).unwrap();
    assert_eq!(handle.join().unwrap(), 7);
}

#[test]
fn same_seed_same_events_different_seed_different_draws() {
    // Real sampling over the test double's confidences is not involved; this checks that the
    // uniforms handed to the denoiser are a pure function of the seed.
    struct Recorder(Vec<Vec<f32>>);
    impl Denoiser for Recorder {
        fn reset(&mut self, _: usize) -> Result<()> {
            Ok(())
        }
        fn denoise(
            &mut self,
            pass: Pass<'_>,
            _: &SamplerSpec,
            u: &[f32],
        ) -> Result<Vec<PosSample>> {
            self.0.push(u.to_vec());
            Ok(pass.block.iter().map(|_| PosSample { token: 5, conf: 0.5, entropy: 0.5 }).collect())
        }
    }
    let draws = |seed: u64| {
        let mut s = settings(Strategy::LowConfidenceStatic, 8);
        s.sampling = Sampling { temperature: 0.8, seed, ..Sampling::default() };
        let mut r = Recorder(vec![]);
        decode(&mut r, &Pieces, &request(4, s), &mut |_| {}, None);
        r.0
    };
    assert_eq!(draws(1), draws(1));
    assert_ne!(draws(1), draws(2));
}

/// Test double whose `n`-th pass fails: panics, or returns a NaN confidence at block index 1.
struct Failing {
    inner: ScriptedDenoiser,
    fail_at: usize,
    panic: bool,
}

impl Denoiser for Failing {
    fn reset(&mut self, capacity: usize) -> Result<()> {
        self.inner.reset(capacity)
    }
    fn denoise(&mut self, pass: Pass<'_>, s: &SamplerSpec, u: &[f32]) -> Result<Vec<PosSample>> {
        let n = self.inner.passes;
        let mut out = self.inner.denoise(pass, s, u)?;
        if n == self.fail_at {
            if self.panic {
                let empty: Vec<u32> = Vec::new();
                let _ = empty[n]; // index out of bounds, as the sampler once did
            }
            out[1] = PosSample { conf: f32::NAN, ..out[1] };
        }
        Ok(out)
    }
}

#[test]
fn a_panic_in_the_model_ends_the_decode_with_reason_error_and_keeps_what_came_before() {
    let mut d = Failing { inner: ScriptedDenoiser::new(right_first), fail_at: 2, panic: true };
    let req = request(6, settings(Strategy::LowConfidenceStatic, 6));
    let mut events = vec![];
    let fin = decode(&mut d, &Pieces, &req, &mut |e| events.push(e), None);
    assert_eq!(fin.reason, FinishReason::Error);
    let msg = fin.error.clone().unwrap();
    assert!(msg.starts_with("internal error (panic): index out of bounds"), "{msg}");
    assert!(msg.contains("tests/engine_events.rs:"), "names where: {msg}");
    assert_eq!(
        shape(&events),
        vec![
            "header first_block=1 max_len=12",
            "step b1 s0 f1 [7] masked [6]",
            "step b1 s1 f2 [6] masked []",
            "block b1 start=4 steps=2 f2",
            "finish Error n=2 f2",
        ]
    );
}

#[test]
fn a_panic_on_the_engine_thread_still_sends_the_finish_event() {
    let d = Failing { inner: ScriptedDenoiser::new(right_first), fail_at: 0, panic: true };
    let (tx, rx) = mpsc::channel();
    let engine = unmask::engine::EngineThread::spawn(Box::new(d), Box::new(Pieces), move |e| {
        let _ = tx.send(e);
    });
    engine.submit(request(6, settings(Strategy::LowConfidenceStatic, 6)));
    let mut events = vec![];
    while !matches!(events.last(), Some(Event::Finish(_))) {
        // Before the fix the channel stayed open and silent: wait a bounded time, not forever.
        events.push(rx.recv_timeout(std::time::Duration::from_secs(20)).expect("a finish event"));
    }
    assert_eq!(shape(&events), vec!["header first_block=1 max_len=12", "finish Error n=0 f0"]);
    // ... and the thread lives on for the next decode.
    drop(engine);
}

#[test]
fn a_non_finite_sample_fails_the_decode_naming_block_step_and_position() {
    let mut d = Failing { inner: ScriptedDenoiser::new(right_first), fail_at: 2, panic: false };
    let req = request(6, settings(Strategy::LowConfidenceStatic, 6));
    let mut events = vec![];
    decode(&mut d, &Pieces, &req, &mut |e| events.push(e), None);
    let Some(Event::Finish(f)) = events.last() else { panic!() };
    assert_eq!(f.reason, FinishReason::Error);
    assert_eq!(
        f.error.as_deref(),
        Some("block 2 step 0 (forward 3): non-finite logits at position 9 (NaN/Inf in the weights or an overflowing activation)")
    );
    // Nothing NaN was sent on.
    assert!(events.iter().all(|e| e.non_finite().is_none()));
}
