//! The CPU's bf16 projections (src/model/linear.rs, bf16_products.rs) alone: one pass's
//! products of qwen3-0.6b (28 layers of q|k|v, o, gate|up and down, then the tied lm_head),
//! f32 and bf16 products, 4 rows (a denoising pass), 8 (a storing pass) and 64, against the
//! host's read bandwidth measured in the same run:
//!
//!     cargo bench --bench cpu_linear
//!
//! What the rest of a pass costs is the difference between this and `unmask bench`.

use unmask::cli::commands::bench::host_read_bandwidth;
use unmask::model::linear::Bf16Panels;
use unmask::model::Products;

const LAYERS: usize = 28;
/// (out, in) of a layer's projections, then lm_head.
const LAYER: [(usize, usize); 4] = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)];
const HEAD: (usize, usize) = (151_936, 1024);

fn weights(out: usize, inp: usize, products: Products, seed: usize) -> Bf16Panels {
    let bits: Vec<u16> = (0..out * inp)
        .map(|i| 0x3c00 + ((i.wrapping_mul(2_654_435_761) ^ seed) % 0x700) as u16)
        .collect();
    Bf16Panels::from_out_in(&bits, out, inp, products)
}

fn main() {
    let bw = host_read_bandwidth();
    println!(
        "cpu_linear on {} threads: read bandwidth {:.1} GB/s",
        rayon::current_num_threads(),
        bw / 1e9
    );
    println!("| products | rows | ms a pass | GB read | read floor ms | x floor |\n|---|---:|---:|---:|---:|---:|");
    for products in [Products::F32, Products::Bf16] {
        let layers: Vec<Vec<Bf16Panels>> = (0..LAYERS)
            .map(|l| {
                LAYER
                    .iter()
                    .enumerate()
                    .map(|(j, &(o, i))| weights(o, i, products, l * 4 + j))
                    .collect()
            })
            .collect();
        let head = weights(HEAD.0, HEAD.1, products, 999);
        let bytes: usize = layers.iter().flatten().chain([&head]).map(|p| p.bytes()).sum();
        for rows in [4, 8, 64] {
            let x: Vec<f32> = (0..rows * 3072).map(|i| ((i % 17) as f32 - 8.0) / 16.0).collect();
            let pass = || {
                for l in &layers {
                    for p in l {
                        std::hint::black_box(p.matmul(&x[..rows * p.inputs()], rows));
                    }
                }
                std::hint::black_box(head.matmul(&x[..rows.min(4) * 1024], rows.min(4)));
            };
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = std::time::Instant::now();
                rayon::scope(|_| pass()); // on the pool, as the engine runs a pass
                best = best.min(t.elapsed().as_secs_f64());
            }
            let floor = bytes as f64 / bw;
            println!(
                "| {products:?} | {rows} | {:.1} | {:.2} | {:.1} | {:.2} |",
                best * 1e3,
                bytes as f64 / 1e9,
                floor * 1e3,
                best / floor
            );
        }
    }
}
