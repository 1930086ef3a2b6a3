//! Kernel benchmarks: the decode mat-vec (`linear` with one row of x) at Gemma 4 E2B shapes,
//! next to the device's streaming bandwidth measured by a WGSL copy kernel (`layout::copy4`):
//! `copy_buffer_to_buffer` runs far below what shaders reach on some GPUs, so it is no yardstick.
//! Each case chains enough distinct weights that they cannot stay in the GPU's caches, and is
//! timed over replays with GPU timestamps where the adapter has them.

use super::raw_vulkan::{raw_dispatch, RawDispatch};
use super::{Context, GpuError, GpuExecutor};
use crate::ir::{ActQuant, AttnLayout, DType, Graph, InputValue, Int, Io, OpKind, Role, Weight};
use crate::pte::{Blob, Bytes};
use serde::Serialize;
use std::sync::Arc;

/// Gemma 4 E2B's decode mat-vec shapes (K → N): attention projections, MLP (plain and the
/// double-width layers), per-layer input projections and the 262144-row LM head.
pub const E2B_SHAPES: [(usize, usize); 7] = [
    (1536, 2048),
    (1536, 256),
    (1536, 6144),
    (1536, 12288),
    (6144, 1536),
    (12288, 1536),
    (1536, 262144),
];

/// One weight format a mat-vec case runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WeightCase {
    /// `f32`, `q8`, `q4`.
    pub weight: &'static str,
    pub group: usize,
    /// The 8da4w form: per-row dynamic int8 activations (torchao's rounding) before the mat-vec.
    pub dynamic_int8: bool,
}

impl WeightCase {
    /// `f32`, `q8g128`, `q4g128dq8`, …
    pub fn name(&self) -> String {
        let mut s = self.weight.to_string();
        if self.group > 0 {
            s += &format!("g{}", self.group);
        }
        if self.dynamic_int8 {
            s += "dq8";
        }
        s
    }

    fn ir(&self) -> Weight {
        match self.weight {
            "f32" => Weight::F32,
            "q8" => Weight::Q8 { group: self.group },
            _ => Weight::Q4 { group: self.group },
        }
    }
}

/// The formats `pteria bench --kernels` runs: 4-bit group 128 with dynamic int8 activations
/// (8da4w, the E2B exports' linears) and without, 8-bit group 128, 4-bit group 32, and f32 last:
/// on an H100 the cases right after freeing its 1.6 GB LM head ran up to 2x slow.
pub const WEIGHT_CASES: [WeightCase; 5] = [
    WeightCase {
        weight: "q4",
        group: 128,
        dynamic_int8: true,
    },
    WeightCase {
        weight: "q8",
        group: 128,
        dynamic_int8: false,
    },
    WeightCase {
        weight: "q4",
        group: 128,
        dynamic_int8: false,
    },
    WeightCase {
        weight: "q4",
        group: 32,
        dynamic_int8: false,
    },
    WeightCase {
        weight: "f32",
        group: 0,
        dynamic_int8: false,
    },
];

#[derive(Debug, Clone)]
pub struct KernelBenchOptions {
    pub shapes: Vec<(usize, usize)>,
    pub weights: Vec<WeightCase>,
    /// Bytes each case chains through, weights and activations (at least one layer): several
    /// times the GPU's last-level cache, so every layer is read from memory.
    pub bytes: u64,
    /// GPU time each measurement aims to span.
    pub seconds: f64,
    /// Rows of x each linear takes: 1 for the decode mat-vec, more for a prompt's.
    pub rows: usize,
}

impl Default for KernelBenchOptions {
    fn default() -> Self {
        KernelBenchOptions {
            shapes: E2B_SHAPES.to_vec(),
            weights: WEIGHT_CASES.to_vec(),
            bytes: 256 << 20,
            seconds: 0.2,
            rows: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct MatVecResult {
    /// Rows of x.
    pub m: usize,
    pub k: usize,
    pub n: usize,
    #[serde(flatten)]
    pub case: WeightCase,
    /// Distinct weights chained in one replay.
    pub layers: usize,
    /// Bytes one mat-vec reads: packed weights, scales and biases.
    pub bytes: u64,
    /// GPU bytes of one layer's activations: its x and y in f32, and x's int8 rows with their
    /// scales and zero points where it quantizes them.
    pub activation_bytes: u64,
    /// GPU time per mat-vec (the act-quant dispatch included where there is one).
    pub us: f64,
    pub gb_per_s: f64,
    /// `gb_per_s` against the streaming copy's.
    pub pct_of_stream: f64,
    /// Multiply-adds of the linear, two operations each, in 10^12 a second.
    pub tops: f64,
    /// `tops` against the device's integer dot products (quantized weights with int8
    /// activations) or f32 multiply-adds (the others; `arith_rates`).
    pub pct_of_arith: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct KernelReport {
    pub adapter: String,
    /// GPU timestamps (else wall-clock over replays in one submit).
    pub timestamps: bool,
    pub subgroups: Option<(u32, u32)>,
    /// Streaming copy, read plus write bytes per second, in GB/s.
    pub stream_gb_per_s: f64,
    /// Bytes each way of the copy that measured it (the best of `COPY_SIZES`).
    pub stream_bytes: u64,
    /// Every copy size tried (bytes each way) with its GB/s.
    pub stream_sizes: Vec<(u64, f64)>,
    /// GPU time of a dispatch that waits for the one before (`dependent_dispatch`), in µs.
    pub dependent_dispatch_us: f64,
    /// GPU time of a dispatch with no data dependency on the one before (`independent_dispatch`),
    /// in µs.
    pub independent_dispatch_us: f64,
    /// The same chains recorded through the Vulkan driver with no wgpu in between
    /// (`raw_vulkan`); `None` off Vulkan or where the probe could not run (`raw_vulkan_error`).
    pub raw_vulkan: Option<RawDispatch>,
    pub raw_vulkan_error: Option<String>,
    pub matvec: Vec<MatVecResult>,
    /// The device's integer dot product and f32 multiply-add rates (`arith_rates`).
    pub arith: ArithRates,
    pub attention: Vec<AttnResult>,
    /// A barrier across one dispatch's workgroups (`grid_barrier`), by grid size.
    pub grid_barrier: Vec<GridBarrierResult>,
}

/// What a grid-wide barrier inside one dispatch costs (`grid_barrier`).
#[derive(Debug, Clone, Serialize)]
pub struct GridBarrierResult {
    pub workgroups: u32,
    pub invocations: u32,
    /// µs a barrier; `None` where a run failed.
    pub us: Option<f64>,
    /// The failed run's waits that gave up and stale reads (else the last run's: 0).
    pub failures: u32,
    pub stale: u32,
}

/// Grids `kernel_bench` times `grid_barrier` on: (workgroups, invocations each). An H100 has
/// 132 multiprocessors, an H200 too.
pub const GRID_CASES: [(u32, u32); 6] = [
    (1, 256),
    (32, 256),
    (132, 256),
    (264, 256),
    (528, 64),
    (1056, 64),
];

/// A prefill's attention at Gemma 4 E2B shapes: 8 query heads on one kv head, [B, S, H, D]
/// (as the published exports' custom sdpa), causal from its start position over a 1024-row
/// cache.
#[derive(Debug, Clone, Serialize)]
pub struct AttnResult {
    pub queries: usize,
    /// Position of the first query: the keys before it are an earlier turn's.
    pub start: usize,
    pub head_dim: usize,
    pub cache: usize,
    pub window: Option<usize>,
    pub dispatches: usize,
    pub us: f64,
}

/// (queries, head dim, sliding window, start): E2B's sliding layers (d 256, window 512) and full
/// layers (d 512); a first prompt (start 0), and a chat turn's few queries after 480 positions.
pub const ATTN_CASES: [(usize, usize, Option<usize>, usize); 8] = [
    (128, 256, Some(512), 0),
    (128, 512, None, 0),
    (900, 256, Some(512), 0),
    (900, 512, None, 0),
    (16, 256, Some(512), 480),
    (16, 512, None, 480),
    (64, 256, Some(512), 480),
    (64, 512, None, 480),
];

/// Deterministic filler (xorshift64*): benchmarks need no randomness, only data that is not
/// all zeros.
fn filler(n: usize, seed: u64) -> Result<Vec<u8>, GpuError> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::new();
    // A shape asked for on the command line may not fit the host: say so, not abort.
    v.try_reserve_exact(n.saturating_add(8)).map_err(|_| {
        GpuError::Device(format!(
            "the benchmark's data needs {n} bytes of host memory, which could not be allocated"
        ))
    })?;
    while v.len() < n {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        v.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    v.truncate(n);
    Ok(v)
}

/// `n` f32 values in [lo, lo + span).
fn floats(n: usize, seed: u64, lo: f32, span: f32) -> Result<Vec<u8>, GpuError> {
    let mut v = filler(n.saturating_mul(4), seed)?;
    for c in v.chunks_exact_mut(4) {
        let u = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) >> 8;
        c.copy_from_slice(&(lo + span * u as f32 / (1u32 << 24) as f32).to_le_bytes());
    }
    Ok(v)
}

fn shared(bytes: Vec<u8>) -> Blob {
    Blob::whole(Arc::new(Bytes::Owned(bytes)))
}

/// Seconds per replay, with enough replays to span about `seconds` of GPU time, after as many
/// unmeasured: an idle GPU runs at low clocks at first (on an H100 the same copy measured 1377
/// or 2486 GB/s, and a dependent dispatch 2.2 or 6.4 us, as the first thing a process timed).
fn measure(
    gpu: &mut GpuExecutor,
    inputs: &[InputValue],
    seconds: f64,
) -> Result<(f64, bool), GpuError> {
    let first = gpu.time_replays(inputs, 1)?;
    let reps = (seconds / first.seconds.max(1e-7)).clamp(2.0, 500.0) as u32;
    gpu.time_replays(inputs, reps)?;
    let t = gpu.time_replays(inputs, reps)?;
    Ok((t.seconds, t.timestamps))
}

/// Bytes each way of the copies that measure the streaming bandwidth. One size can measure far
/// below the rest: on an H200 a copy of 256 MiB ran at 3241-3243 GB/s in every run while 128,
/// 192, 384 and 1024 MiB ran at 3979-4147 (README), so the yardstick is the best of several
/// sizes, each more than twice any GPU's last-level cache.
pub const COPY_SIZES: [u64; 3] = [128 << 20, 192 << 20, 384 << 20];

/// The streaming copy's bandwidth (read + write, bytes a second) at each of `COPY_SIZES` the
/// device binds, or at its largest binding where it binds none of them.
pub fn stream_bandwidths(ctx: &Arc<Context>, seconds: f64) -> Result<Vec<(u64, f64)>, GpuError> {
    let max = ctx.max_storage_binding();
    let mut sizes: Vec<u64> = COPY_SIZES.into_iter().filter(|&b| b <= max).collect();
    if sizes.is_empty() {
        sizes.push(max);
    }
    sizes
        .into_iter()
        .map(|b| Ok((b, stream_bandwidth_at(ctx, b, seconds)?)))
        .collect()
}

/// The fastest of `stream_bandwidths`' copies: (its bytes each way, bytes a second).
pub fn best_stream(sizes: &[(u64, f64)]) -> (u64, f64) {
    sizes
        .iter()
        .copied()
        .fold((0, 0.0), |best, s| if s.1 > best.1 { s } else { best })
}

/// The device's streaming bandwidth (read + write, bytes a second): the best of
/// `stream_bandwidths`.
pub fn stream_bandwidth(ctx: &Arc<Context>, seconds: f64) -> Result<f64, GpuError> {
    Ok(best_stream(&stream_bandwidths(ctx, seconds)?).1)
}

/// Streaming bandwidth (read + write) of the copy kernel over `bytes`, in bytes per second.
fn stream_bandwidth_at(ctx: &Arc<Context>, bytes: u64, seconds: f64) -> Result<f64, GpuError> {
    let n = (bytes.min(ctx.max_storage_binding()) / 16 * 4).max(4) as usize;
    let mut g = Graph::default();
    let x = g.add_tensor("x", DType::F32, vec![n], Role::Input(0));
    g.inputs.push(Io::Tensor(x));
    let y = g.add_tensor("y", DType::F32, vec![n], Role::Activation);
    g.op(OpKind::Copy, vec![x], vec![y]);
    g.outputs.push(y);
    let data = floats(n, 1, -1.0, 2.0)?;
    let inputs = [InputValue::Tensor {
        shape: vec![n],
        data: &data,
    }];
    let mut gpu = GpuExecutor::new(ctx.clone(), g)?;
    let (s, _) = measure(&mut gpu, &inputs, seconds)?;
    Ok(2.0 * n as f64 * 4.0 / s)
}

/// GPU time of one dispatch that must wait for the one before (a barrier between them), in
/// seconds: a chain of 256 element-wise negations of 1536 floats, each reading the last one's
/// output. A decode step is such a chain, so this times its dispatch count is its floor however
/// few bytes its kernels move.
pub fn dependent_dispatch(ctx: &Arc<Context>, seconds: f64) -> Result<f64, GpuError> {
    negations(ctx, seconds, true)
}

/// GPU time of one dispatch with no data dependency on the one before: 256 negations of the
/// same 1536 floats, each into its own buffer (wgpu may still place barriers between them).
/// Against `dependent_dispatch`, whether independent dispatches run any cheaper.
pub fn independent_dispatch(ctx: &Arc<Context>, seconds: f64) -> Result<f64, GpuError> {
    negations(ctx, seconds, false)
}

/// Seconds per dispatch of 256 negations of 1536 floats, each of the last one's output
/// (`chained`) or each of the input into a buffer of its own.
fn negations(ctx: &Arc<Context>, seconds: f64, chained: bool) -> Result<f64, GpuError> {
    let (links, d) = (256, 1536);
    let mut g = Graph::default();
    let x = g.add_tensor("x", DType::F32, vec![1, d], Role::Input(0));
    g.inputs.push(Io::Tensor(x));
    let mut t = x;
    for i in 0..links {
        let y = g.add_tensor(format!("t{i}"), DType::F32, vec![1, d], Role::Activation);
        g.op(OpKind::Unary(crate::ir::UnaryOp::Neg), vec![t], vec![y]);
        if chained {
            t = y;
        } else {
            g.outputs.push(y);
        }
    }
    if chained {
        g.outputs.push(t);
    }
    let data = floats(d, 7, -1.0, 2.0)?;
    let inputs = [InputValue::Tensor {
        shape: vec![1, d],
        data: &data,
    }];
    let mut gpu = GpuExecutor::new(ctx.clone(), g)?;
    let (s, _) = measure(&mut gpu, &inputs, seconds)?;
    Ok(s / links as f64)
}

/// What one layer of a mat-vec case takes.
struct CaseSize {
    /// Bytes of packed weights (f32 or quantized).
    packed: usize,
    /// Quantization groups (an f32 scale and bias each).
    groups: usize,
    weight_bytes: u64,
    activation_bytes: u64,
}

/// `m` rows of `k`x`n` in `case`'s format, or why this device cannot run it. Shapes come from
/// the command line: they are checked before any benchmark runs or host memory is taken.
fn case_size(
    ctx: &Context,
    m: usize,
    k: usize,
    n: usize,
    case: WeightCase,
) -> Result<CaseSize, GpuError> {
    let what = format!("{m} rows of {k}x{n} ({})", case.name());
    if m == 0 || k == 0 || n == 0 {
        return Err(GpuError::Device(format!("{what}: a dimension is 0")));
    }
    let too_large = || GpuError::Device(format!("{what} is too large to benchmark"));
    let activation_bytes = activation_bytes(m, k, n, case.dynamic_int8).ok_or_else(too_large)?;
    let widest = 4 * (m as u64).saturating_mul(k.max(n) as u64);
    if widest > ctx.max_storage_binding() {
        return Err(GpuError::Device(format!(
            "{what}: an activation of {widest} bytes is more than the device's {}-byte storage \
             binding",
            ctx.max_storage_binding()
        )));
    }
    let nk = n.checked_mul(k).ok_or_else(too_large)?;
    // Packed bytes, and the group (an f32 scale and bias each).
    let (packed, group) = match case.ir() {
        Weight::F32 => (nk.checked_mul(4).ok_or_else(too_large)?, 0),
        Weight::Q8 { group } => (nk, group),
        Weight::Q4 { group } => (nk / 2, group),
    };
    if group > 0 && k % group != 0 {
        return Err(GpuError::Device(format!(
            "{what}: K is not a multiple of the group size {group}"
        )));
    }
    let groups = nk.checked_div(group).unwrap_or(0);
    let weight_bytes = (groups as u64)
        .checked_mul(8)
        .and_then(|b| b.checked_add(packed as u64))
        .ok_or_else(too_large)?;
    Ok(CaseSize {
        packed,
        groups,
        weight_bytes,
        activation_bytes,
    })
}

/// One case: `layers` linears M×K → N, each with its own weight buffers, in one graph.
fn matvec_case(
    ctx: &Arc<Context>,
    m: usize,
    k: usize,
    n: usize,
    case: WeightCase,
    budget: u64,
    seconds: f64,
) -> Result<(usize, CaseSize, f64), GpuError> {
    let w = case.ir();
    let size = case_size(ctx, m, k, n, case)?;
    let (packed, groups) = (size.packed, size.groups);
    // Activations count: with many rows of x they, not the weights, fill GPU memory.
    let layers = budget
        .div_ceil(size.weight_bytes.saturating_add(size.activation_bytes))
        .clamp(1, 2048) as usize;
    // One host copy of each constant serves every layer: each still gets its own GPU buffer.
    let wdata = shared(match w {
        Weight::F32 => floats(n * k, 2, -0.05, 0.1)?,
        _ => filler(packed, 3)?,
    });
    let sdata = shared(floats(groups, 4, 0.001, 0.01)?);
    let bdata = shared(floats(groups, 5, -0.05, 0.1)?);
    let mut g = Graph::default();
    let act_quant = if case.dynamic_int8 {
        ActQuant::Torchao
    } else {
        ActQuant::None
    };
    let mut outs = Vec::new();
    for l in 0..layers {
        // An input per layer: linears of one input would quantize it once (memory.rs), and each
        // 8da4w decode linear of the benchmark is to pay for its own quantization.
        let x = g.add_tensor(format!("x{l}"), DType::F32, vec![m, k], Role::Input(l));
        g.inputs.push(Io::Tensor(x));
        let mut ins = vec![x];
        match w {
            Weight::F32 => ins.push(g.add_tensor(
                format!("w{l}"),
                DType::F32,
                vec![n, k],
                Role::Constant(wdata.clone()),
            )),
            _ => {
                let (dt, cols) = match w {
                    Weight::Q4 { .. } => (DType::U8, k / 2),
                    _ => (DType::I8, k),
                };
                let gk = groups / n;
                ins.push(g.add_tensor(
                    format!("w{l}"),
                    dt,
                    vec![n, cols],
                    Role::Constant(wdata.clone()),
                ));
                ins.push(g.add_tensor(
                    format!("s{l}"),
                    DType::F32,
                    vec![n, gk],
                    Role::Constant(sdata.clone()),
                ));
                ins.push(g.add_tensor(
                    format!("b{l}"),
                    DType::F32,
                    vec![n, gk],
                    Role::Constant(bdata.clone()),
                ));
            }
        }
        let y = g.add_tensor(format!("y{l}"), DType::F32, vec![m, n], Role::Activation);
        g.op(
            OpKind::Linear {
                weight: w,
                act_quant,
                has_bias: false,
            },
            ins,
            vec![y],
        );
        outs.push(y);
    }
    // Only the last output is read back; every layer still runs (the executor runs every node).
    let Some(&last) = outs.last() else {
        return Err(GpuError::Device("a benchmark case without layers".into()));
    };
    g.outputs.push(last);
    let data = floats(m * k, 6, -1.0, 2.0)?;
    let inputs: Vec<InputValue> = (0..layers)
        .map(|_| InputValue::Tensor {
            shape: vec![m, k],
            data: &data,
        })
        .collect();
    let mut gpu = GpuExecutor::new(ctx.clone(), g)?;
    let (s, _) = measure(&mut gpu, &inputs, seconds)?;
    Ok((layers, size, s / layers as f64))
}

/// GPU bytes of one benchmark layer's activations (`MatVecResult::activation_bytes`).
/// None where it does not fit 64 bits.
fn activation_bytes(m: usize, k: usize, n: usize, quantized: bool) -> Option<u64> {
    let (m, k, n) = (m as u64, k as u64, n as u64);
    let floats = m.checked_mul(k.checked_add(n)?)?.checked_mul(4)?;
    let int8 = if quantized {
        m.checked_mul(k.checked_add(8)?)?
    } else {
        0
    };
    floats.checked_add(int8)
}

/// Whether `ctx` can run every mat-vec case of `opts` (`kernel_bench` asks first).
pub fn check_cases(ctx: &Context, opts: &KernelBenchOptions) -> Result<(), GpuError> {
    for &case in &opts.weights {
        for &(k, n) in &opts.shapes {
            case_size(ctx, opts.rows, k, n, case)?;
        }
    }
    Ok(())
}

/// The mat-vec table for `opts`, on `ctx`.
pub fn kernel_bench(
    ctx: &Arc<Context>,
    opts: &KernelBenchOptions,
    mut progress: impl FnMut(&MatVecResult),
) -> Result<KernelReport, GpuError> {
    check_cases(ctx, opts)?;
    let sizes = stream_bandwidths(ctx, opts.seconds)?;
    let (copy_bytes, stream) = best_stream(&sizes);
    let dependent = dependent_dispatch(ctx, opts.seconds)?;
    let independent = independent_dispatch(ctx, opts.seconds)?;
    let (raw_vulkan, raw_vulkan_error) = if ctx.adapter().backend == "vulkan" {
        match raw_dispatch(&ctx.adapter().name, opts.seconds) {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e)),
        }
    } else {
        (
            None,
            Some(format!(
                "the adapter is not Vulkan ({})",
                ctx.adapter().backend
            )),
        )
    };
    let arith = arith_rates(ctx)?;
    let mut attention = Vec::new();
    for &(s, d, window, start) in &ATTN_CASES {
        attention.push(attention_case(ctx, s, d, window, start, opts.seconds)?);
    }
    let mut grid = Vec::new();
    for &(workgroups, invocations) in &GRID_CASES {
        let (s, run) = grid_barrier(ctx, workgroups, invocations)?;
        grid.push(GridBarrierResult {
            workgroups,
            invocations,
            us: s.map(|s| s * 1e6),
            failures: run.failures,
            stale: run.stale,
        });
    }
    let mut rows = Vec::new();
    for &case in &opts.weights {
        for &(k, n) in &opts.shapes {
            let m = opts.rows;
            let (layers, size, s) = matvec_case(ctx, m, k, n, case, opts.bytes, opts.seconds)?;
            let bytes = size.weight_bytes;
            let bw = bytes as f64 / s;
            let r = MatVecResult {
                m,
                k,
                n,
                case,
                layers,
                bytes,
                activation_bytes: size.activation_bytes,
                us: s * 1e6,
                gb_per_s: bw / 1e9,
                pct_of_stream: 100.0 * bw / stream,
                tops: 2.0 * (m * k * n) as f64 / s / 1e12,
                pct_of_arith: {
                    // Multiply-adds a second: four a dot product.
                    let peak = if case.dynamic_int8 {
                        4.0 * arith.dots_per_s
                    } else {
                        arith.fmas_per_s
                    };
                    100.0 * (m * k * n) as f64 / s / peak
                },
            };
            progress(&r);
            rows.push(r);
        }
    }
    Ok(KernelReport {
        adapter: ctx.adapter().to_string(),
        timestamps: ctx.has_timestamps(),
        subgroups: ctx.adapter().subgroup_sizes,
        stream_gb_per_s: stream / 1e9,
        stream_bytes: copy_bytes,
        stream_sizes: sizes.iter().map(|&(b, s)| (b, s / 1e9)).collect(),
        dependent_dispatch_us: dependent * 1e6,
        independent_dispatch_us: independent * 1e6,
        raw_vulkan,
        raw_vulkan_error,
        matvec: rows,
        arith,
        attention,
        grid_barrier: grid,
    })
}

/// One `Sdpa` as `AttnResult` says, its GPU time replayed.
fn attention_case(
    ctx: &Arc<Context>,
    s: usize,
    d: usize,
    window: Option<usize>,
    start: usize,
    seconds: f64,
) -> Result<AttnResult, GpuError> {
    let (hq, cache) = (8, 1024);
    let mut g = Graph::default();
    let qs = vec![1, s, hq, d];
    let ks = vec![1, cache, 1, d];
    let q = g.add_tensor("q", DType::F32, qs.clone(), Role::Input(0));
    let k = g.add_tensor("k", DType::F32, ks.clone(), Role::Input(1));
    let v = g.add_tensor("v", DType::F32, ks.clone(), Role::Input(2));
    for t in [q, k, v] {
        g.inputs.push(Io::Tensor(t));
    }
    let start_sym = g.add_sym("start");
    g.inputs.push(Io::Sym(start_sym));
    let y = g.add_tensor("y", DType::F32, qs.clone(), Role::Activation);
    let kind = OpKind::Sdpa {
        layout: AttnLayout::Bshd,
        scale: 1.0,
        causal: true,
        window,
        softcap: None,
        start: Int::Sym(start_sym),
        all_rows: false,
    };
    g.op(kind, vec![q, k, v], vec![y]);
    g.outputs.push(y);
    let (qd, kd) = (
        floats(s * hq * d, 3, -1.0, 2.0)?,
        floats(cache * d, 4, -1.0, 2.0)?,
    );
    let inputs = [
        InputValue::Tensor {
            shape: qs,
            data: &qd,
        },
        InputValue::Tensor {
            shape: ks.clone(),
            data: &kd,
        },
        InputValue::Tensor {
            shape: ks,
            data: &kd,
        },
        InputValue::Sym(start as i64),
    ];
    let mut gpu = GpuExecutor::new(ctx.clone(), g)?;
    let (t, _) = measure(&mut gpu, &inputs, seconds)?;
    Ok(AttnResult {
        queries: s,
        start,
        head_dim: d,
        cache,
        window,
        dispatches: gpu.stats().last_dispatches,
        us: t * 1e6,
    })
}

/// One dispatch of `kernels/grid_barrier.wgsl`: `workgroups` workgroups of `wg` invocations
/// passing `rounds` grid-wide barriers.
#[derive(Debug, Clone, Copy)]
pub struct GridRun {
    /// GPU time of the dispatch (timestamps where the device has them, else the wall clock
    /// around its submit and wait).
    pub seconds: f64,
    /// Waits that gave up (a workgroup never resident beside the others).
    pub failures: u32,
    /// Reads of a neighbour's word that did not see its last round's write.
    pub stale: u32,
}

/// Runs `grid_barrier.wgsl` once; see `GridRun`.
pub fn grid_barrier_run(
    ctx: &Arc<Context>,
    workgroups: u32,
    wg: u32,
    rounds: u32,
) -> Result<GridRun, GpuError> {
    use super::context::Slot;
    use wgpu::util::DeviceExt;
    if workgroups == 0 || workgroups > ctx.max_workgroups() || !(1..=256).contains(&wg) {
        return Err(GpuError::Device(format!(
            "grid barrier: {workgroups} workgroups of {wg} is not a dispatch this device runs"
        )));
    }
    let _turn = ctx.turn();
    let pipe = ctx.pipeline(
        "grid_barrier",
        "main",
        &[("WG", wg as f64)],
        &[Slot::Uniform, Slot::Write, Slot::Write],
    )?;
    let dev = &ctx.device;
    let storage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    let params = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("grid params"),
        contents: bytemuck::cast_slice(&[rounds, 0, 0, 0]),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    // Zeroed at creation: no arrivals, no failures, and every cell at round 0's value.
    let sync = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("grid sync"),
        size: 16,
        usage: storage,
        mapped_at_creation: false,
    });
    let cells = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("grid cells"),
        size: 8 * workgroups as u64,
        usage: storage,
        mapped_at_creation: false,
    });
    let read = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("grid read"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bind = bind_in_order(ctx, &pipe.layout, &[&params, &sync, &cells]);
    let seconds = timed_dispatch(ctx, &pipe.pipeline, &bind, workgroups, |enc| {
        enc.copy_buffer_to_buffer(&sync, 0, &read, 0, 16)
    })?;
    let words: Vec<u32> = bytemuck::pod_collect_to_vec(&super::executor::read_back(ctx, &read)?);
    let arrivals = words.first().copied().unwrap_or(0);
    let mut failures = words.get(1).copied().unwrap_or(u32::MAX);
    let stale = words.get(2).copied().unwrap_or(u32::MAX);
    // Every workgroup counted once a round, unless a failure ended the waiting.
    if failures == 0 && arrivals != rounds.saturating_mul(workgroups) {
        failures = 1;
    }
    Ok(GridRun {
        seconds,
        failures,
        stale,
    })
}

/// A bind group of whole `buffers` at bindings 0, 1, ... in order.
pub(crate) fn bind_in_order(
    ctx: &Context,
    layout: &wgpu::BindGroupLayout,
    buffers: &[&wgpu::Buffer],
) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> = (buffers.iter().enumerate())
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.as_entire_binding(),
        })
        .collect();
    ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout,
        entries: &entries,
    })
}

/// Runs one dispatch of `workgroups` workgroups (`after` encodes what follows it in the same
/// submit) and waits for it; returns its GPU time (timestamps where the device has them, else
/// the wall clock around the submit and wait).
fn timed_dispatch(
    ctx: &Arc<Context>,
    pipeline: &wgpu::ComputePipeline,
    bind: &wgpu::BindGroup,
    workgroups: u32,
    after: impl FnOnce(&mut wgpu::CommandEncoder),
) -> Result<f64, GpuError> {
    timed_dispatches(ctx, pipeline, &[bind], workgroups, |_| {}, after)
}

/// One dispatch of `workgroups` workgroups a bind group, in order in one pass (`before` and
/// `after` encode what precedes and follows the pass in the same submit), waited for; returns
/// the pass's GPU time (timestamps where the device has them, else the wall clock around the
/// submit and wait).
pub(crate) fn timed_dispatches(
    ctx: &Arc<Context>,
    pipeline: &wgpu::ComputePipeline,
    binds: &[&wgpu::BindGroup],
    workgroups: u32,
    before: impl FnOnce(&mut wgpu::CommandEncoder),
    after: impl FnOnce(&mut wgpu::CommandEncoder),
) -> Result<f64, GpuError> {
    let dev = &ctx.device;
    let stamps = ctx
        .has_timestamps()
        .then(|| super::executor::Stamps::new(ctx, 2));
    let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    before(&mut enc);
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: stamps.as_ref().map(|s| s.writes(0)),
        });
        pass.set_pipeline(pipeline);
        for bind in binds {
            pass.set_bind_group(0, *bind, &[]);
            pass.dispatch_workgroups(workgroups, 1, 1);
        }
    }
    after(&mut enc);
    if let Some(s) = &stamps {
        s.resolve(&mut enc);
    }
    let t0 = std::time::Instant::now();
    ctx.queue.submit([enc.finish()]);
    dev.poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| GpuError::Device(format!("waiting for a timed dispatch: {e}")))?;
    let wall = t0.elapsed().as_secs_f64();
    ctx.take_errors()?;
    Ok(match &stamps {
        Some(s) => {
            let t = s.read(ctx)?;
            t[1].saturating_sub(t[0]) as f64 * ctx.queue.get_timestamp_period() as f64 * 1e-9
        }
        None => wall,
    })
}

/// Integer dot products of four int8 pairs (`dot4I8Packed`: DP4A where the GPU has it) and f32
/// multiply-adds the device runs a second (`kernels/arith_probe.wgsl`): what a prompt's
/// quantized linears, made of the first, and the tiled f32 ones, made of the second, could reach.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ArithRates {
    pub dots_per_s: f64,
    pub fmas_per_s: f64,
}

/// `ArithRates` on `ctx`: each probe's best of a few dispatches long enough to time.
pub fn arith_rates(ctx: &Arc<Context>) -> Result<ArithRates, GpuError> {
    Ok(ArithRates {
        dots_per_s: arith_rate(ctx, "dots")?,
        fmas_per_s: arith_rate(ctx, "fmas")?,
    })
}

fn arith_rate(ctx: &Arc<Context>, entry: &'static str) -> Result<f64, GpuError> {
    use super::context::Slot;
    use wgpu::util::DeviceExt;
    const WG: u32 = 256;
    // Eight chains an invocation (the probe's), enough workgroups to fill any GPU.
    let workgroups = ctx.max_workgroups().min(8192);
    let _turn = ctx.turn();
    let pipe = ctx.pipeline(
        "arith_probe",
        entry,
        &[("WG", WG as f64)],
        &[Slot::Uniform, Slot::Write],
    )?;
    let dev = &ctx.device;
    let out = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("arith out"),
        size: 4 * (workgroups * WG) as u64,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let run = |iters: u32| -> Result<f64, GpuError> {
        let params = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("arith params"),
            contents: bytemuck::cast_slice(&[iters, 0x5eed, 0, 0]),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let bind = bind_in_order(ctx, &pipe.layout, &[&params, &out]);
        timed_dispatch(ctx, &pipe.pipeline, &bind, workgroups, |_| {})
    };
    // Grow the loop until a dispatch takes 20 ms (a CPU driver gets there at a few turns; an
    // H200 at about 16k). The cap keeps a timer that reads 0 from asking for minutes.
    let mut iters = 4u32;
    let mut s = run(iters)?;
    while s < 0.02 && iters < 1 << 16 {
        iters = ((iters as f64 * (0.025 / s.max(1e-6)).clamp(2.0, 64.0)) as u32).min(1 << 16);
        s = run(iters)?;
    }
    for _ in 0..3 {
        s = s.min(run(iters)?);
    }
    Ok(8.0 * iters as f64 * (workgroups * WG) as f64 / s)
}

/// What one grid-wide barrier costs with `workgroups` workgroups of `wg` invocations, in
/// seconds: the difference between dispatches of few and many rounds, over the extra rounds
/// (the least of a few tries); `None` where a run failed (the workgroups were not all resident
/// at once, or a read came stale), with that run.
pub fn grid_barrier(
    ctx: &Arc<Context>,
    workgroups: u32,
    wg: u32,
) -> Result<(Option<f64>, GridRun), GpuError> {
    let (few, many) = (16u32, 16 + 1024);
    let failed = |r: &GridRun| r.failures > 0 || r.stale > 0;
    // The first dispatches warm the GPU's clocks (see `measure`).
    let mut last = grid_barrier_run(ctx, workgroups, wg, many)?;
    for _ in 0..2 {
        if failed(&last) {
            return Ok((None, last));
        }
        last = grid_barrier_run(ctx, workgroups, wg, many)?;
    }
    // The least time of each length, then their difference: the least of the differences
    // instead came out at or below zero when one short run was slowed (a busy CPU driver).
    let (mut short, mut long) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        let a = grid_barrier_run(ctx, workgroups, wg, few)?;
        let b = grid_barrier_run(ctx, workgroups, wg, many)?;
        for r in [a, b] {
            if failed(&r) {
                return Ok((None, r));
            }
        }
        short = short.min(a.seconds);
        long = long.min(b.seconds);
        last = b;
    }
    Ok((Some(((long - short) / (many - few) as f64).max(0.0)), last))
}

/// A graph whose one output is `rows` rows of `values` (a constant) plus its one input, a single
/// float: with 0 in, a call makes the rows anew on the GPU, as an LM head does, for timing and
/// testing what reads logits back (`GpuExecutor::run_candidates`).
pub fn row_graph(values: &[f32], rows: usize) -> Graph {
    let shape = vec![rows, values.len() / rows.max(1)];
    let mut g = Graph::default();
    let s = g.add_tensor("s", DType::F32, vec![1], Role::Input(0));
    g.inputs.push(Io::Tensor(s));
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let l = g.add_tensor(
        "l",
        DType::F32,
        shape.clone(),
        Role::Constant(shared(bytes)),
    );
    let y = g.add_tensor("y", DType::F32, shape, Role::Activation);
    g.op(
        OpKind::Binary(crate::ir::BinaryOp::Add),
        vec![l, s],
        vec![y],
    );
    g.outputs.push(y);
    g
}

/// A graph whose output is one row of `values` (a constant) plus 0 · its one input, a token id
/// ([1, 1], i64): a call makes the row anew whatever the token, and the token can be fed a
/// pick on the device (`GpuExecutor::start_candidates`), for timing decode steps one ahead.
pub fn token_row_graph(values: &[f32]) -> Graph {
    let n = values.len();
    let mut g = Graph::default();
    let ids = g.add_tensor("ids", DType::I64, vec![1, 1], Role::Input(0));
    g.inputs.push(Io::Tensor(ids));
    let f = g.add_tensor("f", DType::F32, vec![1, 1], Role::Activation);
    g.op(OpKind::Cast, vec![ids], vec![f]);
    let zero = g.add_tensor(
        "zero",
        DType::F32,
        vec![1],
        Role::Constant(shared(0f32.to_le_bytes().to_vec())),
    );
    let z = g.add_tensor("z", DType::F32, vec![1, 1], Role::Activation);
    g.op(
        OpKind::Binary(crate::ir::BinaryOp::Mul),
        vec![f, zero],
        vec![z],
    );
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let l = g.add_tensor("l", DType::F32, vec![1, n], Role::Constant(shared(bytes)));
    let y = g.add_tensor("y", DType::F32, vec![1, n], Role::Activation);
    g.op(
        OpKind::Binary(crate::ir::BinaryOp::Add),
        vec![l, z],
        vec![y],
    );
    g.outputs.push(y);
    g
}

/// `n` logits shaped as a language model's: about normal (a sum of four uniforms), spread 3.
pub fn model_like_logits(n: usize, seed: u64) -> Result<Vec<f32>, GpuError> {
    let parts = (0..4)
        .map(|i| floats(n, seed + i, -1.0, 2.0))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((0..n)
        .map(|i| {
            let sum: f32 = parts
                .iter()
                .map(|p| f32::from_le_bytes([p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]]))
                .sum();
            3.0 * sum
        })
        .collect())
}
