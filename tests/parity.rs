//! Numerical parity with the PyTorch reference (transformers' Qwen3ForCausalLM under the
//! block-causal mask) and step-for-step parity of greedy decodes with a Python re-run of the
//! algorithm. Goldens: tests/fixtures/gen_fixtures.py.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use unmask::engine::{decode, Denoiser, ModelDenoiser, Request};
use unmask::events::{Event, FinishReason};
use unmask::model::{Checkpoint, Source};
use unmask::settings::{DecodeSettings, Sampling, Schedule, Strategy};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn load(name: &str) -> Checkpoint {
    Checkpoint::load(&Source::Dir(fixture(name)), &Device::Cpu, DType::F32).unwrap()
}

fn golden(name: &str) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture(name).join("golden.safetensors"), &Device::Cpu).unwrap()
}

fn ids(t: &Tensor) -> Vec<u32> {
    t.to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect()
}

/// ‖a − b‖ / ‖b‖ over all elements.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn prefill_logits(ck: &Checkpoint, prompt: &[u32]) -> Tensor {
    let mut cache = ck.model.new_cache(16).unwrap();
    let h = ck.model.forward(prompt, &mut cache, 4, prompt.len()).unwrap();
    ck.model.logits(&h).unwrap()
}

fn denoise_logits(ck: &Checkpoint, prefix: &[u32], block: &[u32]) -> Tensor {
    let mut cache = ck.model.new_cache(16).unwrap();
    ck.model.forward(prefix, &mut cache, 4, prefix.len()).unwrap();
    let h = ck.model.forward(block, &mut cache, 4, 0).unwrap();
    assert_eq!(cache.len(), prefix.len(), "a denoising pass must not store");
    ck.model.logits(&h).unwrap()
}

#[test]
fn logits_match_transformers_for_prefill_and_cached_denoise() {
    for name in ["tiny-random", "tiny-random-sharded", "tiny-random-tied-bf16"] {
        let ck = load(name);
        let g = golden(name);
        let prompt = ids(&g["prefill_ids"]);
        let got = prefill_logits(&ck, &prompt);
        let e = rel_err(&got, &g["prefill_logits"]);
        assert!(e <= 1e-4, "{name}: prefill logits rel err {e:e}");
        let block = ids(&g["denoise_ids"]);
        let got = denoise_logits(&ck, &prompt[..8], &block);
        let e = rel_err(&got, &g["denoise_logits"]);
        assert!(e <= 1e-4, "{name}: denoise logits rel err {e:e}");
    }
}

#[test]
fn sharded_checkpoint_loads_the_same_weights() {
    let (a, b) = (load("tiny-random"), load("tiny-random-sharded"));
    let prompt = ids(&golden("tiny-random")["prefill_ids"]);
    let (la, lb) = (prefill_logits(&a, &prompt), prefill_logits(&b, &prompt));
    assert_eq!(la.to_vec2::<f32>().unwrap(), lb.to_vec2::<f32>().unwrap());
}

#[test]
fn a_pass_reusing_scratch_slots_does_not_leak_into_the_next() {
    // Two denoising passes over different blocks at the same slots must equal fresh ones.
    let ck = load("tiny-random");
    let g = golden("tiny-random");
    let prompt = ids(&g["prefill_ids"]);
    let block = ids(&g["denoise_ids"]);
    let mut cache = ck.model.new_cache(16).unwrap();
    ck.model.forward(&prompt[..8], &mut cache, 4, 8).unwrap();
    ck.model.forward(&[1, 2, 3, 4], &mut cache, 4, 0).unwrap();
    let h = ck.model.forward(&block, &mut cache, 4, 0).unwrap();
    let e = rel_err(&ck.model.logits(&h).unwrap(), &g["denoise_logits"]);
    assert!(e <= 1e-4, "rel err {e:e}");
}

#[derive(Deserialize)]
struct Case {
    name: String,
    model: String,
    prompt_ids: Vec<u32>,
    block_length: usize,
    steps: usize,
    strategy: Strategy,
    schedule: Schedule,
    threshold: f32,
    eb_threshold: f32,
    max_new_tokens: usize,
    eos_ids: Vec<u32>,
    expected: Expected,
}

#[derive(Deserialize)]
struct Expected {
    steps: Vec<ExpStep>,
    output_ids: Vec<u32>,
    finish_reason: FinishReason,
    forwards: usize,
}

#[derive(Deserialize, Debug, PartialEq)]
struct ExpStep {
    block: usize,
    step: usize,
    committed: Vec<ExpCommit>,
}

#[derive(Deserialize, Debug)]
struct ExpCommit {
    pos: usize,
    token: u32,
    conf: f32,
}

impl PartialEq for ExpCommit {
    fn eq(&self, o: &Self) -> bool {
        self.pos == o.pos && self.token == o.token && (self.conf - o.conf).abs() <= 1e-4
    }
}

fn run_case(case: &Case, ck: Checkpoint) -> Vec<Event> {
    let settings = DecodeSettings {
        strategy: case.strategy,
        schedule: case.schedule,
        threshold: case.threshold,
        eb_threshold: case.eb_threshold,
        block_length: case.block_length,
        steps: case.steps,
        sampling: Sampling::default(),
        max_new_tokens: case.max_new_tokens,
    };
    settings.validate().unwrap();
    let req = Request {
        prompt: String::new(),
        prompt_ids: case.prompt_ids.clone(),
        settings,
        mask_id: ck.tokenizer.mask_id(),
        eos_ids: case.eos_ids.clone(),
        model: ck.info.clone(),
        device: "cpu".into(),
        chat: None,
        sources: Default::default(),
        candidates: 1,
        routing: false,
    };
    let mut denoiser: Box<dyn Denoiser> = Box::new(ModelDenoiser::new(ck.model, ck.tokenizer.mask_id()));
    let mut events = vec![];
    decode(denoiser.as_mut(), &ck.tokenizer, &req, &mut |e| events.push(e), None);
    events
}

#[test]
fn greedy_decodes_match_the_python_reference_step_for_step() {
    let text = std::fs::read_to_string(fixture("golden_decodes.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    assert!(cases.len() >= 10, "expected the full case list");
    let mut multi_token_steps = 0;
    for case in &cases {
        let events = run_case(case, load(&case.model));
        let steps: Vec<ExpStep> = events
            .iter()
            .filter_map(|e| match e {
                Event::Step(s) => Some(ExpStep {
                    block: s.block,
                    step: s.step,
                    committed: s
                        .committed
                        .iter()
                        .map(|c| ExpCommit { pos: c.pos, token: c.token, conf: c.conf })
                        .collect(),
                }),
                _ => None,
            })
            .collect();
        multi_token_steps += steps.iter().filter(|s| s.committed.len() > 1).count();
        assert_eq!(steps, case.expected.steps, "case {}", case.name);
        let Some(Event::Finish(fin)) = events.last() else { panic!("case {}: no finish", case.name) };
        assert_eq!(fin.output_ids, case.expected.output_ids, "case {}", case.name);
        assert_eq!(fin.reason, case.expected.finish_reason, "case {}", case.name);
        assert_eq!(fin.forwards, case.expected.forwards, "case {}", case.name);
    }
    assert!(multi_token_steps > 0, "the cases must exercise multi-token steps");
}
