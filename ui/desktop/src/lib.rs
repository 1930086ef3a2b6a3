//! Pteria's native desktop shell: the Slint window in `ui/app.slint`, wired to the chat core by
//! `shell` (every callback a few lines calling `pteria::chat::ChatCore`); `view` turns the core's
//! values into the window's rows; `snapshot` saves what the window shows as a PNG.

slint::include_modules!();

pub mod shell;
pub mod snapshot;
pub mod view;
