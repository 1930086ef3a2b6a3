//! The desktop window driven headless through Slint's testing backend, clicking its buttons and
//! typing into its fields, on a chat core whose bundled model is the tiny Llama fixture (run by
//! our CPU runtime) and whose hub is a loopback server: streamed replies, stop, regenerate,
//! settings persisted, the model picker's states through a download, and conversations restored.

#[allow(dead_code)]
#[path = "../../../tests/downloads/hub.rs"]
mod hub;
#[allow(dead_code)]
#[path = "support/markdown_conversation.rs"]
mod markdown_conversation;
#[allow(dead_code)]
#[path = "../../../tests/support/tiny_chat.rs"]
mod tiny;

use i_slint_backend_testing::{AccessibleRole, ElementHandle};
use pteria::chat::{Author, ChatCore, Settings};
use pteria_desktop::shell::{self, Post};
use pteria_desktop::{AppWindow, MessageRow, VariantRow};
use slint::{ComponentHandle, Model};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// Temporary app files and a loopback hub serving the downloadable model.
struct Setup {
    dir: tempfile::TempDir,
    hub: hub::Hub,
}

impl Setup {
    fn new() -> Setup {
        let hub = hub::Hub::start();
        for (path, bytes, lfs) in tiny::remote_files(&fixtures()) {
            hub.add_file(tiny::REPO, tiny::REV, path, bytes, lfs);
        }
        Setup {
            dir: tempfile::tempdir().unwrap(),
            hub,
        }
    }

    fn config(&self) -> pteria::chat::CoreConfig {
        tiny::config(self.dir.path(), &fixtures(), self.hub.endpoint())
    }

    /// A core with greedy, six-token replies on the CPU.
    fn open(&self) -> ChatCore {
        let core = ChatCore::open(self.config()).unwrap();
        core.update_settings(Settings {
            temperature: 0.0,
            max_tokens: Some(6),
            device: pteria::chat::DeviceChoice::Cpu,
            ..Settings::default()
        })
        .unwrap();
        core
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A headless window on `core`. The core's events reach the window through a queue the test
/// drains on this thread (the testing backend's per-thread platform has no event loop).
fn window(core: &ChatCore) -> (AppWindow, Receiver<Job>) {
    let (ui, rx, _) = window_gated(core);
    (ui, rx)
}

/// Holds the engine's thread after each piece of UI work it posts while `hold` is set, until
/// the UI thread hands out a permit: a test can act between two streamed pieces however
/// fast the engine is (the tiny fixture writes its 25 tokens in milliseconds).
struct Gate {
    hold: AtomicBool,
    /// Posts held so far: the test checks its premise (the engine's thread was held).
    held: AtomicUsize,
    permits: Mutex<Receiver<()>>,
    permit: mpsc::Sender<()>,
}

impl Gate {
    fn release(&self) {
        let _ = self.permit.send(());
    }
}

fn window_gated(core: &ChatCore) -> (AppWindow, Receiver<Job>, Arc<Gate>) {
    // Each test thread gets its own headless platform.
    thread_local!(static INIT: Once = const { Once::new() });
    INIT.with(|o| o.call_once(i_slint_backend_testing::init_no_event_loop));
    let (tx, rx) = mpsc::channel::<Job>();
    let (permit, permits) = mpsc::channel();
    let gate = Arc::new(Gate {
        hold: AtomicBool::new(false),
        held: AtomicUsize::new(0),
        permits: Mutex::new(permits),
        permit,
    });
    let g = gate.clone();
    let post: Post = Arc::new(move |f| {
        let _ = tx.send(f);
        // Only the engine's thread: another's post (a model load finishing) could take the
        // engine's permit.
        if g.hold.load(Ordering::SeqCst) && std::thread::current().name() == Some("pteria-engine") {
            g.held.fetch_add(1, Ordering::SeqCst);
            let _ = g.permits.lock().unwrap().recv_timeout(TIMEOUT);
        }
    });
    let ui = AppWindow::new().unwrap();
    shell::attach(&ui, core.clone(), post, true);
    ui.show().unwrap();
    (ui, rx, gate)
}

/// Runs queued UI work until `done` holds, calling `each` after every piece.
fn pump(rx: &Receiver<Job>, mut done: impl FnMut() -> bool, mut each: impl FnMut()) {
    while !done() {
        let job = rx
            .recv_timeout(TIMEOUT)
            .expect("the window never got there");
        job();
        each();
    }
}

/// Presses the control labelled `label` (texts carry their words as a label too: skipped).
fn click(ui: &AppWindow, label: &str) {
    let button = ElementHandle::find_by_accessible_label(ui, label)
        .find(|e| e.accessible_role() != Some(AccessibleRole::Text))
        .unwrap_or_else(|| panic!("no `{label}` on screen"));
    assert_ne!(
        button.accessible_enabled(),
        Some(false),
        "`{label}` is disabled"
    );
    button.invoke_accessible_default_action();
}

fn type_into(ui: &AppWindow, id: &str, text: &str) {
    ElementHandle::find_by_element_id(ui, id)
        .next()
        .unwrap_or_else(|| panic!("no `{id}` on screen"))
        .set_accessible_value(text);
}

fn rows(ui: &AppWindow) -> Vec<MessageRow> {
    ui.get_messages().iter().collect()
}

fn variant(ui: &AppWindow, spec: &str) -> VariantRow {
    ui.get_variants()
        .iter()
        .find(|v| v.spec == spec)
        .unwrap_or_else(|| panic!("no row for {spec}"))
}

fn loaded(ui: &AppWindow, rx: &Receiver<Job>) {
    pump(rx, || ui.get_model_loaded(), || {});
}

/// Types `text` and presses Send; returns the reply's text as it was after each streamed piece.
fn send_and_watch(ui: &AppWindow, rx: &Receiver<Job>, text: &str) -> Vec<String> {
    type_into(ui, "ChatPage::message-input", text);
    assert_eq!(ui.get_draft(), text);
    click(ui, "Send");
    assert!(ui.get_replying());
    let mut seen = Vec::new();
    pump(
        rx,
        || !ui.get_replying(),
        || {
            if let Some(last) = rows(ui).last().filter(|r| r.streaming) {
                seen.push(last.text.to_string());
            }
        },
    );
    seen
}

#[test]
fn a_sent_message_streams_its_reply_into_the_window_with_ttft_and_speed() {
    let s = Setup::new();
    let core = s.open();
    let (ui, rx) = window(&core);
    assert!(!ui.get_model_loaded());
    loaded(&ui, &rx);
    assert!(
        ui.get_model_status().contains("Tiny Llama (bundled)"),
        "{}",
        ui.get_model_status()
    );

    let seen = send_and_watch(&ui, &rx, "hi");
    assert_eq!(ui.get_draft(), "", "the message box is cleared");
    // The reply grew piece by piece in the window before it finished.
    let partial: Vec<&String> = seen.iter().filter(|t| !t.is_empty()).collect();
    assert!(partial.len() >= 2, "{seen:?}");
    assert!(partial.windows(2).all(|w| w[1].starts_with(w[0].as_str())));

    let shown = rows(&ui);
    assert_eq!(shown.len(), 2);
    assert!(shown[0].user && shown[0].text == "hi");
    let reply = &shown[1];
    assert!(!reply.user && !reply.streaming);
    let saved = core.conversation(&ui.get_current_conversation()).unwrap();
    assert_eq!(saved.messages[1].author, Author::Assistant);
    assert_eq!(reply.text, saved.messages[1].content.as_str());
    assert_eq!(*partial.last().unwrap(), &saved.messages[1].content);
    assert!(reply.blocks.row_count() >= 1);
    let stats = reply.stats.to_string();
    assert!(
        stats.starts_with("TTFT ") && stats.contains(" ms · "),
        "{stats}"
    );
    assert!(stats.contains(" tok/s · 6 tokens"), "{stats}");
    assert_eq!(ui.get_context_usage(), "context 13 / 32 tokens");
    let titles: Vec<String> = ui
        .get_conversations()
        .iter()
        .map(|c| c.title.to_string())
        .collect();
    assert_eq!(titles, ["hi"], "the first message names the conversation");
    assert_eq!(
        ui.get_conversations().row_data(0).unwrap().subtitle,
        "2 messages",
        "the sidebar counts the saved reply"
    );

    // Regenerate replaces the reply; greedy sampling writes the same one again.
    click(&ui, "Regenerate");
    assert!(ui.get_replying());
    assert_eq!(rows(&ui).len(), 2, "the old reply gives way to the new one");
    pump(&rx, || !ui.get_replying(), || {});
    let again = rows(&ui);
    assert_eq!(again.len(), 2);
    assert_eq!(again[1].text, reply.text);
    assert_ne!(again[1].id, reply.id);
}

#[test]
fn stop_ends_the_reply_and_the_window_shows_it_stopped() {
    let s = Setup::new();
    let core = s.open();
    core.update_settings(Settings {
        max_tokens: None,
        ..core.settings()
    })
    .unwrap();
    let (ui, rx, gate) = window_gated(&core);
    loaded(&ui, &rx);
    // The engine waits after each piece it posts until this thread lets it go on.
    gate.hold.store(true, Ordering::SeqCst);
    type_into(&ui, "ChatPage::message-input", "hi");
    click(&ui, "Send");
    // Stop once the first text is on screen, with the Stop button that replaced Send.
    let text = || rows(&ui).last().is_some_and(|r| !r.text.is_empty());
    pump(&rx, text, || {
        if !text() {
            gate.release();
        }
    });
    assert!(ElementHandle::find_by_accessible_label(&ui, "Send")
        .all(|e| e.accessible_role() == Some(AccessibleRole::Text)));
    click(&ui, "Stop");
    assert!(
        gate.held.load(Ordering::SeqCst) > 0,
        "the engine's thread was never held at a post"
    );
    gate.hold.store(false, Ordering::SeqCst);
    gate.release();
    pump(&rx, || !ui.get_replying(), || {});
    let reply = rows(&ui).pop().unwrap();
    assert!(reply.stats.ends_with(" · stopped"), "{}", reply.stats);
    let saved = core.conversation(&ui.get_current_conversation()).unwrap();
    let last = saved.messages.last().unwrap();
    assert!(last.stopped);
    assert_eq!(reply.text, last.content.as_str());
    // Without the stop the never-ending fixture fills the 25 positions left; the engine waited
    // at the first text until the stop was in.
    assert!(last.stats.as_ref().unwrap().generated_tokens < 5);
}

#[test]
fn settings_saved_in_the_window_persist_and_bad_values_are_refused() {
    let s = Setup::new();
    let core = s.open();
    let (ui, _rx) = window(&core);
    ui.set_page(2);
    type_into(
        &ui,
        "SettingsPage::system-prompt-input",
        "Answer in French.",
    );
    ui.set_top_k(7);
    ui.set_max_tokens(0);
    ui.set_device(2);
    ui.set_tables(1);
    click(&ui, "Gemma 4 thinking");
    assert!(ui.get_thinking());
    click(&ui, "Save settings");
    assert_eq!(ui.get_settings_status(), "Saved");
    let saved = core.settings();
    assert_eq!(saved.system_prompt, "Answer in French.");
    assert_eq!((saved.top_k, saved.max_tokens), (7, None));
    assert!(saved.thinking);
    assert_eq!(
        (saved.device, saved.tables),
        (
            pteria::chat::DeviceChoice::Cpu,
            pteria::chat::TablesChoice::Host
        )
    );

    // Tables in GPU memory on the CPU device are refused.
    ui.set_tables(2);
    click(&ui, "Save settings");
    assert!(
        ui.get_settings_status().contains("tables"),
        "{}",
        ui.get_settings_status()
    );
    assert_eq!(core.settings().tables, pteria::chat::TablesChoice::Host);
    ui.set_tables(1);

    ui.set_temperature(-1.0);
    click(&ui, "Save settings");
    assert!(
        ui.get_settings_status().contains("temperature"),
        "{}",
        ui.get_settings_status()
    );
    assert_eq!(core.settings().temperature, saved.temperature);

    // A new window on a new core over the same data directory shows what was saved.
    drop(ui);
    drop(core);
    let core = ChatCore::open(s.config()).unwrap();
    let (ui, _rx) = window(&core);
    assert_eq!(ui.get_system_prompt(), "Answer in French.");
    assert_eq!((ui.get_top_k(), ui.get_max_tokens()), (7, 0));
    assert!(ui.get_thinking());
    assert_eq!((ui.get_device(), ui.get_tables()), (2, 1));
}

#[test]
fn the_model_picker_downloads_with_progress_then_loads_and_deletes() {
    let s = Setup::new();
    let core = s.open();
    let (ui, rx) = window(&core);
    loaded(&ui, &rx);
    ui.set_page(1);
    let bundled = variant(&ui, tiny::BUNDLED);
    assert_eq!(bundled.state, "bundled");
    assert!(bundled.loaded && bundled.first_of_model);
    let spec = tiny::REMOTE;
    assert_eq!(variant(&ui, spec).state, "remote");
    assert_eq!(variant(&ui, spec).fit_light, "green");

    // A slow transfer, so the window shows progress and a Cancel button.
    s.hub.fail_next_get(
        "cpu/model.pte",
        hub::Fault::Trickle {
            chunk: 4096,
            every: std::time::Duration::from_millis(20),
        },
    );
    click(&ui, &format!("Download {spec}"));
    pump(&rx, || variant(&ui, spec).progress > 0.0, || {});
    let row = variant(&ui, spec);
    assert_eq!(row.state, "downloading");
    assert!(row.progress_text.contains(" of "), "{}", row.progress_text);
    click(&ui, &format!("Cancel {spec}"));
    pump(&rx, || variant(&ui, spec).state != "downloading", || {});
    assert_eq!(variant(&ui, spec).state, "partial");
    assert!(ui.get_models_status().starts_with("Cancelled"));

    // Resume, then use it, then delete it.
    click(&ui, &format!("Download {spec}"));
    pump(&rx, || variant(&ui, spec).state == "downloaded", || {});
    assert!(ui.get_models_status().starts_with("Downloaded"));
    click(&ui, &format!("Use {spec}"));
    // Until the `Loaded` event: the `Loading` one's list refresh can already show it loaded
    // while the status still says "Loading".
    pump(
        &rx,
        || ui.get_model_status().contains("Tiny Llama (hub)"),
        || {},
    );
    assert!(variant(&ui, spec).loaded);
    assert_eq!(core.loaded_model().unwrap().spec, spec);
    click(&ui, &format!("Delete {spec}"));
    assert_eq!(variant(&ui, spec).state, "remote");
    assert!(
        !ui.get_model_loaded(),
        "deleting the loaded model unloads it"
    );
}

#[test]
fn conversations_are_listed_reopened_and_deleted_from_the_sidebar() {
    let s = Setup::new();
    let core = s.open();
    let (ui, rx) = window(&core);
    loaded(&ui, &rx);
    send_and_watch(&ui, &rx, "first");
    click(&ui, "New chat");
    assert_eq!(rows(&ui).len(), 0);
    send_and_watch(&ui, &rx, "second");
    let titles: Vec<String> = ui
        .get_conversations()
        .iter()
        .map(|c| c.title.to_string())
        .collect();
    assert_eq!(titles, ["second", "first"], "newest first");

    click(&ui, "first");
    assert_eq!(rows(&ui)[0].text, "first");
    assert_eq!(ui.get_context_usage(), "context 16 / 32 tokens");

    // Restarted, the window opens the newest conversation.
    drop(ui);
    drop(core);
    let core = s.open();
    let (ui, _rx) = window(&core);
    assert_eq!(rows(&ui).len(), 2);
    assert_eq!(rows(&ui)[0].text, "second");
    click(&ui, "Delete conversation second");
    assert_eq!(ui.get_conversations().row_count(), 1);
    assert_eq!(rows(&ui).len(), 0);
    assert_eq!(core.conversations().len(), 1);
}

#[test]
fn a_restored_markdown_reply_is_drawn_as_native_blocks() {
    let s = Setup::new();
    markdown_conversation::save(&s.dir.path().join("data"));
    let core = s.open();
    let (ui, rx) = window(&core);
    // The saved stats' context use, then against the fixture's 32 tokens once it is loaded.
    assert_eq!(ui.get_context_usage(), "context 127 / 2048 tokens");
    loaded(&ui, &rx);
    assert_eq!(ui.get_context_usage(), "context 127 / 32 tokens");
    let shown = rows(&ui);
    assert_eq!(shown.len(), 2);
    let blocks: Vec<_> = shown[1].blocks.iter().collect();
    let outline: Vec<(String, i32, String)> = blocks
        .iter()
        .map(|b| (b.kind.to_string(), b.depth, b.marker.to_string()))
        .collect();
    let want = [
        ("paragraph", 0, ""),
        ("item", 0, "1."),
        ("item", 0, "2."),
        ("item", 1, "•"),
        ("item", 0, "3."),
        ("code", 0, ""),
        ("quote", 0, ""),
    ];
    assert_eq!(
        outline,
        want.map(|(k, d, m)| (k.to_string(), d, m.to_string()))
    );
    // Emphasis, strong text and inline code styled as Slint styles the same markdown.
    let styled = |md: &str| format!("{:?}", slint::StyledText::from_markdown(md).unwrap());
    assert_eq!(
        format!("{:?}", blocks[0].text),
        styled("Here is how to **count words** in a file:")
    );
    assert_eq!(
        format!("{:?}", blocks[1].text),
        styled("Read the file *line by line*.")
    );
    assert_eq!(
        format!("{:?}", blocks[3].text),
        styled("Empty lines count as `0`.")
    );
    assert_eq!(blocks[5].language, "rust");
    let code = "fn words(text: &str) -> usize {\n    text.split_whitespace().count()\n}";
    assert_eq!(blocks[5].code, code);
    // The code block is a monospace text element of its own on screen.
    let code_text = ElementHandle::find_by_accessible_label(&ui, code)
        .next()
        .expect("the code block's text element");
    assert!(code_text.size().width > 100.0 && code_text.size().height > 30.0);
    assert_eq!(
        shown[1].stats, "TTFT 84 ms · 41.3 tok/s · 96 tokens",
        "the saved reply keeps its stats"
    );
}

/// The chat page fills the window at any size, while a message, a conversation row and a
/// model card keep their own height however much room is free.
#[test]
fn the_window_content_follows_the_window_size_and_rows_keep_their_height() {
    let s = Setup::new();
    markdown_conversation::save(&s.dir.path().join("data"));
    let core = s.open();
    let (ui, _rx) = window(&core);
    let one = |type_name: &str| {
        let mut found = ElementHandle::find_by_element_type_name(&ui, type_name);
        found
            .next()
            .unwrap_or_else(|| panic!("no {type_name} on screen"))
    };
    for (w, h) in [(1400.0, 1000.0), (800.0, 560.0)] {
        ui.window().set_size(slint::LogicalSize::new(w, h));
        let page = one("ChatPage");
        let (size, at) = (page.size(), page.absolute_position());
        assert_eq!(
            (at.x + size.width, size.height),
            (w, h),
            "the chat page fills a {w}x{h} window"
        );
        let question = one("MessageView");
        assert!(
            question.size().height < 90.0,
            "a one-line message is {} px tall in a {w}x{h} window",
            question.size().height
        );
        let row = one("ConversationItem");
        assert!(
            row.size().height < 60.0,
            "a conversation row is {} px tall",
            row.size().height
        );
    }
    ui.set_page(1);
    let card = one("VariantView");
    assert!(
        card.size().height < 120.0,
        "a model card is {} px tall",
        card.size().height
    );
}

/// Runs queued UI work until the core's reply is over and its last event has been applied.
fn settle(rx: &Receiver<Job>, core: &ChatCore) {
    pump(rx, || !core.is_replying(), || {});
    // The final event is posted just after the core marks the reply done.
    while let Ok(job) = rx.recv_timeout(Duration::from_millis(500)) {
        job();
    }
}

/// Types `text`, presses Send, and runs UI work (letting the held engine go one piece at a
/// time) until the reply's first text is on screen; the engine is then held there.
fn send_and_hold_at_first_text(ui: &AppWindow, rx: &Receiver<Job>, gate: &Gate, text: &str) {
    gate.hold.store(true, Ordering::SeqCst);
    type_into(ui, "ChatPage::message-input", text);
    click(ui, "Send");
    let shown = || {
        rows(ui)
            .last()
            .is_some_and(|r| r.streaming && !r.text.is_empty())
    };
    pump(rx, shown, || {
        if !shown() {
            gate.release();
        }
    });
    assert!(ui.get_replying());
}

fn let_the_engine_go(gate: &Gate) {
    assert!(
        gate.held.load(Ordering::SeqCst) > 0,
        "the engine's thread was never held at a post"
    );
    gate.hold.store(false, Ordering::SeqCst);
    gate.release();
}

#[test]
fn leaving_the_conversation_being_written_does_not_leave_the_window_replying() {
    let s = Setup::new();
    let core = s.open();
    let (ui, rx, gate) = window_gated(&core);
    loaded(&ui, &rx);
    send_and_watch(&ui, &rx, "first");
    click(&ui, "New chat");

    // Another conversation opened mid-reply.
    send_and_hold_at_first_text(&ui, &rx, &gate, "second");
    let second = ui.get_current_conversation();
    click(&ui, "first");
    let_the_engine_go(&gate);
    settle(&rx, &core);
    assert!(!ui.get_replying(), "Send is back once the reply is done");
    assert_eq!(rows(&ui).len(), 2, "the other conversation stays open");
    assert_eq!(rows(&ui)[0].text, "first");
    assert_eq!(core.conversation(&second).unwrap().messages.len(), 2);

    // "New chat" mid-reply.
    click(&ui, "second");
    send_and_hold_at_first_text(&ui, &rx, &gate, "third");
    click(&ui, "New chat");
    let_the_engine_go(&gate);
    settle(&rx, &core);
    assert!(!ui.get_replying());
    assert_eq!(rows(&ui).len(), 0, "the new chat stays open");
    assert_eq!(core.conversation(&second).unwrap().messages.len(), 4);

    // The conversation being written deleted mid-reply.
    click(&ui, "second");
    send_and_hold_at_first_text(&ui, &rx, &gate, "fourth");
    click(&ui, "Delete conversation second");
    let_the_engine_go(&gate);
    settle(&rx, &core);
    assert!(!ui.get_replying());
    assert!(core.conversation(&second).is_err());

    // Send works again.
    send_and_watch(&ui, &rx, "fifth");
    let shown = rows(&ui);
    assert_eq!(shown.len(), 2);
    assert!(!shown[1].streaming && !shown[1].text.is_empty());
}

#[test]
fn reopening_the_conversation_being_written_shows_its_reply_so_far() {
    let s = Setup::new();
    let core = s.open();
    let (ui, rx, gate) = window_gated(&core);
    loaded(&ui, &rx);
    send_and_watch(&ui, &rx, "first");
    click(&ui, "New chat");
    send_and_hold_at_first_text(&ui, &rx, &gate, "second");
    let so_far = rows(&ui).last().unwrap().text.clone();
    click(&ui, "first");
    assert!(rows(&ui).iter().all(|r| !r.streaming));

    // Back to it (and once more, opening the conversation already open): the reply as far as
    // it got, still streaming.
    for _ in 0..2 {
        click(&ui, "second");
        let shown = rows(&ui);
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert_eq!(shown[0].text, "second");
        assert!(shown[1].streaming);
        assert_eq!(shown[1].text, so_far);
    }
    // It grows on from there, and ends as saved.
    gate.release();
    pump(&rx, || rows(&ui)[1].text != so_far, || gate.release());
    assert!(rows(&ui)[1].text.starts_with(so_far.as_str()));
    let_the_engine_go(&gate);
    settle(&rx, &core);
    assert!(!ui.get_replying());
    let saved = core.conversation(&ui.get_current_conversation()).unwrap();
    let shown = rows(&ui);
    assert_eq!(shown.len(), 2);
    assert!(!shown[1].streaming);
    assert_eq!(shown[1].id, saved.messages[1].id.as_str());
    assert_eq!(shown[1].text, saved.messages[1].content.as_str());

    // A regeneration reopened mid-reply shows the new reply in place of the old one.
    let old = saved.messages[1].clone();
    gate.hold.store(true, Ordering::SeqCst);
    click(&ui, "Regenerate");
    click(&ui, "first");
    click(&ui, "second");
    let shown = rows(&ui);
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert!(shown[1].streaming && shown[1].id != old.id.as_str());
    let_the_engine_go(&gate);
    settle(&rx, &core);
    let shown = rows(&ui);
    assert_eq!(shown.len(), 2);
    assert!(!shown[1].streaming && shown[1].id != old.id.as_str());
}
