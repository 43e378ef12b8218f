//! `--routing` on the tiny SDAR-MoE fixture against transformers' router
//! (tests/fixtures/golden_routing_moe.json, made by gen_moe_routing.py): every committed
//! position's experts and weights in each sparse layer, from the pass that committed it, and the
//! distinct experts each step's pass read. Routing changes nothing else in the decode, and the
//! trace round-trips it.

mod common;

use candle_core::{DType, Device};
use serde::Deserialize;
use unmask::engine::settings::DecodeSettings;
use unmask::engine::{decode, ModelDenoiser, Request};
use unmask::trace::events::{Event, StepEvent};

use common::{cases, fixture, load, request, run_case};

#[derive(Deserialize)]
struct Golden {
    name: String,
    sparse_layers: Vec<usize>,
    steps: Vec<GoldenStep>,
}

#[derive(Deserialize)]
struct GoldenStep {
    block: usize,
    step: usize,
    distinct: Vec<u32>,
    committed: Vec<GoldenCommit>,
}

#[derive(Deserialize)]
struct GoldenCommit {
    pos: usize,
    experts: Vec<Vec<u32>>,
    weights: Vec<Vec<f32>>,
}

fn step_events(events: &[Event]) -> Vec<&StepEvent> {
    events.iter().filter_map(|e| if let Event::Step(s) = e { Some(s) } else { None }).collect()
}

#[test]
fn routes_match_the_reference_router_step_for_step() {
    let cases = cases("golden_decodes_moe.json");
    let goldens: Vec<Golden> =
        serde_json::from_str(&std::fs::read_to_string(fixture("golden_routing_moe.json")).unwrap())
            .unwrap();
    assert_eq!(goldens.len(), 3);
    for g in &goldens {
        let case = cases.iter().find(|c| c.name == g.name).unwrap();
        let events = run_case(case, load("tiny-sdar-moe"), true);
        let Event::Header(h) = &events[0] else { panic!("no header") };
        let moe = h.model.moe.as_ref().expect("the header carries the routing layout");
        assert_eq!(
            (moe.sparse_layers.as_slice(), moe.experts, moe.top_k),
            (g.sparse_layers.as_slice(), 8, 3)
        );
        let steps = step_events(&events);
        assert_eq!(steps.len(), g.steps.len(), "case {}", g.name);
        for (s, want) in steps.iter().zip(&g.steps) {
            let at = format!("case {} block {} step {}", g.name, s.block, s.step);
            assert_eq!((s.block, s.step), (want.block, want.step), "{at}");
            assert_eq!(s.distinct_experts, want.distinct, "{at}: distinct experts");
            assert_eq!(s.committed.len(), want.committed.len(), "{at}");
            for (c, w) in s.committed.iter().zip(&want.committed) {
                assert_eq!(c.pos, w.pos, "{at}");
                assert_eq!(c.routes.len(), g.sparse_layers.len(), "{at} pos {}", c.pos);
                for (l, r) in c.routes.iter().enumerate() {
                    assert_eq!(
                        r.experts, w.experts[l],
                        "{at} pos {} layer {}",
                        c.pos, g.sparse_layers[l]
                    );
                    for (got, want) in r.weights.iter().zip(&w.weights[l]) {
                        assert!(
                            (got - want).abs() <= 1e-5,
                            "{at} pos {}: weight {got} vs {want}",
                            c.pos
                        );
                    }
                }
            }
        }
    }
}

/// Off by default and free: the same decode without any routing field; on, the same decode with
/// them, and a trace file carries them back unchanged.
#[test]
fn routing_changes_nothing_else_and_round_trips_through_a_trace() {
    let cases = cases("golden_decodes_moe.json");
    let case = cases.iter().find(|c| c.name == "p8_s4_static_lmdeploy").unwrap();
    let (on, off) =
        (run_case(case, load("tiny-sdar-moe"), true), run_case(case, load("tiny-sdar-moe"), false));
    assert_eq!(on.len(), off.len());
    for (a, b) in step_events(&on).into_iter().zip(step_events(&off)) {
        assert!(b.distinct_experts.is_empty() && b.committed.iter().all(|c| c.routes.is_empty()));
        let mut stripped = a.clone();
        stripped.distinct_experts.clear();
        stripped.committed.iter_mut().for_each(|c| c.routes.clear());
        stripped.t_ms = b.t_ms;
        assert_eq!(&stripped, b);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routed.jsonl");
    let text: String = on.iter().map(|e| serde_json::to_string(e).unwrap() + "\n").collect();
    std::fs::write(&path, text).unwrap();
    let read = unmask::trace::file::read_file(&path).unwrap();
    assert_eq!(read.stopped, None);
    // What routing adds, exactly (`t_ms` may read back a unit in the last place off).
    let routing = |s: &StepEvent| (s.distinct_experts.clone(), s.committed.clone());
    let back: Vec<_> = step_events(&read.events).into_iter().map(routing).collect();
    assert_eq!(back, step_events(&on).into_iter().map(routing).collect::<Vec<_>>());
    assert!(back.iter().all(|(d, c)| d.len() == 2 && c.iter().all(|c| c.routes.len() == 2)));
}

/// Token ids as `<id>`: the random model below has no tokenizer.
struct Ids;

impl unmask::engine::Detok for Ids {
    fn piece(&self, id: u32) -> String {
        format!("<{id}>")
    }
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|&i| self.piece(i)).collect()
    }
}

/// The GPU's path on the CPU: passes replayed from fixed buffers through the streamed layer
/// read their routes back from the device routing tables. They must be the eager pass's routes
/// (both bf16 streamed layers; the fixed pass attends over the whole cache under a mask). The
/// streamed layer's kernels need real widths, so this is a small random MoE, not the fixture.
#[test]
fn fixed_streamed_passes_report_the_eager_passes_routes() {
    use unmask::engine::RunOptions;
    use unmask::model::random::RandomWeights;
    use unmask::model::Model;
    let cfg = unmask::model::random::three_layer_moe((256, 4, 2, 1000, 512), (8, 3, 64));
    let mask = 999;
    let run = |opts: RunOptions| {
        let mut w = RandomWeights::on_host(&cfg, 9);
        w.std = 0.05; // routes that differ row to row
        let mut model = Model::load(&cfg, &w, DType::BF16, &Device::Cpu).unwrap();
        model.use_row_weights().unwrap();
        let info = unmask::trace::events::ModelInfo {
            source: "random".into(),
            model_type: cfg.model_type.clone(),
            vocab_size: 1000,
            hidden_size: 256,
            num_layers: 3,
            num_params: cfg.num_params(),
            dtype: "bf16".into(),
            compute: None,
            moe: cfg.moe_info(),
        };
        let settings = DecodeSettings {
            block_length: 4,
            steps: 4,
            max_new_tokens: 12,
            ..DecodeSettings::default()
        };
        let req =
            Request { routing: true, ..request(&[11, 12, 13, 14, 15, 16], settings, mask, info) };
        let mut den = ModelDenoiser::with_options(model, mask, opts);
        let mut events = vec![];
        decode(&mut den, &Ids, &req, &mut |e| events.push(e), None);
        (events, den.status())
    };
    let (fixed, status) =
        run(RunOptions { device_sampler: true, fixed_passes: true, cuda_graph: false });
    assert!(status.streamed_layer, "the fixed passes must run the streamed layer");
    let (eager, _) = run(RunOptions::reference());
    let (a, b) = (step_events(&fixed), step_events(&eager));
    assert!(a.len() >= 3 && a.len() == b.len());
    let mut routes = 0;
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.distinct_experts, y.distinct_experts, "block {} step {}", x.block, x.step);
        assert_eq!(x.distinct_experts.len(), 2);
        for (p, q) in x.committed.iter().zip(&y.committed) {
            assert_eq!((p.pos, p.token), (q.pos, q.token));
            assert_eq!(p.routes.len(), 2);
            for (r, s) in p.routes.iter().zip(&q.routes) {
                assert_eq!(r.experts, s.experts, "pos {}", p.pos);
                assert!(
                    r.weights.iter().zip(&s.weights).all(|(u, v)| (u - v).abs() < 2e-2),
                    "{r:?} vs {s:?}"
                );
                routes += 1;
            }
        }
    }
    // Positions 6..20: blocks 1 to 4, the last cells past max_new_tokens decoded too.
    assert_eq!(routes, 2 * 14);
}
