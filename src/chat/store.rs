//! Conversations on disk: one JSON file per conversation under `<data dir>/conversations/`,
//! each written atomically (temporary file, fsync, rename, fsync of the directory) so a crash or
//! a closed window leaves the previous version or the new one, never a torn file.

use super::{ChatError, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The title a conversation has until its first message names it.
pub const NEW_TITLE: &str = "New chat";
/// Longest title taken from a first message, in characters.
const TITLE_CHARS: usize = 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Author {
    User,
    Assistant,
}

/// What one reply cost, as shown beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageStats {
    /// `model:variant` (or the program's file name) that wrote the reply.
    pub model: String,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    /// Milliseconds from the request to the first token; `None` when none was produced.
    pub ttft_ms: Option<f64>,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// Why the reply ended: "end of turn", "max tokens", "context full", "cancelled".
    pub stop: String,
    /// Older messages left out so the prompt fit the context.
    pub dropped_messages: usize,
    /// The model's context, in tokens.
    pub context_tokens: usize,
    pub seed: u64,
}

impl MessageStats {
    /// Tokens the conversation occupied in the context once this reply was written.
    pub fn context_used(&self) -> usize {
        self.prompt_tokens + self.generated_tokens
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub id: String,
    pub author: Author,
    pub content: String,
    /// Unix time in milliseconds.
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<MessageStats>,
    /// The reply was stopped by the user before the model finished it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
    /// The reply failed; the text says why. Such a message is shown but never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    pub id: String,
    pub title: String,
    pub created_at: u64,
    pub updated_at: u64,
    pub messages: Vec<StoredMessage>,
}

/// A conversation as listed: no message bodies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConversationSummary {
    pub id: String,
    pub title: String,
    pub created_at: u64,
    pub updated_at: u64,
    pub message_count: usize,
    /// The start of the last message, for the list.
    pub preview: String,
}

impl Conversation {
    pub fn summary(&self) -> ConversationSummary {
        let preview = self
            .messages
            .last()
            .map(|m| m.content.chars().take(80).collect())
            .unwrap_or_default();
        ConversationSummary {
            id: self.id.clone(),
            title: self.title.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            message_count: self.messages.len(),
            preview,
        }
    }

    /// The title a first message gives a conversation: its first line, shortened.
    pub fn title_from(text: &str) -> String {
        let line = text.lines().map(str::trim).find(|l| !l.is_empty());
        let line = line.unwrap_or(NEW_TITLE);
        let mut title: String = line.chars().take(TITLE_CHARS).collect();
        if line.chars().count() > TITLE_CHARS {
            title.push('…');
        }
        title
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A new id: time-ordered, unique within the process, safe as a file name.
pub fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:011x}-{:04x}", now_ms(), n & 0xffff)
}

/// Ids come back from the UI and name files: only `[0-9a-z-]`, so none can leave the directory.
pub fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ChatError::NoConversation { id: id.to_string() })
    }
}

/// Writes `bytes` to `path` so that a crash at any point leaves either the old file or the new.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |action: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| ChatError::Io {
            action,
            path: p,
            source,
        }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let mut f = fs::File::create(&tmp).map_err(io("creating", &tmp))?;
    f.write_all(bytes).map_err(io("writing", &tmp))?;
    // The data must be on disk before the rename makes it the file, or a power cut could leave
    // the new name pointing at nothing.
    f.sync_all().map_err(io("syncing", &tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(io("renaming", &tmp))?;
    // The rename itself lives in the directory; opening a directory fails on Windows, where the
    // rename is already durable enough, so that error is ignored.
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Every conversation, in memory and mirrored on disk.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    conversations: HashMap<String, Conversation>,
}

impl Store {
    /// Reads every conversation in `dir` (created if missing). Files that do not parse are left
    /// alone and reported in the returned warnings, so one damaged file never hides the others.
    pub fn open(dir: PathBuf) -> Result<(Store, Vec<String>)> {
        fs::create_dir_all(&dir).map_err(|source| ChatError::Io {
            action: "creating",
            path: dir.clone(),
            source,
        })?;
        let entries = fs::read_dir(&dir).map_err(|source| ChatError::Io {
            action: "reading",
            path: dir.clone(),
            source,
        })?;
        let mut conversations = HashMap::new();
        let mut warnings = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".json.tmp") {
                // An interrupted write: the real file still holds the last complete version.
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            let parsed = fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Conversation>(&b).map_err(|e| e.to_string()))
                .and_then(|c| {
                    if c.id == stem && check_id(&c.id).is_ok() {
                        Ok(c)
                    } else {
                        Err(format!("its id `{}` does not match the file name", c.id))
                    }
                });
            match parsed {
                Ok(c) => {
                    conversations.insert(c.id.clone(), c);
                }
                Err(e) => warnings.push(format!(
                    "conversation file {} was not loaded: {e}",
                    path.display()
                )),
            }
        }
        Ok((Store { dir, conversations }, warnings))
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Newest first.
    pub fn list(&self) -> Vec<ConversationSummary> {
        let mut all: Vec<ConversationSummary> =
            self.conversations.values().map(|c| c.summary()).collect();
        all.sort_by(|a, b| {
            b.updated_at
                .cmp(&a.updated_at)
                .then_with(|| b.id.cmp(&a.id))
        });
        all
    }

    pub fn get(&self, id: &str) -> Result<&Conversation> {
        check_id(id)?;
        self.conversations
            .get(id)
            .ok_or_else(|| ChatError::NoConversation { id: id.to_string() })
    }

    pub fn create(&mut self, title: Option<&str>) -> Result<Conversation> {
        let now = now_ms();
        let mut id = new_id();
        while self.conversations.contains_key(&id) {
            id = new_id();
        }
        let title = title
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .unwrap_or(NEW_TITLE);
        let c = Conversation {
            id: id.clone(),
            title: title.to_string(),
            created_at: now,
            updated_at: now,
            messages: Vec::new(),
        };
        self.put(c.clone())?;
        Ok(c)
    }

    /// Applies `f` to a conversation and saves it; nothing changes in memory if saving fails.
    pub fn update<T>(&mut self, id: &str, f: impl FnOnce(&mut Conversation) -> T) -> Result<T> {
        let mut c = self.get(id)?.clone();
        let out = f(&mut c);
        c.updated_at = now_ms().max(c.updated_at);
        self.put(c)?;
        Ok(out)
    }

    fn put(&mut self, c: Conversation) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(&c).map_err(|e| ChatError::Corrupt {
            path: self.path(&c.id),
            reason: e.to_string(),
        })?;
        write_atomic(&self.path(&c.id), &bytes)?;
        self.conversations.insert(c.id.clone(), c);
        Ok(())
    }

    pub fn delete(&mut self, id: &str) -> Result<()> {
        self.get(id)?;
        let path = self.path(id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ChatError::Io {
                    action: "deleting",
                    path,
                    source,
                })
            }
        }
        self.conversations.remove(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(author: Author, text: &str) -> StoredMessage {
        StoredMessage {
            id: new_id(),
            author,
            content: text.into(),
            created_at: now_ms(),
            stats: None,
            stopped: false,
            error: None,
        }
    }

    #[test]
    fn conversations_survive_a_reopen_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, w) = Store::open(dir.path().join("c")).unwrap();
        assert!(w.is_empty());
        let a = s.create(None).unwrap();
        let b = s.create(Some("  Second ")).unwrap();
        // Order is by millisecond timestamps: the update must land in a later millisecond than
        // the creation, or the tie goes to the newer id.
        std::thread::sleep(std::time::Duration::from_millis(3));
        s.update(&a.id, |c| c.messages.push(message(Author::User, "hello")))
            .unwrap();
        let (s2, w) = Store::open(dir.path().join("c")).unwrap();
        assert!(w.is_empty());
        let list = s2.list();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].id, a.id, "the updated one comes first");
        assert_eq!(
            (list[0].message_count, list[0].preview.as_str()),
            (1, "hello")
        );
        assert_eq!(s2.get(&b.id).unwrap().title, "Second");
        assert_eq!(s2.get(&a.id).unwrap().title, NEW_TITLE);
    }

    #[test]
    fn a_damaged_file_is_reported_and_the_rest_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let cdir = dir.path().join("c");
        let (mut s, _) = Store::open(cdir.clone()).unwrap();
        let a = s.create(Some("kept")).unwrap();
        fs::write(cdir.join("0000-bad.json"), b"{ not json").unwrap();
        // A write interrupted before its rename leaves only the temporary file.
        fs::write(cdir.join(format!("{}.json.tmp", a.id)), b"{ half").unwrap();
        let (s2, w) = Store::open(cdir.clone()).unwrap();
        assert_eq!(s2.list().len(), 1);
        assert_eq!(s2.get(&a.id).unwrap().title, "kept");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("0000-bad.json"), "{w:?}");
        assert!(!cdir.join(format!("{}.json.tmp", a.id)).exists());
    }

    #[test]
    fn ids_that_could_escape_the_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(dir.path().to_path_buf()).unwrap();
        for bad in ["../x", "a/b", "", "A", "x.json", &"a".repeat(65)] {
            assert!(
                matches!(s.get(bad), Err(ChatError::NoConversation { .. })),
                "{bad}"
            );
            assert!(s.delete(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn delete_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(dir.path().to_path_buf()).unwrap();
        let a = s.create(None).unwrap();
        assert!(dir.path().join(format!("{}.json", a.id)).is_file());
        s.delete(&a.id).unwrap();
        assert!(!dir.path().join(format!("{}.json", a.id)).exists());
        assert!(s.get(&a.id).is_err());
    }

    #[test]
    fn titles_come_from_the_first_line_shortened() {
        assert_eq!(Conversation::title_from("\n  Hi there \nmore"), "Hi there");
        let long = "x".repeat(60);
        assert_eq!(
            Conversation::title_from(&long),
            format!("{}…", "x".repeat(48))
        );
        assert_eq!(Conversation::title_from("   "), NEW_TITLE);
    }
}
