//! Tables derived from a trace: which token was decoded at which step. Pure: events in, rows out.

use serde::Serialize;

use crate::trace::events::Event;

/// One generated token: where it sits and when it was decoded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenRow {
    pub pos: usize,
    /// Index among the generated tokens (0 = first token after the prompt).
    pub index: usize,
    pub block: usize,
    /// 0-based denoising step within the block.
    pub step: usize,
    /// 0-based denoising step over the whole decode.
    pub global_step: usize,
    pub forward: usize,
    pub token: u32,
    /// What the token adds to the text of the positions before it (the block event's `texts`),
    /// else, in older traces, the token decoded alone.
    pub text: String,
    /// The token's raw bytes where they are not whole characters (it splits one, or is invalid
    /// UTF-8: its `U+FFFD` in `text` is then not a literal one), as the trace's `bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    pub conf: f32,
    pub entropy: f32,
}

/// One denoising step: how much it committed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepRow {
    pub global_step: usize,
    pub block: usize,
    pub step: usize,
    pub forward: usize,
    pub committed: usize,
    pub still_masked: usize,
    pub t_ms: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tables {
    pub tokens: Vec<TokenRow>,
    pub steps: Vec<StepRow>,
    /// For every output token, the 1-based step within its block at which it was decoded: the
    /// shape of the `step_map` that lmdeploy (PR #4057) and SGLang (`return_step_maps`) return.
    pub step_map: Vec<usize>,
}

/// Builds the tables from the last run in `events` (a trace may hold restarts).
pub fn tables(events: &[Event]) -> Tables {
    let start = events.iter().rposition(|e| matches!(e, Event::Header(_))).unwrap_or(0);
    let run = &events[start..];
    let (prompt_len, max_len) = match run.first() {
        Some(Event::Header(h)) => (h.prompt_ids.len(), h.max_len),
        _ => (0, usize::MAX),
    };
    // Output length: the finish event's, else every decoded position inside the limit.
    let out_len = run.iter().find_map(|e| match e {
        Event::Finish(f) => Some(f.output_ids.len()),
        _ => None,
    });
    let limit = out_len.map_or(max_len, |n| prompt_len + n);
    let mut tokens = Vec::new();
    let mut steps = Vec::new();
    for ev in run {
        let Event::Step(s) = ev else { continue };
        let global_step = steps.len();
        steps.push(StepRow {
            global_step,
            block: s.block,
            step: s.step,
            forward: s.forward,
            committed: s.committed.len(),
            still_masked: s.masked.len(),
            t_ms: s.t_ms,
        });
        for c in s.committed.iter().filter(|c| c.pos >= prompt_len && c.pos < limit) {
            tokens.push(TokenRow {
                pos: c.pos,
                index: c.pos - prompt_len,
                block: s.block,
                step: s.step,
                global_step,
                forward: s.forward,
                token: c.token,
                text: c.text.clone(),
                bytes: c.bytes.clone(),
                conf: c.conf,
                entropy: c.entropy,
            });
        }
    }
    // A block event's texts are the final text of each position (a token holding part of a
    // character reads as its share of the decode, not `�`); older traces only have the token's.
    for ev in run {
        let Event::Block(b) = ev else { continue };
        let Some(texts) = &b.texts else { continue };
        for row in tokens.iter_mut().filter(|r| (b.start..b.start + texts.len()).contains(&r.pos)) {
            row.text = texts[row.pos - b.start].clone();
        }
    }
    tokens.sort_by_key(|t| t.pos);
    let step_map = tokens.iter().map(|t| t.step + 1).collect();
    Tables { tokens, steps, step_map }
}

/// Token text shown as the TUI shows it (control characters as visible stand-ins), for an
/// export written to a terminal: a crafted token must not drive the terminal (set its title,
/// move the cursor). Files get the exact text.
pub fn escape_for_terminal(t: &mut Tables) {
    for r in &mut t.tokens {
        r.text = crate::glyph::escape_line(&r.text).into_owned();
    }
}

/// RFC 4180 field: quoted when it holds a comma, quote or line break. A field a spreadsheet
/// would run as a formula (starting with `=`, `+`, `-`, `@`, tab or carriage return) gets a
/// leading `'`, OWASP's rule against CSV injection: token text is untrusted.
fn csv_field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

pub fn tokens_csv(t: &Tables) -> String {
    let mut out =
        String::from("pos,index,block,step,global_step,forward,token,text,conf,entropy\n");
    for r in &t.tokens {
        out += &format!(
            "{},{},{},{},{},{},{},{},{},{}\n",
            r.pos,
            r.index,
            r.block,
            r.step,
            r.global_step,
            r.forward,
            r.token,
            csv_field(&r.text),
            r.conf,
            r.entropy
        );
    }
    out
}

pub fn steps_csv(t: &Tables) -> String {
    let mut out = String::from("global_step,block,step,forward,committed,still_masked,t_ms\n");
    for r in &t.steps {
        out += &format!(
            "{},{},{},{},{},{},{:.3}\n",
            r.global_step, r.block, r.step, r.forward, r.committed, r.still_masked, r.t_ms
        );
    }
    out
}

pub fn step_map_csv(t: &Tables) -> String {
    let mut out = String::from("index,step_map\n");
    for (i, s) in t.step_map.iter().enumerate() {
        out += &format!("{i},{s}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_only_what_needs_it() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("line\nbreak"), "\"line\nbreak\"");
    }

    #[test]
    fn csv_neutralises_formula_prefixes() {
        assert_eq!(csv_field("=1+2"), "'=1+2");
        assert_eq!(csv_field("+cmd"), "'+cmd");
        assert_eq!(csv_field("-"), "'-");
        assert_eq!(csv_field("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(csv_field("\tx"), "'\tx");
        assert_eq!(csv_field("\rx"), "\"'\rx\"");
        assert_eq!(csv_field("=HYPERLINK(\"a\",b)"), "\"'=HYPERLINK(\"\"a\"\",b)\"");
        assert_eq!(csv_field("a=b"), "a=b");
    }
}
