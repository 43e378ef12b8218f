//! The tiny SDAR model compiled into the binary (assets/tiny-sdar/), so `unmask` runs with no
//! download and no flags. It loads through the same code path as `--model DIR`.

use anyhow::Result;

use crate::model::Embedded;

pub fn default_model() -> Result<&'static Embedded> {
    anyhow::bail!("this build has no embedded model yet; pass --model DIR")
}
