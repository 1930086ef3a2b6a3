//! A chat model: runner + tokenizer + chat template + stop tokens, and the context policy that
//! keeps a long conversation going (drop the oldest turns, keep the system prompt, re-prefill)
//! instead of failing when the cache is full. Synchronous; `Engine` runs it on a worker thread.

use super::runner::{DecodeOptions, Runner, RunnerConfig, StopReason};
use super::sampler::{Sampler, SamplingParams};
use super::template::{ChatTemplate, Message, RenderOptions, Role};
use super::tokenizer::Tokenizer;
use super::{CancelToken, LlmError, ModelMetadata, Result};
use crate::runtime::delegate::{executor_placed, Device, KvCache, KvTally, Tables};
use crate::runtime::BackendRegistry;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The files a model is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// The `.pte` program.
    pub program: PathBuf,
    /// `.ptd` files holding named data the program refers to.
    pub data_files: Vec<PathBuf>,
    /// `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// `tokenizer_config.json` (chat template, special-token names); without it the built-in
    /// Gemma 4 format is used.
    pub tokenizer_config: Option<PathBuf>,
}

const TOKENIZER_FILE: &str = "tokenizer.json";
const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

impl ModelFiles {
    /// The program with `tokenizer.json` (required) and `tokenizer_config.json` (if present)
    /// from the same directory.
    pub fn beside(program: impl Into<PathBuf>) -> Result<ModelFiles> {
        let program = program.into();
        let dir = program.parent().map(Path::to_path_buf).unwrap_or_default();
        let tokenizer = dir.join(TOKENIZER_FILE);
        if !tokenizer.is_file() {
            return Err(LlmError::Files(format!(
                "no {TOKENIZER_FILE} beside {} (looked for {})",
                program.display(),
                tokenizer.display()
            )));
        }
        let config = dir.join(TOKENIZER_CONFIG_FILE);
        Ok(ModelFiles {
            program,
            data_files: Vec::new(),
            tokenizer,
            tokenizer_config: config.is_file().then_some(config),
        })
    }

    /// The one `.pte` in `dir` (an error if there are none or several), with its tokenizer
    /// files beside it.
    pub fn in_dir(dir: &Path) -> Result<ModelFiles> {
        let entries = std::fs::read_dir(dir).map_err(|source| LlmError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut programs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "pte"))
            .collect();
        programs.sort();
        match programs.len() {
            0 => Err(LlmError::Files(format!(
                "no .pte program in {}",
                dir.display()
            ))),
            1 => ModelFiles::beside(programs.remove(0)),
            _ => Err(LlmError::Files(format!(
                "{} holds several programs ({}); name one",
                dir.display(),
                programs
                    .iter()
                    .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// A program and the other files of its download (a catalog variant's files): the tokenizer
    /// files are picked from `files` by name, else looked for beside the program.
    pub fn from_files(program: &Path, files: &[PathBuf]) -> Result<ModelFiles> {
        let named = |name: &str| {
            files
                .iter()
                .find(|f| f.file_name().is_some_and(|n| n == name))
                .cloned()
        };
        let mut m = match named(TOKENIZER_FILE) {
            Some(tokenizer) => ModelFiles {
                program: program.to_path_buf(),
                data_files: Vec::new(),
                tokenizer,
                tokenizer_config: None,
            },
            None => ModelFiles::beside(program)?,
        };
        if let Some(cfg) = named(TOKENIZER_CONFIG_FILE) {
            m.tokenizer_config = Some(cfg);
        }
        m.data_files = files
            .iter()
            .filter(|f| f.extension().is_some_and(|x| x == "ptd"))
            .cloned()
            .collect();
        Ok(m)
    }
}

/// How much room a prompt must leave for the reply before older turns are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextPolicy {
    /// Tokens kept free for the reply, capped at a quarter of the context so small contexts
    /// still hold a conversation.
    pub reserve_tokens: usize,
}

impl Default for ContextPolicy {
    fn default() -> Self {
        ContextPolicy {
            reserve_tokens: 256,
        }
    }
}

impl ContextPolicy {
    pub fn reserve(&self, context: usize) -> usize {
        self.reserve_tokens.min(context / 4)
    }
}

/// How a model is loaded.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Delegate backends (XNNPACK, Vulkan, MLX front ends register here); the default holds
    /// none, so only portable programs load.
    pub backends: BackendRegistry,
    pub runner: RunnerConfig,
    pub context: ContextPolicy,
    /// The KV caches the GPU executors hold once loaded (`on_device_with`).
    pub kv_tally: KvTally,
}

impl LoadOptions {
    /// Load options whose delegate programs (XNNPACK, Vulkan) are lowered to the IR and run on
    /// `device`; the portable part of a program always runs on the CPU runtime. With
    /// `Device::Auto` and no usable GPU the CPU executor is used and the reason is returned,
    /// for the caller to show.
    pub fn on_device(device: Device) -> Result<(LoadOptions, Option<String>)> {
        LoadOptions::on_device_with(device, KvCache::F32)
    }

    /// `on_device` with the GPU executor's KV caches held as `kv`.
    pub fn on_device_with(device: Device, kv: KvCache) -> Result<(LoadOptions, Option<String>)> {
        LoadOptions::on_device_placed(device, kv, Tables::Auto)
    }

    /// `on_device_with`, with big embedding tables where `tables` says (on the GPU, decode steps
    /// run one ahead).
    pub fn on_device_placed(
        device: Device,
        kv: KvCache,
        tables: Tables,
    ) -> Result<(LoadOptions, Option<String>)> {
        let (make, note, kv_tally) =
            executor_placed(device, kv, tables).map_err(LlmError::Device)?;
        let options = LoadOptions {
            backends: crate::frontend::backends(make),
            kv_tally,
            ..LoadOptions::default()
        };
        Ok((options, note))
    }
}

/// Per-request settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerateOptions {
    pub sampling: SamplingParams,
    /// `None`: until a stop token or the context is full.
    pub max_new_tokens: Option<usize>,
    /// Gemma 4 thinking mode (rendered into the prompt by the template).
    pub enable_thinking: bool,
}

/// What one reply cost.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationStats {
    /// Tokens of the rendered prompt (after older turns were dropped to fit).
    pub prompt_tokens: usize,
    /// Prompt tokens found in the KV cache and not run again.
    pub cached_tokens: usize,
    /// Tokens run through prefill (re-prefills after a context shift included).
    pub prefilled_tokens: usize,
    pub generated_tokens: usize,
    /// Messages (other than the system prompt) left out to fit the context.
    pub dropped_messages: usize,
    /// Times the cache filled during the reply and older turns were dropped to continue it.
    pub context_shifts: usize,
    /// From the request to the first sampled token (prompt rendering and prefill included).
    pub time_to_first_token: Option<Duration>,
    pub prefill_time: Duration,
    /// From the first to the last sampled token.
    pub decode_time: Duration,
    pub prefill_tokens_per_s: f64,
    /// Tokens sampled after the first, per second of decode time.
    pub decode_tokens_per_s: f64,
    pub stop: StopReason,
    /// The sampler's seed, to replay the reply.
    pub seed: u64,
}

/// A finished reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The answer: what was streamed as `Event::Text`, without the thought channel.
    pub text: String,
    /// Gemma 4's reasoning: the text of every `<|channel>…<channel|>` block the model wrote (an
    /// unclosed one runs to the end), kept out of the answer and of later prompts.
    pub thinking: String,
    pub tokens: Vec<u32>,
    pub stats: GenerationStats,
}

/// What a generation reports, in order: prefill progress, text deltas, then exactly one of
/// `Finished` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// `done` of `total` new prompt tokens have been run.
    Prefill {
        done: usize,
        total: usize,
    },
    /// Newly completed text (always whole characters).
    Text(String),
    Finished(Completion),
    Failed(LlmError),
}

/// What a loaded model is.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub files: ModelFiles,
    pub metadata: ModelMetadata,
    /// Cache positions in use.
    pub context_len: usize,
    pub prefill_chunk: usize,
    pub stop_ids: Vec<u32>,
    pub template: &'static str,
    pub tokenizer_vocab: usize,
}

/// A prompt that fits the context.
#[derive(Debug, Clone, PartialEq)]
pub struct FittedPrompt {
    pub tokens: Vec<u32>,
    /// Non-system messages dropped from the front.
    pub dropped: usize,
}

pub struct Model {
    runner: Runner,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    stop_ids: Vec<u32>,
    /// The thought channel's opening and closing ids, where the tokenizer has both.
    channel: Option<(u32, u32)>,
    policy: ContextPolicy,
    files: ModelFiles,
}

/// Gemma 4's thought channel markers (tokenizer tokens 100 and 101 there).
const CHANNEL_OPEN: &str = "<|channel>";
const CHANNEL_CLOSE: &str = "<channel|>";

impl Model {
    pub fn load(files: ModelFiles, options: &LoadOptions) -> Result<Model> {
        let tokenizer = Tokenizer::from_file(&files.tokenizer)?;
        let template = match &files.tokenizer_config {
            Some(p) => ChatTemplate::from_config_file(p)?,
            None => ChatTemplate::gemma4(),
        };
        let ptds: Vec<&Path> = files.data_files.iter().map(PathBuf::as_path).collect();
        let runner = Runner::open(&files.program, &ptds, &options.backends, &options.runner)?;
        Model::from_parts(runner, tokenizer, template, options.context, files)
    }

    /// Assembles a model from loaded parts; checks that they agree.
    pub fn from_parts(
        runner: Runner,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        policy: ContextPolicy,
        files: ModelFiles,
    ) -> Result<Model> {
        let vocab = runner.metadata().vocab_size;
        if tokenizer.id_bound() > vocab {
            return Err(LlmError::Metadata(format!(
                "the tokenizer has ids up to {} but the model's logits cover {vocab} tokens",
                tokenizer.id_bound() - 1
            )));
        }
        // The program's EOS ids (ExecuTorch's runner uses the tokenizer's EOS only when the
        // program declares none), plus whatever closes a turn in this chat format.
        let mut stop_ids = runner.metadata().eos_ids.clone();
        if stop_ids.is_empty() {
            if let Some(id) = template
                .token("eos_token")
                .and_then(|t| tokenizer.token_id(t))
            {
                stop_ids.push(id);
            }
        }
        for id in template.end_of_turn_ids(&tokenizer) {
            if !stop_ids.contains(&id) && (id as usize) < vocab {
                stop_ids.push(id);
            }
        }
        if stop_ids.is_empty() {
            return Err(LlmError::Metadata(
                "no stop token: the program has no get_eos_ids, the tokenizer config names no eos_token, \
                 and the chat template closes turns with no special token"
                    .into(),
            ));
        }
        let channel = tokenizer
            .token_id(CHANNEL_OPEN)
            .zip(tokenizer.token_id(CHANNEL_CLOSE));
        Ok(Model {
            runner,
            tokenizer,
            template,
            stop_ids,
            channel,
            policy,
            files,
        })
    }

    pub fn info(&self) -> ModelInfo {
        ModelInfo {
            files: self.files.clone(),
            metadata: self.runner.metadata().clone(),
            context_len: self.runner.context_len(),
            prefill_chunk: self.runner.prefill_chunk(),
            stop_ids: self.stop_ids.clone(),
            template: self.template.describe(),
            tokenizer_vocab: self.tokenizer.vocab_size(),
        }
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }
    pub fn runner_mut(&mut self) -> &mut Runner {
        &mut self.runner
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Forgets the KV cache.
    pub fn reset(&mut self) -> Result<()> {
        self.runner.reset()
    }

    /// The prompt for `messages` with the generation prompt appended, dropping the oldest turns
    /// (never the system prompt, never the last user turn) until it leaves the policy's reserve
    /// free, or at least one token when nothing more can go.
    pub fn fit_prompt(&self, messages: &[Message], enable_thinking: bool) -> Result<FittedPrompt> {
        let reserve = self.policy.reserve(self.runner.context_len());
        match self.fit_from(messages, 0, enable_thinking, 0, reserve)? {
            Ok(f) => Ok(f),
            Err(tokens) => Err(LlmError::PromptTooLong {
                tokens,
                limit: self.runner.context_len(),
            }),
        }
    }

    /// `Ok(Err(n))`: even the shortest candidate needs `n` tokens, too many.
    fn fit_from(
        &self,
        messages: &[Message],
        from: usize,
        enable_thinking: bool,
        extra: usize,
        reserve: usize,
    ) -> Result<std::result::Result<FittedPrompt, usize>> {
        let ctx = self.runner.context_len();
        let (system, rest) = match messages.split_first() {
            Some((first, rest)) if first.role == Role::System => (Some(first), rest),
            _ => (None, messages),
        };
        let opts = RenderOptions {
            add_generation_prompt: true,
            enable_thinking,
        };
        let mut start = from;
        let mut kept: Vec<Message> = Vec::with_capacity(messages.len());
        loop {
            kept.clear();
            kept.extend(system.cloned());
            kept.extend(rest.get(start..).unwrap_or(&[]).iter().cloned());
            let tokens = self.tokenizer.encode(&self.template.render(&kept, opts)?)?;
            let need = tokens.len() + extra;
            let fits = |room: usize| need + room <= ctx;
            let next = rest
                .iter()
                .enumerate()
                .skip(start + 1)
                .find(|(_, m)| m.role == Role::User)
                .map(|(i, _)| i);
            match next {
                _ if fits(reserve) => {
                    return Ok(Ok(FittedPrompt {
                        tokens,
                        dropped: start,
                    }))
                }
                Some(n) => start = n,
                None if fits(1) => {
                    return Ok(Ok(FittedPrompt {
                        tokens,
                        dropped: start,
                    }))
                }
                None => return Ok(Err(need)),
            }
        }
    }

    /// Generates the assistant's reply to `messages` (which end with the user's turn),
    /// streaming text through `on_event`. Reuses the KV cache when the prompt extends what it
    /// holds; when the cache fills mid-reply, drops the oldest turn, re-prefills, and goes on.
    pub fn chat(
        &mut self,
        messages: &[Message],
        opts: &GenerateOptions,
        cancel: &CancelToken,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Completion> {
        let t0 = Instant::now();
        let mut sampler = Sampler::new(opts.sampling.clone())?;
        let fitted = self.fit_prompt(messages, opts.enable_thinking)?;
        let reserve = self.policy.reserve(self.runner.context_len());
        let ctx = self.runner.context_len();
        let decode_opts = |done: usize| DecodeOptions {
            max_new_tokens: opts.max_new_tokens.map(|m| m.saturating_sub(done)),
            stop_ids: self.stop_ids.clone(),
        };

        let mut stats = GenerationStats {
            prompt_tokens: fitted.tokens.len(),
            cached_tokens: 0,
            prefilled_tokens: 0,
            generated_tokens: 0,
            dropped_messages: fitted.dropped,
            context_shifts: 0,
            time_to_first_token: None,
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            prefill_tokens_per_s: 0.0,
            decode_tokens_per_s: 0.0,
            stop: StopReason::Cancelled,
            seed: sampler.seed(),
        };
        let mut decode_steps = 0usize;
        let mut generated: Vec<u32> = Vec::new();
        let mut text = String::new();
        let mut stream = self.tokenizer.stream();
        // The thought channel decodes apart: its markers are special tokens, which decoding
        // skips, so one stream would show the reasoning as the answer (and the chat would save
        // it and send it back as the model's words).
        let mut thinking = String::new();
        let mut thought = self.tokenizer.stream();
        let mut in_thought = false;
        let channel = self.channel;
        let mut prompt = fitted.tokens;
        let mut dropped = fitted.dropped;
        let mut first_round = true;

        let stop = loop {
            let opts_now = decode_opts(generated.len());
            let p = self.runner.prefill(&prompt, cancel, &mut |done, total| {
                on_event(Event::Prefill { done, total })
            })?;
            if first_round {
                stats.cached_tokens = p.reused;
                first_round = false;
            }
            stats.prefilled_tokens += p.prefilled;
            stats.prefill_time += p.time;
            if p.cancelled {
                break StopReason::Cancelled;
            }
            let d = self
                .runner
                .decode(&mut sampler, &opts_now, cancel, &mut |tok| {
                    generated.push(tok);
                    match channel {
                        Some((open, _)) if tok == open && !in_thought => {
                            in_thought = true;
                            // The answer so far is complete: show what it still holds back.
                            if let Some(rest) = stream.finish()? {
                                text.push_str(&rest);
                                on_event(Event::Text(rest));
                            }
                        }
                        Some((_, close)) if tok == close && in_thought => {
                            in_thought = false;
                            if let Some(rest) = thought.finish()? {
                                thinking.push_str(&rest);
                            }
                        }
                        _ if in_thought => {
                            if let Some(delta) = thought.push(tok)? {
                                thinking.push_str(&delta);
                            }
                        }
                        _ => {
                            if let Some(delta) = stream.push(tok)? {
                                text.push_str(&delta);
                                on_event(Event::Text(delta));
                            }
                        }
                    }
                    Ok(())
                })?;
            if let (Some(first), Some(last)) = (d.first_token_at, d.last_token_at) {
                stats.time_to_first_token.get_or_insert(first - t0);
                stats.decode_time += last - first;
                let sampled =
                    d.tokens.len() + usize::from(matches!(d.stop, StopReason::EndOfTurn(_)));
                decode_steps += sampled.saturating_sub(1);
            }
            if d.stop == StopReason::ContextFull {
                // Context policy: drop one more turn and continue the same reply after it.
                let next_start = messages
                    .iter()
                    .skip(usize::from(
                        messages.first().is_some_and(|m| m.role == Role::System),
                    ))
                    .enumerate()
                    .skip(dropped + 1)
                    .find(|(_, m)| m.role == Role::User)
                    .map(|(i, _)| i);
                if let Some(from) = next_start {
                    if let Ok(f) = self.fit_from(
                        messages,
                        from,
                        opts.enable_thinking,
                        generated.len(),
                        reserve,
                    )? {
                        let mut tokens = f.tokens;
                        tokens.extend_from_slice(&generated);
                        if tokens.len() < ctx {
                            stats.context_shifts += 1;
                            stats.dropped_messages = f.dropped;
                            dropped = f.dropped;
                            prompt = tokens;
                            continue;
                        }
                    }
                }
            }
            break d.stop;
        };
        if let Some(rest) = stream.finish()? {
            text.push_str(&rest);
            on_event(Event::Text(rest));
        }
        if let Some(rest) = thought.finish()? {
            thinking.push_str(&rest);
        }
        stats.stop = stop;
        stats.generated_tokens = generated.len();
        stats.prefill_tokens_per_s = rate(stats.prefilled_tokens, stats.prefill_time);
        stats.decode_tokens_per_s = rate(decode_steps, stats.decode_time);
        Ok(Completion {
            text,
            thinking,
            tokens: generated,
            stats,
        })
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    let s = t.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Model>();
};
