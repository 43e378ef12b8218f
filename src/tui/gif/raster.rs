//! A screen (ratatui's `Buffer`) drawn as pixels, cell by cell, as a terminal draws it: each
//! cell its background, its glyph in its foreground, bold, italic, underline and strikethrough
//! drawn, a wide character over its two cells, `Color::Reset` in the colours of the terminal
//! the theme is made for. Pure: no I/O, the font is the bundled one.

use ratatui::buffer::{Buffer, Cell, CellWidth};
use ratatui::style::{Color, Modifier};
use unicode_width::UnicodeWidthChar;

use super::unifont::{Font, Glyph, HEIGHT};
use crate::tui::theme::{Rgb, Theme};

/// A cell is this many pixels wide (at scale 1), a wide character twice that: Unifont's grid.
pub const CELL_W: usize = 8;
/// A cell is this many pixels tall (at scale 1).
pub const CELL_H: usize = HEIGHT;
/// The glyph row an underline takes: the font's underscore's, below the baseline (row 13).
const UNDERLINE_ROW: usize = 14;
/// The glyph row a strikethrough takes: the middle of a lower-case letter (rows 6 to 13),
/// where a struck-out word is crossed in a terminal.
const STRIKE_ROW: usize = 9;

/// Pixels per font pixel (`--gif-scale`): 1 gives 8×16 cells, 2 gives 16×32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Scale {
    #[default]
    #[value(name = "1")]
    One,
    #[value(name = "2")]
    Two,
}

impl Scale {
    pub fn factor(self) -> usize {
        match self {
            Scale::One => 1,
            Scale::Two => 2,
        }
    }
}

/// What a cell's colours show as: `Color::Reset` is the terminal's own text and background
/// colour, the ones the theme is made for; with no colour (`--mono`, NO_COLOR) every cell is
/// in those two colours, whatever colour a cell names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Look {
    fg: Rgb,
    bg: Rgb,
    mono: bool,
}

/// A cell's colours as a terminal paints them (reverse and hidden applied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Paint {
    fg: Rgb,
    bg: Rgb,
    underline: Rgb,
}

impl Look {
    pub fn of(theme: &Theme) -> Look {
        let (fg, bg) = theme.screen_rgb();
        Look { fg, bg, mono: theme.mono() }
    }

    /// The background of a screen no cell has painted yet.
    pub fn background(&self) -> Rgb {
        self.bg
    }

    fn rgb(&self, c: Color, default: Rgb) -> Rgb {
        match c {
            _ if self.mono => default,
            Color::Reset => default,
            Color::Rgb(r, g, b) => (r, g, b),
            Color::Indexed(i) => xterm_rgb(i),
            named => xterm_rgb(named_index(named)),
        }
    }

    fn paint(&self, cell: &Cell) -> Paint {
        let (mut fg, mut bg) = (self.rgb(cell.fg, self.fg), self.rgb(cell.bg, self.bg));
        let m = cell.modifier;
        if m.contains(Modifier::REVERSED) {
            std::mem::swap(&mut fg, &mut bg);
        }
        if m.contains(Modifier::DIM) {
            fg = mix(fg, bg);
        }
        if m.contains(Modifier::HIDDEN) {
            fg = bg;
        }
        let underline = match cell.underline_color {
            Color::Reset => fg,
            c => self.rgb(c, fg),
        };
        Paint { fg, bg, underline }
    }
}

/// Halfway between two colours: a dim text colour.
fn mix(a: Rgb, b: Rgb) -> Rgb {
    let m = |x: u8, y: u8| ((x as u16 + y as u16) / 2) as u8;
    (m(a.0, b.0), m(a.1, b.1), m(a.2, b.2))
}

/// The palette index of one of the sixteen named colours (xterm's order).
fn named_index(c: Color) -> u8 {
    match c {
        Color::Black => 0,
        Color::Red => 1,
        Color::Green => 2,
        Color::Yellow => 3,
        Color::Blue => 4,
        Color::Magenta => 5,
        Color::Cyan => 6,
        Color::Gray => 7,
        Color::DarkGray => 8,
        Color::LightRed => 9,
        Color::LightGreen => 10,
        Color::LightYellow => 11,
        Color::LightBlue => 12,
        Color::LightMagenta => 13,
        Color::LightCyan => 14,
        _ => 15,
    }
}

/// A colour of xterm's 256-colour palette: its sixteen system colours (xterm's defaults:
/// terminals redefine them), the 6×6×6 cube and the grey ramp (`theme::xterm256` the other
/// way).
pub fn xterm_rgb(i: u8) -> Rgb {
    const SYSTEM: [Rgb; 16] = [
        (0, 0, 0),
        (205, 0, 0),
        (0, 205, 0),
        (205, 205, 0),
        (0, 0, 238),
        (205, 0, 205),
        (0, 205, 205),
        (229, 229, 229),
        (127, 127, 127),
        (255, 0, 0),
        (0, 255, 0),
        (255, 255, 0),
        (92, 92, 255),
        (255, 0, 255),
        (0, 255, 255),
        (255, 255, 255),
    ];
    const LEVELS: [u8; 6] = [0, 95, 135, 175, 215, 255];
    match i {
        0..=15 => SYSTEM[i as usize],
        16..=231 => {
            let c = (i - 16) as usize;
            (LEVELS[c / 36], LEVELS[c / 6 % 6], LEVELS[c % 6])
        }
        _ => {
            let g = 8 + 10 * (i - 232);
            (g, g, g)
        }
    }
}

/// A glyph's rows at a cell's width in pixels (8 or 16), leftmost pixel in bit `width - 1`.
type Rows = [u16; HEIGHT];

/// `g` at `width` pixels: as it is when it fits; a wide glyph in a narrow cell (Unifont draws
/// ✗ and ✎ 16 pixels wide, a terminal gives them one cell) squeezed to half its width, each
/// pixel column the union of two; a narrow glyph in a wide cell centred.
fn fit(g: &Glyph, width: usize) -> Rows {
    let mut rows = [0u16; HEIGHT];
    for (y, row) in rows.iter_mut().enumerate() {
        for x in 0..width {
            let on = if g.width > width {
                let r = g.width / width;
                (x * r..(x + 1) * r).any(|sx| g.pixel(sx, y))
            } else {
                let off = (width - g.width) / 2;
                x >= off && x - off < g.width && g.pixel(x - off, y)
            };
            if on {
                *row |= 1 << (width - 1 - x);
            }
        }
    }
    rows
}

/// What a terminal with no glyph for a character shows (an emoji, outside the font's plane):
/// an empty box.
fn tofu(width: usize) -> Rows {
    let mut rows = [0u16; HEIGHT];
    let inner = (1u16 << (width - 2)) - 1; // columns 1 ..= width - 2
    let sides = 1 << (width - 2) | 1 << 1;
    for (y, row) in rows.iter_mut().enumerate().take(14).skip(2) {
        *row = if y == 2 || y == 13 { inner << 1 } else { sides };
    }
    rows
}

/// Whether a character after the first of a cell's grapheme is drawn over it: a combining
/// mark is (width 0); joiners, variation selectors and other default-ignorable characters,
/// which a terminal does not show, are not (Unifont draws them as labelled boxes).
fn overlays(c: char) -> bool {
    let ignorable = matches!(
        c,
        '\u{34f}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{e0000}'..='\u{e0fff}'
    );
    c.width() == Some(0) && !ignorable
}

/// A cell's glyph rows at `width` pixels, with its italic (the top half leans one pixel
/// right) and its bold (each pixel doubled to its right, as terminals embolden a bitmap font
/// that has no bold face).
fn shape(font: &Font, symbol: &str, width: usize, m: Modifier) -> Rows {
    let mut chars = symbol.chars();
    let first = chars.next().unwrap_or(' ');
    let mut rows = font.glyph(first).map_or_else(|| tofu(width), |g| fit(g, width));
    for g in chars.filter(|&c| overlays(c)).filter_map(|c| font.glyph(c)) {
        for (row, more) in rows.iter_mut().zip(fit(g, width)) {
            *row |= more;
        }
    }
    if m.contains(Modifier::ITALIC) {
        rows.iter_mut().take(HEIGHT / 2).for_each(|r| *r >>= 1);
    }
    if m.contains(Modifier::BOLD) {
        rows.iter_mut().for_each(|r| *r |= *r >> 1);
    }
    rows
}

/// The pixels of a screen, redrawn cell by cell as screens come.
pub struct Raster {
    font: &'static Font,
    look: Look,
    scale: usize,
    cols: usize,
    rows: usize,
    pixels: Vec<Rgb>,
    /// The screen the pixels show (None: none yet, the background).
    drawn: Option<Buffer>,
    /// The pixels redrawn since [`Raster::take_redrawn`] last asked (None: none).
    redrawn: Option<Area>,
}

/// A rectangle of pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Area {
    pub x: usize,
    pub y: usize,
    pub width: usize,
    pub height: usize,
}

impl Area {
    /// The smallest area holding both.
    fn union(self, o: Area) -> Area {
        let (x, y) = (self.x.min(o.x), self.y.min(o.y));
        let right = (self.x + self.width).max(o.x + o.width);
        let bottom = (self.y + self.height).max(o.y + o.height);
        Area { x, y, width: right - x, height: bottom - y }
    }
}

impl Raster {
    pub fn new(font: &'static Font, look: Look, scale: Scale, cols: u16, rows: u16) -> Raster {
        let (cols, rows, scale) = (cols as usize, rows as usize, scale.factor());
        let pixels = vec![look.bg; cols * CELL_W * scale * rows * CELL_H * scale];
        Raster { font, look, scale, cols, rows, pixels, drawn: None, redrawn: None }
    }

    /// The pixels redrawn since the last call (a picture as a whole before the first), which
    /// hold every pixel that changed: the rest of the picture is as it was.
    pub fn take_redrawn(&mut self) -> Option<Area> {
        self.redrawn.take()
    }

    pub fn width(&self) -> usize {
        self.cols * CELL_W * self.scale
    }

    pub fn height(&self) -> usize {
        self.rows * CELL_H * self.scale
    }

    /// Row by row, left to right, `width()` pixels a row.
    pub fn pixels(&self) -> &[Rgb] {
        &self.pixels
    }

    /// Draws `screen` (of the raster's size in cells; the part of it that fits otherwise),
    /// redrawing only the cells that differ from the screen drawn before, and those after a
    /// cell that changed (it may have been a wide character over them, or become one).
    pub fn draw(&mut self, screen: &Buffer) {
        let cols = self.cols.min(screen.area.width as usize);
        let rows = self.rows.min(screen.area.height as usize);
        let stride = screen.area.width as usize;
        let drawn = self.drawn.take().filter(|b| b.area == screen.area);
        for y in 0..rows {
            let row = &screen.content[y * stride..y * stride + cols];
            let old = drawn.as_ref().map(|b| &b.content[y * stride..y * stride + cols]);
            let mut x = 0;
            while x < cols {
                let span = (row[x].cell_width().max(1) as usize).min(cols - x);
                let same = |i: usize| old.is_some_and(|o| o[i] == row[i]);
                if !(same(x) && (x == 0 || same(x - 1))) {
                    self.draw_cell(x, y, &row[x], span);
                }
                x += span;
            }
        }
        self.drawn = Some(screen.clone());
    }

    /// Paints `cell` over `span` cells from column `col` of row `row`.
    fn draw_cell(&mut self, col: usize, row: usize, cell: &Cell, span: usize) {
        let paint = self.look.paint(cell);
        let glyph_w = span.min(2) * CELL_W;
        let glyph = shape(self.font, cell.symbol(), glyph_w, cell.modifier);
        let under = cell.modifier.contains(Modifier::UNDERLINED);
        let struck = cell.modifier.contains(Modifier::CROSSED_OUT);
        let (s, width) = (self.scale, self.width());
        let (x0, y0) = (col * CELL_W * s, row * CELL_H * s);
        let area = Area { x: x0, y: y0, width: span * CELL_W * s, height: CELL_H * s };
        self.redrawn = Some(self.redrawn.map_or(area, |r| r.union(area)));
        for (gy, bits) in glyph.iter().enumerate() {
            for gx in 0..span * CELL_W {
                let ink = gx < glyph_w && bits >> (glyph_w - 1 - gx) & 1 == 1;
                let colour = match () {
                    _ if under && gy == UNDERLINE_ROW => paint.underline,
                    _ if (struck && gy == STRIKE_ROW) || ink => paint.fg,
                    _ => paint.bg,
                };
                for py in y0 + gy * s..y0 + (gy + 1) * s {
                    let at = py * width + x0 + gx * s;
                    self.pixels[at..at + s].fill(colour);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ratatui::layout::Rect;
    use ratatui::style::Style;

    use super::*;
    use crate::tui::theme::{pick, Depth, ThemeName};

    const FG: Rgb = (0x12, 0x34, 0x56);
    const BG: Rgb = (0xfe, 0xdc, 0xba);

    fn look() -> Look {
        Look::of(pick(ThemeName::Dark, Depth::TrueColor))
    }

    fn raster(look: Look, scale: Scale, buf: &Buffer) -> Raster {
        let mut r =
            Raster::new(Font::bundled().unwrap(), look, scale, buf.area.width, buf.area.height);
        r.draw(buf);
        r
    }

    /// The pixels of cell (col, row), CELL_W × CELL_H at scale 1, as rows of colours.
    fn cell_pixels(r: &Raster, col: usize, row: usize, cells: usize) -> Vec<Vec<Rgb>> {
        (0..CELL_H)
            .map(|y| {
                let at = (row * CELL_H + y) * r.width() + col * CELL_W;
                r.pixels()[at..at + cells * CELL_W].to_vec()
            })
            .collect()
    }

    /// The cell's rows as text: `#` for the foreground, `.` for the background.
    fn ascii(px: &[Vec<Rgb>], fg: Rgb, bg: Rgb) -> Vec<String> {
        px.iter()
            .map(|row| {
                row.iter()
                    .map(|&c| match c {
                        c if c == fg => '#',
                        c if c == bg => '.',
                        _ => '?',
                    })
                    .collect()
            })
            .collect()
    }

    fn one(symbol: &str, style: Style) -> Buffer {
        let mut buf = Buffer::empty(Rect::new(0, 0, 4, 1));
        buf.set_string(0, 0, symbol, style);
        buf
    }

    fn rgb(c: Rgb) -> Color {
        Color::Rgb(c.0, c.1, c.2)
    }

    #[test]
    fn a_cell_is_its_glyph_in_its_exact_colours() {
        let r = raster(look(), Scale::One, &one("A", Style::default().fg(rgb(FG)).bg(rgb(BG))));
        assert_eq!((r.width(), r.height()), (4 * CELL_W, CELL_H));
        let a = ascii(&cell_pixels(&r, 0, 0, 1), FG, BG);
        // Unifont's A: rows 4 to 13
        assert_eq!(a[3], "........");
        assert_eq!(a[4], "...##...");
        assert_eq!(a[9], ".######.");
        assert_eq!(a[13], ".#....#.");
        let (text, back) = pick(ThemeName::Dark, Depth::TrueColor).screen_rgb();
        // the next cell is blank: the theme's background, a Reset colour
        let next = cell_pixels(&r, 1, 0, 1);
        assert!(next.iter().flatten().all(|&c| c == back), "{next:?}");
        assert_ne!(text, back);
    }

    #[test]
    fn reset_and_indexed_colours_are_the_terminal_s() {
        let dark = pick(ThemeName::Dark, Depth::TrueColor);
        let (text, back) = dark.screen_rgb();
        let r = raster(Look::of(dark), Scale::One, &one("█", Style::default()));
        assert!(cell_pixels(&r, 0, 0, 1).iter().flatten().all(|&c| c == text));
        let r = raster(
            look(),
            Scale::One,
            &one("█ ", Style::default().fg(Color::Indexed(196)).bg(Color::Indexed(232))),
        );
        assert!(cell_pixels(&r, 0, 0, 1).iter().flatten().all(|&c| c == (255, 0, 0)));
        assert!(cell_pixels(&r, 1, 0, 1).iter().flatten().all(|&c| c == (8, 8, 8)));
        assert_eq!(xterm_rgb(16 + 36 + 12 + 3), (95, 135, 175));
        assert_eq!(xterm_rgb(244), (128, 128, 128));
        assert_eq!(back, (0x10, 0x12, 0x16));
    }

    #[test]
    fn a_wide_character_spans_two_cells() {
        let r = raster(look(), Scale::One, &one("你a", Style::default().fg(rgb(FG)).bg(rgb(BG))));
        let wide = ascii(&cell_pixels(&r, 0, 0, 2), FG, BG);
        let font = Font::bundled().unwrap();
        assert_eq!(wide, ascii_glyph(font.glyph('你').unwrap()));
        assert!(wide.iter().any(|row| row[8..].contains('#')), "ink in the second cell");
        let a = ascii(&cell_pixels(&r, 2, 0, 1), FG, BG);
        assert_eq!(a, ascii_glyph(font.glyph('a').unwrap()), "the next character after both");
    }

    fn ascii_glyph(g: &Glyph) -> Vec<String> {
        (0..HEIGHT)
            .map(|y| (0..g.width).map(|x| if g.pixel(x, y) { '#' } else { '.' }).collect())
            .collect()
    }

    #[test]
    fn strikethrough_and_underline_are_lines_across_the_cell() {
        let style = Style::default().fg(rgb(FG)).bg(rgb(BG));
        let plain =
            ascii(&cell_pixels(&raster(look(), Scale::One, &one("o", style)), 0, 0, 1), FG, BG);
        let struck = one("o", style.add_modifier(Modifier::CROSSED_OUT));
        let s = ascii(&cell_pixels(&raster(look(), Scale::One, &struck), 0, 0, 1), FG, BG);
        assert_eq!(s[STRIKE_ROW], "########");
        assert_ne!(plain[STRIKE_ROW], "########");
        assert_eq!(s[..STRIKE_ROW], plain[..STRIKE_ROW], "the glyph otherwise");
        let under = one("o", style.add_modifier(Modifier::UNDERLINED).underline_color(rgb(BG)));
        let u = ascii(&cell_pixels(&raster(look(), Scale::One, &under), 0, 0, 1), FG, BG);
        assert_eq!(u[UNDERLINE_ROW], "........", "in its underline colour");
        let under = one("o", style.add_modifier(Modifier::UNDERLINED));
        let u = ascii(&cell_pixels(&raster(look(), Scale::One, &under), 0, 0, 1), FG, BG);
        assert_eq!(u[UNDERLINE_ROW], "########", "else in the text colour");
    }

    #[test]
    fn bold_thickens_italic_leans_reverse_swaps() {
        let style = Style::default().fg(rgb(FG)).bg(rgb(BG));
        let draw = |m: Modifier| {
            ascii(
                &cell_pixels(
                    &raster(look(), Scale::One, &one("l", style.add_modifier(m))),
                    0,
                    0,
                    1,
                ),
                FG,
                BG,
            )
        };
        let (plain, bold, italic) =
            (draw(Modifier::empty()), draw(Modifier::BOLD), draw(Modifier::ITALIC));
        let ink = |rows: &[String]| rows.iter().map(|r| r.matches('#').count()).sum::<usize>();
        assert!(ink(&bold) > ink(&plain));
        assert_eq!(italic[HEIGHT - 3], plain[HEIGHT - 3], "the foot stays");
        assert_eq!(italic[4][1..], plain[4][..7], "the top leans right");
        let reversed = draw(Modifier::REVERSED);
        let swapped: Vec<String> = plain
            .iter()
            .map(|r| r.chars().map(|c| if c == '#' { '.' } else { '#' }).collect())
            .collect();
        assert_eq!(reversed, swapped);
    }

    /// No colour: every cell in the theme's two colours, whatever colours the cells name.
    #[test]
    fn mono_draws_in_the_terminal_s_two_colours() {
        let mono = pick(ThemeName::Light, Depth::Mono);
        let (text, back) = mono.screen_rgb();
        let mut buf = one("x▆", Style::default().fg(rgb(FG)).bg(rgb(BG)));
        buf.set_string(2, 0, "y", Style::default().fg(Color::Red).add_modifier(Modifier::REVERSED));
        let r = raster(Look::of(mono), Scale::One, &buf);
        let colours: std::collections::BTreeSet<Rgb> = r.pixels().iter().copied().collect();
        assert_eq!(colours, [text, back].into_iter().collect());
        assert_eq!(back, (0xff, 0xff, 0xff), "the light theme's white");
        let y = cell_pixels(&r, 2, 0, 1);
        assert_eq!(y[0][0], text, "reversed: text-coloured background");
    }

    #[test]
    fn scale_two_doubles_every_pixel() {
        let buf = one("A", Style::default().fg(rgb(FG)).bg(rgb(BG)));
        let (a, b) = (raster(look(), Scale::One, &buf), raster(look(), Scale::Two, &buf));
        assert_eq!((b.width(), b.height()), (2 * a.width(), 2 * a.height()));
        for y in 0..b.height() {
            for x in 0..b.width() {
                assert_eq!(b.pixels()[y * b.width() + x], a.pixels()[(y / 2) * a.width() + x / 2]);
            }
        }
    }

    /// A screen drawn over another is the same pixels as that screen drawn afresh, through
    /// wide characters that come and go.
    #[test]
    fn redrawing_only_changed_cells_gives_the_screen_drawn_afresh() {
        let style = Style::default().fg(rgb(FG)).bg(rgb(BG));
        let screens =
            [one("ab", style), one("你c", style), one("a好", style), one("x ", Style::default())];
        let mut r = Raster::new(Font::bundled().unwrap(), look(), Scale::One, 4, 1);
        for s in &screens {
            r.draw(s);
            assert_eq!(r.pixels(), raster(look(), Scale::One, s).pixels());
        }
    }

    #[test]
    fn a_character_outside_the_font_is_a_box_and_marks_combine() {
        let style = Style::default().fg(rgb(FG)).bg(rgb(BG));
        let r = raster(look(), Scale::One, &one("😀", style));
        let b = ascii(&cell_pixels(&r, 0, 0, 2), FG, BG);
        assert_eq!(b[2], ".##############.");
        assert_eq!(b[5], ".#............#.");
        let e = ascii(
            &cell_pixels(&raster(look(), Scale::One, &one("e\u{301}", style)), 0, 0, 1),
            FG,
            BG,
        );
        let plain =
            ascii(&cell_pixels(&raster(look(), Scale::One, &one("e", style)), 0, 0, 1), FG, BG);
        assert_ne!(e, plain, "the acute is drawn over the e");
        let zwj = ascii(
            &cell_pixels(&raster(look(), Scale::One, &one("e\u{fe0f}", style)), 0, 0, 1),
            FG,
            BG,
        );
        assert_eq!(zwj, plain, "a variation selector is not");
    }
}
