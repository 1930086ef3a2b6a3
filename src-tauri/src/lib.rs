//! Pteria's Tauri shell: each command translates its arguments, calls the chat core
//! (`pteria::chat::ChatCore`), and streams events back through a `tauri::ipc::Channel`. No
//! engine, download or storage logic lives here; what a command would need beyond that goes
//! into the core, where the Slint shell and the CLI share it.

use pteria::chat::{
    ChatCore, ChatError, ChatEvent, ContextUsage, Conversation, ConversationSummary, CoreConfig,
    DownloadEvent, LoadEvent, LoadedModel, ModelView, ReplyStarted, Settings,
};
use serde::Serialize;
use std::path::PathBuf;
use tauri::ipc::Channel;
use tauri::{Manager, Runtime, State};

include!("command_names.rs");

/// Overrides where bundled models are looked for (the variable the CLI reads too).
const ASSETS_ENV: &str = "PTERIA_ASSETS";
/// Overrides the data directory (tests, portable installs; the variable the CLI reads too).
const HOME_ENV: &str = "PTERIA_HOME";

type Result<T> = std::result::Result<T, ChatError>;

/// What the UI needs once at start.
#[derive(Debug, Clone, Serialize)]
pub struct AppInfo {
    pub version: &'static str,
    pub data_dir: String,
    /// Problems found restoring saved data, to show once.
    pub warnings: Vec<String>,
    pub loaded: Option<LoadedModel>,
    pub replying: bool,
}

#[tauri::command]
async fn app_info(core: State<'_, ChatCore>) -> Result<AppInfo> {
    Ok(AppInfo {
        version: env!("CARGO_PKG_VERSION"),
        data_dir: core.data_dir().display().to_string(),
        warnings: core.warnings().to_vec(),
        loaded: core.loaded_model(),
        replying: core.is_replying(),
    })
}

#[tauri::command]
async fn list_models(core: State<'_, ChatCore>) -> Result<Vec<ModelView>> {
    core.models()
}

#[tauri::command]
async fn download_model(
    core: State<'_, ChatCore>,
    spec: String,
    on_event: Channel<DownloadEvent>,
) -> Result<()> {
    // A closed window drops the channel; the download itself goes on and is kept.
    core.download(&spec, move |e| {
        let _ = on_event.send(e);
    })
}

#[tauri::command]
async fn cancel_download(core: State<'_, ChatCore>, spec: String) -> Result<bool> {
    Ok(core.cancel_download(&spec))
}

#[tauri::command]
async fn delete_model(core: State<'_, ChatCore>, spec: String) -> Result<u64> {
    core.delete_model(&spec)
}

#[tauri::command]
async fn load_model(
    core: State<'_, ChatCore>,
    spec: Option<String>,
    on_event: Channel<LoadEvent>,
) -> Result<String> {
    core.load_model(spec.as_deref(), move |e| {
        let _ = on_event.send(e);
    })
}

#[tauri::command]
async fn get_settings(core: State<'_, ChatCore>) -> Result<Settings> {
    Ok(core.settings())
}

#[tauri::command]
async fn update_settings(core: State<'_, ChatCore>, settings: Settings) -> Result<Settings> {
    core.update_settings(settings)
}

#[tauri::command]
async fn list_conversations(core: State<'_, ChatCore>) -> Result<Vec<ConversationSummary>> {
    Ok(core.conversations())
}

#[tauri::command]
async fn create_conversation(
    core: State<'_, ChatCore>,
    title: Option<String>,
) -> Result<Conversation> {
    core.create_conversation(title.as_deref())
}

#[tauri::command]
async fn open_conversation(core: State<'_, ChatCore>, id: String) -> Result<Conversation> {
    core.conversation(&id)
}

#[tauri::command]
async fn rename_conversation(
    core: State<'_, ChatCore>,
    id: String,
    title: String,
) -> Result<ConversationSummary> {
    core.rename_conversation(&id, &title)
}

#[tauri::command]
async fn delete_conversation(core: State<'_, ChatCore>, id: String) -> Result<()> {
    core.delete_conversation(&id)
}

#[tauri::command]
async fn context_usage(core: State<'_, ChatCore>, id: String) -> Result<Option<ContextUsage>> {
    core.context_usage(&id)
}

#[tauri::command]
async fn send_message(
    core: State<'_, ChatCore>,
    conversation_id: String,
    text: String,
    on_event: Channel<ChatEvent>,
) -> Result<ReplyStarted> {
    core.send(&conversation_id, &text, move |e| {
        let _ = on_event.send(e);
    })
}

#[tauri::command]
async fn stop_generation(core: State<'_, ChatCore>) -> Result<bool> {
    Ok(core.stop())
}

#[tauri::command]
async fn regenerate(
    core: State<'_, ChatCore>,
    conversation_id: String,
    on_event: Channel<ChatEvent>,
) -> Result<ReplyStarted> {
    core.regenerate(&conversation_id, move |e| {
        let _ = on_event.send(e);
    })
}

/// Registers every command on `builder`; the app and the tests (mock runtime) share it.
pub fn with_commands<R: Runtime>(builder: tauri::Builder<R>) -> tauri::Builder<R> {
    builder.invoke_handler(tauri::generate_handler![
        app_info,
        list_models,
        download_model,
        cancel_download,
        delete_model,
        load_model,
        get_settings,
        update_settings,
        list_conversations,
        create_conversation,
        open_conversation,
        rename_conversation,
        delete_conversation,
        context_usage,
        send_message,
        stop_generation,
        regenerate,
    ])
}

/// Opens the chat core in the app's data directory (Tauri's path resolver: right on desktop,
/// Android and iOS), with bundled models from the app's resources.
fn open_core<R: Runtime>(app: &tauri::App<R>) -> std::result::Result<ChatCore, String> {
    let data_dir = match std::env::var_os(HOME_ENV).filter(|h| !h.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => app
            .path()
            .app_data_dir()
            .map_err(|e| format!("no app data directory: {e}"))?,
    };
    let config = CoreConfig::new(data_dir, assets_dir(app)).map_err(|e| e.to_string())?;
    ChatCore::open(config).map_err(|e| e.to_string())
}

/// `PTERIA_ASSETS`, else the bundle's resources, else the source tree's `assets/` (running
/// from a checkout with `cargo run -p pteria-app`).
fn assets_dir<R: Runtime>(app: &tauri::App<R>) -> PathBuf {
    if let Some(dir) = std::env::var_os(ASSETS_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Ok(res) = app.path().resource_dir() {
        let dir = res.join("assets");
        if dir.join("models").is_dir() {
            return dir;
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets")
}

#[cfg_attr(mobile, tauri::mobile_entry_point)]
pub fn run() {
    pteria::runtime::tune_allocator();
    let result = with_commands(tauri::Builder::default())
        .setup(|app| {
            let core = open_core(app)?;
            app.manage(core);
            Ok(())
        })
        .run(tauri::generate_context!());
    if let Err(e) = result {
        eprintln!("pteria-app: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests;
