//! Incremental detokenization over bytes: the text each position adds, when its neighbours may
//! still be masked. Pure: no tokenizer, no I/O. Every view of a position's text goes through
//! here: the TUI (grid, Text panel, inspector), `unmask steps`, the trace's block `texts` (and
//! so `unmask export`) and the SVG figure.
//!
//! A byte-level BPE token is a run of bytes, not of characters: `≈` (E2 89 88) may be split
//! over two tokens, and a token alone then decodes to `�`. **The rule** (docs/events.md, "Token
//! text"): reading the bytes of the positions in order, as `String::from_utf8_lossy` does,
//! - a character belongs to the position holding its last byte; a position that only starts a
//!   character adds nothing (`""`);
//! - bytes that can never be part of a character where they stand (an invalid sequence, as
//!   std's `Utf8Chunks` and so the lossy decode find them, or a character the output ends
//!   inside) stay with the positions holding them, as [`Seg::Invalid`]: shown as hex (`<F2>`),
//!   never as `U+FFFD`; a JSON text ([`Text::lossy`]) spells each such sequence as one `U+FFFD`
//!   at the position of its first byte, so the texts of a sequence still concatenate exactly to
//!   its lossy decode;
//! - at a step of a decode, a position whose bytes wait on a masked neighbour (or on a later
//!   block) is [`Piece::Pending`]: its own bytes, not resolved yet.
//!
//! A position's text depends only on the bytes up to the byte that settles it. tokenizers' own
//! `DecodeStream` does this for ids appended left to right; a diffusion decode fills positions
//! in any order, with masks between them, so it is done here.

/// A run of a position's text: characters, or bytes that are not (part of) any character.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    Str(String),
    /// Invalid UTF-8; `first`: this run holds the first byte of its invalid sequence (the one
    /// `U+FFFD` of a lossy decode goes there).
    Invalid {
        bytes: Vec<u8>,
        first: bool,
    },
}

/// What a resolved position adds to the text: its runs in byte order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Text(Vec<Seg>);

impl Text {
    /// Valid text only.
    pub fn plain(s: &str) -> Self {
        let mut t = Text::default();
        t.push_str(s);
        t
    }

    fn push_str(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        match self.0.last_mut() {
            Some(Seg::Str(t)) => t.push_str(s),
            _ => self.0.push(Seg::Str(s.to_string())),
        }
    }

    fn push_invalid(&mut self, bytes: &[u8], first: bool) {
        self.0.push(Seg::Invalid { bytes: bytes.to_vec(), first });
    }

    pub fn segs(&self) -> &[Seg] {
        &self.0
    }

    /// Adds nothing: it only starts a character that a later position completes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether some of its bytes are invalid UTF-8.
    pub fn has_invalid(&self) -> bool {
        self.0.iter().any(|s| matches!(s, Seg::Invalid { .. }))
    }

    /// The text when it is all characters (`None` with invalid bytes).
    pub fn valid(&self) -> Option<&str> {
        match &self.0[..] {
            [] => Some(""),
            [Seg::Str(s)] => Some(s),
            _ => None,
        }
    }

    /// As a person reads it: `f` of each run of characters, invalid bytes as hex (`<F2>`;
    /// adjacent invalid runs as one group).
    pub fn render(&self, f: impl Fn(&str) -> String) -> String {
        self.render_hex(f, hex)
    }

    /// [`Text::render`] with the invalid bytes spelled by `h`.
    pub fn render_hex(&self, f: impl Fn(&str) -> String, h: impl Fn(&[u8]) -> String) -> String {
        let mut out = String::new();
        let mut bad: Vec<u8> = vec![];
        for s in &self.0 {
            match s {
                Seg::Str(t) => {
                    if !bad.is_empty() {
                        out += &h(&std::mem::take(&mut bad));
                    }
                    out += &f(t);
                }
                Seg::Invalid { bytes, .. } => bad.extend_from_slice(bytes),
            }
        }
        if !bad.is_empty() {
            out += &h(&bad);
        }
        out
    }

    /// [`Text::render`] with the characters as they are.
    pub fn display(&self) -> String {
        self.render(str::to_string)
    }

    /// As a lossy decode spells it (for JSON): one `U+FFFD` per invalid sequence, at its first
    /// byte's position.
    pub fn lossy(&self) -> String {
        let mut out = String::new();
        for s in &self.0 {
            match s {
                Seg::Str(t) => out += t,
                Seg::Invalid { first: true, .. } => out.push(char::REPLACEMENT_CHARACTER),
                Seg::Invalid { first: false, .. } => {}
            }
        }
        out
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.0.capacity() * std::mem::size_of::<Seg>()
            + self
                .0
                .iter()
                .map(|s| match s {
                    Seg::Str(t) => t.capacity(),
                    Seg::Invalid { bytes, .. } => bytes.capacity(),
                })
                .sum::<usize>()
    }
}

/// What one position shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// What this position adds (empty when its bytes only start a character that a later
    /// position completes).
    Text(Text),
    /// Some of its bytes cannot be resolved yet (waiting on a masked neighbour, or continuation
    /// bytes whose start is masked): all of the position's own bytes.
    Pending(Vec<u8>),
}

impl Piece {
    /// The text (invalid bytes as hex), or the bytes as hex (`<E2 89>`) while pending.
    pub fn display(&self) -> String {
        match self {
            Piece::Text(t) => t.display(),
            Piece::Pending(b) => hex(b),
        }
    }
}

/// `<E2 89>`: bytes as upper-case hex, space separated, in angle brackets.
pub fn hex(bytes: &[u8]) -> String {
    let inner: Vec<String> = bytes.iter().map(|b| format!("{b:02X}")).collect();
    format!("<{}>", inner.join(" "))
}

/// Whether the window ends where the decode does (leftover bytes become `U+FFFD`) or more may
/// follow (leftover bytes stay pending).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Open,
    Final,
}

/// The pieces of a window of positions: `carry` holds bytes left incomplete by the (fully
/// decoded) positions before the window; `cells` the bytes of each position, `None` while
/// masked (its piece is `None` too). Returns the pieces and the bytes still incomplete after
/// the last position when it and everything before it is decoded (the next window's carry).
pub fn pieces(carry: &[u8], cells: &[Option<&[u8]>], end: End) -> (Vec<Option<Piece>>, Vec<u8>) {
    let (texts, unresolved, carry_out) = stream(carry, cells, end);
    let out = cells
        .iter()
        .zip(texts)
        .zip(unresolved)
        .map(|((cell, text), unresolved)| {
            let bytes = (*cell)?;
            Some(if unresolved { Piece::Pending(bytes.to_vec()) } else { Piece::Text(text) })
        })
        .collect();
    (out, carry_out)
}

/// The final texts of a window whose positions are all decoded, and the carry after it. With
/// `End::Open`, a trailing incomplete character is left to the later position that completes
/// (or breaks) it; the positions holding its first bytes keep only what they complete.
pub fn settled(carry: &[u8], cells: &[&[u8]], end: End) -> (Vec<Text>, Vec<u8>) {
    let cells: Vec<Option<&[u8]>> = cells.iter().map(|&c| Some(c)).collect();
    let (texts, _, carry_out) = stream(carry, &cells, end);
    (texts, carry_out)
}

/// Each position's completed text, whether some of its bytes are unresolved, and the carry.
fn stream(carry: &[u8], cells: &[Option<&[u8]>], end: End) -> (Vec<Text>, Vec<bool>, Vec<u8>) {
    let mut st = Stream { pending: carry.to_vec(), owners: vec![None; carry.len()], texts: vec![] };
    // Positions with a byte that cannot be resolved in this window.
    let mut unresolved = vec![false; cells.len()];
    let mut after_gap = false;
    for (i, cell) in cells.iter().enumerate() {
        st.texts.push(Text::default());
        let Some(bytes) = cell else {
            // Bytes waiting on this masked position cannot be resolved.
            st.owners.iter().flatten().for_each(|&o| unresolved[o] = true);
            st.pending.clear();
            st.owners.clear();
            after_gap = true;
            continue;
        };
        let mut bytes = &bytes[..];
        if after_gap {
            // Leading continuation bytes belong to a character that starts in the gap; the
            // stream is in step again at the first byte that is not one.
            let lead = bytes.iter().take_while(|&&b| is_continuation(b)).count();
            if lead > 0 {
                unresolved[i] = true;
                bytes = &bytes[lead..];
            }
            after_gap = bytes.is_empty();
        }
        st.feed(i, bytes);
    }
    let carry_out = match (end, after_gap || cells.last().is_some_and(Option::is_none)) {
        (End::Final, _) => {
            st.finish();
            vec![]
        }
        (End::Open, true) => vec![],
        (End::Open, false) => {
            st.owners.iter().flatten().for_each(|&o| unresolved[o] = true);
            st.pending.clone()
        }
    };
    (st.texts, unresolved, carry_out)
}

/// The texts of a complete, fully decoded sequence (see the module doc), as JSON spells them
/// ([`Text::lossy`]): they concatenate to `String::from_utf8_lossy` of all the bytes.
pub fn texts(cells: &[&[u8]]) -> Vec<String> {
    settled(&[], cells, End::Final).0.iter().map(Text::lossy).collect()
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Left-to-right state: bytes of a character not complete yet, and the position of each.
struct Stream {
    pending: Vec<u8>,
    /// Position (index in the window) of each pending byte; `None` for the carry.
    owners: Vec<Option<usize>>,
    texts: Vec<Text>,
}

impl Stream {
    /// Appends the bytes of position `i`, moving every character they complete into
    /// `texts[i]`, and every invalid sequence they show invalid to the positions holding its
    /// bytes. std's `Utf8Chunks` decides what is valid, invalid or incomplete exactly as
    /// `from_utf8_lossy` does, so no UTF-8 rule is restated here.
    fn feed(&mut self, i: usize, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        self.owners.extend(std::iter::repeat_n(Some(i), bytes.len()));
        let mut used = 0;
        let pending = std::mem::take(&mut self.pending);
        for chunk in pending.utf8_chunks() {
            self.texts[i].push_str(chunk.valid());
            used += chunk.valid().len();
            let bad = chunk.invalid();
            if bad.is_empty() {
                continue;
            }
            let at_end = used + bad.len() == pending.len();
            // An invalid run at the very end may be the start of a character still to come.
            if at_end && std::str::from_utf8(bad).is_err_and(|e| e.error_len().is_none()) {
                break;
            }
            self.invalid(used, bad, i);
            used += bad.len();
        }
        self.pending = pending;
        self.pending.drain(..used);
        self.owners.drain(..used);
    }

    /// The invalid sequence `bad`, pending from index `from`, to the positions holding its
    /// bytes; bytes of the carry (whose positions are settled already) to the first position
    /// of the window holding some of its bytes, else to `at`.
    fn invalid(&mut self, from: usize, bad: &[u8], at: usize) {
        let owners = &self.owners[from..from + bad.len()];
        let at = owners.iter().flatten().next().copied().unwrap_or(at);
        let mut start = 0;
        while start < bad.len() {
            let owner = owners[start];
            let len = owners[start..].iter().take_while(|&&o| o == owner).count();
            self.texts[owner.unwrap_or(at)].push_invalid(&bad[start..start + len], start == 0);
            start += len;
        }
    }

    /// The decode ended: an incomplete character left over is an invalid sequence (one
    /// `U+FFFD` in a lossy decode), shown by the positions holding its bytes (the carry's in
    /// the last position).
    fn finish(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Some(at) = self.texts.len().checked_sub(1) {
            let bad = std::mem::take(&mut self.pending);
            self.invalid(0, &bad, at);
        }
        self.pending.clear();
        self.owners.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(s: &str) -> Option<Piece> {
        Some(Piece::Text(Text::plain(s)))
    }

    /// Display form of each position (`None` masked).
    fn shown(p: &[Option<Piece>]) -> Vec<Option<String>> {
        p.iter().map(|p| p.as_ref().map(Piece::display)).collect()
    }

    fn final_display(cells: &[&[u8]]) -> Vec<String> {
        settled(&[], cells, End::Final).0.iter().map(Text::display).collect()
    }

    fn pending(b: &[u8]) -> Option<Piece> {
        Some(Piece::Pending(b.to_vec()))
    }

    #[test]
    fn a_split_character_belongs_to_the_position_that_completes_it() {
        // "a≈b": E2 89 | 88 62
        let (p, carry) = pieces(b"", &[Some(b"a\xE2\x89"), Some(b"\x88b")], End::Open);
        assert_eq!(p, vec![text("a"), text("≈b")]);
        assert!(carry.is_empty());
        assert_eq!(texts(&[b"\xF0\x9F", b"\xA4", b"\x96!"]), vec!["", "", "🤖!"]);
    }

    #[test]
    fn bytes_waiting_on_a_masked_neighbour_are_pending() {
        // ≈ split over three positions, the middle one masked.
        let (p, _) = pieces(b"", &[Some(b"x\xE2"), None, Some(b"\x88y")], End::Open);
        assert_eq!(p, vec![pending(b"x\xE2"), None, pending(b"\x88y")]);
        assert_eq!(p[0].as_ref().unwrap().display(), "<78 E2>");
        // Filled: the character completes in the last position.
        let (p, _) = pieces(b"", &[Some(b"x\xE2"), Some(b"\x89"), Some(b"\x88y")], End::Open);
        assert_eq!(p, vec![text("x"), text(""), text("≈y")]);
        // A complete position after a gap needs nothing from it.
        let (p, _) = pieces(b"", &[None, Some(b"ok")], End::Open);
        assert_eq!(p, vec![None, text("ok")]);
    }

    #[test]
    fn an_open_window_carries_its_incomplete_tail_to_the_next() {
        let (p, carry) = pieces(b"", &[Some(b"a"), Some(b"\xE4\xBD")], End::Open);
        assert_eq!(p, vec![text("a"), pending(b"\xE4\xBD")]);
        assert_eq!(carry, b"\xE4\xBD");
        let (p, carry) = pieces(&carry, &[Some(b"\xA0!")], End::Open);
        assert_eq!(p, vec![text("你!")]);
        assert!(carry.is_empty());
    }

    #[test]
    fn the_end_of_a_decode_leaves_an_incomplete_character_invalid_where_its_bytes_are() {
        let (p, carry) = pieces(b"", &[Some(b"a\xE2"), Some(b"\x89")], End::Final);
        assert_eq!(shown(&p), [Some("a<E2>".into()), Some("<89>".into())]);
        assert!(carry.is_empty());
        // As JSON: one U+FFFD for the sequence, where it starts; the lossy decode's.
        assert_eq!(texts(&[b"a\xE2", b"\x89"]), ["a\u{FFFD}", ""]);
        assert_eq!(String::from_utf8_lossy(b"a\xE2\x89"), "a\u{FFFD}");
        // The carry's bytes belong to positions already settled: the last position shows them.
        let (p, _) = pieces(b"\xE2", &[Some(b"")], End::Final);
        assert_eq!(shown(&p), [Some("<E2>".into())]);
        let (p, _) = pieces(b"", &[Some(b"\xF0\x9F"), Some(b"")], End::Final);
        assert_eq!(shown(&p), [Some("<F0 9F>".into()), Some("".into())]);
    }

    #[test]
    fn a_settled_window_keeps_what_a_position_completes_before_its_trailing_bytes() {
        // " ∑" split as " E2 | 88 91": the space is final in the first position.
        let (t, carry) = settled(b"", &[b"x", b" \xE2"], End::Open);
        assert_eq!((t, carry), (vec![Text::plain("x"), Text::plain(" ")], b"\xE2".to_vec()));
        let (t, carry) = settled(b"\xE2", &[b"\x88\x91"], End::Open);
        assert_eq!((t, carry), (vec![Text::plain("∑")], vec![]));
    }

    #[test]
    fn invalid_bytes_stay_with_the_position_holding_them_as_hex() {
        // F2 then 'e': F2 can never start a character here; it is F2's position's, as hex, and
        // 'e' completes nothing of it.
        assert_eq!(final_display(&[b"\xF2", b"ep"]), ["<F2>", "ep"]);
        assert_eq!(texts(&[b"\xF2", b"ep"]), ["\u{FFFD}", "ep"]);
        // A byte that is never UTF-8.
        assert_eq!(final_display(&[b"\xFC", b"a\xFFb"]), ["<FC>", "a<FF>b"]);
        assert_eq!(final_display(&[b"\xFF", b"\x80"]), ["<FF>", "<80>"]);
        // DB DB DB "hat": each DB is broken by the byte after it.
        assert_eq!(
            final_display(&[b"\xDB", b"\xDB", b"\xDB", b"hat"]),
            ["<DB>", "<DB>", "<DB>", "hat"]
        );
        // An invalid sequence over two positions: each shows its own bytes; one U+FFFD in JSON.
        let (t, _) = settled(b"", &[b"\xE2", b"\x89", b"z"], End::Final);
        assert_eq!(t.iter().map(Text::display).collect::<Vec<_>>(), ["<E2>", "<89>", "z"]);
        assert_eq!(t.iter().map(Text::lossy).collect::<Vec<_>>(), ["\u{FFFD}", "", "z"]);
        assert!(t[0].has_invalid() && !t[2].has_invalid());
        // Pending while the byte that decides is masked, invalid once it is known.
        let (p, _) = pieces(b"", &[Some(b"\xF2"), None], End::Open);
        assert_eq!(p, [pending(b"\xF2"), None]);
        let (p, _) = pieces(b"", &[Some(b"\xF2"), Some(b"ep")], End::Open);
        assert_eq!(shown(&p), [Some("<F2>".into()), Some("ep".into())]);
    }

    #[test]
    fn a_character_split_over_tokens_and_filled_out_of_order() {
        // E0 B5 8C (ൌ) over three positions, committed last, middle, first... at each step.
        let c: [&[u8]; 3] = [b"\xE0", b"\xB5", b"\x8C"];
        let (p, _) = pieces(b"", &[None, None, Some(c[2])], End::Open);
        assert_eq!(p, [None, None, pending(b"\x8C")]);
        let (p, _) = pieces(b"", &[Some(c[0]), None, Some(c[2])], End::Open);
        assert_eq!(p, [pending(b"\xE0"), None, pending(b"\x8C")]);
        let (p, _) = pieces(b"", &[Some(c[0]), Some(c[1]), Some(c[2])], End::Open);
        assert_eq!(p, [text(""), text(""), text("ൌ")]);
        assert_eq!(texts(&c), ["", "", "ൌ"]);
    }

    #[test]
    fn literal_token_texts_are_text_not_bytes() {
        // A token whose text is "<B5>" is four characters, not the byte B5.
        let (p, _) = pieces(b"", &[Some(b"<B5>")], End::Open);
        assert_eq!(p, [text("<B5>")]);
        let Some(Piece::Text(t)) = &p[0] else { panic!() };
        assert_eq!((t.valid(), t.has_invalid()), (Some("<B5>"), false));
        // A vocabulary token spelling U+FFFD (EF BF BD) is a valid character, not invalid bytes.
        let (p, _) = pieces(b"", &[Some("\u{FFFD}".as_bytes()), Some(b"\xFC")], End::Final);
        let Some(Piece::Text(lit)) = &p[0] else { panic!() };
        assert_eq!(
            (lit.valid(), lit.display(), lit.has_invalid()),
            (Some("\u{FFFD}"), "\u{FFFD}".into(), false)
        );
        let Some(Piece::Text(bad)) = &p[1] else { panic!() };
        assert_eq!(
            (bad.valid(), bad.display(), bad.lossy(), bad.has_invalid()),
            (None, "<FC>".into(), "\u{FFFD}".into(), true)
        );
        // Both spell U+FFFD as JSON text; has_invalid (and the raw bytes) tells them apart.
        assert_eq!(lit.lossy(), bad.lossy());
    }

    fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut out = vec![];
        let mut last = 0;
        for c in cuts.into_iter().chain([bytes.len()]) {
            out.push(bytes[last..c].to_vec());
            last = c;
        }
        out
    }

    /// Bytes biased towards UTF-8 structure: ASCII, lead and continuation bytes, and junk.
    fn byte() -> impl Strategy<Value = u8> {
        prop_oneof![0x20u8..0x7F, 0x80u8..0xC0, 0xC2u8..0xF5, any::<u8>()]
    }

    proptest! {
        #[test]
        fn texts_concatenate_to_the_lossy_decode(
            bytes in proptest::collection::vec(byte(), 0..40),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let cells = split(&bytes, &cuts);
            let refs: Vec<&[u8]> = cells.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(texts(&refs).concat(), String::from_utf8_lossy(&bytes));
        }

        /// Every byte shows exactly once, in order: in a character of the position holding its
        /// last byte, or as invalid in the position holding it.
        #[test]
        fn every_byte_shows_once_in_order(
            bytes in proptest::collection::vec(byte(), 0..40),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let cells = split(&bytes, &cuts);
            let refs: Vec<&[u8]> = cells.iter().map(Vec::as_slice).collect();
            let (t, _) = settled(&[], &refs, End::Final);
            let mut all = vec![];
            for (i, t) in t.iter().enumerate() {
                for seg in t.segs() {
                    match seg {
                        Seg::Str(s) => all.extend_from_slice(s.as_bytes()),
                        Seg::Invalid { bytes, .. } => {
                            // Invalid bytes are this position's own.
                            prop_assert!(refs[i].windows(bytes.len()).any(|w| w == &bytes[..]), "{:?} in {:?}", bytes, refs[i]);
                            all.extend_from_slice(bytes);
                        }
                    }
                }
                // (unless the text holds a real U+FFFD: its bytes EF BF BD are valid UTF-8)
                let literal = bytes.windows(3).any(|w| w == [0xEF, 0xBF, 0xBD]);
                prop_assert!(literal || !t.display().contains(char::REPLACEMENT_CHARACTER));
            }
            prop_assert_eq!(all, bytes);
        }

        #[test]
        fn valid_text_never_shows_a_replacement_character(
            s in "[a-z≈∑你好🤖é ]{0,16}",
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let cells = split(s.as_bytes(), &cuts);
            let refs: Vec<&[u8]> = cells.iter().map(Vec::as_slice).collect();
            let t = texts(&refs);
            prop_assert!(t.iter().all(|t| !t.contains(char::REPLACEMENT_CHARACTER)), "{:?}", t);
            prop_assert_eq!(t.concat(), s);
        }

        /// Windows chained through their carry give the same texts as one window.
        #[test]
        fn windows_chain_through_the_carry(
            bytes in proptest::collection::vec(byte(), 0..40),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
            at in any::<usize>(),
        ) {
            let cells = split(&bytes, &cuts);
            let refs: Vec<Option<&[u8]>> = cells.iter().map(|c| Some(c.as_slice())).collect();
            let at = at % (refs.len() + 1);
            let (a, carry) = pieces(b"", &refs[..at], End::Open);
            let (b, _) = pieces(&carry, &refs[at..], End::Final);
            let (whole, _) = pieces(b"", &refs, End::Final);
            let resolved = |p: Option<Piece>| match p { Some(Piece::Text(t)) => Some(t), _ => None };
            // The first window's pending tail resolves in the second: compare only the rest.
            let mut b: Vec<_> = b.into_iter().map(resolved).collect();
            // A carry that turns out invalid shows in the second window's first position with
            // bytes (its own positions were settled before); the whole sequence shows it where
            // those bytes are.
            // (or the last, where the decode ends on it).
            let first = refs[at..].iter().position(|c| c.is_some_and(|c| !c.is_empty())).or(b.len().checked_sub(1));
            if let Some(Some(t)) = first.map(|k| &mut b[k]) {
                if let Some(Seg::Invalid { bytes, .. }) = t.0.first() {
                    if !carry.is_empty() && *bytes == carry {
                        t.0.remove(0);
                    }
                }
            }
            let whole: Vec<_> = whole.into_iter().map(resolved).collect();
            prop_assert_eq!(&b[..], &whole[at..]);
            // A text shown in the first window is the one the whole sequence gives it, as long
            // as more may follow (at the true end, a leftover is invalid where its bytes are).
            let (open, _) = pieces(b"", &refs, End::Open);
            for (i, p) in a.into_iter().enumerate() {
                if let Some(Piece::Text(t)) = p {
                    prop_assert_eq!(Some(Piece::Text(t)), open[i].clone());
                }
            }
        }

        /// Masking positions never changes a resolved text of the full sequence... except that
        /// a position may become pending, and a shown text is always the final one.
        #[test]
        fn a_shown_text_is_the_final_text(
            s in "[a≈∑你🤖]{0,10}",
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
            masked in proptest::collection::vec(any::<bool>(), 12),
        ) {
            let cells = split(s.as_bytes(), &cuts);
            let full: Vec<&[u8]> = cells.iter().map(Vec::as_slice).collect();
            let want = texts(&full);
            let part: Vec<Option<&[u8]>> =
                full.iter().enumerate().map(|(i, &c)| (!masked[i % 12]).then_some(c)).collect();
            let (got, _) = pieces(b"", &part, End::Open);
            for (i, p) in got.into_iter().enumerate() {
                match p {
                    None => prop_assert!(masked[i % 12]),
                    Some(Piece::Text(t)) => prop_assert_eq!(&t.lossy(), &want[i], "position {}", i),
                    Some(Piece::Pending(b)) => prop_assert_eq!(&b[..], full[i]),
                }
            }
        }
    }
}
