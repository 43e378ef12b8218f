//! End to end: the real binary in a detached tmux session of fixed size, driven by keys sent
//! with `send-keys` and read back with `capture-pane`. Each test has its own tmux server
//! (`-L`), so they run in parallel and never touch a user's tmux.
//!
//! Skipped, with the reason printed, only when tmux is not installed (CI installs it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_unmask");
const MODEL: &str = "tests/fixtures/tiny-random";
const WAIT: Duration = Duration::from_secs(60);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn have_tmux() -> bool {
    let ok = Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED: tmux is not installed (apt-get install tmux)");
    }
    ok
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// One tmux server with one session running `args` (the binary's arguments). The shell
/// prints the exit status after the binary ends and keeps the pane open for us to read it.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(name: &str, args: &[&str], size: (u16, u16)) -> Tmux {
        Tmux::start_env(name, &[], args, size)
    }

    fn start_env(name: &str, env: &[(&str, &str)], args: &[&str], size: (u16, u16)) -> Tmux {
        let socket = format!("unmask-e2e-{name}-{}", std::process::id());
        let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}={}", quote(v))).collect();
        let cmd: Vec<String> =
            std::iter::once(BIN).chain(args.iter().copied()).map(quote).collect();
        let shell = format!("{} {}; echo EXIT=$?; sleep 600", vars.join(" "), cmd.join(" "));
        let t = Tmux { socket };
        let (w, h) = (size.0.to_string(), size.1.to_string());
        let dir = root().display().to_string();
        t.tmux(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "e2e",
            "-x",
            &w,
            "-y",
            &h,
            "-c",
            &dir,
            &shell,
        ]);
        t
    }

    fn tmux(&self, args: &[&str]) -> Output {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("running tmux");
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out
    }

    /// Sends keys by tmux's names (`Space`, `Left`, `C-c`, or plain characters).
    fn keys(&self, keys: &[&str]) {
        for k in keys {
            self.tmux(&["send-keys", "-t", "e2e", k]);
        }
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-t", "e2e"]).stdout)
            .into_owned()
    }

    fn alternate_on(&self) -> bool {
        let out = self.tmux(&["display-message", "-p", "-t", "e2e", "#{alternate_on}"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }

    /// Polls the screen until `ok` holds, or fails showing the last screen.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(start.elapsed() < WAIT, "timed out waiting for {what}; the screen:\n{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_text(&self, text: &str) -> String {
        self.wait_for(&format!("{text:?}"), |s| s.contains(text))
    }

    /// Waits for `text`, then until two captures 200 ms apart agree: under load, a capture can
    /// catch the title of a frame whose timeline is one step behind it.
    fn wait_settled(&self, text: &str) -> String {
        let start = Instant::now();
        let mut last = self.wait_text(text);
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = self.screen();
            if now == last {
                return now;
            }
            assert!(start.elapsed() < WAIT, "the screen did not settle; the last:\n{now}");
            last = now;
        }
    }

    /// Quits with `keys` and checks the binary exited 0 with the terminal restored.
    fn quit_cleanly(&self, keys: &[&str]) {
        self.keys(keys);
        let s = self.wait_text("EXIT=");
        assert!(s.contains("EXIT=0"), "non-zero exit:\n{s}");
        assert!(!self.alternate_on(), "still in the alternate screen");
        assert!(
            !s.contains("Blocks") && !s.contains("Timeline"),
            "TUI remnants on the normal screen:\n{s}"
        );
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).output();
    }
}

/// `overall N/M` from the timeline.
fn overall(screen: &str) -> (usize, usize) {
    let at = screen
        .find("overall ")
        .unwrap_or_else(|| panic!("no `overall` on the timeline:\n{screen}"))
        + "overall ".len();
    let field: String =
        screen[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '/').collect();
    let (n, m) = field.split_once('/').expect("N/M");
    (n.parse().unwrap(), m.parse().unwrap())
}

/// `forwards N/M` from the timeline (0 before the first step).
fn forwards(screen: &str) -> usize {
    if screen.contains("no step yet") {
        return 0;
    }
    let at = screen
        .find("forwards ")
        .unwrap_or_else(|| panic!("no `forwards` on the timeline:\n{screen}"))
        + "forwards ".len();
    screen[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
}

/// A live decode whose view follows the head as fast as it goes (`--pace 0`): these tests
/// look at the decode's end, not at its unfolding (see `the_default_pace_unfolds_the_decode`).
fn live_args(max_new: &str) -> Vec<&str> {
    vec!["--model", MODEL, "--prompt", "The cat sat", "--max-new-tokens", max_new, "--pace", "0"]
}

#[test]
fn live_run_pause_step_strategy_restart_quit() {
    if !have_tmux() {
        return;
    }
    let t = Tmux::start("live", &live_args("64"), (120, 40));
    let s = t.wait_settled("finished: ");
    for panel in [
        "Blocks",
        "Text",
        "Inspector",
        "Stats",
        "Timeline",
        "● LIVE",
        "strategy low_confidence_dynamic",
    ] {
        assert!(s.contains(panel), "missing {panel:?}:\n{s}");
    }
    let (n, m) = overall(&s);
    assert_eq!(n, m, "live follows the head");

    t.keys(&["Space"]);
    t.wait_text("PAUSED");
    t.keys(&["h"]);
    let s = t.wait_for("one step back", |s| overall(s) == (m - 1, m));
    assert!(s.contains("1 behind the head"), "{s}");

    t.keys(&["m"]);
    t.wait_text("pending entropy_bounded");
    t.keys(&["R"]);
    let s = t.wait_for("the restarted decode", |s| {
        s.contains("strategy entropy_bounded") && s.contains("finished: ")
    });
    assert!(s.contains("● LIVE"), "a restart follows the new run:\n{s}");

    t.quit_cleanly(&["q"]);
}

#[test]
fn engine_pause_stops_the_decode_and_ctrl_c_quits() {
    if !have_tmux() {
        return;
    }
    // A long decode (one token per block: two forwards a token), paused at once: the key
    // waits in the terminal's input until the UI reads it, a moment after the engine starts.
    let mut args = live_args("1000");
    args.extend(["--block-length", "1", "--steps", "1"]);
    let t = Tmux::start("engine", &args, (120, 40));
    t.keys(&["p"]);
    t.wait_text("engine paused");
    // The engine stops before its next forward pass; give the one under way time to land.
    std::thread::sleep(Duration::from_millis(500));
    let before = forwards(&t.screen());
    std::thread::sleep(Duration::from_millis(1000));
    let s = t.screen();
    assert_eq!(forwards(&s), before, "the engine decoded while paused:\n{s}");
    assert!(s.contains("decoding"), "{s}");
    t.keys(&["p"]);
    t.wait_for("the engine to go on", |s| forwards(s) > before || s.contains("finished: "));
    t.quit_cleanly(&["C-c"]);
}

/// The binary's pid: the pane's shell runs it as its one child.
fn child_pid(t: &Tmux) -> String {
    let out = t.tmux(&["display-message", "-p", "-t", "e2e", "#{pane_pid}"]);
    let shell = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let kids = Command::new("pgrep").args(["-P", &shell]).output().expect("pgrep");
    String::from_utf8_lossy(&kids.stdout).lines().next().expect("the binary runs").to_string()
}

/// The process state letter of /proc/PID/stat (`T`: stopped).
fn state(pid: &str) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().and_then(|rest| rest.trim_start().chars().next()).unwrap_or('?')
}

fn wait_state(pid: &str, want: char) {
    let start = Instant::now();
    while state(pid) != want {
        assert!(
            start.elapsed() < WAIT,
            "process {pid} never reached state {want} (is {})",
            state(pid)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ctrl_z_and_sigtstp_give_the_terminal_back_and_sigcont_draws_it_again() {
    if !have_tmux() {
        return;
    }
    let mut args = live_args("1000");
    args.extend(["--block-length", "1", "--steps", "1"]);
    let t = Tmux::start("suspend", &args, (120, 40));
    t.wait_text("Blocks");
    let pid = child_pid(&t);
    for how in ["C-z", "SIGTSTP"] {
        match how {
            "C-z" => t.keys(&["C-z"]),
            _ => assert!(Command::new("kill").args(["-TSTP", &pid]).status().unwrap().success()),
        }
        wait_state(&pid, 'T');
        assert!(!t.alternate_on(), "{how}: stopped with the alternate screen still on");
        assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
        t.wait_for("the screen back after SIGCONT", |s| {
            s.contains("Blocks") && s.contains("Timeline")
        });
        assert!(t.alternate_on(), "{how}: the TUI is back on the alternate screen");
    }
    // raw mode again: a key quits at once
    t.quit_cleanly(&["q"]);
}

fn write_trace(dir: &Path) -> PathBuf {
    let path = dir.join("t.jsonl");
    let mut args = vec!["trace"];
    // the same decode, without the view's --pace (trace refuses it: it plays nothing)
    args.extend(live_args("64").into_iter().filter(|a| !["--pace", "0"].contains(a)));
    let out =
        Command::new(BIN).current_dir(root()).args(&args).arg("--out").arg(&path).output().unwrap();
    assert!(out.status.success(), "unmask trace: {}", String::from_utf8_lossy(&out.stderr));
    path
}

/// Everything but the lines that must differ: the title (live vs replay), the rates
/// (wall-clock timings of two different runs) and the footer's key hints (a replay lists only
/// the keys that work there).
fn comparable(screen: &str) -> String {
    // (the timeline's badge: ● LIVE at a live head, ■ END of trace at a replay's)
    let badge = |l: &str| l.contains("● LIVE") || l.contains("■ END");
    screen
        .lines()
        .skip(1)
        .filter(|l| !l.contains("tok/s") && !l.contains("? help") && !badge(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn replay_of_a_trace_shows_the_live_screens() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path());
    let live = Tmux::start("same-live", &live_args("64"), (120, 40));
    let live_screen = live.wait_settled("finished: ");
    live.quit_cleanly(&["q"]);

    let replay = Tmux::start("same-replay", &["replay", trace.to_str().unwrap()], (120, 40));
    // A replay starts playing from the first step; End jumps to the head.
    replay.wait_for("the replay", |s| s.contains("· pace ") || s.contains("■ END"));
    replay.keys(&["End"]);
    let replay_screen =
        replay.wait_for("the head", |s| s.contains("■ END") && s.contains("finished: "));
    assert!(replay_screen.contains("replay "), "{replay_screen}");
    assert_eq!(comparable(&live_screen), comparable(&replay_screen));

    // Stepping works the same way on a replay.
    replay.keys(&["["]);
    replay.wait_text("PAUSED");
    replay.quit_cleanly(&["q"]);
}

#[test]
fn truncated_trace_replays_to_the_last_good_event() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read_to_string(write_trace(dir.path())).unwrap();
    let lines: Vec<&str> = full.lines().collect();
    let keep = 20;
    let steps = lines[..keep].iter().filter(|l| l.contains("\"event\":\"step\"")).count();
    let cut = format!("{}\n{}", lines[..keep].join("\n"), &lines[keep][..lines[keep].len() / 2]);
    let path = dir.path().join("cut.jsonl");
    std::fs::write(&path, cut).unwrap();

    let t = Tmux::start("cut", &["replay", path.to_str().unwrap()], (120, 40));
    t.keys(&["End"]);
    let s = t.wait_for("the last good step", |s| s.contains("■ END") && s.contains("overall "));
    assert_eq!(overall(&s), (steps, steps), "{s}");
    assert!(
        s.contains("trace stopped early") && s.contains(&format!("cut.jsonl:{}:", keep + 1)),
        "{s}"
    );
    assert!(s.contains("unfinished"), "{s}");
    t.quit_cleanly(&["q"]);
}

#[test]
fn a_small_terminal_says_so_and_a_resize_recovers() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path());
    let t = Tmux::start("resize", &["replay", trace.to_str().unwrap()], (120, 40));
    t.wait_text("Blocks");
    t.tmux(&["resize-window", "-t", "e2e", "-x", "50", "-y", "15"]);
    let s = t.wait_text("terminal too small");
    assert!(!s.contains("Blocks"), "{s}");
    t.tmux(&["resize-window", "-t", "e2e", "-x", "90", "-y", "30"]);
    let s = t.wait_text("Blocks");
    assert!(s.lines().all(|l| l.chars().count() <= 90), "{s}");
    t.keys(&["?"]);
    t.wait_text("unmask · keys");
    t.keys(&["Escape"]);
    t.wait_for("help to close", |s| !s.contains("unmask · keys"));
    t.quit_cleanly(&["q"]);
}

#[test]
fn a_panic_restores_the_terminal_before_printing() {
    if !have_tmux() {
        return;
    }
    // The debug binary panics on the UI thread right after its first frame when asked to.
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path());
    let t = Tmux::start_env(
        "panic",
        &[("UNMASK_E2E_PANIC", "1")],
        &["replay", trace.to_str().unwrap()],
        (120, 40),
    );
    let s = t.wait_text("EXIT=");
    assert!(s.contains("EXIT=101"), "a panic exits 101:\n{s}");
    assert!(
        s.contains("UNMASK_E2E_PANIC: a panic on the UI thread"),
        "the message shows on the normal screen:\n{s}"
    );
    assert!(!t.alternate_on(), "still in the alternate screen");
    assert!(!s.contains("Timeline"), "{s}");
}

/// The status bar shows the error while the screen is up; quitting then fails the run with it,
/// as `trace` fails (it exited 0 with nothing said).
#[test]
fn a_decode_that_stops_on_an_error_fails_the_run_once_the_screen_is_gone() {
    if !have_tmux() {
        return;
    }
    let m = common::copy_model(|p| {
        common::poison_tensor(&p.join("model.safetensors"), "model.norm.weight", f32::NAN)
    });
    let t = Tmux::start(
        "engine-error",
        &["--model", m.path().to_str().unwrap(), "--max-new-tokens", "8"],
        (200, 40),
    );
    t.wait_text("engine error");
    t.keys(&["q"]);
    let s = t.wait_text("EXIT=");
    assert!(s.contains("EXIT=1"), "{s}");
    assert!(
        s.contains("unmask: error: decode failed: block 1 step 0 (forward 1): non-finite logits"),
        "{s}"
    );
    assert!(!t.alternate_on(), "still in the alternate screen");
}

#[test]
fn without_a_terminal_it_says_so_in_one_line() {
    for args in [live_args("8"), vec!["replay", "tests/fixtures/traces/tiny-dynamic.jsonl"]] {
        let out = Command::new(BIN).current_dir(root()).args(&args).output().unwrap();
        assert!(!out.status.success());
        assert!(out.stdout.is_empty(), "escape codes written to a pipe");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("not a terminal") && err.contains("unmask trace"), "{err}");
    }
}

/// `step N/M` from a compare screen's side line (`row` 1 is A, 2 is B).
fn side_step(screen: &str, row: usize) -> (usize, usize) {
    let line = screen.lines().nth(row).unwrap_or_default();
    let at = line.find(" step ").unwrap_or_else(|| panic!("no `step` on row {row}:\n{screen}"))
        + " step ".len();
    let field: String =
        line[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '/').collect();
    let (n, m) = field.split_once('/').expect("N/M");
    (n.parse().unwrap(), m.parse().unwrap())
}

#[test]
fn compare_shows_both_decodes_steps_back_and_quits() {
    if !have_tmux() {
        return;
    }
    let mut args =
        vec!["compare", "--model", MODEL, "--prompt", "The cat sat", "--max-new-tokens", "32"];
    args.extend([
        "--strategy-a",
        "sequential",
        "--strategy-b",
        "low_confidence_dynamic",
        "--threshold-b",
        "0.5",
        "--pace",
        "50",
    ]);
    let t = Tmux::start("compare", &args, (120, 40));
    // both play from step 1 at --pace, then follow the heads
    let s = t.wait_for("both settings, both finishes, the heads", |s| {
        // (a side line too wide for "finished:" says "ended:")
        let ends = s.matches("finished: ").count() + s.matches("ended: ").count();
        s.contains(" A sequential block ")
            && s.contains(" B low_confidence_dynamic block ")
            && ends >= 2
            && s.contains("● LIVE")
    });
    assert!(
        s.contains("thr=0.50") && s.contains("lock-step by step") && s.contains("● LIVE"),
        "{s}"
    );
    assert!(s.contains("outputs "), "no comparison line:\n{s}");
    let (a, b) = (side_step(&s, 1), side_step(&s, 2));
    assert!(a.0 == a.1 && b.0 == b.1, "both at their heads: {a:?} {b:?}");
    t.keys(&["Left"]);
    let s = t.wait_settled("⏸ PAUSED");
    // Lock-step: one step back from the longer side's head; the shorter stays at its own.
    let longest = a.1.max(b.1);
    let (a2, b2) = (side_step(&s, 1), side_step(&s, 2));
    assert_eq!((a2.0, b2.0), (a.1.min(longest - 1), b.1.min(longest - 1)), "{s}");
    t.quit_cleanly(&["q"]);
}

/// SGR parameters that set a foreground or background colour in `escaped` text.
fn colour_codes(escaped: &str) -> Vec<String> {
    let mut out = Vec::new();
    for seq in escaped.split("\x1b[").skip(1) {
        let Some(end) = seq.find(|c: char| !(c.is_ascii_digit() || c == ';' || c == ':')) else {
            continue;
        };
        if !seq[end..].starts_with('m') {
            continue;
        }
        let colour = |p: &str| {
            let n: u32 = p.split(':').next().unwrap_or("").parse().unwrap_or(0);
            // 39 and 49 ("default colour") are no colour: tmux writes them when attributes change.
            matches!(n, 30..=38 | 40..=48 | 90..=97 | 100..=107)
        };
        if seq[..end].split(';').any(colour) {
            out.push(seq[..end].to_string());
        }
    }
    out
}

#[test]
fn no_color_draws_no_colour_and_marks_steps_in_cells() {
    if !have_tmux() {
        return;
    }
    let t = Tmux::start_env("nocolor", &[("NO_COLOR", "1")], &live_args("24"), (120, 40));
    let s = t.wait_settled("finished: ");
    assert!(s.contains("¹") && s.contains("before the token"), "step marks and their legend:\n{s}");
    let escaped =
        String::from_utf8_lossy(&t.tmux(&["capture-pane", "-e", "-p", "-t", "e2e"]).stdout)
            .into_owned();
    assert!(escaped.contains("\x1b["), "capture-pane -e shows attributes (bold, reverse)");
    let codes = colour_codes(&escaped);
    assert!(codes.is_empty(), "colour escapes under NO_COLOR: {codes:?}");
    // The Steps panel replaces the text and marks the step shown.
    t.keys(&["L"]);
    // settled: under load a capture can catch the panel's title before its list is drawn
    let s = t.wait_settled(" Steps ");
    let (n, _) = overall(&s);
    assert!(s.contains(&format!("▶step {n} · block ")), "the step shown is marked:\n{s}");
    t.quit_cleanly(&["q"]);
}

impl Tmux {
    /// The pid of the binary: the pane's shell runs it as its child.
    fn binary_pid(&self) -> u32 {
        let out = self.tmux(&["display-message", "-p", "-t", "e2e", "#{pane_pid}"]);
        let shell = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let start = Instant::now();
        loop {
            let child = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
                let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                // pid (comm) state ppid ...: the comm may hold spaces, so read after the ')'.
                let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
                (ppid == shell).then(|| e.file_name().to_str()?.parse().ok()).flatten()
            });
            if let Some(pid) = child {
                return pid;
            }
            assert!(start.elapsed() < WAIT, "no child of the pane's shell {shell}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn flag(&self, name: &str) -> String {
        let out = self.tmux(&["display-message", "-p", "-t", "e2e", &format!("#{{{name}}}")]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Sends `signal` to the binary, then checks it exited 128 + the signal's number with the
    /// terminal restored: normal screen, mouse reporting off, cursor shown.
    fn signal_restores(&self, signal: &str, number: i32) {
        let pid = self.binary_pid();
        assert!(self.alternate_on() && self.flag("mouse_any_flag") == "1", "the TUI is not up");
        let ok =
            Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap();
        assert!(ok.success());
        let s = self.wait_text("EXIT=");
        assert!(s.contains(&format!("EXIT={}", 128 + number)), "SIG{signal}:\n{s}");
        assert!(s.contains(&format!("unmask: interrupted by SIG{signal}")), "{s}");
        assert!(!self.alternate_on(), "SIG{signal}: still in the alternate screen");
        assert_eq!(self.flag("mouse_any_flag"), "0", "SIG{signal}: mouse reporting left on");
        assert_eq!(self.flag("cursor_flag"), "1", "SIG{signal}: cursor left hidden");
        assert!(!s.contains("Blocks") && !s.contains("Timeline"), "TUI remnants:\n{s}");
    }
}

/// A decode long enough to be under way when the test acts: one token per block.
fn long_args() -> Vec<&'static str> {
    let mut args = live_args("1000");
    args.extend(["--block-length", "1", "--steps", "1"]);
    args
}

#[test]
fn each_signal_restores_the_terminal_of_the_live_tui() {
    if !have_tmux() {
        return;
    }
    for (signal, number) in [("TERM", 15), ("HUP", 1), ("INT", 2), ("QUIT", 3)] {
        let t = Tmux::start(&format!("sig-{signal}"), &long_args(), (120, 40));
        t.wait_text("decoding");
        t.signal_restores(signal, number);
    }
}

#[test]
fn signals_restore_the_terminal_of_replay_and_compare() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path());
    let t = Tmux::start("sig-replay", &["replay", trace.to_str().unwrap()], (120, 40));
    t.wait_text("Blocks");
    t.signal_restores("TERM", 15);
    let mut args =
        vec!["compare", "--model", MODEL, "--prompt", "The cat sat", "--max-new-tokens", "1000"];
    args.extend(["--block-length", "1", "--steps", "1"]);
    let t = Tmux::start("sig-compare", &args, (120, 40));
    t.wait_text(" A ");
    t.signal_restores("HUP", 1);
}

#[test]
fn an_unfinished_escape_sequence_does_not_swallow_q_or_ctrl_c() {
    if !have_tmux() {
        return;
    }
    // ESC [ < (an SGR mouse report cut short), ESC [ ? and a bracketed-paste start, each with
    // the quitting key in the same write, and with the key a moment later.
    let starts: [&[&str]; 3] =
        [&["1b", "5b", "3c"], &["1b", "5b", "3f"], &["1b", "5b", "32", "30", "30", "7e"]];
    for (i, start) in starts.iter().enumerate() {
        for (quit, apart) in [("71", false), ("03", true)] {
            let t = Tmux::start(&format!("wedge-{i}-{quit}"), &long_args(), (120, 40));
            t.wait_text("decoding");
            let mut bytes: Vec<&str> = vec!["send-keys", "-t", "e2e", "-H"];
            bytes.extend(start.iter());
            if apart {
                t.tmux(&bytes);
                std::thread::sleep(Duration::from_millis(300));
                t.tmux(&["send-keys", "-t", "e2e", "-H", quit]);
            } else {
                bytes.push(quit);
                t.tmux(&bytes);
            }
            let s = t.wait_text("EXIT=");
            assert!(s.contains("EXIT=0"), "{start:?} then {quit}:\n{s}");
            assert!(!t.alternate_on());
        }
    }
}

#[test]
fn r_r_q_exits_at_once_without_the_queued_decode() {
    if !have_tmux() {
        return;
    }
    let t = Tmux::start("rrq", &long_args(), (120, 40));
    t.wait_text("decoding");
    let start = Instant::now();
    // In one write, as a fast typist's keys arrive: all three reach the UI within one forward.
    t.tmux(&["send-keys", "-t", "e2e", "R", "R", "q"]);
    let s = t.wait_text("EXIT=");
    assert!(s.contains("EXIT=0"), "{s}");
    // Without the fix the second restart decodes 1000 tokens first (tens of seconds).
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?} to exit", start.elapsed());
}

#[test]
fn the_default_pace_unfolds_the_decode() {
    if !have_tmux() {
        return;
    }
    // The embedded model with every default: its first screen shows the first steps, not the end.
    let t = Tmux::start("pace", &[], (120, 40));
    let s = t.wait_text("overall ");
    assert!(
        !(s.contains("finished: ") && s.contains("● LIVE")),
        "the first screen is already the end:\n{s}"
    );
    let (n, m) = overall(&s);
    assert!(n < 20, "step {n}/{m} on the first screen:\n{s}");
    t.quit_cleanly(&["q"]);
}

#[test]
fn pace_keys_and_go_to_in_a_replay() {
    if !have_tmux() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path());
    let t = Tmux::start("goto", &["replay", trace.to_str().unwrap()], (120, 40));
    t.wait_text("· pace 10/s");
    t.keys(&["+"]);
    t.wait_text("· pace 20/s");
    t.keys(&["-", "-"]);
    t.wait_text("· pace 5/s");
    t.keys(&["g", "1", "2"]);
    t.wait_text("go to step (12) or block (b7): 12");
    t.keys(&["Enter"]);
    let s = t.wait_settled("PAUSED");
    assert_eq!(overall(&s).0, 12, "{s}");
    t.keys(&["g", "9", "9", "9", "Enter"]);
    t.wait_text("g: no step 999");
    // Typing goes on past 12 characters; the error quotes all of it and the hints after it are
    // whole ones.
    let mut nines = vec!["g"];
    nines.extend(["9"; 21]);
    nines.push("Enter");
    t.keys(&nines);
    let s = t.wait_text(&format!("g: no step {}: the decode has", "9".repeat(21)));
    let footer = s.lines().last().unwrap_or("");
    assert!(footer.contains("? help") && !footer.contains('…'), "{footer}");
    t.keys(&["End"]);
    t.wait_text("■ END");
    t.quit_cleanly(&["q"]);
}

/// `--routing` on the MoE fixture, live: the inspector shows the newest commit's route through
/// the two sparse layers and the stats its pass's distinct experts; on a dense model the flag
/// is a one-line error before the terminal is taken.
#[test]
fn routing_shows_in_the_inspector_and_stats_live() {
    if !have_tmux() {
        return;
    }
    let args = [
        "--model",
        "tests/fixtures/tiny-sdar-moe",
        "--routing",
        "--prompt",
        "x ≈ ∑ 你好",
        "--max-new-tokens",
        "16",
        "--pace",
        "0",
    ];
    let t = Tmux::start("routing", &args, (120, 40));
    let s = t.wait_settled("finished: length");
    assert!(s.contains("route top-1 weight by layer · 3 of 8"), "{s}");
    assert!(s.contains("L1 ") && s.contains("experts/layer") && s.contains("of 8)"), "{s}");
    t.quit_cleanly(&["q"]);
    let dense = Tmux::start("routing-dense", &["--model", MODEL, "--routing"], (120, 40));
    let s = dense.wait_text("EXIT=");
    assert!(
        s.contains("--routing:") && s.contains("describes a dense model") && s.contains("EXIT=1"),
        "{s}"
    );
    assert!(!dense.alternate_on());
}
