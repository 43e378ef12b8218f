//! The `unmask` binary end to end (no terminal): traces and one-line errors for bad input.

use std::path::Path;
use std::process::{Command, Output};

use unmask::trace::events::Event;

mod common;
use common::{copy_model, fixture};

fn unmask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_unmask")).args(args).output().expect("running unmask")
}

fn trace(extra: &[&str]) -> Vec<Event> {
    let model = fixture("tiny-random");
    let mut args = vec![
        "trace",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "The cat sat",
        "--max-new-tokens",
        "24",
    ];
    args.extend_from_slice(extra);
    let out = unmask(&args);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is one event"))
        .collect()
}

fn steps(events: &[Event]) -> Vec<&unmask::trace::events::StepEvent> {
    events.iter().filter_map(|e| if let Event::Step(s) = e { Some(s) } else { None }).collect()
}

#[test]
fn static_b4_s4_commits_exactly_one_token_per_step() {
    let events =
        trace(&["--block-length", "4", "--steps", "4", "--strategy", "low_confidence_static"]);
    assert!(matches!(events[0], Event::Header(_)));
    assert!(matches!(events.last(), Some(Event::Finish(_))));
    let steps = steps(&events);
    assert!(steps.len() >= 24);
    assert!(steps.iter().all(|s| s.committed.len() == 1));
}

#[test]
fn sequential_commits_left_to_right() {
    let events = trace(&["--strategy", "sequential"]);
    let order: Vec<usize> =
        steps(&events).iter().flat_map(|s| s.committed.iter().map(|c| c.pos)).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);
}

#[test]
fn the_step_map_reads_straight_from_the_trace() {
    let events = trace(&["--strategy", "low_confidence_dynamic", "--threshold", "0.5"]);
    let Event::Header(h) = &events[0] else { panic!() };
    let Some(Event::Finish(f)) = events.last() else { panic!() };
    let p = h.prompt_ids.len();
    // position -> (block, step); every output token appears exactly once.
    let mut map = std::collections::BTreeMap::new();
    for s in steps(&events) {
        for c in &s.committed {
            assert!(
                map.insert(c.pos, (s.block, s.step, c.token)).is_none(),
                "position {} twice",
                c.pos
            );
        }
    }
    for (i, &tok) in f.output_ids.iter().enumerate() {
        let (block, _step, t) = map[&(p + i)];
        assert_eq!(t, tok);
        assert_eq!(block, (p + i) / 4);
    }
}

#[test]
fn out_file_holds_the_same_events_as_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    let model = fixture("tiny-random");
    let args = [
        "trace",
        "--model",
        model.to_str().unwrap(),
        "--max-new-tokens",
        "8",
        "--out",
        path.to_str().unwrap(),
    ];
    assert!(unmask(&args).status.success());
    let file = unmask::trace::file::read_file(&path).unwrap();
    assert!(file.stopped.is_none());
    let stdout = unmask(&args[..5]);
    let lines: Vec<Event> = String::from_utf8(stdout.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Timings differ between runs; everything else must not.
    let strip = |evs: &[Event]| -> Vec<String> {
        evs.iter()
            .map(|e| match e.clone() {
                Event::Step(mut s) => {
                    s.t_ms = 0.0;
                    serde_json::to_string(&s).unwrap()
                }
                Event::Block(mut b) => {
                    b.t_ms = 0.0;
                    serde_json::to_string(&b).unwrap()
                }
                Event::Finish(mut f) => {
                    f.elapsed_ms = 0.0;
                    serde_json::to_string(&f).unwrap()
                }
                Event::Header(h) => serde_json::to_string(&h).unwrap(),
            })
            .collect()
    };
    assert_eq!(strip(&file.events), strip(&lines));
}

/// Runs `unmask trace` on `dir` and returns its one-line error.
fn error_for(dir: &Path, extra: &[&str]) -> String {
    let mut args = vec!["trace", "--model", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = unmask(&args);
    assert!(!out.status.success(), "expected failure");
    assert!(out.stdout.is_empty(), "no trace on failure");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with("unmask: error: "), "{err}");
    err
}

fn rewrite(path: &Path, f: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, f(text)).unwrap();
}

#[test]
fn bad_checkpoints_give_one_line_errors_naming_file_and_field() {
    let missing = Path::new("/nonexistent/model");
    assert!(error_for(missing, &[]).contains("model folder /nonexistent/model: does not exist"));

    let d = copy_model(|p| std::fs::remove_file(p.join("config.json")).unwrap());
    assert!(error_for(d.path(), &[]).contains("config.json: missing"));

    let d = copy_model(|p| {
        rewrite(&p.join("config.json"), |t| {
            t.replace("\"hidden_size\": 64", "\"hidden_size\": \"x\"")
        })
    });
    let e = error_for(d.path(), &[]);
    assert!(
        e.contains("config.json: invalid config: field `hidden_size`: invalid type: string \"x\""),
        "{e}"
    );

    let d = copy_model(|p| {
        rewrite(&p.join("config.json"), |t| {
            t.replace("\"intermediate_size\": 160", "\"intermediate_size\": 128")
        })
    });
    let e = error_for(d.path(), &[]);
    assert!(e.contains("model.safetensors: tensor `model.layers.0.mlp.gate_proj.weight` has shape [160, 64], expected [128, 64]"), "{e}");

    let d = copy_model(|p| std::fs::remove_file(p.join("tokenizer.json")).unwrap());
    assert!(error_for(d.path(), &[]).contains("tokenizer.json: missing"));

    let d = copy_model(|p| std::fs::write(p.join("tokenizer.json"), "{\"version\": ").unwrap());
    assert!(error_for(d.path(), &[]).contains("tokenizer.json: invalid tokenizer"));

    let d = copy_model(|p| {
        let f = p.join("model.safetensors");
        let bytes = std::fs::read(&f).unwrap();
        std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    });
    let e = error_for(d.path(), &[]);
    assert!(e.contains("model.safetensors: not a valid safetensors file"), "{e}");

    let d = copy_model(|p| std::fs::remove_file(p.join("model.safetensors")).unwrap());
    assert!(
        error_for(d.path(), &[]).contains("no model.safetensors or model.safetensors.index.json")
    );
}

#[test]
fn bad_flags_give_one_line_errors() {
    let model = fixture("tiny-random");
    let e = error_for(&model, &["--block-length", "0"]);
    assert!(e.contains("--block-length must be within 1 to 4096 (got 0)"), "{e}");
    let e = error_for(&model, &["--strategy", "fastest"]);
    assert!(e.contains("invalid value 'fastest' for '--strategy"), "{e}");
    assert!(e.contains("low_confidence_dynamic"), "lists the strategies: {e}");
    let e = error_for(&model, &["--top-p", "0"]);
    assert!(e.contains("--top-p must be within (0, 1]"), "{e}");
    // --device and --dtype are refused as the command line is read, naming the flag
    let e = error_for(&model, &["--device", "tpu"]);
    assert!(
        e.contains("invalid value 'tpu' for '--device <DEV>': expected cpu, cuda or cuda:N"),
        "{e}"
    );
    let e = error_for(&model, &["--device", "cuda:first"]);
    assert!(
        e.contains(
            "invalid value 'cuda:first' for '--device <DEV>': expected cuda:N with N a GPU index"
        ),
        "{e}"
    );
    let e = error_for(&model, &["--dtype", "f64"]);
    assert!(
        e.contains(
            "invalid value 'f64' for '--dtype <DT>' [possible values: auto, f32, bf16, f16]"
        ),
        "{e}"
    );
    // A negative number is the flag's value, checked like any other (not "unexpected argument").
    let e = error_for(&model, &["--threshold", "-1"]);
    assert!(e.contains("--threshold must be within [0, 1] (got -1)"), "{e}");
    let e = error_for(&model, &["--temperature", "-0.5"]);
    assert!(e.contains("--temperature must be a finite number >= 0 (got -0.5)"), "{e}");
    let e = error_for(&model, &["--steps", "-2"]);
    assert!(e.contains("invalid value '-2' for '--steps <N>'"), "{e}");
}

/// Flags the command would ignore are refused: decode flags for the commands that read a
/// trace, a revision of no model, a pace nothing would use.
#[test]
fn flags_the_command_would_ignore_give_one_line_errors() {
    let trace = fixture("traces/tiny-dynamic.jsonl");
    let t = trace.to_str().unwrap();
    let one_line = |args: &[&str]| {
        let o = unmask(args);
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!((o.status.code(), e.lines().count()), (Some(1), 1), "{args:?}: {e}");
        e
    };
    let e = one_line(&["export", t, "--model", "/nonexistent", "--steps", "0"]);
    assert!(
        e.starts_with(
            "unmask: error: export reads a recorded trace: --model applies only when decoding"
        ),
        "{e}"
    );
    let e = one_line(&["replay", t, "--block-length", "0", "--cast", "/dev/null"]);
    assert!(
        e.contains("replay reads a recorded trace: --block-length applies only when decoding"),
        "{e}"
    );
    let e = one_line(&["trace", "--revision", "foo", "--max-new-tokens", "2"]);
    assert!(e.contains("--revision picks a revision of --model ORG/NAME; give --model too"), "{e}");
    let e = one_line(&["--pace", "nan", "--max-new-tokens", "2"]);
    assert!(e.contains("--pace NaN: must be 0"), "{e}");
    let e = one_line(&["bench", "--prompt", "hi", "--repeat", "1"]);
    assert!(
        e.contains("bench decodes a prompt of --prompt-len tokens: --prompt has no effect there"),
        "{e}"
    );
    let e = one_line(&["export", t, "--format", "json", "--table", "steps"]);
    assert!(e.contains("--table picks one CSV table"), "{e}");
    // what the commands do take still works
    assert!(unmask(&["export", t, "--format", "csv"]).status.success());
    assert!(unmask(&["export", t, "--table", "steps"]).status.success());
}

/// The look flags, `--pace` and the cast flags are refused by the commands that would ignore
/// them, naming the flag and what it applies to (`export --format svg --theme dark` drew the
/// one light figure, `trace --mono`, `record --pace 3` did nothing); a trace read by `steps`
/// refuses a decode flag by its name (clap listed all 22 decode flags).
#[test]
fn look_and_pace_flags_are_refused_where_nothing_uses_them() {
    let trace = fixture("traces/tiny-dynamic.jsonl");
    let t = trace.to_str().unwrap();
    let refused = |args: &[&str], want: &str| {
        let o = unmask(args);
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!((o.status.code(), e.lines().count()), (Some(1), 1), "{args:?}: {e}");
        assert!(e.starts_with(&format!("unmask: error: {want}")), "{args:?}: {e}");
        assert!(o.stdout.is_empty(), "{args:?}");
    };
    let screens = "applies only to the screens (the TUI, replay, compare, record)";
    let pace = "--pace applies only to the TUI, compare and replay on a terminal";
    refused(
        &["export", t, "--format", "svg", "--theme", "dark"],
        &format!("export draws no screen: --theme {screens}; the SVG figure has one look"),
    );
    refused(&["export", t, "--mono"], &format!("export draws no screen: --mono {screens}"));
    refused(
        &["--theme", "light", "export", t],
        &format!("export draws no screen: --theme {screens}"),
    );
    refused(&["export", t, "--pace", "3"], &format!("export plays nothing: {pace}"));
    refused(
        &["trace", "--mono", "--max-new-tokens", "2"],
        &format!("trace draws no screen: --mono {screens}"),
    );
    refused(
        &["trace", "--theme", "light", "--max-new-tokens", "2"],
        &format!("trace draws no screen: --theme {screens}"),
    );
    refused(
        &["trace", "--pace", "5", "--max-new-tokens", "2"],
        &format!("trace plays nothing: {pace}"),
    );
    refused(&["steps", t, "--mono"], &format!("steps draws no screen: --mono {screens}"));
    refused(&["bench", "--theme", "light"], &format!("bench draws no screen: --theme {screens}"));
    refused(
        &["record", "--pace", "3", "--cast", "/dev/null"],
        &format!("record writes a cast: {pace}; a cast's pace is --step-delay"),
    );
    refused(
        &["replay", t, "--cast", "/dev/null", "--pace", "3"],
        &format!("replay --cast writes a cast: {pace}"),
    );
    refused(&["replay", t, "--fps", "3"], "replay: --fps applies only with --cast or --gif");
    refused(
        &["record", "--gif", "/dev/null", "--pace", "3"],
        &format!("record writes a GIF: {pace}; a GIF's pace is --step-delay"),
    );
    refused(
        &["replay", t, "--cast", "/dev/null", "--gif-scale", "2"],
        "replay: --gif-scale applies only with --gif",
    );
    refused(
        &["record", "--max-new-tokens", "2"],
        "the following required arguments were not provided: <--cast <FILE>|--gif <FILE>>",
    );
    refused(
        &["compare", "--headless", "--pace", "2"],
        &format!("compare --headless prints a table: {pace}"),
    );
    refused(
        &["compare", "--headless", "--mono"],
        &format!("compare --headless prints a table: --mono {screens}"),
    );
    refused(
        &["steps", t, "--temperature", "0.5"],
        "steps TRACE reads a recorded trace: --temperature applies only when decoding (trace, steps without a TRACE, record, compare, bench)",
    );
    // where they apply they are taken
    assert!(unmask(&["replay", t, "--cast", "/dev/null", "--mono", "--theme", "light"])
        .status
        .success());
    assert!(unmask(&["steps", t]).status.success());
}

/// `export --help` and `replay --help` list only the flags they take: the 22 decode flags (and
/// for export the look flags), which they refuse, are not shown; the refusals stay.
#[test]
fn help_lists_only_the_flags_a_command_takes() {
    let help = |args: &[&str]| {
        let o = unmask(args);
        assert!(o.status.success(), "{args:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let decode = [
        "--model",
        "--temperature",
        "--candidates",
        "--max-new-tokens",
        "--device",
        "--routing",
        "--prompt",
    ];
    for cmd in ["export", "replay"] {
        let h = help(&[cmd, "--help"]);
        for flag in decode {
            assert!(!h.contains(flag), "{cmd} --help shows {flag}:\n{h}");
        }
        assert_eq!(help(&["help", cmd]), h);
    }
    let export = help(&["export", "--help"]);
    for flag in ["--mono", "--theme", "--pace"] {
        assert!(!export.contains(flag), "{flag}:\n{export}");
    }
    assert!(
        export.contains("--format") && export.contains("--out") && export.contains("--table"),
        "{export}"
    );
    let replay = help(&["replay", "--help"]);
    assert!(
        ["--cast", "--fps", "--mono", "--theme", "--pace"].iter().all(|f| replay.contains(f)),
        "{replay}"
    );
    let trace = help(&["trace", "--help"]);
    assert!(
        trace.contains("--temperature") && !trace.contains("--mono") && !trace.contains("--pace"),
        "{trace}"
    );
    assert!(!help(&["record", "--help"]).contains("--pace"));
    let bench = help(&["bench", "--help"]);
    for flag in ["--prompt ", "--prompt-file", "--system", "--chat-arg", "--raw"] {
        assert!(!bench.contains(flag), "bench --help shows {flag}:\n{bench}");
    }
    assert!(bench.contains("--prompt-len") && bench.contains("--temperature"), "{bench}");
    let top = help(&["--help"]);
    assert!(
        decode.iter().chain(&["--mono", "--theme", "--pace"]).all(|f| top.contains(f)),
        "{top}"
    );
}

/// `--help` and `--version` whose output cannot be written fail with one line, as the data
/// commands do (`unmask --help > /dev/full` exited 0); a reader that has gone away
/// (`unmask --help | head -1`) still ends quietly with exit 0.
#[test]
fn help_that_cannot_be_written_is_an_error_but_a_closed_pipe_is_not() {
    let bin = env!("CARGO_BIN_EXE_unmask");
    for args in ["--help", "--version", "export --help", "help trace"] {
        // a shell redirection: the test never opens /dev/full itself
        let o = Command::new("sh")
            .args(["-c", &format!("\"$0\" {args} > /dev/full"), bin])
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args}: {e}");
        assert_eq!(e.lines().count(), 1, "{args}: {e}");
        assert!(
            e.starts_with("unmask: error: stdout: cannot write: No space left on device"),
            "{args}: {e}"
        );
        let mut child = Command::new(bin)
            .args(args.split(' '))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success() && o.stderr.is_empty(), "{args}: {o:?}");
    }
}

/// `-` reads the trace from stdin wherever a trace is read (it was "-: does not exist" for
/// export and replay).
#[test]
fn a_trace_from_stdin_reads_as_the_file_does() {
    let trace = fixture("traces/tiny-dynamic.jsonl");
    let piped = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_unmask"))
            .args(args)
            .stdin(std::process::Stdio::from(std::fs::File::open(&trace).unwrap()))
            .output()
            .unwrap();
        assert!(c.status.success(), "{args:?}: {}", String::from_utf8_lossy(&c.stderr));
        std::mem::take(&mut c.stdout)
    };
    for args in [&["export", "-"][..], &["export", "-", "--format", "json"], &["steps", "-"]] {
        let from_file: Vec<&str> =
            args.iter().map(|a| if *a == "-" { trace.to_str().unwrap() } else { a }).collect();
        assert_eq!(piped(args), unmask(&from_file).stdout, "{args:?}");
    }
    let d = tempfile::tempdir().unwrap();
    let cast = d.path().join("c.cast");
    piped(&["replay", "-", "--cast", cast.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&cast).unwrap().lines().count() > 3);
}

#[test]
fn compare_headless_prints_both_sides_and_where_they_differ() {
    let model = fixture("tiny-random");
    let out = unmask(&[
        "compare",
        "--headless",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "The cat sat",
        "--max-new-tokens",
        "16",
        "--strategy-a",
        "sequential",
        "--strategy-b",
        "low_confidence_dynamic",
        "--threshold-b",
        "0.5",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("sequential block 4 steps 4 greedy"), "{text}");
    assert!(text.contains("low_confidence_dynamic block 4 steps 4 thr=0.50 greedy"), "{text}");
    // Dynamic at 0.5 commits several tokens per pass on this model: fewer forwards than 16/1.
    let fwd: Vec<usize> = text
        .lines()
        .find(|l| l.starts_with("forwards"))
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(fwd[1] < fwd[0], "{text}");
    assert!(
        text.contains("outputs diverge at output token") || text.contains("outputs are identical")
    );
}

/// `compare --headless` with the run-dependent timing blanked.
fn compare_headless(args: &[&str]) -> String {
    let mut all = vec!["compare", "--headless"];
    all.extend_from_slice(args);
    let out = unmask(&all);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .map(|l| if l.starts_with("elapsed ms") { "elapsed ms" } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn compare_headless_counts_cells_at_other_steps_and_other_tokens_exactly() {
    let model = fixture("tiny-random");
    let text = compare_headless(&[
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "The cat sat",
        "--max-new-tokens",
        "16",
        "--strategy-a",
        "low_confidence_static",
        "--strategy-b",
        "low_confidence_dynamic",
        "--threshold-b",
        "0.5",
    ]);
    let expected = "                   A                                              B
settings           low_confidence_static block 4 steps 4 greedy   low_confidence_dynamic block 4 steps 4 thr=0.50 greedy
tokens             16                                             16
forwards           19                                             6
steps              19                                             6
blocks             5                                              5
tokens/forward     0.842                                          2.667
finish             length                                         length
elapsed ms
outputs diverge at output token 3
blocks that differ: 1 2 3 4 5
steps per block (A/B): 1:3/1 2:4/1 3:4/2 4:4/1 5:4/1
same token, other step (A/B): 2 (first: pos 6 steps 2/1, pos 8 steps 2/1)
different token: 10 (first: pos 7, pos 9, pos 10, pos 13, pos 14, …)
--- A
ionYYY<F0 F0>YYion<F7 FF 8F>YYionion
--- B
ionYionY<F7>YYYYYind<FF FF>Y<FF>␝
";
    assert_eq!(text, expected);
}

#[test]
fn compare_is_greedy_unless_a_temperature_is_given() {
    // The embedded model's generation_config samples at 0.7; compare does not, by default.
    let text = compare_headless(&["--max-new-tokens", "4", "--strategy-a", "sequential"]);
    let settings = text.lines().find(|l| l.starts_with("settings")).unwrap();
    assert_eq!(settings.matches(" greedy").count(), 2, "{text}");
    assert!(!text.contains("random draws"), "{text}");
    let text = compare_headless(&[
        "--max-new-tokens",
        "4",
        "--strategy-a",
        "sequential",
        "--temperature-b",
        "0.7",
    ]);
    let settings = text.lines().find(|l| l.starts_with("settings")).unwrap();
    assert!(settings.contains(" greedy") && settings.contains(" T=0.7"), "{text}");
    assert!(
        text.contains("\nsampled (temperature > 0): the sides also differ by their random draws\n"),
        "{text}"
    );
}

#[test]
fn bench_with_events_both_reports_an_on_and_an_off_row_per_strategy() {
    let json = std::env::temp_dir().join(format!("unmask-bench-{}.json", std::process::id()));
    let out = unmask(&[
        "bench",
        "--strategy",
        "sequential",
        "--max-new-tokens",
        "4",
        "--prompt-len",
        "4",
        "--warmup",
        "0",
        "--repeat",
        "2",
        "--events",
        "both",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    let rows = report["rows"].as_array().unwrap();
    let modes: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["strategy"].as_str().unwrap(), r["events"].as_str().unwrap()))
        .collect();
    assert_eq!(modes, [("sequential", "on"), ("sequential", "off")]);
    for r in rows {
        assert!(r["ms_per_forward"].as_f64().unwrap() > 0.0);
        assert_eq!(
            r["tokens_per_forward"].as_f64().unwrap(),
            1.0,
            "sequential commits one token a forward"
        );
    }
    assert!(String::from_utf8_lossy(&out.stdout).contains("# events cost, sequential:"));
}

#[test]
fn a_decode_longer_than_the_models_positions_is_refused_before_it_starts() {
    // The embedded model has 512 positions; "ROMEO.\n" is 6 tokens, so 506 new ones fit (a
    // decode that long is too slow for a debug-build test; the message states the bound).
    let out = unmask(&["trace", "--max-new-tokens", "510"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing is written before the check");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err,
        "unmask: error: --max-new-tokens 510: the prompt's 6 tokens plus 510 new ones, in blocks of 4, \
         exceed the model's 512 positions (config.json `max_position_embeddings`); at most 506 new tokens fit\n"
    );
}

#[test]
fn a_block_too_long_for_the_model_blames_the_block_length_in_the_tui_and_in_trace() {
    // The embedded model: 512 positions, a 6-token prompt, 256 new tokens by default.
    let want = "unmask: error: --block-length 1000: in blocks of 1000, not one new token fits after the prompt's \
                6 tokens in the model's 512 positions (config.json `max_position_embeddings`); blocks of at most \
                512 fit 256 new tokens\n";
    // The TUI checks the decode before it needs a terminal: the same line as `trace`.
    for args in [&["trace", "--block-length", "1000"][..], &["--block-length", "1000"][..]] {
        let out = unmask(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8(out.stderr).unwrap(), want, "{args:?}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn bad_pace_and_export_files_are_refused_before_the_tui_needs_a_terminal() {
    let out = unmask(&["--pace", "-2"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "unmask: error: --pace -2: must be 0 (as fast as the decode goes) or a positive number of steps per second\n"
    );
    let csv = fixture("traces/tiny-dynamic.tokens.csv");
    let out = unmask(&["replay", csv.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("this is a CSV table from `unmask export`, not a trace; `unmask trace --out FILE` writes a trace"), "{err}");
}

#[test]
fn candidates_3_round_trip_through_a_trace_and_leave_the_decode_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (with, without) = (dir.path().join("k3.jsonl"), dir.path().join("k1.jsonl"));
    let model = fixture("tiny-random");
    let base = [
        "trace",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "The cat sat",
        "--max-new-tokens",
        "12",
        "--temperature",
        "0",
    ];
    for (path, k) in [(&with, "3"), (&without, "1")] {
        let mut args = base.to_vec();
        args.extend(["--candidates", k, "--out", path.to_str().unwrap()]);
        let out = unmask(&args);
        assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    }
    // Read back, the events are every line as written; written again and read, the same
    // events (bytes may differ only in the last digit of a time: serde_json's float parsing).
    let text = std::fs::read_to_string(&with).unwrap();
    let read = unmask::trace::file::read_file(&with).unwrap();
    assert_eq!(read.stopped, None);
    let lines: Vec<Event> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(read.events, lines);
    let mut again = Vec::new();
    let mut w = unmask::trace::file::TraceWriter::new(&mut again, "again");
    read.events.iter().for_each(|e| w.write(e).unwrap());
    assert_eq!(unmask::trace::file::read(again.as_slice(), "again").unwrap().events, read.events);
    assert_eq!(
        String::from_utf8(again).unwrap().matches("\"top\":[").count(),
        text.matches("\"top\":[").count()
    );
    // Every sampled entry has its 3 most probable tokens, most probable first; greedy, the
    // first is the token itself with its confidence.
    let k3 = steps(&read.events);
    let entries: Vec<(u32, f32, &Vec<unmask::trace::events::TopCandidate>)> = k3
        .iter()
        .flat_map(|s| {
            s.committed
                .iter()
                .map(|c| (c.token, c.conf, &c.top))
                .chain(s.masked.iter().map(|c| (c.token, c.conf, &c.top)))
        })
        .collect();
    assert!(entries.len() > 12);
    for (token, conf, top) in entries {
        assert_eq!(top.len(), 3);
        assert_eq!((top[0].token, top[0].p), (token, conf));
        assert!(top.windows(2).all(|w| w[0].p >= w[1].p), "{top:?}");
        assert!(top.iter().all(|t| !t.text.is_empty() || t.bytes.is_some()));
    }
    // The same decode: tokens and steps; K = 1 writes no `top` at all.
    let k1 = unmask::trace::file::read_file(&without).unwrap().events;
    let strip = |s: &unmask::trace::events::StepEvent| {
        let c: Vec<(usize, u32)> = s.committed.iter().map(|c| (c.pos, c.token)).collect();
        let m: Vec<(usize, u32)> = s.masked.iter().map(|c| (c.pos, c.token)).collect();
        (s.block, s.step, c, m)
    };
    assert_eq!(
        k3.iter().map(|s| strip(s)).collect::<Vec<_>>(),
        steps(&k1).iter().map(|s| strip(s)).collect::<Vec<_>>()
    );
    assert!(!std::fs::read_to_string(&without).unwrap().contains("\"top\""));
}

#[test]
fn candidates_outside_1_to_16_are_a_one_line_error() {
    for k in ["0", "100", "-1", "three"] {
        let out = unmask(&["trace", "--candidates", k]);
        assert_eq!(out.status.code(), Some(1), "--candidates {k}");
        assert!(out.stdout.is_empty());
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(
            err,
            format!(
                "unmask: error: invalid value '{k}' for '--candidates <K>': expected a whole number from 1 to 16 \
                 (candidates kept per masked position) (see --help)\n"
            )
        );
    }
}

/// `--dtype bf16` on the CPU runs the bf16 products and says so in the header, and decodes to
/// the end like f32 (its tokens are those of its own arithmetic: tests/parity.rs bounds them).
#[test]
fn dtype_bf16_on_the_cpu_runs_bf16_products_and_says_so() {
    let header = |events: &[Event]| match &events[0] {
        Event::Header(h) => h.device.clone(),
        other => panic!("first event {other:?}"),
    };
    let (f32_run, bf16_run) =
        (trace(&["--temperature", "0"]), trace(&["--temperature", "0", "--dtype", "bf16"]));
    assert_eq!(header(&f32_run), "cpu");
    assert_eq!(header(&bf16_run), "cpu (bf16 products)");
    // Any compute dtype that is not the device's own is recorded: its tokens are its own.
    assert_eq!(header(&trace(&["--temperature", "0", "--dtype", "f16"])), "cpu (f16)");
    assert_eq!(header(&trace(&["--temperature", "0", "--dtype", "f32"])), "cpu");
    assert!(!steps(&bf16_run).is_empty());
    assert!(matches!(bf16_run.last(), Some(Event::Finish(_))), "a decode that ends");
}

/// A `--prompt-len` past the model's positions is one line before any work (2^64 panicked
/// allocating the prompt, 2^32 ran out of memory).
#[test]
fn bench_refuses_a_prompt_len_past_the_model() {
    for (args, want) in [
        (
            vec!["bench", "--random-init", "tiny", "--prompt-len", "18446744073709551615"],
            "--prompt-len 18446744073709551615: the prompt's",
        ),
        (
            vec!["bench", "--prompt-len", "600"],
            "--prompt-len 600: the prompt's 600 tokens fill the model's 512 positions",
        ),
        (
            vec!["bench", "--prompt-len", "500", "--max-new-tokens", "64"],
            "--prompt-len 500: --max-new-tokens 64",
        ),
    ] {
        let out = unmask(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want) && err.lines().count() == 1, "{args:?}: {err}");
    }
}

/// A misspelt flag gets clap's suggestion on its one line, and a refused strategy lists the
/// short names it also takes (`dynamic`, `joint`, ...), not only the full ones.
#[test]
fn a_typo_gets_a_suggestion_and_a_strategy_its_short_names() {
    let err = |args: &[&str]| {
        let out = unmask(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    assert_eq!(
        err(&["trace", "--promt", "hi"]),
        "unmask: error: unexpected argument '--promt' found; did you mean --prompt? (see --help)\n"
    );
    let e = err(&["trace", "--strategy", "fast"]);
    assert!(e.contains("[possible values: sequential, low_confidence_static, low_confidence_dynamic, entropy_bounded, joint_threshold] (short names: static = low_confidence_static, dynamic = low_confidence_dynamic, entropy = entropy_bounded, joint = joint_threshold, edit = joint_threshold) (see --help)"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    // a flag whose values have no other names lists only the values
    let e = err(&["trace", "--dtype", "x"]);
    assert!(e.ends_with("[possible values: auto, f32, bf16, f16] (see --help)\n"), "{e}");
}

#[test]
fn ignore_eos_decodes_to_the_length_and_says_so_in_the_header() {
    let events = trace(&["--ignore-eos"]);
    let Event::Header(h) = &events[0] else { panic!() };
    assert!(h.eos_ids.is_empty());
    assert!(h.sources["eos"].starts_with("ignored (--ignore-eos): "), "{:?}", h.sources);
    let Some(Event::Finish(f)) = events.last() else { panic!() };
    assert_eq!((f.reason, f.output_ids.len()), (unmask::trace::events::FinishReason::Length, 24));
}

#[test]
fn a_stop_text_ends_the_output_and_is_recorded() {
    let all = trace(&[]);
    let Some(Event::Finish(whole)) = all.last() else { panic!() };
    // a text the decode writes in its second half: the output ends where it is completed
    let at = whole.text.len() / 2;
    let at = (at..whole.text.len()).find(|&i| whole.text.is_char_boundary(i)).unwrap();
    let stop: String = whole.text[at..].chars().take(3).collect();
    let cut = trace(&["--stop", &stop]);
    let Event::Header(h) = &cut[0] else { panic!() };
    assert_eq!(h.settings.stop, vec![stop.clone()]);
    let Some(Event::Finish(f)) = cut.last() else { panic!() };
    assert_eq!(f.reason, unmask::trace::events::FinishReason::Stop);
    let end = whole.text.find(&stop).unwrap() + stop.len();
    assert!(f.text.len() >= end && f.text.contains(&stop), "{:?} in {:?}", stop, f.text);
    assert!(whole.text.starts_with(&f.text), "{:?} then {:?}", f.text, whole.text);
    let out = unmask(&["trace", "--stop", "", "--prompt", "x"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "unmask: error: --stop \"\": an empty text would end every output before its first token"
    );
}

#[test]
fn chat_template_renders_the_prompt_with_the_file_given() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.jinja");
    std::fs::write(&file, "<<{{ messages[-1].content }}>>").unwrap();
    let events = trace(&["--chat-template", file.to_str().unwrap()]);
    let Event::Header(h) = &events[0] else { panic!() };
    assert_eq!(h.prompt, "<<The cat sat>>");
    assert_eq!(h.sources["chat_template"], file.display().to_string());
    let missing = dir.path().join("none.jinja");
    let out = unmask(&["trace", "--chat-template", missing.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "unmask: error: --chat-template {}: does not exist",
            missing.display()
        )),
        "{err}"
    );
    std::fs::write(&file, "{% for %}").unwrap();
    let out = unmask(&["trace", "--chat-template", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with(&format!("unmask: error: {}", file.display())), "{err}");
}

#[test]
fn steps_over_the_block_length_are_capped_and_said_once() {
    let model = fixture("tiny-random");
    let out = unmask(&[
        "trace",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "Hi",
        "--max-new-tokens",
        "8",
        "--block-length",
        "4",
        "--steps",
        "8",
        "--strategy",
        "low_confidence_static",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim(),
        "unmask: steps 8 is more than a block's 4 positions: each block takes at most 4 steps"
    );
    let events: Vec<Event> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(events.iter().all(|e| !matches!(e, Event::Block(b) if b.steps > 4)));
}
