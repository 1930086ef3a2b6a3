//! Vulkan fixtures through the IR: every call of each VulkanBackend program matches its golden
//! within the manifest's tolerance, on the CPU executor and on the GPU executor (lavapipe in CI).

mod common;

use pteria::pte::Program;
use pteria::runtime::delegate::{cpu_executor, gpu_executor, ExecutorFactory};
use pteria::runtime::{HostTensor, Method};
use serde_json::Value;

/// Worst per-call rel-L2 of one program against its golden.
fn worst_rel_l2(entry: &Value, m: &Value, make: ExecutorFactory) -> Result<f64, String> {
    let file = entry["file"].as_str().unwrap();
    // Every Vulkan fixture, the stock export's CPU glue ops included, runs as one IR graph.
    let mut method = common::load_whole(file, make)?;
    let errs =
        common::golden_rel_l2_per_call(&mut method, entry, m).map_err(|e| format!("{file} {e}"))?;
    // `f64::max` skips NaN; a NaN call must fail.
    if let Some(i) = errs.iter().position(|e| e.is_nan()) {
        return Err(format!("{file} call {i}: NaN logits"));
    }
    Ok(errs.into_iter().fold(0f64, f64::max))
}

fn vulkan_entries(m: &Value) -> Vec<Value> {
    let v = common::manifest_programs(m, "vulkan");
    assert!(v.len() >= 2, "expected the fp32 and 8da4w Vulkan fixtures");
    v
}

#[test]
fn vulkan_fixtures_match_goldens_on_the_cpu_executor() {
    let m = common::manifest();
    for e in vulkan_entries(&m) {
        let tol = e["tolerance_rel_l2_per_call"].as_f64().unwrap();
        let worst = worst_rel_l2(&e, &m, cpu_executor()).unwrap_or_else(|err| panic!("{err}"));
        println!(
            "cpu {}: worst rel-L2 {worst:.2e} (tolerance {tol:.0e})",
            e["file"]
        );
        assert!(worst <= tol, "{}: {worst:.3e} > {tol:.0e}", e["file"]);
    }
}

#[test]
fn vulkan_fixtures_match_goldens_on_the_gpu_executor() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    println!("adapter: {:?}", ctx.adapter());
    let m = common::manifest();
    for e in vulkan_entries(&m) {
        let tol = e["tolerance_rel_l2_per_call"].as_f64().unwrap();
        let worst =
            worst_rel_l2(&e, &m, gpu_executor(ctx.clone())).unwrap_or_else(|err| panic!("{err}"));
        println!(
            "gpu {}: worst rel-L2 {worst:.2e} (tolerance {tol:.0e})",
            e["file"]
        );
        assert!(worst <= tol, "{}: {worst:.3e} > {tol:.0e}", e["file"]);
    }
}

fn replace_all(bytes: &mut [u8], from: &[u8], to: &[u8]) -> usize {
    assert_eq!(
        from.len(),
        to.len(),
        "same-length rewrite keeps every offset"
    );
    let mut n = 0;
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
            n += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    n
}

/// A program using operators we lack, in CPU kernel calls and in several delegates, fails at
/// load with one error that names every one of them (and how many delegates use each), not
/// just the first.
#[test]
fn unsupported_operators_are_all_listed_at_load() {
    let path = common::fixtures().join("gemma4_tiny_vulkan_stock_8da4w_emb4.pte");
    let mut bytes = std::fs::read(&path).unwrap();
    // Op names are flatbuffer strings: same-length renames keep the file valid.
    let gelu = replace_all(&mut bytes, b"aten.gelu.default", b"aten.gelx.default");
    let emb = replace_all(
        &mut bytes,
        b"et_vk.embedding_q4gsw.default",
        b"et_vk.embedding_q4gsx.default",
    );
    let cpu = replace_all(&mut bytes, b"aten::index_put", b"aten::index_pux");
    assert!(gelu > 2 && emb == 2 && cpu == 1, "{gelu} {emb} {cpu}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("renamed.pte");
    std::fs::write(&file, &bytes).unwrap();
    let program = Program::open(&file, &[]).expect("still a valid program");
    let backends = pteria::frontend::backends(cpu_executor());
    let msg = Method::load(&program, "forward", &backends)
        .err()
        .expect("unsupported operators must fail the load")
        .to_string();
    for want in [
        "aten::index_pux.out (CPU kernel)".to_string(),
        format!("aten.gelx.default (VulkanBackend, {gelu} delegates)"),
        "et_vk.embedding_q4gsx.default (VulkanBackend, 2 delegates)".to_string(),
    ] {
        assert!(msg.contains(&want), "`{want}` missing from: {msg}");
    }
}

/// The stock export keeps its KV caches in mutable buffers that CPU `index_put`/`copy_` ops
/// update between delegates. Run whole on the GPU, a call is a few submits, the caches are State
/// buffers that never travel: a decode step uploads its token and position (two i32) only.
#[test]
fn whole_method_keeps_the_kv_cache_on_the_gpu() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    let path = common::fixtures().join("gemma4_tiny_vulkan_stock_8da4w_emb4.pte");
    let program = Program::open(&path, &[]).unwrap();
    let (make, handles) = pteria::runtime::delegate::profiled_gpu_executor(ctx);
    let backends = pteria::frontend::backends(make);
    let mut method = Method::load(&program, "forward", &backends).unwrap();
    assert!(method.runs_whole(), "{:?}", method.whole_note());
    let execs = handles.lock().unwrap().clone();
    assert_eq!(execs.len(), 1, "one executor for the whole method");
    let exec = execs[0].clone();
    // 8 caches of [1, 1, 32, 16 or 32] f32.
    let states = exec.lock().unwrap().memory().states;
    assert!(states >= 6 * 2048 + 2 * 4096, "state bytes {states}");

    let prompt = [2i64, 105, 2364, 107];
    method
        .execute(&[
            HostTensor::from_i64(&[1, 4], &prompt),
            HostTensor::from_i64(&[4], &[0, 1, 2, 3]),
        ])
        .unwrap();
    let mut submits = exec.lock().unwrap().stats().submits;
    for pos in 4..8i64 {
        method
            .execute(&[
                HostTensor::from_i64(&[1, 1], &[7 + pos]),
                HostTensor::from_i64(&[1], &[pos]),
            ])
            .unwrap();
        let st = exec.lock().unwrap().stats();
        // Pieces of 64 dispatches, then 256, then 1024, ...
        let (mut pieces, mut left, mut piece) = (0, st.last_dispatches, 64);
        while left > 0 {
            (pieces, left, piece) = (pieces + 1, left.saturating_sub(piece), piece * 4);
        }
        assert!(pieces <= 3, "{st:?}");
        assert_eq!(
            st.submits - submits,
            pieces,
            "a few submits per call: {st:?}"
        );
        submits = st.submits;
        assert_eq!(st.last_upload_bytes, 8, "token and position only: {st:?}");
        assert_eq!(st.last_readback_bytes, 256 * 4, "the logits only: {st:?}");
    }
    let st = exec.lock().unwrap().stats();
    assert_eq!((st.recordings, st.replays), (2, 3), "{st:?}");
}
