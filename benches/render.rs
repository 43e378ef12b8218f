//! One full frame of the TUI at 10,000 decoded tokens, and the store's memory per token.
//!
//!     cargo bench --bench render
//!
//! Figures go to docs/perf.md ("The TUI").

use std::hint::black_box;

use criterion::{criterion_group, Criterion};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::Terminal;
use unmask::trace::store::Store;
use unmask::trace::synth::{self, Synth};
use unmask::tui::{self, App};

const TOKENS: usize = 10_000;
/// (block length, steps): SDAR's default, and a long block with many steps.
const SHAPES: [(usize, usize); 2] = [(4, 4), (32, 32)];

fn app(block: usize, steps: usize) -> App {
    let mut app =
        App::replay(synth::trace(&Synth::long(TOKENS, block, steps)), "bench".into(), None);
    app.on_key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE));
    app
}

fn frames(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame_10k_tokens");
    for (block, steps) in SHAPES {
        let mut a = app(block, steps);
        let area = Rect::new(0, 0, 160, 48);
        a.size = area;
        g.bench_function(format!("render_B{block}_S{steps}_160x48"), |b| {
            let mut buf = Buffer::empty(area);
            b.iter(|| {
                buf.reset();
                tui::render(black_box(&a), area, &mut buf);
            })
        });
        // After a resize (or a restart) the text view re-wraps the whole decode once.
        g.bench_function(format!("render_B{block}_S{steps}_160x48_cold_text_cache"), |b| {
            let mut buf = Buffer::empty(area);
            b.iter(|| {
                *a.text_cache.borrow_mut() = Default::default();
                buf.reset();
                tui::render(black_box(&a), area, &mut buf);
            })
        });
        // The whole draw as the loop does it: render, diff against the last frame, flush.
        // Stepping back and forth makes every frame differ from the one before.
        g.bench_function(format!("draw_B{block}_S{steps}_160x48_stepping"), |b| {
            let mut term = Terminal::new(TestBackend::new(160, 48)).unwrap();
            let mut back = true;
            b.iter(|| {
                let k = if back { KeyCode::Left } else { KeyCode::Right };
                a.on_key(KeyEvent::new(k, KeyModifiers::NONE));
                back = !back;
                term.draw(|f| tui::draw(f, &a)).unwrap();
            })
        });
    }
    g.finish();
    panels(c);
}

/// Each panel alone, to see where a frame's time goes.
fn panels(c: &mut Criterion) {
    type Panel = fn(&tui::app::View, Rect, &mut Buffer);
    let mut g = c.benchmark_group("panel_10k_tokens_B4_S4");
    let mut a = app(4, 4);
    a.size = Rect::new(0, 0, 160, 48);
    let areas = tui::layout::areas(a.size).unwrap();
    let list: [(&str, Panel, Rect); 5] = [
        ("grid", tui::grid::render, areas.grid),
        ("text", tui::text::render, areas.text),
        ("inspector", tui::inspector::render, areas.inspector),
        ("stats", tui::stats::render, areas.stats),
        ("timeline", tui::timeline::render, areas.timeline),
    ];
    for (name, panel, area) in list {
        g.bench_function(name, |b| {
            let mut buf = Buffer::empty(a.size);
            let v = a.view().unwrap();
            b.iter(|| panel(black_box(&v), area, &mut buf))
        });
    }
    g.finish();
}

/// Heap bytes the store holds per generated token.
fn memory() {
    for (block, steps) in SHAPES {
        let events = synth::trace(&Synth::long(TOKENS, block, steps));
        let store = Store::from_events(events);
        let bytes = store.heap_bytes();
        println!(
            "store memory, B={block} S={steps}: {bytes} bytes for {TOKENS} tokens = {:.1} bytes/token",
            bytes as f64 / TOKENS as f64
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(4));
    targets = frames
}

fn main() {
    memory();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
