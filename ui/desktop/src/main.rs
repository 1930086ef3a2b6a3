//! `pteria-desktop`: the chat window. `--screenshot FILE` waits until the model has loaded and
//! any `--send` reply has finished, saves the window as a PNG and exits (screenshots for people;
//! the test suite drives the window itself in tests/screenshot.rs).

use anyhow::{Context, Result};
use clap::Parser;
use pteria::chat::{ChatCore, CoreConfig};
use pteria_desktop::{shell, snapshot, AppWindow};
use slint::ComponentHandle;
use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(version, about = "Pteria: on-device chat (native desktop window)")]
struct Args {
    /// Conversations, settings and downloaded models (default: PTERIA_HOME, else the platform's
    /// data directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Bundled models (default: PTERIA_ASSETS, else `assets/` beside the executable, else the
    /// source tree's).
    #[arg(long)]
    assets: Option<PathBuf>,
    /// Open on this page: chat, models or settings.
    #[arg(long, default_value = "chat")]
    page: String,
    /// Send this message once the model has loaded.
    #[arg(long)]
    send: Option<String>,
    /// Save the window as a PNG once everything asked for is shown, then exit.
    #[arg(long)]
    screenshot: Option<PathBuf>,
}

fn main() -> Result<()> {
    pteria::runtime::tune_allocator();
    let args = Args::parse();
    let mut config = CoreConfig::desktop()?;
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if let Some(a) = args.assets {
        config.assets_dir = a;
    }
    let core = ChatCore::open(config)?;
    let ui = AppWindow::new().context("opening the window")?;
    ui.set_page(match args.page.as_str() {
        "models" => 1,
        "settings" => 2,
        _ => 0,
    });
    shell::attach(&ui, core.clone(), shell::event_loop_post(), true);
    let script = Script::start(&ui, core, args.send, args.screenshot);
    ui.run().context("running the window")?;
    drop(script);
    Ok(())
}

/// `--send` and `--screenshot`: driven by a timer on the UI thread, through the same callbacks
/// the window's buttons call.
struct Script {
    _timer: Option<slint::Timer>,
}

impl Script {
    fn start(
        ui: &AppWindow,
        core: ChatCore,
        send: Option<String>,
        screenshot: Option<PathBuf>,
    ) -> Script {
        if send.is_none() && screenshot.is_none() {
            return Script { _timer: None };
        }
        let timer = slint::Timer::default();
        let weak = ui.as_weak();
        let mut send = send;
        let started = Instant::now();
        let settled = Rc::new(Cell::new(0u32));
        timer.start(
            slint::TimerMode::Repeated,
            Duration::from_millis(100),
            move || {
                let Some(ui) = weak.upgrade() else { return };
                let busy = core.loading_model().is_some() || ui.get_replying();
                let timed_out = started.elapsed() > Duration::from_secs(600);
                if busy && !timed_out {
                    settled.set(0);
                    return;
                }
                if let Some(text) = send.take() {
                    if core.loaded_model().is_some() {
                        ui.invoke_send(text.into());
                        return;
                    }
                }
                // A few quiet ticks so the last frame is drawn before the snapshot.
                settled.set(settled.get() + 1);
                if settled.get() < 3 {
                    return;
                }
                if let Some(path) = &screenshot {
                    match snapshot::save_png(ui.window(), path) {
                        Ok(()) => eprintln!("pteria-desktop: saved {}", path.display()),
                        Err(e) => eprintln!("pteria-desktop: {e:#}"),
                    }
                }
                let _ = slint::quit_event_loop();
            },
        );
        Script {
            _timer: Some(timer),
        }
    }
}
