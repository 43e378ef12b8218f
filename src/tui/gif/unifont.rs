//! The font a GIF's cells are drawn in: GNU Unifont (assets/fonts/unifont/README.md), bundled
//! as its own `.hex` file, gzipped, and parsed at first use.
//!
//! Why a bitmap font, and this one: a terminal cell is a fixed grid of pixels, and Unifont is
//! drawn on that grid (8×16 for a narrow character, 16×16 for a wide one), so a glyph is copied
//! as it is, with no rasteriser and no anti-aliasing (whose blended edges would add colours no
//! theme has, and make the GIF larger). One font covers every character the screens hold: all
//! of the Basic Multilingual Plane, CJK (你好), maths (≈ ∑), box drawing, blocks (▁…█, ░),
//! arrows and dingbats (✗, ✎). A TTF through fontdue or ab_glyph would need a second font for
//! CJK and would anti-alias. The `.hex` format is a line per glyph, `XXXX:` and the bitmap's
//! rows in hex; no crate reads it (the bdf and psf crates read other formats), and its parser is
//! a few lines.

use std::collections::HashMap;
use std::io::Read;
use std::sync::LazyLock;

use anyhow::{bail, Context, Result};

/// The rows of a glyph are this many pixels tall.
pub const HEIGHT: usize = 16;

static HEX_GZ: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/fonts/unifont/unifont-15.0.01.hex.gz"
));

/// A glyph: 16 rows, each `width` pixels (8 or 16), the leftmost pixel in the row's top bit
/// (bit `width - 1`), as the `.hex` file spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Glyph {
    pub width: usize,
    pub rows: [u16; HEIGHT],
}

impl Glyph {
    /// Whether the pixel at column `x` of row `y` is set (`x < width`).
    pub fn pixel(&self, x: usize, y: usize) -> bool {
        self.rows[y] >> (self.width - 1 - x) & 1 == 1
    }
}

pub struct Font {
    glyphs: HashMap<char, Glyph>,
}

impl Font {
    pub fn glyph(&self, c: char) -> Option<&Glyph> {
        self.glyphs.get(&c)
    }

    /// Parses a `.hex` font: one `CODEPOINT:BITMAP` line per glyph, a bitmap of 32 hex digits
    /// (8 pixels a row) or 64 (16 pixels a row). A bad line fails with its number.
    pub fn parse(text: &str) -> Result<Font> {
        let mut glyphs = HashMap::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
            let (c, g) = parse_line(line).with_context(|| format!("line {}", i + 1))?;
            glyphs.insert(c, g);
        }
        Ok(Font { glyphs })
    }

    /// The bundled Unifont, parsed once.
    pub fn bundled() -> Result<&'static Font> {
        static FONT: LazyLock<Result<Font, String>> = LazyLock::new(|| {
            let mut text = String::new();
            flate2::read::GzDecoder::new(HEX_GZ)
                .read_to_string(&mut text)
                .map_err(|e| e.to_string())
                .and_then(|_| Font::parse(&text).map_err(|e| format!("{e:#}")))
        });
        FONT.as_ref().map_err(|e| anyhow::anyhow!("the bundled font (Unifont): {e}"))
    }
}

fn parse_line(line: &str) -> Result<(char, Glyph)> {
    let Some((cp, bits)) = line.split_once(':') else { bail!("no ':' after the code point") };
    let cp = u32::from_str_radix(cp, 16).with_context(|| format!("code point {cp:?}"))?;
    let c = char::from_u32(cp).with_context(|| format!("code point {cp:X} is no character"))?;
    let width = match bits.len() {
        32 => 8,
        64 => 16,
        n => bail!("a bitmap of {n} hex digits (32 or 64)"),
    };
    let digits = width / 4;
    let mut rows = [0u16; HEIGHT];
    for (y, row) in rows.iter_mut().enumerate() {
        let hex = bits.get(y * digits..(y + 1) * digits).context("not ASCII hex")?;
        *row = u16::from_str_radix(hex, 16).with_context(|| format!("row {hex:?}"))?;
    }
    Ok((c, Glyph { width, rows }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_font_has_every_character_the_screens_draw() {
        let font = Font::bundled().unwrap();
        for (c, width) in [
            ('a', 8),
            ('≈', 8),
            ('∑', 8),
            ('░', 8),
            ('▁', 8),
            ('█', 8),
            ('─', 8),
            ('│', 8),
            ('→', 8),
            ('¹', 8),
            ('…', 8),
            ('你', 16),
            ('好', 16),
            ('✗', 16),
            ('✎', 16),
        ] {
            assert_eq!(font.glyph(c).map(|g| g.width), Some(width), "{c}");
        }
        let full = font.glyph('█').unwrap();
        assert!(full.rows.iter().all(|&r| r == 0xff), "{full:?}");
        assert!(font.glyph('\u{1f600}').is_none(), "the BMP only");
    }

    #[test]
    fn a_hex_line_is_a_glyph_and_a_bad_one_names_its_line() {
        let f = Font::parse("0041:0000000018242442427E424242420000\n").unwrap();
        let a = f.glyph('A').unwrap();
        assert_eq!((a.width, a.rows[4], a.rows[9]), (8, 0x18, 0x7e));
        assert!(a.pixel(3, 4) && a.pixel(4, 4) && !a.pixel(2, 4));
        let e = Font::parse("0041:00\n").err().unwrap();
        assert_eq!(format!("{e:#}"), "line 1: a bitmap of 2 hex digits (32 or 64)");
        let e = Font::parse("0041:0000000018242442427E424242420000\nzz:0\n").err().unwrap();
        assert!(format!("{e:#}").starts_with("line 2: code point \"zz\""), "{e:#}");
    }
}
