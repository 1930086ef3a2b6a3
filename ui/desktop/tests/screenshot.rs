//! The real window (winit on X11, software renderer) under an Xvfb server this test starts: a
//! saved conversation with a markdown reply is drawn, then a new chat is opened, a message is sent
//! through the window's callback and the reply streams in. Both states are saved as PNGs in the
//! target directory (for a person to look at) and checked: the code block is drawn as a dark box
//! with text on it, and the streamed reply changed the transcript's pixels.
//!
//! The model is the bundled demo model (a real English reply). Winit wants the main thread, so this file has its own
//! `main` (`harness = false`). Needs Debian's `xvfb` (scripts/test.sh installs it);
//! `PTERIA_NO_WINDOW_TESTS=1` skips it where no X server can run.

#[allow(dead_code)]
#[path = "support/markdown_conversation.rs"]
mod markdown_conversation;
#[allow(dead_code)]
#[path = "../../../tests/support/xvfb.rs"]
mod xvfb;

use pteria::chat::{ChatCore, CoreConfig, DeviceChoice, Settings};
use pteria_desktop::{shell, snapshot, AppWindow};
use slint::{ComponentHandle, Model, Rgba8Pixel, SharedPixelBuffer};
use std::cell::RefCell;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

const NAME: &str = "the_window_under_xvfb_draws_markdown_and_a_streamed_reply";
const TIMEOUT: Duration = Duration::from_secs(300);

fn main() {
    // Behave like a libtest binary for `cargo test -- --list` and name filters.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("{NAME}: test");
        return;
    }
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !NAME.contains(a.as_str()))
    {
        return;
    }
    if std::env::var_os("PTERIA_NO_WINDOW_TESTS").is_some() {
        eprintln!("{NAME}: skipped (PTERIA_NO_WINDOW_TESTS is set)");
        return;
    }
    // The main thread, before any other thread exists.
    let _x = xvfb::Xvfb::start("1280x900x24");
    run();
    println!("test {NAME} ... ok\n\ntest result: ok. 1 passed; 0 failed");
}

/// The app's configuration with the bundled demo model; short greedy replies on the CPU.
fn config(root: &Path) -> CoreConfig {
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets");
    let mut config = CoreConfig::new(root.join("data"), assets).expect("builtin catalog");
    config.device_facts = None;
    std::fs::create_dir_all(&config.data_dir).expect("data dir");
    Settings {
        temperature: 0.0,
        max_tokens: Some(24),
        device: DeviceChoice::Cpu,
        ..Settings::default()
    }
    .save(&config.data_dir.join("settings.json"))
    .expect("settings");
    config
}

/// What the window showed at each step.
#[derive(Default)]
struct Seen {
    empty_chat: Option<SharedPixelBuffer<Rgba8Pixel>>,
    reply: Option<String>,
    error: Option<String>,
}

fn run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().to_path_buf();
    let config = config(&root);
    markdown_conversation::save(&config.data_dir);
    let core = ChatCore::open(config).expect("chat core");

    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let markdown_png = out.join("pteria-desktop-markdown.png");
    let reply_png = out.join("pteria-desktop.png");
    for p in [&markdown_png, &reply_png] {
        let _ = std::fs::remove_file(p);
    }

    let ui = AppWindow::new().expect("opening the window");
    shell::attach(&ui, core.clone(), shell::event_loop_post(), true);
    let seen = Rc::new(RefCell::new(Seen::default()));
    let shots = (markdown_png.as_path(), reply_png.as_path());
    let _driver = drive(
        &ui,
        core.clone(),
        seen.clone(),
        markdown_conversation::QUESTION,
        shots,
    );
    ui.run().expect("running the window");

    let seen = seen.take();
    if let Some(e) = seen.error {
        panic!("{e}");
    }
    let markdown = read_png(&markdown_png);
    check_markdown(&markdown);
    let reply = seen.reply.expect("the reply was never shown");
    assert!(!reply.trim().is_empty(), "an empty reply");
    let saved = core.conversations();
    let saved = core
        .conversation(&saved[0].id)
        .expect("the new conversation");
    assert_eq!(saved.messages[0].content, markdown_conversation::QUESTION);
    assert_eq!(
        saved.messages[1].content, reply,
        "the window shows the saved reply"
    );
    let after = read_png(&reply_png);
    let before = seen.empty_chat.expect("the empty chat's snapshot");
    check_reply_drawn(&before, &after);
    eprintln!(
        "{NAME} (demo model): reply {reply:?}; screenshots {} and {}",
        markdown_png.display(),
        reply_png.display()
    );
}

/// Steps through the scene on a UI-thread timer, through the callbacks the window's buttons call:
/// once the model is loaded, saves the restored markdown conversation, opens a new chat, sends
/// the question and saves the window once the reply is finished.
fn drive(
    ui: &AppWindow,
    core: ChatCore,
    seen: Rc<RefCell<Seen>>,
    question: &'static str,
    (markdown_png, reply_png): (&Path, &Path),
) -> slint::Timer {
    let timer = slint::Timer::default();
    let weak = ui.as_weak();
    let (markdown_png, reply_png) = (markdown_png.to_path_buf(), reply_png.to_path_buf());
    let started = Instant::now();
    let mut step = 0;
    let mut quiet = 0;
    timer.start(
        slint::TimerMode::Repeated,
        Duration::from_millis(100),
        move || {
            let Some(ui) = weak.upgrade() else { return };
            let fail = |e: String| {
                seen.borrow_mut().error = Some(e);
                let _ = slint::quit_event_loop();
            };
            if started.elapsed() > TIMEOUT {
                return fail(format!("step {step} not done after {TIMEOUT:?}"));
            }
            if core.loading_model().is_some() || ui.get_replying() {
                quiet = 0;
                return;
            }
            // A few quiet ticks so the last change is drawn before a snapshot.
            quiet += 1;
            if quiet < 3 {
                return;
            }
            quiet = 0;
            match step {
                0 => {
                    if core.loaded_model().is_none() {
                        return fail(format!("no model loaded: {}", ui.get_model_status()));
                    }
                    if let Err(e) = snapshot::save_png(ui.window(), &markdown_png) {
                        return fail(format!("{e:#}"));
                    }
                    ui.invoke_new_conversation();
                }
                1 => {
                    match ui.window().take_snapshot() {
                        Ok(shot) => seen.borrow_mut().empty_chat = Some(shot),
                        Err(e) => return fail(format!("snapshot: {e}")),
                    }
                    ui.invoke_send(question.into());
                    if !ui.get_replying() {
                        return fail(format!("the message was not sent: {}", ui.get_error()));
                    }
                }
                _ => {
                    let last = ui.get_messages().iter().last();
                    seen.borrow_mut().reply = last.map(|m| m.text.to_string());
                    if let Err(e) = snapshot::save_png(ui.window(), &reply_png) {
                        return fail(format!("{e:#}"));
                    }
                    let _ = slint::quit_event_loop();
                }
            }
            step += 1;
        },
    );
    timer
}

struct Image {
    w: usize,
    h: usize,
    rgba: Vec<u8>,
}

impl Image {
    fn rgb(&self, x: usize, y: usize) -> (u8, u8, u8) {
        let i = (y * self.w + x) * 4;
        (self.rgba[i], self.rgba[i + 1], self.rgba[i + 2])
    }
}

fn read_png(path: &Path) -> Image {
    let file = std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("no screenshot at {}: {e}", path.display()));
    let mut reader = png::Decoder::new(BufReader::new(file))
        .read_info()
        .expect("a PNG");
    let mut rgba = vec![0; reader.output_buffer_size().expect("PNG size")];
    let info = reader.next_frame(&mut rgba).expect("PNG pixels");
    assert_eq!(info.color_type, png::ColorType::Rgba);
    let (w, h) = (info.width as usize, info.height as usize);
    assert!(
        w >= 760 && h >= 520,
        "{w}x{h}: smaller than the window's minimum"
    );
    Image { w, h, rgba }
}

/// The code block's background fills a box of its own (the reply was drawn as blocks, not as raw
/// markdown) and there is light text on it.
fn check_markdown(img: &Image) {
    let bg = markdown_conversation::CODE_BACKGROUND;
    let code_rows: Vec<usize> = (0..img.h)
        .filter(|&y| (0..img.w).filter(|&x| img.rgb(x, y) == bg).count() > 200)
        .collect();
    let box_pixels: usize = code_rows
        .iter()
        .map(|&y| (0..img.w).filter(|&x| img.rgb(x, y) == bg).count())
        .sum();
    assert!(
        box_pixels > 5_000,
        "code block background: {box_pixels} pixels"
    );
    let glyphs = code_rows
        .iter()
        .flat_map(|&y| (0..img.w).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let (r, g, b) = img.rgb(x, y);
            r > 150 && g > 150 && b > 150
        })
        .count();
    assert!(glyphs > 200, "code text pixels: {glyphs}");
}

/// The transcript (right of the sidebar, above the message box) changed between the empty chat
/// and the finished reply by at least the question's and the reply's text.
fn check_reply_drawn(before: &SharedPixelBuffer<Rgba8Pixel>, after: &Image) {
    assert_eq!(
        (before.width() as usize, before.height() as usize),
        (after.w, after.h)
    );
    let px = before.as_slice();
    let changed = (40..after.h.saturating_sub(120))
        .flat_map(|y| (260..after.w).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let p = px[y * after.w + x];
            (p.r, p.g, p.b) != after.rgb(x, y)
        })
        .count();
    assert!(
        changed > 3_000,
        "the transcript changed by only {changed} pixels after the reply"
    );
}
