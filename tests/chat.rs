//! Chat checkpoints end to end, on tests/fixtures/tiny-sdar-chat (the real Qwen3 tokenizer +
//! `<|MASK|>`, SDAR's chat_template.jinja, tiny random weights): prompt ids equal
//! transformers' `apply_chat_template` (tests/fixtures/chat_prompts.json), `--raw`,
//! `--system`, `--chat-arg`, `--prompt-file -`, stop ids, config quirks, `--model ORG/NAME`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use candle_core::{DType, Device};
use serde::Deserialize;
use unmask::model::chat::{ChatTemplate, Message};
use unmask::model::{Checkpoint, Source};
use unmask::trace::events::{Event, Header};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn chat_model() -> PathBuf {
    fixture("tiny-sdar-chat")
}

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<Message>,
    chat_args: BTreeMap<String, serde_json::Value>,
    text: String,
    ids: Vec<u32>,
}

fn golden() -> Vec<Case> {
    let text = std::fs::read_to_string(fixture("chat_prompts.json")).unwrap();
    serde_json::from_str::<Golden>(&text).unwrap().cases
}

fn case(name: &str) -> Case {
    golden().into_iter().find(|c| c.name == name).unwrap()
}

#[test]
fn prompt_ids_equal_transformers_apply_chat_template() {
    let ck = Checkpoint::load(&Source::Dir(chat_model()), &Device::Cpu, DType::F32).unwrap();
    let template: &ChatTemplate =
        ck.chat_template.as_ref().expect("the fixture ships chat_template.jinja");
    assert!(
        template.origin().ends_with("tiny-sdar-chat/chat_template.jinja"),
        "{}",
        template.origin()
    );
    let cases = golden();
    assert_eq!(cases.len(), 7);
    for c in cases {
        let mut vars = ck.template_vars.clone();
        vars.extend(c.chat_args.clone());
        let text = template.render(&c.messages, &vars).unwrap();
        assert_eq!(text, c.text, "case {}", c.name);
        assert_eq!(ck.tokenizer.encode(&text).unwrap(), c.ids, "case {}", c.name);
    }
}

#[test]
fn stop_ids_are_the_union_of_generation_config_config_and_tokenizer_config() {
    let ck = Checkpoint::load(&Source::Dir(chat_model()), &Device::Cpu, DType::F32).unwrap();
    // generation_config [<|im_end|>, <|endoftext|>], config <|endoftext|>, tokenizer_config <|im_end|>.
    assert_eq!(ck.eos_ids, vec![151645, 151643]);
    assert_eq!(ck.tokenizer.mask_id(), 151669);
}

fn unmask(args: &[&str], stdin: Option<&str>, env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_unmask"));
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("running unmask");
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

/// The header of a 4-token greedy trace of `model` with `extra` flags.
fn header_with(model: &str, extra: &[&str], stdin: Option<&str>, env: &[(&str, &Path)]) -> Header {
    let mut args = vec!["trace", "--model", model, "--max-new-tokens", "4", "--temperature", "0"];
    args.extend_from_slice(extra);
    let out = unmask(&args, stdin, env);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let first = String::from_utf8(out.stdout).unwrap().lines().next().unwrap().to_string();
    let Event::Header(h) = serde_json::from_str(&first).unwrap() else {
        panic!("first event is the header")
    };
    *h
}

fn header(extra: &[&str]) -> Header {
    header_with(chat_model().to_str().unwrap(), extra, None, &[])
}

fn error(args: &[&str]) -> String {
    let out = unmask(args, None, &[]);
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    e.trim_end().to_string()
}

#[test]
fn the_template_is_applied_by_default_and_the_header_keeps_the_users_message() {
    let h = header(&["--prompt", "What is 12 * 7?"]);
    let want = case("plain");
    assert_eq!((h.prompt.as_str(), &h.prompt_ids), (want.text.as_str(), &want.ids));
    let chat = h.chat.as_ref().unwrap();
    assert_eq!(
        (chat.user.as_str(), chat.system.as_deref(), chat.template_applied),
        ("What is 12 * 7?", None, true)
    );
    assert_eq!(h.shown_prompt(), "What is 12 * 7?");
    assert_eq!(h.prompt_pieces.concat(), h.prompt);
    assert_eq!(h.eos_ids, vec![151645, 151643]);
    // SDAR-Chat's generation_config sampling, shown in the settings; greedy only by flag here.
    assert_eq!(h.sources["sampling"], "flags over generation_config.json");
    assert_eq!((h.settings.sampling.top_k, h.settings.sampling.top_p), (20, 0.95));
    assert_eq!(h.sources["block_length"], "config.json block_size");
    assert_eq!(h.sources["mask_token"], "config.json mask_token_id");
    assert!(h.sources["chat_template"].ends_with("chat_template.jinja"));
}

#[test]
fn a_chat_checkpoint_without_prompt_gets_a_question_and_its_sampling_defaults() {
    let out = unmask(
        &["trace", "--model", chat_model().to_str().unwrap(), "--max-new-tokens", "4"],
        None,
        &[],
    );
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let first = String::from_utf8(out.stdout).unwrap().lines().next().unwrap().to_string();
    let Event::Header(h) = serde_json::from_str(&first).unwrap() else { panic!() };
    assert_eq!(h.shown_prompt(), unmask::cli::session::DEFAULT_CHAT_PROMPT);
    assert!(h.prompt.starts_with("<|im_start|>user\nWhat is the sum"), "{:?}", h.prompt);
    let s = h.settings.sampling;
    assert_eq!((s.temperature, s.top_k, s.top_p), (0.6, 20, 0.95));
    assert_eq!(h.sources["sampling"], "generation_config.json");
}

#[test]
fn raw_passes_the_prompt_unchanged() {
    let h = header(&["--raw", "--prompt", "ROMEO:\n"]);
    assert_eq!(h.prompt, "ROMEO:\n");
    assert_eq!(h.prompt_ids, vec![3361, 6760, 510]);
    let chat = h.chat.unwrap();
    assert!(!chat.template_applied);
    assert_eq!(chat.user, "ROMEO:\n");
}

#[test]
fn system_and_chat_args_render_as_transformers_does() {
    let h = header(&["--system", "You are a careful math tutor.", "--prompt", "Is 91 prime?"]);
    assert_eq!(h.prompt_ids, case("system").ids);
    assert_eq!(h.chat.unwrap().system.as_deref(), Some("You are a careful math tutor."));
    let h = header(&["--chat-arg", "enable_thinking=false", "--prompt", "What is 2 + 2?"]);
    assert_eq!(h.prompt_ids, case("no_thinking").ids);
    assert_eq!(h.chat.unwrap().chat_args["enable_thinking"], serde_json::json!(false));
}

#[test]
fn prompt_file_from_stdin_keeps_every_byte() {
    let want = case("multiline_trailing_newline");
    let user = &want.messages[0].content;
    assert!(user.ends_with(".\n"));
    let h = header_with(chat_model().to_str().unwrap(), &["--prompt-file", "-"], Some(user), &[]);
    assert_eq!(h.prompt_ids, want.ids);
    assert_eq!(&h.chat.unwrap().user, user);
}

#[test]
fn chat_flags_without_a_template_are_one_line_errors() {
    let base = fixture("tiny-random");
    let e = error(&["trace", "--model", base.to_str().unwrap(), "--system", "Be brief."]);
    assert_eq!(
        e,
        format!(
            "unmask: error: --system: {} has no chat template (no chat_template.jinja, no `chat_template` in tokenizer_config.json)",
            base.display()
        )
    );
    let e = error(&[
        "trace",
        "--model",
        chat_model().to_str().unwrap(),
        "--chat-arg",
        "enable_thinking",
    ]);
    assert_eq!(e, "unmask: error: --chat-arg \"enable_thinking\": expected KEY=VALUE");
    let e = error(&["trace", "--prompt-file", "/nonexistent/q.txt"]);
    assert!(e.starts_with("unmask: error: --prompt-file /nonexistent/q.txt: cannot read: "), "{e}");
}

/// A copy of the chat fixture with `edit` applied to it.
fn edited_copy(edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(chat_model()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    edit(dir.path());
    dir
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn stops_on_im_end_when_only_tokenizer_config_names_it_and_mask_comes_from_the_tokenizer() {
    let dir = edited_copy(|d| {
        edit_json(&d.join("config.json"), |c| {
            for k in ["eos_token_id", "mask_token_id", "block_size"] {
                c.remove(k);
            }
        });
        std::fs::remove_file(d.join("generation_config.json")).unwrap();
    });
    let ck =
        Checkpoint::load(&Source::Dir(dir.path().to_path_buf()), &Device::Cpu, DType::F32).unwrap();
    assert_eq!(ck.eos_ids, vec![151645]);
    assert_eq!(ck.tokenizer.mask_id(), 151669);
    let h = header_with(dir.path().to_str().unwrap(), &[], None, &[]);
    assert_eq!(h.eos_ids, vec![151645]);
    assert_eq!(h.mask_token_id, 151669);
    assert_eq!(h.sources["mask_token"], "tokenizer.json \"<|MASK|>\"");
    assert_eq!(h.sources["block_length"], "default");
    assert_eq!(h.settings.block_length, 4);
    assert_eq!(h.sources["sampling"], "flags");
}

/// A hub cache holding the chat fixture as `Org/NAME` (blobs + snapshot symlinks + refs/main),
/// config.json without `block_size` so the name's `-bN` decides.
fn hub_cache(name: &str) -> tempfile::TempDir {
    let hash = "4f1e3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d";
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join(format!("models--Org--{name}"));
    let snap = repo.join("snapshots").join(hash);
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    for (i, f) in std::fs::read_dir(chat_model()).unwrap().enumerate() {
        let f = f.unwrap().path();
        let blob = repo.join("blobs").join(format!("b{i}"));
        std::fs::copy(&f, &blob).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/b{i}"), snap.join(f.file_name().unwrap()))
            .unwrap();
    }
    let config = snap.join("config.json");
    let real = std::fs::canonicalize(&config).unwrap();
    edit_json(&real, |c| {
        c.remove("block_size");
    });
    std::fs::write(repo.join("refs/main"), hash).unwrap();
    cache
}

#[test]
fn model_ids_resolve_from_the_hub_cache() {
    let cache = hub_cache("tiny-sdar-chat-b8");
    let env = [("HF_HUB_CACHE", cache.path())];
    let h = header_with("Org/tiny-sdar-chat-b8", &["--prompt", "What is 12 * 7?"], None, &env);
    assert_eq!(
        h.model.source, "Org/tiny-sdar-chat-b8@4f1e3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d",
        "the commit decoded"
    );
    assert_eq!(h.prompt_ids, case("plain").ids);
    assert_eq!(h.settings.block_length, 8);
    assert_eq!(h.sources["block_length"], "-b8 in the name \"tiny-sdar-chat-b8\"");
    let out = unmask(&["trace", "--model", "Org/missing", "--revision", "main"], None, &env);
    let e = String::from_utf8(out.stderr).unwrap();
    let want = "models--Org--missing; set HF_HUB_CACHE or HF_HOME, or download it with `hf download Org/missing`)\n";
    assert!(!out.status.success() && e.ends_with(want) && e.lines().count() == 1, "{e}");
    // a revision of a folder names nothing: refused, not ignored
    let out = unmask(
        &["trace", "--model", chat_model().to_str().unwrap(), "--revision", "v2"],
        None,
        &[],
    );
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(
        !out.status.success() && e.contains("--revision v2: ") && e.contains("is a folder"),
        "{e}"
    );
}

#[test]
fn a_block_size_in_the_name_out_of_range_is_blamed_on_the_name() {
    let cache = hub_cache("tiny-sdar-chat-b9999");
    let env = [("HF_HUB_CACHE", cache.path())];
    let out = unmask(
        &["trace", "--model", "Org/tiny-sdar-chat-b9999", "--max-new-tokens", "4"],
        None,
        &env,
    );
    let e = String::from_utf8(out.stderr).unwrap();
    let want = "unmask: error: block length 9999 from -b9999 in the name \"tiny-sdar-chat-b9999\" must be within 1 to 4096; pass --block-length\n";
    assert!(!out.status.success() && e == want, "{e}");
    // a flag that sets the block length makes the name's irrelevant
    let h = header_with("Org/tiny-sdar-chat-b9999", &["--block-length", "4"], None, &env);
    assert_eq!(h.settings.block_length, 4);
}
