//! The long local fuzz run of docs/reliability.md: N mutated traces (from the fixtures under
//! tests/fixtures/traces) through the trace reader, the store, export's tables and, for one in
//! 20, the TUI's screens as `replay --cast` draws them.
//!
//!     cargo run --release --example fuzz_traces -- 100000 [seed]
//!
//! A panic ends the run (exit 101) with its message (the same seed reproduces it);
//! a case that takes more than 10 s is reported as a hang and the run exits 2.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(100_000, |a| a.parse().expect("N: a number of mutants"));
    let seed: u64 = args.next().map_or(1, |a| a.parse().expect("seed: a number"));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces");
    let mut bases = Vec::new();
    for f in std::fs::read_dir(&dir).expect("the fixture traces") {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|e| e == "jsonl") {
            bases.push(std::fs::read_to_string(&p).unwrap());
        }
    }
    // Watchdog: the main loop bumps `done`; no progress for 10 s is a hang.
    let done = Arc::new(AtomicU64::new(0));
    let seen = done.clone();
    std::thread::spawn(move || {
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(Duration::from_secs(10));
            let now = seen.load(Ordering::SeqCst);
            if now == last {
                eprintln!("HANG: mutant {now} (seed {seed}) made no progress for 10 s");
                std::process::exit(2);
            }
            last = now;
        }
    });
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let start = Instant::now();
    let (mut readable, mut events, mut slowest) = (0u64, 0u64, Duration::ZERO);
    for i in 0..n {
        let base = &bases[(i as usize) % bases.len()];
        let text = unmask::fuzz::mutate_trace_n(base, &mut rng);
        let t0 = Instant::now();
        let got = unmask::fuzz::exercise_trace(text.as_bytes(), i % 20 == 0);
        slowest = slowest.max(t0.elapsed());
        readable += (got > 0) as u64;
        events += got as u64;
        done.store(i + 1, Ordering::SeqCst);
    }
    println!(
        "{n} mutants (seed {seed}) in {:.1} s: {readable} read back ({events} events), \
         slowest case {:.1} ms; no panic, no hang",
        start.elapsed().as_secs_f64(),
        slowest.as_secs_f64() * 1e3
    );
}
