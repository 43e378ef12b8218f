//! The block grid: one row per block, one cell per position. A decoded cell is filled with the
//! hue of the step that decoded it, as bright as the model was confident; a masked cell shows
//! the mask glyph; the block being decoded is marked `▶` and lit; prompt blocks sit above a
//! rule, in grey; a cell whose token a later step replaced (token editing) starts with `✎`. Only the rows in view are drawn, so a 10,000-token decode costs what a
//! 100-token one does.

use ratatui::buffer::Buffer;
use ratatui::layout::{Position, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Widget};

use super::app::View;
use super::theme;
use crate::glyph::{self, Mode};
use crate::trace::detok::{self, Piece};
use crate::trace::store::CellState;

/// Cells are this wide where the panel has room, or wider where the run's tokens need it (a
/// wide window showed `setVisib…` beside empty columns), up to [`WIDEST_CELL`].
const MAX_CELL: u16 = 10;
/// Beyond this a cell would only show more of a rare long token (a run of spaces, a URL).
const WIDEST_CELL: u16 = 24;
/// Columns of a cell besides its token: the step mark and the confidence bar.
const CELL_EXTRA: usize = 2;

/// How a block's cells map onto columns and lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geom {
    label_w: u16,
    cell_w: u16,
    gap: u16,
    /// Cells per line; a block wider than the panel continues on the next line.
    per_line: usize,
    lines_per_block: usize,
}

fn geom(v: &View, width: u16) -> Geom {
    let b = v.run.block_length();
    let digits = (v.run.max_blocks().saturating_sub(1)).max(1).ilog10() as u16 + 1;
    let label_w = digits + 3;
    let avail = width.saturating_sub(label_w).max(1) as usize;
    let per_cell = avail / b;
    let cap = (v.run.widest_token() + CELL_EXTRA).clamp(MAX_CELL as usize, WIDEST_CELL as usize);
    let (cell_w, gap) = match per_cell {
        w if w >= 4 => ((w - 1).min(cap) as u16, 1),
        w if w >= 1 => (w as u16, 0),
        _ => (1, 0),
    };
    let per_line = (avail / (cell_w + gap) as usize).clamp(1, b);
    Geom { label_w, cell_w, gap, per_line, lines_per_block: b.div_ceil(per_line) }
}

/// What one line of the grid holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    Block {
        block: usize,
        sub: usize,
    },
    /// The rule between the prompt blocks and the decoded ones.
    Rule,
}

/// The grid's lines: prompt blocks, a rule, then decode blocks up to the active one.
struct Lines {
    first_block: usize,
    lpb: usize,
    rule: usize,
    shown_blocks: usize,
}

impl Lines {
    fn new(v: &View, g: &Geom) -> Self {
        let first_block = v.run.header.first_block;
        Lines {
            first_block,
            lpb: g.lines_per_block,
            rule: usize::from(first_block > 0),
            shown_blocks: v.run.active_block(v.at) + 1,
        }
    }

    fn total(&self) -> usize {
        self.shown_blocks * self.lpb + self.rule
    }

    fn line_of(&self, block: usize) -> usize {
        if block < self.first_block {
            block * self.lpb
        } else {
            block * self.lpb + self.rule
        }
    }

    fn row(&self, line: usize) -> Option<Row> {
        let prompt_lines = self.first_block * self.lpb;
        if line >= self.total() {
            return None;
        }
        if line < prompt_lines {
            return Some(Row::Block { block: line / self.lpb, sub: line % self.lpb });
        }
        if self.rule == 1 && line == prompt_lines {
            return Some(Row::Rule);
        }
        let l = line - self.rule;
        Some(Row::Block { block: l / self.lpb, sub: l % self.lpb })
    }
}

fn frame<'a>(v: &View) -> Block<'a> {
    let t = v.theme;
    Block::bordered()
        .border_style(t.border())
        .title(Line::from(vec![Span::styled(" Blocks ", t.title())]))
}

/// Step hues (or, without colour, how cells carry their step) and the confidence marks, drawn
/// into the bottom border. Steps are numbered from 1.
fn legend<'a>(v: &View, width: u16) -> Line<'a> {
    let t = v.theme;
    let span = v.run.step_span();
    let conf = format!("  conf {}…{} ", theme::conf_mark(0.1), theme::conf_mark(1.0));
    let masked = format!(" {} masked ", glyph::MASK);
    // Named only in a run that has edits: a legend for every other run stays as it was.
    let edited =
        if v.run.has_edits() { format!("· {} edited ", glyph::EDIT) } else { String::new() };
    if t.mono() {
        let steps = format!("{}…{}", theme::superscript(1), theme::superscript(span));
        let marks = format!(" step {steps} before the token,");
        let full = format!("{marks}{conf}after it ·{masked}{edited}");
        if edited.is_empty() || glyph::width(&full) + 2 <= width as usize {
            return Line::from(Span::styled(full, t.dim()));
        }
        // The edit mark is named whole, before the confidence key's words give way.
        let bars = format!("{}…{}", theme::conf_mark(0.1), theme::conf_mark(1.0));
        let short = [
            format!(" step {steps} {} edited before the token, conf {bars} after ", glyph::EDIT),
            format!(" {steps} step {} edited · {bars} conf ·{masked}", glyph::EDIT),
        ];
        let fits = |l: &&String| glyph::width(l) + 2 <= width as usize;
        let pick = short.iter().find(fits).unwrap_or(&short[1]);
        return Line::from(Span::styled(pick.clone(), t.dim()));
    }
    let mut s = vec![Span::styled(" step ", t.dim())];
    let fixed = 6 + conf.chars().count() + masked.chars().count() + edited.chars().count() + 2;
    let w = legend_label_w(span);
    for step in legend_steps(span, (width as usize).saturating_sub(fixed)) {
        // Each step a swatch of its hue, its number centred with a blank column at least
        // beside it, so that `9` and `10` never run together into `910`.
        s.push(Span::styled(format!("{:^w$}", step + 1), t.cell_style(step, span)));
    }
    s.push(Span::styled(conf, t.dim()));
    s.push(Span::styled(masked, t.dim()));
    if !edited.is_empty() {
        s.push(Span::styled("· ", t.dim()));
        s.push(Span::styled(format!("{} ", glyph::EDIT), t.edit_mark()));
        s.push(Span::styled("edited ", t.dim()));
    }
    Line::from(s)
}

/// A legend swatch's columns: the widest step number and a blank, at least 3.
fn legend_label_w(span: usize) -> usize {
    (span.to_string().len() + 1).max(3)
}

/// Which steps (0-based) the legend names in `room` columns: all when they fit, else the
/// first, the last and evenly spaced ones between.
fn legend_steps(span: usize, room: usize) -> Vec<usize> {
    let fit = (room / legend_label_w(span)).max(2);
    if span <= fit {
        return (0..span).collect();
    }
    let mut out: Vec<usize> = (0..fit).map(|i| i * (span - 1) / (fit - 1)).collect();
    out.dedup();
    out
}

/// First line shown, total lines and lines that fit.
pub fn scroll_state(v: &View, area: Rect) -> (usize, usize, usize) {
    let inner = frame(v).inner(area);
    let g = geom(v, inner.width);
    let lines = Lines::new(v, &g);
    let height = inner.height as usize;
    let total = lines.total();
    let max_top = total.saturating_sub(height);
    let follow = (lines.line_of(v.run.active_block(v.at)) + lines.lpb).saturating_sub(height);
    (v.app.grid_top.map_or(follow, |t| t.min(max_top)), total, height)
}

/// The first line to show so that `pos` is in view, moving as little as possible.
pub fn reveal(v: &View, area: Rect, pos: usize) -> usize {
    let inner = frame(v).inner(area);
    let g = geom(v, inner.width);
    let lines = Lines::new(v, &g);
    let b = v.run.block_length();
    let line = lines.line_of(pos / b) + (pos % b) / g.per_line;
    let (top, _, height) = scroll_state(v, area);
    if line < top {
        line
    } else if line >= top + height {
        line + 1 - height
    } else {
        top
    }
}

/// The position under a mouse click, if a shown cell is there.
pub fn hit(v: &View, area: Rect, at: Position) -> Option<usize> {
    let inner = frame(v).inner(area);
    if !inner.contains(at) {
        return None;
    }
    let g = geom(v, inner.width);
    let lines = Lines::new(v, &g);
    let (top, _, _) = scroll_state(v, area);
    let Row::Block { block, sub } = lines.row(top + (at.y - inner.y) as usize)? else {
        return None;
    };
    let x = (at.x - inner.x).checked_sub(g.label_w)?;
    let pitch = g.cell_w + g.gap;
    if x % pitch >= g.cell_w {
        return None;
    }
    let col = (x / pitch) as usize;
    let b = v.run.block_length();
    let pos = block * b + sub * g.per_line + col;
    (col < g.per_line && pos < (block + 1) * b).then_some(pos)
}

/// Where `pos` is drawn, if it is in view (the inverse of `hit`): compare mode marks cells.
pub fn cell_area(v: &View, area: Rect, pos: usize) -> Option<Rect> {
    let inner = frame(v).inner(area);
    let g = geom(v, inner.width);
    let lines = Lines::new(v, &g);
    let (top, _, _) = scroll_state(v, area);
    let (b, block) = (v.run.block_length(), pos / v.run.block_length());
    if block >= lines.shown_blocks {
        return None;
    }
    let line = (lines.line_of(block) + (pos % b) / g.per_line).checked_sub(top)?;
    if line >= inner.height as usize {
        return None;
    }
    let x = inner.x + g.label_w + ((pos % b) % g.per_line) as u16 * (g.cell_w + g.gap);
    Some(Rect::new(x, inner.y + line as u16, g.cell_w, 1).intersection(inner))
}

/// Where a one-column mark for `pos` goes (compare mode's `≠`, `≈`): the blank column before
/// the cell (the gap between cells, or the label's trailing space), else, when cells abut, the
/// cell's first column.
pub fn mark_at(v: &View, area: Rect, pos: usize) -> Option<Position> {
    let r = cell_area(v, area, pos)?;
    let g = geom(v, frame(v).inner(area).width);
    let first_in_line = (pos % v.run.block_length()).is_multiple_of(g.per_line);
    let x = if g.gap > 0 || first_in_line { r.x - 1 } else { r.x };
    Some(Position::new(x, r.y))
}

pub fn render(v: &View, area: Rect, buf: &mut Buffer) {
    let block = frame(v).title_bottom(legend(v, area.width));
    let inner = block.inner(area);
    block.render(area, buf);
    let g = geom(v, inner.width);
    let lines = Lines::new(v, &g);
    let (top, _, _) = scroll_state(v, area);
    for y in 0..inner.height {
        let Some(row) = lines.row(top + y as usize) else { break };
        let line = Rect { y: inner.y + y, height: 1, ..inner };
        match row {
            Row::Rule => rule(v, line, buf),
            Row::Block { block, sub } => block_line(v, &g, block, sub, line, buf),
        }
    }
}

fn rule(v: &View, area: Rect, buf: &mut Buffer) {
    let label = " decode ";
    let w = area.width as usize;
    let left = 2.min(w);
    let text =
        format!("{}{label}{}", "┄".repeat(left), "┄".repeat(w.saturating_sub(left + label.len())));
    buf.set_stringn(area.x, area.y, text, w, v.theme.faint());
}

fn block_line(v: &View, g: &Geom, block: usize, sub: usize, area: Rect, buf: &mut Buffer) {
    let t = v.theme;
    let active = block == v.run.active_block(v.at) && v.at.is_some();
    let prompt = block < v.run.header.first_block;
    if active {
        buf.set_style(area, Style::default().bg(t.active_row_bg));
    }
    if sub == 0 {
        let marker = if active { '▶' } else { ' ' };
        let style = if active {
            t.title()
        } else if prompt {
            t.faint()
        } else {
            t.dim()
        };
        let label = format!("{marker}{block:>w$} ", w = (g.label_w - 3) as usize);
        buf.set_stringn(area.x, area.y, label, g.label_w as usize, style);
    }
    let b = v.run.block_length();
    let first = block * b + sub * g.per_line;
    let last = ((block + 1) * b).min(first + g.per_line);
    for (i, pos) in (first..last).enumerate() {
        let x = area.x + g.label_w + i as u16 * (g.cell_w + g.gap);
        if x + g.cell_w > area.right() {
            break;
        }
        let c = cell(v, pos, active);
        let (text, edit_at) = c.layout(g.cell_w as usize);
        buf.set_stringn(x, area.y, text, g.cell_w as usize, c.style);
        if let Some(col) = edit_at {
            // The glyph in the edit colour over the cell's own fill.
            let style = c.style.patch(v.theme.edit_mark());
            buf.set_stringn(x + col as u16, area.y, glyph::EDIT, 1, style);
        }
    }
}

/// A decoded cell keeps its confidence bar from this width on: one column of token and the bar.
const BAR_FROM: usize = 2;

/// What one grid cell shows: a step mark (no colour), the token, a confidence mark.
struct Cell {
    /// Superscript step number, when there is no colour to say it.
    mark: String,
    /// Its token replaced one it held before (token editing): `✎` after the step mark.
    edit: bool,
    text: String,
    /// `text` is a fill (a mask's `░░░`), cut to the cell without `…`; a token is cut with it.
    fill: bool,
    /// Confidence of a decoded cell, drawn as a bar glyph in its last column.
    conf: Option<f32>,
    style: Style,
}

impl Cell {
    /// The cell in `w` columns: the step mark (whole or not at all: `¹` of `¹⁶` would be
    /// another step), the confidence bar in the last column from `BAR_FROM` columns on, and
    /// the token in what is left, ending in `…` when cut (a token with no room at all is
    /// read in the inspector).
    #[cfg(test)]
    fn draw(&self, w: usize) -> String {
        self.layout(w).0
    }

    /// [`Cell::draw`]'s text, and the column of the edit glyph when it has one and room for it
    /// (after the step mark: the mark, then the glyph, then the bar, then the token get room).
    fn layout(&self, w: usize) -> (String, Option<usize>) {
        let mark_w = glyph::width(&self.mark);
        let mark = if mark_w <= w { self.mark.as_str() } else { "" };
        let mut left = w - glyph::width(mark);
        let edit_at = (self.edit && left >= 1).then(|| w - left);
        left -= usize::from(edit_at.is_some());
        let edit = if edit_at.is_some() { glyph::EDIT } else { "" };
        let bar = self.conf.filter(|_| w >= BAR_FROM && left >= 1).map(theme::conf_mark);
        let room = left - usize::from(bar.is_some());
        let (fitted, tw) = if self.fill {
            fit_fill(&self.text, room)
        } else {
            let (f, fw) = glyph::fit(&self.text, room);
            (f.into_owned(), fw)
        };
        let mut out = format!("{mark}{edit}{fitted}{}", " ".repeat(room - tw));
        out.extend(bar);
        (out, edit_at)
    }
}

/// The text of a prompt or decoded cell at the step shown: what it adds to the cells before it,
/// its bytes as hex while a masked neighbour leaves them incomplete, `→` when a later cell
/// completes (and shows) the character it starts.
fn cell_text(v: &View, pos: usize) -> String {
    match v.run.cell_piece(pos, v.at) {
        Some(Piece::Text(t)) if t.is_empty() => glyph::PART.to_string(),
        // Invalid bytes as hex (`<F2>`), never `�`.
        Some(Piece::Text(t)) => t.render(|s| glyph::escape(s, Mode::Cell).into_owned()),
        Some(Piece::Pending(b)) => detok::hex(&b),
        None => String::new(),
    }
}

/// A cell at the step shown.
fn cell(v: &View, pos: usize, active: bool) -> Cell {
    let t = v.theme;
    let span = v.run.step_span();
    let plain = |text: String, style| Cell {
        mark: String::new(),
        edit: false,
        text,
        fill: false,
        conf: None,
        style,
    };
    let mut c = match v.run.cell(pos, v.at) {
        CellState::Prompt { .. } => plain(cell_text(v, pos), t.prompt()),
        CellState::Decoded(d) => {
            let text = cell_text(v, pos);
            let mark = if t.mono() { theme::superscript(d.step + 1) } else { String::new() };
            // Dropped (past the output): grey and struck through, but its confidence and,
            // committed by the step shown, the fresh mark stay, so the step shown always
            // shows where it committed.
            let s = if pos >= v.run.output_end(v.at) {
                t.faint().add_modifier(Modifier::CROSSED_OUT)
            } else {
                t.cell_style(d.step, span)
            };
            // Fresh: committed or edited by the step shown.
            let style = if Some(d.at) == v.at { t.fresh(s) } else { s };
            Cell { mark, edit: d.edited(), text, fill: false, conf: Some(d.conf), style }
        }
        CellState::Masked { cand } => {
            let fg = if active { t.mask_active_fg } else { t.mask_fg };
            match cand.filter(|_| v.app.ghosts) {
                // Still a mask: the glyph first, then what the model would pick now.
                Some(c) => plain(
                    format!(
                        "{}{}",
                        glyph::MASK,
                        glyph::escape(&v.run.token_label(c.token), Mode::Cell)
                    ),
                    Style::default().fg(fg).add_modifier(Modifier::ITALIC),
                ),
                None => Cell {
                    fill: true,
                    ..plain(glyph::MASK.repeat(WIDEST_CELL as usize), Style::default().fg(fg))
                },
            }
        }
    };
    if v.focus == Some(pos) {
        c.style = c.style.add_modifier(Modifier::REVERSED | Modifier::BOLD);
    }
    c
}

/// A fill pattern cut to `w` columns, without `…`.
fn fit_fill(text: &str, w: usize) -> (String, usize) {
    let mut out = String::new();
    let mut used = 0;
    for (g, gw) in glyph::graphemes(text) {
        if used + gw > w {
            break;
        }
        out.push_str(g);
        used += gw;
    }
    (out, used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{self, Synth};
    use crate::tui::app::App;
    use crate::tui::testing::{render_panel, snapshot_text};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    fn app_at_head() -> App {
        App::replay(synth::trace(&Synth::small()), "t".into(), None)
    }

    fn key(app: &mut App, c: KeyCode) {
        app.on_key(KeyEvent::new(c, KeyModifiers::NONE));
    }

    #[test]
    fn cell_area_is_where_a_click_hits() {
        let mut app = app_at_head();
        key(&mut app, KeyCode::End);
        let v = app.view().unwrap();
        let area = Rect::new(3, 2, 40, 10);
        let mut shown = 0;
        for pos in 0..v.run.shown_end(v.at) {
            let Some(r) = cell_area(&v, area, pos) else { continue };
            shown += 1;
            assert_eq!(hit(&v, area, Position::new(r.x, r.y)), Some(pos));
            assert_eq!(hit(&v, area, Position::new(r.right() - 1, r.y)), Some(pos));
        }
        assert!(shown > 8, "{shown} cells in view");
    }

    /// Prompt `x ≈ ∑` and output ` 你好 🤖 okx`, every character split across tokens.
    fn split_app() -> App {
        App::replay(synth::split_trace(), "t".into(), None)
    }

    #[test]
    fn grid_of_split_characters_at_the_head() {
        let mut app = split_app();
        key(&mut app, KeyCode::End);
        let buf = render_panel(&app, 64, 8, render);
        let text = snapshot_text(&buf);
        assert!(!text.contains('\u{FFFD}'), "{text}");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn grid_of_split_characters_shows_bytes_waiting_on_a_mask_as_hex() {
        let mut app = split_app();
        // Home shows step 0 (cell 7 decoded); one step on, cell 6 too, 5 (the start of 你)
        // still masked.
        key(&mut app, KeyCode::Home);
        key(&mut app, KeyCode::Right);
        assert_eq!(app.view().unwrap().at, Some(1));
        let buf = render_panel(&app, 64, 8, render);
        let text = snapshot_text(&buf);
        assert!(text.contains("<A0 E5>") && text.contains('好'), "{text}");
        insta::assert_snapshot!(text);
    }

    #[test]
    fn grid_at_the_head() {
        let mut app = app_at_head();
        key(&mut app, KeyCode::End);
        let buf = render_panel(&app, 64, 14, render);
        insta::assert_snapshot!(snapshot_text(&buf));
    }

    #[test]
    fn grid_mid_block_shows_masks_and_the_active_block() {
        let mut app = app_at_head();
        key(&mut app, KeyCode::Home);
        for _ in 0..4 {
            key(&mut app, KeyCode::Right);
        }
        let buf = render_panel(&app, 64, 14, render);
        insta::assert_snapshot!(snapshot_text(&buf));
    }

    #[test]
    fn grid_with_candidates_shown() {
        let mut app = app_at_head();
        key(&mut app, KeyCode::Home);
        for _ in 0..3 {
            key(&mut app, KeyCode::Right);
        }
        key(&mut app, KeyCode::Char('c'));
        let buf = render_panel(&app, 64, 14, render);
        insta::assert_snapshot!(snapshot_text(&buf));
    }

    #[test]
    fn grid_narrow_cells_and_scrolled_to_the_active_block() {
        let mut app = app_at_head();
        key(&mut app, KeyCode::End);
        let buf = render_panel(&app, 24, 8, render);
        insta::assert_snapshot!(snapshot_text(&buf));
    }

    #[test]
    fn cells_are_coloured_by_their_step() {
        let mut app = app_at_head();
        key(&mut app, KeyCode::End);
        let buf = render_panel(&app, 64, 14, render);
        let v = app.view().unwrap();
        let g = geom(&v, 62);
        // Line 5 is block 3 (border, prompt block 0, the rule, blocks 1, 2, 3): its four cells
        // were decoded at the four different steps of the block, so four different hues.
        let bg = |i: u16| buf[(1 + g.label_w + i * (g.cell_w + g.gap), 5)].bg;
        let mut steps = vec![];
        for (i, pos) in (12..16).enumerate() {
            let CellState::Decoded(d) = v.run.cell(pos, v.at) else { panic!() };
            steps.push((d.step, bg(i as u16)));
        }
        steps.sort_by_key(|s| s.0);
        assert_eq!(steps.iter().map(|s| s.0).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        for (i, a) in steps.iter().enumerate() {
            for b in &steps[i + 1..] {
                assert_ne!(a.1, b.1, "steps {} and {} share a fill", a.0, b.0);
            }
        }
    }

    #[test]
    fn a_click_selects_the_cell_under_it() {
        let mut app = app_at_head();
        key(&mut app, KeyCode::End);
        let area = Rect::new(0, 0, 64, 14);
        let v = app.view().unwrap();
        let g = geom(&v, 62);
        // Line 3 inside the border is block 2 (prompt block 0, the rule, block 1, block 2).
        let y = 1 + 3;
        let x = 1 + g.label_w + (g.cell_w + g.gap) + 1; // second cell
        assert_eq!(hit(&v, area, Position::new(x, y)), Some(2 * 4 + 1));
        assert_eq!(hit(&v, area, Position::new(1, y)), None, "the label is no cell");
        assert_eq!(hit(&v, area, Position::new(x, 1 + 1)), None, "the rule is no cell");
    }

    /// A finished decode with `steps` steps per block (blocks as long), drawn in `theme`.
    fn grid_in(steps: usize, name: theme::ThemeName, depth: theme::Depth, w: u16) -> Buffer {
        let cfg = Synth { block_length: steps, steps, new_tokens: 2 * steps, ..Synth::small() };
        let mut app = App::replay(synth::trace(&cfg), "t".into(), None);
        app.theme = theme::pick(name, depth);
        key(&mut app, KeyCode::End);
        render_panel(&app, w, 7, render)
    }

    fn has_colour(buf: &Buffer) -> bool {
        use ratatui::style::Color;
        buf.content.iter().any(|c| c.fg != Color::Reset || c.bg != Color::Reset)
    }

    #[test]
    fn mono_grid_marks_every_decoded_cell_with_its_step() {
        use theme::{Depth, ThemeName};
        for steps in [4, 16] {
            let buf = grid_in(steps, ThemeName::Dark, Depth::Mono, 100);
            assert!(!has_colour(&buf), "mono draws no colour");
            let s = snapshot_text(&buf);
            // The last decode block's cells carry superscript steps 1..=steps between them.
            assert!(
                s.contains(&theme::superscript(1)) && s.contains(&theme::superscript(steps)),
                "{s}"
            );
            insta::assert_snapshot!(format!("mono_{steps}_steps"), s);
        }
    }

    #[test]
    fn light_and_256_colour_grids() {
        use theme::{Depth, ThemeName};
        for steps in [4, 16] {
            let light = grid_in(steps, ThemeName::Light, Depth::TrueColor, 100);
            insta::assert_snapshot!(
                format!("light_{steps}_steps"),
                crate::tui::testing::snapshot_styled(&light)
            );
            let indexed = grid_in(steps, ThemeName::Dark, Depth::Ansi256, 100);
            let rgb =
                indexed.content.iter().any(|c| matches!(c.bg, ratatui::style::Color::Rgb(..)));
            assert!(!rgb, "the 256-colour grid uses no 24-bit colour");
            insta::assert_snapshot!(
                format!("ansi256_{steps}_steps"),
                crate::tui::testing::snapshot_styled(&indexed)
            );
        }
    }

    #[test]
    fn legend_names_first_last_and_steps_between() {
        assert_eq!(legend_steps(4, 40), vec![0, 1, 2, 3]);
        assert_eq!(legend_steps(16, 48), (0..16).collect::<Vec<_>>());
        let few = legend_steps(16, 18);
        assert_eq!((few[0], *few.last().unwrap(), few.len()), (0, 15, 6), "{few:?}");
        // Every number stands apart: 16 steps read `8  9 10 11`, never `8 910111213141516`.
        for (steps, w, want) in [
            (4, 100, "step  1  2  3  4   conf"),
            (16, 100, "step  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16   conf"),
        ] {
            let buf = grid_in(steps, theme::ThemeName::Dark, theme::Depth::TrueColor, w);
            let bottom = snapshot_text(&buf).lines().last().unwrap().to_string();
            assert!(bottom.contains(want), "{bottom}");
        }
        // The 140-column screen's grid (77 columns) names all 16; narrower, some, still apart.
        let bottom =
            snapshot_text(&grid_in(16, theme::ThemeName::Dark, theme::Depth::TrueColor, 77))
                .lines()
                .last()
                .unwrap()
                .to_string();
        assert!(bottom.contains(" 9 10 11 ") && bottom.contains("16 "), "{bottom}");
        let bottom =
            snapshot_text(&grid_in(16, theme::ThemeName::Dark, theme::Depth::TrueColor, 50))
                .lines()
                .last()
                .unwrap()
                .to_string();
        assert!(
            bottom.contains("step  1 ") && bottom.contains(" 16 ") && !bottom.contains("910"),
            "{bottom}"
        );
    }

    /// 16 cells a row of 3 columns (the 140-column screen) keep their confidence bars, and a
    /// token cut to fit ends in `…`; a dropped cell keeps its bar too.
    #[test]
    fn narrow_cells_keep_the_confidence_bar_and_mark_a_cut() {
        let c = |text: &str, mark: &str, conf| Cell {
            mark: mark.into(),
            edit: false,
            text: text.into(),
            fill: false,
            conf,
            style: Style::default(),
        };
        assert_eq!(c("·my", "", Some(1.0)).draw(3), "·…█");
        assert_eq!(c("M", "", Some(0.3)).draw(3), "M ▃");
        assert_eq!(c("·my", "", Some(1.0)).draw(2), "…█");
        assert_eq!(c("M", "", Some(1.0)).draw(2), "M█");
        assert_eq!(c("·my", "", Some(1.0)).draw(4), "·my█");
        assert_eq!(
            c("·my", "", Some(1.0)).draw(1),
            "…",
            "no room for a bar: the cell says it holds more"
        );
        // Mono: the step mark whole first, then the bar, then the token.
        assert_eq!(c("·my", "⁹", Some(0.8)).draw(3), "⁹…▇");
        assert_eq!(c("·my", "¹⁶", Some(0.8)).draw(3), "¹⁶▇");
        assert_eq!(c("·my", "¹⁶", Some(0.8)).draw(2), "¹⁶");
        assert_eq!(c("·my", "¹⁶", Some(0.8)).draw(1), "…", "never half a step number");
        // A prompt token has no bar; a mask is a fill, cut without `…`.
        assert_eq!(c("·lord", "", None).draw(3), "·l…");
        let mask = Cell { fill: true, ..c(&glyph::MASK.repeat(10), "", None) };
        assert_eq!(mask.draw(3), "░░░");
    }

    /// The synthetic decode's last step commits only cells past `max_new_tokens`: they are
    /// struck through, and still show their confidence and, as the step shown's commits, the
    /// fresh mark, so the current step is visible on screen.
    #[test]
    fn dropped_cells_keep_their_bar_and_the_fresh_mark() {
        let mut app = app_at_head();
        key(&mut app, KeyCode::End);
        let v = app.view().unwrap();
        let (k, end) = (v.at.unwrap(), v.run.output_end(v.at));
        let first = v.run.step(k).unwrap().first_commit.unwrap();
        assert!(first >= end, "the fixture ends on a dropped commit");
        let area = Rect::new(0, 0, 64, 14);
        let buf = render_panel(&app, 64, 14, render);
        let r = cell_area(&v, area, first).unwrap();
        let CellState::Decoded(d) = v.run.cell(first, v.at) else { panic!() };
        assert_eq!(
            buf[(r.right() - 1, r.y)].symbol(),
            theme::conf_mark(d.conf).to_string(),
            "the bar in the last column"
        );
        let m = buf[(r.x, r.y)].modifier;
        assert!(m.contains(Modifier::CROSSED_OUT | Modifier::BOLD | Modifier::UNDERLINED), "{m:?}");
        // A dropped cell of an earlier step: struck through and barred, not fresh.
        let older = (end..v.run.shown_end(v.at))
            .find(|&p| matches!(v.run.cell(p, v.at), CellState::Decoded(d) if d.at < k))
            .unwrap();
        let r = cell_area(&v, area, older).unwrap();
        let m = buf[(r.x, r.y)].modifier;
        assert!(m.contains(Modifier::CROSSED_OUT) && !m.contains(Modifier::UNDERLINED), "{m:?}");
        assert!(
            glyph::width(buf[(r.right() - 1, r.y)].symbol()) == 1
                && "▁▂▃▄▅▆▇█".contains(buf[(r.right() - 1, r.y)].symbol())
        );
    }

    /// The editing trace at step index `k` (Home, then `k` steps on).
    fn edits_app_at(k: usize) -> App {
        let mut app = App::replay(synth::trace(&Synth::small_edits()), "t".into(), None);
        key(&mut app, KeyCode::Home);
        for _ in 0..k {
            key(&mut app, KeyCode::Right);
        }
        assert_eq!(app.view().unwrap().at, Some(k));
        app
    }

    /// Step index 7 is block 2's post-step, which replaced the tokens of positions 10 and 11:
    /// both start with `✎` (11 was edited at step 4 already), fresh; a step back shows them
    /// as they were, a step on again as edited; the legend names the mark.
    #[test]
    fn edited_cells_are_marked_and_a_step_back_undoes_them() {
        let at_post = edits_app_at(7);
        let buf = render_panel(&at_post, 64, 8, render);
        let post = snapshot_text(&buf);
        let v = at_post.view().unwrap();
        let area = Rect::new(0, 0, 64, 8);
        for pos in [10, 11] {
            let r = cell_area(&v, area, pos).unwrap();
            assert_eq!(buf[(r.x, r.y)].symbol(), glyph::EDIT, "{post}");
            assert!(buf[(r.x + 1, r.y)].modifier.contains(Modifier::BOLD | Modifier::UNDERLINED));
        }
        assert!(post.contains("✎ edited"), "{post}");
        let mut back = edits_app_at(7);
        key(&mut back, KeyCode::Left);
        let before = snapshot_text(&render_panel(&back, 64, 8, render));
        assert_ne!(before, post);
        key(&mut back, KeyCode::Right);
        assert_eq!(snapshot_text(&render_panel(&back, 64, 8, render)), post, "redone exactly");
        insta::assert_snapshot!(format!("{post}\n{before}"));
    }

    /// Without colour (NO_COLOR, `--mono`) an edited cell has the same glyph after its step
    /// mark, and the legend names it; in colour the glyph is a chip of its own colour.
    #[test]
    fn edited_cells_read_in_mono_and_in_the_light_theme() {
        use theme::{Depth, ThemeName};
        let mut app = edits_app_at(7);
        app.theme = theme::pick(ThemeName::Dark, Depth::Mono);
        let buf = render_panel(&app, 64, 8, render);
        assert!(!has_colour(&buf));
        let mono = snapshot_text(&buf);
        assert!(
            mono.contains("⁵✎,") && mono.contains("⁵✎·and") && mono.contains("✎ edited"),
            "{mono}"
        );
        insta::assert_snapshot!("edits_mono", mono);
        app.theme = theme::pick(ThemeName::Light, Depth::TrueColor);
        let light = render_panel(&app, 64, 8, render);
        let v = app.view().unwrap();
        let r = cell_area(&v, Rect::new(0, 0, 64, 8), 10).unwrap();
        assert_eq!(light[(r.x, r.y)].bg, ratatui::style::Color::Rgb(0xb4, 0x1c, 0x1c));
        insta::assert_snapshot!("edits_light", crate::tui::testing::snapshot_styled(&light));
    }

    /// A trace without edits keeps its legend: the mark is named only where it can appear.
    #[test]
    fn the_edit_mark_is_named_only_in_a_run_with_edits() {
        let mut app = app_at_head();
        key(&mut app, KeyCode::End);
        let s = snapshot_text(&render_panel(&app, 100, 14, render));
        assert!(!s.contains(glyph::EDIT), "{s}");
    }

    #[test]
    fn an_edited_cell_draws_its_glyph_after_the_step_mark() {
        let c = |mark: &str| Cell {
            mark: mark.into(),
            edit: true,
            text: "·my".into(),
            fill: false,
            conf: Some(1.0),
            style: Style::default(),
        };
        assert_eq!(c("").layout(5), ("✎·my█".to_string(), Some(0)));
        assert_eq!(c("").layout(3), ("✎…█".to_string(), Some(0)));
        assert_eq!(c("⁵").layout(4), ("⁵✎…█".to_string(), Some(1)));
        assert_eq!(c("⁵").layout(2), ("⁵✎".to_string(), Some(1)));
        assert_eq!(c("¹⁶").layout(1), ("✎".to_string(), Some(0)), "the glyph before a cut token");
    }

    /// A wide panel widens the cells as far as the run's longest token needs (it left columns
    /// empty and cut `setVisib…`); a narrow one keeps them at the usual width.
    #[test]
    fn cells_use_the_width_they_have_for_long_tokens() {
        let mut events = synth::trace(&Synth::small());
        let long = "setVisibility";
        let c = events
            .iter_mut()
            .find_map(|e| match e {
                crate::trace::events::Event::Step(s) if !s.committed.is_empty() => {
                    Some(&mut s.committed[0])
                }
                _ => None,
            })
            .unwrap();
        (c.token, c.text) = (5000, long.into());
        let app = App::replay(events, "t".into(), None);
        let v = app.view().unwrap();
        assert_eq!(geom(&v, 62).cell_w, 13, "all the room there is");
        let wide = geom(&v, 200);
        assert_eq!(wide.cell_w as usize, long.len() + CELL_EXTRA);
        let s = snapshot_text(&render_panel(&app, 200, 8, render));
        assert!(s.contains(long), "{s}");
        let plain = app_at_head();
        assert_eq!(geom(&plain.view().unwrap(), 200).cell_w, MAX_CELL, "short tokens: no wider");
    }

    #[test]
    fn geometry_adapts_to_width_and_block_length() {
        let app = app_at_head();
        let v = app.view().unwrap();
        let g = geom(&v, 62);
        assert_eq!((g.cell_w, g.gap, g.lines_per_block), (MAX_CELL, 1, 1));
        let g = geom(&v, 10);
        assert_eq!((g.cell_w, g.gap, g.per_line, g.lines_per_block), (1, 0, 4, 1));
        let g = geom(&v, 6);
        assert_eq!((g.per_line, g.lines_per_block), (2, 2), "a block too wide wraps");
    }
}
