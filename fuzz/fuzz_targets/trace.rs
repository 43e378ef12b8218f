//! Any bytes as a trace file: reader, store, export tables (what `unmask export` runs).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    unmask::fuzz::exercise_trace(data, false);
});
