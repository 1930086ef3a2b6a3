//! The real window under Xvfb: `pteria-desktop` is started on a data directory holding a
//! conversation with a markdown reply (and, when the bundled demo model is in assets/, sends it a
//! message and waits for the streamed reply), saves what its window shows as a PNG and exits.
//! The PNG is kept in the target directory for a person to look at.
//!
//! Needs `xvfb-run` (Debian `xvfb`, which scripts/test.sh installs); PTERIA_NO_XVFB_TESTS=1 skips
//! it where no X server can be had.

use pteria::chat::store::{new_id, now_ms, Store};
use pteria::chat::{Author, MessageStats, Settings, StoredMessage};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const REPLY: &str = "Here is how to **count words** in a file:

1. Read the file *line by line*.
2. Split each line on whitespace.
   - Empty lines count as `0`.
3. Add up the counts.

```rust
fn words(text: &str) -> usize {
    text.split_whitespace().count()
}
```

> Tip: `wc -w` does the same from a shell.";

const DEMO_MODEL: &str = "models/smollm2-135m-instruct";

fn message(author: Author, content: &str, stats: Option<MessageStats>) -> StoredMessage {
    StoredMessage {
        id: new_id(),
        author,
        content: content.into(),
        created_at: now_ms(),
        stats,
        stopped: false,
        error: None,
    }
}

fn has_xvfb() -> bool {
    Command::new("xvfb-run")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

#[test]
fn the_window_under_xvfb_shows_a_markdown_conversation() {
    if std::env::var_os("PTERIA_NO_XVFB_TESTS").is_some() {
        eprintln!("skipped: PTERIA_NO_XVFB_TESTS is set");
        return;
    }
    assert!(
        has_xvfb(),
        "xvfb-run is missing: install Debian's xvfb (scripts/test.sh does) or set PTERIA_NO_XVFB_TESTS=1"
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut store, _) = Store::open(data.join("conversations")).unwrap();
    let c = store.create(Some("Counting words")).unwrap();
    let stats = MessageStats {
        model: "smollm2-135m-instruct:portable-fp32".into(),
        prompt_tokens: 31,
        cached_tokens: 0,
        generated_tokens: 96,
        ttft_ms: Some(84.0),
        prefill_tokens_per_s: 370.0,
        decode_tokens_per_s: 41.3,
        stop: "end of turn".into(),
        dropped_messages: 0,
        context_tokens: 2048,
        seed: 7,
    };
    store
        .update(&c.id, |c| {
            c.messages.push(message(
                Author::User,
                "How do I count the words in a file?",
                None,
            ));
            c.messages
                .push(message(Author::Assistant, REPLY, Some(stats.clone())));
        })
        .unwrap();
    drop(store);

    let repo_assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets");
    let demo = repo_assets.join(DEMO_MODEL).is_dir();
    let assets = if demo {
        // Short greedy replies keep the run quick on CPU.
        Settings {
            temperature: 0.0,
            max_tokens: Some(24),
            device: pteria::chat::DeviceChoice::Cpu,
            ..Settings::default()
        }
        .save(&data.join("settings.json"))
        .unwrap();
        repo_assets
    } else {
        dir.path().join("no-assets")
    };

    let png_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pteria-desktop.png");
    let _ = std::fs::remove_file(&png_path);
    let mut cmd = Command::new("xvfb-run");
    cmd.args(["-a", "-s", "-screen 0 1280x900x24"])
        .arg(env!("CARGO_BIN_EXE_pteria-desktop"))
        .arg("--data-dir")
        .arg(&data)
        .arg("--assets")
        .arg(&assets)
        .arg("--screenshot")
        .arg(&png_path);
    if demo {
        cmd.args(["--send", "Say hello."]);
    }
    let mut child = cmd.spawn().expect("starting xvfb-run");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!("pteria-desktop did not save its screenshot within 300 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "pteria-desktop under xvfb-run: {status}");

    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&png_path).expect("no screenshot was saved"),
    ));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgba);
    let (w, h) = (info.width as usize, info.height as usize);
    assert!(
        w >= 760 && h >= 520,
        "{w}x{h}: smaller than the window's minimum"
    );
    eprintln!("screenshot: {} ({w}x{h})", png_path.display());

    let rgb = |x: usize, y: usize| {
        let i = (y * w + x) * 4;
        (pixels[i], pixels[i + 1], pixels[i + 2])
    };
    // The code block's background (#1f2937) fills a box of its own: the reply was rendered as
    // blocks, not as raw markdown.
    let code_bg = (0..h)
        .flat_map(|y| (0..w).map(move |x| (x, y)))
        .filter(|&(x, y)| rgb(x, y) == (0x1f, 0x29, 0x37))
        .count();
    assert!(code_bg > 5_000, "code block background: {code_bg} pixels");
    // And there is text on it: light pixels inside the code block's rows.
    let code_rows: Vec<usize> = (0..h)
        .filter(|&y| (0..w).filter(|&x| rgb(x, y) == (0x1f, 0x29, 0x37)).count() > 200)
        .collect();
    let glyphs = code_rows
        .iter()
        .flat_map(|&y| (0..w).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let (r, g, b) = rgb(x, y);
            r > 150 && g > 150 && b > 150
        })
        .count();
    assert!(glyphs > 200, "code text pixels: {glyphs}");
}
