// Every command the app registers: build.rs turns these into `allow-<name>` permissions and
// src/lib.rs's tests check each one is handled. Keep in the order of `generate_handler!`.
pub const COMMANDS: &[&str] = &[
    "app_info",
    "list_models",
    "download_model",
    "cancel_download",
    "delete_model",
    "load_model",
    "get_settings",
    "update_settings",
    "list_conversations",
    "create_conversation",
    "open_conversation",
    "rename_conversation",
    "delete_conversation",
    "context_usage",
    "send_message",
    "stop_generation",
    "regenerate",
];
