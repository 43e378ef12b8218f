//! The host memory a model will take, counted from its config before anything is allocated:
//! its weights in the layout this device's path keeps them, the most that loading them holds
//! at once beyond that, its KV cache and a pass's workspace. [`HostNeed::check`] compares the
//! sum with what the host can give ([`crate::limits::fits_in_memory`]), so that a shape that
//! does not fit is refused with one line instead of aborting on a failed allocation after
//! minutes of work. Device memory is not counted: on a GPU only the host's copies on the way
//! there are.

use anyhow::Result;
use candle_core::{DType, Device};

use super::paths::bf16_weights_here;
use super::{Compute, KvCache, ModelConfig, Products};

/// Where the weights come from, which decides what loading them copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A checkpoint's tensors stored as `DType` (mapped files: they count against the
    /// address space, not against the memory available).
    Checkpoint(DType),
    /// [`super::random::RandomWeights`]: drawn in f32 on the host, rounded to bf16.
    Random,
}

/// Bytes the host will need, by part, for the message.
#[derive(Clone, Debug, Default)]
pub struct HostNeed {
    parts: Vec<(&'static str, usize)>,
}

/// Bytes of one value of `dtype`.
fn elem(dtype: DType) -> usize {
    dtype.size_in_bytes()
}

impl HostNeed {
    pub fn new() -> Self {
        Self::default()
    }

    /// The weights of `cfg` from `origin`, as [`super::Model::load`] keeps them for `compute` on
    /// `device`, and the most its loading holds at once beyond them (one tensor's copies).
    pub fn weights(
        mut self,
        cfg: &ModelConfig,
        origin: Origin,
        compute: Compute,
        device: &Device,
    ) -> Self {
        let c = elem(compute.dtype);
        let stored = match origin {
            Origin::Checkpoint(dt) => dt,
            Origin::Random => DType::BF16,
        };
        // loader.rs: projections and the embedding stay bf16 (panels) where the CPU computes in
        // f32 from bf16 weights or with bf16 products; everything else is in the compute dtype
        let panels = bf16_weights_here(device, compute.dtype, &compute.paths);
        let kept_bf16 = panels && (compute.products == Products::Bf16 || stored == DType::BF16);
        let k = if kept_bf16 { 2 } else { c };
        let (h, d, layers) = (cfg.hidden_size, cfg.head_dim(), cfg.num_hidden_layers);
        let norms = layers.saturating_mul(2 * h + 2 * d).saturating_add(h);
        // a tied lm_head is a second copy on the CPU (panels or `[in, out]` of the embedding)
        let head = if cfg.tie_word_embeddings { cfg.vocab_size.saturating_mul(h) } else { 0 };
        let matrices = cfg.num_params().saturating_sub(norms).saturating_add(head);
        // the largest tensor loaded alone (the embedding, lm_head) and the largest stacked
        // from parts (q|k|v, gate|up, an expert's gate|up)
        let (q, kv) = (cfg.num_attention_heads * d, cfg.kv_heads() * d);
        let moe_i = cfg.moe.moe_intermediate_size.unwrap_or(0);
        let single = cfg.vocab_size.saturating_mul(h);
        let stacked = (q + 2 * kv).max(2 * cfg.intermediate_size).max(2 * moe_i).saturating_mul(h);
        let s = elem(stored);
        // the copies of one tensor that loading holds besides the one it keeps, a byte an element
        let (alone, parts) = match origin {
            // packed straight from the mapped file's bytes
            Origin::Checkpoint(_) if device.is_cpu() && kept_bf16 && stored == DType::BF16 => {
                (0, 0)
            }
            // read in the stored dtype, converted, stacked (parts), laid out
            Origin::Checkpoint(_) if device.is_cpu() => {
                let read = if s == k { s } else { s + k };
                (read, read + k)
            }
            // on its way to the device: read and converted on the host
            Origin::Checkpoint(_) => {
                let read = if s == c { s } else { s + c };
                (read, read)
            }
            // drawn in f32, rounded to bf16, converted, stacked (parts)
            Origin::Random if device.is_cpu() => {
                let drawn = 4 + 2 + if k == 2 { 0 } else { k };
                (drawn, drawn + k)
            }
            // drawn on the device
            Origin::Random => (0, 0),
        };
        let loading = single.saturating_mul(alone).max(stacked.saturating_mul(parts));
        if device.is_cpu() {
            let bytes = matrices.saturating_mul(k).saturating_add(norms.saturating_mul(c));
            self.parts.push(("weights", bytes));
        }
        self.parts.push(("loading them", loading));
        self
    }

    /// A decode's KV cache of `capacity` positions and the workspace of its largest pass, of
    /// `rows` rows of which `head_rows` go through lm_head and the sampler (the host's share: on
    /// a GPU, nothing).
    pub fn decode(
        mut self,
        cfg: &ModelConfig,
        compute: Compute,
        device: &Device,
        capacity: usize,
        (rows, head_rows): (usize, usize),
    ) -> Self {
        if !device.is_cpu() {
            return self;
        }
        let c = elem(compute.dtype);
        let d = cfg.head_dim();
        let kv_cache =
            KvCache::bytes(cfg.num_hidden_layers, (cfg.kv_heads(), d), capacity, compute.dtype);
        self.parts.push(("KV cache", kv_cache.unwrap_or(usize::MAX)));
        let (h, q, kv) = (cfg.hidden_size, cfg.num_attention_heads * d, cfg.kv_heads() * d);
        let moe =
            cfg.moe.num_experts_per_tok.unwrap_or(0) * cfg.moe.moe_intermediate_size.unwrap_or(0);
        let ffn = cfg.intermediate_size.max(moe);
        // residual, norm, q|k|v, attention, gate|up, SwiGLU, down: twice over for the
        // temporaries the ops make between
        let per_row = 4 * h + (q + 2 * kv) + q + 3 * ffn;
        let mut bytes = rows.saturating_mul(per_row).saturating_mul(c).saturating_mul(2);
        // logits, probabilities and the sampler's sort, in f32
        bytes =
            bytes.saturating_add(head_rows.saturating_mul(cfg.vocab_size).saturating_mul(4 * 3));
        if !compute.paths.fused {
            // the generic chain materialises the scores and their softmax
            let scores = cfg.num_attention_heads.saturating_mul(rows).saturating_mul(capacity);
            bytes = bytes.saturating_add(scores.saturating_mul(c).saturating_mul(2));
        }
        self.parts.push(("workspace", bytes));
        self
    }

    /// The sum of the parts.
    pub fn total(&self) -> usize {
        self.parts.iter().fold(0usize, |a, (_, b)| a.saturating_add(*b))
    }

    /// Fails with one line if the host cannot give [`HostNeed::total`] now: `what` needs N GiB
    /// (its parts), more than there is; `advice` ends the line. Every part is host memory,
    /// whatever the model's device.
    pub fn check(&self, what: &str, advice: &str) -> Result<()> {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        // (a part under 0.05 GiB would read 0.0)
        let parts: Vec<String> = self
            .parts
            .iter()
            .filter(|(_, b)| gib(*b) >= 0.05)
            .map(|(n, b)| format!("{n} {:.1}", gib(*b)))
            .collect();
        let detail =
            if parts.len() > 1 { format!(" ({} GiB)", parts.join(", ")) } else { String::new() };
        let total = Some(self.total()).filter(|&t| t != usize::MAX);
        crate::limits::fits_in_memory(what, total, &detail, &Device::Cpu, advice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::random::shape_config;

    fn gib(b: usize) -> f64 {
        b as f64 / (1u64 << 30) as f64
    }

    /// sdar-8b on the CPU: bf16 panels (2 bytes a weight, lm_head untied), f32 everything
    /// else; its random weights draw the embedding (the largest tensor) in f32 first.
    #[test]
    fn sdar_8b_on_the_cpu_counts_its_bf16_panels() {
        let cfg = shape_config("sdar-8b").unwrap();
        let cpu = Device::Cpu;
        let f32c: Compute = DType::F32.into();
        let n = HostNeed::new().weights(&cfg, Origin::Random, f32c, &cpu);
        let weights = n.parts[0].1;
        assert_eq!(n.parts[0].0, "weights");
        assert!((gib(weights) - 15.26).abs() < 0.05, "{}", gib(weights));
        let ck = HostNeed::new().weights(&cfg, Origin::Checkpoint(DType::BF16), f32c, &cpu);
        assert_eq!(ck.parts[0].1, weights, "the same layout from a checkpoint");
        assert_eq!(ck.parts[1].1, 0, "packed from the mapped file");
        let f32_ck = HostNeed::new().weights(&cfg, Origin::Checkpoint(DType::F32), f32c, &cpu);
        assert!(f32_ck.parts[0].1 > 2 * weights - (1 << 30), "f32 weights stay f32");
        // a decode of 4096 positions: 36 layers x 2 x 8 heads x 128 x 4 bytes a position
        let d = HostNeed::new().decode(&cfg, f32c, &cpu, 4096, (516, 4));
        assert_eq!(d.parts[0], ("KV cache", 2 * 8 * 4096 * 128 * 37 * 4));
    }

    #[test]
    fn a_need_larger_than_any_machine_is_refused_naming_its_parts() {
        let cfg = shape_config("sdar-30b-a3b").unwrap();
        let mut n = HostNeed::new().weights(&cfg, Origin::Random, DType::F32.into(), &Device::Cpu);
        n.parts.push(("KV cache", 1 << 50));
        let e = n
            .check("--random-init sdar-30b-a3b", "lower --max-new-tokens")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--random-init sdar-30b-a3b needs 1048"), "{e}");
        assert!(
            e.contains(" GiB (weights 56.")
                && e.contains(", KV cache 1048576.0 GiB), more than the "),
            "{e}"
        );
        assert!(e.ends_with("; lower --max-new-tokens"), "{e}");
    }
}
