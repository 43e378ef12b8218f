//! The running output as prose: every token coloured by the step that decoded it, the active
//! block's masks visible, word-wrapped to the panel, following the decode unless scrolled.
//!
//! The whole text is wrapped each frame (the follow position depends on it), but only the lines
//! in view become spans; wrapping walks graphemes with an ASCII fast path and allocates one
//! mark per line.

use std::borrow::Cow;

use ratatui::buffer::Buffer;
use ratatui::layout::{Position, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::app::View;
use super::glyph::{self, Mode};
use crate::store::CellState;

/// One token's text as drawn.
struct Seg<'a> {
    text: Cow<'a, str>,
    style: Style,
    pos: usize,
}

/// Where a line starts: a segment and a byte offset in its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    seg: usize,
    byte: usize,
}

fn segments<'a>(v: &View<'a>) -> Vec<Seg<'a>> {
    let t = v.theme;
    let run = v.run;
    let span = run.step_span();
    let end = run.shown_end(v.at).min(run.output_end(v.at));
    let mut out = Vec::with_capacity(end);
    for pos in 0..end {
        let (text, mut style) = match run.cell(pos, v.at) {
            CellState::Prompt { token } => (glyph::escape(run.piece(token), Mode::Prose), Style::default().fg(t.prompt_fg)),
            CellState::Decoded(d) => {
                let s = t.prose_style(d.step, span, d.conf);
                (glyph::escape(run.piece(d.token), Mode::Prose), if Some(d.at) == v.at { t.fresh(s) } else { s })
            }
            CellState::Masked { cand } => match cand.filter(|_| v.app.ghosts) {
                Some(c) => {
                    let ghost = format!("{}{}", glyph::MASK, glyph::escape(run.piece(c.token), Mode::Prose));
                    (Cow::Owned(ghost), t.faint().add_modifier(Modifier::ITALIC))
                }
                None => (Cow::Borrowed(glyph::MASK), Style::default().fg(t.mask_active_fg)),
            },
        };
        if v.focus == Some(pos) {
            style = style.add_modifier(Modifier::REVERSED);
        }
        out.push(Seg { text, style, pos });
    }
    out
}

/// Line starts of `segs` word-wrapped to `width` columns. A newline is drawn as `↵` and ends
/// its line; a word longer than the line is cut where it overflows.
fn wrap(segs: &[Seg], width: usize) -> Vec<Mark> {
    let width = width.max(1);
    let mut starts = vec![Mark { seg: 0, byte: 0 }];
    let mut col = 0;
    // After the last space of the current line: where it may break, and the column there.
    let mut brk: Option<(Mark, usize)> = None;
    for (si, seg) in segs.iter().enumerate() {
        let mut off = 0;
        for (g, w) in glyph::graphemes(&seg.text) {
            let here = Mark { seg: si, byte: off };
            off += g.len();
            let after = Mark { seg: si, byte: off };
            let w = if g == "\n" { 1 } else { w };
            if col > 0 && col + w > width {
                if let Some((m, c)) = brk.take() {
                    starts.push(m);
                    col -= c;
                }
                if col > 0 && col + w > width {
                    starts.push(here);
                    col = 0;
                }
            }
            col += w;
            if g == "\n" {
                starts.push(after);
                col = 0;
                brk = None;
            } else if g == " " {
                brk = Some((after, col));
            }
        }
    }
    starts
}

fn frame<'a>(v: &View, scrolled: Option<(usize, usize)>) -> Block<'a> {
    let t = v.theme;
    let generated = v.at.and_then(|k| v.run.step(k)).map_or(0, |s| s.tokens_total);
    let state = match scrolled {
        Some((top, total)) => Span::styled(format!(" line {}/{} ", top + 1, total), t.warn()),
        None => Span::styled(" following ", t.faint()),
    };
    Block::bordered()
        .border_style(t.border())
        .title(Line::from(vec![Span::styled(" Text ", t.title()), Span::styled(format!("{generated} tokens "), t.dim())]))
        .title_bottom(Line::from(state).right_aligned())
}

/// First line shown, total lines and lines that fit.
pub fn scroll_state(v: &View, area: Rect) -> (usize, usize, usize) {
    let inner = frame(v, None).inner(area);
    let total = wrap(&segments(v), inner.width as usize).len();
    top_of(v, total, inner.height as usize)
}

fn top_of(v: &View, total: usize, height: usize) -> (usize, usize, usize) {
    let max_top = total.saturating_sub(height);
    (v.app.text_top.map_or(max_top, |t| t.min(max_top)), total, height)
}

pub fn render(v: &View, area: Rect, buf: &mut Buffer) {
    let segs = segments(v);
    let inner = frame(v, None).inner(area);
    let starts = wrap(&segs, inner.width as usize);
    let (top, total, height) = top_of(v, starts.len(), inner.height as usize);
    let scrolled = v.app.text_top.is_some() && top < total.saturating_sub(height);
    frame(v, scrolled.then_some((top, total))).render(area, buf);
    for (i, line) in (top..starts.len()).take(height).enumerate() {
        let end = starts.get(line + 1).copied().unwrap_or(Mark { seg: segs.len(), byte: 0 });
        let spans = line_spans(&segs, starts[line], end);
        buf.set_line(inner.x, inner.y + i as u16, &Line::from(spans), inner.width);
    }
}

/// The pieces of segment text that make one wrapped line, from `start` up to `end`.
fn line_pieces<'s, 'a>(segs: &'s [Seg<'a>], start: Mark, end: Mark) -> impl Iterator<Item = (&'s Seg<'a>, &'s str)> {
    let last = segs.len().min(end.seg + 1);
    segs[start.seg.min(last)..last].iter().enumerate().filter_map(move |(i, seg)| {
        let si = start.seg + i;
        let from = if si == start.seg { start.byte } else { 0 };
        let to = if si == end.seg { end.byte } else { seg.text.len() };
        (from < to).then(|| (seg, &seg.text[from..to]))
    })
}

/// The spans of one wrapped line.
fn line_spans<'s>(segs: &'s [Seg], start: Mark, end: Mark) -> Vec<Span<'s>> {
    line_pieces(segs, start, end)
        .map(|(seg, piece)| {
            // set_line drops control characters: draw the newline's mark instead.
            let piece: Cow<str> = if piece.contains('\n') { Cow::Owned(piece.replace('\n', "↵")) } else { Cow::Borrowed(piece) };
            Span::styled(piece, seg.style)
        })
        .collect()
}

/// The position of the token under a click, if any.
pub fn hit(v: &View, area: Rect, at: Position) -> Option<usize> {
    let inner = frame(v, None).inner(area);
    if !inner.contains(at) {
        return None;
    }
    let segs = segments(v);
    let starts = wrap(&segs, inner.width as usize);
    let (top, _, _) = top_of(v, starts.len(), inner.height as usize);
    let line = top + (at.y - inner.y) as usize;
    let start = *starts.get(line)?;
    let end = starts.get(line + 1).copied().unwrap_or(Mark { seg: segs.len(), byte: 0 });
    let target = (at.x - inner.x) as usize;
    let mut col = 0;
    for (seg, piece) in line_pieces(&segs, start, end) {
        for (g, w) in glyph::graphemes(piece) {
            col += if g == "\n" { 1 } else { w };
            if col > target {
                return Some(seg.pos);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{self, Synth};
    use crate::ui::app::App;
    use crate::ui::testing::{render_panel, snapshot_text};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    fn seg(s: &str) -> Seg<'_> {
        Seg { text: Cow::Borrowed(s), style: Style::default(), pos: 0 }
    }

    fn lines(segs: &[Seg], width: usize) -> Vec<String> {
        let starts = wrap(segs, width);
        (0..starts.len())
            .map(|i| {
                let end = starts.get(i + 1).copied().unwrap_or(Mark { seg: segs.len(), byte: 0 });
                line_spans(segs, starts[i], end).iter().map(|s| s.content.as_ref()).collect()
            })
            .collect()
    }

    #[test]
    fn wraps_at_spaces_and_cuts_long_words() {
        let segs = [seg("The"), seg(" cat"), seg(" sat"), seg(" on"), seg(" the"), seg(" mat.")];
        assert_eq!(lines(&segs, 12), vec!["The cat sat ", "on the mat."]);
        let segs = [seg("abcdefghij")];
        assert_eq!(lines(&segs, 4), vec!["abcd", "efgh", "ij"]);
    }

    #[test]
    fn newlines_show_and_break() {
        let segs = [seg("a"), seg("\n"), seg("b\n\nc")];
        assert_eq!(lines(&segs, 10), vec!["a↵", "b↵", "↵", "c"]);
    }

    #[test]
    fn wide_characters_wrap_whole() {
        let segs = [seg("ab日本")];
        assert_eq!(lines(&segs, 5), vec!["ab日", "本"]);
    }

    fn app() -> App {
        App::replay(synth::trace(&Synth::small()), "t".into(), None)
    }

    fn key(app: &mut App, c: KeyCode) {
        app.on_key(KeyEvent::new(c, KeyModifiers::NONE));
    }

    #[test]
    fn text_at_the_head() {
        let mut app = app();
        key(&mut app, KeyCode::End);
        let buf = render_panel(&app, 40, 10, render);
        insta::assert_snapshot!(snapshot_text(&buf));
    }

    #[test]
    fn text_mid_decode_shows_the_active_block_s_masks() {
        let mut app = app();
        key(&mut app, KeyCode::Home);
        for _ in 0..7 {
            key(&mut app, KeyCode::Right);
        }
        let buf = render_panel(&app, 40, 10, render);
        insta::assert_snapshot!(snapshot_text(&buf));
    }

    #[test]
    fn text_follows_then_scrolls_by_hand() {
        let mut app = app();
        key(&mut app, KeyCode::End);
        let follow = snapshot_text(&render_panel(&app, 24, 6, render));
        app.text_top = Some(0);
        let top = snapshot_text(&render_panel(&app, 24, 6, render));
        assert_ne!(follow, top);
        assert!(top.contains("line 1/"), "{top}");
        assert!(follow.contains("following"), "{follow}");
        assert!(top.contains("The·cat") || top.contains("The cat"), "{top}");
    }

    #[test]
    fn a_click_on_a_word_selects_its_token() {
        let mut app = app();
        key(&mut app, KeyCode::End);
        app.text_top = Some(0);
        let v = app.view().unwrap();
        let area = Rect::new(0, 0, 40, 10);
        // "The cat sat..." begins the first line: column 5 is inside " cat" (position 1).
        assert_eq!(hit(&v, area, Position::new(1 + 5, 1)), Some(1));
        assert_eq!(hit(&v, area, Position::new(1, 1)), Some(0));
    }
}
