//! Terminal input bytes to key, mouse and resize events, with an escape timeout.
//!
//! Why not crossterm's `EventStream`: its parser (crossterm 0.29, `event/sys/unix/parse.rs`)
//! keeps an unfinished escape sequence in its buffer and appends every later byte to it until
//! the sequence can end: after `ESC [ <` it waits for an `m` or `M` (`parse_csi_sgr_mouse`),
//! after `ESC [ ?` for a `u` or `c`, after `ESC [ 200 ~` for `ESC [ 201 ~`. Every key typed
//! meanwhile, `q` and Ctrl-C included, becomes part of that sequence and is lost, and the
//! parser is private, so it cannot be told to give up. Here the bytes are read by us, and
//! an unfinished sequence can never hold later keys:
//! - a byte that cannot continue the sequence (`q` after `ESC [ <`, which only digits, `;`
//!   and `M`/`m` may follow; any control byte) drops what came before it and is read as
//!   input of its own;
//! - an unfinished sequence that sees no byte for [`ESC_TIMEOUT`] is dropped (a lone ESC is
//!   the Esc key), as a terminal would time it out.
//!
//! [`Decoder`] is the pure part (bytes in, events out); [`stream`] reads the terminal on a
//! thread and applies the timeout.
use std::collections::VecDeque;
use std::time::Duration;

use crossterm::event::{
    Event, KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};

/// How long an unfinished escape sequence may wait for its next byte. Terminals write a
/// sequence in one go; 100 ms is what vim's `ttimeoutlen` defaults to in many setups.
pub const ESC_TIMEOUT: Duration = Duration::from_millis(100);

/// Bytes of input in, events out.
#[derive(Default)]
pub struct Decoder {
    pending: Vec<u8>,
}

/// What the bytes at the start of the buffer are.
enum Parse {
    /// An event (or `None`: a valid sequence that means nothing here) spanning `n` bytes.
    Done(Option<Event>, usize),
    /// A sequence that may still be completed by more bytes.
    NeedMore,
    /// The first `n` bytes cannot start anything valid: drop them, read on from there.
    Invalid(usize),
}

impl Decoder {
    /// Takes `bytes` and returns every event they complete; an unfinished escape sequence
    /// stays pending.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut at = 0;
        while at < self.pending.len() {
            match parse(&self.pending[at..]) {
                Parse::Done(ev, n) => {
                    out.extend(ev);
                    at += n;
                }
                Parse::Invalid(n) => at += n,
                Parse::NeedMore => break,
            }
        }
        self.pending.drain(..at);
        out
    }

    /// Whether bytes wait for the rest of their sequence.
    pub fn is_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The pending bytes timed out: a lone ESC is the Esc key (and `ESC ESC` two of them);
    /// an unfinished sequence is dropped.
    pub fn time_out(&mut self) -> Vec<Event> {
        let p = std::mem::take(&mut self.pending);
        if !p.is_empty() && p.iter().all(|&b| b == 0x1b) {
            return p.iter().map(|_| key(KeyCode::Esc, KeyModifiers::NONE)).collect();
        }
        Vec::new()
    }
}

fn key(code: KeyCode, m: KeyModifiers) -> Event {
    Event::Key(KeyEvent::new(code, m))
}

fn parse(b: &[u8]) -> Parse {
    match b[0] {
        0x1b => match b.get(1) {
            None => Parse::NeedMore,
            Some(b'[') => csi(b),
            Some(b'O') => ss3(b),
            Some(0x1b) => Parse::Done(Some(key(KeyCode::Esc, KeyModifiers::NONE)), 1),
            // ESC then a key: that key with Alt.
            Some(_) => match plain(&b[1..]) {
                Parse::Done(Some(Event::Key(mut k)), n) => {
                    k.modifiers |= KeyModifiers::ALT;
                    Parse::Done(Some(Event::Key(k)), n + 1)
                }
                Parse::NeedMore => Parse::NeedMore,
                _ => Parse::Invalid(1),
            },
        },
        _ => plain(b),
    }
}

/// One key that is not an escape sequence: a control byte or a UTF-8 character.
fn plain(b: &[u8]) -> Parse {
    let k = |c, m| Parse::Done(Some(key(c, m)), 1);
    match b[0] {
        b'\r' | b'\n' => k(KeyCode::Enter, KeyModifiers::NONE),
        b'\t' => k(KeyCode::Tab, KeyModifiers::NONE),
        0x7f | 0x08 => k(KeyCode::Backspace, KeyModifiers::NONE),
        0x00 => k(KeyCode::Char(' '), KeyModifiers::CONTROL),
        c @ 0x01..=0x1a => k(KeyCode::Char((b'a' + c - 1) as char), KeyModifiers::CONTROL),
        c @ 0x1c..=0x1f => k(KeyCode::Char((b'4' + c - 0x1c) as char), KeyModifiers::CONTROL),
        0x1b => Parse::Invalid(1),
        first => {
            let len = match first {
                0x20..=0x7e => 1,
                0xc2..=0xdf => 2,
                0xe0..=0xef => 3,
                0xf0..=0xf4 => 4,
                _ => return Parse::Invalid(1),
            };
            if b.len() < len {
                // A continuation byte is all that may follow a partial character.
                return if b[1..].iter().all(|c| c & 0xc0 == 0x80) {
                    Parse::NeedMore
                } else {
                    Parse::Invalid(1)
                };
            }
            match std::str::from_utf8(&b[..len]).ok().and_then(|s| s.chars().next()) {
                Some(c) => Parse::Done(Some(key(KeyCode::Char(c), shift_of(c))), len),
                None => Parse::Invalid(1),
            }
        }
    }
}

fn shift_of(c: char) -> KeyModifiers {
    if c.is_uppercase() {
        KeyModifiers::SHIFT
    } else {
        KeyModifiers::NONE
    }
}

/// `ESC O x`: the keypad-mode arrows, Home/End and F1-F4.
fn ss3(b: &[u8]) -> Parse {
    let Some(&c) = b.get(2) else { return Parse::NeedMore };
    let code = match c {
        b'A' => KeyCode::Up,
        b'B' => KeyCode::Down,
        b'C' => KeyCode::Right,
        b'D' => KeyCode::Left,
        b'H' => KeyCode::Home,
        b'F' => KeyCode::End,
        b'P'..=b'S' => KeyCode::F(1 + c - b'P'),
        // Not a sequence after all: the ESC O is dropped, the byte read on its own.
        _ => return Parse::Invalid(2),
    };
    Parse::Done(Some(key(code, KeyModifiers::NONE)), 3)
}

/// `ESC [` + an optional private marker (`<`, `?`, `>`, `=`) + digits, `;` and `:` + a final
/// byte. Only the finals terminals send as input are accepted; any other byte ends the
/// sequence as invalid and is read on its own (so `ESC [ <` then `q` is a `q`).
fn csi(b: &[u8]) -> Parse {
    // X10 mouse (`ESC [ M` + three raw bytes), from a terminal without SGR reporting: dropped
    // whole, so that its bytes are not read as keys.
    if b.get(2) == Some(&b'M') {
        return if b.len() < 6 { Parse::NeedMore } else { Parse::Done(None, 6) };
    }
    let marker = b.get(2).copied().filter(|c| matches!(c, b'<' | b'?' | b'>' | b'='));
    let start = 2 + usize::from(marker.is_some());
    let mut i = start;
    while let Some(&c) = b.get(i) {
        if c.is_ascii_digit() || c == b';' || c == b':' {
            i += 1;
            continue;
        }
        let params = std::str::from_utf8(&b[start..i]).unwrap_or("");
        return match final_byte(marker, params, c) {
            Some(ev) => Parse::Done(ev, i + 1),
            None => Parse::Invalid(i),
        };
    }
    // Bounded: a real sequence is short; a stream of digits after `ESC [` is not one.
    if i > 32 {
        return Parse::Invalid(i);
    }
    Parse::NeedMore
}

/// The event of a whole CSI sequence: `None` if `c` cannot end one, `Some(None)` for a
/// sequence that is valid but means nothing here.
fn final_byte(marker: Option<u8>, params: &str, c: u8) -> Option<Option<Event>> {
    let nums: Vec<u16> = params.split([';', ':']).map(|p| p.parse().unwrap_or(0)).collect();
    let mods = modifiers(nums.get(1).copied().unwrap_or(1));
    let k = |code| Some(Some(key(code, mods)));
    match (marker, c) {
        (Some(b'<'), b'M' | b'm') => Some(sgr_mouse(&nums, c == b'm')),
        (Some(b'?'), b'u' | b'c') => Some(None),
        (Some(_), _) => None,
        (None, b'A') => k(KeyCode::Up),
        (None, b'B') => k(KeyCode::Down),
        (None, b'C') => k(KeyCode::Right),
        (None, b'D') => k(KeyCode::Left),
        (None, b'H') => k(KeyCode::Home),
        (None, b'F') => k(KeyCode::End),
        (None, b'P') => k(KeyCode::F(1)),
        (None, b'Q') => k(KeyCode::F(2)),
        (None, b'S') => k(KeyCode::F(4)),
        (None, b'Z') => Some(Some(key(KeyCode::BackTab, KeyModifiers::SHIFT))),
        (None, b'I') => Some(Some(Event::FocusGained)),
        (None, b'O') => Some(Some(Event::FocusLost)),
        (None, b'~') => Some(tilde(nums[0]).map(|code| key(code, mods))),
        // Kitty keys, cursor reports, old mouse: valid, not asked for, ignored.
        (None, b'u' | b'R' | b'M') => Some(None),
        _ => None,
    }
}

fn tilde(n: u16) -> Option<KeyCode> {
    Some(match n {
        1 | 7 => KeyCode::Home,
        2 => KeyCode::Insert,
        3 => KeyCode::Delete,
        4 | 8 => KeyCode::End,
        5 => KeyCode::PageUp,
        6 => KeyCode::PageDown,
        11..=15 => KeyCode::F((n - 10) as u8),
        17..=21 => KeyCode::F((n - 11) as u8),
        23 | 24 => KeyCode::F((n - 12) as u8),
        // 200/201: bracketed paste, which unmask does not ask for; the text reads as keys.
        _ => return None,
    })
}

/// xterm's modifier parameter: 1 + a bit set of shift 1, alt 2, ctrl 4.
fn modifiers(p: u16) -> KeyModifiers {
    let bits = p.saturating_sub(1);
    let mut m = KeyModifiers::NONE;
    for (bit, flag) in
        [(1, KeyModifiers::SHIFT), (2, KeyModifiers::ALT), (4, KeyModifiers::CONTROL)]
    {
        if bits & bit != 0 {
            m |= flag;
        }
    }
    m
}

/// `ESC [ < b ; x ; y M|m`: SGR mouse reporting (1-based cells; `m` is a release).
fn sgr_mouse(nums: &[u16], release: bool) -> Option<Event> {
    let [b, x, y] = nums else { return None };
    let button = match b & 3 {
        0 => MouseButton::Left,
        1 => MouseButton::Middle,
        _ => MouseButton::Right,
    };
    let kind = match (b & 64 != 0, b & 32 != 0, release) {
        (true, _, _) => match b & 3 {
            0 => MouseEventKind::ScrollUp,
            1 => MouseEventKind::ScrollDown,
            2 => MouseEventKind::ScrollLeft,
            _ => MouseEventKind::ScrollRight,
        },
        (false, true, _) if b & 3 == 3 => MouseEventKind::Moved,
        (false, true, _) => MouseEventKind::Drag(button),
        (false, false, true) => MouseEventKind::Up(button),
        (false, false, false) => MouseEventKind::Down(button),
    };
    let mut modifiers = KeyModifiers::NONE;
    for (bit, flag) in
        [(4, KeyModifiers::SHIFT), (8, KeyModifiers::ALT), (16, KeyModifiers::CONTROL)]
    {
        if b & bit != 0 {
            modifiers |= flag;
        }
    }
    Some(Event::Mouse(MouseEvent {
        kind,
        column: x.saturating_sub(1),
        row: y.saturating_sub(1),
        modifiers,
    }))
}

/// What the reader threads send: bytes from the terminal, or a resize (SIGWINCH, or the
/// terminal given back after a suspension: [`repaint`]).
enum Input {
    Bytes(Vec<u8>),
    Resize,
}

/// The running stream's sender, for [`repaint`].
static REPAINT: std::sync::Mutex<
    Option<tokio::sync::mpsc::UnboundedSender<std::io::Result<Input>>>,
> = std::sync::Mutex::new(None);

/// Makes the stream yield a `Resize` of the current size: the screen was overwritten (the
/// process was suspended and the shell drew on it) and must be drawn whole again.
pub fn repaint() {
    if let Some(tx) = REPAINT.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        let _ = tx.send(Ok(Input::Resize));
    }
}

/// The terminal's events: bytes read from the terminal on a thread (stdin if it is one, else
/// `/dev/tty`, as crossterm does), decoded with the escape timeout, plus a `Resize` on every
/// SIGWINCH. Needs a tokio runtime with time enabled. The threads block in `read` until the
/// process exits; the TUI is the last thing a run does.
pub fn stream() -> std::io::Result<impl futures::Stream<Item = std::io::Result<Event>> + Unpin> {
    use std::io::{IsTerminal, Read};
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<std::io::Result<Input>>();
    let mut tty: Box<dyn Read + Send> = if std::io::stdin().is_terminal() {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open("/dev/tty")?)
    };
    let mut winch = signal_hook::iterator::Signals::new([signal_hook::consts::SIGWINCH])?;
    *REPAINT.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx.clone());
    let bytes_tx = tx.clone();
    std::thread::Builder::new().name("unmask-input".into()).spawn(move || {
        let mut buf = [0u8; 1024];
        loop {
            let sent = match tty.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes_tx.send(Ok(Input::Bytes(buf[..n].to_vec()))),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => bytes_tx.send(Err(e)),
            };
            if sent.is_err() {
                break;
            }
        }
    })?;
    std::thread::Builder::new().name("unmask-winch".into()).spawn(move || {
        for _ in winch.forever() {
            if tx.send(Ok(Input::Resize)).is_err() {
                break;
            }
        }
    })?;
    let state = (Decoder::default(), rx, VecDeque::<std::io::Result<Event>>::new());
    Ok(Box::pin(futures::stream::unfold(state, |(mut dec, mut rx, mut queue)| async move {
        loop {
            if let Some(ev) = queue.pop_front() {
                return Some((ev, (dec, rx, queue)));
            }
            let next = if dec.is_pending() {
                match tokio::time::timeout(ESC_TIMEOUT, rx.recv()).await {
                    Ok(x) => x,
                    Err(_) => {
                        queue.extend(dec.time_out().into_iter().map(Ok));
                        continue;
                    }
                }
            } else {
                rx.recv().await
            };
            match next? {
                Ok(Input::Bytes(b)) => queue.extend(dec.feed(&b).into_iter().map(Ok)),
                Ok(Input::Resize) => {
                    if let Ok((w, h)) = crossterm::terminal::size() {
                        queue.push_back(Ok(Event::Resize(w, h)));
                    }
                }
                Err(e) => queue.push_back(Err(e)),
            }
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(c: char) -> Event {
        key(KeyCode::Char(c), KeyModifiers::NONE)
    }

    fn ctrl(c: char) -> Event {
        key(KeyCode::Char(c), KeyModifiers::CONTROL)
    }

    #[test]
    fn keys_arrows_and_modifiers() {
        let mut d = Decoder::default();
        assert_eq!(
            d.feed(b"qR\x03\r\t"),
            vec![
                k('q'),
                key(KeyCode::Char('R'), KeyModifiers::SHIFT),
                ctrl('c'),
                key(KeyCode::Enter, KeyModifiers::NONE),
                key(KeyCode::Tab, KeyModifiers::NONE)
            ]
        );
        assert_eq!(
            d.feed(b"\x1b[A\x1b[D\x1bOH\x1b[4~\x1b[5~\x1b[Z\x1b[1;5C"),
            vec![
                key(KeyCode::Up, KeyModifiers::NONE),
                key(KeyCode::Left, KeyModifiers::NONE),
                key(KeyCode::Home, KeyModifiers::NONE),
                key(KeyCode::End, KeyModifiers::NONE),
                key(KeyCode::PageUp, KeyModifiers::NONE),
                key(KeyCode::BackTab, KeyModifiers::SHIFT),
                key(KeyCode::Right, KeyModifiers::CONTROL),
            ]
        );
        assert_eq!(d.feed("é€".as_bytes()), vec![k('é'), k('€')]);
        assert_eq!(d.feed(b"\x1bx"), vec![key(KeyCode::Char('x'), KeyModifiers::ALT)]);
        assert!(!d.is_pending());
        assert_eq!(d.feed(b"\x1b[M !!q"), vec![k('q')], "an X10 mouse report is dropped whole");
    }

    #[test]
    fn split_sequences_and_characters_wait_for_their_rest() {
        let mut d = Decoder::default();
        assert_eq!(d.feed(b"\x1b["), vec![]);
        assert!(d.is_pending());
        assert_eq!(d.feed(b"1;5"), vec![]);
        assert_eq!(d.feed(b"Aq"), vec![key(KeyCode::Up, KeyModifiers::CONTROL), k('q')]);
        assert_eq!(d.feed(&"€".as_bytes()[..2]), vec![]);
        assert_eq!(d.feed(&"€".as_bytes()[2..]), vec![k('€')]);
    }

    #[test]
    fn sgr_mouse_clicks_and_scrolls() {
        let mut d = Decoder::default();
        let ev = d.feed(b"\x1b[<0;10;5M\x1b[<0;10;5m\x1b[<65;1;1M");
        let m = |kind, column, row| {
            Event::Mouse(MouseEvent { kind, column, row, modifiers: KeyModifiers::NONE })
        };
        assert_eq!(
            ev,
            vec![
                m(MouseEventKind::Down(MouseButton::Left), 9, 4),
                m(MouseEventKind::Up(MouseButton::Left), 9, 4),
                m(MouseEventKind::ScrollDown, 0, 0)
            ]
        );
    }

    /// The wedge of crossterm's parser: after these, `q` and Ctrl-C must still arrive.
    #[test]
    fn an_unfinished_sequence_never_swallows_q_or_ctrl_c() {
        for start in [&b"\x1b[<"[..], b"\x1b[?", b"\x1b[<1;2", b"\x1b[200~", b"\x1b[", b"\x1bO"] {
            let mut d = Decoder::default();
            let mut got = d.feed(start);
            got.extend(d.feed(b"q"));
            assert_eq!(got, vec![k('q')], "after {start:?}");
            let mut d = Decoder::default();
            let mut got = d.feed(start);
            got.extend(d.feed(b"\x03"));
            assert_eq!(got, vec![ctrl('c')], "after {start:?}");
        }
    }

    #[test]
    fn a_timed_out_escape_is_the_esc_key_and_a_partial_sequence_is_dropped() {
        let mut d = Decoder::default();
        assert_eq!(d.feed(b"\x1b"), vec![]);
        assert_eq!(d.time_out(), vec![key(KeyCode::Esc, KeyModifiers::NONE)]);
        assert_eq!(d.feed(b"\x1b[<1;2"), vec![]);
        assert_eq!(d.time_out(), vec![]);
        assert!(!d.is_pending());
    }

    #[test]
    fn endless_parameters_are_not_a_sequence() {
        let mut d = Decoder::default();
        let mut bytes = b"\x1b[".to_vec();
        bytes.extend(std::iter::repeat_n(b'1', 40));
        assert_eq!(d.feed(&bytes), vec![]);
        assert!(!d.is_pending(), "a long run of digits is dropped, not held");
        assert_eq!(d.feed(b"q"), vec![k('q')]);
    }
}
