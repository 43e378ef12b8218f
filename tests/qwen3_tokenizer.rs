//! Tokenizer fixture tests: the real Qwen3 `tokenizer.json` (the one SDAR /
//! Qwen3 checkpoints ship), loaded through the `tokenizers` crate and checked
//! against llama.cpp's reference ids for its "qwen2" vocabulary. Those ids come from
//! the Qwen1.5 tokenizer, whose 151,643 base tokens and 151,387 merges are
//! identical to Qwen3's. The tests also check SDAR's extra `<|MASK|>` token.
//!
//! Fixture folder: tests/fixtures/qwen3-tokenizer/ (see its README.md for
//! sources, versions and sha256 of each file).

use std::io::Read;
use std::path::PathBuf;
use std::sync::OnceLock;

use tokenizers::{AddedToken, Tokenizer};

/// Number of test strings in ggml-vocab-qwen2.gguf.inp / .out.
const EXPECTED_CASES: usize = 46;
/// Byte-level BPE vocabulary (ids 0..=151642).
const BASE_VOCAB: usize = 151_643;
/// Added tokens shipped in tokenizer.json (ids 151643..=151668).
const ADDED_TOKENS: usize = 26;
/// SDAR's mask token, appended after the 26 shipped added tokens.
const MASK: &str = "<|MASK|>";
const MASK_ID: u32 = 151_669;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3-tokenizer")
}

/// The parsed tokenizer, loaded once per test binary (parsing the 11 MB JSON
/// takes about a second in a debug build); tests clone it when they mutate it.
fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = fixture_dir().join("tokenizer.json.gz");
        let gz = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut json)
            .unwrap_or_else(|e| panic!("gunzip {}: {e}", path.display()));
        Tokenizer::from_bytes(&json).unwrap_or_else(|e| panic!("load {}: {e}", path.display()))
    })
}

/// Parse llama.cpp's tokenizer test files exactly as `read_tests` in
/// llama.cpp's tests/test-tokenizer-0.cpp does:
/// * `.inp` (read as raw bytes, no newline translation) is split on
///   `"\n__ggml_vocab_test__\n"`; the file ends with that separator, which
///   therefore does not start an extra (empty) case;
/// * `.out` has one line per case (`std::getline` semantics: a final newline
///   does not make an extra line); each line is stripped and split on single
///   spaces into integer ids. An empty line means "no tokens" (the empty
///   string case).
fn load_cases() -> Vec<(String, Vec<u32>)> {
    let dir = fixture_dir();
    let inp = std::fs::read(dir.join("ggml-vocab-qwen2.gguf.inp")).expect("read .inp");
    let inp = String::from_utf8(inp).expect(".inp is UTF-8");
    let out = std::fs::read_to_string(dir.join("ggml-vocab-qwen2.gguf.out")).expect("read .out");

    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut strings = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEP) {
            Some(n) => {
                strings.push(rest[..n].to_string());
                rest = &rest[n + SEP.len()..];
            }
            None => {
                strings.push(rest.to_string());
                break;
            }
        }
    }

    let mut lines: Vec<&str> = out.split('\n').collect();
    if out.ends_with('\n') {
        lines.pop();
    }
    let ids: Vec<Vec<u32>> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            l.trim()
                .split(' ')
                .filter(|t| !t.is_empty())
                .map(|t| {
                    t.parse::<u32>().unwrap_or_else(|e| panic!(".out line {}: {t:?}: {e}", i + 1))
                })
                .collect()
        })
        .collect();

    assert_eq!(
        strings.len(),
        ids.len(),
        ".inp has {} cases but .out has {} lines",
        strings.len(),
        ids.len()
    );
    assert_eq!(strings.len(), EXPECTED_CASES, "unexpected number of test cases");
    strings.into_iter().zip(ids).collect()
}

#[test]
fn qwen3_tokenizer_loads_with_expected_vocab() {
    let tok = tokenizer();
    assert_eq!(tok.get_vocab_size(false), BASE_VOCAB);
    assert_eq!(tok.get_vocab_size(true), BASE_VOCAB + ADDED_TOKENS);

    let added = tok.get_added_tokens_decoder();
    assert_eq!(added.len(), ADDED_TOKENS);
    let mut ids: Vec<u32> = added.keys().copied().collect();
    ids.sort_unstable();
    let want: Vec<u32> = (BASE_VOCAB as u32..(BASE_VOCAB + ADDED_TOKENS) as u32).collect();
    assert_eq!(ids, want, "added token ids must be contiguous after the base vocab");

    for (content, id) in [
        ("<|endoftext|>", 151_643),
        ("<|im_start|>", 151_644),
        ("<|im_end|>", 151_645),
        ("<think>", 151_667),
        ("</think>", 151_668),
    ] {
        assert_eq!(tok.token_to_id(content), Some(id), "id of {content}");
        assert_eq!(tok.id_to_token(id).as_deref(), Some(content), "token of {id}");
    }
}

#[test]
fn qwen3_tokenizer_matches_llama_cpp_reference_ids() {
    let tok = tokenizer();
    let cases = load_cases();
    let mut failures = Vec::new();
    for (i, (text, want)) in cases.iter().enumerate() {
        let got = tok
            .encode(text.as_str(), false)
            .unwrap_or_else(|e| panic!("encode case {i} {text:?}: {e}"))
            .get_ids()
            .to_vec();
        if &got != want {
            failures.push(format!("case {i} {text:?}\n   got  {got:?}\n   want {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn qwen3_tokenizer_decode_round_trips() {
    let tok = tokenizer();
    let mut failures = Vec::new();
    for (i, (text, want)) in load_cases().iter().enumerate() {
        let back = tok.decode(want, false).unwrap_or_else(|e| panic!("decode case {i}: {e}"));
        if &back != text {
            failures.push(format!("case {i}: decode(ids) = {back:?}, want {text:?}"));
        }
        // Streaming decode (token by token) must give the same text.
        let mut stream = tok.decode_stream(false);
        let mut streamed = String::new();
        for &id in want {
            if let Some(piece) = stream.step(id).unwrap_or_else(|e| panic!("stream case {i}: {e}"))
            {
                streamed.push_str(&piece);
            }
        }
        if &streamed != text {
            failures.push(format!("case {i}: streamed decode = {streamed:?}, want {text:?}"));
        }
    }
    assert!(failures.is_empty(), "round-trip failures:\n{}", failures.join("\n"));
}

#[test]
fn sdar_mask_token_is_added_after_shipped_tokens() {
    let mut tok = tokenizer().clone();
    assert_eq!(tok.token_to_id(MASK), None, "{MASK} must not be in the shipped Qwen3 vocab");
    assert_eq!(
        tok.encode(format!("a{MASK}b").as_str(), false).unwrap().get_ids(),
        &[64, 27, 91, 49863, 91, 29, 65],
        "without the added token, {MASK} is split into ordinary BPE pieces"
    );

    let n = tok.add_special_tokens([AddedToken::from(MASK, true)]).unwrap();
    assert_eq!(n, 1, "exactly one new token added");
    assert_eq!(tok.token_to_id(MASK), Some(MASK_ID));
    assert_eq!(tok.id_to_token(MASK_ID).as_deref(), Some(MASK));
    assert_eq!(tok.get_vocab_size(true), BASE_VOCAB + ADDED_TOKENS + 1);

    let ids = tok.encode(format!("a{MASK}b{MASK}{MASK}").as_str(), false).unwrap();
    assert_eq!(ids.get_ids(), &[64, MASK_ID, 65, MASK_ID, MASK_ID]);
    assert_eq!(tok.decode(ids.get_ids(), false).unwrap(), format!("a{MASK}b{MASK}{MASK}"));
    assert_eq!(tok.decode(ids.get_ids(), true).unwrap(), "ab", "special tokens skipped");

    // Adding it again is a no-op and keeps the id.
    assert_eq!(tok.add_special_tokens([AddedToken::from(MASK, true)]).unwrap(), 0);
    assert_eq!(tok.token_to_id(MASK), Some(MASK_ID));
}

/// unmask's own loader on the real Qwen3 tokenizer, which lacks SDAR's `<|MASK|>`: it adds the
/// token only where config.json expects it, and refuses otherwise with a one-line reason.
#[test]
fn unmask_loader_adds_the_missing_mask_token_only_at_the_configured_id() {
    let mut gz = flate2::read::GzDecoder::new(
        std::fs::File::open(fixture_dir().join("tokenizer.json.gz")).unwrap(),
    );
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut gz, &mut bytes).unwrap();
    let tok =
        unmask::model::tokenizer::Tok::from_bytes(&bytes, "tokenizer.json", Some(151669), None)
            .unwrap();
    assert_eq!(tok.mask_id(), 151669);
    assert!(tok.mask_added);
    assert_eq!(tok.encode("a<|MASK|>b").unwrap(), vec![64, 151669, 65]);
    assert_eq!(tok.piece(151669), "<|MASK|>");

    let err =
        unmask::model::tokenizer::Tok::from_bytes(&bytes, "tokenizer.json", Some(151700), None)
            .err()
            .unwrap();
    assert_eq!(
        format!("{err:#}"),
        "tokenizer.json: no mask token; adding `<|MASK|>` would give id 151669, but config.json says mask_token_id 151700"
    );
    let err = unmask::model::tokenizer::Tok::from_bytes(&bytes, "tokenizer.json", None, None)
        .err()
        .unwrap();
    assert!(format!("{err:#}").contains("config.json has no `mask_token_id`"));
}

/// unmask's tokenizer over the real Qwen3 vocabulary (with SDAR's `<|MASK|>`), loaded once.
fn unmask_tok() -> &'static unmask::model::tokenizer::Tok {
    static TOK: OnceLock<unmask::model::tokenizer::Tok> = OnceLock::new();
    TOK.get_or_init(|| {
        let gz = std::fs::read(fixture_dir().join("tokenizer.json.gz")).unwrap();
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut json).unwrap();
        unmask::model::tokenizer::Tok::from_bytes(&json, "tokenizer.json", Some(MASK_ID), None)
            .unwrap()
    })
}

/// Per-position texts of `ids` through unmask's incremental detokenizer.
fn position_texts(ids: &[u32]) -> Vec<String> {
    let bytes: Vec<Vec<u8>> = ids.iter().map(|&id| unmask_tok().token_bytes(id)).collect();
    let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    unmask::trace::detok::texts(&refs)
}

/// Characters Qwen3 splits across tokens get no `�`: each lands whole in the token completing it.
#[test]
fn split_characters_land_whole_in_the_token_that_completes_them() {
    let text = "x ≈ ∑ 你好 🤖 café";
    let ids = unmask_tok().encode(text).unwrap();
    let own: Vec<String> = ids.iter().map(|&id| unmask_tok().piece(id)).collect();
    assert!(
        own.iter().any(|p| p.contains('\u{FFFD}')),
        "the fixture must split a character: {own:?}"
    );
    let texts = position_texts(&ids);
    assert_eq!(texts.concat(), text);
    assert!(texts.iter().all(|t| !t.contains('\u{FFFD}')), "{texts:?}");
    // 🤖 is F0 9F A4 96: its token(s) before the last show nothing, the last shows it all.
    let robot = texts.iter().position(|t| t.contains('🤖')).unwrap();
    assert!(texts[robot].ends_with('🤖'));
}

/// An id past the vocabulary (Qwen3's embedding has 151,936 rows, its vocabulary 151,669
/// entries; random weights draw them) adds no text, as the tokenizer's own decode skips it: it
/// showed as the text "<151793>", which no decode of the output contains.
#[test]
fn an_id_without_a_vocabulary_entry_adds_no_text() {
    let ids = [9707, 151793, 1879];
    assert_eq!(unmask_tok().piece(151793), "");
    assert!(unmask_tok().token_bytes(151793).is_empty());
    let want = tokenizer_with_mask().decode(&ids, false).unwrap();
    assert_eq!(position_texts(&ids).concat(), want);
    assert_eq!(unmask_tok().decode(&ids), want);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    /// For any id sequence (special tokens included), the per-token texts concatenate to the
    /// tokenizer's own decode of the whole sequence.
    #[test]
    fn per_token_texts_concatenate_to_the_whole_decode(
        ids in proptest::collection::vec(0u32..=MASK_ID, 0..24),
    ) {
        let want = tokenizer_with_mask().decode(&ids, false).unwrap();
        proptest::prop_assert_eq!(position_texts(&ids).concat(), want);
    }

    /// Ids drawn from text with split characters: never a `�`.
    #[test]
    fn valid_text_gives_no_replacement_character(s in "[a ≈∑∫∞≤÷你好世界🤖😀é]{0,12}") {
        let ids = unmask_tok().encode(&s).unwrap();
        let texts = position_texts(&ids);
        proptest::prop_assert!(texts.iter().all(|t| !t.contains(char::REPLACEMENT_CHARACTER)), "{:?}", texts);
        proptest::prop_assert_eq!(texts.concat(), s);
    }
}

/// The raw tokenizer with `<|MASK|>` added at 151669, as SDAR ships it.
fn tokenizer_with_mask() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let mut t = tokenizer().clone();
        t.add_special_tokens(vec![AddedToken::from(MASK, true)]).unwrap();
        t
    })
}
