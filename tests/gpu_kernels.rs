//! Every GPU kernel and op variant against the CPU reference (`ir::cpu::CpuExecutor`) on the same
//! tiny graphs, with random data of awkward sizes; then record/replay, KV state across calls,
//! weight splitting past the storage binding limit, and the unsupported-op report.
//!
//! Runs on any wgpu adapter; without a GPU, lavapipe (Debian `mesa-vulkan-drivers`) provides a
//! CPU Vulkan one. No adapter at all fails every test with the reason, unless
//! PTERIA_NO_GPU_TESTS=1 is set.

use pteria::gpu::{
    Context, ContextOptions, GpuError, GpuExecutor, SPLIT_MAX_S, SPLIT_MAX_S_ALL_ROWS,
};
use pteria::ir::cpu::CpuExecutor;
use pteria::ir::{
    AttnLayout, BinaryOp, DType, Graph, InputValue, Int, Io, Node, OpKind, Role, RopeStyle, SymOp,
    TensorId, UnaryOp, Weight,
};
use pteria::pte::{Blob, Bytes};
use pteria::runtime::candidates::{DevicePick, Draw};
use pteria::runtime::HostTensor;
use std::sync::{Arc, OnceLock};

fn open(opts: ContextOptions) -> Option<Arc<Context>> {
    if std::env::var("PTERIA_NO_GPU_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("PTERIA_NO_GPU_TESTS=1: skipping a GPU test");
        return None;
    }
    // Prompt rows past MATVEC_ROWS take the tiled kernel, so that small tests reach both.
    let opts = ContextOptions {
        quad_matvec_rows: opts.quad_matvec_rows.or(Some(MATVEC_ROWS)),
        ..opts
    };
    match Context::with_options(opts) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) => panic!(
            "no GPU adapter for the GPU tests ({e}). Install lavapipe (Debian: mesa-vulkan-drivers) \
             or set PTERIA_NO_GPU_TESTS=1 to skip them"
        ),
    }
}

/// One device for the whole file: adapters are slow to open.
fn ctx() -> Option<Arc<Context>> {
    static CTX: OnceLock<Option<Arc<Context>>> = OnceLock::new();
    CTX.get_or_init(|| open(ContextOptions::default())).clone()
}

/// A device that plans with a 64 KiB storage binding, so modest weights must be split.
fn small_binding_ctx() -> Option<Arc<Context>> {
    static CTX: OnceLock<Option<Arc<Context>>> = OnceLock::new();
    CTX.get_or_init(|| {
        open(ContextOptions {
            max_storage_binding: Some(64 << 10),
            ..Default::default()
        })
    })
    .clone()
}

/// A device that binds at most WebGPU's default 8 storage buffers per kernel.
fn eight_binding_ctx() -> Option<Arc<Context>> {
    static CTX: OnceLock<Option<Arc<Context>>> = OnceLock::new();
    CTX.get_or_init(|| {
        open(ContextOptions {
            max_storage_buffers: Some(8),
            ..Default::default()
        })
    })
    .clone()
}

/// A device with subgroup operations left off, so kernels take their shared-memory paths.
fn no_subgroup_ctx() -> Option<Arc<Context>> {
    static CTX: OnceLock<Option<Arc<Context>>> = OnceLock::new();
    CTX.get_or_init(|| {
        open(ContextOptions {
            no_subgroups: true,
            ..Default::default()
        })
    })
    .clone()
}

/// A device whose kernels round XNNPACK's multiply-adds by their own sequence even where
/// `fma()` is fused.
fn emulated_fma_ctx() -> Option<Arc<Context>> {
    static CTX: OnceLock<Option<Arc<Context>>> = OnceLock::new();
    CTX.get_or_init(|| {
        open(ContextOptions {
            emulated_fma: true,
            ..Default::default()
        })
    })
    .clone()
}

/// A device whose prompts' quantized linears take their tiled kernels (`xnn_gemm` for
/// XNNPACK's) from two rows of x on.
fn one_row_ctx() -> Option<Arc<Context>> {
    static CTX: OnceLock<Option<Arc<Context>>> = OnceLock::new();
    CTX.get_or_init(|| {
        open(ContextOptions {
            quad_matvec_rows: Some(1),
            ..Default::default()
        })
    })
    .clone()
}

/// A device whose executors hold KV caches as f16.
fn f16_kv_ctx() -> Option<Arc<Context>> {
    static CTX: OnceLock<Option<Arc<Context>>> = OnceLock::new();
    CTX.get_or_init(|| {
        open(ContextOptions {
            f16_kv_cache: true,
            ..Default::default()
        })
    })
    .clone()
}

/// Both reduction paths: subgroups where the device has them, and shared memory.
fn check_both(what: &str, t: &T, tol: f32, floor: f32) {
    for (name, c) in [("", ctx()), (" (no subgroups)", no_subgroup_ctx())] {
        if let Some(c) = c {
            check_on(c, &format!("{what}{name}"), t, tol, floor);
        }
    }
}

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    fn ints(&mut self, n: usize, lo: i64, hi: i64) -> Vec<i64> {
        (0..n)
            .map(|_| lo + (self.next() % (hi - lo + 1) as u64) as i64)
            .collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn blob(bytes: Vec<u8>) -> Blob {
    Blob::whole(Arc::new(Bytes::Owned(bytes)))
}

/// A graph under construction plus the values of its inputs.
#[derive(Default)]
struct T {
    g: Graph,
    inputs: Vec<Val>,
}

#[derive(Clone)]
enum Val {
    Tensor(Vec<usize>, Vec<u8>),
    Sym(i64),
}

impl T {
    fn input(
        &mut self,
        dtype: DType,
        max_shape: &[usize],
        shape: &[usize],
        data: Vec<u8>,
    ) -> TensorId {
        let k = self.g.inputs.len();
        let t = self
            .g
            .add_tensor(format!("in{k}"), dtype, max_shape.to_vec(), Role::Input(k));
        self.g.inputs.push(Io::Tensor(t));
        self.inputs.push(Val::Tensor(shape.to_vec(), data));
        t
    }
    fn input_f(&mut self, shape: &[usize], v: &[f32]) -> TensorId {
        self.input(DType::F32, shape, shape, f32_bytes(v))
    }
    fn input_i(&mut self, shape: &[usize], v: &[i64]) -> TensorId {
        self.input(DType::I64, shape, shape, i64_bytes(v))
    }
    fn sym(&mut self, name: &str, v: i64) -> usize {
        let s = self.g.add_sym(name);
        self.g.inputs.push(Io::Sym(s));
        self.inputs.push(Val::Sym(v));
        s
    }
    fn constant(&mut self, dtype: DType, shape: &[usize], data: Vec<u8>) -> TensorId {
        let n = self.g.tensors.len();
        self.g.add_tensor(
            format!("c{n}"),
            dtype,
            shape.to_vec(),
            Role::Constant(blob(data)),
        )
    }
    fn const_f(&mut self, shape: &[usize], v: &[f32]) -> TensorId {
        self.constant(DType::F32, shape, f32_bytes(v))
    }
    fn act(&mut self, dtype: DType, shape: &[usize]) -> TensorId {
        let n = self.g.tensors.len();
        self.g
            .add_tensor(format!("a{n}"), dtype, shape.to_vec(), Role::Activation)
    }
    /// Adds an op whose output is a new activation, returns the output.
    fn op(
        &mut self,
        kind: OpKind,
        inputs: Vec<TensorId>,
        dtype: DType,
        shape: &[usize],
    ) -> TensorId {
        let o = self.act(dtype, shape);
        self.g.op(kind, inputs, vec![o]);
        o
    }
    fn out(&mut self, t: TensorId) {
        self.g.outputs.push(t);
    }
    /// An f32 cache update along axis 2 of `rows` into cache `c` (shape `cs`), a graph output:
    /// at the rows `idx` names, else from symbol `start`.
    fn cache_update(
        &mut self,
        c: TensorId,
        rows: TensorId,
        idx: Option<TensorId>,
        start: usize,
        cs: &[usize],
    ) -> TensorId {
        let (ins, at) = match idx {
            Some(i) => (vec![c, rows, i], Int::Lit(0)),
            None => (vec![c, rows], Int::Sym(start)),
        };
        let u = self.op(
            OpKind::CacheUpdate { axis: 2, start: at },
            ins,
            DType::F32,
            cs,
        );
        self.out(u);
        u
    }
}

fn values(vals: &[Val]) -> Vec<InputValue<'_>> {
    vals.iter()
        .map(|v| match v {
            Val::Tensor(shape, data) => InputValue::Tensor {
                shape: shape.clone(),
                data,
            },
            Val::Sym(s) => InputValue::Sym(*s),
        })
        .collect()
}

/// Largest error of `got` against `want`, relative to `|want| + floor · max|want|`.
fn rel_error(got: &[f32], want: &[f32], floor: f32) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() && w.is_nan() || g == w {
                0.0
            } else {
                (g - w).abs() / (w.abs() + floor * scale).max(1e-30)
            }
        })
        .fold(0f32, f32::max)
}

fn compare(what: &str, got: &[HostTensor], want: &[HostTensor], tol: f32, floor: f32) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.dtype, w.dtype, "{what}: output {i} dtype");
        assert_eq!(g.sizes, w.sizes, "{what}: output {i} shape");
        if w.dtype.is_float() {
            let (gv, wv) = (g.to_f32().unwrap(), w.to_f32().unwrap());
            let e = rel_error(&gv, &wv, floor);
            assert!(
                e <= tol,
                "{what}: output {i}: relative error {e:e} > {tol:e}\n got {:?}\nwant {:?}",
                &gv[..gv.len().min(8)],
                &wv[..wv.len().min(8)]
            );
        } else {
            assert_eq!(
                g.to_i64().unwrap(),
                w.to_i64().unwrap(),
                "{what}: output {i}"
            );
        }
    }
}

/// Runs the graph on both executors and compares; returns the GPU executor for more calls.
fn check_on(ctx: Arc<Context>, what: &str, t: &T, tol: f32, floor: f32) -> GpuExecutor {
    let mut cpu = CpuExecutor::new(t.g.clone()).unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
    let mut gpu = GpuExecutor::new(ctx, t.g.clone()).unwrap_or_else(|e| panic!("{what}: gpu: {e}"));
    let vals = values(&t.inputs);
    let want = cpu
        .run(&vals)
        .unwrap_or_else(|e| panic!("{what}: cpu run: {e}"));
    let got = gpu
        .run(&vals)
        .unwrap_or_else(|e| panic!("{what}: gpu run: {e}"));
    compare(what, &got, &want, tol, floor);
    gpu
}

fn check(what: &str, t: &T, tol: f32, floor: f32) {
    if let Some(ctx) = ctx() {
        check_on(ctx, what, t, tol, floor);
    }
}

const TOL: f32 = 1e-4;

/// Rows of x up to which a linear of 16-byte weight quads runs as the mat-vec on the tests'
/// devices (`open`), taking its activations packed; more are tiled. `PAST` rows sit just past
/// it. A prompt's mat-vec teams own 4 weight rows each (src/gpu/ops.rs `MULTI_LANES`), their
/// width set by the weight's rows: 128-row cases are the longest that reach them.
const MATVEC_ROWS: usize = 128;
const PAST: usize = MATVEC_ROWS + 2;

#[test]
fn context_reports_the_adapter() {
    let Some(ctx) = ctx() else { return };
    let a = ctx.adapter();
    assert!(!a.name.is_empty());
    assert!(a.max_storage_binding >= 16 << 20, "{a}");
    eprintln!(
        "GPU tests run on: {a}, subgroups {:?}, f16 {}",
        a.subgroup_sizes, a.shader_f16
    );
}

#[test]
fn unary_ops_match_cpu() {
    use UnaryOp::*;
    let ops = [
        Neg, Abs, Exp, Log, Sqrt, Rsqrt, Tanh, Sin, Cos, Sigmoid, Silu, Gelu, GeluTanh, Relu,
        Square, Reciprocal, Floor, Ceil, LogicalNot,
    ];
    let shape = [3, 37, 11];
    let n = 3 * 37 * 11;
    let mut rng = Rng::new(1);
    for u in ops {
        // sin/cos also at RoPE angles (position x frequency: hundreds of radians).
        let scale = if matches!(u, Sin | Cos) { 2000.0 } else { 6.0 };
        let mut v = rng.floats(n, scale);
        if matches!(u, Log | Sqrt | Rsqrt | Reciprocal) {
            v.iter_mut().for_each(|x| *x = x.abs() + 0.05);
        }
        v[0] = 0.0;
        v[1] = -12.0;
        let mut t = T::default();
        let x = t.input_f(&shape, &v);
        let y = t.op(OpKind::Unary(u), vec![x], DType::F32, &shape);
        t.out(y);
        check(&format!("{u:?}"), &t, TOL, 1e-3);
    }
    // Integer paths, and a float op with an integer output (truncation).
    for u in [Neg, Abs, Square, LogicalNot, Exp] {
        let mut t = T::default();
        let x = t.input_i(&[5, 13], &rng.ints(65, -9, 9));
        let y = t.op(OpKind::Unary(u), vec![x], DType::I64, &[5, 13]);
        t.out(y);
        check(&format!("{u:?} i64"), &t, 0.0, 0.0);
    }
}

/// `ExecutorStats::last_chain`: the longest chain of dispatches each waiting for an earlier
/// one's data, beside the call's dispatches (what removing wgpu's barrier before every dispatch
/// could at most leave).
#[test]
fn the_longest_chain_of_dependent_dispatches_is_counted() {
    let Some(ctx) = ctx() else { return };
    let mut t = T::default();
    let sh = [2, 300];
    let x = t.input_f(&sh, &Rng::new(9).floats(600, 2.0));
    let neg = |t: &mut T, v| t.op(OpKind::Unary(UnaryOp::Neg), vec![v], DType::F32, &sh);
    // x → a → b → c → (c + d): four rounds; d and e only wait for x.
    let a = neg(&mut t, x);
    let b = neg(&mut t, a);
    let c = neg(&mut t, b);
    let d = neg(&mut t, x);
    let e = neg(&mut t, x);
    let sum = t.op(OpKind::Binary(BinaryOp::Add), vec![c, d], DType::F32, &sh);
    t.out(sum);
    t.out(e);
    let mut gpu = check_on(ctx, "chain", &t, 0.0, 0.0);
    let stats = gpu.stats();
    assert_eq!((stats.last_dispatches, stats.last_chain), (6, 4));

    // Timed replays leave out only the dispatches named (kernel, entry or kernel:entry), and
    // plain `time_replays` (the kernel benchmarks, the bandwidth yardstick) none.
    let vals = values(&t.inputs);
    let replayed = |gpu: &mut GpuExecutor, skip: &[&str]| {
        let skip: Vec<String> = skip.iter().map(|s| s.to_string()).collect();
        let r = gpu.time_replays_skipping(&vals, 2, &skip).unwrap();
        assert!(r.seconds >= 0.0 && r.seconds.is_finite(), "{skip:?}: {r:?}");
        r.dispatches
    };
    assert_eq!(gpu.time_replays(&vals, 2).unwrap().dispatches, 6);
    assert_eq!(replayed(&mut gpu, &[]), 6);
    assert_eq!(replayed(&mut gpu, &["binary"]), 5);
    assert_eq!(replayed(&mut gpu, &["elementwise:unary"]), 1);
    assert_eq!(replayed(&mut gpu, &["elementwise"]), 0);
    assert_eq!(replayed(&mut gpu, &["element"]), 6);
}

#[test]
fn binary_ops_broadcast_and_match_cpu() {
    use BinaryOp::*;
    let ops = [
        Add, Sub, Mul, Div, Pow, Max, Min, Eq, Ne, Lt, Le, Gt, Ge, And, Or,
    ];
    let mut rng = Rng::new(2);
    for b in ops {
        let mut t = T::default();
        let mut av = rng.floats(4 * 37, 3.0);
        let mut bv = rng.floats(5, 3.0);
        if b == Pow {
            av.iter_mut().for_each(|x| *x = x.abs() + 0.1);
        }
        // Some equal elements for the comparisons.
        av[0] = bv[0];
        bv[1] = 0.0;
        let a = t.input_f(&[4, 1, 37], &av);
        let bb = t.input_f(&[5, 1], &bv);
        let dt = if b.is_comparison() {
            DType::Bool
        } else {
            DType::F32
        };
        let y = t.op(OpKind::Binary(b), vec![a, bb], dt, &[4, 5, 37]);
        t.out(y);
        check(&format!("{b:?}"), &t, TOL, 1e-3);

        let mut t = T::default();
        let a = t.input_i(&[3, 7], &rng.ints(21, -20, 20));
        let bi = rng.ints(7, -4, 4);
        let bb = t.input(
            DType::I32,
            &[7],
            &[7],
            bi.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
        );
        let dt = if b.is_comparison() {
            DType::Bool
        } else {
            DType::I64
        };
        let y = t.op(OpKind::Binary(b), vec![a, bb], dt, &[3, 7]);
        t.out(y);
        check(&format!("{b:?} int"), &t, 0.0, 0.0);
    }
    // Mixed: an integer tensor plus a float one computes in float.
    let mut t = T::default();
    let a = t.input_i(&[6], &[1, 2, 3, 4, 5, 6]);
    let bb = t.input_f(&[2, 1], &[0.5, -1.25]);
    let y = t.op(OpKind::Binary(Mul), vec![a, bb], DType::F32, &[2, 6]);
    t.out(y);
    check("mixed mul", &t, TOL, 0.0);
}

#[test]
fn scalar_where_clamp_cast_match_cpu() {
    let mut rng = Rng::new(3);
    let v = rng.floats(301, 4.0);
    for (op, sf, dt) in [
        (BinaryOp::Sub, true, DType::F32),
        (BinaryOp::Div, false, DType::F32),
        (BinaryOp::Pow, false, DType::F32),
        (BinaryOp::Gt, false, DType::Bool),
    ] {
        let mut t = T::default();
        let x = t.input_f(&[301], &v);
        let y = t.op(
            OpKind::BinaryScalar {
                op,
                scalar: 2.0,
                scalar_first: sf,
            },
            vec![x],
            dt,
            &[301],
        );
        t.out(y);
        check(&format!("{op:?} scalar"), &t, TOL, 1e-3);
    }
    let mut t = T::default();
    let x = t.input_i(&[9], &[-7, -3, -1, 0, 1, 2, 5, 9, 13]);
    let y = t.op(
        OpKind::BinaryScalar {
            op: BinaryOp::Div,
            scalar: 2.0,
            scalar_first: false,
        },
        vec![x],
        DType::I64,
        &[9],
    );
    let z = t.op(
        OpKind::BinaryScalar {
            op: BinaryOp::Mul,
            scalar: 0.5,
            scalar_first: false,
        },
        vec![x],
        DType::F32,
        &[9],
    );
    t.out(y);
    t.out(z);
    check("int scalar", &t, 0.0, 0.0);

    let mut t = T::default();
    let c = t.input(DType::Bool, &[3, 1], &[3, 1], vec![1, 0, 1]);
    let a = t.input_f(&[3, 40], &rng.floats(120, 1.0));
    let b = t.input_f(&[40], &rng.floats(40, 1.0));
    let y = t.op(OpKind::Where, vec![c, a, b], DType::F32, &[3, 40]);
    t.out(y);
    check("where", &t, 0.0, 0.0);

    let mut t = T::default();
    let x = t.input_f(&[301], &v);
    let xi = t.input_i(&[7], &[-9, -2, 0, 1, 2, 3, 100]);
    let y = t.op(
        OpKind::Clamp {
            min: Some(-1.5),
            max: Some(2.0),
        },
        vec![x],
        DType::F32,
        &[301],
    );
    let y2 = t.op(
        OpKind::Clamp {
            min: None,
            max: Some(0.25),
        },
        vec![x],
        DType::F32,
        &[301],
    );
    let yi = t.op(
        OpKind::Clamp {
            min: Some(-1.5),
            max: Some(2.5),
        },
        vec![xi],
        DType::I64,
        &[7],
    );
    let c1 = t.op(OpKind::Cast, vec![x], DType::I64, &[301]);
    let c2 = t.op(OpKind::Cast, vec![xi], DType::F32, &[7]);
    let c3 = t.op(OpKind::Cast, vec![x], DType::Bool, &[301]);
    let c4 = t.op(OpKind::Cast, vec![x], DType::F16, &[301]);
    for o in [y, y2, yi, c1, c2, c3, c4] {
        t.out(o);
    }
    check("clamp and cast", &t, 0.0, 0.0);
}

#[test]
fn norms_and_reductions_match_cpu() {
    let mut rng = Rng::new(4);
    for (rows, d, weight) in [
        (5, 1537, true),
        (70, 7, false),
        (1, 256, true),
        (3, 1000, false),
        // E2B's decode norms (hidden, per-head q/k, per-layer inputs), and rows longer than
        // the largest workgroup (scalar and vec4 paths).
        (1, 1536, true),
        (8, 256, false),
        (35, 256, true),
        (2, 6004, true),
        (2, 4099, false),
    ] {
        let mut t = T::default();
        let x = t.input_f(&[rows, d], &rng.floats(rows * d, 3.0));
        let mut ins = vec![x];
        if weight {
            ins.push(t.const_f(&[d], &rng.floats(d, 2.0)));
        }
        let y = t.op(OpKind::RmsNorm { eps: 1e-6 }, ins, DType::F32, &[rows, d]);
        let s = t.op(OpKind::Softmax, vec![x], DType::F32, &[rows, d]);
        t.out(y);
        t.out(s);
        check_both(&format!("rms_norm/softmax {rows}x{d}"), &t, TOL, 1e-3);
    }
    let mut t = T::default();
    let x = t.input_f(&[3, 45, 7], &rng.floats(3 * 45 * 7, 2.0));
    let a = t.op(
        OpKind::Mean {
            dims: vec![1],
            keepdim: true,
        },
        vec![x],
        DType::F32,
        &[3, 1, 7],
    );
    let b = t.op(
        OpKind::Mean {
            dims: vec![0, 2],
            keepdim: false,
        },
        vec![x],
        DType::F32,
        &[45],
    );
    let c = t.op(
        OpKind::Mean {
            dims: vec![2],
            keepdim: false,
        },
        vec![x],
        DType::F32,
        &[3, 45],
    );
    let d = t.op(
        OpKind::Sum {
            dims: vec![0, 1],
            keepdim: true,
        },
        vec![x],
        DType::F32,
        &[1, 1, 7],
    );
    t.out(a);
    t.out(b);
    t.out(c);
    t.out(d);
    check("mean and sum", &t, TOL, 1e-2);
}

/// `MulMean` (a mean of broadcast products, each rounded before it is added) has the CPU's bits
/// wherever the count is a power of two (a division by it is exact everywhere): the demo
/// export's q·k and p·v at decode and prompt sizes, output counts off the workgroup size, and
/// several reduced dims; within TOL elsewhere (a GPU's division may round differently).
#[test]
fn mul_means_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng::new(21);
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[1, 3, 3, 1, 1, 64], &[1, 3, 1, 1, 1024, 64], &[5]),
        (&[1, 3, 3, 1, 1024, 1], &[1, 3, 1, 1, 1024, 64], &[4]),
        (&[1, 3, 3, 7, 1, 64], &[1, 3, 1, 1, 256, 64], &[5]),
        (&[1, 3, 3, 7, 256, 1], &[1, 3, 1, 1, 256, 64], &[4]),
        (&[5, 576], &[5, 576], &[1]),
        (&[4, 6, 16], &[6, 16], &[0, 2]),
        (&[3, 100, 7], &[3, 100, 7], &[1]),
    ];
    for &(ash, bsh, dims) in cases {
        let mut t = T::default();
        let a = t.input_f(ash, &rng.floats(ash.iter().product(), 2.0));
        let b = t.input_f(bsh, &rng.floats(bsh.iter().product(), 2.0));
        let kind = OpKind::MulMean {
            dims: dims.to_vec(),
            keepdim: false,
        };
        let shape = pteria::ir::op_shapes(&kind, &[ash, bsh], &[])
            .unwrap()
            .remove(0);
        let y = t.op(kind, vec![a, b], DType::F32, &shape);
        t.out(y);
        let what = format!("mul_mean {ash:?} * {bsh:?} over {dims:?}");
        let n: usize = dims
            .iter()
            .map(|&d| ash.len().max(bsh.len()) - 1 - d)
            .map(|back| {
                let at = |s: &[usize]| s.iter().rev().nth(back).copied().unwrap_or(1);
                at(ash).max(at(bsh))
            })
            .product();
        let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
        let mut gpu = GpuExecutor::new(ctx.clone(), t.g.clone()).unwrap();
        let vals = values(&t.inputs);
        let (want, got) = (cpu.run(&vals).unwrap(), gpu.run(&vals).unwrap());
        if n.is_power_of_two() {
            assert_eq!(got[0].data, want[0].data, "{what}: not the CPU's bits");
        } else {
            compare(&what, &got, &want, TOL, 1e-3);
        }
    }
}

/// Packs a `[rows, cols]` quantized weight as the IR stores it, with random scales and biases.
fn quant_weight(t: &mut T, rng: &mut Rng, w: Weight, rows: usize, cols: usize) -> Vec<TensorId> {
    match w {
        Weight::F32 => vec![t.const_f(&[rows, cols], &rng.floats(rows * cols, 0.5))],
        Weight::Q4 { group } | Weight::Q8 { group } => {
            let g = cols / group;
            let packed = match w {
                Weight::Q4 { .. } => {
                    t.constant(DType::U8, &[rows, cols / 2], rng.bytes(rows * cols / 2))
                }
                _ => t.constant(DType::I8, &[rows, cols], rng.bytes(rows * cols)),
            };
            let s: Vec<f32> = rng
                .floats(rows * g, 0.02)
                .iter()
                .map(|v| v.abs() + 0.001)
                .collect();
            let scales = t.const_f(&[rows, g], &s);
            let biases = t.const_f(&[rows, g], &rng.floats(rows * g, 0.1));
            vec![packed, scales, biases]
        }
    }
}

fn linear_graph(
    rng: &mut Rng,
    w: Weight,
    m: usize,
    k: usize,
    n: usize,
    bias: bool,
    act_quant: pteria::ir::ActQuant,
) -> T {
    let mut t = T::default();
    let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
    let mut ins = vec![x];
    ins.extend(quant_weight(&mut t, rng, w, n, k));
    if bias {
        ins.push(t.const_f(&[n], &rng.floats(n, 1.0)));
    }
    let y = t.op(
        OpKind::Linear {
            weight: w,
            act_quant,
            has_bias: bias,
        },
        ins,
        DType::F32,
        &[m, n],
    );
    t.out(y);
    t
}

#[test]
fn linear_variants_match_cpu() {
    let mut rng = Rng::new(5);
    let cases = [
        // (weight, M, K, N, bias, act_quant)
        (Weight::F32, 1, 37, 29, false, false),
        (Weight::F32, 3, 100, 70, true, false),
        (Weight::F32, 37, 100, 70, true, false),
        (Weight::F32, 65, 19, 131, false, false),
        (Weight::Q4 { group: 32 }, 1, 256, 300, false, false),
        (Weight::Q4 { group: 32 }, 5, 96, 37, true, false),
        (Weight::Q4 { group: 32 }, 20, 160, 45, false, false),
        (Weight::Q4 { group: 128 }, 1, 384, 77, true, false),
        (Weight::Q4 { group: 128 }, 70, 256, 65, false, false),
        (Weight::Q8 { group: 32 }, 1, 224, 101, false, false),
        (Weight::Q8 { group: 128 }, 33, 256, 50, true, false),
        (Weight::Q8 { group: 128 }, 2, 128, 9, false, false),
        (Weight::Q4 { group: 8 }, 1, 40, 19, true, false),
        (Weight::Q8 { group: 4 }, 2, 12, 7, false, false),
        // Prefill rows (tiled): weights by whole words with K past the last 16-deep slice, and
        // by single weights where a group is smaller than a word (groups this small have no
        // 16-byte quads, so any rows past 8 are tiled).
        (Weight::Q8 { group: 4 }, 9, 12, 7, true, false),
        (Weight::Q4 { group: 4 }, 12, 36, 21, false, false),
        (Weight::Q4 { group: 32 }, 1, 256, 100, false, true),
        (Weight::Q4 { group: 32 }, 17, 128, 33, true, true),
        (Weight::Q8 { group: 32 }, 4, 64, 31, false, true),
        // Dynamic int8 activations on the decode path: integer dot products (both roundings).
        (Weight::Q4 { group: 128 }, 1, 1536, 77, true, true),
        (Weight::Q4 { group: 64 }, 3, 640, 45, false, true),
        (Weight::Q8 { group: 16 }, 2, 48, 19, true, true),
        (Weight::Q8 { group: 128 }, 1, 1536, 70, false, true),
        (Weight::Q4 { group: 8 }, 2, 40, 19, false, true),
        // Past the quad mat-vec's rows, tiled (XNNPACK's exact int8 GEMM, then floats); up
        // to them, the mat-vec with its rows first in the grid (torchao's rounding).
        (Weight::Q4 { group: 128 }, PAST - 1, 256, 33, false, true),
        (Weight::Q4 { group: 128 }, 40, 256, 30, true, true),
        (Weight::Q4 { group: 32 }, PAST, 64, 40, false, false),
        (Weight::Q4 { group: 128 }, MATVEC_ROWS, 256, 40, true, true),
    ];
    for (i, (w, m, k, n, bias, aq)) in cases.into_iter().enumerate() {
        let aq = match (aq, i % 2) {
            (false, _) => pteria::ir::ActQuant::None,
            (true, 0) => pteria::ir::ActQuant::Torchao,
            (true, _) => pteria::ir::ActQuant::Xnnpack,
        };
        let t = linear_graph(&mut rng, w, m, k, n, bias, aq);
        check_both(
            &format!("linear {w:?} {m}x{k}->{n} bias={bias} act_quant={aq:?}"),
            &t,
            TOL,
            0.05,
        );
    }
}

/// XNNPACK-quantized linears (dynamic int8 activations × 4/8-bit group weights) give the CPU
/// reference's bits exactly, which reproduce ExecuTorch's XNNPACK runtime
/// (tests/xnnpack_linear.rs): decode and prefill rows, symmetric and asymmetric weights, more
/// groups than one pass of shared memory holds, and weights split past the binding limit.
#[test]
fn xnnpack_linears_are_bit_exact_with_the_cpu_executor() {
    let mut rng = Rng::new(31);
    let cases = [
        // (weight, M, K, N, symmetric, bias): the demo model's up/down projections first.
        (Weight::Q4 { group: 64 }, 1, 1536, 576, true, false),
        (Weight::Q4 { group: 64 }, 5, 576, 1536, true, false),
        (Weight::Q4 { group: 32 }, 32, 576, 300, true, true),
        (Weight::Q4 { group: 64 }, 3, 640, 45, false, false),
        (Weight::Q4 { group: 8 }, 2, 1024, 37, true, false),
        (Weight::Q4 { group: 32 }, 1, 4096, 24, true, false),
        (Weight::Q8 { group: 32 }, 3, 128, 40, false, true),
        (Weight::Q8 { group: 4 }, 1, 96, 19, true, false),
        // One row of x at groups of 64 and more (`xnn_matvec`): E2B's widest K, rows that
        // leave the last workgroup part empty, stored biases, a model's bias.
        (Weight::Q4 { group: 128 }, 1, 12288, 37, true, false),
        (Weight::Q4 { group: 128 }, 1, 1536, 300, true, true),
        (Weight::Q4 { group: 64 }, 1, 640, 45, false, false),
        (Weight::Q4 { group: 256 }, 1, 2048, 70, false, true),
        // A prompt's rows as mat-vecs (`xnn_matvec_rows`): E2B's widest K, a bias, more rows
        // than a subgroup.
        (Weight::Q4 { group: 128 }, 7, 12288, 37, true, false),
        (Weight::Q4 { group: 128 }, 19, 1536, 300, false, true),
    ];
    for (w, m, k, n, symmetric, bias) in cases {
        let mut t = T::default();
        // Residual-stream-like rows: small values with a few large ones; with more than one,
        // one row all >= 0 (its zero point makes the weights' column sums drop out).
        let mut xv = rng.floats(m * k, 1.0);
        for (i, v) in xv.iter_mut().enumerate() {
            if i % 97 == 5 {
                *v *= 40.0;
            }
            if m > 1 && i / k == m / 2 {
                *v = v.abs();
            }
        }
        let x = t.input_f(&[m, k], &xv);
        let (group, four) = match w {
            Weight::Q4 { group } => (group, true),
            Weight::Q8 { group } => (group, false),
            Weight::F32 => unreachable!(),
        };
        let g = k / group;
        let packed = if four {
            t.constant(DType::U8, &[n, k / 2], rng.bytes(n * k / 2))
        } else {
            t.constant(DType::I8, &[n, k], rng.bytes(n * k))
        };
        let s: Vec<f32> = rng
            .floats(n * g, 0.02)
            .iter()
            .map(|v| v.abs() + 0.001)
            .collect();
        // Symmetric: 4-bit n = round(w / s) + 8 stored with bias -8s, as 8da4w exports do.
        let b: Vec<f32> = if symmetric {
            s.iter()
                .map(|v| if four { -8.0 * v } else { 0.0 })
                .collect()
        } else {
            rng.floats(n * g, 0.1)
        };
        let mut ins = vec![x, packed, t.const_f(&[n, g], &s), t.const_f(&[n, g], &b)];
        if bias {
            ins.push(t.const_f(&[n], &rng.floats(n, 1.0)));
        }
        let y = t.op(
            OpKind::Linear {
                weight: w,
                act_quant: pteria::ir::ActQuant::Xnnpack,
                has_bias: bias,
            },
            ins,
            DType::F32,
            &[m, n],
        );
        t.out(y);
        let what = format!("xnnpack linear {w:?} {m}x{k}->{n} symmetric={symmetric}");
        let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
        let want = cpu.run(&values(&t.inputs)).unwrap()[0].to_f32().unwrap();
        for (name, c) in [
            ("", ctx()),
            (" (no subgroups)", no_subgroup_ctx()),
            (" (split weights)", small_binding_ctx()),
            (" (fma emulated)", emulated_fma_ctx()),
            (" (prompt tiled)", one_row_ctx()),
        ] {
            let Some(c) = c else { continue };
            // (The 64 KiB binding splits weights, not activations.)
            if name.contains("split") && m * k * 4 > 64 << 10 {
                continue;
            }
            let mut gpu = GpuExecutor::new(c, t.g.clone()).unwrap();
            let got = gpu.run(&values(&t.inputs)).unwrap()[0].to_f32().unwrap();
            assert_same_bits(&format!("{what}{name}"), &got, &want);
            // Prompt rows of 4-bit weights in groups of 32s take the mat-vec, one row of x a
            // workgroup, up to `quad_matvec_rows`; `xnn_gemm` past it and for the rest.
            if m > 1 && !name.contains("split") {
                let rows = four && group % 32 == 0 && !name.contains("tiled");
                let entry = if rows { "xnn_matvec_rows" } else { "xnn_gemm" };
                assert!(
                    gpu.last_entries().iter().any(|e| e.ends_with(entry)),
                    "{what}{name}: {:?}",
                    gpu.last_entries()
                );
            }
        }
    }
}

/// Adds one output linear (no bias) of `x` ([m, k]) per `(weight format, quantization, N)`.
fn linears_of(
    t: &mut T,
    rng: &mut Rng,
    x: TensorId,
    [m, k]: [usize; 2],
    cases: &[(Weight, pteria::ir::ActQuant, usize)],
) {
    for &(w, act_quant, n) in cases {
        let mut ins = vec![x];
        ins.extend(quant_weight(t, rng, w, n, k));
        let kind = OpKind::Linear {
            weight: w,
            act_quant,
            has_bias: false,
        };
        let y = t.op(kind, ins, DType::F32, &[m, n]);
        t.out(y);
    }
}

/// Linears reading one input with one activation quantization (q/k/v, gate/up) quantize it
/// once; a different weight format or rounding rule quantizes again. Decode rows (packed int8
/// path) and prefill rows (tiled path), against the CPU.
#[test]
fn linears_of_one_input_share_its_quantization() {
    use pteria::ir::ActQuant;
    let mut rng = Rng::new(25);
    for m in [1usize, 3, 20] {
        let k = 256;
        let mut t = T::default();
        let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
        let q4 = Weight::Q4 { group: 128 };
        let cases = [
            (q4, ActQuant::Torchao, 70),
            (q4, ActQuant::Torchao, 33),
            (Weight::Q8 { group: 128 }, ActQuant::Torchao, 40),
            (q4, ActQuant::Xnnpack, 19),
            (q4, ActQuant::Torchao, 129),
        ];
        linears_of(&mut t, &mut rng, x, [m, k], &cases);
        let Some(ctx) = ctx() else { return };
        let gpu = check_on(
            ctx,
            &format!("shared quantization, {m} rows"),
            &t,
            TOL,
            0.05,
        );
        // 3 quantizations (q4/torchao once for three linears, q8, xnnpack) and 3 mat-vecs:
        // the three q4/torchao linears run as one.
        assert_eq!(gpu.stats().last_dispatches, 6, "{m} rows");
    }
}

/// Devices for tests that a planner fusion changes no bit: the default one and one planned with
/// `apart` (the fusion off), with and without subgroups. Absent devices are left out.
fn fused_and_apart(apart: ContextOptions) -> Vec<(Arc<Context>, Arc<Context>, &'static str)> {
    let off = |no_subgroups: bool| {
        open(ContextOptions {
            no_subgroups,
            ..apart.clone()
        })
    };
    [
        (ctx(), off(false), ""),
        (no_subgroup_ctx(), off(true), " (no subgroups)"),
    ]
    .into_iter()
    .filter_map(|(a, b, name)| Some((a?, b?, name)))
    .collect()
}

/// Runs `t` on both devices, checks the fused run against the CPU and that both give the same
/// bits; returns their dispatch counts (fused, apart).
fn same_bits_fused_and_apart(
    fused: &Arc<Context>,
    apart: &Arc<Context>,
    what: &str,
    t: &T,
) -> (usize, usize) {
    let (gpu, one) = fused_and_apart_runs(fused, apart, what, t);
    (gpu.stats().last_dispatches, one.stats().last_dispatches)
}

/// `same_bits_fused_and_apart`'s runs: the two executors after their last call.
fn fused_and_apart_runs(
    fused: &Arc<Context>,
    apart: &Arc<Context>,
    what: &str,
    t: &T,
) -> (GpuExecutor, GpuExecutor) {
    let mut gpu = check_on(fused.clone(), what, t, TOL, 0.05);
    let mut one = GpuExecutor::new(apart.clone(), t.g.clone()).unwrap();
    let vals = values(&t.inputs);
    let got = gpu.run(&vals).unwrap();
    let want = one.run(&vals).unwrap();
    assert!(got == want, "{what}: the fused and separate results differ");
    (gpu, one)
}

/// `same_bits_fused_and_apart` on every device pair, asserting that the fusion saves exactly
/// `saved` dispatches.
fn fusion_saves(pairs: &[(Arc<Context>, Arc<Context>, &str)], what: &str, t: &T, saved: usize) {
    for (fused, apart, name) in pairs {
        let what = format!("{what}{name}");
        let (a, b) = same_bits_fused_and_apart(fused, apart, &what, t);
        assert_eq!(a + saved, b, "{what}: {a} dispatches against {b}");
    }
}

/// Weight formats and roundings whose linears take their activations packed from the norm that
/// produces them.
fn packed_formats() -> [(Weight, pteria::ir::ActQuant); 4] {
    use pteria::ir::ActQuant;
    [
        (Weight::Q4 { group: 32 }, ActQuant::Torchao),
        (Weight::Q8 { group: 32 }, ActQuant::Torchao),
        (Weight::Q4 { group: 32 }, ActQuant::Xnnpack),
        (Weight::Q8 { group: 16 }, ActQuant::Xnnpack),
    ]
}

/// An rms_norm, plain or with its residual chain, or an element-wise chain of short rows, whose
/// rows a quantized linear reads packed quantizes them itself (no act_quant dispatch; the chain
/// then runs as a row kernel): the same bits as the separate quantization,
/// by torchao's and XNNPACK's rounding, for 4- and 8-bit weights, with and without subgroups.
/// Prefill rows the tiled kernel takes (past `MATVEC_ROWS`, as dequantized floats) keep the
/// separate dispatch.
#[test]
fn norms_quantize_for_the_linears_they_feed() {
    use pteria::ir::ActQuant;
    let pairs = fused_and_apart(ContextOptions {
        separate_quant: true,
        ..Default::default()
    });
    let mut rng = Rng::new(27);
    let formats = packed_formats();
    for (m, k) in [
        (1usize, 256usize),
        (3, 1536),
        (20, 96),
        (PAST, 96),
        (1, 4096),
    ] {
        for (w, aq) in formats {
            let mut t = T::default();
            let f = DType::F32;
            let sh = [m, k];
            let x = t.input_f(&sh, &rng.floats(m * k, 3.0));
            let r = t.input_f(&sh, &rng.floats(m * k, 2.0));
            let nw = t.const_f(&[k], &rng.floats(k, 1.5));
            let scale = t.const_f(&[1], &[0.625]);
            // A layer's input norm feeding q/k-like linears, then a post-norm with its residual
            // add (an RmsNormChain once fused) feeding one more.
            let n1 = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![x, nw], f, &sh);
            linears_of(&mut t, &mut rng, n1, [m, k], &[(w, aq, 40), (w, aq, 24)]);
            let n2 = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![n1], f, &sh);
            let m2 = t.op(OpKind::Binary(BinaryOp::Mul), vec![n2, scale], f, &sh);
            let a2 = t.op(OpKind::Binary(BinaryOp::Add), vec![m2, r], f, &sh);
            t.out(a2);
            linears_of(&mut t, &mut rng, a2, [m, k], &[(w, aq, 17)]);
            // The per-layer input's gelu(gate) · input (an ElementwiseChain once fused) feeding
            // its projection.
            let ge = t.op(OpKind::Unary(UnaryOp::GeluTanh), vec![x], f, &sh);
            let gm = t.op(OpKind::Binary(BinaryOp::Mul), vec![ge, r], f, &sh);
            linears_of(&mut t, &mut rng, gm, [m, k], &[(w, aq, 29)]);
            pteria::ir::passes::fuse_elementwise_chains(&mut t.g);
            assert_eq!(pteria::ir::passes::fuse_norm_chains(&mut t.g), 1);
            let xnn = aq == ActQuant::Xnnpack;
            // Packed rows (decode mat-vecs, XNNPACK's GEMM at any M) save all three
            // quantizations, short chain rows included.
            // A decode row short enough for a team is chained in its linear's loads: no
            // dispatch for the chain either (XNNPACK's 4-bit mat-vec too, not its 8-bit GEMM).
            let loads = !xnn || matches!(w, Weight::Q4 { .. });
            let chain = (k <= 2048) as usize + (m == 1 && k <= 512 && loads) as usize;
            let saved = if m <= MATVEC_ROWS || xnn {
                2 + chain
            } else {
                0
            };
            let what = format!("{m}x{k} norms quantizing for {w:?}/{aq:?}");
            fusion_saves(&pairs, &what, &t, saved);
        }
    }
}

/// A norm whose rows a plain norm reads only to quantize them for its linears runs that norm
/// too, in its own dispatch (Gemma's post-norm with its residual add, then the next pre-norm):
/// the same bits as the two apart, weighted or not, by torchao's and XNNPACK's rounding, for 4-
/// and 8-bit weights, with and without subgroups. Rows the linears take as floats (tiled, for
/// torchao), rows over 2048, and a second norm whose f32 rows something else reads stay apart.
#[test]
fn norms_run_the_norm_that_reads_their_rows() {
    use pteria::ir::ActQuant;
    // Apart, the second norm would otherwise run in its linear's mat-vec (`norm_load`).
    let pairs = fused_and_apart(ContextOptions {
        separate_norms: true,
        separate_norm_loads: true,
        ..Default::default()
    });
    let mut rng = Rng::new(31);
    let formats = packed_formats();
    for (m, k) in [
        (1usize, 256usize),
        (3, 1536),
        (20, 96),
        (PAST, 96),
        (1, 2048),
        (1, 2080),
    ] {
        for (w, aq) in formats {
            let mut t = T::default();
            let f = DType::F32;
            let sh = [m, k];
            let x = t.input_f(&sh, &rng.floats(m * k, 3.0));
            let r = t.input_f(&sh, &rng.floats(m * k, 2.0));
            let x2 = t.input_f(&sh, &rng.floats(m * k, 0.5));
            let w1 = t.const_f(&[k], &rng.floats(k, 1.5));
            let w2 = t.const_f(&[k], &rng.floats(k, 1.5));
            let scale = t.const_f(&[1], &[0.625]);
            // A post-norm with its residual add (an RmsNormChain once fused), then a weighted
            // pre-norm of another eps feeding two linears that share its quantization.
            let n1 = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![x, w1], f, &sh);
            let m1 = t.op(OpKind::Binary(BinaryOp::Mul), vec![n1, scale], f, &sh);
            let h = t.op(OpKind::Binary(BinaryOp::Add), vec![m1, r], f, &sh);
            t.out(h);
            let n2 = t.op(OpKind::RmsNorm { eps: 1e-3 }, vec![h, w2], f, &sh);
            linears_of(&mut t, &mut rng, n2, [m, k], &[(w, aq, 40), (w, aq, 24)]);
            // A plain norm, then an unweighted one.
            let n3 = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![x2, w2], f, &sh);
            let n4 = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![n3], f, &sh);
            linears_of(&mut t, &mut rng, n4, [m, k], &[(w, aq, 17)]);
            // The second norm's rows are an output too: apart.
            let n5 = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![x, w2], f, &sh);
            let n6 = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![n5, w1], f, &sh);
            t.out(n6);
            linears_of(&mut t, &mut rng, n6, [m, k], &[(w, aq, 9)]);
            pteria::ir::passes::fuse_elementwise_chains(&mut t.g);
            assert_eq!(pteria::ir::passes::fuse_norm_chains(&mut t.g), 1);
            let packed = m <= MATVEC_ROWS || aq == ActQuant::Xnnpack;
            // The fused run also runs the output's norm (n6) in its linear's mat-vec
            // (`norm_load`) for one row by torchao's rounding, or XNNPACK's with 4-bit weights.
            let quad = aq == ActQuant::Torchao || matches!(w, Weight::Q4 { .. });
            let loaded = m == 1 && quad && k <= 2048;
            let saved = if packed && k <= 2048 { 2 } else { 0 } + loaded as usize;
            let what = format!("{m}x{k} norm pairs for {w:?}/{aq:?}");
            fusion_saves(&pairs, &what, &t, saved);
        }
    }
}

/// Linears of one input, activation quantization and weight format run in pairs as one
/// dispatch: the same bits as one dispatch each, with and without subgroups, for decode and
/// prefill rows, odd N, every weight format; pairs too large to share a binding stay apart.
#[test]
fn paired_linears_match_separate_ones() {
    use pteria::ir::ActQuant;
    let pairs = fused_and_apart(ContextOptions {
        separate_linears: true,
        ..Default::default()
    });
    let mut rng = Rng::new(26);
    // MATVEC_ROWS rows: a prompt's teams of 4 weight rows, the pair's split among them.
    for m in [1usize, 3, 20, MATVEC_ROWS] {
        let k = 256;
        let mut t = T::default();
        let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
        let q4 = Weight::Q4 { group: 128 };
        let q8 = Weight::Q8 { group: 64 };
        // (format, quantization, N): q/k/v-like triples and gate/up-like pairs.
        let cases = [
            (q4, ActQuant::Torchao, 67),
            (q4, ActQuant::Torchao, 9),
            (q4, ActQuant::Torchao, 9),
            (q8, ActQuant::Torchao, 33),
            (q8, ActQuant::Torchao, 131),
            (Weight::F32, ActQuant::None, 60),
            (Weight::F32, ActQuant::None, 7),
            (q4, ActQuant::None, 21),
            (q4, ActQuant::None, 600),
        ];
        linears_of(&mut t, &mut rng, x, [m, k], &cases);
        for (merged, apart, name) in &pairs {
            let what = format!("paired linears, {m} rows{name}");
            let (a, b) = same_bits_fused_and_apart(merged, apart, &what, &t);
            // 9 linears in one triple (q4/torchao) and 3 pairs, 2 quantizations.
            assert_eq!(a, 6, "{what}");
            assert_eq!(b, 11, "{what}");
        }
        // With a 64 KiB binding the 600-row q4 weight is split (its pair runs apart, in 1 + 2
        // dispatches) and the f32 pair (60 KiB + 7 KiB) cannot share one binding (at up to 20
        // rows: a prompt's activations outgrow it).
        if let Some(small) = small_binding_ctx().filter(|_| m <= 20) {
            let what = format!("paired linears, {m} rows, small binding");
            let gpu = check_on(small, &what, &t, TOL, 0.05);
            assert_eq!(gpu.stats().last_dispatches, 9, "{what}");
        }
        // A device binding 8 storage buffers has no third output: the q4/torchao linears run as
        // a pair and one alone.
        if let Some(eight) = eight_binding_ctx() {
            let what = format!("paired linears, {m} rows, 8 bindings");
            let gpu = check_on(eight, &what, &t, TOL, 0.05);
            assert_eq!(gpu.stats().last_dispatches, 7, "{what}");
        }
    }
}

/// A symmetric 4-bit weight as the Vulkan front end lowers one: random nibbles, positive scales,
/// and biases of -8 · scale (the stored nibbles are q + 8). `flaw` 1: one bias an ulp off; 2: one
/// scale 0 (its bias -0, the product, which kernels do not form from the scale's bits).
fn symmetric_q4(
    t: &mut T,
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    group: usize,
    flaw: u8,
) -> Vec<TensorId> {
    let g = cols / group;
    let packed = t.constant(DType::U8, &[rows, cols / 2], rng.bytes(rows * cols / 2));
    let mut s: Vec<f32> = rng
        .floats(rows * g, 0.02)
        .iter()
        .map(|v| v.abs() + 0.001)
        .collect();
    let i = s.len() / 2;
    if flaw == 2 {
        s[i] = 0.0;
    }
    let mut b: Vec<f32> = s.iter().map(|v| -8.0 * v).collect();
    if flaw == 1 {
        b[i] = f32::from_bits(b[i].to_bits() + 1);
    }
    let scales = t.const_f(&[rows, g], &s);
    let biases = t.const_f(&[rows, g], &b);
    vec![packed, scales, biases]
}

/// Biases that are -8 · scales bit for bit (symmetric 4-bit linears and embeddings) are computed
/// from the scales, not stored: the same bits as reading them, without their bytes. Decode rows
/// (int8 activations and f32), prefill rows (tiled), groups smaller than a quad, paired linears
/// (whose biases share a buffer) and an embedding; biases with one an ulp off, or with a scale of
/// 0, stay stored.
#[test]
fn symmetric_biases_are_computed_not_stored() {
    use pteria::ir::ActQuant;
    let pairs = fused_and_apart(ContextOptions {
        stored_biases: true,
        ..Default::default()
    });
    let mut rng = Rng::new(61);
    // Bytes of f32 biases for a [rows, cols] weight in groups of `group`, and a buffer's
    // size for some bytes (16-byte multiples).
    let held = |rows: usize, cols: usize, group: usize| (rows * (cols / group) * 4) as u64;
    let padded = |bytes: u64| bytes.max(16).div_ceil(16) * 16;
    for flaw in [0, 1, 2] {
        for (m, k, group, aq) in [
            (1, 256, 32, ActQuant::Torchao),
            (1, 384, 128, ActQuant::None),
            (3, 256, 128, ActQuant::Torchao),
            (20, 160, 32, ActQuant::Torchao),
            (2, 40, 8, ActQuant::None),
        ] {
            let mut t = T::default();
            let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
            // Two linears of x (paired: one dispatch, their biases in one buffer).
            let mut saved = 0;
            for n in [37, 64] {
                let mut ins = vec![x];
                ins.extend(symmetric_q4(&mut t, &mut rng, n, k, group, flaw));
                let y = t.op(
                    OpKind::Linear {
                        weight: Weight::Q4 { group },
                        act_quant: aq,
                        has_bias: false,
                    },
                    ins,
                    DType::F32,
                    &[m, n],
                );
                t.out(y);
                saved += held(n, k, group);
            }
            let e_ins = symmetric_q4(&mut t, &mut rng, 50, k, group, 0);
            let ids = t.input_i(&[1, 3], &[49, 0, 17]);
            let e = t.op(
                OpKind::Embedding {
                    weight: Weight::Q4 { group },
                },
                vec![e_ins[0], e_ins[1], e_ins[2], ids],
                DType::F32,
                &[1, 3, k],
            );
            t.out(e);
            // A flaw: the linears' biases stay stored, the embedding's not.
            let saved = if flaw > 0 { 0 } else { padded(saved) } + padded(held(50, k, group));
            for (derived, stored, name) in &pairs {
                let what = format!("symmetric biases {m}x{k} g{group} {aq:?} flaw {flaw}{name}");
                let (a, b) = same_bits_fused_and_apart(derived, stored, &what, &t);
                assert_eq!(a, b, "{what}: dispatches");
                let bytes = |ctx: &Arc<Context>| {
                    GpuExecutor::new(ctx.clone(), t.g.clone())
                        .unwrap()
                        .memory()
                        .constants
                };
                let (got, want) = (bytes(derived), bytes(stored));
                assert_eq!(got + saved, want, "{what}: constants {got} against {want}");
            }
        }
    }
    // A weight split by rows past a 64 KiB binding (600 rows of 128 bytes): its derived biases,
    // split at the same rows, are formed in every chunk's dispatch.
    let small = |stored_biases| {
        open(ContextOptions {
            max_storage_binding: Some(64 << 10),
            stored_biases,
            ..Default::default()
        })
    };
    if let (Some(derived), Some(stored)) = (small(false), small(true)) {
        for m in [1, 20] {
            let mut t = T::default();
            let x = t.input_f(&[m, 256], &rng.floats(m * 256, 1.0));
            let mut ins = vec![x];
            ins.extend(symmetric_q4(&mut t, &mut rng, 600, 256, 32, 0));
            let kind = OpKind::Linear {
                weight: Weight::Q4 { group: 32 },
                act_quant: ActQuant::Torchao,
                has_bias: false,
            };
            let y = t.op(kind, ins, DType::F32, &[m, 600]);
            t.out(y);
            let what = format!("symmetric biases of a split weight, {m} rows");
            let (a, b) = same_bits_fused_and_apart(&derived, &stored, &what, &t);
            // The quantization and one mat-vec a chunk.
            assert_eq!((a, b), (3, 3), "{what}");
        }
    }
    // Biases made from the scales on first read, as the Vulkan front end lowers them
    // (`Blob::neg8`): derived without being made (only the scales are checked), the same bits.
    for (derived, stored, name) in &pairs {
        let mut t = T::default();
        let x = t.input_f(&[1, 256], &rng.floats(256, 1.0));
        let mut ins = vec![x];
        ins.extend(symmetric_q4(&mut t, &mut rng, 64, 256, 32, 0));
        let Role::Constant(scales) = t.g.tensors[ins[2]].role.clone() else {
            unreachable!()
        };
        let bias = Blob::neg8(scales);
        t.g.tensors[ins[3]].role = Role::Constant(bias.clone());
        let kind = OpKind::Linear {
            weight: Weight::Q4 { group: 32 },
            act_quant: ActQuant::Torchao,
            has_bias: false,
        };
        let y = t.op(kind, ins, DType::F32, &[1, 64]);
        t.out(y);
        let what = format!("biases made from the scales{name}");
        let exec = GpuExecutor::new(derived.clone(), t.g.clone()).unwrap();
        assert!(!bias.is_made(), "{what}: the biases were made");
        assert_eq!(exec.memory().constants, 64 * 128 + 64 * 8 * 4, "{what}");
        drop(exec);
        same_bits_fused_and_apart(derived, stored, &what, &t);
        assert!(bias.is_made(), "{what}: stored biases are read");
    }
}

/// Three linears of one input (q/k/v) run as one dispatch writing three outputs (linear.wgsl's
/// `linear3`) on every path a linear takes: decode mat-vecs of 16-byte quads (4- and 8-bit,
/// int8 or f32 activations), of single words (groups of 8), of f32 weights, and prefill's tiled
/// kernel; the same bits as a pair and one alone.
#[test]
fn three_linears_of_one_input_run_as_one() {
    use pteria::ir::ActQuant;
    let pairs = fused_and_apart(ContextOptions {
        separate_triples: true,
        ..Default::default()
    });
    let mut rng = Rng::new(67);
    let cases = [
        // (format, quantization, M, K, the three Ns)
        (
            Weight::Q4 { group: 128 },
            ActQuant::Torchao,
            1,
            512,
            [80, 16, 16],
        ),
        (
            Weight::Q4 { group: 32 },
            ActQuant::None,
            1,
            256,
            [33, 7, 50],
        ),
        (
            Weight::Q8 { group: 64 },
            ActQuant::Torchao,
            3,
            256,
            [40, 9, 9],
        ),
        (Weight::Q4 { group: 8 }, ActQuant::None, 2, 40, [19, 5, 11]),
        (Weight::F32, ActQuant::None, 1, 100, [30, 6, 6]),
        (
            Weight::Q4 { group: 32 },
            ActQuant::Torchao,
            20,
            160,
            [45, 17, 17],
        ),
        (Weight::F32, ActQuant::None, 37, 64, [70, 9, 13]),
        // A prompt's teams of 4 weight rows, the third's among them.
        (
            Weight::Q4 { group: 128 },
            ActQuant::Torchao,
            MATVEC_ROWS,
            256,
            [40, 8, 8],
        ),
    ];
    for (w, aq, m, k, ns) in cases {
        let mut t = T::default();
        let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
        let three: Vec<_> = ns.iter().map(|&n| (w, aq, n)).collect();
        linears_of(&mut t, &mut rng, x, [m, k], &three);
        let what = format!("three linears {w:?} {aq:?} {m}x{k}->{ns:?}");
        fusion_saves(&pairs, &what, &t, 1);
        if let Some(eight) = eight_binding_ctx() {
            let fused = check_on(ctx().unwrap(), &what, &t, TOL, 0.05);
            let mut apart = check_on(eight, &format!("{what}, 8 bindings"), &t, TOL, 0.05);
            let got = apart.run(&values(&t.inputs)).unwrap();
            let mut fused = fused;
            let want = fused.run(&values(&t.inputs)).unwrap();
            assert!(got == want, "{what}: 8 bindings and the triple differ");
            assert_eq!(
                apart.stats().last_dispatches,
                fused.stats().last_dispatches + 1,
                "{what}: 8 bindings"
            );
        }
    }
    // Three 200-row 4-bit weights with a 64 KiB binding: a pair's nibbles (51200 bytes) fit one,
    // a triple's (76800) do not, so the third runs alone: a quantization and two mat-vecs.
    if let Some(small) = small_binding_ctx() {
        let (m, k) = (1, 256);
        let mut t = T::default();
        let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
        let w = Weight::Q4 { group: 32 };
        linears_of(
            &mut t,
            &mut rng,
            x,
            [m, k],
            &[(w, ActQuant::Torchao, 200); 3],
        );
        let what = "three linears past the binding";
        let mut gpu = check_on(small, what, &t, TOL, 0.05);
        assert_eq!(gpu.stats().last_dispatches, 3, "{what}");
        let mut one = GpuExecutor::new(pairs[0].1.clone(), t.g.clone()).unwrap();
        let vals = values(&t.inputs);
        assert!(
            gpu.run(&vals).unwrap() == one.run(&vals).unwrap(),
            "{what}: bits"
        );
    }
}

/// Two linears of `x` ([m, k]) to n outputs each, and gelu(one) · the other (an MLP's gate/up).
fn gate_up(
    t: &mut T,
    rng: &mut Rng,
    x: TensorId,
    [m, k, n]: [usize; 3],
    (weight, act_quant): (Weight, pteria::ir::ActQuant),
    gelu_second: bool,
) -> TensorId {
    let f = DType::F32;
    let mut halves = Vec::new();
    for _ in 0..2 {
        let mut ins = vec![x];
        ins.extend(quant_weight(t, rng, weight, n, k));
        let kind = OpKind::Linear {
            weight,
            act_quant,
            has_bias: false,
        };
        halves.push(t.op(kind, ins, f, &[m, n]));
    }
    let (g, u) = if gelu_second {
        (halves[1], halves[0])
    } else {
        (halves[0], halves[1])
    };
    let ge = t.op(OpKind::Unary(UnaryOp::GeluTanh), vec![g], f, &[m, n]);
    t.op(OpKind::Binary(BinaryOp::Mul), vec![ge, u], f, &[m, n])
}

/// A paired gate/up linear whose two outputs only gelu(one) · the other reads stores that chain
/// itself where it runs as a mat-vec (decode rows, and up to `MATVEC_ROWS` of quantized
/// weights): one dispatch fewer and the same bits as the chain apart, for 4- and 8-bit weights
/// with and without int8 activations and f32 weights, whichever of the two the gelu takes, with
/// and without subgroups. Rows the tiled kernel takes keep the chain's own dispatch.
#[test]
fn paired_gate_up_linears_store_their_chain() {
    use pteria::ir::ActQuant;
    let pairs = fused_and_apart(ContextOptions {
        separate_glu: true,
        ..Default::default()
    });
    let mut rng = Rng::new(28);
    let formats = [
        (Weight::Q4 { group: 128 }, ActQuant::Torchao),
        (Weight::Q8 { group: 64 }, ActQuant::Torchao),
        (Weight::Q4 { group: 128 }, ActQuant::None),
        (Weight::F32, ActQuant::None),
    ];
    for (m, k, n) in [
        (1usize, 256usize, 67usize),
        (3, 1536, 2560),
        (20, 256, 40),
        // A prompt's teams of 4 weight rows, 2 of each half.
        (MATVEC_ROWS, 256, 40),
        (PAST, 256, 40),
    ] {
        for (w, aq) in formats {
            for gelu_second in [false, true] {
                let mut t = T::default();
                let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
                let y = gate_up(&mut t, &mut rng, x, [m, k, n], (w, aq), gelu_second);
                t.out(y);
                assert_eq!(pteria::ir::passes::fuse_elementwise_chains(&mut t.g), 1);
                let what = format!(
                    "{m}x{k} gate/up of {n} {w:?}/{aq:?}, gelu of the {}",
                    if gelu_second { "second" } else { "first" }
                );
                // f32 weights take the mat-vec for decode rows only.
                let rows = if matches!(w, Weight::F32) {
                    8
                } else {
                    MATVEC_ROWS
                };
                fusion_saves(&pairs, &what, &t, (m <= rows) as usize);
            }
        }
    }
}

/// Asserts `got` has `want`'s bits, naming how many differ and the first.
fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: output length");
    let differ = (got.iter().zip(want))
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let first = (got.iter().zip(want)).position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(
        differ,
        0,
        "{what}: {differ} of {} outputs differ, first at {first:?}: {:?}",
        want.len(),
        first.map(|i| (got[i], want[i]))
    );
}

/// Runs `t` on `ctx` and asserts every output has the CPU executor's bits (XNNPACK's linears);
/// returns the GPU executor and its kernel entries.
fn same_bits_as_cpu(ctx: Arc<Context>, what: &str, t: &T) -> (GpuExecutor, Vec<String>) {
    let vals = values(&t.inputs);
    let want = CpuExecutor::new(t.g.clone()).unwrap().run(&vals).unwrap();
    let mut gpu = GpuExecutor::new(ctx, t.g.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = gpu.run(&vals).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got.len(), want.len(), "{what}: outputs");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (g.to_f32().unwrap(), w.to_f32().unwrap());
        assert_same_bits(&format!("{what}: output {i}"), &g, &w);
    }
    let entries = gpu.last_entries();
    (gpu, entries)
}

/// XNNPACK-quantized 4-bit linears of one input run as one dispatch with their ksums joined
/// (q/k/v in threes, gate/up in pairs): the CPU executor's bits (so XNNPACK's), with and without
/// subgroups and fused multiply-adds; a device of 8 storage bindings keeps them apart and one of
/// 9 pairs but does not triple. A gate/up pair whose outputs only gelu(one) · the other reads
/// stores that chain from its decode mat-vec, leaving its range for the next linear's
/// quantization: the same bits as the chain and the pair apart.
#[test]
fn xnnpack_linears_pair_and_store_their_chain() {
    use pteria::ir::ActQuant;
    let Some(fused) = ctx() else { return };
    let apart = |o: ContextOptions| open(o);
    let others: Vec<(Arc<Context>, &str)> = [
        (no_subgroup_ctx(), " (no subgroups)"),
        (emulated_fma_ctx(), " (fma emulated)"),
    ]
    .into_iter()
    .filter_map(|(c, n)| Some((c?, n)))
    .collect();
    let mut rng = Rng::new(71);
    let count = |e: &[String], entry: &str| e.iter().filter(|e| e.ends_with(entry)).count();
    // (M, K, group, the three Ns, symmetric): decode rows take xnn_matvec, a prompt's
    // xnn_matvec_rows.
    for (m, k, group, ns, symmetric) in [
        (1usize, 256usize, 32usize, [40usize, 9, 9], true),
        (1, 1536, 128, [300, 64, 64], false),
        // Two weight rows a workgroup (K >= 6144), the triple's split inside one.
        (1, 6144, 128, [21, 9, 9], true),
        (3, 256, 64, [45, 17, 17], true),
    ] {
        let mut t = T::default();
        let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
        for n in ns {
            let w = Weight::Q4 { group };
            let mut ins = vec![x];
            if symmetric {
                ins.extend(symmetric_q4(&mut t, &mut rng, n, k, group, 0));
            } else {
                ins.extend(quant_weight(&mut t, &mut rng, w, n, k));
            }
            let kind = OpKind::Linear {
                weight: w,
                act_quant: ActQuant::Xnnpack,
                has_bias: false,
            };
            let y = t.op(kind, ins, DType::F32, &[m, n]);
            t.out(y);
        }
        let what = format!("xnnpack q/k/v {m}x{k}->{ns:?} g{group}");
        let entry = if m == 1 {
            ":xnn_matvec"
        } else {
            ":xnn_matvec_rows"
        };
        let (_, e) = same_bits_as_cpu(fused.clone(), &what, &t);
        assert_eq!(count(&e, entry), 1, "{what}: {e:?}");
        for (c, name) in &others {
            let (_, e) = same_bits_as_cpu(c.clone(), &format!("{what}{name}"), &t);
            assert_eq!(count(&e, entry), 1, "{what}{name}: {e:?}");
        }
        for (max, linears) in [(8, 3), (9, 2)] {
            let Some(c) = apart(ContextOptions {
                max_storage_buffers: Some(max),
                ..Default::default()
            }) else {
                continue;
            };
            let what = format!("{what}, {max} bindings");
            let (_, e) = same_bits_as_cpu(c, &what, &t);
            assert_eq!(count(&e, entry), linears, "{what}: {e:?}");
        }
    }
    // (M, K, group, N, the next linear's group and N): gate/up, gelu · up, a down projection.
    for (m, k, group, n, down) in [
        (1usize, 256usize, 32usize, 96usize, (32usize, 40usize)),
        (1, 1536, 128, 1024, (128, 300)),
        // A workgroup's one gate row and one up row (K >= 6144).
        (1, 6144, 128, 96, (32, 40)),
        // A chain row past MATVEC_ROWS' norm kernel: apart, it takes a dispatch of its own.
        (1, 256, 32, 2560, (32, 40)),
        (4, 256, 64, 64, (32, 24)),
    ] {
        for gelu_second in [false, true] {
            let mut t = T::default();
            let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
            let q4 = (Weight::Q4 { group }, ActQuant::Xnnpack);
            let h = gate_up(&mut t, &mut rng, x, [m, k, n], q4, gelu_second);
            let mut ins = vec![h];
            ins.extend(symmetric_q4(&mut t, &mut rng, down.1, n, down.0, 0));
            let kind = OpKind::Linear {
                weight: Weight::Q4 { group: down.0 },
                act_quant: ActQuant::Xnnpack,
                has_bias: false,
            };
            let y = t.op(kind, ins, DType::F32, &[m, down.1]);
            t.out(y);
            assert_eq!(pteria::ir::passes::fuse_elementwise_chains(&mut t.g), 1);
            let what = format!(
                "xnnpack gate/up {m}x{k}->{n} g{group}, down to {}, gelu of the {}",
                down.1,
                if gelu_second { "second" } else { "first" }
            );
            // (The chain's tanh is the GPU's, a few ulps from the CPU's: against the CPU within
            // the tolerance, against each other bit for bit.)
            let run = |c: Arc<Context>, name: &str| {
                let what = format!("{what}{name}");
                let mut gpu = check_on(c, &what, &t, TOL, 0.05);
                let out = gpu.run(&values(&t.inputs)).unwrap()[0].to_f32().unwrap();
                let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                (bits, gpu.last_entries())
            };
            let (want, e) = run(fused.clone(), "");
            for (c, name) in &others {
                let (got, e2) = run(c.clone(), name);
                assert!(got == want, "{what}{name}: bits");
                assert_eq!(e2, e, "{what}{name}");
            }
            let apart_e = |o: ContextOptions, name: &str| {
                let (got, e) = run(apart(o)?, name);
                assert!(got == want, "{what}{name}: bits");
                Some(e)
            };
            let no_glu = apart_e(
                ContextOptions {
                    separate_glu: true,
                    ..Default::default()
                },
                ", chain apart",
            );
            let no_pairs = apart_e(
                ContextOptions {
                    separate_linears: true,
                    ..Default::default()
                },
                ", apart",
            );
            // Apart, a chain row of up to 512 is computed by the down projection as it loads
            // it (`chain_load`), one of up to 2048 quantizes itself (a row kernel), a longer one
            // runs apart and then a quantization.
            let long = (n > 2048) as usize;
            let apart_chain = if n <= 512 { 0 } else { 1 + long };
            if m == 1 {
                // The quantization, the pair storing its chain and range, the ranged
                // quantization, the down projection.
                assert_eq!(e.len(), 4, "{what}: {e:?}");
                assert_eq!(count(&e, ":xnn_matvec_ranged"), 1, "{what}: {e:?}");
                assert_eq!(count(&e, ":act_quant_ranged"), 1, "{what}: {e:?}");
                if let Some(a) = &no_glu {
                    assert_eq!(a.len(), 3 + apart_chain, "{what}, chain apart: {a:?}");
                }
            } else {
                // The pair's chain runs apart, and never quantizes (decode calls would not).
                assert_eq!(count(&e, ":xnn_matvec_rows"), 2, "{what}: {e:?}");
                assert_eq!(e.len(), 5, "{what}: {e:?}");
            }
            if let Some(a) = no_pairs {
                let apart = if m == 1 { 4 + apart_chain } else { 5 + long };
                assert_eq!(a.len(), apart, "{what}, apart: {a:?}");
            }
        }
    }
}

/// A prompt's int8 quad mat-vec taking 2, 4 or 8 rows of x a workgroup (each weight quad loaded
/// once for all of them) gives the bits of one row a workgroup, for 4- and 8-bit weights, with
/// biases, rows past the last group of x, a gate/up pair storing its chain, and with and without
/// subgroups; and the CPU's results.
#[test]
fn prompt_mat_vecs_taking_several_rows_of_x_give_the_same_bits() {
    use pteria::ir::ActQuant;
    let mut rng = Rng::new(29);
    let ones = fused_and_apart(ContextOptions {
        matvec_x_rows: Some(1),
        ..Default::default()
    });
    for x_rows in [2, 4, 8] {
        let several = |no_subgroups| {
            open(ContextOptions {
                matvec_x_rows: Some(x_rows),
                no_subgroups,
                ..Default::default()
            })
        };
        let pairs: Vec<_> = (ones.iter())
            .filter_map(|(_, one, name)| Some((several(!name.is_empty())?, one.clone(), *name)))
            .collect();
        for (m, k, n) in [(5usize, 256usize, 40usize), (21, 512, 300)] {
            for (w, bias) in [
                (Weight::Q4 { group: 128 }, false),
                (Weight::Q8 { group: 64 }, true),
            ] {
                let t = linear_graph(&mut rng, w, m, k, n, bias, ActQuant::Torchao);
                for (fused, one, name) in &pairs {
                    let what = format!("{m}x{k}->{n} {w:?} bias {bias}, {x_rows} rows of x{name}");
                    same_bits_several_and_one(fused, one, &what, &t);
                }
            }
            let mut t = T::default();
            let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
            let q4 = (Weight::Q4 { group: 128 }, ActQuant::Torchao);
            let y = gate_up(&mut t, &mut rng, x, [m, k, n], q4, false);
            t.out(y);
            pteria::ir::passes::fuse_elementwise_chains(&mut t.g);
            for (fused, one, name) in &pairs {
                let what = format!("{m}x{k} gate/up of {n}, {x_rows} rows of x{name}");
                same_bits_several_and_one(fused, one, &what, &t);
            }
        }
    }
}

/// `same_bits_fused_and_apart` for `several` rows of x a mat-vec workgroup against `one`: the
/// first ran `matvec_rows`, the second never.
fn same_bits_several_and_one(several: &Arc<Context>, one: &Arc<Context>, what: &str, t: &T) {
    let (a, b) = fused_and_apart_runs(several, one, what, t);
    let (a, b) = (a.last_entries(), b.last_entries());
    let rows = |e: &[String]| e.iter().any(|e| e.ends_with(":matvec_rows"));
    assert!(rows(&a), "{what}: {a:?}");
    assert!(!rows(&b), "{what}: {b:?}");
}

/// A linear quantizing a decode row that a gate/up mat-vec's chain or a split attention stores
/// takes the row's range from the producer's stores (`act_quant_ranged`, no pass over the row
/// first): the same bits as the pass, and the CPU's values, by torchao's and XNNPACK's rounding
/// for 4- and 8-bit weights, with and without subgroups, rows of 256 to 12288. More rows keep
/// the pass.
#[test]
fn producers_leave_the_range_their_linear_quantizes_by() {
    let pairs = fused_and_apart(ContextOptions {
        separate_ranges: true,
        ..Default::default()
    });
    let mut rng = Rng::new(31);
    // A call after one of a wider range must start from cleared slots: its bits are those of
    // a first call. Returns how many quantizations took the producer's range, and how many a pass.
    let ranged = |fused: &Arc<Context>, t: &T| {
        let wide: Vec<Val> = (t.inputs.iter())
            .map(|v| match v {
                // (Every tensor input here is f32.)
                Val::Tensor(shape, data) => Val::Tensor(
                    shape.clone(),
                    (data.chunks_exact(4))
                        .flat_map(|b| {
                            (4.0 * f32::from_le_bytes(b.try_into().unwrap())).to_le_bytes()
                        })
                        .collect(),
                ),
                v => v.clone(),
            })
            .collect();
        let mut gpu = GpuExecutor::new(fused.clone(), t.g.clone()).unwrap();
        let mut first = GpuExecutor::new(fused.clone(), t.g.clone()).unwrap();
        gpu.run(&values(&wide)).unwrap();
        let got = gpu.run(&values(&t.inputs)).unwrap();
        assert!(got == first.run(&values(&t.inputs)).unwrap(), "second call");
        let e = gpu.last_entries();
        let n = |what: &str| e.iter().filter(|x| x.as_str() == what).count();
        (n("linear:act_quant_ranged"), n("linear:act_quant_packed"))
    };
    let q4 = Weight::Q4 { group: 128 };
    for (m, k, n) in [(1usize, 256usize, 256usize), (1, 128, 12288), (3, 256, 512)] {
        for (w, aq) in packed_formats() {
            let mut t = T::default();
            let x = t.input_f(&[m, k], &rng.floats(m * k, 1.0));
            let torchao = pteria::ir::ActQuant::Torchao;
            let y = gate_up(&mut t, &mut rng, x, [m, k, n], (q4, torchao), false);
            linears_of(&mut t, &mut rng, y, [m, n], &[(w, aq, 40)]);
            assert_eq!(pteria::ir::passes::fuse_elementwise_chains(&mut t.g), 1);
            let what = format!("{m}x{k} gate/up of {n}, then {w:?}/{aq:?}");
            fusion_saves(&pairs, &what, &t, 0);
            for (fused, _, name) in &pairs {
                // The gate/up pair quantizes its input with a pass; the down linear not, in decode.
                let want = if m == 1 { (1, 1) } else { (0, 2) };
                assert_eq!(ranged(fused, &t), want, "{what}{name}");
            }
        }
    }
    // Attention of one query over a cache, its heads as one row of a linear.
    for (hq, d, s) in [(4usize, 64usize, 1usize), (8, 256, 1), (2, 64, 3)] {
        for (w, aq) in packed_formats() {
            let mut t = T::default();
            let f = DType::F32;
            let (cache, start) = (40usize, 29i64);
            let qs = attn_shape(AttnLayout::Bshd, 1, s, hq, d);
            let ks = attn_shape(AttnLayout::Bshd, 1, cache, 1, d);
            let q = t.input_f(&qs, &rng.floats(s * hq * d, 1.0));
            let kc = t.input_f(&ks, &rng.floats(cache * d, 1.0));
            let vc = t.input_f(&ks, &rng.floats(cache * d, 1.0));
            let start = t.sym("start", start);
            let kind = OpKind::Sdpa {
                layout: AttnLayout::Bshd,
                scale: 1.0,
                causal: true,
                window: None,
                softcap: None,
                start: Int::Sym(start),
                all_rows: false,
            };
            let o = t.op(kind, vec![q, kc, vc], f, &qs);
            let shape = vec![Int::Lit(s as i64), Int::Lit((hq * d) as i64)];
            let row = t.op(OpKind::Reshape { shape }, vec![o], f, &[s, hq * d]);
            linears_of(&mut t, &mut rng, row, [s, hq * d], &[(w, aq, 24)]);
            let what = format!("attention of {s} queries, {hq}x{d}, then {w:?}/{aq:?}");
            fusion_saves(&pairs, &what, &t, 0);
            for (fused, _, name) in &pairs {
                let want = if s == 1 { (1, 0) } else { (0, 1) };
                assert_eq!(ranged(fused, &t), want, "{what}{name}");
            }
        }
    }
}

/// Identity weights make the linear return its quantize-dequantized activations, so a single
/// tie rounded the other way shows as a whole quantization step.
/// A linear whose input an element-wise chain of short rows makes, and nothing else reads,
/// computes the chain as its decode mat-vec loads the chain's inputs and quantizes the row in
/// each team (Gemma's per-layer input: gelu(gate) · a slice of the per-layer inputs, read in
/// place): no dispatch for the chain, the same bits as the chain quantizing apart, for 4- and
/// 8-bit weights, one or two chain inputs, with and without subgroups, by torchao's rounding and
/// XNNPACK's (4-bit `xnn_matvec`, the whole workgroup chaining the row). The chain's inputs stay
/// alive until the linear although a tensor is written in between. Prefill rows, rows longer
/// than a team holds, and XNNPACK's 8-bit GEMM keep the chain's dispatch.
#[test]
fn linears_compute_the_chain_they_quantize() {
    use pteria::ir::ActQuant;
    let pairs = fused_and_apart(ContextOptions {
        separate_chain_loads: true,
        ..Default::default()
    });
    let mut rng = Rng::new(37);
    let torchao = [
        (Weight::Q4 { group: 32 }, ActQuant::Torchao),
        (Weight::Q4 { group: 128 }, ActQuant::Torchao),
        (Weight::Q8 { group: 32 }, ActQuant::Torchao),
        (Weight::Q4 { group: 32 }, ActQuant::Xnnpack),
        (Weight::Q4 { group: 128 }, ActQuant::Xnnpack),
    ];
    // (rows, K, N, two inputs, format, fused)
    let mut cases = Vec::new();
    for (w, aq) in torchao {
        for (m, k, n, two, fused) in [
            (1, 256, 1536, true, true),
            (1, 512, 29, true, true),
            (1, 256, 40, false, true),
            (3, 256, 40, true, false),
            (1, 1024, 40, true, false),
        ] {
            cases.push((m, k, n, two, w, aq, fused));
        }
    }
    // XNNPACK's 8-bit linears keep their GEMM.
    cases.push((
        1,
        256,
        40,
        true,
        Weight::Q8 { group: 32 },
        ActQuant::Xnnpack,
        false,
    ));
    for (m, k, n, two, w, aq, fused) in cases {
        let mut t = T::default();
        let f = DType::F32;
        let sh = [m, k];
        let x = t.input_f(&sh, &rng.floats(m * k, 2.0));
        let all = t.input_f(&[m, 4, k], &rng.floats(m * 4 * k, 1.5));
        let other = t.input_f(&sh, &rng.floats(m * k, 1.0));
        // Activations (not graph inputs) on the chain's side, as in a model.
        let gate = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![x], f, &sh);
        let layers = t.op(OpKind::Unary(UnaryOp::Neg), vec![all], f, &[m, 4, k]);
        let slice = t.op(
            OpKind::Select {
                dim: 1,
                index: Int::Lit(2),
            },
            vec![layers],
            f,
            &sh,
        );
        let ge = t.op(OpKind::Unary(UnaryOp::GeluTanh), vec![gate], f, &sh);
        let chain = if two {
            t.op(OpKind::Binary(BinaryOp::Mul), vec![ge, slice], f, &sh)
        } else {
            t.op(OpKind::Unary(UnaryOp::Neg), vec![ge], f, &sh)
        };
        // Written between the chain and its linear: they must not take the storage of the
        // chain's inputs (or of what the slice reads in place).
        let wide = t.op(OpKind::Unary(UnaryOp::Exp), vec![all], f, &[m, 4, k]);
        t.out(wide);
        let between = t.op(OpKind::Unary(UnaryOp::Exp), vec![other], f, &sh);
        t.out(between);
        if !two {
            t.out(slice);
        }
        linears_of(&mut t, &mut rng, chain, [m, k], &[(w, aq, n)]);
        pteria::ir::passes::fuse_elementwise_chains(&mut t.g);
        let what = format!(
            "{m}x{k}->{n} chain of {} inputs for {w:?}/{aq:?}",
            1 + two as usize
        );
        fusion_saves(&pairs, &what, &t, fused as usize);
    }
}

/// An rms_norm whose one row only a linear of few rows reads quantized (Gemma's post-norm with
/// its residual add and clamp, before the per-layer input's gate) runs in that linear's
/// mat-vec: no dispatch for the norm, the same bits as apart and the CPU's values, for 4- and
/// 8-bit weights, weighted or not, with or without its chain, with and without subgroups. Its
/// rows are still stored for their other reader, and its inputs (activations that die at the
/// norm) stay alive until the linear although tensors are written in between. By torchao's
/// rounding and XNNPACK's (4-bit `xnn_matvec`). Prompt rows, linears of many rows, linears
/// sharing the quantization, XNNPACK's 8-bit GEMM, a broadcast chain operand and rows past 2048
/// keep the norm's dispatch.
#[test]
fn linears_norm_the_row_they_quantize() {
    use pteria::ir::ActQuant;
    let pairs = fused_and_apart(ContextOptions {
        separate_norm_loads: true,
        ..Default::default()
    });
    let mut rng = Rng::new(43);
    #[derive(Clone, Copy, PartialEq)]
    enum Norm {
        Plain,
        Weighted,
        Residual,
        Broadcast,
        Shared,
        ReadBetween,
    }
    let q4 = Weight::Q4 { group: 128 };
    let q8 = Weight::Q8 { group: 32 };
    let tao = ActQuant::Torchao;
    let xnn = ActQuant::Xnnpack;
    // (rows, K, N, weight, rounding, norm, fused)
    let cases = [
        (1, 1536, 256, q4, tao, Norm::Residual, true),
        (1, 1536, 256, q8, tao, Norm::Residual, true),
        (
            1,
            256,
            40,
            Weight::Q4 { group: 32 },
            tao,
            Norm::Weighted,
            true,
        ),
        (1, 512, 29, q8, tao, Norm::Plain, true),
        (1, 2048, 70, q4, tao, Norm::Residual, true),
        (3, 256, 40, q4, tao, Norm::Residual, false),
        (1, 256, 1536, q4, tao, Norm::Residual, false),
        (1, 256, 40, q4, tao, Norm::Shared, false),
        // XNNPACK's 4-bit mat-vec, the whole workgroup norming the row.
        (1, 1536, 256, q4, xnn, Norm::Residual, true),
        (
            1,
            256,
            40,
            Weight::Q4 { group: 32 },
            xnn,
            Norm::Weighted,
            true,
        ),
        (1, 512, 29, q4, xnn, Norm::Plain, true),
        (3, 256, 40, q4, xnn, Norm::Residual, false),
        (1, 256, 40, q8, xnn, Norm::Residual, false),
        (1, 256, 40, q4, tao, Norm::Broadcast, false),
        (1, 2560, 40, q4, tao, Norm::Residual, false),
        (1, 256, 40, q4, tao, Norm::ReadBetween, false),
    ];
    for (m, k, n, w, aq, norm, fused) in cases {
        let mut t = T::default();
        let f = DType::F32;
        let sh = [m, k];
        let x_in = t.input_f(&sh, &rng.floats(m * k, 3.0));
        let r_in = t.input_f(&sh, &rng.floats(m * k, 2.0));
        let other = t.input_f(&sh, &rng.floats(m * k, 1.0));
        let nw = t.const_f(&[k], &rng.floats(k, 1.5));
        let row = t.const_f(&[k], &rng.floats(k, 1.0));
        // Activations that die at the norm, as in a model: the norm's rows must not take their
        // storage while the linear's workgroups still read them.
        let x = t.op(OpKind::Unary(UnaryOp::Neg), vec![x_in], f, &sh);
        let r = t.op(OpKind::Unary(UnaryOp::Neg), vec![r_in], f, &sh);
        let weighted = norm != Norm::Plain;
        let ins = if weighted { vec![x, nw] } else { vec![x] };
        let mut h = t.op(OpKind::RmsNorm { eps: 1e-6 }, ins, f, &sh);
        match norm {
            Norm::Residual | Norm::Shared | Norm::ReadBetween => {
                h = t.op(OpKind::Binary(BinaryOp::Add), vec![h, r], f, &sh);
                let (min, max) = (Some(-2.5), Some(2.5));
                h = t.op(OpKind::Clamp { min, max }, vec![h], f, &sh);
            }
            Norm::Broadcast => {
                h = t.op(OpKind::Binary(BinaryOp::Add), vec![h, row], f, &sh);
                t.out(r);
            }
            _ => t.out(r),
        }
        // Read again before the linear: the rows must exist before it runs.
        if norm == Norm::ReadBetween {
            let before = t.op(OpKind::Unary(UnaryOp::Exp), vec![h], f, &sh);
            t.out(before);
        }
        // Written between the norm and its linear.
        let between = t.op(OpKind::Unary(UnaryOp::Exp), vec![other], f, &sh);
        t.out(between);
        let linears: &[_] = if norm == Norm::Shared {
            &[(w, aq, n), (w, aq, 24)]
        } else {
            &[(w, aq, n)]
        };
        linears_of(&mut t, &mut rng, h, [m, k], linears);
        // The norm's rows are read again after the linear (the residual stream).
        let after = t.op(OpKind::Unary(UnaryOp::Exp), vec![h], f, &sh);
        t.out(after);
        pteria::ir::passes::fuse_elementwise_chains(&mut t.g);
        pteria::ir::passes::fuse_norm_chains(&mut t.g);
        let what = format!("{m}x{k}->{n} {w:?}/{aq:?} norm loaded");
        fusion_saves(&pairs, &what, &t, fused as usize);
    }
}

/// Decode attention whose q is a rotated rms_norm's rows (Gemma's q norm with RoPE), read
/// through a permute that only moves size-1 dims, norms and rotates each head's row in `split`:
/// no dispatch for the norm, the same bits as the norm apart, weighted or not, half or
/// interleaved, all or part of the dims rotated, head dims 256 and 512, one query or a few (each
/// at its own position), with and without subgroups. The norm's inputs stay alive until the
/// attention although tensors are written in between. Queries whose permute moves data, or more
/// than split takes (`SPLIT_MAX_S`, the matmuls' then), keep the norm's dispatch.
#[test]
fn attention_norms_and_rotates_its_q() {
    let pairs = fused_and_apart(ContextOptions {
        separate_q_norms: true,
        ..Default::default()
    });
    let mut rng = Rng::new(41);
    // (queries, heads, head dim, rotated dims, weighted, style, permuted, fused)
    let cases = [
        (1, 8, 256, 256, true, RopeStyle::Half, true, true),
        (1, 4, 512, 128, false, RopeStyle::Interleaved, false, true),
        (1, 2, 256, 256, true, RopeStyle::Interleaved, true, true),
        (3, 4, 256, 256, true, RopeStyle::Half, false, true),
        (3, 4, 256, 256, true, RopeStyle::Half, true, false),
        (8, 4, 256, 256, true, RopeStyle::Half, false, true),
        (SPLIT_MAX_S, 2, 256, 256, true, RopeStyle::Half, false, true),
        (
            SPLIT_MAX_S + 1,
            2,
            256,
            256,
            true,
            RopeStyle::Half,
            false,
            false,
        ),
    ];
    let (cache, hkv, start, max_pos) = (80, 1, 37i64, 80);
    for (s, hq, d, rotary, weighted, style, permuted, fused) in cases {
        let mut t = T::default();
        let f = DType::F32;
        let xs = [1, s, hq, d];
        let n = s * hq * d;
        let x = t.input_f(&xs, &rng.floats(n, 2.0));
        let half = rotary / 2;
        let cos = t.input_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
        let sin = t.input_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
        let pos = t.sym("start", start);
        // Activations (not graph inputs) on the norm's side, as in a model.
        let raw = t.op(OpKind::Unary(UnaryOp::Neg), vec![x], f, &xs);
        let cos_a = t.op(OpKind::Unary(UnaryOp::Neg), vec![cos], f, &[max_pos, half]);
        let mut ins = vec![raw];
        if weighted {
            ins.push(t.const_f(&[d], &rng.floats(d, 1.5)));
        }
        ins.extend([cos_a, sin]);
        let kind = OpKind::RmsNormRope {
            eps: 1e-6,
            weighted,
            style,
            rotary,
            seq_dim: 1,
            start: Int::Sym(pos),
        };
        let normed = t.op(kind, ins, f, &xs);
        // Written between the norm and the attention: they must not take the storage of the
        // norm's input or tables.
        let other = t.input_f(&xs, &rng.floats(n, 1.0));
        let between = t.op(OpKind::Unary(UnaryOp::Exp), vec![other], f, &xs);
        t.out(between);
        let table = t.op(OpKind::Unary(UnaryOp::Exp), vec![cos], f, &[max_pos, half]);
        t.out(table);
        let layout = if permuted {
            AttnLayout::Bhsd
        } else {
            AttnLayout::Bshd
        };
        let q = if permuted {
            let perm = OpKind::Permute {
                perm: vec![0, 2, 1, 3],
            };
            t.op(perm, vec![normed], f, &[1, hq, s, d])
        } else {
            normed
        };
        let ks = attn_shape(layout, 1, cache, hkv, d);
        let k = t.input_f(&ks, &rng.floats(cache * hkv * d, 1.0));
        let v = t.input_f(&ks, &rng.floats(cache * hkv * d, 1.0));
        let kind = OpKind::Sdpa {
            layout,
            scale: 1.0,
            causal: true,
            window: None,
            softcap: None,
            start: Int::Sym(pos),
            all_rows: false,
        };
        let qs = attn_shape(layout, 1, s, hq, d);
        let y = t.op(kind, vec![q, k, v], f, &qs);
        t.out(y);
        let what = format!("{s} queries, {hq}x{d}, {rotary} rotated {style:?}, weighted {weighted}, permuted {permuted}");
        fusion_saves(&pairs, &what, &t, fused as usize);
        // A device binding 8 storage buffers keeps the norm apart.
        if let (Some(narrow), Some((_, apart, _))) = (eight_binding_ctx(), pairs.first()) {
            fusion_saves(&[(narrow, apart.clone(), " (8 bindings)")], &what, &t, 0);
        }
    }
}

#[test]
fn activation_quant_rounds_ties_as_its_reference() {
    use pteria::ir::cpu::{quant_dequant_row, quant_dequant_row_xnnpack};
    use pteria::ir::ActQuant;
    let (m, k) = (3, 203);
    // Hundredths over a range of 5.1 land x · 50 and x / 0.02 on (near-)ties, where the two
    // rules' float roundings disagree.
    let x: Vec<f32> = (0..m * k)
        .map(|i| {
            let (r, j) = (i / k, i % k);
            match j {
                0 => -2.55 + r as f32 * 0.5,
                1 => 2.55,
                _ => ((j * 37 + r * 11) % 511) as f32 / 100.0 - 2.55,
            }
        })
        .collect();
    let quantized = |f: fn(&mut [f32])| {
        let mut v = x.clone();
        v.chunks_mut(k).for_each(f);
        v
    };
    let (torchao, xnn) = (
        quantized(quant_dequant_row),
        quantized(quant_dequant_row_xnnpack),
    );
    let differ = torchao.iter().zip(&xnn).filter(|(a, b)| a != b).count();
    assert!(
        differ > 0,
        "the rows must contain ties the two rules round apart"
    );
    for aq in [ActQuant::Torchao, ActQuant::Xnnpack] {
        check(
            &format!("act quant {aq:?} ({differ} ties differ)"),
            &quantized_through_identity(&x, m, k, aq),
            TOL,
            0.05,
        );
    }
}

/// A linear of identity weights over x [m, k] with activation quantization `aq`: it returns
/// each row quantized and dequantized, s · (q - zp), exactly.
fn quantized_through_identity(x: &[f32], m: usize, k: usize, aq: pteria::ir::ActQuant) -> T {
    let mut eye = vec![0f32; k * k];
    (0..k).for_each(|i| eye[i * k + i] = 1.0);
    let mut t = T::default();
    let xi = t.input_f(&[m, k], x);
    let w = t.const_f(&[k, k], &eye);
    let y = t.op(
        OpKind::Linear {
            weight: Weight::F32,
            act_quant: aq,
            has_bias: false,
        },
        vec![xi, w],
        DType::F32,
        &[m, k],
    );
    t.out(y);
    t
}

/// The quantization's scale, range / 255, and zero point are the reference's bits: rows of
/// ranges over twelve orders of magnitude (each a different quotient), through identity weights
/// that return s · (q - zp) exactly.
#[test]
fn activation_quant_scales_are_the_references_bits() {
    use pteria::ir::ActQuant;
    let mut rng = Rng::new(41);
    let k = 16;
    for m in [1, 3, 2000] {
        let x: Vec<f32> = (0..m * k)
            .map(|i| {
                let r = i / k;
                let mag = 10f32.powf((r % 13) as f32 - 6.0) * (1.0 + (r as f32 * 0.37).fract());
                rng.f() * mag
            })
            .collect();
        let t = quantized_through_identity(&x, m, k, ActQuant::Torchao);
        check(&format!("act quant scales, {m} rows"), &t, 0.0, 0.0);
    }
}

/// Elements whose quotient by the scale lies near a rounding tie (a half-integer t) round as the
/// reference rounds them: the quotient rounded to f32 first, then to an integer (ties to even).
/// Each row's range fixes its scale; its other elements are the floats nearest t·s and up to 3
/// ulps either side. Where the f32 quotient is exactly the tie but the exact one is not, rounding the
/// exact quotient differs (the test counts that such elements occur).
#[test]
fn activation_quant_rounds_quotients_near_ties_as_the_reference() {
    use pteria::ir::ActQuant;
    let mut rng = Rng::new(77);
    let (m, k) = (64, 256);
    let mut x = Vec::with_capacity(m * k);
    let mut double_rounded = 0;
    for r in 0..m {
        let mag = 10f32.powf((r % 9) as f32 - 4.0) * (1.0 + rng.f().abs());
        let (lo, hi) = (-mag * (0.3 + rng.f().abs()), mag * (0.3 + rng.f().abs()));
        let s = ((hi - lo) / 255.0).max(f32::EPSILON);
        let row_start = x.len();
        x.extend([lo, hi]);
        while x.len() < row_start + k {
            // A half-integer strictly inside the row's range, either sign.
            let lim = ((lo / s).abs().min(hi / s) - 2.0).floor().max(0.0);
            let t = (rng.f() * lim).trunc() + 0.5 * rng.f().signum();
            let mut v = (t as f64 * s as f64) as f32;
            for _ in 0..3 {
                v = v.next_down();
            }
            for _ in 0..7 {
                if x.len() < row_start + k && v > lo && v < hi {
                    x.push(v);
                    let q32 = (v / s).round_ties_even();
                    let exact = (v as f64 / s as f64).round_ties_even() as f32;
                    double_rounded += usize::from(q32 != exact);
                }
                v = v.next_up();
            }
        }
    }
    assert!(
        double_rounded > 0,
        "no element whose f32 quotient rounds differently"
    );
    let t = quantized_through_identity(&x, m, k, ActQuant::Torchao);
    check("act quant near ties", &t, 0.0, 0.0);
}

/// Dynamic int8 activations against symmetric 4-bit weights (bias -8·scale, as the Vulkan and
/// XNNPACK exports store them) on the decode path are exact integer sums, so the result may
/// round only once per group: a rule that rounds s·Σq·n and b·Σq apart loses several ulps to
/// their cancellation, enough to flip a later int8 rounding (the tiny Gemma 8da4w fixture did
/// on an H100). One-signed activations make Σq large, the worst case.
#[test]
fn dq8_int4_decode_linear_rounds_once_per_group() {
    use pteria::ir::cpu::quant_dequant_row;
    let (k, n, group) = (256, 64, 32);
    let mut rng = Rng::new(8);
    let x: Vec<f32> = rng.floats(k, 3.0).iter().map(|v| v.abs() + 0.5).collect();
    let nibbles = rng.bytes(n * k / 2);
    let scales: Vec<f32> = rng
        .floats(n * k / group, 0.02)
        .iter()
        .map(|v| v.abs() + 0.001)
        .collect();
    let biases: Vec<f32> = scales.iter().map(|s| -8.0 * s).collect();
    let mut t = T::default();
    let xi = t.input_f(&[1, k], &x);
    let w = t.constant(DType::U8, &[n, k / 2], nibbles.clone());
    let sc = t.const_f(&[n, k / group], &scales);
    let bi = t.const_f(&[n, k / group], &biases);
    let y = t.op(
        OpKind::Linear {
            weight: Weight::Q4 { group },
            act_quant: pteria::ir::ActQuant::Torchao,
            has_bias: false,
        },
        vec![xi, w, sc, bi],
        DType::F32,
        &[1, n],
    );
    t.out(y);
    // The exact value in f64: x = s·(q - zp) by the reference's own quantization.
    let mut xq = x.clone();
    quant_dequant_row(&mut xq);
    let (mn, mx) = x
        .iter()
        .fold((0f32, 0f32), |(a, b), v| (a.min(*v), b.max(*v)));
    let s = ((mx - mn) / 255.0).max(f32::EPSILON) as f64;
    let want: Vec<f64> = (0..n)
        .map(|r| {
            (0..k)
                .map(|j| {
                    let q = ((nibbles[r * k / 2 + j / 2] >> ((j % 2) * 4)) & 0xf) as f64;
                    let qx = (xq[j] as f64 / s).round();
                    s * qx * scales[r * k / group + j / group] as f64 * (q - 8.0)
                })
                .sum()
        })
        .collect();
    let rel_l2 = |got: &[f32]| {
        let (mut d, mut w2) = (0f64, 0f64);
        for (g, w) in got.iter().zip(&want) {
            d += (*g as f64 - w).powi(2);
            w2 += w * w;
        }
        (d / w2).sqrt()
    };
    for (name, c) in [("", ctx()), (" (no subgroups)", no_subgroup_ctx())] {
        let Some(c) = c else { continue };
        let mut gpu = GpuExecutor::new(c, t.g.clone()).unwrap();
        let got = gpu.run(&values(&t.inputs)).unwrap()[0].to_f32().unwrap();
        let e = rel_l2(&got);
        assert!(
            e < 1e-7,
            "dq8 int4 decode linear{name}: rel-L2 {e:.2e} from exact"
        );
    }
}

/// By default quantized linears of 16-byte quads run as mat-vecs up to `QUAD_MATVEC_MAX_M` rows
/// of x (a whole E2B prompt), tiled past them, matching the CPU either way.
#[test]
fn prompts_run_their_linears_as_mat_vecs_up_to_the_default_rows() {
    let max = pteria::gpu::QUAD_MATVEC_MAX_M;
    let Some(ctx) = open(ContextOptions {
        quad_matvec_rows: Some(max),
        ..Default::default()
    }) else {
        return;
    };
    let mut rng = Rng::new(71);
    // A prompt's mat-vec takes several rows of x a workgroup (`matvec_rows`).
    for (m, entry) in [(max, "linear:matvec_rows"), (max + 1, "linear:tiled")] {
        let t = linear_graph(
            &mut rng,
            Weight::Q4 { group: 128 },
            m,
            256,
            40,
            false,
            pteria::ir::ActQuant::Torchao,
        );
        let gpu = check_on(ctx.clone(), &format!("{m} rows"), &t, TOL, 0.05);
        assert!(
            gpu.last_entries().iter().any(|e| e == entry),
            "{m} rows: {:?}",
            gpu.last_entries()
        );
    }
}

#[test]
fn linear_at_gemma_e2b_sizes_matches_cpu() {
    let mut rng = Rng::new(6);
    // Decode (M = 1, 2) picks teams of 16 or 32 lanes here; M = 9 takes the tiled kernel.
    for (w, m, k, n) in [
        (Weight::F32, 1, 1536, 6144),
        (Weight::Q4 { group: 32 }, 1, 1536, 6144),
        (Weight::Q4 { group: 128 }, 2, 1536, 2048),
        (Weight::Q4 { group: 128 }, 1, 12288, 1536),
        (Weight::Q4 { group: 32 }, 9, 1536, 6144),
        (Weight::Q8 { group: 128 }, 1, 1536, 6144),
        (Weight::Q8 { group: 32 }, 1, 6144, 1539),
        // A long row: one act_quant_packed workgroup walks 20 words an invocation.
        (Weight::Q4 { group: 128 }, 1, 20480, 256),
    ] {
        let t = linear_graph(&mut rng, w, m, k, n, false, pteria::ir::ActQuant::None);
        check_both(&format!("linear {w:?} {m}x{k}->{n}"), &t, TOL, 0.05);
        let t = linear_graph(&mut rng, w, m, k, n, false, pteria::ir::ActQuant::Torchao);
        check_both(&format!("linear {w:?} {m}x{k}->{n} dq8"), &t, TOL, 0.05);
    }
}

#[test]
fn weights_past_the_binding_limit_are_split_by_rows() {
    let Some(ctx) = small_binding_ctx() else {
        return;
    };
    let mut rng = Rng::new(7);
    // f32 300x100 = 117 KiB, Q8 700x128 = 87 KiB, Q4 1500x128 = 94 KiB: all past 64 KiB.
    for (w, m, k, n) in [
        (Weight::F32, 1, 100, 300),
        (Weight::F32, 12, 100, 300),
        (Weight::Q8 { group: 32 }, 1, 128, 700),
        (Weight::Q4 { group: 32 }, 1, 128, 1500),
        (Weight::Q4 { group: 32 }, 10, 128, 1500),
    ] {
        let t = linear_graph(&mut rng, w, m, k, n, true, pteria::ir::ActQuant::None);
        check_on(
            ctx.clone(),
            &format!("split linear {w:?} {m}x{k}->{n}"),
            &t,
            TOL,
            0.05,
        );
    }
    // A tied table: one embedding and the logits linear read the same split constant.
    for w in [
        Weight::F32,
        Weight::Q4 { group: 32 },
        Weight::Q8 { group: 64 },
    ] {
        let (rows, cols) = (1000, 128);
        let mut t = T::default();
        let ids = t.input_i(&[2, 3], &[0, 999, 500, 1, 998, 250]);
        let mut ins = quant_weight(&mut t, &mut rng, w, rows, cols);
        let tensors = ins.clone();
        ins.push(ids);
        let e = t.op(
            OpKind::Embedding { weight: w },
            ins,
            DType::F32,
            &[2, 3, cols],
        );
        let mut lin = vec![e];
        lin.extend(tensors);
        let y = t.op(
            OpKind::Linear {
                weight: w,
                act_quant: pteria::ir::ActQuant::None,
                has_bias: false,
            },
            lin,
            DType::F32,
            &[2, 3, rows],
        );
        t.out(e);
        t.out(y);
        check_on(
            ctx.clone(),
            &format!("split tied embedding {w:?}"),
            &t,
            TOL,
            0.05,
        );
    }
}

/// Once uploaded, constants leave host memory: the executor's graph keeps their shapes, drops
/// their bytes (an owned buffer is freed), and later calls still match the CPU.
#[test]
fn constants_leave_host_memory_once_uploaded() {
    let mut rng = Rng::new(11);
    // Plain, and split by rows past a 64 KiB binding (uploaded piece by piece).
    for (ctx, n) in [(ctx(), 96), (small_binding_ctx(), 1500)] {
        let Some(ctx) = ctx else { return };
        let (k, w) = (128, Weight::Q4 { group: 32 });
        let mut t = linear_graph(&mut rng, w, 1, k, n, true, pteria::ir::ActQuant::None);
        // Every constant's bytes in one buffer this test can watch.
        let mut watched = Vec::new();
        for def in &mut t.g.tensors {
            if let Role::Constant(b) = &def.role {
                let bytes = Arc::new(Bytes::Owned(b.to_vec()));
                watched.push(Arc::downgrade(&bytes));
                def.role = Role::Constant(Blob::whole(bytes));
            }
        }
        assert_eq!(watched.len(), 4, "weight, scales, biases and bias");
        let vals = values(&t.inputs);
        let want = CpuExecutor::new(t.g.clone()).unwrap().run(&vals).unwrap();
        let mut gpu = GpuExecutor::new(ctx, t.g).unwrap();
        for (i, w) in watched.iter().enumerate() {
            assert!(
                w.upgrade().is_none(),
                "n={n}: constant {i} still held on the host"
            );
        }
        for def in &gpu.graph().tensors {
            if let Role::Constant(b) = &def.role {
                assert!(b.is_empty(), "n={n}: {} keeps {} bytes", def.name, b.len());
            }
        }
        for call in 0..2 {
            let got = gpu.run(&vals).unwrap();
            compare(&format!("n={n}, call {call}"), &got, &want, TOL, 0.05);
        }
    }
}

/// Embeddings with big tables are gathered on the host, their ids computed there from the
/// inputs, and their rows passed to the GPU: the same values as the CPU, on calls of different
/// lengths, with no table (or derived bias) on the GPU; a bad id is an error.
#[test]
fn big_tables_are_gathered_on_the_host() {
    use pteria::ir::BinaryOp;
    let Some(on_host) = open(ContextOptions {
        host_gather_min_bytes: Some(1),
        ..Default::default()
    }) else {
        return;
    };
    let Some(on_gpu) = ctx() else { return };
    let mut rng = Rng::new(23);
    let (rows, cols) = (300, 64);
    let build = |rng: &mut Rng, ids: &[i64]| {
        let mut t = T::default();
        let x = t.input(DType::I64, &[1, 64], &[1, ids.len()], i64_bytes(ids));
        // A 4-bit table whose biases are made from its scales, as the Vulkan front end's are.
        let q = symmetric_q4(&mut t, rng, rows, cols, 32, 0);
        let Role::Constant(scales) = t.g.tensors[q[1]].role.clone() else {
            unreachable!()
        };
        let bias = Blob::neg8(scales);
        t.g.tensors[q[2]].role = Role::Constant(bias.clone());
        let e1 = t.op(
            OpKind::Embedding {
                weight: Weight::Q4 { group: 32 },
            },
            vec![q[0], q[1], q[2], x],
            DType::F32,
            &[1, 64, cols],
        );
        // An f32 table read at ids the host computes first (ids - 1).
        let shifted = t.op(
            OpKind::BinaryScalar {
                op: BinaryOp::Sub,
                scalar: 1.0,
                scalar_first: false,
            },
            vec![x],
            DType::I64,
            &[1, 64],
        );
        let table = t.const_f(&[rows, cols], &rng.floats(rows * cols, 1.0));
        let e2 = t.op(
            OpKind::Embedding {
                weight: Weight::F32,
            },
            vec![table, shifted],
            DType::F32,
            &[1, 64, cols],
        );
        let sum = t.op(
            OpKind::Binary(BinaryOp::Add),
            vec![e1, e2],
            DType::F32,
            &[1, 64, cols],
        );
        t.out(sum);
        t.out(e1);
        // 8-bit groups, and 4-bit groups of one (odd: two groups share a byte), stored biases.
        for w in [Weight::Q8 { group: 16 }, Weight::Q4 { group: 1 }] {
            let mut ins = quant_weight(&mut t, rng, w, rows, cols);
            ins.push(x);
            let e = t.op(
                OpKind::Embedding { weight: w },
                ins,
                DType::F32,
                &[1, 64, cols],
            );
            t.out(e);
        }
        (t, bias)
    };
    let (t, bias) = build(&mut rng, &[5, 299, 1]);
    let mut gpu = GpuExecutor::new(on_host.clone(), t.g.clone()).unwrap();
    let vals = values(&t.inputs);
    let got = gpu.run(&vals).unwrap();
    assert!(!bias.is_made(), "the host forms the biases from the scales");
    let want = CpuExecutor::new(t.g.clone()).unwrap().run(&vals).unwrap();
    compare("host gathers", &got, &want, TOL, 0.05);
    // Both tables stay on the host, and the ids' op runs there only.
    assert_eq!(gpu.memory().constants, 0, "tables left on the host");
    assert_eq!(gpu.stats().last_dispatches, 1, "the add alone");
    assert_eq!(got.len(), 4);
    let full = GpuExecutor::new(on_gpu, t.g.clone()).unwrap();
    assert!(full.memory().constants > 0);
    // Another length (40 rows: gathered on several threads where there are cores), then a bad
    // id (the table has 300 rows).
    let longer: Vec<i64> = (0..40).map(|i| 1 + i * 7).collect();
    let longer_bytes = i64_bytes(&longer);
    let vals = [InputValue::Tensor {
        shape: vec![1, 40],
        data: &longer_bytes,
    }];
    let got = gpu.run(&vals).unwrap();
    let want = CpuExecutor::new(t.g.clone()).unwrap().run(&vals).unwrap();
    compare("host gathers, 40 ids", &got, &want, TOL, 0.05);
    let bad = i64_bytes(&[3, 300]);
    let err = gpu
        .run(&[InputValue::Tensor {
            shape: vec![1, 2],
            data: &bad,
        }])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("token id 300 outside the 300-row table"),
        "{err}"
    );
}

#[test]
fn a_tensor_too_large_to_bind_is_reported() {
    let Some(ctx) = small_binding_ctx() else {
        return;
    };
    let mut t = T::default();
    let x = t.input_f(&[200, 100], &[0.0; 20000]);
    let y = t.op(OpKind::Softmax, vec![x], DType::F32, &[200, 100]);
    t.out(y);
    match GpuExecutor::new(ctx, t.g) {
        Err(GpuError::Unsupported(why)) => {
            assert!(why.iter().any(|w| w.contains("storage binding")), "{why:?}")
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("an 80 KB activation should not fit a 64 KiB binding"),
    }
}

#[test]
fn matmul_with_broadcast_batches_matches_cpu() {
    let mut rng = Rng::new(8);
    for (a, b, o) in [
        (vec![2, 3, 37, 19], vec![19, 23], vec![2, 3, 37, 23]),
        (vec![1, 3, 5, 70], vec![2, 1, 70, 66], vec![2, 3, 5, 66]),
        (vec![1, 65], vec![65, 130], vec![1, 130]),
        // Decode attention: one query row per head against a shared cache (few-rows kernel).
        (vec![1, 8, 1, 256], vec![1, 1, 256, 203], vec![1, 8, 1, 203]),
        // E2B's decode p·V (K = the 1024-row cache) and a K that no step count divides.
        (vec![8, 1, 1024], vec![1, 1024, 512], vec![8, 1, 512]),
        (vec![3, 2, 1001], vec![1, 1001, 17], vec![3, 2, 17]),
        (vec![1, 3, 4, 70], vec![2, 1, 70, 66], vec![2, 3, 4, 66]),
        (vec![2, 1, 33], vec![2, 33, 130], vec![2, 1, 130]),
    ] {
        // b as given, and stored transposed ([.., N, K]) for `transpose_b`.
        for transpose_b in [false, true] {
            let mut b = b.clone();
            let r = b.len();
            if transpose_b {
                b.swap(r - 2, r - 1);
            }
            let mut t = T::default();
            let an: usize = a.iter().product();
            let bn: usize = b.iter().product();
            let x = t.input_f(&a, &rng.floats(an, 1.0));
            let y = t.input_f(&b, &rng.floats(bn, 1.0));
            let z = t.op(OpKind::MatMul { transpose_b }, vec![x, y], DType::F32, &o);
            t.out(z);
            check(
                &format!("matmul {a:?} x {b:?} (bt {transpose_b})"),
                &t,
                TOL,
                0.05,
            );
        }
    }
}

#[test]
fn embedding_variants_match_cpu() {
    let mut rng = Rng::new(9);
    for w in [
        Weight::F32,
        Weight::Q4 { group: 32 },
        Weight::Q4 { group: 128 },
        Weight::Q8 { group: 32 },
        Weight::Q8 { group: 128 },
    ] {
        let (rows, cols) = (300, 256);
        let mut t = T::default();
        let mut ins = quant_weight(&mut t, &mut rng, w, rows, cols);
        let ids = t.input_i(&[2, 5], &rng.ints(10, 0, 299));
        ins.push(ids);
        let e = t.op(
            OpKind::Embedding { weight: w },
            ins,
            DType::F32,
            &[2, 5, cols],
        );
        t.out(e);
        check(&format!("embedding {w:?}"), &t, TOL, 1e-3);
    }
}

#[test]
fn rope_styles_and_positions_match_cpu() {
    let mut rng = Rng::new(10);
    let (max_pos, rotary) = (40, 12);
    for style in [RopeStyle::Half, RopeStyle::Interleaved] {
        for (shape, seq_dim) in [(vec![1, 5, 3, 16], 1), (vec![2, 3, 4, 12], 2)] {
            let mut t = T::default();
            let n: usize = shape.iter().product();
            let x = t.input_f(&shape, &rng.floats(n, 2.0));
            let cos = t.const_f(
                &[max_pos, rotary / 2],
                &rng.floats(max_pos * rotary / 2, 1.0),
            );
            let sin = t.const_f(
                &[max_pos, rotary / 2],
                &rng.floats(max_pos * rotary / 2, 1.0),
            );
            let start = t.sym("start", 7);
            let kind = OpKind::Rope {
                style,
                rotary,
                seq_dim,
                start: Int::Sym(start),
            };
            let y = t.op(kind, vec![x, cos, sin], DType::F32, &shape);
            t.out(y);
            check(&format!("rope {style:?} {shape:?}"), &t, TOL, 1e-3);
        }
    }
}

/// q/k norms then RoPE fused into one op (`fuse_norm_ropes`): both styles, weighted or not,
/// rows of 16-byte words (E2B's 256) and odd rows, a dynamic start: the GPU matches the CPU with
/// and without the pass.
#[test]
fn norm_then_rope_matches_cpu_fused() {
    let mut rng = Rng::new(27);
    let max_pos = 40;
    for style in [RopeStyle::Half, RopeStyle::Interleaved] {
        for (shape, seq_dim, rotary, weighted) in [
            (vec![1, 8, 3, 256], 2, 256, true),
            (vec![1, 3, 2, 10], 1, 8, false),
            (vec![1, 1, 2, 512], 2, 512, true),
        ] {
            let mut t = T::default();
            let n: usize = shape.iter().product();
            let d = shape[3];
            let x = t.input_f(&shape, &rng.floats(n, 2.0));
            let half = rotary / 2;
            let cos = t.const_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
            let sin = t.const_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
            let start = t.sym("start", 7);
            let mut ins = vec![x];
            if weighted {
                ins.push(t.const_f(&[d], &rng.floats(d, 1.5)));
            }
            let normed = t.op(OpKind::RmsNorm { eps: 1e-6 }, ins, DType::F32, &shape);
            let kind = OpKind::Rope {
                style,
                rotary,
                seq_dim,
                start: Int::Sym(start),
            };
            let y = t.op(kind, vec![normed, cos, sin], DType::F32, &shape);
            t.out(y);
            let what = format!("norm + rope {style:?} {shape:?}");
            check(&format!("{what}, unfused"), &t, TOL, 1e-3);
            assert_eq!(pteria::ir::passes::fuse_norm_ropes(&mut t.g), 1, "{what}");
            check_both(&format!("{what}, fused"), &t, TOL, 1e-3);
        }
    }
}

struct AttnCase {
    layout: AttnLayout,
    b: usize,
    s: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    cache: usize,
    start: i64,
    causal: bool,
    window: Option<usize>,
    softcap: Option<f32>,
    mask: bool,
    /// Every cache row is a key, the mask (rank 4) hiding those past each query's position and,
    /// when there are several queries, all of the last query's.
    all_rows: bool,
    /// Run by matmuls: whether q·Kᵀ and p·V split their K over workgroups (few 64x64 tiles, a
    /// K of 8 or more 16-deep slices, room in split's scratch: src/gpu/ops.rs `k_splits`).
    score_parts: bool,
    pv_parts: bool,
}

fn attn_shape(layout: AttnLayout, b: usize, s: usize, h: usize, d: usize) -> Vec<usize> {
    match layout {
        AttnLayout::Bshd => vec![b, s, h, d],
        AttnLayout::Bhsd => vec![b, h, s, d],
    }
}

#[test]
fn sdpa_variants_match_cpu() {
    let mut rng = Rng::new(11);
    let base = AttnCase {
        layout: AttnLayout::Bshd,
        b: 1,
        s: 3,
        hq: 4,
        hkv: 2,
        d: 64,
        cache: 100,
        start: 70,
        causal: true,
        window: None,
        softcap: None,
        mask: false,
        all_rows: false,
        score_parts: false,
        pv_parts: false,
    };
    let cases = [
        AttnCase { ..base },
        // Gemma 4 E2B's decode over its largest cache (8 heads on one kv head, d 512).
        AttnCase {
            layout: AttnLayout::Bhsd,
            s: 1,
            hq: 8,
            hkv: 1,
            d: 512,
            cache: 1024,
            start: 700,
            causal: false,
            mask: true,
            all_rows: true,
            ..base
        },
        AttnCase {
            s: 2,
            start: 57,
            causal: false,
            mask: true,
            all_rows: true,
            softcap: Some(5.0),
            ..base
        },
        // A cache long enough that chunks take more keys (30000 rows: 32 each, 938 chunks).
        AttnCase {
            layout: AttnLayout::Bhsd,
            s: 1,
            hq: 8,
            hkv: 1,
            d: 64,
            cache: 30000,
            start: 29000,
            causal: false,
            mask: true,
            all_rows: true,
            ..base
        },
        // A prefill over every row: more queries than a 64-row matmul tile, as a tiled q·Kᵀ,
        // probabilities, p·V.
        AttnCase {
            layout: AttnLayout::Bhsd,
            s: 70,
            hq: 8,
            hkv: 1,
            d: 256,
            start: 20,
            causal: false,
            mask: true,
            all_rows: true,
            score_parts: true,
            ..base
        },
        AttnCase {
            layout: AttnLayout::Bhsd,
            s: 7,
            start: 40,
            window: Some(30),
            mask: true,
            all_rows: true,
            ..base
        },
        AttnCase {
            layout: AttnLayout::Bhsd,
            ..base
        },
        AttnCase {
            causal: false,
            b: 2,
            d: 80,
            ..base
        },
        AttnCase {
            window: Some(9),
            ..base
        },
        AttnCase {
            window: Some(20),
            causal: false,
            s: 5,
            start: 10,
            ..base
        },
        AttnCase {
            softcap: Some(5.0),
            mask: true,
            layout: AttnLayout::Bhsd,
            ..base
        },
        AttnCase {
            s: 1,
            start: 0,
            hkv: 1,
            d: 33,
            ..base
        },
        AttnCase {
            s: 17,
            start: 0,
            cache: 17,
            hkv: 4,
            mask: true,
            causal: false,
            ..base
        },
        AttnCase {
            s: 1,
            start: 99,
            d: 256,
            ..base
        },
        // Prefills bounded by their start (a front end's custom sdpa): tiled matmuls that skip
        // the tiles past each tile's last query, more queries than one 64-row tile.
        AttnCase {
            s: 100,
            start: 30,
            cache: 200,
            hq: 8,
            hkv: 1,
            d: 256,
            softcap: Some(30.0),
            score_parts: true,
            pv_parts: true,
            ..base
        },
        AttnCase {
            s: 70,
            start: 0,
            cache: 150,
            window: Some(32),
            pv_parts: true,
            ..base
        },
        AttnCase {
            layout: AttnLayout::Bhsd,
            s: 66,
            start: 5,
            cache: 80,
            d: 80,
            ..base
        },
        // Scores of 256 KiB: past a 64 KiB binding, where each query walks the cache instead.
        AttnCase {
            s: 64,
            start: 0,
            cache: 64,
            hq: 16,
            d: 8,
            ..base
        },
        // A chat turn: as many queries as split takes, after an earlier turn's keys, at
        // E2B's full and sliding layers' shapes; one query more takes the matmuls.
        AttnCase {
            s: SPLIT_MAX_S,
            hq: 8,
            hkv: 1,
            d: 512,
            cache: 1024,
            start: 480,
            ..base
        },
        AttnCase {
            s: SPLIT_MAX_S + 1,
            hq: 8,
            hkv: 1,
            d: 256,
            cache: 1024,
            start: 900,
            window: Some(512),
            score_parts: true,
            pv_parts: true,
            ..base
        },
        // Split's scratch (7 chunks of 66 floats a query and head) passes a 64 KiB binding from
        // 9 queries: there the matmuls take these 20.
        AttnCase {
            s: 20,
            start: 30,
            ..base
        },
    ];
    for c in cases {
        let mut t = T::default();
        let qs = attn_shape(c.layout, c.b, c.s, c.hq, c.d);
        let ks = attn_shape(c.layout, c.b, c.cache, c.hkv, c.d);
        let qn: usize = qs.iter().product();
        let kn: usize = ks.iter().product();
        let (mut kd, mut vd) = (rng.floats(kn, 1.0), rng.floats(kn, 1.0));
        // Attention bounded by its start sees no cache row past start + s: NaN there must not
        // reach the output. Only where the device keeps NaN through arithmetic, which Vulkan
        // does not require: lavapipe passes with p·V reading those rows.
        let end = c.start as usize + c.s;
        if !c.all_rows && end < c.cache {
            for (i, (x, y)) in kd.iter_mut().zip(vd.iter_mut()).enumerate() {
                let row = match c.layout {
                    AttnLayout::Bshd => i / (c.hkv * c.d) % c.cache,
                    AttnLayout::Bhsd => i / c.d % c.cache,
                };
                if row >= end {
                    (*x, *y) = (f32::NAN, f32::NAN);
                }
            }
        }
        let q = t.input_f(&qs, &rng.floats(qn, 1.0));
        let k = t.input_f(&ks, &kd);
        let v = t.input_f(&ks, &vd);
        let start = t.sym("start", c.start);
        let mut ins = vec![q, k, v];
        if c.mask && c.all_rows {
            let mut m = rng.floats(c.s * c.cache, 2.0);
            for (i, row) in m.chunks_mut(c.cache).enumerate() {
                let hidden = c.s > 1 && i + 1 == c.s;
                for (j, x) in row.iter_mut().enumerate() {
                    if hidden || j as i64 > c.start + i as i64 {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
            ins.push(t.input_f(&[1, 1, c.s, c.cache], &m));
        } else if c.mask {
            let kv = c.start as usize + c.s;
            let mut m = rng.floats(c.s * (kv + 2), 2.0);
            m[1] = f32::NEG_INFINITY;
            ins.push(t.input_f(&[c.s, kv + 2], &m));
        }
        let kind = OpKind::Sdpa {
            layout: c.layout,
            scale: 1.0 / (c.d as f32).sqrt(),
            causal: c.causal,
            window: c.window,
            softcap: c.softcap,
            start: Int::Sym(start),
            all_rows: c.all_rows,
        };
        let y = t.op(kind, ins, DType::F32, &qs);
        t.out(y);
        let what = format!(
            "sdpa {:?} b={} s={} hq={} hkv={} d={} start={} causal={} window={:?} softcap={:?} mask={} all_rows={}",
            c.layout, c.b, c.s, c.hq, c.hkv, c.d, c.start, c.causal, c.window, c.softcap, c.mask, c.all_rows
        );
        let Some(ctx) = ctx() else { continue };
        let gpu = check_on(ctx, &what, &t, TOL, 1e-2);
        // Decode and a chat turn's few queries split the keys (split, combine); more run as
        // matmul, probs, matmul.
        let split_max = if c.all_rows {
            SPLIT_MAX_S_ALL_ROWS
        } else {
            SPLIT_MAX_S
        };
        if c.s <= split_max {
            assert_eq!(gpu.stats().last_dispatches, 2, "{what}");
        } else {
            let tiled = |split| if split { "matmul:parts" } else { "matmul:main" };
            let mut want = vec![tiled(c.score_parts), "sdpa:probs", tiled(c.pv_parts)];
            if c.pv_parts {
                want.push("matmul:ksum");
            }
            assert_eq!(gpu.last_entries(), want, "{what}");
        }
        // Past a 64 KiB binding: split's scratch keeps more than 4 queries from splitting, and
        // scores larger than it take `main`, one dispatch.
        let small = 64 << 10;
        if c.s > 4 && 4 * qn.max(kn) <= small {
            let Some(ctx) = small_binding_ctx() else {
                continue;
            };
            let gpu = check_on(ctx, &what, &t, TOL, 1e-2);
            // Chunks of 16 keys, each a max, a sum and a row of d.
            let split_bytes = 4 * c.b * c.hq * c.s * c.cache.div_ceil(16) * (c.d + 2);
            let want = if c.s <= split_max && split_bytes <= small {
                2
            } else if 4 * c.b * c.hq * c.s * c.cache <= small {
                3
            } else {
                1
            };
            assert_eq!(gpu.stats().last_dispatches, want, "{what}, 64 KiB binding");
        }
    }
}

/// A select by a literal index of a dim after size-1 dims (the per-layer input's select) is read
/// in place, from an offset into its input, where that offset suits the device's binding
/// alignment: no dispatch, the CPU's values. An unaligned one, or one past a dim of more than
/// one, is copied as before.
#[test]
fn contiguous_selects_are_read_in_place() {
    let Some(c) = ctx() else { return };
    let align = c.limits().min_storage_buffer_offset_alignment as usize;
    let mut rng = Rng::new(31);
    // (input shape, dim, index, whether a view)
    let row = align.max(4);
    let cases = [
        (vec![3, row], 0, 1i64, true),
        (vec![3, row], 0, -1, true),
        (vec![1, 4, 1, row], 1, 2, true),
        (vec![3, row + 1], 0, 1, false),
        (vec![2, 3, row], 1, 1, false),
        (vec![3, row], 0, 0, true),
    ];
    for (xs, dim, index, view) in cases {
        let mut t = T::default();
        let n: usize = xs.iter().product();
        let x = t.input_f(&xs, &rng.floats(n, 1.0));
        // Activations on both sides, as in a model.
        let a = t.op(OpKind::Unary(UnaryOp::Neg), vec![x], DType::F32, &xs);
        let mut os = xs.clone();
        os.remove(dim);
        let s = t.op(
            OpKind::Select {
                dim,
                index: Int::Lit(index),
            },
            vec![a],
            DType::F32,
            &os,
        );
        let y = t.op(OpKind::Unary(UnaryOp::Exp), vec![s], DType::F32, &os);
        t.out(y);
        let what = format!("select {index} of dim {dim} of {xs:?}");
        let gpu = check_on(c.clone(), &what, &t, TOL, 1e-3);
        let want = if view { 2 } else { 3 };
        assert_eq!(gpu.stats().last_dispatches, want, "{what}");
    }
}

#[test]
fn layout_ops_match_cpu() {
    let mut rng = Rng::new(12);
    let mut t = T::default();
    let xs = [3, 5, 7];
    let x = t.input_f(&xs, &rng.floats(105, 1.0));
    let xi = t.input_i(&[4, 6], &rng.ints(24, -50, 50));
    let ids = t.input_i(&[4], &[2, 0, 2, 1]);
    let s = t.sym("s", 1);
    let neg = t.sym("neg", -2);
    let p = t.op(
        OpKind::Permute {
            perm: vec![2, 0, 1],
        },
        vec![x],
        DType::F32,
        &[7, 3, 5],
    );
    let sl = t.op(
        OpKind::Slice {
            dim: 1,
            start: Int::Sym(s),
            end: Int::Lit(5),
            step: 2,
        },
        vec![x],
        DType::F32,
        &[3, 2, 7],
    );
    let sl2 = t.op(
        OpKind::Slice {
            dim: 2,
            start: Int::Lit(-3),
            end: Int::Lit(100),
            step: 1,
        },
        vec![x],
        DType::F32,
        &[3, 5, 3],
    );
    let se = t.op(
        OpKind::Select {
            dim: 1,
            index: Int::Sym(neg),
        },
        vec![x],
        DType::F32,
        &[3, 7],
    );
    let se2 = t.op(
        OpKind::Select {
            dim: 0,
            index: Int::Lit(2),
        },
        vec![xi],
        DType::I64,
        &[6],
    );
    let cc = t.op(
        OpKind::Concat { dim: 1 },
        vec![x, sl, x],
        DType::F32,
        &[3, 12, 7],
    );
    let ex = t.op(
        OpKind::Expand {
            shape: vec![Int::Lit(2), Int::Lit(4), Int::Lit(6)],
        },
        vec![xi],
        DType::I64,
        &[2, 4, 6],
    );
    let is = t.op(
        OpKind::IndexSelect { dim: 0 },
        vec![x, ids],
        DType::F32,
        &[4, 5, 7],
    );
    let is2 = t.op(
        OpKind::IndexSelect { dim: 1 },
        vec![xi, ids],
        DType::I64,
        &[4, 4],
    );
    let cp = t.op(OpKind::Copy, vec![xi], DType::F32, &[4, 6]);
    let cb = t.op(OpKind::Copy, vec![x], DType::Bool, &[3, 5, 7]);
    let fl = t.op(
        OpKind::Full {
            value: 2.5,
            shape: vec![Int::Lit(3), Int::Sym(s)],
        },
        vec![],
        DType::F32,
        &[3, 4],
    );
    let fi = t.op(
        OpKind::Full {
            value: -3.0,
            shape: vec![Int::Lit(5)],
        },
        vec![],
        DType::I32,
        &[5],
    );
    let ar = t.op(
        OpKind::Arange {
            start: Int::Sym(neg),
            end: Int::Lit(9),
            step: 3,
        },
        vec![],
        DType::I64,
        &[4],
    );
    let arf = t.op(
        OpKind::Arange {
            start: Int::Lit(1),
            end: Int::Lit(6),
            step: 1,
        },
        vec![],
        DType::F32,
        &[5],
    );
    let rs = t.op(
        OpKind::Reshape {
            shape: vec![Int::Lit(-1), Int::Lit(7)],
        },
        vec![p],
        DType::F32,
        &[15, 7],
    );
    let after = t.op(OpKind::Unary(UnaryOp::Neg), vec![rs], DType::F32, &[15, 7]);
    for o in [
        p, sl, sl2, se, se2, cc, ex, is, is2, cp, cb, fl, fi, ar, arf, rs, after,
    ] {
        t.out(o);
    }
    check("layout", &t, 0.0, 0.0);
}

/// One attention layer's decode path: k/v written into State caches at `start`, then attention
/// over the first `start + S` rows. Returns the graph and its caches.
/// Per-layer copies of one RoPE table chain (cast, reshape, mul by equal frequency constants,
/// concat, cos) and a cache read after each layer's write: deduplicating the constants and
/// merging the common ops leaves one chain, and the GPU gives the same bytes as without.
#[test]
fn merged_common_ops_give_the_same_results_on_the_gpu() {
    let Some(ctx) = ctx() else { return };
    let (s, h) = (3usize, 5usize);
    let mut t = T::default();
    let pos = t.input_i(&[s], &[9, 10, 11]);
    let mut rng = Rng::new(21);
    let x = t.input_f(&[s, 2 * h], &rng.floats(s * 2 * h, 1.0));
    let cache =
        t.g.add_tensor("cache", DType::F32, vec![s, 2 * h], Role::State(None));
    let freq: Vec<f32> = (0..h).map(|k| 0.7f32.powi(k as i32)).collect();
    let mut run = x;
    for _ in 0..3 {
        let f = t.const_f(&[h], &freq);
        let c = t.op(OpKind::Cast, vec![pos], DType::F32, &[s]);
        let shape = vec![Int::Lit(s as i64), Int::Lit(1)];
        let r = t.op(OpKind::Reshape { shape }, vec![c], DType::F32, &[s, 1]);
        let m = t.op(
            OpKind::Binary(BinaryOp::Mul),
            vec![r, f],
            DType::F32,
            &[s, h],
        );
        let cat = t.op(
            OpKind::Concat { dim: 1 },
            vec![m, m],
            DType::F32,
            &[s, 2 * h],
        );
        let cos = t.op(
            OpKind::Unary(UnaryOp::Cos),
            vec![cat],
            DType::F32,
            &[s, 2 * h],
        );
        run = t.op(
            OpKind::Binary(BinaryOp::Mul),
            vec![run, cos],
            DType::F32,
            &[s, 2 * h],
        );
        let update = OpKind::CacheUpdate {
            axis: 0,
            start: Int::Lit(0),
        };
        t.op(update, vec![cache, run], DType::F32, &[s, 2 * h]);
        let back = t.op(
            OpKind::Unary(UnaryOp::Neg),
            vec![cache],
            DType::F32,
            &[s, 2 * h],
        );
        t.out(back);
    }
    t.out(run);
    let mut merged = t.g.clone();
    assert_eq!(pteria::ir::passes::dedupe_constants(&mut merged), 2);
    assert_eq!(pteria::ir::passes::merge_common_ops(&mut merged), 10);
    let vals = values(&t.inputs);
    let want = check_on(ctx.clone(), "common ops, unmerged", &t, TOL, 1e-3).run(&vals);
    let mut gpu = GpuExecutor::new(ctx, merged).unwrap();
    let got = gpu.run(&vals).unwrap();
    let want = want.unwrap();
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.data, b.data, "output {k}");
    }
}

/// RoPE as the Vulkan export decomposes it (cos/sin of concat(pos * freq, pos * freq), then
/// `x * cos + concat(-x[.., h:], x[.., :h]) * sin`), at a dynamic sequence length below its
/// bound: fused into one `Rope` it matches the CPU as the unfused chain does.
#[test]
fn fused_rotate_half_matches_the_unfused_chain_on_the_gpu() {
    let mut rng = Rng::new(22);
    for (heads, d) in [(8usize, 256usize), (1, 512), (3, 6)] {
        let (s_max, s) = (5usize, 3usize);
        let h = d / 2;
        let mut t = T::default();
        let pos = t.input(DType::I64, &[s_max], &[s], i64_bytes(&[7, 8, 300]));
        let xv = rng.floats(heads * s * d, 2.0);
        let x = t.input(
            DType::F32,
            &[1, heads, s_max, d],
            &[1, heads, s, d],
            f32_bytes(&xv),
        );
        let len = t.g.add_sym("S");
        t.g.nodes.push(Node::Sym(SymOp::Size {
            out: len,
            tensor: pos,
            dim: 0,
        }));
        let (sl, l) = (Int::Sym(len), Int::Lit(1));
        let freq: Vec<f32> = (0..h).map(|k| 0.9f32.powi(k as i32)).collect();
        let freq = t.const_f(&[h], &freq);
        let c = t.op(OpKind::Cast, vec![pos], DType::F32, &[s_max]);
        let shape = vec![sl, l];
        let r = t.op(OpKind::Reshape { shape }, vec![c], DType::F32, &[s_max, 1]);
        let m = t.op(
            OpKind::Binary(BinaryOp::Mul),
            vec![r, freq],
            DType::F32,
            &[s_max, h],
        );
        let cat = t.op(
            OpKind::Concat { dim: 1 },
            vec![m, m],
            DType::F32,
            &[s_max, d],
        );
        let mut tables = Vec::new();
        for u in [UnaryOp::Cos, UnaryOp::Sin] {
            let v = t.op(OpKind::Unary(u), vec![cat], DType::F32, &[s_max, d]);
            let shape = vec![l, l, sl, Int::Lit(d as i64)];
            tables.push(t.op(
                OpKind::Reshape { shape },
                vec![v],
                DType::F32,
                &[1, 1, s_max, d],
            ));
        }
        let (xs, hs) = ([1, heads, s_max, d], [1, heads, s_max, h]);
        let xc = t.op(
            OpKind::Binary(BinaryOp::Mul),
            vec![tables[0], x],
            DType::F32,
            &xs,
        );
        let slice = |t: &mut T, a: usize, b: i64| {
            let kind = OpKind::Slice {
                dim: 3,
                start: Int::Lit(a as i64),
                end: Int::Lit(b),
                step: 1,
            };
            t.op(kind, vec![x], DType::F32, &hs)
        };
        let lo = slice(&mut t, 0, h as i64);
        let hi = slice(&mut t, h, i64::MAX);
        let neg = t.op(OpKind::Unary(UnaryOp::Neg), vec![hi], DType::F32, &hs);
        let rot = t.op(OpKind::Concat { dim: 3 }, vec![neg, lo], DType::F32, &xs);
        let rs = t.op(
            OpKind::Binary(BinaryOp::Mul),
            vec![rot, tables[1]],
            DType::F32,
            &xs,
        );
        let out = t.op(OpKind::Binary(BinaryOp::Add), vec![xc, rs], DType::F32, &xs);
        t.out(out);
        let what = format!("rotate-half rope {heads}x{d}");
        check(&format!("{what}, unfused"), &t, TOL, 1e-3);
        assert_eq!(pteria::ir::passes::fuse_rotate_half(&mut t.g), 1, "{what}");
        pteria::ir::passes::eliminate_dead(&mut t.g);
        assert_eq!(t.g.ops().filter(|o| o.kind.name() == "layout").count(), 0);
        check(&format!("{what}, fused"), &t, TOL, 1e-3);
    }
}

/// Post-norm residual adds (norm → add residual → clamp; unweighted norm → · layer scalar
/// broadcast + residual; an operand broadcast over rows, on the left) fused into the norms
/// (`fuse_norm_chains`): the GPU matches the CPU with and without the pass, on rows of 16-byte
/// words and on odd rows.
#[test]
fn norms_with_their_chains_match_cpu() {
    let mut rng = Rng::new(26);
    for (rows, d) in [(3usize, 1536usize), (2, 37), (1, 256)] {
        let mut t = T::default();
        let f = DType::F32;
        let sh = [rows, d];
        let x = t.input_f(&sh, &rng.floats(rows * d, 3.0));
        let r = t.input_f(&sh, &rng.floats(rows * d, 2.0));
        let w = t.const_f(&[d], &rng.floats(d, 1.5));
        let scale = t.const_f(&[1], &[0.625]);
        let eps = 1e-6;
        let n1 = t.op(OpKind::RmsNorm { eps }, vec![x, w], f, &sh);
        let a1 = t.op(OpKind::Binary(BinaryOp::Add), vec![r, n1], f, &sh);
        let clamp = OpKind::Clamp {
            min: Some(-1.0),
            max: Some(1.25),
        };
        let c1 = t.op(clamp, vec![a1], f, &sh);
        let n2 = t.op(OpKind::RmsNorm { eps }, vec![c1], f, &sh);
        let m2 = t.op(OpKind::Binary(BinaryOp::Mul), vec![n2, scale], f, &sh);
        let a2 = t.op(OpKind::Binary(BinaryOp::Add), vec![m2, r], f, &sh);
        // An operand broadcast over the rows.
        let n3 = t.op(OpKind::RmsNorm { eps }, vec![a2, w], f, &sh);
        let a3 = t.op(OpKind::Binary(BinaryOp::Sub), vec![w, n3], f, &sh);
        t.out(a3);
        let what = format!("norm chains {rows}x{d}");
        // The residual add cancels: a last-bit difference in the norm's sum (tree vs sequential)
        // is measured against the output's scale.
        let floor = 1e-2;
        pteria::ir::passes::fuse_elementwise_chains(&mut t.g);
        check_both(&format!("{what}, unfused"), &t, TOL, floor);
        assert_eq!(pteria::ir::passes::fuse_norm_chains(&mut t.g), 3, "{what}");
        let Some(ctx) = ctx() else { return };
        let gpu = check_on(ctx, &format!("{what}, fused"), &t, TOL, floor);
        assert_eq!(gpu.stats().last_dispatches, 3, "{what}");
        if let Some(c) = no_subgroup_ctx() {
            check_on(c, &format!("{what}, fused (no subgroups)"), &t, TOL, floor);
        }
    }
}

/// Element-wise pairs of a decode layer (residual add + clamp, gelu · up, scores · scale +
/// mask broadcast over heads, a chain on the right of a subtraction, a chain at the step limit)
/// fused into chains: the GPU matches the CPU on sizes that are not multiples of the workgroup.
#[test]
fn elementwise_chains_match_cpu() {
    let mut rng = Rng::new(23);
    for (h, s) in [(7usize, 300usize), (1, 5)] {
        let mut t = T::default();
        let x = t.input_f(&[h, s], &rng.floats(h * s, 3.0));
        let r = t.input_f(&[h, s], &rng.floats(h * s, 2.0));
        let mask = t.input_f(&[s], &rng.floats(s, 4.0));
        let scale = t.const_f(&[], &[0.625]);
        let f = DType::F32;
        let sh = [h, s];
        let clamp = OpKind::Clamp {
            min: Some(-1.5),
            max: Some(2.0),
        };
        let add = t.op(OpKind::Binary(BinaryOp::Add), vec![x, r], f, &sh);
        let res = t.op(clamp, vec![add], f, &sh);
        let sub = t.op(OpKind::Binary(BinaryOp::Sub), vec![x, res], f, &sh);
        let gl = t.op(OpKind::Unary(UnaryOp::GeluTanh), vec![x], f, &sh);
        let gm = t.op(OpKind::Binary(BinaryOp::Mul), vec![gl, r], f, &sh);
        let sc = t.op(OpKind::Binary(BinaryOp::Mul), vec![x, scale], f, &sh);
        let masked = t.op(OpKind::Binary(BinaryOp::Add), vec![mask, sc], f, &sh);
        let mut v = t.op(OpKind::Binary(BinaryOp::Max), vec![gm, masked], f, &sh);
        for k in 0..6 {
            let kind = OpKind::BinaryScalar {
                op: if k % 3 == 0 {
                    BinaryOp::Div
                } else {
                    BinaryOp::Sub
                },
                scalar: 0.5 + k as f64,
                scalar_first: k % 2 == 1,
            };
            v = t.op(kind, vec![v], f, &sh);
        }
        t.out(sub);
        t.out(v);
        let what = format!("elementwise chains {h}x{s}");
        check(&format!("{what}, unfused"), &t, TOL, 1e-3);
        let ops = t.g.ops().count();
        let fused = pteria::ir::passes::fuse_elementwise_chains(&mut t.g);
        let labels: Vec<String> = t.g.ops().map(|o| o.kind.label()).collect();
        assert_eq!(ops - fused, 4, "{what}: {labels:?}");
        check_both(&format!("{what}, fused"), &t, TOL, 1e-3);
    }
}

/// A permute of a K/V projection that moves only its unit head dim ([1, S, 1, D] -> [1, 1, S, D],
/// S below its bound) becomes a reshape sharing its input's buffer: same results on the GPU.
#[test]
fn unit_permutes_as_reshapes_match_cpu() {
    let mut rng = Rng::new(24);
    let (s_max, s, d) = (6usize, 4usize, 12usize);
    let mut t = T::default();
    let x = t.input(
        DType::F32,
        &[1, s_max, 1, d],
        &[1, s, 1, d],
        f32_bytes(&rng.floats(s * d, 2.0)),
    );
    let e = t.op(
        OpKind::Unary(UnaryOp::Exp),
        vec![x],
        DType::F32,
        &[1, s_max, 1, d],
    );
    let perm = OpKind::Permute {
        perm: vec![0, 2, 1, 3],
    };
    let y = t.op(perm, vec![e], DType::F32, &[1, 1, s_max, d]);
    let z = t.op(
        OpKind::Unary(UnaryOp::Neg),
        vec![y],
        DType::F32,
        &[1, 1, s_max, d],
    );
    t.out(z);
    check("unit permute", &t, TOL, 1e-3);
    assert_eq!(pteria::ir::passes::unit_permutes_to_reshapes(&mut t.g), 1);
    check("unit permute as a reshape", &t, TOL, 1e-3);
}

/// A permute that moves only dims of size 1 in a call (a decode step's attention output,
/// [1, H, 1, D] -> [1, 1, H, D]) is skipped there and its readers read its input, which stays
/// live until they have (other ops allocate in between): the same results as the CPU at S = 1,
/// one dispatch fewer, and the copy still runs at S = 3. Read through a reshape, as attention
/// outputs are.
#[test]
fn permutes_that_are_views_in_a_call_are_skipped() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng::new(28);
    let (h, s_max, d) = (3usize, 6usize, 8usize);
    let mut t = T::default();
    let f = DType::F32;
    let x = t.input(f, &[1, h, s_max, d], &[1, h, 1, d], Vec::new());
    let r = t.input(f, &[1, s_max, h * d], &[1, 1, h * d], Vec::new());
    let len = t.g.add_sym("S");
    t.g.nodes.push(Node::Sym(SymOp::Size {
        out: len,
        tensor: x,
        dim: 2,
    }));
    let e = t.op(OpKind::Unary(UnaryOp::Exp), vec![x], f, &[1, h, s_max, d]);
    let perm = OpKind::Permute {
        perm: vec![0, 2, 1, 3],
    };
    let y = t.op(perm, vec![e], f, &[1, s_max, h, d]);
    // Read through a reshape (heads joined), as an attention output is.
    let shape = vec![Int::Lit(1), Int::Sym(len), Int::Lit((h * d) as i64)];
    let yr = t.op(OpKind::Reshape { shape }, vec![y], f, &[1, s_max, h * d]);
    // Tensors allocated while y is live, then two readers of it.
    let hd = [1, s_max, h * d];
    let a = t.op(OpKind::Unary(UnaryOp::Neg), vec![r], f, &hd);
    let b = t.op(OpKind::Unary(UnaryOp::Exp), vec![a], f, &hd);
    let z = t.op(OpKind::Binary(BinaryOp::Mul), vec![yr, b], f, &hd);
    let z2 = t.op(OpKind::Binary(BinaryOp::Add), vec![z, yr], f, &hd);
    t.out(z2);
    let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
    let mut gpu = GpuExecutor::new(ctx, t.g.clone()).unwrap();
    let mut dispatches = Vec::new();
    for s in [1usize, 3, 1] {
        t.inputs[0] = Val::Tensor(vec![1, h, s, d], f32_bytes(&rng.floats(h * s * d, 1.0)));
        t.inputs[1] = Val::Tensor(vec![1, s, h * d], f32_bytes(&rng.floats(h * s * d, 1.0)));
        let vals = values(&t.inputs);
        let what = format!("permute at S = {s}");
        compare(
            &what,
            &gpu.run(&vals).unwrap(),
            &cpu.run(&vals).unwrap(),
            TOL,
            1e-3,
        );
        dispatches.push(gpu.stats().last_dispatches);
    }
    assert_eq!(dispatches[0] + 1, dispatches[1], "{dispatches:?}");
    assert_eq!(dispatches[0], dispatches[2], "{dispatches:?}");
}

fn decode_graph(layout: AttnLayout, cache: usize, h: usize, d: usize, s_max: usize) -> T {
    let mut t = T::default();
    let xs = attn_shape(layout, 1, s_max, h, d);
    let n: usize = xs.iter().product();
    let q = t.input(DType::F32, &xs, &xs, vec![0; n * 4]);
    let k = t.input(DType::F32, &xs, &xs, vec![0; n * 4]);
    let v = t.input(DType::F32, &xs, &xs, vec![0; n * 4]);
    let start = t.sym("start", 0);
    let cs = attn_shape(layout, 1, cache, h, d);
    let kc =
        t.g.add_tensor("k_cache", DType::F32, cs.clone(), Role::State(None));
    let vc =
        t.g.add_tensor("v_cache", DType::F32, cs.clone(), Role::State(None));
    let axis = match layout {
        AttnLayout::Bshd => 1,
        AttnLayout::Bhsd => 2,
    };
    let ku = t.op(
        OpKind::CacheUpdate {
            axis,
            start: Int::Sym(start),
        },
        vec![kc, k],
        DType::F32,
        &cs,
    );
    let vu = t.op(
        OpKind::CacheUpdate {
            axis,
            start: Int::Sym(start),
        },
        vec![vc, v],
        DType::F32,
        &cs,
    );
    let kind = OpKind::Sdpa {
        layout,
        scale: 0.125,
        causal: true,
        window: None,
        softcap: None,
        start: Int::Sym(start),
        all_rows: false,
    };
    let o = t.op(kind, vec![q, ku, vu], DType::F32, &xs);
    t.out(o);
    t
}

fn set_step(
    t: &mut T,
    rng: &mut Rng,
    layout: AttnLayout,
    s: usize,
    h: usize,
    d: usize,
    start: i64,
) {
    let shape = attn_shape(layout, 1, s, h, d);
    for i in 0..3 {
        t.inputs[i] = Val::Tensor(shape.clone(), f32_bytes(&rng.floats(s * h * d, 1.0)));
    }
    t.inputs[3] = Val::Sym(start);
}

#[test]
fn decode_steps_replay_one_recording_and_keep_the_kv_cache() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng::new(13);
    for layout in [AttnLayout::Bshd, AttnLayout::Bhsd] {
        let (cache, h, d) = (40, 2, 32);
        let mut t = decode_graph(layout, cache, h, d, 8);
        let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
        let mut gpu = GpuExecutor::new(ctx.clone(), t.g.clone()).unwrap();
        // Prefill 7 positions, then 6 decode steps.
        let mut pos = 0;
        for (step, s) in [7usize, 1, 1, 1, 1, 1, 1].into_iter().enumerate() {
            set_step(&mut t, &mut rng, layout, s, h, d, pos);
            let vals = values(&t.inputs);
            let want = cpu.run(&vals).unwrap();
            let got = gpu.run(&vals).unwrap();
            compare(
                &format!("{layout:?} step {step} at {pos}"),
                &got,
                &want,
                TOL,
                1e-2,
            );
            pos += s as i64;
        }
        let st = gpu.stats();
        assert_eq!(
            st.recordings, 2,
            "{layout:?}: one recording for prefill, one for every decode step: {st:?}"
        );
        assert_eq!(st.replays, 5, "{layout:?}: {st:?}");
    }
}

/// Executors of one context share their input and activation buffers (a program's delegates
/// run one after another): two attention graphs with KV caches, called in turn, each still
/// match the CPU at every step, so neither's inputs, activations or cache leak into the other.
#[test]
fn executors_of_one_context_called_in_turn_keep_their_own_results() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng::new(29);
    let (cache, h, d) = (40, 2, 32);
    let layouts = [AttnLayout::Bshd, AttnLayout::Bhsd];
    let mut ts: Vec<T> = layouts
        .iter()
        .map(|&l| decode_graph(l, cache, h, d, 8))
        .collect();
    let mut cpus: Vec<CpuExecutor> = ts
        .iter()
        .map(|t| CpuExecutor::new(t.g.clone()).unwrap())
        .collect();
    let mut gpus: Vec<GpuExecutor> = ts
        .iter()
        .map(|t| GpuExecutor::new(ctx.clone(), t.g.clone()).unwrap())
        .collect();
    let mut pos = 0;
    for (step, s) in [7usize, 1, 1, 1].into_iter().enumerate() {
        for (k, &layout) in layouts.iter().enumerate() {
            set_step(&mut ts[k], &mut rng, layout, s, h, d, pos);
            let vals = values(&ts[k].inputs);
            let want = cpus[k].run(&vals).unwrap();
            let got = gpus[k].run(&vals).unwrap();
            compare(&format!("{layout:?} step {step}"), &got, &want, TOL, 1e-2);
        }
        pos += s as i64;
    }
}

/// `index_put`-style cache writes: rows go to the positions an index tensor names (scattered,
/// negative from the end), and the State keeps earlier calls' rows.
#[test]
fn indexed_cache_update_scatters_rows_and_keeps_the_cache() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng::new(21);
    let (cache, inner) = (10, 3);
    let mut t = T::default();
    let v = t.input(
        DType::F32,
        &[2, 4, inner],
        &[2, 1, inner],
        vec![0; 2 * inner * 4],
    );
    let idx = t.input(DType::I64, &[4], &[1], vec![0; 8]);
    let cs = [2, cache, inner];
    let c =
        t.g.add_tensor("cache", DType::F32, cs.to_vec(), Role::State(None));
    let u = t.op(
        OpKind::CacheUpdate {
            axis: 1,
            start: Int::Lit(0),
        },
        vec![c, v, idx],
        DType::F32,
        &cs,
    );
    t.out(u);
    let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
    let mut gpu = GpuExecutor::new(ctx, t.g.clone()).unwrap();
    for rows in [vec![3i64, 0, -1], vec![5], vec![7, 2, 9, -10]] {
        let s = rows.len();
        t.inputs[0] = Val::Tensor(
            vec![2, s, inner],
            f32_bytes(&rng.floats(2 * s * inner, 1.0)),
        );
        t.inputs[1] = Val::Tensor(vec![s], i64_bytes(&rows));
        let vals = values(&t.inputs);
        let want = cpu.run(&vals).unwrap();
        let got = gpu.run(&vals).unwrap();
        compare(&format!("rows {rows:?}"), &got, &want, 0.0, 0.0);
    }
    // A row outside the cache is an error on the reference.
    t.inputs[0] = Val::Tensor(vec![2, 1, inner], f32_bytes(&rng.floats(2 * inner, 1.0)));
    t.inputs[1] = Val::Tensor(vec![1], i64_bytes(&[10]));
    let err = cpu.run(&values(&t.inputs)).unwrap_err().to_string();
    assert!(err.contains("outside a cache of 10 rows"), "{err}");
}

/// Calls of a cache-writing graph at positions 0, 3, 4, 5 and 12 (1-3 rows; the last runs past a
/// 12-row cache), each on `on` and on `apart` and, where it fits, the CPU: the same bits on both
/// devices, `saved` dispatches fewer on `on`, and the CPU's values. `set(t, rows, at)` writes a
/// call's inputs.
#[allow(clippy::too_many_arguments)]
fn cache_calls(
    t: &mut T,
    on: &Arc<Context>,
    apart: &Arc<Context>,
    what: &str,
    saved: usize,
    cache: usize,
    mut set: impl FnMut(&mut T, usize, i64),
) {
    let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
    let mut gf = GpuExecutor::new(on.clone(), t.g.clone()).unwrap();
    let mut ga = GpuExecutor::new(apart.clone(), t.g.clone()).unwrap();
    for (n, at) in [(3usize, 0i64), (1, 3), (1, 4), (2, 5), (1, 12)] {
        set(t, n, at);
        let vals = values(&t.inputs);
        let what = format!("{what}, {n} rows at {at}");
        let (got, want) = (gf.run(&vals).unwrap(), ga.run(&vals).unwrap());
        assert!(got == want, "{what}: fused and apart differ");
        let (a, b) = (gf.stats().last_dispatches, ga.stats().last_dispatches);
        assert_eq!(a + saved, b, "{what}: {a} dispatches against {b}");
        match cpu.run(&vals) {
            Ok(reference) => compare(&what, &got, &reference, TOL, 1e-3),
            Err(e) => assert!(at + n as i64 > cache as i64, "{what}: {e}"),
        }
    }
}

/// An rms_norm whose rows only an update of an f32 KV cache reads stores them straight into the
/// cache (one dispatch fewer): call after call the cache holds the same bits as with the update
/// apart and matches the CPU, for indexed and start-position updates, plain and rotated norms,
/// two heads, prompt and decode rows, with and without subgroups. A row an index puts outside the
/// cache is not stored either way (the CPU reference reports it). An op reading the cache between
/// the norm and the update keeps them apart.
#[test]
fn norms_store_their_rows_into_the_kv_cache() {
    let pairs = fused_and_apart(ContextOptions {
        separate_cache_update: true,
        ..Default::default()
    });
    let mut rng = Rng::new(29);
    let (h, d, cache, max_t, max_pos) = (2usize, 16usize, 12usize, 4usize, 16usize);
    let f = DType::F32;
    for indexed in [true, false] {
        for rope in [false, true] {
            for peek in [false, true] {
                let mut t = T::default();
                let xs = [1, h, max_t, d];
                let x = t.input(f, &xs, &xs, vec![0; 4 * h * max_t * d]);
                let idx = t.input(DType::I64, &[max_t], &[max_t], vec![0; 8 * max_t]);
                let start = t.sym("start", 0);
                let w = t.const_f(&[d], &rng.floats(d, 1.5));
                let normed = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![x, w], f, &xs);
                let rows = if rope {
                    let half = d / 2;
                    let cos = t.const_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
                    let sin = t.const_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
                    let kind = OpKind::Rope {
                        style: RopeStyle::Half,
                        rotary: d,
                        seq_dim: 2,
                        start: Int::Sym(start),
                    };
                    t.op(kind, vec![normed, cos, sin], f, &xs)
                } else {
                    normed
                };
                let cs = [1, h, cache, d];
                let c = t.g.add_tensor("cache", f, cs.to_vec(), Role::State(None));
                if peek {
                    let seen = t.op(OpKind::Unary(UnaryOp::Neg), vec![c], f, &cs);
                    t.out(seen);
                }
                t.cache_update(c, rows, indexed.then_some(idx), start, &cs);
                if rope {
                    assert_eq!(pteria::ir::passes::fuse_norm_ropes(&mut t.g), 1);
                }
                let what = format!("indexed {indexed}, rope {rope}, peek {peek}");
                for (fused, apart, name) in &pairs {
                    let what = format!("{what}{name}");
                    cache_calls(
                        &mut t,
                        fused,
                        apart,
                        &what,
                        !peek as usize,
                        cache,
                        |t, n, at| {
                            let xv = rng.floats(h * n * d, 2.0);
                            t.inputs[0] = Val::Tensor(vec![1, h, n, d], f32_bytes(&xv));
                            let pos: Vec<i64> = (at..at + n as i64).collect();
                            t.inputs[1] = Val::Tensor(vec![n], i64_bytes(&pos));
                            t.inputs[2] = Val::Sym(at);
                        },
                    );
                }
            }
        }
    }
}

/// Decode attention that norms its q, over KV caches that a v norm and a k norm with RoPE store
/// into just before it (`kv_guest`), norms the step's new k and v rows in its split: one
/// dispatch fewer a decode call, and call after call the output and both caches hold the same
/// bits as with the norms apart and match the CPU, for indexed and start-position updates,
/// weighted or unweighted k, attention over heads-first caches or (as XNNPACK's llama ops read
/// the E2B-shaped program's one kv head) over row-first views of them, with and without
/// subgroups; the new row at the first, middle and last rows of a chunk and of the cache.
/// Prompts (3 rows) and calls of 2 queries keep the norms' dispatch; so does an op reading the
/// k cache between the norms and the attention, and a device binding 12 storage buffers.
#[test]
fn attention_norms_the_new_k_and_v_rows_in_its_split() {
    let pairs = fused_and_apart(ContextOptions {
        separate_kv_splits: true,
        ..Default::default()
    });
    let narrow = open(ContextOptions {
        max_storage_buffers: Some(12),
        ..Default::default()
    });
    let mut rng = Rng::new(47);
    let (hq, d, cache, max_t, max_pos) = (4usize, 64usize, 48usize, 3usize, 64usize);
    let f = DType::F32;
    for (indexed, weighted, peek, layout) in [
        (true, true, false, AttnLayout::Bhsd),
        (false, true, false, AttnLayout::Bhsd),
        (false, false, false, AttnLayout::Bhsd),
        (true, true, true, AttnLayout::Bhsd),
        (true, true, false, AttnLayout::Bshd),
        (false, false, false, AttnLayout::Bshd),
    ] {
        let heads_first = layout == AttnLayout::Bhsd;
        // (Row-first views of heads-first caches are views only with one kv head.)
        let hkv = if heads_first { 2 } else { 1 };
        let mut t = T::default();
        let qx = [1, max_t, hq, d];
        let kx = [1, hkv, max_t, d];
        let xq = t.input(f, &qx, &qx, vec![0; 4 * hq * max_t * d]);
        let xk = t.input(f, &kx, &kx, vec![0; 4 * hkv * max_t * d]);
        let xv = t.input(f, &kx, &kx, vec![0; 4 * hkv * max_t * d]);
        let idx = t.input(DType::I64, &[max_t], &[max_t], vec![0; 8 * max_t]);
        let start = t.sym("start", 0);
        let half = d / 2;
        let cos = t.const_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
        let sin = t.const_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
        let rope = |weighted: bool, seq_dim: usize| OpKind::RmsNormRope {
            eps: 1e-6,
            weighted,
            style: RopeStyle::Half,
            rotary: d,
            seq_dim,
            start: Int::Sym(start),
        };
        let cs = [1, hkv, cache, d];
        let kc = t.g.add_tensor("k_cache", f, cs.to_vec(), Role::State(None));
        let vc = t.g.add_tensor("v_cache", f, cs.to_vec(), Role::State(None));
        let update = |t: &mut T, c: TensorId, rows: TensorId| {
            t.cache_update(c, rows, indexed.then_some(idx), start, &cs)
        };
        // (Activations, whose storage others would take were they freed.)
        let xv_a = t.op(OpKind::Unary(UnaryOp::Neg), vec![xv], f, &kx);
        let v = t.op(OpKind::RmsNorm { eps: 1e-5 }, vec![xv_a], f, &kx);
        let vu = update(&mut t, vc, v);
        let mut kins = vec![xk];
        if weighted {
            kins.push(t.const_f(&[d], &rng.floats(d, 1.5)));
        }
        kins.extend([cos, sin]);
        let k = t.op(rope(weighted, 2), kins, f, &kx);
        let ku = update(&mut t, kc, k);
        if peek {
            let seen = t.op(OpKind::Unary(UnaryOp::Neg), vec![kc], f, &cs);
            t.out(seen);
        }
        // Written between the norms and the attention: it must not take their inputs' storage.
        let between = t.op(OpKind::Unary(UnaryOp::Exp), vec![xk], f, &kx);
        t.out(between);
        let qw = t.const_f(&[d], &rng.floats(d, 1.5));
        let qn = t.op(rope(true, 1), vec![xq, qw, cos, sin], f, &qx);
        let (q, ku, vu, ys) = if heads_first {
            let perm = OpKind::Permute {
                perm: vec![0, 2, 1, 3],
            };
            let ys = [1, hq, max_t, d];
            (t.op(perm, vec![qn], f, &ys), ku, vu, ys)
        } else {
            let rows = [1, cache, 1, d];
            let view = |t: &mut T, c: TensorId| {
                let shape = rows.iter().map(|&n| Int::Lit(n as i64)).collect();
                t.op(OpKind::Reshape { shape }, vec![c], f, &rows)
            };
            (qn, view(&mut t, ku), view(&mut t, vu), qx)
        };
        let kind = OpKind::Sdpa {
            layout,
            scale: 0.125,
            causal: true,
            window: None,
            softcap: None,
            start: Int::Sym(start),
            all_rows: false,
        };
        let y = t.op(kind, vec![q, ku, vu], f, &ys);
        t.out(y);
        let what = format!("indexed {indexed}, weighted {weighted}, peek {peek}, {layout:?}");
        let runs = (pairs
            .iter()
            .map(|(on, apart, name)| (on.clone(), apart.clone(), *name, !peek)))
        .chain(
            (narrow.clone().zip(pairs.first()))
                .map(|(n, p)| (n, p.1.clone(), " (12 bindings)", false)),
        );
        for (on, apart, name, fused) in runs {
            let what = format!("{what}{name}");
            let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
            let mut gf = GpuExecutor::new(on.clone(), t.g.clone()).unwrap();
            let mut ga = GpuExecutor::new(apart.clone(), t.g.clone()).unwrap();
            for (n, at) in [
                (3usize, 0i64),
                (1, 3),
                (1, 14),
                (1, 15),
                (1, 16),
                (2, 17),
                (1, 19),
                (1, 32),
                (1, 47),
            ] {
                let xq = rng.floats(hq * n * d, 2.0);
                let (xk, xv) = (rng.floats(hkv * n * d, 2.0), rng.floats(hkv * n * d, 2.0));
                t.inputs[0] = Val::Tensor(vec![1, n, hq, d], f32_bytes(&xq));
                t.inputs[1] = Val::Tensor(vec![1, hkv, n, d], f32_bytes(&xk));
                t.inputs[2] = Val::Tensor(vec![1, hkv, n, d], f32_bytes(&xv));
                let pos: Vec<i64> = (at..at + n as i64).collect();
                t.inputs[3] = Val::Tensor(vec![n], i64_bytes(&pos));
                t.inputs[4] = Val::Sym(at);
                let vals = values(&t.inputs);
                let what = format!("{what}, {n} rows at {at}");
                let (got, want) = (gf.run(&vals).unwrap(), ga.run(&vals).unwrap());
                assert!(got == want, "{what}: fused and apart differ");
                let (a, b) = (gf.stats().last_dispatches, ga.stats().last_dispatches);
                let saved = (fused && n == 1) as usize;
                assert_eq!(a + saved, b, "{what}: {a} dispatches against {b}");
                compare(&what, &got, &cpu.run(&vals).unwrap(), TOL, 0.05);
            }
        }
    }
}

/// A v norm (unweighted, not rotated) storing into its KV cache runs in the dispatch of the k
/// norm after it that stores as many rows into a cache of the same shape at the same rows:
/// call after call both caches hold the same bits as with the norms apart and match the CPU,
/// for indexed and start-position updates, prompt and decode rows, with and without subgroups.
/// The k norm before the v norm, or an op reading the v cache between them, keeps them apart.
#[test]
fn the_v_norm_runs_in_the_k_norms_dispatch() {
    let pairs = fused_and_apart(ContextOptions {
        separate_kv_norms: true,
        ..Default::default()
    });
    let mut rng = Rng::new(43);
    let (h, d, cache, max_t, max_pos) = (2usize, 16usize, 12usize, 4usize, 16usize);
    let f = DType::F32;
    for indexed in [true, false] {
        for (k_first, peek) in [(false, false), (true, false), (false, true)] {
            let mut t = T::default();
            let xs = [1, h, max_t, d];
            let xk = t.input(f, &xs, &xs, vec![0; 4 * h * max_t * d]);
            let xv = t.input(f, &xs, &xs, vec![0; 4 * h * max_t * d]);
            let idx = t.input(DType::I64, &[max_t], &[max_t], vec![0; 8 * max_t]);
            let start = t.sym("start", 0);
            let cs = [1, h, cache, d];
            let kc = t.g.add_tensor("k_cache", f, cs.to_vec(), Role::State(None));
            let vc = t.g.add_tensor("v_cache", f, cs.to_vec(), Role::State(None));
            let w = t.const_f(&[d], &rng.floats(d, 1.5));
            let half = d / 2;
            let cos = t.const_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
            let sin = t.const_f(&[max_pos, half], &rng.floats(max_pos * half, 1.0));
            let update = |t: &mut T, c: TensorId, rows: TensorId| {
                t.cache_update(c, rows, indexed.then_some(idx), start, &cs);
            };
            let k_norm = |t: &mut T| {
                let kind = OpKind::RmsNormRope {
                    eps: 1e-6,
                    weighted: true,
                    style: RopeStyle::Half,
                    rotary: d,
                    seq_dim: 2,
                    start: Int::Sym(start),
                };
                let k = t.op(kind, vec![xk, w, cos, sin], f, &xs);
                update(t, kc, k);
            };
            if k_first {
                k_norm(&mut t);
            }
            // (An activation, whose storage the k norm's rows would take were it freed.)
            let xv_a = t.op(OpKind::Unary(UnaryOp::Neg), vec![xv], f, &xs);
            let v = t.op(OpKind::RmsNorm { eps: 1e-5 }, vec![xv_a], f, &xs);
            update(&mut t, vc, v);
            if peek {
                let seen = t.op(OpKind::Unary(UnaryOp::Neg), vec![vc], f, &cs);
                t.out(seen);
            }
            // Written between the norms: it must not take the v norm's input's storage.
            let between = t.op(OpKind::Unary(UnaryOp::Exp), vec![xk], f, &xs);
            t.out(between);
            if !k_first {
                k_norm(&mut t);
            }
            let fused = !k_first && !peek;
            let what = format!("indexed {indexed}, k first {k_first}, peek {peek}");
            // (A device binding 8 storage buffers keeps the norms apart.)
            let narrow = eight_binding_ctx().zip(pairs.first().map(|p| p.1.clone()));
            let runs = (pairs
                .iter()
                .map(|(on, apart, name)| (on.clone(), apart.clone(), *name, fused)))
            .chain(narrow.map(|(on, apart)| (on, apart, " (8 bindings)", false)));
            for (on, apart, name, fused) in runs {
                let what = format!("{what}{name}");
                cache_calls(
                    &mut t,
                    &on,
                    &apart,
                    &what,
                    fused as usize,
                    cache,
                    |t, n, at| {
                        for i in 0..2 {
                            let x = rng.floats(h * n * d, 2.0);
                            t.inputs[i] = Val::Tensor(vec![1, h, n, d], f32_bytes(&x));
                        }
                        let pos: Vec<i64> = (at..at + n as i64).collect();
                        t.inputs[2] = Val::Tensor(vec![n], i64_bytes(&pos));
                        t.inputs[3] = Val::Sym(at);
                    },
                );
            }
        }
    }
}

/// Rel-L2 allowed for an output computed from f16 KV caches: f16 keeps 11 significant bits (a
/// cached value is off by up to 2^-12 of itself); measured on lavapipe, the worst output below
/// is 2.6e-4.
const F16_KV_TOL: f64 = 1e-3;

/// Runs `t`'s calls (`steps` rewrites its inputs for call i) on the CPU, on the GPU with f32
/// caches and with f16 caches. The f32 GPU run matches the CPU to TOL; the f16 one within f16's
/// rounding (rel-L2 per output) but not bit for bit (the caches really are f16); its State
/// buffers take half the bytes.
fn check_f16_kv(what: &str, t: &mut T, calls: usize, mut steps: impl FnMut(&mut T, usize)) {
    let (Some(c32), Some(c16)) = (ctx(), f16_kv_ctx()) else {
        return;
    };
    let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
    let mut g32 = GpuExecutor::new(c32, t.g.clone()).unwrap();
    let mut g16 = GpuExecutor::new(c16, t.g.clone()).unwrap();
    let (m32, m16) = (g32.memory(), g16.memory());
    assert_eq!(
        (m32.kv_caches, m32.f16_kv_caches),
        (2, 0),
        "{what}: {m32:?}"
    );
    assert_eq!(
        (m16.kv_caches, m16.f16_kv_caches),
        (2, 2),
        "{what}: {m16:?}"
    );
    assert_eq!(m32.states, 2 * m16.states, "{what}: {m32:?} {m16:?}");
    assert_eq!(m16.kv_cache, m16.states, "{what}: {m16:?}");
    let mut worst = 0f64;
    for i in 0..calls {
        steps(t, i);
        let vals = values(&t.inputs);
        let want = cpu.run(&vals).unwrap();
        let got32 = g32.run(&vals).unwrap();
        let got16 = g16.run(&vals).unwrap();
        compare(&format!("{what} call {i} (f32)"), &got32, &want, TOL, 1e-2);
        for (k, (a, b)) in got16.iter().zip(&want).enumerate() {
            assert_eq!(a.sizes, b.sizes, "{what} call {i} output {k}");
            let e = pteria::runtime::rel_l2(&a.to_f32().unwrap(), &b.to_f32().unwrap());
            assert!(
                e <= F16_KV_TOL,
                "{what} call {i} output {k}: rel-L2 {e:.2e}"
            );
            worst = worst.max(e);
        }
    }
    eprintln!("{what}: f16 KV caches, worst error {worst:.2e}");
    assert!(worst > 0.0, "{what}: f16 caches gave f32's results exactly");
}

/// Attention's decode path (cache_update + sdpa, both layouts) with f16 KV caches; and its
/// prompts: turns of up to `SPLIT_MAX_S` queries split like decode, longer ones take the
/// matmuls, which read the f16 caches in place too.
#[test]
fn f16_kv_caches_in_sdpa_decode_match_cpu_in_half_the_bytes() {
    let mut rng = Rng::new(31);
    for layout in [AttnLayout::Bshd, AttnLayout::Bhsd] {
        let (cache, h, d) = (80, 2, 34);
        let mut t = decode_graph(layout, cache, h, d, SPLIT_MAX_S + 1);
        let mut pos = 0;
        let lens = [7usize, 1, 1, 5, 1, SPLIT_MAX_S + 1, 1];
        check_f16_kv(&format!("sdpa {layout:?}"), &mut t, lens.len(), |t, i| {
            set_step(t, &mut rng, layout, lens[i], h, d, pos);
            pos += lens[i] as i64;
        });
    }
}

/// The stock Vulkan export's attention reads its caches through matmuls (q·Kᵀ with the cache
/// transposed in place, p·V) and views; index_put-style updates write them. With f16 caches:
/// the tiled matmul (prefill) and the few-rows ones (decode), select / slice / permute of a
/// cache, and the cache itself as an output.
#[test]
fn f16_kv_caches_in_matmul_attention_and_views_match_cpu() {
    let mut rng = Rng::new(32);
    let (h, c, d, s_max) = (3usize, 37usize, 18usize, 8usize);
    let mut t = T::default();
    let xs = [1, h, s_max, d];
    let n = h * s_max * d;
    let q = t.input(DType::F32, &xs, &xs, vec![0; n * 4]);
    let k = t.input(DType::F32, &xs, &xs, vec![0; n * 4]);
    let v = t.input(DType::F32, &xs, &xs, vec![0; n * 4]);
    let idx = t.input(DType::I64, &[s_max], &[1], vec![0; 8]);
    let start = t.sym("start", 0);
    let cs = [1, h, c, d];
    let kc =
        t.g.add_tensor("k_cache", DType::F32, cs.to_vec(), Role::State(None));
    let vc =
        t.g.add_tensor("v_cache", DType::F32, cs.to_vec(), Role::State(None));
    let ku = t.op(
        OpKind::CacheUpdate {
            axis: 2,
            start: Int::Lit(0),
        },
        vec![kc, k, idx],
        DType::F32,
        &cs,
    );
    let vu = t.op(
        OpKind::CacheUpdate {
            axis: 2,
            start: Int::Sym(start),
        },
        vec![vc, v],
        DType::F32,
        &cs,
    );
    let sc = t.op(
        OpKind::MatMul { transpose_b: true },
        vec![q, ku],
        DType::F32,
        &[1, h, s_max, c],
    );
    let p = t.op(OpKind::Softmax, vec![sc], DType::F32, &[1, h, s_max, c]);
    let o = t.op(
        OpKind::MatMul { transpose_b: false },
        vec![p, vu],
        DType::F32,
        &xs,
    );
    let row = t.op(
        OpKind::Select {
            dim: 2,
            index: Int::Sym(start),
        },
        vec![ku],
        DType::F32,
        &[1, h, d],
    );
    let first = t.op(
        OpKind::Slice {
            dim: 2,
            start: Int::Lit(0),
            end: Int::Lit(5),
            step: 1,
        },
        vec![vu],
        DType::F32,
        &[1, h, 5, d],
    );
    let perm = t.op(
        OpKind::Permute {
            perm: vec![0, 2, 1, 3],
        },
        vec![vu],
        DType::F32,
        &[1, c, h, d],
    );
    for x in [o, row, first, perm, ku] {
        t.out(x);
    }
    let lens = [6usize, 1, 1, 3, 1];
    let mut pos = 0i64;
    check_f16_kv("matmul attention", &mut t, lens.len(), |t, i| {
        let sh = vec![1, h, lens[i], d];
        for j in 0..3 {
            let vals = rng.floats(h * lens[i] * d, 1.0);
            t.inputs[j] = Val::Tensor(sh.clone(), f32_bytes(&vals));
        }
        let rows: Vec<i64> = (pos..pos + lens[i] as i64).collect();
        t.inputs[3] = Val::Tensor(vec![lens[i]], i64_bytes(&rows));
        t.inputs[4] = Val::Sym(pos);
        pos += lens[i] as i64;
    });
}

#[test]
fn same_shapes_record_once_and_new_shapes_record_again() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng::new(14);
    let mut t = T::default();
    let x = t.input(
        DType::F32,
        &[8, 64],
        &[3, 64],
        f32_bytes(&rng.floats(192, 1.0)),
    );
    let w = t.const_f(&[64], &rng.floats(64, 1.0));
    let n = t.op(
        OpKind::RmsNorm { eps: 1e-5 },
        vec![x, w],
        DType::F32,
        &[8, 64],
    );
    let y = t.op(OpKind::Unary(UnaryOp::Silu), vec![n], DType::F32, &[8, 64]);
    t.out(y);
    let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
    let mut gpu = GpuExecutor::new(ctx, t.g.clone()).unwrap();
    for rows in [3, 3, 5, 3] {
        t.inputs[0] = Val::Tensor(vec![rows, 64], f32_bytes(&rng.floats(rows * 64, 1.0)));
        let vals = values(&t.inputs);
        compare(
            "replay",
            &gpu.run(&vals).unwrap(),
            &cpu.run(&vals).unwrap(),
            TOL,
            1e-3,
        );
    }
    let st = gpu.stats();
    assert_eq!(
        (st.recordings, st.replays, st.last_dispatches),
        (2, 2, 2),
        "{st:?}"
    );
}

#[test]
fn unsupported_ops_are_listed_together() {
    let Some(ctx) = ctx() else { return };
    let mut t = T::default();
    let x = t.input_i(&[4, 4], &[0; 16]);
    let a = t.op(OpKind::Softmax, vec![x], DType::F32, &[4, 4]);
    let b = t.op(OpKind::RmsNorm { eps: 1e-6 }, vec![x], DType::F32, &[4, 4]);
    t.out(a);
    t.out(b);
    match GpuExecutor::new(ctx, t.g) {
        Err(GpuError::Unsupported(why)) => {
            assert_eq!(why.len(), 2, "{why:?}");
            assert!(
                why[0].contains("softmax") && why[1].contains("rms_norm"),
                "{why:?}"
            );
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("integer softmax should be unsupported"),
    }
}

/// A call's outputs are right whether the host blocks in the driver for them or sleeps through
/// most of the last call's time and polls for the rest (the default, for calls expected to take
/// up to 10 ms; longer ones block): mat-vecs of 1 and 32 MB of f32 weights (a few milliseconds
/// and tens of them on lavapipe) replayed, each call against the CPU.
#[test]
fn outputs_polled_for_after_a_sleep_are_right() {
    let Some(polled) = ctx() else { return };
    let blocked = open(ContextOptions {
        block_on_outputs: true,
        ..Default::default()
    })
    .expect("the GPU opened once already");
    let mut rng = Rng::new(41);
    for n in [128, 4096] {
        let t = linear_graph(
            &mut rng,
            Weight::F32,
            1,
            2048,
            n,
            false,
            pteria::ir::ActQuant::None,
        );
        // Sums of 2048 products in another order than the CPU's.
        let calls = 6;
        for (ctx, what) in [(polled.clone(), "polled"), (blocked.clone(), "blocked")] {
            let what = format!("{what} 2048x{n}");
            let mut gpu = check_on(ctx, &what, &t, 1e-3, 1e-3);
            let mut cpu = CpuExecutor::new(t.g.clone()).unwrap();
            let mut x = t.inputs.clone();
            // Per call: its wait for outputs (ms) and whether it slept first.
            let mut per_call = Vec::new();
            for call in 1..calls {
                x[0] = Val::Tensor(vec![1, 2048], f32_bytes(&rng.floats(2048, 1.0)));
                let vals = values(&x);
                let want = cpu.run(&vals).unwrap();
                let before = gpu.stats();
                let got = gpu
                    .run(&vals)
                    .unwrap_or_else(|e| panic!("{what} call {call}: {e}"));
                let after = gpu.stats();
                per_call.push((
                    (after.host.wait_ns - before.host.wait_ns) as f64 / 1e6,
                    after.slept_waits > before.slept_waits,
                ));
                compare(&format!("{what} call {call}"), &got, &want, 1e-3, 1e-3);
            }
            println!("{what}: (wait ms, slept) a call {per_call:?}");
            // A call sleeps where the call before it (of the same recording) waited longer than
            // the polled tail (0.3 ms) and no longer than a long call (10 ms): on lavapipe the
            // small mat-vec waits a few milliseconds and the large one tens, on an H200 both
            // microseconds. (The margins: a wait is measured from after the submit.)
            for w in per_call.windows(2) {
                let ((last, _), (_, slept)) = (w[0], w[1]);
                if what.starts_with("blocked") || last > 13.0 {
                    assert!(!slept, "{what}: {per_call:?}");
                } else if std::env::var("PTERIA_POLL_OUTPUTS").is_err()
                    && (1.5..7.0).contains(&last)
                {
                    assert!(slept, "{what}: {per_call:?}");
                }
            }
        }
    }
}

/// The grid barrier benchmark's kernel (`pteria bench --kernels`): one workgroup passes every
/// round's barrier and reads back its own last write each round; a grid no device can hold
/// resident at once on a CPU driver ends with failed waits rather than hanging.
#[test]
fn grid_barrier_counts_every_round_and_gives_up_without_residency() {
    let Some(ctx) = ctx() else { return };
    let r = pteria::gpu::bench::grid_barrier_run(&ctx, 1, 64, 200).unwrap();
    assert_eq!((r.failures, r.stale), (0, 0), "{r:?}");
    if ctx.adapter().device_type == "cpu" {
        // lavapipe runs a workgroup to its end on one of its threads, a few at a time.
        let r = pteria::gpu::bench::grid_barrier_run(&ctx, 4096, 64, 4).unwrap();
        assert!(r.failures > 0, "{r:?}");
    }
}

/// A row of logits reduced to its sampling candidates on the GPU (kernels/candidates.wgsl)
/// gives the reference's (`runtime::candidates`): the same count, and the same pairs wherever
/// they fit. Rows model-like, tied by the thousand, full of NaN, infinities and signed zeros,
/// shorter than a block and not whole blocks; k above the blocks; the last of several rows.
#[test]
fn candidates_match_the_reference() {
    use pteria::gpu::bench::{model_like_logits, row_graph};
    use pteria::runtime::candidates::{candidates_of, CAPACITY};
    // A device of its own: the other tests' calls would reuse the activation buffers that
    // `read_output` reads from.
    let Some(ctx) = open(ContextOptions::default()) else {
        return;
    };
    let mut rng = Rng::new(41);
    let awkward = |rng: &mut Rng, n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| match rng.next() % 30 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 => -0.0,
                3 => 0.0,
                4 if rng.next() % 50 == 0 => f32::INFINITY,
                r if r < 15 => (rng.next() % 5) as f32 - 2.0,
                _ => rng.f() * 4.0,
            })
            .collect()
    };
    let mut cases: Vec<(String, Vec<f32>, usize)> = vec![
        (
            "model-like".into(),
            model_like_logits(262144, 3).unwrap(),
            1,
        ),
        (
            "ties in fours".into(),
            (0..262144).map(|i| (i % 4) as f32).collect(),
            1,
        ),
        ("all NaN".into(), vec![f32::NAN; 3000], 1),
        (
            "three rows".into(),
            model_like_logits(3 * 5000, 4).unwrap(),
            3,
        ),
        // The pick's search past the first block whose maximum is the row's: a block of NaN
        // keeps -inf as its maximum, and the first -inf lies two blocks on.
        (
            "NaN, then -inf".into(),
            (0..4000)
                .map(|i| match i {
                    2500 | 3000 => f32::NEG_INFINITY,
                    _ => f32::NAN,
                })
                .collect(),
            1,
        ),
        (
            "signed zeros".into(),
            (0..3000)
                .map(|i| match i {
                    1100 => -0.0,
                    1500 => 0.0,
                    _ if i % 3 == 0 => f32::NAN,
                    _ => -1.0,
                })
                .collect(),
            1,
        ),
    ];
    for n in [1, 7, 1024, 1025, 4099, 70000] {
        cases.push((format!("awkward {n}"), awkward(&mut rng, n), 1));
    }
    let zero = 0f32.to_le_bytes();
    let inputs = [InputValue::Tensor {
        shape: vec![1],
        data: &zero,
    }];
    let mut complete = 0;
    for (what, values, rows) in &cases {
        let mut gpu = GpuExecutor::new(ctx.clone(), row_graph(values, *rows)).unwrap();
        let full = gpu.run(&inputs).unwrap().remove(0);
        let n = values.len() / rows;
        for k in [1, 2, 64, 300] {
            let (outs, got) = gpu.run_candidates(&inputs, 0, k).unwrap();
            assert!(outs[0].data.is_empty(), "{what}: the row came back too");
            // The row the call made, read after it: the reference's input.
            let row = gpu.read_output(0).unwrap();
            assert_eq!(row, full, "{what} k {k}: read_output");
            let row: Vec<f32> = row
                .data
                .chunks_exact(4)
                .skip((rows - 1) * n)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let want = candidates_of(&row, k);
            assert_eq!(got.found, want.found, "{what} k {k}");
            assert_eq!(got.k, k);
            // k = 1: the greedy pick over the whole row, overflowed or not.
            assert_eq!(got.first, want.first, "{what} k {k}: the pick");
            let mut pairs = got.pairs.clone();
            pairs.sort_by_key(|p| p.0);
            let same =
                |a: &(u32, f32), b: &(u32, f32)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits();
            if want.found <= CAPACITY {
                assert_eq!(pairs.len(), want.pairs.len(), "{what} k {k}");
                assert!(
                    pairs.iter().zip(&want.pairs).all(|(a, b)| same(a, b)),
                    "{what} k {k}"
                );
                complete += got.complete() as usize;
            } else {
                // Overflowed: CAPACITY distinct pairs of the reference's, in the order they
                // were found.
                assert_eq!(pairs.len(), CAPACITY, "{what} k {k}");
                pairs.dedup_by_key(|p| p.0);
                assert_eq!(pairs.len(), CAPACITY, "{what} k {k}: repeated ids");
                let at = |i: u32| row[i as usize];
                assert!(pairs.iter().all(|p| at(p.0).to_bits() == p.1.to_bits()
                    && p.1 >= pteria::runtime::candidates::threshold(&row, k)));
            }
        }
        // A plain call after them reads the whole output again.
        assert_eq!(gpu.run(&inputs).unwrap().remove(0), full, "{what}");
        // Another executor's call may reuse its buffers: reading back is then refused.
        let mut other = GpuExecutor::new(ctx.clone(), row_graph(&[1.0, 2.0], 1)).unwrap();
        other.run(&inputs).unwrap();
        let e = gpu.read_output(0).unwrap_err().to_string();
        assert!(e.contains("another call"), "{what}: {e}");
    }
    assert!(complete > 20, "{complete} complete");
}

/// A row of `vocab` logits per token whose largest lies at `next(token)`: an embedding of a
/// table built so, with its id input.
fn successor_graph(vocab: usize) -> (Graph, impl Fn(u32) -> u32) {
    let next = move |t: u32| (t * 7 + 3) % vocab as u32;
    let mut rng = Rng::new(77);
    let mut table = vec![0f32; vocab * vocab];
    for t in 0..vocab {
        for v in 0..vocab {
            table[t * vocab + v] = rng.f() * 4.0 - 2.0;
        }
        table[t * vocab + next(t as u32) as usize] = 9.0;
    }
    (token_rows(&table, vocab), next)
}

/// A graph whose output is the row of `table` (rows of `vocab` logits) its one input, a token
/// id ([1, 1], i64), selects: an embedding.
fn token_rows(table: &[f32], vocab: usize) -> Graph {
    let bytes: Vec<u8> = table.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut g = Graph::default();
    let ids = g.add_tensor("ids", DType::I64, vec![1, 1], Role::Input(0));
    g.inputs.push(Io::Tensor(ids));
    let w = g.add_tensor(
        "w",
        DType::F32,
        vec![table.len() / vocab, vocab],
        Role::Constant(Blob::whole(Arc::new(Bytes::Owned(bytes)))),
    );
    let y = g.add_tensor("y", DType::F32, vec![1, 1, vocab], Role::Activation);
    g.op(
        OpKind::Embedding {
            weight: Weight::F32,
        },
        vec![w, ids],
        vec![y],
    );
    g.outputs.push(y);
    g
}

/// Greedy decode steps one ahead: a call copies its pick into the next call's token on the
/// device, two calls in flight, each finished with its own candidates; and the misuses refused.
#[test]
fn fed_calls_take_the_last_calls_pick() {
    // A device of its own: `read_output` below must see only this test's calls.
    let Some(ctx) = open(ContextOptions::default()) else {
        return;
    };
    let vocab = 1500;
    let (g, next) = successor_graph(vocab);
    let mut gpu = GpuExecutor::new(ctx.clone(), g).unwrap();
    let token = |t: i64| t.to_le_bytes().to_vec();
    fn call(bytes: &[u8]) -> [InputValue<'_>; 1] {
        [InputValue::Tensor {
            shape: vec![1, 1],
            data: bytes,
        }]
    }
    let (five, junk) = (token(5), token(1234));
    // Not fed: the host's token. Then fed: the placeholder is not read.
    gpu.start_candidates(&call(&five), 0, 1, Some(feed(false)))
        .unwrap();
    let mut want = next(5);
    for step in 0..6 {
        gpu.start_candidates(&call(&junk), 0, 1, Some(feed(true)))
            .unwrap();
        assert_eq!(gpu.in_flight(), 2);
        let e = gpu
            .start_candidates(&call(&junk), 0, 1, Some(feed(true)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("in flight"), "{e}");
        let e = gpu.run(&call(&five)).unwrap_err().to_string();
        assert!(e.contains("in flight"), "{e}");
        let e = gpu.read_output(0).unwrap_err().to_string();
        assert!(e.contains("in flight"), "{e}");
        let (outs, c) = gpu.finish_candidates().unwrap();
        assert!(outs[0].data.is_empty());
        assert_eq!(c.first, Some(want), "step {step}");
        assert!(
            c.complete() && c.pairs == vec![(want, 9.0)],
            "step {step}: {c:?}"
        );
        want = next(want);
    }
    let (_, c) = gpu.finish_candidates().unwrap();
    assert_eq!(c.first, Some(want));
    assert_eq!(gpu.in_flight(), 0);
    assert!(gpu.finish_candidates().is_err());
    // The last call's row, whole: the table's row for the token it was fed.
    let row = gpu.read_output(0).unwrap();
    let fed = (0..vocab as u32).find(|&t| next(t) == want).unwrap();
    let expect = CpuExecutor::new(successor_graph(vocab).0)
        .unwrap()
        .run(&call(&token(fed as i64)))
        .unwrap()
        .remove(0);
    assert_eq!(row, expect);
    // A pick from top-2 needs a draw, a draw sane settings, and a fed call must follow a
    // feeding one.
    let e = gpu
        .start_candidates(&call(&five), 0, 2, Some(feed(false)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs a draw"), "{e}");
    let bad = Draw {
        temperature: 0.0,
        top_p: 1.0,
        min_p: 0.0,
        u: 0.5,
    };
    let e = gpu
        .start_candidates(
            &call(&five),
            0,
            2,
            Some(DevicePick {
                draw: Some(bad),
                ..feed(false)
            }),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("out of range"), "{e}");
    gpu.start_candidates(&call(&five), 0, 1, None).unwrap();
    gpu.finish_candidates().unwrap();
    let e = gpu
        .start_candidates(&call(&junk), 0, 1, Some(feed(true)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("must follow"), "{e}");
    // Another executor's call between the feeding call and the fed one is refused too.
    gpu.start_candidates(&call(&five), 0, 1, Some(feed(false)))
        .unwrap();
    gpu.finish_candidates().unwrap();
    let (g2, _) = successor_graph(8);
    let mut other = GpuExecutor::new(ctx.clone(), g2).unwrap();
    other.run(&call(&token(1))).unwrap();
    let e = gpu
        .start_candidates(&call(&junk), 0, 1, Some(feed(true)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("must follow"), "{e}");
    // A float input cannot be fed a token.
    let mut rows =
        GpuExecutor::new(ctx.clone(), pteria::gpu::bench::row_graph(&[1.0, 2.0], 1)).unwrap();
    assert!(rows.feed_check(0).is_err());
    let zero = 0f32.to_le_bytes();
    let e = rows
        .start_candidates(
            &[InputValue::Tensor {
                shape: vec![1],
                data: &zero,
            }],
            0,
            1,
            Some(feed(false)),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("not an integer"), "{e}");
}

fn feed(fed: bool) -> DevicePick {
    DevicePick {
        feed: 0,
        fed,
        draw: None,
    }
}

/// A sampled pick on the device (`draw` in kernels/candidates.wgsl, f32) is the host sampler's
/// (f64) with the same uniform number, over rows model-like, tied, with +inf and signed zeros,
/// at several settings. (`fed_calls_take_the_last_calls_pick` and the runner's tests feed picks.)
#[test]
fn device_draws_pick_what_the_sampler_picks() {
    use pteria::llm::sampler::{Sampler, SamplingParams};
    use pteria::runtime::candidates::candidates_of;
    let Some(ctx) = open(ContextOptions::default()) else {
        return;
    };
    // Rows of 70000 logits (69 blocks, so top-64's threshold is a block maximum), one a token.
    let (rows, vocab) = (16, 70000);
    let mut table = Vec::with_capacity(rows * vocab);
    for t in 0..rows {
        let row = pteria::gpu::bench::model_like_logits(vocab, t as u64 + 1).unwrap();
        table.extend(row.iter().map(|&x| match t % 7 {
            // Ties: logits in steps of 1.
            1 => x.round(),
            // Several +inf.
            2 if x > 9.0 => f32::INFINITY,
            // Signed zeros on top.
            3 if x > 9.0 => {
                if x > 10.0 {
                    0.0
                } else {
                    -0.0
                }
            }
            3 => x - 20.0,
            _ => x,
        }));
    }
    let g = token_rows(&table, vocab);
    let mut gpu = GpuExecutor::new(ctx.clone(), g).unwrap();
    let settings = [
        (1.0, 64, 0.95, 0.0),
        (0.7, 3, 1.0, 0.0),
        (1.3, 40, 0.5, 0.1),
        (1.0, 1, 1.0, 0.0),
        (2.0, 300, 0.99, 0.05),
    ];
    let mut checked = 0;
    for (s, &(temperature, top_k, top_p, min_p)) in settings.iter().enumerate() {
        let mut sampler = Sampler::new(SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: Some(s as u64 + 3),
            ..SamplingParams::default()
        })
        .unwrap();
        let mut tok = 5u32;
        for step in 0..60 {
            let bytes = (tok as i64).to_le_bytes();
            let input = [InputValue::Tensor {
                shape: vec![1, 1],
                data: &bytes,
            }];
            let draw = sampler.draw_ahead(0).unwrap();
            let pick = DevicePick {
                draw: Some(draw),
                ..feed(false)
            };
            gpu.start_candidates(&input, 0, top_k, Some(pick)).unwrap();
            let (_, c) = gpu.finish_candidates().unwrap();
            let what = format!("settings {s} step {step} token {tok}");
            let row = &table[tok as usize * vocab..][..vocab];
            assert_eq!(c.found, candidates_of(row, top_k).found, "{what}");
            assert_eq!(c.first, None, "{what}");
            let host = sampler.sample_candidates(&c).unwrap();
            if c.complete() {
                assert_eq!(c.drawn, host, "{what}: u {}", draw.u);
                assert!(host.is_some(), "{what}");
                checked += 1;
            } else {
                assert_eq!((c.drawn, host), (None, None), "{what}");
            }
            // The next row, from the pick where there is one.
            tok = (host.unwrap_or(tok) * 31 + 7) % rows as u32;
        }
    }
    assert!(checked > 200, "{checked} draws checked");
}

/// The phase-chain experiment (kernels/phase_chain.wgsl) computes its chain of 4-bit mat-vecs:
/// every mode gives the host's outputs (f64 sums) to rounding and the same bits as the others,
/// on rows that do not fill the grid's teams and rows whose chunks do not fill a team. One
/// workgroup for the modes that need every workgroup resident (lavapipe runs a few at a time).
#[test]
fn phase_chain_matches_the_host_in_every_mode() {
    use pteria::gpu::phase_chain::{reference, Layout, PhaseChain, PhaseMode};
    let Some(ctx) = ctx() else { return };
    let shapes = [(256, 384), (384, 256), (128, 512), (512, 256)];
    let layout = Layout::new(&shapes, 2).unwrap();
    assert_eq!((layout.phases(), layout.outputs()), (8, 256));
    let want = reference(&layout, 11);
    let chain = match PhaseChain::new(&ctx, layout, 11) {
        Ok(c) => c,
        // A device with less than 24 KiB of workgroup memory: refused, not run.
        Err(e) => {
            assert!(e.to_string().contains("workgroup memory"), "{e}");
            return;
        }
    };
    let norm = want.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
    assert!(norm > 1.0, "the chain's outputs should not vanish: {norm}");
    let mut first: Option<Vec<u32>> = None;
    for (mode, g) in [
        (PhaseMode::Dispatches, 3),
        (PhaseMode::Dispatches, 1),
        (PhaseMode::Persistent, 1),
        (PhaseMode::Prefetch, 1),
    ] {
        let r = chain.run(g, mode).unwrap();
        assert_eq!(r.failures, 0, "{mode:?} on {g}");
        let err = r
            .out
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum::<f64>()
            .sqrt()
            / norm;
        assert!(err < 1e-5, "{mode:?} on {g}: rel-L2 {err}");
        let bits: Vec<u32> = r.out.iter().map(|v| v.to_bits()).collect();
        match &first {
            Some(f) => assert_eq!(*f, bits, "{mode:?} on {g}"),
            None => first = Some(bits),
        }
    }
}

/// Chains the kernel cannot run are refused by name.
#[test]
fn phase_chain_refuses_what_its_kernel_does_not_take() {
    use pteria::gpu::phase_chain::{Layout, MAX_PHASES};
    for (shapes, layers, why) in [
        (vec![(256, 256)], 0, "phases"),
        (vec![(256, 256)], MAX_PHASES + 1, "phases"),
        (vec![(200, 256)], 1, "multiple of 128"),
        (vec![(256, 128)], 2, "phase before"),
        (vec![(8192, 8192)], 1, "at most 6144"),
        (vec![(256, 0)], 1, "is 256→0"),
    ] {
        let e = Layout::new(&shapes, layers).unwrap_err().to_string();
        assert!(e.contains(why), "{shapes:?} x {layers}: {e}");
    }
}

/// `g` after the passes a whole method takes at load (runtime/whole.rs).
fn load_passes(g: &Graph) -> Graph {
    let mut g = g.clone();
    pteria::ir::passes::optimize(&mut g);
    pteria::ir::passes::finish(&mut g);
    g
}

/// Random graphs of the ops a decoder is made of, in random orders and widths: element-wise
/// ops and their chains, residual adds, norms (whole and decomposed as the export leaves them),
/// clamps, softmax, and linears of every weight format and activation quantization, single,
/// several of one input and gate/up pairs with gelu(gate) · up; 1 to 130 rows of x (decode, a
/// prompt's mat-vecs, the tiled linear past 128). The CPU executor runs each graph as built;
/// the GPU runs it after the load-time IR passes (`optimize`, `finish`), with its planner's
/// fusions, on the device as it is or on one whose limits change the plans (a 64 KiB binding,
/// 8 bindings, no subgroups, emulated FMA). So each combination of passes and fusions that a
/// graph happens to trigger must give the CPU's results: within 1e-4 rel-L2 per output, 2e-2 where an int8 activation
/// quantization can round one element differently after a few ulps upstream.
#[test]
fn random_graphs_run_on_the_gpu_as_on_the_cpu() {
    use pteria::ir::ActQuant;
    let Some(ctx) = ctx() else { return };
    // The device as it is, and devices whose limits change the planner's choices: weights split
    // past a 64 KiB binding, fusions that need more than 8 bindings off, reductions without
    // subgroups, XNNPACK's FMA emulated. Each graph takes the next.
    let devices = [
        ("the device", Some(ctx)),
        ("64 KiB bindings", small_binding_ctx()),
        ("8 bindings", eight_binding_ctx()),
        ("no subgroups", no_subgroup_ctx()),
        ("emulated FMA", emulated_fma_ctx()),
    ];
    let mut rng = Rng::new(0x6A5_F00D);
    let pick = |rng: &mut Rng, n: usize| (rng.next() % n as u64) as usize;
    let mut quantized_graphs = 0;
    // PTERIA_FUZZ_ITERS runs more (the fuzzers' knob).
    let cases = std::env::var("PTERIA_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    for case in 0..cases {
        let mut t = T::default();
        let m = [1, 1, 2, 5, 17, 40, 130][pick(&mut rng, 7)];
        let k0 = [32, 64, 96, 256][pick(&mut rng, 4)];
        let x = t.input_f(&[m, k0], &rng.floats(m * k0, 2.0));
        // Live values: (tensor, width).
        let mut pool = vec![(x, k0)];
        if pick(&mut rng, 2) == 0 {
            let r = t.input_f(&[m, k0], &rng.floats(m * k0, 2.0));
            pool.push((r, k0));
        }
        let mut quantized = false;
        let mut ops = Vec::new();
        for _ in 0..4 + pick(&mut rng, 7) {
            let (a, w) = pool[pool.len() - 1 - pick(&mut rng, pool.len().min(3))];
            let sh = [m, w];
            let f = DType::F32;
            let out = match pick(&mut rng, 9) {
                0 => {
                    let u = [
                        UnaryOp::Neg,
                        UnaryOp::Tanh,
                        UnaryOp::Sigmoid,
                        UnaryOp::Silu,
                        UnaryOp::GeluTanh,
                        UnaryOp::Gelu,
                        UnaryOp::Relu,
                        UnaryOp::Abs,
                    ][pick(&mut rng, 8)];
                    ops.push(format!("{u:?}"));
                    t.op(OpKind::Unary(u), vec![a], f, &sh)
                }
                1 => {
                    // A residual add or product: another value of this width, a weight row, or
                    // a scalar.
                    let op = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Sub][pick(&mut rng, 3)];
                    let same: Vec<TensorId> = (pool.iter())
                        .filter(|&&(p, pw)| pw == w && p != a)
                        .map(|&(p, _)| p)
                        .collect();
                    // Or the value itself (x · x, a chain reading one tensor twice).
                    let b = match (same.is_empty(), pick(&mut rng, 4)) {
                        (false, 0 | 1) => same[pick(&mut rng, same.len())],
                        (_, 2) => t.const_f(&[], &[rng.f() + 1.5]),
                        (_, 3) if pick(&mut rng, 2) == 0 => a,
                        _ => t.const_f(&[w], &rng.floats(w, 1.0)),
                    };
                    ops.push(format!("{op:?}"));
                    t.op(OpKind::Binary(op), vec![a, b], f, &sh)
                }
                2 => {
                    let mut ins = vec![a];
                    if pick(&mut rng, 2) == 0 {
                        ins.push(t.const_f(&[w], &rng.floats(w, 1.0)));
                    }
                    ops.push("rms_norm".into());
                    t.op(OpKind::RmsNorm { eps: 1e-6 }, ins, f, &sh)
                }
                3 => {
                    // RMSNorm as the export decomposes it: x · rsqrt(mean(x²) + eps) · w.
                    let sq = t.op(
                        OpKind::BinaryScalar {
                            op: BinaryOp::Pow,
                            scalar: 2.0,
                            scalar_first: false,
                        },
                        vec![a],
                        f,
                        &sh,
                    );
                    let mean = t.op(
                        OpKind::Mean {
                            dims: vec![1],
                            keepdim: true,
                        },
                        vec![sq],
                        f,
                        &[m, 1],
                    );
                    let eps = t.op(
                        OpKind::BinaryScalar {
                            op: BinaryOp::Add,
                            scalar: 1e-6,
                            scalar_first: false,
                        },
                        vec![mean],
                        f,
                        &[m, 1],
                    );
                    let rs = t.op(OpKind::Unary(UnaryOp::Rsqrt), vec![eps], f, &[m, 1]);
                    let n = t.op(OpKind::Binary(BinaryOp::Mul), vec![a, rs], f, &sh);
                    let wt = t.const_f(&[w], &rng.floats(w, 1.0));
                    ops.push("decomposed rms_norm".into());
                    t.op(OpKind::Binary(BinaryOp::Mul), vec![n, wt], f, &sh)
                }
                4 => {
                    ops.push("clamp".into());
                    t.op(
                        OpKind::Clamp {
                            min: Some(-1.5),
                            max: Some(2.0),
                        },
                        vec![a],
                        f,
                        &sh,
                    )
                }
                5 => {
                    ops.push("softmax".into());
                    t.op(OpKind::Softmax, vec![a], f, &sh)
                }
                kind => {
                    // Linears: one, two or three of this input (pairs and triples run as one
                    // mat-vec), or a gate/up pair whose only reader is gelu(gate) · up.
                    let (weight, aq) = match pick(&mut rng, 5) {
                        0 => (Weight::F32, ActQuant::None),
                        1 => (Weight::Q4 { group: 32 }, ActQuant::None),
                        2 => packed_formats()[pick(&mut rng, 4)],
                        _ => packed_formats()[pick(&mut rng, 2)],
                    };
                    // K a whole number of groups (48 wide values take 16-groups or floats).
                    let (weight, aq) = match weight {
                        Weight::Q4 { group } | Weight::Q8 { group } if w % group != 0 => {
                            [(Weight::F32, ActQuant::None), packed_formats()[3]][pick(&mut rng, 2)]
                        }
                        _ => (weight, aq),
                    };
                    quantized |= aq != ActQuant::None;
                    let n = [32, 48, 64, 96, 256][pick(&mut rng, 5)];
                    let bias = pick(&mut rng, 3) == 0;
                    let linear = |t: &mut T, rng: &mut Rng| {
                        let mut ins = vec![a];
                        ins.extend(quant_weight(t, rng, weight, n, w));
                        if bias {
                            ins.push(t.const_f(&[n], &rng.floats(n, 0.5)));
                        }
                        let kind = OpKind::Linear {
                            weight,
                            act_quant: aq,
                            has_bias: bias,
                        };
                        t.op(kind, ins, f, &[m, n])
                    };
                    ops.push(format!("linear {weight:?} {aq:?} {w}->{n}"));
                    let y = linear(&mut t, &mut rng);
                    match kind {
                        6 => y,
                        7 => {
                            let z = linear(&mut t, &mut rng);
                            let g = t.op(OpKind::Unary(UnaryOp::GeluTanh), vec![y], f, &[m, n]);
                            ops.push("gelu(gate) · up".into());
                            t.op(OpKind::Binary(BinaryOp::Mul), vec![g, z], f, &[m, n])
                        }
                        _ => {
                            let z = linear(&mut t, &mut rng);
                            pool.push((z, n));
                            if pick(&mut rng, 2) == 0 {
                                let v = linear(&mut t, &mut rng);
                                pool.push((v, n));
                            }
                            y
                        }
                    }
                }
            };
            let width = t.g.tensors[out].max_shape[1];
            pool.push((out, width));
        }
        // The last value, and sometimes an earlier one that later ops also read.
        let last = pool[pool.len() - 1].0;
        t.out(last);
        if pool.len() > 3 && pick(&mut rng, 2) == 0 {
            let (extra, _) = pool[1 + pick(&mut rng, pool.len() - 2)];
            if extra != last {
                t.out(extra);
            }
        }
        quantized_graphs += usize::from(quantized);

        let vals = values(&t.inputs);
        // (Activations are not split: 130 rows of 256 floats do not fit a 64 KiB binding.)
        let mut d = case % devices.len();
        if d == 1 && m * 256 * 4 > 65536 {
            d = 0;
        }
        let (device, ctx) = &devices[d];
        let ctx = ctx.clone().expect("the device opened once already");
        let what = format!("case {case} (m {m}, {device}): {}", ops.join(", "));
        let mut cpu = CpuExecutor::new(t.g.clone()).unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
        let want = cpu
            .run(&vals)
            .unwrap_or_else(|e| panic!("{what}: cpu run: {e}"));
        let mut gpu = GpuExecutor::new(ctx.clone(), load_passes(&t.g))
            .unwrap_or_else(|e| panic!("{what}: gpu: {e}"));
        let tol = if quantized { 2e-2 } else { 1e-4 };
        // Twice: the second call replays the first's recording.
        for call in 0..2 {
            let got = gpu
                .run(&vals)
                .unwrap_or_else(|e| panic!("{what}: gpu run: {e}"));
            assert_eq!(got.len(), want.len(), "{what}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.sizes, w.sizes, "{what}: output {i}");
                let (g, w) = (g.to_f32().unwrap(), w.to_f32().unwrap());
                for (a, b) in g.iter().zip(&w) {
                    assert_eq!(a.is_nan(), b.is_nan(), "{what}: output {i}: NaN where not");
                }
                let finite = |v: &[f32]| v.iter().copied().filter(|x| !x.is_nan()).collect();
                let (g, w): (Vec<f32>, Vec<f32>) = (finite(&g), finite(&w));
                let e = pteria::runtime::rel_l2(&g, &w);
                assert!(
                    e <= tol,
                    "{what}: call {call} output {i}: rel-L2 {e:e} > {tol:e}"
                );
            }
        }
    }
    assert!(
        quantized_graphs >= 10,
        "only {quantized_graphs} graphs quantize"
    );
}

/// A norm chain that reads its input twice (`x · rms_norm(x)·w`) quantizing for a linear: its
/// mat-vec (`norm_load`) would bind x at a read-only and a read-write slot at once, which wgpu
/// refuses (found by the random-graph test), so the norm runs apart and the result is the CPU's.
/// An element-wise chain of x with itself (`gelu(x) · x`) takes x once and stays in the mat-vec's
/// dispatch where a mat-vec runs it.
#[test]
fn fusions_never_bind_one_tensor_twice() {
    use pteria::ir::ActQuant;
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng::new(388);
    for (weight, aq) in packed_formats() {
        for norm in [true, false] {
            let mut t = T::default();
            let x = t.input_f(&[1, 256], &rng.floats(256, 1.0));
            let row = |t: &mut T, kind, ins| t.op(kind, ins, DType::F32, &[1, 256]);
            let h = if norm {
                let w = t.const_f(&[256], &rng.floats(256, 1.0));
                let n = row(&mut t, OpKind::RmsNorm { eps: 1e-6 }, vec![x, w]);
                row(&mut t, OpKind::Binary(BinaryOp::Mul), vec![n, x])
            } else {
                let g = row(&mut t, OpKind::Unary(UnaryOp::GeluTanh), vec![x]);
                row(&mut t, OpKind::Binary(BinaryOp::Mul), vec![g, x])
            };
            let mut ins = vec![h];
            ins.extend(quant_weight(&mut t, &mut rng, weight, 96, 256));
            let kind = OpKind::Linear {
                weight,
                act_quant: aq,
                has_bias: false,
            };
            let y = t.op(kind, ins, DType::F32, &[1, 96]);
            t.out(y);
            let g = load_passes(&t.g);
            let what = format!("{weight:?}/{aq:?}, {}", if norm { "norm" } else { "chain" });
            let vals = values(&t.inputs);
            let want = CpuExecutor::new(t.g.clone()).unwrap().run(&vals).unwrap();
            let mut gpu = GpuExecutor::new(ctx.clone(), g).unwrap();
            let got = gpu.run(&vals).unwrap_or_else(|e| panic!("{what}: {e}"));
            let tol = if aq == ActQuant::None { 1e-4 } else { 2e-2 };
            compare(&what, &got, &want, tol, 1e-2);
            let entries = gpu.last_entries();
            if norm {
                // The norm in a dispatch of its own, not in the mat-vec.
                assert!(
                    entries.iter().any(|e| e == "rms_norm:main4_quant")
                        && !entries.iter().any(|e| e.contains("normed")),
                    "{what}: {entries:?}"
                );
            } else if (entries.iter()).any(|e| e.ends_with(":matvec") || e.ends_with(":xnn_matvec"))
            {
                // The chain in the mat-vec's dispatch, where a mat-vec runs it.
                assert_eq!(entries.len(), 1, "{what}: {entries:?}");
            }
        }
    }
}
