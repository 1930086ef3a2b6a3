//! Hugging Face `tokenizer.json` tokenizers (the `tokenizers` crate, pure Rust) and streaming
//! detokenization that only ever emits whole characters: a multi-byte character split over
//! byte-fallback tokens (`<0xE2>` `<0x82>` `<0xAC>`) or byte-level BPE pieces is held back until
//! its last byte arrives.

use super::{panic_text, LlmError, Result};
use std::collections::HashMap;
use std::path::Path;

/// A loaded tokenizer. Encoding never adds BOS/EOS: chat templates write them as text.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    origin: String,
    /// Byte-fallback tokens (`<0x00>`…`<0xFF>`) by id, when the decoder turns them into bytes.
    byte_tokens: HashMap<u32, u8>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("origin", &self.origin)
            .field("vocab", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = std::fs::read(path).map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes_named(&bytes, &path.display().to_string())
    }

    /// A tokenizer from the text of a `tokenizer.json`.
    pub fn from_json(json: &str) -> Result<Tokenizer> {
        Self::from_bytes_named(json.as_bytes(), "(in memory)")
    }

    fn from_bytes_named(bytes: &[u8], origin: &str) -> Result<Tokenizer> {
        let fail = |msg: String| LlmError::Tokenizer {
            path: origin.to_string(),
            msg,
        };
        // The tokenizers crate panics on some malformed JSON (0.22's decoder section: a
        // truncated file panicked in its `expect("Helper")`): the syntax is checked here first,
        // and a panic left for a well-formed file is still this file's error, not the app's.
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
            .map_err(|e| fail(format!("not valid JSON: {e}")))?;
        let inner = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes))
            .map_err(|p| {
                fail(format!(
                    "the tokenizer library failed on it: {}",
                    panic_text(&*p)
                ))
            })?
            .map_err(|e| fail(e.to_string()))?;
        // Only a decoder with a ByteFallback step reads `<0xNN>` tokens as bytes.
        let byte_fallback = inner
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|j| j.contains(r#""type":"ByteFallback""#));
        let byte_tokens = if byte_fallback {
            (0..=255u8)
                .filter_map(|b| inner.token_to_id(&format!("<0x{b:02X}>")).map(|id| (id, b)))
                .collect()
        } else {
            HashMap::new()
        };
        Ok(Tokenizer {
            inner,
            origin: origin.to_string(),
            byte_tokens,
        })
    }

    fn err(&self, msg: impl std::fmt::Display) -> LlmError {
        LlmError::Tokenizer {
            path: self.origin.clone(),
            msg: msg.to_string(),
        }
    }

    /// Token ids of `text`; added tokens written in the text (`<|im_start|>`, `<bos>`) become
    /// their ids, as `apply_chat_template(tokenize=True)` does.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| self.err(e))
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Entries including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The largest id any entry has, plus one (added tokens may leave gaps).
    pub fn id_bound(&self) -> usize {
        let added = self
            .inner
            .get_added_tokens_decoder()
            .keys()
            .max()
            .map(|&m| m as usize + 1);
        self.inner.get_vocab_size(false).max(added.unwrap_or(0))
    }

    /// Whether `id` is an added token marked special (`<|im_end|>`, `<turn|>`).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special)
    }

    /// A streaming decoder for generated ids (special tokens are not shown).
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            bytes: Vec::new(),
            shown: false,
        }
    }
}

/// Turns ids into text deltas as they arrive.
///
/// Byte-fallback tokens are collected as raw bytes and released as soon as they form whole
/// characters; a byte that cannot start or continue a character becomes one U+FFFD at once
/// (`String::from_utf8_lossy`'s rule). Doing this ourselves matters because the ByteFallback
/// decoder turns a whole run of byte tokens into U+FFFDs when any one of them is invalid.
///
/// Other tokens go through the tokenizer's decoder on a short window that starts at the last
/// emitted token, emitting what the new tokens add (SentencePiece's leading-space rule needs that
/// context) — the approach of HF's `TextStreamer`. A window whose text ends in U+FFFD (a
/// byte-level BPE token ending inside a character) is held until the character completes.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    /// Start of the decode window (the token before the unread ones, for context).
    prefix: usize,
    /// Tokens before this have been emitted.
    read: usize,
    /// Bytes of byte-fallback tokens not yet forming a whole character.
    bytes: Vec<u8>,
    /// Some text has been emitted.
    shown: bool,
}

/// A UTF-8 character has at most 4 bytes, and each held token adds at least one: past this many
/// held tokens the replacement character is real (invalid bytes from the model), not a split.
const MAX_HELD: usize = 4;

impl StreamDecoder<'_> {
    /// Adds a token; returns newly completed text, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        let out = self.push_id(id)?;
        self.shown |= out.is_some();
        Ok(out)
    }

    fn push_id(&mut self, id: u32) -> Result<Option<String>> {
        if let Some(&b) = self.tokenizer.byte_tokens.get(&id) {
            let mut out = self.flush_window()?;
            self.ids.push(id);
            self.bytes.push(b);
            let text = self.take_bytes(false);
            if !self.shown && out.is_empty() && self.bytes.is_empty() && !text.is_empty() {
                // The stream's first text, as a whole decode shows it: a decoder's rules for
                // the start of the text apply (Llama's Strip drops a leading space, which a
                // run of byte tokens can begin with). Invalid bytes keep our U+FFFD rule.
                out.push_str(&match text.contains('\u{FFFD}') {
                    true => text,
                    false => self.tokenizer.decode(&self.ids, true)?,
                });
            } else {
                out.push_str(&text);
            }
            if self.bytes.is_empty() {
                // Everything up to here is shown; this token is the next window's context.
                self.prefix = self.ids.len() - 1;
                self.read = self.ids.len();
            }
            return Ok((!out.is_empty()).then_some(out));
        }
        // A character still missing bytes when a non-byte token arrives never completes.
        let had_bytes = !self.bytes.is_empty();
        let mut out = self.take_bytes(true);
        if had_bytes {
            self.prefix = self.ids.len().saturating_sub(1);
            self.read = self.ids.len();
        }
        self.ids.push(id);
        let prefix_text = self
            .tokenizer
            .decode(&self.ids[self.prefix..self.read], true)?;
        let text = self.tokenizer.decode(&self.ids[self.prefix..], true)?;
        let held = self.ids.len() - self.read;
        if text.ends_with('\u{FFFD}') && held < MAX_HELD {
            // The last token ends inside a character: wait for the rest of its bytes.
            return Ok((!out.is_empty()).then_some(out));
        }
        out.push_str(&self.delta(&prefix_text, &text)?);
        // Special or empty tokens show nothing but still move the window on.
        self.prefix = self.read;
        self.read = self.ids.len();
        // Keep memory flat over long generations: only the window matters.
        if self.prefix > 64 {
            self.ids.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
        Ok((!out.is_empty()).then_some(out))
    }

    /// Whatever is still held back (an incomplete character at the very end), with U+FFFD for
    /// the missing part; call once when generation stops.
    pub fn finish(&mut self) -> Result<Option<String>> {
        let mut out = self.flush_window()?;
        out.push_str(&self.take_bytes(true));
        self.read = self.ids.len();
        self.prefix = self.read.saturating_sub(1);
        self.shown |= !out.is_empty();
        Ok((!out.is_empty()).then_some(out))
    }

    /// Emits held non-byte tokens as they decode now (U+FFFD included).
    fn flush_window(&mut self) -> Result<String> {
        if self.read == self.ids.len() || !self.bytes.is_empty() {
            return Ok(String::new());
        }
        let prefix_text = self
            .tokenizer
            .decode(&self.ids[self.prefix..self.read], true)?;
        let text = self.tokenizer.decode(&self.ids[self.prefix..], true)?;
        let delta = self.delta(&prefix_text, &text)?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(delta)
    }

    /// The text the unread tokens add: the window's text minus the context's, or, should the
    /// decoder render the context differently inside the window, the unread tokens alone.
    fn delta(&self, prefix_text: &str, text: &str) -> Result<String> {
        match text.strip_prefix(prefix_text) {
            Some(d) => Ok(d.to_string()),
            None => self.tokenizer.decode(&self.ids[self.read..], true),
        }
    }

    /// The whole characters at the front of the held bytes, U+FFFD for each invalid sequence;
    /// an incomplete character at the end stays held unless `flush`.
    fn take_bytes(&mut self, flush: bool) -> String {
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.bytes) {
                Ok(s) => {
                    out.push_str(s);
                    self.bytes.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.bytes[..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.bytes.drain(..valid + bad);
                        }
                        None if flush => {
                            out.push('\u{FFFD}');
                            self.bytes.clear();
                            return out;
                        }
                        None => {
                            self.bytes.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }
}
