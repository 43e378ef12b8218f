//! The Steps panel (`L`): the per-step list of `unmask steps` around the step shown, that step
//! marked, steps after it (already decoded, not yet shown) faint.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::app::View;
use crate::trace::steps::{from_run, StepLine};

fn frame<'a>(v: &View) -> Block<'a> {
    let t = v.theme;
    Block::bordered()
        .border_style(t.border())
        .title(Line::from(Span::styled(" Steps ", t.title())))
        .title_bottom(Line::from(Span::styled(" L: back to the text ", t.faint())).right_aligned())
}

/// The step indices shown in `height` lines: the step shown in the middle, or as low as the
/// list allows near its ends.
fn window(at: usize, head: usize, height: usize) -> std::ops::Range<usize> {
    let n = head + 1;
    let top = at.saturating_sub(height / 2).min(n.saturating_sub(height));
    top..(top + height).min(n)
}

pub fn render(v: &View, area: Rect, buf: &mut Buffer) {
    let block = frame(v);
    let inner = block.inner(area);
    block.render(area, buf);
    let (Some(at), Some(head)) = (v.at, v.run.head()) else {
        buf.set_stringn(inner.x, inner.y, "no step yet", inner.width as usize, v.theme.dim());
        return;
    };
    for (y, k) in window(at, head, inner.height as usize).enumerate() {
        let Some(l) = from_run(v.run, k) else { break };
        // cut between words with `…`: a figure shows whole or not at all
        let l = super::fields::cut_words(line(v, &l, k.cmp(&at)), inner.width as usize);
        buf.set_line(inner.x, inner.y + y as u16, &l, inner.width);
    }
}

/// One step: `▶` and bold for the step shown, faint for steps after it; the step-within-block
/// figure in its step's colour.
fn line<'a>(v: &View, l: &StepLine, vs_shown: std::cmp::Ordering) -> Line<'a> {
    use std::cmp::Ordering::*;
    let t = v.theme;
    let text = l.text();
    let (marker, style) = match vs_shown {
        Equal => ("▶", t.value().add_modifier(Modifier::BOLD)),
        Less => (" ", t.text()),
        Greater => (" ", t.faint()),
    };
    // Split around "step i/N" (the second "step") to colour it.
    let inner = format!("step {}/{}", l.block_step, l.count());
    let at = text.find(" · step ").map_or(0, |i| i + " · ".len());
    let (head, rest) = text.split_at(at);
    let tail = rest.strip_prefix(inner.as_str()).unwrap_or(rest);
    // The edits (`~" cat"→" dog"`) end the line: in the edit colour, unless after the step shown.
    let edits = l.edits_text();
    let tail = tail.strip_suffix(edits.as_str()).unwrap_or(tail);
    let mark = if vs_shown == Greater {
        t.faint()
    } else {
        t.cell_style(l.block_step - 1, v.run.step_span())
    };
    let mut spans = vec![
        Span::styled(marker, t.title()),
        Span::styled(head.to_string(), style),
        Span::styled(inner, mark),
        Span::styled(tail.to_string(), style),
    ];
    if !edits.is_empty() {
        let edit = if vs_shown == Greater { t.faint() } else { t.warn() };
        spans.push(Span::styled(edits, edit));
    }
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};
    use crate::tui::app::App;
    use crate::tui::testing::{render_panel, snapshot_text};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    fn key(app: &mut App, c: KeyCode) {
        app.on_key(KeyEvent::new(c, KeyModifiers::NONE));
    }

    #[test]
    fn the_window_centres_the_step_shown_and_stops_at_the_ends() {
        assert_eq!(window(0, 25, 6), 0..6);
        assert_eq!(window(10, 25, 6), 7..13);
        assert_eq!(window(25, 25, 6), 20..26);
        assert_eq!(window(2, 3, 10), 0..4);
    }

    /// A narrow panel cuts a step's line between words, with `…`: `fwd 6` for `fwd 65` read
    /// as a wrong count.
    #[test]
    fn a_narrow_steps_panel_cuts_no_figure() {
        let mut app = App::replay(synth::trace(&Synth::long(300, 4, 4)), "t".into(), None);
        key(&mut app, KeyCode::End);
        for w in 20..60 {
            let text = snapshot_text(&render_panel(&app, w, 6, render));
            for l in text.lines().filter(|l| l.contains("fwd")) {
                let words: Vec<&str> = l
                    .split(|c: char| c.is_whitespace() || c == '│')
                    .filter(|s| !s.is_empty())
                    .collect();
                let fwd = words.iter().position(|&s| s == "fwd");
                // the figure after "fwd" is whole (a cut after it may end in `…`)
                if let Some(n) = fwd
                    .and_then(|i| words.get(i + 1))
                    .map(|n| n.trim_end_matches('…'))
                    .filter(|n| !n.is_empty())
                {
                    assert!(n.parse::<usize>().is_ok_and(|n| n >= 250), "{w}: {l}");
                }
            }
        }
    }

    /// Edits end their step's line (`~11 " fish"→" and"`), in the edit colour up to the step
    /// shown, faint after it.
    #[test]
    fn steps_panel_lists_edits() {
        let mut app = App::replay(synth::trace(&Synth::small_edits()), "t".into(), None);
        key(&mut app, KeyCode::Home);
        for _ in 0..6 {
            key(&mut app, KeyCode::Right);
        }
        let buf = render_panel(&app, 96, 9, render);
        let s = snapshot_text(&buf);
        assert!(
            s.contains(r#"▶step 7 · block 2 · step 4/6 · fwd 7  [8 " was"] ~11 " dream"→" fish""#),
            "{s}"
        );
        assert!(
            s.contains(
                r#" step 8 · block 2 · step 5/6 · fwd 8  [] ~10 "\t"→"," ~11 " fish"→" and""#
            ),
            "{s}"
        );
        let y = s.lines().position(|l| l.contains("▶step 7")).unwrap() as u16;
        let x = s.lines().nth(y as usize).unwrap().chars().position(|c| c == '~').unwrap() as u16;
        assert_eq!(buf[(x, y)].fg, app.theme.warn);
        assert_eq!(buf[(x, y + 1)].fg, app.theme.faint);
        insta::assert_snapshot!(s);
    }

    #[test]
    fn steps_panel_around_a_middle_step() {
        let mut app = App::replay(synth::trace(&Synth::small()), "t".into(), None);
        key(&mut app, KeyCode::End);
        key(&mut app, KeyCode::Char('['));
        key(&mut app, KeyCode::Char('['));
        let s = snapshot_text(&render_panel(&app, 72, 9, render));
        let shown = app.view().unwrap().at.unwrap();
        assert!(s.contains(&format!("▶step {} · block", shown + 1)), "{s}");
        insta::assert_snapshot!(s);
    }
}
