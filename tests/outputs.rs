//! Recorded data is never lost (issue 19, class 3): an output that is an input, through any
//! link, or another output is refused with one line and nothing is touched; an interrupted
//! `record` and `trace --out` still leave a whole trace and a whole cast.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use unmask::events::{Event, FinishReason};

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
        refused(&["export", s(&a), "--out", s(out)], &format!("{}: --out would overwrite the trace ({})", s(out), s(&a)));
        refused(&["replay", s(&a), "--cast", s(out)], &format!("{}: --cast would overwrite the trace", s(out)));
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
    refused(&["record", "--model", MODEL, "--cast", s(&o), "--trace", s(&o)], "--trace and --cast are the same file");
    assert!(!o.exists(), "nothing was written");
    let (a, bytes) = input(d.path());
    std::fs::create_dir(d.path().join("sub")).unwrap();
    refused(&["record", "--model", MODEL, "--cast", s(&a), "--trace", s(&d.path().join("sub/../a.jsonl"))], "same file");
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
    unmask::cast::parse(&std::fs::read_to_string(&cast).unwrap()).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
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
    let ok = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().unwrap();
    assert!(ok.success());
    let t0 = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "took {:?} to stop", t0.elapsed());
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn spawn(args: &[&str]) -> Child {
    Command::new(BIN).current_dir(root()).args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()
}

/// A long decode: one token per block, 1000 of them (tens of seconds).
const LONG: [&str; 8] = ["--model", MODEL, "--max-new-tokens", "1000", "--block-length", "1", "--steps", "1"];

/// The trace read back whole, ending on a `cancelled` finish.
fn cancelled_trace(p: &Path) -> Vec<Event> {
    let t = unmask::trace::read_file(p).unwrap();
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
        let (header, frames) = unmask::cast::parse(&std::fs::read_to_string(&cast).unwrap()).unwrap();
        assert_eq!(header.version, 2);
        assert!(frames.len() > 3, "{} frames", frames.len());
        assert!(frames.iter().any(|f| f.2.contains("cancelled")), "the last screen says the decode was cancelled");
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
