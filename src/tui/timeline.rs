//! The timeline: where the view stands among every step recorded so far (block, step within
//! the block, the step's edits and whether it is a post-edit step, step overall, forward
//! passes), how it moves (live, paused, playing) and, when it is behind, where the live head is.

use ratatui::buffer::Buffer;
use ratatui::layout::{Position, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::app::View;
use super::cursor::Mode;
use super::fields::{self, Field};
use super::goto;

fn frame<'a>(v: &View) -> Block<'a> {
    Block::bordered()
        .border_style(v.theme.border())
        .title(Line::from(Span::styled(" Timeline ", v.theme.title())))
}

pub fn render(v: &View, area: Rect, buf: &mut Buffer) {
    let block = frame(v);
    let inner = block.inner(area);
    block.render(area, buf);
    if inner.height == 0 {
        return;
    }
    // The position's fields and the badge share the line: shorter spellings first, then whole
    // fields, least important first; a number is never cut.
    let mut fields = position(v);
    let badge = mode_badge(v);
    let has_badge = badge.is_some();
    fields.extend(badge);
    let (mut chosen, cut) = fields::choose(fields, 2, inner.width as usize);
    let badge = if has_badge { chosen.pop().flatten() } else { None };
    let mut left: Vec<Span> = Vec::new();
    for f in chosen.into_iter().flatten() {
        if !left.is_empty() {
            left.push(Span::raw("  "));
        }
        left.extend(f);
    }
    if cut {
        left.push(Span::styled(" …", v.theme.dim()));
    }
    let badge = Line::from(badge.unwrap_or_default());
    let bw = badge.width() as u16;
    let left = fields::cut_words(Line::from(left), inner.width.saturating_sub(bw + 1) as usize);
    buf.set_line(inner.x, inner.y, &left, inner.width.saturating_sub(bw + 1));
    buf.set_line(inner.right().saturating_sub(bw), inner.y, &badge, bw);
    if inner.height > 1 {
        bar(v, Rect { y: inner.y + 1, height: 1, ..inner }, buf);
    }
}

fn kv<'a>(v: &View, k: &str, val: String) -> Vec<Span<'a>> {
    vec![Span::styled(format!("{k} "), v.theme.label()), Span::styled(val, v.theme.value())]
}

/// `block 6 of 2-18  step 3/4  overall 23/59  forwards 28/77`, each field with its shorter
/// spellings (`b6`, `#23/59`, `fwd 28/77`) and the rank at which it gives way.
fn position<'a>(v: &View) -> Vec<Field<'a>> {
    let run = v.run;
    let Some(k) = v.at else {
        return vec![Field::new(vec![Span::styled("no step yet", v.theme.dim())])];
    };
    let s = &run.steps()[k];
    let head = run.head().unwrap_or(k);
    let of_block = run.block_step_count(s.block);
    let forwards = run.finish.as_ref().map_or(run.steps()[head].forward, |f| f.forwards);
    let val = |x: String| Span::styled(x, v.theme.value());
    let mut fields = vec![
        // One numbering, the grid's: the trace's block index, and the span the decode covers
        Field::new(kv(
            v,
            "block",
            format!("{} of {}-{}", s.block, run.header.first_block, run.max_blocks() - 1),
        ))
        .or(5, kv(v, "block", s.block.to_string()))
        .or(8, vec![Span::styled("b", v.theme.label()), val(s.block.to_string())]),
        Field::new(kv(v, "step", format!("{}/{of_block}", s.step + 1))),
    ];
    if s.edited > 0 || s.post {
        // `✎2`: the step replaced two tokens; a post-edit step comes after its block's last
        // mask and only edits (the last of a block, edits nothing).
        let edits = || {
            vec![Span::styled(crate::glyph::EDIT, v.theme.edit_mark()), val(s.edited.to_string())]
        };
        let with = |word: &str| {
            let mut l = vec![Span::styled(format!("{word} "), v.theme.label())];
            l.extend(edits());
            l
        };
        let word = |w: &str| vec![Span::styled(w.to_string(), v.theme.label())];
        fields.push(match (s.post, s.edited) {
            // the pass that found nothing left to edit, which ends its block
            (true, 0) => Field::new(word("post-edit")).or(2, word("post")),
            (true, _) => Field::new(with("post-edit")).or(2, with("post")).or(6, edits()),
            (false, _) => Field::new(edits()),
        });
    }
    fields.extend([
        Field::new(kv(v, "overall", format!("{}/{}", k + 1, head + 1)))
            .or(3, vec![Span::styled("#", v.theme.label()), val(format!("{}/{}", k + 1, head + 1))])
            .drop_at(7),
        Field::new(kv(v, "forwards", format!("{}/{forwards}", s.forward)))
            .or(1, kv(v, "fwd", format!("{}/{forwards}", s.forward)))
            .drop_at(4),
    ]);
    fields
}

/// Where the view is: live (following the head), at the end of a replay, paused (and how far
/// behind the head), or catching up at the pace. None in a recording.
fn mode_badge<'a>(v: &View) -> Option<Field<'a>> {
    let t = v.theme;
    let c = &v.app.cursor;
    let head = v.run.head();
    let behind = c.behind(head);
    if v.app.cast {
        // A recording places its cursor step by step; "paused" and "behind" would be false.
        return None;
    }
    let bold =
        |text: String, style: Style| vec![Span::styled(text, style.add_modifier(Modifier::BOLD))];
    let warn = Style::default().fg(t.warn);
    Some(match c.mode {
        // A replay has no live head: the view stands at the end of the trace.
        Mode::Live if !v.app.is_live() => {
            Field::new(bold("■ END of trace".into(), Style::default().fg(t.accent)))
                .or(2, bold("■ END".into(), Style::default().fg(t.accent)))
        }
        Mode::Live => Field::new(bold("● LIVE".into(), Style::default().fg(t.step_color(2, 7)))),
        // (a replay's last step is the end of the trace, not a head that moves on)
        Mode::Paused if behind == 0 && !v.app.is_live() => {
            Field::new(bold("⏸ PAUSED at the end".into(), warn))
                .or(2, bold("⏸ PAUSED".into(), warn))
        }
        Mode::Paused if behind == 0 => Field::new(bold("⏸ PAUSED at the head".into(), warn))
            .or(2, bold("⏸ PAUSED".into(), warn)),
        Mode::Paused if !v.app.is_live() => {
            Field::new(bold(format!("⏸ PAUSED · {behind} before the end"), warn))
                .or(2, bold(format!("⏸ PAUSED · {behind} before"), warn))
                .or(4, bold(format!("⏸ {behind} before"), warn))
                .or(9, bold("⏸".into(), warn))
        }
        Mode::Paused => Field::new(bold(format!("⏸ PAUSED · {behind} behind the head"), warn))
            .or(2, bold(format!("⏸ PAUSED · {behind} behind"), warn))
            .or(4, bold(format!("⏸ {behind} behind"), warn))
            .or(9, bold("⏸".into(), warn)),
        // Catching up with the head at the pace: where the view is, of how many recorded.
        Mode::Playing => {
            let style = Style::default().fg(t.accent);
            let shown = match (v.at, head) {
                (Some(k), Some(h)) => format!("{}/{} · ", k + 1, h + 1),
                _ => String::new(),
            };
            Field::new(bold(format!("▶ {shown}pace {}", c.pace), style))
                .or(2, bold(format!("▶ pace {}", c.pace), style))
                .or(9, bold("▶".into(), style))
        }
    })
}

/// The step under a click on the bar (the timeline's second inner row), if it is there.
pub fn hit(v: &View, area: Rect, at: Position) -> Option<usize> {
    let inner = frame(v).inner(area);
    let head = v.run.head()?;
    let on_bar =
        at.y == inner.y + 1 && inner.height > 1 && (inner.x..inner.right()).contains(&at.x);
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
    use crate::trace::synth::{self, Synth};
    use crate::tui::app::App;
    use crate::tui::testing::{render_panel, snapshot_text};
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

    /// At any width every figure on the line is whole (`overall 7/2` for 7/258 read as a
    /// wrong value): fields take shorter spellings or go, and the badge shortens.
    #[test]
    fn no_figure_is_ever_cut() {
        let mut app = app();
        key(&mut app, KeyCode::Home);
        for _ in 0..6 {
            key(&mut app, KeyCode::Right);
        }
        let first_line = |app: &App, w| {
            snapshot_text(&render_panel(app, w, 4, render)).lines().nth(1).unwrap().to_string()
        };
        let wide = first_line(&app, 200);
        assert!(wide.contains("overall 7/26") && wide.contains("19 before the end"), "{wide}");
        let mut whole: Vec<String> =
            wide.split(|c: char| c == '│' || c.is_whitespace()).map(str::to_string).collect();
        whole.extend(["#7/26".into(), "b3".into()]);
        for w in 12..120 {
            let line = first_line(&app, w);
            for word in line
                .split(|c: char| c == '│' || c.is_whitespace())
                .filter(|w| w.chars().any(|c| c.is_ascii_digit()))
            {
                assert!(
                    whole.iter().any(|x| x == word),
                    "{w} columns: {word:?} is cut in {line:?}"
                );
            }
        }
        let narrow: Vec<String> = [40, 30, 24].map(|w| first_line(&app, w)).into();
        insta::assert_snapshot!(narrow.join("\n"));
    }

    /// A replay has no live head: at its end the badge says so, not `● LIVE`.
    #[test]
    fn a_replay_ends_instead_of_going_live() {
        let mut app = app();
        key(&mut app, KeyCode::End);
        let s = snapshot_text(&render_panel(&app, 100, 4, render));
        assert!(s.contains("■ END of trace") && !s.contains("LIVE"), "{s}");
        let mut live = App::live();
        synth::trace(&Synth::small()).into_iter().for_each(|e| {
            let _ = live.ingest(e);
        });
        assert!(snapshot_text(&render_panel(&live, 100, 4, render)).contains("● LIVE"));
    }

    /// A step that edited says how many tokens it replaced; a post-edit step (after its
    /// block's last mask) says so too, in shorter words when narrow, never cutting a figure.
    #[test]
    fn timeline_shows_edits_and_post_edit_steps() {
        let mut app = App::replay(synth::trace(&Synth::small_edits()), "t".into(), None);
        key(&mut app, KeyCode::Home);
        key(&mut app, KeyCode::Right);
        let edit = snapshot_text(&render_panel(&app, 100, 4, render));
        assert!(edit.contains("step 2/3  ✎1  overall 2/35"), "{edit}");
        key(&mut app, KeyCode::Right);
        let settle = snapshot_text(&render_panel(&app, 100, 4, render));
        assert!(settle.contains("step 3/3  post-edit  overall 3/35"), "{settle}");
        for _ in 0..5 {
            key(&mut app, KeyCode::Right);
        }
        let post: Vec<String> =
            [100, 60, 44, 30].map(|w| snapshot_text(&render_panel(&app, w, 4, render))).into();
        assert!(post[0].contains("step 5/6  post-edit ✎2  overall 8/35"), "{}", post[0]);
        // Without edits no field is added (the synthetic decode's steps).
        let plain = snapshot_text(&render_panel(&self::app(), 100, 4, render));
        assert!(!plain.contains('✎'), "{plain}");
        insta::assert_snapshot!(format!("{edit}\n{settle}\n{}", post.join("\n")));
    }

    #[test]
    fn timeline_playing() {
        let app = app();
        let s = snapshot_text(&render_panel(&app, 100, 4, render));
        assert!(s.contains("▶ 1/26 · pace 10/s") && s.contains("overall 1/26"), "{s}");
    }
}
