//! Writes a bf16 checkpoint of a named real shape with random weights (safetensors, the real
//! tensor names, a Qwen3 tokenizer), so the CPU benchmark runs on a real checkpoint folder
//! without a download (docs/perf.md):
//!
//!     cargo run --release --example make_checkpoint -- sdar-1.7b /tmp/sdar-1.7b-random [SEED]
//!
//! Shapes: those of `unmask bench --random-init`. The weights equal `--random-init SHAPE` with
//! the same `--seed` (default 0). SDAR-1.7B's folder takes 4.1 GB: delete it when done.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use unmask::model::random::{shape_names, write_checkpoint};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (shape, dir, seed) = match args.as_slice() {
        [s, d] => (s, PathBuf::from(d), 0),
        [s, d, seed] => (
            s,
            PathBuf::from(d),
            seed.parse().with_context(|| format!("seed `{seed}`: not a number"))?,
        ),
        _ => bail!(
            "usage: make_checkpoint SHAPE DIR [SEED]; shapes: {}",
            shape_names().collect::<Vec<_>>().join(", ")
        ),
    };
    let t0 = Instant::now();
    let bytes = write_checkpoint(shape, seed, &dir)?;
    println!(
        "{}: {shape}, seed {seed}, {:.2} GB of bf16 weights, written in {:.1} s",
        dir.display(),
        bytes as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
