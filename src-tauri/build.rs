include!("src/command_names.rs");

fn main() {
    // The app's own commands get permissions (`allow-<command>`) like a plugin's, so the
    // capability file grants exactly the commands the UI calls and nothing else.
    tauri_build::try_build(
        tauri_build::Attributes::new()
            .app_manifest(tauri_build::AppManifest::new().commands(COMMANDS)),
    )
    .expect("tauri build step");
}
