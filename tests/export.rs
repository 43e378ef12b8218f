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
        let want = std::fs::read_to_string(traces().join(format!("tiny-dynamic.{table}.csv"))).unwrap();
        assert_eq!(export(&trace, &["--table", table]).0, want, "table {table}");
    }
    let want = std::fs::read_to_string(traces().join("tiny-dynamic.json")).unwrap();
    assert_eq!(export(&trace, &["--format", "json"]).0, want);
}

#[test]
fn the_step_map_has_one_entry_per_output_token() {
    let events = unmask::trace::read_file(&traces().join("tiny-dynamic.jsonl")).unwrap().events;
    let t = unmask::export::tables(&events);
    let Some(unmask::events::Event::Finish(f)) = events.last() else { panic!() };
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
    let (csv, err) = export(&cut, &["--table", "steps"]);
    assert!(err.contains("cut.jsonl:4: invalid event"), "{err}");
    // Lines 1-3 are the header, block 1's only step and its block event.
    assert_eq!(csv.lines().count(), 1 + 1, "CSV header + the one whole step");
}
