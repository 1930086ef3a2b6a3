//! The chat core as a shell drives it, on real files in temporary data directories: the tiny
//! Llama fixture run by our CPU runtime as a bundled model and as a model downloaded from a
//! loopback hub, conversations and settings persisted and restored, streaming, stop, regenerate.

mod common;
#[allow(dead_code)]
#[path = "downloads/hub.rs"]
mod hub;
#[allow(dead_code)]
#[path = "support/tiny_chat.rs"]
mod tiny_chat;

use common::fixtures;
use hub::{Fault, Hub};
use pteria::catalog::Catalog;
use pteria::chat::{
    Author, ChatCore, ChatError, ChatEvent, Conversation, CoreConfig, DeviceChoice, DownloadEvent,
    LoadEvent, Settings, StoredMessage, TablesChoice, VariantState,
};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;
use tiny_chat::{tokenizer_config, tokenizer_json, CATALOG, PROGRAM as LLAMA, REMOTE, REPO, REV};

const TIMEOUT: Duration = Duration::from_secs(120);

struct Setup {
    dir: tempfile::TempDir,
    hub: Hub,
    config: CoreConfig,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let hub = Hub::start();
        for (path, bytes, lfs) in tiny_chat::remote_files(&fixtures()) {
            hub.add_file(REPO, REV, path, bytes, lfs);
        }
        let config = tiny_chat::config(dir.path(), &fixtures(), hub.endpoint());
        Setup { dir, hub, config }
    }

    fn config(&self) -> CoreConfig {
        self.config.clone()
    }

    /// A core with greedy, short replies on the CPU.
    fn open(&self) -> ChatCore {
        let core = ChatCore::open(self.config()).unwrap();
        core.update_settings(Settings {
            temperature: 0.0,
            max_tokens: Some(6),
            device: DeviceChoice::Cpu,
            ..Settings::default()
        })
        .unwrap();
        core
    }
}

fn load(core: &ChatCore, spec: Option<&str>) -> Vec<LoadEvent> {
    let (tx, rx) = mpsc::channel();
    core.load_model(spec, move |e| tx.send(e).unwrap()).unwrap();
    let events: Vec<LoadEvent> = rx.iter().collect();
    assert!(
        matches!(events.last(), Some(LoadEvent::Loaded { .. })),
        "{events:?}"
    );
    events
}

/// Events until the final one.
fn collect(rx: &mpsc::Receiver<ChatEvent>) -> Vec<ChatEvent> {
    let mut out = Vec::new();
    loop {
        let e = rx.recv_timeout(TIMEOUT).expect("the reply never finished");
        let last = matches!(e, ChatEvent::Finished { .. } | ChatEvent::Failed { .. });
        out.push(e);
        if last {
            return out;
        }
    }
}

fn deltas(events: &[ChatEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ChatEvent::Delta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn send(core: &ChatCore, id: &str, text: &str) -> Vec<ChatEvent> {
    let (tx, rx) = mpsc::channel();
    core.send(id, text, move |e| {
        let _ = tx.send(e);
    })
    .unwrap();
    collect(&rx)
}

#[test]
fn a_reply_streams_is_saved_and_the_conversation_is_restored_on_the_next_start() {
    let s = Setup::new();
    let core = s.open();
    let events = load(&core, None);
    let LoadEvent::Loaded { model } = &events[1] else {
        panic!("{events:?}")
    };
    assert_eq!(
        (model.spec.as_str(), model.context_tokens),
        ("tiny:portable-fp32", 32)
    );
    assert_eq!(core.loaded_model().unwrap().spec, "tiny:portable-fp32");

    let c = core.create_conversation(None).unwrap();
    let (tx, rx) = mpsc::channel();
    let started = core
        .send(&c.id, "hi", move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    assert_eq!(
        started.title, "hi",
        "the first message names the conversation"
    );
    assert_eq!(started.user_message.as_ref().unwrap().content, "hi");
    let events = collect(&rx);
    assert!(matches!(events[0], ChatEvent::Prefill { .. }), "{events:?}");
    let ChatEvent::Finished { message, usage } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    let streamed = deltas(&events);
    assert!(!streamed.is_empty());
    assert_eq!(message.content, streamed);
    assert_eq!(message.id, started.assistant_id);
    let stats = message.stats.as_ref().unwrap();
    // "hi" costs 2 + 3 tokens and the generation prompt 2; greedy for 6 tokens.
    assert_eq!((stats.prompt_tokens, stats.generated_tokens), (7, 6));
    assert_eq!(stats.stop, "max tokens");
    assert!(stats.ttft_ms.is_some_and(|t| t > 0.0));
    assert!(stats.decode_tokens_per_s > 0.0);
    assert_eq!(
        (usage.used_tokens, usage.context_tokens),
        (13, 32),
        "prompt + reply of a 32-token context"
    );
    assert_eq!(core.context_usage(&c.id).unwrap(), Some(*usage));
    assert!(!core.is_replying());

    // A fresh core on the same data directory: settings, the conversation and the model
    // choice come back from disk.
    drop(core);
    let again = ChatCore::open(s.config()).unwrap();
    assert!(again.warnings().is_empty(), "{:?}", again.warnings());
    assert_eq!(again.settings().temperature, 0.0);
    assert_eq!(
        again.settings().model.as_deref(),
        Some("tiny:portable-fp32")
    );
    let list = again.conversations();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].title.as_str(), list[0].message_count), ("hi", 2));
    let restored = again.conversation(&c.id).unwrap();
    assert_eq!(restored.messages[0].author, Author::User);
    assert_eq!(&restored.messages[1], message);

    // The same greedy question in a new conversation gets the same reply.
    load(&again, None);
    let c2 = again.create_conversation(Some("second")).unwrap();
    let events = send(&again, &c2.id, "hi");
    let ChatEvent::Finished { message: m2, .. } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert_eq!(m2.content, message.content);
    assert_eq!(again.conversation(&c2.id).unwrap().title, "second");
}

#[test]
fn stop_ends_the_reply_and_what_was_written_is_saved() {
    let s = Setup::new();
    let core = s.open();
    core.update_settings(Settings {
        max_tokens: None,
        ..core.settings()
    })
    .unwrap();
    load(&core, None);
    let c = core.create_conversation(None).unwrap();
    let (tx, rx) = mpsc::channel();
    let stopper = core.clone();
    core.send(&c.id, "hi", move |e| {
        // Stop as soon as the first text arrives: from the engine's thread, as a UI would.
        if matches!(e, ChatEvent::Delta { .. }) {
            stopper.stop();
        }
        let _ = tx.send(e);
    })
    .unwrap();
    let events = collect(&rx);
    let ChatEvent::Finished { message, .. } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert!(message.stopped);
    let stats = message.stats.as_ref().unwrap();
    assert_eq!(stats.stop, "cancelled");
    // Without the stop, the never-ending fixture would fill the 25 positions left.
    assert!(stats.generated_tokens < 5, "{stats:?}");
    assert_eq!(message.content, deltas(&events));
    let saved = core.conversation(&c.id).unwrap();
    assert_eq!(saved.messages.last().unwrap(), message);
    assert!(!core.stop(), "nothing left to stop");
}

#[test]
fn regenerate_replaces_the_last_reply() {
    let s = Setup::new();
    let core = s.open();
    load(&core, None);
    let c = core.create_conversation(None).unwrap();
    let first = send(&core, &c.id, "hi");
    let ChatEvent::Finished { message: m1, .. } = first.last().unwrap() else {
        panic!("{first:?}")
    };
    let (tx, rx) = mpsc::channel();
    let started = core
        .regenerate(&c.id, move |e| {
            let _ = tx.send(e);
        })
        .unwrap();
    assert!(started.user_message.is_none());
    let events = collect(&rx);
    let ChatEvent::Finished { message: m2, .. } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert_ne!(m1.id, m2.id);
    // Greedy: the same prompt gets the same text again.
    assert_eq!(m1.content, m2.content);
    let saved = core.conversation(&c.id).unwrap();
    assert_eq!(saved.messages.len(), 2);
    assert_eq!(saved.messages[1].id, m2.id);

    let empty = core.create_conversation(None).unwrap();
    assert!(matches!(
        core.regenerate(&empty.id, |_| {}),
        Err(ChatError::NothingToRegenerate)
    ));
}

#[test]
fn replies_need_a_loaded_model_and_one_at_a_time() {
    let s = Setup::new();
    let core = s.open();
    let c = core.create_conversation(None).unwrap();
    assert!(matches!(
        core.send(&c.id, "hi", |_| {}),
        Err(ChatError::NoModel)
    ));
    load(&core, None);
    assert!(matches!(
        core.send(&c.id, "  ", |_| {}),
        Err(ChatError::EmptyMessage)
    ));
    assert!(matches!(
        core.send("0-nope", "hi", |_| {}),
        Err(ChatError::NoConversation { .. })
    ));
    // A reply held open by its callback: a second send is refused until it finishes.
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let (tx, rx) = mpsc::channel();
    core.send(&c.id, "hi", move |e| {
        if matches!(e, ChatEvent::Prefill { .. }) {
            let _ = gate_rx.recv_timeout(TIMEOUT);
        }
        let _ = tx.send(e);
    })
    .unwrap();
    assert!(core.is_replying());
    assert!(matches!(
        core.send(&c.id, "again", |_| {}),
        Err(ChatError::ReplyRunning)
    ));
    assert!(matches!(
        core.load_model(None, |_| {}),
        Err(ChatError::ReplyRunning)
    ));
    drop(gate_tx);
    collect(&rx);
    assert!(!core.is_replying());
}

#[test]
fn conversations_are_created_renamed_listed_and_deleted_on_disk() {
    let s = Setup::new();
    let core = s.open();
    let a = core.create_conversation(Some("alpha")).unwrap();
    let b = core.create_conversation(None).unwrap();
    assert_eq!(b.title, "New chat");
    let renamed = core.rename_conversation(&b.id, "  beta  ").unwrap();
    assert_eq!(renamed.title, "beta");
    assert!(core.rename_conversation(&b.id, " ").is_err());
    let titles: Vec<String> = core.conversations().into_iter().map(|c| c.title).collect();
    assert_eq!(titles, ["beta", "alpha"], "newest change first");
    let file = s
        .dir
        .path()
        .join("data/conversations")
        .join(format!("{}.json", a.id));
    assert!(file.is_file());
    core.delete_conversation(&a.id).unwrap();
    assert!(!file.exists());
    assert!(matches!(
        core.conversation(&a.id),
        Err(ChatError::NoConversation { .. })
    ));
    let reopened = ChatCore::open(s.config()).unwrap();
    let titles: Vec<String> = reopened
        .conversations()
        .into_iter()
        .map(|c| c.title)
        .collect();
    assert_eq!(titles, ["beta"]);
}

#[test]
fn settings_are_validated_and_persisted() {
    let s = Setup::new();
    let core = s.open();
    let wanted = Settings {
        system_prompt: "Be terse.".into(),
        temperature: 0.3,
        top_p: 0.8,
        top_k: 20,
        min_p: 0.1,
        max_tokens: Some(99),
        thinking: true,
        device: DeviceChoice::Gpu,
        tables: TablesChoice::Gpu,
        model: Some("ignored:here".into()),
    };
    let saved = core.update_settings(wanted.clone()).unwrap();
    assert_eq!(saved.model, None, "the model changes only by loading one");
    let bad = Settings {
        top_p: 0.0,
        ..wanted.clone()
    };
    let e = core.update_settings(bad).unwrap_err().to_string();
    assert!(e.contains("top_p"), "{e}");
    let bad = Settings {
        device: DeviceChoice::Cpu,
        ..wanted.clone()
    };
    let e = core.update_settings(bad).unwrap_err().to_string();
    assert!(e.contains("tables"), "{e}");
    let reopened = ChatCore::open(s.config()).unwrap();
    assert_eq!(
        reopened.settings(),
        Settings {
            model: None,
            ..wanted
        }
    );

    // A damaged settings file is set aside and reported, and the app still starts.
    let path = s.dir.path().join("data/settings.json");
    std::fs::write(&path, "{ not json").unwrap();
    let core = ChatCore::open(s.config()).unwrap();
    assert_eq!(core.settings(), Settings::default());
    assert_eq!(core.warnings().len(), 1, "{:?}", core.warnings());
    assert!(s.dir.path().join("data/settings.json.damaged").is_file());
}

fn state_of(core: &ChatCore, spec: &str) -> VariantState {
    let models = core.models().unwrap();
    models
        .iter()
        .flat_map(|m| &m.variants)
        .find(|v| v.spec == spec)
        .unwrap()
        .state
        .clone()
}

fn download(core: &ChatCore, spec: &str) -> (Vec<DownloadEvent>, mpsc::Receiver<DownloadEvent>) {
    let (tx, rx) = mpsc::channel();
    core.download(spec, move |e| {
        let _ = tx.send(e);
    })
    .unwrap();
    (Vec::new(), rx)
}

fn until_final(
    rx: &mpsc::Receiver<DownloadEvent>,
    mut seen: Vec<DownloadEvent>,
) -> Vec<DownloadEvent> {
    loop {
        let e = rx.recv_timeout(TIMEOUT).expect("download never finished");
        let last = !matches!(e, DownloadEvent::Progress { .. });
        seen.push(e);
        if last {
            return seen;
        }
    }
}

#[test]
fn the_model_list_shows_bundled_fit_default_and_download_state() {
    let s = Setup::new();
    let core = s.open();
    let models = core.models().unwrap();
    assert_eq!(models.len(), 2);
    let tiny = &models[0];
    assert!(tiny.bundled);
    let v = &tiny.variants[0];
    assert_eq!(v.state, VariantState::Bundled);
    assert_eq!((v.backend, v.gpu), ("portable", false));
    assert!(v.platform_default);
    // The real file size replaces the catalog's estimate once the file is there.
    assert_eq!(
        v.bytes,
        std::fs::metadata(fixtures().join(LLAMA)).unwrap().len()
    );
    assert_eq!(v.fit.light, "green");
    assert!(v.fit.summary.contains("available"), "{}", v.fit.summary);
    assert_eq!(models[1].variants[0].state, VariantState::Remote);

    // A bundled model whose files are missing is marked so, and cannot load.
    std::fs::remove_file(s.dir.path().join("assets/models/tiny/model.pte")).unwrap();
    assert_eq!(
        state_of(&core, "tiny:portable-fp32"),
        VariantState::BundledMissing
    );
    let e = core.load_model(Some("tiny"), |_| {}).unwrap_err();
    assert!(matches!(e, ChatError::NotAvailable { .. }), "{e}");
    assert!(matches!(
        core.download("tiny:portable-fp32", |_| {}),
        Err(ChatError::Bundled { .. })
    ));
}

#[test]
fn a_model_is_downloaded_with_progress_cancelled_resumed_loaded_and_deleted() {
    let s = Setup::new();
    let core = s.open();
    let spec = "remote:cpu-fp32";
    assert!(matches!(
        core.load_model(Some(spec), |_| {}),
        Err(ChatError::NotAvailable { .. })
    ));
    assert!(matches!(
        core.download("remote", |_| {}),
        Err(ChatError::VariantRequired { .. })
    ));

    // A slow first try, cancelled once bytes arrive: the partial file stays.
    s.hub.fail_next_get(
        "cpu/model.pte",
        Fault::Trickle {
            chunk: 4096,
            every: Duration::from_millis(20),
        },
    );
    let (mut seen, rx) = download(&core, spec);
    assert!(matches!(
        core.download(spec, |_| {}),
        Err(ChatError::AlreadyDownloading { .. })
    ));
    loop {
        let e = rx.recv_timeout(TIMEOUT).unwrap();
        let started = matches!(&e, DownloadEvent::Progress { done, .. } if *done > 8192);
        seen.push(e);
        if started {
            break;
        }
    }
    assert!(matches!(
        state_of(&core, spec),
        VariantState::Downloading { .. }
    ));
    assert!(core.cancel_download(spec));
    let events = until_final(&rx, seen);
    let DownloadEvent::Failed { cancelled, .. } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert!(cancelled);
    assert!(matches!(
        state_of(&core, spec),
        VariantState::Partial { bytes } if bytes > 0
    ));
    assert!(!core.cancel_download(spec));

    // The second try resumes and finishes; progress ends at the total.
    let (seen, rx) = download(&core, spec);
    let events = until_final(&rx, seen);
    let program = std::fs::metadata(fixtures().join(LLAMA)).unwrap().len();
    let total = program + tokenizer_json().len() as u64 + tokenizer_config().len() as u64;
    let DownloadEvent::Finished { bytes, .. } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert_eq!(*bytes, total);
    let last_progress = events.iter().rev().find_map(|e| match e {
        DownloadEvent::Progress { done, total, .. } => Some((*done, *total)),
        _ => None,
    });
    assert_eq!(last_progress, Some((total, total)));
    let resumed = s
        .hub
        .requests_for("cpu/model.pte")
        .iter()
        .filter_map(|r| r.range_start())
        .max();
    assert!(resumed.is_some_and(|r| r > 0), "no ranged resume request");
    assert_eq!(state_of(&core, spec), VariantState::Downloaded);

    // Loaded from the cache and chatted with; then deleted, which unloads it.
    load(&core, Some("remote"));
    assert_eq!(core.loaded_model().unwrap().spec, spec);
    let c = core.create_conversation(None).unwrap();
    let events = send(&core, &c.id, "hi");
    assert!(matches!(events.last(), Some(ChatEvent::Finished { .. })));
    let freed = core.delete_model(spec).unwrap();
    assert_eq!(freed, total);
    assert!(core.loaded_model().is_none());
    assert_eq!(state_of(&core, spec), VariantState::Remote);
    assert!(matches!(
        core.send(&c.id, "hi", |_| {}),
        Err(ChatError::NoModel)
    ));
}

/// The app downloads one variant of a model at a time: variants share files, and the model's
/// download lock is one per model. Asking for a second says which one runs, not that some other
/// process does.
#[test]
fn a_second_variant_of_a_downloading_model_is_refused_naming_the_running_one() {
    let s = Setup::new();
    let mut config = s.config();
    let other = "remote:cpu-fp16";
    config.catalog = Catalog::from_toml(&format!(
        "{CATALOG}
[[model.variant]]
id = \"cpu-fp16\"
backend = \"portable\"
quantization = \"fp16\"
file = \"cpu16/model.pte\"
approx_bytes = 250000
"
    ))
    .unwrap();
    let core = ChatCore::open(config).unwrap();
    s.hub.fail_next_get(
        "cpu/model.pte",
        Fault::Trickle {
            chunk: 4096,
            every: Duration::from_millis(20),
        },
    );
    let (mut seen, rx) = download(&core, REMOTE);
    loop {
        let e = rx.recv_timeout(TIMEOUT).unwrap();
        let started = matches!(&e, DownloadEvent::Progress { done, .. } if *done > 0);
        seen.push(e);
        if started {
            break;
        }
    }
    let wanted = format!("another variant of this model is downloading: `{REMOTE}`");
    for e in [
        core.download(other, |_| {}).unwrap_err(),
        core.delete_model(other).unwrap_err(),
    ] {
        assert!(
            matches!(e, ChatError::OtherVariantDownloading { .. }),
            "{e}"
        );
        assert!(e.to_string().contains(&wanted), "{e}");
    }

    assert!(core.cancel_download(REMOTE));
    until_final(&rx, seen);
    // Once that download stopped, the other variant's starts (the hub lacks its program).
    let (seen, rx) = download(&core, other);
    let events = until_final(&rx, seen);
    let Some(DownloadEvent::Failed { error, .. }) = events.last() else {
        panic!("{events:?}")
    };
    assert!(error.contains("404 Not Found"), "{error}");
}

#[test]
fn a_failed_load_reports_why_and_leaves_no_model() {
    let s = Setup::new();
    let core = s.open();
    load(&core, None);
    // A damaged program where the bundled one was.
    let program = s.dir.path().join("assets/models/tiny/model.pte");
    std::fs::write(&program, b"not a program").unwrap();
    let (tx, rx) = mpsc::channel();
    core.load_model(Some("tiny"), move |e| tx.send(e).unwrap())
        .unwrap();
    let events: Vec<LoadEvent> = rx.iter().collect();
    let Some(LoadEvent::Failed { error, .. }) = events.last() else {
        panic!("{events:?}")
    };
    assert!(error.contains("model.pte"), "{error}");
    assert!(core.loaded_model().is_none());
}

#[test]
fn the_data_directory_is_only_written_atomically() {
    let s = Setup::new();
    let core = s.open();
    let c = core.create_conversation(None).unwrap();
    core.rename_conversation(&c.id, "x").unwrap();
    let names: Vec<String> = walk(&s.dir.path().join("data"));
    assert!(
        names.iter().all(|n| !n.ends_with(".tmp")),
        "temporary files left: {names:?}"
    );
    assert!(names.iter().any(|n| n.ends_with("settings.json")));
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

/// The conversation as its file on disk holds it, read directly (what a crash would leave).
fn on_disk(s: &Setup, id: &str) -> Vec<StoredMessage> {
    let file = s
        .dir
        .path()
        .join("data/conversations")
        .join(format!("{id}.json"));
    let c: Conversation = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    c.messages
}

/// Starts a regeneration whose callback runs `at_prefill` on its first prefill event.
fn regenerate_with(
    core: &ChatCore,
    id: &str,
    mut at_prefill: impl FnMut() + Send + 'static,
    mut each: impl FnMut(&ChatEvent) + Send + 'static,
) -> mpsc::Receiver<ChatEvent> {
    let (tx, rx) = mpsc::channel();
    let mut first = true;
    core.regenerate(id, move |e| {
        if first && matches!(e, ChatEvent::Prefill { .. }) {
            first = false;
            at_prefill();
        }
        each(&e);
        let _ = tx.send(e);
    })
    .unwrap();
    rx
}

#[test]
fn regenerating_keeps_the_saved_reply_until_a_new_one_replaces_it() {
    let s = Setup::new();
    let core = s.open();
    load(&core, None);
    let c = core.create_conversation(None).unwrap();
    let first = send(&core, &c.id, "hi");
    let ChatEvent::Finished { message: m1, .. } = first.last().unwrap() else {
        panic!("{first:?}")
    };
    let saved = on_disk(&s, &c.id);
    assert_eq!(saved.len(), 2);

    // Mid-regeneration (held at its first event) the file still holds the old reply: a crash
    // or a closed window here loses nothing.
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let rx = regenerate_with(
        &core,
        &c.id,
        move || {
            let _ = gate_rx.recv_timeout(TIMEOUT);
        },
        |_| {},
    );
    assert_eq!(on_disk(&s, &c.id), saved);
    assert_eq!(core.conversation(&c.id).unwrap().messages, saved);
    let progress = core.reply_in_progress().unwrap();
    assert_eq!(
        (progress.conversation_id.as_str(), progress.follows),
        (c.id.as_str(), 1)
    );
    drop(gate_tx);
    let events = collect(&rx);
    let ChatEvent::Finished { message: m2, .. } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert_ne!(m2.id, m1.id);
    assert_eq!(on_disk(&s, &c.id), [saved[0].clone(), m2.clone()]);
    assert!(core.reply_in_progress().is_none());

    // Stopped before any text: the old reply stays, on disk and as the reply reported.
    let stopper = core.clone();
    let rx = regenerate_with(
        &core,
        &c.id,
        move || {
            stopper.stop();
        },
        |_| {},
    );
    let events = collect(&rx);
    assert_eq!(deltas(&events), "", "{events:?}");
    let ChatEvent::Finished { message, .. } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert_eq!(message, m2, "the reply kept is reported");
    assert_eq!(on_disk(&s, &c.id), [saved[0].clone(), m2.clone()]);

    // Failed (the shell's callback panics on the first text, which takes the model down): the
    // old reply stays and the failure is saved after it, never in its place.
    let rx = regenerate_with(
        &core,
        &c.id,
        || {},
        |e| {
            if matches!(e, ChatEvent::Delta { .. }) {
                panic!("a shell bug while showing the reply");
            }
        },
    );
    let events = collect(&rx);
    let ChatEvent::Failed {
        message: failed, ..
    } = events.last().unwrap()
    else {
        panic!("{events:?}")
    };
    let after = on_disk(&s, &c.id);
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(after[..2], [saved[0].clone(), m2.clone()]);
    assert_eq!(&after[2], failed);
    assert!(failed.error.is_some());

    // A regeneration that succeeds replaces both the old reply and the failure.
    load(&core, None);
    let rx = regenerate_with(&core, &c.id, || {}, |_| {});
    let events = collect(&rx);
    let ChatEvent::Finished { message: m3, .. } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert_eq!(on_disk(&s, &c.id), [saved[0].clone(), m3.clone()]);
}

#[test]
fn a_panic_while_writing_a_reply_unloads_the_model_in_the_core_too() {
    let s = Setup::new();
    let core = s.open();
    load(&core, None);
    let c = core.create_conversation(None).unwrap();
    let (tx, rx) = mpsc::channel();
    core.send(&c.id, "hi", move |e| {
        if matches!(e, ChatEvent::Delta { .. }) {
            panic!("a shell bug while showing the reply");
        }
        let _ = tx.send(e);
    })
    .unwrap();
    let events = collect(&rx);
    let ChatEvent::Failed { error, message } = events.last().unwrap() else {
        panic!("{events:?}")
    };
    assert!(error.contains("internal error"), "{error}");
    // The failed reply keeps the text it had: the delta the shell panicked on.
    assert!(!message.content.is_empty(), "{message:?}");
    assert_eq!(on_disk(&s, &c.id).last(), Some(message));
    // The engine dropped the model: the core says so, and the next message asks for a model
    // instead of failing in the engine.
    assert_eq!(core.loaded_model(), None);
    assert!(core
        .models()
        .unwrap()
        .iter()
        .flat_map(|m| &m.variants)
        .all(|v| !v.loaded));
    assert!(matches!(
        core.send(&c.id, "again", |_| {}),
        Err(ChatError::NoModel)
    ));
    // Loading it again makes replies work again.
    load(&core, None);
    let events = send(&core, &c.id, "again");
    assert!(
        matches!(events.last(), Some(ChatEvent::Finished { .. })),
        "{events:?}"
    );
}

/// Downloads the hub's model and waits for it.
fn download_remote(core: &ChatCore) {
    let (seen, rx) = download(core, tiny_chat::REMOTE);
    let events = until_final(&rx, seen);
    assert!(
        matches!(events.last(), Some(DownloadEvent::Finished { .. })),
        "{events:?}"
    );
}

/// Starts loading `spec`, held after its `Loading` event until the returned sender is dropped.
fn held_load(core: &ChatCore, spec: &str) -> (mpsc::Sender<()>, mpsc::Receiver<LoadEvent>) {
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let (tx, rx) = mpsc::channel();
    core.load_model(Some(spec), move |e| {
        let hold = matches!(e, LoadEvent::Loading { .. });
        let _ = tx.send(e);
        if hold {
            let _ = gate_rx.recv_timeout(TIMEOUT);
        }
    })
    .unwrap();
    (gate_tx, rx)
}

#[test]
fn a_model_is_not_deleted_while_a_load_involves_it() {
    let s = Setup::new();
    let core = s.open();
    let remote = tiny_chat::REMOTE;
    download_remote(&core);

    // The model being loaded: its files stay under the loader.
    let (gate, rx) = held_load(&core, remote);
    assert!(matches!(
        rx.recv_timeout(TIMEOUT),
        Ok(LoadEvent::Loading { .. })
    ));
    let e = core.delete_model(remote).unwrap_err();
    assert!(matches!(e, ChatError::Loading), "{e}");
    assert_eq!(state_of(&core, remote), VariantState::Downloaded);
    drop(gate);
    let events: Vec<LoadEvent> = rx.iter().collect();
    assert!(
        matches!(events.last(), Some(LoadEvent::Loaded { .. })),
        "{events:?}"
    );

    // The loaded model while another loads: the engine frees it for the new one, and the core
    // must not unload (behind the load) the model that load brings.
    let (gate, rx) = held_load(&core, tiny_chat::BUNDLED);
    assert!(matches!(
        rx.recv_timeout(TIMEOUT),
        Ok(LoadEvent::Loading { .. })
    ));
    let e = core.delete_model(remote).unwrap_err();
    assert!(matches!(e, ChatError::Loading), "{e}");
    drop(gate);
    let events: Vec<LoadEvent> = rx.iter().collect();
    assert!(
        matches!(events.last(), Some(LoadEvent::Loaded { .. })),
        "{events:?}"
    );
    assert_eq!(core.loaded_model().unwrap().spec, tiny_chat::BUNDLED);
    let c = core.create_conversation(None).unwrap();
    let events = send(&core, &c.id, "hi");
    assert!(
        matches!(events.last(), Some(ChatEvent::Finished { .. })),
        "{events:?}"
    );
    // Once no load runs, it is deleted.
    assert!(core.delete_model(remote).unwrap() > 0);
    assert_eq!(state_of(&core, remote), VariantState::Remote);
}

#[test]
fn deleting_the_last_model_used_makes_the_next_start_load_the_bundled_demo() {
    let s = Setup::new();
    let core = s.open();
    let remote = tiny_chat::REMOTE;
    download_remote(&core);
    load(&core, Some(remote));
    assert_eq!(core.settings().model.as_deref(), Some(remote));
    core.delete_model(remote).unwrap();
    assert_eq!(
        core.settings().model,
        None,
        "the deleted model is forgotten"
    );
    drop(core);
    let again = ChatCore::open(s.config()).unwrap();
    assert_eq!(again.settings().model, None);
    load(&again, None);
    assert_eq!(again.loaded_model().unwrap().spec, tiny_chat::BUNDLED);
}

#[test]
fn a_remembered_model_that_is_gone_falls_back_to_the_bundled_demo() {
    let s = Setup::new();
    // Remembered, then removed behind the app's back; or dropped from the catalog by an update.
    for gone in [tiny_chat::REMOTE, "retired:v1"] {
        let core = s.open();
        let mut settings = core.settings();
        settings.model = Some(gone.into());
        settings
            .save(&s.dir.path().join("data/settings.json"))
            .unwrap();
        let core = ChatCore::open(s.config()).unwrap();
        assert_eq!(core.settings().model.as_deref(), Some(gone));
        load(&core, None);
        assert_eq!(core.loaded_model().unwrap().spec, tiny_chat::BUNDLED);
        assert_eq!(core.settings().model.as_deref(), Some(tiny_chat::BUNDLED));
    }
    // Named explicitly, a missing model is still an error naming it.
    let core = s.open();
    let e = core
        .load_model(Some(tiny_chat::REMOTE), |_| {})
        .unwrap_err();
    assert!(e.to_string().contains(tiny_chat::REMOTE), "{e}");
}

/// The files in the data directory whose names start with `settings.json.damaged`.
fn damaged_settings(s: &Setup) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(s.dir.path().join("data"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("settings.json.damaged")
        })
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn settings_with_a_value_out_of_range_are_set_aside_and_never_overwrite_an_earlier_one() {
    let s = Setup::new();
    s.open();
    let path = s.dir.path().join("data/settings.json");
    let first = br#"{"system_prompt": "Be kind.", "max_tokens": 0}"#;
    std::fs::write(&path, first).unwrap();
    let core = ChatCore::open(s.config()).unwrap();
    assert_eq!(core.settings(), Settings::default());
    assert_eq!(core.warnings().len(), 1, "{:?}", core.warnings());
    let w = &core.warnings()[0];
    assert!(
        w.contains("settings.json") && w.contains("max tokens"),
        "{w}"
    );
    assert_eq!(
        damaged_settings(&s),
        [("settings.json.damaged".to_string(), first.to_vec())]
    );
    assert!(!path.exists());

    // A second damaged file is kept beside the first, which stays as it was.
    let second = br#"{"temperature": -1}"#;
    std::fs::write(&path, second).unwrap();
    let core = ChatCore::open(s.config()).unwrap();
    assert_eq!(core.settings(), Settings::default());
    let w = &core.warnings()[0];
    assert!(w.contains("temperature"), "{w}");
    let kept = damaged_settings(&s);
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept.contains(&("settings.json.damaged".to_string(), first.to_vec())));
    let (name, bytes) = kept
        .iter()
        .find(|(n, _)| n != "settings.json.damaged")
        .unwrap();
    assert_eq!(bytes, second);
    assert!(
        w.contains(name.as_str()),
        "the warning names where it went: {w}"
    );
}

/// A read that fails for another reason than a missing file. Unreadable permissions would be
/// the usual one, but the tests may run as root; a symbolic link loop fails the same way.
#[cfg(unix)]
#[test]
fn an_unreadable_settings_file_is_left_in_place_and_never_saved_over() {
    let s = Setup::new();
    s.open();
    let path = s.dir.path().join("data/settings.json");
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("settings.json", &path).unwrap();
    let core = ChatCore::open(s.config()).unwrap();
    assert_eq!(core.settings(), Settings::default());
    assert_eq!(core.warnings().len(), 1, "{:?}", core.warnings());
    assert!(
        core.warnings()[0].contains("settings.json"),
        "{:?}",
        core.warnings()
    );
    let still_there = || std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
    assert!(
        still_there(),
        "an unreadable file is not set aside as damaged"
    );
    assert!(damaged_settings(&s).is_empty());
    // Saving would replace it: refused, with the reason.
    let e = core
        .update_settings(Settings {
            temperature: 0.5,
            ..Settings::default()
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("settings.json"), "{e}");
    assert!(still_there());
    // Loading a model works; only remembering it is skipped.
    load(&core, None);
    assert!(still_there());
}

#[test]
fn a_second_damaged_settings_file_is_kept_beside_the_first() {
    let s = Setup::new();
    s.open();
    let path = s.dir.path().join("data/settings.json");
    let first = b"{ not json".to_vec();
    let second = b"{ not json either".to_vec();
    std::fs::write(&path, &first).unwrap();
    ChatCore::open(s.config()).unwrap();
    std::fs::write(&path, &second).unwrap();
    let core = ChatCore::open(s.config()).unwrap();
    assert_eq!(core.settings(), Settings::default());
    let kept = damaged_settings(&s);
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert_eq!(kept[0], ("settings.json.damaged".to_string(), first));
    assert_eq!(kept[1].1, second);
    let w = &core.warnings()[0];
    assert!(
        w.contains(&kept[1].0),
        "the warning names where it went: {w}"
    );
}
