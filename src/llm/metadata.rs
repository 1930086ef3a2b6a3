//! The LLM facts a program declares: ExecuTorch's LLM exports add constant methods
//! (`get_max_seq_len`, `get_eos_ids`, …) beside `forward`, and the forward's input bounds say how
//! many tokens one call may take. Missing values fall back to the defaults ExecuTorch's own runner
//! uses (`extension/llm/runner/llm_runner_helper.cpp`); contradictions are errors, not guesses.

use super::{LlmError, Result};
use crate::pte::{Dynamism, EValue, Program};
use crate::runtime::{self, DType, Output};

/// ExecuTorch's runner default when `get_max_seq_len` is absent.
pub const DEFAULT_MAX_SEQ_LEN: usize = 128;

/// How `forward` takes token positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionForm {
    /// `input_pos` is `[T]`: the absolute position of every token in the call.
    PerToken,
    /// `input_pos` is `[1]`: the position of the call's first token.
    Start,
}

/// What the runner needs to know about a program, read once at load.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMetadata {
    /// `get_max_seq_len`: the most tokens one forward call is exported for.
    pub max_seq_len: usize,
    /// `get_max_context_len`: the KV cache's length, i.e. the most tokens a conversation holds.
    pub max_context_len: usize,
    pub use_kv_cache: bool,
    pub enable_dynamic_shape: bool,
    pub bos_id: Option<u32>,
    /// `get_eos_ids`; empty when the program does not say (the tokenizer's EOS is used then).
    pub eos_ids: Vec<u32>,
    /// The logits' last dimension (`get_vocab_size` must agree with it when present).
    pub vocab_size: usize,
    /// `get_max_prefill_chunk`, when the export limits prefill calls below `max_seq_len`.
    pub max_prefill_chunk: Option<usize>,
    /// Upper bound of the tokens input's sequence dimension, as `forward` declares it.
    pub max_input_len: usize,
    pub positions: PositionForm,
    pub tokens_dtype: DType,
    pub positions_dtype: DType,
    /// Metadata methods that were absent, so their default was used.
    pub defaulted: Vec<&'static str>,
}

/// What the metadata methods answered; `None` where a method is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawMetadata {
    pub max_seq_len: Option<i64>,
    pub max_context_len: Option<i64>,
    pub use_kv_cache: Option<i64>,
    pub enable_dynamic_shape: Option<i64>,
    pub bos_id: Option<i64>,
    pub eos_ids: Option<Vec<i64>>,
    pub vocab_size: Option<i64>,
    pub max_prefill_chunk: Option<i64>,
}

impl RawMetadata {
    pub fn read(program: &Program) -> Result<RawMetadata> {
        Ok(RawMetadata {
            max_seq_len: single(program, "get_max_seq_len")?,
            max_context_len: single(program, "get_max_context_len")?,
            use_kv_cache: single(program, "use_kv_cache")?,
            enable_dynamic_shape: single(program, "enable_dynamic_shape")?,
            bos_id: single(program, "get_bos_id")?,
            eos_ids: read_ints(program, "get_eos_ids")?,
            vocab_size: single(program, "get_vocab_size")?,
            max_prefill_chunk: single(program, "get_max_prefill_chunk")?,
        })
    }
}

/// What `forward`'s plan declares about its inputs and output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardSignature {
    /// Upper bound of the tokens input's sequence dimension.
    pub max_input_len: usize,
    /// The tokens input has a static shape (not a dynamic bound).
    pub tokens_static: bool,
    pub positions: PositionForm,
    pub tokens_dtype: DType,
    pub positions_dtype: DType,
    /// The logits output's last dimension.
    pub output_vocab: usize,
}

impl ForwardSignature {
    pub fn read(program: &Program) -> Result<ForwardSignature> {
        let forward = program
            .plan("forward")
            .ok_or_else(|| LlmError::Unsupported("the program has no `forward` method".into()))?;
        let tensor = |id: usize, what: &str| match forward.values.get(id) {
            Some(EValue::Tensor(t)) => Ok(t),
            _ => Err(LlmError::Unsupported(format!(
                "`forward`'s {what} is not a tensor"
            ))),
        };
        let (tokens, positions) = match forward.inputs.as_slice() {
            [t, p] => (tensor(*t, "first input (tokens)")?, tensor(*p, "second input (input_pos)")?),
            [_] => {
                return Err(LlmError::Unsupported(
                    "`forward` takes only tokens: programs exported without a KV cache are not supported".into(),
                ))
            }
            other => {
                return Err(LlmError::Unsupported(format!(
                    "`forward` takes {} inputs; expected (tokens [1, T], input_pos)",
                    other.len()
                )))
            }
        };
        if tokens.sizes.len() != 2 || tokens.sizes[0] != 1 || tokens.sizes[1] == 0 {
            return Err(LlmError::Unsupported(format!(
                "`forward`'s tokens input has shape {:?}; expected [1, T] with T >= 1",
                tokens.sizes
            )));
        }
        let max_input_len = tokens.sizes[1];
        let dtype = |t: &crate::pte::TensorInfo, what: &str| {
            DType::from_scalar(t.dtype)
                .filter(|d| !d.is_float())
                .ok_or_else(|| {
                    LlmError::Unsupported(format!(
                        "`forward`'s {what} has element type {}",
                        t.dtype
                    ))
                })
        };
        let pos_len: usize = positions.sizes.iter().product();
        let positions_form = if pos_len == max_input_len {
            PositionForm::PerToken
        } else if pos_len == 1 {
            PositionForm::Start
        } else {
            return Err(LlmError::Unsupported(format!(
                "`forward`'s input_pos has shape {:?}; expected [1] or [{max_input_len}]",
                positions.sizes
            )));
        };
        let output_vocab = match forward.outputs.first().and_then(|&o| forward.values.get(o)) {
            Some(EValue::Tensor(t)) if t.sizes.last().is_some_and(|&v| v > 0) => {
                t.sizes[t.sizes.len() - 1]
            }
            _ => {
                return Err(LlmError::Unsupported(
                    "`forward`'s first output is not a logits tensor".into(),
                ))
            }
        };
        Ok(ForwardSignature {
            max_input_len,
            tokens_static: tokens.dynamism == Dynamism::Static,
            positions: positions_form,
            tokens_dtype: dtype(tokens, "tokens input")?,
            positions_dtype: dtype(positions, "input_pos input")?,
            output_vocab,
        })
    }
}

impl ModelMetadata {
    /// Reads the metadata methods and the `forward` plan's signature.
    pub fn read(program: &Program) -> Result<ModelMetadata> {
        ModelMetadata::resolve(
            &RawMetadata::read(program)?,
            &ForwardSignature::read(program)?,
        )
    }

    /// Applies the defaults and checks that the facts agree.
    pub fn resolve(raw: &RawMetadata, sig: &ForwardSignature) -> Result<ModelMetadata> {
        let mut defaulted = Vec::new();
        let mut note = |v: Option<i64>, name: &'static str| {
            if v.is_none() {
                defaulted.push(name);
            }
            v
        };
        let positive = |name: &str, v: i64| -> Result<usize> {
            usize::try_from(v)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| LlmError::Metadata(format!("`{name}` is {v}; it must be positive")))
        };
        let vocab = sig.output_vocab;

        let max_seq_len = match note(raw.max_seq_len, "get_max_seq_len") {
            Some(v) => positive("get_max_seq_len", v)?,
            None => DEFAULT_MAX_SEQ_LEN,
        };
        // ExecuTorch's runner: a program without `get_max_context_len` has a cache of max_seq_len.
        let max_context_len = match note(raw.max_context_len, "get_max_context_len") {
            Some(v) => positive("get_max_context_len", v)?,
            None => max_seq_len,
        };
        if max_context_len < max_seq_len {
            return Err(LlmError::Metadata(format!(
                "get_max_context_len ({max_context_len}) is smaller than get_max_seq_len ({max_seq_len}); \
                 ExecuTorch exports require the cache to hold at least one full call"
            )));
        }
        let use_kv_cache = note(raw.use_kv_cache, "use_kv_cache").is_none_or(|v| v != 0);
        if !use_kv_cache {
            return Err(LlmError::Unsupported(
                "use_kv_cache is false: programs that recompute the whole sequence every call are not supported".into(),
            ));
        }
        let enable_dynamic_shape =
            note(raw.enable_dynamic_shape, "enable_dynamic_shape").is_some_and(|v| v != 0);
        if enable_dynamic_shape && sig.tokens_static && sig.max_input_len > 1 {
            return Err(LlmError::Metadata(format!(
                "enable_dynamic_shape is true but `forward`'s tokens input is static [1, {}]",
                sig.max_input_len
            )));
        }
        if !enable_dynamic_shape && sig.tokens_static && sig.max_input_len != 1 {
            // Without dynamic shapes the runner feeds one token per call, which a static [1, N>1]
            // input cannot take; such programs need padding logic we do not have.
            return Err(LlmError::Unsupported(format!(
                "`forward` takes exactly {} tokens per call (static shape); only [1, 1] static programs are supported",
                sig.max_input_len
            )));
        }
        let bos_id = match note(raw.bos_id, "get_bos_id") {
            Some(v) => Some(token_id("get_bos_id", v, vocab)?),
            None => None,
        };
        let eos_ids = match &raw.eos_ids {
            Some(v) => v
                .iter()
                .map(|&id| token_id("get_eos_ids", id, vocab))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        if raw.eos_ids.is_none() {
            note(None, "get_eos_ids");
        }
        let vocab_size = match note(raw.vocab_size, "get_vocab_size") {
            Some(v) => {
                let n = positive("get_vocab_size", v)?;
                if n != vocab {
                    return Err(LlmError::Metadata(format!(
                        "get_vocab_size is {n} but `forward` returns {vocab} logits per token"
                    )));
                }
                n
            }
            None => vocab,
        };
        // Optional by design (most exports bound prefill by max_seq_len alone): not "defaulted".
        let max_prefill_chunk = match raw.max_prefill_chunk {
            Some(v) => Some(positive("get_max_prefill_chunk", v)?),
            None => None,
        };

        Ok(ModelMetadata {
            max_seq_len,
            max_context_len,
            use_kv_cache,
            enable_dynamic_shape,
            bos_id,
            eos_ids,
            vocab_size,
            max_prefill_chunk,
            max_input_len: sig.max_input_len,
            positions: sig.positions,
            tokens_dtype: sig.tokens_dtype,
            positions_dtype: sig.positions_dtype,
            defaulted,
        })
    }

    /// The most tokens one prefill call may carry: bounded by the forward's declared input, by
    /// max_seq_len, by get_max_prefill_chunk, and by one token when shapes are not dynamic
    /// (ExecuTorch's runner prefills token by token then).
    pub fn max_chunk(&self) -> usize {
        if !self.enable_dynamic_shape {
            return 1;
        }
        let mut n = self.max_input_len.min(self.max_seq_len);
        if let Some(c) = self.max_prefill_chunk {
            n = n.min(c);
        }
        n.max(1)
    }
}

/// A metadata method that returns one integer; `None` when the program has no such method.
fn single(program: &Program, name: &'static str) -> Result<Option<i64>> {
    match read_ints(program, name)? {
        None => Ok(None),
        Some(v) if v.len() == 1 => Ok(Some(v[0])),
        Some(v) => Err(LlmError::Metadata(format!(
            "`{name}` returned {} values, expected one",
            v.len()
        ))),
    }
}

fn token_id(name: &str, v: i64, vocab: usize) -> Result<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&id| (id as usize) < vocab)
        .ok_or_else(|| {
            LlmError::Metadata(format!(
                "`{name}` holds token id {v}, outside the {vocab}-entry vocabulary"
            ))
        })
}

/// The integers a constant method returns (one output per value, or one list), `None` if the
/// program has no such method.
fn read_ints(program: &Program, name: &str) -> Result<Option<Vec<i64>>> {
    let outputs = match runtime::constant_method(program, name) {
        Ok(Some(o)) => o,
        Ok(None) => return Ok(None),
        Err(source) => {
            return Err(LlmError::Runtime {
                context: format!("reading metadata method `{name}`"),
                source,
            })
        }
    };
    let mut out = Vec::new();
    for o in outputs {
        match o {
            Output::Int(v) => out.push(v),
            Output::Bool(b) => out.push(b as i64),
            Output::IntList(v) => out.extend(v),
            Output::Tensor(t) if !t.dtype.is_float() => out.extend(
                t.to_i64()
                    .map_err(|m| LlmError::Metadata(format!("`{name}`: {m}")))?,
            ),
            Output::Tensor(t) => {
                return Err(LlmError::Metadata(format!(
                    "`{name}` returned a {} tensor, expected integers",
                    t.dtype.name()
                )))
            }
            other => {
                return Err(LlmError::Metadata(format!(
                    "`{name}` returned {other:?}, expected integers"
                )))
            }
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig() -> ForwardSignature {
        ForwardSignature {
            max_input_len: 31,
            tokens_static: false,
            positions: PositionForm::PerToken,
            tokens_dtype: DType::I64,
            positions_dtype: DType::I64,
            output_vocab: 256,
        }
    }

    fn full() -> RawMetadata {
        RawMetadata {
            max_seq_len: Some(32),
            max_context_len: Some(64),
            use_kv_cache: Some(1),
            enable_dynamic_shape: Some(1),
            bos_id: Some(1),
            eos_ids: Some(vec![2, 7]),
            vocab_size: Some(256),
            max_prefill_chunk: None,
        }
    }

    #[test]
    fn complete_metadata_is_taken_as_declared() {
        let m = ModelMetadata::resolve(&full(), &sig()).unwrap();
        assert_eq!(
            (m.max_seq_len, m.max_context_len, m.vocab_size),
            (32, 64, 256)
        );
        assert_eq!((m.bos_id, m.eos_ids.clone()), (Some(1), vec![2, 7]));
        assert!(m.defaulted.is_empty());
        // min(declared input 31, max_seq_len 32)
        assert_eq!(m.max_chunk(), 31);
        let chunked = RawMetadata {
            max_prefill_chunk: Some(8),
            ..full()
        };
        assert_eq!(
            ModelMetadata::resolve(&chunked, &sig())
                .unwrap()
                .max_chunk(),
            8
        );
    }

    #[test]
    fn missing_metadata_falls_back_to_executorch_defaults() {
        let m = ModelMetadata::resolve(&RawMetadata::default(), &sig()).unwrap();
        assert_eq!(
            (m.max_seq_len, m.max_context_len),
            (DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
        );
        assert!(m.use_kv_cache && !m.enable_dynamic_shape);
        assert_eq!((m.bos_id, m.eos_ids.len(), m.vocab_size), (None, 0, 256));
        // Without dynamic shapes prefill goes one token per call.
        assert_eq!(m.max_chunk(), 1);
        assert_eq!(m.defaulted.len(), 7, "{:?}", m.defaulted);
        // The context defaults to max_seq_len, not to 128.
        let seq_only = RawMetadata {
            max_seq_len: Some(512),
            ..RawMetadata::default()
        };
        assert_eq!(
            ModelMetadata::resolve(&seq_only, &sig())
                .unwrap()
                .max_context_len,
            512
        );
    }

    #[test]
    fn contradictions_are_errors() {
        let bad = |raw: RawMetadata| {
            ModelMetadata::resolve(&raw, &sig())
                .unwrap_err()
                .to_string()
        };
        assert!(bad(RawMetadata {
            max_context_len: Some(16),
            ..full()
        })
        .contains("smaller than get_max_seq_len"));
        assert!(bad(RawMetadata {
            vocab_size: Some(300),
            ..full()
        })
        .contains("returns 256 logits"));
        assert!(bad(RawMetadata {
            eos_ids: Some(vec![2, 256]),
            ..full()
        })
        .contains("outside"));
        assert!(bad(RawMetadata {
            bos_id: Some(-1),
            ..full()
        })
        .contains("outside"));
        assert!(bad(RawMetadata {
            max_seq_len: Some(0),
            ..full()
        })
        .contains("positive"));
        assert!(bad(RawMetadata {
            max_prefill_chunk: Some(-4),
            ..full()
        })
        .contains("positive"));
        assert!(bad(RawMetadata {
            use_kv_cache: Some(0),
            ..full()
        })
        .contains("use_kv_cache"));
        let static_many = ForwardSignature {
            tokens_static: true,
            ..sig()
        };
        assert!(ModelMetadata::resolve(&full(), &static_many).is_err());
        let no_dyn = RawMetadata {
            enable_dynamic_shape: Some(0),
            ..full()
        };
        assert!(ModelMetadata::resolve(&no_dyn, &static_many).is_err());
        let one = ForwardSignature {
            tokens_static: true,
            max_input_len: 1,
            ..sig()
        };
        assert_eq!(
            ModelMetadata::resolve(&no_dyn, &one).unwrap().max_chunk(),
            1
        );
    }
}
