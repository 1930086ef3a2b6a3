//! A saved conversation whose assistant reply uses every markdown block the window draws
//! (paragraph with emphasis, numbered and nested lists, inline code, a code block, a quote).
//! Included with `#[path]` by tests/window.rs and tests/screenshot.rs.

use pteria::chat::store::{new_id, now_ms, Store};
use pteria::chat::{Author, MessageStats, StoredMessage};
use std::path::Path;

pub const QUESTION: &str = "How do I count the words in a file?";

pub const REPLY: &str = "Here is how to **count words** in a file:

1. Read the file *line by line*.
2. Split each line on whitespace.
   - Empty lines count as `0`.
3. Add up the counts.

```rust
fn words(text: &str) -> usize {
    text.split_whitespace().count()
}
```

> Tip: `wc -w` does the same from a shell.";

/// The code block's background in ui/app.slint.
pub const CODE_BACKGROUND: (u8, u8, u8) = (0x1f, 0x29, 0x37);

fn message(author: Author, content: &str, stats: Option<MessageStats>) -> StoredMessage {
    StoredMessage {
        id: new_id(),
        author,
        content: content.into(),
        created_at: now_ms(),
        stats,
        stopped: false,
        error: None,
    }
}

/// Saves the conversation in `data_dir` (a chat core's data directory) before a core opens it.
pub fn save(data_dir: &Path) {
    let (mut store, _) = Store::open(data_dir.join("conversations")).expect("conversation store");
    let c = store
        .create(Some("Counting words"))
        .expect("new conversation");
    let stats = MessageStats {
        model: "smollm2-135m-instruct:portable-fp32".into(),
        prompt_tokens: 31,
        cached_tokens: 0,
        generated_tokens: 96,
        ttft_ms: Some(84.0),
        prefill_tokens_per_s: 370.0,
        decode_tokens_per_s: 41.3,
        stop: "end of turn".into(),
        dropped_messages: 0,
        context_tokens: 2048,
        seed: 7,
    };
    store
        .update(&c.id, |c| {
            c.messages.push(message(Author::User, QUESTION, None));
            c.messages
                .push(message(Author::Assistant, REPLY, Some(stats)));
        })
        .expect("saving the conversation");
}
