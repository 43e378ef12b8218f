//! SDAR-MoE on the CPU against transformers' Qwen3MoeForCausalLM under SDAR's block-causal mask
//! (tests/fixtures/tiny-sdar-moe, made by gen_moe_fixture.py): the released layout loads (sharded
//! index, no block_size, mask from tokenizer_config), logits and routing equal the reference, and
//! greedy decodes equal it step for step.

mod common;

use candle_core::DType;
use common::{golden, ids, rel_err};
use unmask::model::Checkpoint;

const NAME: &str = "tiny-sdar-moe";

fn load() -> Checkpoint {
    common::load(NAME)
}

#[test]
fn the_released_layout_loads_with_sdar_defaults() {
    let ck = load();
    assert_eq!(ck.config.model_type, "sdar_moe");
    assert_eq!(ck.config.block_size, None);
    assert_eq!(ck.tokenizer.mask_id(), ck.tokenizer.token_to_id("<|MASK|>").unwrap());
    assert_eq!(ck.mask_source, "tokenizer_config.json mask_token \"<|MASK|>\"");
    assert!(!ck.config.is_sparse(0) && ck.config.is_sparse(1) && ck.config.is_sparse(2));
    assert_eq!(ck.info.num_params, ck.config.num_params());
}

#[test]
fn logits_and_routing_match_transformers() {
    let ck = load();
    let g = golden(NAME);
    let prompt = ids(&g["prefill_ids"]);
    let mut cache = ck.model.new_cache(16).unwrap();
    let (h, routing) = ck.model.forward_routed(&prompt, &mut cache, 4, prompt.len()).unwrap();
    let e = rel_err(&ck.model.logits(&h).unwrap(), &g["prefill_logits"]);
    assert!(e <= 1e-4, "prefill logits rel err {e:e}");
    // [positions, sparse layers, k]
    let experts = g["prefill_experts"].to_dtype(DType::I64).unwrap().to_vec3::<i64>().unwrap();
    let weights = g["prefill_expert_weights"].to_vec3::<f32>().unwrap();
    assert_eq!(routing.iter().map(|r| r.layer).collect::<Vec<_>>(), vec![1, 2]);
    for (s, layer) in routing.iter().enumerate() {
        for (p, route) in layer.rows.iter().enumerate() {
            let want: Vec<u32> = experts[p][s].iter().map(|&e| e as u32).collect();
            assert_eq!(route.experts, want, "layer {} position {p}", layer.layer);
            for (got, want) in route.weights.iter().zip(&weights[p][s]) {
                assert!(
                    (got - want).abs() <= 1e-5,
                    "layer {} position {p}: weight {got} vs {want}",
                    layer.layer
                );
            }
        }
    }
    let mut cache = ck.model.new_cache(16).unwrap();
    ck.model.forward(&prompt[..8], &mut cache, 4, 8).unwrap();
    let h = ck.model.forward(&ids(&g["denoise_ids"]), &mut cache, 4, 0).unwrap();
    let e = rel_err(&ck.model.logits(&h).unwrap(), &g["denoise_logits"]);
    assert!(e <= 1e-4, "denoise logits rel err {e:e}");
}

#[test]
fn greedy_decodes_match_the_reference_step_for_step() {
    common::assert_golden_decodes("golden_decodes_moe.json", |model| {
        assert_eq!(model, NAME);
        load()
    });
}
