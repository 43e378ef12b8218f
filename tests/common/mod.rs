//! What tests/parity.rs and tests/moe_parity.rs share: loading the fixtures and their goldens,
//! the relative error, and the runner that replays the golden greedy decodes (made by
//! tests/fixtures/gen_fixtures.py and gen_moe_fixture.py) step for step. (tests/moe_routing.rs
//! uses it too; tests/reliability.rs and e2e_tmux.rs take broken copies of a fixture from it.)
//! Each test crate uses some of it, hence no dead-code warnings here.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use unmask::engine::settings::{DecodeSettings, Sampling, Schedule, Strategy};
use unmask::engine::{decode, Denoiser, ModelDenoiser, Request};
use unmask::model::{Checkpoint, PathChoices, Source};
use unmask::trace::events::{Event, FinishReason, ModelInfo};

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The fixture checkpoint `name` on the CPU in f32.
pub fn load(name: &str) -> Checkpoint {
    Checkpoint::load(&Source::Dir(fixture(name)), &Device::Cpu, DType::F32).unwrap()
}

/// The reference tensors of the fixture checkpoint `name`.
pub fn golden(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture(name).join("golden.safetensors"), &Device::Cpu).unwrap()
}

pub fn ids(t: &Tensor) -> Vec<u32> {
    t.to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect()
}

/// ‖a − b‖ / ‖b‖ over all elements.
pub fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[derive(Deserialize)]
pub struct Case {
    pub name: String,
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

/// A CPU decode of `prompt_ids` with `settings` on a model of `info`: no chat, no EOS, nothing
/// asked beyond the samples (set `eos_ids`, `candidates`, `routing` with struct update syntax).
pub fn request(
    prompt_ids: &[u32],
    settings: DecodeSettings,
    mask_id: u32,
    model: ModelInfo,
) -> Request {
    Request {
        prompt: String::new(),
        prompt_ids: prompt_ids.to_vec(),
        settings,
        mask_id,
        eos_ids: vec![],
        model,
        device: "cpu".into(),
        chat: None,
        sources: Default::default(),
        candidates: 1,
        routing: false,
    }
}

/// Decodes `case` greedily on `ck` (with `--routing` when `routing`); every event.
pub fn run_case(case: &Case, ck: Checkpoint, routing: bool) -> Vec<Event> {
    let settings = DecodeSettings {
        strategy: case.strategy,
        schedule: case.schedule,
        threshold: case.threshold,
        eb_threshold: case.eb_threshold,
        block_length: case.block_length,
        steps: case.steps,
        sampling: Sampling::default(),
        max_new_tokens: case.max_new_tokens,
        ..DecodeSettings::default()
    };
    settings.validate().unwrap();
    let req = Request {
        eos_ids: case.eos_ids.clone(),
        routing,
        ..request(&case.prompt_ids, settings, ck.tokenizer.mask_id(), ck.info.clone())
    };
    let mut denoiser: Box<dyn Denoiser> =
        Box::new(ModelDenoiser::new(ck.model, ck.tokenizer.mask_id(), &PathChoices::DEFAULT));
    let mut events = vec![];
    decode(denoiser.as_mut(), &ck.tokenizer, &req, &mut |e| events.push(e), None);
    events
}

fn steps(events: &[Event]) -> Vec<ExpStep> {
    events
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
        .collect()
}

/// The golden decode cases of the fixture file `file`.
pub fn cases(file: &str) -> Vec<Case> {
    serde_json::from_str(&std::fs::read_to_string(fixture(file)).unwrap()).unwrap()
}

/// Decodes every case of the fixture file `cases` (at least 10 of them, some step committing
/// several tokens) on the checkpoint `load` returns for the case's model, and asserts its steps
/// (positions, tokens, confidences within 1e-4), output, finish reason and forward count equal
/// the reference's.
pub fn assert_golden_decodes(cases: &str, load: impl Fn(&str) -> Checkpoint) {
    let cases = self::cases(cases);
    assert!(cases.len() >= 10, "expected the full case list");
    let mut multi_token_steps = 0;
    for case in &cases {
        let events = run_case(case, load(&case.model), false);
        let steps = steps(&events);
        multi_token_steps += steps.iter().filter(|s| s.committed.len() > 1).count();
        assert_eq!(steps, case.expected.steps, "case {}", case.name);
        let Some(Event::Finish(fin)) = events.last() else {
            panic!("case {}: no finish", case.name)
        };
        assert_eq!(fin.output_ids, case.expected.output_ids, "case {}", case.name);
        assert_eq!(fin.reason, case.expected.finish_reason, "case {}", case.name);
        assert_eq!(fin.forwards, case.expected.forwards, "case {}", case.name);
    }
    assert!(multi_token_steps > 0, "the cases must exercise multi-token steps");
}

/// A copy of the tiny-random fixture, changed by `edit` (a broken checkpoint to load).
pub fn copy_model(edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(fixture("tiny-random")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    edit(dir.path());
    dir
}

/// Overwrites every value of an f32 tensor of a safetensors file in place.
pub fn poison_tensor(file: &Path, name: &str, value: f32) {
    let mut bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header[name];
    assert_eq!(t["dtype"], "F32");
    let (a, b) = (
        t["data_offsets"][0].as_u64().unwrap() as usize,
        t["data_offsets"][1].as_u64().unwrap() as usize,
    );
    for chunk in bytes[8 + n + a..8 + n + b].chunks_mut(4) {
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    std::fs::write(file, bytes).unwrap();
}
