//! The embedded tiny SDAR model: loads through the public loader, matches the PyTorch training
//! model's logits (golden from assets/recipe/golden.py), and decodes a fixed prompt with a fixed
//! seed to the exact committed output and step map.

use std::path::Path;

use candle_core::{DType, Device, IndexOp, Tensor};
use serde::Deserialize;
use unmask::cli::session::Session;
use unmask::cli::DecodeArgs;
use unmask::engine::decode;
use unmask::model::{Checkpoint, Source};
use unmask::trace::events::Event;

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn embedded_model_logits_match_the_pytorch_training_model() {
    let embedded = unmask::model::embedded::default_model().unwrap();
    let ck = Checkpoint::load(&Source::Embedded(embedded), &Device::Cpu, DType::F32).unwrap();
    assert_eq!((ck.tokenizer.mask_id(), ck.eos_ids.as_slice()), (4095, &[4094][..]));
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-sdar-golden.safetensors");
    let g = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    let (ids, want) = (&g["input_ids"], &g["logits"]);
    for row in 0..2 {
        let ids: Vec<u32> =
            ids.i(row).unwrap().to_vec1::<i64>().unwrap().iter().map(|&x| x as u32).collect();
        // Five whole blocks prefilled, then one denoising pass over the last (masked) block.
        let mut cache = ck.model.new_cache(24).unwrap();
        let pre = ck.model.forward(&ids[..20], &mut cache, 4, 20).unwrap();
        let last = ck.model.forward(&ids[20..], &mut cache, 4, 0).unwrap();
        let got =
            Tensor::cat(&[ck.model.logits(&pre).unwrap(), ck.model.logits(&last).unwrap()], 0)
                .unwrap();
        let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let want = want.i(row).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let e = rel_err(&got, &want);
        assert!(e <= 1e-4, "row {row}: rel err {e:e}");
    }
}

#[derive(Deserialize)]
struct Expected {
    prompt: String,
    seed: u64,
    max_new_tokens: usize,
    output_ids: Vec<u32>,
    text: String,
    forwards: usize,
    step_map: Vec<(usize, usize)>,
}

#[test]
fn embedded_model_decodes_the_fixed_prompt_exactly() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-sdar-decode.json");
    let exp: Expected = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let args = DecodeArgs {
        prompt: Some(exp.prompt.clone()),
        seed: Some(exp.seed),
        max_new_tokens: Some(exp.max_new_tokens),
        device: unmask::model::DeviceSpec::Cpu,
        ..DecodeArgs::default()
    };
    let mut s = Session::open(&args).unwrap();
    assert_eq!(
        s.request.settings.sampling.temperature, 0.7,
        "defaults come from generation_config.json"
    );
    let mut events = vec![];
    let fin = decode(&mut s.denoiser, &s.tokenizer, &s.request, &mut |e| events.push(e), None);
    assert_eq!(fin.output_ids, exp.output_ids);
    assert_eq!(fin.text, exp.text);
    assert_eq!(fin.forwards, exp.forwards);
    let p = s.request.prompt_ids.len();
    let n = fin.output_ids.len();
    let mut map = vec![(usize::MAX, usize::MAX); n];
    for e in &events {
        if let Event::Step(st) = e {
            for c in st.committed.iter().filter(|c| c.pos >= p && c.pos < p + n) {
                map[c.pos - p] = (st.block, st.step);
            }
        }
    }
    assert_eq!(map, exp.step_map);
    assert!(map.iter().any(|&(_, step)| step > 0), "some tokens wait for later steps");
}
