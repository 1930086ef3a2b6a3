//! The chat core's values as the window's rows: conversations, messages with their markdown
//! blocks as Slint styled text, model picker rows, settings. Pure conversions, no state.

use crate::{ConversationRow, MdBlock, MessageRow, VariantRow};
use pteria::chat::markdown::{self, Block, Span};
use pteria::chat::{
    Author, ConversationSummary, DeviceChoice, MessageStats, ModelView, StoredMessage,
    TablesChoice, VariantState,
};
use slint::{ModelRc, StyledText, VecModel};

pub fn conversation_row(c: &ConversationSummary) -> ConversationRow {
    let messages = match c.message_count {
        1 => "1 message".to_string(),
        n => format!("{n} messages"),
    };
    ConversationRow {
        id: c.id.as_str().into(),
        title: c.title.as_str().into(),
        subtitle: messages.into(),
    }
}

pub fn message_row(m: &StoredMessage) -> MessageRow {
    let user = m.author == Author::User;
    let mut stats = m.stats.as_ref().map(stats_line).unwrap_or_default();
    if m.stopped {
        stats = if stats.is_empty() {
            "stopped".into()
        } else {
            format!("{stats} · stopped")
        };
    }
    MessageRow {
        id: m.id.as_str().into(),
        user,
        text: m.content.as_str().into(),
        blocks: if user {
            ModelRc::default()
        } else {
            blocks(&m.content)
        },
        stats: stats.into(),
        streaming: false,
        error: m.error.as_deref().unwrap_or_default().into(),
    }
}

/// The empty assistant row a streamed reply grows into.
pub fn streaming_row(id: &str) -> MessageRow {
    MessageRow {
        id: id.into(),
        user: false,
        streaming: true,
        ..MessageRow::default()
    }
}

/// "TTFT 120 ms · 35.2 tok/s · 42 tokens".
pub fn stats_line(s: &MessageStats) -> String {
    let mut parts = Vec::new();
    if let Some(ttft) = s.ttft_ms {
        parts.push(format!("TTFT {ttft:.0} ms"));
    }
    parts.push(format!("{:.1} tok/s", s.decode_tokens_per_s));
    parts.push(format!("{} tokens", s.generated_tokens));
    parts.join(" · ")
}

/// An assistant reply's blocks, parsed by the chat core.
pub fn blocks(text: &str) -> ModelRc<MdBlock> {
    let rows: Vec<MdBlock> = markdown::parse(text).iter().map(block).collect();
    ModelRc::new(VecModel::from(rows))
}

fn block(b: &Block) -> MdBlock {
    let kind = |k: &str| MdBlock {
        kind: k.into(),
        ..MdBlock::default()
    };
    match b {
        Block::Paragraph { spans } => MdBlock {
            text: styled(spans),
            ..kind("paragraph")
        },
        Block::Heading { level, spans } => MdBlock {
            // StyledText has no weight of its own: a heading is strong text, sized by level.
            text: styled(&emboldened(spans)),
            level: i32::from(*level),
            ..kind("heading")
        },
        Block::ListItem {
            depth,
            marker,
            spans,
        } => MdBlock {
            text: styled(spans),
            depth: i32::try_from(*depth).unwrap_or(i32::MAX),
            marker: marker.as_str().into(),
            ..kind("item")
        },
        Block::Quote { spans } => MdBlock {
            text: styled(spans),
            ..kind("quote")
        },
        Block::Code { language, code } => MdBlock {
            code: code.as_str().into(),
            language: language.as_deref().unwrap_or_default().into(),
            ..kind("code")
        },
        Block::Rule => kind("rule"),
    }
}

fn emboldened(spans: &[Span]) -> Vec<Span> {
    spans
        .iter()
        .map(|s| Span {
            strong: true,
            ..s.clone()
        })
        .collect()
}

/// Spans as Slint styled text. Slint builds styled text only from markdown, so the spans are
/// written back as markdown with every ASCII punctuation character of their text escaped: what a
/// model wrote can never turn into markup (or into one of the constructs Slint refuses).
pub fn styled(spans: &[Span]) -> StyledText {
    let md = spans_markdown(spans);
    StyledText::from_markdown(&md).unwrap_or_else(|_| {
        // Unreachable with escaped text; showing the words unstyled beats showing nothing.
        StyledText::from_plain_text(&markdown::plain_text(spans))
    })
}

fn spans_markdown(spans: &[Span]) -> String {
    let mut out = String::new();
    for s in spans {
        if s.code {
            out.push_str(&code_span(&s.text));
            continue;
        }
        // Emphasis delimiters only work hugging non-space text: keep spaces outside them.
        let core = s.text.trim_matches(' ');
        let lead = &s.text[..s.text.len() - s.text.trim_start_matches(' ').len()];
        let trail = &s.text[s.text.trim_end_matches(' ').len()..];
        push_escaped(&mut out, lead);
        if core.is_empty() {
            continue;
        }
        let mut open = String::new();
        if s.link.is_some() {
            open.push('[');
        }
        if s.strikethrough {
            open.push_str("~~");
        }
        if s.strong {
            open.push_str("**");
        }
        if s.emphasis {
            open.push('*');
        }
        let close: String = open.chars().rev().filter(|c| *c != '[').collect::<String>();
        out.push_str(&open);
        push_escaped(&mut out, core);
        out.push_str(&close);
        if let Some(url) = &s.link {
            out.push_str("](");
            for c in url.chars() {
                match c {
                    ' ' => out.push_str("%20"),
                    '\n' => {}
                    c if c.is_ascii_punctuation() => {
                        out.push('\\');
                        out.push(c);
                    }
                    c => out.push(c),
                }
            }
            out.push(')');
        }
        push_escaped(&mut out, trail);
    }
    out
}

/// Text with markdown's punctuation escaped; a line's leading spaces dropped (they would start an
/// indented code block) and blank lines folded (they would end the paragraph).
fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        let line_start = out.is_empty() || out.ends_with('\n');
        match c {
            ' ' | '\t' if line_start => {}
            '\n' if line_start => {}
            '\t' => out.push(' '),
            c if c.is_ascii_punctuation() => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
}

/// An inline code span fenced by one more backtick than the longest run inside it.
fn code_span(text: &str) -> String {
    let text = text.replace('\n', " ");
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    // A space each side keeps a backtick at either end from joining the fence; CommonMark
    // strips one such space.
    format!("{fence} {text} {fence}")
}

/// The model picker's rows: one per variant, the model's name on its first.
pub fn variant_rows(models: &[ModelView]) -> Vec<VariantRow> {
    let mut rows = Vec::new();
    for m in models {
        for (i, v) in m.variants.iter().enumerate() {
            let (state, progress, progress_text) = match &v.state {
                VariantState::Bundled => ("bundled", 0.0, String::new()),
                VariantState::BundledMissing => ("missing", 0.0, String::new()),
                VariantState::Downloaded => ("downloaded", 0.0, String::new()),
                VariantState::Downloading { done, total } => (
                    "downloading",
                    fraction(*done, *total),
                    progress_text(*done, *total),
                ),
                VariantState::Partial { bytes } => (
                    "partial",
                    0.0,
                    format!("{} downloaded", human_bytes(*bytes)),
                ),
                VariantState::Remote => ("remote", 0.0, String::new()),
            };
            rows.push(VariantRow {
                spec: v.spec.as_str().into(),
                model_name: m.name.as_str().into(),
                first_of_model: i == 0,
                variant: v.id.as_str().into(),
                backend: v.backend.into(),
                quantization: v.quantization.as_str().into(),
                size: human_bytes(v.bytes).into(),
                platform_default: v.platform_default,
                default_reason: v.default_reason.as_deref().unwrap_or_default().into(),
                fit_light: v.fit.light.into(),
                fit_summary: v.fit.summary.as_str().into(),
                state: state.into(),
                progress,
                progress_text: progress_text.into(),
                loaded: v.loaded,
            });
        }
    }
    rows
}

/// A running download's row as progress comes in, without asking the core for the whole list.
pub fn with_progress(row: &VariantRow, done: u64, total: u64) -> VariantRow {
    VariantRow {
        state: "downloading".into(),
        progress: fraction(done, total),
        progress_text: progress_text(done, total).into(),
        ..row.clone()
    }
}

fn fraction(done: u64, total: u64) -> f32 {
    if total == 0 {
        0.0
    } else {
        (done as f64 / total as f64).clamp(0.0, 1.0) as f32
    }
}

fn progress_text(done: u64, total: u64) -> String {
    format!("{} of {}", human_bytes(done), human_bytes(total))
}

pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.0} kB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

/// The settings page's device combo box index.
pub fn device_index(d: DeviceChoice) -> i32 {
    match d {
        DeviceChoice::Auto => 0,
        DeviceChoice::Gpu => 1,
        DeviceChoice::Cpu => 2,
    }
}

pub fn device_choice(index: i32) -> DeviceChoice {
    match index {
        1 => DeviceChoice::Gpu,
        2 => DeviceChoice::Cpu,
        _ => DeviceChoice::Auto,
    }
}

/// The settings page's embedding tables combo box index.
pub fn tables_index(t: TablesChoice) -> i32 {
    match t {
        TablesChoice::Auto => 0,
        TablesChoice::Host => 1,
        TablesChoice::Gpu => 2,
    }
}

pub fn tables_choice(index: i32) -> TablesChoice {
    match index {
        1 => TablesChoice::Host,
        2 => TablesChoice::Gpu,
        _ => TablesChoice::Auto,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(md: &str) -> Vec<Span> {
        match markdown::parse(md).as_slice() {
            [Block::Paragraph { spans }] => spans.clone(),
            other => panic!("{other:?}"),
        }
    }

    /// The spans the core parsed, written back for Slint, style the text exactly as Slint's
    /// own parser styles the original.
    #[test]
    fn spans_render_as_slint_parses_the_original() {
        for md in [
            "plain words",
            "Hello *you* and **all**, run `ls -a` ~~now~~.",
            "**a***b* and *c***d**",
            "see [the docs](https://example.com/a_b?x=1&y=(2)) now",
            "use `` a`b `` here",
            "line one\nline two",
            "a **bold statement** with `*stars*` inside code",
        ] {
            let want = StyledText::from_markdown(md).unwrap();
            assert_eq!(
                format!("{:?}", styled(&parsed(md))),
                format!("{want:?}"),
                "{md:?} -> {:?}",
                spans_markdown(&parsed(md))
            );
        }
    }

    #[test]
    fn model_text_never_becomes_markup() {
        for text in [
            "<script>alert(1)</script>",
            "# not a heading",
            "1. not a list\n- nor this\n    nor code",
            "<u>under</u> <font color=\"red\">x</font> \\* &amp; [l](u) ![i](j)",
        ] {
            let md = spans_markdown(&[Span::plain(text)]);
            let got = StyledText::from_markdown(&md)
                .unwrap_or_else(|e| panic!("{text:?} escaped to {md:?}: {e}"));
            let got = format!("{got:?}");
            // No styled range, no link, and every line's characters as written.
            assert!(!got.contains("FormattedSpan"), "{md:?}: {got}");
            for line in text.lines() {
                assert!(
                    got.contains(&format!("{:?}", line.trim_start())),
                    "{line:?} in {got}"
                );
            }
        }
    }

    #[test]
    fn stats_line_shows_ttft_speed_and_tokens() {
        let s = MessageStats {
            model: "m:v".into(),
            prompt_tokens: 10,
            cached_tokens: 0,
            generated_tokens: 42,
            ttft_ms: Some(123.4),
            prefill_tokens_per_s: 100.0,
            decode_tokens_per_s: 35.24,
            stop: "end of turn".into(),
            dropped_messages: 0,
            context_tokens: 2048,
            seed: 1,
        };
        assert_eq!(stats_line(&s), "TTFT 123 ms · 35.2 tok/s · 42 tokens");
    }

    #[test]
    fn sizes_read_in_decimal_units() {
        assert_eq!(human_bytes(2_500_000_000), "2.50 GB");
        assert_eq!(human_bytes(135_000_000), "135 MB");
        assert_eq!(human_bytes(512), "512 B");
    }
}
