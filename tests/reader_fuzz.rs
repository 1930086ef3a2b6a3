//! Mutation fuzzing of the program reader and method loader, seeded with every fixture: each
//! mutant must load or fail with an error, never panic. Prints how many inputs were tried.

mod common;

use pteria::pte::{Bytes, DataFile, Limits, Program};
use pteria::runtime::{BackendRegistry, HostTensor, Method};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// xorshift64*: deterministic, so a failure reproduces from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    let n = 1 + rng.below(4);
    for _ in 0..n {
        if b.is_empty() {
            break;
        }
        match rng.below(6) {
            0 => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            2 => {
                // Interesting 32-bit values where offsets, lengths and sizes live.
                let i = rng.below(b.len().saturating_sub(4).max(1));
                let v: u32 = [
                    0,
                    1,
                    0x7FFF_FFFF,
                    0xFFFF_FFFF,
                    0x8000_0000,
                    rng.next() as u32,
                    0x10000,
                ][rng.below(7)];
                let end = (i + 4).min(b.len());
                b[i..end].copy_from_slice(&v.to_le_bytes()[..end - i]);
            }
            3 => {
                let len = rng.below(b.len());
                b.truncate(len);
            }
            4 => {
                let i = rng.below(b.len());
                let v: u64 = [u64::MAX, 1 << 40, rng.next()][rng.below(3)];
                let end = (i + 8).min(b.len());
                b[i..end].copy_from_slice(&v.to_le_bytes()[..end - i]);
            }
            _ => {
                let i = rng.below(b.len());
                let j = rng.below(b.len());
                b[i] = b[j];
            }
        }
    }
    b
}

/// Parse, load every method, and run `forward` once on a one-token input.
fn exercise(bytes: Vec<u8>, run: bool, data: &[DataFile]) {
    let limits = Limits {
        max_arena_bytes: 64 << 20,
    };
    let Ok(p) = Program::parse(Arc::new(Bytes::Owned(bytes)), data, &limits) else {
        return;
    };
    for plan in &p.plans {
        let Ok(mut m) = Method::load(&p, &plan.name, &BackendRegistry::default()) else {
            continue;
        };
        if run && plan.name == "forward" {
            let inputs: Vec<HostTensor> = m
                .input_specs()
                .iter()
                .map(|(dt, sizes)| {
                    let shape: Vec<usize> = sizes.iter().map(|_| 1).collect();
                    HostTensor::from_i64(&shape, &[0]).cast(*dt)
                })
                .collect();
            let _ = m.execute(&inputs);
        } else if plan.is_constant() {
            let _ = m.execute(&[]);
        }
    }
}

#[test]
fn mutated_programs_never_panic() {
    let mut seeds: Vec<_> = std::fs::read_dir(common::fixtures())
        .expect("fixtures dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pte"))
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no .pte fixtures to seed the fuzzer");
    let per_seed: usize = std::env::var("PTERIA_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut tried = 0usize;
    let mut failures = Vec::new();
    for (si, path) in seeds.iter().enumerate() {
        let seed = std::fs::read(path).unwrap();
        // Programs with external weights are fuzzed with their .ptd merged in.
        let ptd = path.with_extension("ptd");
        let data: Vec<DataFile> = if ptd.exists() {
            vec![DataFile::open(&ptd).unwrap()]
        } else {
            vec![]
        };
        // The unmutated file must load.
        Program::parse(
            Arc::new(Bytes::Owned(seed.clone())),
            &data,
            &Limits::default(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for it in 0..per_seed {
            let s = 0x9E37_79B9_7F4A_7C15u64 ^ ((si as u64) << 32) ^ it as u64;
            let mut rng = Rng(s | 1);
            let m = mutate(&mut rng, &seed);
            let run = it % 8 == 0;
            tried += 1;
            if catch_unwind(AssertUnwindSafe(|| exercise(m, run, &data))).is_err() {
                failures.push(format!("{} mutation seed {s:#x}", path.display()));
            }
        }
    }
    println!(
        "reader fuzz: tried {tried} mutated inputs from {} fixtures",
        seeds.len()
    );
    assert!(failures.is_empty(), "panics on: {failures:#?}");
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
