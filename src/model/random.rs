//! Seeded random weights of a named real shape, built directly on the target device, for
//! benchmarks (`unmask bench --random-init sdar-1.7b`). They go through the same
//! [`Model::load`](super::Model::load) as a checkpoint, so the forward pass measured is the one
//! that decodes real models. [`RandomWeights::new`] stores them as bf16, as SDAR's checkpoints
//! are, so that the CPU keeps them bf16 (linear.rs's panels) exactly as it does a checkpoint's.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::ModelConfig;
use super::weights::WeightSource;

/// A named real shape of `--random-init`: the sizes of its `config.json`.
#[derive(Debug, PartialEq, Eq)]
pub struct Shape {
    pub name: &'static str,
    pub dims: Dims,
    /// The mixture-of-experts sizes of an SDAR-MoE or LLaDA2 shape; `None`: a dense SDAR.
    pub moe: Option<MoeDims>,
    /// The family its config names.
    pub kind: Kind,
}

/// The family of a shape, and the sizes only that family has.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind {
    /// SDAR (`sdar`), or SDAR-MoE (`sdar_moe`) with MoE sizes.
    Sdar,
    /// LLaDA2 (`llada2_moe`): the router's groups and the groups it keeps, the shared experts,
    /// the dense layers first (`first_k_dense_replace`).
    Llada2 { groups: usize, keep: usize, shared: usize, dense_first: usize },
}

/// The sizes every shape has.
#[derive(Debug, PartialEq, Eq)]
pub struct Dims {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub tied: bool,
    pub mask: u32,
}

/// The sizes of an MoE shape: experts, experts a row, expert intermediate size.
#[derive(Debug, PartialEq, Eq)]
pub struct MoeDims {
    pub experts: usize,
    pub per_token: usize,
    pub intermediate: usize,
}

const fn dims(
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    intermediate: usize,
    tied: bool,
) -> Dims {
    // SDAR's are their Qwen3 bases: head_dim 128, vocab 151936, `<|MASK|>` at 151669
    Dims {
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim: 128,
        intermediate,
        vocab: 151936,
        tied,
        mask: 151669,
    }
}

/// The shapes `--random-init` knows, the one place that names them. SDAR's are their Qwen3
/// bases (head_dim 128, vocab 151936, rope_theta 1e6, no biases); LLaDA2's its released
/// config's.
pub const SHAPES: [Shape; 8] = [
    // the test fixture's shape (tests/fixtures/tiny-random)
    Shape {
        name: "tiny",
        dims: Dims {
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            intermediate: 160,
            vocab: 354,
            tied: false,
            mask: 353,
        },
        moe: None,
        kind: Kind::Sdar,
    },
    Shape {
        name: "qwen3-0.6b",
        dims: dims(1024, 28, 16, 8, 3072, true),
        moe: None,
        kind: Kind::Sdar,
    },
    // untied lm_head, as in docs/perf.md's PyTorch anchor (4.06 GB of bf16 weights)
    Shape {
        name: "sdar-1.7b",
        dims: dims(2048, 28, 16, 8, 6144, false),
        moe: None,
        kind: Kind::Sdar,
    },
    Shape {
        name: "sdar-4b",
        dims: dims(2560, 36, 32, 8, 9728, false),
        moe: None,
        kind: Kind::Sdar,
    },
    Shape {
        name: "sdar-8b",
        dims: dims(4096, 36, 32, 8, 12288, false),
        moe: None,
        kind: Kind::Sdar,
    },
    // a small MoE of the same head geometry, for quick GPU runs
    Shape {
        name: "moe-small",
        dims: dims(1024, 8, 16, 4, 3072, false),
        moe: Some(MoeDims { experts: 64, per_token: 8, intermediate: 512 }),
        kind: Kind::Sdar,
    },
    // SDAR-30B-A3B (sdar_moe): 48 sparse layers of 128 experts, 8 a row, 32/4 heads
    Shape {
        name: "sdar-30b-a3b",
        dims: dims(2048, 48, 32, 4, 6144, false),
        moe: Some(MoeDims { experts: 128, per_token: 8, intermediate: 768 }),
        kind: Kind::Sdar,
    },
    // LLaDA2.0/2.1-mini (llada2_moe, 16B): 20 layers, the first dense (5120), then 256 experts
    // of 512 in 8 groups (4 kept), 8 a row, one shared expert; 16/4 heads of 128, half of each
    // rotated; vocab 157184 with `<|mask|>` at 156895
    Shape {
        name: "llada2-mini",
        dims: Dims {
            hidden: 2048,
            layers: 20,
            heads: 16,
            kv_heads: 4,
            head_dim: 128,
            intermediate: 5120,
            vocab: 157184,
            tied: false,
            mask: 156895,
        },
        moe: Some(MoeDims { experts: 256, per_token: 8, intermediate: 512 }),
        kind: Kind::Llada2 { groups: 8, keep: 4, shared: 1, dense_first: 1 },
    },
];

/// The names of [`SHAPES`], in order.
pub fn shape_names() -> impl Iterator<Item = &'static str> + Clone {
    SHAPES.iter().map(|s| s.name)
}

/// The shape named `name`.
pub fn shape(name: &str) -> Result<&'static Shape> {
    match SHAPES.iter().find(|s| s.name == name) {
        Some(s) => Ok(s),
        None => bail!(
            "--random-init {name}: unknown shape; known: {}",
            shape_names().collect::<Vec<_>>().join(", ")
        ),
    }
}

/// `--random-init SHAPE` as clap reads it: one of [`SHAPES`] (a value that is not is refused
/// with their list).
pub fn shape_parser() -> impl clap::builder::TypedValueParser<Value = &'static Shape> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(shape_names())
        .map(|name| shape(&name).expect("one of the possible values"))
}

/// `config.json` of a named shape.
pub fn shape_config(name: &str) -> Result<ModelConfig> {
    shape(name)?.config()
}

impl Shape {
    /// Its `config.json`, parsed and checked as a checkpoint's is.
    pub fn config(&self) -> Result<ModelConfig> {
        crate::model::registry::parse_config(
            &self.json().to_string(),
            &format!("--random-init {}", self.name),
        )
    }

    /// Its `config.json`, as JSON.
    pub fn json(&self) -> serde_json::Value {
        if let (Kind::Llada2 { groups, keep, shared, dense_first }, Some(m)) =
            (&self.kind, &self.moe)
        {
            return llada2_json(&self.dims, m, (*groups, *keep, *shared, *dense_first));
        }
        let d = &self.dims;
        let mut json = serde_json::json!({
            "model_type": "sdar",
            "vocab_size": d.vocab,
            "hidden_size": d.hidden,
            "intermediate_size": d.intermediate,
            "num_hidden_layers": d.layers,
            "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads,
            "head_dim": d.head_dim,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000.0,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": d.tied,
            "block_size": 4,
            "mask_token_id": d.mask,
        });
        if let (Some(m), Some(o)) = (&self.moe, json.as_object_mut()) {
            let extra = serde_json::json!({
                "model_type": "sdar_moe",
                "num_experts": m.experts,
                "num_experts_per_tok": m.per_token,
                "moe_intermediate_size": m.intermediate,
                "norm_topk_prob": true,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            });
            o.extend(extra.as_object().cloned().unwrap_or_default());
        }
        json
    }
}

/// LLaDA2's `config.json` of these sizes (the released config's fields, `rope_theta` 600000,
/// half of each head rotated); no `block_size`, as released: a benchmark decodes in the
/// family's blocks of 32 (a flag sets any other).
fn llada2_json(
    d: &Dims,
    m: &MoeDims,
    (groups, keep, shared, dense_first): (usize, usize, usize, usize),
) -> serde_json::Value {
    serde_json::json!({
        "model_type": "llada2_moe",
        "architectures": ["LLaDA2MoeModelLM"],
        "vocab_size": d.vocab,
        "hidden_size": d.hidden,
        "intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": 600000.0,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": d.tied,
        "mask_token_id": d.mask,
        "num_experts": m.experts,
        "num_experts_per_tok": m.per_token,
        "moe_intermediate_size": m.intermediate,
        "n_group": groups,
        "topk_group": keep,
        "num_shared_experts": shared,
        "first_k_dense_replace": dense_first,
        "routed_scaling_factor": 2.5,
        "score_function": "sigmoid",
        "moe_router_enable_expert_bias": true,
        "use_qkv_bias": false,
        "use_bias": false,
        "use_qk_norm": true,
    })
}

/// A random LLaDA2 of three layers, the first dense, heads of 128 (what the streamed layer's
/// kernels take): `(hidden, heads, kv heads, vocab, dense intermediate)` and `(experts, experts
/// a row, expert intermediate)`, the experts in `groups` groups of which `keep` are kept, one
/// shared expert. For tests of the LLaDA2 paths (moe_grouped.rs, check-device).
pub fn three_layer_llada2(
    (h, qh, kvh, v, i): (usize, usize, usize, usize, usize),
    (experts, k, moe_i): (usize, usize, usize),
    (groups, keep): (usize, usize),
) -> ModelConfig {
    let dims = Dims {
        hidden: h,
        layers: 3,
        heads: qh,
        kv_heads: kvh,
        head_dim: 128,
        intermediate: i,
        vocab: v,
        tied: false,
        mask: v as u32 - 1,
    };
    let mut json = llada2_json(
        &dims,
        &MoeDims { experts, per_token: k, intermediate: moe_i },
        (groups, keep, 1, 1),
    );
    json["max_position_embeddings"] = 4096.into();
    crate::model::registry::parse_config(&json.to_string(), "a three-layer LLaDA2")
        .expect("a valid config")
}

/// A random SDAR-MoE of three layers, the middle one dense (`mlp_only_layers`), heads of 128
/// (what the streamed layer's kernels take): `(hidden, heads, kv heads, vocab, dense
/// intermediate)` and `(experts, experts a row, expert intermediate)`. For tests of the MoE
/// paths (moe_grouped.rs, check-device, tests/moe_routing.rs).
pub fn three_layer_moe(
    (h, qh, kvh, v, i): (usize, usize, usize, usize, usize),
    (experts, k, moe_i): (usize, usize, usize),
) -> ModelConfig {
    let json = serde_json::json!({
        "model_type": "sdar_moe", "vocab_size": v, "hidden_size": h, "intermediate_size": i,
        "num_hidden_layers": 3, "num_attention_heads": qh, "num_key_value_heads": kvh, "head_dim": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": false, "num_experts": experts, "num_experts_per_tok": k,
        "moe_intermediate_size": moe_i, "norm_topk_prob": true, "mlp_only_layers": [1],
    });
    crate::model::registry::parse_config(&json.to_string(), "a three-layer MoE")
        .expect("a valid config")
}

/// Every weight of `cfg` in the order [`Model::load`](super::Model::load) reads them (so a
/// [`RandomWeights`] source draws them in this order), with their shapes.
pub fn tensor_order(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, d, i) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
    let (q, kv) = (cfg.num_attention_heads * d, cfg.kv_heads() * d);
    let mut out = Vec::new();
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        for (n, shape) in [
            ("input_layernorm", vec![h]),
            ("self_attn.q_proj", vec![q, h]),
            ("self_attn.k_proj", vec![kv, h]),
            ("self_attn.v_proj", vec![kv, h]),
            ("self_attn.o_proj", vec![h, q]),
            ("self_attn.q_norm", vec![d]),
            ("self_attn.k_norm", vec![d]),
            ("post_attention_layernorm", vec![h]),
            ("mlp.gate_proj", vec![i, h]),
            ("mlp.up_proj", vec![i, h]),
            ("mlp.down_proj", vec![h, i]),
        ] {
            out.push((format!("{p}.{n}.weight"), shape));
        }
    }
    out.push(("model.embed_tokens.weight".into(), vec![cfg.vocab_size, h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".into(), vec![cfg.vocab_size, h]));
    }
    out.push(("model.norm.weight".into(), vec![h]));
    out
}

/// Writes the random bf16 weights of shape `name` drawn from `seed` as a checkpoint folder
/// (`config.json`, one `model.safetensors` with the real tensor names, a tokenizer), so that
/// a CPU benchmark can load a real bf16 checkpoint without a download. The weights equal
/// `--random-init name` with the same seed. The safetensors file is written tensor by tensor
/// (at most one tensor in memory); returns its size in bytes.
pub fn write_checkpoint(name: &str, seed: u64, dir: &std::path::Path) -> Result<u64> {
    use anyhow::Context;
    use std::io::Write;
    let named = shape(name)?;
    if named.moe.is_some() {
        bail!("{name}: checkpoints are written for the dense shapes only; a MoE shape runs with --random-init");
    }
    let mut json = named.json();
    json["torch_dtype"] = "bfloat16".into();
    json["architectures"] = serde_json::json!(["SDARForCausalLM"]);
    let cfg = named.config()?;
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let file = |f: &str| dir.join(f);
    let write = |f: &str, bytes: &[u8]| {
        std::fs::write(file(f), bytes)
            .with_context(|| format!("{}: cannot write", file(f).display()))
    };
    write("config.json", serde_json::to_string_pretty(&json)?.as_bytes())?;
    // The tiny shape's vocabulary is the test fixture's; every other is Qwen3's (151669 ids,
    // `<|MASK|>` added at 151669 on load).
    if name == "tiny" {
        write("tokenizer.json", include_bytes!("../../tests/fixtures/tiny-random/tokenizer.json"))?;
    } else {
        write(
            "tokenizer.json.gz",
            include_bytes!("../../tests/fixtures/qwen3-tokenizer/tokenizer.json.gz"),
        )?;
    }
    // safetensors: an 8-byte header length, the JSON header (padded to 8 bytes), the data
    let order = tensor_order(&cfg);
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut at = 0usize;
    for (n, shape) in &order {
        let len = shape.iter().product::<usize>() * 2;
        header.insert(
            n.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [at, at + len]}),
        );
        at += len;
    }
    let mut head = serde_json::to_string(&header)?.into_bytes();
    head.resize(head.len().div_ceil(8) * 8, b' ');
    let path = file("model.safetensors");
    let f = std::fs::File::create(&path)
        .with_context(|| format!("{}: cannot create", path.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 22, f);
    let cpu = Device::Cpu;
    let w = RandomWeights::new(&cfg, seed, &cpu)?;
    let mut put = |bytes: &[u8]| {
        out.write_all(bytes).with_context(|| format!("{}: cannot write", path.display()))
    };
    put(&(head.len() as u64).to_le_bytes())?;
    put(&head)?;
    for (n, shape) in &order {
        let t = w.get(n, shape, DType::BF16, &cpu)?.flatten_all()?.to_vec1::<half::bf16>()?;
        let bytes: Vec<u8> = t.iter().flat_map(|b| b.to_bits().to_le_bytes()).collect();
        put(&bytes)?;
    }
    out.flush().with_context(|| format!("{}: cannot write", path.display()))?;
    Ok((8 + head.len() + at) as u64)
}

/// Norm weights are 1, every other tensor is drawn with standard deviation `std` (a normal on
/// CUDA through curand, a uniform of the same spread on the CPU).
pub struct RandomWeights {
    pub tied: bool,
    pub std: f32,
    /// Draw on the host (ChaCha8) whatever the target device, so that every device gets the
    /// same weights (for CPU/GPU comparisons); otherwise CUDA draws with curand.
    pub host: bool,
    /// The dtype the weights are "stored" in, as a checkpoint's are: every value drawn is
    /// rounded to it, and [`WeightSource::stored`] reports it. `None`: the compute dtype.
    pub stored: Option<DType>,
    rng: std::cell::RefCell<ChaCha8Rng>,
}

impl RandomWeights {
    /// Seeds the device's generator too (CUDA); the CPU draws from a ChaCha8 stream.
    pub fn new(cfg: &ModelConfig, seed: u64, device: &Device) -> Result<Self> {
        if !device.is_cpu() {
            device.set_seed(seed)?;
        }
        let rng = ChaCha8Rng::seed_from_u64(seed).into();
        Ok(RandomWeights {
            tied: cfg.tie_word_embeddings,
            std: 0.02,
            host: false,
            stored: Some(DType::BF16),
            rng,
        })
    }

    /// The stored dtype's name, as a checkpoint's header gives it (`bf16`).
    pub fn stored_dtype(&self, compute: DType) -> String {
        format!("{:?}", self.stored.unwrap_or(compute)).to_lowercase()
    }

    /// Weights drawn on the host from `seed` alone: the same tensors on every device.
    pub fn on_host(cfg: &ModelConfig, seed: u64) -> Self {
        RandomWeights {
            tied: cfg.tie_word_embeddings,
            std: 0.02,
            host: true,
            stored: None,
            rng: ChaCha8Rng::seed_from_u64(seed).into(),
        }
    }
}

impl WeightSource for RandomWeights {
    fn get(&self, name: &str, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        if name.ends_with("norm.weight") {
            return Ok(Tensor::ones(shape, dtype, device)?);
        }
        let t = if device.is_cpu() || self.host {
            let n: usize = shape.iter().product();
            let a = self.std * 12f32.sqrt();
            let mut rng = self.rng.borrow_mut();
            let v: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() - 0.5) * a).collect();
            Tensor::from_vec(v, shape, &Device::Cpu)?.to_device(device)?
        } else {
            Tensor::randn(0f32, self.std, shape, device)?
        };
        let t = match self.stored {
            Some(s) => t.to_dtype(s)?,
            None => t,
        };
        Ok(t.to_dtype(dtype)?)
    }

    /// Every weight of the shape, but biases (no family here computes one; LLaDA2 refuses one
    /// its config does not ask for) and a tied lm_head.
    fn contains(&self, name: &str) -> bool {
        !name.ends_with(".bias") && (name != "lm_head.weight" || !self.tied)
    }

    fn stored(&self, _name: &str) -> Option<DType> {
        self.stored
    }
}

/// A small config with real-model head geometry, for checks (`heads`/`kv_heads` x `head_dim`).
pub fn check_config(
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
) -> Result<ModelConfig> {
    let json = serde_json::json!({
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": false,
    });
    crate::model::registry::parse_config(&json.to_string(), "check config")
}

/// What the layer tests (here, and moe_grouped.rs's) run on two forms of a model and compare.
#[cfg(test)]
pub(crate) mod passes {
    use candle_core::{Device, Tensor};

    use crate::model::LayerRoutes;
    use crate::model::{Model, PassInput};

    /// The logits of four passes over a 24-slot cache, on the CPU: a 10-row prefill (storing
    /// nothing), a pass committing 8 rows, a cached denoise of 4 rows (with its routes), and
    /// the same denoise as the fixed-window pass (mask, keys = capacity).
    pub fn four(m: &Model) -> (Vec<Vec<f32>>, Vec<LayerRoutes>) {
        let dev = Device::Cpu;
        let mut cache = m.new_cache(24).unwrap();
        let pre = m
            .logits(&m.forward(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &mut cache, 4, 0).unwrap())
            .unwrap();
        let commit =
            m.logits(&m.forward(&[1, 2, 3, 4, 5, 6, 7, 8], &mut cache, 4, 8).unwrap()).unwrap();
        let (h, routes) = m.forward_routed(&[9, 10, 11, 12], &mut cache, 4, 0).unwrap();
        let den = m.logits(&h).unwrap();
        let (pos, mask) = PassInput::window(8, 4, 4, 24);
        let input = PassInput {
            ids: Tensor::new(&[9u32, 10, 11, 12], &dev).unwrap(),
            positions: Tensor::from_vec(pos, 4, &dev).unwrap(),
            keys: 24,
            mask: Some(Tensor::from_vec(mask, (4, 24), &dev).unwrap().to_dtype(m.dtype()).unwrap()),
        };
        let win = m.logits(&m.forward_input(&input, &cache).unwrap()).unwrap();
        (
            [pre, commit, den, win]
                .iter()
                .map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
                .collect(),
            routes,
        )
    }

    /// ‖a − b‖ / ‖b‖.
    pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
        let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        let den: f32 = b.iter().map(|y| y * y).sum();
        (num / den).sqrt()
    }

    /// ‖a − b‖: the denoise against the window pass, which see the same keys.
    pub fn distance(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>().sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_shapes_parse_and_have_the_documented_sizes() {
        for s in &SHAPES {
            let c = s.config().unwrap();
            // a shape with MoE sizes is an SDAR-MoE of them, every other is dense
            let moe = s.moe.as_ref().map(|m| (m.experts, m.per_token, m.intermediate));
            let got = c.moe_info().map(|_| {
                (
                    c.moe.num_experts.unwrap(),
                    c.moe.num_experts_per_tok.unwrap(),
                    c.moe.moe_intermediate_size.unwrap(),
                )
            });
            assert_eq!(got, moe, "{}", s.name);
            let want = match (&s.kind, moe.is_some()) {
                (Kind::Llada2 { .. }, _) => "llada2_moe",
                (Kind::Sdar, true) => "sdar_moe",
                (Kind::Sdar, false) => "sdar",
            };
            assert_eq!(c.model_type, want, "{}", s.name);
            assert_eq!(shape(s.name).unwrap(), s, "one shape per name");
        }
        let c = shape_config("sdar-30b-a3b").unwrap();
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.moe_info().unwrap().sparse_layers.len()),
            (2048, 48, 48)
        );
        // LLaDA2-mini: 16.26B parameters, layer 0 dense, 19 sparse layers of 256 + 1 experts
        let c = shape_config("llada2-mini").unwrap();
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.moe_info().unwrap().sparse_layers.len()),
            (2048, 20, 19)
        );
        assert_eq!(c.num_params(), 16_255_638_528);
        assert_eq!((c.head_dim(), c.partial_rotary_factor, c.vocab_size), (128, Some(0.5), 157184));
        let c = shape_config("sdar-1.7b").unwrap();
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size),
            (2048, 28, 6144, 151936)
        );
        assert_eq!((c.num_attention_heads, c.kv_heads(), c.head_dim()), (16, 8, 128));
        let c = shape_config("sdar-4b").unwrap();
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size),
            (2560, 36, 32, 9728)
        );
        assert!(!c.tie_word_embeddings);
        let c = shape_config("sdar-8b").unwrap();
        assert_eq!((c.hidden_size, c.intermediate_size), (4096, 12288));
        assert_eq!(
            shape_config("sdar-3b").unwrap_err().to_string(),
            "--random-init sdar-3b: unknown shape; known: tiny, qwen3-0.6b, sdar-1.7b, sdar-4b, sdar-8b, moe-small, sdar-30b-a3b, llada2-mini"
        );
    }

    #[test]
    fn random_model_runs_through_the_same_forward() {
        let cfg = shape_config("tiny").unwrap();
        let w = RandomWeights::new(&cfg, 7, &Device::Cpu).unwrap();
        let m = super::super::Model::load(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
        let mut cache = m.new_cache(16).unwrap();
        let h = m.forward(&[1, 2, 3, 4, 5, 6], &mut cache, 4, 6).unwrap();
        let lg = m.logits(&h).unwrap();
        assert_eq!(lg.dims(), &[6, 354]);
        assert!(lg.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite()));
        // the same seed gives the same weights
        let w2 = RandomWeights::new(&cfg, 7, &Device::Cpu).unwrap();
        let m2 = super::super::Model::load(&cfg, &w2, DType::F32, &Device::Cpu).unwrap();
        let mut c2 = m2.new_cache(16).unwrap();
        let h2 = m2.forward(&[1, 2, 3, 4, 5, 6], &mut c2, 4, 6).unwrap();
        assert_eq!(h.to_vec2::<f32>().unwrap(), h2.to_vec2::<f32>().unwrap());
    }

    /// The checkpoint written for a shape loads as a bf16 checkpoint and holds exactly the
    /// weights `--random-init` draws from the same seed: the same logits.
    #[test]
    fn a_written_checkpoint_equals_the_random_init_weights() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = write_checkpoint("tiny", 11, dir.path()).unwrap();
        assert_eq!(bytes, std::fs::metadata(dir.path().join("model.safetensors")).unwrap().len());
        let src = crate::model::Source::Dir(dir.path().to_path_buf());
        let ck = crate::model::Checkpoint::load(&src, &Device::Cpu, DType::F32).unwrap();
        assert_eq!(ck.info.dtype, "bf16");
        let cfg = shape_config("tiny").unwrap();
        let rand = super::super::Model::load(
            &cfg,
            &RandomWeights::new(&cfg, 11, &Device::Cpu).unwrap(),
            DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        let logits = |m: &super::super::Model| {
            let mut cache = m.new_cache(16).unwrap();
            m.logits(&m.forward(&[1, 2, 3, 4, 5, 6], &mut cache, 4, 6).unwrap())
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
        };
        assert_eq!(logits(&ck.model), logits(&rand));
        assert_eq!(ck.model.weight_bytes(), rand.weight_bytes());
    }

    /// Random weights of a named shape load as a bf16 checkpoint does on the CPU: projections
    /// in bf16 panels (2 bytes a weight) under f32 compute, every value a bf16 one.
    #[test]
    fn random_weights_are_stored_bf16_and_take_the_checkpoint_path() {
        let cfg = shape_config("tiny").unwrap();
        let w = RandomWeights::new(&cfg, 7, &Device::Cpu).unwrap();
        assert_eq!(w.stored("model.layers.0.mlp.down_proj.weight"), Some(DType::BF16));
        assert_eq!(w.stored_dtype(DType::F32), "bf16");
        let t = w.get("model.embed_tokens.weight", &[354, 64], DType::F32, &Device::Cpu).unwrap();
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(v.iter().all(|&x| half::bf16::from_f32(x).to_f32() == x), "values are bf16 ones");
        let m = super::super::Model::load(
            &cfg,
            &RandomWeights::new(&cfg, 7, &Device::Cpu).unwrap(),
            DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        let f32_model = super::super::Model::load(
            &cfg,
            &RandomWeights::on_host(&cfg, 7),
            DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        // the embedding bf16 as stored against f32; each layer's 43008 projection weights 2
        // bytes (panels) against 4; lm_head's 354 rows 4 bytes against 2 in 23 panels of 16
        let embed = 354 * 64 * (4 - 2);
        let layers = 2 * 43008 * (4 - 2);
        let head = 354 * 64 * 4 - 23 * 16 * 64 * 2;
        assert_eq!(f32_model.weight_bytes() - m.weight_bytes(), embed + layers + head);
    }

    /// The fused ops (their CPU implementations, the kernels' algorithm) against the generic
    /// chains of candle ops, through the whole model: prefill (mask), cached denoise (no mask),
    /// and the fixed-window pass (mask, keys = capacity), with GQA groups of 2 and 4.
    #[test]
    fn fused_ops_match_the_generic_chains() {
        for (cfg, dt, tol) in [
            (shape_config("tiny").unwrap(), DType::F32, 1e-5),
            (check_config(256, 2, 8, 2, 64, 512, 1000).unwrap(), DType::F32, 1e-5),
            (check_config(256, 2, 8, 2, 64, 512, 1000).unwrap(), DType::BF16, 2e-2),
        ] {
            let w = RandomWeights::on_host(&cfg, 3);
            let mut m = super::super::Model::load(&cfg, &w, dt, &Device::Cpu).unwrap();
            m.set_fused(true);
            let (fused, _) = passes::four(&m);
            m.set_fused(false);
            let (generic, _) = passes::four(&m);
            for (k, (a, b)) in fused.iter().zip(&generic).enumerate() {
                let e = passes::rel_err(a, b);
                assert!(
                    e < tol,
                    "{dt:?} heads {}/{} pass {k}: rel err {e}",
                    cfg.num_attention_heads,
                    cfg.kv_heads()
                );
            }
            // and the denoise pass equals the fixed-window pass (same queries, same keys)
            assert!(passes::distance(&fused[2], &fused[3]) < 1e-3, "window vs exact keys");
        }
    }

    /// Past the CUDA kernel's longest cache (6k keys), the CPU still runs its own attention
    /// kernel (ops::attention_takes), and it still equals the generic chain: a 6.5k-position
    /// prefix committed in chunks, then a cached denoise of 4 rows over it.
    #[test]
    fn past_the_cuda_limit_the_cpu_attention_matches_the_generic_chain() {
        let mut cfg = check_config(64, 1, 4, 2, 32, 64, 300).unwrap();
        cfg.max_position_embeddings = 8192;
        let keys = crate::model::ops::ATTENTION_MAX_KEYS_PLUS_D + 400;
        let mut m = super::super::Model::load(
            &cfg,
            &RandomWeights::on_host(&cfg, 9),
            DType::F32,
            &Device::Cpu,
        )
        .unwrap();
        let ids: Vec<u32> = (0..keys as u32).map(|i| i * 7 % 300).collect();
        let mut denoise = |fused: bool| {
            m.set_fused(fused);
            let mut cache = m.new_cache(keys + 4).unwrap();
            for chunk in ids.chunks(512) {
                m.forward(chunk, &mut cache, 4, chunk.len()).unwrap();
            }
            m.logits(&m.forward(&[1, 2, 3, 4], &mut cache, 4, 0).unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        let (fused, generic) = (denoise(true), denoise(false));
        let e = passes::rel_err(&fused, &generic);
        assert!(e < 1e-5, "rel err {e}");
    }

    /// The GPU's streamed layer (six kernels a layer writing into a workspace, projections
    /// `[out, in]` with the norms and residual adds folded into them), run here through the
    /// CPU bodies of the same ops, against the standard fused layer: prefill (standard in
    /// both: too many rows), the committing pass, a cached denoise and the fixed-window pass.
    #[test]
    fn the_streamed_layer_matches_the_standard_one() {
        for cfg in [
            check_config(256, 2, 8, 2, 64, 512, 1000).unwrap(),
            check_config(256, 2, 4, 2, 128, 768, 1000).unwrap(),
        ] {
            let dev = Device::Cpu;
            // each model from its own source of the same seed: a source draws as it is read
            let load = || {
                super::super::Model::load(&cfg, &RandomWeights::on_host(&cfg, 5), DType::BF16, &dev)
                    .unwrap()
            };
            let (standard, mut streamed) = (load(), load());
            streamed.use_row_weights().unwrap();
            assert!(
                streamed.packed() && !standard.packed(),
                "the streamed layer reads packed weights, as on the GPU"
            );
            assert!(!standard.streams(4, 24));
            assert!(streamed.streams(4, 24) && streamed.streams(8, 24));
            assert!(
                !streamed.streams(10, 24),
                "a prefill of more than 8 rows takes the standard layer"
            );
            let ((a, _), (b, _)) = (passes::four(&streamed), passes::four(&standard));
            for (k, (x, y)) in a.iter().zip(&b).enumerate() {
                let e = passes::rel_err(x, y);
                // bf16 roundings at the same points, sums in another order
                assert!(e < 2e-2, "d {} pass {k}: rel err {e}", cfg.head_dim());
                if k == 0 {
                    assert_eq!(x, y, "the prefill runs the same standard layer in both");
                }
            }
            // the cached denoise and the window pass see the K/V the streamed commit wrote
            assert!(passes::distance(&a[2], &a[3]) < 1e-3, "window vs exact keys");
        }
    }
}
