//! The window's callbacks, each a few lines calling the chat core. The core reports long work
//! (replies, loads, downloads) on its worker threads; those events come back to the UI thread
//! through `Post` and land in the window's models.

use crate::view;
use crate::{AppWindow, MessageRow, VariantRow};
use pteria::chat::{
    ChatCore, ChatError, ChatEvent, DownloadEvent, LoadEvent, ReplyStarted, Settings,
};
use slint::{ComponentHandle, Model, ModelRc, VecModel, Weak};
use std::sync::Arc;

/// Runs a closure on the UI thread: `slint::invoke_from_event_loop` in the app; tests pass a
/// queue they drain themselves.
pub type Post = Arc<dyn Fn(Box<dyn FnOnce() + Send>) + Send + Sync>;

/// The app's `Post`.
pub fn event_loop_post() -> Post {
    Arc::new(|f| {
        // Fails only once the event loop is gone, when nothing is left to show.
        let _ = slint::invoke_from_event_loop(f);
    })
}

/// Fills the window from the core and connects every callback. `load_last` loads the last model
/// used (else the bundled demo) right away.
pub fn attach(ui: &AppWindow, core: ChatCore, post: Post, load_last: bool) {
    ui.set_messages(ModelRc::new(VecModel::<MessageRow>::default()));
    ui.set_variants(ModelRc::new(VecModel::<VariantRow>::default()));
    if let Some(w) = core.warnings().first() {
        ui.set_error(w.as_str().into());
    }
    show_settings(ui, &core.settings());
    refresh_conversations(ui, &core);
    refresh_models(ui, &core);
    show_model(ui, &core);
    if let Some(newest) = core.conversations().first() {
        open(ui, &core, &newest.id);
    }
    if load_last {
        start_load(ui, &core, &post, None);
    }

    let c = Ctx::new(ui, &core, &post);
    ui.on_send(move |text| c.with(|ui, core, post| send(ui, core, post, &text)));
    let c = Ctx::new(ui, &core, &post);
    ui.on_stop(move || {
        c.core.stop();
    });
    let c = Ctx::new(ui, &core, &post);
    ui.on_regenerate(move || {
        c.with(|ui, core, post| {
            let id = ui.get_current_conversation();
            let started = core.regenerate(&id, reply_events(ui, core, post, &id));
            reply_started(ui, core, started)
        })
    });
    let c = Ctx::new(ui, &core, &post);
    ui.on_new_conversation(move || {
        c.with(|ui, core, _| {
            let conv = core.create_conversation(None);
            conv.map(|conv| {
                refresh_conversations(ui, core);
                open(ui, core, &conv.id)
            })
        })
    });
    let c = Ctx::new(ui, &core, &post);
    ui.on_open_conversation(move |id| {
        c.with(|ui, core, _| {
            open(ui, core, &id);
            Ok(())
        })
    });
    let c = Ctx::new(ui, &core, &post);
    ui.on_delete_conversation(move |id| {
        c.with(|ui, core, _| {
            core.delete_conversation(&id)?;
            if ui.get_current_conversation() == id {
                ui.set_current_conversation("".into());
                edit(ui.get_messages(), |m| m.set_vec(Vec::new()));
            }
            refresh_conversations(ui, core);
            Ok(())
        })
    });
    let c = Ctx::new(ui, &core, &post);
    ui.on_download(move |spec| c.with(|ui, core, post| download(ui, core, post, &spec)));
    let c = Ctx::new(ui, &core, &post);
    ui.on_cancel_download(move |spec| {
        c.core.cancel_download(&spec);
    });
    let c = Ctx::new(ui, &core, &post);
    ui.on_delete_model(move |spec| {
        c.with(|ui, core, _| {
            let freed = core.delete_model(&spec)?;
            ui.set_models_status(
                format!("Deleted {spec}: {} freed", view::human_bytes(freed)).into(),
            );
            refresh_models(ui, core);
            show_model(ui, core);
            Ok(())
        })
    });
    let c = Ctx::new(ui, &core, &post);
    ui.on_load_model(move |spec| {
        c.with(|ui, core, post| {
            start_load(ui, core, post, Some(&spec));
            Ok(())
        })
    });
    let c = Ctx::new(ui, &core, &post);
    ui.on_save_settings(move || {
        c.with(|ui, core, _| {
            let saved = core.update_settings(read_settings(ui, &core.settings()));
            match saved {
                Ok(s) => {
                    show_settings(ui, &s);
                    ui.set_settings_status("Saved".into());
                }
                Err(e) => ui.set_settings_status(e.to_string().into()),
            }
            Ok(())
        })
    });
}

/// What every callback holds: the window (weakly: the window owns the callbacks), the core, and
/// the way back to the UI thread.
struct Ctx {
    ui: Weak<AppWindow>,
    core: ChatCore,
    post: Post,
}

impl Ctx {
    fn new(ui: &AppWindow, core: &ChatCore, post: &Post) -> Ctx {
        Ctx {
            ui: ui.as_weak(),
            core: core.clone(),
            post: post.clone(),
        }
    }

    /// Runs a callback's body; its error is shown above the message box.
    fn with(&self, f: impl FnOnce(&AppWindow, &ChatCore, &Post) -> Result<(), ChatError>) {
        if let Some(ui) = self.ui.upgrade() {
            ui.set_error("".into());
            if let Err(e) = f(&ui, &self.core, &self.post) {
                ui.set_error(e.to_string().into());
            }
        }
    }
}

fn send(ui: &AppWindow, core: &ChatCore, post: &Post, text: &str) -> Result<(), ChatError> {
    let mut id = ui.get_current_conversation().to_string();
    if id.is_empty() {
        id = core.create_conversation(None)?.id;
        ui.set_current_conversation(id.as_str().into());
    }
    let started = core.send(&id, text, reply_events(ui, core, post, &id))?;
    ui.set_draft("".into());
    reply_started(ui, core, Ok(started))
}

/// Shows the user's message and an empty reply that the stream fills.
fn reply_started(
    ui: &AppWindow,
    core: &ChatCore,
    started: Result<ReplyStarted, ChatError>,
) -> Result<(), ChatError> {
    let started = started?;
    edit(ui.get_messages(), |rows| {
        match &started.user_message {
            Some(m) => rows.push(view::message_row(m)),
            // A regeneration: the core dropped the replies after the last message of the user's.
            None => {
                while let Some(last) = rows.row_count().checked_sub(1) {
                    if rows.row_data(last).is_some_and(|r| r.user) {
                        break;
                    }
                    rows.remove(last);
                }
            }
        }
        rows.push(view::streaming_row(&started.assistant_id));
    });
    ui.set_replying(true);
    refresh_conversations(ui, core);
    Ok(())
}

/// The reply stream's handler: each event is applied to the window on the UI thread. Text
/// arrives as the whole reply so far: a conversation reopened mid-reply starts from the core's
/// copy, and pieces queued before that must not show twice.
fn reply_events(
    ui: &AppWindow,
    core: &ChatCore,
    post: &Post,
    conversation_id: &str,
) -> impl FnMut(ChatEvent) + Send + 'static {
    let ui = ui.as_weak();
    let core = core.clone();
    let post = post.clone();
    let conversation_id = conversation_id.to_string();
    let mut so_far = String::new();
    move |event| {
        if let ChatEvent::Delta { text } = &event {
            so_far.push_str(text);
        }
        let (ui, core, id, so_far) = (
            ui.clone(),
            core.clone(),
            conversation_id.clone(),
            so_far.clone(),
        );
        post(Box::new(move || {
            if let Some(ui) = ui.upgrade() {
                apply_reply_event(&ui, &core, &id, event, &so_far);
            }
        }))
    }
}

fn apply_reply_event(
    ui: &AppWindow,
    core: &ChatCore,
    conversation_id: &str,
    event: ChatEvent,
    so_far: &str,
) {
    let over = matches!(event, ChatEvent::Finished { .. } | ChatEvent::Failed { .. });
    if over {
        // Whatever the window shows now (another conversation, a new chat, none), the reply is
        // over and Send comes back.
        ui.set_replying(false);
        // The saved reply changes the conversation's message count in the sidebar.
        refresh_conversations(ui, core);
    }
    if matches!(event, ChatEvent::Failed { .. }) {
        // A failure can take the model down with it (a panic in the engine).
        show_model(ui, core);
        refresh_models(ui, core);
    }
    if ui.get_current_conversation() != conversation_id {
        return; // Another conversation is open; the core saves the reply anyway.
    }
    if over {
        // The saved conversation is the truth once a reply is done: a regeneration that failed
        // or stopped before any text keeps the old reply.
        open(ui, core, conversation_id);
        return;
    }
    let rows = ui.get_messages();
    let last = rows.row_count().saturating_sub(1);
    let Some(mut row) = rows.row_data(last).filter(|r| r.streaming) else {
        return;
    };
    match event {
        ChatEvent::Prefill { done, total } => {
            row.stats = format!("reading the prompt: {done} of {total} tokens").into();
        }
        // The text only grows: a shorter one is a piece the row already has from the core.
        ChatEvent::Delta { .. } if so_far.len() >= row.text.len() => {
            row.text = so_far.into();
            row.blocks = view::blocks(so_far);
            row.stats = "".into();
        }
        _ => return,
    }
    rows.set_row_data(last, row);
}

fn open(ui: &AppWindow, core: &ChatCore, id: &str) {
    match core.conversation(id) {
        Ok(c) => {
            ui.set_current_conversation(c.id.as_str().into());
            let mut rows: Vec<_> = c.messages.iter().map(view::message_row).collect();
            // A reply still being written for it: the messages it follows, then its text so far.
            if let Some(p) = core.reply_in_progress().filter(|p| p.conversation_id == id) {
                rows.truncate(p.follows);
                rows.push(MessageRow {
                    text: p.text.as_str().into(),
                    blocks: view::blocks(&p.text),
                    ..view::streaming_row(&p.assistant_id)
                });
            }
            edit(ui.get_messages(), |m| m.set_vec(rows));
            show_context_usage(ui, core);
        }
        Err(e) => ui.set_error(e.to_string().into()),
    }
}

/// The open conversation's context use, against the loaded model's context when one is loaded.
fn show_context_usage(ui: &AppWindow, core: &ChatCore) {
    let usage = core
        .context_usage(&ui.get_current_conversation())
        .ok()
        .flatten();
    ui.set_context_usage(
        usage
            .map(|u| context_text(u.used_tokens, u.context_tokens))
            .unwrap_or_default()
            .into(),
    );
}

fn context_text(used: usize, context: usize) -> String {
    format!("context {used} / {context} tokens")
}

fn start_load(ui: &AppWindow, core: &ChatCore, post: &Post, spec: Option<&str>) {
    let weak = ui.as_weak();
    let post = post.clone();
    let core2 = core.clone();
    let started = core.load_model(spec, move |event| {
        let weak = weak.clone();
        let core = core2.clone();
        post(Box::new(move || {
            if let Some(ui) = weak.upgrade() {
                match event {
                    LoadEvent::Loading { spec } => {
                        ui.set_model_status(format!("Loading {spec}…").into())
                    }
                    LoadEvent::Loaded { .. } => {
                        show_model(&ui, &core);
                        show_context_usage(&ui, &core);
                    }
                    LoadEvent::Failed { spec, error } => {
                        ui.set_model_status(format!("{spec} failed to load: {error}").into())
                    }
                }
                refresh_models(&ui, &core);
            }
        }))
    });
    if let Err(e) = started {
        ui.set_model_status(e.to_string().into());
    }
}

fn show_model(ui: &AppWindow, core: &ChatCore) {
    let loaded = core.loaded_model();
    ui.set_model_loaded(loaded.is_some());
    let status = match loaded {
        Some(m) => {
            let mut s = format!(
                "{} · {:?} · {} tokens of context",
                m.name, m.device, m.context_tokens
            );
            if let Some(note) = m.note {
                s.push_str(&format!(" ({note})"));
            }
            s
        }
        None => "No model loaded: pick one under Models".to_string(),
    };
    ui.set_model_status(status.into());
}

fn download(ui: &AppWindow, core: &ChatCore, post: &Post, spec: &str) -> Result<(), ChatError> {
    let weak = ui.as_weak();
    let post = post.clone();
    let core2 = core.clone();
    core.download(spec, move |event| {
        let weak = weak.clone();
        let core = core2.clone();
        post(Box::new(move || {
            if let Some(ui) = weak.upgrade() {
                apply_download_event(&ui, &core, event);
            }
        }))
    })?;
    refresh_models(ui, core);
    Ok(())
}

fn apply_download_event(ui: &AppWindow, core: &ChatCore, event: DownloadEvent) {
    match event {
        DownloadEvent::Progress {
            spec, done, total, ..
        } => {
            let rows = ui.get_variants();
            for i in 0..rows.row_count() {
                if let Some(row) = rows.row_data(i).filter(|r| r.spec.as_str() == spec) {
                    rows.set_row_data(i, view::with_progress(&row, done, total));
                }
            }
        }
        DownloadEvent::Finished { spec, bytes } => {
            ui.set_models_status(
                format!("Downloaded {spec} ({})", view::human_bytes(bytes)).into(),
            );
            refresh_models(ui, core);
        }
        DownloadEvent::Failed {
            spec,
            error,
            cancelled,
        } => {
            let status = if cancelled {
                format!("Cancelled {spec}; downloading again resumes it")
            } else {
                format!("{spec}: {error}")
            };
            ui.set_models_status(status.into());
            refresh_models(ui, core);
        }
    }
}

fn refresh_models(ui: &AppWindow, core: &ChatCore) {
    match core.models() {
        Ok(models) => edit(ui.get_variants(), |m| {
            m.set_vec(view::variant_rows(&models))
        }),
        Err(e) => ui.set_models_status(e.to_string().into()),
    }
}

fn refresh_conversations(ui: &AppWindow, core: &ChatCore) {
    let rows: Vec<_> = core
        .conversations()
        .iter()
        .map(view::conversation_row)
        .collect();
    ui.set_conversations(ModelRc::new(VecModel::from(rows)));
}

fn show_settings(ui: &AppWindow, s: &Settings) {
    ui.set_system_prompt(s.system_prompt.as_str().into());
    ui.set_temperature(s.temperature);
    ui.set_top_p(s.top_p);
    ui.set_top_k(i32::try_from(s.top_k).unwrap_or(i32::MAX));
    ui.set_min_p(s.min_p);
    ui.set_max_tokens(
        s.max_tokens
            .map_or(0, |n| i32::try_from(n).unwrap_or(i32::MAX)),
    );
    ui.set_thinking(s.thinking);
    ui.set_device(view::device_index(s.device));
    ui.set_tables(view::tables_index(s.tables));
}

fn read_settings(ui: &AppWindow, current: &Settings) -> Settings {
    Settings {
        system_prompt: ui.get_system_prompt().to_string(),
        temperature: ui.get_temperature(),
        top_p: ui.get_top_p(),
        top_k: usize::try_from(ui.get_top_k()).unwrap_or(0),
        min_p: ui.get_min_p(),
        max_tokens: usize::try_from(ui.get_max_tokens()).ok().filter(|&n| n > 0),
        thinking: ui.get_thinking(),
        device: view::device_choice(ui.get_device()),
        tables: view::tables_choice(ui.get_tables()),
        ..current.clone()
    }
}

/// Edits a list the window shows; `attach` made each one a `VecModel`.
fn edit<T: Clone + 'static>(model: ModelRc<T>, f: impl FnOnce(&VecModel<T>)) {
    if let Some(m) = model.as_any().downcast_ref::<VecModel<T>>() {
        f(m);
    }
}
