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
use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, Error, ErrorKind};
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
    /// override nothing the call sets itself: `messages`, `add_generation_prompt`).
    pub fn render(&self, messages: &[Message], vars: &Vars) -> Result<String> {
        let env = self.env();
        let tmpl = env.template_from_str(&self.source).map_err(|e| self.error(e))?;
        let mut ctx: BTreeMap<String, Value> =
            vars.iter().map(|(k, v)| (k.clone(), Value::from(Serde(v)))).collect();
        ctx.insert("messages".into(), Value::from(Serde(messages)));
        ctx.insert("add_generation_prompt".into(), Value::from(true));
        ctx.entry("tools".into()).or_insert(Value::from(()));
        ctx.entry("documents".into()).or_insert(Value::from(()));
        tmpl.render(Value::from(ctx)).map_err(|e| self.error(e))
    }

    fn env(&self) -> Environment<'static> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid");
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
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

/// transformers' `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent)`, so Python's
/// separators (`", "`, `": "`) and no HTML escaping, unlike minijinja's built-in filter.
fn tojson(value: Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(n) => Some(n),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Python's `json.dumps` layout. Written by hand because serde_json's formatters cannot give
/// `", "` between items on one line (its compact style has no spaces).
fn write_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let (open_sep, item_sep, close_sep) = match indent {
        None => (String::new(), ", ".to_string(), String::new()),
        Some(n) => {
            let pad = |d: usize| format!("\n{}", " ".repeat(n * d));
            (pad(depth + 1), format!(",{}", pad(depth + 1)), pad(depth))
        }
    };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            out.push_str(&open_sep);
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                write_json(x, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            out.push_str(&open_sep);
            for (i, (k, x)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(x, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
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
}
