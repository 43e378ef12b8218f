//! The CPU attention kernel (src/model/cpu_attention.rs) alone, at qwen3-0.6b's head geometry
//! (16 query heads, 8 KV heads, d = 128), in GFLOP/s and the cache's GB/s:
//!
//!     cargo bench --bench cpu_attention                        # the pool's threads
//!     RAYON_NUM_THREADS=1 cargo bench --bench cpu_attention    # one
//!
//! Shapes: a block pass (4 rows: 8 queries a KV head) over a cache that fits the L3 (1024 keys)
//! and over caches that do not (4k, 16k keys; six layers' caches taken in turn, as a pass takes
//! its layers); and a prefill chunk (512 rows) over 2048 keys. Figures go to docs/perf.md
//! ("This CPU").

use rayon::prelude::*;
use unmask::model::cpu_attention::Job;
use unmask::model::ops::Attention;

const HEADS: usize = 16;
const KV_HEADS: usize = 8;
const D: usize = 128;

/// Values spread over [-1, 1).
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i.wrapping_mul(104_729).wrapping_add(seed * 7919)) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// Best of 3, per layer: (ms, cache GB/s, GFLOP/s).
fn run(rows: usize, keys: usize, layers: usize) -> (f64, f64, f64) {
    let op = Attention {
        heads: HEADS,
        kv_heads: KV_HEADS,
        head_dim: D,
        keys,
        scale: 1.0 / (D as f32).sqrt(),
    };
    let q = values(HEADS * rows * D, 1);
    let caches: Vec<Vec<f32>> =
        (0..layers).map(|l| values(2 * KV_HEADS * keys * D, l + 2)).collect();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = std::time::Instant::now();
        for kv in &caches {
            let job = Job { op: &op, q: &q, kv, mask: None, t_len: rows, cap: keys };
            let s: f32 = (0..job.tasks()).into_par_iter().map(|i| job.task(i)[0]).sum();
            std::hint::black_box(s);
        }
        best = best.min(start.elapsed().as_secs_f64() / layers as f64);
    }
    let bytes = (2 * KV_HEADS * keys * D * 4) as f64;
    // two products (scores, values), 2 FLOP a multiply-add
    let flops = (HEADS * rows * keys * D * 4) as f64;
    (best * 1e3, bytes / best / 1e9, flops / best / 1e9)
}

fn main() {
    println!(
        "cpu_attention on {} threads (RAYON_NUM_THREADS), {HEADS}/{KV_HEADS} heads, d = {D}",
        rayon::current_num_threads()
    );
    println!("| shape | rows | keys | ms a layer | cache GB/s | GFLOP/s |\n|---|---:|---:|---:|---:|---:|");
    for (shape, rows, keys, layers) in [
        ("block pass, cache in L3", 4, 1024, 1),
        ("block pass", 4, 4096, 6),
        ("block pass", 4, 16384, 6),
        ("prefill chunk", 512, 2048, 1),
    ] {
        let (ms, gbs, gflops) = run(rows, keys, layers);
        println!("| {shape} | {rows} | {keys} | {ms:.2} | {gbs:.1} | {gflops:.1} |");
    }
}
