//! Qwen3-MoE and SDAR-MoE (SDAR-30B-A3B): Qwen3's architecture (qwen3.rs: attention, layer,
//! model, tensor names) with a sparse feed-forward block in most layers: a mixture of
//! `num_experts` SwiGLUs of `moe_intermediate_size` (layers/moe.rs) under
//! `model.layers.N.mlp.gate` and `model.layers.N.mlp.experts.E`, except the layers listed in
//! `mlp_only_layers` or off the `decoder_sparse_step`, which are dense SwiGLUs of
//! `intermediate_size` (qwen3.rs's).

use anyhow::{bail, Result};

use super::config::ModelConfig;
use super::layers::feed_forward::FeedForward;
use super::layers::moe::MoeBlock;
use super::loader::Loader;
use super::qwen3;
use super::registry::Family;

pub const FAMILY: Family = Family {
    model_types: &["sdar_moe", "qwen3_moe"],
    architectures: &["SDARMoeForCausalLM", "Qwen3MoeForCausalLM"],
    check,
    layer_tensor: qwen3::FAMILY.layer_tensor,
    load: |cfg, b| qwen3::model(cfg, b, ffn),
    // SDAR decodes with unmask's defaults: they are its generate.py's.
    decoding: |_, _| None,
};

/// Config: the MoE fields, bounded (crate::limits) before experts are allocated from them.
fn check(cfg: &ModelConfig) -> Result<()> {
    let m = &cfg.moe;
    cfg.expert_sizes()?;
    if m.decoder_sparse_step == 0 {
        bail!("field `decoder_sparse_step` must be positive");
    }
    if let Some(&l) = m.mlp_only_layers.iter().find(|&&l| l >= cfg.num_hidden_layers) {
        bail!(
            "field `mlp_only_layers` lists layer {l}; the model has {} layers",
            cfg.num_hidden_layers
        );
    }
    Ok(())
}

/// Feed-forward of layer `l` under `prefix` (`model.layers.N.mlp`): where the layer is sparse
/// ([`ModelConfig::is_sparse`]), the router `gate` over `num_experts` experts, each row's
/// `num_experts_per_tok` best renormalised where `norm_topk_prob`; else qwen3.rs's dense SwiGLU.
fn ffn(cfg: &ModelConfig, b: &Loader, prefix: &str, l: usize) -> Result<FeedForward> {
    let m = &cfg.moe;
    if !cfg.is_sparse(l) {
        return qwen3::dense(cfg, b, prefix, l);
    }
    let shape = (
        m.num_experts.unwrap_or(0),
        m.num_experts_per_tok.unwrap_or(0),
        m.moe_intermediate_size.unwrap_or(0),
    );
    Ok(FeedForward::Sparse(MoeBlock::load(b, prefix, cfg.hidden_size, shape, m.norm_topk_prob)?))
}
