//! LLaDA2 (`llada2_moe`) on the CPU against the reference code's numbers
//! (tests/fixtures/tiny-llada2, made by gen_llada2_fixture.py): the forward's logits under the
//! block-causal mask, the grouped sigmoid router row by row, the checkpoint's own checks (bias
//! tensors against the config), and a greedy decode through the existing strategies.

mod common;

use std::collections::BTreeSet;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;
use unmask::model::layers::router::{sigmoid, GroupedSigmoid, Routing};
use unmask::model::{Checkpoint, Compute, Source};

const NAME: &str = "tiny-llada2";

fn golden_json(file: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(common::fixture(file)).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The forward golden's 16 rows (block 0 and a tail in block 1, then masks) in one pass over
/// an empty cache, blocks of 8: the logits `[16, vocab]`.
fn forward_logits(ck: &Checkpoint) -> Vec<Vec<f32>> {
    let g = golden_json("golden_llada2_forward.json");
    let ids = u32s(&g["ids"]);
    let block = g["block_length"].as_u64().unwrap() as usize;
    let mut cache = ck.model.new_cache(ids.len()).unwrap();
    let h = ck.model.forward(&ids, &mut cache, block, 0).unwrap();
    ck.model.logits(&h).unwrap().to_vec2::<f32>().unwrap()
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |b, (i, &v)| if v > row[b] { i } else { b })
}

#[test]
fn the_released_layout_loads_as_llada2() {
    let ck = common::load(NAME);
    assert_eq!(ck.config.model_type, "llada2_moe");
    assert_eq!(ck.tokenizer.mask_id(), 353);
    assert_eq!(ck.mask_source, "tokenizer_config.json mask_token \"<|mask|>\"");
    assert_eq!(ck.eos_ids, vec![352]);
    assert!(!ck.config.is_sparse(0) && ck.config.is_sparse(1) && ck.config.is_sparse(2));
    // every tensor of the checkpoint is a parameter of the shapes, but the routers' biases
    // (buffers, not parameters): 8 values in each of the two sparse layers
    let bytes = std::fs::read(common::fixture(NAME).join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let total: usize = st.tensors().iter().map(|(_, t)| t.shape().iter().product::<usize>()).sum();
    assert_eq!(ck.info.num_params, ck.config.num_params());
    assert_eq!(total, ck.config.num_params() + 2 * 8);
}

#[test]
fn f32_logits_equal_the_reference_forward() {
    let g = golden_json("golden_llada2_forward.json");
    let got = forward_logits(&common::load(NAME));
    let want: Vec<Vec<f32>> = g["logits"].as_array().unwrap().iter().map(floats).collect();
    assert_eq!(got.len(), 16);
    let mut worst = 0f32;
    for (r, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs());
        }
        assert_eq!(argmax(a), g["argmax"][r].as_u64().unwrap() as usize, "row {r}");
    }
    eprintln!("max |logit - reference| = {worst:.3e}");
    assert!(worst <= 1e-4, "max abs logit difference {worst:e}");
}

/// In bf16 (the whole model on the CPU in bf16, and f32 with `--dtype bf16`'s bf16 products) the
/// logits move by bf16's rounding; the argmax is the reference's wherever the reference's own
/// margin (top-1 minus top-2 logit) is wider than twice that movement.
#[test]
fn bf16_argmax_agrees_where_the_margin_allows() {
    let g = golden_json("golden_llada2_forward.json");
    let want: Vec<Vec<f32>> = g["logits"].as_array().unwrap().iter().map(floats).collect();
    for (label, compute) in
        [("bf16", Compute::from(DType::BF16)), ("bf16 products", Compute::CPU_BF16)]
    {
        let ck =
            Checkpoint::load(&Source::Dir(common::fixture(NAME)), &Device::Cpu, compute).unwrap();
        let got = forward_logits(&ck);
        let mut worst = 0f32;
        for (a, b) in got.iter().zip(&want) {
            worst = a.iter().zip(b).fold(worst, |m, (x, y)| m.max((x - y).abs()));
        }
        // bf16 rounding through three layers of logits up to 13: well under half a unit
        assert!(worst < 0.5, "{}: max abs logit difference {worst}", label);
        let mut checked = 0;
        for (r, (a, b)) in got.iter().zip(&want).enumerate() {
            let top = argmax(b);
            let second = b
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != top)
                .fold(f32::MIN, |m, (_, &v)| m.max(v));
            if b[top] - second > 0.25 {
                assert_eq!(argmax(a), top, "{} row {r}: margin {}", label, b[top] - second);
                checked += 1;
            }
        }
        assert!(checked >= 8, "{}: only {checked} rows had a margin to check", label);
        eprintln!("{}: max |logit - reference| = {worst:.3e}, {checked} argmaxes checked", label);
    }
}

/// Router logits of `input` `[hidden]` through layer `layer`'s `mlp.gate.weight` (bf16 as
/// stored), in f32 as the reference computes them.
fn router_logits(
    weights: &std::collections::HashMap<String, Tensor>,
    layer: u64,
    input: &[f32],
) -> Vec<f32> {
    let w = weights[&format!("model.layers.{layer}.mlp.gate.weight")]
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    w.iter().map(|row| row.iter().zip(input).map(|(a, b)| a * b).sum()).collect()
}

/// Every row of golden_llada2_router.json (the forward's 16 MLP inputs and a zero row, in
/// each sparse layer) through the model's own router: the scores, the chosen experts as a
/// set and their weights, within 1e-6. The zero row of layer 2 is a tie of groups and of
/// experts: either documented answer is accepted (upstream's, or the lower index first).
#[test]
fn the_router_routes_every_golden_row() {
    let g = golden_json("golden_llada2_router.json");
    let weights = candle_core::safetensors::load(
        common::fixture(NAME).join("model.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let mut rows = 0;
    let mut ties = 0;
    for layer in g["layers"].as_array().unwrap() {
        let l = layer["layer"].as_u64().unwrap();
        let block = Routing::GroupedSigmoid(GroupedSigmoid {
            bias: floats(&layer["expert_bias"]),
            groups: g["n_group"].as_u64().unwrap() as usize,
            keep: g["topk_group"].as_u64().unwrap() as usize,
            scale: g["routed_scaling_factor"].as_f64().unwrap() as f32,
        });
        for row in layer["rows"].as_array().unwrap() {
            let logits = router_logits(&weights, l, &floats(&row["input"]));
            for (e, (z, want)) in logits.iter().zip(floats(&row["scores"])).enumerate() {
                assert!((sigmoid(*z) - want).abs() <= 1e-6, "layer {l} {}: score {e}", row["what"]);
            }
            let route = block.route(&logits, 2);
            let want = u32s(&row["experts"]);
            let got: BTreeSet<u32> = route.experts.iter().copied().collect();
            let mut answers = vec![want.clone()];
            if let Some(t) = row.get("ties") {
                ties += 1;
                // the lower index first: groups and experts tied at the cut resolved downwards
                assert!(t.as_array().unwrap().len() == 2, "{t}");
                answers.push(vec![5, 0]);
            }
            if row.get("ties").is_some() {
                // the host router orders ties as torch.topk does (topk.rs): upstream's answer
                assert_eq!(route.experts, want, "layer {l}: the tie row");
            }
            let ok = answers.iter().find(|a| a.iter().copied().collect::<BTreeSet<_>>() == got);
            let Some(answer) = ok else {
                panic!(
                    "layer {l} {}: experts {:?}, want one of {answers:?}",
                    row["what"], route.experts
                )
            };
            let want_w = if *answer == want { floats(&row["weights"]) } else { vec![1.25, 1.25] };
            for (e, w) in route.experts.iter().zip(&route.weights) {
                let at = answer.iter().position(|x| x == e).unwrap();
                assert!(
                    (w - want_w[at]).abs() <= 1e-6,
                    "layer {l} {}: expert {e} weight {w} vs {}",
                    row["what"],
                    want_w[at]
                );
            }
            rows += 1;
        }
    }
    assert_eq!((rows, ties), (34, 1));
}

/// The model's own routers (the bias read from the checkpoint, f32) route the forward's rows as
/// the reference did: each sparse layer's experts (in the reference's order) and weights.
#[test]
fn the_forward_routes_as_the_reference() {
    let g = golden_json("golden_llada2_forward.json");
    let r = golden_json("golden_llada2_router.json");
    let ck = common::load(NAME);
    let ids = u32s(&g["ids"]);
    let mut cache = ck.model.new_cache(ids.len()).unwrap();
    let (_, routing) = ck.model.forward_routed(&ids, &mut cache, 8, 0).unwrap();
    assert_eq!(routing.iter().map(|r| r.layer).collect::<Vec<_>>(), vec![1, 2]);
    for (layer, want) in routing.iter().zip(r["layers"].as_array().unwrap()) {
        let rows = want["rows"].as_array().unwrap();
        for (p, route) in layer.rows.iter().enumerate() {
            assert_eq!(rows[p]["pos"].as_u64().unwrap() as usize, p);
            assert_eq!(route.experts, u32s(&rows[p]["experts"]), "layer {} row {p}", layer.layer);
            for (a, b) in route.weights.iter().zip(floats(&rows[p]["weights"])) {
                assert!((a - b).abs() <= 1e-5, "layer {} row {p}: {a} vs {b}", layer.layer);
            }
        }
    }
}

/// A copy of the fixture whose safetensors file `edit` changes (tensor by tensor).
fn edited_copy(
    edit: impl FnOnce(&mut std::collections::HashMap<String, Tensor>),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(common::fixture(NAME)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let file = dir.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, &file).unwrap();
    dir
}

fn load_err(dir: &std::path::Path) -> String {
    match Checkpoint::load(&Source::Dir(dir.to_path_buf()), &Device::Cpu, DType::F32) {
        Ok(_) => panic!("{}: loaded", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn a_missing_router_bias_is_named_with_its_file() {
    let name = "model.layers.2.mlp.gate.expert_bias";
    let dir = edited_copy(|t| {
        t.remove(name);
    });
    let e = load_err(dir.path());
    let file = dir.path().join("model.safetensors");
    assert_eq!(e, format!("{}: missing tensor `{name}`", file.display()));
    // unless the config says the routers have none: then the reference's zeros
    let cfg = dir.path().join("config.json");
    let mut j: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    j["moe_router_enable_expert_bias"] = false.into();
    std::fs::write(&cfg, j.to_string()).unwrap();
    Checkpoint::load(&Source::Dir(dir.path().to_path_buf()), &Device::Cpu, DType::F32).unwrap();
}

#[test]
fn a_bias_tensor_the_config_says_is_absent_is_refused() {
    let name = "model.layers.1.attention.dense.bias";
    let dir = edited_copy(|t| {
        t.insert(name.to_string(), Tensor::zeros(64, DType::BF16, &Device::Cpu).unwrap());
    });
    let e = load_err(dir.path());
    let file = dir.path().join("model.safetensors");
    assert_eq!(
        e,
        format!("{}: tensor `{name}` is present, but config.json's `use_bias` is false: unmask would compute without it", file.display())
    );
}

/// `unmask trace` decodes the fixture with the existing strategies (blocks of 8 by flag): every
/// block filled, 16 tokens, no mask left.
#[test]
fn the_fixture_decodes_through_trace() {
    let dir = common::fixture(NAME);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_unmask"))
        .args(["trace", "--model", dir.to_str().unwrap(), "--raw", "--prompt", "Hi"])
        .args(["--max-new-tokens", "16", "--block-length", "8"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["model"]["model_type"], "llada2_moe");
    assert_eq!(events[0]["settings"]["block_length"], 8);
    let finish = events.last().unwrap();
    assert_eq!(finish["event"], "finish");
    let ids = u32s(&finish["output_ids"]);
    assert_eq!(ids.len(), 16);
    assert!(!ids.contains(&353), "no mask left: {ids:?}");
    assert!(events.iter().filter(|e| e["event"] == "block").count() >= 2);
}
