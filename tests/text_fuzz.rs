//! The text parsers a model's files and replies go through, fuzzed like the program reader:
//! `tokenizer.json` (a downloaded or user-added model's), the chat template in
//! `tokenizer_config.json`, and the markdown of assistant replies; and the app's own files
//! (saved conversations and settings) and its model catalog. Every mutant must load and run, or
//! fail with an error; none may panic, and a damaged conversation stays on disk as it was.

mod common;

use common::fuzz::Seed;
use pteria::chat::markdown::{self, Block};
use pteria::llm::{ChatTemplate, Message, RenderOptions, Tokenizer};
use std::path::PathBuf;

fn demo_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets/models/smollm2-135m-instruct")
        .join(name)
}

/// A SentencePiece-style byte-fallback tokenizer (Gemma's kind) small enough to mutate often:
/// specials, the 256 byte tokens, a few words and merges.
fn byte_fallback_json() -> String {
    let specials = [
        "<unk>",
        "<bos>",
        "<eos>",
        "<start_of_turn>",
        "<end_of_turn>",
    ];
    let words = [
        "▁", "h", "i", "▁h", "▁hi", "é", "▁café", "c", "a", "f", "ca",
    ];
    common::byte_fallback_json(&specials, &words, &["▁ h", "▁h i", "c a"]).to_string()
}

/// Texts that reach the tokenizer's pre-tokenizer, byte fallback and added-token matching.
const TEXTS: [&str; 4] = [
    "Hi there, café 中文 😀!",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>",
    " \t\n leading and trailing spaces  ",
    "<start_of_turn>model\n\u{301}e\u{301}<end_of_turn>",
];

/// Encodes, decodes and streams with a tokenizer that loaded from a mutant.
fn use_tokenizer(tok: &Tokenizer) {
    for text in TEXTS {
        let Ok(ids) = tok.encode(text) else { continue };
        let _ = tok.decode(&ids, false);
        let mut s = tok.stream();
        for &id in &ids {
            let _ = s.push(id);
        }
        let _ = s.finish();
    }
    // Ids the vocabulary may not have, and the ends of its range.
    let bound = tok.id_bound() as u32;
    for ids in [
        vec![0, 1, 2],
        vec![bound.saturating_sub(1), bound, bound + 1],
        vec![u32::MAX],
    ] {
        let _ = tok.decode(&ids, true);
        let mut s = tok.stream();
        for &id in &ids {
            let _ = s.push(id);
        }
        let _ = s.finish();
    }
}

#[test]
fn mutated_tokenizers_never_panic() {
    let demo = std::fs::read(demo_file("tokenizer.json")).unwrap();
    let small = byte_fallback_json().into_bytes();
    // The unmutated files load.
    for bytes in [&demo, &small] {
        Tokenizer::from_json(std::str::from_utf8(bytes).unwrap()).unwrap();
    }
    let seeds = [
        Seed::new("the demo model's tokenizer.json", demo),
        Seed::new("a byte-fallback tokenizer.json", small),
    ];
    let docs: Vec<serde_json::Value> = (seeds.iter())
        .map(|s| serde_json::from_slice(&s.bytes).unwrap())
        .collect();
    // The demo's 3.4 MB takes about 0.2 s a load: fewer of its mutants. Each byte-level mutant
    // (which mostly breaks the JSON) comes with one of the document's structure.
    let per_seed = common::fuzz::iters(60);
    common::fuzz::run("tokenizer", &seeds, per_seed, 0x70C3_11E5, |si, m| {
        let mut rng = common::fuzz::Rng(common::fuzz::hash(&m) | 1);
        let structural = common::fuzz::mutate_json(&mut rng, &docs[si]).to_string();
        let mut ok = false;
        for text in [String::from_utf8_lossy(&m).into_owned(), structural] {
            if let Ok(tok) = Tokenizer::from_json(&text) {
                use_tokenizer(&tok);
                ok = true;
            }
        }
        ok
    });
}

/// Renders a conversation with a template that loaded from a mutant, and reads its turn ends.
fn use_template(t: &ChatTemplate, tok: &Tokenizer) {
    let messages = [
        Message::system("Be brief."),
        Message::user("Hi {{ there }} {% raw %}"),
        Message::assistant("Hello!"),
        Message::user("And now?"),
    ];
    for add_generation_prompt in [false, true] {
        let opts = RenderOptions {
            add_generation_prompt,
            ..RenderOptions::default()
        };
        let _ = t.render(&messages, opts);
        let _ = t.render(&[], opts);
    }
    let _ = t.end_of_turn_ids(tok);
}

/// Chat templates that loop or build strings past any prompt's size: minijinja's limits (its
/// `range` cap, recursion depth, repeated-string size) or ours (a render's fuel) must end them
/// with an error, not hang or abort. Not bounded: a string doubled by `~` in a loop (memory is
/// not metered), which aborts on allocation.
const HOSTILE_TEMPLATES: [&str; 5] = [
    "{% for i in range(100000000) %}x{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ 'x' * 1000000000000 }}",
    "{{ messages[99999999].content }}{{ raise_exception('stop') }}",
];

#[test]
fn mutated_chat_templates_never_panic() {
    let tok = Tokenizer::from_file(&demo_file("tokenizer.json")).unwrap();
    let config = std::fs::read(demo_file("tokenizer_config.json")).unwrap();
    let cfg: serde_json::Value = serde_json::from_slice(&config).unwrap();
    // The template alone (a chat_template.jinja), so that most mutants still parse as JSON.
    let jinja = cfg["chat_template"].as_str().unwrap().as_bytes().to_vec();
    ChatTemplate::from_config_json(std::str::from_utf8(&config).unwrap(), None).unwrap();
    let seeds = [
        Seed::new("the demo model's tokenizer_config.json", config),
        Seed::new("the demo model's chat template", jinja),
    ];
    for src in HOSTILE_TEMPLATES {
        let started = std::time::Instant::now();
        let t = ChatTemplate::jinja(src, &[]);
        assert!(
            t.render(&[Message::user("hi")], RenderOptions::default())
                .is_err(),
            "{src}: rendered"
        );
        assert!(
            started.elapsed().as_secs() < 10,
            "{src}: took {:?}",
            started.elapsed()
        );
    }
    let per_seed = common::fuzz::iters(8000);
    common::fuzz::run("chat template", &seeds, per_seed, 0xC4A7_7E3F, |si, m| {
        let text = String::from_utf8_lossy(&m).into_owned();
        let mut loaded = Vec::new();
        if si == 0 {
            // The config's structure too: the template as a list of named ones, tokens as
            // objects, values of the wrong kind.
            let mut rng = common::fuzz::Rng(common::fuzz::hash(&m) | 1);
            let structural = common::fuzz::mutate_json(&mut rng, &cfg).to_string();
            loaded.push(ChatTemplate::from_config_json(&text, None));
            loaded.push(ChatTemplate::from_config_json(&structural, None));
        } else {
            loaded.push(ChatTemplate::from_config_json("{}", Some(text)));
        }
        let mut ok = false;
        for t in loaded.iter().flatten() {
            use_template(t, &tok);
            ok = true;
        }
        ok
    });
}

/// Replies that reach every block and span kind the parser makes.
const REPLIES: [&str; 3] = [
    "# Title\n\nSome **bold**, *emphasis*, ~~struck~~ and `code` with a [link](https://x.y).\n\n\
     - one\n  - nested\n1. first\n2. second\n\n> quoted\n\n---\n\n```rust\nfn main() {}\n```\n",
    "Text<b>html</b><!-- c -->\n\n    indented code\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n\
     ![img](x.png) <https://auto.link> [ref][r]\n\n[r]: https://r.s \"t\"\n",
    "1) a\n   > q\n   ```\n   unclosed fence\n* **bold *nested* ~~x~~**\\\nbreak  \nhard\n\n\
     ***\n###### h6\nSetext\n===\n",
];

#[test]
fn markdown_of_mutated_replies_never_panics() {
    let seeds: Vec<Seed> = REPLIES
        .iter()
        .enumerate()
        .map(|(i, r)| Seed::new(format!("reply {i}"), r.as_bytes().to_vec()))
        .collect();
    for r in REPLIES {
        assert!(markdown::parse(r).len() > 3, "{r}");
    }
    let per_seed = common::fuzz::iters(15000);
    common::fuzz::run("markdown", &seeds, per_seed, 0x3D0C_5EED, |_, m| {
        let text = String::from_utf8_lossy(&m);
        // Every prefix too: a reply is parsed again as each token streams in.
        let mut cut = 0;
        let mut blocks = 0;
        while cut <= text.len() {
            if text.is_char_boundary(cut) {
                blocks = markdown::parse(&text[..cut]).len();
            }
            cut += 1 + text.len() / 16;
        }
        for b in markdown::parse(&text) {
            if let Block::Paragraph { spans } | Block::Heading { spans, .. } = &b {
                let _ = markdown::plain_text(spans);
            }
        }
        blocks > 0
    });
}

/// Files the tokenizers crate panics on are errors that say what is wrong: one cut inside its
/// decoder section (0.22 panics in an `expect` there on broken JSON), and valid JSON whose BPE
/// merge is shorter than the continuing-subword prefix (0.22 slices past the merge's end).
#[test]
fn tokenizer_files_the_library_panics_on_are_errors() {
    let full = byte_fallback_json();
    let cut = full.find("\"decoder\"").unwrap() + 40;
    let err = Tokenizer::from_json(&full[..cut]).unwrap_err().to_string();
    assert!(err.contains("not valid JSON"), "{err}");

    let mut doc: serde_json::Value = serde_json::from_str(&full).unwrap();
    doc["model"]["continuing_subword_prefix"] = "##########".into();
    doc["model"]["vocab"]["▁hé"] = 999.into();
    doc["model"]["merges"] = serde_json::json!(["▁h é"]);
    let err = Tokenizer::from_json(&doc.to_string())
        .unwrap_err()
        .to_string();
    // With the library's own words.
    assert!(
        err.contains("tokenizer library failed") && err.contains("out of bounds"),
        "{err}"
    );
}

/// A saved conversation's file, as the store writes it: messages of both authors, a reply's
/// stats, a stopped one and a failed one.
fn conversation_file(dir: &std::path::Path) -> (String, Vec<u8>) {
    use pteria::chat::store::Store;
    use pteria::chat::{Author, MessageStats, StoredMessage};
    let (mut store, _) = Store::open(dir.to_path_buf()).unwrap();
    let c = store.create(Some("Fuzzed")).unwrap();
    let msg = |author, content: &str| StoredMessage {
        id: pteria::chat::store::new_id(),
        author,
        content: content.into(),
        created_at: 1_700_000_000_000,
        stats: None,
        stopped: false,
        error: None,
    };
    store
        .update(&c.id, |c| {
            c.messages.push(msg(Author::User, "Hi *there*"));
            let mut reply = msg(Author::Assistant, "Hello! ```rust\nfn f() {}\n```");
            reply.stats = Some(MessageStats {
                model: "demo".into(),
                prompt_tokens: 12,
                cached_tokens: 4,
                generated_tokens: 7,
                ttft_ms: Some(3.5),
                prefill_tokens_per_s: 900.0,
                decode_tokens_per_s: 40.0,
                stop: "end of turn".into(),
                dropped_messages: 0,
                context_tokens: 2048,
                seed: 42,
            });
            c.messages.push(reply);
            let mut stopped = msg(Author::Assistant, "Stopp");
            stopped.stopped = true;
            c.messages.push(stopped);
            let mut failed = msg(Author::Assistant, "");
            failed.error = Some("out of memory".into());
            c.messages.push(failed);
        })
        .unwrap();
    let name = format!("{}.json", c.id);
    let bytes = std::fs::read(dir.join(&name)).unwrap();
    (name, bytes)
}

#[test]
fn mutated_conversations_and_settings_never_panic_or_vanish() {
    use pteria::chat::store::Store;
    use pteria::chat::Settings;
    let tmp = tempfile::tempdir().unwrap();
    let (name, conversation) = conversation_file(&tmp.path().join("seed"));
    let settings_path = tmp.path().join("settings.json");
    Settings::default().save(&settings_path).unwrap();
    let settings = std::fs::read(&settings_path).unwrap();
    let seeds = [
        Seed::new("a saved conversation", conversation),
        Seed::new("saved settings", settings),
    ];
    let docs: Vec<serde_json::Value> = (seeds.iter())
        .map(|s| serde_json::from_slice(&s.bytes).unwrap())
        .collect();
    let count = std::cell::Cell::new(0usize);
    common::fuzz::run(
        "app files",
        &seeds,
        common::fuzz::iters(5000),
        0xC0DE_F11E,
        |si, m| {
            let n = count.get();
            count.set(n + 1);
            // Every other mutant is one of the JSON's structure (most byte-level ones break it).
            let bytes = if n % 2 == 0 {
                m
            } else {
                let mut rng = common::fuzz::Rng(common::fuzz::hash(&m) | 1);
                common::fuzz::mutate_json(&mut rng, &docs[si])
                    .to_string()
                    .into_bytes()
            };
            let dir = tmp.path().join(format!("m{n}"));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(if si == 0 {
                name.as_str()
            } else {
                "settings.json"
            });
            std::fs::write(&path, &bytes).unwrap();
            let ok = if si == 0 {
                let (mut store, warnings) = Store::open(dir.clone()).unwrap();
                let list = store.list();
                for c in &list {
                    let _ = store.get(&c.id).map(|c| c.summary());
                    store.update(&c.id, |c| c.title = "renamed".into()).unwrap();
                }
                if list.is_empty() {
                    // Not loaded: reported, and the file left as it was.
                    assert_eq!(warnings.len(), 1, "{warnings:?}");
                    assert_eq!(
                        std::fs::read(&path).unwrap(),
                        bytes,
                        "a damaged file changed"
                    );
                }
                !list.is_empty()
            } else {
                match Settings::load(&path) {
                    Ok(Some(s)) => {
                        if s.validate().is_ok() {
                            let _ = s.generate_options();
                        }
                        true
                    }
                    Ok(None) => panic!("a settings file that exists read as none"),
                    Err(_) => false,
                }
            };
            std::fs::remove_dir_all(&dir).unwrap();
            ok
        },
    );
}

#[test]
fn mutated_catalogs_never_panic() {
    use pteria::catalog::Catalog;
    let text = include_str!("../assets/catalog.toml");
    Catalog::from_toml(text).unwrap();
    let seeds = [Seed::new("assets/catalog.toml", text.as_bytes().to_vec())];
    let assets = tempfile::tempdir().unwrap();
    common::fuzz::run(
        "catalog",
        &seeds,
        common::fuzz::iters(20_000),
        0xCA7A_1065,
        |_, m| {
            let Ok(cat) = Catalog::from_toml(&String::from_utf8_lossy(&m)) else {
                return false;
            };
            for model in cat.models() {
                for v in &model.variants {
                    let _ = model.files(v).count();
                    let _ = cat.resolve(&model.spec(v));
                    let _ = model.bundled_dir(v, assets.path());
                    let _ = model.variant(&v.id);
                }
                let _ = cat.model(&model.id);
            }
            true
        },
    );
}
