//! A chat setup on real files for the chat core's tests and the Tauri shell's: the tiny Llama
//! fixture (run by our CPU runtime) as a bundled model, the same program served by a loopback
//! hub as a downloadable one, byte-level tokenizer files, and a core configured for them.
//! Included with `#[path]` by tests/chat.rs and src-tauri's tests.

use pteria::catalog::{Catalog, DeviceFacts, Memory, Os};
use pteria::chat::CoreConfig;
use pteria::download::{DownloadOptions, HubConfig, RetryPolicy};
use pteria::llm::{ContextPolicy, RunnerConfig};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The fixture program (in tests/fixtures).
pub const PROGRAM: &str = "llama_tiny_portable_fp32.pte";
pub const BUNDLED: &str = "tiny:portable-fp32";
pub const REMOTE: &str = "remote:cpu-fp32";
pub const REPO: &str = "org/tiny";
pub const REV: &str = "v1";

/// A compact ChatML-like template (one role letter per turn) so conversations fit the fixture's
/// 32-token context: each message costs its bytes plus 3 tokens.
pub const TEMPLATE: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'][0] + m['content'] + '<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>a' }}{% endif %}";

/// `tokenizer.json` for the fixture's 256-entry vocabulary: ids 0 `<unk>`, 1 `<s>`, 2 `</s>`,
/// 3 `<|im_start|>`, 4 `<|im_end|>`, then bytes 0x05..0xFF as byte-fallback tokens.
pub fn tokenizer_json() -> String {
    let specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"];
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for b in 0..=255u32 {
        match specials.get(b as usize) {
            Some(s) => {
                vocab.insert(s.to_string(), json!(b));
                added.push(
                    json!({"id": b, "content": s, "single_word": false, "lstrip": false,
                                  "rstrip": false, "normalized": false, "special": true}),
                );
            }
            None => {
                vocab.insert(format!("<0x{b:02X}>"), json!(b));
            }
        }
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    })
    .to_string()
}

pub fn tokenizer_config() -> String {
    json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE}).to_string()
}

pub const CATALOG: &str = r#"
[[model]]
id = "tiny"
name = "Tiny Llama (bundled)"
bundled = "models/tiny"
files = ["tokenizer.json", "tokenizer_config.json"]
context_length = 32
kv_values_per_token = 128
overhead_bytes = 1000

[[model.variant]]
id = "portable-fp32"
backend = "portable"
quantization = "fp32"
file = "model.pte"
approx_bytes = 500000

[[model]]
id = "remote"
name = "Tiny Llama (hub)"
repo = "org/tiny"
revision = "v1"
files = ["tok/tokenizer.json", "tok/tokenizer_config.json"]
context_length = 32
kv_values_per_token = 128
overhead_bytes = 1000

[[model.variant]]
id = "cpu-fp32"
backend = "portable"
quantization = "fp32"
file = "cpu/model.pte"
approx_bytes = 500000
"#;

/// The files of the hub model: (path in the repository, bytes, stored with LFS).
pub fn remote_files(fixtures: &Path) -> Vec<(&'static str, Vec<u8>, bool)> {
    let program = std::fs::read(fixtures.join(PROGRAM)).expect("fixture program");
    vec![
        ("cpu/model.pte", program, true),
        ("tok/tokenizer.json", tokenizer_json().into_bytes(), false),
        (
            "tok/tokenizer_config.json",
            tokenizer_config().into_bytes(),
            false,
        ),
    ]
}

/// Writes the bundled model under `<root>/assets/models/tiny` and returns a core config with its
/// data directory at `<root>/data`, the hub at `endpoint`, a CPU-only 4 GB device, fast retries.
pub fn config(root: &Path, fixtures: &Path, endpoint: String) -> CoreConfig {
    let bundled = root.join("assets/models/tiny");
    std::fs::create_dir_all(&bundled).expect("assets dir");
    std::fs::copy(fixtures.join(PROGRAM), bundled.join("model.pte")).expect("copy program");
    std::fs::write(bundled.join("tokenizer.json"), tokenizer_json()).expect("tokenizer");
    std::fs::write(bundled.join("tokenizer_config.json"), tokenizer_config()).expect("config");
    CoreConfig {
        data_dir: root.join("data"),
        assets_dir: root.join("assets"),
        catalog: Catalog::from_toml(CATALOG).expect("test catalog"),
        hub: HubConfig {
            endpoint,
            token: None,
        },
        download: DownloadOptions {
            retry: RetryPolicy {
                attempts: 2,
                first_delay: Duration::from_millis(10),
                max_delay: Duration::from_millis(20),
            },
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(5),
            available_space: Some(1 << 30),
        },
        device_facts: Some(DeviceFacts {
            os: Os::current(),
            gpus: Vec::new(),
            memory: Some(Memory {
                total_bytes: 8 << 30,
                available_bytes: 4 << 30,
            }),
            notes: Vec::new(),
        }),
        runner: RunnerConfig::default(),
        context: ContextPolicy { reserve_tokens: 4 },
    }
}

pub fn program_path(fixtures: &Path) -> PathBuf {
    fixtures.join(PROGRAM)
}
