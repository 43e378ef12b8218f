//! `unmask record` and `unmask replay FILE --cast OUT --gif OUT`: the TUI's screens of a
//! decode written as an asciicast, an animated GIF or both, with no terminal involved.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::cli::output::{check_outputs, create_streamed, is_stdout, write_atomically};
use crate::cli::session::Session;
use crate::cli::{CastArgs, DecodeArgs, LookArgs};
use crate::trace::events::{Event, FinishReason};
use crate::trace::file::{self as trace, TraceWriter};
use crate::tui::gif::GifScreens;
use crate::tui::record::{default_title, play, CastScreens, Pacing, Screens};

/// What a recording writes: a cast, a GIF, or both (never neither).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recording<'a> {
    Cast(&'a Path),
    Gif(&'a Path),
    Both { cast: &'a Path, gif: &'a Path },
}

impl<'a> Recording<'a> {
    /// The recording `--cast` and `--gif` ask for; `None` when neither is given.
    pub fn new(cast: Option<&'a Path>, gif: Option<&'a Path>) -> Option<Self> {
        match (cast, gif) {
            (Some(cast), Some(gif)) => Some(Recording::Both { cast, gif }),
            (Some(cast), None) => Some(Recording::Cast(cast)),
            (None, Some(gif)) => Some(Recording::Gif(gif)),
            (None, None) => None,
        }
    }

    fn cast(self) -> Option<&'a Path> {
        match self {
            Recording::Cast(c) | Recording::Both { cast: c, .. } => Some(c),
            Recording::Gif(_) => None,
        }
    }

    fn gif(self) -> Option<&'a Path> {
        match self {
            Recording::Gif(g) | Recording::Both { gif: g, .. } => Some(g),
            Recording::Cast(_) => None,
        }
    }

    /// The outputs by flag, for the checks of [`check_outputs`].
    fn outputs(self) -> Vec<(&'static str, &'a Path)> {
        let cast = self.cast().map(|c| ("--cast", c));
        cast.into_iter().chain(self.gif().map(|g| ("--gif", g))).collect()
    }
}

/// Decodes, streaming the trace (if asked) line by line as the events come, then renders the
/// recording of everything decoded. Interrupted by a signal, the decode is cancelled and
/// every file is still written whole: the trace ends with its `cancelled` finish event, the
/// cast and the GIF show the screens up to it. A signal while the recording renders ends it
/// on the frames rendered so far, written whole. Outputs that are inputs of the decode (its
/// prompt file, a file of its checkpoint) or each other are refused, and all are checked
/// writable, before the checkpoint loads; `-` is stdout for any one of them.
pub fn run(
    args: &DecodeArgs,
    to: Recording,
    trace_out: Option<&Path>,
    cast_args: &CastArgs,
    look: &LookArgs,
) -> Result<()> {
    let pacing = cast_args.pacing(look.cast_theme());
    pacing.validate()?;
    let mut outputs = to.outputs();
    outputs.extend(trace_out.map(|t| ("--trace", t)));
    crate::cli::session::check_decode_outputs(args, &outputs)?;
    let session = Session::open(args)?;
    let mut writer = match trace_out {
        Some(p) if is_stdout(p) => Some(TraceWriter::new(
            BufWriter::new(Box::new(std::io::stdout()) as Box<dyn Write>),
            "stdout",
        )),
        Some(p) => Some(TraceWriter::new(
            BufWriter::new(Box::new(create_streamed(p)?) as Box<dyn Write>),
            p.display().to_string(),
        )),
        None => None,
    };
    // Subscribed from the decode to the end of the cast: a signal between the two (once the
    // decode's own subscription has ended) must not cut the run short either.
    let _signals = crate::signals::subscribe(|_| {});
    let mut events = Vec::new();
    let fin = super::trace::stream(session, |ev| {
        events.push(ev.clone());
        writer.as_mut().map_or(Ok(()), |w| w.write(ev))
    })?;
    drop(writer);
    write_recording(events, None, None, to, (&pacing, cast_args))?;
    if fin.reason == FinishReason::Error {
        bail!("decode of the recording failed: {}", fin.error.unwrap_or_default());
    }
    Ok(())
}

/// A recorded trace to a cast, a GIF or both; a corrupt one records up to its last good
/// event, with a warning.
pub fn from_trace(file: &Path, to: Recording, cast_args: &CastArgs, look: &LookArgs) -> Result<()> {
    let pacing = cast_args.pacing(look.cast_theme());
    pacing.validate()?;
    check_outputs(&to.outputs(), &[("trace", file)])?;
    let t = trace::read_path(file)?;
    let label = Some(file.display().to_string());
    write_recording(t.events, label, t.stopped.clone(), to, (&pacing, cast_args))?;
    // The recording holds the good part; say where the trace ended, and exit so that a script
    // knows.
    crate::cli::PartialTrace::check(t.stopped, "recorded the events before it")
}

/// Renders the recording and writes each of its outputs, to a file whole (or not at all) or
/// to stdout (`-`). A signal that comes while it renders (not one that cancelled the decode
/// before: that decode's recording is rendered to its end) stops the rendering; the frames so
/// far are written as a whole cast and a whole GIF. `label`: the trace replayed, `None` for a
/// live decode.
fn write_recording(
    events: Vec<Event>,
    label: Option<String>,
    stopped: Option<String>,
    to: Recording,
    (pacing, args): (&Pacing, &CastArgs),
) -> Result<()> {
    let title = args.title.clone().unwrap_or_else(|| default_title(&events));
    let signalled_before = crate::signals::caught().is_some();
    let stop = || !signalled_before && crate::signals::caught().is_some();
    // While subscribed, a signal does not end the process: rendering stops at the next frame.
    let _signals = crate::signals::subscribe(|_| {});
    crate::signals::finishing(|| {
        with_output(to.cast(), |cast| {
            with_output(to.gif(), |gif| {
                let cast = cast.map(|(w, name)| CastScreens::new(w, &name, pacing, &title));
                let mut cast = cast.transpose()?;
                let look = (pacing.theme, args.gif_scale);
                let size = (pacing.width, pacing.height);
                let gif = gif.map(|(w, name)| GifScreens::new(w, &name, look, size, &title));
                let mut gif = gif.transpose()?;
                let mut screens: Vec<&mut dyn Screens> = Vec::new();
                screens.extend(cast.as_mut().map(|c| c as &mut dyn Screens));
                screens.extend(gif.as_mut().map(|g| g as &mut dyn Screens));
                play(events, label, stopped, pacing, &mut screens, &stop)?;
                cast.map(CastScreens::finish).transpose()?;
                gif.map(GifScreens::finish).transpose()?;
                Ok(())
            })
        })
    })
}

/// An output and the name its errors give it.
type Out<'w> = (&'w mut dyn Write, String);

/// Runs `write` on the output at `path` (`None`: no such output): stdout for `-`, else a file
/// written whole or not at all.
fn with_output<T>(path: Option<&Path>, write: impl FnOnce(Option<Out>) -> Result<T>) -> Result<T> {
    let Some(path) = path else { return write(None) };
    if is_stdout(path) {
        let mut out = BufWriter::new(std::io::stdout().lock());
        let value = write(Some((&mut out, "stdout".into())))?;
        out.flush().context("stdout: cannot write")?;
        return Ok(value);
    }
    let name = path.display().to_string();
    write_atomically(path, |w| write(Some((w, name))))
}
