//! Prefill and decode on token ids over one loaded `forward` method. The method's KV cache lives
//! in its planned memory (or its delegates' state) and persists across calls; the runner keeps
//! the list of tokens that cache holds, so a prompt that extends them only runs its new tokens,
//! and any other prompt reloads the method (a fresh cache) and runs in full.
//!
//! Call convention (ExecuTorch LLM exports): `forward(tokens [1, T], input_pos [T] or [1])`,
//! returning the logits of the call's last token (`[1, V]`, `[1, 1, V]`, or `[1, T, V]`, of which
//! the last row is used).

use super::metadata::{ModelMetadata, PositionForm};
use super::sampler::Sampler;
use super::{CancelToken, LlmError, Result};
use crate::pte::Program;
use crate::runtime::{BackendRegistry, Candidates, HostTensor, Method, Output};
use std::path::Path;
use std::time::{Duration, Instant};

/// Knobs a caller may tighten below what the program allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Most tokens per prefill call; the program's own bound (forward's declared input length,
    /// max_seq_len, get_max_prefill_chunk) still applies.
    pub prefill_chunk: Option<usize>,
    /// Use at most this many cache positions (the program's max_context_len still applies).
    pub context_limit: Option<usize>,
    /// Read every decode step's whole row of logits, even where the executor can hand back
    /// only the candidates that decide the sampler's pick (`runtime::candidates`).
    pub full_logits: bool,
    /// Submit each decode step only once the last one's token is known on the host, even
    /// where greedy steps could run one ahead on the device (`Runner::steps_ahead`).
    pub serial_decode: bool,
}

/// What a prefill did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prefill {
    /// Prompt tokens already in the cache and not run again.
    pub reused: usize,
    /// Tokens run through `forward`.
    pub prefilled: usize,
    pub chunks: usize,
    /// The cache did not hold a prefix of the prompt, so the method was reloaded first.
    pub reset: bool,
    /// Stopped by the cancel token between chunks; the cache holds the chunks that ran.
    pub cancelled: bool,
    pub time: Duration,
}

/// Why a decode stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an EOS or end-of-turn token (not part of the output).
    EndOfTurn(u32),
    /// The caller's `max_new_tokens` was reached.
    MaxTokens,
    /// The cache is full: max_context_len minus the tokens cached before the reply.
    ContextFull,
    Cancelled,
}

impl StopReason {
    pub fn describe(&self) -> &'static str {
        match self {
            StopReason::EndOfTurn(_) => "end of turn",
            StopReason::MaxTokens => "max tokens",
            StopReason::ContextFull => "context full",
            StopReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct DecodeOptions {
    /// `None`: as many as the cache has room for.
    pub max_new_tokens: Option<usize>,
    pub stop_ids: Vec<u32>,
}

/// What a decode produced.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// Generated tokens, the stop token excluded.
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    /// When the first and the last token were sampled.
    pub first_token_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
    pub time: Duration,
}

/// Drives one program's `forward`.
pub struct Runner {
    program: Program,
    backends: BackendRegistry,
    method: Option<Method>,
    meta: ModelMetadata,
    chunk: usize,
    context: usize,
    /// The tokens whose keys and values are in the cache, in position order.
    cached: Vec<u32>,
    /// Logits after the last cached token.
    logits: Option<Logits>,
    /// A forward ran since the method was loaded (a reload is needed for a clean cache).
    used: bool,
    /// A forward failed part-way, so the cache's contents are unknown until a reset.
    stale: bool,
    resets: usize,
    /// Decode steps may hand back candidates: the method can reduce its output, and the last
    /// whole output was one row of logits a token.
    candidates: bool,
    full_logits: bool,
    /// Picks in a row that the candidates did not decide (the row read too): at
    /// `MAX_MISSES` the runner reads rows until the next prefill, as a program whose logits
    /// tie by the thousand would make it.
    misses: usize,
    /// Tokens picked from candidates alone.
    candidate_picks: usize,
    serial_decode: bool,
    /// Decode steps submitted with the device's own pick, before the host knew it.
    steps_ahead: usize,
    /// Steps submitted ahead and dropped because the host's draw differed from the device's.
    misses_ahead: usize,
    /// A call ran after the one whose logits `logits` holds (a step submitted ahead that
    /// decode then dropped), so that call's row is gone from the device: `logits` runs it again.
    row_gone: bool,
}

/// Candidate misses in a row after which decode steps read their whole row.
const MAX_MISSES: usize = 3;

/// What a decode has produced so far (`Runner::decode_ahead` hands it on).
struct Progress<'a> {
    tokens: &'a mut Vec<u32>,
    first_token_at: &'a mut Option<Instant>,
    last_token_at: &'a mut Option<Instant>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("meta", &self.meta)
            .field("chunk", &self.chunk)
            .field("context", &self.context)
            .field("cached", &self.cached.len())
            .finish()
    }
}

fn load_forward(program: &Program, backends: &BackendRegistry) -> Result<Method> {
    Method::load(program, "forward", backends).map_err(|source| LlmError::Runtime {
        context: "loading method `forward`".into(),
        source,
    })
}

impl Runner {
    /// Opens a `.pte` (with any `.ptd` data files) and loads its `forward`.
    pub fn open(
        path: &Path,
        data_files: &[&Path],
        backends: &BackendRegistry,
        config: &RunnerConfig,
    ) -> Result<Runner> {
        let program = Program::open(path, data_files).map_err(|source| LlmError::Program {
            path: path.to_path_buf(),
            source,
        })?;
        Runner::load(program, backends, config)
    }

    pub fn load(
        program: Program,
        backends: &BackendRegistry,
        config: &RunnerConfig,
    ) -> Result<Runner> {
        let meta = ModelMetadata::read(&program)?;
        let method = load_forward(&program, backends)?;
        let context = match config.context_limit {
            Some(0) => {
                return Err(LlmError::Metadata(
                    "the context limit must be at least one token".into(),
                ))
            }
            Some(c) => c.min(meta.max_context_len),
            None => meta.max_context_len,
        };
        let chunk = match config.prefill_chunk {
            Some(0) => {
                return Err(LlmError::Metadata(
                    "the prefill chunk must be at least one token".into(),
                ))
            }
            Some(c) => c.min(meta.max_chunk()),
            None => meta.max_chunk(),
        };
        Ok(Runner {
            program,
            backends: backends.clone(),
            method: Some(method),
            meta,
            chunk,
            context,
            cached: Vec::new(),
            logits: None,
            used: false,
            stale: false,
            resets: 0,
            candidates: false,
            full_logits: config.full_logits,
            misses: 0,
            candidate_picks: 0,
            serial_decode: config.serial_decode,
            steps_ahead: 0,
            misses_ahead: 0,
            row_gone: false,
        })
    }

    pub fn metadata(&self) -> &ModelMetadata {
        &self.meta
    }

    /// Cache positions this runner uses.
    pub fn context_len(&self) -> usize {
        self.context
    }

    /// Tokens per prefill call.
    pub fn prefill_chunk(&self) -> usize {
        self.chunk
    }

    pub fn cached_tokens(&self) -> &[u32] {
        if self.stale {
            &[]
        } else {
            &self.cached
        }
    }

    /// Logits after the last cached token (read back in full here where a decode step left
    /// only candidates, or run again where a step run ahead and dropped came after it; `None`
    /// if that fails).
    pub fn logits(&mut self) -> Option<&[f32]> {
        if self.stale {
            return None;
        }
        if matches!(self.logits, Some(Logits::Candidates(_))) {
            self.read_row().ok()?;
        }
        self.logits.as_ref().and_then(Logits::as_slice)
    }

    /// The last call's whole row of logits, read again where it handed back candidates.
    fn read_row(&mut self) -> Result<()> {
        if self.row_gone {
            // Run the last cached token again: it writes the same keys and values at the same
            // position (caches that hold every position, as ExecuTorch's exports make them),
            // and the row comes back whole.
            let at = self.cached.len().checked_sub(1).ok_or(LlmError::NoPrompt)?;
            let tok = self.cached[at];
            let logits = self.forward(&[tok], at, None)?;
            self.logits = Some(logits);
            self.row_gone = false;
            return Ok(());
        }
        let method = self.method.as_mut().ok_or(LlmError::NoPrompt)?;
        let out = method.read_output(0).map_err(|source| LlmError::Runtime {
            context: "reading the last call's logits".into(),
            source,
        })?;
        let Output::Tensor(h) = out else {
            return Err(LlmError::Unsupported(
                "the first output is not a float tensor".into(),
            ));
        };
        self.logits = Some(Logits::last_row(h, self.meta.vocab_size));
        Ok(())
    }

    /// The next token from the current logits: from their candidates where those decide it,
    /// else from the whole row.
    fn pick(&mut self, sampler: &mut Sampler) -> Result<u32> {
        if let Some(Logits::Candidates(c)) = &self.logits {
            // A greedy pick is also the device's own over the whole row, which decides it where
            // the candidates overflow (logits tied by the thousand).
            let greedy = sampler.candidates_wanted() == Some(1);
            let tok = match sampler.sample_candidates(c)? {
                None if greedy => c.first,
                t => t,
            };
            if let Some(tok) = tok {
                self.misses = 0;
                self.candidate_picks += 1;
                return Ok(tok);
            }
            self.misses += 1;
            self.read_row()?;
        }
        let row = self
            .logits
            .as_ref()
            .and_then(Logits::as_slice)
            .ok_or(LlmError::NoPrompt)?;
        sampler.sample(row, &self.cached)
    }

    /// Tokens picked from their step's candidates alone, the row of logits never read
    /// (`RunnerConfig::full_logits`).
    pub fn candidate_picks(&self) -> usize {
        self.candidate_picks
    }

    /// Decode steps that ran one ahead and were kept: submitted with the device's pick from
    /// the step before, while the host was still reading that step
    /// (`RunnerConfig::serial_decode`).
    pub fn steps_ahead(&self) -> usize {
        self.steps_ahead
    }

    /// Steps run ahead and dropped: the device's draw picked another token than the host's
    /// (f32 against f64 arithmetic, where the uniform number falls on a boundary), or the
    /// candidates could not decide the host's.
    pub fn misses_ahead(&self) -> usize {
        self.misses_ahead
    }

    /// How many times the method has been reloaded to clear its cache.
    pub fn resets(&self) -> usize {
        self.resets
    }

    /// Room left for generated tokens: max_context_len (or the configured limit) minus the
    /// tokens in the cache.
    pub fn budget(&self) -> usize {
        self.context.saturating_sub(self.cached_tokens().len())
    }

    /// Empties the cache by reloading the method. The old method is dropped first so its
    /// memory is free before the new one allocates.
    pub fn reset(&mut self) -> Result<()> {
        self.cached.clear();
        self.logits = None;
        self.row_gone = false;
        if self.used || self.stale || self.method.is_none() {
            self.method = None;
            self.method = Some(load_forward(&self.program, &self.backends)?);
            self.resets += 1;
        }
        self.used = false;
        self.stale = false;
        Ok(())
    }

    fn check_ids(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.meta.vocab_size) {
            Some(&id) => Err(LlmError::TokenOutOfRange {
                id,
                vocab: self.meta.vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// Makes the cache hold exactly `tokens` and leaves the logits after the last one. Tokens
    /// already cached as a prefix are reused; otherwise the method is reset and all run again.
    /// `on_chunk(done, total)` is called after each prefill call.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(usize, usize),
    ) -> Result<Prefill> {
        let start = Instant::now();
        if tokens.is_empty() {
            return Err(LlmError::NoPrompt);
        }
        if tokens.len() > self.context {
            return Err(LlmError::PromptTooLong {
                tokens: tokens.len(),
                limit: self.context,
            });
        }
        self.check_ids(tokens)?;
        self.misses = 0;
        let mut out = Prefill::default();
        let extends = !self.stale
            && self.cached.len() <= tokens.len()
            && tokens[..self.cached.len()] == self.cached[..]
            && (self.cached.len() < tokens.len() || self.logits.is_some());
        if extends {
            out.reused = self.cached.len();
        } else {
            self.reset()?;
            out.reset = true;
        }
        let total = tokens.len() - self.cached.len();
        let mut done = 0;
        while self.cached.len() < tokens.len() {
            if cancel.is_cancelled() {
                out.cancelled = true;
                break;
            }
            let at = self.cached.len();
            let end = (at + self.chunk).min(tokens.len());
            let logits = self.forward(&tokens[at..end], at, None)?;
            self.cached.extend_from_slice(&tokens[at..end]);
            self.logits = Some(logits);
            out.chunks += 1;
            done += end - at;
            on_chunk(done, total);
        }
        out.prefilled = done;
        out.time = start.elapsed();
        Ok(out)
    }

    /// Samples tokens from the current logits, feeding each back, until a stop token, the
    /// caller's limit, a full cache, or cancellation. `on_token` sees every kept token as it is
    /// sampled. The last sampled token is not fed (nothing needs its logits); a later prefill
    /// that includes it runs it then.
    pub fn decode(
        &mut self,
        sampler: &mut Sampler,
        opts: &DecodeOptions,
        cancel: &CancelToken,
        on_token: &mut dyn FnMut(u32) -> Result<()>,
    ) -> Result<Decoded> {
        let start = Instant::now();
        if self.stale || self.logits.is_none() {
            return Err(LlmError::NoPrompt);
        }
        let budget = self.budget();
        let limit = opts.max_new_tokens.map_or(budget, |m| m.min(budget));
        let mut tokens = Vec::new();
        let mut first_token_at = None;
        let mut last_token_at = None;
        if self.runs_ahead(sampler) {
            let mut so_far = Progress {
                tokens: &mut tokens,
                first_token_at: &mut first_token_at,
                last_token_at: &mut last_token_at,
            };
            if let Some(stop) =
                self.decode_ahead(sampler, opts, cancel, on_token, limit, &mut so_far)?
            {
                return Ok(Decoded {
                    tokens,
                    stop,
                    first_token_at,
                    last_token_at,
                    time: start.elapsed(),
                });
            }
            // The candidates stopped deciding picks: one step at a time from here.
        }
        let stop = loop {
            if cancel.is_cancelled() {
                break StopReason::Cancelled;
            }
            if tokens.len() >= limit {
                break if opts.max_new_tokens.is_some_and(|m| tokens.len() >= m) {
                    StopReason::MaxTokens
                } else {
                    StopReason::ContextFull
                };
            }
            let tok = self.pick(sampler)?;
            let now = Instant::now();
            first_token_at.get_or_insert(now);
            last_token_at = Some(now);
            if opts.stop_ids.contains(&tok) {
                break StopReason::EndOfTurn(tok);
            }
            tokens.push(tok);
            on_token(tok)?;
            if tokens.len() >= limit || cancel.is_cancelled() {
                // The loop stops next; skip a forward whose logits nobody would read.
                continue;
            }
            let at = self.cached.len();
            let want = sampler
                .candidates_wanted()
                .filter(|_| !self.full_logits && self.misses < MAX_MISSES);
            let logits = self.forward(&[tok], at, want)?;
            self.cached.push(tok);
            self.logits = Some(logits);
        };
        Ok(Decoded {
            tokens,
            stop,
            first_token_at,
            last_token_at,
            time: start.elapsed(),
        })
    }

    /// Whether decode steps can run one ahead on the device: each step picks a token on the GPU
    /// (greedy, or a draw from its top-k candidates with the host's next uniform number) and
    /// copies it into the next step's token (`Method::start_candidates`), so the next is
    /// submitted before the host has read this one, and the GPU never waits for the host.
    fn runs_ahead(&self, sampler: &Sampler) -> bool {
        let device_picks = sampler.is_greedy() || sampler.draw_ahead(0).is_some();
        !self.serial_decode
            && !self.full_logits
            && self.candidates
            && self.misses < MAX_MISSES
            && device_picks
            && self.method.as_ref().is_some_and(|m| m.supports_feed(0))
    }

    /// `decode`, one step ahead. The step for token t runs while the host reads the one before;
    /// the device's pick from it is the next step's token, submitted with it. Greedy, that pick
    /// is `Candidates::first`, the row's first largest logit: `argmax`'s pick. Sampled, it is
    /// `Candidates::drawn`, the device's draw in f32 with the uniform number the host's RNG
    /// gives that pick; the host makes its own pick from the candidates (f64, exact) and drops
    /// the step run ahead where the two differ. So the tokens, and the RNG's draws, are those of
    /// the one-at-a-time loop. A step submitted ahead that the decode then does not need (a
    /// stop token, cancellation, another pick) is finished and dropped: its keys and values sit
    /// past the cached tokens, where no call reads them before a later call overwrites them.
    /// `None` once `MAX_MISSES` picks in a row were not decided by the candidates (logits tied
    /// by the thousand): nothing is in flight then, and `decode` goes on one step at a time.
    fn decode_ahead(
        &mut self,
        sampler: &mut Sampler,
        opts: &DecodeOptions,
        cancel: &CancelToken,
        on_token: &mut dyn FnMut(u32) -> Result<()>,
        limit: usize,
        so_far: &mut Progress,
    ) -> Result<Option<StopReason>> {
        let Progress {
            tokens,
            first_token_at,
            last_token_at,
        } = so_far;
        // A step is in flight whose token is the device's pick from the current logits.
        let mut ahead = false;
        let stop = loop {
            if self.misses >= MAX_MISSES {
                self.drop_ahead(&mut ahead)?;
                return Ok(None);
            }
            if cancel.is_cancelled() || tokens.len() >= limit {
                self.drop_ahead(&mut ahead)?;
                if cancel.is_cancelled() {
                    break StopReason::Cancelled;
                }
                break if opts.max_new_tokens.is_some_and(|m| tokens.len() >= m) {
                    StopReason::MaxTokens
                } else {
                    StopReason::ContextFull
                };
            }
            let (host, device) = match &self.logits {
                Some(Logits::Candidates(c)) if sampler.is_greedy() => (c.first, c.first),
                Some(Logits::Candidates(c)) => (sampler.sample_candidates(c)?, c.drawn),
                _ => (None, None),
            };
            let tok = match host {
                Some(t) => {
                    self.candidate_picks += 1;
                    self.misses = 0;
                    if ahead && device != Some(t) {
                        self.drop_ahead(&mut ahead)?;
                        self.misses_ahead += 1;
                    }
                    t
                }
                None => {
                    // Not decided by the candidates (overflowed, a row of NaN, or logits read
                    // whole): the host's pick from the row, which says why where there is none.
                    if ahead {
                        self.misses_ahead += 1;
                    }
                    self.drop_ahead(&mut ahead)?;
                    self.pick(sampler)?
                }
            };
            let now = Instant::now();
            first_token_at.get_or_insert(now);
            **last_token_at = Some(now);
            if opts.stop_ids.contains(&tok) {
                self.drop_ahead(&mut ahead)?;
                break StopReason::EndOfTurn(tok);
            }
            tokens.push(tok);
            if let Err(e) = on_token(tok) {
                self.drop_ahead(&mut ahead)?;
                return Err(e);
            }
            if tokens.len() >= limit || cancel.is_cancelled() {
                continue;
            }
            let at = self.cached.len();
            if ahead {
                // It runs `tok` already.
                self.steps_ahead += 1;
            } else {
                self.start_step(sampler, Some(tok), at)?;
            }
            self.cached.push(tok);
            // The step after it, fed its pick, unless the limit leaves no room for its token.
            ahead = tokens.len() + 1 < limit;
            if ahead {
                self.start_step(sampler, None, at + 1)?;
            }
            let logits = self.finish_step()?;
            self.logits = Some(logits);
        };
        Ok(Some(stop))
    }

    /// Submits a decode step for `tok` at position `at` (`None`: the last step's pick, on the
    /// device) that picks the next token on the device as `sampler` would and copies it into
    /// the next step's token. Its draw is the pick after `tok`'s: the RNG's next uniform number,
    /// or the one after it for a step fed a pick the host has not drawn yet.
    fn start_step(&mut self, sampler: &Sampler, tok: Option<u32>, at: usize) -> Result<()> {
        let (ids, pos) = self.step_inputs(&[tok.unwrap_or(0)], at);
        let pick = crate::runtime::candidates::DevicePick {
            feed: 0,
            fed: tok.is_none(),
            draw: sampler.draw_ahead(tok.is_none() as usize),
        };
        let k = sampler.candidates_wanted().unwrap_or(1);
        let method = self.method.as_mut().ok_or(LlmError::NoPrompt)?;
        let result = method
            .start_candidates(&[ids, pos], 0, k, Some(pick))
            .map_err(|source| LlmError::Runtime {
                context: format!("starting `forward` on 1 token at position {at}"),
                source,
            });
        self.settle(result)
    }

    /// Marks the method used, and after a failed call the cache unknown: the call may have
    /// written part of it, so nothing cached can be trusted.
    fn settle<T>(&mut self, result: Result<T>) -> Result<T> {
        self.used = true;
        if result.is_err() {
            self.stale = true;
            self.cached.clear();
            self.logits = None;
        }
        result
    }

    /// The oldest started step's candidates.
    fn finish_step(&mut self) -> Result<Logits> {
        let vocab = self.meta.vocab_size;
        let method = self.method.as_mut().ok_or(LlmError::NoPrompt)?;
        let result = method
            .finish_candidates()
            .map_err(|source| LlmError::Runtime {
                context: "finishing a `forward` decode step".into(),
                source,
            })
            .and_then(|(_, c)| Logits::candidates(c, vocab, "a decode step"));
        self.row_gone = false;
        self.settle(result)
    }

    /// Finishes and drops the step submitted ahead, if one is: the current logits' call is no
    /// longer the device's last, so `logits` runs it again for its row.
    fn drop_ahead(&mut self, ahead: &mut bool) -> Result<()> {
        if std::mem::take(ahead) {
            self.finish_step()?;
            self.row_gone = true;
        }
        Ok(())
    }

    /// Prefill then decode: the token-level generation loop.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        opts: &DecodeOptions,
        cancel: &CancelToken,
        on_token: &mut dyn FnMut(u32) -> Result<()>,
    ) -> Result<(Prefill, Decoded)> {
        let p = self.prefill(prompt, cancel, &mut |_, _| {})?;
        if p.cancelled {
            let d = Decoded {
                tokens: Vec::new(),
                stop: StopReason::Cancelled,
                first_token_at: None,
                last_token_at: None,
                time: Duration::ZERO,
            };
            return Ok((p, d));
        }
        let d = self.decode(sampler, opts, cancel, on_token)?;
        Ok((p, d))
    }

    /// One `forward` call on `tokens` at positions `start..`; returns the last token's logits,
    /// or their candidates for `k` where asked and the method can reduce them.
    fn forward(&mut self, tokens: &[u32], start: usize, k: Option<usize>) -> Result<Logits> {
        let result = self.forward_inner(tokens, start, k);
        self.row_gone = false;
        self.settle(result)
    }

    /// `forward`'s inputs for `tokens` at positions `start..`.
    fn step_inputs(&self, tokens: &[u32], start: usize) -> (HostTensor, HostTensor) {
        let t = tokens.len();
        let ids: Vec<i64> = tokens.iter().map(|&x| i64::from(x)).collect();
        let positions: Vec<i64> = match self.meta.positions {
            PositionForm::PerToken => (start..start + t).map(|p| p as i64).collect(),
            PositionForm::Start => vec![start as i64],
        };
        let tok = HostTensor::from_i64(&[1, t], &ids).cast(self.meta.tokens_dtype);
        let pos =
            HostTensor::from_i64(&[positions.len()], &positions).cast(self.meta.positions_dtype);
        (tok, pos)
    }

    fn forward_inner(&mut self, tokens: &[u32], start: usize, k: Option<usize>) -> Result<Logits> {
        let t = tokens.len();
        let (tok, pos) = self.step_inputs(tokens, start);
        let context = || format!("`forward` on {t} token(s) at position {start}");
        let method = self.method.as_mut().ok_or_else(|| {
            LlmError::Unsupported(
                "the method failed to reload after a reset; load the model again".into(),
            )
        })?;
        let err = |source| LlmError::Runtime {
            context: context(),
            source,
        };
        let vocab = self.meta.vocab_size;
        if let Some(k) = k.filter(|_| self.candidates) {
            let (_, c) = method.execute_candidates(&[tok, pos], 0, k).map_err(err)?;
            return Logits::candidates(c, vocab, &context());
        }
        let outputs = method.execute(&[tok, pos]).map_err(err)?;
        match outputs.into_iter().next() {
            Some(Output::Tensor(h)) if h.dtype.is_float() => {
                let n = h.data.len() / h.dtype.size();
                if n < vocab || n % vocab != 0 {
                    return Err(LlmError::Unsupported(format!(
                        "{}: returned {n} values ({:?}), not whole rows of {vocab} logits",
                        context(),
                        h.sizes
                    )));
                }
                // Candidates reduce the output's last dim: one row a token. Asked here, once a
                // whole row, not on every decode step.
                self.candidates = h.sizes.last() == Some(&vocab) && method.supports_candidates(0);
                Ok(Logits::last_row(h, vocab))
            }
            _ => Err(LlmError::Unsupported(format!(
                "{}: the first output is not a float tensor",
                context()
            ))),
        }
    }
}

/// The last row of a call's logits: read in place from the output where it holds f32 words
/// (a 262144-token row is 1 MB, otherwise copied again every token), else converted.
enum Logits {
    InPlace {
        output: HostTensor,
        from: usize,
    },
    Owned(Vec<f32>),
    /// Only the candidates that decide a sampler's pick (the row stays on the device).
    Candidates(Candidates),
}

impl Logits {
    /// A call's candidates, with every token they name (pairs and the device's picks) checked
    /// against the vocabulary: `what` says which call, for the error.
    fn candidates(c: Candidates, vocab: usize, what: &str) -> Result<Logits> {
        let ids = c.pairs.iter().map(|p| p.0).chain(c.first).chain(c.drawn);
        match ids.into_iter().find(|&id| id as usize >= vocab) {
            Some(id) => Err(LlmError::Unsupported(format!(
                "{what}: candidate token {id} is outside the {vocab}-token vocabulary"
            ))),
            None => Ok(Logits::Candidates(c)),
        }
    }

    fn last_row(output: HostTensor, vocab: usize) -> Logits {
        let in_place = output.dtype == crate::runtime::DType::F32
            && bytemuck::try_cast_slice::<u8, f32>(&output.data).is_ok();
        if in_place {
            let from = output.data.len() / 4 - vocab;
            return Logits::InPlace { output, from };
        }
        let v = crate::runtime::tensor::to_f32(output.dtype, &output.data);
        Logits::Owned(v[v.len() - vocab..].to_vec())
    }

    fn as_slice(&self) -> Option<&[f32]> {
        match self {
            Logits::InPlace { output, from } => {
                Some(&bytemuck::cast_slice::<u8, f32>(&output.data)[*from..])
            }
            Logits::Owned(v) => Some(v),
            Logits::Candidates(_) => None,
        }
    }
}

/// Runners move to the engine's worker thread.
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Runner>();
};
