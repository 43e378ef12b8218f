//! The title bar (what is being watched, and the state of the decode) and the footer (the last
//! message, or where a trace stopped, and the key hints).

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};

use super::app::{App, Level, Source, View};
use super::fields::{self, Field};
use super::theme::Theme;
use crate::glyph::{self, Mode};
use crate::trace::events::FinishReason;

/// `131712` → `131.7K`, `1_700_000_000` → `1.7B`.
pub fn human(n: usize) -> String {
    let n = n as f64;
    match n {
        n if n >= 1e9 => format!("{:.1}B", n / 1e9),
        n if n >= 1e6 => format!("{:.1}M", n / 1e6),
        n if n >= 1e3 => format!("{:.1}K", n / 1e3),
        n => format!("{n}"),
    }
}

fn brand<'a>(t: &Theme) -> Span<'a> {
    Span::styled(
        " unmask ",
        Style::default().fg(t.prompt_bg).bg(t.accent).add_modifier(Modifier::BOLD),
    )
}

/// Draws `left` and `right` on one line, the right part winning when space runs out.
fn split_line(area: Rect, buf: &mut Buffer, left: &Line, right: &Line) {
    let rw = (right.width() as u16).min(area.width);
    buf.set_line(area.x, area.y, left, area.width.saturating_sub(rw + 1));
    buf.set_line(area.right() - rw, area.y, right, rw);
}

/// The dtype the decode runs in, and (`long`) the weights' where they differ: `f32 (bf16
/// weights)` for a bf16 checkpoint decoded in f32 on the CPU. A trace that predates the
/// compute dtype gives the weights' alone.
fn dtype_words(m: &crate::trace::events::ModelInfo, long: bool) -> String {
    match m.compute.as_deref() {
        Some(c) if c != m.dtype && long => format!("{c} ({} weights)", m.dtype),
        Some(c) => c.to_string(),
        None => m.dtype.clone(),
    }
}

/// The checkpoint as the title names it: a hub id's commit shortened to 7 characters, a long
/// path to its last 32 columns, so that the prompt keeps room.
fn source_label(source: &str) -> String {
    let short = match source.split_once('@') {
        Some((id, commit)) if commit.len() > 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()) => {
            format!("{id}@{}", &commit[..7])
        }
        _ => source.to_string(),
    };
    glyph::fit_end(&glyph::escape_line(&short), 32).into_owned()
}

/// The title: the checkpoint, its size and device, the prompt, and the state of the decode at
/// the right. Every part gets a fair share: narrow, the replay's path shortens to its file
/// name, the checkpoint's name and the model's figures shorten, then go, before the prompt
/// does; whatever is cut ends in `…` (the prompt's quote closes after it).
pub fn title(v: &View, area: Rect, buf: &mut Buffer) {
    let t = v.theme;
    let h = &v.run.header;
    let m = &h.model;
    let width = area.width as usize;
    let source = source_label(&m.source);
    let dim = |s: String| vec![Span::styled(s, t.dim())];
    let prompt = glyph::escape(h.shown_prompt(), Mode::Prose).replace('\n', "↵");
    // The prompt's share: what it needs up to 24 columns; it takes whatever is left after.
    let share = glyph::width(&prompt).min(24) + 2;
    let fields = vec![
        Field::new(vec![brand(t)]),
        Field::new(vec![Span::styled(format!(" {source} "), t.value())])
            .or(3, vec![Span::styled(format!(" {} ", glyph::fit_end(&source, 16)), t.value())])
            .drop_at(6),
        Field::new(dim(format!(
            "{} · {} params · {} · {}",
            m.model_type,
            human(m.num_params),
            dtype_words(m, true),
            h.device
        )))
        .or(
            2,
            dim(format!(
                "{} · {} · {} · {}",
                m.model_type,
                human(m.num_params),
                dtype_words(m, false),
                h.device
            )),
        )
        .or(4, dim(format!("{} · {}", m.model_type, human(m.num_params))))
        .drop_at(5),
        Field::new(vec![Span::styled("   prompt ", t.label()), Span::raw(" ".repeat(share))])
            .or(5, vec![Span::raw("  "), Span::raw(" ".repeat(share))])
            .drop_at(7),
        state(v),
    ];
    let (mut chosen, _) = fields::choose(fields, 0, width.saturating_sub(1));
    let right = Line::from(chosen.pop().flatten().unwrap_or_default());
    let mut left: Vec<Span> = Vec::new();
    let prompt_at = chosen.len() - 1;
    for (i, f) in chosen.into_iter().enumerate() {
        let Some(mut f) = f else { continue };
        if i == prompt_at {
            // The prompt's placeholder gives way to the prompt, in all the room left.
            f.pop();
            let used = left.iter().chain(&f).map(Span::width).sum::<usize>() + right.width() + 1;
            let room = width.saturating_sub(used).min(62);
            let (cut, _) = glyph::fit(&prompt, room.saturating_sub(2));
            f.push(Span::styled(format!("\"{cut}\""), Style::default().fg(t.prompt_fg)));
        }
        left.extend(f);
    }
    let left = fields::cut_words(Line::from(left), width.saturating_sub(right.width() + 1));
    split_line(area, buf, &left, &right);
}

/// What the decode is doing: decoding, paused, finished (and why), restarting; and what it
/// is: live, a replay of a trace (its path, or only its file name when narrow), recorded.
fn state<'a>(v: &View) -> Field<'a> {
    let t = v.theme;
    let bold = |c| Style::default().fg(c).add_modifier(Modifier::BOLD);
    let mut s = Vec::new();
    match &v.app.source {
        Source::Live { restarting: true, .. } => s.push(Span::styled("restarting… ", bold(t.warn))),
        Source::Live { engine_paused: true, .. } if v.run.finish.is_none() => {
            s.push(Span::styled("engine paused ", bold(t.warn)))
        }
        _ => {}
    }
    s.push(match &v.run.finish {
        None if v.app.is_live() => Span::styled("decoding ", bold(t.accent)),
        None => Span::styled("unfinished ", bold(t.warn)),
        Some(f) => {
            let (word, c) = match f.reason {
                FinishReason::Eos => ("finished: eos", t.accent),
                FinishReason::Length => ("finished: length", t.accent),
                FinishReason::Stop => ("finished: stop text", t.accent),
                FinishReason::Cancelled => ("cancelled", t.warn),
                FinishReason::Error => ("engine error", t.error),
            };
            Span::styled(format!("{word} "), bold(c))
        }
    });
    let with = |tail: String| {
        let mut l = s.clone();
        l.push(Span::styled(tail, t.dim()));
        l
    };
    match &v.app.source {
        Source::Live { .. } => Field::new(with("· live ".into())),
        Source::Replay { .. } if v.app.recorded_live => Field::new(with("· recorded ".into())),
        Source::Replay { path, .. } => {
            let name = std::path::Path::new(path)
                .file_name()
                .map_or(path.clone(), |n| n.to_string_lossy().into_owned());
            let name = glyph::escape_line(&name).into_owned();
            Field::new(with(format!("· replay {} ", glyph::escape_line(path))))
                .or(1, with(format!("· replay {name} ")))
                .or(3, with(format!("· replay {} ", glyph::fit_end(&name, 16))))
                .or(6, s.clone())
        }
    }
}

/// The hints a live screen shows, in the order shown, each with the rank at which it goes
/// when the footer is narrow or a message takes the room: a hint goes whole, never cut, and
/// `? help` (which lists them all) goes last.
const HINTS: &[(&str, u8)] = &[
    ("? help", 9),
    ("space pause", 6),
    ("←→ step", 7),
    ("[] block", 4),
    ("g go to", 5),
    ("m strategy", 2),
    ("R restart", 1),
    ("q quit", 8),
];
/// A replay has no engine: only keys that work there.
const REPLAY_HINTS: &[(&str, u8)] = &[
    ("? help", 9),
    ("space pause", 6),
    ("←→ step", 7),
    ("[] block", 4),
    ("g go to", 5),
    ("+- pace", 3),
    ("q quit", 8),
];

/// The hints that fit in `room` columns, two spaces apart: whole hints, least useful gone first.
fn hints_line(hints: &[(&'static str, u8)], room: usize) -> String {
    let fields =
        hints.iter().map(|&(h, rank)| Field::new(vec![Span::raw(h)]).drop_at(rank)).collect();
    let (chosen, _) = fields::choose(fields, 2, room);
    let kept: Vec<String> = chosen
        .into_iter()
        .flatten()
        .map(|f| f.iter().map(|s| s.content.as_ref()).collect())
        .collect();
    kept.join("  ")
}

/// The `g` prompt: what has been typed, always in view (its end, after `…`, when it is longer
/// than the line); the label shortens, then the keys go, before the typing is cut.
fn goto_line(t: &Theme, typed: &str, area: Rect, buf: &mut Buffer) {
    let width = area.width as usize;
    let typed_w = glyph::width(typed) + 1;
    let keys = "Enter go  Esc cancel ";
    let long = " go to step (12) or block (b7): ";
    let short = " go to: ";
    let (label, keys) = if glyph::width(long) + typed_w + 1 + keys.len() <= width {
        (long, keys)
    } else if glyph::width(short) + typed_w + 1 + keys.len() <= width {
        (short, keys)
    } else {
        (short, "")
    };
    // The cursor mark, and the column `split_line` keeps between the two sides.
    let room = width.saturating_sub(glyph::width(label) + 2 + keys.len());
    let shown = glyph::fit_end(typed, room);
    let prompt = Line::from(vec![
        Span::styled(label, t.label()),
        Span::styled(format!("{shown}▏"), t.value()),
    ]);
    split_line(area, buf, &prompt, &Line::from(Span::styled(keys, t.faint())));
}

pub fn footer(app: &App, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    if let Some(typed) = &app.goto {
        goto_line(t, typed, area, buf);
        return;
    }
    let width = area.width as usize;
    let note = app.message.as_ref().map(|m| (m.text.clone(), m.level)).or_else(|| stop_note(app));
    // The message comes first: whole if it fits, else cut between words with `…`.
    let left = match note {
        Some((text, Level::Warn)) => Line::from(Span::styled(format!(" ⚠ {text}"), t.warn())),
        Some((text, Level::Info)) => Line::from(Span::styled(format!(" {text}"), t.text())),
        None => Line::default(),
    };
    let left = fields::cut_words(left, width);
    // A recording takes no keys: hints in it would be a lie.
    let hints: &[(&str, u8)] = match app.source {
        _ if app.cast => &[],
        Source::Live { .. } => HINTS,
        Source::Replay { .. } => REPLAY_HINTS,
    };
    // The hints take what the message leaves, two columns apart from it and one from the edge.
    // held at a step, space resumes (plays on, or goes live at the head): say that
    let paused = app.cursor.mode == super::cursor::Mode::Paused;
    let hints: Vec<(&str, u8)> = hints
        .iter()
        .map(
            |&(h, rank)| {
                if paused && h == "space pause" {
                    ("space resume", rank)
                } else {
                    (h, rank)
                }
            },
        )
        .collect();
    let gap = if left.width() > 0 { 2 } else { 0 };
    let room = width.saturating_sub(left.width() + gap + 1);
    let hints = hints_line(&hints, room);
    let right = if hints.is_empty() {
        Line::default()
    } else {
        Line::from(Span::styled(format!("{hints} "), t.faint()))
    };
    buf.set_line(area.x, area.y, &left, area.width);
    let rw = right.width() as u16;
    if rw > 0 {
        buf.set_line(area.right() - rw, area.y, &right, rw);
    }
}

/// Why the decode ended badly, or where a trace stopped: worth keeping on screen.
fn stop_note(app: &App) -> Option<(String, Level)> {
    if let Source::Replay { stopped: Some(s), .. } = &app.source {
        return Some((format!("trace stopped early: {s}"), Level::Warn));
    }
    Some((format!("engine error: {}", app.decode_error()?), Level::Warn))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long path keeps its end and a hub commit shows 7 characters, so the prompt has room
    /// (a long --model path left none).
    #[test]
    fn the_title_shortens_the_checkpoints_name() {
        assert_eq!(
            source_label("Org/tiny-sdar-chat@4f1e3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d"),
            "Org/tiny-sdar-chat@4f1e3c2"
        );
        assert_eq!(
            source_label("/home/ana/main/tests/fixtures/tiny-sdar-chat"),
            "…n/tests/fixtures/tiny-sdar-chat"
        );
        assert_eq!(glyph::width(&source_label("/home/ana/main/tests/fixtures/tiny-sdar-chat")), 32);
        assert_eq!(source_label("embedded:tiny-sdar"), "embedded:tiny-sdar");
    }

    /// A replay's title keeps the prompt (its quote closed) at 140 and 120 columns: the path
    /// shortens to its file name and the checkpoint's name with `…`; no word is cut without
    /// `…` (`bf16` showed as `bf`).
    #[test]
    fn a_replay_title_gives_the_prompt_its_share() {
        use crate::trace::synth::{self, Synth};
        use crate::tui::testing::{render_panel, snapshot_text};
        let mut events = synth::trace(&Synth::small());
        if let crate::trace::events::Event::Header(h) = &mut events[0] {
            h.model.source = "/home/ana/main/tests/fixtures/tiny-sdar-chat".into();
            h.model.dtype = "bf16".into();
            h.prompt = "≈ ∑ 你好 ∫ x² dx".into();
        }
        let app = App::replay(events, "/tmp/wtZ/chat.jsonl".into(), None);
        let title_panel = |v: &View, area: Rect, buf: &mut Buffer| title(v, area, buf);
        let mut shots = Vec::new();
        for w in [140, 120, 100, 80, 60] {
            let s = snapshot_text(&render_panel(&app, w, 1, title_panel));
            assert!(s.contains("finished: length"), "{w}: {s}");
            if w >= 100 {
                assert!(s.contains("prompt \"≈ ∑ 你好 ∫ x² dx\""), "{w}: {s}");
            }
            if w >= 120 {
                assert!(s.contains("bf16 · cpu"), "{w}: {s}");
            }
            assert!(!s.contains(" bf ") && !s.contains("bf…"), "{w}: {s}");
            shots.push(s);
        }
        insta::assert_snapshot!(shots.concat());
    }

    #[test]
    fn human_counts() {
        assert_eq!(human(131_712), "131.7K");
        assert_eq!(human(1_700_000_000), "1.7B");
        assert_eq!(human(12), "12");
    }
}

#[cfg(test)]
mod footer_tests {
    use super::*;
    use crate::trace::synth::{self, Synth};
    use crate::tui::testing::{render_panel, snapshot_text};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    fn footer_panel(v: &View, area: Rect, buf: &mut Buffer) {
        footer(v.app, area, buf)
    }

    #[test]
    fn goto_prompt() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        for c in [KeyCode::Char('g'), KeyCode::Char('1'), KeyCode::Char('2')] {
            app.on_key(KeyEvent::new(c, KeyModifiers::NONE));
        }
        insta::assert_snapshot!(snapshot_text(&render_panel(&app, 100, 1, footer_panel)));
    }

    fn warned(text: &str, live: bool) -> App {
        let mut app = if live {
            let mut app = App::live();
            for e in synth::trace(&Synth::small()) {
                app.ingest(e);
            }
            app
        } else {
            App::replay(synth::trace(&Synth::small()), "t".into(), None)
        };
        app.message = Some(crate::tui::app::Message { text: text.into(), level: Level::Warn });
        app
    }

    /// A `g` error at 140 columns ran into the hints, which were then cut mid-word
    /// (`m stra…`): the message comes first, the hints that fit follow, whole, apart from it.
    #[test]
    fn a_message_keeps_its_room_and_hints_go_whole() {
        let msg =
            "g: \"b-1\" is not a step or a block: type a step number (12) or b and a block (b7)";
        let whole = |s: &str| {
            let hints: Vec<&str> = HINTS.iter().map(|h| h.0).collect();
            // What follows the message is whole hints, two spaces apart.
            let tail = s.split(" (b7)").nth(1).unwrap_or("").trim();
            tail.is_empty() || tail.split("  ").all(|h| hints.contains(&h))
        };
        let mut shots = Vec::new();
        for w in [140, 120, 100, 86, 60] {
            let s = snapshot_text(&render_panel(&warned(msg, true), w, 1, footer_panel));
            let line = s.lines().next().unwrap().to_string();
            if w >= 86 {
                assert!(line.contains(&format!("⚠ {msg}")), "{w}: the message whole: {line}");
                assert!(whole(&line), "{w}: a hint cut: {line}");
                assert!(
                    line.contains("(b7)  ") || line.trim_end().ends_with("(b7)"),
                    "{w}: {line}"
                );
            } else {
                assert!(line.trim_end().ends_with('…') && !line.contains("help"), "{w}: {line}");
            }
            assert!(!line.contains("stra…") && !line.contains("m stra"), "{w}: {line}");
            shots.push(line);
        }
        assert!(
            shots[0]
                .trim_end()
                .ends_with("(b7)           ? help  space pause  ←→ step  g go to  q quit"),
            "{}",
            shots[0]
        );
        insta::assert_snapshot!(shots.join("\n"));
    }

    /// Without a message the hints still go whole as the footer narrows, `? help` last.
    #[test]
    fn hints_go_whole_least_useful_first() {
        assert_eq!(
            hints_line(HINTS, 200),
            "? help  space pause  ←→ step  [] block  g go to  m strategy  R restart  q quit"
        );
        assert_eq!(
            hints_line(HINTS, 60),
            "? help  space pause  ←→ step  [] block  g go to  q quit"
        );
        assert_eq!(hints_line(HINTS, 30), "? help  ←→ step  q quit");
        assert_eq!(hints_line(HINTS, 7), "? help");
        assert_eq!(hints_line(HINTS, 5), "");
    }

    /// The `g` prompt shows everything typed (its end when it is long), never stopping at 12.
    #[test]
    fn the_goto_prompt_shows_long_input() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        for c in "g999999999999999999999".chars() {
            app.on_key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE));
        }
        let s = snapshot_text(&render_panel(&app, 100, 1, footer_panel));
        assert!(s.contains("999999999999999999999▏") && s.contains("Esc cancel"), "{s}");
        app.goto = Some("1".repeat(120));
        let s = snapshot_text(&render_panel(&app, 60, 1, footer_panel));
        assert!(s.contains(" go to: …111") && s.trim_end().ends_with("1▏"), "{s}");
    }

    /// Paused, the footer offers what space does then: resume, not pause.
    #[test]
    fn a_paused_view_offers_resume() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        app.on_key(KeyEvent::new(KeyCode::Char(' '), KeyModifiers::NONE));
        let s = snapshot_text(&render_panel(&app, 100, 1, footer_panel));
        assert!(s.contains("space resume") && !s.contains("space pause"), "{s}");
        app.on_key(KeyEvent::new(KeyCode::Char(' '), KeyModifiers::NONE));
        let s = snapshot_text(&render_panel(&app, 100, 1, footer_panel));
        assert!(s.contains("space pause"), "{s}");
    }

    #[test]
    fn replay_hints_only_keys_that_work_there() {
        let app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        let s = snapshot_text(&render_panel(&app, 100, 1, footer_panel));
        assert_eq!(s.trim(), "? help  space pause  ←→ step  [] block  g go to  +- pace  q quit");
        for engine_key in ["strategy", "restart"] {
            assert!(!s.contains(engine_key), "{s}");
        }
    }

    /// The title names the dtype the decode runs in, not only the weights': a bf16 checkpoint
    /// decoded in f32 on the CPU says `f32 (bf16 weights)`, narrow `f32`.
    #[test]
    fn the_title_gives_the_dtype_the_decode_runs_in() {
        use crate::trace::synth::{self, Synth};
        use crate::tui::testing::{render_panel, snapshot_text};
        let mut events = synth::trace(&Synth::small());
        if let crate::trace::events::Event::Header(h) = &mut events[0] {
            h.model.dtype = "bf16".into();
            h.model.compute = Some("f32".into());
        }
        let app = App::replay(events, "t.jsonl".into(), None);
        let title_panel = |v: &View, area: Rect, buf: &mut Buffer| title(v, area, buf);
        let wide = snapshot_text(&render_panel(&app, 160, 1, title_panel));
        assert!(wide.contains("params · f32 (bf16 weights) · cpu"), "{wide}");
        let m = |compute: Option<&str>| crate::trace::events::ModelInfo {
            compute: compute.map(str::to_string),
            ..crate::trace::synth::trace(&Synth::small())
                .iter()
                .find_map(|e| match e {
                    crate::trace::events::Event::Header(h) => Some(h.model.clone()),
                    _ => None,
                })
                .unwrap()
        };
        assert_eq!(dtype_words(&m(Some("bf16")), false), "bf16");
        assert_eq!(dtype_words(&m(None), true), "f32", "an older trace: the weights'");
    }
}
