//! SDAR-MoE on the CPU against transformers' Qwen3MoeForCausalLM under SDAR's block-causal mask
//! (tests/fixtures/tiny-sdar-moe, made by gen_moe_fixture.py): the released layout loads (sharded
//! index, no block_size, mask from tokenizer_config), logits and routing equal the reference, and
//! greedy decodes equal it step for step.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use unmask::engine::{decode, Denoiser, ModelDenoiser, Request};
use unmask::events::{Event, FinishReason};
use unmask::model::{Checkpoint, Source};
use unmask::settings::{DecodeSettings, Sampling, Schedule, Strategy};

const NAME: &str = "tiny-sdar-moe";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn load() -> Checkpoint {
    Checkpoint::load(&Source::Dir(fixture(NAME)), &Device::Cpu, DType::F32).unwrap()
}

fn golden() -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture(NAME).join("golden.safetensors"), &Device::Cpu).unwrap()
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

#[test]
fn the_released_layout_loads_with_sdar_defaults() {
    let ck = load();
    assert_eq!(ck.config.model_type, "sdar_moe");
    assert_eq!(ck.config.block_size, None);
    assert_eq!(ck.tokenizer.mask_id(), ck.tokenizer.token_to_id("<|MASK|>").unwrap());
    assert_eq!(ck.mask_source, "tokenizer_config.json mask_token \"<|MASK|>\"");
    assert!(!ck.config.is_sparse(0) && ck.config.is_sparse(1) && ck.config.is_sparse(2));
    assert_eq!(ck.info.num_params, ck.config.num_params());
}

#[test]
fn logits_and_routing_match_transformers() {
    let ck = load();
    let g = golden();
    let prompt = ids(&g["prefill_ids"]);
    let mut cache = ck.model.new_cache(16).unwrap();
    let (h, routing) = ck.model.forward_routed(&prompt, &mut cache, 4, prompt.len()).unwrap();
    let e = rel_err(&ck.model.logits(&h).unwrap(), &g["prefill_logits"]);
    assert!(e <= 1e-4, "prefill logits rel err {e:e}");
    // [positions, sparse layers, k]
    let experts = g["prefill_experts"].to_dtype(DType::I64).unwrap().to_vec3::<i64>().unwrap();
    let weights = g["prefill_expert_weights"].to_vec3::<f32>().unwrap();
    assert_eq!(routing.iter().map(|r| r.layer).collect::<Vec<_>>(), vec![1, 2]);
    for (s, layer) in routing.iter().enumerate() {
        for (p, route) in layer.rows.iter().enumerate() {
            let want: Vec<u32> = experts[p][s].iter().map(|&e| e as u32).collect();
            assert_eq!(route.experts, want, "layer {} position {p}", layer.layer);
            for (got, want) in route.weights.iter().zip(&weights[p][s]) {
                assert!((got - want).abs() <= 1e-5, "layer {} position {p}: weight {got} vs {want}", layer.layer);
            }
        }
    }
    let mut cache = ck.model.new_cache(16).unwrap();
    ck.model.forward(&prompt[..8], &mut cache, 4, 8).unwrap();
    let h = ck.model.forward(&ids(&g["denoise_ids"]), &mut cache, 4, 0).unwrap();
    let e = rel_err(&ck.model.logits(&h).unwrap(), &g["denoise_logits"]);
    assert!(e <= 1e-4, "denoise logits rel err {e:e}");
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
fn greedy_decodes_match_the_reference_step_for_step() {
    let text = std::fs::read_to_string(fixture("golden_decodes_moe.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    assert!(cases.len() >= 10, "expected the full case list");
    let mut multi_token_steps = 0;
    for case in &cases {
        assert_eq!(case.model, NAME);
        let events = run_case(case, load());
        let steps: Vec<ExpStep> = events
            .iter()
            .filter_map(|e| match e {
                Event::Step(s) => Some(ExpStep {
                    block: s.block,
                    step: s.step,
                    committed: s.committed.iter().map(|c| ExpCommit { pos: c.pos, token: c.token, conf: c.conf }).collect(),
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
