//! Warnings that code far from the screen has for the user: a kernel that did not compile, a
//! CUDA graph that could not be captured, a CPU without an instruction set. They go to stderr at
//! once, except while the TUI owns the terminal ([`crate::tui::terminal::Guard`]): a line written
//! then would land on the alternate screen, over the panels, and be gone on exit. So they wait,
//! the TUI shows each in its status line as it comes (`ui::run` asks for the new ones), and all
//! of them are printed once the terminal is restored.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Whether the TUI owns the terminal.
static HELD: AtomicBool = AtomicBool::new(false);
/// Every notice of the process, in order; those past `PRINTED` wait for the terminal.
static NOTICES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static PRINTED: Mutex<usize> = Mutex::new(0);

/// Tells the user `msg` (one line, without the `unmask: ` prefix): now on stderr, or once the
/// TUI has restored the terminal. The same text twice is told once.
pub fn warn(msg: impl Into<String>) {
    let msg = msg.into();
    let mut all = NOTICES.lock().unwrap_or_else(|e| e.into_inner());
    if all.contains(&msg) {
        return;
    }
    all.push(msg);
    drop(all);
    if !HELD.load(Ordering::SeqCst) {
        flush();
    }
}

/// The screen is the TUI's: notices wait from now on.
pub fn hold() {
    HELD.store(true, Ordering::SeqCst);
}

/// The terminal is restored: print what waited, and print at once from now on.
pub fn release() {
    HELD.store(false, Ordering::SeqCst);
    flush();
}

fn flush() {
    let all = NOTICES.lock().unwrap_or_else(|e| e.into_inner());
    let mut printed = PRINTED.lock().unwrap_or_else(|e| e.into_inner());
    for msg in &all[*printed..] {
        eprintln!("unmask: {msg}");
    }
    *printed = all.len();
}

/// The notices after the first `seen` of them (the TUI keeps `seen`, starting at 0).
pub fn since(seen: usize) -> Vec<String> {
    let all = NOTICES.lock().unwrap_or_else(|e| e.into_inner());
    all.get(seen..).map(<[String]>::to_vec).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the state is the process's, so parts run in one order.
    #[test]
    fn held_notices_wait_are_listed_once_and_print_on_release() {
        let start = since(0).len();
        hold();
        warn("graph capture failed: test");
        warn("graph capture failed: test");
        warn("another");
        assert_eq!(since(start), ["graph capture failed: test", "another"]);
        assert!(*PRINTED.lock().unwrap() <= start, "nothing printed while held");
        release();
        assert_eq!(*PRINTED.lock().unwrap(), start + 2);
        warn("after");
        assert_eq!(*PRINTED.lock().unwrap(), start + 3, "printed at once when not held");
    }
}
