//! Qwen3, and SDAR (Qwen3 with block-causal attention), top to bottom: config, attention,
//! feed-forward, layer, model. Qwen3-MoE (qwen3_moe.rs) is this architecture with another
//! feed-forward block in some layers.
//!
//! The forward ([`Decoder::forward`]): embed the ids → each layer `x += attn(norm(x))`,
//! `x += ffn(norm(x))` → final norm → lm_head. Attention is block-causal over the KV cache
//! (the mask comes with the pass, [`PassInput`](super::PassInput)).

use anyhow::Result;

use super::config::ModelConfig;
use super::decoder::Decoder;
use super::layers::attention::{AttentionTensors, Heads, SelfAttention};
use super::layers::decoder_layer::DecoderLayer;
use super::layers::embedding::{Embedding, LmHead};
use super::layers::feed_forward::FeedForward;
use super::layers::kv_cache::Rope;
use super::layers::swiglu::SwiGlu;
use super::loader::Loader;
use super::registry::Family;

// Config: `model_type` sdar or qwen3 (else an `architectures` entry). It reads the fields
// every family shares (config.rs checks them: sizes, `rms_norm_eps`, `rope_theta`,
// `tie_word_embeddings`, no attention bias, no RoPE scaling, no sliding window, SiLU) and
// adds none of its own.
pub const FAMILY: Family = Family {
    model_types: &["sdar", "qwen3"],
    architectures: &["SDARForCausalLM", "Qwen3ForCausalLM"],
    check: |_| Ok(()),
    layer_tensor: |l| format!("model.layers.{l}.input_layernorm.weight"),
    load: |cfg, b| model(cfg, b, dense),
    // SDAR decodes with unmask's defaults: they are its generate.py's.
    decoding: |_, _| None,
};

/// Attention under `prefix` (`model.layers.N.self_attn`): `q_proj`, `k_proj` and `v_proj`
/// stacked into one q|k|v product, `o_proj`; `q_norm` and `k_norm`, an RMSNorm over each head
/// of q and k; RoPE at `rope_theta` over whole heads.
pub fn attention(cfg: &ModelConfig, b: &Loader, prefix: &str) -> Result<SelfAttention> {
    let heads = Heads::of(cfg);
    let (q, kv) = heads.widths();
    let name = |n: &str| format!("{prefix}.{n}.weight");
    let tensors = AttentionTensors {
        qkv: vec![(name("q_proj"), q), (name("k_proj"), kv), (name("v_proj"), kv)],
        o: name("o_proj"),
        q_norm: name("q_norm"),
        k_norm: name("k_norm"),
    };
    SelfAttention::load(
        b,
        &tensors,
        cfg.hidden_size,
        heads,
        Rope { theta: cfg.rope_theta, dims: heads.head_dim },
    )
}

/// Feed-forward under `prefix` (`model.layers.N.mlp`): a dense SwiGLU of `intermediate_size`,
/// `gate_proj` and `up_proj` stacked into one product, then `down_proj`. Every layer has one.
pub fn dense(cfg: &ModelConfig, b: &Loader, prefix: &str, _layer: usize) -> Result<FeedForward> {
    Ok(FeedForward::Dense(SwiGlu::load(b, prefix, cfg.hidden_size, cfg.intermediate_size)?))
}

/// A layer's feed-forward block from its prefix and index.
pub type FfnLoader = fn(&ModelConfig, &Loader, &str, usize) -> Result<FeedForward>;

/// Layer `l` under `model.layers.l`: `input_layernorm`, attention (`self_attn`),
/// `post_attention_layernorm`, the feed-forward block `ffn` loads (`mlp`).
pub fn layer(cfg: &ModelConfig, b: &Loader, l: usize, ffn: FfnLoader) -> Result<DecoderLayer> {
    let (p, h) = (format!("model.layers.{l}"), cfg.hidden_size);
    let input_norm = b.get(&format!("{p}.input_layernorm.weight"), &[h])?;
    let attn = attention(cfg, b, &format!("{p}.self_attn"))?;
    let post_norm = b.get(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
    let ffn = ffn(cfg, b, &format!("{p}.mlp"), l)?;
    Ok(DecoderLayer { input_norm, attn, post_norm, ffn })
}

/// The model: the layers, `model.embed_tokens`, `lm_head` (the embedding itself where
/// `tie_word_embeddings` and the checkpoint lacks it), `model.norm`; read in that order.
pub fn model(cfg: &ModelConfig, b: &Loader, ffn: FfnLoader) -> Result<Decoder> {
    let layers =
        (0..cfg.num_hidden_layers).map(|l| layer(cfg, b, l, ffn)).collect::<Result<Vec<_>>>()?;
    let embed = Embedding::load(b, "model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size))?;
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
