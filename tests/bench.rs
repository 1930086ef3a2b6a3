//! `pteria bench`: the kernel table and program benchmarks report well-formed, self-consistent
//! numbers (never checked against timings: CI machines vary).

mod common;

use common::{fixture, pteria};
use serde_json::Value;

fn no_gpu() -> bool {
    std::env::var("PTERIA_NO_GPU_TESTS").is_ok_and(|v| v == "1")
}

fn json(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{out}"))
}

#[test]
fn kernel_bench_reports_every_shape_and_format() {
    if no_gpu() {
        return;
    }
    let (ok, out, err) = pteria(&[
        "bench",
        "--kernels",
        "--json",
        "--mib",
        "1",
        "--shapes",
        "256x64,384x40",
        "--weights",
        "f32,q4g32,q4g128dq8",
        "--rows",
        "2",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    let (dots, fmas) = (
        v["arith"]["dots_per_s"].as_f64().unwrap(),
        v["arith"]["fmas_per_s"].as_f64().unwrap(),
    );
    assert!(dots > 0.0 && fmas > 0.0, "{v}");
    assert!(v["stream_gb_per_s"].as_f64().unwrap() > 0.0, "{v}");
    // The yardstick is the fastest of its copies, each within the device's binding.
    let sizes = v["stream_sizes"].as_array().unwrap();
    assert!(!sizes.is_empty(), "{v}");
    let best = sizes
        .iter()
        .map(|s| s[1].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(best, v["stream_gb_per_s"].as_f64().unwrap(), "{v}");
    assert!(sizes.iter().any(|s| s[0] == v["stream_bytes"]), "{v}");
    assert!(v["dependent_dispatch_us"].as_f64().unwrap() > 0.0, "{v}");
    // On Vulkan the driver's own chains ran too; the probe fails unless the chain with barriers
    // left its input negated 255 times.
    if v["adapter"].as_str().unwrap().contains("(vulkan,") {
        let raw = &v["raw_vulkan"];
        assert!(v["raw_vulkan_error"].is_null(), "{v}");
        for t in ["dependent_us", "dependent_uniform_us", "back_to_back_us"] {
            assert!(raw[t].as_f64().unwrap() > 0.0, "{raw}");
        }
    }
    // One workgroup always passes its barriers; larger grids report a time or their failures.
    let grids = v["grid_barrier"].as_array().unwrap();
    assert_eq!(grids[0]["workgroups"].as_u64(), Some(1), "{v}");
    assert!(grids[0]["us"].as_f64().unwrap() > 0.0, "{v}");
    for g in grids {
        let failed = g["failures"].as_u64().unwrap() + g["stale"].as_u64().unwrap() > 0;
        assert_eq!(g["us"].is_null(), failed, "{g}");
    }
    // A token's pick from a GPU's row of logits, both ways; at top-k 64 at least 64 candidates,
    // and few enough that the pick never reads the row (the bench fails if one does).
    let picks = &v["picks"];
    assert_eq!(picks["vocab"].as_u64(), Some(262144), "{picks}");
    for t in [
        "greedy_row_us",
        "greedy_candidates_us",
        "default_row_us",
        "default_candidates_us",
        "greedy_ahead_us",
        "default_ahead_us",
    ] {
        assert!(picks[t].as_f64().unwrap() > 0.0, "{picks}");
    }
    // The device's draws one ahead are the host's (f32 against f64 can differ only where the
    // uniform number falls on a boundary, none of these 420).
    assert_eq!(picks["default_ahead_missed"].as_u64(), Some(0), "{picks}");
    let found = picks["default_found"].as_u64().unwrap();
    assert!((64..=1024).contains(&found), "{picks}");
    let rows = v["matvec"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{v}");
    for r in rows {
        let (k, n) = (r["k"].as_u64().unwrap(), r["n"].as_u64().unwrap());
        let group = r["group"].as_u64().unwrap();
        // Packed weights plus an f32 scale and bias per group.
        let want = match r["weight"].as_str().unwrap() {
            "f32" => n * k * 4,
            "q4" => n * k / 2 + 8 * n * (k / group),
            w => panic!("unexpected weight {w}"),
        };
        assert_eq!(r["bytes"].as_u64().unwrap(), want, "{r}");
        // x and y in f32, and x's int8 rows with a scale and zero point each where it quantizes.
        let m = r["m"].as_u64().unwrap();
        let acts = 4 * m * (k + n)
            + if r["dynamic_int8"].as_bool().unwrap() {
                m * (k + 8)
            } else {
                0
            };
        assert_eq!(r["activation_bytes"].as_u64(), Some(acts), "{r}");
        // Just enough layers for 1 MiB of weights and activations a case.
        let layers = r["layers"].as_u64().unwrap();
        assert!(layers * (want + acts) >= 1 << 20, "{r}");
        assert!((layers - 1) * (want + acts) < 1 << 20, "{r}");
        let (us, gbs) = (r["us"].as_f64().unwrap(), r["gb_per_s"].as_f64().unwrap());
        assert!(us > 0.0 && gbs > 0.0, "{r}");
        assert!((gbs - want as f64 / us / 1e3).abs() <= 1e-6 * gbs, "{r}");
        let pct = 100.0 * gbs / v["stream_gb_per_s"].as_f64().unwrap();
        assert!(
            (r["pct_of_stream"].as_f64().unwrap() - pct).abs() < 1e-6 * pct,
            "{r}"
        );
        // Two rows of x: 2·K·N multiply-adds, against four a dot product (int8 activations) or
        // one an f32 multiply-add.
        assert_eq!(r["m"].as_u64(), Some(2), "{r}");
        let macs = (2 * k * n) as f64 / (us * 1e-6);
        let tops = r["tops"].as_f64().unwrap();
        assert!((tops - 2.0 * macs / 1e12).abs() <= 1e-6 * tops, "{r}");
        let peak = if r["dynamic_int8"].as_bool().unwrap() {
            4.0 * dots
        } else {
            fmas
        };
        let pct = 100.0 * macs / peak;
        assert!(
            (r["pct_of_arith"].as_f64().unwrap() - pct).abs() <= 1e-6 * pct,
            "{r}"
        );
    }
    let formats: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r["weight"].as_str().unwrap(),
                r["dynamic_int8"].as_bool().unwrap(),
            )
        })
        .collect();
    assert!(formats.contains(&("q4", true)), "{formats:?}");
}

#[test]
fn kernel_bench_rejects_unknown_formats_and_shapes() {
    let (ok, _, err) = pteria(&["bench", "--kernels", "--weights", "q3g7"]);
    assert!(!ok && err.contains("unknown weight format `q3g7`"), "{err}");
    let (ok, _, err) = pteria(&["bench", "--kernels", "--shapes", "1536"]);
    assert!(!ok && err.contains("`1536` is not KxN"), "{err}");
    let (ok, _, err) = pteria(&["bench", "--kernels", "--rows", "0"]);
    assert!(!ok && err.contains("--rows must be at least 1"), "{err}");
}

/// Sizes a device cannot run are refused before any benchmark runs or host memory is taken:
/// no panic, no abort, no other table first.
#[test]
fn kernel_bench_refuses_hostile_sizes_up_front() {
    if no_gpu() {
        return;
    }
    let max = u64::MAX.to_string();
    let huge = format!("{max}x{max}");
    for (args, want) in [
        (
            vec!["--shapes", "0x64"],
            "1 rows of 0x64 (q4g128dq8): a dimension is 0",
        ),
        (
            vec!["--shapes", "100x64"],
            "K is not a multiple of the group size 128",
        ),
        (
            vec!["--rows", &max, "--shapes", "64x64"],
            "is too large to benchmark",
        ),
        (vec!["--shapes", &huge], "is too large to benchmark"),
        (
            vec!["--rows", "100000", "--shapes", "12288x12288"],
            "an activation of 4915200000 bytes is more than the device's",
        ),
    ] {
        let mut a = vec!["bench", "--kernels", "--weights", "q4g128dq8"];
        a.extend(args);
        let (ok, out, err) = pteria(&a);
        assert!(!ok && err.contains(want), "{a:?}: {err}");
        // Refused before the copy, dispatch and attention tables.
        assert!(out.trim().is_empty(), "{a:?}: {out}");
    }
}

fn check_program_report(v: &Value, gpu: bool) {
    assert_eq!(v["prompt_len"], 5, "{v}");
    assert_eq!(v["decode_steps"], 3, "{v}");
    for key in [
        "ttft_ms",
        "ttft_cold_ms",
        "prefill_tok_per_s",
        "decode_ms",
        "decode_tok_per_s",
    ] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    let tps = v["decode_tok_per_s"].as_f64().unwrap();
    assert!(
        (tps * v["decode_ms"].as_f64().unwrap() - 1e3).abs() < 1e-6 * 1e3,
        "{v}"
    );
    if cfg!(target_os = "linux") {
        assert!(v["peak_host_bytes"].as_u64().unwrap() > 1 << 20, "{v}");
    }
    if gpu {
        // The tiny model's weights alone are a few hundred KiB.
        assert!(v["gpu_bytes"].as_u64().unwrap() > 100 << 10, "{v}");
        // The step's replay against the floor its dispatch chain sets, from the parts reported.
        let (us, n, d) = (
            v["decode_replay_gpu_us"].as_f64().unwrap(),
            v["dispatches_per_token"].as_f64().unwrap(),
            v["dependent_dispatch_us"].as_f64().unwrap(),
        );
        let f = v["decode_vs_dispatch_floor"].as_f64().unwrap();
        assert!(d > 0.0 && (f - us / (n * d)).abs() <= 1e-9 * f, "{v}");
        // The longest chain of dependent dispatches: some of them (every layer waits for the
        // last), and fewer than all (a layer's k and v run beside its q).
        let chain = v["dispatch_chain_per_token"].as_f64().unwrap();
        assert!(chain > 10.0 && chain < n, "{v}");
        let ops = v["decode_ops"].as_array().unwrap();
        if let Some(total) = v["decode_gpu_us"].as_f64() {
            assert!(ops
                .iter()
                .any(|o| o["op"].as_str().unwrap().starts_with("linear")));
            let sum: f64 = ops.iter().map(|o| o["us"].as_f64().unwrap()).sum();
            assert!((sum - total).abs() <= 1e-6 * total, "{v}");
        }
    } else {
        assert!(v["gpu_bytes"].is_null() && v["decode_ops"].as_array().unwrap().is_empty());
    }
}

#[test]
fn program_bench_reports_prefill_decode_and_memory() {
    let f = fixture("gemma4_tiny_vulkan_8da4w.pte");
    let base = ["bench", &f, "--prompt-len", "5", "--decode", "3", "--json"];
    let (ok, out, err) = pteria(&[&base[..], &["--device", "cpu"]].concat());
    assert!(ok, "{err}");
    check_program_report(&json(&out), false);
    if no_gpu() {
        return;
    }
    let (ok, out, err) = pteria(&[&base[..], &["--device", "gpu"]].concat());
    assert!(ok, "{err}");
    check_program_report(&json(&out), true);
}

/// With `--decode 0` the GPU time by op is the prompt's call's: its ops add up to its total, and
/// no decode step is reported.
#[test]
fn program_bench_without_decode_times_the_prompts_ops() {
    if no_gpu() {
        return;
    }
    let f = fixture("gemma4_tiny_vulkan_8da4w.pte");
    let args = [
        "bench",
        &f,
        "--prompt-len",
        "12",
        "--decode",
        "0",
        "--device",
        "gpu",
    ];
    let (ok, out, err) = pteria(&[&args[..], &["--json"]].concat());
    assert!(ok, "{err}");
    let v = json(&out);
    assert!(v["decode_gpu_us"].is_null(), "{v}");
    assert!(v["decode_ops"].as_array().unwrap().is_empty(), "{v}");
    // Timestamps are optional; lavapipe and NVIDIA's driver have them.
    if let Some(total) = v["prefill_gpu_us"].as_f64() {
        let ops = v["prefill_ops"].as_array().unwrap();
        let has = |p: &str| ops.iter().any(|o| o["op"].as_str().unwrap().starts_with(p));
        assert!(has("linear") && has("sdpa"), "{v}");
        let sum: f64 = ops.iter().map(|o| o["us"].as_f64().unwrap()).sum();
        assert!(total > 0.0 && (sum - total).abs() <= 1e-6 * total, "{v}");
        let (ok, out, err) = pteria(&args);
        assert!(ok, "{err}");
        assert!(out.contains("prompt's call GPU time by op"), "{out}");
    }
    // With decode steps the prompt's call is not timed by op.
    let (ok, out, err) = pteria(&["bench", &f, "--prompt-len", "5", "--decode", "2", "--json"]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert!(v["prefill_gpu_us"].is_null(), "{v}");
    assert!(v["prefill_ops"].as_array().unwrap().is_empty(), "{v}");
}

/// `--start` times a chat turn: the prompt's call from that position, attention reading the
/// earlier rows, its decode steps after it; on the GPU its per-op table has the attention. A
/// turn past the positions the method takes is refused.
#[test]
fn program_bench_times_a_chat_turn_from_its_start() {
    let f = fixture("gemma4_tiny_vulkan_8da4w.pte");
    let device = if no_gpu() { "cpu" } else { "gpu" };
    let base = [
        "bench",
        &f,
        "--prompt-len",
        "5",
        "--device",
        device,
        "--json",
    ];
    let (ok, out, err) = pteria(&[&base[..], &["--start", "20", "--decode", "3"]].concat());
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(v["start"], 20, "{v}");
    assert_eq!(v["prompt_len"], 5, "{v}");
    assert!(v["ttft_ms"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["decode_ms"].as_f64().unwrap() > 0.0, "{v}");
    let (ok, out, err) = pteria(&[&base[..], &["--start", "20", "--decode", "0"]].concat());
    assert!(ok, "{err}");
    let v = json(&out);
    if let Some(ops) = v["prefill_ops"].as_array().filter(|o| !o.is_empty()) {
        assert!(
            ops.iter()
                .any(|o| o["op"].as_str().unwrap().starts_with("sdpa")),
            "{v}"
        );
    }
    let cpu = [
        "bench",
        &f,
        "--prompt-len",
        "5",
        "--device",
        "cpu",
        "--start",
    ];
    let (ok, out, err) = pteria(&[&cpu[..], &["20", "--decode", "3"]].concat());
    assert!(ok, "{err}");
    assert!(
        out.contains("prefill 5 tokens from position 20: TTFT"),
        "{out}"
    );
    // The tiny export's caches hold 32 positions.
    let (ok, _, err) = pteria(&[&cpu[..], &["20", "--decode", "8"]].concat());
    assert!(
        !ok && err.contains(
            "--start 20 with --prompt-len 5 and --decode 8 reaches position 32, past the 32"
        ),
        "{err}"
    );
}

#[test]
fn program_bench_rejects_a_prompt_longer_than_the_method_takes() {
    let f = fixture("gemma4_tiny_vulkan_8da4w.pte");
    let (ok, _, err) = pteria(&["bench", &f, "--prompt-len", "5000", "--device", "cpu"]);
    assert!(!ok && err.contains("--prompt-len must be 1..="), "{err}");
    // A first prompt's decode steps past the cache's 32 positions, and a start past 64 bits,
    // refused before any call (a step past the cache failed deep in a linear before).
    let base = ["bench", &f, "--prompt-len", "8", "--device", "cpu"];
    let (ok, _, err) = pteria(&[&base[..], &["--decode", "25"]].concat());
    assert!(
        !ok && err.contains("--decode 25 reaches position 32, past the 32 this program's cache"),
        "{err}"
    );
    let max = u64::MAX.to_string();
    let (ok, _, err) = pteria(&[&base[..], &["--start", &max]].concat());
    assert!(!ok && err.contains("reaches position past 2^64"), "{err}");
    let (ok, _, err) = pteria(&["bench"]);
    assert!(
        !ok && err.contains("give a program to benchmark, or --kernels"),
        "{err}"
    );
}

/// `--kv f16` reports the KV caches' bytes (half of f32's) and the logits' error against the same
/// calls with f32 caches; asking for it where the CPU executor would run is an error.
#[test]
fn program_bench_with_f16_kv_caches_reports_their_bytes_and_error() {
    let f = fixture("gemma4_tiny_vulkan_stock_8da4w_emb4.pte");
    let base = ["bench", &f, "--prompt-len", "5", "--decode", "3", "--json"];
    let (ok, _, err) = pteria(&[&base[..], &["--device", "cpu", "--kv", "f16"]].concat());
    assert!(
        !ok && err.contains("--kv f16 needs the GPU executor"),
        "{err}"
    );
    let (ok, _, err) = pteria(&[&base[..], &["--kv", "f8"]].concat());
    assert!(!ok && err.contains("unknown KV cache type `f8`"), "{err}");
    if no_gpu() {
        return;
    }
    let run = |kv: &str| {
        let (ok, out, err) = pteria(&[&base[..], &["--device", "gpu", "--kv", kv]].concat());
        assert!(ok, "{err}");
        json(&out)
    };
    let (v32, v16) = (run("f32"), run("f16"));
    assert_eq!(v32["kv_caches"], 8, "{v32}");
    assert_eq!(v32["f16_kv_caches"], 0, "{v32}");
    assert!(v32["kv_f16_rel_l2_worst"].is_null(), "{v32}");
    assert_eq!(v16["f16_kv_caches"], 8, "{v16}");
    let bytes = |v: &Value, k: &str| v[k].as_u64().unwrap();
    assert_eq!(
        2 * bytes(&v16, "kv_cache_bytes"),
        bytes(&v32, "kv_cache_bytes")
    );
    // The caches' saving, and at most a little more: the f32 plan may hold a few more
    // activation bytes (its norms store into the f32 caches themselves, and the v norm's input
    // lives until the k norm's dispatch: src/gpu/memory.rs `kv_guest`).
    let (saved, kv16) = (
        bytes(&v32, "gpu_bytes") - bytes(&v16, "gpu_bytes"),
        bytes(&v16, "kv_cache_bytes"),
    );
    assert!(saved >= kv16 && saved < kv16 + kv16 / 4, "{v32} {v16}");
    // Within the bound tests/vulkan_conformance.rs measures for this program.
    let worst = v16["kv_f16_rel_l2_worst"].as_f64().unwrap();
    assert!(worst > 0.0 && worst <= 0.15, "{v16}");
}

/// `--phases`: every mode on every grid reports a time or its failures, and one workgroup (which
/// any device runs whole) passes every mode with the same outputs; chains its kernel does not
/// take are refused before any GPU work.
#[test]
fn phase_bench_reports_every_mode_and_refuses_what_it_cannot_run() {
    let (ok, _, err) = pteria(&["bench", "--phases", "--layers", "50"]);
    assert!(
        !ok && err.contains("300 phases; between 1 and 256"),
        "{err}"
    );
    let (ok, _, err) = pteria(&["bench", "--phases", "--grids", "0"]);
    assert!(!ok && err.contains("a grid of 0 workgroups"), "{err}");
    if no_gpu() {
        return;
    }
    let (ok, out, err) = pteria(&[
        "bench", "--phases", "--layers", "1", "--grids", "1,2", "--json",
    ]);
    assert!(ok, "{err}");
    let v = json(&out);
    assert_eq!(
        (v["layers"].as_u64(), v["phases"].as_u64()),
        (Some(1), Some(6)),
        "{v}"
    );
    assert!(v["weight_bytes"].as_u64().unwrap() > 18 << 20, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 6, "{v}");
    for r in results {
        let failed = r["failures"].as_u64().unwrap() > 0;
        assert_eq!(r["min_us"].is_null(), failed, "{r}");
        if r["workgroups"].as_u64() == Some(1) || r["mode"] == "Dispatches" {
            assert!(!failed && r["min_us"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["min_us"].as_f64() <= r["median_us"].as_f64(), "{r}");
            assert_eq!(r["same_bits"], true, "{r}");
        }
    }
}
