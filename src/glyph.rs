//! Token text made visible and measured. Tokens are arbitrary strings: a newline, a tab, an
//! escape byte or a lone combining mark must neither break the layout nor vanish. Widths are
//! measured per grapheme with unicode-width, as ratatui measures them when it draws.

use std::borrow::Cow;

use unicode_segmentation::UnicodeSegmentation;
use unicode_width::UnicodeWidthStr;

/// A masked cell.
pub const MASK: &str = "░";
/// Text cut short to fit.
pub const ELLIPSIS: &str = "…";
/// A grid cell whose bytes only start a character that a later cell completes (and shows).
pub const PART: &str = "→";
/// A decoded cell whose token a later step replaced (token editing): a glyph, so that the mark
/// reads without colour too.
pub const EDIT: &str = "✎";

/// Where text is drawn: a grid cell shows spaces as `·` (token boundaries matter there); prose
/// keeps spaces and keeps `\n` so that the wrapper can break the line after drawing `↵`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Cell,
    Prose,
}

/// The visible stand-in of a character that would not show, if it needs one.
fn stand_in(c: char, mode: Mode) -> Option<char> {
    Some(match c {
        '\n' if mode == Mode::Prose => return None,
        '\n' | '\u{2028}' | '\u{2029}' => '↵',
        '\r' => '␍',
        '\t' => '⇥',
        ' ' if mode == Mode::Cell => '·',
        '\u{a0}' if mode == Mode::Cell => '⍽',
        // C0 controls have dedicated pictures at U+2400.
        c @ '\0'..='\u{1f}' => char::from_u32(0x2400 + c as u32).unwrap_or('⍰'),
        '\u{7f}' => '␡',
        '\u{80}'..='\u{9f}' => '⍰',
        // Invisible format characters: zero-width spaces and joiners, BOM, soft hyphen.
        '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}' => '¤',
        _ => return None,
    })
}

/// `s` with every invisible or layout-breaking character replaced by a visible stand-in. A
/// leading combining mark (width 0) gets a dotted circle to sit on, as Unicode charts draw it.
pub fn escape(s: &str, mode: Mode) -> Cow<'_, str> {
    let plain = s.bytes().all(|b| (0x21..0x7f).contains(&b) || (b == b' ' && mode == Mode::Prose));
    if plain {
        return Cow::Borrowed(s);
    }
    let mut out: String = s.chars().map(|c| stand_in(c, mode).unwrap_or(c)).collect();
    if out.graphemes(true).next().is_some_and(|g| g.width() == 0 && g != "\n") {
        out.insert(0, '◌');
    }
    if out == s {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(out)
    }
}

/// `s` as one line with no control character left: every character [`escape`] would replace
/// in a cell, line breaks included, except spaces. For text from files that is printed outside
/// the TUI (error messages, `unmask export` to a terminal), so that a crafted token or value
/// cannot move the cursor, set the terminal's title or split a one-line error.
pub fn escape_line(s: &str) -> Cow<'_, str> {
    let keep = |c: char| c == ' ' || c == '\u{a0}';
    let visible = |c: char| if keep(c) { c } else { stand_in(c, Mode::Cell).unwrap_or(c) };
    if s.chars().all(|c| visible(c) == c) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.chars().map(visible).collect())
}

/// Display width of already escaped text.
pub fn width(s: &str) -> usize {
    if s.is_ascii() {
        return s.len();
    }
    s.graphemes(true).map(UnicodeWidthStr::width).sum()
}

/// `s` cut to at most `max` columns, ending in `…` if anything was cut. Never splits a grapheme,
/// so a wide character that would straddle the edge is dropped whole. Returns the text and its
/// width.
pub fn fit(s: &str, max: usize) -> (Cow<'_, str>, usize) {
    let w = width(s);
    if w <= max {
        return (Cow::Borrowed(s), w);
    }
    if max == 0 {
        return (Cow::Borrowed(""), 0);
    }
    let mut out = String::new();
    let mut used = 0;
    for g in s.graphemes(true) {
        let gw = g.width();
        if used + gw > max - 1 {
            break;
        }
        out.push_str(g);
        used += gw;
    }
    out.push_str(ELLIPSIS);
    (Cow::Owned(out), used + 1)
}

/// `s` cut to at most `max` columns from the left, starting with `…` if anything was cut: the
/// end of a path (the model's folder) is what tells it apart.
pub fn fit_end(s: &str, max: usize) -> Cow<'_, str> {
    if width(s) <= max {
        return Cow::Borrowed(s);
    }
    if max == 0 {
        return Cow::Borrowed("");
    }
    let mut kept: Vec<&str> = Vec::new();
    let mut used = 0;
    for g in s.graphemes(true).rev() {
        if used + g.width() + 1 > max {
            break;
        }
        kept.push(g);
        used += g.width();
    }
    let tail: String = kept.into_iter().rev().collect();
    Cow::Owned(format!("{ELLIPSIS}{tail}"))
}

/// Every grapheme of escaped text with its width, ASCII fast-pathed (the common case, and the
/// text view walks every token of the decode each frame).
pub fn graphemes(s: &str) -> Box<dyn Iterator<Item = (&str, usize)> + '_> {
    if s.is_ascii() {
        Box::new((0..s.len()).map(move |i| (&s[i..i + 1], 1)))
    } else {
        Box::new(s.graphemes(true).map(|g| (g, g.width())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_line_leaves_one_line_of_visible_text() {
        assert_eq!(escape_line("plain text, é 字"), "plain text, é 字");
        assert!(matches!(escape_line("plain"), Cow::Borrowed(_)));
        assert_eq!(escape_line("\x1b]0;pwned\x07 a\nb\tc\r\u{9b}\u{7f}"), "␛]0;pwned␇ a↵b⇥c␍⍰␡");
    }

    #[test]
    fn controls_become_visible() {
        assert_eq!(escape("a\nb", Mode::Cell), "a↵b");
        assert_eq!(escape("a\nb", Mode::Prose), "a\nb");
        assert_eq!(escape("\t", Mode::Prose), "⇥");
        assert_eq!(escape("\u{7}", Mode::Cell), "␇");
        assert_eq!(escape("\u{1b}[0m", Mode::Cell), "␛[0m");
        assert_eq!(escape("\u{7f}", Mode::Cell), "␡");
        assert_eq!(escape("\u{85}", Mode::Cell), "⍰");
        assert_eq!(escape("a\u{200b}b", Mode::Prose), "a¤b");
    }

    #[test]
    fn spaces_show_in_cells_only() {
        assert_eq!(escape(" the", Mode::Cell), "·the");
        assert_eq!(escape(" the", Mode::Prose), " the");
        assert!(matches!(escape("the", Mode::Cell), Cow::Borrowed(_)));
    }

    #[test]
    fn leading_combining_mark_gets_a_base() {
        assert_eq!(escape("\u{301}x", Mode::Prose), "◌\u{301}x");
        // Inside a token it combines with its base and stays as is.
        assert_eq!(escape("e\u{301}", Mode::Prose), "e\u{301}");
        assert_eq!(width("e\u{301}"), 1);
    }

    #[test]
    fn wide_characters_are_measured_and_never_split() {
        assert_eq!(width("日本"), 4);
        assert_eq!(width("🦀"), 2);
        assert_eq!(fit("日本語", 4), (Cow::Owned("日…".to_string()), 3));
        assert_eq!(fit("日本", 4), (Cow::Borrowed("日本"), 4));
        assert_eq!(fit("abcdef", 3).0, "ab…");
        assert_eq!(fit("abc", 0).1, 0);
    }

    #[test]
    fn graphemes_keep_clusters_together() {
        let g: Vec<_> = graphemes("e\u{301}日a").collect();
        assert_eq!(g, vec![("e\u{301}", 1), ("日", 2), ("a", 1)]);
        assert_eq!(graphemes("ab").count(), 2);
    }
}
