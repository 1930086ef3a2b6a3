//! `pteria generate --prompt TEXT`: one user turn through the model's chat template; only the
//! reply goes to stdout (streamed), everything else to stderr. Also holds what `chat` shares
//! with it: model resolution (path or catalog id), device, sampling flags.

use super::models::assets_dir;
use anyhow::{anyhow, bail, Result};
use pteria::catalog::{self, Catalog, Source};
use pteria::download::Cache;
use pteria::llm::{
    CancelToken, Completion, Engine, Event, GenerateOptions, LoadOptions, Message, ModelFiles,
    ModelInfo, RunnerConfig, SamplingParams,
};
use pteria::runtime::delegate::{Device, KvCache, Tables};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The model used when `--model` is not given: the demo shipped in assets/.
const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

#[derive(clap::Args)]
pub struct ModelArgs {
    /// A .pte file (tokenizer.json and tokenizer_config.json beside it), a directory holding
    /// one, or a catalog id (MODEL or MODEL:VARIANT). Default: the bundled demo model.
    #[arg(long)]
    pub model: Option<String>,
    /// auto | cpu | gpu
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// f32 | f16: how the GPU executor holds KV caches (f16: half the bytes, see README).
    #[arg(long, default_value = "f32")]
    pub kv: String,
    /// auto | host | gpu: where the GPU executor keeps big embedding tables. gpu takes their
    /// size in GPU memory (1.6 GiB for Gemma 4 E2B) and lets decoding run a step ahead; auto
    /// does that on a discrete GPU with at least 8 GiB of its own memory.
    #[arg(long, default_value = "auto")]
    pub tables: String,
    /// Use at most this many tokens of context (the program's max_context_len still applies).
    #[arg(long)]
    pub context: Option<usize>,
    /// Most tokens per prefill call (the program's own bound still applies).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
}

#[derive(clap::Args)]
pub struct SamplingArgs {
    /// 0 is greedy. Default 1.0 (with top-k 64, top-p 0.95: Gemma 4's generation config).
    #[arg(long)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub min_p: Option<f32>,
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop a reply after this many tokens (default: when the model ends its turn or the
    /// context is full).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Gemma 4 thinking mode.
    #[arg(long)]
    pub think: bool,
    /// Print timing and token counts to stderr after each reply.
    #[arg(long)]
    pub stats: bool,
}

impl SamplingArgs {
    pub fn options(&self) -> GenerateOptions {
        let d = SamplingParams::default();
        GenerateOptions {
            sampling: SamplingParams {
                temperature: self.temperature.unwrap_or(d.temperature),
                top_k: self.top_k.unwrap_or(d.top_k),
                top_p: self.top_p.unwrap_or(d.top_p),
                min_p: self.min_p.unwrap_or(d.min_p),
                repetition_penalty: self.repeat_penalty.unwrap_or(d.repetition_penalty),
                seed: self.seed,
                ..d
            },
            max_new_tokens: self.max_tokens,
            enable_thinking: self.think,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The user's message.
    #[arg(long)]
    prompt: String,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run(a: Args) -> Result<()> {
    let opts = a.sampling.options();
    opts.sampling.validate()?;
    let (engine, _info) = open(&a.model)?;
    let mut messages = Vec::new();
    if let Some(s) = a.system {
        messages.push(Message::system(s));
    }
    messages.push(Message::user(a.prompt));
    let current = Arc::new(Mutex::new(None));
    // Ctrl-C ends the reply cleanly (what was generated stays printed) instead of killing us.
    on_ctrl_c(current.clone(), || std::process::exit(130));
    let completion = reply(&engine, messages, opts, &current)?;
    println!();
    if a.sampling.stats {
        eprintln!("{}", describe_stats(&completion));
    }
    Ok(())
}

/// Starts the engine and loads the model `args` names, its delegate graphs on `--device`.
pub fn open(args: &ModelArgs) -> Result<(Engine, ModelInfo)> {
    let files = resolve_model(args.model.as_deref())?;
    let device: Device = args.device.parse().map_err(anyhow::Error::msg)?;
    let kv: KvCache = args.kv.parse().map_err(anyhow::Error::msg)?;
    let tables: Tables = args.tables.parse().map_err(anyhow::Error::msg)?;
    let (mut options, note) = LoadOptions::on_device_placed(device, kv, tables)?;
    if let Some(n) = note {
        eprintln!("{n}");
    }
    options.runner = RunnerConfig {
        prefill_chunk: args.prefill_chunk,
        context_limit: args.context,
        ..RunnerConfig::default()
    };
    let tally = options.kv_tally.clone();
    let engine = Engine::new()?;
    let info = engine
        .load(files.clone(), options)
        .map_err(|e| anyhow!("loading {}: {e}", files.program.display()))?;
    if kv == KvCache::F16 {
        if let Some(n) = tally.get().f16_note() {
            eprintln!("{n}");
        }
    }
    Ok((engine, info))
}

/// Runs one reply, streaming text to stdout; `current` holds its cancel token meanwhile so a
/// Ctrl-C handler can stop it.
pub fn reply(
    engine: &Engine,
    messages: Vec<Message>,
    opts: GenerateOptions,
    current: &Arc<Mutex<Option<CancelToken>>>,
) -> Result<Completion> {
    let generation = engine.chat(messages, opts)?;
    set_current(current, Some(generation.cancel_token()));
    let mut out = std::io::stdout().lock();
    let mut result = Err(anyhow!("the engine stopped before the reply finished"));
    while let Some(event) = generation.recv() {
        match event {
            Event::Text(t) => {
                out.write_all(t.as_bytes())?;
                out.flush()?;
            }
            Event::Prefill { .. } => {}
            Event::Finished(c) => {
                result = Ok(c);
                break;
            }
            Event::Failed(e) => {
                result = Err(e.into());
                break;
            }
        }
    }
    set_current(current, None);
    result
}

fn set_current(current: &Arc<Mutex<Option<CancelToken>>>, token: Option<CancelToken>) {
    // A poisoned lock only means a handler panicked; the slot itself is still usable.
    let mut slot = current.lock().unwrap_or_else(|p| p.into_inner());
    *slot = token;
}

/// On Ctrl-C: cancel the reply in progress if there is one, else call `idle` (quit). Uses
/// tokio's signal handling on a small thread of its own.
pub fn on_ctrl_c(current: Arc<Mutex<Option<CancelToken>>>, idle: impl Fn() + Send + 'static) {
    let spawned = std::thread::Builder::new()
        .name("ctrl-c".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                while tokio::signal::ctrl_c().await.is_ok() {
                    let token = current.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    match token {
                        Some(t) => t.cancel(),
                        None => idle(),
                    }
                }
            });
        });
    if spawned.is_err() {
        eprintln!("warning: could not install the Ctrl-C handler");
    }
}

pub fn describe_stats(c: &Completion) -> String {
    let s = &c.stats;
    let mut parts = vec![
        format!("stop: {}", s.stop.describe()),
        format!(
            "prompt {} tokens ({} cached, {} prefilled)",
            s.prompt_tokens, s.cached_tokens, s.prefilled_tokens
        ),
        format!("generated {}", s.generated_tokens),
    ];
    if let Some(t) = s.time_to_first_token {
        parts.push(format!("first token after {:.0} ms", t.as_secs_f64() * 1e3));
    }
    parts.push(format!("prefill {:.1} tok/s", s.prefill_tokens_per_s));
    parts.push(format!("decode {:.1} tok/s", s.decode_tokens_per_s));
    if s.dropped_messages > 0 {
        parts.push(format!(
            "{} earlier messages dropped to fit the context",
            s.dropped_messages
        ));
    }
    if s.context_shifts > 0 {
        parts.push(format!("{} context shifts", s.context_shifts));
    }
    parts.push(format!("seed {}", s.seed));
    format!("[{}]", parts.join(", "))
}

/// `--model`: an existing path (a .pte or a directory with one), else a catalog id.
pub fn resolve_model(spec: Option<&str>) -> Result<ModelFiles> {
    let spec = spec.unwrap_or(DEFAULT_MODEL);
    let path = Path::new(spec);
    if path.is_file() {
        return Ok(ModelFiles::beside(path)?);
    }
    if path.is_dir() {
        return Ok(ModelFiles::in_dir(path)?);
    }
    let catalog = Catalog::builtin()?;
    let (model, explicit) = catalog
        .resolve(spec)
        .map_err(|e| anyhow!("`{spec}` is neither a file nor a catalog id: {e}"))?;
    if let Source::Bundled { dir } = &model.source {
        let dir = assets_dir().join(dir);
        if !dir.is_dir() {
            bail!(
                "the bundled model `{}` is not in {}",
                model.id,
                dir.display()
            );
        }
        // The variant's file when present, else whatever single .pte the directory holds.
        let variant = explicit.or(model.variants.first());
        if let Some(v) = variant {
            let named = dir.join(&v.file);
            if named.is_file() {
                return Ok(ModelFiles::beside(named)?);
            }
        }
        return ModelFiles::in_dir(&dir).map_err(|e| match variant {
            // The program is larger than the repository may hold, so a checkout lacks it.
            Some(v) => anyhow!(
                "the bundled model `{}` has no program: {} is missing ({e}); produce it with \
                 tests/fixtures/export_demo_model.py (see {}) or pass --model",
                model.id,
                dir.join(&v.file).display(),
                dir.join("README.md").display()
            ),
            None => e.into(),
        });
    }
    let cache = Cache::default_location()?;
    let local = match explicit {
        Some(v) => cache.local_model(model, v)?,
        None => {
            let mut found = Vec::new();
            for v in &model.variants {
                if let Some(l) = cache.local_model(model, v)? {
                    found.push(l);
                }
            }
            // Several downloaded: this device's default among them, else the first.
            if found.len() > 1 {
                let choice = catalog::choose(model, &catalog::probe(), catalog.gpu_deny(), None)?;
                if let Some(i) = found.iter().position(|l| l.variant_id == choice.variant.id) {
                    found.swap(0, i);
                }
            }
            found.into_iter().next()
        }
    };
    let local = local.ok_or_else(|| {
        let id = explicit.map_or_else(|| model.id.clone(), |v| model.spec(v));
        anyhow!("`{id}` is not downloaded; run `pteria models download {id}`")
    })?;
    Ok(ModelFiles::from_files(&local.program, &local.files)?)
}
