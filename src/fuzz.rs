//! Mutators and the run-everything check behind the property tests (tests/fuzz_props.rs), the
//! long local run (`cargo run --release --example fuzz_traces -- N`) and the `cargo fuzz`
//! targets (fuzz/). Mutations are structure-aware: they keep a trace mostly valid JSON Lines so
//! that the reader's checks and what comes after them (store, export, views) are reached,
//! rather than stopping at the first parse error as random bytes would.

use rand::seq::IndexedRandom;
use rand::Rng;

use crate::trace::events::Event;

/// Numbers that break naive size arithmetic.
const EVIL_NUMBERS: [&str; 14] = [
    "0",
    "1",
    "-1",
    "4097",
    "65535",
    "100000000",
    "1000000000",
    "4294967295",
    "4294967296",
    "9223372036854775808",
    "18446744073709551615",
    "1e308",
    "-0.0",
    "3.5",
];

/// Strings that break naive text handling.
const EVIL_TEXT: [&str; 6] =
    ["\\u001b]0;x\\u0007", "=cmd", "\\n\\r\\t", "\\u0000", "\\u202e", "\\ud800"];

/// One random edit of a JSON Lines trace: a number, a string, a byte or a whole line.
pub fn mutate_trace(text: &str, rng: &mut impl Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return text.to_string();
    }
    let i = rng.random_range(0..lines.len());
    match rng.random_range(0..8) {
        0..=2 => lines[i] = replace_number(&lines[i], rng),
        3 => lines[i] = replace_string(&lines[i], rng),
        4 => {
            let dup = lines[i].clone();
            let j = rng.random_range(0..=lines.len());
            lines.insert(j, dup);
        }
        5 => {
            lines.remove(i);
        }
        6 => {
            let j = rng.random_range(0..lines.len());
            lines.swap(i, j);
        }
        _ => lines[i] = flip_byte(&lines[i], rng),
    }
    let mut out = lines.join("\n");
    if rng.random_bool(0.1) {
        // A truncated recording.
        let cut = rng.random_range(0..=out.len());
        out.truncate(floor_char_boundary(&out, cut));
    } else {
        out.push('\n');
    }
    out
}

/// Several edits in a row.
pub fn mutate_trace_n(text: &str, rng: &mut impl Rng) -> String {
    let n = rng.random_range(1..=4);
    (0..n).fold(text.to_string(), |t, _| mutate_trace(&t, rng))
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Replaces one run of digits with an evil number.
fn replace_number(line: &str, rng: &mut impl Rng) -> String {
    let starts: Vec<usize> = line
        .char_indices()
        .filter(|&(i, c)| {
            c.is_ascii_digit() && (i == 0 || !line.as_bytes()[i - 1].is_ascii_digit())
        })
        .map(|(i, _)| i)
        .collect();
    let Some(&s) = starts.choose(rng) else { return line.to_string() };
    let e = s + line[s..]
        .find(|c: char| !c.is_ascii_digit() && c != '.' && c != 'e' && c != '-')
        .unwrap_or(line.len() - s);
    let n = EVIL_NUMBERS.choose(rng).expect("not empty");
    format!("{}{}{}", &line[..s], n, &line[e..])
}

/// Replaces the content of one JSON string value with evil text.
fn replace_string(line: &str, rng: &mut impl Rng) -> String {
    let quotes: Vec<usize> = line.match_indices(":\"").map(|(i, _)| i + 2).collect();
    let Some(&s) = quotes.choose(rng) else { return line.to_string() };
    let Some(len) = line[s..].find('"') else { return line.to_string() };
    let t = EVIL_TEXT.choose(rng).expect("not empty");
    format!("{}{}{}", &line[..s], t, &line[s + len..])
}

fn flip_byte(line: &str, rng: &mut impl Rng) -> String {
    let mut b = line.as_bytes().to_vec();
    if b.is_empty() {
        return line.to_string();
    }
    let i = rng.random_range(0..b.len());
    b[i] = rng.random();
    String::from_utf8_lossy(&b).into_owned()
}

/// Everything a trace file goes through in `unmask export` and `unmask replay`: the reader,
/// the store, the tables and their CSV/JSON, and (when `render`) the TUI's screens at a few
/// cursor positions, drawn as `replay --cast` draws them. Returns the number of events read;
/// a panic here is the bug a fuzz run looks for.
pub fn exercise_trace(bytes: &[u8], render: bool) -> usize {
    let Ok(read) = crate::trace::file::read(bytes, "fuzz.jsonl") else { return 0 };
    let n = read.events.len();
    let store = crate::trace::store::Store::from_events(read.events.iter().cloned());
    let t = crate::trace::export::tables(&read.events);
    check_tables(&t, &read.events);
    let _ = crate::trace::export::tokens_csv(&t);
    let _ = crate::trace::export::steps_csv(&t);
    let _ = crate::trace::export::step_map_csv(&t);
    let _ = crate::trace::export::edits_csv(&t);
    let _ = serde_json::to_string(&t);
    let _ = store.run().map(|r| (r.head(), r.max_blocks(), r.step_span()));
    if render {
        let pacing = crate::tui::record::Pacing {
            fps: 30.0,
            step_delay: 0.05,
            width: 80,
            height: 24,
            theme: &crate::tui::theme::DARK,
        };
        let _ = crate::tui::record::record(
            read.events,
            Some("fuzz".into()),
            read.stopped,
            &pacing,
            "fuzz",
            std::io::sink(),
            "sink",
        );
    }
    n
}

/// What a read trace guarantees its tables: each generated position at most once, all of them
/// inside the decode.
fn check_tables(t: &crate::trace::export::Tables, events: &[Event]) {
    let Some(h) =
        events.iter().rev().find_map(|e| if let Event::Header(h) = e { Some(h) } else { None })
    else {
        return;
    };
    let mut seen = std::collections::HashSet::new();
    for r in &t.tokens {
        assert!(
            r.pos >= h.prompt_ids.len() && r.pos < h.max_len,
            "token row outside the decode: {r:?}"
        );
        assert!(seen.insert(r.pos), "position {} exported twice", r.pos);
    }
    for e in &t.edits {
        assert!(
            e.pos >= h.prompt_ids.len() && e.from != e.to,
            "an edit of a prompt position, or to the token held: {e:?}"
        );
    }
}
