//! LLaDA2.x (`llada2_moe`, `LLaDA2MoeModelLM`: LLaDA2.0 and LLaDA2.1, one architecture), top to
//! bottom: config, attention, feed-forward (dense, or a mixture of experts with a grouped
//! sigmoid router and a shared expert), layer, model.
//!
//! The forward ([`Decoder::forward`]): embed the ids (`model.word_embeddings`) → each layer
//! `x += attn(norm(x))`, `x += ffn(norm(x))` → final norm → lm_head (untied). Position i
//! predicts token i (no shift); attention is block-causal over the KV cache as SDAR's (the mask
//! comes with the pass, [`PassInput`](super::PassInput)).

use anyhow::{bail, Result};

use super::config::ModelConfig;
use super::decoder::Decoder;
use super::layers::attention::{AttentionTensors, Heads, SelfAttention};
use super::layers::decoder_layer::DecoderLayer;
use super::layers::embedding::{Embedding, LmHead};
use super::layers::feed_forward::FeedForward;
use super::layers::kv_cache::Rope;
use super::layers::moe::MoeBlock;
use super::layers::router::{GroupedSigmoid, Routing};
use super::layers::swiglu::SwiGlu;
use super::loader::Loader;
use super::registry::Family;
use super::GenerationConfig;

pub const FAMILY: Family = Family {
    model_types: &["llada2_moe"],
    architectures: &["LLaDA2MoeModelLM"],
    check,
    layer_tensor: |l| format!("model.layers.{l}.input_layernorm.weight"),
    load: model,
    decoding,
};

// Decoding: which of the two published `generate()`s a checkpoint gets, and their defaults.

/// LLaDA2.0's and LLaDA2.1's `generate()` defaults (dllm's copies of the remote code).
const BLOCK: usize = 32;
const STEPS: usize = 32;
const THRESHOLD: f32 = 0.95;
const EDIT_THRESHOLD: f32 = 0.9;
const MAX_POST_STEPS: usize = 16;

/// One architecture carries two decoders: LLaDA2.1's token editing where the checkpoint's
/// generation_config.json names an editing key or its name says 2.1, else LLaDA2.0's. The
/// checkpoint's own values (and flags) still override these; `origin` says which was taken
/// and why, for the trace header's `sources.decoding`.
fn decoding(gen: &GenerationConfig, name: Option<&str>) -> Option<GenerationConfig> {
    let base = GenerationConfig {
        block_length: Some(BLOCK),
        denoising_steps: Some(STEPS),
        threshold: Some(THRESHOLD),
        ..GenerationConfig::default()
    };
    let editing_key = [
        gen.editing_threshold.is_some().then_some("editing_threshold"),
        gen.max_post_steps.is_some().then_some("max_post_steps"),
    ]
    .into_iter()
    .flatten()
    .next();
    let named_21 = name.filter(|n| says_2_1(n));
    let why = match (editing_key, named_21) {
        (Some(key), _) => Some(format!("{} names `{key}`", gen.label())),
        (None, Some(n)) => Some(format!("the checkpoint's name {n:?} says 2.1")),
        (None, None) => None,
    };
    Some(match why {
        Some(why) => GenerationConfig {
            remasking_strategy: Some("joint_threshold".into()),
            editing_threshold: Some(EDIT_THRESHOLD),
            max_post_steps: Some(MAX_POST_STEPS),
            eos_early_stop: Some(false),
            origin: format!("LLaDA2.1 generate() (token editing): {why}"),
            ..base
        },
        None => GenerationConfig {
            remasking_strategy: Some("low_confidence_dynamic".into()),
            eos_early_stop: Some(true),
            origin:
                "LLaDA2.0 generate(): no editing key in generation_config.json, no 2.1 in the name"
                    .into(),
            ..base
        },
    })
}

/// `LLaDA2.1-mini`, `llada2_1-flash`, ...: a name that says LLaDA2.1 (any case).
fn says_2_1(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["llada2.1", "llada2_1", "llada-2.1"].iter().any(|s| n.contains(s))
}

// Config: the fields every family shares (config.rs), the MoE sizes, and LLaDA2's own, with
// the defaults of its config class (`LLaDA2MoeConfig`) where config.json leaves one out.

/// `n_group`, `topk_group`, `routed_scaling_factor` and `partial_rotary_factor` where absent.
const DEFAULT_GROUPS: usize = 8;
const DEFAULT_KEPT_GROUPS: usize = 4;
const DEFAULT_SCALE: f64 = 2.5;
const DEFAULT_PARTIAL_ROTARY: f64 = 0.5;

/// The router's groups, the groups kept and the weights' scale (checked by [`check`]).
fn router_fields(cfg: &ModelConfig) -> (usize, usize, f64) {
    let m = &cfg.moe;
    (
        m.n_group.unwrap_or(DEFAULT_GROUPS),
        m.topk_group.unwrap_or(DEFAULT_KEPT_GROUPS),
        m.routed_scaling_factor.unwrap_or(DEFAULT_SCALE),
    )
}

/// The leading dimensions of a head RoPE rotates: `int(head_dim * partial_rotary_factor)`, as
/// the reference truncates it.
fn rotary_dims(cfg: &ModelConfig) -> usize {
    let factor = cfg.partial_rotary_factor.unwrap_or(DEFAULT_PARTIAL_ROTARY);
    (cfg.head_dim() as f64 * factor) as usize
}

/// LLaDA2's config fields, each refused with its name and value where unmask would compute
/// something else than the reference.
fn check(cfg: &ModelConfig) -> Result<()> {
    let (experts, k, moe_i) = cfg.expert_sizes()?;
    let m = &cfg.moe;
    let (groups, keep, scale) = router_fields(cfg);
    if groups == 0 {
        bail!("field `n_group` must be positive");
    }
    if !experts.is_multiple_of(groups) {
        bail!("field `n_group` {groups} does not divide `num_experts` {experts}");
    }
    let size = experts / groups;
    if size < 2 {
        bail!("field `n_group` {groups} leaves {size} expert a group of `num_experts` {experts}; a group's score sums its best two");
    }
    if keep == 0 {
        bail!("field `topk_group` must be positive");
    }
    if keep > groups {
        bail!("field `topk_group` {keep} is more than `n_group` {groups}");
    }
    if k > keep * size {
        bail!("field `num_experts_per_tok` {k} is more than the {} experts the `topk_group` {keep} kept groups of {size} hold", keep * size);
    }
    if !(scale.is_finite() && scale > 0.0) {
        bail!("field `routed_scaling_factor` is {scale}; it must be a positive number");
    }
    if let Some(f) = m.score_function.as_deref().filter(|f| *f != "sigmoid") {
        bail!("field `score_function` is {f:?}; LLaDA2's router computes \"sigmoid\"");
    }
    let shared = m.num_shared_experts.unwrap_or(0);
    crate::limits::at_most("field `num_shared_experts`", shared, crate::limits::MAX_EXPERTS)?;
    crate::limits::at_most(
        "`moe_intermediate_size` x `num_shared_experts`",
        moe_i * shared,
        crate::limits::MAX_INTERMEDIATE,
    )?;
    if cfg.use_qkv_bias == Some(true) {
        bail!("field `use_qkv_bias` is true; unmask computes the q|k|v product without a bias (released LLaDA2 checkpoints set false)");
    }
    // LLaDA2MoeConfig defaults `use_bias` to true, so an absent field asks for a bias too
    let no_bias = "unmask computes attention's output product without a bias (released LLaDA2 checkpoints set false)";
    match cfg.use_bias {
        Some(false) => {}
        Some(true) => bail!("field `use_bias` is true; {no_bias}"),
        None => bail!(
            "field `use_bias` is absent, which LLaDA2's config class reads as true; {no_bias}"
        ),
    }
    if cfg.use_qk_norm == Some(false) {
        bail!("field `use_qk_norm` is false; unmask normalises q and k per head (released LLaDA2 checkpoints set true)");
    }
    let factor = cfg.partial_rotary_factor.unwrap_or(DEFAULT_PARTIAL_ROTARY);
    if !(factor.is_finite() && factor > 0.0 && factor <= 1.0) {
        bail!("field `partial_rotary_factor` is {factor}; it must be in (0, 1]");
    }
    let (rot, d) = (rotary_dims(cfg), cfg.head_dim());
    if rot < 2 || !rot.is_multiple_of(2) {
        bail!("field `partial_rotary_factor` {factor} rotates {rot} of `head_dim` {d} dimensions; RoPE turns them in pairs, so it needs an even number, at least 2");
    }
    Ok(())
}

/// Refuses a bias tensor the config says the checkpoint has not: unmask would leave it out.
fn no_bias(b: &Loader, prefix: &str, proj: &str, field: &str) -> Result<()> {
    let name = format!("{prefix}.{proj}.bias");
    if b.contains(&name) {
        bail!("{}: tensor `{name}` is present, but config.json's `{field}` is false: unmask would compute without it", b.origin(&name));
    }
    Ok(())
}

/// Attention under `prefix` (`model.layers.N.attention`): `query_key_value`, the q, k and v
/// heads in one `[q | k | v]` tensor; `dense`, the output product; `query_layernorm` and
/// `key_layernorm`, an RMSNorm over each head of q and k before RoPE; RoPE at `rope_theta` over
/// the first `head_dim * partial_rotary_factor` dimensions of each head (rotate-half within
/// them), the rest passed through. No biases (`use_qkv_bias`, `use_bias` false).
pub fn attention(cfg: &ModelConfig, b: &Loader, prefix: &str) -> Result<SelfAttention> {
    no_bias(b, prefix, "query_key_value", "use_qkv_bias")?;
    no_bias(b, prefix, "dense", "use_bias")?;
    let heads = Heads::of(cfg);
    let (q, kv) = heads.widths();
    let name = |n: &str| format!("{prefix}.{n}.weight");
    // Kept fused as stored: SelfAttention multiplies q, k and v as one stacked `[q | k | v]`
    // product whatever the family (Qwen3's three tensors are stacked into exactly this at
    // load), so the fused tensor is that product already, and the CPU and every device path
    // (the standard layer, the streamed one's gemv and q/k prep kernels) run it through the
    // one attention code; splitting it would only copy it back together.
    let tensors = AttentionTensors {
        qkv: vec![(name("query_key_value"), q + 2 * kv)],
        o: name("dense"),
        q_norm: name("query_layernorm"),
        k_norm: name("key_layernorm"),
    };
    let rope = Rope { theta: cfg.rope_theta, dims: rotary_dims(cfg) };
    SelfAttention::load(b, &tensors, cfg.hidden_size, heads, rope)
}

/// Feed-forward of layer `l` under `prefix` (`model.layers.N.mlp`). The first
/// `first_k_dense_replace` layers: a dense SwiGLU of `intermediate_size` (`gate_proj`,
/// `up_proj`, `down_proj`). The others a mixture of `num_experts` SwiGLUs of
/// `moe_intermediate_size` (`experts.E`), routed by the grouped sigmoid router (`gate.weight`,
/// `gate.expert_bias` f32: layers/router.rs), each row's `num_experts_per_tok` experts; plus
/// the shared expert (`shared_experts`, one SwiGLU of `moe_intermediate_size` x
/// `num_shared_experts`), which every row goes through. `norm_topk_prob` is not read: the
/// weights are always renormalised (for more than one expert a row) and scaled.
fn ffn(cfg: &ModelConfig, b: &Loader, prefix: &str, l: usize) -> Result<FeedForward> {
    let h = cfg.hidden_size;
    if !cfg.is_sparse(l) {
        return Ok(FeedForward::Dense(SwiGlu::load(b, prefix, h, cfg.intermediate_size)?));
    }
    let (experts, k, moe_i) = cfg.expert_sizes()?;
    let (groups, keep, scale) = router_fields(cfg);
    // `moe_router_enable_expert_bias` false: no bias tensor, the reference's zeros
    let bias = match cfg.moe.moe_router_enable_expert_bias {
        Some(false) => vec![0.0; experts],
        _ => b.host_f32(&format!("{prefix}.gate.expert_bias"), &[experts])?,
    };
    let routing =
        Routing::GroupedSigmoid(GroupedSigmoid { bias, groups, keep, scale: scale as f32 });
    let shared = cfg.moe.num_shared_experts.filter(|&n| n > 0).map(|n| n * moe_i);
    Ok(FeedForward::Sparse(MoeBlock::load_routed(
        b,
        prefix,
        h,
        (experts, k, moe_i),
        routing,
        shared,
    )?))
}

/// Layer `l` under `model.layers.l`: `input_layernorm`, `attention`,
/// `post_attention_layernorm`, `mlp`.
fn layer(cfg: &ModelConfig, b: &Loader, l: usize) -> Result<DecoderLayer> {
    let (p, h) = (format!("model.layers.{l}"), cfg.hidden_size);
    let input_norm = b.get(&format!("{p}.input_layernorm.weight"), &[h])?;
    let attn = attention(cfg, b, &format!("{p}.attention"))?;
    let post_norm = b.get(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
    let ffn = ffn(cfg, b, &format!("{p}.mlp"), l)?;
    Ok(DecoderLayer { input_norm, attn, post_norm, ffn })
}

/// The model: the layers, `model.word_embeddings`, `lm_head` (the embedding itself only where
/// `tie_word_embeddings` and the checkpoint lacks it; LLaDA2's are untied), `model.norm`; read
/// in that order.
fn model(cfg: &ModelConfig, b: &Loader) -> Result<Decoder> {
    let layers =
        (0..cfg.num_hidden_layers).map(|l| layer(cfg, b, l)).collect::<Result<Vec<_>>>()?;
    let embed =
        Embedding::load(b, "model.word_embeddings.weight", (cfg.vocab_size, cfg.hidden_size))?;
    let lm_head = LmHead::load(b, "lm_head.weight", &embed, cfg.tie_word_embeddings)?;
    let norm = b.get("model.norm.weight", &[cfg.hidden_size])?;
    Ok(Decoder {
        embed,
        layers,
        norm,
        lm_head,
        eps: cfg.rms_norm_eps as f32,
        max_positions: cfg.max_position_embeddings,
    })
}

#[cfg(test)]
mod tests {
    use crate::model::registry::parse_config;

    /// The fixture's config (tests/fixtures/tiny-llada2), the released config's fields.
    fn fixture_config() -> serde_json::Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny-llada2/config.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// The error of the fixture's config with `field` set to `value` (`null`: removed).
    fn err_with(field: &str, value: serde_json::Value) -> String {
        let mut j = fixture_config();
        if value.is_null() {
            j.as_object_mut().unwrap().remove(field);
        } else {
            j[field] = value;
        }
        match parse_config(&j.to_string(), "DIR/config.json") {
            Ok(_) => panic!("{field} = {}: accepted", j[field]),
            Err(e) => format!("{e:#}"),
        }
    }

    /// Each `(field, value, error)`: the fixture's config with `field` set to `value` is refused
    /// in one line that names the file and starts with `error`.
    fn assert_refused(cases: &[(&str, serde_json::Value, &str)]) {
        for (field, value, want) in cases {
            let e = err_with(field, value.clone());
            assert!(
                e.starts_with(&format!("DIR/config.json: invalid config: {want}")),
                "{field} = {value}: {e}"
            );
            assert_eq!(e.lines().count(), 1, "one line: {e}");
        }
    }

    #[test]
    fn the_fixture_config_is_llada2_with_its_sizes() {
        let c = parse_config(&fixture_config().to_string(), "c").unwrap();
        assert_eq!(c.model_type, "llada2_moe");
        assert_eq!((0..3).map(|l| c.is_sparse(l)).collect::<Vec<_>>(), [false, true, true]);
        assert_eq!(super::rotary_dims(&c), 8, "half of 16");
        assert_eq!(super::router_fields(&c), (4, 2, 2.5));
        let info = c.moe_info().unwrap();
        assert_eq!((info.experts, info.top_k, info.sparse_layers), (8, 2, vec![1, 2]));
        // by the architecture alone, as a mislabelled checkpoint
        let mut j = fixture_config();
        j["model_type"] = "llada2_custom".into();
        let c = parse_config(&j.to_string(), "c").unwrap();
        assert_eq!(crate::model::registry::family(&c).unwrap().model_types, ["llada2_moe"]);
    }

    #[test]
    fn bad_router_fields_are_named_with_file_and_value() {
        use serde_json::json;
        let cases = [
            ("n_group", json!(3), "field `n_group` 3 does not divide `num_experts` 8"),
            ("n_group", json!(0), "field `n_group` must be positive"),
            ("n_group", json!(8), "field `n_group` 8 leaves 1 expert a group of `num_experts` 8"),
            ("topk_group", json!(5), "field `topk_group` 5 is more than `n_group` 4"),
            ("topk_group", json!(0), "field `topk_group` must be positive"),
            (
                "num_experts_per_tok",
                json!(5),
                "field `num_experts_per_tok` 5 is more than the 4 experts the `topk_group` 2 kept groups of 2 hold",
            ),
            (
                "score_function",
                json!("softmax"),
                "field `score_function` is \"softmax\"; LLaDA2's router computes \"sigmoid\"",
            ),
            (
                "routed_scaling_factor",
                json!(-1.0),
                "field `routed_scaling_factor` is -1; it must be a positive number",
            ),
            ("num_experts", serde_json::Value::Null, "field `num_experts` is missing"),
        ];
        assert_refused(&cases);
    }

    #[test]
    fn attention_fields_unmask_does_not_compute_are_refused() {
        use serde_json::json;
        let cases = [
            (
                "partial_rotary_factor",
                json!(0.1875),
                "field `partial_rotary_factor` 0.1875 rotates 3 of `head_dim` 16 dimensions; RoPE turns them in pairs",
            ),
            ("partial_rotary_factor", json!(0.0), "field `partial_rotary_factor` is 0; it must be in (0, 1]"),
            ("partial_rotary_factor", json!(1.5), "field `partial_rotary_factor` is 1.5; it must be in (0, 1]"),
            ("use_qkv_bias", json!(true), "field `use_qkv_bias` is true; unmask computes the q|k|v product without a bias"),
            ("use_bias", json!(true), "field `use_bias` is true; unmask computes attention's output product without a bias"),
            (
                "use_bias",
                serde_json::Value::Null,
                "field `use_bias` is absent, which LLaDA2's config class reads as true",
            ),
            ("use_qk_norm", json!(false), "field `use_qk_norm` is false"),
        ];
        assert_refused(&cases);
        // the factor's truncation: 16 x 0.3 = 4.8 rotates 4 dimensions, which is fine
        let mut j = fixture_config();
        j["partial_rotary_factor"] = json!(0.3);
        let c = parse_config(&j.to_string(), "c").unwrap();
        assert_eq!(super::rotary_dims(&c), 4);
        // absent, the config class's 0.5
        let mut j = fixture_config();
        j.as_object_mut().unwrap().remove("partial_rotary_factor");
        assert_eq!(super::rotary_dims(&parse_config(&j.to_string(), "c").unwrap()), 8);
    }

    /// generation_config.json's text, parsed as a checkpoint's would be.
    fn gen(json: &str) -> crate::model::GenerationConfig {
        crate::model::GenerationConfig::parse(json, "M/generation_config.json").unwrap()
    }

    #[test]
    fn an_editing_key_or_a_2_1_name_picks_llada2_1s_decoder() {
        let d = super::decoding(&gen(r#"{"editing_threshold":0.5}"#), Some("ckpt")).unwrap();
        assert_eq!(d.remasking_strategy.as_deref(), Some("joint_threshold"));
        assert_eq!(
            (d.editing_threshold, d.max_post_steps, d.eos_early_stop),
            (Some(0.9), Some(16), Some(false))
        );
        assert_eq!(
            d.origin,
            "LLaDA2.1 generate() (token editing): M/generation_config.json names `editing_threshold`"
        );
        let d = super::decoding(&gen(r#"{"max_post_steps":4}"#), None).unwrap();
        assert!(d.origin.ends_with("names `max_post_steps`"), "{}", d.origin);
        for name in ["LLaDA2.1-mini", "inclusionAI--llada2_1-flash", "my-LLaDA-2.1"] {
            let d = super::decoding(&gen("{}"), Some(name)).unwrap();
            assert_eq!(d.remasking_strategy.as_deref(), Some("joint_threshold"), "{name}");
            assert!(d.origin.contains(&format!("{name:?} says 2.1")), "{}", d.origin);
        }
        for d in [
            super::decoding(&gen("{}"), Some("ckpt")).unwrap(),
            super::decoding(&gen(r#"{"max_post_steps":4}"#), None).unwrap(),
        ] {
            assert_eq!(
                (d.block_length, d.denoising_steps, d.threshold),
                (Some(32), Some(32), Some(0.95))
            );
        }
    }

    #[test]
    fn otherwise_llada2_0s_decoder_stops_after_the_eos_block() {
        for name in [Some("LLaDA2.0-mini-preview"), Some("llada2"), None] {
            let d = super::decoding(&gen(r#"{"eos_token_id":156892}"#), name).unwrap();
            assert_eq!(d.remasking_strategy.as_deref(), Some("low_confidence_dynamic"));
            assert_eq!(d.eos_early_stop, Some(true));
            assert_eq!((d.editing_threshold, d.max_post_steps), (None, None));
            assert!(d.origin.starts_with("LLaDA2.0 generate()"), "{}", d.origin);
        }
    }
}
