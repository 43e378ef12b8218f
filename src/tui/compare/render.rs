//! The compare screen as pure functions of the state, one per part of the screen: the title,
//! each side's line of figures, the line of differences, the two columns and the footer.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};

use super::{too_small, Align, CompareApp, Mark, KEYS, MIN_HEIGHT, MIN_WIDTH};
use crate::glyph;
use crate::trace::compare::Comparison;
use crate::trace::store::Run;
use crate::tui::app::View;
use crate::tui::cursor::Mode;
use crate::tui::fields::{self, Field};
use crate::tui::theme::Theme;
use crate::tui::{centred, grid, help, steps, text, timeline};

const HINTS: &str = "? help  space play  ←→ step  [] block  a align  q quit ";

/// The compare screen as a pure function of the app.
pub fn render(app: &CompareApp, area: Rect, buf: &mut Buffer) {
    if too_small(area) {
        let msg = format!(
            "terminal too small: {}×{}; compare needs at least {MIN_WIDTH}×{MIN_HEIGHT} (q quits)",
            area.width, area.height
        );
        centred(app.theme, area, buf, msg);
        return;
    }
    let rows = Layout::vertical(
        [1, 1, 1, 1]
            .map(Constraint::Length)
            .into_iter()
            .chain([Constraint::Min(0), Constraint::Length(1)]),
    );
    let [title, line_a, line_b, diff, body, footer] = rows.areas(area);
    title_line(app, title, buf);
    side_lines(app, [line_a, line_b], buf);
    diff_line(app, diff, buf);
    let [left, right] = Layout::horizontal([Constraint::Percentage(50); 2]).areas(body);
    let marks = app.marks();
    for (i, col) in [left, right].into_iter().enumerate() {
        column(app, i, col, &marks, buf);
    }
    let (hints, _) = crate::glyph::fit(HINTS, footer.width as usize);
    let w = hints.chars().count() as u16;
    buf.set_stringn(
        footer.right().saturating_sub(w),
        footer.y,
        hints,
        w as usize,
        app.theme.faint(),
    );
    if app.help {
        help::render_table(app.theme, KEYS, area, buf);
    }
}

const NAMES: [&str; 2] = ["A", "B"];

fn title_line(app: &CompareApp, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let brand = Span::styled(
        " unmask compare ",
        Style::default().fg(t.prompt_bg).bg(t.accent).add_modifier(Modifier::BOLD),
    );
    let mut left = vec![brand];
    let align = match app.align {
        Align::Step => "lock-step by step",
        Align::Block => "aligned by block",
    };
    let mode = match app.mode {
        Mode::Live => "● LIVE",
        Mode::Paused => "⏸ PAUSED",
        Mode::Playing => "▶ PLAYING",
    };
    let right = Line::from(vec![
        Span::styled(format!("{align} · "), t.dim()),
        Span::styled(format!("{mode} "), t.label()),
    ]);
    let right_w = right.width();
    if let Some(r) = app.runs().next() {
        // The checkpoint's name and the prompt share the room; a cut prompt ends in `…"`.
        let prompt = glyph::escape(r.header.shown_prompt(), glyph::Mode::Prose).replace('\n', "↵");
        let room = (area.width as usize).saturating_sub(16 + right_w + 1);
        let mut source = glyph::escape_line(&r.header.model.source).into_owned();
        let share = (room / 3).max(8);
        if glyph::width(&source) > share {
            // A path's folder name says the most in the least room.
            if let Some(name) = std::path::Path::new(&source).file_name() {
                source = name.to_string_lossy().into_owned();
            }
        }
        let source = glyph::fit_end(&source, share).into_owned();
        let prompt_room = room.saturating_sub(glyph::width(&source) + 2 + 9).min(42);
        left.push(Span::styled(format!(" {source} "), t.value()));
        if prompt_room >= 4 {
            let (cut, _) = glyph::fit(&prompt, prompt_room - 2);
            left.push(Span::styled(format!("prompt \"{cut}\""), Style::default().fg(t.prompt_fg)));
        }
    }
    let rw = right_w as u16;
    let left = fields::cut_words(Line::from(left), area.width.saturating_sub(rw + 1) as usize);
    buf.set_line(area.x, area.y, &left, area.width.saturating_sub(rw + 1));
    buf.set_line(area.right().saturating_sub(rw), area.y, &right, rw);
}

/// `A sequential block 4 steps 4 greedy  step 7/12  forwards 9  tokens 7  tok/fwd 0.78  finished: eos`;
/// narrow, the figures shorten and go (least telling first), never cut, and the two lines
/// shorten alike so that their figures still read side by side.
fn side_lines(app: &CompareApp, areas: [Rect; 2], buf: &mut Buffer) {
    let room = |i: usize| (areas[i].width as usize).saturating_sub(side_name(app, i).width());
    let sides = [side_fields(app, 0), side_fields(app, 1)];
    let floor = sides
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some(fields::rank_needed(f.as_ref()?, "", room(i))))
        .max()
        .unwrap_or(0);
    for (i, (area, f)) in areas.into_iter().zip(sides).enumerate() {
        let mut spans = vec![side_name(app, i)];
        match f {
            Some(f) => spans.extend(fields::line_from(f, "", room(i), floor).spans),
            None => {
                spans.push(Span::styled("waiting for the engine's first event…", app.theme.dim()))
            }
        }
        buf.set_line(area.x, area.y, &Line::from(spans), area.width);
    }
}

fn side_name(app: &CompareApp, i: usize) -> Span<'static> {
    Span::styled(format!(" {} ", NAMES[i]), app.theme.title())
}

/// Side `i`'s figures, fullest spelling first (`None` before its first event).
fn side_fields(app: &CompareApp, i: usize) -> Option<Vec<Field<'static>>> {
    let t = app.theme;
    let v = app.sides[i].view()?;
    let (fwd, tokens) = shown_counts(app, i, &v);
    let head = v.run.head().map_or(0, |h| h + 1);
    let state = match &v.run.finish {
        Some(f) => format!("finished: {}", format!("{:?}", f.reason).to_lowercase()),
        None => "decoding".into(),
    };
    let tpf = if fwd == 0 { 0.0 } else { tokens as f64 / fwd as f64 };
    // Both summaries padded to one width, so the figures after them line up.
    let pad = app.runs().map(|r| r.latest_settings().summary().len()).max().unwrap_or(0);
    let summary = v.run.latest_settings().summary();
    let kv = |k: &str, val: String| {
        vec![Span::styled(format!(" {k} "), t.label()), Span::styled(val, t.value())]
    };
    Some(vec![
        // Padded so that both sides' figures line up, until the room runs short.
        Field::new(vec![Span::styled(format!("{summary:<pad$}"), t.value())])
            .or(2, vec![Span::styled(summary.clone(), t.value())]),
        Field::new(kv("step", format!("{}/{head}", v.at.map_or(0, |k| k + 1)))),
        Field::new(kv("forwards", fwd.to_string())).or(3, kv("fwd", fwd.to_string())).drop_at(6),
        Field::new(kv("tokens", tokens.to_string()))
            .or(3, kv("tok", tokens.to_string()))
            .drop_at(5),
        Field::new(kv("tok/fwd", format!("{tpf:.2}"))).drop_at(4),
        Field::new(vec![Span::styled(format!("  {state}"), t.dim())])
            .or(1, vec![Span::styled(format!(" {}", state.replace("finished", "ended")), t.dim())])
            .or(3, vec![Span::styled(format!(" {}", state.replace("finished: ", "")), t.dim())])
            .drop_at(7),
    ])
}

/// Forwards used and tokens decoded up to the step shown; the finish's totals at the end.
fn shown_counts(app: &CompareApp, i: usize, v: &View) -> (usize, usize) {
    let at_end = v.at == v.run.head() && app.mode == Mode::Live;
    match (app.comparison(), at_end) {
        (Some(c), true) => (c.runs[i].forwards, c.runs[i].output_ids.len()),
        _ => {
            v.at.and_then(|k| Some((v.run.step(k)?.forward, v.run.tokens_out(k)))).unwrap_or((0, 0))
        }
    }
}

fn diff_line(app: &CompareApp, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let prompt_len = app.runs().next().map_or(0, Run::prompt_len);
    let overall = match app.comparison() {
        Some(c) => match c.first_divergence {
            // the output token counted from 1, as steps are; the position as the trace's
            Some(i) => {
                format!("outputs diverge at output token {} (position {})", i + 1, prompt_len + i)
            }
            None if c.runs[0].output_ids == c.runs[1].output_ids => "outputs are identical".into(),
            None => "one output is a prefix of the other".into(),
        },
        None => "decoding…".into(),
    };
    let marks = app.marks();
    // What goes when the line is short, last first: the count of cells at another step, the
    // count of other tokens, then the sampling caveat (it explains a divergence); the
    // overall verdict stays.
    let mut fields = vec![Field::new(vec![Span::styled(format!(" {overall}"), t.value())])];
    if marks.is_empty() {
        fields.push(
            Field::new(vec![Span::styled("no committed cell differs here", t.dim())]).drop_at(3),
        );
    }
    let count = |kind| marks.iter().filter(|m| m.1 == kind).count();
    let parts = [
        (Mark::OtherToken, count(Mark::OtherToken), "", 2u8),
        (Mark::OtherStep, count(Mark::OtherStep), " at another step", 1),
    ];
    for (i, &(kind, n, tail, drop)) in parts.iter().filter(|p| p.1 > 0).enumerate() {
        let what = match kind {
            Mark::OtherToken => "other token",
            Mark::OtherStep => "same token",
        };
        let plural = if n == 1 { "" } else { "s" };
        let here = if i == 0 { vec![Span::styled("here ", t.dim())] } else { Vec::new() };
        let full = [
            here.clone(),
            vec![
                Span::styled(format!("{} ", kind.glyph()), mark_style(t, kind)),
                Span::styled(format!("{n} {what}{plural}{tail}"), t.warn()),
            ],
        ]
        .concat();
        let short = [
            here,
            vec![
                Span::styled(format!("{} ", kind.glyph()), mark_style(t, kind)),
                Span::styled(n.to_string(), t.warn()),
            ],
        ]
        .concat();
        fields.push(Field::new(full).or(drop, short).drop_at(drop + 2));
    }
    if let Some([a, b]) = app.edited() {
        // Edited cells at the steps shown (the grids mark them `✎`).
        let glyph = Span::styled(crate::glyph::EDIT, t.edit_mark());
        fields.push(
            Field::new(vec![
                glyph.clone(),
                Span::styled(format!(" edited A {a} · B {b}"), t.warn()),
            ])
            .or(3, vec![glyph, Span::styled(format!(" {a}/{b}"), t.warn())])
            .drop_at(6),
        );
    }
    if app.comparison().is_some_and(Comparison::sampled) {
        fields.push(
            Field::new(vec![Span::styled("sampled: draws differ too", t.dim())])
                .or(4, vec![Span::styled("sampled", t.dim())])
                .drop_at(5),
        );
    }
    buf.set_line(area.x, area.y, &fields::line(fields, " · ", area.width as usize), area.width);
}

/// The mark glyph's style: warn for another token, the accent for another step.
fn mark_style(t: &Theme, kind: Mark) -> Style {
    let fg = match kind {
        Mark::OtherToken => t.warn,
        Mark::OtherStep => t.accent,
    };
    Style::default().fg(fg).add_modifier(Modifier::BOLD)
}

/// One side: grid, text and timeline in a column, the differing cells marked.
fn column(app: &CompareApp, i: usize, area: Rect, marks: &[(usize, Mark)], buf: &mut Buffer) {
    let Some(v) = app.sides[i].view() else {
        centred(
            app.theme,
            area,
            buf,
            format!("{}: waiting for the engine's first event…", NAMES[i]),
        );
        return;
    };
    let [g, txt, tl] =
        Layout::vertical([Constraint::Percentage(55), Constraint::Min(3), Constraint::Length(4)])
            .areas(area);
    grid::render(&v, g, buf);
    if app.sides[i].steps_panel {
        steps::render(&v, txt, buf);
    } else {
        text::render(&v, txt, buf);
    }
    timeline::render(&v, tl, buf);
    // Another token: the cell reversed in the warning colour, and `≠`; the same token at
    // another step: `≈` only, the cell keeps its step's hue.
    let reversed = Style::default()
        .fg(app.theme.warn)
        .add_modifier(Modifier::UNDERLINED | Modifier::BOLD | Modifier::REVERSED);
    for &(p, kind) in marks {
        if let (Mark::OtherToken, Some(r)) = (kind, grid::cell_area(&v, g, p)) {
            buf.set_style(r, reversed);
        }
        if let Some(at) = grid::mark_at(&v, g, p) {
            buf.set_string(at.x, at.y, kind.glyph(), mark_style(app.theme, kind));
        }
    }
    // Which side this is, on the grid's top border.
    let label = format!(" {} ", NAMES[i]);
    buf.set_string(g.right().saturating_sub(5), g.y, label, app.theme.title());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::compare::tests::{at, heads, pair, press, screen};
    use crossterm::event::KeyCode;

    #[test]
    fn compare_screen_at_the_end() {
        let app = pair();
        let c = app.comparison().expect("both finished");
        assert_ne!(c.runs[0].forwards, c.runs[1].forwards, "the pair must differ in forwards");
        insta::assert_snapshot!(screen(&app, 120, 36));
    }

    #[test]
    fn compare_screen_mid_step() {
        let mut app = pair();
        press(&mut app, KeyCode::Home);
        for _ in 0..5 {
            press(&mut app, KeyCode::Right);
        }
        assert_eq!(at(&app), [Some(5), Some(5.min(heads(&app)[1]))]);
        insta::assert_snapshot!(screen(&app, 120, 36));
    }

    #[test]
    fn l_shows_each_sides_steps_list_at_its_own_step() {
        let mut app = pair();
        press(&mut app, KeyCode::Home);
        for _ in 0..5 {
            press(&mut app, KeyCode::Right);
        }
        press(&mut app, KeyCode::Char('L'));
        let s = screen(&app, 120, 36);
        assert_eq!(s.matches(" Steps ").count(), 2, "{s}");
        assert!(!s.contains(" Text "), "{s}");
        // Both sides are at global step 6 (index 5): each marks its own line for it.
        assert_eq!(s.matches("▶step 6 · block").count(), 2, "{s}");
        insta::assert_snapshot!(s);
        press(&mut app, KeyCode::Char('L'));
        assert!(screen(&app, 120, 36).contains(" Text "));
    }

    /// At the smallest compare screen, mid-decode and paused: no figure is cut (`119 behind`
    /// for 119 and more, `overall 7/2` for 7/258) and a cut prompt closes its quote.
    #[test]
    fn the_smallest_screen_cuts_no_figure() {
        let mut app = pair();
        press(&mut app, KeyCode::Home);
        for _ in 0..6 {
            press(&mut app, KeyCode::Right);
        }
        let s = screen(&app, 80, 22);
        let title = s.lines().next().unwrap();
        assert!(
            title.contains("prompt \"")
                && title.trim_end().ends_with("⏸ PAUSED")
                && title.matches('"').count() == 2,
            "{s}"
        );
        assert!(!s.contains("B=4"), "{s}");
        insta::assert_snapshot!(s);
    }

    /// A decode without edits (A) against one that edits (B), same final tokens: at the first
    /// step B holds a draft at position 7, another token; one step on B has replaced it, and
    /// it is the same token at another step. B's grid marks its edited cells `✎`, and the
    /// line counts them at the steps shown.
    #[test]
    fn compare_judges_the_tokens_held_and_shows_edits() {
        use crate::trace::synth::{trace, Synth};
        let mut app = CompareApp::replay(trace(&Synth::small()), trace(&Synth::small_edits()));
        press(&mut app, KeyCode::Home);
        assert_eq!(at(&app), [Some(0), Some(0)]);
        assert!(app.marks().contains(&(7, Mark::OtherToken)), "{:?}", app.marks());
        press(&mut app, KeyCode::Right);
        let marks = app.marks();
        assert!(marks.contains(&(7, Mark::OtherStep)) && app.differing().is_empty(), "{marks:?}");
        let early = screen(&app, 120, 36);
        assert!(early.contains("✎ edited A 0 · B 1"), "{early}");
        press(&mut app, KeyCode::End);
        let end = screen(&app, 120, 36);
        assert!(
            end.contains("outputs are identical") && end.contains("✎ edited A 0 · B 6"),
            "{end}"
        );
        // B's six output cells and its dropped one past max_new_tokens, B's legend, the line.
        assert_eq!(end.matches('✎').count(), 6 + 1 + 1 + 1, "{end}");
        insta::assert_snapshot!(format!("{early}\n{end}"));
        // Neither side edits: nothing is said of edits.
        assert!(!screen(&pair(), 120, 36).contains('✎'));
    }

    #[test]
    fn too_small_says_so() {
        assert!(screen(&pair(), 70, 20).contains("compare needs at least 80×22"));
    }

    #[test]
    fn waiting_before_any_event() {
        let s = screen(&CompareApp::live(), 100, 30);
        assert!(s.contains("A: waiting") && s.contains("B: waiting"), "{s}");
    }

    /// Synthetic decodes of one prompt: the same tokens, B in half the steps, except that B
    /// decodes another token at position 9.
    fn steps_pair() -> CompareApp {
        use crate::trace::events::Event;
        use crate::trace::synth::{trace, Synth};
        let a = trace(&Synth { new_tokens: 10, ..Synth::small() });
        let mut b = trace(&Synth { new_tokens: 10, steps: 2, ..Synth::small() });
        for e in &mut b {
            match e {
                Event::Step(s) => s
                    .committed
                    .iter_mut()
                    .filter(|c| c.pos == 9)
                    .for_each(|c| (c.token, c.text) = (0, "ROMEO".into())),
                Event::Block(bl) if bl.start == 8 => bl.tokens[1] = 0,
                Event::Finish(f) => f.output_ids[3] = 0,
                _ => {}
            }
        }
        CompareApp::replay(a, b)
    }

    #[test]
    fn other_tokens_and_other_steps_are_marked_apart() {
        let app = steps_pair();
        let c = app.comparison().unwrap().clone();
        let marks = app.marks();
        let of = |kind| marks.iter().filter(|m| m.1 == kind).map(|m| m.0).collect::<Vec<_>>();
        assert_eq!(of(Mark::OtherToken), vec![9]);
        assert_eq!(of(Mark::OtherStep), c.other_step.iter().map(|p| p.pos).collect::<Vec<_>>());
        assert!(of(Mark::OtherStep).len() >= 3, "{marks:?}");
        let s = screen(&app, 120, 36);
        let line = s.lines().nth(3).unwrap();
        let steps = of(Mark::OtherStep);
        assert_eq!(line, format!(" outputs diverge at output token 4 (position 9) · here ≠ 1 other token · ≈ {} same tokens at another step", steps.len()));
        // Both sides' grids carry one mark per marked cell.
        assert_eq!(s.matches('≠').count(), 1 + 2, "{s}");
        assert_eq!(s.matches('≈').count(), 1 + 2 * steps.len(), "{s}");
        insta::assert_snapshot!(s);
        // Without colour the marks are the same glyphs (and the different token stays reversed).
        let mut mono = steps_pair();
        mono.theme = crate::tui::theme::pick(
            crate::tui::theme::ThemeName::Dark,
            crate::tui::theme::Depth::Mono,
        );
        let m = screen(&mono, 120, 36);
        assert_eq!(
            (m.matches('≠').count(), m.matches('≈').count()),
            (3, 1 + 2 * steps.len()),
            "{m}"
        );
    }

    #[test]
    fn sampled_sides_are_announced_on_the_screen() {
        let mut app = steps_pair();
        assert!(!screen(&app, 160, 36).contains("draws differ"));
        let mut events = crate::trace::synth::trace(&crate::trace::synth::Synth {
            new_tokens: 10,
            ..crate::trace::synth::Synth::small()
        });
        if let crate::trace::events::Event::Header(h) = &mut events[0] {
            h.settings.sampling.temperature = 0.7;
        }
        app = CompareApp::replay(events.clone(), events);
        assert!(screen(&app, 160, 36).contains("sampled: draws differ too"));
        // on a narrow screen the caveat outranks the counts of marked cells
        let narrow = screen(&app, 80, 24);
        let diff = narrow.lines().find(|l| l.contains("outputs ")).unwrap();
        assert!(diff.contains("sampled"), "{narrow}");
    }
}
