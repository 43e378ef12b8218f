//! The reference sampler (src/sampler/mod.rs) on one row of Qwen3's 151,936-token vocabulary, as
//! the CPU path samples every row of every pass: greedy, SDAR-Chat's generation config
//! (temperature 0.6, top-k 20, top-p 0.95), and plain temperature 1.0 (no top-k: the whole
//! vocabulary in order), each with and without 16 ranked candidates (the inspector's list):
//!
//!     cargo bench --bench sampler
//!
//! Logits are a model's shape of row: most tokens far below a few likely ones.

use std::time::Instant;

use unmask::engine::settings::{SamplerSpec, Sampling};
use unmask::sampler::sample_ranked;

const VOCAB: usize = 151_936;

fn row(seed: u64) -> Vec<f32> {
    let mut h = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..VOCAB)
        .map(|i| {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            let u = (h >> 40) as f32 / (1u64 << 24) as f32;
            // a normal-ish bulk around -4, a handful of likely tokens near +12
            if i % 9973 == 0 {
                10.0 + 4.0 * u
            } else {
                -4.0 + 6.0 * (u - 0.5)
            }
        })
        .collect()
}

fn main() {
    let rows: Vec<Vec<f32>> = (0..8).map(row).collect();
    let settings = [
        ("greedy", Sampling::default()),
        (
            "T 0.6, top-k 20, top-p 0.95",
            Sampling { temperature: 0.6, top_k: 20, top_p: 0.95, seed: 0 },
        ),
        ("T 1.0", Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 0 }),
    ];
    println!("| sampling | candidates | us a row (median of 9 x 8 rows) |\n|---|---:|---:|");
    for (name, s) in settings {
        for k in [0, 16] {
            let mut times: Vec<f64> = (0..9)
                .map(|_| {
                    let t = Instant::now();
                    for (i, r) in rows.iter().enumerate() {
                        std::hint::black_box(sample_ranked(
                            r,
                            &SamplerSpec::from(s),
                            0.1 * i as f32 + 0.05,
                            k,
                        ));
                    }
                    t.elapsed().as_secs_f64() * 1e6 / rows.len() as f64
                })
                .collect();
            times.sort_by(f64::total_cmp);
            println!("| {name} | {k} | {:.0} |", times[4]);
        }
    }
}
