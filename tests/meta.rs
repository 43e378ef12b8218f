//! What the binary says about itself and its surroundings: `--version`, `--help`'s defaults,
//! shell completions, man pages, and `unmask models` over a Hugging Face cache.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::fixture;

fn unmask(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_unmask"));
    cmd.args(args).env_remove("HF_HUB_CACHE").env_remove("HF_HOME");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running unmask")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn version_names_the_commit_and_the_devices_built_in() {
    let v = stdout(&unmask(&["--version"], &[]));
    assert!(v.starts_with(&format!("unmask {} (commit ", env!("CARGO_PKG_VERSION"))), "{v}");
    let want = if cfg!(feature = "cuda") { "CUDA built in" } else { "CPU only" };
    assert!(v.contains(want), "{v}");
    assert!(!v.contains("commit unknown"), "built from a git checkout: {v}");
}

#[test]
fn help_shows_every_decode_default_as_it_runs() {
    let defaults = unmask::cli::decode_defaults();
    for cmd in [&["--help"][..], &["trace", "--help"], &["compare", "--help"], &["steps", "--help"]]
    {
        let help = stdout(&unmask(cmd, &[]));
        for (id, value) in &defaults {
            let flag = format!("--{}", id.replace('_', "-"));
            let at = help.find(&format!("{flag} <")).unwrap_or_else(|| panic!("{cmd:?}: {flag}"));
            let entry = &help[at..];
            let entry = &entry[..entry[2..].find("\n      --").map_or(entry.len(), |e| e + 2)];
            assert!(
                entry.contains(&format!("[default: {value}, unless the checkpoint sets it]")),
                "{cmd:?} {flag}: {entry}"
            );
        }
    }
    let d = unmask::engine::settings::DecodeSettings::default();
    let strategy = defaults.iter().find(|(id, _)| *id == "strategy").unwrap();
    assert_eq!(strategy.1, d.strategy.name());
}

#[test]
fn compare_help_groups_each_side_under_its_heading() {
    let help = stdout(&unmask(&["compare", "--help"], &[]));
    let a = help.find("Side A only").expect("side A heading");
    let b = help.find("Side B only").expect("side B heading");
    assert!(a < help.find("--strategy-a").unwrap() && help.find("--strategy-a").unwrap() < b);
    assert!(b < help.find("--strategy-b").unwrap());
}

#[test]
fn completions_cover_every_shell_and_the_flags() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout(&unmask(&["completions", shell], &[]));
        assert!(script.contains("max-new-tokens"), "{shell}");
        assert!(script.contains("joint_threshold"), "{shell}: strategy values");
    }
    let out = unmask(&["completions", "tcsh"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[possible values: bash, elvish"));
}

#[test]
fn man_pages_render_one_per_command() {
    let page = stdout(&unmask(&["man"], &[]));
    assert!(page.starts_with(".ie") && page.contains(".TH unmask 1"), "{}", &page[..200]);
    let dir = tempfile::tempdir().unwrap();
    stdout(&unmask(&["man", "--dir", dir.path().to_str().unwrap()], &[]));
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    for want in ["unmask.1", "unmask-trace.1", "unmask-compare.1", "unmask-models.1"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("check-device")), "{names:?}");
    let trace = std::fs::read_to_string(dir.path().join("unmask-trace.1")).unwrap();
    assert!(trace.contains("unless the checkpoint sets it"));
    let out = unmask(&["man", "--dir", "/nonexistent/man"], &[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "unmask: error: --dir /nonexistent/man: not a folder"
    );
}

/// A hub cache as huggingface_hub writes one: a loadable chat checkpoint (blobs and a snapshot
/// of symlinks, refs/main), a model of another family, a download with no weights.
fn cache() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let repo = root.path().join("models--JetAstra--SDAR-tiny-Chat");
    let hash = "0123456789abcdef0123456789abcdef01234567";
    let snap = repo.join("snapshots").join(hash);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), hash).unwrap();
    for f in std::fs::read_dir(fixture("tiny-sdar-chat")).unwrap() {
        let f = f.unwrap();
        let blob = repo.join("blobs").join(f.file_name());
        std::fs::copy(f.path(), &blob).unwrap();
        std::os::unix::fs::symlink(&blob, snap.join(f.file_name())).unwrap();
    }
    let bert = root.path().join("models--google--bert-base/snapshots/aa");
    std::fs::create_dir_all(&bert).unwrap();
    std::fs::write(bert.join("config.json"), r#"{"model_type": "bert"}"#).unwrap();
    let partial = root.path().join("models--JetAstra--SDAR-half/snapshots/bb");
    std::fs::create_dir_all(&partial).unwrap();
    for f in ["config.json", "tokenizer.json.gz"] {
        std::fs::copy(fixture("tiny-sdar-chat").join(f), partial.join(f)).unwrap();
    }
    std::fs::create_dir_all(root.path().join("datasets--a--b")).unwrap();
    root
}

#[test]
fn models_lists_what_model_org_name_loads() {
    let root = cache();
    let env = [("HF_HUB_CACHE", root.path())];
    let table = stdout(&unmask(&["models"], &env));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["MODEL", "REVISION", "FAMILY", "PARAMS", "SIZE"]
    );
    assert!(lines[1].starts_with("JetAstra/SDAR-tiny-Chat  main"), "{table}");
    assert!(lines[1].contains(" sdar "), "{table}");
    assert_eq!(
        lines[2],
        "(2 other snapshots in the cache that unmask cannot load: --all lists them and why)"
    );
    let all = stdout(&unmask(&["models", "--all"], &env));
    assert!(all.contains("model_type \"bert\" is not a family unmask decodes"), "{all}");
    assert!(all.contains("JetAstra/SDAR-half") && all.contains("no model.safetensors"), "{all}");
    // every row it lists loads by the id and revision it shows
    let json = stdout(&unmask(&["models", "--json"], &env));
    let row: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(row["model"], "JetAstra/SDAR-tiny-Chat");
    let id = row["model"].as_str().unwrap();
    let rev = row["revision"].as_str().unwrap();
    let args =
        ["trace", "--model", id, "--revision", rev, "--prompt", "Hi", "--max-new-tokens", "4"];
    stdout(&unmask(&args, &env));
}

#[test]
fn models_without_a_cache_says_where_it_looked() {
    let out = unmask(&["models"], &[("HF_HUB_CACHE", Path::new("/nonexistent/hub"))]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "unmask: no Hugging Face cache at /nonexistent/hub (HF_HUB_CACHE or HF_HOME set another)"
    );
    let out = unmask(&["models", "--strategy", "sequential"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--strategy has no effect there"));
}
