//! Assistant replies as blocks of styled spans, parsed from markdown (CommonMark plus
//! strikethrough) with pulldown-cmark, for every shell to render natively. Raw HTML in a reply
//! stays plain text: nothing a model writes becomes markup, links are data, never followed here.

use serde::Serialize;

/// One block of a reply, top to bottom.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Block {
    Paragraph {
        spans: Vec<Span>,
    },
    /// `level` 1 to 6.
    Heading {
        level: u8,
        spans: Vec<Span>,
    },
    /// A list item's paragraph. `depth` 0 is the outermost list; `marker` is `•` or `3.` on an
    /// item's first paragraph and empty on the paragraphs after it.
    ListItem {
        depth: usize,
        marker: String,
        spans: Vec<Span>,
    },
    /// A paragraph inside a block quote.
    Quote {
        spans: Vec<Span>,
    },
    /// A fenced or indented code block, verbatim, without its final newline.
    Code {
        language: Option<String>,
        code: String,
    },
    Rule,
}

/// A run of text with one style. Line breaks inside a paragraph are `\n` in `text`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Span {
    pub text: String,
    pub strong: bool,
    pub emphasis: bool,
    pub strikethrough: bool,
    /// Inline code.
    pub code: bool,
    /// The destination of the link this text is in.
    pub link: Option<String>,
}

impl Span {
    pub fn plain(text: impl Into<String>) -> Span {
        Span {
            text: text.into(),
            ..Span::default()
        }
    }

    fn same_style(&self, other: &Span) -> bool {
        (
            self.strong,
            self.emphasis,
            self.strikethrough,
            self.code,
            &self.link,
        ) == (
            other.strong,
            other.emphasis,
            other.strikethrough,
            other.code,
            &other.link,
        )
    }
}

/// The text of spans without their styles.
pub fn plain_text(spans: &[Span]) -> String {
    spans.iter().map(|s| s.text.as_str()).collect()
}

/// Parses a reply (complete or still streaming: an unclosed code fence runs to the end) into
/// blocks.
pub fn parse(markdown: &str) -> Vec<Block> {
    use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

    let mut b = Builder::default();
    for event in Parser::new_ext(markdown, Options::ENABLE_STRIKETHROUGH) {
        match event {
            Event::Start(tag) => match tag {
                Tag::Paragraph | Tag::HtmlBlock => b.flush(),
                Tag::Heading { level, .. } => {
                    b.flush();
                    b.open = Some((Open::Heading(level as u8), Vec::new()));
                }
                Tag::BlockQuote(_) => {
                    b.flush();
                    b.quotes += 1;
                }
                Tag::CodeBlock(kind) => {
                    b.flush();
                    let language = match kind {
                        CodeBlockKind::Fenced(info) => info
                            .split_whitespace()
                            .next()
                            .map(str::to_string)
                            .filter(|l| !l.is_empty()),
                        CodeBlockKind::Indented => None,
                    };
                    b.code = Some((language, String::new()));
                }
                Tag::List(start) => {
                    b.flush();
                    b.lists.push(start);
                }
                Tag::Item => {
                    b.flush();
                    b.marker = Some(match b.lists.last_mut() {
                        Some(Some(n)) => {
                            *n += 1;
                            format!("{}.", *n - 1)
                        }
                        _ => "•".to_string(),
                    });
                }
                Tag::Emphasis => b.emphasis += 1,
                Tag::Strong => b.strong += 1,
                Tag::Strikethrough => b.strikethrough += 1,
                Tag::Link { dest_url, .. } => b.links.push(dest_url.to_string()),
                // Images become their alt text; tables and the other extensions are not enabled.
                _ => {}
            },
            Event::End(tag) => match tag {
                TagEnd::Paragraph | TagEnd::Heading(_) | TagEnd::HtmlBlock => b.flush(),
                TagEnd::BlockQuote(_) => {
                    b.flush();
                    b.quotes = b.quotes.saturating_sub(1);
                }
                TagEnd::CodeBlock => {
                    if let Some((language, mut code)) = b.code.take() {
                        if code.ends_with('\n') {
                            code.pop();
                        }
                        b.blocks.push(Block::Code { language, code });
                    }
                }
                TagEnd::List(_) => {
                    b.flush();
                    b.lists.pop();
                }
                TagEnd::Item => {
                    b.flush();
                    b.marker = None;
                }
                TagEnd::Emphasis => b.emphasis = b.emphasis.saturating_sub(1),
                TagEnd::Strong => b.strong = b.strong.saturating_sub(1),
                TagEnd::Strikethrough => b.strikethrough = b.strikethrough.saturating_sub(1),
                TagEnd::Link => {
                    b.links.pop();
                }
                _ => {}
            },
            Event::Text(t) => b.text(&t, false),
            Event::Code(t) => b.text(&t, true),
            // Kept as the characters the model wrote.
            Event::Html(t) | Event::InlineHtml(t) => b.text(&t, false),
            Event::SoftBreak | Event::HardBreak => b.text("\n", false),
            Event::Rule => {
                b.flush();
                b.blocks.push(Block::Rule);
            }
            _ => {}
        }
    }
    b.flush();
    if let Some((language, code)) = b.code.take() {
        b.blocks.push(Block::Code { language, code });
    }
    b.blocks
}

enum Open {
    Paragraph,
    Heading(u8),
    Item { depth: usize, marker: String },
    Quote,
}

#[derive(Default)]
struct Builder {
    blocks: Vec<Block>,
    open: Option<(Open, Vec<Span>)>,
    code: Option<(Option<String>, String)>,
    /// Each open list's next number (`None`: bulleted).
    lists: Vec<Option<u64>>,
    /// The marker of the list item whose first text has not come yet.
    marker: Option<String>,
    quotes: usize,
    strong: usize,
    emphasis: usize,
    strikethrough: usize,
    links: Vec<String>,
}

impl Builder {
    fn text(&mut self, text: &str, code: bool) {
        if let Some((_, buf)) = &mut self.code {
            buf.push_str(text);
            return;
        }
        let span = Span {
            text: text.to_string(),
            strong: self.strong > 0,
            emphasis: self.emphasis > 0,
            strikethrough: self.strikethrough > 0,
            code,
            link: self.links.last().cloned(),
        };
        let open = if self.quotes > 0 {
            Open::Quote
        } else if !self.lists.is_empty() {
            Open::Item {
                depth: self.lists.len() - 1,
                marker: self.marker.take().unwrap_or_default(),
            }
        } else {
            Open::Paragraph
        };
        let (_, spans) = self.open.get_or_insert_with(|| (open, Vec::new()));
        match spans.last_mut() {
            Some(last) if last.same_style(&span) => last.text.push_str(&span.text),
            _ => spans.push(span),
        }
    }

    fn flush(&mut self) {
        let Some((open, mut spans)) = self.open.take() else {
            return;
        };
        // A trailing line break ends nothing visible.
        if let Some(last) = spans.last_mut() {
            if last.text.ends_with('\n') {
                last.text.pop();
            }
            if last.text.is_empty() {
                spans.pop();
            }
        }
        self.blocks.push(match open {
            Open::Paragraph => Block::Paragraph { spans },
            Open::Heading(level) => Block::Heading { level, spans },
            Open::Item { depth, marker } => Block::ListItem {
                depth,
                marker,
                spans,
            },
            Open::Quote => Block::Quote { spans },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn styled(text: &str, f: impl FnOnce(&mut Span)) -> Span {
        let mut s = Span::plain(text);
        f(&mut s);
        s
    }

    #[test]
    fn paragraphs_with_emphasis_strong_code_and_links() {
        let blocks = parse(
            "Hello *you* and **all**, run `ls` ~~now~~.\nNext line.\n\n[docs](https://x.y/z) end",
        );
        assert_eq!(
            blocks,
            vec![
                Block::Paragraph {
                    spans: vec![
                        Span::plain("Hello "),
                        styled("you", |s| s.emphasis = true),
                        Span::plain(" and "),
                        styled("all", |s| s.strong = true),
                        Span::plain(", run "),
                        styled("ls", |s| s.code = true),
                        Span::plain(" "),
                        styled("now", |s| s.strikethrough = true),
                        Span::plain(".\nNext line."),
                    ]
                },
                Block::Paragraph {
                    spans: vec![
                        styled("docs", |s| s.link = Some("https://x.y/z".into())),
                        Span::plain(" end"),
                    ]
                },
            ]
        );
    }

    #[test]
    fn nested_and_numbered_lists_keep_depth_and_markers() {
        let blocks = parse("3. three\n4. four\n   - inner *a*\n   - inner b\n\n   more of four\n");
        let items: Vec<(usize, String, String)> = blocks
            .iter()
            .map(|b| match b {
                Block::ListItem {
                    depth,
                    marker,
                    spans,
                } => (*depth, marker.clone(), plain_text(spans)),
                other => panic!("not a list item: {other:?}"),
            })
            .collect();
        assert_eq!(
            items,
            vec![
                (0, "3.".into(), "three".into()),
                (0, "4.".into(), "four".into()),
                (1, "•".into(), "inner a".into()),
                (1, "•".into(), "inner b".into()),
                (0, "".into(), "more of four".into()),
            ]
        );
    }

    #[test]
    fn code_blocks_are_verbatim_with_their_language() {
        let blocks = parse(
            "Run:\n\n```rust\nfn main() {\n    println!(\"*hi*\");\n}\n```\n\n    indented <b>\n",
        );
        assert_eq!(
            blocks,
            vec![
                Block::Paragraph {
                    spans: vec![Span::plain("Run:")]
                },
                Block::Code {
                    language: Some("rust".into()),
                    code: "fn main() {\n    println!(\"*hi*\");\n}".into()
                },
                Block::Code {
                    language: None,
                    code: "indented <b>".into()
                },
            ]
        );
    }

    #[test]
    fn an_unclosed_fence_while_streaming_is_code_to_the_end() {
        let blocks = parse("Here:\n```py\nprint(1)\nx = [");
        assert_eq!(
            blocks.last(),
            Some(&Block::Code {
                language: Some("py".into()),
                code: "print(1)\nx = [".into()
            })
        );
    }

    #[test]
    fn html_in_a_reply_stays_text() {
        let blocks = parse("<script>alert(1)</script>\n\nx <img src=a onerror=alert(2)> y");
        let texts: Vec<String> = blocks
            .iter()
            .map(|b| match b {
                Block::Paragraph { spans } => plain_text(spans),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            texts,
            vec![
                "<script>alert(1)</script>".to_string(),
                "x <img src=a onerror=alert(2)> y".to_string()
            ]
        );
    }

    #[test]
    fn headings_quotes_and_rules() {
        let blocks = parse("# Title\n\n> quoted **bit**\n\n---\n\n## Sub");
        assert_eq!(
            blocks,
            vec![
                Block::Heading {
                    level: 1,
                    spans: vec![Span::plain("Title")]
                },
                Block::Quote {
                    spans: vec![Span::plain("quoted "), styled("bit", |s| s.strong = true)]
                },
                Block::Rule,
                Block::Heading {
                    level: 2,
                    spans: vec![Span::plain("Sub")]
                },
            ]
        );
        assert_eq!(parse(""), vec![]);
    }
}
