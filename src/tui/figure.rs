//! The step map as a figure: `unmask export TRACE --format svg`. Every generated token is a
//! cell filled with the hue of the step (within its block) that set its final token (its
//! commit, or the edit that last replaced it), a bar along its bottom for the model's
//! confidence, its text in it, a corner mark when a later step replaced its token; blocks are
//! outlined and packed into rows; a title gives the settings and a legend the step colours,
//! the confidence key and, when some token was edited, the edit mark.
//!
//! Pure: events in, SVG text out. The SVG is written by hand: it is a few dozen rectangles and
//! text elements in a layout of our own (blocks packed into rows, cells clipped to a fixed
//! number of monospace columns), which no SVG crate knows; a writer crate would only spell
//! the same tags.
//!
//! Sizes are for a one-column figure of a two-column paper (3.3 in wide): the SVG is
//! 240 pt wide, user units are points, tokens are 8 pt monospace (5 columns per cell), the
//! title 8 pt, the settings and the legend 7 pt, so they print at those sizes when the
//! figure is placed at its own width.

use std::fmt::Write;

use crate::engine::settings::{DecodeSettings, Schedule, Strategy};
use crate::glyph::{self, Mode};
use crate::trace::events::{Event, Header};
use crate::trace::store::{CellState, Run, Store};
use crate::tui::theme::{pick, Depth, Rgb, ThemeName};

/// The figure's width, in points (3.33 in: one column of a two-column paper).
const MAX_WIDTH: f64 = 240.0;
const MARGIN: f64 = 4.0;
/// Left column holding each row's first block number.
const LABEL_W: f64 = 12.0;
/// Token text: 8 pt monospace, whose advance is 0.6 em (DejaVu Sans Mono, Menlo, Consolas).
const FONT: f64 = 8.0;
const ADVANCE: f64 = 0.6 * FONT;
/// Columns of token text a cell shows; longer tokens are cut with `…`.
const CELL_COLS: usize = 5;
const CELL_W: f64 = CELL_COLS as f64 * ADVANCE + 2.0;
const CELL_H: f64 = 16.0;
const CELL_GAP: f64 = 1.0;
const BLOCK_GAP: f64 = 5.0;
const ROW_GAP: f64 = 4.0;
/// The confidence bar: its track spans the cell's width, its fill the confidence's share.
const BAR_H: f64 = 2.0;
/// The edit mark: a triangle of this side in a cell's top right corner.
const EDIT_MARK: f64 = 4.0;
const BAR_Y: f64 = 12.6;
const SMALL: f64 = 7.0;
const LINE: f64 = 10.0;
const MONO: &str = "DejaVu Sans Mono, Menlo, Consolas, monospace";
const SANS: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";
const INK: &str = "#1a1c22";
const GREY: &str = "#555b66";
const PROMPT_FILL: &str = "#e4e7ec";
const BAR_TRACK: &str = "#ffffff";
const BAR_FILL: &str = "#1a1c22";

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FigureError {
    #[error("the trace has no header event")]
    NoHeader,
    #[error("the trace has no decoded token to draw")]
    NothingDecoded,
}

/// What one drawn cell holds.
#[derive(Clone, Debug, PartialEq)]
enum Fill {
    /// A prompt token sharing the first decoded block.
    Prompt,
    /// Its final token set at this 0-based step of its block, with this confidence, after
    /// `edits` replacements of the token it was committed with.
    Decoded { step: usize, conf: f32, edits: usize },
    /// Still masked where the trace ends (a cut-short trace).
    Masked,
}

#[derive(Clone, Debug, PartialEq)]
struct Cell {
    pos: usize,
    token: Option<u32>,
    text: String,
    /// The tooltip's text: characters quoted, bytes that are none (yet) bare (`<D1 F2>`), as
    /// the inspector and `unmask steps` write them: `"<D1 F2>"` read as a token spelled so.
    tip: String,
    fill: Fill,
}

/// The step map of the last run in `events` as an SVG document.
pub fn step_map_svg(events: &[Event]) -> Result<String, FigureError> {
    let start =
        events.iter().rposition(|e| matches!(e, Event::Header(_))).ok_or(FigureError::NoHeader)?;
    let store = Store::from_events(events[start..].iter().cloned());
    let run = store.run().ok_or(FigureError::NoHeader)?;
    let cells = cells(run);
    if !cells.iter().any(|c| matches!(c.fill, Fill::Decoded { .. })) {
        return Err(FigureError::NothingDecoded);
    }
    Ok(draw(run, &cells))
}

/// The cells to draw: every position of the decoded blocks up to the end of the output.
fn cells(run: &Run) -> Vec<Cell> {
    let head = run.head();
    let b = run.block_length();
    let end = match &run.finish {
        Some(f) => run.prompt_len() + f.output_ids.len(),
        None => run.output_end(head).min(run.shown_end(head)),
    };
    (run.header.first_block * b..end)
        .map(|pos| {
            let piece = run.cell_piece(pos, head);
            let text = match &piece {
                Some(crate::trace::detok::Piece::Text(t)) if t.is_empty() => {
                    glyph::PART.to_string()
                }
                Some(crate::trace::detok::Piece::Text(t)) => {
                    t.render(|s| glyph::escape(s, Mode::Cell).into_owned())
                }
                Some(crate::trace::detok::Piece::Pending(bytes)) => crate::trace::detok::hex(bytes),
                None => String::new(),
            };
            let tip = match &piece {
                Some(crate::trace::detok::Piece::Text(t)) if !t.is_empty() => {
                    t.render(|s| format!("\"{}\"", glyph::escape(s, Mode::Cell)))
                }
                _ => text.clone(),
            };
            let (token, fill) = match run.cell(pos, head) {
                CellState::Prompt { token } => (Some(token), Fill::Prompt),
                CellState::Decoded(d) => {
                    (Some(d.token), Fill::Decoded { step: d.step, conf: d.conf, edits: d.edits })
                }
                CellState::Masked { .. } => (None, Fill::Masked),
            };
            Cell { pos, token, text, tip, fill }
        })
        .collect()
}

/// Where the blocks go: how many cells fit on a line, how many blocks share a row.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Layout {
    block_length: usize,
    /// Cells per line of a block (a block longer than a line wraps onto several).
    per_line: usize,
    lines_per_block: usize,
    blocks_per_row: usize,
}

impl Layout {
    fn new(block_length: usize) -> Layout {
        let room = MAX_WIDTH - 2.0 * MARGIN - LABEL_W;
        let per_line = (((room + CELL_GAP) / (CELL_W + CELL_GAP)) as usize).clamp(1, block_length);
        let block_w = per_line as f64 * (CELL_W + CELL_GAP) - CELL_GAP;
        let blocks_per_row = if per_line < block_length {
            1
        } else {
            (((room + BLOCK_GAP) / (block_w + BLOCK_GAP)) as usize).max(1)
        };
        Layout {
            block_length,
            per_line,
            lines_per_block: block_length.div_ceil(per_line),
            blocks_per_row,
        }
    }

    fn block_w(&self) -> f64 {
        self.per_line as f64 * (CELL_W + CELL_GAP) - CELL_GAP
    }

    fn row_h(&self) -> f64 {
        self.lines_per_block as f64 * (CELL_H + CELL_GAP) - CELL_GAP
    }

    /// Top-left corner of block `i` (counted from the first decoded block), relative to the grid.
    fn block_origin(&self, i: usize) -> (f64, f64) {
        let (row, col) = (i / self.blocks_per_row, i % self.blocks_per_row);
        (LABEL_W + col as f64 * (self.block_w() + BLOCK_GAP), row as f64 * (self.row_h() + ROW_GAP))
    }

    /// Top-left corner of the cell at offset `i` within its block.
    fn cell_origin(&self, block: (f64, f64), i: usize) -> (f64, f64) {
        let (line, col) = (i / self.per_line, i % self.per_line);
        (block.0 + col as f64 * (CELL_W + CELL_GAP), block.1 + line as f64 * (CELL_H + CELL_GAP))
    }

    #[cfg(test)]
    fn grid_w(&self, blocks: usize) -> f64 {
        let cols = blocks.min(self.blocks_per_row) as f64;
        LABEL_W + cols * self.block_w() + (cols - 1.0).max(0.0) * BLOCK_GAP
    }

    fn grid_h(&self, blocks: usize) -> f64 {
        let rows = blocks.div_ceil(self.blocks_per_row) as f64;
        rows * self.row_h() + (rows - 1.0).max(0.0) * ROW_GAP
    }
}

/// The whole document.
fn draw(run: &Run, cells: &[Cell]) -> String {
    let b = run.block_length();
    let layout = Layout::new(b);
    let first = run.header.first_block;
    let blocks = cells.last().map_or(0, |c| c.pos / b + 1 - first);
    let span = run.step_span();
    let title = title_lines(&run.header, run.latest_settings(), cells);
    let title_h = title.len() as f64 * LINE + 2.0;
    let grid_y = MARGIN + title_h;
    let legend_y = grid_y + layout.grid_h(blocks) + 8.0;
    // Always the full column width: a figure's text prints at its stated size only if every
    // figure is placed at the same scale.
    let width = MAX_WIDTH;
    let height = legend_y + 2.0 * LINE + MARGIN;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}pt" height="{h}pt" viewBox="0 0 {w} {h}" font-family="{SANS}">"#,
        w = num(width),
        h = num(height)
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    for (i, line) in title.iter().enumerate() {
        let (size, weight) = if i == 0 { (FONT, r#" font-weight="bold""#) } else { (SMALL, "") };
        let y = MARGIN + (i + 1) as f64 * LINE - 2.0;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="{}" fill="{INK}"{weight}>{}</text>"#,
            num(MARGIN),
            num(y),
            num(size),
            xml(line)
        );
    }
    let origin = (MARGIN, grid_y);
    for i in 0..blocks {
        block_frame(&mut s, &layout, origin, i, first + i);
    }
    for c in cells {
        cell(&mut s, &layout, origin, first, c, span);
    }
    let edited = cells.iter().any(|c| matches!(c.fill, Fill::Decoded { edits: 1.., .. }));
    legend(&mut s, (MARGIN, legend_y), span, edited);
    s.push_str("</svg>\n");
    s
}

/// The title: the model and what was decoded, then the settings in words, wrapped to fit.
fn title_lines(h: &Header, settings: &DecodeSettings, cells: &[Cell]) -> Vec<String> {
    let model = h.model.source.rsplit('/').find(|p| !p.is_empty()).unwrap_or(&h.model.source);
    let model = glyph::fit(&glyph::escape_line(model), 36).0.into_owned();
    let tokens = cells.iter().filter(|c| matches!(c.fill, Fill::Decoded { .. })).count();
    let mut lines = vec![format!("{model} · {tokens} token{}", if tokens == 1 { "" } else { "s" })];
    let cols = ((MAX_WIDTH - 2.0 * MARGIN) / (0.6 * SMALL)) as usize;
    let mut line = String::new();
    for part in settings_words(settings) {
        if !line.is_empty() && glyph::width(&line) + 3 + glyph::width(&part) > cols {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line += " · ";
        }
        line += &part;
    }
    lines.push(line);
    lines
}

/// `low_confidence_dynamic`, `block length 4`, `4 steps`, `threshold 0.85`, `greedy`, ...
fn settings_words(s: &DecodeSettings) -> Vec<String> {
    let mut w = vec![
        s.strategy.name().to_string(),
        format!("block length {}", s.block_length),
        format!("{} steps", s.steps),
    ];
    match s.strategy {
        Strategy::LowConfidenceDynamic => w.push(format!("threshold {}", s.threshold)),
        Strategy::EntropyBounded => w.push(format!("entropy bound {}", s.eb_threshold)),
        Strategy::JointThreshold => {
            w.push(format!("threshold {}", s.threshold));
            w.push(format!("edit threshold {}", s.edit_threshold));
        }
        _ => {}
    }
    if s.schedule == Schedule::Lmdeploy {
        w.push("lmdeploy schedule".into());
    }
    let p = &s.sampling;
    if p.is_greedy() {
        w.push("greedy (temperature 0)".into());
    } else {
        w.push(format!("temperature {}", p.temperature));
        if p.top_k > 0 {
            w.push(format!("top-k {}", p.top_k));
        }
        if p.top_p < 1.0 {
            w.push(format!("top-p {}", p.top_p));
        }
        w.push(format!("seed {}", p.seed));
    }
    w
}

/// A block's outline (one per line it spans) and, first in its row, its number.
fn block_frame(s: &mut String, l: &Layout, origin: (f64, f64), i: usize, block: usize) {
    let (bx, by) = l.block_origin(i);
    let (x, y) = (origin.0 + bx, origin.1 + by);
    for line in 0..l.lines_per_block {
        let cells = (l.block_length - line * l.per_line).min(l.per_line);
        let w = cells as f64 * (CELL_W + CELL_GAP) - CELL_GAP;
        let ly = y + line as f64 * (CELL_H + CELL_GAP);
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="{INK}" stroke-width="0.6"/>"##,
            num(x - 0.5),
            num(ly - 0.5),
            num(w + 1.0),
            num(CELL_H + 1.0)
        );
    }
    if i.is_multiple_of(l.blocks_per_row) {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="6" fill="{GREY}" text-anchor="end">{block}</text>"#,
            num(origin.0 + LABEL_W - 3.0),
            num(y + 10.0)
        );
    }
}

/// One cell: the fill, the confidence bar, the text; a tooltip with the exact values.
fn cell(s: &mut String, l: &Layout, origin: (f64, f64), first: usize, c: &Cell, span: usize) {
    let block = c.pos / l.block_length - first;
    let (x, y) = l.cell_origin(l.block_origin(block), c.pos % l.block_length);
    let (x, y) = (origin.0 + x, origin.1 + y);
    let theme = pick(ThemeName::Light, Depth::TrueColor);
    let (fill, ink) = match c.fill {
        Fill::Decoded { step, .. } => {
            let (bg, fg) = theme.cell_rgb(step, span);
            (hex(bg), hex(fg))
        }
        Fill::Prompt => (PROMPT_FILL.to_string(), GREY.to_string()),
        Fill::Masked => ("#ffffff".to_string(), GREY.to_string()),
    };
    let (kind, data) = match c.fill {
        Fill::Decoded { step, conf, edits } => {
            let edits = if edits > 0 { format!(r#" data-edits="{edits}""#) } else { String::new() };
            ("decoded", format!(r#" data-step="{}" data-conf="{conf:.3}"{edits}"#, step + 1))
        }
        Fill::Prompt => ("prompt", String::new()),
        Fill::Masked => ("masked", String::new()),
    };
    let _ = write!(
        s,
        r#"<g class="{kind}" data-pos="{}"{data}><title>{}</title>"#,
        c.pos,
        xml(&tooltip(c))
    );
    let _ = write!(
        s,
        r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{fill}"/>"#,
        num(x),
        num(y),
        num(CELL_W),
        num(CELL_H)
    );
    if let Fill::Decoded { conf, edits, .. } = c.fill {
        bar(s, x + 1.0, y + BAR_Y, CELL_W - 2.0, conf);
        if edits > 0 {
            edit_mark(s, x + CELL_W, y, &ink);
        }
    }
    let shown = glyph::fit(&c.text, CELL_COLS).0;
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" font-family="{MONO}" font-size="{}" fill="{ink}" text-anchor="middle" xml:space="preserve">{}</text>"#,
        num(x + CELL_W / 2.0),
        num(y + 9.5),
        num(FONT),
        xml(&shown)
    );
    s.push_str("</g>\n");
}

/// The edit mark: a triangle in the top right corner of the cell whose corner is at `(x, y)`,
/// in the cell's text colour (which reads on its fill).
fn edit_mark(s: &mut String, x: f64, y: f64, ink: &str) {
    let _ = write!(
        s,
        r#"<path class="edit" d="M{} {}H{}V{}Z" fill="{ink}"/>"#,
        num(x - EDIT_MARK),
        num(y),
        num(x),
        num(y + EDIT_MARK)
    );
}

/// `pos 12 · step 2 · conf 0.812 · token 315 "·the"` (`· edited 2×` after the confidence when
/// later steps replaced the token it was committed with: the step is the final token's).
fn tooltip(c: &Cell) -> String {
    let token = c.token.map(|t| format!(" · token {t}")).unwrap_or_default();
    match c.fill {
        Fill::Decoded { step, conf, edits } => {
            let edited = if edits > 0 { format!(" · edited {edits}×") } else { String::new() };
            format!("pos {} · step {} · conf {conf:.3}{edited}{token} {}", c.pos, step + 1, c.tip)
        }
        Fill::Prompt => format!("pos {} · prompt{token} {}", c.pos, c.tip),
        Fill::Masked => format!("pos {} · still masked", c.pos),
    }
}

/// A confidence bar: a white track, a dark fill as long as the confidence.
fn bar(s: &mut String, x: f64, y: f64, w: f64, conf: f32) {
    let fill = w * conf.clamp(0.0, 1.0) as f64;
    let _ = write!(
        s,
        r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{BAR_TRACK}" fill-opacity="0.85"/><rect x="{}" y="{}" width="{}" height="{}" fill="{BAR_FILL}"/>"#,
        num(x),
        num(y),
        num(w),
        num(BAR_H),
        num(x),
        num(y),
        num(fill),
        num(BAR_H)
    );
}

/// Swatch width in the legend: roomy for few steps, narrower for many.
fn swatch_w(span: usize) -> f64 {
    ((MAX_WIDTH - 2.0 * MARGIN - 28.0) / span as f64).clamp(3.0, 12.0)
}

/// Step swatches numbered from 1 (all of them up to 16, else the first, the last and evenly
/// spaced ones between), then the confidence key and, when some token was `edited`, the edit
/// mark.
fn legend(s: &mut String, (x, y): (f64, f64), span: usize, edited: bool) {
    let theme = pick(ThemeName::Light, Depth::TrueColor);
    let w = swatch_w(span);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="{}" fill="{INK}">step</text>"#,
        num(x),
        num(y + 7.0),
        num(SMALL)
    );
    let named = legend_steps(span);
    for step in 0..span {
        let (bg, fg) = theme.cell_rgb(step, span);
        let sx = x + 28.0 + step as f64 * w;
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="{}" height="9" fill="{}"/>"#,
            num(sx),
            num(y),
            num(w),
            hex(bg)
        );
        if named.contains(&step) {
            let (tx, ty, ink) = if w >= 7.0 {
                (sx + w / 2.0, y + 7.0, hex(fg))
            } else {
                (sx + w / 2.0, y + 16.0, INK.to_string())
            };
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" font-size="6" fill="{ink}" text-anchor="middle">{}</text>"#,
                num(tx),
                num(ty),
                step + 1
            );
        }
    }
    s.push('\n');
    let cy = y + LINE + if w >= 7.0 { 1.0 } else { 8.0 };
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" font-size="{}" fill="{INK}">confidence</text>"#,
        num(x),
        num(cy + 6.0),
        num(SMALL)
    );
    let mut kx = x + 42.0;
    for conf in [0.25f32, 0.5, 1.0] {
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="{GREY}" stroke-width="0.3"/>"#,
            num(kx),
            num(cy + 2.0),
            num(16.0),
            num(BAR_H)
        );
        bar(s, kx, cy + 2.0, 16.0, conf);
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" font-size="6" fill="{INK}">{conf}</text>"#,
            num(kx + 18.0),
            num(cy + 5.5)
        );
        kx += 36.0;
    }
    if edited {
        let _ = write!(
            s,
            r##"<rect x="{}" y="{}" width="8" height="8" fill="{PROMPT_FILL}" stroke="{GREY}" stroke-width="0.3"/>"##,
            num(kx),
            num(cy - 1.0)
        );
        edit_mark(s, kx + 8.0, cy - 1.0, INK);
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" font-size="6" fill="{INK}">edited</text>"#,
            num(kx + 10.0),
            num(cy + 5.5)
        );
    }
    s.push('\n');
}

/// Which steps (0-based) the legend numbers: all up to 16, else about eight, the first and
/// the last among them.
fn legend_steps(span: usize) -> Vec<usize> {
    if span <= 16 {
        return (0..span).collect();
    }
    let n = 8;
    let mut out: Vec<usize> = (0..n).map(|i| i * (span - 1) / (n - 1)).collect();
    out.dedup();
    out
}

fn hex((r, g, b): Rgb) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// A coordinate with at most two decimals and no trailing zeros (stable, short output).
fn num(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// Text as XML character data or an attribute value: markup characters escaped, characters
/// XML 1.0 cannot hold at all (most C0 controls, U+FFFE, U+FFFF) as U+FFFD. Token text is
/// untrusted: a token `</text><script>` must stay text.
pub fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            '\0'..='\u{1f}' | '\u{fffe}' | '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_replaces_what_xml_cannot_hold() {
        assert_eq!(xml("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(xml("</text><script>"), "&lt;/text&gt;&lt;script&gt;");
        assert_eq!(xml("x\u{1b}[31m\u{0}\u{ffff}"), "x\u{fffd}[31m\u{fffd}\u{fffd}");
        assert_eq!(xml("日本 🦀"), "日本 🦀");
    }

    #[test]
    fn numbers_are_short_and_stable() {
        assert_eq!(num(4.0), "4");
        assert_eq!(num(27.5), "27.5");
        assert_eq!(num(1.0 / 3.0), "0.33");
        assert_eq!(num(-0.001), "0");
    }

    #[test]
    fn blocks_pack_into_rows_and_long_blocks_wrap() {
        let four = Layout::new(4);
        assert_eq!((four.per_line, four.lines_per_block, four.blocks_per_row), (4, 1, 2));
        let sixteen = Layout::new(16);
        assert_eq!((sixteen.per_line, sixteen.lines_per_block, sixteen.blocks_per_row), (8, 2, 1));
        // Two blocks of four and the label column fit the 240 pt width.
        assert!(2.0 * MARGIN + four.grid_w(2) <= MAX_WIDTH, "{}", four.grid_w(2));
    }

    #[test]
    fn legend_names_every_step_up_to_sixteen_then_the_ends_and_between() {
        assert_eq!(legend_steps(4), vec![0, 1, 2, 3]);
        assert_eq!(legend_steps(16).len(), 16);
        let l = legend_steps(32);
        assert_eq!((l[0], *l.last().unwrap(), l.len()), (0, 31, 8));
    }

    /// The decoded cells of a parsed figure: `(pos, step, fill, text)`.
    fn decoded_cells(svg: &str) -> Vec<(usize, usize, String, String)> {
        let doc = roxmltree::Document::parse(svg).expect("the figure is well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        assert_eq!(doc.root_element().tag_name().namespace(), Some("http://www.w3.org/2000/svg"));
        doc.descendants()
            .filter(|n| n.attribute("class") == Some("decoded"))
            .map(|g| {
                let child = |name: &str| g.children().find(|c| c.has_tag_name(name)).unwrap();
                (
                    g.attribute("data-pos").unwrap().parse().unwrap(),
                    g.attribute("data-step").unwrap().parse().unwrap(),
                    child("rect").attribute("fill").unwrap().to_string(),
                    child("text").text().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn awkward_tokens_stay_text_and_the_figure_stays_well_formed() {
        use crate::trace::synth::{trace, Synth};
        let mut events = trace(&Synth { new_tokens: 28, ..Synth::small() });
        // A hostile token: markup, an ampersand, an escape byte (the text of token 11, ` was`,
        // wherever it appears).
        for e in &mut events {
            if let Event::Step(s) = e {
                s.committed
                    .iter_mut()
                    .filter(|c| c.token == 11)
                    .for_each(|c| c.text = "<b>&\u{1b}".into());
                s.masked
                    .iter_mut()
                    .filter(|c| c.token == 11)
                    .for_each(|c| c.text = "<b>&\u{1b}".into());
            }
        }
        let svg = step_map_svg(&events).unwrap();
        let cells = decoded_cells(&svg);
        assert_eq!(cells.len(), 28, "one cell per generated token");
        // The synthetic vocabulary's bell (␇), tab (⇥), newline (↵) and spaces (·) are drawn visibly.
        let texts: Vec<&str> = cells.iter().map(|c| c.3.as_str()).collect();
        assert!(texts.contains(&"␇") && texts.contains(&"⇥") && texts.contains(&"↵"), "{texts:?}");
        assert!(texts.contains(&"·cat"), "{texts:?}");
        assert!(texts.contains(&"<b>&␛"), "{texts:?}");
        assert!(svg.contains("&lt;b&gt;&amp;␛"));
        assert!(!svg.contains('\u{1b}') && !svg.contains('\u{7}'));
    }

    /// A tooltip quotes characters and leaves bytes bare, as the inspector and `unmask steps`
    /// do: `"<FC>"` read as a token spelled `<FC>`.
    #[test]
    fn a_tooltip_gives_bytes_bare_and_characters_quoted() {
        let events = crate::trace::synth::invalid_split_trace();
        let svg = step_map_svg(&events).unwrap();
        for want in [
            "token 5 &quot;·&quot;&lt;E4 BD&gt;</title>",
            "token 6 &lt;FC&gt;</title>",
            "token 7 &lt;A5 BD&gt;</title>",
        ] {
            assert!(svg.contains(want), "{want} missing:\n{svg}");
        }
    }

    /// With edits each cell is coloured by the step that set its final token (the step map's
    /// step), an edited one carries the corner mark, `data-edits` and `edited N×` in its
    /// tooltip, and the legend names the mark; without edits there is none of it.
    #[test]
    fn edited_cells_are_marked_and_coloured_by_their_final_step() {
        use crate::trace::synth::{trace, Synth};
        let events = trace(&Synth::small_edits());
        let svg = step_map_svg(&events).unwrap();
        let t = crate::trace::export::tables(&events);
        let cells = decoded_cells(&svg);
        assert_eq!(
            cells.iter().map(|c| c.1).collect::<Vec<_>>(),
            t.step_map,
            "data-step is the step map's"
        );
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let edited: Vec<(usize, usize)> = doc
            .descendants()
            .filter(|n| n.attribute("data-edits").is_some())
            .map(|g| {
                assert!(g.children().any(|c| c.attribute("class") == Some("edit")), "a mark");
                let n = |a| g.attribute(a).unwrap().parse().unwrap();
                (n("data-pos"), n("data-edits"))
            })
            .collect();
        let want: Vec<(usize, usize)> = t
            .tokens
            .iter()
            .filter(|r| r.edits > Some(0))
            .map(|r| (r.pos, r.edits.unwrap()))
            .collect();
        assert_eq!(edited, want);
        assert!(svg.contains("pos 11 · step 5 · conf 0.852 · edited 2× · token 14"), "{svg}");
        assert!(svg.contains(">edited</text>"));
        let plain = step_map_svg(&trace(&Synth::small())).unwrap();
        assert!(!plain.contains("edit"));
        insta::assert_snapshot!(svg);
    }

    #[test]
    fn no_header_or_no_decoded_token_is_an_error() {
        assert_eq!(step_map_svg(&[]), Err(FigureError::NoHeader));
        let events = crate::trace::synth::trace(&crate::trace::synth::Synth::small());
        assert_eq!(step_map_svg(&events[..1]), Err(FigureError::NothingDecoded));
    }
}
