//! The window as a PNG, rendered by Slint's software renderer: what the test suite's screenshot
//! of the real window under Xvfb saves.

use anyhow::{Context, Result};
use std::path::Path;

pub fn save_png(window: &slint::Window, path: &Path) -> Result<()> {
    let shot = window
        .take_snapshot()
        .context("the renderer could not take a snapshot of the window")?;
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), shot.width(), shot.height());
    encoder.set_color(png::ColorType::Rgba);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder
        .write_header()
        .with_context(|| format!("writing {}", path.display()))?;
    writer
        .write_image_data(shot.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    writer
        .finish()
        .with_context(|| format!("writing {}", path.display()))
}
