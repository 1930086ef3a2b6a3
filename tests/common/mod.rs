//! Helpers shared by the integration tests: fixture paths, `.npy` reading, error metrics.
#![allow(dead_code)]

pub mod fuzz;

use std::path::{Path, PathBuf};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A fixture's path as a command-line argument.
pub fn fixture(name: &str) -> String {
    fixtures().join(name).to_string_lossy().into_owned()
}

/// Runs the `pteria` binary with `args`: (success, stdout, stderr).
pub fn pteria(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pteria"))
        .args(args)
        .output()
        .expect("run pteria");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every `.pte` directly in tests/fixtures, sorted by name.
pub fn fixture_programs() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("fixtures dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pte"))
        .collect();
    paths.sort();
    paths
}

/// One delegate's blob with where it sits: (method, delegate index, blob).
pub type DelegateBlob = (String, usize, pteria::pte::Blob);

/// Every fixture program with at least one delegate of `backend_id`, sorted by file name, with
/// those delegates' blobs in method and delegate order.
pub fn delegate_fixtures(
    backend_id: &str,
) -> Vec<(PathBuf, pteria::pte::Program, Vec<DelegateBlob>)> {
    let mut out = Vec::new();
    for path in fixture_programs() {
        let program = pteria::pte::Program::open(&path, &[])
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut blobs = Vec::new();
        for plan in &program.plans {
            for (i, d) in plan.delegates.iter().enumerate() {
                if d.id == backend_id {
                    blobs.push((plan.name.clone(), i, d.data.clone()));
                }
            }
        }
        if !blobs.is_empty() {
            out.push((path, program, blobs));
        }
    }
    assert!(
        !out.is_empty(),
        "no {backend_id} fixture in {}",
        fixtures().display()
    );
    out
}

/// A float32 or int64 little-endian C-order `.npy` array: (shape, values as f64).
pub fn read_npy(path: &Path) -> (Vec<usize>, Vec<f64>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..6], b"\x93NUMPY", "{} is not .npy", path.display());
    let (hlen, hstart) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    let header = std::str::from_utf8(&b[hstart..hstart + hlen]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_str = header
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape: Vec<usize> = shape_str
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data = &b[hstart + hlen..];
    let vals: Vec<f64> = if header.contains("'<f4'") {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect()
    } else if header.contains("'<i8'") {
        data.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect()
    } else if header.contains("'<f8'") {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    } else {
        panic!("unsupported npy dtype in {header}")
    };
    (shape, vals)
}

/// ||a - b|| / ||b||.
pub fn rel_l2(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-30)).sqrt()
}

/// The GPU for a GPU test: `None` (skip) only when `PTERIA_NO_GPU_TESTS=1`; a missing adapter
/// otherwise fails the test, so a machine without lavapipe cannot pass GPU suites silently.
pub fn gpu_context() -> Option<std::sync::Arc<pteria::gpu::Context>> {
    if std::env::var("PTERIA_NO_GPU_TESTS").is_ok_and(|v| v == "1") {
        println!("PTERIA_NO_GPU_TESTS=1: skipped");
        return None;
    }
    match pteria::gpu::Context::new() {
        Ok(c) => Some(std::sync::Arc::new(c)),
        Err(e) => panic!(
            "no GPU adapter for the GPU tests ({e}). Install lavapipe (Debian: \
             mesa-vulkan-drivers) or set PTERIA_NO_GPU_TESTS=1 to skip them"
        ),
    }
}

/// tests/fixtures/manifest.json: the fixture programs, their goldens, and the calls (tokens and
/// input positions) the goldens were made from.
pub fn manifest() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("manifest is JSON")
}

/// Every program entry of the manifest.
pub fn manifest_entries(m: &serde_json::Value) -> Vec<serde_json::Value> {
    match &m["programs"] {
        serde_json::Value::Array(a) => a.clone(),
        serde_json::Value::Object(o) => o.values().cloned().collect(),
        _ => panic!("manifest has no programs"),
    }
}

/// The manifest's program entries exported for `backend` (`portable`, `xnnpack`, `vulkan`, `mlx`).
pub fn manifest_programs(m: &serde_json::Value, backend: &str) -> Vec<serde_json::Value> {
    let mut v = manifest_entries(m);
    v.retain(|e| e["backend"] == backend);
    v
}

pub fn ints(v: &serde_json::Value) -> Vec<i64> {
    v.as_array()
        .expect("an array of integers")
        .iter()
        .map(|x| x.as_i64().expect("an integer"))
        .collect()
}

/// Fixture `file`'s `forward` loaded with the IR front ends on `make`'s executor, required to run
/// as one IR graph (delegates, mutable buffers and CPU glue together).
pub fn load_whole(
    file: &str,
    make: pteria::runtime::delegate::ExecutorFactory,
) -> Result<pteria::runtime::Method, String> {
    let program =
        pteria::pte::Program::open(&fixtures().join(file), &[]).map_err(|e| e.to_string())?;
    let backends = pteria::frontend::backends(make);
    let method =
        pteria::runtime::Method::load(&program, "forward", &backends).map_err(|e| e.to_string())?;
    if !method.runs_whole() {
        return Err(format!(
            "{file} does not run as one graph: {}",
            method.whole_note().unwrap_or("?")
        ));
    }
    Ok(method)
}

/// Runs the manifest's calls on `method` in order (the KV cache carries from one to the next) and
/// returns the rel-L2 of each call's logits against its row of `entry`'s golden.
pub fn golden_rel_l2_per_call(
    method: &mut pteria::runtime::Method,
    entry: &serde_json::Value,
    m: &serde_json::Value,
) -> Result<Vec<f64>, String> {
    let golden = entry["golden"].as_str().expect("golden");
    let (shape, golden) = read_npy(&fixtures().join(golden));
    let vocab = shape[1];
    let calls = m["inputs"]["calls"].as_array().expect("calls");
    if shape[0] != calls.len() {
        return Err(format!(
            "{} calls but the golden has {} rows",
            calls.len(),
            shape[0]
        ));
    }
    Ok(manifest_call_logits(method, m)?
        .iter()
        .enumerate()
        .map(|(i, got)| rel_l2(got, &golden[i * vocab..(i + 1) * vocab]))
        .collect())
}

/// Runs the manifest's calls on `method` in order and returns each call's logits.
pub fn manifest_call_logits(
    method: &mut pteria::runtime::Method,
    m: &serde_json::Value,
) -> Result<Vec<Vec<f32>>, String> {
    use pteria::runtime::{HostTensor, Output};
    let calls = m["inputs"]["calls"].as_array().expect("calls");
    let mut logits = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let (toks, pos) = (ints(&c["tokens"][0]), ints(&c["input_pos"]));
        let out = method
            .execute(&[
                HostTensor::from_i64(&[1, toks.len()], &toks),
                HostTensor::from_i64(&[pos.len()], &pos),
            ])
            .map_err(|e| format!("call {i}: {e}"))?;
        let Output::Tensor(t) = &out[0] else {
            return Err(format!("call {i}: output {:?} is not a tensor", out[0]));
        };
        logits.push(t.to_f32().map_err(|e| format!("call {i}: {e}"))?);
    }
    Ok(logits)
}

/// One token at position 0 for each of `m`'s inputs, in its dtype (a fuzzed program's run).
pub fn one_token_inputs(m: &pteria::runtime::Method) -> Vec<pteria::runtime::HostTensor> {
    m.input_specs()
        .iter()
        .map(|(dt, sizes)| {
            let shape: Vec<usize> = sizes.iter().map(|_| 1).collect();
            pteria::runtime::HostTensor::from_i64(&shape, &[0]).cast(*dt)
        })
        .collect()
}

/// The `tokenizer.json` of a SentencePiece-style (Llama/Gemma) byte-fallback BPE: `specials`
/// (ids from 0, added tokens), the 256 byte tokens `<0x00>`…, then `words`, with `merges`; "▁"
/// for spaces, decoder Replace → ByteFallback → Fuse → Strip.
pub fn byte_fallback_json(specials: &[&str], words: &[&str], merges: &[&str]) -> serde_json::Value {
    use serde_json::json;
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, s) in specials.iter().enumerate() {
        vocab.insert(s.to_string(), json!(i));
        added.push(
            json!({"id": i, "content": s, "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}),
        );
    }
    for b in 0..=255u32 {
        let n = vocab.len();
        vocab.insert(format!("<0x{b:02X}>"), json!(n));
    }
    for w in words {
        let n = vocab.len();
        vocab.insert(w.to_string(), json!(n));
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
}
