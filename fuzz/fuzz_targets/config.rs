//! Any text as config.json: parsed and checked, or refused; a parsed one has computable sizes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(c) = unmask::model::ModelConfig::parse(text, "config.json") {
            let _ = (c.num_params(), c.head_dim(), c.kv_heads());
        }
    }
});
