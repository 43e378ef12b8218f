//! LLaDA2.0's and LLaDA2.1's `generate()`, pass for pass: the decode loop, fed the argmax and
//! confidence that the published code saw at every pass (tests/fixtures/golden_llada2_decodes.json),
//! must make the same commits and the same edits, end every block where upstream did, and
//! return the same output: once with a test double that answers every pass with upstream's
//! argmax and confidence (the decoders alone), once with the fixture checkpoint itself (the
//! whole path).

mod common;

use anyhow::Result;
use candle_core::{DType, Device};
use serde_json::Value;
use unmask::engine::settings::{DecodeSettings, SamplerSpec, Sampling, Schedule, Strategy};
use unmask::engine::{decode, Denoiser, Detok, ModelDenoiser, Pass, Request};
use unmask::model::{Checkpoint, PathChoices, Source};
use unmask::sampler::PosSample;
use unmask::trace::events::{Event, FinishReason, ModelInfo};

const GOLDEN: &str = include_str!("fixtures/golden_llada2_decodes.json");

/// Test double: answers pass `n` with the golden's pass `n` (argmax and confidence at every
/// position of the block), after checking that the loop asked for the block upstream denoised.
struct Replayed {
    passes: Vec<Value>,
    next: usize,
    /// The block of the last pass: blocks come in order.
    block: usize,
    mask: u32,
}

impl Denoiser for Replayed {
    fn reset(&mut self, _capacity: usize) -> Result<()> {
        Ok(())
    }

    fn denoise(&mut self, pass: Pass<'_>, _: &SamplerSpec, _: &[f32]) -> Result<Vec<PosSample>> {
        let Some(want) = self.passes.get(self.next) else {
            panic!("pass {} asked; upstream made {}", self.next, self.passes.len())
        };
        let block = want["block"].as_u64().unwrap() as usize;
        assert!(block >= self.block, "pass {}: block {block} after {}", self.next, self.block);
        self.block = block;
        let start = block * pass.block.len();
        let masked: Vec<u64> = (0..pass.block.len())
            .filter(|&i| pass.block[i] == self.mask)
            .map(|i| (start + i) as u64)
            .collect();
        assert_eq!(
            masked,
            ints(&want["masked"]),
            "pass {} (block {block}): masked positions",
            self.next
        );
        let argmax = want["argmax"].as_array().unwrap();
        let conf = want["conf"].as_array().unwrap();
        self.next += 1;
        Ok(argmax
            .iter()
            .zip(conf)
            .map(|(t, c)| PosSample {
                token: t.as_u64().unwrap() as u32,
                conf: c.as_f64().unwrap() as f32,
                entropy: 0.0,
            })
            .collect())
    }
}

struct Ids;
impl Detok for Ids {
    fn piece(&self, id: u32) -> String {
        format!("<{id}>")
    }
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|&i| self.piece(i)).collect()
    }
}

/// The decode settings that reproduce a case's `generate()` arguments.
fn settings(case: &Value) -> DecodeSettings {
    let s = &case["settings"];
    let f = |k: &str| s[k].as_f64().unwrap() as f32;
    let u = |k: &str| s[k].as_u64().unwrap() as usize;
    let editing = case["decoder"] == "2.1";
    let d = DecodeSettings::default();
    DecodeSettings {
        strategy: if editing { Strategy::JointThreshold } else { Strategy::LowConfidenceDynamic },
        schedule: Schedule::Sdar,
        threshold: f("threshold"),
        block_length: u("block_length"),
        steps: u("steps"),
        sampling: Sampling::default(),
        max_new_tokens: u("gen_length"),
        edit_threshold: if editing { f("editing_threshold") } else { d.edit_threshold },
        max_post_steps: if editing { u("max_post_steps") } else { d.max_post_steps },
        // 2.0 always stops after the block holding an EOS; 2.1 only when asked
        eos_early_stop: !editing || s["eos_early_stop"].as_bool().unwrap(),
        ..d
    }
}

/// The integers of a golden list.
fn ints(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    ints(v).into_iter().map(|t| t as u32).collect()
}

fn request(case: &Value) -> Request {
    let model = ModelInfo {
        source: "golden".into(),
        model_type: "llada2_moe".into(),
        vocab_size: 354,
        hidden_size: 64,
        num_layers: 3,
        num_params: 1,
        dtype: "f32".into(),
        compute: None,
        moe: None,
    };
    let mask = case["settings"]["mask_id"].as_u64().unwrap() as u32;
    Request {
        eos_ids: vec![case["settings"]["eos_id"].as_u64().unwrap() as u32],
        ..common::request(&u32s(&case["prompt_ids"]), settings(case), mask, model)
    }
}

/// `(pos, token)` of a list of golden commits, or `(pos, from, to)` of its edits, as text.
fn golden_list(v: &Value, edits: bool) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| match edits {
            false => format!("{}={}", c["pos"], c["token"]),
            true => format!("{}:{}->{}", c["pos"], c["from"], c["to"]),
        })
        .collect()
}

/// Decodes every golden case with the denoiser `make` gives, and checks it made upstream's
/// commits and edits pass for pass (confidences within `conf_tol`), ended every block where
/// upstream did and returned the same output. Returns the number of edits seen.
fn check_cases<D: Denoiser>(
    detok: &dyn Detok,
    conf_tol: f32,
    mut make: impl FnMut(&Value, &Request) -> D,
) -> usize {
    let cases: Vec<Value> = serde_json::from_str(GOLDEN).unwrap();
    assert_eq!(cases.len(), 9);
    let mut edits_seen = 0;
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let want = &case["expected"];
        let passes = want["passes"].as_array().unwrap();
        let req = request(case);
        let mut d = make(case, &req);
        let mut events = vec![];
        let fin = decode(&mut d, detok, &req, &mut |e| events.push(e), None);
        assert_eq!(fin.error, None, "{name}");
        let steps: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::Step(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(steps.len(), passes.len(), "{name}: passes");
        for (i, (got, want)) in steps.iter().zip(passes).enumerate() {
            let at = format!("{name} pass {i} (block {} step {})", want["block"], want["step"]);
            assert_eq!(
                (got.block as u64, got.step as u64),
                (want["block"].as_u64().unwrap(), want["step"].as_u64().unwrap()),
                "{at}"
            );
            let commits: Vec<String> =
                got.committed.iter().map(|c| format!("{}={}", c.pos, c.token)).collect();
            assert_eq!(commits, golden_list(&want["committed"], false), "{at}: commits");
            let edits: Vec<String> =
                got.edited.iter().map(|c| format!("{}:{}->{}", c.pos, c.from, c.token)).collect();
            let want_edits = want.get("edited").map_or(vec![], |e| golden_list(e, true));
            assert_eq!(edits, want_edits, "{at}: edits");
            let confs =
                got.committed.iter().map(|c| c.conf).chain(got.edited.iter().map(|c| c.conf));
            let want_confs = want["committed"]
                .as_array()
                .unwrap()
                .iter()
                .chain(want.get("edited").and_then(Value::as_array).into_iter().flatten())
                .map(|c| c["conf"].as_f64().unwrap() as f32);
            for (g, w) in confs.zip(want_confs) {
                assert!((g - w).abs() <= conf_tol, "{at}: confidence {g} against {w}");
            }
            edits_seen += edits.len();
        }
        let blocks: Vec<(u64, u64)> = events
            .iter()
            .filter_map(|e| match e {
                Event::Block(b) => Some((b.block as u64, b.steps as u64)),
                _ => None,
            })
            .collect();
        let want_blocks: Vec<(u64, u64)> = want["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["block"].as_u64().unwrap(), b["passes"].as_u64().unwrap()))
            .collect();
        assert_eq!(blocks, want_blocks, "{name}: blocks and the passes each took");
        let out = u32s(&want["output_ids"]);
        assert_eq!(fin.output_ids, out, "{name}: output");
        assert_eq!(fin.forwards as u64, want["forwards"].as_u64().unwrap(), "{name}: forwards");
        let eos = out.last().is_some_and(|t| req.eos_ids.contains(t));
        let reason = if eos { FinishReason::Eos } else { FinishReason::Length };
        assert_eq!(fin.reason, reason, "{name}");
        // The block events hold the final tokens: upstream's final sequence.
        let finals: Vec<u32> = events
            .iter()
            .filter_map(|e| match e {
                Event::Block(b) => Some(b.tokens.clone()),
                _ => None,
            })
            .flatten()
            .skip(req.prompt_ids.len() % req.settings.block_length)
            .collect();
        let want_finals = u32s(&want["final_sequence_ids"]);
        // (a decode stopped at an EOS leaves upstream's later blocks masked)
        let (done, rest) = want_finals.split_at(finals.len().min(want_finals.len()));
        assert_eq!(&finals[..done.len()], done, "{name}: final sequence");
        assert!(rest.iter().all(|&t| t == req.mask_id), "{name}: blocks upstream did not decode");
    }
    edits_seen
}

#[test]
fn both_decoders_make_upstreams_commits_and_edits_pass_for_pass() {
    let edits = check_cases(&Ids, 0.0, |case, req| Replayed {
        passes: case["expected"]["passes"].as_array().unwrap().clone(),
        next: 0,
        block: 0,
        mask: req.mask_id,
    });
    assert!(edits > 100, "the cases edit ({edits})");
}

/// The whole path: the fixture checkpoint in f32 on the CPU, through the engine's own
/// denoiser and KV cache, decodes as the published `generate()` did on the same weights.
#[test]
fn the_fixture_model_decodes_as_upstream_step_for_step() {
    let ck = common::load("tiny-llada2");
    let mask = ck.tokenizer.mask_id();
    let mut model = Some(ck.model);
    let tok = ck.tokenizer;
    let path = common::fixture("tiny-llada2");
    let edits = check_cases(&tok, 1e-4, |_, _| {
        // one load per case: the model moves into its denoiser
        let m = model.take().unwrap_or_else(|| {
            Checkpoint::load(&Source::Dir(path.clone()), &Device::Cpu, DType::F32).unwrap().model
        });
        ModelDenoiser::new(m, mask, &PathChoices::DEFAULT)
    });
    assert!(edits > 100, "the cases edit ({edits})");
}
