//! One mutation fuzzer for every parser test: the program reader and the three delegate blob
//! formats share the mutations, the seeding and the panic bookkeeping; each test supplies only
//! its seeds and what to do with a mutant.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

/// xorshift64*: deterministic, so a failure reproduces from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One seed input: a name for failure reports, its bytes, and byte positions worth aiming at
/// more often than chance would (a header, union tags) — empty when none are.
pub struct Seed {
    pub name: String,
    pub bytes: Vec<u8>,
    pub hot: Vec<usize>,
}

impl Seed {
    pub fn new(name: impl Into<String>, bytes: Vec<u8>) -> Seed {
        Seed {
            name: name.into(),
            bytes,
            hot: Vec::new(),
        }
    }

    pub fn with_hot(mut self, hot: Vec<usize>) -> Seed {
        self.hot = hot;
        self
    }
}

/// 1–4 mutations: bit flips, random bytes, extreme u32/u64 values where offsets, lengths, ids
/// and sizes live, truncation, nudged 16-bit vtable entries or tags, byte copies, and one in
/// eight aimed at a hot position.
pub fn mutate(rng: &mut Rng, seed: &[u8], hot: &[usize]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            break;
        }
        let i = match hot.get(rng.below(hot.len())) {
            Some(&p) if p < b.len() && rng.below(8) == 0 => p,
            _ => rng.below(b.len()),
        };
        match rng.below(7) {
            0 => b[i] ^= 1 << rng.below(8),
            1 => b[i] = rng.next() as u8,
            2 => {
                let v: u32 = [
                    0,
                    1,
                    2,
                    0x7FFF_FFFF,
                    0xFFFF_FFFF,
                    0x8000_0000,
                    0x10000,
                    rng.next() as u32,
                ][rng.below(8)];
                let end = (i + 4).min(b.len());
                b[i..end].copy_from_slice(&v.to_le_bytes()[..end - i]);
            }
            3 => {
                let v: u64 = [u64::MAX, u64::MAX - 1, 1 << 40, 1 << 32, rng.next()][rng.below(5)];
                let end = (i + 8).min(b.len());
                b[i..end].copy_from_slice(&v.to_le_bytes()[..end - i]);
            }
            4 => b.truncate(i),
            5 => {
                let v = u16::from_le_bytes([b[i], *b.get(i + 1).unwrap_or(&0)]);
                let v = v
                    .wrapping_add([1, 2, 4, 0xFFFF, 0xFFFE][rng.below(5)])
                    .to_le_bytes();
                b[i] = v[0];
                if i + 1 < b.len() {
                    b[i + 1] = v[1];
                }
            }
            _ => b[i] = b[rng.below(b.len())],
        }
    }
    b
}

/// Mutants per seed: `PTERIA_FUZZ_ITERS` when set, else `default`.
pub fn iters(default: usize) -> usize {
    std::env::var("PTERIA_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Feeds `per_seed` mutants of every seed to `exercise(seed index, mutant)`, which returns
/// whether the mutant was accepted; panics listing every mutant that made it panic. `salt`
/// keeps each test's mutant stream its own.
pub fn run(
    what: &str,
    seeds: &[Seed],
    per_seed: usize,
    salt: u64,
    exercise: impl Fn(usize, Vec<u8>) -> bool,
) {
    assert!(!seeds.is_empty(), "no seeds for the {what} fuzzer");
    let start = Instant::now();
    let (mut tried, mut accepted, mut failures) = (0usize, 0usize, Vec::new());
    for (si, seed) in seeds.iter().enumerate() {
        for it in 0..per_seed {
            let s = salt ^ ((si as u64) << 32) ^ it as u64;
            let m = mutate(&mut Rng(s | 1), &seed.bytes, &seed.hot);
            tried += 1;
            match catch_unwind(AssertUnwindSafe(|| exercise(si, m))) {
                Ok(ok) => accepted += usize::from(ok),
                Err(_) => failures.push(format!("{} mutation seed {s:#x}", seed.name)),
            }
        }
    }
    println!(
        "{what} fuzz: tried {tried} inputs from {} seeds ({accepted} accepted) in {:.1}s",
        seeds.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "panics on: {failures:#?}");
}

/// 1–4 edits of a JSON document's structure, for parsers whose byte-level mutants rarely get
/// past the JSON syntax. Two edits in three keep the value's kind (another number, an edge
/// string, a flipped bool, an object's key or an array's entry dropped or doubled), so that
/// many mutants still load and reach the code behind the loader; the third puts a value of
/// another kind. Each edit's path is walked from the root, a random child a level, stopping at
/// each level with chance 1 in 3, so that small sections (a tokenizer's decoder) are hit about
/// as often as big ones (its vocabulary).
pub fn mutate_json(rng: &mut Rng, doc: &serde_json::Value) -> serde_json::Value {
    use serde_json::{json, Value};
    let mut doc = doc.clone();
    for _ in 0..1 + rng.below(4) {
        let mut v = &mut doc;
        loop {
            let n = match v {
                Value::Object(o) => o.len(),
                Value::Array(a) => a.len(),
                _ => 0,
            };
            if n == 0 || rng.below(3) == 0 {
                break;
            }
            let i = rng.below(n);
            v = match v {
                Value::Object(o) => o.values_mut().nth(i).unwrap(),
                Value::Array(a) => &mut a[i],
                _ => unreachable!(),
            };
        }
        let same_kind = rng.below(3) != 0;
        match &mut *v {
            Value::Object(o) if same_kind && !o.is_empty() => {
                let k = o.keys().nth(rng.below(o.len())).unwrap().clone();
                o.remove(&k);
            }
            Value::Array(a) if same_kind && !a.is_empty() => {
                let i = rng.below(a.len());
                if rng.below(2) == 0 {
                    a.remove(i);
                } else {
                    let e = a[i].clone();
                    a.insert(i, e);
                }
            }
            Value::Number(_) if same_kind => {
                *v = [
                    json!(-1),
                    json!(0),
                    json!(1),
                    json!(2),
                    json!(u32::MAX),
                    json!(1e9),
                ][rng.below(6)]
                .clone();
            }
            Value::String(t) if same_kind => {
                *t = match rng.below(5) {
                    0 => String::new(),
                    1 => " ".into(),
                    2 => "▁".into(),
                    3 => "<0xFF>".into(),
                    _ => t.chars().skip(1).collect(),
                };
            }
            Value::Bool(b) if same_kind => *b = !*b,
            _ => {
                *v = match rng.below(10) {
                    0 => Value::Null,
                    1 => json!(-1),
                    2 => json!(u64::MAX),
                    3 => json!(1e300),
                    4 => json!(""),
                    5 => json!("\u{0}\u{FFFD}▁"),
                    6 => json!([]),
                    7 => json!({}),
                    8 => json!(true),
                    _ => json!(format!("{:x}", rng.next())),
                }
            }
        }
    }
    doc
}

/// An FNV-1a hash of `bytes`: a seed for a second mutation drawn from a first mutant.
pub fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}
