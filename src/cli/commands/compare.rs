//! `unmask compare`: the same prompt decoded under two settings, compared.

use anyhow::{bail, Context, Result};

use crate::cli::session::Session;
use crate::cli::DecodeArgs;
use crate::engine::{decode, EngineThread};
use crate::trace::compare::{compare, table};
use crate::trace::events::{Event, FinishReason};
use crate::tui::compare::CompareApp;
use crate::tui::theme::Theme;

/// Decodes one side to the end and returns its events.
pub fn decode_side(args: &DecodeArgs, side: &str) -> Result<Vec<Event>> {
    let mut s = open_side(args, side)?;
    let mut events = Vec::new();
    let fin = decode(&mut s.denoiser, &s.tokenizer, &s.request, &mut |e| events.push(e), None);
    if fin.reason == FinishReason::Error {
        bail!("decode {side} failed: {}", fin.error.unwrap_or_default());
    }
    Ok(events)
}

/// One side's session; its settings' errors say which side (its `--steps-a` is reported as
/// the `--steps` it set).
fn open_side(args: &DecodeArgs, side: &str) -> Result<Session> {
    Session::open(args).with_context(|| format!("side {side}"))
}

/// Compare is greedy unless a temperature is given (`--temperature`, `--temperature-a/-b`):
/// a checkpoint's sampling default (the embedded model's is 0.7) would make the two sides
/// also differ by their random draws, which hides what the settings change. A side that does
/// sample is announced in the comparison.
pub fn greedy_unless_given(args: &DecodeArgs) -> DecodeArgs {
    DecodeArgs { temperature: args.temperature.or(Some(0.0)), ..args.clone() }
}

pub fn headless(a: &DecodeArgs, b: &DecodeArgs, as_json: bool) -> Result<()> {
    let ea = decode_side(&greedy_unless_given(a), "A")?;
    let eb = decode_side(&greedy_unless_given(b), "B")?;
    let c = compare(&ea, &eb);
    if as_json {
        // the texts as decoded (JSON escapes what a terminal must not see)
        let text = |e: &[Event]| match e.last() {
            Some(Event::Finish(f)) => f.text.clone(),
            _ => String::new(),
        };
        let v = crate::trace::compare::json(&c, [&text(&ea), &text(&eb)]);
        return crate::cli::output::print(&format!("{v}\n"));
    }
    let (ta, tb) = (output_text(&ea), output_text(&eb));
    crate::cli::output::print(&table(&c, [&ta, &tb]))
}

/// A side's output as a person reads it, the TUI's way: invalid UTF-8 as hex (`<F2>`), control
/// characters as visible stand-ins (a token's ESC must not drive the terminal), line breaks
/// kept. The finish event's `text` is a lossy decode, U+FFFD for invalid bytes.
fn output_text(events: &[Event]) -> String {
    use crate::glyph::{escape, Mode};
    use crate::trace::detok::{settled, End};
    let store = crate::trace::store::Store::from_events(events.iter().cloned());
    let (Some(run), Some(Event::Finish(f))) = (store.run(), events.last()) else {
        return String::new();
    };
    let bytes: Vec<u8> = f.output_ids.iter().flat_map(|&t| run.token_bytes(t).to_vec()).collect();
    let (texts, _) = settled(&[], &[&bytes], End::Final);
    texts.first().map_or(String::new(), |t| t.render(|s| escape(s, Mode::Prose).into_owned()))
}

/// The compare TUI: one engine per side (each loads the checkpoint), both decoding live.
pub fn tui(
    a: &DecodeArgs,
    b: &DecodeArgs,
    theme: &'static Theme,
    pace: crate::tui::cursor::Pace,
) -> Result<()> {
    super::tui::require_terminal()?;
    let (ea, ra) = spawn(&greedy_unless_given(a), "A")?;
    let (eb, rb) = spawn(&greedy_unless_given(b), "B")?;
    let mut app = CompareApp::paced(pace, std::time::Instant::now());
    // Each side draws its panels with the theme too (--mono's step marks in the cells).
    app.theme = theme;
    app.sides.iter_mut().for_each(|s| s.theme = theme);
    let result = serve(&mut app, [Some(ra), Some(rb)]);
    // The engines drop after the screen is restored: that cancels their decodes.
    drop((ea, eb));
    result?;
    for (side, app) in ["A", "B"].iter().zip(&app.sides) {
        if let Some(err) = app.decode_error() {
            bail!("decode {side} failed: {err}");
        }
    }
    Ok(())
}

type Events = crate::cli::session::EventRx;

fn spawn(args: &DecodeArgs, side: &str) -> Result<(EngineThread, Events)> {
    let (engine, request, rx) = open_side(args, side)?.spawn();
    engine.submit(request);
    Ok((engine, rx))
}

fn serve(app: &mut CompareApp, events: [Option<Events>; 2]) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    let mut guard = crate::tui::terminal::Guard::enter()?;
    let (_signals, input) = crate::tui::terminal::input()?;
    // Compare cannot steer its engines: it asks nothing of them.
    let result =
        rt.block_on(crate::tui::run(&mut guard.terminal, app, events, input, &mut |never| {
            match never {}
        }));
    drop(guard);
    result
}
