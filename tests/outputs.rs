//! Recorded data is never lost: an output that is an input, through any
//! link, or another output is refused with one line and nothing is touched; an interrupted
//! `record` and `trace --out` still leave a whole trace and a whole cast.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use unmask::trace::events::{Event, FinishReason};

const BIN: &str = env!("CARGO_BIN_EXE_unmask");
const TRACE: &str = "tests/fixtures/traces/tiny-dynamic.jsonl";
const MODEL: &str = "tests/fixtures/tiny-random";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn unmask(args: &[&str]) -> Output {
    Command::new(BIN).current_dir(root()).args(args).output().expect("running unmask")
}

/// A copy of the fixture trace in a fresh folder.
fn input(dir: &Path) -> (PathBuf, Vec<u8>) {
    let bytes = std::fs::read(root().join(TRACE)).unwrap();
    let p = dir.join("a.jsonl");
    std::fs::write(&p, &bytes).unwrap();
    (p, bytes)
}

/// Runs `args`, expecting a one-line error that contains `want`.
fn refused(args: &[&str], want: &str) {
    let out = unmask(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("unmask: error: ") && err.contains(want), "{args:?}: {err}");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn an_output_that_is_the_input_is_refused_through_any_link() {
    let d = tempfile::tempdir().unwrap();
    let (a, bytes) = input(d.path());
    let link = d.path().join("link.csv");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let hard = d.path().join("hard.csv");
    std::fs::hard_link(&a, &hard).unwrap();
    for out in [&a, &link, &hard] {
        refused(
            &["export", s(&a), "--out", s(out)],
            &format!("{}: --out would overwrite the trace ({})", s(out), s(&a)),
        );
        refused(
            &["replay", s(&a), "--cast", s(out)],
            &format!("{}: --cast would overwrite the trace", s(out)),
        );
    }
    // The input through a link, the output by its own name: the same file.
    refused(&["export", s(&link), "--out", s(&a)], "--out would overwrite the trace");
    assert_eq!(std::fs::read(&a).unwrap(), bytes, "the input is untouched");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
}

#[test]
fn record_refuses_one_file_for_both_outputs_before_decoding() {
    let d = tempfile::tempdir().unwrap();
    let o = d.path().join("o");
    refused(
        &["record", "--model", MODEL, "--cast", s(&o), "--trace", s(&o)],
        "--trace and --cast are the same file",
    );
    assert!(!o.exists(), "nothing was written");
    let (a, bytes) = input(d.path());
    std::fs::create_dir(d.path().join("sub")).unwrap();
    refused(
        &[
            "record",
            "--model",
            MODEL,
            "--cast",
            s(&a),
            "--trace",
            s(&d.path().join("sub/../a.jsonl")),
        ],
        "same file",
    );
    assert_eq!(std::fs::read(&a).unwrap(), bytes);
}

#[test]
fn export_and_replay_cast_write_whole_files_and_leave_no_temporary() {
    let d = tempfile::tempdir().unwrap();
    let (a, _) = input(d.path());
    let csv = d.path().join("t.csv");
    std::fs::write(&csv, "old").unwrap();
    let out = unmask(&["export", s(&a), "--format", "csv", "--out", s(&csv)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read_to_string(&csv).unwrap().starts_with("pos,index,"));
    let cast = d.path().join("t.cast");
    let out = unmask(&["replay", s(&a), "--cast", s(&cast)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    unmask::tui::cast::parse(&std::fs::read_to_string(&cast).unwrap()).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["a.jsonl", "t.cast", "t.csv"]);
}

/// Starts a long decode writing `files`, waits until its trace has `lines` lines, then sends
/// `signal`; returns the exit status and stderr.
fn interrupt(mut child: Child, trace: &Path, lines: usize, signal: &str) -> (Option<i32>, String) {
    let start = Instant::now();
    while std::fs::read_to_string(trace).map_or(0, |t| t.lines().count()) < lines {
        assert!(start.elapsed() < Duration::from_secs(60), "the trace never grew");
        assert!(child.try_wait().unwrap().is_none(), "the decode ended before the signal");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let t0 = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "took {:?} to stop", t0.elapsed());
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn spawn(args: &[&str]) -> Child {
    Command::new(BIN)
        .current_dir(root())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A long decode: one token per block, 1000 of them (tens of seconds).
const LONG: [&str; 8] =
    ["--model", MODEL, "--max-new-tokens", "1000", "--block-length", "1", "--steps", "1"];

/// The trace read back whole, ending on a `cancelled` finish.
fn cancelled_trace(p: &Path) -> Vec<Event> {
    let t = unmask::trace::file::read_file(p).unwrap();
    assert_eq!(t.stopped, None, "the trace is whole");
    match t.events.last() {
        Some(Event::Finish(f)) => assert_eq!(f.reason, FinishReason::Cancelled),
        e => panic!("the trace ends on {e:?}"),
    }
    t.events
}

#[test]
fn an_interrupted_record_leaves_a_whole_trace_and_cast() {
    for signal in ["INT", "TERM"] {
        let d = tempfile::tempdir().unwrap();
        let (cast, trace) = (d.path().join("c.cast"), d.path().join("c.jsonl"));
        let mut args = vec!["record", "--cast", s(&cast), "--trace", s(&trace)];
        args.extend(LONG);
        let (code, err) = interrupt(spawn(&args), &trace, 40, signal);
        let want = if signal == "INT" { 130 } else { 143 };
        assert_eq!(code, Some(want), "{err}");
        assert_eq!(err.trim(), format!("unmask: interrupted by SIG{signal}"));
        let events = cancelled_trace(&trace);
        let steps = events.iter().filter(|e| matches!(e, Event::Step(_))).count();
        assert!(steps >= 20, "{steps} steps");
        // The cast is a valid asciicast of those steps, ending on the final screen.
        let (header, frames) =
            unmask::tui::cast::parse(&std::fs::read_to_string(&cast).unwrap()).unwrap();
        assert_eq!(header.version, 2);
        assert!(frames.len() > 3, "{} frames", frames.len());
        assert!(
            frames.iter().any(|f| f.2.contains("cancelled")),
            "the last screen says the decode was cancelled"
        );
    }
}

#[test]
fn an_interrupted_trace_out_ends_on_its_finish_event() {
    let d = tempfile::tempdir().unwrap();
    let trace = d.path().join("t.jsonl");
    let mut args = vec!["trace", "--out", s(&trace)];
    args.extend(LONG);
    let (code, err) = interrupt(spawn(&args), &trace, 10, "HUP");
    assert_eq!(code, Some(129), "{err}");
    cancelled_trace(&trace);
}

/// A copy of the fixture checkpoint in `dir/ckpt`.
fn copy_checkpoint(dir: &Path) -> PathBuf {
    let c = dir.join("ckpt");
    std::fs::create_dir(&c).unwrap();
    for f in std::fs::read_dir(root().join(MODEL)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, c.join(f.file_name().unwrap())).unwrap();
    }
    c
}

/// Every file of `dir`, by name, with its bytes.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    v
}

/// `trace --model c --out c/model.safetensors` destroyed the checkpoint (exit 0); so did
/// `--out p.txt` of `--prompt-file p.txt`. Every output of a command that decodes is refused
/// before anything loads, when it is the prompt file or a file of the checkpoint folder.
#[test]
fn a_decode_output_that_is_one_of_its_inputs_is_refused_before_loading() {
    let d = tempfile::tempdir().unwrap();
    let c = copy_checkpoint(d.path());
    let before = contents(&c);
    let prompt = d.path().join("p.txt");
    std::fs::write(&prompt, "hello").unwrap();
    let cast = d.path().join("x.cast");
    let model = ["--model", s(&c), "--max-new-tokens", "8"];
    for name in ["model.safetensors", "config.json", "tokenizer.json"] {
        let f = c.join(name);
        // by another spelling of the same path, and through a symlink
        let dotted = c.join("..").join("ckpt").join(name);
        let link = d.path().join(format!("link-{name}"));
        std::os::unix::fs::symlink(&f, &link).unwrap();
        for out in [&f, &dotted, &link] {
            let want = |flag: &str| {
                format!("{}: {flag} would overwrite the checkpoint file ({})", s(out), s(&f))
            };
            refused(&[&["trace"][..], &model, &["--out", s(out)]].concat(), &want("--out"));
            refused(&[&["record"][..], &model, &["--cast", s(out)]].concat(), &want("--cast"));
            refused(
                &[&["record"][..], &model, &["--cast", s(&cast), "--trace", s(out)]].concat(),
                &want("--trace"),
            );
            refused(&[&["bench"][..], &model, &["--json", s(out)]].concat(), &want("--json"));
        }
    }
    assert_eq!(contents(&c), before, "the checkpoint is untouched");
    let p = ["--prompt-file", s(&prompt)];
    let want = |flag: &str| {
        format!("{}: {flag} would overwrite the --prompt-file ({})", s(&prompt), s(&prompt))
    };
    refused(&[&["trace"][..], &model, &p, &["--out", s(&prompt)]].concat(), &want("--out"));
    refused(&[&["record"][..], &model, &p, &["--cast", s(&prompt)]].concat(), &want("--cast"));
    refused(
        &[&["record"][..], &model, &p, &["--cast", s(&cast), "--trace", s(&prompt)]].concat(),
        &want("--trace"),
    );
    // the embedded model: only the prompt file is an input
    refused(&["trace", "--prompt-file", s(&prompt), "--out", s(&prompt)], &want("--out"));
    assert_eq!(std::fs::read_to_string(&prompt).unwrap(), "hello");
    assert!(!cast.exists());
    // A new file in the checkpoint's folder is no input.
    let out = unmask(&[&["trace"][..], &model, &["--out", s(&c.join("new.jsonl"))]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A hub id's snapshot holds symlinks into `blobs/`: an output that is a blob, or a snapshot
/// link, is the checkpoint's file.
#[test]
fn an_output_into_a_hub_snapshot_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let repo = d.path().join("models--test--tiny");
    let hash = "0123456789abcdef0123456789abcdef01234567";
    let snap = repo.join("snapshots").join(hash);
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(repo.join("refs/main"), hash).unwrap();
    for (i, f) in std::fs::read_dir(root().join(MODEL)).unwrap().enumerate() {
        let f = f.unwrap().path();
        let blob = repo.join("blobs").join(format!("b{i}"));
        std::fs::copy(&f, &blob).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/b{i}"), snap.join(f.file_name().unwrap()))
            .unwrap();
    }
    let run = |out: &Path| {
        Command::new(BIN)
            .current_dir(root())
            .env("HF_HUB_CACHE", d.path())
            .args(["trace", "--model", "test/tiny", "--max-new-tokens", "8", "--out", s(out)])
            .output()
            .unwrap()
    };
    let ok = run(&d.path().join("t.jsonl"));
    assert!(
        ok.status.success(),
        "the hub checkpoint decodes: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let blobs = contents(&repo.join("blobs"));
    let target = std::fs::canonicalize(snap.join("model.safetensors")).unwrap();
    for out in [snap.join("model.safetensors"), target.clone()] {
        let o = run(&out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains("--out would overwrite the checkpoint file")
                && err.contains("model.safetensors"),
            "{err}"
        );
    }
    assert_eq!(contents(&repo.join("blobs")), blobs, "no blob was touched");
}

/// `--cast` was only tried after the whole decode and render: a folder, a missing folder
/// lost the decode. Refused before the checkpoint loads, as the trace is not even created.
#[test]
fn record_checks_its_cast_before_decoding() {
    let d = tempfile::tempdir().unwrap();
    let trace = d.path().join("t.jsonl");
    let missing = d.path().join("no/such/x.cast");
    for (cast, want) in [
        (d.path().to_path_buf(), format!("--cast {}: is a folder; name a file", s(d.path()))),
        (missing.clone(), format!("--cast {}: the folder", s(&missing))),
    ] {
        let mut args = vec!["record", "--cast", s(&cast), "--trace", s(&trace)];
        args.extend(LONG);
        let t0 = Instant::now();
        refused(&args, &want);
        assert!(t0.elapsed() < Duration::from_secs(5), "refused after {:?}", t0.elapsed());
        assert!(!trace.exists(), "refused before the decode started");
    }
}

/// Every output a decode or an export writes is checked by its flag before the work:
/// `trace --out DIR/` said `DIR/: cannot create: Is a directory` after loading the model.
#[test]
fn every_output_is_checked_by_its_flag_before_the_work() {
    let d = tempfile::tempdir().unwrap();
    let dir = s(d.path());
    let missing = d.path().join("no/x.jsonl");
    let cast = d.path().join("x.cast");
    let trace = root().join("tests/fixtures/traces/tiny-dynamic.jsonl");
    refused(
        &[&["trace", "--out", dir][..], &LONG[..]].concat(),
        &format!("--out {dir}: is a folder; name a file"),
    );
    refused(
        &[&["trace", "--out", s(&missing)][..], &LONG[..]].concat(),
        &format!("--out {}: the folder", s(&missing)),
    );
    refused(
        &[&["record", "--cast", s(&cast), "--trace", dir][..], &LONG[..]].concat(),
        &format!("--trace {dir}: is a folder; name a file"),
    );
    assert!(!cast.exists(), "refused before the decode");
    refused(
        &["export", s(&trace), "--out", dir],
        &format!("--out {dir}: is a folder; name a file"),
    );
}

/// A signal once the decode is done, while the cast renders, cut the run short and deleted
/// the cast's temporary file: no cast. Now rendering stops and the frames so far are a whole
/// cast and a whole GIF; the trace (written during the decode) is whole too.
#[test]
fn a_signal_while_the_cast_renders_still_leaves_a_whole_cast() {
    let d = tempfile::tempdir().unwrap();
    let (cast, trace) = (d.path().join("c.cast"), d.path().join("c.jsonl"));
    let gif = d.path().join("c.gif");
    let mut args = vec!["record", "--cast", s(&cast), "--gif", s(&gif), "--trace", s(&trace)];
    args.extend(LONG);
    let mut child = spawn(&args);
    // The temporary cast and GIF appear when the rendering starts.
    let rendering = || {
        std::fs::read_dir(d.path())
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".unmask-tmp"))
    };
    let start = Instant::now();
    while !rendering() {
        assert!(start.elapsed() < Duration::from_secs(120), "the rendering never started");
        assert!(child.try_wait().unwrap().is_none(), "the record ended before the signal");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "took {:?} to stop", t0.elapsed());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{err}");
    assert_eq!(err.trim(), "unmask: interrupted by SIGTERM");
    let t = unmask::trace::file::read_file(&trace).unwrap();
    assert!(
        matches!(t.events.last(), Some(Event::Finish(f)) if f.reason != FinishReason::Cancelled),
        "the decode had finished"
    );
    let (header, frames) =
        unmask::tui::cast::parse(&std::fs::read_to_string(&cast).expect("a cast")).unwrap();
    assert_eq!(header.version, 2);
    assert!(!frames.is_empty());
    assert_eq!(
        frames.last().unwrap().2,
        "\x1b[0m\x1b[?25h",
        "the cast ends by showing the cursor again"
    );
    // The GIF: every frame reads, and the file ends with its trailer.
    let bytes = std::fs::read(&gif).expect("a GIF");
    assert_eq!(bytes.last(), Some(&0x3b), "the GIF's trailer");
    let mut decoder = gif::DecodeOptions::new().read_info(bytes.as_slice()).unwrap();
    let mut shown = 0;
    while decoder.read_next_frame().unwrap().is_some() {
        shown += 1;
    }
    assert!(
        shown >= 1 && shown <= frames.len(),
        "{shown} GIF frames, {} cast events",
        frames.len()
    );
    assert!(!rendering(), "no temporary file left");
}

/// `-` as an output wrote a file named `-`; it is stdout, as `-` is stdin for the inputs.
#[test]
fn a_dash_output_is_stdout() {
    let d = tempfile::tempdir().unwrap();
    let (a, _) = input(d.path());
    let model = root().join(MODEL);
    let run = |args: &[&str]| {
        let out = Command::new(BIN).current_dir(d.path()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let traced = run(&["trace", "--model", s(&model), "--max-new-tokens", "8", "--out", "-"]);
    assert!(String::from_utf8(traced).unwrap().lines().last().unwrap().contains("\"finish\""));
    let csv = run(&["export", s(&a), "--out", "-"]);
    assert!(String::from_utf8(csv).unwrap().starts_with("pos,index,"));
    let cast = run(&["record", "--model", s(&model), "--max-new-tokens", "8", "--cast", "-"]);
    let (_, frames) = unmask::tui::cast::parse(&String::from_utf8(cast).unwrap()).unwrap();
    assert!(frames.len() > 2);
    let cast = run(&["replay", s(&a), "--cast", "-"]);
    unmask::tui::cast::parse(&String::from_utf8(cast).unwrap()).unwrap();
    assert!(!d.path().join("-").exists(), "no file named -");
    let out = Command::new(BIN)
        .current_dir(d.path())
        .args(["record", "--cast", "-", "--trace", "-"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "unmask: error: --trace - and --cast - would both write to stdout; give one of them a file"
    );
}

/// The shortest `bench` that still times one decode (the embedded model unless told).
const QUICK_BENCH: [&str; 13] = [
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
    "1",
    "--events",
    "off",
];

/// `bench --json` and `check-device --json` are outputs like the others: checked before the
/// work (a folder, a missing folder, `-`, which would mix into the results on stdout), then
/// written whole through a temporary file.
#[test]
fn json_reports_are_checked_first_and_written_whole() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("no/such/r.json");
    let bench = QUICK_BENCH;
    let device = ["check-device", "--model", MODEL];
    for cmd in [&bench[..], &device[..]] {
        let name = cmd[0];
        refused(
            &[cmd, &["--json", s(d.path())]].concat(),
            &format!("--json {}: is a folder; name a file", s(d.path())),
        );
        refused(
            &[cmd, &["--json", s(&missing)]].concat(),
            &format!("--json {}: the folder", s(&missing)),
        );
        refused(
            &[cmd, &["--json", "-"]].concat(),
            &format!("--json -: {name} prints its results on stdout; name a file for the JSON"),
        );
    }
    let json = d.path().join("r.json");
    std::fs::write(&json, "old").unwrap();
    let out = unmask(&[&bench[..], &["--json", s(&json)]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["rows"].as_array().map(Vec::len), Some(1), "{report}");
    let names: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["r.json"], "no temporary file left");
}

/// `bench` reports the load against one read of the checkpoint's files in the same run: in
/// its table's heading and in the JSON, with the files' real size.
#[test]
fn bench_reports_the_load_against_a_read_of_the_files() {
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("r.json");
    let out = unmask(&[&QUICK_BENCH[..], &["--model", MODEL, "--json", s(&json)]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("# load: ")).expect("a load line");
    assert!(line.contains("GB of checkpoint files") && line.contains("x the read"), "{line}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let size =
        std::fs::metadata(std::path::Path::new(MODEL).join("model.safetensors")).unwrap().len();
    assert_eq!(report["load"]["from"], "files", "{report}");
    assert_eq!(report["load"]["file_bytes"].as_u64(), Some(size), "{report}");
    assert!(report["load"]["read_s"].as_f64().is_some_and(|r| r > 0.0), "{report}");
    // random weights have no files to read
    let out = unmask(&[&QUICK_BENCH[..], &["--random-init", "tiny"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("# load: random weights made in "));
}

/// An output that is a symbolic link (to a file, or to nothing yet) is refused by every command
/// that writes one, before any work, naming the flag and where the link points: writing
/// through it truncated its target, as the shell's `>` does. The process's own descriptors
/// (`/dev/stdout`) are written in place, whatever the shell opened.
#[test]
fn an_output_that_is_a_symlink_is_refused_by_every_command() {
    let d = tempfile::tempdir().unwrap();
    let (a, _) = input(d.path());
    let precious = d.path().join("precious.txt");
    std::fs::write(&precious, "keep me").unwrap();
    let to_file = d.path().join("out-link");
    std::os::unix::fs::symlink(&precious, &to_file).unwrap();
    let dangling = d.path().join("new-link");
    std::os::unix::fs::symlink(d.path().join("elsewhere.txt"), &dangling).unwrap();
    let cast = d.path().join("c.cast");
    let model = ["--model", MODEL, "--max-new-tokens", "8"];
    for link in [&to_file, &dangling] {
        let to = std::fs::read_link(link).unwrap();
        let want = |flag: &str| {
            format!(
                "{flag} {}: is a symbolic link (to {}); outputs are not written through links: name the file itself, or remove the link",
                s(link),
                s(&to)
            )
        };
        refused(&[&["trace"][..], &model, &["--out", s(link)]].concat(), &want("--out"));
        refused(&[&["record"][..], &model, &["--cast", s(link)]].concat(), &want("--cast"));
        refused(
            &[&["record"][..], &model, &["--cast", s(&cast), "--trace", s(link)]].concat(),
            &want("--trace"),
        );
        refused(&["export", s(&a), "--out", s(link)], &want("--out"));
        refused(&["replay", s(&a), "--cast", s(link)], &want("--cast"));
        refused(&[&["bench"][..], &model, &["--json", s(link)]].concat(), &want("--json"));
        assert!(std::fs::symlink_metadata(link).unwrap().file_type().is_symlink());
    }
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    assert!(!d.path().join("elsewhere.txt").exists() && !cast.exists());
    // `--out /dev/stdout` with stdout a file: that file
    let file = d.path().join("stdout.csv");
    let out = Command::new(BIN)
        .current_dir(root())
        .args(["export", s(&a), "--out", "/dev/stdout"])
        .stdout(std::fs::File::create(&file).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read_to_string(&file).unwrap().starts_with("pos,index,"));
}
