//! The checkpoint's tokenizer, with the mask token SDAR decodes from.

use anyhow::{anyhow, bail, Result};
use std::collections::HashMap;
use std::sync::OnceLock;

use tokenizers::{AddedToken, DecoderWrapper, Tokenizer};

/// Spellings of the mask token seen in SDAR releases (`<|MASK|>` in one file, `<MASK>` in another).
pub const MASK_SPELLINGS: [&str; 2] = ["<|MASK|>", "<MASK>"];

pub struct Tok {
    inner: Tokenizer,
    /// How errors name tokenizer.json.
    origin: String,
    mask_id: u32,
    /// Whether `<|MASK|>` was missing from tokenizer.json and had to be added.
    pub mask_added: bool,
}

impl Tok {
    /// Loads tokenizer.json bytes. `config_mask` is `mask_token_id` from config.json, if any;
    /// `config_mask_text` is `mask_token` from tokenizer_config.json, if any.
    pub fn from_bytes(
        bytes: &[u8],
        origin: &str,
        config_mask: Option<u32>,
        config_mask_text: Option<&str>,
    ) -> Result<Self> {
        let mut inner = Tokenizer::from_bytes(bytes)
            .map_err(|e| anyhow!("{origin}: invalid tokenizer: {e}"))?;
        let known =
            config_mask_text.into_iter().chain(MASK_SPELLINGS).find_map(|s| inner.token_to_id(s));
        let (mask_id, mask_added) = match (known, config_mask) {
            (Some(id), Some(want)) if id != want => {
                bail!("{origin}: mask token has id {id}, but config.json says mask_token_id {want}")
            }
            (Some(id), _) => (id, false),
            (None, want) => (add_mask(&mut inner, origin, want)?, true),
        };
        Ok(Tok { inner, origin: origin.to_string(), mask_id, mask_added })
    }

    pub fn mask_id(&self) -> u32 {
        self.mask_id
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        // The onig binding of tokenizers panics when the regex engine gives up on a
        // pre-tokenizer pattern (e.g. `(a+)+$` over a long run of `a`: onig's retry limit);
        // it returns no error for it, so catching the panic is the only way to report it.
        let enc = crate::panics::catch(|| self.inner.encode(text, false))
            .map_err(|p| {
                anyhow!("{}: cannot tokenize the prompt: the tokenizer failed ({p})", self.origin)
            })?
            .map_err(|e| anyhow!("{}: cannot tokenize the prompt: {e}", self.origin))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of a whole output, special tokens dropped.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, true).unwrap_or_default()
    }

    /// The visible piece of one token: what a cell shows. Special tokens keep their spelling;
    /// an id with no vocabulary entry (Qwen3 pads its embedding past the vocabulary) has no
    /// text, as tokenizers' decode skips it.
    pub fn piece(&self, id: u32) -> String {
        match self.inner.decode(&[id], false) {
            Ok(s) if !s.is_empty() => s,
            _ => self.inner.id_to_token(id).unwrap_or_default(),
        }
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }

    /// The bytes one token adds to a decode: what the decoder turns its vocabulary string into
    /// before the whole output is read as (lossy) UTF-8. A byte-level BPE string maps back
    /// through GPT-2's byte<->char table (an added token whose characters are not all in that
    /// table is its own UTF-8, as tokenizers' ByteLevel decoder does); a `<0xNN>` byte-fallback
    /// token is that one byte; any other decoder: the token decoded alone.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        // No vocabulary entry: no bytes, as the whole output's decode skips the id.
        let Some(token) = self.inner.id_to_token(id) else { return Vec::new() };
        if let Some(DecoderWrapper::ByteLevel(_)) = self.inner.get_decoder() {
            return token
                .chars()
                .map(byte_level_byte)
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| token.into_bytes());
        }
        if let Some(b) = byte_fallback(&token) {
            return vec![b];
        }
        self.inner.decode(&[id], false).unwrap_or(token).into_bytes()
    }
}

/// `<0xNN>`: a byte-fallback token (SentencePiece-style vocabularies).
fn byte_fallback(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// The byte a char of GPT-2's byte-level alphabet stands for. tokenizers keeps this table
/// private (`bytes_char`), so it is rebuilt here: the printable bytes `!..=~`, `¡..=¬`,
/// `®..=ÿ` are their own char; the other 68 bytes, in order, are chars 256, 257, ...
fn byte_level_byte(c: char) -> Option<u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut shifted = 256u32;
        (0..=255u8)
            .map(|b| {
                if printable(b) {
                    (char::from(b), b)
                } else {
                    shifted += 1;
                    (char::from_u32(shifted - 1).expect("below the surrogates"), b)
                }
            })
            .collect()
    });
    table.get(&c).copied()
}

/// SDAR adds `<|MASK|>` on top of Qwen3's vocabulary; a tokenizer.json without it gets it here,
/// but only where that lands on the id config.json expects.
fn add_mask(inner: &mut Tokenizer, origin: &str, want: Option<u32>) -> Result<u32> {
    let Some(want) = want else {
        bail!("{origin}: no mask token (`<|MASK|>` or `<MASK>`) and config.json has no `mask_token_id`");
    };
    let next = inner.get_vocab_size(true) as u32;
    if next != want {
        bail!(
            "{origin}: no mask token; adding `<|MASK|>` would give id {next}, \
             but config.json says mask_token_id {want}"
        );
    }
    inner
        .add_special_tokens(vec![AddedToken::from(MASK_SPELLINGS[0], true)])
        .map_err(|e| anyhow!("{origin}: cannot add the mask token: {e}"))?;
    Ok(want)
}
