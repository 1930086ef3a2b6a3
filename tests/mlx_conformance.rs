//! MLX fixtures through the IR: every call of each MLXBackend program matches its golden within
//! the manifest's tolerance, on the CPU executor and on the GPU executor (lavapipe in CI). fp32 is
//! checked against the portable program's ExecuTorch run, int4 against the eager quantized model.

mod common;

use pteria::pte::Program;
use pteria::runtime::delegate::{cpu_executor, gpu_executor, ExecutorFactory};
use pteria::runtime::{HostTensor, Method, Output};
use serde_json::Value;

/// Rel-L2 of every call of one program against its golden. The MLX programs' mutable KV buffers
/// and glue lower with their delegates: one graph.
fn rel_l2_per_call(entry: &Value, m: &Value, make: ExecutorFactory) -> Result<Vec<f64>, String> {
    let file = entry["file"].as_str().unwrap();
    let mut method = common::load_whole(file, make)?;
    common::golden_rel_l2_per_call(&mut method, entry, m).map_err(|e| format!("{file} {e}"))
}

fn mlx_entries(m: &Value) -> Vec<Value> {
    let v = common::manifest_programs(m, "mlx");
    assert!(v.len() >= 2, "expected the fp32 and int4 MLX fixtures");
    v
}

fn check_all(device: &str, make: impl Fn() -> ExecutorFactory) {
    let m = common::manifest();
    let mut failures = Vec::new();
    for e in mlx_entries(&m) {
        let file = e["file"].as_str().unwrap();
        let tol = e["tolerance_rel_l2_per_call"].as_f64().unwrap();
        match rel_l2_per_call(&e, &m, make()) {
            Ok(errs) => {
                let calls: Vec<String> = errs.iter().map(|x| format!("{x:.2e}")).collect();
                println!(
                    "{device} {file}: per call [{}] (tolerance {tol:.0e})",
                    calls.join(", ")
                );
                // NaN fails too.
                if !errs.iter().all(|&x| x <= tol) {
                    failures.push(format!("{file}: [{}] > {tol:.0e}", calls.join(", ")));
                }
            }
            Err(err) => failures.push(err),
        }
    }
    assert!(failures.is_empty(), "{device}: {}", failures.join("\n"));
}

#[test]
fn mlx_fixtures_match_goldens_on_the_cpu_executor() {
    check_all("cpu", cpu_executor);
}

#[test]
fn mlx_fixtures_match_goldens_on_the_gpu_executor() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    println!("adapter: {:?}", ctx.adapter());
    check_all("gpu", || gpu_executor(ctx.clone()));
}

/// Rel-L2 per call of fixture `name` (`<name>.pte`, run on the calls its `<name>.json` spec lists)
/// against `<name>.golden.npy`, rows of the spec's `width` values, and the spec's tolerance.
/// `inputs(call, first_row, width)` gives a call's inputs and how many rows it covers.
fn spec_rel_l2(
    name: &str,
    width: &str,
    make: ExecutorFactory,
    inputs: impl Fn(&Value, usize, usize) -> (Vec<HostTensor>, usize),
) -> Result<(Vec<f64>, f64), String> {
    let dir = common::fixtures();
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap())
            .unwrap();
    let tol = spec["tolerance_rel_l2_per_call"].as_f64().unwrap();
    let c = spec[width].as_u64().unwrap() as usize;
    let program =
        Program::open(&dir.join(format!("{name}.pte")), &[]).map_err(|e| e.to_string())?;
    let backends = pteria::frontend::backends(make);
    let mut method = Method::load(&program, "forward", &backends).map_err(|e| e.to_string())?;
    let (_, golden) = common::read_npy(&dir.join(format!("{name}.golden.npy")));
    let mut row = 0;
    let mut errs = Vec::new();
    for (i, call) in spec["calls"].as_array().unwrap().iter().enumerate() {
        let (ins, t) = inputs(call, row, c);
        let out = method.execute(&ins).map_err(|e| format!("call {i}: {e}"))?;
        let Output::Tensor(y) = &out[0] else {
            return Err(format!("call {i}: no tensor output"));
        };
        let got = y.to_f32().map_err(|e| e.to_string())?;
        errs.push(common::rel_l2(&got, &golden[row * c..(row + t) * c]));
        row += t;
    }
    Ok((errs, tol))
}

fn check_spec(device: &str, name: &str, result: Result<(Vec<f64>, f64), String>) {
    let (errs, tol) = result.unwrap_or_else(|e| panic!("{device}: {e}"));
    let calls: Vec<String> = errs.iter().map(|x| format!("{x:.2e}")).collect();
    println!(
        "{device} {name}.pte: per call [{}] (tolerance {tol:.0e})",
        calls.join(", ")
    );
    assert!(
        errs.iter().all(|&e| e <= tol),
        "{device}: [{}] > {tol:.0e}",
        calls.join(", ")
    );
}

/// `mlx_llm_ops.pte`: an attention block written with the MLX LLM custom ops (rope with a
/// position offset, linear and ring-buffer KV-cache updates, lower-right causal GQA
/// `custom_sdpa`, SDPA with a sliding-window mask, RMSNorm with and without weight) against the
/// same module run in PyTorch eager.
fn check_llm_ops(device: &str, make: ExecutorFactory) {
    let (_, xs) = common::read_npy(&common::fixtures().join("mlx_llm_ops.inputs.npy"));
    let result = spec_rel_l2("mlx_llm_ops", "hidden", make, |call, row, c| {
        let pos = common::ints(&call["input_pos"]);
        let t = pos.len();
        let x: Vec<f32> = xs[row * c..(row + t) * c]
            .iter()
            .map(|&v| v as f32)
            .collect();
        let ins = vec![
            HostTensor::from_f32(&[1, t, c], &x),
            HostTensor::from_i64(&[t], &pos),
        ];
        (ins, t)
    });
    check_spec(device, "mlx_llm_ops", result);
}

#[test]
fn mlx_llm_custom_ops_match_pytorch_eager_on_the_cpu_executor() {
    check_llm_ops("cpu", cpu_executor());
}

#[test]
fn mlx_llm_custom_ops_match_pytorch_eager_on_the_gpu_executor() {
    if let Some(ctx) = common::gpu_context() {
        check_llm_ops("gpu", gpu_executor(ctx));
    }
}

/// The runner chunks prefill by `forward`'s declared token bound; the MLX delegate declares the
/// same bound for its tokens slot, and the program's method info carries it.
#[test]
fn mlx_programs_declare_their_max_input_length() {
    let m = common::manifest();
    for e in mlx_entries(&m) {
        let file = e["file"].as_str().unwrap();
        let program = Program::open(&common::fixtures().join(file), &[]).unwrap();
        let meta = pteria::llm::ModelMetadata::read(&program).unwrap();
        assert_eq!(meta.max_input_len, 31, "{file}");
        assert_eq!(meta.max_chunk(), 31, "{file}");
        let plan = program.plan("forward").unwrap();
        let g = pteria::frontend::mlx::parse(&plan.delegates[0].data, &program.named_data).unwrap();
        let tokens = g
            .meta(pteria::frontend::mlx::Tid(g.input_map[0].idx))
            .unwrap();
        assert_eq!(
            tokens.shape[1],
            pteria::frontend::mlx::ShapeDim::Dynamic {
                min: 2,
                max: Some(31)
            },
            "{file}"
        );
    }
}

/// `mlx_quant_ops.pte`: torchao weight-only quantized embeddings (int4 group 32 and int8 group 64)
/// and linears (int8 group 128 and int4 group 64 with a bias), as the MLX recipe quantizes them,
/// against the quantized module in PyTorch eager.
fn check_quant_ops(device: &str, make: ExecutorFactory) {
    let result = spec_rel_l2("mlx_quant_ops", "out_features", make, |call, _, _| {
        let toks = common::ints(&call["tokens"]);
        let t = toks.len();
        (vec![HostTensor::from_i64(&[1, t], &toks)], t)
    });
    check_spec(device, "mlx_quant_ops", result);
}

#[test]
fn mlx_quantized_embeddings_and_linears_match_pytorch_eager_on_the_cpu_executor() {
    check_quant_ops("cpu", cpu_executor());
}

#[test]
fn mlx_quantized_embeddings_and_linears_match_pytorch_eager_on_the_gpu_executor() {
    if let Some(ctx) = common::gpu_context() {
        check_quant_ops("gpu", gpu_executor(ctx));
    }
}

/// The MLX export's attention slices its caches to the first pos + 1 rows, so each decode step
/// has shapes of its own. The GPU executor predicts the next step (this one's position plus one)
/// and records and encodes it while the GPU runs this one: every step after the first submits
/// once, what it encoded ahead, with no planning left; the logits equal the CPU executor's.
/// A call that is not the predicted one (a second prompt, a step back) plans anew and is right.
#[test]
fn position_following_decode_steps_are_recorded_ahead_and_right() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    let file = "gemma4_tiny_mlx_int4.pte";
    let (make, handles) = pteria::runtime::delegate::profiled_gpu_executor(ctx);
    let mut gpu = common::load_whole(file, make).unwrap();
    let mut cpu = common::load_whole(file, cpu_executor()).unwrap();
    let exec = handles.lock().unwrap()[0].clone();
    let logits = |m: &mut Method, tokens: &[i64], start: i64| -> Vec<f32> {
        let n = tokens.len();
        let pos: Vec<i64> = (start..start + n as i64).collect();
        let out = m
            .execute(&[
                HostTensor::from_i64(&[1, n], tokens),
                HostTensor::from_i64(&[n], &pos),
            ])
            .unwrap();
        let Output::Tensor(t) = &out[0] else {
            panic!("logits are a tensor")
        };
        t.to_f32().unwrap()
    };
    let check = |g: &[f32], c: &[f32], what: &str| {
        let num: f64 = g
            .iter()
            .zip(c)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum();
        let den: f64 = c.iter().map(|b| (*b as f64).powi(2)).sum();
        let err = (num / den).sqrt();
        assert!(err < 1e-4, "{what}: rel-L2 {err}");
    };
    let prompt = [2i64, 105, 36, 107];
    check(
        &logits(&mut gpu, &prompt, 0),
        &logits(&mut cpu, &prompt, 0),
        "prompt",
    );
    let mut submits = exec.lock().unwrap().stats().submits;
    for pos in 4..10i64 {
        let t = [7 + pos];
        let what = format!("decode at {pos}");
        check(
            &logits(&mut gpu, &t, pos),
            &logits(&mut cpu, &t, pos),
            &what,
        );
        let st = exec.lock().unwrap().stats();
        if pos > 4 {
            assert_eq!(st.submits - submits, 1, "{what}: {st:?}");
        }
        submits = st.submits;
    }
    // Off the prediction: a step back (the next position was predicted), then a second prompt.
    check(
        &logits(&mut gpu, &[30], 6),
        &logits(&mut cpu, &[30], 6),
        "a step back",
    );
    let again = [2i64, 105, 99];
    check(
        &logits(&mut gpu, &again, 0),
        &logits(&mut cpu, &again, 0),
        "a new prompt",
    );
    check(
        &logits(&mut gpu, &[41], 3),
        &logits(&mut cpu, &[41], 3),
        "its first step",
    );
}
