//! `unmask steps` end to end: exact lines for a committed trace, from a file, from stdin and
//! live; and `| head` ending quietly.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn unmask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_unmask")).args(args).output().expect("running unmask")
}

/// `unmask steps -` with its stdin, stdout and stderr on pipes.
fn steps_on_a_pipe() -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_unmask"))
        .args(["steps", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn stdout(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}, stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.stderr.is_empty(), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// tiny-dynamic.jsonl as a person reads it (checked by hand against the trace's events): its
/// last block runs 3 positions past `--max-new-tokens` 12, marked dropped.
const TINY_DYNAMIC: &str = r#"step 1 · block 1 · step 1/≤4 · fwd 2  [5 "ion", 6 "Y", 7 "ion"]
block 1 done · 1 step (at most 4)
step 2 · block 2 · step 1/≤4 · fwd 4  [8 "Y", 9 "�", 10 "Y", 11 "Y"]
block 2 done · 1 step (at most 4)
step 3 · block 3 · step 1/≤4 · fwd 6  [12 "Y", 13 "Y", 14 "Y"]
step 4 · block 3 · step 2/≤4 · fwd 7  [15 "ind"]
block 3 done · 2 steps (at most 4)
step 5 · block 4 · step 1/≤4 · fwd 9  [16 "�", 17 ✗"�", 18 ✗"Y", 19 ✗"�"]
block 4 done · 1 step (at most 4)
finished: length · 12 tokens out · 3 decoded and dropped: pos 17-19
"#;

#[test]
fn a_trace_file_lists_every_step() {
    let trace = fixture("traces/tiny-dynamic.jsonl");
    assert_eq!(stdout(unmask(&["steps", trace.to_str().unwrap()])), TINY_DYNAMIC);
}

#[test]
fn json_lines_carry_the_same_numbers() {
    let trace = fixture("traces/tiny-dynamic.jsonl");
    let out = stdout(unmask(&["steps", "--json", trace.to_str().unwrap()]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 10, "5 steps, 4 block ends, the finish");
    // as the step happens its block's count is unknown (null), its budget known; the block's
    // end gives the count
    assert_eq!(
        lines[5],
        r#"{"step":4,"block":3,"block_step":2,"block_steps":null,"block_budget":4,"forward":7,"pos":[15],"texts":["ind"],"conf":[0.4448627]}"#
    );
    assert_eq!(lines[6], r#"{"block_done":{"block":3,"steps":2,"budget":4,"forward":8}}"#);
    let last: serde_json::Value = serde_json::from_str(lines[7]).unwrap();
    assert_eq!(last["pos"], serde_json::json!([16, 17, 18, 19]));
    assert_eq!(last["dropped"], serde_json::json!([17, 18, 19]), "past --max-new-tokens");
    assert_eq!(
        lines[9],
        r#"{"finish":{"reason":"length","output_tokens":12,"dropped":[17,18,19]}}"#
    );
}

#[test]
fn a_dash_reads_the_trace_from_stdin() {
    let text = std::fs::read(fixture("traces/tiny-dynamic.jsonl")).unwrap();
    let mut child = steps_on_a_pipe();
    child.stdin.take().unwrap().write_all(&text).unwrap();
    assert_eq!(stdout(child.wait_with_output().unwrap()), TINY_DYNAMIC);
}

#[test]
fn live_steps_are_the_steps_of_the_same_decode_traced() {
    // The settings tiny-dynamic.jsonl was recorded with (tests/fixtures/README.md).
    let model = fixture("tiny-random");
    let decode =
        ["--model", model.to_str().unwrap(), "--prompt", "The cat sat", "--max-new-tokens", "12"];
    let flags = ["--strategy", "low_confidence_dynamic", "--threshold", "0.5"];
    let live = stdout(unmask(&[&["steps"][..], &decode, &flags].concat()));
    // The same decode traced, then listed: the same lines.
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.jsonl");
    let out = ["--out", trace.to_str().unwrap()];
    stdout(unmask(&[&["trace"][..], &decode, &flags, &out].concat()));
    assert_eq!(live, stdout(unmask(&["steps", trace.to_str().unwrap()])));
    // And the fixture's steps, block by block and token by token (the fixture predates the
    // forward count's current accounting, so `fwd` is left out).
    let no_fwd = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("step "))
            .map(|l| {
                l.split(" · fwd ").next().unwrap().to_string() + l.split_once("  [").unwrap().1
            })
            .collect()
    };
    // The fixture also predates `bytes`: it spells a token that is no character on its own
    // (0xF7, 0xFF in this tokenizer) as its lossy text `"�"`, where the list now shows the bytes
    // as bare hex (`<F7>`, unquoted so that it never reads as a token's text "<F7>").
    let lossy = |s: String| {
        let mut out = String::new();
        let mut rest = s.as_str();
        while let Some(i) = rest.find('<') {
            let bare = !rest[..i].ends_with('"');
            out.push_str(&rest[..i]);
            let tail = &rest[i + 1..];
            match tail.find('>') {
                Some(j) if bare && tail[..j].chars().all(|c| c.is_ascii_hexdigit() || c == ' ') => {
                    out.push_str("\"\u{fffd}\"");
                    rest = &tail[j + 1..];
                }
                _ => {
                    out.push('<');
                    rest = tail;
                }
            }
        }
        out + rest
    };
    let live: Vec<String> = no_fwd(&live).into_iter().map(lossy).collect();
    assert_eq!(live, no_fwd(TINY_DYNAMIC));
}

/// `steps -` prints each step as soon as its event line arrives (it waited for the end of
/// its input, so `unmask trace | unmask steps -` showed nothing until the decode ended), and
/// the lines are those of the whole file.
#[test]
fn steps_from_a_stream_print_each_step_as_its_line_arrives() {
    let text = std::fs::read_to_string(fixture("traces/tiny-dynamic.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let first_step = lines.iter().position(|l| l.contains("\"event\":\"step\"")).unwrap();
    let mut child = steps_on_a_pipe();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            tx.send(line.unwrap()).unwrap();
        }
    });
    // The header and the first step only; the rest is held back.
    stdin.write_all((lines[..=first_step].join("\n") + "\n").as_bytes()).unwrap();
    stdin.flush().unwrap();
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the first step's line before the input ends");
    assert_eq!(got, TINY_DYNAMIC.lines().next().unwrap());
    stdin.write_all((lines[first_step + 1..].join("\n") + "\n").as_bytes()).unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success());
    reader.join().unwrap();
    let rest: Vec<String> = rx.try_iter().collect();
    assert_eq!(
        std::iter::once(got).chain(rest).map(|l| l + "\n").collect::<String>(),
        TINY_DYNAMIC
    );
}

/// A trace of two runs (two traces end to end): each run listed from step 1, the second after
/// a `# run 2` line (`{"run":2}` with --json), from a file and from stdin alike. (It printed
/// both runs back to back, the numbering restarting without a word.)
#[test]
fn a_trace_of_two_runs_lists_each_after_a_run_line() {
    let text = std::fs::read_to_string(fixture("traces/tiny-dynamic.jsonl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let two = dir.path().join("two.jsonl");
    std::fs::write(&two, format!("{text}{text}")).unwrap();
    let t = two.to_str().unwrap();
    assert_eq!(stdout(unmask(&["steps", t])), format!("{TINY_DYNAMIC}# run 2\n{TINY_DYNAMIC}"));
    let json = stdout(unmask(&["steps", "--json", t]));
    let json: Vec<&str> = json.lines().collect();
    assert_eq!(json.len(), 21, "each run's 5 steps, 4 block ends and its finish line");
    assert_eq!(json[10], r#"{"run":2}"#);
    assert_eq!(json[..10], json[11..]);
    let piped = Command::new(env!("CARGO_BIN_EXE_unmask"))
        .args(["steps", "-"])
        .stdin(std::fs::File::open(&two).unwrap())
        .output()
        .unwrap();
    assert_eq!(stdout(piped), format!("{TINY_DYNAMIC}# run 2\n{TINY_DYNAMIC}"));
}

#[test]
fn a_trace_and_decode_flags_together_are_refused() {
    let trace = fixture("traces/tiny-dynamic.jsonl");
    let o = unmask(&["steps", trace.to_str().unwrap(), "--steps", "2"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("steps TRACE reads a recorded trace: --steps applies only when decoding"),
        "{err}"
    );
}

/// Runs `unmask ARGS | head -1`: reads the first line (none with `read: false`, the reader
/// gone before unmask writes anything), closes the pipe, and returns the line, unmask's exit
/// status and its stderr.
fn into_head(args: &[&str], read: bool) -> (String, std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_unmask"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = Vec::new();
    let mut byte = [0u8; 1];
    while read && out.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        first.push(byte[0]);
    }
    drop(out);
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (String::from_utf8(first).unwrap(), child.wait().unwrap(), err)
}

#[test]
fn piped_into_head_trace_and_steps_end_quietly_with_exit_0() {
    let model = fixture("tiny-random");
    let m = model.to_str().unwrap();
    let trace = ["trace", "--model", m, "--max-new-tokens", "64"];
    let steps = ["steps", "--model", m, "--max-new-tokens", "64"];
    let (line, status, err) = into_head(&trace, true);
    assert!(line.starts_with(r#"{"event":"header""#), "{line}");
    assert!(status.success() && err.is_empty(), "exit {status:?}, stderr {err:?}");
    let (line, status, err) = into_head(&steps, true);
    assert!(line.starts_with("step 1 · block 1 · step 1/"), "{line}");
    assert!(status.success() && err.is_empty(), "exit {status:?}, stderr {err:?}");
    // The reader gone before the first line: every write meets a closed pipe.
    let trace_file = fixture("traces/tiny-dynamic.jsonl");
    let from_file = ["steps", trace_file.to_str().unwrap()];
    for args in [&trace[..], &steps[..], &from_file[..]] {
        let (_, status, err) = into_head(args, false);
        assert!(status.success() && err.is_empty(), "{args:?}: exit {status:?}, stderr {err:?}");
    }
    // The commands that print their result once, at the end (they panicked in print!).
    let compare = ["compare", "--headless", "--model", m, "--max-new-tokens", "8"];
    let bench = ["bench", "--model", m, "--max-new-tokens", "8", "--warmup", "0", "--repeat", "1"];
    for args in [&compare[..], &bench[..]] {
        let (_, status, err) = into_head(args, false);
        assert!(
            status.success() && !err.contains("panicked"),
            "{args:?}: exit {status:?}, stderr {err:?}"
        );
    }
}

#[test]
fn a_trace_that_is_not_a_regular_file_is_refused_before_reading() {
    let out = unmask(&["steps", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "unmask: error: /dev/zero: not a regular file (a character device)\n"
    );
}

/// The synthetic trace with token edits: each edit on its step's line after the commits,
/// `~"old"→"new"`; the post-edit steps (after a block's last mask) commit nothing, `[]`, and
/// the last of each block edits nothing either; the last block's two positions past the
/// length are marked dropped.
const EDITS: &str = r#"step 1 · block 1 · step 1/≤6 · fwd 1  [7 " purr"]
step 2 · block 1 · step 2/≤6 · fwd 2  [6 "."] ~7 " purr"→" It"
step 3 · block 1 · step 3/≤6 · fwd 3  []
block 1 done · 3 steps (at most 6)
step 4 · block 2 · step 1/≤6 · fwd 4  [11 " dream"]
step 5 · block 2 · step 2/≤6 · fwd 5  [10 "\t"]
step 6 · block 2 · step 3/≤6 · fwd 6  [9 " warm"]
step 7 · block 2 · step 4/≤6 · fwd 7  [8 " was"] ~11 " dream"→" fish"
step 8 · block 2 · step 5/≤6 · fwd 8  [] ~10 "\t"→"," ~11 " fish"→" and"
step 9 · block 2 · step 6/≤6 · fwd 9  []
block 2 done · 6 steps
step 10 · block 3 · step 1/≤6 · fwd 10  [14 " purr"]
step 11 · block 3 · step 2/≤6 · fwd 11  [12 " the"]
step 12 · block 3 · step 3/≤6 · fwd 12  [15 "ed"]
step 13 · block 3 · step 4/≤6 · fwd 13  [13 " cat"]
step 14 · block 3 · step 5/≤6 · fwd 14  []
block 3 done · 5 steps (at most 6)
step 15 · block 4 · step 1/≤6 · fwd 15  [17 "\t"]
step 16 · block 4 · step 2/≤6 · fwd 16  [19 "\t"] ~17 "\t"→","
step 17 · block 4 · step 3/≤6 · fwd 17  [18 "\n"]
step 18 · block 4 · step 4/≤6 · fwd 18  [16 " softly"]
step 19 · block 4 · step 5/≤6 · fwd 19  []
block 4 done · 5 steps (at most 6)
step 20 · block 5 · step 1/≤6 · fwd 20  [22 " 🦀"]
step 21 · block 5 · step 2/≤6 · fwd 21  [23 "\u0007"]
step 22 · block 5 · step 3/≤6 · fwd 22  [21 "ing"]
step 23 · block 5 · step 4/≤6 · fwd 23  [20 " dream"] ~22 " 🦀"→" \""
step 24 · block 5 · step 5/≤6 · fwd 24  [] ~22 " \""→" of" ~23 "\u0007"→" fish"
step 25 · block 5 · step 6/≤6 · fwd 25  []
block 5 done · 6 steps
step 26 · block 6 · step 1/≤6 · fwd 26  [26 " 日本"]
step 27 · block 6 · step 2/≤6 · fwd 27  [27 " café"]
step 28 · block 6 · step 3/≤6 · fwd 28  [25 " \""]
step 29 · block 6 · step 4/≤6 · fwd 29  [24 " —"]
step 30 · block 6 · step 5/≤6 · fwd 30  []
block 6 done · 5 steps (at most 6)
step 31 · block 7 · step 1/≤6 · fwd 31  [31 ✗"ROMEO"]
step 32 · block 7 · step 2/≤6 · fwd 32  [28 " 🦀"] ~31 "ROMEO"→"\u0007"
step 33 · block 7 · step 3/≤6 · fwd 33  [29 "\""]
step 34 · block 7 · step 4/≤6 · fwd 34  [30 ✗"́"]
step 35 · block 7 · step 5/≤6 · fwd 35  []
block 7 done · 5 steps (at most 6)
finished: length · 24 tokens out · 2 decoded and dropped: pos 30-31
"#;

#[test]
fn a_trace_with_edits_lists_them_on_their_step_lines() {
    let trace = fixture("traces/edits.jsonl");
    assert_eq!(stdout(unmask(&["steps", trace.to_str().unwrap()])), EDITS);
    let out = stdout(unmask(&["steps", "--json", trace.to_str().unwrap()]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[8],
        r#"{"step":8,"block":2,"block_step":5,"block_steps":null,"block_budget":6,"forward":8,"pos":[],"texts":[],"conf":[],"edits":[{"pos":10,"from":18,"token":13,"from_text":"\t","text":",","conf":0.8010297},{"pos":11,"from":22,"token":14,"from_text":" fish","text":" and","conf":0.85181785}]}"#
    );
    assert_eq!(lines.iter().filter(|l| l.contains(r#""edits":"#)).count(), 7);
}

/// A trace cut mid-line (a recording that died): the steps before the cut are listed, one
/// warning line names where it stopped, and the status is 3, so that a script can tell.
#[test]
fn a_cut_trace_lists_what_came_before_and_exits_3() {
    let text = std::fs::read_to_string(fixture("traces/tiny-dynamic.jsonl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.jsonl");
    std::fs::write(&cut, &text[..text.len() * 2 / 3]).unwrap();
    let out = unmask(&["steps", cut.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("unmask: warning: ") && err.contains("cut.jsonl:"), "{err}");
    assert!(err.ends_with("; listed the steps before it\n"), "{err}");
    let listed = String::from_utf8(out.stdout).unwrap();
    assert!(!listed.is_empty() && TINY_DYNAMIC.starts_with(&listed), "{listed}");
}
