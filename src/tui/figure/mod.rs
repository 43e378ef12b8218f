//! The step map as a figure: `unmask export TRACE --format svg|png`. Every generated token is
//! a cell as wide as its text, filled with the hue of the step (within its block) that set its
//! final token (its commit, or the edit that last replaced it), a bar along its bottom for the
//! model's confidence, its text in it, a corner mark when a later step replaced its token.
//! Blocks are outlined, numbered and set side by side in aligned columns, as many a row as fit
//! the width ([`layout`]); a title gives the settings, axis titles name the rows and the
//! reading direction, and a legend every fill drawn: the steps, the prompt, context cells,
//! masked cells, the edit mark and the confidence key.
//!
//! Pure: events in, SVG text out ([`png`] rasterises it). The SVG is written by hand: it is a
//! few dozen rectangles and text elements in a layout of our own, which no SVG crate knows; a
//! writer crate would only spell the same tags.
//!
//! Sizes are for print: user units are points, tokens are 8 pt monospace, the title 8 pt, the
//! settings and the legend 7 pt, block numbers and axis titles 6 pt. The width is chosen
//! (`--width`, 240 pt, one column of a two-column paper, by default) and the text keeps its
//! size, so placed at its own width the figure prints at those sizes.

pub mod fonts;
pub mod layout;
pub mod options;
pub mod png;

use std::fmt::Write;

use crate::engine::settings::{DecodeSettings, Schedule, Strategy};
use crate::glyph::{self, Mode};
use crate::trace::events::{Event, Header};
use crate::trace::store::{CellState, Run, Store};
use crate::tui::theme::{contrast, lerp, pick, Depth, Rgb, Theme, ThemeName};
use layout::{Packed, Rect, CELL_H, FONT, LABEL_FONT};
pub use options::{BlocksPerRow, Dpi, Options, StepRange, Width};

const MARGIN: f64 = 4.0;
const SMALL: f64 = 7.0;
const LINE: f64 = 10.0;
/// Axis titles: the line above the grid.
const AXIS: f64 = 6.0;
const AXIS_H: f64 = 9.0;
/// Sans text's mean advance, to wrap and place labels (Noto Sans' lowercase is about 0.52 em;
/// a little over, so that nothing measured overlaps).
const SANS_ADVANCE: f64 = 0.56;
/// The text baseline and the confidence bar, from a cell's top.
const TEXT_Y: f64 = 9.5;
const BAR_Y: f64 = 12.6;
const BAR_H: f64 = 2.0;
/// How far a bar's track goes from the cell's fill toward the bar's colour: far enough to
/// show the track's length, near enough to the fill that the bar stands out of it.
const TRACK_MIX: f32 = 0.3;
/// The edit mark: a triangle of this side in a cell's top right corner.
const EDIT_MARK: f64 = 4.0;
const INK: Rgb = (0x1a, 0x1c, 0x22);
const GREY: Rgb = (0x55, 0x5b, 0x66);
const WHITE: Rgb = (0xff, 0xff, 0xff);
const PROMPT_FILL: Rgb = (0xe4, 0xe7, 0xec);
/// Cells set at a step outside `--step-range`: their text, light, on white, outlined.
const CONTEXT_INK: Rgb = (0x8a, 0x90, 0x99);
const CONTEXT_LINE: Rgb = (0xc4, 0xc8, 0xcf);

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum FigureError {
    #[error("the trace has no header event")]
    NoHeader,
    #[error("the trace has no decoded token to draw")]
    NothingDecoded,
    #[error("--step-range {range}: the trace's blocks take at most {span} step{}", if *span == 1 { "" } else { "s" })]
    StepsOutside { range: StepRange, span: usize },
    #[error("--blocks-per-row {}: {}", .0.per_row, .0)]
    TooWide(layout::TooWide),
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

/// The step map of the last run in `events` as an SVG document, laid out as `opts` says.
pub fn step_map_svg(events: &[Event], opts: &Options) -> Result<String, FigureError> {
    let start =
        events.iter().rposition(|e| matches!(e, Event::Header(_))).ok_or(FigureError::NoHeader)?;
    let store = Store::from_events(events[start..].iter().cloned());
    let run = store.run().ok_or(FigureError::NoHeader)?;
    let cells = cells(run);
    if !cells.iter().any(|c| matches!(c.fill, Fill::Decoded { .. })) {
        return Err(FigureError::NothingDecoded);
    }
    let span = run.step_span();
    if opts.steps.steps(span).is_empty() {
        return Err(FigureError::StepsOutside { range: opts.steps, span });
    }
    let figure = Figure::new(run, &cells, opts)?;
    Ok(figure.draw(&run.header, run.latest_settings()))
}

/// The cells to draw: every position of the decoded blocks up to the end of the output.
fn cells(run: &Run) -> Vec<Cell> {
    use crate::trace::detok::Piece;
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
                Some(Piece::Text(t)) if t.is_empty() => glyph::PART.to_string(),
                Some(Piece::Text(t)) => t.render(|s| glyph::escape(s, Mode::Cell).into_owned()),
                Some(Piece::Pending(bytes)) => crate::trace::detok::hex(bytes),
                None => String::new(),
            };
            let tip = match &piece {
                Some(Piece::Text(t)) if !t.is_empty() => {
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

/// How a cell is painted.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Paint {
    fill: Rgb,
    ink: Rgb,
    /// An outline, for fills that are white like the page.
    outline: Option<(Rgb, bool)>,
    /// The confidence bar and the edit mark, for cells in the step range.
    marks: bool,
}

impl Paint {
    fn of(fill: &Fill, theme: &Theme, span: usize, range: &StepRange) -> Paint {
        match *fill {
            Fill::Decoded { step, .. } if range.contains(step) => {
                let fill = theme.cell_rgb(step, span).0;
                Paint { fill, ink: ink_on(fill, theme), outline: None, marks: true }
            }
            Fill::Decoded { .. } => Paint::CONTEXT,
            Fill::Prompt => Paint::PROMPT,
            Fill::Masked => Paint::MASKED,
        }
    }

    const PROMPT: Paint = Paint { fill: PROMPT_FILL, ink: GREY, outline: None, marks: false };
    /// White like the page, dashed: nothing decoded there yet.
    const MASKED: Paint =
        Paint { fill: WHITE, ink: GREY, outline: Some((GREY, true)), marks: false };
    const CONTEXT: Paint =
        Paint { fill: WHITE, ink: CONTEXT_INK, outline: Some((CONTEXT_LINE, false)), marks: false };

    /// The outline's attributes for a `<rect>`, if the paint has one.
    fn outline_attrs(&self) -> String {
        match self.outline {
            Some((line, dashed)) => format!(
                r#" stroke="{}" stroke-width="0.4"{}"#,
                hex(line),
                if dashed { r#" stroke-dasharray="1 1""# } else { "" }
            ),
            None => String::new(),
        }
    }

    /// The confidence bar's track and fill: the bar in the cell's text colour (chosen to read
    /// on the fill), its track between the two, so that the bar shows on every step's hue.
    fn bar(&self) -> (Rgb, Rgb) {
        (lerp(self.fill, self.ink, TRACK_MIX), self.ink)
    }
}

/// The text (and bar) colour for a cell filled `fill`: the theme's dark or light ink, whichever
/// contrasts more. (The terminal's cells pick by brightness, which leaves viridis' middle
/// greens under 3:1 with white; print needs the better of the two.)
fn ink_on(fill: Rgb, theme: &Theme) -> Rgb {
    let (dark, light) = theme.inks();
    if contrast(fill, dark) >= contrast(fill, light) {
        dark
    } else {
        light
    }
}

/// A cell with the text it shows (cut only past [`layout::MAX_COLS`]) and its width.
struct Shown<'a> {
    cell: &'a Cell,
    text: String,
    w: f64,
}

/// Everything measured and placed, ready to draw.
struct Figure<'a> {
    width: f64,
    first_block: usize,
    blocks: Vec<Vec<Shown<'a>>>,
    packed: Packed,
    span: usize,
    range: StepRange,
    theme: &'static Theme,
}

impl<'a> Figure<'a> {
    fn new(run: &Run, cells: &'a [Cell], opts: &Options) -> Result<Figure<'a>, FigureError> {
        let width = opts.width.points();
        let room = width - 2.0 * MARGIN;
        let b = run.block_length();
        let first_block = run.header.first_block;
        let count = cells.len().div_ceil(b);
        let label_w = layout::label_w(first_block + count.saturating_sub(1));
        let cap = layout::max_cols(layout::line_room(room, label_w));
        let blocks: Vec<Vec<Shown>> = cells
            .chunks(b)
            .map(|block| {
                block
                    .iter()
                    .map(|cell| {
                        let (text, cols) = glyph::fit(&cell.text, cap);
                        Shown { cell, text: text.into_owned(), w: layout::cell_w(cols) }
                    })
                    .collect()
            })
            .collect();
        let widths: Vec<Vec<f64>> =
            blocks.iter().map(|b| b.iter().map(|s| s.w).collect()).collect();
        let per_row = opts.blocks_per_row.map(|n| n.0);
        let packed = layout::pack(&widths, room, label_w, per_row).map_err(FigureError::TooWide)?;
        Ok(Figure {
            width,
            first_block,
            blocks,
            packed,
            span: run.step_span(),
            range: opts.steps,
            theme: pick(ThemeName::Light, Depth::TrueColor),
        })
    }

    fn cells(&self) -> impl Iterator<Item = &Cell> {
        self.blocks.iter().flatten().map(|s| s.cell)
    }

    /// What the legend must name, from the cells drawn.
    fn legend(&self) -> legend::Legend {
        let has = |f: &dyn Fn(&Cell) -> bool| self.cells().any(f);
        legend::Legend {
            steps: self.range.steps(self.span),
            span: self.span,
            prompt: has(&|c| c.fill == Fill::Prompt),
            context: has(
                &|c| matches!(c.fill, Fill::Decoded { step, .. } if !self.range.contains(step)),
            ),
            masked: has(&|c| c.fill == Fill::Masked),
            edited: has(
                &|c| matches!(c.fill, Fill::Decoded { step, edits: 1.., .. } if self.range.contains(step)),
            ),
        }
    }

    /// The whole document.
    fn draw(&self, header: &Header, settings: &DecodeSettings) -> String {
        let coloured = (!self.range.is_all()).then(|| self.range.steps(self.span));
        let title = title_lines(header, settings, self.cells(), coloured, self.width);
        let axis_y = MARGIN + title.len() as f64 * LINE + 3.0;
        let grid = (MARGIN, axis_y + AXIS_H);
        let legend = self.legend();
        let legend_y = grid.1 + self.packed.height + 8.0;
        let laid = legend.layout(self.width - 2.0 * MARGIN);
        let height = legend_y + laid.height + MARGIN;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}pt" height="{h}pt" viewBox="0 0 {w} {h}" font-family="{}">"#,
            fonts::SANS,
            w = num(self.width),
            h = num(height)
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="{}"/>"#, hex(WHITE));
        for (i, line) in title.iter().enumerate() {
            let (size, ink) = if i == 0 { (FONT, INK) } else { (SMALL, GREY) };
            let y = MARGIN + (i + 1) as f64 * LINE - 2.0;
            text(&mut s, (MARGIN, y), size, ink, "", line);
        }
        self.axis_titles(&mut s, axis_y);
        self.grid(&mut s, grid);
        legend.draw(&mut s, &laid, (MARGIN, legend_y), self.theme);
        s.push_str("</svg>\n");
        s
    }

    /// `block` over the block numbers, `position in block →` over the first block's cells.
    fn axis_titles(&self, s: &mut String, y: f64) {
        let base = y + AXIS_H - 2.5;
        text(s, (MARGIN, base), AXIS, GREY, "", "block");
        let first_cell =
            self.packed.blocks.first().and_then(|b| b.cells.first()).map_or(0.0, |c| c.x);
        let x = MARGIN + first_cell.max(sans_w("block", AXIS) + 4.0);
        text(s, (x, base), AXIS, GREY, "", "position in block →");
    }

    /// Block outlines and numbers, then the cells in a group that sets their font.
    fn grid(&self, s: &mut String, (ox, oy): (f64, f64)) {
        for (i, placed) in self.packed.blocks.iter().enumerate() {
            for line in &placed.lines {
                let _ = writeln!(
                    s,
                    r#"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="{}" stroke-width="0.6"/>"#,
                    num(ox + line.x - 0.5),
                    num(oy + line.y - 0.5),
                    num(line.w + 1.0),
                    num(line.h + 1.0),
                    hex(INK)
                );
            }
            let (lx, ly) = placed.label;
            let label = (self.first_block + i).to_string();
            let at = (ox + lx, oy + ly + CELL_H / 2.0 + LABEL_FONT * 0.36);
            text(s, at, LABEL_FONT, GREY, r#" text-anchor="end" class="block""#, &label);
        }
        let _ = writeln!(
            s,
            r#"<g font-family="{}" font-size="{}" text-anchor="middle">"#,
            fonts::MONO,
            num(FONT)
        );
        for (block, placed) in self.blocks.iter().zip(&self.packed.blocks) {
            for (shown, rect) in block.iter().zip(&placed.cells) {
                let r = Rect { x: ox + rect.x, y: oy + rect.y, ..*rect };
                self.cell(s, shown, r);
            }
        }
        s.push_str("</g>\n");
    }

    /// One cell: the fill, the confidence bar, the text; a tooltip with the exact values.
    fn cell(&self, s: &mut String, shown: &Shown, r: Rect) {
        let c = shown.cell;
        let paint = Paint::of(&c.fill, self.theme, self.span, &self.range);
        let (kind, data) = match c.fill {
            Fill::Decoded { step, conf, edits } => {
                let edits =
                    if edits > 0 { format!(r#" data-edits="{edits}""#) } else { String::new() };
                let context = if paint.marks { "" } else { r#" data-context="true""# };
                (
                    "decoded",
                    format!(r#" data-step="{}" data-conf="{conf:.3}"{edits}{context}"#, step + 1),
                )
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
        let outline = paint.outline_attrs();
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{}"{outline}/>"#,
            num(r.x),
            num(r.y),
            num(r.w),
            num(r.h),
            hex(paint.fill)
        );
        if let (true, Fill::Decoded { conf, edits, .. }) = (paint.marks, &c.fill) {
            bar(s, (r.x + 1.0, r.y + BAR_Y), r.w - 2.0, *conf, paint.bar());
            if *edits > 0 {
                edit_mark(s, r.x + r.w, r.y, paint.ink);
            }
        }
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" fill="{}" xml:space="preserve">{}</text>"#,
            num(r.x + r.w / 2.0),
            num(r.y + TEXT_Y),
            hex(paint.ink),
            xml(&shown.text)
        );
        s.push_str("</g>\n");
    }
}

mod legend;

/// A line of sans text at `(x, y)` (its baseline's start), `extra` attributes added.
fn text(s: &mut String, (x, y): (f64, f64), size: f64, ink: Rgb, extra: &str, body: &str) {
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="{}" fill="{}"{extra}>{}</text>"#,
        num(x),
        num(y),
        num(size),
        hex(ink),
        xml(body)
    );
}

/// About how wide sans text is.
fn sans_w(s: &str, size: f64) -> f64 {
    glyph::width(s) as f64 * size * SANS_ADVANCE
}

/// The title: the model and what was decoded, then the settings in words, wrapped to fit.
fn title_lines<'c>(
    h: &Header,
    settings: &DecodeSettings,
    cells: impl Iterator<Item = &'c Cell>,
    coloured: Option<std::ops::Range<usize>>,
    width: f64,
) -> Vec<String> {
    let cols = ((width - 2.0 * MARGIN) / (SANS_ADVANCE * SMALL)) as usize;
    let model = h.model.source.rsplit('/').find(|p| !p.is_empty()).unwrap_or(&h.model.source);
    let model = glyph::fit(&glyph::escape_line(model), cols.saturating_sub(14)).0.into_owned();
    let tokens = cells.filter(|c| matches!(c.fill, Fill::Decoded { .. })).count();
    let mut lines = vec![format!("{model} · {tokens} token{}", if tokens == 1 { "" } else { "s" })];
    let mut words = settings_words(settings);
    match coloured {
        Some(r) if r.len() == 1 => words.push(format!("step {} coloured", r.end)),
        Some(r) => words.push(format!("steps {}–{} coloured", r.start + 1, r.end)),
        None => {}
    }
    let mut line = String::new();
    for part in words {
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

/// The edit mark: a triangle in the top right corner of the cell whose corner is at `(x, y)`,
/// in the cell's text colour (which reads on its fill).
fn edit_mark(s: &mut String, x: f64, y: f64, ink: Rgb) {
    let _ = write!(
        s,
        r#"<path class="edit" d="M{} {}H{}V{}Z" fill="{}"/>"#,
        num(x - EDIT_MARK),
        num(y),
        num(x),
        num(y + EDIT_MARK),
        hex(ink)
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

/// A confidence bar `w` long at `(x, y)`: the track, and the fill as long as the confidence.
fn bar(s: &mut String, (x, y): (f64, f64), w: f64, conf: f32, (track, fill): (Rgb, Rgb)) {
    let filled = w * conf.clamp(0.0, 1.0) as f64;
    let _ = write!(
        s,
        r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{}"/><rect x="{}" y="{}" width="{}" height="{}" fill="{}"/>"#,
        num(x),
        num(y),
        num(w),
        num(BAR_H),
        hex(track),
        num(x),
        num(y),
        num(filled),
        num(BAR_H),
        hex(fill)
    );
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
    fn legend_names_every_step_up_to_sixteen_then_the_ends_and_between() {
        assert_eq!(legend::named_steps(0..4), vec![0, 1, 2, 3]);
        assert_eq!(legend::named_steps(0..16).len(), 16);
        let l = legend::named_steps(0..32);
        assert_eq!((l[0], *l.last().unwrap(), l.len()), (0, 31, 8));
        let l = legend::named_steps(8..40);
        assert_eq!((l[0], *l.last().unwrap()), (8, 39), "a range's own ends");
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
        let svg = step_map_svg(&events, &Options::default()).unwrap();
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
        let svg = step_map_svg(&events, &Options::default()).unwrap();
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
        let svg = step_map_svg(&events, &Options::default()).unwrap();
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
        let plain = step_map_svg(&trace(&Synth::small()), &Options::default()).unwrap();
        assert!(!plain.contains("edit"), "{plain}");
    }

    #[test]
    fn no_header_or_no_decoded_token_is_an_error() {
        assert_eq!(step_map_svg(&[], &Options::default()), Err(FigureError::NoHeader));
        let events = crate::trace::synth::trace(&crate::trace::synth::Synth::small());
        assert_eq!(
            step_map_svg(&events[..1], &Options::default()),
            Err(FigureError::NothingDecoded)
        );
    }

    use crate::trace::synth::{trace, Synth};

    /// `events` with every token `token` spelled `text` (committed or still masked).
    fn spell(mut events: Vec<Event>, token: u32, text: &str) -> Vec<Event> {
        for e in &mut events {
            if let Event::Step(s) = e {
                let (c, m) = (s.committed.iter_mut(), s.masked.iter_mut());
                c.filter(|c| c.token == token).for_each(|c| c.text = text.into());
                m.filter(|c| c.token == token).for_each(|c| c.text = text.into());
            }
        }
        events
    }

    /// The small synthetic trace with CJK, math and a 40-character token in it.
    fn awkward() -> Vec<Event> {
        let events = spell(trace(&Synth::small()), 11, "你好");
        let events = spell(events, 12, " ≈ ∑");
        spell(events, 14, &"x".repeat(40))
    }

    fn svg(events: &[Event], opts: Options) -> String {
        step_map_svg(events, &opts).unwrap()
    }

    /// `(data-pos, rect width, text)` of every drawn cell.
    fn widths(svg: &str) -> Vec<(usize, f64, String)> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.attribute("data-pos").is_some())
            .map(|g| {
                let child = |name: &str| g.children().find(|c| c.has_tag_name(name)).unwrap();
                (
                    g.attribute("data-pos").unwrap().parse().unwrap(),
                    child("rect").attribute("width").unwrap().parse().unwrap(),
                    child("text").text().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    /// The block numbers drawn, with the y of each.
    fn labels(svg: &str) -> Vec<(usize, f64)> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.attribute("class") == Some("block"))
            .map(|t| {
                (t.text().unwrap().parse().unwrap(), t.attribute("y").unwrap().parse().unwrap())
            })
            .collect()
    }

    fn rows(svg: &str) -> usize {
        let mut ys: Vec<f64> = labels(svg).iter().map(|l| l.1).collect();
        ys.dedup();
        ys.len()
    }

    #[test]
    fn cells_are_as_wide_as_their_whole_text_and_long_tokens_are_capped() {
        let svg = svg(&awkward(), Options::default());
        let cells = widths(&svg);
        let width_of = |text: &str| cells.iter().find(|c| c.2 == text).map(|c| c.1);
        let near = |a: f64, b: f64| (a - b).abs() < 0.01;
        // Whole tokens: wide characters take two columns; a short token the floor.
        assert!(near(width_of("你好").unwrap(), layout::cell_w(4)), "{cells:?}");
        assert!(near(width_of("·≈·∑").unwrap(), layout::cell_w(4)));
        assert!(near(width_of("·softly").unwrap(), layout::cell_w(7)));
        assert!(near(width_of(".").unwrap(), layout::cell_w(layout::MIN_COLS)));
        // 40 columns are cut at the cap, the whole text kept in the tooltip.
        let cut = format!("{}…", "x".repeat(layout::MAX_COLS - 1));
        assert!(near(width_of(&cut).unwrap(), layout::cell_w(layout::MAX_COLS)), "{cells:?}");
        assert!(svg.contains(&format!("&quot;{}&quot;</title>", "x".repeat(40))));
        // Nothing leaves the figure.
        let doc = roxmltree::Document::parse(&svg).unwrap();
        for r in doc.descendants().filter(|n| n.has_tag_name("rect") && n.has_attribute("x")) {
            let x: f64 = r.attribute("x").unwrap().parse().unwrap();
            let w: f64 = r.attribute("width").unwrap().parse().unwrap();
            assert!(x + w <= 240.0 - MARGIN + 0.6, "{x} + {w}");
        }
    }

    #[test]
    fn rows_hold_as_many_blocks_as_fit_or_as_many_as_asked() {
        let events = trace(&Synth { new_tokens: 58, ..Synth::small() });
        let blocks = labels(&svg(&events, Options::default())).len();
        assert_eq!(blocks, 15);
        let narrow = rows(&svg(&events, Options::default()));
        let wide = Options { width: Width::new(504.0).unwrap(), ..Options::default() };
        let two_column = rows(&svg(&events, wide));
        assert!(two_column < narrow, "{two_column} rows at 504 pt, {narrow} at 240 pt");
        let per_row = |n| Options {
            blocks_per_row: Some(BlocksPerRow(std::num::NonZeroUsize::new(n).unwrap())),
            ..Options::default()
        };
        assert_eq!(rows(&svg(&events, per_row(1))), 15);
        assert_eq!(rows(&svg(&events, per_row(2))), 8);
        let e = step_map_svg(&events, &per_row(9)).unwrap_err();
        assert!(matches!(e, FigureError::TooWide(_)), "{e}");
        assert!(e.to_string().starts_with("--blocks-per-row 9: 9 blocks a row need "), "{e}");
    }

    #[test]
    fn every_block_is_numbered_and_the_axes_are_titled() {
        let events = trace(&Synth { new_tokens: 58, ..Synth::small() });
        for width in [240.0, 504.0] {
            let opts = Options { width: Width::new(width).unwrap(), ..Options::default() };
            let svg = svg(&events, opts);
            let numbers: Vec<usize> = labels(&svg).iter().map(|l| l.0).collect();
            assert_eq!(numbers, (1..16).collect::<Vec<_>>(), "every block, in order");
            assert!(svg.contains(">block</text>") && svg.contains(">position in block →</text>"));
        }
    }

    #[test]
    fn the_legend_names_the_prompt_the_steps_and_the_confidence_key() {
        let svg = svg(&awkward(), Options::default());
        assert!(svg.contains(r#"class="legend-prompt""#) && svg.contains(">prompt</text>"));
        assert!(svg.contains(">step</text>") && svg.contains(">confidence</text>"));
        assert!(!svg.contains(">other steps</text>") && !svg.contains(">masked</text>"));
        for n in 1..=4 {
            assert!(svg.contains(&format!(r#"text-anchor="middle">{n}</text>"#)), "step {n}");
        }
    }

    #[test]
    fn a_step_range_colours_its_steps_and_draws_the_rest_as_context() {
        let events = trace(&Synth::small());
        let steps: StepRange = "2..3".parse().unwrap();
        let svg = svg(&events, Options { steps, ..Options::default() });
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let theme = pick(ThemeName::Light, Depth::TrueColor);
        let mut seen = (0, 0);
        for g in doc.descendants().filter(|n| n.attribute("class") == Some("decoded")) {
            let step: usize = g.attribute("data-step").unwrap().parse().unwrap();
            let fill = g.children().find(|c| c.has_tag_name("rect")).unwrap().attribute("fill");
            if (2..=3).contains(&step) {
                assert_eq!(fill, Some(hex(theme.cell_rgb(step - 1, 4).0).as_str()), "full ramp");
                assert!(g.attribute("data-context").is_none());
                seen.0 += 1;
            } else {
                assert_eq!(fill, Some("#ffffff"));
                assert_eq!(g.attribute("data-context"), Some("true"));
                seen.1 += 1;
            }
        }
        assert!(seen.0 > 0 && seen.1 > 0, "{seen:?}");
        assert!(svg.contains(">other steps</text>") && svg.contains("steps 2–3 coloured"));
        // Only the range's steps are in the scale.
        let scale: Vec<&str> = doc
            .descendants()
            .filter(|n| {
                n.attribute("font-size") == Some("6")
                    && n.attribute("text-anchor") == Some("middle")
            })
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(scale, ["2", "3"]);
        let outside: StepRange = "5..".parse().unwrap();
        let e = step_map_svg(&events, &Options { steps: outside, ..Options::default() });
        assert_eq!(
            e.unwrap_err().to_string(),
            "--step-range 5..: the trace's blocks take at most 4 steps"
        );
    }

    /// A confidence bar reads on every step's hue: the bar against the cell's fill has at least
    /// WCAG's 3:1 for graphics (the dark-on-dark bars of step 1 had 1.3:1), the text too (it is
    /// the bar's colour), and the track differs from both.
    #[test]
    fn confidence_bars_contrast_with_every_step_colour() {
        let theme = pick(ThemeName::Light, Depth::TrueColor);
        for span in 1..=32 {
            for step in 0..span {
                let fill = Fill::Decoded { step, conf: 1.0, edits: 0 };
                let p = Paint::of(&fill, theme, span, &StepRange::ALL);
                let (track, bar) = p.bar();
                let at = format!("step {step} of {span}");
                assert!(contrast(bar, p.fill) >= 3.0, "{at}: {}", contrast(bar, p.fill));
                assert!(contrast(bar, track) >= 2.0, "{at}: bar on track");
                assert_ne!(track, p.fill, "{at}");
            }
        }
    }

    /// The figure of a small synthetic decode with CJK, math, a long token and edits, as a
    /// reviewer reads it: the whole document.
    #[test]
    fn the_figure_of_a_small_decode_with_cjk_and_math() {
        let events = spell(trace(&Synth::small_edits()), 11, "你好");
        let events = spell(events, 12, " ≈ ∑");
        insta::assert_snapshot!(svg(&events, Options::default()));
    }
}
