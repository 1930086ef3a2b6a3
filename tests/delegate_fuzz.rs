//! Mutated delegate blobs taken all the way: the blob fuzzers (`*_blob.rs`) stop at parsing, and
//! the program fuzzer (`reader_fuzz`) loads delegates without a backend. Here each mutant blob
//! goes back into its program (same length, same place), and the program is parsed, lowered
//! through the front end, the IR passes and the planner, and run on the CPU executor; one in
//! eight also on the GPU executor. Every stage must either work or fail with an error: no
//! panic, no allocation the size a hostile shape asks for.

mod common;

use common::fuzz::{mutate, Rng, Seed};
use pteria::pte::{Bytes, Limits, Program};
use pteria::runtime::delegate::{cpu_executor, gpu_executor};
use pteria::runtime::{BackendRegistry, Method};
use std::sync::Arc;

/// Every delegate blob of the fixtures, with its program's bytes and where the blob sits in them.
fn blob_seeds() -> Vec<(Seed, Arc<Vec<u8>>, usize)> {
    let mut out = Vec::new();
    for path in common::fixture_programs() {
        let bytes = Arc::new(std::fs::read(&path).unwrap());
        let program = Program::open(&path, &[]).unwrap();
        for plan in &program.plans {
            for (i, d) in plan.delegates.iter().enumerate() {
                let blob: &[u8] = &d.data;
                let at = d.data.start();
                assert!(
                    bytes[at..].starts_with(blob),
                    "{}: blob {i} is not at {at}",
                    path.display()
                );
                let name = format!("{} {} delegate {i} ({})", path.display(), plan.name, d.id);
                out.push((Seed::new(name, blob.to_vec()), bytes.clone(), at));
            }
        }
    }
    out
}

/// Loads `forward` (or the first method) of `bytes` with `backends` and runs it on one token at
/// position 0; `true` when the method loaded.
fn load_and_run(bytes: Vec<u8>, backends: &BackendRegistry) -> bool {
    let limits = Limits {
        max_arena_bytes: 64 << 20,
    };
    let Ok(p) = Program::parse(Arc::new(Bytes::Owned(bytes)), &[], &limits) else {
        return false;
    };
    let Some(plan) = p
        .plans
        .iter()
        .find(|pl| pl.name == "forward")
        .or(p.plans.first())
    else {
        return false;
    };
    let Ok(mut m) = Method::load(&p, &plan.name, backends) else {
        return false;
    };
    let _ = m.execute(&common::one_token_inputs(&m));
    true
}

#[test]
fn mutated_delegates_lower_and_run_or_fail_cleanly() {
    let seeds = blob_seeds();
    assert!(
        seeds
            .iter()
            .any(|(s, _, _)| s.name.contains("VulkanBackend"))
            && seeds
                .iter()
                .any(|(s, _, _)| s.name.contains("XnnpackBackend"))
            && seeds.iter().any(|(s, _, _)| s.name.contains("MLXBackend")),
        "fixtures of all three formats"
    );
    let cpu = pteria::frontend::backends(cpu_executor());
    let gpu = common::gpu_context().map(|ctx| pteria::frontend::backends(gpu_executor(ctx)));
    // The unmutated programs load and run.
    for (seed, program, _) in &seeds {
        assert!(load_and_run(program.to_vec(), &cpu), "{}", seed.name);
    }
    let fuzz_seeds: Vec<Seed> = seeds
        .iter()
        .map(|(s, _, _)| Seed::new(s.name.clone(), s.bytes.clone()))
        .collect();
    let count = std::cell::Cell::new(0usize);
    // Each mutant loads its whole program (every delegate lowered): about 8 ms a mutant in a
    // release build, so about 2000 in all.
    let per_seed = common::fuzz::iters(2000 / seeds.len().max(1)).max(1);
    common::fuzz::run("delegate", &fuzz_seeds, per_seed, 0xDE1E_6A7E, |si, m| {
        let (seed, program, at) = &seeds[si];
        let n = count.get();
        count.set(n + 1);
        // Same length, same place: the program around the blob stays valid.
        let mut blob = m;
        blob.resize(seed.bytes.len(), 0);
        let mut bytes = program.to_vec();
        bytes[*at..*at + blob.len()].copy_from_slice(&blob);
        let loaded = load_and_run(bytes.clone(), &cpu);
        if let (Some(gpu), true) = (&gpu, n % 8 == 0) {
            load_and_run(bytes, gpu);
        }
        loaded
    });
    // Mutants of mutants: two rounds reach deeper than one.
    let mut rng = Rng(0x5EC0_4D00);
    for (seed, program, at) in seeds.iter().take(4) {
        let mut blob = seed.bytes.clone();
        for _ in 0..50 {
            blob = mutate(&mut rng, &blob, &[]);
            blob.resize(seed.bytes.len(), 0);
            let mut bytes = program.to_vec();
            bytes[*at..*at + blob.len()].copy_from_slice(&blob);
            let name = &seed.name;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load_and_run(bytes, &cpu)))
                .unwrap_or_else(|_| panic!("{name}: a chain of mutants panicked"));
        }
    }
}
