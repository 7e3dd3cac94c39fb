//! Rendering a conversation with the model's own Jinja chat template, as transformers does.
//!
//! The reference is transformers 5.23.0 `PreTrainedTokenizerBase.apply_chat_template` and
//! `utils/chat_template_utils.py`. What it does, and where we do the same:
//!
//! - each message loses the keys whose value is `null`; a message with reasoning under
//!   `reasoning_content`, `thinking` or `reasoning` gets it under both `thinking` and
//!   `reasoning_content` ([`prepare_messages`]);
//! - an empty conversation is an error;
//! - with several named templates, `"tool_use"` is used when tools are given, else `"default"`;
//! - the template sees `messages`, `tools` (none when not given), `documents` (none),
//!   `add_generation_prompt`, the special tokens (`bos_token`, `eos_token`, ...) and any extra
//!   keyword (`enable_thinking`, only when given: templates test `enable_thinking is defined`);
//! - Jinja runs with `trim_blocks` and `lstrip_blocks` and the loop controls, `tojson` is Python's
//!   `json.dumps(x, ensure_ascii=False)` ([`super::pyjson`]), and the globals `raise_exception`
//!   and `strftime_now` exist. Python's string methods (`startswith`, `split`, `strip`, ...) come
//!   from minijinja-contrib's pycompat.
//!
//! On top of that, one check HuggingFace does not make: a message whose content the template
//! silently drops (a role it does not know) is an error here, because a chat that quietly loses a
//! message is worse than one that says it cannot express it.

use super::pyjson::{self, DumpOptions};
use super::template_file::TemplateFile;
use anyhow::Result;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Serde};
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value as JinjaValue};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// One message of a conversation, in HuggingFace's JSON form
/// (`{"role": "user", "content": "..."}`, optionally `"reasoning_content"` on assistant turns).
///
/// Unknown fields are refused rather than ignored: a message with `tool_calls` must go through
/// [`ChatTemplate::render_json`], which passes every field to the template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// The assistant's reasoning, when kept apart from `content` (Qwen3's template reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
        }
    }
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// The name the default template is registered under in the Jinja environment.
const DEFAULT: &str = "chat_template";
/// Named templates are registered as `chat_template/<name>`.
const NAMED_PREFIX: &str = "chat_template/";
/// Stands in for message content when checking that the template renders a role (see
/// [`ChatTemplate::check_roles_rendered`]). Private-use characters: never in real text.
const PROBE: &str = "\u{E000}pico-qwen role probe\u{E000}";

/// A model's chat template, ready to render conversations.
pub struct ChatTemplate {
    path: PathBuf,
    file: TemplateFile,
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("path", &self.path)
            .field("source", &self.file.source)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Reads a template file (`<model>.template.json`) and compiles its templates.
    pub fn open(path: &Path) -> Result<ChatTemplate> {
        let file = TemplateFile::read(path)?;
        ChatTemplate::from_file(file, path)
    }

    /// Compiles the templates of an already parsed file. `path` names it in errors.
    pub fn from_file(file: TemplateFile, path: &Path) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        // jinja2 as transformers configures it: ImmutableSandboxedEnvironment(trim_blocks=True,
        // lstrip_blocks=True, extensions=[loopcontrols]); keep_trailing_newline stays False.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| anyhow::anyhow!("{}: jinja syntax config: {e}", path.display()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(DEFAULT, file.chat_template.clone())
            .map_err(|e| {
                anyhow::anyhow!("{}: chat template does not compile: {e}", path.display())
            })?;
        for (name, source) in &file.named_templates {
            env.add_template_owned(format!("{NAMED_PREFIX}{name}"), source.clone())
                .map_err(|e| {
                    anyhow::anyhow!(
                        "{}: chat template {name:?} does not compile: {e}",
                        path.display()
                    )
                })?;
        }
        Ok(ChatTemplate {
            path: path.to_path_buf(),
            file,
            env,
        })
    }

    /// The template file this was built from.
    pub fn file(&self) -> &TemplateFile {
        &self.file
    }

    /// A special token the checkpoint sets (`"eos_token"` -> `"<|im_end|>"`).
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.file.special_tokens.get(name).map(String::as_str)
    }

    /// Renders `messages` as `tokenizer.apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=..., enable_thinking=...)` does. `enable_thinking: None` does not pass
    /// the variable at all, so the template applies its own default.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String> {
        let values: Vec<Value> = messages
            .iter()
            .map(|m| serde_json::to_value(m).expect("a Message always serializes"))
            .collect();
        self.render_json(&values, None, add_generation_prompt, enable_thinking)
    }

    /// Like [`ChatTemplate::render`], for messages in any JSON form the template understands
    /// (`tool_calls`, tool results) and an optional list of tool schemas (`tools=` in HF).
    pub fn render_json(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String> {
        if messages.is_empty() {
            anyhow::bail!("cannot render an empty conversation: give at least one message");
        }
        let messages = prepare_messages(messages)?;
        let name = match tools {
            Some(_) if self.file.named_templates.contains_key("tool_use") => {
                format!("{NAMED_PREFIX}tool_use")
            }
            _ => DEFAULT.to_string(),
        };
        let args = RenderArgs {
            name: &name,
            tools,
            add_generation_prompt,
            enable_thinking,
        };
        let text = self.render_prepared(&args, &messages)?;
        self.check_roles_rendered(&args, &messages)?;
        Ok(text)
    }

    /// What the template does when `enable_thinking` is not given: `Some(true)` if that renders
    /// like `enable_thinking=True` (Qwen3), `Some(false)` if like `False`, `None` if the template
    /// does not look at `enable_thinking` at all.
    pub fn default_thinking(&self) -> Option<bool> {
        let probe = [Message::user("Hello")];
        let r = |t| self.render(&probe, true, t).ok();
        let (none, on, off) = (r(None), r(Some(true)), r(Some(false)));
        if on == off {
            None
        } else if none == on {
            Some(true)
        } else if none == off {
            Some(false)
        } else {
            None
        }
    }

    /// Whether the template writes an assistant's tool call as XML (Qwen3.5's `<tool_call>\n
    /// <function=NAME>\n<parameter=P>\nvalue\n</parameter>\n</function>\n</tool_call>`) rather
    /// than as JSON in the block (Qwen3's and Qwen2.5's `{"name": .., "arguments": ..}`): found,
    /// as [`ChatTemplate::default_thinking`] is, by rendering one call.
    pub fn xml_tool_calls(&self) -> bool {
        let call = serde_json::json!({"type": "function", "function": {"name": "f", "arguments": {"x": 1}}});
        let probe = [
            serde_json::json!({"role": "user", "content": "Hi"}),
            serde_json::json!({"role": "assistant", "content": "", "tool_calls": [call]}),
        ];
        self.render_json(&probe, None, false, Some(false))
            .is_ok_and(|t| t.contains("<function=f>"))
    }

    fn render_prepared(&self, args: &RenderArgs, messages: &[Value]) -> Result<String> {
        // The keyword arguments of `compiled_template.render(...)` in transformers.
        let mut ctx = Map::new();
        ctx.insert("messages".into(), Value::Array(messages.to_vec()));
        ctx.insert(
            "tools".into(),
            args.tools.map_or(Value::Null, |t| Value::Array(t.to_vec())),
        );
        ctx.insert("documents".into(), Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(args.add_generation_prompt),
        );
        for (k, v) in &self.file.special_tokens {
            ctx.insert(k.clone(), Value::String(v.clone()));
        }
        if let Some(t) = args.enable_thinking {
            ctx.insert("enable_thinking".into(), Value::Bool(t));
        }
        let template = self
            .env
            .get_template(args.name)
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))?;
        template
            .render(JinjaValue::from(Serde(&Value::Object(ctx))))
            .map_err(|e| anyhow::anyhow!("{}: chat template: {e}", self.path.display()))
    }

    /// Refuses a conversation in which the template drops every message of some role: for each
    /// role, the messages' content is replaced by a probe string that must appear in the output.
    fn check_roles_rendered(&self, args: &RenderArgs, messages: &[Value]) -> Result<()> {
        let mut roles: Vec<&str> = Vec::new();
        for m in messages {
            if let Some(r) = m.get("role").and_then(Value::as_str) {
                if !roles.contains(&r) {
                    roles.push(r);
                }
            }
        }
        for role in roles {
            let mut probed = messages.to_vec();
            let mut replaced = false;
            for m in probed.iter_mut() {
                if m.get("role").and_then(Value::as_str) == Some(role)
                    && m.get("content").is_some_and(Value::is_string)
                {
                    m["content"] = Value::String(PROBE.into());
                    replaced = true;
                }
            }
            if !replaced {
                continue;
            }
            // A probe the template rejects says nothing about dropping; only a clean render counts.
            if let Ok(text) = self.render_prepared(args, &probed) {
                if !text.contains(PROBE) {
                    anyhow::bail!(
                        "{}: the chat template cannot express messages with role {role:?} \
                         (it leaves their content out of the prompt)",
                        self.path.display()
                    );
                }
            }
        }
        Ok(())
    }
}

struct RenderArgs<'a> {
    name: &'a str,
    tools: Option<&'a [Value]>,
    add_generation_prompt: bool,
    enable_thinking: Option<bool>,
}

/// The reasoning field names transformers 5.23.0 recognises (`_REASONING_FIELDS`), first match wins.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// transformers' message normalisation before rendering: drop `null` values
/// (`apply_chat_template`), then `_alias_reasoning_fields`: a message with reasoning becomes
/// `{"thinking": r, **message, "reasoning_content": r}` (key order matters to `tojson`).
fn prepare_messages(messages: &[Value]) -> Result<Vec<Value>> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(map) = m else {
                anyhow::bail!("message {i} is not a JSON object: {m}");
            };
            if !map.get("role").is_some_and(Value::is_string) {
                anyhow::bail!("message {i} has no \"role\" string");
            }
            let map: Map<String, Value> = map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let reasoning = REASONING_FIELDS.iter().find_map(|f| map.get(*f)).cloned();
            let Some(r) = reasoning else {
                return Ok(Value::Object(map));
            };
            let mut out = Map::new();
            out.insert("thinking".into(), r.clone());
            for (k, v) in map {
                out.insert(k, v);
            }
            out.insert("reasoning_content".into(), r);
            Ok(Value::Object(out))
        })
        .collect()
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, transformers'
/// replacement for Jinja's filter; arguments in Python's order, by position or by name.
fn tojson(value: JinjaValue, args: Rest<JinjaValue>, kwargs: Kwargs) -> Result<String, JinjaError> {
    let bad = |msg: String| JinjaError::new(ErrorKind::InvalidOperation, msg);
    if args.0.len() > 4 {
        return Err(bad("tojson takes at most 4 arguments".into()));
    }
    let arg = |pos: usize, name: &str| -> Result<Option<JinjaValue>, JinjaError> {
        let by_name: Option<JinjaValue> = kwargs.get(name)?;
        Ok(by_name.or_else(|| args.0.get(pos).cloned()))
    };
    let mut opts = DumpOptions::default();
    if let Some(v) = arg(0, "ensure_ascii")? {
        opts.ensure_ascii = v.is_true();
    }
    if let Some(v) = arg(1, "indent")? {
        if let Some(n) = v.as_i64() {
            // Python: a negative indent is treated like 0 (newlines, no indentation).
            opts.indent = Some(" ".repeat(n.max(0) as usize));
        } else if let Some(s) = v.as_str() {
            opts.indent = Some(s.to_string());
        } else if !v.is_none() {
            return Err(bad(format!(
                "tojson: indent must be an int or a string, not {v}"
            )));
        }
    }
    if let Some(v) = arg(2, "separators")? {
        if !v.is_none() {
            let parts: Vec<JinjaValue> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    opts.separators = Some((a.to_string(), b.to_string()));
                }
                _ => return Err(bad("tojson: separators must be two strings".into())),
            }
        }
    }
    if let Some(v) = arg(3, "sort_keys")? {
        opts.sort_keys = v.is_true();
    }
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| bad(format!("tojson: value is not JSON-serializable: {e}")))?;
    Ok(pyjson::dumps(&json, &opts))
}

/// `raise_exception(message)`: the template refuses the conversation (e.g. roles that do not
/// alternate). transformers raises `TemplateError(message)`.
fn raise_exception(message: String) -> Result<JinjaValue, JinjaError> {
    Err(JinjaError::new(
        ErrorKind::InvalidOperation,
        format!("the template refused the conversation: {message}"),
    ))
}

/// `strftime_now(format)`: transformers returns `datetime.now().strftime(format)` in local time.
/// We have no time-zone database, so this is UTC; only the common directives are supported.
fn strftime_now(format: String) -> Result<String, JinjaError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime_utc(&format, secs)
}

/// Formats the UTC time `secs` after the Unix epoch with C `strftime` directives.
fn strftime_utc(format: &str, secs: i64) -> Result<String, JinjaError> {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (h, mi, s) = (sod / 3600, sod % 3600 / 60, sod % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant, "chrono-compatible low-level date
    // algorithms", days_from_civil inverse).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3)
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{:02}", (h + 11) % 12 + 1)),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('%') => out.push('%'),
            other => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.unwrap_or(' ')
                    ),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn template(src: &str) -> ChatTemplate {
        let f = TemplateFile::new("test".into(), src.into(), BTreeMap::new(), BTreeMap::new());
        ChatTemplate::from_file(f, Path::new("t.template.json")).unwrap()
    }

    /// Golden strings from transformers 5.23.0 `render_jinja_template` (jinja2 3.1.6). The Qwen3
    /// reference cases do not depend on these settings, so each is tested on its own here.
    #[test]
    fn jinja_environment_matches_transformers() {
        let user = [Message::user("a<b>&'c'")];
        // trim_blocks + lstrip_blocks: block lines leave no whitespace behind.
        let t = template(
            "{% for m in messages %}\n    {% if m.role == 'user' %}\n<{{ m.content }}>\n    \
             {% endif %}\n{% endfor %}\n",
        );
        assert_eq!(t.render(&user, false, None).unwrap(), "<a<b>&'c'>\n");
        // tojson is Python's json.dumps(ensure_ascii=False): no HTML escaping; options pass through.
        let t = template(
            "{{ messages[0]|tojson }}|{{ messages[0]|tojson(indent=2) }}|\
             {{ messages[0]|tojson(sort_keys=true, separators=(',', ':')) }}|\
             {{ 'é'|tojson(ensure_ascii=true) }}",
        );
        assert_eq!(
            t.render(&user, false, None).unwrap(),
            "{\"role\": \"user\", \"content\": \"a<b>&'c'\"}|\
             {\n  \"role\": \"user\",\n  \"content\": \"a<b>&'c'\"\n}|\
             {\"content\":\"a<b>&'c'\",\"role\":\"user\"}|\"\\u00e9\""
        );
        // Loop controls (jinja2.ext.loopcontrols).
        let t = template(
            "{% for m in messages %}{% if m.content == 'skip' %}{% continue %}{% endif %}\
             {{ m.content }}{% if m.content == 'stop' %}{% break %}{% endif %}{% endfor %}",
        );
        let four = [
            Message::user("a"),
            Message::assistant("skip"),
            Message::user("stop"),
            Message::assistant("z"),
        ];
        assert_eq!(t.render(&four, false, None).unwrap(), "astop");
    }

    #[test]
    fn strftime_matches_python() {
        // Python: datetime.fromtimestamp(t, timezone.utc).strftime(fmt)
        let f = "%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %I%p %%";
        assert_eq!(
            strftime_utc(f, 0).unwrap(),
            "1970-01-01 00:00:00 Thu Thursday Jan January 001 70 12AM %"
        );
        assert_eq!(
            strftime_utc(f, 1_709_251_199).unwrap(),
            "2024-02-29 23:59:59 Thu Thursday Feb February 060 24 11PM %"
        );
        assert_eq!(
            strftime_utc("%d %b %Y", 1_798_761_600).unwrap(),
            "01 Jan 2027"
        );
        assert!(strftime_utc("%Q", 0).is_err());
    }

    #[test]
    fn raise_exception_is_a_clear_error() {
        let t = template("{{ raise_exception('Only user and assistant roles are supported!') }}");
        let e = t.render(&[Message::user("hi")], true, None).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.starts_with("t.template.json: chat template: "), "{msg}");
        assert!(msg.contains("the template refused the conversation: Only user and assistant"));
    }

    #[test]
    fn dropped_role_is_an_error() {
        // A template that only knows users and assistants silently drops everything else.
        let t = template(
            "{% for m in messages %}{% if m.role in ['user', 'assistant'] %}{{ m.role }}: \
             {{ m.content }}\n{% endif %}{% endfor %}",
        );
        let ok = t.render(&[Message::user("hi")], false, None).unwrap();
        assert_eq!(ok, "user: hi\n");
        let e = t
            .render(
                &[Message::new("critic", "bad"), Message::user("hi")],
                false,
                None,
            )
            .unwrap_err();
        assert!(format!("{e:#}").contains("cannot express messages with role \"critic\""));
    }

    #[test]
    fn empty_conversation_is_an_error() {
        let t = template("{{ messages|length }}");
        assert!(t.render(&[], true, None).is_err());
    }

    #[test]
    fn messages_are_normalised_like_transformers() {
        let t = template("{% for m in messages %}{{ m|tojson }}{% endfor %}");
        let msgs = [
            serde_json::json!({"role": "assistant", "content": "4", "tool_calls": null,
                                        "reasoning": "add"}),
        ];
        let out = t.render_json(&msgs, None, false, None).unwrap();
        // transformers 5.23.0: nulls dropped, reasoning aliased as thinking + reasoning_content.
        assert_eq!(
            out,
            r#"{"thinking": "add", "role": "assistant", "content": "4", "reasoning": "add", "reasoning_content": "add"}"#
        );
    }

    #[test]
    fn message_json_form() {
        let m: Message = serde_json::from_str(r#"{"role": "user", "content": "hi"}"#).unwrap();
        assert_eq!(m, Message::user("hi"));
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"role":"user","content":"hi"}"#
        );
        assert!(serde_json::from_str::<Message>(
            r#"{"role": "assistant", "content": "",
            "tool_calls": []}"#
        )
        .is_err());
    }
}
