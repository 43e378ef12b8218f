//! Seeded random weights of a named real shape, built directly on the target device, for
//! benchmarks (`unmask bench --random-init sdar-1.7b`). They go through the same
//! [`Qwen3::load`](super::Qwen3::load) as a checkpoint, so the forward pass measured is the one
//! that decodes real models.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::ModelConfig;
use super::weights::WeightSource;

/// The shapes `--random-init` knows. SDAR's are their Qwen3 bases (head_dim 128, vocab
/// 151936, rope_theta 1e6, no biases).
pub const SHAPES: [&str; 5] = ["tiny", "qwen3-0.6b", "sdar-1.7b", "sdar-4b", "sdar-8b"];

/// `config.json` of a named shape.
pub fn shape_config(name: &str) -> Result<ModelConfig> {
    // (hidden, layers, heads, kv heads, head_dim, intermediate, vocab, tied, mask id)
    let (h, l, qh, kvh, d, i, v, tied, mask) = match name {
        // the test fixture's shape (tests/fixtures/tiny-random)
        "tiny" => (64, 2, 4, 2, 16, 160, 354, false, 353),
        "qwen3-0.6b" => (1024, 28, 16, 8, 128, 3072, 151936, true, 151669),
        // untied lm_head, as in docs/perf.md's PyTorch anchor (4.06 GB of bf16 weights)
        "sdar-1.7b" => (2048, 28, 16, 8, 128, 6144, 151936, false, 151669),
        "sdar-4b" => (2560, 36, 32, 8, 128, 9728, 151936, false, 151669),
        "sdar-8b" => (4096, 36, 32, 8, 128, 12288, 151936, false, 151669),
        other => bail!("--random-init {other}: unknown shape; known: {}", SHAPES.join(", ")),
    };
    let json = serde_json::json!({
        "model_type": "sdar",
        "vocab_size": v,
        "hidden_size": h,
        "intermediate_size": i,
        "num_hidden_layers": l,
        "num_attention_heads": qh,
        "num_key_value_heads": kvh,
        "head_dim": d,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": tied,
        "block_size": 4,
        "mask_token_id": mask,
    });
    ModelConfig::parse(&json.to_string(), &format!("--random-init {name}"))
}

/// Norm weights are 1, every other tensor is drawn with standard deviation `std` (a normal on
/// CUDA through curand, a uniform of the same spread on the CPU).
pub struct RandomWeights {
    pub tied: bool,
    pub std: f32,
    rng: std::cell::RefCell<ChaCha8Rng>,
}

impl RandomWeights {
    /// Seeds the device's generator too (CUDA); the CPU draws from a ChaCha8 stream.
    pub fn new(cfg: &ModelConfig, seed: u64, device: &Device) -> Result<Self> {
        if !device.is_cpu() {
            device.set_seed(seed)?;
        }
        Ok(RandomWeights { tied: cfg.tie_word_embeddings, std: 0.02, rng: ChaCha8Rng::seed_from_u64(seed).into() })
    }
}

impl WeightSource for RandomWeights {
    fn get(&self, name: &str, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        if name.ends_with("norm.weight") {
            return Ok(Tensor::ones(shape, dtype, device)?);
        }
        let t = if device.is_cpu() {
            let n: usize = shape.iter().product();
            let a = self.std * 12f32.sqrt();
            let mut rng = self.rng.borrow_mut();
            let v: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() - 0.5) * a).collect();
            Tensor::from_vec(v, shape, device)?
        } else {
            Tensor::randn(0f32, self.std, shape, device)?
        };
        Ok(t.to_dtype(dtype)?)
    }

    fn contains(&self, name: &str) -> bool {
        name != "lm_head.weight" || !self.tied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_shapes_parse_and_have_the_documented_sizes() {
        for s in SHAPES {
            shape_config(s).unwrap();
        }
        let c = shape_config("sdar-1.7b").unwrap();
        assert_eq!((c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size), (2048, 28, 6144, 151936));
        assert_eq!((c.num_attention_heads, c.kv_heads(), c.head_dim()), (16, 8, 128));
        let c = shape_config("sdar-4b").unwrap();
        assert_eq!((c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size), (2560, 36, 32, 9728));
        assert!(!c.tie_word_embeddings);
        let c = shape_config("sdar-8b").unwrap();
        assert_eq!((c.hidden_size, c.intermediate_size), (4096, 12288));
        assert!(shape_config("sdar-3b").unwrap_err().to_string().contains("known: tiny"));
    }

    #[test]
    fn random_model_runs_through_the_same_forward() {
        let cfg = shape_config("tiny").unwrap();
        let w = RandomWeights::new(&cfg, 7, &Device::Cpu).unwrap();
        let m = super::super::Qwen3::load(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
        let mut cache = m.new_cache(16).unwrap();
        let h = m.forward(&[1, 2, 3, 4, 5, 6], &mut cache, 4, true).unwrap();
        let lg = m.logits(&h).unwrap();
        assert_eq!(lg.dims(), &[6, 354]);
        assert!(lg.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite()));
        // the same seed gives the same weights
        let w2 = RandomWeights::new(&cfg, 7, &Device::Cpu).unwrap();
        let m2 = super::super::Qwen3::load(&cfg, &w2, DType::F32, &Device::Cpu).unwrap();
        let mut c2 = m2.new_cache(16).unwrap();
        let h2 = m2.forward(&[1, 2, 3, 4, 5, 6], &mut c2, 4, true).unwrap();
        assert_eq!(h.to_vec2::<f32>().unwrap(), h2.to_vec2::<f32>().unwrap());
    }
}
