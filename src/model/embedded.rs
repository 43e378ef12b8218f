//! The tiny SDAR model compiled into the binary (assets/tiny-sdar/, trained by
//! assets/recipe/), so `unmask` runs with no download and no flags. It loads through the same
//! code path as `--model DIR`.

use anyhow::Result;

use crate::model::Embedded;

macro_rules! asset {
    ($name:literal) => {
        (
            $name,
            include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/tiny-sdar/", $name))
                as &[u8],
        )
    };
}

static TINY_SDAR: Embedded = Embedded {
    name: "tiny-sdar",
    files: &[
        asset!("config.json"),
        asset!("generation_config.json"),
        asset!("model.safetensors"),
        asset!("tokenizer.json"),
        asset!("tokenizer_config.json"),
    ],
};

pub fn default_model() -> Result<&'static Embedded> {
    Ok(&TINY_SDAR)
}
