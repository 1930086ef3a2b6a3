//! XNNPACK conformance: every fixture program with `XnnpackBackend` delegates, lowered to the IR
//! and run on the CPU reference executor and on the GPU executor (lavapipe in CI; the rest of the
//! program on the CPU kernels), reproduces its golden logits on every call — prefill, then decode
//! steps — within the manifest's tolerance.

mod common;

use pteria::pte::Program;
use pteria::runtime::delegate::{cpu_executor, gpu_executor, ExecutorFactory};
use pteria::runtime::{BackendRegistry, HostTensor, Method, Output};
use serde_json::Value;

fn manifest() -> Value {
    let text =
        std::fs::read_to_string(common::fixtures().join("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("manifest is JSON")
}

fn programs(m: &Value) -> Vec<Value> {
    match &m["programs"] {
        Value::Array(a) => a.clone(),
        Value::Object(o) => o.values().cloned().collect(),
        _ => panic!("manifest has no programs"),
    }
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("an array of integers")
        .iter()
        .map(|x| x.as_i64().expect("an integer"))
        .collect()
}

/// Runs the manifest's calls on `forward` in order; returns each call's flattened logits.
fn run_calls(method: &mut Method, m: &Value) -> Result<Vec<Vec<f32>>, String> {
    let calls = m["inputs"]["calls"].as_array().expect("calls");
    let mut outs = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let toks = ints(&c["tokens"][0]);
        let pos = ints(&c["input_pos"]);
        let out = method
            .execute(&[
                HostTensor::from_i64(&[1, toks.len()], &toks),
                HostTensor::from_i64(&[pos.len()], &pos),
            ])
            .map_err(|e| format!("call {i}: {e}"))?;
        match &out[0] {
            Output::Tensor(t) => outs.push(t.to_f32().map_err(|e| e.to_string())?),
            o => return Err(format!("call {i}: unexpected output {o:?}")),
        }
    }
    Ok(outs)
}

/// Runs one program with the IR backends; returns the rel-L2 of every call against its golden.
fn rel_l2_per_call(
    entry: &Value,
    m: &Value,
    backends: &BackendRegistry,
) -> Result<Vec<f64>, String> {
    let file = entry["file"].as_str().expect("file");
    let program = Program::open(&common::fixtures().join(file), &[]).map_err(|e| e.to_string())?;
    let mut method = Method::load(&program, "forward", backends).map_err(|e| e.to_string())?;
    let got = run_calls(&mut method, m)?;
    let golden = entry["golden"].as_str().expect("golden");
    let (shape, golden) = common::read_npy(&common::fixtures().join(golden));
    let vocab = shape[1];
    if shape[0] != got.len() {
        return Err(format!(
            "{} calls but the golden has {} rows",
            got.len(),
            shape[0]
        ));
    }
    Ok(got
        .iter()
        .enumerate()
        .map(|(i, g)| common::rel_l2(g, &golden[i * vocab..(i + 1) * vocab]))
        .collect())
}

fn check_all(device: &str, make: ExecutorFactory) {
    let m = manifest();
    let entries: Vec<Value> = programs(&m)
        .into_iter()
        .filter(|e| e["backend"] == "xnnpack")
        .collect();
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
