//! The chat core every shell (Tauri, Slint, CLI) drives: conversations persisted in the app's
//! data directory, settings, the model picker's view of the catalog with downloads, model
//! loading, and replies streamed from the `llm::Engine`. Upstream are `llm`, `catalog` and
//! `download`; a shell never touches them directly.
//!
//! Nothing here blocks on long work: `send`, `regenerate`, `load_model` and `download` return at
//! once and report through a callback (called on a worker thread) that ends with exactly one
//! final event. A shell's command is a few lines: translate arguments, call, forward events.

pub mod markdown;
pub mod models;
pub mod settings;
pub mod store;

pub use models::{FitView, ModelView, VariantState, VariantView};
pub use settings::{DeviceChoice, Settings, TablesChoice};
pub use store::{Author, Conversation, ConversationSummary, MessageStats, StoredMessage};

use crate::catalog::{Catalog, CatalogError, DeviceFacts};
use crate::download::{
    self, Cache, DownloadError, DownloadOptions, Downloader, HubConfig, Progress,
};
use crate::llm::{
    CancelToken, Completion, ContextPolicy, Engine, Event, LlmError, LoadOptions, Message,
    ModelFiles, RunnerConfig, StopReason,
};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use store::{now_ms, Store};

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is damaged: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("no conversation `{id}`")]
    NoConversation { id: String },
    #[error("settings: {0}")]
    Settings(String),
    #[error("no model is loaded: pick one in the model list first")]
    NoModel,
    #[error("a reply is being written; stop it or wait for it to finish")]
    ReplyRunning,
    #[error("a model is loading; wait for it to finish")]
    Loading,
    #[error("`{spec}` is already downloading")]
    AlreadyDownloading { spec: String },
    #[error("`{spec}` is downloading; cancel the download first")]
    Downloading { spec: String },
    #[error("another variant of this model is downloading: `{running}`; `{spec}` shares its files, so wait for that download or cancel it first")]
    OtherVariantDownloading { spec: String, running: String },
    #[error("`{spec}` ships with the app and cannot be downloaded or deleted")]
    Bundled { spec: String },
    #[error("`{spec}` names a model; name a variant too (model:variant)")]
    VariantRequired { spec: String },
    #[error("`{spec}` cannot be loaded: {reason}")]
    NotAvailable { spec: String, reason: String },
    #[error("nothing to regenerate: the conversation has no message of yours to answer")]
    NothingToRegenerate,
    #[error("the message is empty")]
    EmptyMessage,
    #[error("device: {0}")]
    Device(String),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Download(#[from] DownloadError),
    #[error(transparent)]
    Llm(#[from] LlmError),
}

/// Shells send errors to their UI as text.
impl Serialize for ChatError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

pub type Result<T> = std::result::Result<T, ChatError>;

/// What a shell tells the core about where it runs.
#[derive(Clone)]
pub struct CoreConfig {
    /// Conversations, settings and downloaded models live here (the shell's app data dir; on
    /// mobile the one Tauri's path resolver gives).
    pub data_dir: PathBuf,
    /// Where bundled models are (`models/<id>/` inside it).
    pub assets_dir: PathBuf,
    pub catalog: Catalog,
    pub hub: HubConfig,
    pub download: DownloadOptions,
    /// `None`: probe this device the first time the model list is asked for.
    pub device_facts: Option<DeviceFacts>,
    pub runner: RunnerConfig,
    pub context: ContextPolicy,
}

impl CoreConfig {
    /// The built-in catalog, the hub from `HF_ENDPOINT`/`HF_TOKEN`, default download behaviour.
    pub fn new(data_dir: impl Into<PathBuf>, assets_dir: impl Into<PathBuf>) -> Result<Self> {
        Ok(CoreConfig {
            data_dir: data_dir.into(),
            assets_dir: assets_dir.into(),
            catalog: Catalog::builtin()?,
            hub: HubConfig::from_env(),
            download: DownloadOptions::default(),
            device_facts: None,
            runner: RunnerConfig::default(),
            context: ContextPolicy::default(),
        })
    }

    /// For desktop shells: data in `PTERIA_HOME`, else the platform's data directory; bundled
    /// models from `default_assets_dir()`.
    pub fn desktop() -> Result<Self> {
        let cache = Cache::default_location()?;
        CoreConfig::new(cache.root(), default_assets_dir())
    }
}

/// `PTERIA_ASSETS`, else the nearest `assets/` holding `models/` beside or above the executable
/// (installed layouts, and `target/<profile>/` inside a checkout), else the source tree's
/// `assets/` as of the build. The CLI and both shells resolve bundled models through this.
pub fn default_assets_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PTERIA_ASSETS").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().ok();
    let found = exe
        .as_deref()
        .and_then(Path::parent)
        .into_iter()
        .flat_map(Path::ancestors)
        .map(|d| d.join("assets"))
        .find(|a| a.join("models").is_dir());
    found.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets"))
}

/// The loaded model, as shells show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadedModel {
    pub spec: String,
    pub name: String,
    pub context_tokens: usize,
    pub device: DeviceChoice,
    /// Why `auto` fell back to the CPU, when it did.
    pub note: Option<String>,
    pub chat_format: String,
    pub load_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LoadEvent {
    Loading { spec: String },
    Loaded { model: LoadedModel },
    Failed { spec: String, error: String },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DownloadEvent {
    Progress {
        spec: String,
        file: String,
        file_index: usize,
        file_count: usize,
        done: u64,
        total: u64,
        bytes_per_sec: f64,
        eta_s: Option<f64>,
    },
    Finished {
        spec: String,
        bytes: u64,
    },
    Failed {
        spec: String,
        error: String,
        /// Stopped by `cancel_download`; the partial files stay and a new download resumes.
        cancelled: bool,
    },
}

/// How full the model's context is with a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ContextUsage {
    pub used_tokens: usize,
    pub context_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChatEvent {
    /// `done` of `total` new prompt tokens have been run.
    Prefill { done: usize, total: usize },
    /// More of the reply.
    Delta { text: String },
    /// The reply is complete (or was stopped: `message.stopped`) and saved. A regeneration
    /// stopped before any text saves nothing: `message` is then the old reply, kept.
    Finished {
        message: StoredMessage,
        usage: ContextUsage,
    },
    /// The reply failed; `message` (saved, with `error` set) keeps any text it had. A failed
    /// regeneration is saved after the old reply, which stays.
    Failed {
        message: StoredMessage,
        error: String,
    },
}

/// What `send` and `regenerate` return at once, before the reply streams.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplyStarted {
    pub conversation_id: String,
    /// The user's message as saved (`None` for a regeneration).
    pub user_message: Option<StoredMessage>,
    /// The id the reply will be saved under.
    pub assistant_id: String,
    /// The conversation's title (a first message names it).
    pub title: String,
}

/// The reply being written, as far as it has streamed: what a shell shows when the user opens
/// its conversation again mid-reply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplyProgress {
    pub conversation_id: String,
    /// The id the reply will be saved under.
    pub assistant_id: String,
    /// How many of the conversation's saved messages come before the reply. A regeneration's
    /// old reply stays saved after them until the new one replaces it, so a shell shows only
    /// these, then the streaming text.
    pub follows: usize,
    pub text: String,
}

struct ActiveReply {
    progress: ReplyProgress,
    cancel: CancelToken,
}

struct State {
    settings: Settings,
    store: Store,
    loaded: Option<LoadedModel>,
    loading: Option<String>,
    reply: Option<ActiveReply>,
    /// Running downloads by spec.
    downloads: HashMap<String, RunningDownload>,
}

/// A download the core runs, with its latest progress.
struct RunningDownload {
    model_id: String,
    cancel: download::CancelToken,
    progress: Option<Progress>,
}

impl State {
    /// Refuses to start or delete `spec` while a variant of the same model downloads: variants
    /// share files, so the download lock is one per model, not per variant.
    fn check_model_idle(&self, model_id: &str, spec: &str) -> Result<()> {
        if self.downloads.contains_key(spec) {
            return Err(ChatError::Downloading { spec: spec.into() });
        }
        match self.downloads.iter().find(|(_, d)| d.model_id == model_id) {
            Some((running, _)) => Err(ChatError::OtherVariantDownloading {
                spec: spec.into(),
                running: running.clone(),
            }),
            None => Ok(()),
        }
    }

    /// True while a load runs that `spec` is part of: the one being loaded, or the one loaded,
    /// which the engine is freeing or has freed for the new one.
    fn load_involves(&self, spec: &str) -> bool {
        self.loading.is_some()
            && (self.loading.as_deref() == Some(spec)
                || self.loaded.as_ref().is_some_and(|l| l.spec == spec))
    }
}

/// Everything reply callbacks need; never owns the engine, so a callback running on the engine's
/// thread can never be the one to drop it.
struct Shared {
    config: CoreConfig,
    cache: Cache,
    settings_path: PathBuf,
    /// Why `settings_path` must not be written this session: it could not be read (or a
    /// damaged one set aside) at start, and saving would replace what the user had there.
    settings_readonly: Option<String>,
    facts: OnceLock<DeviceFacts>,
    warnings: Vec<String>,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a callback panicked; the state itself stays consistent because
        // every change is saved before it is applied.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn save_settings(&self, s: &Settings) -> Result<()> {
        if let Some(why) = &self.settings_readonly {
            return Err(ChatError::Settings(format!(
                "not saved: {why}; saving would replace that file (fix it and restart the app)"
            )));
        }
        s.save(&self.settings_path)
    }

    fn facts(&self) -> &DeviceFacts {
        self.facts.get_or_init(|| {
            self.config
                .device_facts
                .clone()
                .unwrap_or_else(crate::catalog::probe)
        })
    }
}

/// The chat core. Cheap to clone; every clone is the same core.
#[derive(Clone)]
pub struct ChatCore {
    engine: Arc<Engine>,
    shared: Arc<Shared>,
}

const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatCore>();
};

impl ChatCore {
    /// Opens the data directory: restores settings and every conversation. Damaged files do not
    /// stop the app: they are kept aside and reported by `warnings`.
    pub fn open(config: CoreConfig) -> Result<ChatCore> {
        let settings_path = config.data_dir.join("settings.json");
        let mut warnings = Vec::new();
        let mut settings_readonly = None;
        let settings = match Settings::load(&settings_path) {
            Ok(s) => s.unwrap_or_default(),
            Err(e @ ChatError::Corrupt { .. }) => {
                // Keep the damaged file for the user to inspect, under a name no earlier damaged
                // file holds; start from the defaults.
                let aside = aside_path(&settings_path);
                match std::fs::rename(&settings_path, &aside) {
                    Ok(()) => warnings.push(format!(
                        "{e}; using default settings (the old file is {})",
                        aside.display()
                    )),
                    Err(source) => {
                        let why =
                            format!("{e}, and moving it to {} failed: {source}", aside.display());
                        warnings.push(format!("{why}; using default settings without saving them"));
                        settings_readonly = Some(why);
                    }
                }
                Settings::default()
            }
            Err(e) => {
                // Unreadable is not damaged (permissions, a failing disk): the file may be intact,
                // so it stays where it is and is never saved over this session.
                warnings.push(format!(
                    "{e}; using default settings without saving them (the file is left as it is)"
                ));
                settings_readonly = Some(e.to_string());
                Settings::default()
            }
        };
        let (store, more) = Store::open(config.data_dir.join("conversations"))?;
        warnings.extend(more);
        let cache = Cache::new(&config.data_dir);
        let engine = Engine::new()?;
        Ok(ChatCore {
            engine: Arc::new(engine),
            shared: Arc::new(Shared {
                cache,
                settings_path,
                settings_readonly,
                facts: OnceLock::new(),
                warnings,
                state: Mutex::new(State {
                    settings,
                    store,
                    loaded: None,
                    loading: None,
                    reply: None,
                    downloads: HashMap::new(),
                }),
                config,
            }),
        })
    }

    /// Problems found while restoring (damaged files), for the shell to show once.
    pub fn warnings(&self) -> &[String] {
        &self.shared.warnings
    }

    pub fn data_dir(&self) -> &Path {
        &self.shared.config.data_dir
    }

    // -- settings ------------------------------------------------------------------------------

    pub fn settings(&self) -> Settings {
        self.shared.lock().settings.clone()
    }

    /// Validates and saves new settings; the model choice is kept from the current ones (it
    /// changes by loading a model). Device changes apply at the next load.
    pub fn update_settings(&self, new: Settings) -> Result<Settings> {
        new.validate()?;
        let mut st = self.shared.lock();
        let s = Settings {
            model: st.settings.model.clone(),
            ..new
        };
        self.shared.save_settings(&s)?;
        st.settings = s.clone();
        Ok(s)
    }

    // -- conversations -------------------------------------------------------------------------

    /// Newest first.
    pub fn conversations(&self) -> Vec<ConversationSummary> {
        self.shared.lock().store.list()
    }

    pub fn create_conversation(&self, title: Option<&str>) -> Result<Conversation> {
        self.shared.lock().store.create(title)
    }

    pub fn conversation(&self, id: &str) -> Result<Conversation> {
        self.shared.lock().store.get(id).cloned()
    }

    pub fn rename_conversation(&self, id: &str, title: &str) -> Result<ConversationSummary> {
        let title = title.trim();
        if title.is_empty() {
            return Err(ChatError::Settings("a conversation needs a title".into()));
        }
        self.shared.lock().store.update(id, |c| {
            c.title = title.to_string();
            c.summary()
        })
    }

    /// Deletes a conversation; a reply being written for it is stopped (and not saved).
    pub fn delete_conversation(&self, id: &str) -> Result<()> {
        let mut st = self.shared.lock();
        st.store.delete(id)?;
        if let Some(r) = st
            .reply
            .as_ref()
            .filter(|r| r.progress.conversation_id == id)
        {
            r.cancel.cancel();
        }
        Ok(())
    }

    /// Context use after the conversation's last reply, against the loaded model's context.
    pub fn context_usage(&self, id: &str) -> Result<Option<ContextUsage>> {
        let st = self.shared.lock();
        let c = st.store.get(id)?;
        let last = c.messages.iter().rev().find_map(|m| m.stats.as_ref());
        Ok(last.map(|s| ContextUsage {
            used_tokens: s.context_used(),
            context_tokens: st
                .loaded
                .as_ref()
                .map_or(s.context_tokens, |l| l.context_tokens),
        }))
    }

    // -- models --------------------------------------------------------------------------------

    /// The catalog as the model picker shows it.
    pub fn models(&self) -> Result<Vec<ModelView>> {
        let facts = self.shared.facts();
        let st = self.shared.lock();
        let downloads: HashMap<String, Option<Progress>> = st
            .downloads
            .iter()
            .map(|(k, d)| (k.clone(), d.progress.clone()))
            .collect();
        models::list(
            &self.shared.config.catalog,
            &self.shared.cache,
            facts,
            &self.shared.config.assets_dir,
            &downloads,
            st.loaded.as_ref().map(|l| l.spec.as_str()),
        )
    }

    pub fn loaded_model(&self) -> Option<LoadedModel> {
        self.shared.lock().loaded.clone()
    }

    /// The spec being loaded, while a load runs.
    pub fn loading_model(&self) -> Option<String> {
        self.shared.lock().loading.clone()
    }

    /// Starts downloading `model:variant` (resuming a partial download); `on_event` gets
    /// progress, then `Finished` or `Failed`. One variant of a model downloads at a time.
    pub fn download(
        &self,
        spec: &str,
        mut on_event: impl FnMut(DownloadEvent) + Send + 'static,
    ) -> Result<()> {
        let (model, variant) = models::exact(&self.shared.config.catalog, spec)?;
        if model.is_bundled() {
            return Err(ChatError::Bundled { spec: spec.into() });
        }
        let spec = model.spec(variant);
        let cancel = download::CancelToken::new();
        {
            let mut st = self.shared.lock();
            if st.downloads.contains_key(&spec) {
                return Err(ChatError::AlreadyDownloading { spec });
            }
            st.check_model_idle(&model.id, &spec)?;
            st.downloads.insert(
                spec.clone(),
                RunningDownload {
                    model_id: model.id.clone(),
                    cancel: cancel.clone(),
                    progress: None,
                },
            );
        }
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("pteria-download".into())
            .spawn(move || {
                let result = run_download(&shared, &spec, &cancel, &mut on_event);
                shared.lock().downloads.remove(&spec);
                on_event(match result {
                    Ok(bytes) => DownloadEvent::Finished { spec, bytes },
                    Err(e) => DownloadEvent::Failed {
                        spec,
                        cancelled: matches!(e, ChatError::Download(DownloadError::Cancelled)),
                        error: e.to_string(),
                    },
                });
            });
        spawned.map(|_| ()).map_err(|source| ChatError::Io {
            action: "starting",
            path: "(download thread)".into(),
            source,
        })
    }

    /// Stops a running download (its partial files stay for a resume). False if none ran.
    pub fn cancel_download(&self, spec: &str) -> bool {
        let st = self.shared.lock();
        match st.downloads.get(spec) {
            Some(d) => {
                d.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Deletes a downloaded variant (unloading it first if it is loaded); returns bytes freed.
    /// Refused while any variant of the model downloads, or while a load involves it. If it was
    /// the model loaded last, that is forgotten: the next start loads the bundled demo.
    pub fn delete_model(&self, spec: &str) -> Result<u64> {
        let (model, variant) = models::exact(&self.shared.config.catalog, spec)?;
        let spec = model.spec(variant);
        if model.is_bundled() {
            return Err(ChatError::Bundled { spec });
        }
        let mut st = self.shared.lock();
        st.check_model_idle(&model.id, &spec)?;
        // The loader may be reading its files, or the engine freeing it for the new model:
        // unloading here would wait behind the load and then drop the model just loaded.
        if st.load_involves(&spec) {
            return Err(ChatError::Loading);
        }
        if st.loaded.as_ref().is_some_and(|l| l.spec == spec) {
            if st.reply.is_some() {
                return Err(ChatError::ReplyRunning);
            }
            self.engine.unload()?;
            st.loaded = None;
        }
        let freed = self.shared.cache.remove(model, variant)?;
        if st.settings.model.as_deref() == Some(spec.as_str()) {
            st.settings.model = None;
            if let Err(e) = self.shared.save_settings(&st.settings) {
                // The files are gone either way; `load_model(None)` falls back to the demo.
                log_warning(&format!("could not forget the deleted model: {e}"));
            }
        }
        Ok(freed)
    }

    /// Starts loading `spec` (`model` or `model:variant`; `None`: the last model loaded, else
    /// the bundled demo, also when the last one is gone) on the settings' device. Returns the
    /// exact spec; `on_event` gets `Loading`, then `Loaded` or `Failed`. The previous model is
    /// freed first.
    pub fn load_model(
        &self,
        spec: Option<&str>,
        mut on_event: impl FnMut(LoadEvent) + Send + 'static,
    ) -> Result<String> {
        let facts = self.shared.facts();
        let (spec, files, device, name) = {
            let mut st = self.shared.lock();
            if st.reply.is_some() {
                return Err(ChatError::ReplyRunning);
            }
            if st.loading.is_some() {
                return Err(ChatError::Loading);
            }
            let cfg = &self.shared.config;
            let resolve = |wanted: &str| {
                models::resolve_files(
                    &cfg.catalog,
                    &self.shared.cache,
                    facts,
                    &cfg.assets_dir,
                    wanted,
                )
            };
            let (spec, files) = match (spec, st.settings.model.as_deref()) {
                (Some(s), _) => resolve(s)?,
                (None, Some(last)) => match resolve(last) {
                    Ok(found) => found,
                    // The last model was deleted, or an update's catalog dropped it.
                    Err(e) => match self.default_spec() {
                        Some(demo) => resolve(&demo).map_err(|_| e)?,
                        None => return Err(e),
                    },
                },
                (None, None) => resolve(&self.default_spec().ok_or(ChatError::NoModel)?)?,
            };
            let name = cfg.catalog.resolve(&spec)?.0.name.clone();
            st.loading = Some(spec.clone());
            (spec, files, (st.settings.device, st.settings.tables), name)
        };
        let engine = self.engine.clone();
        let shared = self.shared.clone();
        let out = spec.clone();
        let spawned = std::thread::Builder::new()
            .name("pteria-load".into())
            .spawn(move || {
                on_event(LoadEvent::Loading { spec: spec.clone() });
                let t0 = std::time::Instant::now();
                let (device, tables) = device;
                let result = load(&engine, &shared, files, device, tables);
                let mut st = shared.lock();
                st.loading = None;
                match result {
                    Ok((info, note)) => {
                        let model = LoadedModel {
                            spec: spec.clone(),
                            name,
                            context_tokens: info.context_len,
                            device,
                            note,
                            chat_format: info.template.to_string(),
                            load_ms: t0.elapsed().as_millis() as u64,
                        };
                        st.loaded = Some(model.clone());
                        st.settings.model = Some(spec);
                        let saved = shared.save_settings(&st.settings);
                        drop(st);
                        if let Err(e) = saved {
                            // The model is loaded; only remembering it for next time failed.
                            log_warning(&format!("could not remember the loaded model: {e}"));
                        }
                        on_event(LoadEvent::Loaded { model });
                    }
                    Err(e) => {
                        // The engine frees the old model before loading: none is loaded now.
                        st.loaded = None;
                        drop(st);
                        on_event(LoadEvent::Failed {
                            spec,
                            error: e.to_string(),
                        });
                    }
                }
            });
        match spawned {
            Ok(_) => Ok(out),
            Err(source) => {
                self.shared.lock().loading = None;
                Err(ChatError::Io {
                    action: "starting",
                    path: "(load thread)".into(),
                    source,
                })
            }
        }
    }

    /// The first bundled model: what the app offers before anything is downloaded.
    fn default_spec(&self) -> Option<String> {
        let catalog = &self.shared.config.catalog;
        catalog
            .models()
            .iter()
            .filter(|m| m.is_bundled())
            .find_map(|m| m.variants.first().map(|v| m.spec(v)))
    }

    // -- replies -------------------------------------------------------------------------------

    /// Saves the user's message and starts the reply. `on_event` gets deltas, then `Finished`
    /// (the reply is saved by then) or `Failed`.
    pub fn send(
        &self,
        conversation_id: &str,
        text: &str,
        on_event: impl FnMut(ChatEvent) + Send + 'static,
    ) -> Result<ReplyStarted> {
        if text.trim().is_empty() {
            return Err(ChatError::EmptyMessage);
        }
        let mut st = self.shared.lock();
        let loaded = ready(&st)?;
        let user = StoredMessage {
            id: store::new_id(),
            author: Author::User,
            content: text.to_string(),
            created_at: now_ms(),
            stats: None,
            stopped: false,
            error: None,
        };
        let (title, follows) = st.store.update(conversation_id, |c| {
            if c.messages.iter().all(|m| m.author != Author::User) && c.title == store::NEW_TITLE {
                c.title = Conversation::title_from(text);
            }
            c.messages.push(user.clone());
            (c.title.clone(), c.messages.len())
        })?;
        let start = Start {
            conversation_id,
            loaded,
            user_message: Some(user),
            title,
            follows,
        };
        self.start_reply(st, start, on_event)
    }

    /// Writes a new reply to the conversation's last message of the user's; once it is saved it
    /// replaces the replies after that message. Until then they stay saved, and a regeneration
    /// that fails or is stopped before any text keeps them (see `ChatEvent`).
    pub fn regenerate(
        &self,
        conversation_id: &str,
        on_event: impl FnMut(ChatEvent) + Send + 'static,
    ) -> Result<ReplyStarted> {
        let st = self.shared.lock();
        let loaded = ready(&st)?;
        let c = st.store.get(conversation_id)?;
        let follows = c
            .messages
            .iter()
            .rposition(|m| m.author == Author::User)
            .ok_or(ChatError::NothingToRegenerate)?
            + 1;
        let start = Start {
            conversation_id,
            loaded,
            user_message: None,
            title: c.title.clone(),
            follows,
        };
        self.start_reply(st, start, on_event)
    }

    /// The reply being written and its text so far, if one is.
    pub fn reply_in_progress(&self) -> Option<ReplyProgress> {
        self.shared
            .lock()
            .reply
            .as_ref()
            .map(|r| r.progress.clone())
    }

    /// Stops the reply being written, if any; it is saved as far as it got. True if one ran.
    pub fn stop(&self) -> bool {
        match &self.shared.lock().reply {
            Some(r) => {
                r.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// True while a reply is being written.
    pub fn is_replying(&self) -> bool {
        self.shared.lock().reply.is_some()
    }

    fn start_reply(
        &self,
        mut st: MutexGuard<'_, State>,
        start: Start<'_>,
        mut on_event: impl FnMut(ChatEvent) + Send + 'static,
    ) -> Result<ReplyStarted> {
        let Start {
            conversation_id,
            loaded,
            user_message,
            title,
            follows,
        } = start;
        let conversation = st.store.get(conversation_id)?;
        let mut messages = Vec::new();
        if !st.settings.system_prompt.trim().is_empty() {
            messages.push(Message::system(st.settings.system_prompt.clone()));
        }
        for m in conversation.messages.iter().take(follows) {
            // Failed replies are shown, not sent; a reply stopped before any text adds nothing.
            if m.error.is_some() || m.content.is_empty() {
                continue;
            }
            messages.push(match m.author {
                Author::User => Message::user(m.content.clone()),
                Author::Assistant => Message::assistant(m.content.clone()),
            });
        }
        let options = st.settings.generate_options();
        let assistant_id = store::new_id();
        let shared = self.shared.clone();
        let conv = conversation_id.to_string();
        let id = assistant_id.clone();
        // Events that touch the state wait for `st` to be released: `st.reply` is set by then,
        // and its progress holds the reply's text (one copy, which a failure saves).
        let cancel = self.engine.chat_with(messages, options, move |e| match e {
            Event::Prefill { done, total } => on_event(ChatEvent::Prefill { done, total }),
            Event::Text(t) => {
                if let Some(r) = shared.lock().reply.as_mut() {
                    r.progress.text.push_str(&t);
                }
                on_event(ChatEvent::Delta { text: t });
            }
            Event::Finished(c) => {
                let message = reply_message(&id, &loaded, &c);
                let mut usage = ContextUsage {
                    used_tokens: c.stats.prompt_tokens + c.stats.generated_tokens,
                    context_tokens: loaded.context_tokens,
                };
                match shared.finish_reply(&conv, follows, &message) {
                    Ok(Some(kept)) => {
                        if let Some(s) = &kept.stats {
                            usage.used_tokens = s.context_used();
                        }
                        on_event(ChatEvent::Finished {
                            message: kept,
                            usage,
                        })
                    }
                    Ok(None) => on_event(ChatEvent::Finished { message, usage }),
                    Err(e) => on_event(ChatEvent::Failed {
                        message,
                        error: format!("the reply could not be saved: {e}"),
                    }),
                }
            }
            Event::Failed(e) => {
                let text = {
                    let mut st = shared.lock();
                    if e.unloads_model() {
                        // The engine dropped the model: say so before anything can start on it.
                        st.loaded = None;
                    }
                    (st.reply.as_mut())
                        .map(|r| std::mem::take(&mut r.progress.text))
                        .unwrap_or_default()
                };
                let error = e.to_string();
                let message = StoredMessage {
                    id: id.clone(),
                    author: Author::Assistant,
                    content: text,
                    created_at: now_ms(),
                    stats: None,
                    stopped: false,
                    error: Some(error.clone()),
                };
                let _ = shared.finish_reply(&conv, follows, &message);
                on_event(ChatEvent::Failed { message, error });
            }
        })?;
        st.reply = Some(ActiveReply {
            progress: ReplyProgress {
                conversation_id: conversation_id.to_string(),
                assistant_id: assistant_id.clone(),
                follows,
                text: String::new(),
            },
            cancel,
        });
        Ok(ReplyStarted {
            conversation_id: conversation_id.to_string(),
            user_message,
            assistant_id,
            title,
        })
    }
}

/// What a reply starts from.
struct Start<'a> {
    conversation_id: &'a str,
    loaded: LoadedModel,
    /// The user's message just saved (`None` for a regeneration).
    user_message: Option<StoredMessage>,
    title: String,
    /// The saved messages the reply comes after; any after them are the replies it replaces.
    follows: usize,
}

impl Shared {
    /// Saves a finished reply and marks the engine free. The saved messages after `follows`
    /// are the replies a regeneration replaces, kept until now so that a crash or a close
    /// mid-reply loses none. They also stay when the new reply is no better: stopped before any
    /// text (nothing is saved; the reply kept is returned), or failed (it is saved after them,
    /// in place of an earlier failure). A conversation deleted meanwhile is not an error:
    /// there is nothing left to save it in.
    fn finish_reply(
        &self,
        conversation_id: &str,
        follows: usize,
        message: &StoredMessage,
    ) -> Result<Option<StoredMessage>> {
        let mut st = self.lock();
        st.reply = None;
        let kept = match st.store.get(conversation_id) {
            Ok(c) => c
                .messages
                .get(follows..)
                .unwrap_or_default()
                .last()
                .cloned(),
            Err(ChatError::NoConversation { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if let Some(kept) = kept.filter(|_| message.stopped && message.content.is_empty()) {
            return Ok(Some(kept));
        }
        st.store.update(conversation_id, |c| {
            let replaced = c.messages.split_off(follows.min(c.messages.len()));
            if message.error.is_some() {
                c.messages
                    .extend(replaced.into_iter().filter(|m| m.error.is_none()));
            }
            c.messages.push(message.clone());
        })?;
        Ok(None)
    }
}

/// The loaded model, when nothing stops a reply from starting now.
fn ready(st: &State) -> Result<LoadedModel> {
    if st.reply.is_some() {
        return Err(ChatError::ReplyRunning);
    }
    if st.loading.is_some() {
        return Err(ChatError::Loading);
    }
    st.loaded.clone().ok_or(ChatError::NoModel)
}

fn reply_message(id: &str, loaded: &LoadedModel, c: &Completion) -> StoredMessage {
    let s = &c.stats;
    StoredMessage {
        id: id.to_string(),
        author: Author::Assistant,
        content: c.text.clone(),
        created_at: now_ms(),
        stats: Some(MessageStats {
            model: loaded.spec.clone(),
            prompt_tokens: s.prompt_tokens,
            cached_tokens: s.cached_tokens,
            generated_tokens: s.generated_tokens,
            ttft_ms: s
                .time_to_first_token
                .map(|t| hundredths(t.as_secs_f64() * 1e3)),
            prefill_tokens_per_s: hundredths(s.prefill_tokens_per_s),
            decode_tokens_per_s: hundredths(s.decode_tokens_per_s),
            stop: s.stop.describe().to_string(),
            dropped_messages: s.dropped_messages,
            context_tokens: loaded.context_tokens,
            seed: s.seed,
        }),
        stopped: s.stop == StopReason::Cancelled,
        error: None,
    }
}

/// Rounded to 0.01: more is noise, and short decimals read back from JSON to the same value.
fn hundredths(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Loads `files` on `device`: the delegate front ends run on the chosen executor.
fn load(
    engine: &Engine,
    shared: &Shared,
    files: ModelFiles,
    device: DeviceChoice,
    tables: TablesChoice,
) -> Result<(crate::llm::ModelInfo, Option<String>)> {
    let (executor, note, _) = crate::runtime::delegate::executor_placed(
        device.device(),
        crate::runtime::delegate::KvCache::F32,
        tables.tables(),
    )
    .map_err(ChatError::Device)?;
    let options = LoadOptions {
        backends: crate::frontend::backends(executor),
        runner: shared.config.runner.clone(),
        context: shared.config.context,
        ..LoadOptions::default()
    };
    Ok((engine.load(files, options)?, note))
}

fn run_download(
    shared: &Shared,
    spec: &str,
    cancel: &download::CancelToken,
    on_event: &mut (dyn FnMut(DownloadEvent) + Send),
) -> Result<u64> {
    let (model, variant) = models::exact(&shared.config.catalog, spec)?;
    let downloader = Downloader::new(
        shared.cache.clone(),
        shared.config.hub.clone(),
        shared.config.download.clone(),
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ChatError::Io {
            action: "starting",
            path: "(download runtime)".into(),
            source,
        })?;
    let local = rt.block_on(
        downloader.download(model, variant, cancel, &mut |p: &Progress| {
            if let Some(d) = shared.lock().downloads.get_mut(spec) {
                d.progress = Some(p.clone());
            }
            on_event(DownloadEvent::Progress {
                spec: spec.to_string(),
                file: p.file.clone(),
                file_index: p.file_index,
                file_count: p.file_count,
                done: p.done,
                total: p.total,
                bytes_per_sec: p.bytes_per_sec,
                eta_s: p.eta().map(|d| d.as_secs_f64()),
            });
        }),
    )?;
    Ok(local.bytes)
}

/// Where a damaged `path` is kept: `<name>.damaged`, or `<name>.damaged-2`, `-3`, … when an
/// earlier damaged file already holds that name (it may be the only copy of older settings).
fn aside_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    (1..10_000)
        .map(|n| match n {
            1 => path.with_file_name(format!("{name}.damaged")),
            n => path.with_file_name(format!("{name}.damaged-{n}")),
        })
        // `symlink_metadata`: a dangling link still takes the name.
        .find(|p| std::fs::symlink_metadata(p).is_err())
        .unwrap_or_else(|| path.with_file_name(format!("{name}.damaged-{}", now_ms())))
}

fn log_warning(msg: &str) {
    eprintln!("pteria: {msg}");
}
