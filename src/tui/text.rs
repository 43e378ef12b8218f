//! The running output as prose: every token coloured by the step that decoded it, the active
//! block's masks visible, word-wrapped to the panel, following the decode unless scrolled.
//!
//! Wrapping 10,000 tokens every frame would cost more than everything else on screen, so the
//! line starts of the settled text (every block before the active one, which never changes
//! again) are kept in a cache, with a checkpoint at each block start. A frame wraps only the
//! active block, from its checkpoint, and builds spans only for the lines in view.

use std::borrow::Cow;

use ratatui::buffer::Buffer;
use ratatui::layout::{Position, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::app::View;
use crate::glyph::{self, Mode};
use crate::trace::detok::{self, Piece};
use crate::trace::store::{CellState, Run};

/// Where a line starts: a position and a byte offset in its drawn text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    pos: usize,
    byte: usize,
}

/// The wrapper's state between two tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct State {
    col: usize,
    /// After the last space of the current line: where it may break, and the column there.
    brk: Option<(Mark, usize)>,
}

/// Greedy word wrap, fed token by token. A newline is drawn as `↵` and ends its line; a word
/// longer than the line is cut where it overflows.
struct Wrapper<'a> {
    width: usize,
    state: State,
    starts: &'a mut Vec<Mark>,
}

impl Wrapper<'_> {
    fn feed(&mut self, pos: usize, text: &str) {
        let State { mut col, mut brk } = self.state;
        let width = self.width;
        let mut off = 0;
        for (g, w) in glyph::graphemes(text) {
            let here = Mark { pos, byte: off };
            off += g.len();
            let after = Mark { pos, byte: off };
            let w = if g == "\n" { 1 } else { w };
            if col > 0 && col + w > width {
                if let Some((m, c)) = brk.take() {
                    self.starts.push(m);
                    col -= c;
                }
                if col > 0 && col + w > width {
                    self.starts.push(here);
                    col = 0;
                }
            }
            col += w;
            if g == "\n" {
                self.starts.push(after);
                col = 0;
                brk = None;
            } else if g == " " {
                brk = Some((after, col));
            }
        }
        self.state = State { col, brk };
    }
}

/// Line starts of the settled text for one run and width.
#[derive(Debug, Default)]
pub struct TextCache {
    key: Option<(usize, usize)>,
    starts: Vec<Mark>,
    /// `checkpoints[b]`: lines started before block `b`, and the wrapper's state there.
    checkpoints: Vec<(usize, State)>,
}

impl TextCache {
    /// Makes sure the checkpoint of `block` exists, wrapping the settled blocks before it.
    fn ensure(&mut self, run: &Run, generation: usize, width: usize, block: usize) {
        if self.key != Some((generation, width)) {
            *self = TextCache {
                key: Some((generation, width)),
                starts: vec![Mark { pos: 0, byte: 0 }],
                checkpoints: vec![(1, State::default())],
            };
        }
        let b = run.block_length();
        while self.checkpoints.len() <= block {
            let done = self.checkpoints.len() - 1;
            let state = self.checkpoints[done].1;
            let mut w = Wrapper { width, state, starts: &mut self.starts };
            for pos in done * b..(done + 1) * b {
                w.feed(pos, &settled_text(run, pos));
            }
            let state = w.state;
            self.checkpoints.push((self.starts.len(), state));
        }
    }
}

/// The text of a cell that will not change again (prompt, or decoded at the head).
fn settled_text(run: &Run, pos: usize) -> Cow<'_, str> {
    match run.cell(pos, run.head()) {
        CellState::Prompt { .. } | CellState::Decoded(_) => prose(run, pos, run.head()),
        CellState::Masked { .. } => Cow::Borrowed(glyph::MASK),
    }
}

/// Bytes as hex in prose, which wraps at spaces: joined by no-break spaces, so that a line
/// never ends inside a group (`<D1` at the end of one line, `F2>` starting the next).
fn prose_hex(bytes: &[u8]) -> String {
    detok::hex(bytes).replace(' ', "\u{a0}")
}

/// The text a prompt or decoded cell adds at step `k`, or its bytes as hex while a masked
/// neighbour leaves them incomplete.
fn prose<'a>(run: &Run, pos: usize, k: Option<usize>) -> Cow<'a, str> {
    match run.cell_piece(pos, k) {
        Some(Piece::Text(t)) => {
            Cow::Owned(t.render_hex(|s| glyph::escape(s, Mode::Prose).into_owned(), prose_hex))
        }
        Some(Piece::Pending(b)) => Cow::Owned(prose_hex(&b)),
        None => Cow::Borrowed(""),
    }
}

/// A cell's text and style at the step shown.
fn display<'a>(v: &View<'a>, pos: usize) -> (Cow<'a, str>, Style) {
    let t = v.theme;
    let run = v.run;
    let (text, mut style) = match run.cell(pos, v.at) {
        CellState::Prompt { .. } => (prose(run, pos, v.at), Style::default().fg(t.prompt_fg)),
        CellState::Decoded(d) => {
            let s = t.prose_style(d.step, run.step_span(), d.conf);
            (prose(run, pos, v.at), if Some(d.at) == v.at { t.fresh(s) } else { s })
        }
        CellState::Masked { cand } => match cand.filter(|_| v.app.ghosts) {
            Some(c) => {
                let ghost = format!(
                    "{}{}",
                    glyph::MASK,
                    glyph::escape(&run.token_label(c.token), Mode::Prose)
                );
                (Cow::Owned(ghost), t.faint().add_modifier(Modifier::ITALIC))
            }
            None => (Cow::Borrowed(glyph::MASK), Style::default().fg(t.mask_active_fg)),
        },
    };
    if v.focus == Some(pos) {
        style = style.add_modifier(Modifier::REVERSED);
    }
    (text, style)
}

/// The wrapped text at the step shown: the cached settled lines plus the active block's.
struct Wrapped {
    settled: usize,
    extra: Vec<Mark>,
    /// One past the last position shown.
    end: usize,
}

impl Wrapped {
    fn new(v: &View, width: usize) -> Wrapped {
        let run = v.run;
        let active = run.active_block(v.at);
        let end = run.shown_end(v.at).min(run.output_end(v.at));
        let mut cache = v.app.text_cache.borrow_mut();
        cache.ensure(run, v.app.store.generation(), width.max(1), active);
        let (settled, state) = cache.checkpoints[active];
        let mut extra = Vec::new();
        let mut w = Wrapper { width: width.max(1), state, starts: &mut extra };
        for pos in active * run.block_length()..end {
            w.feed(pos, &display(v, pos).0);
        }
        Wrapped { settled, extra, end }
    }

    fn lines(&self) -> usize {
        self.settled + self.extra.len()
    }

    fn start(&self, v: &View, line: usize) -> Mark {
        match line.checked_sub(self.settled) {
            Some(i) => self.extra.get(i).copied().unwrap_or(Mark { pos: self.end, byte: 0 }),
            None => v.app.text_cache.borrow().starts[line],
        }
    }

    /// Each piece of one line: its position, its text from the line's start to its end, and
    /// its style.
    fn pieces<'a>(&self, v: &View<'a>, line: usize) -> Vec<(usize, Cow<'a, str>, Style)> {
        let (start, end) = (self.start(v, line), self.start(v, line + 1));
        let mut out = Vec::new();
        if self.end == 0 {
            return out;
        }
        for pos in start.pos..=end.pos.min(self.end - 1) {
            let (text, style) = display(v, pos);
            let from = if pos == start.pos { start.byte } else { 0 };
            let to = if pos == end.pos { end.byte } else { text.len() };
            if from < to && to <= text.len() {
                let piece = match text {
                    Cow::Borrowed(s) => Cow::Borrowed(&s[from..to]),
                    Cow::Owned(s) => Cow::Owned(s[from..to].to_string()),
                };
                out.push((pos, piece, style));
            }
        }
        out
    }
}

fn frame<'a>(v: &View, scrolled: Option<(usize, usize)>, end: usize) -> Block<'a> {
    let t = v.theme;
    // Every generated cell before the active block is decoded; only the active one needs a look.
    let p = v.run.prompt_len();
    let active_start = (v.run.active_block(v.at) * v.run.block_length()).max(p);
    let decoded = |pos: &usize| matches!(v.run.cell(*pos, v.at), CellState::Decoded(_));
    let generated = active_start.saturating_sub(p) + (active_start..end).filter(decoded).count();
    let state = match scrolled {
        Some((top, total)) => Span::styled(format!(" line {}/{} ", top + 1, total), t.warn()),
        None => Span::styled(" following ", t.faint()),
    };
    Block::bordered()
        .border_style(t.border())
        .title(Line::from(vec![
            Span::styled(" Text ", t.title()),
            Span::styled(format!("{} ", crate::format::count(generated, "token")), t.dim()),
        ]))
        .title_bottom(Line::from(state).right_aligned())
}

fn inner(area: Rect) -> Rect {
    Block::bordered().inner(area)
}

/// First line shown, total lines and lines that fit.
pub fn scroll_state(v: &View, area: Rect) -> (usize, usize, usize) {
    let inner = inner(area);
    let wrapped = Wrapped::new(v, inner.width as usize);
    top_of(v, wrapped.lines(), inner.height as usize)
}

fn top_of(v: &View, total: usize, height: usize) -> (usize, usize, usize) {
    let max_top = total.saturating_sub(height);
    (v.app.text_top.map_or(max_top, |t| t.min(max_top)), total, height)
}

pub fn render(v: &View, area: Rect, buf: &mut Buffer) {
    let inner = inner(area);
    let wrapped = Wrapped::new(v, inner.width as usize);
    let (top, total, height) = top_of(v, wrapped.lines(), inner.height as usize);
    let scrolled = v.app.text_top.is_some() && top < total.saturating_sub(height);
    frame(v, scrolled.then_some((top, total)), wrapped.end).render(area, buf);
    for (i, line) in (top..total).take(height).enumerate() {
        let spans: Vec<Span> = wrapped
            .pieces(v, line)
            .into_iter()
            .map(|(_, text, style)| {
                // set_line drops control characters: draw the newline's mark instead.
                let text =
                    if text.contains('\n') { Cow::Owned(text.replace('\n', "↵")) } else { text };
                Span::styled(text, style)
            })
            .collect();
        buf.set_line(inner.x, inner.y + i as u16, &Line::from(spans), inner.width);
    }
}

/// The position of the token under a click, if any.
pub fn hit(v: &View, area: Rect, at: Position) -> Option<usize> {
    let inner = inner(area);
    if !inner.contains(at) {
        return None;
    }
    let wrapped = Wrapped::new(v, inner.width as usize);
    let (top, total, _) = top_of(v, wrapped.lines(), inner.height as usize);
    let line = top + (at.y - inner.y) as usize;
    if line >= total {
        return None;
    }
    let target = (at.x - inner.x) as usize;
    let mut col = 0;
    for (pos, text, _) in wrapped.pieces(v, line) {
        for (g, w) in glyph::graphemes(&text) {
            col += if g == "\n" { 1 } else { w };
            if col > target {
                return Some(pos);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};
    use crate::tui::app::App;
    use crate::tui::testing::{render_panel, snapshot_text};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    /// Wraps `tokens` (one position each) and returns the lines' texts.
    fn lines(tokens: &[&str], width: usize) -> Vec<String> {
        let mut starts = vec![Mark { pos: 0, byte: 0 }];
        let mut w = Wrapper { width, state: State::default(), starts: &mut starts };
        for (pos, t) in tokens.iter().enumerate() {
            w.feed(pos, t);
        }
        starts.push(Mark { pos: tokens.len(), byte: 0 });
        starts
            .windows(2)
            .map(|m| {
                let (a, b) = (m[0], m[1]);
                (a.pos..=b.pos.min(tokens.len() - 1))
                    .map(|p| {
                        let t = tokens[p];
                        let from = if p == a.pos { a.byte } else { 0 };
                        let to = if p == b.pos { b.byte } else { t.len() };
                        t.get(from..to).unwrap_or("").replace('\n', "↵")
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn wraps_at_spaces_and_cuts_long_words() {
        assert_eq!(
            lines(&["The", " cat", " sat", " on", " the", " mat."], 12),
            vec!["The cat sat ", "on the mat."]
        );
        assert_eq!(lines(&["abcdefghij"], 4), vec!["abcd", "efgh", "ij"]);
    }

    #[test]
    fn newlines_show_and_break() {
        assert_eq!(lines(&["a", "\n", "b\n\nc"], 10), vec!["a↵", "b↵", "↵", "c"]);
    }

    /// Invalid bytes (`<E4 BD>`) are one word to the wrap: a line broken at a space never
    /// ends inside a group, which left `<E4` at a line's end and `BD>` at the next's start.
    #[test]
    fn hex_bytes_wrap_as_one_word() {
        let events = synth::invalid_split_trace();
        let mut app = App::replay(events, "t".into(), None);
        key(&mut app, KeyCode::End);
        let mut seen = false;
        for w in 10..30u16 {
            let text = snapshot_text(&render_panel(&app, w, 8, render));
            seen |= text.contains("<E4\u{a0}BD>");
            for l in text.lines().skip(1) {
                let inner = l.trim_start_matches('│').trim_end_matches('│');
                let open = inner.rfind('<').is_some_and(|i| inner.rfind('>').is_none_or(|j| j < i));
                // a group too long for a whole line may be cut where it overflows, not elsewhere
                let full = glyph::width(inner.trim_end_matches(' ')) == usize::from(w - 2);
                assert!(!open || full, "{w}: a line ends inside a hex group:\n{text}");
            }
        }
        assert!(seen, "the hex groups are drawn whole at some width");
    }

    #[test]
    fn wide_characters_wrap_whole() {
        assert_eq!(lines(&["ab日本"], 5), vec!["ab日", "本"]);
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
        assert!(top.contains("The cat"), "{top}");
    }

    /// The cache must give exactly what wrapping everything from scratch gives, wherever the
    /// cursor goes and whatever width comes.
    #[test]
    fn cached_wrap_equals_a_fresh_wrap_at_every_step() {
        let mut app = app();
        key(&mut app, KeyCode::End);
        let head = app.view().unwrap().at.unwrap();
        for width in [7, 23, 40] {
            for k in (0..=head).rev() {
                app.cursor.home(app.store.run().unwrap());
                for _ in 0..k {
                    app.cursor.step_forward(app.store.run().unwrap());
                }
                let cached = snapshot_text(&render_panel(&app, width + 2, 12, render));
                *app.text_cache.borrow_mut() = TextCache::default();
                let fresh = snapshot_text(&render_panel(&app, width + 2, 12, render));
                assert_eq!(cached, fresh, "width {width}, step {k}");
            }
        }
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
        assert_eq!(hit(&v, area, Position::new(1, 8)), None, "below the text");
    }
}
