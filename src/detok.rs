//! Incremental detokenization over bytes: the text each position adds, when its neighbours may
//! still be masked. Pure: no tokenizer, no I/O.
//!
//! A byte-level BPE token is a run of bytes, not of characters: `≈` (E2 89 88) may be split
//! over two tokens, and a token alone then decodes to `�`. The text of a whole sequence is
//! `String::from_utf8_lossy` of all its bytes (what tokenizers' ByteLevel decoder does). A
//! position's text is what its bytes add to the text of the positions before it: the
//! characters (or `U+FFFD` for an invalid sequence) completed by a byte of this position. So the
//! texts of a sequence, in position order, concatenate exactly to its lossy decode, and a
//! position's text depends only on the bytes up to it. A trailing incomplete sequence stays
//! pending until a later byte completes or breaks it, or the decode ends (then `U+FFFD`, as
//! the lossy decode gives).
//!
//! tokenizers' own `DecodeStream` does this for ids appended left to right; a diffusion
//! decode fills positions in any order, with masks between them, so it is done here.

/// What one position shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// The characters this position completes (empty when its bytes only start a character
    /// that a later position completes).
    Text(String),
    /// Some of its bytes cannot be resolved yet (waiting on a masked neighbour, or continuation
    /// bytes whose start is masked): all of the position's own bytes.
    Pending(Vec<u8>),
}

impl Piece {
    /// The text, or the bytes as hex (`<E2 89>`) while pending.
    pub fn display(&self) -> String {
        match self {
            Piece::Text(t) => t.clone(),
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
pub fn settled(carry: &[u8], cells: &[&[u8]], end: End) -> (Vec<String>, Vec<u8>) {
    let cells: Vec<Option<&[u8]>> = cells.iter().map(|&c| Some(c)).collect();
    let (texts, _, carry_out) = stream(carry, &cells, end);
    (texts, carry_out)
}

/// Each position's completed text, whether some of its bytes are unresolved, and the carry.
fn stream(carry: &[u8], cells: &[Option<&[u8]>], end: End) -> (Vec<String>, Vec<bool>, Vec<u8>) {
    let mut st = Stream { pending: carry.to_vec(), owners: vec![None; carry.len()], texts: vec![] };
    // Positions with a byte that cannot be resolved in this window.
    let mut unresolved = vec![false; cells.len()];
    let mut after_gap = false;
    for (i, cell) in cells.iter().enumerate() {
        st.texts.push(String::new());
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

/// The texts of a complete, fully decoded sequence (see the module doc).
pub fn texts(cells: &[&[u8]]) -> Vec<String> {
    settled(&[], cells, End::Final).0
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Left-to-right state: bytes of a character not complete yet, and the position of each.
struct Stream {
    pending: Vec<u8>,
    /// Position (index in the window) of each pending byte; `None` for the carry.
    owners: Vec<Option<usize>>,
    texts: Vec<String>,
}

impl Stream {
    /// Appends the bytes of position `i`, moving every character (or invalid sequence) they
    /// complete into `texts[i]`. std's `Utf8Chunks` decides what is valid, invalid or
    /// incomplete exactly as `from_utf8_lossy` does, so no UTF-8 rule is restated here.
    fn feed(&mut self, i: usize, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        self.owners.extend(std::iter::repeat_n(Some(i), bytes.len()));
        let mut used = 0;
        for chunk in self.pending.utf8_chunks() {
            self.texts[i].push_str(chunk.valid());
            used += chunk.valid().len();
            let bad = chunk.invalid();
            if bad.is_empty() {
                continue;
            }
            let at_end = used + bad.len() == self.pending.len();
            // An invalid run at the very end may be the start of a character still to come.
            if at_end && std::str::from_utf8(bad).is_err_and(|e| e.error_len().is_none()) {
                break;
            }
            self.texts[i].push(char::REPLACEMENT_CHARACTER);
            used += bad.len();
        }
        self.pending.drain(..used);
        self.owners.drain(..used);
    }

    /// The decode ended: an incomplete character left over becomes one `U+FFFD`, in the last
    /// position (where the decode ended on it, whichever earlier positions hold its bytes).
    fn finish(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Some(at) = self.texts.len().checked_sub(1) {
            self.texts[at].push(char::REPLACEMENT_CHARACTER);
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
        Some(Piece::Text(s.into()))
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
    fn the_end_of_a_decode_turns_leftovers_into_replacement_characters() {
        let (p, carry) = pieces(b"", &[Some(b"a\xE2"), Some(b"\x89")], End::Final);
        assert_eq!(p, vec![text("a"), text("\u{FFFD}")]);
        assert!(carry.is_empty());
        assert_eq!(String::from_utf8_lossy(b"a\xE2\x89"), "a\u{FFFD}");
        // A leftover goes to the last position, also when earlier ones hold its bytes.
        let (p, _) = pieces(b"\xE2", &[Some(b"")], End::Final);
        assert_eq!(p, vec![text("\u{FFFD}")]);
        let (p, _) = pieces(b"", &[Some(b"\xF0\x9F"), Some(b"")], End::Final);
        assert_eq!(p, vec![text(""), text("\u{FFFD}")]);
    }

    #[test]
    fn a_settled_window_keeps_what_a_position_completes_before_its_trailing_bytes() {
        // " ∑" split as " E2 | 88 91": the space is final in the first position.
        let (t, carry) = settled(b"", &[b"x", b" \xE2"], End::Open);
        assert_eq!((t, carry), (vec!["x".to_string(), " ".to_string()], b"\xE2".to_vec()));
        let (t, carry) = settled(b"\xE2", &[b"\x88\x91"], End::Open);
        assert_eq!((t, carry), (vec!["∑".to_string()], vec![]));
    }

    #[test]
    fn an_invalid_byte_is_replaced_where_it_is_known_invalid() {
        // E2 then 'z': the E2 cannot start a character followed by 'z'.
        assert_eq!(texts(&[b"\xE2", b"z"]), vec!["", "\u{FFFD}z"]);
        assert_eq!(texts(&[b"\xFF", b"\x80"]), vec!["\u{FFFD}", "\u{FFFD}"]);
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
            let b: Vec<_> = b.into_iter().map(resolved).collect();
            let whole: Vec<_> = whole.into_iter().map(resolved).collect();
            prop_assert_eq!(&b[..], &whole[at..]);
            // A text shown in the first window is the one the whole sequence gives it, as long
            // as more may follow (at the true end, a leftover `�` goes to the last position).
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
                    Some(Piece::Text(t)) => prop_assert_eq!(&t, &want[i], "position {}", i),
                    Some(Piece::Pending(b)) => prop_assert_eq!(&b[..], full[i]),
                }
            }
        }
    }
}
