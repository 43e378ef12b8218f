//! Bad input and failures, end to end through the binary: engine failures reported as failures,
//! sizes from untrusted input bounded, text from files kept off the terminal raw, and paths
//! that are not what they seem reported as such. Each gives a one-line error or the right
//! behaviour, and loses nothing. docs/reliability.md lists what is checked.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use unmask::trace::events::{Event, FinishReason};

mod common;
use common::{copy_model, fixture, poison_tensor};

/// Runs unmask with a deadline: a hang is a failure, not a stuck test run.
fn unmask(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_unmask"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running unmask");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("unmask {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The one-line error of a run that must fail.
fn one_line_error(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "expected failure; stderr: {err}");
    assert_eq!(out.status.code(), Some(1), "an error exit, not a crash: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with("unmask: error: "), "{err}");
    assert!(!err.contains('\x1b') && !err.contains('\x07'), "no raw control bytes: {err:?}");
    err
}

fn rewrite(path: &Path, f: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, f(text)).unwrap();
}

fn read_trace(path: &Path) -> Vec<Event> {
    let t = unmask::trace::file::read_file(path).expect("the trace reads back");
    assert_eq!(t.stopped, None, "every line reads back");
    t.events
}

// ---- 1. an engine failure is reported as failure -------------------------------------------

#[test]
fn a_temperature_of_1e_38_decodes_instead_of_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.jsonl");
    let model = fixture("tiny-random");
    let o = unmask(&[
        "trace",
        "--model",
        model.to_str().unwrap(),
        "--temperature",
        "1e-38",
        "--max-new-tokens",
        "16",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let events = read_trace(&out);
    let Some(Event::Finish(f)) = events.last() else { panic!("no finish") };
    assert!(matches!(f.reason, FinishReason::Length | FinishReason::Eos), "{f:?}");
    assert!(!f.output_ids.is_empty());
    // The zero-temperature limit: every token drawn with certainty.
    let confs: Vec<f32> = events
        .iter()
        .filter_map(|e| if let Event::Step(s) = e { Some(s) } else { None })
        .flat_map(|s| s.committed.iter().map(|c| c.conf))
        .collect();
    assert!(confs.len() >= 16, "{confs:?}");
    assert!(confs.iter().all(|&c| c == 1.0), "{confs:?}");
}

#[test]
fn nan_or_inf_weights_fail_the_decode_with_one_line_and_a_readable_trace() {
    for value in [f32::NAN, f32::INFINITY] {
        let m =
            copy_model(|p| poison_tensor(&p.join("model.safetensors"), "model.norm.weight", value));
        let out = m.path().join("r.jsonl");
        let o = unmask(&[
            "trace",
            "--model",
            m.path().to_str().unwrap(),
            "--max-new-tokens",
            "8",
            "--out",
            out.to_str().unwrap(),
        ]);
        let e = one_line_error(&o);
        assert!(
            e.contains(
                "decode failed: block 1 step 0 (forward 1): non-finite logits at position 4"
            ),
            "{value}: {e}"
        );
        // What was written reads back: a header and the error finish, no `null`.
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(!text.contains("null"), "{text}");
        let events = read_trace(&out);
        assert!(matches!(events.last(), Some(Event::Finish(f)) if f.reason == FinishReason::Error));
        // The other headless commands fail the same way.
        let o = unmask(&[
            "compare",
            "--headless",
            "--model",
            m.path().to_str().unwrap(),
            "--max-new-tokens",
            "8",
        ]);
        assert!(one_line_error(&o).contains("non-finite logits"));
        let cast = m.path().join("c.cast");
        let o = unmask(&[
            "record",
            "--model",
            m.path().to_str().unwrap(),
            "--max-new-tokens",
            "8",
            "--cast",
            cast.to_str().unwrap(),
        ]);
        assert!(one_line_error(&o).contains("non-finite logits"));
    }
}

#[test]
fn a_config_with_rope_theta_0_or_rms_norm_eps_minus_1_is_refused_at_load() {
    for (field, from, to) in [
        ("rope_theta", "\"rope_theta\": 1000000.0", "\"rope_theta\": 0"),
        ("rms_norm_eps", "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": -1"),
    ] {
        let m = copy_model(|p| rewrite(&p.join("config.json"), |t| t.replace(from, to)));
        let o = unmask(&["trace", "--model", m.path().to_str().unwrap()]);
        let e = one_line_error(&o);
        let value = to.rsplit(' ').next().unwrap();
        assert!(
            e.contains(&format!("config.json: invalid config: field `{field}` is {value};")),
            "{e}"
        );
        assert!(o.stdout.is_empty(), "nothing decoded");
    }
}

// ---- 4. sizes from untrusted input ---------------------------------------------------------

/// The fixture trace with its header edited, written to a temporary file.
fn edited_trace(dir: &Path, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let text = std::fs::read_to_string(fixture("traces/tiny-dynamic.jsonl")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut h: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    edit(&mut h);
    lines[0] = h.to_string();
    let p = dir.join("t.jsonl");
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

#[test]
fn trace_headers_with_huge_sizes_are_refused_naming_field_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, serde_json::Value, &str); 4] = [
        (
            "block_length",
            1_000_000_000u64.into(),
            "field `settings.block_length` is 1000000000, outside 1 to 4096",
        ),
        (
            "block_length",
            (1u64 << 63).into(),
            "field `settings.block_length` is 9223372036854775808, outside 1 to 4096",
        ),
        (
            "first_block",
            100_000_000u64.into(),
            "field `first_block` is 100000000, but 5 prompt tokens in blocks of 4 start at block 1",
        ),
        ("max_len", 5u64.into(), "field `max_len` is 5, but prompt 5 + max_new_tokens 12 is 17"),
    ];
    for (field, value, want) in cases {
        let t = edited_trace(dir.path(), |h| match field {
            "block_length" => h["settings"]["block_length"] = value.clone(),
            f => h[f] = value.clone(),
        });
        let cast = dir.path().join("o.cast");
        let start = Instant::now();
        for args in [
            vec!["export", t.to_str().unwrap()],
            vec!["replay", t.to_str().unwrap(), "--cast", cast.to_str().unwrap()],
        ] {
            let e = one_line_error(&unmask(&args));
            assert!(e.contains(&format!("t.jsonl:1: {want}")), "{args:?}: {e}");
        }
        assert!(start.elapsed() < Duration::from_secs(20), "refused before any work");
    }
}

/// Ranges in trace errors are inclusive and read as such: a step in a block past the decode's
/// last said `outside this decode's blocks 1..3`, as if 3 were allowed.
#[test]
fn a_step_outside_the_decodes_blocks_names_the_blocks_it_may_be_in() {
    let dir = tempfile::tempdir().unwrap();
    // 5 prompt tokens + 4 new in blocks of 4: blocks 1 and 2; the fixture's steps go on in block 3.
    let t = edited_trace(dir.path(), |h| {
        h["settings"]["max_new_tokens"] = 4.into();
        h["max_len"] = 9.into();
    });
    let o = unmask(&["export", t.to_str().unwrap()]);
    let warn = String::from_utf8_lossy(&o.stderr);
    assert!(warn.contains("field `block` is 3, outside this decode's blocks 1 to 2;"), "{warn}");
}

#[test]
fn a_trace_committing_a_position_twice_is_cut_there() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture("traces/tiny-dynamic.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The first step again as its block's next step, right after it: it commits its
    // positions a second time.
    let first_step = lines.iter().position(|l| l.contains("\"event\":\"step\"")).unwrap();
    let Event::Step(mut again) = serde_json::from_str::<Event>(lines[first_step]).unwrap() else {
        panic!()
    };
    (again.step, again.forward) = (again.step + 1, again.forward + 1);
    let again = serde_json::to_string(&Event::Step(again)).unwrap();
    let mut doubled: Vec<&str> = lines.clone();
    doubled.insert(first_step + 1, &again);
    let t = dir.path().join("d.jsonl");
    std::fs::write(&t, doubled.join("\n") + "\n").unwrap();
    let o = unmask(&["export", t.to_str().unwrap(), "--format", "csv", "--table", "tokens"]);
    assert_eq!(o.status.code(), Some(3), "written from the part before the bad line");
    let warn = String::from_utf8_lossy(&o.stderr);
    assert!(
        warn.contains(&format!("d.jsonl:{}: committed position", first_step + 2))
            && warn.contains("a second time"),
        "{warn}"
    );
    let rows = String::from_utf8(o.stdout).unwrap().lines().count() - 1;
    let Event::Step(s) = serde_json::from_str::<Event>(lines[first_step]).unwrap() else {
        panic!()
    };
    assert_eq!(
        rows,
        s.committed.len(),
        "each position once, only from the events before the bad line"
    );
}

#[test]
fn max_new_tokens_of_2_pow_64_minus_1_is_an_error_not_a_wrap() {
    let model = fixture("tiny-random");
    let o = unmask(&[
        "trace",
        "--model",
        model.to_str().unwrap(),
        "--max-new-tokens",
        "18446744073709551615",
    ]);
    let e = one_line_error(&o);
    assert!(
        e.contains("--max-new-tokens must be within 1 to 1048576 (got 18446744073709551615)"),
        "{e}"
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn cast_sizes_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let cast = dir.path().join("o.cast");
    let t = fixture("traces/tiny-dynamic.jsonl");
    let o = unmask(&[
        "replay",
        t.to_str().unwrap(),
        "--cast",
        cast.to_str().unwrap(),
        "--width",
        "65535",
        "--height",
        "65535",
    ]);
    assert!(one_line_error(&o)
        .contains("--width must be within 60 to 1000, the TUI's smallest to largest (got 65535)"));
}

#[test]
fn a_config_with_a_billion_layers_is_refused_before_allocating() {
    let m = copy_model(|p| {
        rewrite(&p.join("config.json"), |t| {
            t.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1000000000")
        })
    });
    let e = one_line_error(&unmask(&["trace", "--model", m.path().to_str().unwrap()]));
    assert!(e.contains("config.json: invalid config: field `num_hidden_layers` is 1000000000, more than the limit of 1024"), "{e}");
    // Within the bound but more than the weights hold: named against the weights.
    let m = copy_model(|p| {
        rewrite(&p.join("config.json"), |t| {
            t.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 900")
        })
    });
    let e = one_line_error(&unmask(&["trace", "--model", m.path().to_str().unwrap()]));
    assert!(
        e.contains("config.json: field `num_hidden_layers` is 900, but the weights hold 2 layers"),
        "{e}"
    );
}

#[test]
fn devices_and_fifos_are_refused_before_reading() {
    let e = one_line_error(&unmask(&["export", "/dev/zero"]));
    assert_eq!(e.trim_end(), "unmask: error: /dev/zero: not a regular file (a character device)");
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.jsonl");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let e = one_line_error(&unmask(&["export", fifo.to_str().unwrap()]));
    assert!(e.contains("fifo.jsonl: not a regular file (a FIFO)"), "{e}");
    let cast = dir.path().join("o.cast");
    let e = one_line_error(&unmask(&[
        "replay",
        fifo.to_str().unwrap(),
        "--cast",
        cast.to_str().unwrap(),
    ]));
    assert!(e.contains("not a regular file (a FIFO)"), "{e}");
    // A FIFO in place of a checkpoint file.
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        let m = copy_model(|p| {
            std::fs::remove_file(p.join(name)).unwrap();
            assert!(Command::new("mkfifo").arg(p.join(name)).status().unwrap().success());
        });
        let e = one_line_error(&unmask(&["trace", "--model", m.path().to_str().unwrap()]));
        assert!(e.contains(&format!("{name}: not a regular file (a FIFO)")), "{e}");
    }
}

// ---- 6. text from files --------------------------------------------------------------------

#[test]
fn error_messages_show_control_characters_instead_of_sending_them() {
    let e = one_line_error(&unmask(&["trace", "--device", "\x1b]0;pwned\x07\nx"]));
    assert!(
        e.contains(
            "invalid value '␛]0;pwned␇↵x' for '--device <DEV>': expected cpu, cuda or cuda:N"
        ),
        "{e}"
    );
    // a value clap refuses itself (not one of a list) is shown the same way
    let e = one_line_error(&unmask(&["trace", "--strategy", "\x1b[2Jx\ny"]));
    assert!(
        e.contains("invalid value '␛[2Jx↵y' for '--strategy <STRATEGY>' [possible values:"),
        "{e}"
    );
}

#[test]
fn a_pre_tokenizer_regex_that_exhausts_the_regex_engine_is_a_one_line_error() {
    let m = copy_model(|p| {
        rewrite(&p.join("tokenizer.json"), |t| {
            let mut v: serde_json::Value = serde_json::from_str(&t).unwrap();
            v["pre_tokenizer"] = serde_json::json!({
                "type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": false
            });
            v.to_string()
        })
    });
    let prompt = format!("{}b", "a".repeat(5000));
    let e = one_line_error(&unmask(&[
        "trace",
        "--model",
        m.path().to_str().unwrap(),
        "--prompt",
        &prompt,
    ]));
    assert!(e.contains("tokenizer.json: cannot tokenize the prompt"), "{e}");
}

#[test]
fn export_to_a_terminal_shows_control_characters_as_the_tui_does() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture("traces/tiny-dynamic.jsonl")).unwrap();
    // A token whose text would set the terminal's title.
    let evil = text.replacen("\"text\":\"", "\"text\":\"\\u001b]0;pwned\\u0007", 1);
    assert_ne!(evil, text);
    let t = dir.path().join("evil.jsonl");
    std::fs::write(&t, evil).unwrap();
    // `script` gives unmask a pseudo-terminal as stdout; its transcript is what the terminal got.
    let log = dir.path().join("typescript");
    let cmd = format!("{} export {} --format csv", env!("CARGO_BIN_EXE_unmask"), t.display());
    let o = Command::new("script")
        .args(["-qec", &cmd, log.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let seen = std::fs::read_to_string(&log).unwrap();
    assert!(seen.contains("␛]0;pwned␇"), "{seen}");
    assert!(!seen.contains("\x1b]0;pwned"), "raw escape reached the terminal");
    // To a file (a pipe here), the text stays exact.
    let o = unmask(&["export", t.to_str().unwrap(), "--format", "csv"]);
    assert!(String::from_utf8(o.stdout).unwrap().contains("\x1b]0;pwned\x07"));
}

// ---- 7. paths that are not what they seem; tokens beyond the vocabulary ---------------------

#[test]
fn a_symlink_loop_is_reported_as_such_not_as_missing() {
    let m = copy_model(|p| {
        std::fs::remove_file(p.join("tokenizer.json")).unwrap();
        std::os::unix::fs::symlink(p.join("tokenizer.json"), p.join("tokenizer.json")).unwrap();
    });
    let e = one_line_error(&unmask(&["trace", "--model", m.path().to_str().unwrap()]));
    assert!(
        e.contains("tokenizer.json: is a symlink loop (Too many levels of symbolic links"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let looped = dir.path().join("loop");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let e = one_line_error(&unmask(&["trace", "--model", looped.to_str().unwrap()]));
    assert!(e.contains("loop: is a symlink loop"), "{e}");
}

#[test]
fn an_unreadable_folder_is_reported_as_permission_denied() {
    use std::os::unix::fs::PermissionsExt;
    let m = copy_model(|_| {});
    std::fs::set_permissions(m.path(), std::fs::Permissions::from_mode(0o000)).unwrap();
    let readable = std::fs::read_dir(m.path()).is_ok(); // root reads anything
    if readable {
        std::fs::set_permissions(m.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        eprintln!("skipped: running as root, permissions are not enforced");
        return;
    }
    let o = unmask(&["trace", "--model", m.path().to_str().unwrap(), "--max-new-tokens", "4"]);
    std::fs::set_permissions(m.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(one_line_error(&o).contains("permission denied"));
}

#[test]
fn a_prompt_token_beyond_the_vocabulary_is_refused_before_the_first_forward() {
    let m = copy_model(|p| {
        rewrite(&p.join("tokenizer.json"), |t| {
            let mut v: serde_json::Value = serde_json::from_str(&t).unwrap();
            v["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
                "id": 354, "content": "<|extra|>", "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": true
            }));
            v.to_string()
        })
    });
    let o = unmask(&["trace", "--model", m.path().to_str().unwrap(), "--prompt", "The <|extra|>"]);
    let e = one_line_error(&o);
    assert!(e.contains("has id 354, outside the model's vocabulary of 354"), "{e}");
    assert!(o.stdout.is_empty());
}

// ---- checkpoint JSON files: the file and the field named -----------------------------------

/// A copy of tiny-random whose `file` holds `text`.
fn model_with(file: &str, text: &str) -> tempfile::TempDir {
    copy_model(|p| std::fs::write(p.join(file), text).unwrap())
}

/// `unmask trace --model M ARGS`'s header, for a decode that must succeed.
fn header(m: &Path, args: &[&str]) -> unmask::trace::events::Header {
    let o = unmask(&[&["trace", "--model", m.to_str().unwrap()], args].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = String::from_utf8(o.stdout).unwrap().lines().next().unwrap().to_string();
    let Event::Header(h) = serde_json::from_str(&first).unwrap() else { panic!("no header") };
    *h
}

/// A bad value of generation_config.json is blamed on the file and its field, not on a flag
/// the user never gave (`invalid settings: --temperature must be ...`); a flag over it wins.
#[test]
fn a_bad_generation_config_value_names_the_file_and_field_not_a_flag() {
    // (every field's message is unit-tested in src/cli.rs; here the whole path, two of them)
    let cases = [
        (r#"{"temperature":-1}"#, "field `temperature` is -1; it must be a finite number >= 0"),
        (r#"{"max_new_tokens":0}"#, "field `max_new_tokens` is 0; it must be within 1 to 1048576"),
    ];
    for (json, want) in cases {
        let m = model_with("generation_config.json", json);
        let file = m.path().join("generation_config.json");
        let mut args = vec!["trace", "--model", m.path().to_str().unwrap()];
        if !json.contains("max_new_tokens") {
            args.extend(["--max-new-tokens", "4"]);
        }
        let e = one_line_error(&unmask(&args));
        assert!(e.ends_with(&format!("{}: {want}\n", file.display())), "{json}: {e}");
        assert!(!e.contains("invalid settings") && !e.contains("--"), "{json}: {e}");
    }
    // A flag over the file's value: the flag's is used, the file's is not taken.
    let m = model_with("generation_config.json", r#"{"temperature":-1,"max_new_tokens":0}"#);
    let h = header(m.path(), &["--temperature", "0", "--max-new-tokens", "4"]);
    assert_eq!((h.settings.sampling.temperature, h.settings.max_new_tokens), (0.0, 4));
    // Flags keep their own messages.
    let e = one_line_error(&unmask(&[
        "trace",
        "--model",
        m.path().to_str().unwrap(),
        "--temperature",
        "-1",
        "--max-new-tokens",
        "4",
    ]));
    assert!(
        e.ends_with("invalid settings: --temperature must be a finite number >= 0 (got -1)\n"),
        "{e}"
    );
    let plain = fixture("tiny-random");
    let e = one_line_error(&unmask(&[
        "trace",
        "--model",
        plain.to_str().unwrap(),
        "--max-new-tokens",
        "0",
    ]));
    assert!(
        e.ends_with("invalid settings: --max-new-tokens must be within 1 to 1048576 (got 0)\n"),
        "{e}"
    );
}

/// A field of the wrong type or out of its type's range is named, with the file, as the trace
/// reader names it (serde alone said `invalid value: integer -1, expected usize at line 1
/// column 158`, or `data did not match any variant of untagged enum OneOrMany`).
#[test]
fn a_config_field_that_does_not_parse_is_named_with_its_file() {
    let config = std::fs::read_to_string(fixture("tiny-random").join("config.json")).unwrap();
    for (from, to, field) in [
        ("\"vocab_size\": 354", "\"vocab_size\": -1", "vocab_size"),
        ("\"vocab_size\": 354", "\"vocab_size\": 1e10", "vocab_size"),
        ("\"rope_theta\": 1000000.0", "\"rope_theta\": \"x\"", "rope_theta"),
        ("\"eos_token_id\": 352", "\"eos_token_id\": \"x\"", "eos_token_id"),
    ] {
        assert!(config.contains(from));
        let m = model_with("config.json", &config.replace(from, to));
        let e = one_line_error(&unmask(&["trace", "--model", m.path().to_str().unwrap()]));
        let file = m.path().join("config.json");
        assert!(
            e.contains(&format!("{}: invalid config: field `{field}`: ", file.display())),
            "{to}: {e}"
        );
    }
    for (json, field) in [
        (r#"{"eos_token_id":"x"}"#, "eos_token_id"),
        (r#"{"top_k":-3}"#, "top_k"),
        (r#"{"do_sample":"no"}"#, "do_sample"),
    ] {
        let m = model_with("generation_config.json", json);
        let e = one_line_error(&unmask(&["trace", "--model", m.path().to_str().unwrap()]));
        let file = m.path().join("generation_config.json");
        assert!(
            e.contains(&format!(
                "{}: invalid generation config: field `{field}`: ",
                file.display()
            )),
            "{json}: {e}"
        );
        assert!(!e.contains("untagged enum"), "{e}");
    }
}

/// serde's derive reads a JSON array as a struct by position: `[1,2]` as generation_config.json
/// decoded with EOS 1 and blocks of 2. These files must be objects.
#[test]
fn a_checkpoint_json_file_that_is_not_an_object_is_refused() {
    for file in ["generation_config.json", "config.json", "tokenizer_config.json"] {
        for text in ["[1,2]", "[]", "7", "null", "\"x\""] {
            let m = model_with(file, text);
            let e = one_line_error(&unmask(&[
                "trace",
                "--model",
                m.path().to_str().unwrap(),
                "--max-new-tokens",
                "4",
            ]));
            assert!(
                e.contains(&format!("{}: not a JSON object", m.path().join(file).display())),
                "{file} {text}: {e}"
            );
        }
    }
}

/// `do_sample: false` is transformers' greedy decoding: the file's temperature is not taken
/// unless --temperature says so; `do_sample: true` is its sampling, defaults included.
#[test]
fn do_sample_false_in_generation_config_decodes_greedily() {
    let m = model_with(
        "generation_config.json",
        r#"{"eos_token_id":352,"do_sample":false,"temperature":0.7,"top_k":5}"#,
    );
    let h = header(m.path(), &["--max-new-tokens", "4"]);
    assert_eq!(h.settings.sampling.temperature, 0.0);
    assert_eq!(h.sources["sampling"], "generation_config.json (do_sample false: greedy)");
    let h = header(m.path(), &["--max-new-tokens", "4", "--temperature", "0.5"]);
    assert_eq!(h.settings.sampling.temperature, 0.5);
    assert_eq!(h.sources["sampling"], "flags over generation_config.json");
    // do_sample false with a bad temperature: not taken, so not refused.
    let m = model_with("generation_config.json", r#"{"do_sample":false,"temperature":-1}"#);
    assert_eq!(header(m.path(), &["--max-new-tokens", "4"]).settings.sampling.temperature, 0.0);
    // do_sample true keeps the file's temperature and top-k,
    let m =
        model_with("generation_config.json", r#"{"do_sample":true,"temperature":0.7,"top_k":5}"#);
    let h = header(m.path(), &["--max-new-tokens", "4"]);
    assert_eq!((h.settings.sampling.temperature, h.settings.sampling.top_k), (0.7, 5));
    assert_eq!(h.sources["sampling"], "generation_config.json");
    // and samples with transformers' defaults for those it leaves out (never greedy).
    let m = model_with("generation_config.json", r#"{"do_sample":true,"temperature":0.7}"#);
    let h = header(m.path(), &["--max-new-tokens", "4"]);
    assert_eq!((h.settings.sampling.temperature, h.settings.sampling.top_k), (0.7, 50));
    assert_eq!(
        h.sources["sampling"],
        "generation_config.json (do_sample true: transformers' top_k 50)"
    );
    let m = model_with("generation_config.json", r#"{"do_sample":true}"#);
    let h = header(m.path(), &["--max-new-tokens", "4", "--top-k", "3"]);
    assert_eq!((h.settings.sampling.temperature, h.settings.sampling.top_k), (1.0, 3));
    assert_eq!(
        h.sources["sampling"],
        "flags over generation_config.json (do_sample true: transformers' temperature 1.0)"
    );
}

/// A config.json whose `model_type` unmask does not know, found by its `architectures` alone,
/// decodes with a warning that says so (a mislabelled checkpoint decoded as another family
/// without a word).
#[test]
fn a_model_type_found_by_architecture_alone_is_named_in_a_warning() {
    let dir = copy_model(|d| {
        let p = d.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        cfg["model_type"] = "llama".into();
        std::fs::write(&p, cfg.to_string()).unwrap();
    });
    let o = unmask(&["trace", "--model", dir.path().to_str().unwrap(), "--max-new-tokens", "4"]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("model_type \"llama\" is not one unmask knows; decoding it as sdar/qwen3"),
        "{err}"
    );
}

// ---- a checkpoint folder is untrusted input: its template bounded, memory checked first ------

/// A copy of tiny-sdar-chat (the Qwen3 tokenizer, SDAR's template) edited by `edit`.
fn chat_model_with(edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(fixture("tiny-sdar-chat")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    edit(dir.path());
    dir
}

/// `template` as the checkpoint's chat template: chat_template.jinja, or tokenizer_config.json's
/// `chat_template` (the file then holds none).
fn with_template(p: &Path, in_config: bool, template: &str) {
    if !in_config {
        std::fs::write(p.join("chat_template.jinja"), template).unwrap();
        return;
    }
    std::fs::remove_file(p.join("chat_template.jinja")).unwrap();
    let file = p.join("tokenizer_config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    config["chat_template"] = template.into();
    std::fs::write(&file, config.to_string()).unwrap();
}

/// A template that loops, writes, recurses or nests without end ends the run at once with one
/// line naming its file, and leaves no output: `trace --out`, `record`, `compare --headless`
/// (the TUI renders the prompt in the same `Session::open`, before it takes the terminal).
#[test]
fn a_chat_template_that_runs_without_end_stops_on_its_budget_with_one_line_and_no_file() {
    let nest = format!(
        "{{% set ns = namespace(x=1) %}}{{% for i in range(100000) %}}{{% set ns.x = {}ns.x{} %}}{{% endfor %}}{{{{ ns.x }}}}",
        "[".repeat(50),
        "]".repeat(50)
    );
    let cases = [
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "the chat template did not finish within its budget (template line 1): it ran out of its 0.3 million steps"),
        ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "the chat template did not finish within its budget: it wrote more than 1.0 MiB of prompt"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "chat template failed (template line 1): recursion limit exceeded"),
        (&nest, "the chat template did not finish within its budget"),
        ("{% include 'tokenizer_config.json' %}", "chat template failed (template line 1): tried to include non-existing template 'tokenizer_config.json'"),
    ];
    for (i, (template, want)) in cases.iter().enumerate() {
        let in_config = i % 2 == 1;
        let m = chat_model_with(|p| with_template(p, in_config, template));
        let dir = m.path().to_str().unwrap();
        let file = if in_config {
            format!("{dir}/tokenizer_config.json (chat_template)")
        } else {
            format!("{dir}/chat_template.jinja")
        };
        let (trace, cast) = (m.path().join("t.jsonl"), m.path().join("c.cast"));
        let runs: [&[&str]; 3] = [
            &["trace", "--model", dir, "--out", trace.to_str().unwrap()],
            &[
                "record",
                "--model",
                dir,
                "--cast",
                cast.to_str().unwrap(),
                "--trace",
                trace.to_str().unwrap(),
            ],
            &["compare", "--headless", "--model", dir],
        ];
        // every template through trace, the first two through the others too
        for args in runs.into_iter().take(if i < 2 { 3 } else { 1 }) {
            let start = Instant::now();
            let e = one_line_error(&unmask(args));
            assert!(start.elapsed() < Duration::from_secs(10), "{args:?}: {:?}", start.elapsed());
            assert!(e.contains(&format!("{file}: {want}")), "{args:?}: {e}");
            assert!(!trace.exists() && !cast.exists(), "{args:?}: nothing written");
        }
    }
}

/// unmask under `ulimit -v KIB`, with a deadline.
fn unmask_limited(kib: u64, args: &[&str]) -> Output {
    let script = "ulimit -v \"$1\" && shift && exec \"$@\"";
    let limited: Vec<String> = ["-c", script, "sh", &kib.to_string(), env!("CARGO_BIN_EXE_unmask")]
        .into_iter()
        .map(str::to_string)
        .chain(args.iter().map(|a| a.to_string()))
        .collect();
    let mut child = Command::new("sh")
        .args(&limited)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running unmask under ulimit");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("unmask {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

const GIB_IN_KIB: u64 = 1 << 20;

/// Random weights of a shape the address space cannot hold are refused before the first one is
/// drawn, saying how much is needed and how much there is (it ran for minutes, then aborted on
/// a failed allocation); a shape that fits runs under the same limit.
#[test]
fn a_random_init_that_does_not_fit_is_refused_up_front() {
    let start = Instant::now();
    let o = unmask_limited(4 * GIB_IN_KIB, &["bench", "--random-init", "sdar-8b", "--repeat", "1"]);
    let e = one_line_error(&o);
    assert!(start.elapsed() < Duration::from_secs(20), "{:?}", start.elapsed());
    assert!(
        e.contains("--random-init sdar-8b needs 18.9 GiB (weights 15.3, loading them 3.5, KV cache 0.1 GiB), more than the ")
            && e.contains(" GiB of address space left under the limit of 4.0 GiB (ulimit -v); choose a smaller shape"),
        "{e}"
    );
    let o = unmask_limited(
        4 * GIB_IN_KIB,
        &[
            "bench",
            "--random-init",
            "tiny",
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--max-new-tokens",
            "8",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A checkpoint folder of sdar-1.7b's shape (its safetensors sparse: the sizes are real, the
/// bytes never read) under a limit that holds its mapped file but not its weights: refused
/// before the weights load, naming config.json. A small checkpoint decodes under a small
/// limit, chat template and all.
#[test]
fn a_checkpoint_that_does_not_fit_is_refused_before_its_weights_load() {
    let cfg = unmask::model::random::shape_config("sdar-1.7b").unwrap();
    let m = chat_model_with(|p| {
        let mut json = unmask::model::random::shape("sdar-1.7b").unwrap().json();
        json["torch_dtype"] = "bfloat16".into();
        std::fs::write(p.join("config.json"), json.to_string()).unwrap();
        let mut header = serde_json::Map::new();
        let mut at = 0usize;
        for (name, shape) in unmask::model::random::tensor_order(&cfg) {
            let len = shape.iter().product::<usize>() * 2;
            header.insert(
                name,
                serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [at, at + len]}),
            );
            at += len;
        }
        let mut head = serde_json::to_vec(&header).unwrap();
        head.resize(head.len().div_ceil(8) * 8, b' ');
        let file = std::fs::File::create(p.join("model.safetensors")).unwrap();
        use std::io::Write;
        (&file).write_all(&(head.len() as u64).to_le_bytes()).unwrap();
        (&file).write_all(&head).unwrap();
        file.set_len((8 + head.len() + at) as u64).unwrap();
    });
    let dir = m.path().to_str().unwrap();
    let start = Instant::now();
    let e = one_line_error(&unmask_limited(6 * GIB_IN_KIB, &["trace", "--model", dir]));
    assert!(start.elapsed() < Duration::from_secs(20), "{:?}", start.elapsed());
    assert!(
        e.contains(&format!("{dir}/config.json: the model needs 3.8 GiB, more than the "))
            && e.contains(" GiB of address space left under the limit of 6.0 GiB (ulimit -v)"),
        "{e}"
    );
    let chat = fixture("tiny-sdar-chat");
    let o = unmask_limited(
        GIB_IN_KIB,
        &["trace", "--model", chat.to_str().unwrap(), "--max-new-tokens", "8"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
