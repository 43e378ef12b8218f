//! `unmask export` on a committed trace equals the committed expected tables.

use std::path::{Path, PathBuf};
use std::process::Command;

fn traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces")
}

fn export(trace: &Path, args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_unmask"))
        .arg("export")
        .arg(trace)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn csv_and_json_equal_the_committed_expectations() {
    let trace = traces().join("tiny-dynamic.jsonl");
    for table in ["tokens", "steps", "step_map"] {
        let want =
            std::fs::read_to_string(traces().join(format!("tiny-dynamic.{table}.csv"))).unwrap();
        assert_eq!(export(&trace, &["--table", table]).0, want, "table {table}");
    }
    let want = std::fs::read_to_string(traces().join("tiny-dynamic.json")).unwrap();
    assert_eq!(export(&trace, &["--format", "json"]).0, want);
}

#[test]
fn the_step_map_has_one_entry_per_output_token() {
    let events =
        unmask::trace::file::read_file(&traces().join("tiny-dynamic.jsonl")).unwrap().events;
    let t = unmask::trace::export::tables(&events);
    let Some(unmask::trace::events::Event::Finish(f)) = events.last() else { panic!() };
    assert_eq!(t.step_map.len(), f.output_ids.len());
    let ids: Vec<u32> = t.tokens.iter().map(|r| r.token).collect();
    assert_eq!(ids, f.output_ids, "token rows are the output, in order");
    let committed: usize = t.steps.iter().map(|s| s.committed).sum();
    assert!(committed >= f.output_ids.len());
}

#[test]
fn a_truncated_trace_exports_what_came_before_the_bad_line() {
    let text = std::fs::read_to_string(traces().join("tiny-dynamic.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.jsonl");
    // Three whole lines, then half of the fourth: a recording that died mid-write.
    let half = &lines[3][..lines[3].len() / 2];
    std::fs::write(&cut, format!("{}\n{}\n{}\n{half}", lines[0], lines[1], lines[2])).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_unmask"))
        .args(["export", cut.to_str().unwrap(), "--table", "steps"])
        .output()
        .unwrap();
    let (csv, err) =
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    // written, and a status other than 0 and 1 that says the trace was cut
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("cut.jsonl:4: invalid event")
            && err.ends_with("; exported the events before it\n"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // Lines 1-3 are the header, block 1's only step and its block event.
    assert_eq!(csv.lines().count(), 1 + 1, "CSV header + the one whole step");
}

fn unmask(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_unmask")).args(args).output().unwrap()
}

/// The committed trace's step map as a figure, parsed back: every generated token is one
/// cell, at its position, with its whole text and the fill of the step that decoded it.
#[test]
fn the_svg_figure_has_one_cell_per_generated_token_with_its_text_and_step_colour() {
    use unmask::tui::theme::{pick, Depth, ThemeName};
    let events =
        unmask::trace::file::read_file(&traces().join("tiny-dynamic.jsonl")).unwrap().events;
    let svg = unmask::tui::figure::step_map_svg(&events, &Default::default()).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    let root = doc.root_element();
    assert_eq!(
        (root.tag_name().name(), root.tag_name().namespace()),
        ("svg", Some("http://www.w3.org/2000/svg"))
    );
    let t = unmask::trace::export::tables(&events);
    let store = unmask::trace::store::Store::from_events(events.clone());
    let span = store.run().unwrap().step_span();
    let cells: Vec<_> =
        doc.descendants().filter(|n| n.attribute("class") == Some("decoded")).collect();
    assert_eq!(cells.len(), t.tokens.len());
    let theme = pick(ThemeName::Light, Depth::TrueColor);
    for (g, row) in cells.iter().zip(&t.tokens) {
        assert_eq!(g.attribute("data-pos"), Some(row.pos.to_string().as_str()));
        assert_eq!(g.attribute("data-step"), Some(row.block_step.to_string().as_str()), "1-based");
        let rect = g.children().find(|c| c.has_tag_name("rect")).unwrap();
        let (r, gr, b) = theme.cell_rgb(row.block_step - 1, span).0;
        assert_eq!(
            rect.attribute("fill"),
            Some(format!("#{r:02x}{gr:02x}{b:02x}").as_str()),
            "pos {}",
            row.pos
        );
        let text = g.children().find(|c| c.has_tag_name("text")).unwrap().text().unwrap_or("");
        let shown = unmask::glyph::escape(&row.text, unmask::glyph::Mode::Cell);
        assert_eq!(text, shown, "pos {}: the whole token", row.pos);
    }
    insta::assert_snapshot!(svg);
}

#[test]
fn export_svg_writes_the_figure_and_refuses_overwriting_the_trace() {
    let trace = traces().join("tiny-dynamic.jsonl");
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("map.svg");
    let out = unmask(&[
        "export".as_ref(),
        trace.as_os_str(),
        "--format".as_ref(),
        "svg".as_ref(),
        "--out".as_ref(),
        map.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    let events = unmask::trace::file::read_file(&trace).unwrap().events;
    assert_eq!(
        std::fs::read_to_string(&map).unwrap(),
        unmask::tui::figure::step_map_svg(&events, &Default::default()).unwrap()
    );

    // --out naming the trace itself is refused before anything is written.
    let copy = dir.path().join("t.jsonl");
    std::fs::copy(&trace, &copy).unwrap();
    let out = unmask(&[
        "export".as_ref(),
        copy.as_os_str(),
        "--format".as_ref(),
        "svg".as_ref(),
        "--out".as_ref(),
        copy.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--out would overwrite the trace"), "{err}");
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&trace).unwrap());

    // A trace with nothing decoded: a one-line error naming the file.
    let head = dir.path().join("head.jsonl");
    let first = std::fs::read_to_string(&trace).unwrap().lines().next().unwrap().to_string();
    std::fs::write(&head, first + "\n").unwrap();
    let out = unmask(&["export".as_ref(), head.as_os_str(), "--format".as_ref(), "svg".as_ref()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(
            "head.jsonl: cannot draw the step map: the trace has no decoded token to draw"
        ),
        "{err}"
    );
}

/// A trace with token edits: the tokens table holds the final tokens with the step that set
/// each and its edit count, the step map the final steps, `--table edits` every edit; JSON
/// holds the edits table too.
#[test]
fn a_trace_with_edits_exports_final_tokens_and_the_edits() {
    let trace = traces().join("edits.jsonl");
    let (tokens, _) = export(&trace, &["--table", "tokens"]);
    let lines: Vec<&str> = tokens.lines().collect();
    assert_eq!(
        lines[0],
        "pos,index,block,step,block_step,forward,final_step,final_block_step,edits,token,text,conf,entropy"
    );
    assert!(lines[2].starts_with("7,1,1,1,1,1,2,2,1,10, It,0.9038231,"), "{tokens}");
    let (edits, _) = export(&trace, &["--table", "edits"]);
    let lines: Vec<&str> = edits.lines().collect();
    assert_eq!(
        lines[..3],
        [
            "step,block,block_step,forward,pos,index,from,to,from_text,to_text,conf,entropy",
            "2,1,2,2,7,1,15,10, purr, It,0.9038231,0.19235384",
            "7,2,4,7,11,5,19,22, dream, fish,0.86701596,0.26596808",
        ]
    );
    assert_eq!(lines.len(), 1 + 9);
    let (map, _) = export(&trace, &["--table", "step_map"]);
    assert!(map.starts_with("index,step_map\n0,2\n1,2\n2,4\n3,3\n4,5\n5,5\n"), "{map}");
    let (json, _) = export(&trace, &["--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["edits"].as_array().unwrap().len(), 9);
    assert_eq!(v["tokens"][5]["edits"], 2);
    let events = unmask::trace::file::read_file(&trace).unwrap().events;
    let Some(unmask::trace::events::Event::Finish(f)) = events.last() else { panic!() };
    let ids: Vec<u64> =
        v["tokens"].as_array().unwrap().iter().map(|r| r["token"].as_u64().unwrap()).collect();
    assert_eq!(ids, f.output_ids.iter().map(|&t| u64::from(t)).collect::<Vec<_>>());
}

fn run_ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_unmask")).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// One numbering for people: for every output token of a trace (with and without edits), the
/// step `unmask steps` lists it on, the CSV's and the JSON export's `step` and `block_step`,
/// and the step map agree; with edits, `final_step` is the steps line that last edited it.
#[test]
fn steps_csv_json_and_the_step_map_agree_on_every_token() {
    for name in ["tiny-dynamic.jsonl", "edits.jsonl"] {
        let trace = traces().join(name);
        let t = trace.to_str().unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&run_ok(&["export", t, "--format", "json"])).unwrap();
        let csv = run_ok(&["export", t, "--table", "tokens"]);
        // a real CSV reader: a token's text may hold a comma, a quote or a line break
        let mut reader = csv::Reader::from_reader(csv.as_bytes());
        let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
        let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        let col = |row: &csv::StringRecord, name: &str| -> u64 {
            let i = header.iter().position(|h| h == name).unwrap();
            row[i].parse().unwrap()
        };
        // (pos -> (step, block_step)) of the line that committed it, and of the last edit
        let mut committed = std::collections::HashMap::new();
        let mut edited = std::collections::HashMap::new();
        for line in run_ok(&["steps", t, "--json"]).lines() {
            let s: serde_json::Value = serde_json::from_str(line).unwrap();
            if s.get("finish").is_some() || s.get("block_done").is_some() {
                continue;
            }
            let at = (s["step"].as_u64().unwrap(), s["block_step"].as_u64().unwrap());
            for p in s["pos"].as_array().unwrap() {
                committed.insert(p.as_u64().unwrap(), at);
            }
            for e in s.get("edits").and_then(|e| e.as_array()).into_iter().flatten() {
                edited.insert(e["pos"].as_u64().unwrap(), at);
            }
        }
        let rows = &records;
        let tokens = json["tokens"].as_array().unwrap();
        assert_eq!(rows.len(), tokens.len(), "{name}");
        for (i, (row, tok)) in rows.iter().zip(tokens).enumerate() {
            let pos = tok["pos"].as_u64().unwrap();
            let at = format!("{name}: token {i} (pos {pos})");
            let (step, block_step) = committed[&pos];
            assert_eq!((col(row, "step"), col(row, "block_step")), (step, block_step), "{at}: CSV");
            assert_eq!(
                (tok["step"].as_u64().unwrap(), tok["block_step"].as_u64().unwrap()),
                (step, block_step),
                "{at}: JSON"
            );
            let (final_step, final_block_step) =
                edited.get(&pos).copied().unwrap_or((step, block_step));
            if header.iter().any(|h| h == "final_step") {
                assert_eq!(col(row, "final_step"), final_step, "{at}: CSV final_step");
                assert_eq!(tok["final_block_step"].as_u64().unwrap(), final_block_step, "{at}");
            }
            assert_eq!(json["step_map"][i].as_u64().unwrap(), final_block_step, "{at}: step_map");
        }
        assert!(!edited.is_empty() || name == "tiny-dynamic.jsonl", "{name} edits");
    }
}

/// The edits fixture with two tokens respelled: ` was` as `cjk`, ` warm` as ` ≈ ∑`.
fn respelled(dir: &Path, name: &str, cjk: &str) -> PathBuf {
    let text = std::fs::read_to_string(traces().join("edits.jsonl")).unwrap();
    let text = text.replace(r#""text":" was""#, &format!(r#""text":"{cjk}""#));
    let text = text.replace(r#""text":" warm""#, r#""text":" ≈ ∑""#);
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A decoded PNG: width, height, RGB rows.
fn decode_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut r = png::Decoder::new(file).read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    let info = r.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// The pixels of the text area (above the confidence bar) of the first cell showing `text`, at
/// `dpi`: found in the SVG the PNG was drawn from.
fn text_area(svg: &str, text: &str, png: &(u32, u32, Vec<u8>), dpi: f64) -> Vec<u8> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    let cell = doc
        .descendants()
        .find(|g| g.children().any(|c| c.has_tag_name("text") && c.text() == Some(text)))
        .unwrap_or_else(|| panic!("no cell shows {text}"));
    let rect = cell.children().find(|c| c.has_tag_name("rect")).unwrap();
    let at = |a: &str| rect.attribute(a).unwrap().parse::<f64>().unwrap() * dpi / 72.0;
    let (x0, y0, w) = (at("x").ceil() as usize, at("y").ceil() as usize, at("width") as usize);
    let h = (12.0 * dpi / 72.0) as usize;
    let (width, _, px) = png;
    (y0..y0 + h)
        .flat_map(|y| {
            let row = (y * *width as usize + x0) * 3;
            px[row..row + (w - 1) * 3].to_vec()
        })
        .collect()
}

/// `export --format png`: an image `--width` points times dpi/72 wide, the figure's SVG drawn
/// with the bundled fonts: the CJK and math tokens' cells hold glyphs, not the box a missing
/// glyph prints as. (Every box is the same glyph, so swapping two characters leaves the
/// pixels of a box as they were, and changes those of real glyphs.)
#[test]
fn export_png_draws_cjk_and_math_at_the_asked_size() {
    let dir = tempfile::tempdir().unwrap();
    // The PNG with `layout` and `dpi`, and the SVG it was drawn from.
    let png_of = |trace: &Path, layout: &[&str], dpi: &[&str]| {
        let out = dir.path().join(format!("{}.png", trace.file_stem().unwrap().to_str().unwrap()));
        let t = trace.to_str().unwrap();
        let o = out.to_str().unwrap();
        run_ok(&[&["export", t, "--format", "png", "--out", o], layout, dpi].concat());
        let svg = run_ok(&[&["export", t, "--format", "svg"], layout].concat());
        (decode_png(&out), svg)
    };
    let wide = ["--width", "504"];
    let dpi = ["--dpi", "144"];
    let hello = respelled(dir.path(), "hello.jsonl", "你好");
    let (img, svg) = png_of(&hello, &wide, &dpi);
    assert_eq!(img.0, 504 * 2, "width x dpi/72");
    let svg_h: f64 = roxmltree::Document::parse(&svg)
        .unwrap()
        .root_element()
        .attribute("height")
        .unwrap()
        .trim_end_matches("pt")
        .parse()
        .unwrap();
    assert_eq!(img.1, (svg_h * 2.0).round() as u32);
    let (default, _) = png_of(&hello, &[], &[]);
    assert_eq!(default.0, 1000, "240 pt at 300 dpi");

    let area = |img, svg: &str, text| text_area(svg, text, img, 144.0);
    let cjk = area(&img, &svg, "你好");
    let background = cjk[..3].to_vec();
    let inked = cjk.chunks(3).filter(|p| *p != background.as_slice()).count();
    assert!(inked > cjk.len() / 3 / 10, "glyphs were drawn: {inked} of {} pixels", cjk.len() / 3);
    let math = area(&img, &svg, "·≈·∑");
    assert!(math.chunks(3).filter(|p| *p != &math[..3]).count() > 20);

    let swapped = respelled(dir.path(), "swapped.jsonl", "好你");
    let (img2, svg2) = png_of(&swapped, &wide, &dpi);
    assert_ne!(cjk, area(&img2, &svg2, "好你"), "你 and 好 are two glyphs, not two boxes");
    // The check itself: Thai has no bundled font, and its boxes swap unseen.
    let thai = respelled(dir.path(), "thai.jsonl", "กข");
    let (img3, svg3) = png_of(&thai, &wide, &dpi);
    let thai_swapped = respelled(dir.path(), "thai2.jsonl", "ขก");
    let (img4, svg4) = png_of(&thai_swapped, &wide, &dpi);
    assert_eq!(area(&img3, &svg3, "กข"), area(&img4, &svg4, "ขก"), "boxes");
}

/// The PNG is refused where the SVG is: the trace as --out, before anything is written; and
/// it never goes to a terminal (an image there is noise).
#[test]
fn export_png_refuses_what_the_svg_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("t.jsonl");
    std::fs::copy(traces().join("tiny-dynamic.jsonl"), &copy).unwrap();
    let before = std::fs::read(&copy).unwrap();
    let c = copy.to_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_unmask"))
        .args(["export", c, "--format", "png", "--out", c])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--out would overwrite the trace"), "{err}");
    assert_eq!(std::fs::read(&copy).unwrap(), before);
    // A layout that cannot be drawn: a one-line error, no file.
    let png = dir.path().join("map.png");
    let out = Command::new(env!("CARGO_BIN_EXE_unmask"))
        .args(["export", c, "--format", "png", "--width", "160", "--blocks-per-row", "4"])
        .arg("--out")
        .arg(&png)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("--blocks-per-row 4: 4 blocks a row need"), "{err}");
    assert!(!png.exists());
    // Figure flags are refused with a table format, --dpi with the SVG.
    for (args, want) in [
        (&["--format", "csv", "--width", "504"][..], "--width shapes the figure"),
        (&["--format", "json", "--step-range", "1..2"][..], "--step-range shapes the figure"),
        (&["--format", "svg", "--dpi", "600"][..], "--dpi sets the PNG's pixels"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_unmask"))
            .args(["export", c])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
    }
}
