//! Tables derived from a trace: which token was decoded at which step, and which tokens later
//! steps replaced (token editing). Pure: events in, rows out.
//!
//! Every step a row names counts from 1, as `unmask steps` and the TUI do: `step` over the whole
//! decode (the Nth step event), `block_step` within its block (the step map's value). The
//! trace's events count from 0; these tables are for people and spreadsheets joining them.
//!
//! A trace with edits adds columns (`final_step`, `final_block_step`, `edits` to the tokens,
//! `edited` to the steps) and the edits table; one without has none of them.

use std::collections::HashMap;

use serde::Serialize;

use crate::trace::events::Event;

/// One generated token: where it sits, when it was decoded and, with token editing, when its
/// final token was set. The token, its text, confidence and entropy are the final token's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenRow {
    pub pos: usize,
    /// Index among the generated tokens (0 = first token after the prompt).
    pub index: usize,
    pub block: usize,
    /// The denoising step of the decode that committed the position (unmasked it), from 1.
    pub step: usize,
    /// That step's place within the block, from 1.
    pub block_step: usize,
    pub forward: usize,
    /// The step of the decode that set the final token (from 1): `step`, unless an edit
    /// replaced the committed token. Present when the trace has edits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_step: Option<usize>,
    /// That step's place within the block (from 1): the step map's value. Present when the
    /// trace has edits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_block_step: Option<usize>,
    /// How many times a step replaced the position's token. Present when the trace has edits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edits: Option<usize>,
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
    /// From 1, over the whole decode.
    pub step: usize,
    pub block: usize,
    /// From 1, within the block.
    pub block_step: usize,
    pub forward: usize,
    pub committed: usize,
    /// Positions whose token the step replaced. Present when the trace has edits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited: Option<usize>,
    pub still_masked: usize,
    pub t_ms: f64,
}

/// One edit: a step replaced the token a decoded position held.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EditRow {
    /// From 1, over the whole decode.
    pub step: usize,
    pub block: usize,
    /// From 1, within the block.
    pub block_step: usize,
    pub forward: usize,
    pub pos: usize,
    /// Index among the generated tokens, as in the tokens table (a position past the output
    /// has one too: edits are listed whether or not their position is output).
    pub index: usize,
    /// The token it held and the one it holds now, each decoded alone (`U+FFFD` where its bytes
    /// are no whole characters; the token ids say exactly).
    pub from: u32,
    pub to: u32,
    pub from_text: String,
    pub to_text: String,
    /// The new token's confidence and entropy.
    pub conf: f32,
    pub entropy: f32,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tables {
    pub tokens: Vec<TokenRow>,
    pub steps: Vec<StepRow>,
    /// For every output token, the 1-based step within its block that set its final token (its
    /// commit, or the edit that last replaced it): the shape of the `step_map` that lmdeploy
    /// (PR #4057) and SGLang (`return_step_maps`) return.
    pub step_map: Vec<usize>,
    /// Every edit of the run, in step order (each step's ascending by position); absent in JSON
    /// for a trace without edits.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<EditRow>,
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
    let has_edits = run.iter().any(|e| matches!(e, Event::Step(s) if !s.edited.is_empty()));
    let counted = |n: usize| has_edits.then_some(n);
    let mut tokens: Vec<TokenRow> = Vec::new();
    let mut steps = Vec::new();
    let mut edits = Vec::new();
    // Token row of each output position, and the text of every token seen (an edit names the
    // token it replaces by id only).
    let mut row_of: HashMap<usize, usize> = HashMap::new();
    let mut texts: HashMap<u32, String> = HashMap::new();
    for ev in run {
        let Event::Step(s) = ev else { continue };
        // the tables count steps from 1; the events from 0
        let (step, block_step) = (steps.len() + 1, s.step + 1);
        steps.push(StepRow {
            step,
            block: s.block,
            block_step,
            forward: s.forward,
            committed: s.committed.len(),
            edited: counted(s.edited.len()),
            still_masked: s.masked.len(),
            t_ms: s.t_ms,
        });
        for c in &s.edited {
            edits.push(EditRow {
                step,
                block: s.block,
                block_step,
                forward: s.forward,
                pos: c.pos,
                index: c.pos.saturating_sub(prompt_len),
                from: c.from,
                to: c.token,
                from_text: texts.get(&c.from).cloned().unwrap_or_default(),
                to_text: c.text.clone(),
                conf: c.conf,
                entropy: c.entropy,
            });
            texts.entry(c.token).or_insert_with(|| c.text.clone());
            if let Some(&i) = row_of.get(&c.pos) {
                let r = &mut tokens[i];
                (r.token, r.text, r.bytes) = (c.token, c.text.clone(), c.bytes.clone());
                (r.conf, r.entropy) = (c.conf, c.entropy);
                (r.final_step, r.final_block_step) = (Some(step), Some(block_step));
                r.edits = r.edits.map(|n| n + 1);
            }
        }
        for c in &s.committed {
            texts.entry(c.token).or_insert_with(|| c.text.clone());
        }
        for c in s.committed.iter().filter(|c| c.pos >= prompt_len && c.pos < limit) {
            row_of.insert(c.pos, tokens.len());
            tokens.push(TokenRow {
                pos: c.pos,
                index: c.pos - prompt_len,
                block: s.block,
                step,
                block_step,
                forward: s.forward,
                final_step: counted(step),
                final_block_step: counted(block_step),
                edits: counted(0),
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
    let step_map = tokens.iter().map(|t| t.final_block_step.unwrap_or(t.block_step)).collect();
    Tables { tokens, steps, step_map, edits }
}

/// Token text shown as the TUI shows it (control characters as visible stand-ins), for an
/// export written to a terminal: a crafted token must not drive the terminal (set its title,
/// move the cursor). Files get the exact text.
pub fn escape_for_terminal(t: &mut Tables) {
    for r in &mut t.tokens {
        r.text = crate::glyph::escape_line(&r.text).into_owned();
    }
    for r in &mut t.edits {
        r.from_text = crate::glyph::escape_line(&r.from_text).into_owned();
        r.to_text = crate::glyph::escape_line(&r.to_text).into_owned();
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

/// `,a,b` for the columns a trace with edits adds (`None`: it has none, nor the columns).
fn extra<const N: usize>(cols: [Option<usize>; N]) -> String {
    cols.iter().flatten().map(|c| format!(",{c}")).collect()
}

pub fn tokens_csv(t: &Tables) -> String {
    let edits = !t.edits.is_empty();
    let mut out = String::from("pos,index,block,step,block_step,forward,");
    if edits {
        out += "final_step,final_block_step,edits,";
    }
    out += "token,text,conf,entropy\n";
    for r in &t.tokens {
        out += &format!(
            "{},{},{},{},{},{}{},{},{},{},{}\n",
            r.pos,
            r.index,
            r.block,
            r.step,
            r.block_step,
            r.forward,
            extra([r.final_step, r.final_block_step, r.edits]),
            r.token,
            csv_field(&r.text),
            r.conf,
            r.entropy
        );
    }
    out
}

pub fn steps_csv(t: &Tables) -> String {
    let edits = !t.edits.is_empty();
    let mut out = String::from("step,block,block_step,forward,committed,");
    if edits {
        out += "edited,";
    }
    out += "still_masked,t_ms\n";
    for r in &t.steps {
        out += &format!(
            "{},{},{},{},{}{},{},{:.3}\n",
            r.step,
            r.block,
            r.block_step,
            r.forward,
            r.committed,
            extra([r.edited]),
            r.still_masked,
            r.t_ms
        );
    }
    out
}

/// Every edit: which step replaced which position's token with which (a header alone for a
/// trace without edits).
pub fn edits_csv(t: &Tables) -> String {
    let mut out = String::from(
        "step,block,block_step,forward,pos,index,from,to,from_text,to_text,conf,entropy\n",
    );
    for r in &t.edits {
        out += &format!(
            "{},{},{},{},{},{},{},{},{},{},{},{}\n",
            r.step,
            r.block,
            r.block_step,
            r.forward,
            r.pos,
            r.index,
            r.from,
            r.to,
            csv_field(&r.from_text),
            csv_field(&r.to_text),
            r.conf,
            r.entropy
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

    use crate::trace::synth::{self, Synth};

    /// With edits: the token rows hold the final tokens (the output), the step that committed
    /// and the one that set the final token, and the edit count; the step map is the final
    /// step's; the edits table has every edit; the CSV gains the columns.
    #[test]
    fn edits_give_final_tokens_their_steps_and_a_table() {
        let events = synth::trace(&Synth::small_edits());
        let t = tables(&events);
        let Some(Event::Finish(f)) = events.last() else { panic!() };
        assert_eq!(t.tokens.iter().map(|r| r.token).collect::<Vec<_>>(), f.output_ids);
        let plain = tables(&synth::trace(&Synth::small()));
        assert_eq!(
            t.tokens.iter().map(|r| (r.pos, r.block_step, r.text.as_str())).collect::<Vec<_>>(),
            plain.tokens.iter().map(|r| (r.pos, r.block_step, r.text.as_str())).collect::<Vec<_>>(),
            "committed at the same steps of their blocks, to the same final texts"
        );
        let p7 = t.tokens.iter().find(|r| r.pos == 7).unwrap();
        assert_eq!(
            (p7.step, p7.block_step, p7.final_step, p7.final_block_step, p7.edits, p7.token),
            (1, 1, Some(2), Some(2), Some(1), 10)
        );
        let p11 = t.tokens.iter().find(|r| r.pos == 11).unwrap();
        assert_eq!((p11.block_step, p11.final_block_step, p11.edits), (1, Some(5), Some(2)));
        let unedited = t.tokens.iter().find(|r| r.pos == 6).unwrap();
        assert_eq!((unedited.final_step, unedited.edits), (Some(unedited.step), Some(0)));
        assert_eq!(t.step_map[11 - 6], 5, "1-based, the final token's step");
        assert_eq!(t.step_map[7 - 6], 2);
        assert!(plain.step_map.iter().zip(&t.step_map).any(|(a, b)| a != b));
        assert_eq!(t.edits.len(), 9);
        let e = &t.edits[0];
        assert_eq!(
            (e.step, e.block, e.block_step, e.pos, e.index, e.from, e.to),
            (2, 1, 2, 7, 1, 15, 10)
        );
        assert_eq!((e.from_text.as_str(), e.to_text.as_str()), (" purr", " It"));
        assert_eq!(t.steps.iter().filter_map(|s| s.edited).sum::<usize>(), 9);
        let csv = tokens_csv(&t);
        assert!(csv.starts_with("pos,index,block,step,block_step,forward,final_step,final_block_step,edits,token,text,conf,entropy\n6,0,1,2,2,2,2,2,0,9,.,"), "{csv}");
        assert!(csv.contains("\n7,1,1,1,1,1,2,2,1,10, It,"), "{csv}");
        assert!(steps_csv(&t).starts_with(
            "step,block,block_step,forward,committed,edited,still_masked,t_ms\n1,1,1,1,1,0,1,"
        ));
        let edits = edits_csv(&t);
        assert!(edits.starts_with("step,block,block_step,forward,pos,index,from,to,from_text,to_text,conf,entropy\n2,1,2,2,7,1,15,10, purr, It,0.9038231,"), "{edits}");
        assert_eq!(edits.lines().count(), 10);
        let json = serde_json::to_string(&t).unwrap();
        assert!(
            json.contains(r#""final_step":2,"final_block_step":2,"edits":1,"token":10"#)
                && json.contains(r#""edits":[{"step":2,"block":1,"block_step":2"#),
            "{json}"
        );
        // Without edits: none of it.
        let json = serde_json::to_string(&plain).unwrap();
        assert!(!json.contains("final_step") && !json.contains("edit"), "{json}");
        assert_eq!(edits_csv(&plain).lines().count(), 1);
    }

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
