//! Property tests over untrusted input (a few thousand cases, seconds): mutated traces through
//! everything `export` and `replay --cast` do, config.json with hostile sizes, and safetensors
//! files with mutated headers. The property is the same each time: an error or a result,
//! never a panic, and no result that breaks the promises the readers make.
//! The long runs: `cargo run --release --example fuzz_traces -- 100000`, and fuzz/ (cargo fuzz).

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::read_to_string(p).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_traces_read_store_and_export_without_panicking(seed in any::<u64>(), which in 0usize..3) {
        let base = fixture(["traces/tiny-dynamic.jsonl", "traces/compare-a.jsonl", "traces/compare-b.jsonl"][which]);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let text = unmask::fuzz::mutate_trace_n(&base, &mut rng);
        // One case in 30 is also drawn, frame by frame, as `replay --cast` draws it.
        unmask::fuzz::exercise_trace(text.as_bytes(), seed % 30 == 0);
    }

    /// The trace with token edits, mutated: edits of masked, prompt or foreign positions, from
    /// tokens not held, steps out of place; read, stored, exported and drawn without a panic.
    #[test]
    fn mutated_traces_with_edits_read_store_and_export_without_panicking(seed in any::<u64>()) {
        let base = fixture("traces/edits.jsonl");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let text = unmask::fuzz::mutate_trace_n(&base, &mut rng);
        unmask::fuzz::exercise_trace(text.as_bytes(), seed % 30 == 0);
    }

    #[test]
    fn arbitrary_bytes_are_never_a_trace_that_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        unmask::fuzz::exercise_trace(&bytes, false);
    }
}

const CONFIG: &str = r#"{"model_type":"sdar","vocab_size":354,"hidden_size":64,"intermediate_size":160,
    "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
    "max_position_embeddings":1024,"rms_norm_eps":1e-6,"rope_theta":1e6,"block_size":4,"mask_token_id":353}"#;

const FIELDS: [&str; 12] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "block_size",
    "mask_token_id",
];

/// The sizes config.json may not exceed, written out here rather than taken from the checks,
/// so that a size the checks forget fails this test.
const BOUNDS: [(&str, usize); 8] = {
    use unmask::limits::*;
    [
        ("vocab_size", MAX_VOCAB),
        ("hidden_size", MAX_HIDDEN),
        ("intermediate_size", MAX_INTERMEDIATE),
        ("num_hidden_layers", MAX_LAYERS),
        ("num_attention_heads", MAX_HEADS),
        ("num_key_value_heads", MAX_KV_HEADS),
        ("head_dim", MAX_HEAD_DIM),
        ("max_position_embeddings", MAX_POSITIONS),
    ]
};

fn number() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        any::<u64>().prop_map(serde_json::Value::from),
        (0u64..5000).prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map_or(serde_json::Value::Null, serde_json::Value::Number)),
        Just(serde_json::Value::from("12")),
        Just(serde_json::Value::Null),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn configs_with_hostile_sizes_parse_into_bounded_shapes_or_errors(
        edits in proptest::collection::vec((0usize..FIELDS.len(), number()), 1..4)
    ) {
        let mut v: serde_json::Value = serde_json::from_str(CONFIG).unwrap();
        for (f, n) in &edits {
            v[FIELDS[*f]] = n.clone();
        }
        match unmask::model::registry::parse_config(&v.to_string(), "config.json") {
            Err(e) => {
                let e = format!("{e:#}");
                prop_assert!(e.starts_with("config.json: invalid config: "), "{}", e);
                prop_assert_eq!(e.lines().count(), 1);
            }
            Ok(c) => {
                // Within the bounds, so every size derived from them is computable.
                for (field, max) in BOUNDS {
                    let got = v[field].as_u64().unwrap_or(0);
                    prop_assert!(got <= max as u64, "{} = {}", field, got);
                }
                prop_assert!(c.rope_theta > 0.0 && c.rms_norm_eps > 0.0);
                let _ = c.num_params();
            }
        }
    }
}

/// A safetensors file of two small f32 tensors, for the header mutations below.
fn safetensors_file() -> Vec<u8> {
    let header = r#"{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"F32","shape":[4],"data_offsets":[24,40]}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend((0..10).flat_map(|i| (i as f32).to_le_bytes()));
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn safetensors_with_mutated_headers_load_or_error(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        len in proptest::option::of(any::<u64>()),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut bytes = safetensors_file();
        if let Some(l) = len {
            bytes[..8].copy_from_slice(&l.to_le_bytes());
        }
        for (i, b) in &flips {
            let at = i.index(bytes.len());
            bytes[at] = *b;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len() + 1));
        }
        let dev = candle_core::Device::Cpu;
        match unmask::model::weights::Weights::from_vec("m.safetensors", bytes) {
            Err(e) => prop_assert!(format!("{e:#}").starts_with("m.safetensors: "), "{:#}", e),
            Ok(w) => {
                for (name, shape) in [("a", vec![2usize, 3]), ("b", vec![4])] {
                    if w.contains(name) {
                        let _ = w.get(name, &shape, candle_core::DType::F32, &dev);
                    }
                }
                let _ = w.stored_dtype();
            }
        }
    }
}
