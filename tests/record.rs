//! `unmask record` and `unmask replay --cast`: the cast parses (a header of the asked size,
//! every line JSON, times that never go back), and playing its output through a terminal
//! emulator (vt100) ends on exactly the TUI's final screen of the same decode.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use unmask::tui::cast;
use unmask::tui::record::{final_app, Pacing};

const BIN: &str = env!("CARGO_BIN_EXE_unmask");
const MODEL: &str = "tests/fixtures/tiny-random";
const TRACE: &str = "tests/fixtures/traces/tiny-dynamic.jsonl";
const W: u16 = 100;
const H: u16 = 32;
/// A private-use character, one cell wide, that no token here spells.
const STAND_IN: &str = "\u{e000}";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn unmask(args: &[&str]) -> Output {
    let out = Command::new(BIN).current_dir(root()).args(args).output().expect("running unmask");
    assert!(out.status.success(), "unmask {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Parses a cast, checks its header and times, and returns the screen its output leaves.
fn play(path: &Path, w: u16, h: u16) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    for (i, line) in text.lines().enumerate() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
    }
    let (header, events) = cast::parse(&text).unwrap();
    assert_eq!((header.version, header.width, header.height), (2, w, h));
    assert!(header.timestamp > 0 && !header.title.is_empty());
    assert!(events.len() > 3, "{} events", events.len());
    assert!(events.windows(2).all(|p| p[0].0 <= p[1].0), "times go backwards");
    assert!(events.iter().all(|e| e.1 == "o"));
    let mut vt = vt100::Parser::new(h, w, 0);
    for (_, _, data) in &events {
        // vt100 drops U+FFFD (it stands for its own decoding errors) where a terminal prints
        // it one cell wide, as tokens of partial UTF-8 do: pass it through a stand-in.
        vt.process(data.replace('\u{fffd}', STAND_IN).as_bytes());
    }
    vt.screen().rows(0, w).map(|r| r.trim_end().replace(STAND_IN, "\u{fffd}")).collect()
}

/// The buffer's text row by row, skipping the cells hidden under wide characters, as a
/// terminal shows them.
fn buffer_rows(buf: &Buffer) -> Vec<String> {
    buf.content
        .chunks(buf.area.width as usize)
        .map(|row| {
            let (mut line, mut skip) = (String::new(), 0);
            for c in row {
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                line.push_str(c.symbol());
                skip = unicode_width::UnicodeWidthStr::width(c.symbol()).saturating_sub(1);
            }
            line.trim_end().to_string()
        })
        .collect()
}

/// The TUI's final screen for the trace at `trace`, as `record` labels it (`None`: a live
/// decode, recorded).
fn final_screen(trace: &Path, label: Option<&str>, stopped: bool, w: u16, h: u16) -> Vec<String> {
    let t = unmask::trace::file::read_file(trace).unwrap();
    assert_eq!(t.stopped.is_some(), stopped);
    let p = Pacing {
        fps: 30.0,
        step_delay: 0.05,
        width: w,
        height: h,
        theme: &unmask::tui::theme::DARK,
    };
    let app = final_app(t.events, label.map(str::to_string), t.stopped, &p);
    let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
    unmask::tui::render(&app, buf.area, &mut buf);
    buffer_rows(&buf)
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn record_writes_a_cast_that_replays_to_the_final_screen() {
    let dir = tmp();
    let (cast_path, trace): (PathBuf, PathBuf) =
        (dir.path().join("out.cast"), dir.path().join("t.jsonl"));
    let (c, t) = (cast_path.to_str().unwrap(), trace.to_str().unwrap());
    let args = [
        "record",
        "--model",
        MODEL,
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        "24",
        "--cast",
        c,
        "--trace",
        t,
    ];
    unmask(&[&args[..], &["--width", "100", "--height", "32"]].concat());
    let played = play(&cast_path, W, H);
    let expected = final_screen(&trace, None, false, W, H);
    assert_eq!(
        played,
        expected,
        "cast screen:\n{}\nTUI screen:\n{}",
        played.join("\n"),
        expected.join("\n")
    );
    assert!(played.iter().any(|l| l.contains("finished")), "{}", played.join("\n"));
    // A live decode, recorded: not a replay, and not of the cast it is written to.
    assert!(
        played[0].contains("· recorded")
            && !played[0].contains("replay")
            && !played[0].contains("out.cast"),
        "{}",
        played[0]
    );
    // The check can fail: the same decode at another size is another screen.
    assert_ne!(played, final_screen(&trace, None, false, W - 10, H));
    assert!(
        std::panic::catch_unwind(|| play(&cast_path, W + 1, H)).is_err(),
        "a header of another size fails"
    );
}

#[test]
fn replay_cast_paces_by_step_delay_and_fps() {
    let dir = tmp();
    let path = dir.path().join("r.cast");
    let c = path.to_str().unwrap();
    // 0.01 s a step at 20 fps: at most one frame every 0.05 s, so steps are coalesced.
    unmask(&[
        "replay",
        TRACE,
        "--cast",
        c,
        "--width",
        "100",
        "--height",
        "32",
        "--step-delay",
        "0.01",
        "--fps",
        "20",
    ]);
    assert_eq!(play(&path, W, H), final_screen(Path::new(TRACE), Some(TRACE), false, W, H));
    let (_, events) = cast::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let times: Vec<f64> = events.iter().map(|e| e.0).collect();
    let frames = &times[..times.len() - 1];
    assert!(frames.windows(2).all(|p| p[1] - p[0] >= 0.05 - 1e-6), "{times:?}");
    let steps = unmask::trace::file::read_file(Path::new(TRACE))
        .unwrap()
        .events
        .iter()
        .filter(|e| matches!(e, unmask::trace::events::Event::Step(_)))
        .count();
    assert!(frames.len() < steps, "{} frames for {steps} steps", frames.len());
    assert!(
        events[0].2.starts_with("\x1b[0m\x1b[2J\x1b[H\x1b[?25l"),
        "the first frame clears the screen"
    );
    assert!(times.last().unwrap() - frames.last().unwrap() >= 1.0, "a hold at the end");
}

#[test]
fn a_corrupt_trace_records_up_to_its_last_good_event_and_warns() {
    let dir = tmp();
    let text = std::fs::read_to_string(root().join(TRACE)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, format!("{}\n{{oops\n", lines[..6].join("\n"))).unwrap();
    let path = dir.path().join("bad.cast");
    let args =
        ["replay", bad.to_str().unwrap(), "--cast", path.to_str().unwrap(), "--width", "100"];
    let out =
        Command::new(BIN).current_dir(root()).args(args).args(["--height", "32"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // the cast is written, and the status says the trace was cut
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.ends_with("; recorded the events before it\n"), "{err}");
    assert!(err.contains(&format!("{}:7", bad.display())), "{err}");
    assert_eq!(play(&path, W, H), final_screen(&bad, Some(bad.to_str().unwrap()), true, W, H));
}

#[test]
fn bad_pacing_is_refused() {
    let out = Command::new(BIN)
        .current_dir(root())
        .args(["replay", TRACE, "--cast", "/dev/null", "--fps", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--fps"));
}

#[test]
fn pacing_that_would_write_timestamps_no_player_reads_is_refused() {
    for (flag, value) in
        [("--step-delay", "1e308"), ("--fps", "1e-300"), ("--fps", "NaN"), ("--step-delay", "-1")]
    {
        let out = Command::new(BIN)
            .current_dir(root())
            .args(["replay", TRACE, "--cast", "/dev/null", flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}: {err}");
        assert!(
            err.starts_with(&format!("unmask: error: {flag} must be within"))
                && err.lines().count() == 1,
            "{err}"
        );
    }
}

/// A cast is drawn as the TUI would draw it with the same look flags: `--mono` and NO_COLOR
/// without a colour (and with the step marks that carry what colour would), `--theme light`
/// in its own colours. (They were ignored, and NO_COLOR's empty colour codes reset bold and
/// reverse.)
#[test]
fn casts_take_the_look_flags() {
    let d = tmp();
    let cast = |name: &str, env: Option<(&str, &str)>, flags: &[&str]| {
        let path = d.path().join(name);
        let mut cmd = Command::new(BIN);
        cmd.current_dir(root())
            .args(["replay", TRACE, "--cast", path.to_str().unwrap()])
            .args(flags)
            .env_remove("COLORTERM")
            .env_remove("NO_COLOR");
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        assert!(cmd.output().unwrap().status.success());
        std::fs::read_to_string(path).unwrap()
    };
    // (the cast's JSON spells ESC as \u001b)
    let dark = cast("dark.cast", None, &[]);
    let coloured = |c: &str| c.contains("\\u001b[38;5;") || c.contains("\\u001b[38;2;");
    assert!(coloured(&dark), "colour by default");
    assert!(
        dark.contains("\\u001b[38;2;"),
        "24-bit whatever terminal records it (COLORTERM is not set here)"
    );
    for mono in
        [cast("mono.cast", None, &["--mono"]), cast("nocolor.cast", Some(("NO_COLOR", "1")), &[])]
    {
        assert!(!coloured(&mono) && !mono.contains("\\u001b[;m"), "no colour codes, empty or not");
        assert!(mono.contains('¹') && mono.contains('²'), "step marks");
    }
    assert_ne!(cast("light.cast", None, &["--theme", "light"]), dark);
}

/// A trace with token edits (the synthetic editing fixture): the cast shows the edits as the
/// TUI does, frame by frame (the post-edit step's timeline and its edited cells) and on the
/// final screen, which is exactly the TUI's.
#[test]
fn a_cast_of_a_trace_with_edits_shows_them_as_the_tui_does() {
    let trace = "tests/fixtures/traces/edits.jsonl";
    let dir = tmp();
    let path = dir.path().join("edits.cast");
    let c = path.to_str().unwrap();
    // A second a step: one frame per step.
    unmask(&[
        "replay",
        trace,
        "--cast",
        c,
        "--width",
        "100",
        "--height",
        "32",
        "--step-delay",
        "1",
    ]);
    let played = play(&path, W, H);
    assert_eq!(played, final_screen(Path::new(trace), Some(trace), false, W, H));
    assert!(played.iter().any(|l| l.contains("✎ edited")), "{}", played.join("\n"));
    let (_, events) = cast::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut vt = vt100::Parser::new(H, W, 0);
    let frames: Vec<String> = events
        .iter()
        .map(|(_, _, data)| {
            vt.process(data.as_bytes());
            vt.screen().contents()
        })
        .collect();
    // The eighth frame is block 2's post-edit step: two cells edited, the timeline says so;
    // the one before holds position 10's first token still.
    assert!(frames[7].contains("post-edit ✎2") && frames[7].contains("✎,"), "{}", frames[7]);
    assert!(!frames[6].contains("✎,") && frames[6].contains("⇥"), "{}", frames[6]);
}
