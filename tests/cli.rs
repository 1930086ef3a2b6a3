//! The `pteria` binary as users and outside checks call it: `inspect`, `logits`, `generate`.

mod common;

use common::{fixture, pteria};

#[test]
fn inspect_describes_methods_metadata_and_weights() {
    let (ok, out, err) = pteria(&["inspect", &fixture("gemma4_tiny_portable_fp32.pte")]);
    assert!(ok, "{err}");
    assert!(out.contains("forward:"), "{out}");
    // tokens [1, T] with a dynamic upper bound, positions [T].
    assert!(
        out.contains("input 0: i64[1, 31] (dynamic, upper bounds)"),
        "{out}"
    );
    assert!(out.contains("get_max_seq_len = 32"), "{out}");
    assert!(out.contains("get_eos_ids = [1, 106]"), "{out}");
    assert!(out.contains("use_kv_cache = true"), "{out}");
    assert!(out.contains("weights total:"), "{out}");
    assert!(
        !out.contains("[not supported]"),
        "every portable operator must be implemented:\n{out}"
    );
}

#[test]
fn inspect_names_the_delegate_backend() {
    let (ok, out, err) = pteria(&["inspect", &fixture("gemma4_tiny_vulkan_fp32.pte")]);
    assert!(ok, "{err}");
    assert!(out.contains("backend VulkanBackend"), "{out}");
}

/// Which ops run where: kernel calls outside delegates on the CPU runtime, each delegate's blob
/// ops and the IR ops they lower to; delegates with the same ops print once.
#[test]
fn inspect_says_which_ops_run_where() {
    let (ok, out, err) = pteria(&["inspect", &fixture("gemma4_tiny_vulkan_fp32.pte")]);
    assert!(ok, "{err}");
    let ir = out
        .split("IR ops:")
        .nth(1)
        .unwrap_or_else(|| panic!("no IR op list:\n{out}"));
    // The decomposed RMSNorm is fused on the way.
    assert!(
        ir.contains("x linear[f32]") && ir.contains("x rms_norm"),
        "{out}"
    );
    assert!(out.contains("delegates: 1 (1 distinct)"), "{out}");

    let (ok, out, err) = pteria(&["inspect", &fixture("gemma4_tiny_xnnpack_8da4w.pte")]);
    assert!(ok, "{err}");
    let cpu = out
        .split("operators outside delegates (CPU runtime kernels):")
        .nth(1)
        .and_then(|s| s.split("delegates:").next())
        .unwrap_or_else(|| panic!("no CPU kernel list:\n{out}"));
    assert!(cpu.contains("x llama::custom_sdpa.out"), "{out}");
    assert!(!cpu.contains("[not supported]"), "{out}");
    // ~120 XNNPACK partitions, far fewer distinct ones.
    let line = out.lines().find(|l| l.contains("delegates: ")).unwrap();
    let nums: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect();
    assert!(nums[0] > 100 && nums[1] < nums[0], "{line}");
    assert_eq!(out.matches("\n    delegate ").count(), nums[1], "{out}");
    assert!(out.contains("same ops in "), "{out}");
    assert!(out.contains("x linear[q4g32,dq8-xnn]"), "{out}");
    assert!(
        out.contains("execution: whole method as one IR graph"),
        "{out}"
    );
}

/// `inspect --ir` lists the graph the executors run: one line an op (as many as the summary
/// counts) or host integer, after the load-time passes.
#[test]
fn inspect_lists_the_ir_graph_after_its_passes() {
    let file = fixture("gemma4_tiny_xnnpack_8da4w.pte");
    let (ok, out, err) = pteria(&["inspect", "--ir", &file]);
    assert!(ok, "{err}");
    let listing = out
        .split("forward IR:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no listing:\n{out}"));
    let count: usize = out
        .split("as one IR graph (")
        .nth(1)
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no op count:\n{out}"));
    let ops: Vec<&str> = listing.lines().filter(|l| l.contains(") -> (")).collect();
    assert_eq!(ops.len(), count, "{listing}");
    // The 8 caches are written in place, and attention reads them whole: neither the export's
    // cuts to pos + S rows nor copies of the whole cache are left.
    let updates = ops
        .iter()
        .filter(|l| l.contains("cache_update CacheUpdate") && l.contains("] state, "))
        .count();
    assert_eq!(updates, 8, "{listing}");
    assert!(
        !ops.iter()
            .any(|l| l.contains("Slice { dim: 2,") || l.contains(" Copy ")),
        "{listing}"
    );
    assert!(listing.contains("ReadInput {"), "{listing}");
    assert!(
        listing.lines().last().unwrap().contains("outputs: %"),
        "{listing}"
    );
    let (ok, out, err) = pteria(&["inspect", "--ir", &fixture("gemma4_tiny_portable_fp32.pte")]);
    assert!(ok, "{err}");
    assert!(
        out.contains("(not one graph: the method has no delegates)"),
        "{out}"
    );
}

/// `inspect --instructions` lists every instruction, in order, with its arguments.
#[test]
fn inspect_lists_instructions_with_their_arguments() {
    let file = fixture("gemma4_tiny_xnnpack_8da4w.pte");
    let (ok, out, err) = pteria(&["inspect", "--instructions", &file]);
    assert!(ok, "{err}");
    let listing = out
        .split("instructions of forward:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no listing:\n{out}"));
    let lines: Vec<&str> = listing.lines().collect();
    let count: usize = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("instructions: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no instruction count:\n{out}"));
    assert_eq!(lines.len(), count, "{listing}");
    // The first reads the token count off input 0: a size, a constant dim, the returned value.
    assert!(
        lines[0].trim_start().starts_with("0 aten::sym_size.int(%")
            && lines[0].contains("i64[1, 31] (dynamic, upper bounds)"),
        "{}",
        lines[0]
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("delegate 0 (XnnpackBackend)(")),
        "{listing}"
    );
    // Constants are marked; int lists show their members.
    assert!(lines.iter().any(|l| l.contains(" const")), "{listing}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("aten::permute_copy.out(") && l.contains("[%")),
        "{listing}"
    );
    let (ok, plain, _) = pteria(&["inspect", &file]);
    assert!(ok && !plain.contains("instructions of forward:"), "{plain}");

    // A reader that stops after a line (`| head -1`) ends the listing quietly, not in a panic
    // (the listing, ~97 KB, is more than a pipe holds, so the writer meets the closed end).
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pteria"))
        .args(["inspect", "--instructions", &file])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run pteria");
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(first.starts_with("program: "), "{first}");
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
}

#[test]
fn logits_prints_one_json_object_with_every_call() {
    let (ok, out, err) = pteria(&[
        "logits",
        &fixture("llama_tiny_portable_fp32.pte"),
        "--prompt",
        "5,7,9",
        "--decode",
        "3,8",
        "--device",
        "cpu",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("stdout is one JSON object");
    let steps = v["steps"].as_array().expect("steps array");
    assert_eq!(steps.len(), 3, "prompt + 2 decode calls");
    let vocab = steps[0].as_array().unwrap().len();
    assert!(vocab > 1);
    for s in steps {
        assert_eq!(s.as_array().unwrap().len(), vocab);
        assert!(s
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x.as_f64().is_some_and(f64::is_finite)));
    }
    assert_ne!(
        steps[1], steps[2],
        "different decode tokens give different logits"
    );
}

#[test]
fn logits_errors_go_to_stderr_with_a_nonzero_exit() {
    let (ok, out, err) = pteria(&["logits", &fixture("does_not_exist.pte"), "--prompt", "1"]);
    assert!(!ok);
    assert!(out.is_empty());
    assert!(err.contains("does_not_exist.pte"), "{err}");

    let (ok, _, err) = pteria(&[
        "logits",
        &fixture("gemma4_tiny_portable_fp32.pte"),
        "--prompt",
        "1",
        "--device",
        "tpu",
    ]);
    assert!(!ok);
    assert!(err.contains("unknown device"), "{err}");

    // A prompt longer than the program's declared bound is refused with the bound in the message.
    let long: Vec<String> = (0..40).map(|i| (i % 50).to_string()).collect();
    let (ok, _, err) = pteria(&[
        "logits",
        &fixture("gemma4_tiny_portable_fp32.pte"),
        "--prompt",
        &long.join(","),
    ]);
    assert!(!ok);
    assert!(err.contains("exceeds the declared bounds"), "{err}");
}

/// Every line of the "blob ops" and of the "IR ops" histograms over all delegates in `inspect`'s
/// output.
fn delegate_histograms(out: &str) -> (Vec<String>, Vec<String>) {
    let lines: Vec<&str> = out.lines().collect();
    let section = |title: &str| -> Vec<String> {
        let mut v = Vec::new();
        for (at, _) in lines.iter().enumerate().filter(|(_, l)| l.trim() == title) {
            v.extend(
                lines[at + 1..]
                    .iter()
                    .take_while(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
                    .map(|l| l.trim().to_string()),
            );
        }
        v
    };
    (section("blob ops:"), section("IR ops:"))
}

#[test]
fn inspect_shows_blob_nodes_and_the_ir_ops_they_lower_to_for_every_format() {
    for (file, node, ir) in [
        (
            "gemma4_tiny_mlx_int4.pte",
            "52 x QuantizedMatmulNode",
            "52 x linear[q4g32]",
        ),
        (
            "gemma4_tiny_vulkan_8da4w.pte",
            "52 x et_vk.linear_dq8ca_q4gsw.default",
            "52 x linear[q4g32,dq8]",
        ),
        (
            "gemma4_tiny_xnnpack_8da4w.pte",
            "3 x XNNFullyConnected",
            "3 x linear[q4g32,dq8-xnn]",
        ),
    ] {
        let (ok, out, err) = pteria(&["inspect", &fixture(file)]);
        assert!(ok, "{file}: {err}");
        assert!(!out.contains("does not lower"), "{file}:\n{out}");
        let (nodes, ops) = delegate_histograms(&out);
        assert!(
            nodes.iter().any(|l| l == node),
            "{file} blob ops: {nodes:?}"
        );
        assert!(ops.iter().any(|l| l == ir), "{file} IR ops: {ops:?}");
    }
}

/// A model directory around a fixture program: a 256-entry byte tokenizer (id 0 `<eos>`) and a
/// chat template that writes the messages' text.
fn byte_model_dir(program: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut vocab = serde_json::Map::new();
    vocab.insert("<eos>".into(), 0.into());
    for b in 1..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), b.into());
    }
    let tj = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "<eos>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<eos>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    let cfg = serde_json::json!({
        "eos_token": "<eos>",
        "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
    });
    std::fs::write(dir.path().join("tokenizer.json"), tj.to_string()).expect("write");
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).expect("write");
    std::fs::copy(common::fixtures().join(program), dir.path().join(program)).expect("copy");
    dir
}

#[test]
fn generate_runs_an_xnnpack_program_on_the_cpu_and_the_gpu_executor() {
    let dir = byte_model_dir("llama_tiny_xnnpack_8da4w.pte");
    let model = dir.path().to_string_lossy().into_owned();
    for device in ["cpu", "gpu"] {
        let (ok, _, err) = pteria(&[
            "generate",
            "--model",
            &model,
            "--prompt",
            "hello",
            "--temperature",
            "0",
            "--max-tokens",
            "4",
            "--stats",
            "--device",
            device,
        ]);
        assert!(ok, "--device {device}: {err}");
        // 4 tokens, or fewer if the model ended its turn: either way a finished reply.
        assert!(
            err.contains("stop: max tokens") || err.contains("stop: end of turn"),
            "--device {device}: {err}"
        );
    }
    let (ok, _, err) = pteria(&[
        "generate", "--model", &model, "--prompt", "x", "--device", "tpu",
    ]);
    assert!(!ok);
    assert!(err.contains("unknown device `tpu`"), "{err}");
}

/// `--kv f16` says when the caches are not all f16: a program without delegates keeps its caches
/// with CPU ops; the XNNPACK and stock Vulkan exports run as one graph whose caches are cache
/// updates on the GPU, all f16, and nothing is said.
#[test]
fn generate_says_when_kv_f16_finds_no_cache_to_hold() {
    if common::gpu_context().is_none() {
        return;
    }
    for (program, note) in [
        ("llama_tiny_portable_fp32.pte", true),
        ("llama_tiny_xnnpack_8da4w.pte", false),
        ("gemma4_tiny_vulkan_stock_8da4w_emb4.pte", false),
    ] {
        let dir = byte_model_dir(program);
        let model = dir.path().to_string_lossy().into_owned();
        let (ok, _, err) = pteria(&[
            "generate",
            "--model",
            &model,
            "--prompt",
            "hello",
            "--temperature",
            "0",
            "--max-tokens",
            "2",
            "--device",
            "gpu",
            "--kv",
            "f16",
        ]);
        assert!(ok, "{program}: {err}");
        assert_eq!(
            err.contains(
                "--kv f16: this program keeps no KV cache on the GPU (its caches live with CPU \
                 ops), so none is held as f16"
            ),
            note,
            "{program}: {err}"
        );
        assert!(!err.contains("are f16; the others"), "{program}: {err}");
    }
}

/// `pteria generate` without `--model` uses the bundled demo model and answers the README's question.
#[test]
fn generate_defaults_to_the_bundled_demo_model() {
    let (ok, out, err) = pteria(&[
        "generate",
        "--prompt",
        "What is the capital of France?",
        "--temperature",
        "0",
        "--max-tokens",
        "16",
        "--device",
        "cpu",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("Paris"), "{out}");
}

/// `--tables gpu` keeps big embedding tables in GPU memory: the same greedy reply as on the
/// host and as `auto`; with the CPU executor, or a placement that does not exist, a clear error.
#[test]
fn generate_places_tables_as_asked() {
    let dir = byte_model_dir("gemma4_tiny_vulkan_stock_8da4w_emb4.pte");
    let model = dir.path().to_string_lossy().into_owned();
    let run = |device: &str, tables: &str| {
        pteria(&[
            "generate",
            "--model",
            &model,
            "--prompt",
            "hello",
            "--temperature",
            "0",
            "--max-tokens",
            "6",
            "--device",
            device,
            "--tables",
            tables,
        ])
    };
    let (ok, _, err) = run("cpu", "gpu");
    assert!(!ok);
    assert!(
        err.contains(
            "embedding tables in GPU memory (--tables gpu) need the GPU executor (--device gpu), \
             not --device cpu"
        ),
        "{err}"
    );
    let (ok, _, err) = run("cpu", "disk");
    assert!(!ok);
    assert!(err.contains("unknown table placement `disk`"), "{err}");
    // auto (the default) decides on the GPU it opens, and asks nothing of the CPU.
    let (ok, _, err) = run("cpu", "auto");
    assert!(ok, "{err}");
    if common::gpu_context().is_none() {
        return;
    }
    let (ok, host, err) = run("gpu", "host");
    assert!(ok, "{err}");
    let (ok, gpu, err) = run("gpu", "gpu");
    assert!(ok, "{err}");
    let (ok, auto, err) = run("gpu", "auto");
    assert!(ok, "{err}");
    assert_eq!(host, gpu);
    assert_eq!(host, auto);
    assert!(!host.trim().is_empty());
}
