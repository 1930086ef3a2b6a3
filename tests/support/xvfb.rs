//! An Xvfb server for the shells' window tests (src-tauri/tests/window.rs and
//! ui/desktop/tests/screenshot.rs include this file with `#[path]`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A running Xvfb, stopped on drop; holds nothing when the environment's `DISPLAY` is used.
pub struct Xvfb(Option<Child>);

impl Xvfb {
    /// Starts Xvfb with one screen of `geometry` (e.g. `1280x900x24`) on a display number it
    /// picks itself (`-displayfd`) and points `DISPLAY` at it. Call it before any other thread
    /// exists: it sets an environment variable.
    pub fn start(geometry: &str) -> Xvfb {
        let mut child = Command::new("Xvfb")
            .args([
                "-displayfd",
                "1",
                "-screen",
                "0",
                geometry,
                "-nolisten",
                "tcp",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "starting Xvfb (Debian package xvfb; PTERIA_NO_WINDOW_TESTS=1 skips this test)",
            );
        // Xvfb writes the display number once it accepts connections.
        let mut line = String::new();
        let read = BufReader::new(child.stdout.take().expect("Xvfb's stdout")).read_line(&mut line);
        let display = line.trim();
        assert!(
            read.is_ok() && !display.is_empty(),
            "Xvfb did not report a display"
        );
        std::env::set_var("DISPLAY", format!(":{display}"));
        Xvfb(Some(child))
    }

    /// The X display already set in `DISPLAY`, else [`Xvfb::start`].
    pub fn display_or_start(geometry: &str) -> Xvfb {
        if std::env::var_os("DISPLAY").is_some_and(|d| !d.is_empty()) {
            return Xvfb(None);
        }
        Xvfb::start(geometry)
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
