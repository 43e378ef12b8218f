//! The families unmask runs, and the one place that picks a checkpoint's family from its
//! config.json. A new family is a file beside qwen3.rs with a [`Family`] constant, listed in
//! [`FAMILIES`]: it checks its own config fields and builds its [`Decoder`] from its own
//! tensor names, out of the blocks of layers/ (and any block of its own).

use anyhow::{bail, Context, Result};

use super::config::ModelConfig;
use super::decoder::Decoder;
use super::loader::Loader;
use super::GenerationConfig;

/// A family: which checkpoints it takes, and how it builds the network from one.
pub struct Family {
    /// config.json `model_type` values it takes.
    pub model_types: &'static [&'static str],
    /// config.json `architectures` entries it takes (when `model_type` is not one of the above).
    pub architectures: &'static [&'static str],
    /// Checks of its own config fields, after the shared ones; errors name the field and value.
    pub check: fn(&ModelConfig) -> Result<()>,
    /// The name of a tensor layer `l` has (its input norm's): how many layers a checkpoint
    /// holds is checked against `num_hidden_layers` by it, before anything is loaded.
    pub layer_tensor: fn(usize) -> String,
    /// The network from the checkpoint's tensors: embedding, layers, final norm, lm_head. A
    /// random weight source draws tensors in the order they are read (random.rs,
    /// `tensor_order`).
    pub load: fn(&ModelConfig, &Loader) -> Result<Decoder>,
    /// What the family's published `generate()` decodes with where the checkpoint's own files
    /// (generation_config.json, config.json's `block_size`, its name) say nothing: given the
    /// checkpoint's generation config and its name, defaults whose `origin` names where they
    /// come from. `None`: unmask's own defaults.
    pub decoding: fn(&GenerationConfig, Option<&str>) -> Option<GenerationConfig>,
}

pub static FAMILIES: &[Family] =
    &[super::qwen3::FAMILY, super::qwen3_moe::FAMILY, super::llada2::FAMILY];

/// Parses and checks `config.json` (`origin` names the file in errors): the fields every family
/// shares, then the family's own. Every config goes through here.
pub fn parse_config(text: &str, origin: &str) -> Result<ModelConfig> {
    let (cfg, family) = check_config(text, origin)?;
    if !family.model_types.contains(&cfg.model_type.as_str()) {
        // found by `architectures` alone: say so, a mislabelled checkpoint decodes as another
        crate::notice::warn(format!(
            "{origin}: model_type {:?} is not one unmask knows; decoding it as {} (its architectures name {})",
            cfg.model_type,
            family.model_types.join("/"),
            cfg.architectures.join(", ")
        ));
    }
    Ok(cfg)
}

/// [`parse_config`]'s checks, silent: the config and its family (`unmask models` lists many
/// checkpoints and warns of none).
pub fn check_config(text: &str, origin: &str) -> Result<(ModelConfig, &'static Family)> {
    let cfg = ModelConfig::parse_shared(text, origin)?;
    let family = family(&cfg).with_context(|| format!("{origin}: invalid config"))?;
    (family.check)(&cfg).with_context(|| format!("{origin}: invalid config"))?;
    Ok((cfg, family))
}

/// The family of `cfg`: by `model_type`, else by an entry of `architectures`.
pub fn family(cfg: &ModelConfig) -> Result<&'static Family> {
    let by_type = FAMILIES.iter().find(|f| f.model_types.contains(&cfg.model_type.as_str()));
    let by_arch = || {
        FAMILIES
            .iter()
            .find(|f| cfg.architectures.iter().any(|a| f.architectures.contains(&a.as_str())))
    };
    match by_type.or_else(by_arch) {
        Some(f) => Ok(f),
        None => {
            let known: Vec<&str> =
                FAMILIES.iter().flat_map(|f| f.model_types.iter().copied()).collect();
            bail!("field `model_type` is {:?}; supported: {}", cfg.model_type, known.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(model_type: &str, architectures: &str) -> ModelConfig {
        let text = format!(
            r#"{{"model_type":"{model_type}","architectures":[{architectures}],"vocab_size":10,"hidden_size":8,
            "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":4}}"#
        );
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn a_family_is_found_by_model_type_else_by_architecture() {
        assert!(std::ptr::eq(family(&config("sdar", "")).unwrap(), &FAMILIES[0]));
        assert!(std::ptr::eq(
            family(&config("custom", "\"Qwen3ForCausalLM\"")).unwrap(),
            &FAMILIES[0]
        ));
        let Err(e) = family(&config("llama", "\"LlamaForCausalLM\"")) else {
            panic!("llama has no family")
        };
        let e = e.to_string();
        assert!(e.starts_with("field `model_type` is \"llama\"; supported: sdar, qwen3"), "{e}");
    }
}
