//! The timeline: where the view stands among every step recorded so far (block, step within
//! the block, step overall, forward passes), how it moves (live, paused, playing) and, when it
//! is behind, where the live head is.

use ratatui::buffer::Buffer;
use ratatui::layout::{Position, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::app::View;
use super::cursor::Mode;
use super::goto;

fn frame<'a>(v: &View) -> Block<'a> {
    Block::bordered().border_style(v.theme.border()).title(Line::from(Span::styled(" Timeline ", v.theme.title())))
}

pub fn render(v: &View, area: Rect, buf: &mut Buffer) {
    let block = frame(v);
    let inner = block.inner(area);
    block.render(area, buf);
    if inner.height == 0 {
        return;
    }
    let badge = mode_badge(v);
    let bw = badge.width() as u16;
    buf.set_line(inner.x, inner.y, &position(v), inner.width.saturating_sub(bw + 1));
    buf.set_line(inner.right().saturating_sub(bw), inner.y, &badge, bw);
    if inner.height > 1 {
        bar(v, Rect { y: inner.y + 1, height: 1, ..inner }, buf);
    }
}

fn kv<'a>(v: &View, k: &str, val: String) -> [Span<'a>; 3] {
    [Span::styled(format!("{k} "), v.theme.label()), Span::styled(val, v.theme.value()), Span::raw("  ")]
}

/// `block 6 (5/17)  step 3/4  #23/59  forward 28/77`.
fn position<'a>(v: &View) -> Line<'a> {
    let run = v.run;
    let Some(k) = v.at else { return Line::from(Span::styled("no step yet", v.theme.dim())) };
    let s = &run.steps()[k];
    let head = run.head().unwrap_or(k);
    let nth = s.block - run.header.first_block + 1;
    let of_block = run.block_step_budget(s.block);
    let forwards = run.finish.as_ref().map_or(run.steps()[head].forward, |f| f.forwards);
    let mut l: Vec<Span> = Vec::new();
    l.extend(kv(v, "block", format!("{} ({nth}/{})", s.block, run.blocks().len())));
    l.extend(kv(v, "step", format!("{}/{of_block}", s.step + 1)));
    l.extend(kv(v, "overall", format!("{}/{}", k + 1, head + 1)));
    l.extend(kv(v, "forwards", format!("{}/{forwards}", s.forward)));
    Line::from(l)
}

fn mode_badge<'a>(v: &View) -> Line<'a> {
    let t = v.theme;
    let c = &v.app.cursor;
    let head = v.run.head();
    let behind = c.behind(head);
    if v.app.cast {
        // A recording places its cursor step by step; "paused" and "behind" would be false.
        return Line::default();
    }
    let (text, style) = match c.mode {
        Mode::Live => ("● LIVE".to_string(), Style::default().fg(t.step_color(2, 7))),
        Mode::Paused if behind == 0 => ("⏸ PAUSED at the head".to_string(), Style::default().fg(t.warn)),
        Mode::Paused => (format!("⏸ PAUSED · {behind} behind the head"), Style::default().fg(t.warn)),
        // Catching up with the head at the pace: where the view is, of how many recorded.
        Mode::Playing => {
            let shown = match (v.at, head) {
                (Some(k), Some(h)) => format!("{}/{} · ", k + 1, h + 1),
                _ => String::new(),
            };
            (format!("▶ {shown}pace {}", c.pace), Style::default().fg(t.accent))
        }
    };
    Line::from(Span::styled(text, style.add_modifier(Modifier::BOLD)))
}

/// The step under a click on the bar (the timeline's second inner row), if it is there.
pub fn hit(v: &View, area: Rect, at: Position) -> Option<usize> {
    let inner = frame(v).inner(area);
    let head = v.run.head()?;
    let on_bar = at.y == inner.y + 1 && inner.height > 1 && (inner.x..inner.right()).contains(&at.x);
    on_bar.then(|| goto::step_at_column((at.x - inner.x) as usize, inner.width as usize, head))
}

/// `━━━━━●──────┃`: done up to the cursor, recorded beyond it, the head at the end.
fn bar(v: &View, area: Rect, buf: &mut Buffer) {
    let t = v.theme;
    let (Some(k), Some(head)) = (v.at, v.run.head()) else { return };
    let w = area.width as usize;
    if w < 2 {
        return;
    }
    let col = |step: usize| (step * (w - 1)).checked_div(head).unwrap_or(w - 1);
    let at = col(k);
    let mut s = String::with_capacity(w * 3);
    for x in 0..w {
        s.push(if x == at {
            '●'
        } else if x == w - 1 {
            '┃'
        } else if x < at {
            '━'
        } else {
            '─'
        });
    }
    buf.set_stringn(area.x, area.y, &s, w, t.faint());
    let done: String = s.chars().take(at + 1).collect();
    buf.set_stringn(area.x, area.y, &done, w, Style::default().fg(t.accent));
    if at < w - 1 {
        let head_style = Style::default().fg(t.warn).add_modifier(Modifier::BOLD);
        buf.set_stringn(area.x + (w - 1) as u16, area.y, "┃", 1, head_style);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{self, Synth};
    use crate::ui::app::App;
    use crate::ui::testing::{render_panel, snapshot_text};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    fn app() -> App {
        App::replay(synth::trace(&Synth::small()), "t".into(), None)
    }

    fn key(app: &mut App, c: KeyCode) {
        app.on_key(KeyEvent::new(c, KeyModifiers::NONE));
    }

    #[test]
    fn timeline_live_and_behind() {
        let mut app = app();
        key(&mut app, KeyCode::End);
        let live = snapshot_text(&render_panel(&app, 100, 4, render));
        key(&mut app, KeyCode::Char('['));
        key(&mut app, KeyCode::Left);
        let behind = snapshot_text(&render_panel(&app, 100, 4, render));
        insta::assert_snapshot!(format!("{live}\n{behind}"));
    }

    #[test]
    fn timeline_playing() {
        let app = app();
        let s = snapshot_text(&render_panel(&app, 100, 4, render));
        assert!(s.contains("▶ 1/26 · pace 10/s") && s.contains("overall 1/26"), "{s}");
    }
}
