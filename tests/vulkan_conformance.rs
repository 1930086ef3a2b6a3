//! Vulkan fixtures through the IR: every call of each VulkanBackend program matches its golden
//! within the manifest's tolerance, on the CPU executor and on the GPU executor (lavapipe in CI).

mod common;

use pteria::pte::Program;
use pteria::runtime::delegate::{cpu_executor, gpu_executor, ExecutorFactory};
use pteria::runtime::{HostTensor, Method};
use serde_json::Value;

/// Worst per-call rel-L2 of one program against its golden.
fn worst_rel_l2(entry: &Value, m: &Value, make: ExecutorFactory) -> Result<f64, String> {
    let file = entry["file"].as_str().unwrap();
    // Every Vulkan fixture, the stock export's CPU glue ops included, runs as one IR graph.
    let mut method = common::load_whole(file, make)?;
    let errs =
        common::golden_rel_l2_per_call(&mut method, entry, m).map_err(|e| format!("{file} {e}"))?;
    // `f64::max` skips NaN; a NaN call must fail.
    if let Some(i) = errs.iter().position(|e| e.is_nan()) {
        return Err(format!("{file} call {i}: NaN logits"));
    }
    Ok(errs.into_iter().fold(0f64, f64::max))
}

fn vulkan_entries(m: &Value) -> Vec<Value> {
    let v = common::manifest_programs(m, "vulkan");
    assert!(v.len() >= 2, "expected the fp32 and 8da4w Vulkan fixtures");
    v
}

#[test]
fn vulkan_fixtures_match_goldens_on_the_cpu_executor() {
    let m = common::manifest();
    for e in vulkan_entries(&m) {
        let tol = e["tolerance_rel_l2_per_call"].as_f64().unwrap();
        let worst = worst_rel_l2(&e, &m, cpu_executor()).unwrap_or_else(|err| panic!("{err}"));
        println!(
            "cpu {}: worst rel-L2 {worst:.2e} (tolerance {tol:.0e})",
            e["file"]
        );
        assert!(worst <= tol, "{}: {worst:.3e} > {tol:.0e}", e["file"]);
    }
}

#[test]
fn vulkan_fixtures_match_goldens_on_the_gpu_executor() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    println!("adapter: {:?}", ctx.adapter());
    let m = common::manifest();
    for e in vulkan_entries(&m) {
        let tol = e["tolerance_rel_l2_per_call"].as_f64().unwrap();
        let worst =
            worst_rel_l2(&e, &m, gpu_executor(ctx.clone())).unwrap_or_else(|err| panic!("{err}"));
        println!(
            "gpu {}: worst rel-L2 {worst:.2e} (tolerance {tol:.0e})",
            e["file"]
        );
        assert!(worst <= tol, "{}: {worst:.3e} > {tol:.0e}", e["file"]);
    }
}

/// With every embedding table left on the host (`ContextOptions::host_gather_min_bytes`, here 1
/// byte), the fixtures still match their goldens on every call, and the stock export's GPU
/// constants shrink by its token table (its 4-bit rows, scales; the biases were derived) while
/// its logits stay those of the GPU's own gathers.
#[test]
fn vulkan_fixtures_match_goldens_with_embeddings_gathered_on_the_host() {
    let Some(base) = common::gpu_context() else {
        return;
    };
    let ctx = std::sync::Arc::new(
        pteria::gpu::Context::with_options(pteria::gpu::ContextOptions {
            host_gather_min_bytes: Some(1),
            ..Default::default()
        })
        .expect("the GPU opened once already"),
    );
    let m = common::manifest();
    for e in vulkan_entries(&m) {
        let tol = e["tolerance_rel_l2_per_call"].as_f64().unwrap();
        let worst =
            worst_rel_l2(&e, &m, gpu_executor(ctx.clone())).unwrap_or_else(|err| panic!("{err}"));
        println!("host gathers {}: worst rel-L2 {worst:.2e}", e["file"]);
        assert!(worst <= tol, "{}: {worst:.3e} > {tol:.0e}", e["file"]);
    }
    let file = "gemma4_tiny_vulkan_stock_8da4w_emb4.pte";
    let (host, on_host) = logits_on(file, ctx);
    let (gpu, on_gpu) = logits_on(file, base);
    assert!(
        on_host.constants < on_gpu.constants,
        "{} bytes of constants against {}",
        on_host.constants,
        on_gpu.constants
    );
    // Rows dequantized on the host as the CPU executor does, against the GPU's kernel: the same
    // bits on lavapipe and the H100 (a compiler fusing s · q + b could move an ulp).
    assert_eq!(host.len(), gpu.len());
    for (k, (h, d)) in host.iter().zip(&gpu).enumerate() {
        let (num, den) = h.iter().zip(d).fold((0f64, 0f64), |(n, m), (a, b)| {
            (n + ((a - b) as f64).powi(2), m + (*b as f64).powi(2))
        });
        let rel = (num / den.max(1e-30)).sqrt();
        println!("host vs GPU gathers, call {k}: rel-L2 {rel:.2e}");
        assert!(rel <= 1e-6, "{file}: call {k}: rel-L2 {rel:.2e}");
    }
}

fn replace_all(bytes: &mut [u8], from: &[u8], to: &[u8]) -> usize {
    assert_eq!(
        from.len(),
        to.len(),
        "same-length rewrite keeps every offset"
    );
    let mut n = 0;
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
            n += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    n
}

/// A program using operators we lack, in CPU kernel calls and in several delegates, fails at
/// load with one error that names every one of them (and how many delegates use each), not
/// just the first.
#[test]
fn unsupported_operators_are_all_listed_at_load() {
    let path = common::fixtures().join("gemma4_tiny_vulkan_stock_8da4w_emb4.pte");
    let mut bytes = std::fs::read(&path).unwrap();
    // Op names are flatbuffer strings: same-length renames keep the file valid.
    let gelu = replace_all(&mut bytes, b"aten.gelu.default", b"aten.gelx.default");
    let emb = replace_all(
        &mut bytes,
        b"et_vk.embedding_q4gsw.default",
        b"et_vk.embedding_q4gsx.default",
    );
    let cpu = replace_all(&mut bytes, b"aten::index_put", b"aten::index_pux");
    assert!(gelu > 2 && emb == 2 && cpu == 1, "{gelu} {emb} {cpu}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("renamed.pte");
    std::fs::write(&file, &bytes).unwrap();
    let program = Program::open(&file, &[]).expect("still a valid program");
    let backends = pteria::frontend::backends(cpu_executor());
    let msg = Method::load(&program, "forward", &backends)
        .err()
        .expect("unsupported operators must fail the load")
        .to_string();
    for want in [
        "aten::index_pux.out (CPU kernel)".to_string(),
        format!("aten.gelx.default (VulkanBackend, {gelu} delegates)"),
        "et_vk.embedding_q4gsx.default (VulkanBackend, 2 delegates)".to_string(),
    ] {
        assert!(msg.contains(&want), "`{want}` missing from: {msg}");
    }
}

/// The stock export keeps its KV caches in mutable buffers that CPU `index_put`/`copy_` ops
/// update between delegates. Run whole on the GPU, a call is a few submits, the caches are State
/// buffers that never travel: a decode step uploads its token and position (two i32) only.
#[test]
fn whole_method_keeps_the_kv_cache_on_the_gpu() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    let path = common::fixtures().join("gemma4_tiny_vulkan_stock_8da4w_emb4.pte");
    let program = Program::open(&path, &[]).unwrap();
    let (make, handles) = pteria::runtime::delegate::profiled_gpu_executor(ctx);
    let backends = pteria::frontend::backends(make);
    let mut method = Method::load(&program, "forward", &backends).unwrap();
    assert!(method.runs_whole(), "{:?}", method.whole_note());
    let execs = handles.lock().unwrap().clone();
    assert_eq!(execs.len(), 1, "one executor for the whole method");
    let exec = execs[0].clone();
    // 8 caches of [1, 1, 32, 16 or 32] f32.
    let states = exec.lock().unwrap().memory().states;
    assert!(states >= 6 * 2048 + 2 * 4096, "state bytes {states}");

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
        // The first decode step is encoded in pieces of 64 dispatches, then 256, then 1024, ...
        // Later steps submit what the step before encoded ahead: one submit.
        let (mut pieces, mut left, mut piece) = (0, st.last_dispatches, 64);
        while left > 0 {
            (pieces, left, piece) = (pieces + 1, left.saturating_sub(piece), piece * 4);
        }
        assert!(pieces <= 3, "{st:?}");
        assert_eq!(
            st.submits - submits,
            if pos == 4 { pieces } else { 1 },
            "submits of the call at {pos}: {st:?}"
        );
        submits = st.submits;
        assert_eq!(st.last_upload_bytes, 8, "token and position only: {st:?}");
        assert_eq!(st.last_readback_bytes, 256 * 4, "the logits only: {st:?}");
    }
    let st = exec.lock().unwrap().stats();
    assert_eq!((st.recordings, st.replays), (2, 3), "{st:?}");
}

/// A GPU context whose executors hold KV caches as f16 (`--kv f16`).
fn f16_kv_context() -> Option<std::sync::Arc<pteria::gpu::Context>> {
    common::gpu_context()?;
    let opts = pteria::runtime::delegate::gpu_options(pteria::runtime::delegate::KvCache::F16);
    Some(std::sync::Arc::new(
        pteria::gpu::Context::with_options(opts).expect("the GPU opened once already"),
    ))
}

/// The manifest's calls on fixture `file` run whole on `ctx`: each call's logits, and the
/// executor's memory.
fn logits_on(
    file: &str,
    ctx: std::sync::Arc<pteria::gpu::Context>,
) -> (Vec<Vec<f32>>, pteria::gpu::MemoryReport) {
    let (make, handles) = pteria::runtime::delegate::profiled_gpu_executor(ctx);
    let mut method = common::load_whole(file, make).unwrap_or_else(|e| panic!("{e}"));
    let logits = common::manifest_call_logits(&mut method, &common::manifest())
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let execs = handles.lock().unwrap().clone();
    assert_eq!(execs.len(), 1, "{file}: one executor for the whole method");
    let mem = execs[0].lock().unwrap().memory();
    (logits, mem)
}

/// `--kv f16` on the stock export (the benchmark program's path: caches written by `index_put`,
/// read by q·Kᵀ and p·V matmuls): its 8 caches take half the bytes, and its logits stay within a
/// bound of the f32 caches' on every call. Measured on lavapipe: rel-L2 5.2e-2 to 9.1e-2. That
/// is far more than f16's rounding because the dynamic int8 activation quantization of this
/// tiny random-weight 8da4w model turns a last-bit difference into flipped roundings
/// (`f16_kv_cache_error_is_f16_rounding_without_activation_quantization` isolates the caches'
/// own share).
#[test]
fn f16_kv_caches_halve_the_stock_exports_caches_within_a_measured_error() {
    let (Some(c32), Some(c16)) = (common::gpu_context(), f16_kv_context()) else {
        return;
    };
    let file = "gemma4_tiny_vulkan_stock_8da4w_emb4.pte";
    let (l32, m32) = logits_on(file, c32);
    let (l16, m16) = logits_on(file, c16);
    assert_eq!((m32.kv_caches, m32.f16_kv_caches), (8, 0), "{m32:?}");
    assert_eq!((m16.kv_caches, m16.f16_kv_caches), (8, 8), "{m16:?}");
    // 6 caches of [1, 1, 32, 16] and 2 of [1, 1, 32, 32]: 20 KiB in f32.
    assert_eq!(m32.kv_cache, 6 * 2048 + 2 * 4096, "{m32:?}");
    assert_eq!(m16.kv_cache * 2, m32.kv_cache, "{m16:?}");
    assert_eq!(m16.states * 2, m32.states, "{m16:?}");
    // Only the caches shrink. The f32 plan may keep an activation longer: its norms store
    // into f32 caches, and a v norm running in the k norm's dispatch keeps its input until then.
    assert_eq!(
        (m16.constants, m16.inputs),
        (m32.constants, m32.inputs),
        "only the caches shrink"
    );
    assert!(m16.activations <= m32.activations, "{m16:?} {m32:?}");
    for (i, (a, b)) in l16.iter().zip(&l32).enumerate() {
        let e = pteria::runtime::rel_l2(a, b);
        println!("call {i}: f16 vs f32 KV caches, rel-L2 {e:.2e}");
        assert!(e > 0.0 && e <= 0.15, "call {i}: rel-L2 {e:.3e}");
    }
}

/// The same program with its linears' activation quantization taken out of the graph: then the
/// f16 caches' error is f16's rounding, rel-L2 at most 2e-3 a call (measured on lavapipe: 5.9e-4
/// to 1.03e-3), and the f32 caches still match the CPU executor.
#[test]
fn f16_kv_cache_error_is_f16_rounding_without_activation_quantization() {
    use pteria::ir::{ActQuant, Node, OpKind};
    let (Some(c32), Some(c16)) = (common::gpu_context(), f16_kv_context()) else {
        return;
    };
    let mut g = whole_graph("gemma4_tiny_vulkan_stock_8da4w_emb4.pte");
    let mut linears = 0;
    for node in &mut g.nodes {
        if let Node::Op(op) = node {
            if let OpKind::Linear { act_quant, .. } = &mut op.kind {
                *act_quant = ActQuant::None;
                linears += 1;
            }
        }
    }
    assert!(linears > 0);
    let mut cpu = pteria::ir::cpu::CpuExecutor::new(g.clone()).unwrap();
    let mut g32 = pteria::gpu::GpuExecutor::new(c32, g.clone()).unwrap();
    let mut g16 = pteria::gpu::GpuExecutor::new(c16, g).unwrap();
    assert_eq!(g16.memory().f16_kv_caches, 8);
    let m = common::manifest();
    for (i, c) in m["inputs"]["calls"].as_array().unwrap().iter().enumerate() {
        let (toks, pos) = (common::ints(&c["tokens"][0]), common::ints(&c["input_pos"]));
        let (tb, pb) = (i64_bytes(&toks), i64_bytes(&pos));
        let inputs = call_inputs(toks.len(), &tb, pos.len(), &pb);
        let run = |out: Vec<HostTensor>| out[0].to_f32().unwrap();
        let want = run(cpu.run(&inputs).unwrap());
        let (l32, l16) = (
            run(g32.run(&inputs).unwrap()),
            run(g16.run(&inputs).unwrap()),
        );
        let (e32, e16) = (
            pteria::runtime::rel_l2(&l32, &want),
            pteria::runtime::rel_l2(&l16, &l32),
        );
        println!("call {i}: f32 caches vs CPU {e32:.2e}, f16 vs f32 caches {e16:.2e}");
        assert!(e32 <= 1e-4, "call {i}: f32 caches vs the CPU: {e32:.3e}");
        assert!(
            e16 > 0.0 && e16 <= 2e-3,
            "call {i}: f16 vs f32 caches: {e16:.3e}"
        );
    }
}

/// The fp32 and 8da4w fixtures update their caches by arithmetic (a one-hot matmul added into the
/// cache), which the f16 path does not write: with `--kv f16` those States stay f32, no cache is
/// counted, and every call's logits are bit-identical to the f32 run's.
#[test]
fn caches_the_f16_path_cannot_write_stay_f32_and_unchanged() {
    let (Some(c32), Some(c16)) = (common::gpu_context(), f16_kv_context()) else {
        return;
    };
    for file in [
        "gemma4_tiny_vulkan_fp32.pte",
        "gemma4_tiny_vulkan_8da4w.pte",
    ] {
        let (l32, m32) = logits_on(file, c32.clone());
        let (l16, m16) = logits_on(file, c16.clone());
        assert_eq!(m16, m32, "{file}");
        assert_eq!(m16.kv_caches, 0, "{file}");
        assert_eq!(l16, l32, "{file}");
    }
}

/// The plan cache (`ir::PlanCache`) gives every call the shapes and symbols that full shape
/// inference gives, and reuses the last plan exactly when the shapes stay the same: decode steps
/// at new positions, not a prompt after a decode step. Every op's shapes stay the same when any
/// symbol but those `shape_syms` names for it changes (the cache re-runs an op only when one of
/// those does).
#[test]
fn plan_cache_matches_full_inference_on_every_call() {
    use pteria::ir::{infer_shapes, op_shapes, shape_syms, Node, PlanCache};
    for name in [
        "gemma4_tiny_vulkan_fp32.pte",
        "gemma4_tiny_vulkan_8da4w.pte",
        "gemma4_tiny_vulkan_stock_8da4w_emb4.pte",
    ] {
        let g = whole_graph(name);
        let mut cache = PlanCache::new(&g);
        // (tokens, first position): a prompt, decode steps, a shorter prompt, decode again.
        let calls = [
            (10, 0),
            (1, 10),
            (1, 11),
            (1, 12),
            (4, 13),
            (1, 17),
            (1, 18),
        ];
        let mut reused = Vec::new();
        for &(n, start) in &calls {
            let pos: Vec<i64> = (start..start + n as i64).collect();
            let (tb, pb) = (i64_bytes(&vec![5; n]), i64_bytes(&pos));
            let inputs = call_inputs(n, &tb, n, &pb);
            let want = infer_shapes(&g, &inputs).unwrap();
            let (got, same) = cache.plan(&g, &inputs).unwrap();
            assert_eq!(*got, want, "{name}: the call at {start}");
            reused.push(same);
            for node in &g.nodes {
                if let Node::Op(o) = node {
                    let reads = shape_syms(&o.kind);
                    let shifted: Vec<i64> = (want.syms.iter().enumerate())
                        .map(|(s, &v)| if reads.contains(&s) { v } else { v + 3 })
                        .collect();
                    let ins: Vec<&[usize]> = o
                        .inputs
                        .iter()
                        .map(|&t| want.shapes[t].as_slice())
                        .collect();
                    assert_eq!(
                        op_shapes(&o.kind, &ins, &want.syms),
                        op_shapes(&o.kind, &ins, &shifted),
                        "{name}: {}",
                        o.kind.label()
                    );
                }
            }
        }
        assert_eq!(
            reused,
            [false, false, true, true, false, false, true],
            "{name}"
        );
        // A bad call after a reused plan is the same error as without the cache.
        // Two tokens' bytes for a shape of one.
        let (tb, pb) = (i64_bytes(&[5, 5]), i64_bytes(&[19]));
        let bad = call_inputs(1, &tb, 1, &pb);
        let want = infer_shapes(&g, &bad).unwrap_err().to_string();
        assert_eq!(
            cache.plan(&g, &bad).unwrap_err().to_string(),
            want,
            "{name}"
        );
    }
}

/// Fixture `file`'s `forward` lowered to one IR graph (its delegates through the IR front ends).
fn whole_graph(file: &str) -> pteria::ir::Graph {
    let program = Program::open(&common::fixtures().join(file), &[]).unwrap();
    let plan = program.plans.iter().find(|p| p.name == "forward").unwrap();
    let backends = pteria::frontend::backends(cpu_executor());
    pteria::runtime::whole::lower_method(plan, &program.named_data, &backends).unwrap()
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A call's inputs: `tokens` token ids `[1, tokens]` and `positions` positions, from their bytes.
fn call_inputs<'a>(
    tokens: usize,
    tb: &'a [u8],
    positions: usize,
    pb: &'a [u8],
) -> [pteria::ir::InputValue<'a>; 2] {
    [
        pteria::ir::InputValue::Tensor {
            shape: vec![1, tokens],
            data: tb,
        },
        pteria::ir::InputValue::Tensor {
            shape: vec![positions],
            data: pb,
        },
    ]
}
