//! Mutation fuzzing of the program reader and method loader, seeded with every fixture: each
//! mutant must load or fail with an error, never panic. Prints how many inputs were tried.

mod common;

use pteria::pte::{Bytes, DataFile, Limits, Program};
use pteria::runtime::{BackendRegistry, Method};
use std::sync::Arc;

/// Parse, load every method, and run `forward` once on a one-token input; `true` when it parsed.
fn exercise(bytes: Vec<u8>, run: bool, data: &[DataFile]) -> bool {
    let limits = Limits {
        max_arena_bytes: 64 << 20,
    };
    let Ok(p) = Program::parse(Arc::new(Bytes::Owned(bytes)), data, &limits) else {
        return false;
    };
    for plan in &p.plans {
        let Ok(mut m) = Method::load(&p, &plan.name, &BackendRegistry::default()) else {
            continue;
        };
        if run && plan.name == "forward" {
            let _ = m.execute(&common::one_token_inputs(&m));
        } else if plan.is_constant() {
            let _ = m.execute(&[]);
        }
    }
    true
}

#[test]
fn mutated_programs_never_panic() {
    let seeds = common::fixture_programs();
    assert!(!seeds.is_empty(), "no .pte fixtures to seed the fuzzer");
    let per_seed = common::fuzz::iters(400);
    let mut fuzz_seeds = Vec::new();
    let mut data_files = Vec::new();
    for path in &seeds {
        let bytes = std::fs::read(path).unwrap();
        // Programs with external weights are fuzzed with their .ptd merged in.
        let ptd = path.with_extension("ptd");
        let data: Vec<DataFile> = if ptd.exists() {
            vec![DataFile::open(&ptd).unwrap()]
        } else {
            vec![]
        };
        // The unmutated file must load.
        Program::parse(
            Arc::new(Bytes::Owned(bytes.clone())),
            &data,
            &Limits::default(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        fuzz_seeds.push(common::fuzz::Seed::new(path.display().to_string(), bytes));
        data_files.push(data);
    }
    // One mutant in eight of each seed is also run, not only loaded.
    let count = std::cell::Cell::new(0usize);
    common::fuzz::run(
        "reader",
        &fuzz_seeds,
        per_seed,
        0x9E37_79B9_7F4A_7C15,
        |si, m| {
            let run = count.get() % 8 == 0;
            count.set(count.get() + 1);
            exercise(m, run, &data_files[si])
        },
    );
}

#[test]
fn truncated_program_reports_what_is_missing() {
    let seed = std::fs::read_dir(common::fixtures())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "pte"))
        .expect("a fixture");
    let bytes = std::fs::read(&seed).unwrap();
    let cut = bytes[..bytes.len() - 100].to_vec();
    let err = Program::from_bytes(cut).unwrap_err().to_string();
    assert!(
        err.contains("truncated") || err.contains("past the end"),
        "{err}"
    );
    let err = Program::from_bytes(b"hello world, not a program".to_vec())
        .unwrap_err()
        .to_string();
    assert!(err.contains("ET12"), "{err}");
}

/// The `.ptd` reader, seeded with the fixture whose weights live in one: each mutant of the
/// data file must parse or fail with an error, and one that parses must load (or be refused
/// by) its program and run it; mutants of the program with the real data file likewise.
#[test]
fn mutated_data_files_and_their_programs_never_panic() {
    let dir = common::fixtures().join("ptd");
    let pte = std::fs::read(dir.join("ext_mlp.pte")).unwrap();
    let ptd = std::fs::read(dir.join("ext_mlp.ptd")).unwrap();
    let data = DataFile::parse(Arc::new(Bytes::Owned(ptd.clone()))).unwrap();
    assert!(exercise(pte.clone(), true, &[data]), "the fixture itself");
    let seeds = [
        common::fuzz::Seed::new("ext_mlp.ptd", ptd),
        common::fuzz::Seed::new("ext_mlp.pte with its .ptd", pte.clone()),
    ];
    let real = DataFile::parse(Arc::new(Bytes::Owned(seeds[0].bytes.clone()))).unwrap();
    let real = [real];
    common::fuzz::run(
        "data file",
        &seeds,
        common::fuzz::iters(20_000),
        0xD47A_F11E,
        |si, m| {
            if si == 1 {
                return exercise(m, true, &real);
            }
            match DataFile::parse(Arc::new(Bytes::Owned(m))) {
                Ok(d) => {
                    exercise(pte.clone(), true, &[d]);
                    true
                }
                Err(_) => false,
            }
        },
    );
}
