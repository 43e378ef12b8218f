//! Qwen3 (and SDAR, which is Qwen3 with block-causal attention): every layer's feed-forward
//! block is a dense SwiGLU of `intermediate_size` under `model.layers.N.mlp`.

use anyhow::Result;

use super::config::ModelConfig;
use super::ffn::Mlp;
use super::loader::Loader;
use super::mlp::SwiGlu;
use super::registry::Family;

pub const FAMILY: Family = Family {
    model_types: &["sdar", "qwen3"],
    architectures: &["SDARForCausalLM", "Qwen3ForCausalLM"],
    check: |_| Ok(()),
    mlp,
};

fn mlp(cfg: &ModelConfig, b: &Loader, l: usize) -> Result<Mlp> {
    let prefix = format!("model.layers.{l}.mlp");
    Ok(Mlp::Dense(SwiGlu::load(b, &prefix, cfg.hidden_size, cfg.intermediate_size)?))
}
