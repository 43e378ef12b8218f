//! `unmask record --gif` and `unmask replay --gif`: the GIF decodes (the gif crate), one frame
//! per screen of the cast of the same recording, the picture is the TUI's cells at 8×16 pixels
//! each, in the theme's colours, and its last frame is exactly the TUI's final screen drawn.

use std::path::Path;
use std::process::{Command, Output};

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use unmask::tui::gif::raster::{Look, Raster, Scale, CELL_H, CELL_W};
use unmask::tui::gif::unifont::Font;
use unmask::tui::record::{final_app, Pacing};
use unmask::tui::theme::{pick, Depth, Rgb, Theme, ThemeName, DARK_PALETTE};

const BIN: &str = env!("CARGO_BIN_EXE_unmask");
const CHAT: &str = "tests/fixtures/tiny-sdar-chat";
const TRACE: &str = "tests/fixtures/traces/tiny-dynamic.jsonl";
const W: u16 = 100;
const H: u16 = 32;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn unmask(args: &[&str]) -> Output {
    let out = Command::new(BIN)
        .current_dir(root())
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .expect("running unmask");
    assert!(out.status.success(), "unmask {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A GIF as a viewer plays it: its size, and each frame (drawn over the frames before) with
/// its delay in hundredths of a second.
struct Played {
    width: usize,
    height: usize,
    frames: Vec<(u16, Vec<Rgb>)>,
}

fn play(path: &Path) -> Played {
    let mut opts = gif::DecodeOptions::new();
    opts.set_color_output(gif::ColorOutput::RGBA);
    let mut d = opts.read_info(std::fs::File::open(path).unwrap()).unwrap();
    let (width, height) = (d.width() as usize, d.height() as usize);
    let mut canvas = vec![(0, 0, 0); width * height];
    let mut frames = Vec::new();
    while let Some(f) = d.read_next_frame().unwrap() {
        let fw = f.width as usize;
        for (k, px) in f.buffer.chunks(4).enumerate() {
            if px[3] != 0 {
                let (x, y) = (f.left as usize + k % fw, f.top as usize + k / fw);
                canvas[y * width + x] = (px[0], px[1], px[2]);
            }
        }
        frames.push((f.delay, canvas.clone()));
    }
    Played { width, height, frames }
}

/// The TUI's final screen of the trace at `trace` (`label`: as `record` labels it, `None` for
/// a live decode), drawn as the GIF draws it.
fn final_picture(
    trace: &Path,
    label: Option<&str>,
    theme: &'static Theme,
    scale: Scale,
) -> Vec<Rgb> {
    let t = unmask::trace::file::read_file(trace).unwrap();
    let p = Pacing { fps: 30.0, step_delay: 0.05, width: W, height: H, theme };
    let app = final_app(t.events, label.map(str::to_string), t.stopped, &p);
    let mut buf = Buffer::empty(Rect::new(0, 0, W, H));
    unmask::tui::render(&app, buf.area, &mut buf);
    let mut r = Raster::new(Font::bundled().unwrap(), Look::of(theme), scale, W, H);
    r.draw(&buf);
    r.pixels().to_vec()
}

/// The colours of cell (col, row) at scale 1.
fn cell_colours(
    p: &Played,
    frame: usize,
    col: usize,
    row: usize,
) -> std::collections::BTreeSet<Rgb> {
    let px = &p.frames[frame].1;
    (0..CELL_H)
        .flat_map(|y| (0..CELL_W).map(move |x| (row * CELL_H + y) * p.width + col * CELL_W + x))
        .map(|i| px[i])
        .collect()
}

#[test]
fn record_gif_draws_the_tui_s_screens_to_its_final_one() {
    let d = tempfile::tempdir().unwrap();
    let (gif, cast, trace) =
        (d.path().join("r.gif"), d.path().join("r.cast"), d.path().join("r.jsonl"));
    let (g, c, t) = (gif.to_str().unwrap(), cast.to_str().unwrap(), trace.to_str().unwrap());
    let prompt = "≈ ∑ 你好";
    let size = ["--width", "100", "--height", "32"];
    let args = ["record", "--model", CHAT, "--prompt", prompt, "--max-new-tokens", "16"];
    unmask(&[&args[..], &["--gif", g, "--cast", c, "--trace", t], &size[..]].concat());
    let p = play(&gif);
    assert_eq!((p.width, p.height), (W as usize * CELL_W, H as usize * CELL_H));
    assert!(p.frames.len() > 1, "{} frames", p.frames.len());
    // The same screens and times as the cast: a frame per screen that changed, the last held.
    let (_, events) = unmask::tui::cast::parse(&std::fs::read_to_string(&cast).unwrap()).unwrap();
    assert!(
        p.frames.len() < events.len(),
        "{} frames, {} cast events",
        p.frames.len(),
        events.len()
    );
    let total: u64 = p.frames.iter().map(|f| f.0 as u64).sum();
    assert_eq!(total, (events.last().unwrap().0 * 100.0).round() as u64);
    assert!(p.frames.last().unwrap().0 >= 200, "the final screen, then the hold");
    let dark = pick(ThemeName::Dark, Depth::TrueColor);
    let last = p.frames.len() - 1;
    assert!(
        p.frames[last].1 == final_picture(&trace, None, dark, Scale::One),
        "the last frame is the TUI's final screen"
    );
    // The brand, top left: the theme's accent, its letters in the prompt background's colour.
    let (a, pb) = (DARK_PALETTE.accent, DARK_PALETTE.prompt_bg);
    assert_eq!(cell_colours(&p, 0, 0, 0), [a].into());
    assert_eq!(cell_colours(&p, 0, 1, 0), [a, pb].into(), "the bold u of unmask");
    // Nothing drawn at the bottom right: the theme's background.
    assert_eq!(
        cell_colours(&p, last, W as usize - 1, H as usize - 1),
        [DARK_PALETTE.background].into()
    );
}

/// `--mono` draws in the terminal's two colours, `--theme light` on white, `--gif-scale 2`
/// twice the size; each last frame is the TUI's final screen in that look.
#[test]
fn replay_gif_takes_the_look_flags_and_the_scale() {
    let d = tempfile::tempdir().unwrap();
    let gif = |name: &str, flags: &[&str]| {
        let path = d.path().join(name);
        let args =
            ["replay", TRACE, "--gif", path.to_str().unwrap(), "--width", "100", "--height", "32"];
        unmask(&[&args[..], flags].concat());
        play(&path)
    };
    let mono = gif("mono.gif", &["--mono"]);
    let theme = pick(ThemeName::Dark, Depth::Mono);
    let colours: std::collections::BTreeSet<Rgb> =
        mono.frames.iter().flat_map(|f| f.1.iter().copied()).collect();
    let (text, back) = theme.screen_rgb();
    assert_eq!(colours, [text, back].into());
    assert!(
        mono.frames.last().unwrap().1
            == final_picture(Path::new(TRACE), Some(TRACE), theme, Scale::One)
    );

    let light = gif("light.gif", &["--theme", "light", "--gif-scale", "2"]);
    assert_eq!((light.width, light.height), (W as usize * CELL_W * 2, H as usize * CELL_H * 2));
    let theme = pick(ThemeName::Light, Depth::TrueColor);
    assert_eq!(theme.screen_rgb().1, (0xff, 0xff, 0xff));
    assert!(
        light.frames.last().unwrap().1
            == final_picture(Path::new(TRACE), Some(TRACE), theme, Scale::Two)
    );
}

/// The GIF of a 256-token decode of the embedded model (its trace, as `unmask trace
/// --max-new-tokens 256` writes it) at the default size, 120×40, is small enough for a README.
#[test]
fn a_256_token_decode_of_the_embedded_model_is_under_2_mb() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("embedded.gif");
    unmask(&[
        "replay",
        "tests/fixtures/traces/embedded-256.jsonl",
        "--gif",
        path.to_str().unwrap(),
    ]);
    let bytes = std::fs::metadata(&path).unwrap().len();
    assert!(bytes < 2_000_000, "{bytes} bytes");
    let p = play(&path);
    assert_eq!((p.width, p.height), (120 * CELL_W, 40 * CELL_H));
    assert!(p.frames.len() > 100, "{} frames", p.frames.len());
}
