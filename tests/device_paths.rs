//! The GPU's execution paths, run on the CPU: the device sampler (its CPU mirror, through the
//! same candle custom op) and the fixed-buffer block passes that CUDA replays as graphs must
//! give the same decode, event for event, as the reference path (host logits + reference
//! sampler, exact-length attention).

mod common;

use std::path::Path;

use candle_core::{DType, Device};
use unmask::engine::settings::{DecodeSettings, Sampling, Schedule, Strategy};
use unmask::engine::{decode, ModelDenoiser, Request, RunOptions};
use unmask::model::{Checkpoint, Source};
use unmask::trace::events::Event;

use common::request;

fn load() -> Checkpoint {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-random");
    Checkpoint::load(&Source::Dir(dir), &Device::Cpu, DType::F32).unwrap()
}

/// Events with their timings zeroed.
fn run(opts: RunOptions, settings: &DecodeSettings, prompt_ids: &[u32]) -> Vec<Event> {
    let ck = load();
    let req = request(prompt_ids, settings.clone(), ck.tokenizer.mask_id(), ck.info.clone());
    let mut den = ModelDenoiser::with_options(ck.model, ck.tokenizer.mask_id(), opts);
    let mut events = vec![];
    decode(&mut den, &ck.tokenizer, &req, &mut |e| events.push(e), None);
    assert_eq!(den.status().host_rows, 0, "the tiny vocabulary never needs the host sampler");
    for e in &mut events {
        match e {
            Event::Step(s) => s.t_ms = 0.0,
            Event::Block(b) => b.t_ms = 0.0,
            Event::Finish(f) => f.elapsed_ms = 0.0,
            Event::Header(_) => {}
        }
    }
    events
}

fn settings(strategy: Strategy, sampling: Sampling) -> DecodeSettings {
    DecodeSettings {
        strategy,
        schedule: Schedule::Sdar,
        threshold: 0.3,
        eb_threshold: 0.35,
        block_length: 4,
        steps: 4,
        sampling,
        max_new_tokens: 24,
        ..DecodeSettings::default()
    }
}

/// conf/entropy may differ in the last bits between paths (a different reduction order);
/// tokens, positions and the step structure may not.
fn assert_same(a: &[Event], b: &[Event], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: event count");
    for (x, y) in a.iter().zip(b) {
        match (x, y) {
            (Event::Step(s), Event::Step(t)) => {
                assert_eq!((s.block, s.step, s.forward), (t.block, t.step, t.forward), "{what}");
                let c1: Vec<_> = s.committed.iter().map(|c| (c.pos, c.token)).collect();
                let c2: Vec<_> = t.committed.iter().map(|c| (c.pos, c.token)).collect();
                assert_eq!(c1, c2, "{what}: block {} step {}", s.block, s.step);
                for (c, d) in s.committed.iter().zip(&t.committed) {
                    assert!(
                        (c.conf - d.conf).abs() < 1e-5 && (c.entropy - d.entropy).abs() < 1e-4,
                        "{what}: {c:?} {d:?}"
                    );
                }
                let m1: Vec<_> = s.masked.iter().map(|c| (c.pos, c.token)).collect();
                let m2: Vec<_> = t.masked.iter().map(|c| (c.pos, c.token)).collect();
                assert_eq!(m1, m2, "{what}: candidates");
            }
            _ => assert_eq!(x, y, "{what}"),
        }
    }
}

#[test]
fn device_sampler_and_fixed_passes_decode_like_the_reference() {
    let device_sampler =
        RunOptions { device_sampler: true, fixed_passes: false, cuda_graph: false };
    let fixed = RunOptions { device_sampler: true, fixed_passes: true, cuda_graph: false };
    let sampled = Sampling { temperature: 0.9, top_k: 20, top_p: 0.9, seed: 5 };
    let unbounded = Sampling { temperature: 1.1, top_k: 0, top_p: 1.0, seed: 6 };
    // prompts that fill whole blocks and that leave a tail in the first decode block
    for prompt in [vec![5u32, 17, 42, 7, 99, 3, 12, 250], vec![5, 17, 42, 7, 99, 3]] {
        for (strategy, sampling) in [
            (Strategy::LowConfidenceDynamic, Sampling::default()),
            (Strategy::EntropyBounded, Sampling::default()),
            (Strategy::LowConfidenceStatic, sampled),
            (Strategy::Sequential, unbounded),
        ] {
            let s = settings(strategy, sampling);
            let want = run(RunOptions::reference(), &s, &prompt);
            let what = format!("{strategy:?} {sampling:?} prompt {}", prompt.len());
            assert_same(
                &run(device_sampler, &s, &prompt),
                &want,
                &format!("device sampler, {what}"),
            );
            assert_same(&run(fixed, &s, &prompt), &want, &format!("fixed passes, {what}"));
        }
    }
}

#[test]
fn fixed_passes_survive_a_restart_in_the_same_denoiser() {
    // Two decodes through one denoiser: the second reuses the cache and the fixed buffers.
    let ck = load();
    let fixed = RunOptions { device_sampler: true, fixed_passes: true, cuda_graph: false };
    let mut den = ModelDenoiser::with_options(ck.model, ck.tokenizer.mask_id(), fixed);
    let s = settings(Strategy::LowConfidenceDynamic, Sampling::default());
    let mut outs = vec![];
    for prompt in [vec![9u32, 8, 7, 6, 5, 4, 3, 2, 1], vec![1u32, 2, 3, 4, 5]] {
        let req = request(&prompt, s.clone(), ck.tokenizer.mask_id(), ck.info.clone());
        let fin = decode(&mut den, &ck.tokenizer, &req, &mut |_| {}, None);
        outs.push((prompt, fin.output_ids));
    }
    for (prompt, out) in outs {
        let want = run(RunOptions::reference(), &s, &prompt);
        let Some(Event::Finish(f)) = want.last() else { panic!() };
        assert_eq!(out, f.output_ids, "prompt {prompt:?}");
    }
}

#[test]
fn events_off_decodes_the_same_tokens_and_sends_only_the_finish() {
    let ck = load();
    let mask = ck.tokenizer.mask_id();
    let s = settings(Strategy::LowConfidenceStatic, Sampling::default());
    let req = request(&[3, 1, 4, 1, 5, 9], s.clone(), mask, ck.info.clone());
    let mut den = ModelDenoiser::with_options(ck.model, mask, RunOptions::reference());
    let mut sent = vec![];
    let off = unmask::engine::decode_with_events(
        &mut den,
        &ck.tokenizer,
        &req,
        &mut |e| sent.push(e),
        None,
        false,
    );
    assert_eq!(sent.len(), 1, "only the finish event");
    assert!(off.text.is_empty());
    let on = decode(&mut den, &ck.tokenizer, &req, &mut |_| {}, None);
    assert_eq!((off.output_ids, off.forwards, off.steps), (on.output_ids, on.forwards, on.steps));
}

/// `--candidates 3` on the GPU's paths: ranking takes the host path (eager pass, host logits,
/// reference sampler) for every pass, so the decode is the reference one, lists added.
#[test]
fn candidates_above_1_take_the_host_path_and_decode_the_same() {
    let ck = load();
    let device = RunOptions { device_sampler: true, fixed_passes: true, cuda_graph: false };
    let sampled = settings(
        Strategy::LowConfidenceDynamic,
        Sampling { temperature: 0.8, top_k: 20, top_p: 0.9, seed: 3 },
    );
    let reference = run(RunOptions::reference(), &sampled, &[5, 6, 7, 8, 9]);
    let req = Request {
        candidates: 3,
        ..request(&[5, 6, 7, 8, 9], sampled, ck.tokenizer.mask_id(), ck.info.clone())
    };
    let mut den = ModelDenoiser::with_options(ck.model, ck.tokenizer.mask_id(), device);
    let mut events = vec![];
    let fin = decode(&mut den, &ck.tokenizer, &req, &mut |e| events.push(e), None);
    assert_eq!(
        den.status().host_rows,
        fin.forwards * 4,
        "every position of every pass on the host"
    );
    let tokens = |ev: &[Event]| -> Vec<Vec<(usize, u32)>> {
        ev.iter()
            .filter_map(|e| if let Event::Step(s) = e { Some(s) } else { None })
            .map(|s| {
                s.committed
                    .iter()
                    .map(|c| (c.pos, c.token))
                    .chain(s.masked.iter().map(|c| (c.pos, c.token)))
                    .collect()
            })
            .collect()
    };
    assert_eq!(tokens(&events), tokens(&reference));
    let lists = events
        .iter()
        .filter_map(|e| if let Event::Step(s) = e { Some(s) } else { None })
        .flat_map(|s| &s.committed);
    for c in lists {
        assert!(
            !c.top.is_empty() && c.top.len() <= 3 && c.top.windows(2).all(|w| w[0].p >= w[1].p),
            "{:?}",
            c.top
        );
    }
}
