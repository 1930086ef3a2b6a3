//! XNNPACK conformance: every fixture program with `XnnpackBackend` delegates, lowered to the IR
//! and run on the CPU reference executor and on the GPU executor (lavapipe in CI; the rest of the
//! program on the CPU kernels), reproduces its golden logits on every call — prefill, then decode
//! steps — within the manifest's tolerance.

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
    // The Gemma exports write their 8 KV caches by slice_scatter + copy_ back between delegates:
    // in place, so the goldens on every call check that too.
    if file.contains("gemma4") && method.scatters_in_place() != 8 {
        return Err(format!(
            "{} of 8 cache writes in place",
            method.scatters_in_place()
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
