//! The generation layer: turns a loaded `forward` method into a chat model. Upstream is
//! `runtime` (programs and methods); downstream are the chat core and the shells, which talk to
//! this layer through `Engine` (a `Send` handle that runs generation on its own thread) or, for
//! tools and tests, through `Model` and the token-level `Runner` directly.
//!
//! Pieces, each usable alone: `metadata` (the LLM facts a program declares), `runner` (prefill
//! and decode on token ids with KV-cache reuse), `sampler`, `tokenizer` (with UTF-8-safe streaming
//! detokenization), `template` (chat formats), `model` (all of them plus the context policy) and
//! `engine` (the worker thread).

pub mod engine;
pub mod metadata;
pub mod model;
pub mod runner;
pub mod sampler;
pub mod template;
pub mod tokenizer;

pub use engine::{Engine, Generation};
pub use metadata::{ForwardSignature, ModelMetadata, PositionForm, RawMetadata};
pub use model::{
    Completion, ContextPolicy, Event, GenerateOptions, GenerationStats, LoadOptions, Model,
    ModelFiles, ModelInfo,
};
pub use runner::{DecodeOptions, Decoded, Prefill, Runner, RunnerConfig, StopReason};
pub use sampler::{Rng, Sampler, SamplingParams};
pub use template::{ChatTemplate, Message, RenderOptions, Role};
pub use tokenizer::{StreamDecoder, Tokenizer};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Everything that can go wrong in the generation layer.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("program {path}: {source}")]
    Program {
        path: PathBuf,
        #[source]
        source: crate::pte::PteError,
    },
    #[error("{context}: {source}")]
    Runtime {
        context: String,
        #[source]
        source: crate::runtime::RuntimeError,
    },
    /// A metadata method holds a value we cannot use, or two facts contradict each other.
    #[error("model metadata: {0}")]
    Metadata(String),
    /// The program is a valid ExecuTorch program but not an LLM this runner can drive.
    #[error("unsupported program: {0}")]
    Unsupported(String),
    /// The requested device cannot run the model (no GPU adapter, ...).
    #[error("{0}")]
    Device(String),
    #[error("tokenizer {path}: {msg}")]
    Tokenizer { path: String, msg: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("model files: {0}")]
    Files(String),
    #[error("sampling: {0}")]
    Sampling(String),
    #[error("token id {id} is outside the model's {vocab}-entry vocabulary")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("the prompt needs {tokens} tokens but the context holds {limit}; even with every earlier turn dropped it does not fit")]
    PromptTooLong { tokens: usize, limit: usize },
    #[error("nothing to decode from: prefill a prompt first")]
    NoPrompt,
    #[error("no model is loaded")]
    NoModel,
    #[error("the generation engine has stopped")]
    EngineStopped,
    /// A panic inside the runtime (a bug, reported instead of taking the engine down).
    #[error("internal error: {0}")]
    Internal(String),
}

impl LlmError {
    /// True when the engine dropped its model on this error (a panic mid-call leaves the model's
    /// state unknown): whoever tracks what is loaded must forget it too.
    pub fn unloads_model(&self) -> bool {
        matches!(self, LlmError::Internal(_))
    }
}

pub type Result<T> = std::result::Result<T, LlmError>;

/// Asks a running prefill or decode to stop; checked between prefill chunks and between decode
/// steps, so it takes effect within one forward call. Clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A panic's message, where it has one (`catch_unwind`'s payload).
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    match (p.downcast_ref::<&str>(), p.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic".into(),
    }
}
