//! The fonts the figure is drawn with, bundled in the binary (assets/fonts/, where the README
//! gives each one's source and licence). The PNG is drawn with these and nothing else, so it
//! looks the same on every machine, a bare container included; the SVG names the same
//! families first, so that a viewer that has them draws it alike.
//!
//! Why these (6.0 MB of fonts, 3.1 MB gzipped as the binary holds them; tokens come from any
//! tokenizer, so coverage matters):
//! - DejaVu Sans Mono (0.3 MB): the token text. Latin, Greek, Cyrillic, most mathematical
//!   operators, arrows, box drawing and shades in one monospace face whose 0.6 em advance the
//!   layout measures with.
//! - DejaVu Sans (0.8 MB): the title, axis titles and legend, and what the mono face lacks of
//!   Hebrew, Arabic, Armenian, Georgian and the mathematical operators (≪ ≫ ∥ ⊨ ∮).
//! - Noto Sans Math (0.6 MB): the mathematical alphanumerics (𝑥 𝔽 𝟙) and the rest of the
//!   mathematical symbol blocks.
//! - Droid Sans Fallback (3.4 MB): every CJK unified ideograph of the basic block (20,902),
//!   kana and all 11,172 Hangul syllables. Noto Sans CJK draws them better but is 16 MB a
//!   region, 9 MB cut to the ideographs alone; a common-characters subset would draw a rarer
//!   character of a real token as a box. GNU Unifont covers the whole BMP in less, but as 16 px
//!   bitmaps, which print as pixel art.
//! - Noto Emoji (0.9 MB): emoji in outline, drawn in the cell's text colour like any glyph (a
//!   colour emoji font is 10 MB, and its colours would fight the step colours).
//! - Noto Sans Symbols2, cut to its Control Pictures (7 KB): the stand-ins `␇ ␛ ␀` that token
//!   text shows for control characters (src/glyph.rs), which none of the others has.
//!
//! Scripts none of them covers (Thai, the Indic scripts, ...) print as boxes in the PNG; the
//! SVG leaves them to the viewer's fonts.

/// Token text, as the SVG's `font-family` names it: the bundled mono face, the system monos a
/// viewer without it has (before the fallbacks, so that Latin text stays monospace there),
/// then the bundled faces for what the mono face lacks.
pub const MONO: &str = "'DejaVu Sans Mono', Menlo, Consolas, 'DejaVu Sans', 'Noto Sans Math', \
    'Droid Sans Fallback', 'Noto Emoji', 'Noto Sans Symbols2', monospace";
/// Titles and the legend.
pub const SANS: &str = "'DejaVu Sans', Helvetica, Arial, 'Noto Sans Math', \
    'Droid Sans Fallback', 'Noto Emoji', sans-serif";

/// One bundled font file, gzipped (`gzip -9 -n`; half the size in the binary).
pub struct Font {
    pub family: &'static str,
    pub file: &'static str,
    gzipped: &'static [u8],
}

macro_rules! font {
    ($family:literal, $file:literal) => {
        Font {
            family: $family,
            file: $file,
            gzipped: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/assets/fonts/",
                $file,
                ".gz"
            )),
        }
    };
}

/// In the order a character missing from the chosen face is looked for (usvg tries faces in
/// the order they were loaded).
pub const BUNDLED: [Font; 6] = [
    font!("DejaVu Sans Mono", "DejaVuSansMono.ttf"),
    font!("DejaVu Sans", "DejaVuSans.ttf"),
    font!("Noto Sans Math", "NotoSansMath-Regular.ttf"),
    font!("Droid Sans Fallback", "DroidSansFallback.ttf"),
    font!("Noto Emoji", "NotoEmoji-Regular.ttf"),
    font!("Noto Sans Symbols2", "NotoSansSymbols2-ControlPictures.ttf"),
];

impl Font {
    /// The font file itself (the bytes are the binary's own, which the tests inflate: an
    /// error here is a broken build).
    fn data(&self) -> Result<Vec<u8>, String> {
        use std::io::Read;
        let mut out = Vec::with_capacity(self.gzipped.len() * 2);
        flate2::read::GzDecoder::new(self.gzipped)
            .read_to_end(&mut out)
            .map_err(|e| format!("the bundled font {} does not inflate: {e}", self.file))?;
        Ok(out)
    }
}

/// A font database of the bundled fonts only, the generic families mapped onto them.
pub fn database() -> Result<resvg::usvg::fontdb::Database, String> {
    let mut db = resvg::usvg::fontdb::Database::new();
    for f in &BUNDLED {
        db.load_font_data(f.data()?);
    }
    db.set_monospace_family(BUNDLED[0].family);
    db.set_sans_serif_family(BUNDLED[1].family);
    // usvg falls back to serif when no family of a text is found.
    db.set_serif_family(BUNDLED[1].family);
    Ok(db)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The characters of `text` that no bundled font maps to a glyph (they would print as
    /// the notdef box).
    fn uncovered(db: &resvg::usvg::fontdb::Database, text: &str) -> Vec<char> {
        use skrifa::MetadataProvider;
        let has = |id, c| {
            db.with_face_data(id, |data, index| {
                skrifa::FontRef::from_index(data, index).ok()?.charmap().map(c)
            })
            .flatten()
            .is_some()
        };
        text.chars()
            .filter(|c| !c.is_whitespace())
            .filter(|&c| !db.faces().any(|f| has(f.id, c)))
            .collect()
    }

    #[test]
    fn every_bundled_file_is_a_font_of_its_family() {
        let db = database().unwrap();
        assert_eq!(db.len(), BUNDLED.len());
        for (face, font) in db.faces().zip(&BUNDLED) {
            assert!(face.families.iter().any(|(name, _)| name == font.family), "{}", font.file);
            assert!(MONO.contains(font.family) || SANS.contains(font.family), "{}", font.family);
        }
    }

    /// CJK, Hangul, kana, math, Hebrew, Arabic, emoji and the glyph stand-ins of token text
    /// all have a face; Thai has none (the module's comment says why).
    #[test]
    fn the_bundled_fonts_cover_cjk_math_and_the_stand_ins() {
        let db = database().unwrap();
        let text = "你好 世界 日本語 かな カナ 한국어 ≈ ∑ ∫ ≪ ∥ 𝑥 ℝ α β λ ж חי عربي 🦀 😇 · ↵ ⇥ ␇ ␛ ␍ ␡ ⍰ ⍽ ¤ ◌ → … ✎ ░ ÷ ×";
        assert_eq!(uncovered(&db, text), Vec::<char>::new());
        assert_eq!(uncovered(&db, "ภาษาไทย"), "ภาษาไทย".chars().collect::<Vec<_>>());
    }
}
