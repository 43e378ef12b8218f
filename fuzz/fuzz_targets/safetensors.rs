//! Any bytes as a safetensors file: indexed and every tensor loaded, or refused.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(w) = unmask::model::weights::Weights::from_vec("m.safetensors", data.to_vec()) else { return };
    let _ = w.stored_dtype();
});
