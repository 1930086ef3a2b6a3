//! XNNPACK conformance: every fixture program with `XnnpackBackend` delegates, lowered to the IR
//! and run on the CPU reference executor and on the GPU executor (lavapipe in CI), reproduces its
//! golden logits on every call — prefill, then decode steps — within the manifest's tolerance.
//! Each runs whole: its delegates and the portable ops between them as one IR graph.

mod common;

use pteria::pte::Program;
use pteria::runtime::delegate::{cpu_executor, gpu_executor, ExecutorFactory};
use pteria::runtime::{BackendRegistry, Method};
use serde_json::Value;

/// Runs one program with the IR backends; returns the rel-L2 of every call against its golden.
fn rel_l2_per_call(
    entry: &Value,
    m: &Value,
    backends: &BackendRegistry,
) -> Result<Vec<f64>, String> {
    let file = entry["file"].as_str().expect("file");
    let program = Program::open(&common::fixtures().join(file), &[]).map_err(|e| e.to_string())?;
    let mut method = Method::load(&program, "forward", backends).map_err(|e| e.to_string())?;
    // The exports leave sizes, slices, means, masks, the cache writes (slice_scatter + copy_
    // back, index_put) and attention between their delegates: all of it lowers to one graph.
    if !method.runs_whole() {
        return Err(format!(
            "does not run as one graph: {}",
            method.whole_note().unwrap_or("?")
        ));
    }
    common::golden_rel_l2_per_call(&mut method, entry, m)
}

fn check_all(device: &str, make: ExecutorFactory) {
    let m = common::manifest();
    let entries = common::manifest_programs(&m, "xnnpack");
    assert!(
        !entries.is_empty(),
        "the manifest lists no xnnpack programs"
    );
    let backends = pteria::frontend::backends(make);
    let mut failures = Vec::new();
    for e in &entries {
        let file = e["file"].as_str().expect("file");
        let tol = e["tolerance_rel_l2_per_call"].as_f64().expect("tolerance");
        match rel_l2_per_call(e, &m, &backends) {
            Ok(errs) => {
                let worst = errs.iter().copied().fold(0f64, f64::max);
                let calls: Vec<String> = errs.iter().map(|x| format!("{x:.2e}")).collect();
                println!(
                    "{device} {file}: worst rel-L2 {worst:.3e} (tolerance {tol:.0e}); per call [{}]",
                    calls.join(", ")
                );
                // NaN fails too: `f64::max` above skips it, this comparison does not.
                if !errs.iter().all(|&e| e <= tol) {
                    failures.push(format!("{file}: worst rel-L2 {worst:.3e} > {tol:.0e}"));
                }
            }
            Err(err) => failures.push(format!("{file}: {err}")),
        }
    }
    assert!(failures.is_empty(), "{device}: {}", failures.join("\n"));
}

#[test]
fn xnnpack_programs_match_their_goldens_on_every_call() {
    check_all("cpu", cpu_executor());
}

#[test]
fn xnnpack_programs_match_their_goldens_on_the_gpu_executor() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    println!("adapter: {:?}", ctx.adapter());
    check_all("gpu", gpu_executor(ctx));
}

/// The Gemma 4 XNNPACK export run whole on the GPU: its 8 KV caches (slice_scatter'd between
/// delegates, copied back at the end) are State buffers written in place that never travel, and
/// a decode step is one submit of one recording that uploads its token and position and reads
/// back the logits.
#[test]
fn xnnpack_gemma_keeps_its_kv_cache_on_the_gpu_with_one_submit_a_step() {
    use pteria::runtime::HostTensor;
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    let path = common::fixtures().join("gemma4_tiny_xnnpack_8da4w.pte");
    let program = Program::open(&path, &[]).unwrap();
    let (make, handles) = pteria::runtime::delegate::profiled_gpu_executor(ctx);
    let backends = pteria::frontend::backends(make);
    let mut method = Method::load(&program, "forward", &backends).unwrap();
    assert!(method.runs_whole(), "{:?}", method.whole_note());
    let execs = handles.lock().unwrap().clone();
    assert_eq!(execs.len(), 1, "one executor for the whole method");
    let exec = execs[0].clone();
    // 8 caches of [1, 1, 32, 16 or 32] f32, no more: the in-place writes need no copies.
    let states = exec.lock().unwrap().memory().states;
    assert_eq!(states, 6 * 2048 + 2 * 4096, "state bytes");

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
        if pos > 4 {
            assert_eq!(st.submits - submits, 1, "submits at {pos}: {st:?}");
        }
        submits = st.submits;
        assert_eq!(st.last_upload_bytes, 8, "token and position only: {st:?}");
        assert_eq!(st.last_readback_bytes, 256 * 4, "the logits only: {st:?}");
    }
    // The export cuts each cache and mask to pos + S rows, so the steps' shapes would follow the
    // position; read uncut (`uncut_attention_windows`), every step after the first replays.
    let st = exec.lock().unwrap().stats();
    assert_eq!((st.recordings, st.replays), (2, 3), "{st:?}");
}
