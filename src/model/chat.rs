//! Chat templates: messages + a checkpoint's Jinja template -> the prompt text, exactly as
//! transformers' `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`
//! renders it. Pure: no files, no tokenizer (the session reads the template and tokenizes).
//!
//! transformers renders with Jinja2 (`trim_blocks`, `lstrip_blocks`, loop controls), adds
//! `raise_exception` and its own `tojson`, and passes the tokenizer's special tokens
//! (`bos_token`, `eos_token`, ...) plus any extra keyword arguments as variables. minijinja with
//! minijinja-contrib's Python string methods (as Hugging Face's text-generation-inference
//! does) runs the real Qwen3 / SDAR templates; tests/chat_template.rs checks the ids against
//! transformers' own.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};
use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message { role: role.to_string(), content: content.to_string() }
    }
}

/// The conversation unmask decodes: an optional system message, then the user's message.
pub fn conversation(system: Option<&str>, user: &str) -> Vec<Message> {
    system
        .map(|s| Message::new("system", s))
        .into_iter()
        .chain([Message::new("user", user)])
        .collect()
}

/// Template variables (`--chat-arg`, special tokens): name -> JSON value.
pub type Vars = BTreeMap<String, serde_json::Value>;

/// A checkpoint's chat template, with where it came from for error messages.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    origin: String,
}

impl ChatTemplate {
    /// Checks that `source` compiles; `origin` names the file (and key) in errors.
    pub fn new(source: String, origin: String) -> Result<Self> {
        // (it would render every prompt as nothing, the user's message dropped)
        if source.trim().is_empty() {
            bail!("{origin}: the chat template is empty (use --raw to decode the prompt as given)");
        }
        let t = ChatTemplate { source, origin };
        t.env().template_from_str(&t.source).map_err(|e| t.error(e))?;
        Ok(t)
    }

    /// The template of a tokenizer_config.json `chat_template` value: a string, or a list of
    /// `{name, template}` of which the one named `default` is used (as transformers does).
    pub fn from_config_value(v: &serde_json::Value, origin: &str) -> Result<Self> {
        let source = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(list) => {
                let found =
                    list.iter().find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"));
                let Some(t) = found else {
                    bail!("{origin}: field `chat_template` is a list without a template named \"default\"");
                };
                match t.get("template") {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    _ => bail!("{origin}: field `chat_template`: the \"default\" entry has no string `template`"),
                }
            }
            other => {
                bail!("{origin}: field `chat_template` must be a string or a list, not {other}")
            }
        };
        ChatTemplate::new(source, format!("{origin} (chat_template)"))
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Fails on the first of `keys` that is a variable the template never reads (a typo:
    /// `enable_thinkng`), naming the ones it does.
    pub fn check_reads<'k>(&self, keys: impl IntoIterator<Item = &'k String>) -> Result<()> {
        let env = self.env();
        let tmpl = env.template_from_str(&self.source).map_err(|e| self.error(e))?;
        let mut reads: Vec<String> = tmpl.undeclared_variables(false).into_iter().collect();
        let Some(key) = keys.into_iter().find(|k| !reads.contains(k)) else {
            return Ok(());
        };
        // not the variables unmask sets itself, nor the environment's functions (namespace, range)
        let globals: Vec<&str> = env.globals().map(|(name, _)| name).collect();
        reads.retain(|r| {
            !matches!(r.as_str(), "messages" | "add_generation_prompt")
                && !globals.contains(&r.as_str())
        });
        reads.sort();
        bail!(
            "--chat-arg {key}: {} reads no variable of that name (it reads: {})",
            self.origin,
            reads.join(", ")
        )
    }

    /// The prompt for `messages`, with a generation prompt, `vars` as extra variables (they
    /// override nothing the call sets itself: `messages`, `add_generation_prompt`), within the
    /// [`Budget`] of their size: a template that loops or writes past it is a one-line error,
    /// not a hang or an allocation that aborts the process.
    pub fn render(&self, messages: &[Message], vars: &Vars) -> Result<String> {
        self.render_within(messages, vars, Budget::for_input(messages, vars)).map(|(text, _)| text)
    }

    /// [`ChatTemplate::render`] under `budget`, with the fuel it took, on a thread of its own
    /// (the caller's stack might be a 2 MiB one): minijinja prints, compares and drops values by
    /// recursion, and a template can nest a list a level for every 1.6 fuel it spends. The
    /// fuel is capped to what the thread's stack holds ([`STACK_PER_FUEL`]); where the address
    /// space left cannot give [`RENDER_STACKS`]' first, the second (a stack overflow would abort
    /// the process).
    fn render_within(
        &self,
        messages: &[Message],
        vars: &Vars,
        budget: Budget,
    ) -> Result<(String, u64)> {
        let mut failed = None;
        for stack in RENDER_STACKS {
            let budget =
                Budget { fuel: budget.fuel.min((stack / STACK_PER_FUEL) as u64), ..budget };
            let rendered = std::thread::scope(|scope| {
                let job = std::thread::Builder::new()
                    .name("chat template".into())
                    .stack_size(stack)
                    .spawn_scoped(scope, || {
                        crate::panics::catch(|| self.render_here(messages, vars, budget))
                    })
                    .ok()?;
                Some(match job.join() {
                    Ok(Ok(rendered)) => rendered,
                    Ok(Err(panic)) => {
                        Err(anyhow!("{}: chat template failed: {panic}", self.origin))
                    }
                    Err(_) => Err(anyhow!(
                        "{}: chat template failed: internal error (panic)",
                        self.origin
                    )),
                })
            });
            match rendered {
                Some(r) => return r,
                None => failed = Some(stack),
            }
        }
        bail!(
            "{}: cannot start a thread with a stack of {} MiB to render the chat template (too little address space left)",
            self.origin,
            failed.unwrap_or_default() >> 20
        )
    }

    fn render_here(
        &self,
        messages: &[Message],
        vars: &Vars,
        budget: Budget,
    ) -> Result<(String, u64)> {
        let mut env = self.env();
        env.set_fuel(Some(budget.fuel));
        let tmpl = env.template_from_str(&self.source).map_err(|e| self.error(e))?;
        let mut ctx: BTreeMap<String, Value> =
            vars.iter().map(|(k, v)| (k.clone(), Value::from(Serde(v)))).collect();
        ctx.insert("messages".into(), Value::from(Serde(messages)));
        ctx.insert("add_generation_prompt".into(), Value::from(true));
        ctx.entry("tools".into()).or_insert(Value::from(()));
        ctx.entry("documents".into()).or_insert(Value::from(()));
        let mut out = Capped { text: Vec::new(), cap: budget.output, over: false };
        let rendered = tmpl.render_captured_to(Value::from(ctx), &mut out);
        let line =
            |e: &Error| e.line().map(|l| format!(" (template line {l})")).unwrap_or_default();
        match rendered {
            Err(e) if out.over => bail!(
                "{}: the chat template did not finish within its budget{}: it wrote more than {:.1} MiB of prompt",
                self.origin,
                line(&e),
                budget.output as f64 / (1 << 20) as f64
            ),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => bail!(
                "{}: the chat template did not finish within its budget{}: it ran out of its {:.1} million steps",
                self.origin,
                line(&e),
                budget.fuel as f64 / 1e6
            ),
            Err(e) => Err(self.error(e)),
            Ok(done) => {
                let used = done.state().fuel_levels().map_or(0, |(used, _)| used);
                // minijinja writes whole `str`s
                let text =
                    String::from_utf8(out.text).map_err(|e| anyhow!("{}: {e}", self.origin))?;
                Ok((text, used))
            }
        }
    }

    fn env(&self) -> Environment<'static> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid");
        env.set_syntax(syntax);
        env.set_unknown_method_callback(python_method);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env
    }

    /// One line naming the file, with minijinja's reason and line when it has them.
    fn error(&self, e: Error) -> anyhow::Error {
        let line = e.line().map(|l| format!(" (template line {l})")).unwrap_or_default();
        let detail = e.detail().map(str::to_string).unwrap_or_else(|| e.kind().to_string());
        anyhow!("{}: chat template failed{line}: {detail}", self.origin)
    }
}

/// What one render may spend: minijinja's fuel (an instruction is one, and so is every 64 bytes
/// of text or 2 list slots it makes; an operation whose result would not fit is refused before
/// it allocates), and the bytes of prompt it writes. Both grow with the bytes of the
/// conversation and variables, so that a long prompt does not run out: Qwen3's and SDAR's
/// template spend 100 to 600 fuel on a short chat and 0.06 a byte of a long one (33,000 on the
/// 0.5 MiB that 131,072 positions hold, 270,000 on a 4 MiB `--prompt-file`), far inside it. A
/// template that loops or builds text without end runs out within a few hundredths of a second,
/// holding at most 32 MiB. Hence no flag to raise it.
#[derive(Clone, Copy, Debug)]
struct Budget {
    fuel: u64,
    output: usize,
}

impl Budget {
    /// Fuel of any render: 256 thousand instructions.
    const BASE_FUEL: u64 = 1 << 18;
    /// Fuel per byte of input, up to what the stack holds ([`STACK_PER_FUEL`]).
    const FUEL_PER_BYTE: u64 = 1;
    /// Bytes of prompt any render may write.
    const BASE_OUTPUT: usize = 1 << 20;
    /// Prompt bytes per byte of input.
    const OUTPUT_PER_BYTE: usize = 4;

    fn for_input(messages: &[Message], vars: &Vars) -> Self {
        let bytes = messages.iter().map(|m| m.role.len() + m.content.len()).sum::<usize>()
            + vars.iter().map(|(k, v)| k.len() + v.to_string().len()).sum::<usize>();
        Budget {
            fuel: Self::BASE_FUEL
                .saturating_add((bytes as u64).saturating_mul(Self::FUEL_PER_BYTE)),
            output: Self::BASE_OUTPUT.saturating_add(bytes.saturating_mul(Self::OUTPUT_PER_BYTE)),
        }
    }
}

/// The stacks a template renders on: the first, else (where it cannot be mapped) the second.
/// Only the pages a render touches become memory; a real template touches a few.
const RENDER_STACKS: [usize; 2] = [256 << 20, 64 << 20];

/// Stack a fuel may need: a template nests a list a level for 1.6 fuel (`[[[...ns.x...]]]` in a
/// loop), and printing, comparing or dropping a value takes up to 400 bytes of stack a level
/// (measured): 250 bytes a fuel, here twice that. 256 MiB of stack allows 512,000 fuel.
const STACK_PER_FUEL: usize = 512;

/// The rendered prompt, refusing to grow past `cap` bytes (the render then stops with a write
/// error, and `over` says why).
struct Capped {
    text: Vec<u8>,
    cap: usize,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > self.cap {
            self.over = true;
            return Err(std::io::Error::other("the prompt is longer than its budget"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Python's string, dict and list methods (minijinja-contrib's), with `str.format`'s field
/// widths paid for first: it pads without charging the fuel, so `'{:>100000000000}'.format(x)`
/// would allocate 100 GB and abort.
fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(text), "format") = (value.as_str(), method) {
        state.consume_fuel(format_widths(text) / 64)?;
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The sum of the numbers (widths, precisions) in the specs of a `str.format` string's fields
/// (`{name:>8.2}`), the bytes of padding they may ask for; `{{` is a literal brace.
fn format_widths(text: &str) -> u64 {
    let mut total = 0u64;
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(after) = rest.strip_prefix('{') {
            rest = after;
            continue;
        }
        let end = rest.find('}').unwrap_or(rest.len());
        if let Some((_, spec)) = rest[..end].split_once(':') {
            for digits in spec.split(|c: char| !c.is_ascii_digit()).filter(|d| !d.is_empty()) {
                total = total.saturating_add(digits.parse().unwrap_or(u64::MAX));
            }
        }
        rest = &rest[end.min(rest.len())..];
    }
    total
}

/// transformers' `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent)`, so Python's
/// separators (`", "`, `": "`) and no HTML escaping, unlike minijinja's built-in filter. Its
/// text is charged to the render's fuel as it is made (an `indent` of 10^8 runs out before
/// the padding is allocated), and a value nested deeper than [`MAX_JSON_DEPTH`] is refused,
/// as Python's json refuses one past its recursion limit.
fn tojson(
    state: &State,
    value: Value,
    indent: Option<usize>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let indent = match indent {
        Some(n) => Some(n),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    kwargs.assert_all_used()?;
    check_depth(state, &value)?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut |text: &str| {
        state.consume_fuel(text.len() as u64 / 64)?;
        out.push_str(text);
        Ok(())
    })?;
    Ok(Value::from_safe_string(out))
}

/// How deep `tojson` nests: tool schemas are a few levels; serialising is recursive, and a
/// template can build a list a hundred thousand levels deep.
const MAX_JSON_DEPTH: usize = 256;

/// Fails on a value nested deeper than [`MAX_JSON_DEPTH`], walking it without recursion; every
/// item visited is charged to the fuel.
fn check_depth(state: &State, value: &Value) -> Result<(), Error> {
    let mut todo = vec![(value.clone(), 0usize)];
    while let Some((v, depth)) = todo.pop() {
        if depth > MAX_JSON_DEPTH {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: the value is nested more than {MAX_JSON_DEPTH} levels deep"),
            ));
        }
        state.consume_fuel(1)?;
        match v.kind() {
            ValueKind::Seq | ValueKind::Iterable => {
                todo.extend(v.try_iter()?.map(|item| (item, depth + 1)));
            }
            ValueKind::Map => {
                for key in v.try_iter()? {
                    todo.push((v.get_item(&key)?, depth + 1));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Python's `json.dumps` layout, handed to `put` piece by piece (which may refuse one). Written
/// by hand because serde_json's formatters cannot give `", "` between items on one line (its
/// compact style has no spaces).
fn write_json(
    v: &serde_json::Value,
    indent: Option<usize>,
    depth: usize,
    put: &mut dyn FnMut(&str) -> Result<(), Error>,
) -> Result<(), Error> {
    use serde_json::Value as J;
    // a newline and `n` spaces a level: charged before it is made
    let pad = |put: &mut dyn FnMut(&str) -> Result<(), Error>, d: usize| -> Result<(), Error> {
        let Some(n) = indent else { return Ok(()) };
        let width = n.saturating_mul(d);
        put("\n")?;
        let chunk = " ".repeat(width.min(4096));
        let mut left = width;
        while left > 0 {
            let k = left.min(chunk.len());
            put(&chunk[..k])?;
            left -= k;
        }
        Ok(())
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            put("[")?;
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    put(item_sep)?;
                }
                pad(put, depth + 1)?;
                write_json(x, indent, depth + 1, put)?;
            }
            pad(put, depth)?;
            put("]")
        }
        J::Object(map) if !map.is_empty() => {
            put("{")?;
            for (i, (k, x)) in map.iter().enumerate() {
                if i > 0 {
                    put(item_sep)?;
                }
                pad(put, depth + 1)?;
                put(&J::String(k.clone()).to_string())?;
                put(": ")?;
                write_json(x, indent, depth + 1, put)?;
            }
            pad(put, depth)?;
            put("}")
        }
        other => put(&other.to_string()),
    }
}

/// A `--chat-arg KEY=VALUE`: VALUE is JSON when it parses as JSON (`false`, `3`, `"x"`,
/// `[1]`), else the plain string, so `enable_thinking=false` is the boolean Qwen3 tests for.
pub fn parse_chat_arg(arg: &str) -> Result<(String, serde_json::Value)> {
    let (key, value) =
        arg.split_once('=').with_context(|| format!("--chat-arg {arg:?}: expected KEY=VALUE"))?;
    let key = key.trim();
    let valid = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid || key.starts_with(|c: char| c.is_ascii_digit()) {
        bail!("--chat-arg {arg:?}: {key:?} is not a template variable name");
    }
    if matches!(key, "messages" | "add_generation_prompt") {
        bail!("--chat-arg {arg:?}: `{key}` is set by unmask itself");
    }
    // Python's spellings would be the strings "False", "True", "None", which a template tests
    // as true: refused with the JSON that means what they say.
    if let Some(json) = match value.trim() {
        "False" => Some("false"),
        "True" => Some("true"),
        "None" => Some("null"),
        _ => None,
    } {
        bail!("--chat-arg {arg:?}: {value} would be a string here; write {key}={json}");
    }
    let value = serde_json::from_str(value)
        .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
    Ok((key.to_string(), value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpl(src: &str) -> ChatTemplate {
        ChatTemplate::new(src.to_string(), "t.jinja".into()).unwrap()
    }

    const CHATML: &str = "{% for m in messages %}\n<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\n{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn trim_and_lstrip_blocks_as_transformers() {
        let got =
            tmpl(CHATML).render(&conversation(Some("Be brief."), "Hi\n"), &Vars::new()).unwrap();
        assert_eq!(got, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\n<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn python_string_methods_slices_namespace_and_previtem() {
        let src = "{% set ns = namespace(n=0) %}{% for m in messages[::-1] %}{% set ns.n = ns.n + 1 %}\
            {% if loop.previtem is defined %}[{{ loop.previtem.role }}]{% endif %}\
            {{ m.content.strip().split(',')[0].lstrip('x').rstrip('!') }}|{{ m.content.startswith(' x') }};{% endfor %}{{ ns.n }}";
        let msgs = vec![Message::new("user", " xab!, c "), Message::new("assistant", "q")];
        assert_eq!(tmpl(src).render(&msgs, &Vars::new()).unwrap(), "q|False;[assistant]ab|True;2");
    }

    #[test]
    fn chat_args_are_variables_with_json_values() {
        let src = "{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}";
        let mut vars = Vars::new();
        assert_eq!(tmpl(src).render(&[], &vars).unwrap(), "on");
        let (k, v) = parse_chat_arg("enable_thinking=false").unwrap();
        vars.insert(k, v);
        assert_eq!(tmpl(src).render(&[], &vars).unwrap(), "off");
        assert_eq!(
            parse_chat_arg("name=Ada Lovelace").unwrap().1,
            serde_json::json!("Ada Lovelace")
        );
        assert_eq!(parse_chat_arg("n=3").unwrap().1, serde_json::json!(3));
    }

    #[test]
    fn bad_chat_args_are_named() {
        let e = format!("{:#}", parse_chat_arg("enable_thinking").unwrap_err());
        assert_eq!(e, "--chat-arg \"enable_thinking\": expected KEY=VALUE");
        let e = format!("{:#}", parse_chat_arg("a-b=1").unwrap_err());
        assert_eq!(e, "--chat-arg \"a-b=1\": \"a-b\" is not a template variable name");
        let e = format!("{:#}", parse_chat_arg("messages=[]").unwrap_err());
        assert_eq!(e, "--chat-arg \"messages=[]\": `messages` is set by unmask itself");
    }

    #[test]
    fn raise_exception_is_an_error_naming_the_template() {
        let t = tmpl("{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}");
        let e = format!("{:#}", t.render(&conversation(Some("s"), "u"), &Vars::new()).unwrap_err());
        assert_eq!(e, "t.jinja: chat template failed (template line 1): first must be user");
    }

    #[test]
    fn syntax_errors_are_caught_when_loading() {
        let e = ChatTemplate::new("{% if %}".into(), "m/chat_template.jinja".into()).unwrap_err();
        assert!(
            format!("{e:#}")
                .starts_with("m/chat_template.jinja: chat template failed (template line 1): "),
            "{e:#}"
        );
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let t = tmpl("{{ x | tojson }}|{{ x | tojson(indent=2) }}");
        let mut vars = Vars::new();
        vars.insert("x".into(), serde_json::json!({"a": [1, "<é>"], "b": {}}));
        let want = "{\"a\": [1, \"<é>\"], \"b\": {}}|{\n  \"a\": [\n    1,\n    \"<é>\"\n  ],\n  \"b\": {}\n}";
        assert_eq!(t.render(&[], &vars).unwrap(), want);
        // keys in the order given, as json.dumps(sort_keys=False) writes them (a tool's
        // schema and the messages came out sorted)
        let (k, v) = parse_chat_arg(
            r#"x={"type": "function", "function": {"name": "f", "description": "d"}}"#,
        )
        .unwrap();
        vars.insert(k, v);
        assert_eq!(
            tmpl("{{ x | tojson }}").render(&[], &vars).unwrap(),
            r#"{"type": "function", "function": {"name": "f", "description": "d"}}"#
        );
        let m = [Message { role: "user".into(), content: "hi".into() }];
        assert_eq!(
            tmpl("{{ messages | tojson }}").render(&m, &Vars::new()).unwrap(),
            r#"[{"role": "user", "content": "hi"}]"#
        );
    }

    /// A variable the template never reads is a typo, and Python's False a string: both
    /// refused (they decoded as if nothing was asked).
    #[test]
    fn chat_args_the_template_cannot_use_are_refused() {
        let t = tmpl("{% if enable_thinking is defined and enable_thinking is false %}off{% endif %}{% set ns = namespace(a=1) %}{{ tools }}");
        t.check_reads(&["enable_thinking".to_string()]).unwrap();
        let e = t
            .check_reads(&["enable_thinking".to_string(), "enable_thinkng".to_string()])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--chat-arg enable_thinkng: ")
                && e.ends_with("reads no variable of that name (it reads: enable_thinking, tools)"),
            "{e}"
        );
        let e = parse_chat_arg("enable_thinking=False").unwrap_err().to_string();
        assert_eq!(e, "--chat-arg \"enable_thinking=False\": False would be a string here; write enable_thinking=false");
    }

    #[test]
    fn an_empty_template_is_refused() {
        let e = ChatTemplate::new(" \n".into(), "m/chat_template.jinja".into())
            .err()
            .unwrap()
            .to_string();
        assert_eq!(e, "m/chat_template.jinja: the chat template is empty (use --raw to decode the prompt as given)");
    }

    #[test]
    fn config_value_is_a_string_or_a_named_list() {
        let s = serde_json::json!("A{{ messages|length }}");
        assert_eq!(
            ChatTemplate::from_config_value(&s, "tc.json")
                .unwrap()
                .render(&[], &Vars::new())
                .unwrap(),
            "A0"
        );
        let list = serde_json::json!([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]);
        assert_eq!(
            ChatTemplate::from_config_value(&list, "tc.json")
                .unwrap()
                .render(&[], &Vars::new())
                .unwrap(),
            "D"
        );
        let none = serde_json::json!([{"name": "rag", "template": "R"}]);
        let e = format!("{:#}", ChatTemplate::from_config_value(&none, "tc.json").unwrap_err());
        assert_eq!(
            e,
            "tc.json: field `chat_template` is a list without a template named \"default\""
        );
    }

    /// Templates that loop, write or nest without end stop on their budget with one line,
    /// within a fraction of a second each (a generous bound here: a hang is what it catches).
    #[test]
    fn hostile_templates_stop_on_their_budget_with_one_line() {
        // 50 levels an iteration, the cheapest nesting: its fuel runs out 300,000 levels deep
        let nest = format!(
            "{{% set ns = namespace(x=1) %}}{{% for i in range(100000) %}}{{% set ns.x = {}ns.x{} %}}{{% endfor %}}",
            "[".repeat(50),
            "]".repeat(50)
        );
        let cases = [
            ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "it ran out of its 0.5 million steps"),
            ("{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}{{ k }}{% endfor %}{% endfor %}{% endfor %}", "within its budget"),
            ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "it wrote more than 5.0 MiB of prompt"),
            ("{{ 'a' * 100000000000 }}", "within its budget"),
            ("{% set ns = namespace(x='a') %}{% for i in range(100) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}", "within its budget"),
            ("{% set ns = namespace(x='ab') %}{% for i in range(100) %}{% set ns.x = ns.x.replace('a', ns.x) %}{% endfor %}", "within its budget"),
            ("{{ messages | tojson(indent=100000000) }}", "within its budget"),
            ("{{ ('x' * 10000000) | indent(10000) }}", "within its budget"),
            ("{{ '%100000000000s' | format('x') }}", "chat template"),
            ("{{ '{:>100000000000}'.format('x') }}", "chat template"),
            ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion limit exceeded"),
            ("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}", "recursion limit exceeded"),
            ("{% for m in messages * 1000000000 %}{{ m.content }}{% endfor %}", "too large"),
        ];
        let deep = [
            nest.clone(),
            format!("{nest}{{{{ ns.x }}}}"),
            format!("{nest}{{{{ ns.x == [ns.x] }}}}"),
            format!("{nest}{{{{ [ns.x, ns.x] | sort }}}}"),
            format!("{nest}{{{{ ns.x | tojson }}}}"),
        ];
        let long = "x".repeat(1 << 20);
        let all = cases
            .iter()
            .map(|(src, want)| (src.to_string(), *want))
            .chain(deep.into_iter().map(|src| (src, "within its budget")));
        for (src, want) in all {
            let t =
                ChatTemplate::new(src.clone(), "m/tokenizer_config.json (chat_template)".into())
                    .unwrap();
            let start = std::time::Instant::now();
            // a long message: the most fuel a render gets
            let e =
                format!("{:#}", t.render(&conversation(None, &long), &Vars::new()).unwrap_err());
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "{src}: {:?}",
                start.elapsed()
            );
            assert!(e.starts_with("m/tokenizer_config.json (chat_template): "), "{src}: {e}");
            assert!(e.contains(want) && !e.contains('\n'), "{src}: {e}");
        }
    }

    /// Within the budget, a deep value prints, compares and goes as any other; tojson refuses
    /// one deeper than Python's json would take.
    #[test]
    fn deep_values_render_and_tojson_refuses_the_deepest() {
        let nest = "{% set ns = namespace(x=1) %}{% for i in range(20) %}{% for j in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}";
        let t = tmpl(&format!("{nest}{{{{ ns.x == ns.x }}}}{{{{ ns.x | length }}}}"));
        assert_eq!(t.render(&[], &Vars::new()).unwrap(), "True1");
        let e = format!(
            "{:#}",
            tmpl(&format!("{nest}{{{{ ns.x | tojson }}}}")).render(&[], &Vars::new()).unwrap_err()
        );
        assert_eq!(e, "t.jinja: chat template failed (template line 1): tojson: the value is nested more than 256 levels deep");
    }

    /// The longest prompt unmask takes (a 4 MiB `--prompt-file`) renders through the SDAR
    /// template; the longest a model's positions hold (131,072 tokens, about 0.5 MiB) takes a
    /// small part of its budget.
    #[test]
    fn the_longest_prompts_are_within_the_budget() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tiny-sdar-chat/chat_template.jinja"
        );
        let t = tmpl(&std::fs::read_to_string(path).unwrap());
        let most = (RENDER_STACKS[0] / STACK_PER_FUEL) as u64;
        for (bytes, share) in [(4 << 20, 1), (1 << 20, 4), (512 << 10, 8)] {
            let user = "word </think> ".repeat(bytes / 14);
            let msgs = conversation(Some("Be brief."), &user);
            let budget = Budget::for_input(&msgs, &Vars::new());
            let (text, used) = t.render_within(&msgs, &Vars::new(), budget).unwrap();
            assert!(text.len() > user.len());
            assert!(
                used * share < budget.fuel.min(most),
                "{bytes} bytes: {used} of {}",
                budget.fuel
            );
            assert!(text.len() * 4 < budget.output, "{} of {}", text.len(), budget.output);
        }
    }

    /// No loader and no environment: a template can read nothing but what it is given.
    #[test]
    fn templates_cannot_include_import_extend_or_read_the_environment() {
        for (src, want) in [
            (
                "{% include 'chat_template.jinja' %}",
                "tried to include non-existing template 'chat_template.jinja'",
            ),
            (
                "{% import '/etc/passwd' as p %}x",
                "tried to include non-existing template '/etc/passwd'",
            ),
            ("{% from 'a.jinja' import b %}x", "tried to include non-existing template 'a.jinja'"),
            ("{% extends '/etc/passwd' %}", "template \"/etc/passwd\" does not exist"),
        ] {
            let e = format!("{:#}", tmpl(src).render(&[], &Vars::new()).unwrap_err());
            assert_eq!(
                e,
                format!("t.jinja: chat template failed (template line 1): {want}"),
                "{src}"
            );
        }
        std::env::set_var("UNMASK_TEMPLATE_SECRET", "s3cret");
        let src = "[{{ env }}{{ environ }}{{ UNMASK_TEMPLATE_SECRET }}{{ range.__globals__ }}{{ namespace.__init__ }}{{ messages.__class__ }}{{ self }}]";
        let got = tmpl(src).render(&[], &Vars::new()).unwrap();
        assert!(!got.contains("s3cret") && !got.contains("PATH"), "{got}");
    }
}
