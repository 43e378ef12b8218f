//! Command-line interface: flags, and how they resolve against a checkpoint's defaults.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::engine::settings::{DecodeSettings, Sampling, Schedule, Strategy};
use crate::model::{DeviceSpec, DtypeSpec, GenerationConfig};

/// `--version`: the package version, the commit built (build.rs) and whether the GPU path is in.
#[cfg(feature = "cuda")]
pub const VERSION: &str =
    concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("UNMASK_COMMIT"), ", CUDA built in)");
#[cfg(not(feature = "cuda"))]
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("UNMASK_COMMIT"),
    ", CPU only: built without --features cuda)"
);

#[derive(Parser, Debug)]
#[command(
    name = "unmask",
    version = VERSION,
    about = "Watch a block-diffusion language model (SDAR, LLaDA2) decode, step by step, live.",
    long_about = "Watch a block-diffusion language model (SDAR, LLaDA2) decode, step by step, live.\n\n\
        With no subcommand, opens the live TUI on the embedded tiny model (or --model DIR).\n\
        Every denoising step is an event: which positions it committed, with what confidence,\n\
        and what the model would pick for the positions still masked."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub decode: DecodeArgs,
    #[command(flatten)]
    pub look: LookArgs,
}

impl Cli {
    /// The command line, with what clap alone cannot refuse refused too: the decode and look
    /// flags are global (every command takes them), but a command that would ignore one
    /// refuses it ([`ignored_flag`]); `--revision` without `--model` names nothing. Each gets a
    /// clap error, as a wrong flag does.
    pub fn parse_checked(
        args: impl IntoIterator<Item = std::ffi::OsString>,
    ) -> Result<Cli, clap::Error> {
        use clap::parser::ValueSource;
        use clap::FromArgMatches;
        let mut cmd = Cli::checked_command();
        let m = cmd.try_get_matches_from_mut(args)?;
        let given =
            |m: &clap::ArgMatches, id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
        let refuse = |msg: String| {
            Err(Cli::checked_command().error(clap::error::ErrorKind::ArgumentConflict, msg))
        };
        let sub = m.subcommand();
        let at = sub.map_or(&m, |(_, s)| s);
        if given(at, "revision") && !given(at, "model") {
            return refuse(
                "--revision picks a revision of --model ORG/NAME; give --model too".into(),
            );
        }
        if let Some(("bench", s)) = sub {
            // bench decodes a prompt of --prompt-len tokens it makes itself
            if let Some(flag) = BENCH_REFUSES.into_iter().find(|id| given(s, id)) {
                return refuse(format!(
                    "bench decodes a prompt of --prompt-len tokens: --{} has no effect there",
                    flag.replace('_', "-")
                ));
            }
        }
        if let Some(("export", s)) = sub {
            let format = s.get_one::<ExportFormat>("format").copied();
            if given(s, "table") && format.is_some_and(|f| f != ExportFormat::Csv) {
                return refuse("export: --table picks one CSV table (JSON holds every table; SVG and PNG draw the step map)".into());
            }
            let figure = FIGURE_FLAGS.into_iter().find(|id| given(s, id));
            let flag = |id: &str| format!("--{}", id.replace('_', "-"));
            match (figure, format) {
                (Some(id), Some(f)) if !f.is_figure() => {
                    return refuse(format!(
                        "export: {} shapes the figure; give --format svg or png",
                        flag(id)
                    ));
                }
                _ if given(s, "dpi") && format == Some(ExportFormat::Svg) => {
                    return refuse(
                        "export: --dpi sets the PNG's pixels (--format png); an SVG has none"
                            .into(),
                    );
                }
                _ => {}
            }
        }
        if let Some(msg) = sub.and_then(|(name, s)| ignored_flag(name, &|id| given(s, id))) {
            return refuse(msg);
        }
        Cli::from_arg_matches(&m).map_err(|e| e.format(&mut cmd))
    }

    /// The command line as [`Cli::parse_checked`] reads it: a subcommand's help lists only the
    /// flags it takes. The global flags it always refuses ([`refused`]) are given to it as
    /// hidden flags of its own, which keeps clap from handing it the shown global ones.
    pub fn checked_command() -> clap::Command {
        use clap::CommandFactory;
        let mut cmd = with_defaults(Cli::command());
        let globals: Vec<clap::Arg> =
            cmd.get_arguments().filter(|a| a.is_global_set()).cloned().collect();
        let names: Vec<String> =
            cmd.get_subcommands().map(|sc| sc.get_name().to_string()).collect();
        for name in names {
            let ids = refused(&name);
            cmd = cmd.mut_subcommand(name, |mut sc| {
                for a in globals.iter().filter(|a| ids.iter().any(|id| id == a.get_id())) {
                    sc = sc.arg(a.clone().global(false).hide(true));
                }
                sc
            });
        }
        // bench's own prompt flags (its decode flags are its own, not global): refused, hidden
        cmd.mut_subcommand("bench", |sc| {
            BENCH_REFUSES.into_iter().fold(sc, |sc, id| sc.mut_arg(id, |a| a.hide(true)))
        })
    }
}

/// The decode flags that are `Option`s (unset: the checkpoint's value, else unmask's) with
/// unmask's default, as `--help` shows it; one list with [`DecodeSettings::default`], so help
/// cannot drift from what runs.
pub fn decode_defaults() -> Vec<(&'static str, String)> {
    let d = DecodeSettings::default();
    let s = d.sampling;
    vec![
        ("strategy", d.strategy.name().to_string()),
        ("schedule", format!("{:?}", d.schedule).to_lowercase()),
        ("threshold", d.threshold.to_string()),
        ("edit_threshold", d.edit_threshold.to_string()),
        ("max_post_steps", d.max_post_steps.to_string()),
        ("eos_early_stop", d.eos_early_stop.to_string()),
        ("eb_threshold", d.eb_threshold.to_string()),
        ("block_length", d.block_length.to_string()),
        ("steps", d.steps.to_string()),
        ("temperature", s.temperature.to_string()),
        ("top_k", s.top_k.to_string()),
        ("top_p", s.top_p.to_string()),
        ("seed", s.seed.to_string()),
        ("max_new_tokens", d.max_new_tokens.to_string()),
    ]
}

/// Every command's help with the decode flags' defaults: clap shows `[default: ..]` only for
/// flags that have one it fills in, and these are left unset so that a checkpoint's
/// generation_config.json (or its family's published decoder) can fill them first.
fn with_defaults(cmd: clap::Command) -> clap::Command {
    let defaults = decode_defaults();
    let annotate = move |a: clap::Arg| {
        let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
        match defaults.iter().find(|(id, _)| a.get_id() == *id) {
            Some((_, v)) => a.help(format!("{help} [default: {v}, unless the checkpoint sets it]")),
            // unset means 1; no checkpoint file names it
            None if a.get_id() == "candidates" => a.help(format!("{help} [default: 1]")),
            None => a,
        }
    };
    let names: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_string()).collect();
    let cmd = cmd.mut_args(annotate.clone());
    names.into_iter().fold(cmd, |cmd, n| cmd.mut_subcommand(n, |sc| sc.mut_args(annotate.clone())))
}

/// The prompt flags bench refuses: it decodes a synthetic prompt of `--prompt-len` tokens.
const BENCH_REFUSES: [&str; 8] =
    ["prompt", "prompt_file", "system", "chat_arg", "raw", "chat_template", "stop", "ignore_eos"];

/// The ids of a group of flags (`DecodeArgs`, `LookArgs`, `CastArgs`).
fn ids<A: Args>() -> Vec<String> {
    A::augment_args(clap::Command::new("group"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect()
}

/// The global flags subcommand `name` refuses whatever else is given, hidden from its help.
fn refused(name: &str) -> Vec<String> {
    match name {
        "export" => [ids::<DecodeArgs>(), ids::<LookArgs>()].concat(),
        "replay" => ids::<DecodeArgs>(),
        "trace" | "steps" | "bench" | "check-device" => ids::<LookArgs>(),
        "models" | "completions" | "man" => [ids::<DecodeArgs>(), ids::<LookArgs>()].concat(),
        "record" => vec!["pace".into()],
        _ => Vec::new(),
    }
}

/// Why subcommand `name` refuses a flag `given` (by id) on its command line, if it does: the
/// flags it would ignore. The look flags (`--mono`, `--theme`) apply to what draws the TUI's
/// screens (the TUI, `replay`, `compare`, `record`); `--pace` to the TUI, `compare` and
/// `replay` on a terminal (a recording is paced by `--step-delay`); the decode flags to what
/// decodes; the recording flags to `replay` only with `--cast` or `--gif`, and `--gif-scale`
/// only with `--gif`.
fn ignored_flag(name: &str, given: &dyn Fn(&str) -> bool) -> Option<String> {
    let flag = |ids: &[&str]| {
        ids.iter().find(|id| given(id)).map(|id| format!("--{}", id.replace('_', "-")))
    };
    let decode = ids::<DecodeArgs>();
    let decode: Vec<&str> = decode.iter().map(String::as_str).collect();
    let cast = ids::<CastArgs>();
    let cast: Vec<&str> = cast.iter().map(String::as_str).collect();
    const SCREENS: &str = "applies only to the screens (the TUI, replay, compare, record)";
    const PACE: &str = "--pace applies only to the TUI, compare and replay on a terminal";
    let decoding =
        "applies only when decoding (trace, steps without a TRACE, record, compare, bench)";
    // (record and replay only: asking another command of a flag it has not is an error)
    let recording = || {
        if given("cast") {
            ("--cast", "a cast", "a cast's")
        } else {
            ("--gif", "a GIF", "a GIF's")
        }
    };
    match name {
        "export" | "replay" => {
            if let Some(f) = flag(&decode) {
                return Some(format!("{name} reads a recorded trace: {f} {decoding}"));
            }
        }
        "models" | "completions" | "man" => {
            let look = ["mono", "theme", "pace"];
            if let Some(f) = flag(&decode).or_else(|| flag(&look)) {
                return Some(format!("{name} neither decodes nor draws: {f} has no effect there"));
            }
        }
        "steps" if given("trace") => {
            if let Some(f) = flag(&decode) {
                return Some(format!("steps TRACE reads a recorded trace: {f} {decoding}"));
            }
        }
        _ => {}
    }
    match name {
        "export" => flag(&["mono", "theme"])
            .map(|f| format!("export draws no screen: {f} {SCREENS}; the SVG figure has one look, for a white page"))
            .or_else(|| flag(&["pace"]).map(|_| format!("export plays nothing: {PACE}"))),
        "trace" | "steps" | "bench" | "check-device" => flag(&["mono", "theme"])
            .map(|f| format!("{name} draws no screen: {f} {SCREENS}"))
            .or_else(|| flag(&["pace"]).map(|_| format!("{name} plays nothing: {PACE}"))),
        "record" | "replay" if given("gif_scale") && !given("gif") => {
            Some(format!("{name}: --gif-scale applies only with --gif"))
        }
        "record" => flag(&["pace"]).map(|_| {
            let (_, what, its) = recording();
            format!("record writes {what}: {PACE}; {its} pace is --step-delay")
        }),
        "replay" if given("cast") || given("gif") => flag(&["pace"]).map(|_| {
            let (with, what, its) = recording();
            format!("replay {with} writes {what}: {PACE}; {its} pace is --step-delay")
        }),
        "replay" => flag(&cast).map(|f| format!("replay: {f} applies only with --cast or --gif (the TUI replays at --pace)")),
        "compare" if given("headless") => flag(&["mono", "theme"])
            .map(|f| format!("compare --headless prints a table: {f} {SCREENS}"))
            .or_else(|| flag(&["pace"]).map(|_| format!("compare --headless prints a table: {PACE}"))),
        _ => None,
    }
}

/// How the screens look (the TUI, `replay`, `compare`, `record`).
#[derive(Args, Debug, Clone)]
pub struct LookArgs {
    /// No colour: every decoded cell shows its step number, confidence shows as bars. Also
    /// turned on by the NO_COLOR environment variable.
    #[arg(long, global = true)]
    pub mono: bool,
    /// Colours for a dark or a light terminal background.
    #[arg(long, value_enum, value_name = "T", default_value = "dark", global = true)]
    pub theme: crate::tui::theme::ThemeName,
    /// Steps per second the view walks through the decode from its first step until it
    /// catches up with the decode, which never waits for it (`+`/`-` change it live); 0: as
    /// fast as the steps come. The TUI, `compare` and `replay`.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "N",
        default_value_t = 10.0,
        global = true
    )]
    pub pace: f64,
}

impl LookArgs {
    /// The theme for this terminal: `--theme`, at the colour depth the environment asks for
    /// (NO_COLOR, COLORTERM; see `Depth::detect`).
    pub fn theme(&self) -> &'static crate::tui::theme::Theme {
        use crate::tui::theme::{pick, Depth};
        pick(self.theme, Depth::from_env(self.mono))
    }

    /// A recording's theme: 24-bit colour (asciinema players show it) whatever terminal
    /// records it, unless `--mono` or `NO_COLOR` ask for none.
    pub fn cast_theme(&self) -> &'static crate::tui::theme::Theme {
        use crate::tui::theme::{pick, Depth};
        let depth = match Depth::from_env(self.mono) {
            Depth::Mono => Depth::Mono,
            _ => Depth::TrueColor,
        };
        pick(self.theme, depth)
    }

    /// `--pace`, checked.
    pub fn pace(&self) -> Result<crate::tui::cursor::Pace> {
        crate::tui::cursor::Pace::new(self.pace).map_err(anyhow::Error::msg)
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Decode headless and write the step events as JSON Lines (stdout or --out FILE).
    Trace {
        #[command(flatten)]
        decode: DecodeArgs,
        /// Write the trace here instead of stdout (`-`: stdout). Never an input of the decode:
        /// the prompt file or a file of the checkpoint folder is refused.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Two decodes of the same prompt side by side (any setting may differ between A and B).
    ///
    /// Both are greedy unless a temperature is given (--temperature, --temperature-a/-b), so
    /// that they differ by their settings, not by their random draws.
    Compare {
        #[command(flatten)]
        decode: DecodeArgs,
        #[command(flatten)]
        a: SideA,
        #[command(flatten)]
        b: SideB,
        /// Print the comparison as a table instead of opening the TUI.
        #[arg(long)]
        headless: bool,
        /// With --headless: the comparison as one JSON object (steps and token indexes from 1).
        #[arg(long, requires = "headless")]
        json: bool,
    },
    /// Per-token, per-step and per-edit tables of a trace: which token was decoded at which
    /// step, and which later steps replaced; or the step map as a figure (`--format svg|png`).
    Export {
        /// A trace written by `unmask trace` (`-`: read it from stdin).
        trace: PathBuf,
        #[arg(long, value_enum, default_value = "csv")]
        format: ExportFormat,
        /// Which table, for CSV (JSON holds every table; SVG and PNG draw the step map).
        #[arg(long, value_enum, default_value = "tokens")]
        table: ExportTable,
        /// Write here instead of stdout (`-`: stdout); never the trace read.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        figure: FigureArgs,
    },
    /// Open the TUI on a recorded trace (from `unmask trace`); no model needed. A truncated or
    /// corrupt trace replays up to its last good event.
    Replay {
        /// The trace, JSON Lines (`-`: read it from stdin).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Write an asciicast v2 file of the replay instead of opening the TUI (no terminal
        /// needed; `-`: to stdout).
        #[arg(long, value_name = "FILE")]
        cast: Option<PathBuf>,
        /// Write an animated GIF of the replay instead of opening the TUI (no terminal needed;
        /// `-`: to stdout); with --cast, both.
        #[arg(long, value_name = "FILE")]
        gif: Option<PathBuf>,
        #[command(flatten)]
        pacing: CastArgs,
    },
    /// Decode headless and write the TUI's screens as an asciicast v2 file (`asciinema play`
    /// replays it), an animated GIF, or both; no terminal needed.
    #[command(group(clap::ArgGroup::new("recording").args(["cast", "gif"]).required(true).multiple(true)))]
    Record {
        #[command(flatten)]
        decode: DecodeArgs,
        /// The asciicast file to write (`-`: stdout). Checked before the decode starts; never
        /// the prompt file or a file of the checkpoint folder.
        #[arg(long, value_name = "FILE")]
        cast: Option<PathBuf>,
        /// The animated GIF to write (`-`: stdout), checked as --cast is.
        #[arg(long, value_name = "FILE")]
        gif: Option<PathBuf>,
        /// Also write the decode's trace here, line by line as it decodes (`-`: stdout).
        /// Never the prompt file or a file of the checkpoint folder.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        #[command(flatten)]
        pacing: CastArgs,
    },
    /// One line per denoising step: the step (1-based over the decode), the block, the step
    /// within it, the forward and the texts it committed, as a JSON array in position order.
    /// Reads a trace (`-`: stdin), or decodes with the decode flags and prints each step as it
    /// happens.
    Steps(StepsArgs),
    /// Forwards/s, ms per forward and tokens/s per strategy, with step events on and off.
    Bench(BenchArgs),
    /// The checkpoints in the local Hugging Face cache that `--model ORG/NAME` can load: id,
    /// revision, family, parameters, size (nothing is downloaded).
    Models {
        /// Also list the cached repositories unmask cannot load, and why.
        #[arg(long)]
        all: bool,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A shell's completion script on stdout, e.g. `unmask completions bash >
    /// ~/.local/share/bash-completion/completions/unmask`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The man page (roff) on stdout, e.g. `unmask man | man -l -`; with --dir, one page per
    /// command written there (unmask.1, unmask-trace.1, ...).
    Man {
        /// Write every page into this folder instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// GPU self-check: logits vs the CPU, the device sampler vs the reference sampler.
    #[command(hide = true)]
    CheckDevice(CheckDeviceArgs),
}

/// `unmask bench`: the decode flags pick the model, device and settings; unset
/// `--strategy` benchmarks every strategy.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub decode: DecodeArgs,
    /// Random weights of a named real shape instead of --model (default: the embedded model).
    #[arg(long, value_name = "SHAPE", conflicts_with = "model", value_parser = crate::model::random::shape_parser())]
    pub random_init: Option<&'static crate::model::random::Shape>,
    /// Prompt length in tokens (synthetic ids; whole blocks are prefilled).
    #[arg(long, allow_negative_numbers = true, value_name = "N", default_value_t = 64)]
    pub prompt_len: usize,
    /// Step events: built and sent to a consumer thread (on), not built (off), or both.
    #[arg(long, value_enum, default_value = "both")]
    pub events: EventsMode,
    /// Untimed decodes before the timed ones, per configuration.
    #[arg(long, allow_negative_numbers = true, value_name = "N", default_value_t = 1)]
    pub warmup: usize,
    /// Timed decodes per configuration (the medians are reported).
    #[arg(long, allow_negative_numbers = true, value_name = "N", default_value_t = 3)]
    pub repeat: usize,
    /// Also write the results as JSON here (never a file of the checkpoint folder).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `unmask steps [TRACE]`.
#[derive(Args, Debug, Clone)]
pub struct StepsArgs {
    /// A trace written by `unmask trace` (`-`: read it from stdin). Without it, decode now
    /// (the decode flags apply) and print each step as it happens.
    #[arg(value_name = "TRACE")]
    pub trace: Option<PathBuf>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub decode: DecodeArgs,
}

/// Pacing and size of a recording, cast or GIF (`record`, `replay --cast`/`--gif`).
#[derive(Args, Debug, Clone)]
pub struct CastArgs {
    /// Most frames per second of cast time (steps closer together are coalesced).
    #[arg(long, allow_negative_numbers = true, value_name = "N", default_value_t = 30.0)]
    pub fps: f64,
    /// Cast seconds per denoising step.
    #[arg(long, allow_negative_numbers = true, value_name = "SECONDS", default_value_t = 0.05)]
    pub step_delay: f64,
    /// Width of the recorded terminal, in columns.
    #[arg(long, allow_negative_numbers = true, value_name = "N", default_value_t = 120)]
    pub width: u16,
    /// Height of the recorded terminal, in rows.
    #[arg(long, allow_negative_numbers = true, value_name = "N", default_value_t = 40)]
    pub height: u16,
    /// Title of the cast, and the GIF's comment (default: the settings summary and the
    /// prompt).
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
    /// Pixels per font pixel of the GIF: 1 draws a cell 8×16 pixels, 2 draws it 16×32.
    #[arg(long, value_enum, value_name = "N", default_value = "1")]
    pub gif_scale: crate::tui::gif::raster::Scale,
}

impl CastArgs {
    /// The pacing, drawn in `theme` (the look flags').
    pub fn pacing(&self, theme: &'static crate::tui::theme::Theme) -> crate::tui::record::Pacing {
        crate::tui::record::Pacing {
            fps: self.fps,
            step_delay: self.step_delay,
            width: self.width,
            height: self.height,
            theme,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EventsMode {
    On,
    Off,
    Both,
}

/// `unmask check-device` (hidden): run on the GPU host by scripts/gpu_run.sh.
#[derive(Args, Debug, Clone)]
pub struct CheckDeviceArgs {
    #[command(flatten)]
    pub decode: DecodeArgs,
    /// Synthetic rows of this vocabulary size for the sampler check.
    #[arg(long, allow_negative_numbers = true, value_name = "N", default_value_t = 151936)]
    pub vocab: usize,
    /// Write the results as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Csv,
    Json,
    /// The step map as a figure: cells coloured by step, confidence bars, legend, settings.
    Svg,
    /// The same figure as an image, drawn with the fonts built in (CJK and math included).
    Png,
}

impl ExportFormat {
    pub fn is_figure(self) -> bool {
        matches!(self, ExportFormat::Svg | ExportFormat::Png)
    }
}

/// How `export --format svg|png` lays out the step map.
#[derive(Args, Debug, Clone, Default)]
pub struct FigureArgs {
    /// The figure's width in points (240: one column of a two-column paper; 504: both). Text
    /// keeps its size; a wider figure holds more blocks a row.
    #[arg(long, value_name = "PT", allow_negative_numbers = true)]
    pub width: Option<crate::tui::figure::Width>,
    /// Blocks side by side in a row (default: as many as fit the width).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub blocks_per_row: Option<crate::tui::figure::BlocksPerRow>,
    /// Colour only cells set at these steps of their block, 1-based: A..B, A.., ..B or A. The
    /// others keep their text, in grey on white; colours stay those of the whole run.
    #[arg(long, value_name = "A..B")]
    pub step_range: Option<crate::tui::figure::StepRange>,
    /// The PNG's resolution: its pixel width is the width in points times DPI/72 (240 pt at
    /// the default 300 dpi: 1000 pixels).
    #[arg(long, value_name = "DPI", allow_negative_numbers = true)]
    pub dpi: Option<crate::tui::figure::Dpi>,
}

impl FigureArgs {
    /// The layout, defaults filled in.
    pub fn options(&self) -> crate::tui::figure::Options {
        crate::tui::figure::Options {
            width: self.width.unwrap_or_default(),
            blocks_per_row: self.blocks_per_row,
            steps: self.step_range.unwrap_or_default(),
        }
    }
}

/// The figure flags' ids, which only `--format svg|png` takes.
const FIGURE_FLAGS: [&str; 4] = ["width", "blocks_per_row", "step_range", "dpi"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum ExportTable {
    /// One row per generated token: position, block, step, token id, text, confidence.
    Tokens,
    /// One row per denoising step: tokens committed.
    Steps,
    /// The 1-based step within its block that set every output token's final token
    /// (lmdeploy/SGLang `step_map`).
    StepMap,
    /// One row per edit (token editing): step, block, position, the token replaced and the new
    /// one, their texts, confidence.
    Edits,
}

/// Numeric flags take `allow_negative_numbers`, so that `--threshold -1` reaches the range
/// check and its message instead of clap's "unexpected argument '-1'".
///
/// Flags shared by everything that decodes. Unset ones fall back to the checkpoint's
/// generation_config.json, then to unmask's defaults.
#[derive(Args, Debug, Clone, Default)]
pub struct DecodeArgs {
    /// Checkpoint folder (Hugging Face layout: config.json, *.safetensors, tokenizer.json), or a
    /// Hugging Face id ORG/NAME found in the local hub cache (never downloaded). A folder that
    /// exists wins. Default: the tiny SDAR model embedded in the binary.
    #[arg(long, value_name = "DIR|ORG/NAME", global = true)]
    pub model: Option<PathBuf>,
    /// Branch, tag or commit of --model ORG/NAME in the hub cache.
    #[arg(long, value_name = "REV", default_value = "main", global = true)]
    pub revision: String,
    /// The user's message (rendered with the checkpoint's chat template, if it has one).
    #[arg(long, value_name = "TEXT", global = true, conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the user's message from FILE (`-`: stdin), byte for byte, trailing newlines kept.
    #[arg(long, value_name = "FILE", global = true)]
    pub prompt_file: Option<PathBuf>,
    /// Decode the prompt as given: no chat template.
    #[arg(long, global = true)]
    pub raw: bool,
    /// A system message before the user's (chat checkpoints).
    #[arg(long, value_name = "TEXT", global = true, conflicts_with = "raw")]
    pub system: Option<String>,
    /// A Jinja chat template to render the prompt with instead of the checkpoint's.
    #[arg(long, value_name = "FILE", global = true, conflicts_with = "raw")]
    pub chat_template: Option<PathBuf>,
    /// A chat-template variable, VALUE as JSON if it parses (`enable_thinking=false`); repeatable.
    #[arg(long, value_name = "KEY=VALUE", global = true, conflicts_with = "raw")]
    pub chat_arg: Vec<String>,
    /// Positions per block.
    #[arg(long, allow_negative_numbers = true, value_name = "N", global = true)]
    pub block_length: Option<usize>,
    /// Denoising steps per block.
    #[arg(long, allow_negative_numbers = true, value_name = "N", global = true)]
    pub steps: Option<usize>,
    /// Unmasking strategy.
    #[arg(long, value_enum, ignore_case = true, global = true)]
    pub strategy: Option<Strategy>,
    /// Where SDAR and lmdeploy disagree (tokens per step, dynamic's use of steps).
    #[arg(long, value_enum, global = true)]
    pub schedule: Option<Schedule>,
    /// Confidence threshold of low_confidence_dynamic and joint_threshold.
    #[arg(long, allow_negative_numbers = true, value_name = "F", global = true)]
    pub threshold: Option<f32>,
    /// joint_threshold: replace a decoded token when the pass decodes another there with a
    /// probability over F.
    #[arg(long, allow_negative_numbers = true, value_name = "F", global = true)]
    pub edit_threshold: Option<f32>,
    /// joint_threshold: passes a block may take after its last mask (editing only).
    #[arg(long, allow_negative_numbers = true, value_name = "N", global = true)]
    pub max_post_steps: Option<usize>,
    /// End the decode after the block that holds the first EOS (false: decode every block, as
    /// LLaDA2.1's generate() does; the output still ends at the first EOS).
    #[arg(long, value_name = "BOOL", global = true, action = clap::ArgAction::Set)]
    pub eos_early_stop: Option<bool>,
    /// End the output at this text: the decode ends after the block in which the output first
    /// contains it, the output with the token that completes it (as transformers'
    /// `stop_strings`); repeatable.
    #[arg(long, value_name = "TEXT", global = true)]
    pub stop: Vec<String>,
    /// Decode to --max-new-tokens whatever EOS the model writes (the EOS stays in the text).
    #[arg(long, global = true)]
    pub ignore_eos: bool,
    /// Cumulative-entropy bound of entropy_bounded.
    #[arg(long, allow_negative_numbers = true, value_name = "F", global = true)]
    pub eb_threshold: Option<f32>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, allow_negative_numbers = true, value_name = "F", global = true)]
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens (0: off).
    #[arg(long, allow_negative_numbers = true, value_name = "N", global = true)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens with this much probability (1: off).
    #[arg(long, allow_negative_numbers = true, value_name = "F", global = true)]
    pub top_p: Option<f32>,
    /// Seed of the sampler's random stream.
    #[arg(long, allow_negative_numbers = true, value_name = "N", global = true)]
    pub seed: Option<u64>,
    /// Tokens to generate at most.
    #[arg(long, allow_negative_numbers = true, value_name = "N", global = true)]
    pub max_new_tokens: Option<usize>,
    /// cpu, cuda or cuda:N.
    #[arg(long, value_name = "DEV", default_value = "cpu", global = true)]
    pub device: DeviceSpec,
    /// Compute dtype: auto (f32 on the CPU, bf16 on a GPU), f32, bf16 or f16. On the CPU, bf16
    /// rounds each projection's input to bf16 and multiplies in bf16 (AVX512-BF16: prefill and
    /// storing passes up to 1.6x faster); the rest stays f32. Tokens may differ from f32's.
    #[arg(long, value_enum, value_name = "DT", default_value = "auto", global = true)]
    pub dtype: DtypeSpec,
    /// Keep the K most probable tokens of every masked position and their probabilities in
    /// each step (the inspector shows them and the margin p1 - p2), 1 to 16; 1: only the token
    /// drawn. Above 1 on a GPU, sampling runs on the host (slower).
    #[arg(long, allow_negative_numbers = true, value_name = "K", global = true, value_parser = parse_candidates)]
    pub candidates: Option<usize>,
    /// Record, for every committed position, the experts it was routed to in each sparse layer
    /// of a mixture-of-experts model and their weights, and the distinct experts each pass read
    /// (the inspector and the stats panel show them). Off: free.
    #[arg(long, global = true)]
    pub routing: bool,
}

/// `--candidates K`: 1..=MAX_CANDIDATES.
fn parse_candidates(s: &str) -> Result<usize, String> {
    let max = crate::sampler::MAX_CANDIDATES;
    match s.parse::<usize>() {
        Ok(k) if (1..=max).contains(&k) => Ok(k),
        _ => Err(format!(
            "expected a whole number from 1 to {max} (candidates kept per masked position)"
        )),
    }
}

/// transformers' `GenerationConfig` defaults, taken when generation_config.json says
/// `do_sample: true` and leaves the field out.
pub(crate) const TRANSFORMERS_TEMPERATURE: f32 = 1.0;
pub(crate) const TRANSFORMERS_TOP_K: usize = 50;

impl DecodeArgs {
    /// `--candidates`, 1 when not given.
    pub fn candidates(&self) -> usize {
        self.candidates.unwrap_or(1)
    }

    /// Flags over checkpoint defaults (generation_config.json, then config.json's
    /// `block_size`) over unmask defaults; validated. generation_config.json's values that
    /// no flag overrides are checked first, alone, so that a bad one names the file and its
    /// field (`DIR/generation_config.json: field `temperature` is -1; ...`), not a flag the
    /// user never gave. config.json's `block_size` is checked when config.json is read.
    pub fn settings(
        &self,
        gen: &GenerationConfig,
        block_size: Option<usize>,
    ) -> Result<DecodeSettings> {
        self.settings_over(gen, block_size, &GenerationConfig::default())
    }

    /// [`DecodeArgs::settings`], with `family` (what the family's published `generate()` uses,
    /// [`crate::model::registry::Family::decoding`]) under the checkpoint's own values.
    pub fn settings_over(
        &self,
        gen: &GenerationConfig,
        block_size: Option<usize>,
        family: &GenerationConfig,
    ) -> Result<DecodeSettings> {
        let taken = self.taken_from(gen);
        let none = GenerationConfig::default();
        if let Err(e) = DecodeArgs::default().merge(&taken, None, &none)?.validate() {
            use crate::engine::settings::SettingsError::*;
            let field = match e {
                BlockLength(_) => "block_length",
                Steps(_) if gen.steps_field.is_empty() => "denoising_steps",
                Steps(_) => gen.steps_field,
                Threshold(_) if gen.threshold_field.is_empty() => "threshold",
                Threshold(_) => gen.threshold_field,
                EbThreshold(_) => "eb_threshold",
                Temperature(_) => "temperature",
                TopP(_) => "top_p",
                MaxNewTokens(_) => "max_new_tokens",
                EditThreshold(_) => "editing_threshold",
                MaxPostSteps(_) => "max_post_steps",
            };
            bail!("{}: field `{field}` is {}; it {}", gen.label(), e.value(), e.requirement());
        }
        let s = self.merge(gen, block_size, family)?;
        s.validate().context("invalid settings")?;
        Ok(s)
    }

    /// The values of `gen` a decode with these flags takes: those no flag overrides.
    fn taken_from(&self, gen: &GenerationConfig) -> GenerationConfig {
        fn unless<T>(flag: bool, v: &Option<T>) -> Option<T>
        where
            T: Clone,
        {
            if flag {
                None
            } else {
                v.clone()
            }
        }
        GenerationConfig {
            block_length: unless(self.block_length.is_some(), &gen.block_length),
            denoising_steps: unless(self.steps.is_some(), &gen.denoising_steps),
            threshold: unless(self.threshold.is_some(), &gen.threshold),
            eb_threshold: unless(self.eb_threshold.is_some(), &gen.eb_threshold),
            editing_threshold: unless(self.edit_threshold.is_some(), &gen.editing_threshold),
            max_post_steps: unless(self.max_post_steps.is_some(), &gen.max_post_steps),
            eos_early_stop: unless(self.eos_early_stop.is_some(), &gen.eos_early_stop),
            max_new_tokens: unless(self.max_new_tokens.is_some(), &gen.max_new_tokens),
            remasking_strategy: unless(self.strategy.is_some(), &gen.remasking_strategy),
            temperature: unless(self.temperature.is_some(), &gen.temperature),
            do_sample: unless(self.temperature.is_some(), &gen.do_sample),
            top_k: unless(self.top_k.is_some(), &gen.top_k),
            top_p: unless(self.top_p.is_some(), &gen.top_p),
            ..gen.clone()
        }
    }

    /// Flags over `gen` over `block_size` over `family` over unmask's defaults, not validated.
    /// generation_config.json's `do_sample: false` is transformers' greedy search: temperature
    /// 0, whatever the file's `temperature` (`--temperature` still wins); `do_sample: true`
    /// samples, with transformers' temperature and top-k where the file has none.
    fn merge(
        &self,
        gen: &GenerationConfig,
        block_size: Option<usize>,
        family: &GenerationConfig,
    ) -> Result<DecodeSettings> {
        let d = DecodeSettings::default();
        let named = gen.remasking_strategy.as_deref().or(family.remasking_strategy.as_deref());
        let strategy = match (self.strategy, named) {
            (Some(s), _) => s,
            (None, Some(name)) => {
                <Strategy as clap::ValueEnum>::from_str(name, true).map_err(|_| {
                    anyhow::anyhow!(
                        "{}: field `remasking_strategy`: unknown strategy {name:?}",
                        gen.label()
                    )
                })?
            }
            (None, None) => d.strategy,
        };
        let (gen_temperature, gen_top_k) = match gen.do_sample {
            Some(false) => (Some(0.0), gen.top_k),
            // A file that asks to sample and leaves a field out gets transformers' default for
            // it, as transformers would: sampling at temperature 1.0 over the top 50.
            Some(true) => (
                gen.temperature.or(Some(TRANSFORMERS_TEMPERATURE)),
                gen.top_k.or(Some(TRANSFORMERS_TOP_K)),
            ),
            None => (gen.temperature, gen.top_k),
        };
        if self.stop.iter().any(String::is_empty) {
            bail!("--stop \"\": an empty text would end every output before its first token");
        }
        Ok(DecodeSettings {
            strategy,
            schedule: self.schedule.unwrap_or(d.schedule),
            threshold: self.threshold.or(gen.threshold).or(family.threshold).unwrap_or(d.threshold),
            eb_threshold: self.eb_threshold.or(gen.eb_threshold).unwrap_or(d.eb_threshold),
            block_length: self
                .block_length
                .or(gen.block_length)
                .or(block_size)
                .or(family.block_length)
                .unwrap_or(d.block_length),
            steps: self.steps.or(gen.denoising_steps).or(family.denoising_steps).unwrap_or(d.steps),
            sampling: Sampling {
                temperature: self.temperature.or(gen_temperature).unwrap_or(d.sampling.temperature),
                top_k: self.top_k.or(gen_top_k).unwrap_or(d.sampling.top_k),
                top_p: self.top_p.or(gen.top_p).unwrap_or(d.sampling.top_p),
                seed: self.seed.unwrap_or(d.sampling.seed),
            },
            max_new_tokens: self.max_new_tokens.or(gen.max_new_tokens).unwrap_or(d.max_new_tokens),
            edit_threshold: self
                .edit_threshold
                .or(gen.editing_threshold)
                .or(family.editing_threshold)
                .unwrap_or(d.edit_threshold),
            max_post_steps: self
                .max_post_steps
                .or(gen.max_post_steps)
                .or(family.max_post_steps)
                .unwrap_or(d.max_post_steps),
            eos_early_stop: self
                .eos_early_stop
                .or(gen.eos_early_stop)
                .or(family.eos_early_stop)
                .unwrap_or(d.eos_early_stop),
            stop: self.stop.clone(),
        })
    }
}

/// Per-side overrides of `unmask compare`: `--strategy-a`, `--threshold-b`, ...
macro_rules! side_args {
    ($name:ident, $suffix:literal, $heading:literal) => {
        #[derive(Args, Debug, Clone, Default)]
        #[command(next_help_heading = $heading)]
        pub struct $name {
            #[arg(help = concat!("--strategy for side ", $suffix, " only (over the shared flag)"), id = concat!("strategy_", $suffix), long = concat!("strategy-", $suffix), value_enum, ignore_case = true, value_name = "S")]
            pub strategy: Option<Strategy>,
            #[arg(help = concat!("--schedule for side ", $suffix, " only (over the shared flag)"), id = concat!("schedule_", $suffix), long = concat!("schedule-", $suffix), value_enum, value_name = "S")]
            pub schedule: Option<Schedule>,
            #[arg(help = concat!("--threshold for side ", $suffix, " only (over the shared flag)"), id = concat!("threshold_", $suffix), long = concat!("threshold-", $suffix), allow_negative_numbers = true, value_name = "F")]
            pub threshold: Option<f32>,
            #[arg(help = concat!("--eb-threshold for side ", $suffix, " only (over the shared flag)"), id = concat!("eb_threshold_", $suffix), long = concat!("eb-threshold-", $suffix), allow_negative_numbers = true, value_name = "F")]
            pub eb_threshold: Option<f32>,
            #[arg(help = concat!("--edit-threshold for side ", $suffix, " only (over the shared flag)"), id = concat!("edit_threshold_", $suffix), long = concat!("edit-threshold-", $suffix), allow_negative_numbers = true, value_name = "F")]
            pub edit_threshold: Option<f32>,
            #[arg(help = concat!("--steps for side ", $suffix, " only (over the shared flag)"), id = concat!("steps_", $suffix), long = concat!("steps-", $suffix), allow_negative_numbers = true, value_name = "N")]
            pub steps: Option<usize>,
            #[arg(help = concat!("--block-length for side ", $suffix, " only (over the shared flag)"), id = concat!("block_length_", $suffix), long = concat!("block-length-", $suffix), allow_negative_numbers = true, value_name = "N")]
            pub block_length: Option<usize>,
            #[arg(help = concat!("--temperature for side ", $suffix, " only (over the shared flag)"), id = concat!("temperature_", $suffix), long = concat!("temperature-", $suffix), allow_negative_numbers = true, value_name = "F")]
            pub temperature: Option<f32>,
            #[arg(help = concat!("--top-k for side ", $suffix, " only (over the shared flag)"), id = concat!("top_k_", $suffix), long = concat!("top-k-", $suffix), allow_negative_numbers = true, value_name = "N")]
            pub top_k: Option<usize>,
            #[arg(help = concat!("--top-p for side ", $suffix, " only (over the shared flag)"), id = concat!("top_p_", $suffix), long = concat!("top-p-", $suffix), allow_negative_numbers = true, value_name = "F")]
            pub top_p: Option<f32>,
            #[arg(help = concat!("--seed for side ", $suffix, " only (over the shared flag)"), id = concat!("seed_", $suffix), long = concat!("seed-", $suffix), allow_negative_numbers = true, value_name = "N")]
            pub seed: Option<u64>,
        }

        impl $name {
            /// The shared flags with this side's overrides on top.
            pub fn apply(&self, base: &DecodeArgs) -> DecodeArgs {
                DecodeArgs {
                    strategy: self.strategy.or(base.strategy),
                    schedule: self.schedule.or(base.schedule),
                    threshold: self.threshold.or(base.threshold),
                    eb_threshold: self.eb_threshold.or(base.eb_threshold),
                    edit_threshold: self.edit_threshold.or(base.edit_threshold),
                    steps: self.steps.or(base.steps),
                    block_length: self.block_length.or(base.block_length),
                    temperature: self.temperature.or(base.temperature),
                    top_k: self.top_k.or(base.top_k),
                    top_p: self.top_p.or(base.top_p),
                    seed: self.seed.or(base.seed),
                    ..base.clone()
                }
            }
        }
    };
}

side_args!(SideA, "a", "Side A only (over the shared flags)");
side_args!(SideB, "b", "Side B only (over the shared flags)");

/// The other names the values of `flag` (`--strategy`) take, as `dynamic = low_confidence_dynamic,
/// ...`, for a usage error's list of values (clap lists only the names); `None` when it has none.
pub fn value_aliases(flag: &str) -> Option<String> {
    use clap::CommandFactory;
    let long = flag.strip_prefix("--")?;
    let cmd = Cli::command();
    let arg = std::iter::once(&cmd)
        .chain(cmd.get_subcommands())
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_long() == Some(long))?;
    let pairs: Vec<String> = arg
        .get_possible_values()
        .iter()
        .flat_map(|v| {
            let name = v.get_name().to_string();
            // the spelled-out aliases (`low-confidence-dynamic`) only change `_` to `-`
            v.get_name_and_aliases()
                .skip(1)
                .filter(|a| !a.is_empty() && a.replace('-', "_") != name)
                .map(|a| format!("{a} = {name}"))
                .collect::<Vec<_>>()
        })
        .collect();
    (!pairs.is_empty()).then(|| pairs.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
        Cli::checked_command().debug_assert();
    }

    #[test]
    fn strategies_answer_to_the_spellings_users_type() {
        let parse = |s: &str| match Cli::try_parse_from(["unmask", "--strategy", s]) {
            Ok(cli) => Ok(cli.decode.strategy.unwrap()),
            Err(e) => Err(e.kind()),
        };
        for s in [
            "low_confidence_dynamic",
            "low-confidence-dynamic",
            "Low-Confidence-Dynamic",
            "LOW_CONFIDENCE_DYNAMIC",
            "dynamic",
        ] {
            assert_eq!(parse(s), Ok(Strategy::LowConfidenceDynamic), "{s}");
        }
        assert_eq!(parse("low-confidence-static"), Ok(Strategy::LowConfidenceStatic));
        assert_eq!(parse("Entropy-Bounded"), Ok(Strategy::EntropyBounded));
        assert_eq!(parse("Sequential"), Ok(Strategy::Sequential));
        assert_eq!(parse("lowconfidence"), Err(clap::error::ErrorKind::InvalidValue));
        let cli =
            Cli::try_parse_from(["unmask", "compare", "--strategy-a", "Low-Confidence-Static"])
                .unwrap();
        let Some(Command::Compare { a, .. }) = cli.command else { panic!() };
        assert_eq!(a.strategy, Some(Strategy::LowConfidenceStatic));
    }

    #[test]
    fn device_and_dtype_take_the_spellings_they_always_took() {
        use crate::model::{DeviceSpec, DtypeSpec};
        let parse = |flags: &[&str]| {
            let cli = Cli::try_parse_from(["unmask"].iter().chain(flags)).map_err(|e| e.kind())?;
            Ok::<_, clap::error::ErrorKind>((cli.decode.device, cli.decode.dtype))
        };
        assert_eq!(parse(&[]), Ok((DeviceSpec::Cpu, DtypeSpec::Auto)));
        for (dev, want) in [
            ("cpu", DeviceSpec::Cpu),
            ("cuda", DeviceSpec::Cuda(None)),
            ("cuda:0", DeviceSpec::Cuda(Some(0))),
            ("cuda:3", DeviceSpec::Cuda(Some(3))),
        ] {
            assert_eq!(parse(&["--device", dev]).map(|p| p.0), Ok(want), "{dev}");
            assert_eq!(want.to_string(), dev, "shown as given");
        }
        for (dt, want) in [
            ("auto", DtypeSpec::Auto),
            ("", DtypeSpec::Auto),
            ("f32", DtypeSpec::F32),
            ("bf16", DtypeSpec::Bf16),
            ("f16", DtypeSpec::F16),
        ] {
            assert_eq!(parse(&["--dtype", dt]).map(|p| p.1), Ok(want), "{dt:?}");
        }
        for bad in [
            &["--device", "gpu"][..],
            &["--device", "cuda:"],
            &["--device", "cuda:-1"],
            &["--device", "CPU"],
            &["--dtype", "fp16"],
            &["--dtype", "BF16"],
        ] {
            let kind = parse(bad).unwrap_err();
            assert!(
                matches!(
                    kind,
                    clap::error::ErrorKind::ValueValidation | clap::error::ErrorKind::InvalidValue
                ),
                "{bad:?}: {kind:?}"
            );
        }
    }

    /// `--random-init` takes the names of the shape table and nothing else, a misspelled MoE
    /// shape included (it was once built as a dense model).
    #[test]
    fn random_init_takes_a_known_shape() {
        let shape =
            |name: &str| match Cli::try_parse_from(["unmask", "bench", "--random-init", name]) {
                Ok(Cli { command: Some(Command::Bench(b)), .. }) => {
                    Ok(b.random_init.map(|s| s.name))
                }
                Ok(_) => panic!("not bench"),
                Err(e) => Err(e),
            };
        for s in crate::model::random::shape_names() {
            assert_eq!(shape(s).unwrap(), Some(s));
        }
        for bad in ["sdar-1.7bb", "sdar-30b", "SDAR-1.7B", ""] {
            let e = shape(bad).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue, "{bad:?}");
            assert!(e.to_string().contains("[possible values: tiny, qwen3-0.6b, sdar-1.7b, sdar-4b, sdar-8b, moe-small, sdar-30b-a3b, llada2-mini]"), "{e}");
        }
    }

    /// LLaDA2's `generate()` keys, from generation_config.json, under the flags, over a
    /// family's defaults.
    #[test]
    fn editing_settings_come_from_flags_then_the_file_then_the_family() {
        let file = gen(r#"{"steps":6,"editing_threshold":0.7,"eos_early_stop":false}"#);
        let family = GenerationConfig {
            remasking_strategy: Some("joint_threshold".into()),
            block_length: Some(32),
            editing_threshold: Some(0.5),
            max_post_steps: Some(3),
            ..GenerationConfig::default()
        };
        let s = DecodeArgs::default().settings_over(&file, None, &family).unwrap();
        assert_eq!(s.strategy, Strategy::JointThreshold);
        assert_eq!((s.block_length, s.steps), (32, 6));
        assert_eq!((s.edit_threshold, s.max_post_steps, s.eos_early_stop), (0.7, 3, false));
        let flags = DecodeArgs {
            edit_threshold: Some(0.25),
            max_post_steps: Some(0),
            eos_early_stop: Some(true),
            block_length: Some(8),
            ..DecodeArgs::default()
        };
        let s = flags.settings_over(&file, Some(16), &family).unwrap();
        assert_eq!((s.edit_threshold, s.max_post_steps, s.eos_early_stop), (0.25, 0, true));
        assert_eq!(s.block_length, 8);
        // the checkpoint's block size is over the family's
        let s = DecodeArgs::default().settings_over(&file, Some(16), &family).unwrap();
        assert_eq!(s.block_length, 16);
        let e = GenerationConfig::parse(r#"{"steps":4,"denoising_steps":4}"#, "g.json");
        assert_eq!(
            e.unwrap_err().to_string(),
            "g.json: both `denoising_steps` and `steps` are given; keep one"
        );
    }

    fn gen(json: &str) -> GenerationConfig {
        GenerationConfig::parse(json, "m/generation_config.json").unwrap()
    }

    fn settings_err(args: &DecodeArgs, json: &str) -> String {
        format!("{:#}", args.settings(&gen(json), None).unwrap_err())
    }

    /// A bad value taken from generation_config.json names the file and its field; the same
    /// value by flag keeps the flag's message; a flag over a bad file value wins.
    #[test]
    fn generation_config_values_are_checked_as_the_files() {
        let none = DecodeArgs::default();
        let cases = [
            (r#"{"temperature":-1}"#, "field `temperature` is -1; it must be a finite number >= 0"),
            (r#"{"top_p":5}"#, "field `top_p` is 5; it must be within (0, 1]"),
            (r#"{"block_length":0}"#, "field `block_length` is 0; it must be within 1 to 4096"),
            (
                r#"{"denoising_steps":0}"#,
                "field `denoising_steps` is 0; it must be within 1 to 4096",
            ),
            (
                r#"{"confidence_threshold":3}"#,
                "field `confidence_threshold` is 3; it must be within [0, 1]",
            ),
            (r#"{"threshold":3}"#, "field `threshold` is 3; it must be within [0, 1]"),
            (
                r#"{"eb_threshold":-1}"#,
                "field `eb_threshold` is -1; it must be a finite number >= 0",
            ),
            (
                r#"{"max_new_tokens":0}"#,
                "field `max_new_tokens` is 0; it must be within 1 to 1048576",
            ),
            (
                r#"{"remasking_strategy":"zz"}"#,
                "field `remasking_strategy`: unknown strategy \"zz\"",
            ),
            (r#"{"steps":0}"#, "field `steps` is 0; it must be within 1 to 4096"),
            (
                r#"{"editing_threshold":1.5}"#,
                "field `editing_threshold` is 1.5; it must be within [0, 1]",
            ),
            (
                r#"{"max_post_steps":5000}"#,
                "field `max_post_steps` is 5000; it must be within 0 to 4096",
            ),
        ];
        for (json, want) in cases {
            assert_eq!(
                settings_err(&none, json),
                format!("m/generation_config.json: {want}"),
                "{json}"
            );
        }
        let flags = DecodeArgs { temperature: Some(-1.0), ..DecodeArgs::default() };
        assert_eq!(
            settings_err(&flags, "{}"),
            "invalid settings: --temperature must be a finite number >= 0 (got -1)"
        );
        let flags =
            DecodeArgs { temperature: Some(0.5), max_new_tokens: Some(4), ..DecodeArgs::default() };
        let s = flags.settings(&gen(r#"{"temperature":-1,"max_new_tokens":0}"#), None).unwrap();
        assert_eq!((s.sampling.temperature, s.max_new_tokens), (0.5, 4));
        // a file's good value over a flag's bad one: still the flag's message
        let flags = DecodeArgs { top_p: Some(0.0), ..DecodeArgs::default() };
        assert_eq!(
            settings_err(&flags, r#"{"top_p":0.9}"#),
            "invalid settings: --top-p must be within (0, 1] (got 0)"
        );
    }

    /// Either spelling of the threshold is taken; both at once is an error naming the file.
    #[test]
    fn threshold_is_taken_in_either_spelling_not_both() {
        let s =
            DecodeArgs::default().settings(&gen(r#"{"confidence_threshold":0.7}"#), None).unwrap();
        assert_eq!(s.threshold, 0.7);
        let both = GenerationConfig::parse(
            r#"{"threshold":0.7,"confidence_threshold":0.8}"#,
            "m/generation_config.json",
        );
        assert_eq!(
            format!("{:#}", both.unwrap_err()),
            "m/generation_config.json: both `threshold` and `confidence_threshold` are given; keep one"
        );
    }

    /// transformers' `do_sample: false` is greedy search: the file's temperature is not taken
    /// (nor checked); --temperature still wins.
    #[test]
    fn do_sample_false_is_greedy_unless_a_flag_sets_the_temperature() {
        let none = DecodeArgs::default();
        let t = |args: &DecodeArgs, json: &str| {
            args.settings(&gen(json), None).unwrap().sampling.temperature
        };
        assert_eq!(t(&none, r#"{"do_sample":false,"temperature":0.7}"#), 0.0);
        assert_eq!(t(&none, r#"{"do_sample":false,"temperature":-1}"#), 0.0);
        assert_eq!(t(&none, r#"{"do_sample":true,"temperature":0.7}"#), 0.7);
        assert_eq!(t(&none, r#"{"temperature":0.7}"#), 0.7);
        let flag = DecodeArgs { temperature: Some(0.5), ..DecodeArgs::default() };
        assert_eq!(t(&flag, r#"{"do_sample":false,"temperature":0.7}"#), 0.5);
    }

    /// transformers' `do_sample: true` samples with its defaults (temperature 1.0, top-k 50)
    /// for the fields the file leaves out; without `do_sample` an absent field is unmask's.
    #[test]
    fn do_sample_true_fills_in_transformers_defaults() {
        let none = DecodeArgs::default();
        let s = |args: &DecodeArgs, json: &str| {
            let s = args.settings(&gen(json), None).unwrap().sampling;
            (s.temperature, s.top_k, s.top_p)
        };
        assert_eq!(s(&none, r#"{"do_sample":true}"#), (1.0, 50, 1.0));
        assert_eq!(
            s(&none, r#"{"do_sample":true,"temperature":0.6,"top_k":20,"top_p":0.95}"#),
            (0.6, 20, 0.95)
        );
        assert_eq!(s(&none, r#"{"do_sample":true,"top_k":0}"#), (1.0, 0, 1.0));
        assert_eq!(s(&none, r#"{}"#), (0.0, 0, 1.0));
        let flags = DecodeArgs { temperature: Some(0.5), top_k: Some(7), ..DecodeArgs::default() };
        assert_eq!(s(&flags, r#"{"do_sample":true}"#), (0.5, 7, 1.0));
    }

    #[test]
    fn compare_sides_override_the_shared_flags() {
        let cli = Cli::try_parse_from([
            "unmask",
            "compare",
            "--steps",
            "8",
            "--strategy-a",
            "sequential",
            "--threshold-b",
            "0.95",
        ])
        .unwrap();
        let Some(Command::Compare { decode, a, b, .. }) = cli.command else { panic!() };
        let (a, b) = (a.apply(&decode), b.apply(&decode));
        assert_eq!((a.strategy, a.steps, a.threshold), (Some(Strategy::Sequential), Some(8), None));
        assert_eq!((b.strategy, b.steps, b.threshold), (None, Some(8), Some(0.95)));
    }
}
