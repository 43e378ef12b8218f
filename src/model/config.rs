//! `config.json` of a Hugging Face checkpoint of a family unmask knows (registry.rs): the
//! fields every family shares, checked here, and each family's own, checked by its file.

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

/// Parses `text`, the file `origin`, as `T`; `what` says what the file holds in errors
/// (`invalid config`). The file must be a JSON object: serde's derive also reads a JSON array
/// as a struct, by position (`[1,2]` as the first two fields). A value that does not fit its
/// field is named by its JSON path (`field `vocab_size`: invalid value: integer -1, ...`), as
/// the trace reader names it, through serde_path_to_error.
pub(crate) fn parse_object<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
    what: &str,
) -> Result<T> {
    let value: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("{origin}: {what}"))?;
    if !value.is_object() {
        let kind = match value {
            serde_json::Value::Array(_) => "an array",
            serde_json::Value::String(_) => "a string",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::Bool(_) => "a boolean",
            _ => "null",
        };
        bail!("{origin}: not a JSON object (it is {kind})");
    }
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { format!("field `{path}`: ") };
        anyhow!("{origin}: {what}: {field}{}", e.into_inner())
    })
}

/// A token id or a list of them (`eos_token_id`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged, expecting = "expected a token id or a list of token ids")]
pub enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            OneOrMany::One(x) => vec![*x],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct ModelConfig {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub block_size: Option<usize>,
    #[serde(default)]
    pub mask_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<OneOrMany>,
    #[serde(default)]
    pub torch_dtype: Option<String>,
    #[serde(default)]
    pub attention_bias: bool,
    /// Checked, not used: unmask computes plain RoPE over every position, as SDAR's checkpoints
    /// ask (`rope_scaling` null, `use_sliding_window` false); a checkpoint that asks for more is
    /// refused rather than decoded with other numbers than its reference's.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Checked, not used: the MLP is SwiGLU, so the activation must be SiLU.
    #[serde(default)]
    pub hidden_act: Option<String>,
    /// The transformers class names; registry.rs reads them when `model_type` is not one it knows.
    #[serde(default)]
    pub architectures: Vec<String>,
    /// LLaDA2's share of each head that RoPE rotates (llada2.rs reads it; `None`: absent).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// LLaDA2's bias switches and q/k norm switch (llada2.rs checks them; `None`: absent).
    #[serde(default)]
    pub use_qkv_bias: Option<bool>,
    #[serde(default)]
    pub use_bias: Option<bool>,
    #[serde(default)]
    pub use_qk_norm: Option<bool>,
    /// The mixture-of-experts fields (qwen3_moe.rs checks them; other families ignore them).
    #[serde(flatten)]
    pub moe: MoeConfig,
}

/// config.json's MoE fields, with transformers' `Qwen3MoeConfig` defaults where it has them;
/// the fields only LLaDA2 has are `None` where absent (llada2.rs applies its config class's
/// defaults).
#[derive(Clone, Debug, Deserialize)]
pub struct MoeConfig {
    #[serde(default)]
    pub num_experts: Option<usize>,
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    /// The first layers that stay dense (LLaDA2; 0, none, where absent).
    #[serde(default)]
    pub first_k_dense_replace: usize,
    /// Shared experts a sparse layer adds to its routed ones (LLaDA2).
    #[serde(default)]
    pub num_shared_experts: Option<usize>,
    /// LLaDA2's group-limited router: groups of experts, the groups kept, the weights' scale.
    #[serde(default)]
    pub n_group: Option<usize>,
    #[serde(default)]
    pub topk_group: Option<usize>,
    #[serde(default)]
    pub routed_scaling_factor: Option<f64>,
    /// How router logits become scores (LLaDA2 spells it; `sigmoid` is the one it computes).
    #[serde(default)]
    pub score_function: Option<String>,
    /// Whether sparse layers hold `mlp.gate.expert_bias` (LLaDA2; absent: they do).
    #[serde(default)]
    pub moe_router_enable_expert_bias: Option<bool>,
}

fn one() -> usize {
    1
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    1_000_000.0
}
fn default_max_pos() -> usize {
    32768
}

impl ModelConfig {
    /// Parses `config.json` and checks the fields every family shares; `origin` names the file
    /// in errors. [`super::registry::parse_config`] adds the family's own checks: call that.
    pub(super) fn parse_shared(text: &str, origin: &str) -> Result<Self> {
        let cfg: ModelConfig = parse_object(text, origin, "invalid config").map_err(|e| {
            // serde buffers the flattened MoE fields, which loses their path: parsed alone,
            // a bad one is named (and its own line and column given).
            match parse_object::<MoeConfig>(text, origin, "invalid config") {
                Err(moe) if !e.to_string().contains(": field `") => moe,
                _ => e,
            }
        })?;
        cfg.check().with_context(|| format!("{origin}: invalid config"))?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        if self.attention_bias {
            bail!("field `attention_bias` is true; SDAR/Qwen3 checkpoints have no biases");
        }
        // Positive, and bounded before anything is sized from them (a layer list, a RoPE table,
        // a KV cache).
        for (field, v, max) in self.sizes() {
            if v == 0 {
                bail!("field `{field}` must be positive");
            }
            crate::limits::at_most(&format!("field `{field}`"), v, max)?;
        }
        if let Some(b) = self.block_size {
            if b == 0 {
                bail!("field `block_size` must be positive");
            }
            crate::limits::at_most("field `block_size`", b, crate::limits::MAX_BLOCK_LENGTH)?;
        }
        if let Some(scaling) = &self.rope_scaling {
            // transformers writes the unscaled case as rope_type (or type) "default"
            let kind =
                scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(|v| v.as_str());
            if kind != Some("default") {
                bail!("field `rope_scaling` is {scaling}; unmask computes unscaled RoPE (SDAR's checkpoints have null)");
            }
        }
        if self.use_sliding_window {
            bail!("field `use_sliding_window` is true; unmask attends to every cached position (SDAR's checkpoints have false)");
        }
        // transformers' "swish" is the same function as "silu"
        if let Some(act) = self.hidden_act.as_deref().filter(|a| !matches!(*a, "silu" | "swish")) {
            bail!("field `hidden_act` is {act:?}; unmask computes SwiGLU's silu (SDAR's checkpoints have \"silu\")");
        }
        if let Some(e) = self
            .eos_token_id
            .as_ref()
            .and_then(|e| e.to_vec().into_iter().find(|&e| e as usize >= self.vocab_size))
        {
            bail!("field `eos_token_id` ({e}) is outside the vocabulary ({})", self.vocab_size);
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            bail!("field `rms_norm_eps` is {}; it must be a positive number", self.rms_norm_eps);
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            bail!("field `rope_theta` is {}; it must be a positive number", self.rope_theta);
        }
        if !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            bail!(
                "field `num_attention_heads` ({}) is not a multiple of `num_key_value_heads` ({})",
                self.num_attention_heads,
                self.kv_heads()
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            bail!("field `head_dim` ({}) must be even for RoPE", self.head_dim());
        }
        if let Some(m) = self.mask_token_id {
            if m as usize >= self.vocab_size {
                bail!(
                    "field `mask_token_id` ({m}) is outside the vocabulary ({})",
                    self.vocab_size
                );
            }
        }
        Ok(())
    }

    /// Whether layer `l`'s feed-forward block is a mixture of experts: as transformers decides
    /// it, not listed in `mlp_only_layers`, experts configured, on the `decoder_sparse_step`, and
    /// past the `first_k_dense_replace` dense layers (LLaDA2's rule; Qwen3-MoE has neither field
    /// against it, LLaDA2 neither of the first two).
    pub fn is_sparse(&self, l: usize) -> bool {
        let m = &self.moe;
        m.num_experts.unwrap_or(0) > 0
            && !m.mlp_only_layers.contains(&l)
            && (l + 1).is_multiple_of(m.decoder_sparse_step.max(1))
            && l >= m.first_k_dense_replace
    }

    /// The sizes every MoE family needs, `(num_experts, num_experts_per_tok,
    /// moe_intermediate_size)`: present, positive, bounded (crate::limits) before experts are
    /// allocated from them, and no more experts a row than there are.
    pub fn expert_sizes(&self) -> Result<(usize, usize, usize)> {
        let m = &self.moe;
        let required = [
            ("num_experts", m.num_experts, crate::limits::MAX_EXPERTS),
            ("num_experts_per_tok", m.num_experts_per_tok, crate::limits::MAX_EXPERTS_PER_TOK),
            ("moe_intermediate_size", m.moe_intermediate_size, crate::limits::MAX_MOE_INTERMEDIATE),
        ];
        let mut sizes = [0usize; 3];
        for ((field, v, max), size) in required.into_iter().zip(&mut sizes) {
            let Some(v) = v else {
                bail!("field `{field}` is missing; model_type {:?} needs it", self.model_type)
            };
            if v == 0 {
                bail!("field `{field}` must be positive");
            }
            crate::limits::at_most(&format!("field `{field}`"), v, max)?;
            *size = v;
        }
        let [experts, k, i] = sizes;
        if k > experts {
            bail!("field `num_experts_per_tok` ({k}) is more than `num_experts` ({experts})");
        }
        Ok((experts, k, i))
    }

    /// The sizes every family shares, as `(field, value, largest value allowed)`: each must be
    /// positive and at most its bound ([`crate::limits`]). `num_key_value_heads` and
    /// `head_dim` are their values with config.json's defaults applied.
    pub fn sizes(&self) -> [(&'static str, usize, usize); 8] {
        use crate::limits::*;
        [
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("hidden_size", self.hidden_size, MAX_HIDDEN),
            ("intermediate_size", self.intermediate_size, MAX_INTERMEDIATE),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("num_key_value_heads", self.kv_heads(), MAX_KV_HEADS),
            ("head_dim", self.head_dim(), MAX_HEAD_DIM),
            ("max_position_embeddings", self.max_position_embeddings, MAX_POSITIONS),
        ]
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The routing layout step events' `--routing` fields index; `None` for a dense model.
    pub fn moe_info(&self) -> Option<crate::trace::events::MoeInfo> {
        let sparse_layers: Vec<usize> =
            (0..self.num_hidden_layers).filter(|&l| self.is_sparse(l)).collect();
        (!sparse_layers.is_empty()).then(|| crate::trace::events::MoeInfo {
            experts: self.moe.num_experts.unwrap_or(0),
            top_k: self.moe.num_experts_per_tok.unwrap_or(0),
            sparse_layers,
        })
    }

    /// Parameter count implied by the shapes (what the weights must add up to). The sizes are
    /// bounded at parse time ([`Self::sizes`], [`crate::limits`]), so this cannot wrap on 64 bits.
    pub fn num_params(&self) -> usize {
        let (h, d) = (self.hidden_size, self.head_dim());
        let q = self.num_attention_heads * d;
        let kv = self.kv_heads() * d;
        let attn = h * q + 2 * h * kv + q * h + 2 * d;
        let dense = 3 * h * self.intermediate_size;
        let m = &self.moe;
        let (experts, moe_i) = (m.num_experts.unwrap_or(0), m.moe_intermediate_size.unwrap_or(0));
        // the router, the routed experts and LLaDA2's shared ones (its router's `expert_bias`,
        // one value an expert, is a buffer, not a parameter, as transformers counts them)
        let shared = m.num_shared_experts.unwrap_or(0);
        let sparse = experts * h + (experts + shared) * 3 * h * moe_i;
        let mlps: usize = (0..self.num_hidden_layers)
            .map(|l| if self.is_sparse(l) { sparse } else { dense })
            .sum();
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        embed + head + self.num_hidden_layers * (attn + 2 * h) + mlps + h
    }
}

/// The block size a checkpoint's name states, as SGLang reads it: a `-bN` part of the folder
/// or model name (`SDAR-4B-Chat-b32`), ending the name or followed by `-`, `_` or `.`.
pub fn block_size_from_name(name: &str) -> Option<usize> {
    name.match_indices("-b")
        .filter_map(|(i, _)| {
            let rest = &name[i + 2..];
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            let ends = rest[digits..].chars().next().is_none_or(|c| "-_.".contains(c));
            if digits == 0 || !ends {
                return None;
            }
            rest[..digits].parse().ok().filter(|&n| n > 0)
        })
        .last()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::registry::parse_config;

    #[test]
    fn block_size_from_a_name_suffix() {
        assert_eq!(block_size_from_name("SDAR-4B-Chat-b32"), Some(32));
        assert_eq!(block_size_from_name("SDAR-1.7B-Chat-b8-distilled"), Some(8));
        assert_eq!(block_size_from_name("SDAR-8B-Chat"), None);
        assert_eq!(block_size_from_name("TraDo-4B-Instruct"), None);
        assert_eq!(block_size_from_name("model-base"), None);
        assert_eq!(block_size_from_name("x-b0"), None);
        assert_eq!(block_size_from_name("x-b16x"), None);
    }

    #[test]
    fn extra_fields_of_sdar_variants_are_ignored() {
        let extra = with("\"fuse_cross_entropy\":true,\"auto_map\":{\"AutoConfig\":\"c.C\"},\"micro_forward\":false,\"ep_size\":1,\"rope_scaling\":null");
        let c = parse_config(&extra, "c").unwrap();
        assert_eq!((c.mask_token_id, c.block_size), (None, None));
    }

    const MIN: &str = r#"{"model_type":"sdar","vocab_size":10,"hidden_size":8,
        "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
        "num_key_value_heads":1,"head_dim":4}"#;

    #[test]
    fn parses_minimal_config_with_defaults() {
        let c = parse_config(MIN, "config.json").unwrap();
        assert_eq!((c.kv_heads(), c.head_dim(), c.rope_theta), (1, 4, 1e6));
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn eos_may_be_one_or_many() {
        let one = with("\"eos_token_id\":3");
        let many = with("\"eos_token_id\":[3,4]");
        let a = parse_config(&one, "c").unwrap();
        let b = parse_config(&many, "c").unwrap();
        assert_eq!(a.eos_token_id.unwrap().to_vec(), vec![3]);
        assert_eq!(b.eos_token_id.unwrap().to_vec(), vec![3, 4]);
    }

    const MOE: &str = r#"{"model_type":"sdar_moe","architectures":["SDARMoeForCausalLM"],"vocab_size":10,
        "hidden_size":8,"intermediate_size":16,"num_hidden_layers":4,"num_attention_heads":2,
        "num_key_value_heads":1,"head_dim":4,"num_experts":6,"num_experts_per_tok":2,
        "moe_intermediate_size":4,"norm_topk_prob":true,"decoder_sparse_step":1,"mlp_only_layers":[]}"#;

    #[test]
    fn sparse_layers_follow_mlp_only_layers_and_the_sparse_step() {
        let c = parse_config(MOE, "c").unwrap();
        assert_eq!((0..4).map(|l| c.is_sparse(l)).collect::<Vec<_>>(), [true; 4]);
        let c =
            parse_config(&MOE.replace("\"mlp_only_layers\":[]", "\"mlp_only_layers\":[0,3]"), "c")
                .unwrap();
        assert_eq!((0..4).map(|l| c.is_sparse(l)).collect::<Vec<_>>(), [false, true, true, false]);
        let c = parse_config(
            &MOE.replace("\"decoder_sparse_step\":1", "\"decoder_sparse_step\":2"),
            "c",
        )
        .unwrap();
        assert_eq!((0..4).map(|l| c.is_sparse(l)).collect::<Vec<_>>(), [false, true, false, true]);
        // Qwen3MoeConfig's defaults: norm_topk_prob false, step 1, no dense layers.
        let bare = MOE.replace(
            ",\"norm_topk_prob\":true,\"decoder_sparse_step\":1,\"mlp_only_layers\":[]",
            "",
        );
        let c = parse_config(&bare, "c").unwrap();
        assert_eq!(
            (c.moe.norm_topk_prob, c.moe.decoder_sparse_step, c.moe.mlp_only_layers.len()),
            (false, 1, 0)
        );
        // A dense family never has sparse layers.
        assert!(!parse_config(MIN, "c").unwrap().is_sparse(0));
        // Router + experts, per sparse layer, in the parameter count.
        let dense = parse_config(
            &MOE.replace("\"mlp_only_layers\":[]", "\"mlp_only_layers\":[0,1,2,3]"),
            "c",
        )
        .unwrap();
        let all = parse_config(MOE, "c").unwrap();
        assert_eq!(
            all.num_params() + 4 * 3 * 8 * 16,
            dense.num_params() + 4 * (6 * 8 + 6 * 3 * 8 * 4)
        );
    }

    #[test]
    fn moe_fields_are_checked_with_their_names() {
        let cases = [
            (
                MOE.replace("\"num_experts\":6,", ""),
                "field `num_experts` is missing; model_type \"sdar_moe\" needs it",
            ),
            (
                MOE.replace("\"num_experts_per_tok\":2", "\"num_experts_per_tok\":7"),
                "field `num_experts_per_tok` (7) is more than `num_experts` (6)",
            ),
            (
                MOE.replace("\"moe_intermediate_size\":4", "\"moe_intermediate_size\":0"),
                "field `moe_intermediate_size` must be positive",
            ),
            (
                MOE.replace("\"num_experts\":6", "\"num_experts\":100000"),
                "field `num_experts` is 100000, more than the limit of 1024",
            ),
            (
                MOE.replace("\"decoder_sparse_step\":1", "\"decoder_sparse_step\":0"),
                "field `decoder_sparse_step` must be positive",
            ),
            (
                MOE.replace("\"mlp_only_layers\":[]", "\"mlp_only_layers\":[4]"),
                "field `mlp_only_layers` lists layer 4; the model has 4 layers",
            ),
            (
                MOE.replace("\"mlp_only_layers\":[]", "\"mlp_only_layers\":[-1]"),
                "invalid config: field `mlp_only_layers[0]`: invalid value: integer `-1`",
            ),
            (
                MOE.replace("\"num_experts\":6", "\"num_experts\":-6"),
                "invalid config: field `num_experts`: invalid value: integer `-6`",
            ),
        ];
        for (text, want) in cases {
            let e = err(&text);
            assert!(e.starts_with("m/config.json: invalid config") && e.contains(want), "{e}");
        }
        // qwen3_moe and the architecture name reach the same family.
        let c = parse_config(&MOE.replace("\"sdar_moe\"", "\"qwen3_moe\""), "c").unwrap();
        assert!(c.is_sparse(0));
    }

    /// Each size is checked under its own name against its own bound: one over the bound is
    /// refused, the bound itself is not (a renamed field or a bound read for another field
    /// fails here).
    #[test]
    fn every_size_is_bounded_under_its_name() {
        use crate::limits::*;
        let dense = [
            ("vocab_size", MAX_VOCAB),
            ("hidden_size", MAX_HIDDEN),
            ("intermediate_size", MAX_INTERMEDIATE),
            ("num_hidden_layers", MAX_LAYERS),
            ("num_attention_heads", MAX_HEADS),
            ("num_key_value_heads", MAX_KV_HEADS),
            ("head_dim", MAX_HEAD_DIM),
            ("max_position_embeddings", MAX_POSITIONS),
        ];
        let moe = [
            ("num_experts", MAX_EXPERTS),
            ("num_experts_per_tok", MAX_EXPERTS_PER_TOK),
            ("moe_intermediate_size", MAX_MOE_INTERMEDIATE),
        ];
        let c = parse_config(MIN, "c").unwrap();
        assert_eq!(c.sizes().map(|s| (s.0, s.2)), dense, "sizes() names every bound");
        let set = |text: &str, field: &str, v: usize| {
            let mut j: serde_json::Value = serde_json::from_str(text).unwrap();
            j[field] = v.into();
            j.to_string()
        };
        for (text, bounds) in [(MIN, &dense[..]), (MOE, &moe[..])] {
            for &(field, max) in bounds {
                let e = err(&set(text, field, max + 1));
                assert!(
                    e.ends_with(&format!(
                        "invalid config: field `{field}` is {}, more than the limit of {max}",
                        max + 1
                    )),
                    "{e}"
                );
                // the bound itself passes this check (a later one may still refuse the config)
                let e = parse_config(&set(text, field, max), "c")
                    .map(|_| String::new())
                    .unwrap_or_else(|e| format!("{e:#}"));
                assert!(!e.contains("more than the limit"), "{field} = {max}: {e}");
            }
        }
    }

    fn err(text: &str) -> String {
        format!("{:#}", parse_config(text, "m/config.json").unwrap_err())
    }

    /// `MIN` with `fields` (`"name":value,...`) added.
    fn with(fields: &str) -> String {
        MIN.replace("\"head_dim\":4", &format!("\"head_dim\":4,{fields}"))
    }

    #[test]
    fn errors_name_file_and_field() {
        let e = err(&MIN.replace("\"vocab_size\":10,", ""));
        assert!(e.starts_with("m/config.json: invalid config: missing field `vocab_size`"), "{e}");
        let e = err(&MIN.replace("sdar", "llama"));
        assert!(e.contains("`model_type` is \"llama\""), "{e}");
        let e = err(&MIN.replace("\"num_key_value_heads\":1", "\"num_key_value_heads\":3"));
        assert!(e.contains("`num_attention_heads` (2) is not a multiple"), "{e}");
        let e = err(&MIN.replace("\"hidden_size\":8", "\"hidden_size\":\"8\""));
        assert!(e.contains("invalid type"), "{e}");
        for (field, bad) in [
            ("rope_theta", "0"),
            ("rope_theta", "-5"),
            ("rms_norm_eps", "-1"),
            ("rms_norm_eps", "0"),
        ] {
            let e = err(&with(&format!("\"{field}\":{bad}")));
            assert!(
                e.starts_with(&format!("m/config.json: invalid config: field `{field}` is {bad};")),
                "{e}"
            );
        }
        let e = err(&MIN.replace("\"num_hidden_layers\":1", "\"num_hidden_layers\":1000000000"));
        assert!(e.ends_with("invalid config: field `num_hidden_layers` is 1000000000, more than the limit of 1024"), "{e}");
        let e = err(&with("\"max_position_embeddings\":18446744073709551615"));
        assert!(
            e.contains(
                "field `max_position_embeddings` is 18446744073709551615, more than the limit"
            ),
            "{e}"
        );
        // what unmask does not compute is refused, not ignored
        let e = err(&with("\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}"));
        assert!(e.ends_with("field `rope_scaling` is {\"rope_type\":\"yarn\",\"factor\":4.0}; unmask computes unscaled RoPE (SDAR's checkpoints have null)"), "{e}");
        let e = err(&with("\"use_sliding_window\":true"));
        assert!(e.contains("field `use_sliding_window` is true"), "{e}");
        let e = err(&with("\"hidden_act\":\"gelu\""));
        assert!(e.ends_with("field `hidden_act` is \"gelu\"; unmask computes SwiGLU's silu (SDAR's checkpoints have \"silu\")"), "{e}");
        for fine in ["silu", "swish"] {
            parse_config(&with(&format!("\"hidden_act\":\"{fine}\"")), "c").unwrap();
        }
        let e = err(&with("\"max_position_embeddings\":0"));
        assert!(e.ends_with("field `max_position_embeddings` must be positive"), "{e}");
        let e = err(&with("\"eos_token_id\":[3,99999999]"));
        assert!(e.contains("field `eos_token_id` (99999999) is outside the vocabulary"), "{e}");
        for fine in ["null", "{\"rope_type\":\"default\"}", "{\"type\":\"default\"}"] {
            parse_config(&with(&format!("\"rope_scaling\":{fine}")), "c").unwrap();
        }
        // the block size of a checkpoint's own config is named as such, not as the flag's
        let e = err(&with("\"block_size\":0"));
        assert!(e.ends_with("invalid config: field `block_size` must be positive"), "{e}");
        let e = err("{ not json");
        assert!(e.contains("m/config.json: invalid config: key must be a string at line 1"), "{e}");
    }

    /// A value that does not fit its field's type is named by its path (serde alone said
    /// `invalid value: integer -1, expected usize at line 1 column 158`).
    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        for (field, bad) in [
            ("vocab_size", "-1"),
            ("vocab_size", "1e10"),
            ("rope_theta", "\"x\""),
            ("eos_token_id", "\"x\""),
            ("tie_word_embeddings", "1"),
        ] {
            let mut j: serde_json::Value = serde_json::from_str(MIN).unwrap();
            j[field] = serde_json::from_str(bad).unwrap();
            let e = err(&j.to_string());
            assert!(
                e.starts_with(&format!("m/config.json: invalid config: field `{field}`: ")),
                "{field} {bad}: {e}"
            );
            assert!(!e.contains("untagged enum"), "{e}");
        }
        // a missing field is not a field's path
        let e = err(&MIN.replace("\"hidden_size\":8,", ""));
        assert!(e.starts_with("m/config.json: invalid config: missing field `hidden_size`"), "{e}");
    }

    /// serde's derive reads a JSON array as a struct by position; config.json must be an object.
    #[test]
    fn a_config_that_is_not_an_object_is_refused() {
        let fields: Vec<serde_json::Value> =
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(MIN)
                .unwrap()
                .into_iter()
                .map(|(_, v)| v)
                .collect();
        let as_array = serde_json::Value::Array(fields).to_string();
        for text in [as_array.as_str(), "[]", "3", "null"] {
            let e = err(text);
            assert!(e.starts_with("m/config.json: not a JSON object (it is "), "{text}: {e}");
        }
    }
}
