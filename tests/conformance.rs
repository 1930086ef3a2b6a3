//! Conformance: every fixture program the engine runs reproduces its golden logits on every call
//! (prefill, then decode steps with the KV cache persisting), within the manifest's tolerance.

mod common;

use pteria::pte::Program;
use pteria::runtime::{BackendRegistry, HostTensor, Method, Output};
use serde_json::Value;

/// Checks one program against its golden on the given registry; returns the worst rel-L2.
fn check(entry: &Value, m: &Value, backends: &BackendRegistry) -> Result<f64, String> {
    let file = entry["file"].as_str().unwrap();
    let program = Program::open(&common::fixtures().join(file), &[]).map_err(|e| e.to_string())?;
    let mut method = Method::load(&program, "forward", backends).map_err(|e| e.to_string())?;
    // The portable Gemma program writes its 8 caches by slice_scatter + copy_ back: in place, so
    // its goldens on every call check the rewrite.
    if file.contains("gemma4") && file.contains("portable") && method.scatters_in_place() != 8 {
        return Err(format!(
            "{file}: {} of 8 cache writes in place",
            method.scatters_in_place()
        ));
    }
    let errs = common::golden_rel_l2_per_call(&mut method, entry, m)
        .map_err(|e| format!("{file}: {e}"))?;
    let tol = entry["tolerance_rel_l2_per_call"].as_f64().unwrap();
    let mut worst = 0f64;
    for (i, &e) in errs.iter().enumerate() {
        worst = worst.max(e);
        // A NaN logit must fail too, hence not `e > tol`.
        if e.is_nan() || e > tol {
            return Err(format!("{file}: call {i} rel-L2 {e:.3e} > {tol:.0e}"));
        }
    }
    Ok(worst)
}

#[test]
fn portable_programs_match_their_goldens_on_every_call() {
    let m = common::manifest();
    let mut n = 0;
    for e in &common::manifest_programs(&m, "portable") {
        let worst = check(e, &m, &BackendRegistry::default()).unwrap_or_else(|err| panic!("{err}"));
        println!("{}: worst rel-L2 {worst:.2e}", e["file"]);
        assert!(worst <= 1e-5);
        n += 1;
    }
    assert!(
        n >= 2,
        "expected the Gemma and Llama portable programs, found {n}"
    );
}

#[test]
fn delegated_programs_without_a_backend_fail_clearly() {
    let m = common::manifest();
    for e in common::manifest_entries(&m)
        .iter()
        .filter(|e| e["backend"] != "portable")
    {
        let file = e["file"].as_str().unwrap();
        let program = Program::open(&common::fixtures().join(file), &[]).unwrap();
        let err = Method::load(&program, "forward", &BackendRegistry::default())
            .err()
            .expect("no backends registered");
        let msg = err.to_string();
        assert!(
            msg.contains("is not supported yet") && msg.contains("Backend"),
            "{file}: {msg}"
        );
    }
}

#[test]
fn every_fixture_loads_and_reports_its_metadata() {
    let m = common::manifest();
    for e in common::manifest_entries(&m) {
        let file = e["file"].as_str().unwrap();
        let program = Program::open(&common::fixtures().join(file), &[]).unwrap();
        let max_seq = pteria::runtime::constant_method(&program, "get_max_seq_len")
            .unwrap()
            .expect(file);
        assert_eq!(max_seq, vec![Output::Int(32)], "{file}");
        let eos = pteria::runtime::constant_method(&program, "get_eos_ids")
            .unwrap()
            .expect(file);
        assert!(!eos.is_empty(), "{file}");
    }
}

#[test]
fn external_weights_load_from_a_ptd_and_match_the_runtime() {
    let dir = common::fixtures().join("ptd");
    let (pte, ptd) = (dir.join("ext_mlp.pte"), dir.join("ext_mlp.ptd"));
    let program = Program::open(&pte, &[ptd.as_path()]).expect("program with its .ptd");
    let mut method = Method::load(&program, "forward", &BackendRegistry::default()).unwrap();
    let (shape, x) = common::read_npy(&dir.join("ext_mlp.input.npy"));
    let (_, golden) = common::read_npy(&dir.join("ext_mlp.golden.npy"));
    let x: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let out = method.execute(&[HostTensor::from_f32(&shape, &x)]).unwrap();
    let Output::Tensor(t) = &out[0] else {
        panic!("no tensor output")
    };
    let e = common::rel_l2(&t.to_f32().unwrap(), &golden);
    assert!(e < 1e-6, "rel-L2 {e}");

    // Without the .ptd the program names the missing key instead of running on garbage.
    let err = Program::open(&pte, &[]).unwrap_err().to_string();
    assert!(err.contains("external") && err.contains(".ptd"), "{err}");
}
