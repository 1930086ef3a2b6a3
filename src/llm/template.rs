//! Chat formats: a conversation becomes the prompt text the model was trained on. Hugging Face
//! Jinja templates (`tokenizer_config.json`'s `chat_template`, or `chat_template.jinja` beside it)
//! are rendered with minijinja under the same settings and variables `transformers` uses; a model
//! whose files carry no template gets the built-in Gemma 4 format (shared/notes/gemma4.md §2.3).

use super::tokenizer::Tokenizer;
use super::{LlmError, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Message {
        Message {
            role: Role::System,
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Message {
        Message {
            role: Role::Assistant,
            content: content.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenderOptions {
    /// Append the opening of the model's turn (`<|turn>model\n`, `<|im_start|>assistant\n`).
    pub add_generation_prompt: bool,
    /// Gemma 4's thinking mode (`enable_thinking` for Jinja templates that read it).
    pub enable_thinking: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Format {
    Jinja(String),
    Gemma4,
}

/// A chat format plus the special-token strings templates refer to.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatTemplate {
    format: Format,
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token` as `tokenizer_config.json` names them.
    tokens: BTreeMap<String, String>,
}

/// Gemma 4's control strings (gemma4.md §2.2).
const GEMMA4_BOS: &str = "<bos>";
const GEMMA4_EOS: &str = "<eos>";
const GEMMA4_TURN_OPEN: &str = "<|turn>";
const GEMMA4_TURN_CLOSE: &str = "<turn|>";
const GEMMA4_THINK: &str = "<|think|>";
const GEMMA4_CHANNEL_OPEN: &str = "<|channel>";
const GEMMA4_CHANNEL_CLOSE: &str = "<channel|>";

impl ChatTemplate {
    /// The built-in Gemma 4 E2B/E4B format.
    pub fn gemma4() -> ChatTemplate {
        let tokens = [("bos_token", GEMMA4_BOS), ("eos_token", GEMMA4_EOS)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ChatTemplate {
            format: Format::Gemma4,
            tokens,
        }
    }

    /// A Jinja template with the given special-token strings (`bos_token` → `<s>`, …).
    pub fn jinja(source: impl Into<String>, tokens: &[(&str, &str)]) -> ChatTemplate {
        ChatTemplate {
            format: Format::Jinja(source.into()),
            tokens: tokens
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    pub fn is_builtin(&self) -> bool {
        self.format == Format::Gemma4
    }

    /// `"jinja"` or `"gemma4 (built-in)"`, for logs and `ModelInfo`.
    pub fn describe(&self) -> &'static str {
        match self.format {
            Format::Jinja(_) => "jinja (from the model's files)",
            Format::Gemma4 => "gemma4 (built-in)",
        }
    }

    pub fn token(&self, name: &str) -> Option<&str> {
        self.tokens.get(name).map(String::as_str)
    }

    /// Reads `tokenizer_config.json`; the template comes from its `chat_template` (a string, or
    /// a list of named templates of which `default` is used), else from a `chat_template.jinja`
    /// beside it (the layout `transformers` ≥ 4.43 saves), else the built-in Gemma 4 format.
    pub fn from_config_file(path: &Path) -> Result<ChatTemplate> {
        let text = std::fs::read_to_string(path).map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let beside = path.parent().map(|d| d.join("chat_template.jinja"));
        let jinja_file = match beside {
            Some(p) if p.is_file() => Some(
                std::fs::read_to_string(&p).map_err(|source| LlmError::Io { path: p, source })?,
            ),
            _ => None,
        };
        Self::from_config_json(&text, jinja_file)
            .map_err(|e| LlmError::Template(format!("{}: {e}", path.display())))
    }

    /// Parses the text of a `tokenizer_config.json`; `jinja_file` is the text of a
    /// `chat_template.jinja` found beside it, used when the config has no template.
    pub fn from_config_json(json: &str, jinja_file: Option<String>) -> Result<ChatTemplate> {
        let cfg: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| LlmError::Template(format!("not valid JSON: {e}")))?;
        let mut tokens = BTreeMap::new();
        for name in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            // Either a plain string or an AddedToken object {"content": …}.
            let v = match cfg.get(name) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Object(o)) => o
                    .get("content")
                    .and_then(|c| c.as_str())
                    .map(str::to_string),
                _ => None,
            };
            if let Some(v) = v {
                tokens.insert(name.to_string(), v);
            }
        }
        let from_config = match cfg.get("chat_template") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(list)) => {
                let named = |want: &str| {
                    list.iter().find_map(|e| {
                        (e.get("name")?.as_str()? == want)
                            .then(|| e.get("template")?.as_str().map(str::to_string))?
                    })
                };
                Some(named("default").ok_or_else(|| {
                    LlmError::Template("`chat_template` is a list without a `default` entry".into())
                })?)
            }
            Some(_) => {
                return Err(LlmError::Template(
                    "`chat_template` is neither a string nor a list".into(),
                ))
            }
        };
        let format = match from_config.or(jinja_file) {
            Some(src) => Format::Jinja(src),
            None => {
                for (k, v) in [("bos_token", GEMMA4_BOS), ("eos_token", GEMMA4_EOS)] {
                    tokens.entry(k.to_string()).or_insert_with(|| v.to_string());
                }
                Format::Gemma4
            }
        };
        let t = ChatTemplate { format, tokens };
        if let Format::Jinja(src) = &t.format {
            // Fail at load, not at the first message, on a template minijinja cannot parse.
            environment()
                .template_from_str(src)
                .map_err(|e| LlmError::Template(describe(&e)))?;
        }
        Ok(t)
    }

    /// The prompt text for `messages`.
    pub fn render(&self, messages: &[Message], opts: RenderOptions) -> Result<String> {
        match &self.format {
            Format::Gemma4 => Ok(render_gemma4(messages, opts)),
            Format::Jinja(src) => {
                let env = environment();
                let tmpl = env
                    .template_from_str(src)
                    .map_err(|e| LlmError::Template(describe(&e)))?;
                let mut ctx: BTreeMap<&str, minijinja::Value> = BTreeMap::new();
                ctx.insert("messages", minijinja::Value::from_serialize(messages));
                ctx.insert("add_generation_prompt", opts.add_generation_prompt.into());
                ctx.insert("enable_thinking", opts.enable_thinking.into());
                for (k, v) in &self.tokens {
                    ctx.insert(k.as_str(), v.as_str().into());
                }
                tmpl.render(ctx)
                    .map_err(|e| LlmError::Template(describe(&e)))
            }
        }
    }

    /// Token ids that close a model turn, found by rendering a probe exchange and reading the
    /// first token after the model's text: `<turn|>` for Gemma 4, `<|im_end|>` for ChatML,
    /// `<|eot_id|>` for Llama 3. Only special (added) tokens count, so a template that ends
    /// turns with plain text yields none.
    pub fn end_of_turn_ids(&self, tokenizer: &Tokenizer) -> Vec<u32> {
        const MARK: &str = "Pteria end-of-turn probe";
        let probe = [Message::user("Hi"), Message::assistant(MARK)];
        let mut ids = Vec::new();
        if let Ok(text) = self.render(&probe, RenderOptions::default()) {
            if let Some(at) = text.rfind(MARK) {
                let after = &text[at + MARK.len()..];
                if let Ok(toks) = tokenizer.encode(after) {
                    if let Some(&first) = toks.first() {
                        if tokenizer.is_special(first) {
                            ids.push(first);
                        }
                    }
                }
            }
        }
        if self.is_builtin() {
            if let Some(id) = tokenizer.token_id(GEMMA4_TURN_CLOSE) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }
}

/// The Gemma 4 E2B template's plain-chat path: `<bos>`, a system turn only when thinking is on
/// or the first message is a system message, `assistant` renamed `model`, contents trimmed,
/// earlier thoughts (`<|channel>…<channel|>`) stripped from model turns.
fn render_gemma4(messages: &[Message], opts: RenderOptions) -> String {
    let mut out = String::from(GEMMA4_BOS);
    let (system, rest) = match messages.split_first() {
        Some((first, rest)) if first.role == Role::System => (Some(first.content.as_str()), rest),
        _ => (None, messages),
    };
    if opts.enable_thinking || system.is_some() {
        out.push_str(GEMMA4_TURN_OPEN);
        out.push_str("system\n");
        if opts.enable_thinking {
            // The newest template revision puts a newline after the think token.
            out.push_str(GEMMA4_THINK);
            out.push('\n');
        }
        out.push_str(system.unwrap_or("").trim());
        out.push_str(GEMMA4_TURN_CLOSE);
        out.push('\n');
    }
    for m in rest {
        let (role, content) = match m.role {
            Role::Assistant => ("model", strip_thinking(&m.content)),
            Role::User => ("user", m.content.clone()),
            Role::System => ("system", m.content.clone()),
        };
        out.push_str(GEMMA4_TURN_OPEN);
        out.push_str(role);
        out.push('\n');
        out.push_str(content.trim());
        out.push_str(GEMMA4_TURN_CLOSE);
        out.push('\n');
    }
    if opts.add_generation_prompt {
        out.push_str(GEMMA4_TURN_OPEN);
        out.push_str("model\n");
    }
    out
}

/// Removes every `<|channel>…<channel|>` block (an unclosed one runs to the end).
fn strip_thinking(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(GEMMA4_CHANNEL_OPEN) {
        out.push_str(&rest[..start]);
        match rest[start..].find(GEMMA4_CHANNEL_CLOSE) {
            Some(end) => rest = &rest[start + end + GEMMA4_CHANNEL_CLOSE.len()..],
            None => rest = "",
        }
    }
    out.push_str(rest);
    out
}

/// Instructions a render may run (`environment`).
const TEMPLATE_FUEL: u64 = 50_000_000;

/// An environment configured as `transformers` configures Jinja for chat templates:
/// trim_blocks and lstrip_blocks, loop controls, `raise_exception`, `tojson`, `strftime_now`,
/// and Python string/dict methods (`.strip()`, `.startswith()`, `.items()`).
fn environment() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    // A template's loops end: the demo model's ChatML template renders a 1001-message chat in
    // under 30,000 instructions, and a hostile one (nested `range` loops, each within
    // minijinja's cap) stops with an error (2.6 s on a 2-core machine, release build) instead
    // of hanging the app.
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    // transformers replaces Jinja's `tojson` with `json.dumps(ensure_ascii=False)`: Python's
    // ", " / ": " separators, key order kept, and no HTML escaping (which would mangle `<|…|>`).
    env.add_filter(
        "tojson",
        |value: minijinja::Value, kwargs: minijinja::value::Kwargs| {
            let indent: Option<usize> = kwargs.get("indent")?;
            python_json(&value, indent)
                .map(minijinja::Value::from_safe_string)
                .map_err(|e| {
                    minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
                })
        },
    );
    env.add_function("strftime_now", |fmt: String| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        strftime_utc(&fmt, secs)
    });
    env
}

/// `json.dumps(value, ensure_ascii=False, indent=indent)` as Python writes it.
fn python_json(value: &minijinja::Value, indent: Option<usize>) -> serde_json::Result<String> {
    use serde::Serialize;
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&pad),
            );
            value.serialize(&mut ser)?;
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonSeparators);
            value.serialize(&mut ser)?;
        }
    }
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// Python's default `json.dumps` separators: `", "` between items, `": "` after keys.
struct PythonSeparators;

impl serde_json::ser::Formatter for PythonSeparators {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

fn describe(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    msg
}

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
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// The subset of C `strftime` chat templates use (Llama 3.x writes `%d %b %Y`), in UTC: no time
/// zone database on device, and a date line in a system prompt does not need one.
pub fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('j') => out.push_str(&format!("{:03}", civil_day_of_year(year, month, day))),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn civil_day_of_year(year: i64, month: i64, day: i64) -> i64 {
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    CUM[(month - 1) as usize] + day + i64::from(leap && month > 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday (leap day).
        let t = 1_709_211_909;
        assert_eq!(strftime_utc("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime_utc("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime_utc("%A %B %e, %y %j %%", t),
            "Thursday February 29, 24 060 %"
        );
        assert_eq!(strftime_utc("%a %d %B", 0), "Thu 01 January");
        // Before the epoch.
        assert_eq!(strftime_utc("%Y-%m-%d", -86_400), "1969-12-31");
    }

    #[test]
    fn thinking_blocks_are_stripped_from_model_turns() {
        assert_eq!(
            strip_thinking("<|channel>thought\nhmm<channel|>Answer"),
            "Answer"
        );
        assert_eq!(strip_thinking("a<|channel>x<channel|>b<|channel>y"), "ab");
        assert_eq!(strip_thinking("plain"), "plain");
    }

    #[test]
    fn raise_exception_surfaces_the_template_message() {
        let t = ChatTemplate::jinja("{{ raise_exception('roles must alternate') }}", &[]);
        let err = t
            .render(&[Message::user("x")], RenderOptions::default())
            .unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn python_string_methods_and_tojson_work() {
        let t = ChatTemplate::jinja(
            "{% for m in messages %}{{ m['content'].strip().upper() }}|{{ m | tojson }}{% endfor %}",
            &[],
        );
        let s = t
            .render(&[Message::user("  hi ")], RenderOptions::default())
            .unwrap();
        assert_eq!(s, r#"HI|{"role": "user", "content": "  hi "}"#);
        let t = ChatTemplate::jinja(
            "{{ {'a': ['<|x|>', 'é'], 'b': 1} | tojson(indent=2) }}",
            &[],
        );
        let s = t.render(&[], RenderOptions::default()).unwrap();
        assert_eq!(
            s,
            "{\n  \"a\": [\n    \"<|x|>\",\n    \"é\"\n  ],\n  \"b\": 1\n}"
        );
    }

    #[test]
    fn config_forms_are_understood() {
        let t = ChatTemplate::from_config_json(
            r#"{"bos_token": {"content": "<s>", "special": true}, "eos_token": "</s>",
                "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D{{ eos_token }}"}]}"#,
            None,
        )
        .unwrap();
        assert_eq!(t.render(&[], RenderOptions::default()).unwrap(), "<s>D</s>");
        let t = ChatTemplate::from_config_json(
            r#"{"eos_token": "</s>"}"#,
            Some("F{{ eos_token }}".into()),
        )
        .unwrap();
        assert_eq!(t.render(&[], RenderOptions::default()).unwrap(), "F</s>");
        let t = ChatTemplate::from_config_json(r#"{}"#, None).unwrap();
        assert!(t.is_builtin());
        assert!(ChatTemplate::from_config_json(r#"{"chat_template": "{% if %}"}"#, None).is_err());
        assert!(ChatTemplate::from_config_json(
            r#"{"chat_template": [{"name": "x", "template": "y"}]}"#,
            None
        )
        .is_err());
        assert!(ChatTemplate::from_config_json("not json", None).is_err());
    }
}
