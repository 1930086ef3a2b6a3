//! One IR op → kernel dispatches. Each op family has one builder here and one WGSL file in
//! `kernels/` (found by `OpKind::name()`); a builder picks the entry point, the `override`
//! constants that specialise it, the uniform parameters for this call's shapes, the buffers to
//! bind, and the grid. Host symbols that are positions (rope/sdpa/cache `start`, slice start,
//! select index) are not baked in: kernels read them from the syms buffer by slot, so one
//! recording serves every decode position.
//!
//! Binding convention of every kernel: 0 = uniform params, 1 = syms (i32), 2 = output, 3.. =
//! inputs in the order given. Entry points that statically reference a binding they do not use
//! in some variant get a 16-byte dummy there.

use super::memory::{aliases, MemoryPlan, Repr};
use crate::ir::{
    AttnDims, AttnLayout, BinaryOp, ChainStep, DType, Graph, Int, Op, OpKind, Plan, RopeStyle,
    TensorId, UnaryOp, Weight,
};

/// Tensors of rank up to this many dims are supported (uniform arrays of two vec4).
pub(crate) const MAX_RANK: usize = 8;

/// A buffer a dispatch binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Res {
    /// The tensor's storage (through its alias root), whole.
    Tensor(TensorId),
    /// Chunk `c` of a weight split by rows (chunk 0 of an unsplit one is the whole tensor).
    Chunk(TensorId, usize),
    /// Scratch buffer `k` of the op being built.
    Scratch(usize),
    /// Scratch buffer `k` of another node (a linear whose input this op quantizes).
    ScratchOf(usize, usize),
    Dummy,
    /// The ranges buffer: per `MemoryPlan::range_site`, RANGE_SLOTS pairs of words that a
    /// producer leaves its stores' range in for the linear that quantizes them (`ranged`).
    Ranges,
    /// The executor's sampling candidates (`GpuExecutor::run_candidates`).
    Candidates,
}

/// One kernel dispatch.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub kernel: &'static str,
    pub entry: &'static str,
    pub constants: Vec<(&'static str, f64)>,
    pub params: Vec<u32>,
    pub out: Res,
    pub inputs: Vec<Res>,
    /// Further outputs, bound after the inputs.
    pub writes: Vec<Res>,
    /// Further inputs, bound after those.
    pub reads_after: Vec<Res>,
    pub groups: [u32; 3],
}

/// What a builder may ask about the graph and this call.
pub(crate) struct Env<'a> {
    pub graph: &'a Graph,
    pub plan: &'a Plan,
    pub mem: &'a MemoryPlan,
    /// Slot of an `Int` in the syms buffer: symbols first, then the graph's literals.
    pub slot: &'a dyn Fn(Int) -> u32,
    pub max_groups: u32,
    /// The device's smallest subgroup size, where kernels may use subgroup operations.
    pub subgroup: Option<u32>,
    /// Invocations a workgroup may have.
    pub max_invocations: u32,
    /// Storage buffers a kernel may bind.
    pub max_storage: u32,
    /// Bytes of workgroup memory a kernel may use.
    pub max_workgroup_bytes: u32,
    /// Rows of x up to which a quantized linear of 16-byte quads runs as the mat-vec.
    pub quad_rows: usize,
    /// Rows of x a prompt's quad mat-vec workgroup takes, if fixed (else `x_rows`).
    pub x_rows: Option<usize>,
    /// Whether WGSL's `fma()` rounds once here (`Context::fused_fma`).
    pub fused_fma: bool,
    /// Workgroups that `xnn_matvec` leaves at least for a linear's rows (`xnn_matvec_layout`).
    pub xnn_floor: usize,
    /// Per tensor root: the root whose storage holds its values in this call (a view op's
    /// output reads its input's, a select's from an offset; `views`), else itself.
    pub view_of: &'a [TensorId],
}

/// Whether permuting a tensor of `shape` by `perm` leaves its elements in memory order: the dims
/// it moves have size 1.
pub(crate) fn permute_is_view(shape: &[usize], perm: &[usize]) -> bool {
    let kept: Vec<usize> = perm
        .iter()
        .copied()
        .filter(|&d| shape.get(d) != Some(&1))
        .collect();
    kept.windows(2).all(|w| w[0] < w[1])
}

/// Per tensor root, where its values live in a call of these shapes: the root whose storage
/// holds them and the byte offset there. View ops (`MemoryPlan::view_op`) read their input's
/// storage: a permute moving only size-1 dims, and a select of a dim after size-1 dims at an
/// offset that is a multiple of `align` (the device's storage binding offset alignment).
pub(crate) fn views(
    g: &Graph,
    mem: &MemoryPlan,
    shapes: &[Vec<usize>],
    align: u64,
) -> (Vec<TensorId>, Vec<u64>) {
    let mut view: Vec<TensorId> = (0..g.tensors.len()).collect();
    let mut off = vec![0u64; g.tensors.len()];
    for (n, node) in g.nodes.iter().enumerate() {
        let crate::ir::Node::Op(op) = node else {
            continue;
        };
        if !mem.view_op.get(n).copied().unwrap_or(false) {
            continue;
        }
        let (i, o) = (mem.root[op.inputs[0]], mem.root[op.outputs[0]]);
        let xs = &shapes[op.inputs[0]];
        let at = match &op.kind {
            OpKind::Permute { perm } => permute_is_view(xs, perm).then_some(off[i]),
            OpKind::Select {
                dim,
                index: Int::Lit(index),
            } if *dim < xs.len() && xs[..*dim].iter().all(|&d| d == 1) => {
                let n = xs[*dim] as i64;
                let index = if *index < 0 { index + n } else { *index };
                let inner: usize = xs[dim + 1..].iter().product();
                let bytes =
                    super::memory::elem_bytes(mem.repr[i], g.tensors[op.inputs[0]].dtype.size());
                let at = off[i] + index.max(0) as u64 * inner as u64 * bytes;
                (at % align.max(1) == 0).then_some(at)
            }
            _ => None,
        };
        if let Some(at) = at {
            view[o] = view[i];
            off[o] = at;
        }
    }
    (view, off)
}

impl<'a> Env<'a> {
    /// Node `n` where it is an op (the planner's maps name ops by node).
    fn op(&self, n: usize) -> Option<&'a Op> {
        match &self.graph.nodes[n] {
            crate::ir::Node::Op(o) => Some(o),
            crate::ir::Node::Sym(_) => None,
        }
    }
    fn shape(&self, t: TensorId) -> &[usize] {
        &self.plan.shapes[t]
    }
    fn numel(&self, t: TensorId) -> usize {
        self.shape(t).iter().product()
    }
    fn int(&self, t: TensorId) -> bool {
        self.mem.repr[t] == Repr::I32
    }
    fn out_int(&self, t: TensorId) -> bool {
        !self.graph.tensors[t].dtype.is_float()
    }
    /// Rows per chunk and chunk count of a weight tensor with `rows` rows.
    fn chunks(&self, t: TensorId, rows: usize) -> (usize, usize) {
        match self.mem.split[self.mem.root[t]] {
            Some((per, _)) => (per, rows.div_ceil(per).max(1)),
            None => (rows.max(1), 1),
        }
    }
    /// A grid of `n` workgroups, folded into y when x would pass the device limit; kernels
    /// linearise it as `wg.x + wg.y * nwg.x` and bound-check.
    fn grid(&self, n: usize, z: usize) -> [u32; 3] {
        let max = self.max_groups as usize;
        if n <= max {
            [n as u32, 1, z as u32]
        } else {
            [max as u32, n.div_ceil(max) as u32, z as u32]
        }
    }
}

/// Uniform parameters in WGSL struct order: scalars are 4 bytes, arrays start 16-aligned.
#[derive(Default)]
struct P(Vec<u32>);

impl P {
    fn u(mut self, v: usize) -> Self {
        self.0.push(v as u32);
        self
    }
    fn i(mut self, v: i64) -> Self {
        self.0
            .push(v.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32);
        self
    }
    fn f(mut self, v: f32) -> Self {
        self.0.push(v.to_bits());
        self
    }
    /// `array<vec4<u32>, 2>` (or `vec4<u32>` with `n` = 4).
    fn arr(mut self, v: &[usize], n: usize) -> Self {
        while self.0.len() % 4 != 0 {
            self.0.push(0);
        }
        self.0
            .extend((0..n).map(|i| v.get(i).copied().unwrap_or(0) as u32));
        self
    }
    fn pad(mut self) -> Self {
        while self.0.len() % 4 != 0 {
            self.0.push(0);
        }
        self
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    crate::runtime::kernels::strides(shape)
}

/// A reduction's uniform (`reduce.wgsl`, `mul_mean.wgsl`): the output and reduced counts and
/// ranks, the `extra` scalars, then the kept dims' sizes and each operand's strides over them,
/// and the same for the reduced dims; with the output count.
fn reduce_params(
    shape: &[usize],
    dims: &[usize],
    operands: &[&[usize]],
    extra: &[usize],
) -> (usize, P) {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let pick = |ds: &[usize], v: &[usize]| ds.iter().map(|&d| v[d]).collect::<Vec<_>>();
    let n_out = kept.iter().map(|&d| shape[d]).product();
    let n_red = dims.iter().map(|&d| shape[d]).product();
    let mut p = P::default().u(n_out).u(n_red).u(kept.len()).u(dims.len());
    for &e in extra {
        p = p.u(e);
    }
    for ds in [&kept[..], dims] {
        p = p.arr(&pick(ds, shape), 8);
        for st in operands {
            p = p.arr(&pick(ds, st), 8);
        }
    }
    (n_out, p)
}

/// Strides of `src` broadcast over `out` (right-aligned, 0 on broadcast dims).
fn broadcast_strides(src: &[usize], out: &[usize]) -> Vec<usize> {
    let st = strides(src);
    let off = out.len() - src.len().min(out.len());
    (0..out.len())
        .map(|d| {
            if d < off {
                0
            } else {
                let j = d - off;
                if src[j] == 1 {
                    0
                } else {
                    st[j]
                }
            }
        })
        .collect()
}

fn b(v: bool) -> f64 {
    v as u32 as f64
}

const WG: usize = 256;

/// Inputs and steps an `ElementwiseChain` may have on the GPU (its parameters fill one 256-byte
/// uniform slot); `fuse_elementwise_chains` stays within them.
pub const CHAIN_INPUTS: usize = crate::ir::passes::CHAIN_INPUTS;
pub const CHAIN_STEPS: usize = crate::ir::passes::CHAIN_STEPS;

/// The output of an op that shares its input's storage instead of being computed.
pub(crate) fn alias(g: &Graph, op: &Op) -> Option<(TensorId, TensorId)> {
    let (out, input) = (*op.outputs.first()?, *op.inputs.first()?);
    match op.kind {
        OpKind::Reshape { .. } | OpKind::CacheUpdate { .. } if aliases(g, &op.kind, out, input) => {
            Some((out, input))
        }
        _ => None,
    }
}

/// The packed 4/8-bit weight an op reads as raw bytes.
pub(crate) fn packed_weight(op: &Op) -> Option<TensorId> {
    match op.kind {
        OpKind::Linear {
            weight: Weight::Q4 { .. } | Weight::Q8 { .. },
            ..
        } => op.inputs.get(1).copied(),
        OpKind::Embedding {
            weight: Weight::Q4 { .. } | Weight::Q8 { .. },
        } => op.inputs.first().copied(),
        _ => None,
    }
}

/// Whether 4-bit `op` computes its biases as -8 · scale instead of reading them (their buffer is
/// not bound: `MemoryPlan::derived_bias`).
fn derived_bias(env: &Env, op: &Op) -> bool {
    let ws = weight_tensors(op);
    ws.len() == 3 && env.mem.derived_bias[env.mem.root[ws[2]]]
}

/// Weight tensors an op reads by rows (and so may read split into chunks).
pub(crate) fn weight_tensors(op: &Op) -> Vec<TensorId> {
    match &op.kind {
        OpKind::Linear { weight, .. } => op
            .inputs
            .iter()
            .skip(1)
            .take(weight.tensor_count())
            .copied()
            .collect(),
        OpKind::Embedding { weight } => op
            .inputs
            .iter()
            .take(weight.tensor_count())
            .copied()
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `op` can read its input `k` from an f16 KV cache (`Repr::F16`): the cache update
/// writing it, attention's k and v, a matmul's b (q·Kᵀ and p·V read the cache in place), and the
/// strided copies that views of a cache become, which convert to f32.
pub(crate) fn reads_f16(g: &Graph, op: &Op, k: usize) -> bool {
    let float_out = op
        .outputs
        .first()
        .is_some_and(|&o| g.tensors[o].dtype.is_float());
    match op.kind {
        OpKind::CacheUpdate { .. } => k == 0,
        OpKind::MatMul { .. } => k == 1,
        OpKind::Sdpa { .. } => k == 1 || k == 2,
        OpKind::Reshape { .. }
        | OpKind::Copy
        | OpKind::Permute { .. }
        | OpKind::Slice { .. }
        | OpKind::Select { .. }
        | OpKind::Expand { .. } => k == 0 && float_out,
        OpKind::Concat { .. } => float_out,
        _ => false,
    }
}

/// Op-private temporaries, at their max size.
pub(crate) fn scratch_bytes(g: &Graph, op: &Op, max_binding: u64) -> Vec<u64> {
    match op.kind {
        OpKind::Linear {
            act_quant: crate::ir::ActQuant::Torchao | crate::ir::ActQuant::Xnnpack,
            ..
        } => vec![g.tensors[op.inputs[0]].max_numel() as u64 * 4],
        OpKind::Sdpa { .. } => match max_dims(g, op) {
            Some(a) if a.s > 0 => {
                let s = a.s.min(split_max_s(g, op, max_binding)) as u64;
                let mut v = vec![s * split_query_bytes(&a)];
                if by_matmuls(g, op, max_binding) {
                    v.push(scores_bytes(&a));
                }
                v
            }
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// Attention `op`'s dimensions at its max shapes, which size its scratch.
fn max_dims(g: &Graph, op: &Op) -> Option<AttnDims> {
    let OpKind::Sdpa { layout, .. } = op.kind else {
        return None;
    };
    let (q, k) = (&g.tensors[op.inputs[0]], &g.tensors[op.inputs[1]]);
    layout.dims(&q.max_shape, &k.max_shape)
}

/// Split's scratch for one query: per batch, head and chunk of keys, a max, a sum and a row.
fn split_query_bytes(a: &AttnDims) -> u64 {
    let chunks = a.cl.div_ceil(split_keys(a.cl));
    (a.b * a.hq * chunks * (a.d + 2) * 4) as u64
}

/// Attention bounded by its start with at most this many queries per call splits its keys over
/// workgroups (`sdpa.wgsl` `split`): a decode step's few (query, head) pairs alone would leave the
/// GPU idle, and so would a chat turn's few queries in the tiled matmuls' 64-query tiles. Measured
/// on an H100 (`pteria bench --kernels`, 8 heads on one kv head, 1024-row cache), split against
/// the matmuls with their K split (`k_splits`), µs, head dims 256 (window 512) / 512: 24 queries
/// from position 0 33.7 / 41.3 against 45.8 / 48.3, from 480 55.2 / 78.9 against 54.3 / 90.7,
/// from 900 56.0 / 110.6 against 65.7 / 110.9; 28 queries from 0 38.4 / 47.9 against 45.9 /
/// 49.3, from 480 63.0 / 91.9 against 54.5 / 91.6, from 900 64.2 / 130.8 against 66.0 / 112.1;
/// 32 queries, the matmuls win all six. Split's cost grows with the queries, the matmuls' barely.
pub const SPLIT_MAX_S: usize = 24;
/// The same for attention over every cache row, the mask deciding (`all_rows`): there the
/// matmuls compute every row whatever the start, while split skips the chunks the mask hides.
/// TTFT of the E2B-shaped program (H100, 2 runs): 28 tokens 9.28-9.36 ms split against
/// 10.15-10.45 by matmuls, 32 tokens 9.91-9.97 against 10.70-11.14.
pub const SPLIT_MAX_S_ALL_ROWS: usize = 32;
/// Queries a call splits whatever its scratch: a decode step's.
const SPLIT_ALWAYS_S: usize = 4;

/// The most queries a call of attention `op` splits: `SPLIT_MAX_S`, fewer where their chunks'
/// scratch would pass `SCORES_MAX` or a binding (a long cache; at least a decode step's). From
/// the op's max shapes, which size that scratch.
fn split_max_s(g: &Graph, op: &Op, max_binding: u64) -> usize {
    let Some(a) = max_dims(g, op) else {
        return SPLIT_ALWAYS_S;
    };
    let most = match op.kind {
        OpKind::Sdpa { all_rows: true, .. } => SPLIT_MAX_S_ALL_ROWS,
        _ => SPLIT_MAX_S,
    };
    let fit = SCORES_MAX.min(max_binding) / split_query_bytes(&a).max(1);
    (fit.min(most as u64) as usize).max(SPLIT_ALWAYS_S)
}
/// Invocations of a `split` workgroup.
const SPLIT_WG: usize = 256;
/// Storage buffers that the fused kernels binding more than WebGPU's default 8 take
/// (`split_normed`, `main4_cache_kv`, `linear3`); a device with fewer keeps those ops apart.
pub(crate) const WIDE_BINDINGS: u32 = 9;
/// Keys per workgroup in the split (`PTERIA_SDPA_KEYS` = 8..=64, a power of two, overrides, for
/// benchmark sweeps).
fn split_keys(cache_rows: usize) -> usize {
    static KEYS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let keys = *KEYS.get_or_init(|| {
        std::env::var("PTERIA_SDPA_KEYS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|k| k.is_power_of_two() && (8..=64).contains(k))
            // Measured on an H100 (E2B-shaped decode at position ~130): 8 keys 3909 µs a step,
            // 16 3925, 32 3965; small chunks keep each invocation's chain of loads short. Since
            // the q norm moved into `split` (and more): 16 keys 2588-2596 µs after 128 tokens
            // against 2579-2590 for 8, 2631-2637 against 2662-2666 after 512, and 2638 against
            // 2675-2684 after 900 (32 keys: 2676-2687 after 128).
            .unwrap_or(16)
    });
    // `combine`'s lanes walk every chunk: at most SPLIT_CHUNKS of them.
    keys.max(cache_rows.div_ceil(SPLIT_CHUNKS).next_power_of_two())
}

/// The most chunks a split cache has (64 for each of `combine`'s 16 lanes).
const SPLIT_CHUNKS: usize = 1024;

/// Whether attention with more queries than it splits (`split_max_s`) runs as matmul, `probs`,
/// matmul (a prefill): tiled matmuls share each K/V load among 64 queries where `main` walks
/// the cache once per query (2564 against 3988 tok/s for a 900-token E2B prefill, H100).
/// Decided at the op's max shapes, which size its scores' scratch: up to `SCORES_MAX` bytes,
/// and one binding.
fn by_matmuls(g: &Graph, op: &Op, max_binding: u64) -> bool {
    max_dims(g, op).is_some_and(|a| {
        a.s > split_max_s(g, op, max_binding) && scores_bytes(&a) <= SCORES_MAX.min(max_binding)
    })
}

/// The scores of attention run by matmuls: a float per batch, head, query and cache row.
fn scores_bytes(a: &AttnDims) -> u64 {
    (a.b * a.hq * a.s * a.cl * 4) as u64
}

/// The most scratch attention's scores may take (it is allocated at the op's max shapes, for
/// every call); more, and each query walks the cache (`main`).
const SCORES_MAX: u64 = 128 << 20;

/// Why the GPU executor cannot run an op, if it cannot; checked for every op at load.
pub(crate) fn check(g: &Graph, mem: &MemoryPlan, op: &Op) -> Option<String> {
    let t = |i: usize| op.inputs.get(i).copied();
    let rank_ok = op
        .inputs
        .iter()
        .chain(&op.outputs)
        .all(|&t| g.tensors[t].max_shape.len() <= MAX_RANK);
    if !rank_ok {
        return Some(format!("tensors of rank above {MAX_RANK}"));
    }
    let n_in = |n: usize| {
        (op.inputs.len() < n).then(|| format!("needs {n} inputs, has {}", op.inputs.len()))
    };
    if op.outputs.is_empty() {
        return Some("has no output".into());
    }
    let out = op.outputs[0];
    let raw = packed_weight(op);
    for &i in &op.inputs {
        if mem.repr[i] == Repr::Raw && Some(i) != raw {
            return Some(format!(
                "reads packed weight `{}` as a tensor",
                g.tensors[i].name
            ));
        }
    }
    for (k, &i) in op.inputs.iter().enumerate() {
        if mem.repr[i] == Repr::F16 && !reads_f16(g, op, k) {
            return Some(format!(
                "reads the f16 KV cache `{}` as input {k}",
                g.tensors[i].name
            ));
        }
    }
    if let Some(w) = raw {
        if !matches!(g.tensors[mem.root[w]].role, crate::ir::Role::Constant(_)) {
            return Some("packed weights must be constants".into());
        }
    }
    let float_in = |idx: &[usize]| -> Option<String> {
        idx.iter()
            .filter_map(|&i| t(i))
            .find(|&i| !matches!(mem.repr[i], Repr::F32 | Repr::F16))
            .map(|i| format!("integer input `{}`", g.tensors[i].name))
    };
    let float_out = || (!g.tensors[out].dtype.is_float()).then(|| "integer output".to_string());
    match &op.kind {
        OpKind::Unary(_)
        | OpKind::Cast
        | OpKind::Copy
        | OpKind::Clamp { .. }
        | OpKind::BinaryScalar { .. } => n_in(1),
        OpKind::Binary(_) => n_in(2),
        OpKind::Where => n_in(3),
        OpKind::ElementwiseChain { steps } => n_in(1)
            .or_else(|| {
                (op.inputs.len() > CHAIN_INPUTS || steps.len() > CHAIN_STEPS).then(|| {
                    format!("a chain of more than {CHAIN_STEPS} steps or {CHAIN_INPUTS} inputs")
                })
            })
            .or_else(|| float_in(&(0..op.inputs.len()).collect::<Vec<_>>()))
            .or_else(float_out),
        OpKind::RmsNorm { .. } => n_in(1).or_else(|| float_in(&[0, 1])).or_else(float_out),
        OpKind::RmsNormChain {
            weighted,
            norm_input,
            steps,
            ..
        } => n_in(1)
            .or_else(|| {
                let others = op.inputs.len() - 1 - *weighted as usize;
                (others >= CHAIN_INPUTS || *norm_input > others || steps.len() > CHAIN_STEPS)
                    .then(|| format!("a norm chain of more than {CHAIN_STEPS} steps or {CHAIN_INPUTS} inputs"))
            })
            .or_else(|| float_in(&(0..op.inputs.len()).collect::<Vec<_>>()))
            .or_else(float_out),
        OpKind::RmsNormRope { weighted, .. } => n_in(3 + *weighted as usize)
            .or_else(|| float_in(&(0..op.inputs.len()).collect::<Vec<_>>()))
            .or_else(float_out),
        OpKind::Softmax | OpKind::Mean { .. } | OpKind::Sum { .. } => {
            n_in(1).or_else(|| float_in(&[0])).or_else(float_out)
        }
        OpKind::MulMean { .. } => n_in(2)
            .or_else(|| {
                (op.inputs[..2].iter())
                    .find(|&&i| mem.repr[i] != Repr::F32)
                    .map(|&i| format!("input `{}` is not f32", g.tensors[i].name))
            })
            .or_else(float_out),
        OpKind::Rope { .. } => n_in(3).or_else(|| float_in(&[0, 1, 2])).or_else(float_out),
        OpKind::Sdpa { .. } => n_in(3)
            .or_else(|| float_in(&[0, 1, 2, 3]))
            .or_else(float_out)
            .or_else(|| {
                let r = |i: usize| g.tensors[op.inputs[i]].max_shape.len();
                (r(0) != 4 || r(1) != 4 || r(2) != 4).then(|| "q, k, v must be 4-D".to_string())
            }),
        OpKind::Linear {
            weight, has_bias, ..
        } => {
            let need = 1 + weight.tensor_count() + *has_bias as usize;
            let mut idx = vec![0];
            if *weight != Weight::F32 {
                idx.extend([2, 3]);
            } else {
                idx.push(1);
            }
            if *has_bias {
                idx.push(1 + weight.tensor_count());
            }
            n_in(need).or_else(|| float_in(&idx)).or_else(float_out)
        }
        OpKind::Embedding { weight } => {
            let idx: Vec<usize> = if *weight == Weight::F32 {
                vec![0]
            } else {
                vec![1, 2]
            };
            n_in(weight.tensor_count() + 1)
                .or_else(|| float_in(&idx))
                .or_else(float_out)
        }
        OpKind::MatMul { .. } => n_in(2)
            .or_else(|| float_in(&[0, 1]))
            .or_else(float_out)
            .or_else(|| {
                let r = g.tensors[out].max_shape.len();
                (r > 6).then(|| "more than 4 batch dims".to_string())
            }),
        OpKind::CacheUpdate { .. } => n_in(2).or_else(|| {
            let (c, v) = (mem.repr[op.inputs[0]], mem.repr[op.inputs[1]]);
            (c != v && (c, v) != (Repr::F16, Repr::F32))
                .then(|| "cache and value differ in type".to_string())
                .or_else(|| {
                    t(2).filter(|&i| mem.repr[i] != Repr::I32)
                        .map(|_| "cache indices must be integers".to_string())
                })
        }),
        OpKind::Reshape { .. }
        | OpKind::Permute { .. }
        | OpKind::Slice { .. }
        | OpKind::Select { .. }
        | OpKind::Expand { .. } => n_in(1),
        OpKind::Concat { .. } => n_in(1),
        OpKind::IndexSelect { .. } => n_in(2),
        OpKind::Full { .. } | OpKind::Arange { .. } => None,
    }
}

fn step(
    kernel: &'static str,
    entry: &'static str,
    constants: Vec<(&'static str, f64)>,
    params: P,
    out: Res,
    inputs: Vec<Res>,
    groups: [u32; 3],
) -> Step {
    Step {
        kernel,
        entry,
        constants,
        params: params.pad().0,
        out,
        inputs,
        writes: Vec::new(),
        reads_after: Vec::new(),
        groups,
    }
}

/// `(CONVERT code)` for moving a tensor of representation `from` into output tensor `to`;
/// `bool_ne` converts to bool as `x != 0` (cast/copy) instead of by truncation. An f16 KV cache
/// is only ever read into float tensors (`reads_f16`).
fn convert(env: &Env, from: TensorId, to: TensorId, bool_ne: bool) -> u32 {
    if env.mem.repr[from] == Repr::F16 {
        return 5;
    }
    let (fi, ti) = (env.int(from), env.out_int(to));
    if bool_ne && env.graph.tensors[to].dtype == DType::Bool {
        return if fi { 4 } else { 3 };
    }
    match (fi, ti) {
        (true, false) => 1,
        (false, true) => 2,
        _ => 0,
    }
}

/// A strided copy: `src` elements at `src_strides` over `shape` into `dst_strides`.
#[allow(clippy::too_many_arguments)]
fn gather(
    env: &Env,
    x: TensorId,
    out: TensorId,
    shape: &[usize],
    src_strides: &[usize],
    dst_strides: &[usize],
    dst_base: usize,
    dynamic: Option<(Int, usize, usize)>,
    conv: u32,
) -> Vec<Step> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Vec::new();
    }
    let dense = strides(shape);
    if dynamic.is_none()
        && conv == 0
        && n % 4 == 0
        && dst_base % 4 == 0
        && src_strides == dense.as_slice()
        && dst_strides == dense.as_slice()
    {
        let params = P::default()
            .u(n / 4)
            .u(0)
            .u(0)
            .u(dst_base / 4)
            .u(0)
            .i(0)
            .u(0)
            .u(0)
            .arr(&[], 8)
            .arr(&[], 8)
            .arr(&[], 8);
        return vec![step(
            "layout",
            "copy4",
            vec![],
            params,
            Res::Tensor(out),
            vec![Res::Tensor(x)],
            env.grid((n / 4).div_ceil(WG), 1),
        )];
    }
    let (slot, dn, ds) = match dynamic {
        Some((v, n, s)) => ((env.slot)(v), n, s),
        None => (u32::MAX, 0, 0),
    };
    let params = P::default()
        .u(n)
        .u(shape.len())
        .u(0)
        .u(dst_base)
        .u(slot as usize)
        .i(dn as i64)
        .u(ds)
        .u(0)
        .arr(shape, 8)
        .arr(src_strides, 8)
        .arr(dst_strides, 8);
    vec![step(
        "layout",
        "gather",
        vec![("CONVERT", conv as f64)],
        params,
        Res::Tensor(out),
        vec![Res::Tensor(x)],
        env.grid(n.div_ceil(WG), 1),
    )]
}

fn is_cmp(op: BinaryOp) -> bool {
    op.is_comparison()
}

/// The dispatches of one op for this call's shapes.
pub(crate) fn build(env: &Env, node: usize, op: &Op) -> Result<Vec<Step>, String> {
    let out = op.outputs[0];
    let oshape = env.shape(out).to_vec();
    let n = env.numel(out);
    let x = op.inputs.first().copied().unwrap_or(out);
    let out_float = !env.out_int(out);
    let ew = |entry: &'static str,
              constants: Vec<(&'static str, f64)>,
              params: P,
              inputs: Vec<Res>|
     -> Vec<Step> {
        if n == 0 {
            return Vec::new();
        }
        vec![step(
            "elementwise",
            entry,
            constants,
            params,
            Res::Tensor(out),
            inputs,
            env.grid(n.div_ceil(WG), 1),
        )]
    };
    let ew_params = |shapes: &[&[usize]]| -> (bool, P) {
        let bcast = shapes.iter().any(|s| *s != oshape.as_slice());
        let mut p = P::default()
            .u(n)
            .u(oshape.len())
            .f(0.0)
            .i(0)
            .f(0.0)
            .f(0.0)
            .i(0)
            .i(0)
            .arr(&oshape, 8);
        for k in 0..3 {
            p = match shapes.get(k) {
                Some(s) => p.arr(&broadcast_strides(s, &oshape), 8),
                None => p.arr(&[], 8),
            };
        }
        (bcast, p)
    };
    Ok(match &op.kind {
        OpKind::Unary(u) => {
            let int_math = !out_float
                && matches!(
                    u,
                    UnaryOp::Neg | UnaryOp::Abs | UnaryOp::LogicalNot | UnaryOp::Square
                );
            let c = vec![
                ("OP", *u as u32 as f64),
                ("A_INT", b(env.int(x))),
                ("OUT_INT", b(!out_float)),
                ("INT_MATH", b(int_math)),
            ];
            ew("unary", c, ew_params(&[]).1, vec![Res::Tensor(x)])
        }
        OpKind::Binary(bo) => {
            let (a, bb) = (op.inputs[0], op.inputs[1]);
            let int_math = env.int(a) && env.int(bb) && (!out_float || is_cmp(*bo));
            let (bcast, p) = ew_params(&[env.shape(a), env.shape(bb)]);
            let c = vec![
                ("OP", *bo as u32 as f64),
                ("A_INT", b(env.int(a))),
                ("B_INT", b(env.int(bb))),
                ("OUT_INT", b(!out_float)),
                ("INT_MATH", b(int_math)),
                ("BCAST", b(bcast)),
            ];
            ew("binary", c, p, vec![Res::Tensor(a), Res::Tensor(bb)])
        }
        OpKind::BinaryScalar {
            op: bo,
            scalar,
            scalar_first,
        } => {
            // The reference takes an integral scalar as an integer only for integer tensors
            // and outputs; it computes in integers exactly then.
            let s_int = *scalar == scalar.trunc() && env.int(x) && !out_float;
            let p = P::default().u(n).u(0).f(*scalar as f32).i(*scalar as i64);
            let c = vec![
                ("OP", *bo as u32 as f64),
                ("A_INT", b(env.int(x))),
                ("OUT_INT", b(!out_float)),
                ("INT_MATH", b(s_int)),
                ("SCALAR", if *scalar_first { 2.0 } else { 1.0 }),
            ];
            ew(
                "binary",
                c,
                p.f(0.0).f(0.0).i(0).i(0),
                vec![Res::Tensor(x), Res::Dummy],
            )
        }
        OpKind::Where => {
            let (c, a, bb) = (op.inputs[0], op.inputs[1], op.inputs[2]);
            let (bcast, p) = ew_params(&[env.shape(c), env.shape(a), env.shape(bb)]);
            let k = vec![
                ("A_INT", b(env.int(c))),
                ("B_INT", b(env.int(a))),
                ("C_INT", b(env.int(bb))),
                ("OUT_INT", b(!out_float)),
                ("INT_MATH", b(!out_float)),
                ("BCAST", b(bcast)),
            ];
            ew(
                "where_select",
                k,
                p,
                vec![Res::Tensor(c), Res::Tensor(a), Res::Tensor(bb)],
            )
        }
        // The paired linear that produces both inputs stores this chain itself (`glu_fused`).
        OpKind::ElementwiseChain { .. }
            if env.mem.glu_lead[node].is_some_and(|l| glu_fused(env, l).is_some()) =>
        {
            Vec::new()
        }
        // The linear that alone reads this chain computes it as it loads its input.
        OpKind::ElementwiseChain { .. }
            if env.mem.loaded_by[node].is_some_and(|l| chain_loaded(env, l).is_some()) =>
        {
            Vec::new()
        }
        // Rows a quantized linear reads packed: the row kernel chains and quantizes them.
        OpKind::ElementwiseChain { steps }
            if env.mem.quant_into[node]
                .and_then(|l| prequantized(env, l))
                .is_some() =>
        {
            let mut s = rms_norm(env, node, op, 0.0, false, NormThen::Chain(0, steps))?;
            for st in &mut s {
                st.constants.push(("NORM", 0.0));
            }
            s
        }
        OpKind::ElementwiseChain { steps } => {
            let shapes: Vec<&[usize]> = op.inputs.iter().map(|&t| env.shape(t)).collect();
            let bcast = shapes.iter().any(|s| *s != oshape.as_slice());
            let mut p = P::default()
                .u(n)
                .u(oshape.len())
                .u(steps.len())
                .u(0)
                .arr(&oshape, 8);
            for k in 0..CHAIN_INPUTS {
                p = match shapes.get(k) {
                    Some(s) => p.arr(&broadcast_strides(s, &oshape), 8),
                    None => p.arr(&[], 8),
                };
            }
            let (p, mut consts) = chain_steps(p, steps);
            let mut inputs: Vec<Res> = op.inputs.iter().map(|&t| Res::Tensor(t)).collect();
            inputs.resize(CHAIN_INPUTS, Res::Dummy);
            consts.extend([("BCAST", b(bcast)), ("N_IN", op.inputs.len() as f64)]);
            ew("chain", consts, p, inputs)
        }
        OpKind::Clamp { min, max } => {
            let (lo, hi) = (
                min.unwrap_or(f64::NEG_INFINITY),
                max.unwrap_or(f64::INFINITY),
            );
            let p = P::default()
                .u(n)
                .u(0)
                .f(0.0)
                .i(0)
                .f(lo as f32)
                .f(hi as f32)
                .i(lo as i64)
                .i(hi as i64);
            let c = vec![("A_INT", b(env.int(x))), ("OUT_INT", b(!out_float))];
            ew("clamp_range", c, p, vec![Res::Tensor(x)])
        }
        OpKind::Cast => {
            let c = vec![
                ("A_INT", b(env.int(x))),
                ("OUT_INT", b(!out_float)),
                ("OUT_BOOL", b(env.graph.tensors[out].dtype == DType::Bool)),
            ];
            ew("convert", c, P::default().u(n), vec![Res::Tensor(x)])
        }
        OpKind::Copy => gather(
            env,
            x,
            out,
            &[n],
            &[1],
            &[1],
            0,
            None,
            convert(env, x, out, true),
        ),
        OpKind::RmsNorm { eps } => {
            rms_norm(env, node, op, *eps, op.inputs.len() > 1, NormThen::Store)?
        }
        OpKind::RmsNormChain {
            eps,
            weighted,
            norm_input,
            steps,
        } => {
            let then = NormThen::Chain(*norm_input, steps);
            rms_norm(env, node, op, *eps, *weighted, then)?
        }
        // The attention that alone reads these rows norms and rotates them itself.
        OpKind::RmsNormRope { .. }
            if env.mem.normed_q[node].is_some_and(|a| q_normed(env, a).is_some()) =>
        {
            Vec::new()
        }
        OpKind::RmsNormRope {
            eps,
            weighted,
            style,
            rotary,
            seq_dim,
            start,
        } => {
            let then = NormThen::Rope(*style, *rotary, *seq_dim, *start);
            rms_norm(env, node, op, *eps, *weighted, then)?
        }
        OpKind::Softmax => {
            let d = *oshape.last().ok_or("softmax of a scalar")?;
            let rows = n.checked_div(d).unwrap_or(0);
            if rows == 0 {
                return Ok(Vec::new());
            }
            vec![step(
                "softmax",
                "main",
                vec![],
                P::default().u(rows).u(d),
                Res::Tensor(out),
                vec![Res::Tensor(x)],
                env.grid(rows, 1),
            )]
        }
        OpKind::Mean { dims, .. } | OpKind::Sum { dims, .. } => {
            let xs = env.shape(x).to_vec();
            let (n_out, p) = reduce_params(&xs, dims, &[&strides(&xs)], &[]);
            if n_out == 0 {
                return Ok(Vec::new());
            }
            let mean = matches!(op.kind, OpKind::Mean { .. });
            vec![step(
                "reduce",
                "main",
                vec![("MEAN", b(mean))],
                p,
                Res::Tensor(out),
                vec![Res::Tensor(x)],
                env.grid(n_out, 1),
            )]
        }
        OpKind::MulMean { dims, .. } => {
            let (a, bb) = (op.inputs[0], op.inputs[1]);
            let full = crate::ir::broadcast(env.shape(a), env.shape(bb))?;
            let (sa, sb) = (
                broadcast_strides(env.shape(a), &full),
                broadcast_strides(env.shape(bb), &full),
            );
            // The extra scalar is the kernel's uniform zero (`mul_mean.wgsl`).
            let (n_out, p) = reduce_params(&full, dims, &[&sa, &sb], &[0]);
            if n_out == 0 {
                return Ok(Vec::new());
            }
            vec![step(
                "mul_mean",
                "main",
                vec![],
                p,
                Res::Tensor(out),
                vec![Res::Tensor(a), Res::Tensor(bb)],
                env.grid(n_out.div_ceil(64), 1),
            )]
        }
        OpKind::Linear {
            weight,
            act_quant,
            has_bias,
        } => linear(env, node, op, *weight, *act_quant, *has_bias)?,
        OpKind::MatMul { transpose_b } => matmul(env, op, *transpose_b)?,
        OpKind::Embedding { weight } => embedding(env, op, *weight)?,
        OpKind::Rope {
            style,
            rotary,
            seq_dim,
            start,
        } => {
            let xs = env.shape(x);
            let d = *xs.last().ok_or("rope of a scalar")?;
            let half = rotary / 2;
            let seq_len = *xs.get(*seq_dim).ok_or("rope seq_dim out of range")?;
            let table_rows = env.numel(op.inputs[1]).checked_div(half).unwrap_or(0);
            if n == 0 {
                return Ok(Vec::new());
            }
            let p = P::default()
                .u(n)
                .u(d)
                .u(half)
                .u(strides(xs)[*seq_dim])
                .u(seq_len)
                .u((env.slot)(*start) as usize)
                .u(table_rows);
            vec![step(
                "rope",
                "main",
                vec![("INTERLEAVED", b(*style == RopeStyle::Interleaved))],
                p,
                Res::Tensor(out),
                vec![
                    Res::Tensor(x),
                    Res::Tensor(op.inputs[1]),
                    Res::Tensor(op.inputs[2]),
                ],
                env.grid(n.div_ceil(WG), 1),
            )]
        }
        OpKind::Sdpa {
            layout,
            scale,
            causal,
            window,
            softcap,
            start,
            all_rows,
        } => sdpa(
            env,
            node,
            op,
            Attn {
                layout: *layout,
                scale: *scale,
                causal: *causal,
                window: *window,
                softcap: *softcap,
                start: *start,
                all_rows: *all_rows,
            },
        )?,
        // The rms_norm producing the rows stored them in the cache (`MemoryPlan::norm_cache`).
        OpKind::CacheUpdate { .. } if env.mem.cache_filled[node].is_some() => Vec::new(),
        OpKind::CacheUpdate { axis, start } => {
            let (cache, value) = (op.inputs[0], op.inputs[1]);
            let (cs, vs) = (env.shape(cache).to_vec(), env.shape(value).to_vec());
            if *axis >= cs.len() || vs.len() != cs.len() {
                return Err(format!("update of {vs:?} does not fit cache {cs:?}"));
            }
            let inner: usize = cs[axis + 1..].iter().product();
            let nv: usize = vs.iter().product();
            // An f16 cache takes a word (two elements of one row) per invocation.
            let f16 = env.mem.repr[cache] == Repr::F16;
            let per = if f16 { 2 } else { 1 };
            let mut steps = Vec::new();
            if nv > 0 {
                let p = P::default()
                    .u(nv)
                    .u(inner)
                    .u(vs[*axis])
                    .u(cs[*axis])
                    .u((env.slot)(*start) as usize);
                let (entry, mut inputs) = ("main", vec![Res::Tensor(value)]);
                let entry = match op.inputs.get(2) {
                    Some(&idx) => {
                        inputs.push(Res::Tensor(idx));
                        "indexed"
                    }
                    None => entry,
                };
                steps.push(step(
                    "cache_update",
                    entry,
                    vec![("CACHE_F16", b(f16))],
                    p,
                    Res::Tensor(cache),
                    inputs,
                    env.grid((nv / per).div_ceil(WG), 1),
                ));
            }
            if !aliases(env.graph, &op.kind, out, cache) {
                let conv = convert(env, cache, out, false);
                steps.extend(gather(env, cache, out, &[n], &[1], &[1], 0, None, conv));
            }
            steps
        }
        OpKind::Reshape { .. } => {
            if aliases(env.graph, &op.kind, out, x) {
                Vec::new()
            } else {
                let conv = convert(env, x, out, false);
                gather(env, x, out, &[n], &[1], &[1], 0, None, conv)
            }
        }
        // A view in this call: its readers read x (`views`).
        OpKind::Permute { .. } | OpKind::Select { .. }
            if env.view_of[env.mem.root[out]] != env.mem.root[out] =>
        {
            Vec::new()
        }
        OpKind::Permute { perm } => {
            let st = strides(env.shape(x));
            let src: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
            gather(
                env,
                x,
                out,
                &oshape,
                &src,
                &strides(&oshape),
                0,
                None,
                convert(env, x, out, false),
            )
        }
        OpKind::Slice {
            dim,
            start,
            step: stp,
            ..
        } => {
            let xs = env.shape(x);
            let mut st = strides(xs);
            let base = st[*dim];
            st[*dim] *= stp;
            let dynamic = Some((*start, xs[*dim], base));
            gather(
                env,
                x,
                out,
                &oshape,
                &st,
                &strides(&oshape),
                0,
                dynamic,
                convert(env, x, out, false),
            )
        }
        OpKind::Select { dim, index } => {
            let xs = env.shape(x);
            let mut st = strides(xs);
            let base = st.remove(*dim);
            let dynamic = Some((*index, xs[*dim], base));
            gather(
                env,
                x,
                out,
                &oshape,
                &st,
                &strides(&oshape),
                0,
                dynamic,
                convert(env, x, out, false),
            )
        }
        OpKind::Concat { dim } => {
            let ost = strides(&oshape);
            let mut at = 0;
            let mut steps = Vec::new();
            for &part in &op.inputs {
                let ps = env.shape(part).to_vec();
                steps.extend(gather(
                    env,
                    part,
                    out,
                    &ps,
                    &strides(&ps),
                    &ost,
                    at * ost[*dim],
                    None,
                    convert(env, part, out, false),
                ));
                at += ps[*dim];
            }
            steps
        }
        OpKind::Expand { .. } => {
            let src = broadcast_strides(env.shape(x), &oshape);
            gather(
                env,
                x,
                out,
                &oshape,
                &src,
                &strides(&oshape),
                0,
                None,
                convert(env, x, out, false),
            )
        }
        OpKind::IndexSelect { dim } => {
            let xs = env.shape(x);
            let idx = op.inputs[1];
            let inner: usize = xs[dim + 1..].iter().product();
            if n == 0 {
                return Ok(Vec::new());
            }
            let p = P::default().u(n).u(inner).u(env.numel(idx)).u(xs[*dim]);
            vec![step(
                "layout",
                "index_select",
                vec![("IDX_INT", b(env.int(idx)))],
                p,
                Res::Tensor(out),
                vec![Res::Tensor(x), Res::Tensor(idx)],
                env.grid(n.div_ceil(WG), 1),
            )]
        }
        OpKind::Full { value, .. } => {
            if n == 0 {
                return Ok(Vec::new());
            }
            let bits = if out_float {
                (*value as f32).to_bits()
            } else {
                (*value as i64).clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32
            };
            vec![step(
                "full",
                "main",
                vec![],
                P::default().u(n).u(bits as usize),
                Res::Tensor(out),
                vec![],
                env.grid(n.div_ceil(WG), 1),
            )]
        }
        OpKind::Arange {
            start, step: by, ..
        } => {
            if n == 0 {
                return Ok(Vec::new());
            }
            vec![step(
                "full",
                "arange",
                vec![("OUT_INT", b(!out_float))],
                P::default().u(n).u((env.slot)(*start) as usize).i(*by),
                Res::Tensor(out),
                vec![],
                env.grid(n.div_ceil(WG), 1),
            )]
        }
    })
}

/// Packed words hold 8 nibbles or 4 bytes; the mat-vec kernel needs whole words per row and per
/// group.
fn matvec_aligned(weight: Weight, k: usize) -> bool {
    match weight {
        Weight::F32 => true,
        Weight::Q4 { group } => group % 8 == 0 && k % 8 == 0 && k % group == 0,
        Weight::Q8 { group } => group % 4 == 0 && k % 4 == 0 && k % group == 0,
    }
}

/// `(TEAM, WG, RPT)` of the `matvec` kernel for a weight of `n` rows of `k` and `m` rows of x,
/// or `None` where its 16-byte quads would straddle a group (or K). A team of lanes shares RPT
/// rows and walks the quads TEAM apart. A mat-vec is latency-bound unless it reads hundreds of
/// MB: up to `SIZED_ROWS` rows, teams (of one row for one row of x, of 4 for a prompt's
/// several) widen until the grid holds about as many invocations as measured best; more rows
/// (an LM head) keep narrow teams of up to 4 rows. A row's arithmetic depends on TEAM, not
/// RPT. `PTERIA_MATVEC_TUNE=TEAM,WG[,RPT]` overrides, for benchmark sweeps.
fn quad_matvec(weight: Weight, k: usize, n: usize, m: usize) -> Option<(usize, usize, usize)> {
    let per_quad = match weight {
        Weight::F32 => 4,
        Weight::Q4 { group } if group % 32 == 0 => 32,
        Weight::Q8 { group } if group % 16 == 0 => 16,
        _ => return None,
    };
    if k % per_quad != 0 {
        return None;
    }
    static TUNE: std::sync::OnceLock<Option<(usize, usize, usize)>> = std::sync::OnceLock::new();
    let tune = TUNE.get_or_init(|| {
        let v = std::env::var("PTERIA_MATVEC_TUNE").ok()?;
        let mut it = v.split(',').map(|t| t.trim().parse::<usize>().ok());
        let (t, w) = (it.next()??, it.next()??);
        let r = it.next().flatten().unwrap_or(4);
        let ok = t.is_power_of_two()
            && (4..=256).contains(&t)
            && w.is_power_of_two()
            && matches!(r, 1 | 2 | 4);
        (ok && w >= t && w <= 256).then_some((t, w, r))
    });
    if let Some(t) = *tune {
        return Some(t);
    }
    let quads = k / per_quad;
    if n <= SIZED_ROWS && m > 1 {
        // A prompt: teams of 4 weight rows, so each lane has 4 rows' loads in flight, widened
        // until the grid holds about `MULTI_LANES` invocations (for each group of `x_rows`);
        // from `NARROW_M` rows teams stay 4 lanes wide.
        let mut team = 4;
        while m < NARROW_M && team < 256 && team < quads && n.div_ceil(4) * team * 2 <= MULTI_LANES
        {
            team *= 2;
        }
        return Some((team, team.max(128), 4));
    }
    if n <= SIZED_ROWS {
        // Measured on an H200 (`pteria bench --kernels`, 8da4w at E2B shapes, sweeps of
        // PTERIA_MATVEC_TUNE): about 192k invocations in 256-wide workgroups, a row a team,
        // beat one quad a lane in 64-wide ones by 3-12% a shape (1536->6144 9.14 -> 8.16 us,
        // 12288->1536 13.53 -> 12.52). A team is never wider than the row's quads need.
        let mut team = 4;
        while team < 256 && team < quads && n * team * 2 <= 196_608 {
            team *= 2;
        }
        return Some((team, 256, 1));
    }
    // Measured on an H100: lanes with one quad each beat two (5.0 against 6.0 us per link of a
    // chain of dependent 1536x1536 4-bit mat-vecs); then fewer rows per team until 128k
    // invocations (E2B-shaped decode step 4.86 -> 4.77 ms of GPU time; 64k: 4.80, 256k: 4.78).
    // 64-wide workgroups do as well as larger ones for narrow teams. Many rows (the LM head)
    // keep narrower teams: it is bandwidth-bound.
    let mut team = 4;
    while team < 256 && team < quads && (n.div_ceil(4) * team < 131072 || quads > 8 * team) {
        team *= 2;
    }
    let mut rpt = 4;
    while rpt > 1 && n.div_ceil(rpt) * team < 131072 {
        rpt /= 2;
    }
    Some((team, team.max(64), rpt))
}

/// Invocations `quad_matvec` aims for where a mat-vec takes several rows of x (a prompt), its
/// teams owning 4 weight rows each in 128-wide workgroups, each doing every row of x's work.
/// Measured on an H200, TTFT of the E2B-shaped program (2 runs each) against the two rules
/// before it (about 49152 invocations of one row a team under 128 tokens, teams of 8 lanes
/// from 128): 16 tokens 13.65-13.73 ms against 13.98-14.01, 32 16.00-16.02 against
/// 16.73-17.12, 64 19.93-20.18 against 22.25-22.47, 127 28.00-28.22 against 32.64-32.77, 128
/// 28.25-28.27 against 28.35-28.49, 512 81.56-81.92 against 81.52-81.72, 1023 158.1-158.2
/// against 157.5-157.6. At 6144, 16 tokens took 14.2 ms; at 24576, 512 took 85.6.
const MULTI_LANES: usize = 12_288;

/// Rows of x each workgroup of a prompt's int8 quad mat-vec takes (linear.wgsl `XROWS`): each
/// weight quad, loaded and unpacked once, meets them all from registers. One for every 8 rows
/// of the prompt, a power of two up to 8, so that a short prompt still spreads over the GPU.
/// H100, TTFT of the E2B-shaped program (2 runs each) with 1 / 2 / 4 / 8 rows a workgroup: 16
/// tokens 7.08 / 7.06-7.49 / 7.42-7.53 / 8.15-8.64 ms, 32 10.88-11.03 / 10.18-10.31 /
/// 9.99-10.25 / 10.23-10.65, 64 16.0-16.6 / 14.0-14.2 / 13.5-13.95 / 13.6, 128 26.0-27.0 /
/// 21.7-21.8 / 20.8-21.0 / 20.0-20.3, 256 44.7-45.0 / 37.2-37.3 / 35.0-35.1 / 33.2-33.6, 512
/// 83.1-83.3 / 67.0-67.5 / 63.0-63.8 / 59.0-60.1, 1023 160.3-160.8 / 128.9-129.3 /
/// 120.3-125.7 / 111.8-112.2.
pub(crate) fn x_rows(m: usize) -> usize {
    let r = (m / 8).clamp(1, 8);
    if r.is_power_of_two() {
        r
    } else {
        r.next_power_of_two() / 2
    }
}

/// Rows of x from which a prompt's quad mat-vec teams stay 4 lanes wide: the grid is big enough
/// with 8 rows of x a workgroup. H100, TTFT of the E2B-shaped program, teams of 4 against the
/// `MULTI_LANES` sizing (8 rows a workgroup): 256 tokens 32.1 ms against 33.2-33.6, 512 56.6
/// against 59.0-60.1, 1023 106.3 against 111.8-112.2; 128 21.4 against 20.0-20.3.
const NARROW_M: usize = 256;

/// Rows up to which `quad_matvec` sizes for latency (more, an LM head, read for bandwidth).
const SIZED_ROWS: usize = 65536;

/// Subgroup runs a reduction reads after one barrier (common.wgsl `FLAT_RUNS`).
const FLAT_RUNS: usize = 32;

/// Outputs per workgroup of `matvec_q` (its `ROWS`).
const MATVEC_ROWS: usize = 8;

/// A chain's steps as chain.wgsl specialises them: the STEPS / STEP<s> constants (kind, op code,
/// input, operand first) and each step's two f32 words (a scalar, or the clamp bounds) appended
/// to `p`.
fn chain_steps(mut p: P, steps: &[ChainStep]) -> (P, Vec<(&'static str, f64)>) {
    const NAMES: [&str; CHAIN_STEPS] = ["STEP0", "STEP1", "STEP2", "STEP3", "STEP4", "STEP5"];
    let f = |v: f64| (v as f32).to_bits() as usize;
    let mut consts = vec![("STEPS", steps.len() as f64)];
    let mut words = Vec::with_capacity(2 * CHAIN_STEPS);
    for (st, name) in steps.iter().zip(NAMES) {
        let (kind, code, input, first, w) = match *st {
            ChainStep::Unary(u) => (0, u as usize, 0, false, [0, 0]),
            ChainStep::Binary {
                op,
                input,
                operand_first,
            } => (1, op as usize, input, operand_first, [0, 0]),
            ChainStep::Scalar {
                op,
                scalar,
                scalar_first,
            } => (2, op as usize, 0, scalar_first, [f(scalar), 0]),
            ChainStep::Clamp { min, max } => (
                3,
                0,
                0,
                false,
                [
                    f(min.unwrap_or(f64::NEG_INFINITY)),
                    f(max.unwrap_or(f64::INFINITY)),
                ],
            ),
        };
        consts.push((
            name,
            (kind | code << 2 | input << 8 | (first as usize) << 10) as f64,
        ));
        words.extend(w);
    }
    p = p.arr(&words, 4 * 3);
    (p, consts)
}

/// RmsNorm, and RmsNormChain (`chain`: the norm's chain input and the steps; the chain's other
/// inputs follow x and the weight).
/// What an rms_norm kernel does with the normed row besides storing it.
enum NormThen<'a> {
    Store,
    /// RmsNormChain: the norm's chain input and the steps.
    Chain(usize, &'a [ChainStep]),
    /// RmsNormRope: the rotation's style, rotary dims, seq dim and start.
    Rope(RopeStyle, usize, usize, Int),
}

/// RmsNorm, RmsNormChain and RmsNormRope: inputs x, the weight if `has_w`, then the chain's
/// other inputs or the cos/sin tables.
fn rms_norm(
    env: &Env,
    node: usize,
    op: &Op,
    eps: f32,
    has_w: bool,
    then: NormThen,
) -> Result<Vec<Step>, String> {
    let chain = match then {
        NormThen::Chain(k, steps) => Some((k, steps)),
        _ => None,
    };
    let out = op.outputs[0];
    let oshape = env.shape(out).to_vec();
    let n = env.numel(out);
    let d = *oshape.last().ok_or("rms_norm of a scalar")?;
    let rows = n.checked_div(d).unwrap_or(0);
    // A norm whose rows the norm before it normed again in its own dispatch (`norm_pair`), or
    // that a later norm's dispatch stores into its cache (`kv_norms`).
    if rows == 0
        || env.mem.paired_norm[node].is_some_and(|a| norm_pair(env, a).is_some())
        || env.mem.kv_guest_of[node].is_some_and(|h| kv_norms(env, h).is_some())
        || env.mem.kv_split_of[node].is_some_and(|a| kv_split(env, a).is_some())
    {
        return Ok(Vec::new());
    }
    // The linear that alone reads this norm's row norms it in its mat-vec.
    if env.mem.quant_into[node].is_some_and(|l| norm_loaded(env, l).is_some()) {
        return Ok(Vec::new());
    }
    let pair = norm_pair(env, node);
    let w = if has_w {
        Res::Tensor(op.inputs[1])
    } else {
        Res::Dummy
    };
    let others = &op.inputs[1 + has_w as usize..];
    let shapes: Vec<&[usize]> = others.iter().map(|&t| env.shape(t)).collect();
    let one = |k: usize| {
        shapes
            .get(k)
            .is_some_and(|s| s.iter().product::<usize>() == 1)
    };
    let bcast =
        chain.is_some() && (0..shapes.len()).any(|k| shapes[k] != oshape.as_slice() && !one(k));
    let eps2 = pair.as_ref().map_or(0.0, |(_, e, _, _)| *e);
    let mut p = P::default().u(rows).u(d).f(eps).f(eps2);
    let mut consts = vec![
        ("HAS_W", b(has_w)),
        ("CHAIN", b(chain.is_some())),
        (
            "N_OPS",
            if chain.is_some() { others.len() } else { 0 } as f64,
        ),
        ("BCAST", b(bcast)),
        ("OP0_ONE", b(one(0))),
        ("OP1_ONE", b(one(1))),
    ];
    if let Some((norm_input, steps)) = chain {
        p = p
            .u(steps.len())
            .u(norm_input)
            .u(oshape.len())
            .u(0)
            .arr(&oshape, 8);
        for k in 0..CHAIN_INPUTS - 1 {
            p = match shapes.get(k) {
                Some(s) => p.arr(&broadcast_strides(s, &oshape), 8),
                None => p.arr(&[], 8),
            };
        }
        let (q, c) = chain_steps(p, steps);
        p = q;
        consts.extend(c);
    }
    if let NormThen::Rope(style, rotary, seq_dim, start) = then {
        let xs = env.shape(op.inputs[0]);
        let half = rotary / 2;
        let seq_len = *xs.get(seq_dim).ok_or("rope seq_dim out of range")?;
        let table_rows = env.numel(others[0]).checked_div(half).unwrap_or(0);
        // The rotation's words follow the chain's (rms_norm.wgsl `Params`).
        p.0.resize(44, 0);
        p = p
            .u(half)
            .u(strides(xs)[seq_dim])
            .u(seq_len)
            .u((env.slot)(start) as usize)
            .u(table_rows);
        consts.extend([
            ("ROPE", 1.0),
            ("INTERLEAVED", b(style == RopeStyle::Interleaved)),
            ("ROPE_D", d as f64),
        ]);
    }
    let vec4 = d % 4 == 0;
    let (wg, lanes) = norm_workgroup(env, if vec4 { d / 4 } else { d });
    consts.extend([
        ("WG", wg as f64),
        ("SG_LANES", lanes as f64),
        ("NORM_WG", wg as f64),
        ("NORM_LANES", lanes as f64),
    ]);
    let mut inputs = vec![Res::Tensor(op.inputs[0]), w];
    inputs.extend(others.iter().map(|&t| Res::Tensor(t)));
    inputs.resize(2 + CHAIN_INPUTS - 1, Res::Dummy);
    let mut s = step(
        "rms_norm",
        if vec4 { "main4" } else { "main" },
        consts,
        p,
        Res::Tensor(out),
        inputs,
        env.grid(rows, 1),
    );
    // The rows go straight into the KV cache that their only reader, an update, writes: at the
    // cache rows the update's indices (or its start) name, as cache_update.wgsl places them.
    if let Some(u) = env.mem.norm_cache[node] {
        let up = env.op(u).ok_or("a fused cache update is not an op")?;
        let OpKind::CacheUpdate { axis, start } = up.kind else {
            return Err("a fused cache update is not one".into());
        };
        let cache = up.inputs[0];
        let (cs, vs) = (env.shape(cache), env.shape(out));
        if !vec4 || axis + 2 != vs.len() || cs.len() != vs.len() {
            return Err(format!("rows of {vs:?} cannot go into cache {cs:?}"));
        }
        // Words 49.. of rms_norm.wgsl's `Params`, after the rotation's.
        s.params.resize(49, 0);
        s.params.extend([
            cs[axis] as u32,
            vs[axis] as u32,
            (env.slot)(start),
            (up.inputs.len() > 2) as u32,
        ]);
        s.out = Res::Tensor(cache);
        s.inputs
            .push(up.inputs.get(2).map_or(Res::Dummy, |&i| Res::Tensor(i)));
        s.entry = "main4_cache";
        // The earlier norm's rows go into its cache at the same rows, from the workgroups
        // after this one's: its input at binding 8, its cache at 9, its eps as eps2 (word 3)
        // and its rows in word 7 (rms_norm.wgsl `main4_cache_kv`).
        if let Some((gop, geps, gcache)) = kv_norms(env, node) {
            s.params[3] = geps.to_bits();
            s.params[7] = rows as u32;
            s.inputs.push(Res::Tensor(gop.inputs[0]));
            s.writes = vec![Res::Tensor(gcache)];
            s.groups = env.grid(2 * rows, 1);
            s.entry = "main4_cache_kv";
        }
        return Ok(vec![s]);
    }
    // This norm's rows are normed again by the norm that reads them, which then quantizes them
    // for its linear (rms_norm.wgsl `main4_pair`); that norm dispatches nothing.
    if let Some((bop, _, l, quant)) = pair {
        let has_w2 = bop.inputs.len() > 1;
        s.constants.extend([
            ("QUANT", if quant.nibble_order { 1.0 } else { 2.0 }),
            ("XNN_ROUNDING", b(quant.xnn)),
            ("QROW", (d / 4) as f64),
            ("HAS_W2", b(has_w2)),
        ]);
        s.writes = vec![Res::ScratchOf(l, 0)];
        s.reads_after = vec![bop.inputs.get(1).map_or(Res::Dummy, |&t| Res::Tensor(t))];
        s.entry = "main4_pair";
        return Ok(vec![s]);
    }
    // The quantized linear reading this norm's rows takes them packed from here (quant.wgsl).
    if let Some((l, quant)) =
        env.mem.quant_into[node].and_then(|l| Some((l, prequantized(env, l)?)))
    {
        s.constants.extend([
            ("QUANT", if quant.nibble_order { 1.0 } else { 2.0 }),
            ("XNN_ROUNDING", b(quant.xnn)),
            // The row's words in workgroup memory, up to 8 KiB (beside up to 6 KiB of
            // reductions at 512 invocations, within WebGPU's 16 KiB).
            (
                "QROW",
                if d <= NORM_PAIR_MAX_D {
                    (d / 4).max(1) as f64
                } else {
                    1.0
                },
            ),
        ]);
        s.writes = vec![Res::ScratchOf(l, 0)];
        s.entry = "main4_quant";
    }
    Ok(vec![s])
}

/// A norm's workgroup for rows of `units` elements or 16-byte words, and the lanes its reductions
/// sum by subgroup shuffles: about one unit per invocation, as a row's latency is the cost.
fn norm_workgroup(env: &Env, units: usize) -> (usize, usize) {
    let max_wg = (env.max_invocations as usize).clamp(32, 1024);
    let mut wg = units.next_power_of_two().clamp(32, max_wg);
    if let Some(sg) = env.subgroup.map(|s| s as usize) {
        // Whole subgroups to the row's length where the reductions read the runs after one
        // barrier (common.wgsl `FLAT_RUNS`); a tree needs a power of two.
        let fit = units.div_ceil(sg) * sg;
        if (32..=max_wg).contains(&fit) && fit / sg <= FLAT_RUNS {
            wg = fit;
        }
    }
    (wg, env.subgroup.map_or(1, |s| wg.min(s as usize)))
}

/// A rotated rms_norm as attention's split norms it itself (sdpa.wgsl `split_normed`, and
/// `split_kv` for the new k): its op, weight and style, its tables, its words and its
/// workgroup.
struct RopeNorm<'a> {
    op: &'a Op,
    weighted: bool,
    interleaved: bool,
    cos: TensorId,
    sin: TensorId,
    /// eps, half, seq_stride, seq_len, start slot, table rows (sdpa.wgsl `Params`).
    words: (f32, [usize; 5]),
    /// The norm's workgroup and subgroup lanes (`norm_workgroup`).
    wg: usize,
    lanes: usize,
}

/// Node `n` as a `RopeNorm`, where it is a rotated rms_norm of rows in 16-byte words that
/// rotates some dims.
fn rope_norm<'a>(env: &'a Env, n: usize) -> Option<RopeNorm<'a>> {
    let op = env.op(n)?;
    let OpKind::RmsNormRope {
        eps,
        weighted,
        style,
        rotary,
        seq_dim,
        start,
    } = op.kind
    else {
        return None;
    };
    let xs = env.shape(op.inputs[0]);
    let d = *xs.last()?;
    let w = weighted as usize;
    let (cos, sin) = (*op.inputs.get(1 + w)?, *op.inputs.get(2 + w)?);
    let half = rotary / 2;
    let (wg, lanes) = norm_workgroup(env, d / 4);
    (seq_dim < xs.len() && half > 0 && d % 4 == 0).then(|| RopeNorm {
        op,
        weighted,
        interleaved: style == RopeStyle::Interleaved,
        cos,
        sin,
        words: (
            eps,
            [
                half,
                strides(xs)[seq_dim],
                xs[seq_dim],
                (env.slot)(start) as usize,
                env.numel(cos) / half,
            ],
        ),
        wg,
        lanes,
    })
}

/// The rotated rms_norm whose rows attention `a` reads as q (`MemoryPlan::q_norm`), where this
/// call splits the keys, reads q in the norm's storage (the permutes on the way are views), the
/// rows are the heads' (16-byte words), the norm's workgroup fits split's, and the device binds
/// 9 storage buffers. Both ask, so they agree.
fn q_normed<'a>(env: &'a Env, a: usize) -> Option<RopeNorm<'a>> {
    let nn = env.mem.q_norm.get(a).copied().flatten()?;
    let aop = env.op(a)?;
    let OpKind::Sdpa { layout, .. } = aop.kind else {
        return None;
    };
    let dims = attn_dims(env, aop, layout)?;
    let qn = rope_norm(env, nn)?;
    let out = qn.op.outputs[0];
    let d = *env.shape(out).last()?;
    let same_storage = env.view_of[env.mem.root[aop.inputs[0]]] == env.mem.root[out];
    let ok = dims.s <= split_max_s(env.graph, aop, env.mem.max_binding)
        && same_storage
        && d == dims.d
        && env.shape(qn.op.inputs[0]) == env.shape(out)
        && env.numel(out) == dims.b * dims.s * dims.hq * d
        && qn.wg <= SPLIT_WG
        && env.max_storage >= WIDE_BINDINGS;
    ok.then_some(qn)
}

/// An attention's dimensions in this call, from its 4-D q and k in `layout`.
fn attn_dims(env: &Env, op: &Op, layout: AttnLayout) -> Option<AttnDims> {
    let (qs, ks) = (env.shape(op.inputs[0]), env.shape(op.inputs[1]));
    (qs.len() == 4 && ks.len() == 4)
        .then(|| layout.dims(qs, ks))
        .flatten()
}

/// What `split_kv` (sdpa.wgsl) takes for the k norm and its v guest that store this step's new
/// rows into the caches it reads (`MemoryPlan::kv_split`).
struct KvSplit<'a> {
    k: &'a Op,
    v: &'a Op,
    weighted: bool,
    /// The update's indices, where it has them (else its start).
    indices: Option<TensorId>,
    /// k eps, v eps; the k rotation's half, seq_stride, seq_len, start slot, table rows; the
    /// update's start slot, the caches' rows, and whether the indices name the row (sdpa.wgsl
    /// `Params`).
    words: (f32, f32, [usize; 8]),
}

/// For attention `a` that norms its q: the k and v norms storing into its caches, where this
/// call's split may norm and store their rows itself: one query and batch, a row a kv head in
/// the attention's head dim, f32 caches (either layout: split stores by the caches' strides)
/// updated along their rows, the k rotation by q's tables, the norms' workgroups q's, and a
/// device binding 13 storage buffers. Both the norms and the attention ask, so they agree.
fn kv_split<'a>(env: &'a Env, a: usize) -> Option<KvSplit<'a>> {
    let h = env.mem.kv_split.get(a).copied().flatten()?;
    let qn = q_normed(env, a)?;
    let kn = rope_norm(env, h)?;
    let (vop, v_eps, _) = kv_norms(env, h)?;
    let aop = env.op(a)?;
    let up = env.op(env.mem.norm_cache.get(h).copied().flatten()?)?;
    let OpKind::CacheUpdate {
        axis,
        start: kv_start,
    } = up.kind
    else {
        return None;
    };
    let OpKind::Sdpa { layout, .. } = aop.kind else {
        return None;
    };
    let dims = attn_dims(env, aop, layout)?;
    let xs = env.shape(kn.op.inputs[0]);
    let d = *xs.last()?;
    let cs = env.shape(up.inputs[0]);
    let f32_caches = [aop.inputs[1], aop.inputs[2]]
        .iter()
        .all(|&c| env.mem.repr[env.mem.root[c]] == Repr::F32);
    let ok = dims.s == 1
        && dims.b == 1
        && d == dims.d
        && env.numel(kn.op.inputs[0]) == dims.hkv * d
        && env.shape(vop.inputs[0]) == xs
        && cs.get(axis) == Some(&dims.cl)
        && f32_caches
        && (kn.cos, kn.sin) == (qn.cos, qn.sin)
        && kn.interleaved == qn.interleaved
        && (kn.wg, kn.lanes) == (qn.wg, qn.lanes)
        && env.max_storage >= KV_SPLIT_BINDINGS;
    let (k_eps, [half, seq_stride, seq_len, start, table_rows]) = kn.words;
    ok.then(|| KvSplit {
        k: kn.op,
        v: vop,
        weighted: kn.weighted,
        indices: up.inputs.get(2).copied(),
        words: (
            k_eps,
            v_eps,
            [
                half,
                seq_stride,
                seq_len,
                start,
                table_rows,
                (env.slot)(kv_start) as usize,
                dims.cl,
                (up.inputs.len() > 2) as usize,
            ],
        ),
    })
}

/// Storage buffers `split_kv` binds.
const KV_SPLIT_BINDINGS: u32 = 13;

/// For a norm storing into a KV cache whose dispatch may also run an earlier one's
/// (`MemoryPlan::kv_guest`): that norm, its eps and its cache, where this call gives both the
/// same rows in 16-byte words and the device binds 9 storage buffers. Both ask, so they agree.
fn kv_norms<'a>(env: &'a Env, h: usize) -> Option<(&'a Op, f32, TensorId)> {
    let e = env.mem.kv_guest.get(h).copied().flatten()?;
    let u = env.mem.norm_cache.get(e).copied().flatten()?;
    let (hop, eop, up) = (env.op(h)?, env.op(e)?, env.op(u)?);
    let OpKind::RmsNorm { eps } = eop.kind else {
        return None;
    };
    let (ho, eo) = (env.shape(hop.outputs[0]), env.shape(eop.outputs[0]));
    let ok = ho == eo && ho.last().is_some_and(|d| d % 4 == 0) && env.max_storage >= WIDE_BINDINGS;
    ok.then_some((eop, eps, *up.inputs.first()?))
}

/// The longest row a quantizing norm keeps in workgroup memory (`QROW`), and so the longest a
/// norm pair takes.
const NORM_PAIR_MAX_D: usize = 2048;

/// For rms_norm `a` whose rows the plain norm `MemoryPlan::norm_pair` reads: that norm's op and
/// eps, its linear and how it packs for it, where in this call `a`'s dispatch runs it: the
/// linear takes its input packed (so the second norm's f32 rows need not be stored) and the row
/// fits one 16-byte word an invocation and workgroup memory. Both norms ask, so they agree.
fn norm_pair<'a>(env: &Env<'a>, a: usize) -> Option<(&'a Op, f32, usize, Prequant)> {
    let b = env.mem.norm_pair.get(a).copied().flatten()?;
    let bop = env.op(b)?;
    let OpKind::RmsNorm { eps } = bop.kind else {
        return None;
    };
    let l = env.mem.quant_into[b]?;
    let quant = prequantized(env, l)?;
    let d = *env.shape(bop.outputs[0]).last()?;
    let x = bop.inputs[0];
    let same = env.shape(x).last() == Some(&d)
        && env.numel(x) == env.numel(bop.outputs[0])
        && env.op(a).is_some_and(|aop| {
            env.numel(aop.outputs[0]) == env.numel(x)
                && env.shape(aop.outputs[0]).last() == Some(&d)
        });
    let fits = d % 4 == 0 && d <= NORM_PAIR_MAX_D && d / 4 <= env.max_invocations as usize;
    (same && fits).then_some((bop, eps, l, quant))
}

/// Rows of x up to which any linear the mat-vec kernels take (weights re-read per row) runs as
/// a mat-vec; quantized ones with 16-byte quads go on to `QUAD_MATVEC_MAX_M`.
const MATVEC_MAX_M: usize = 8;

/// Rows of x up to which a quantized linear with 16-byte quads runs as the quad mat-vec (its
/// rows next to each other in the grid, so that a block of weights serves them all from the
/// cache). The tiled kernel's few workgroups (a 64-column tile each) leave a big GPU idle at
/// short prompts: on an H200 the E2B-shaped program's prefill of 16 tokens took 51.7 ms tiled
/// and 16.1 as mat-vecs, 64 tokens 54.3 and 31.4, 128 tokens 62.8 and 51.2. Since the
/// mat-vecs got a sizing for many rows (`MULTI_LANES`; first in `bb388d1`) they win at every
/// prompt that program takes (TTFT on an H200, tiled → mat-vec, with that first sizing: 160
/// tokens 68.5 → 39.1 ms, 256 77.4 → 55.1, 512 134.1 → 100.8, 900 220.7 → 175.7, 1023 230.4 →
/// 195.8), and past it (`pteria bench --kernels --rows`, H200, 8da4w at E2B shapes: at 1025
/// rows tiled 103-2694 µs against 35-770 as mat-vecs, 2.9-3.5x; at 2048 and 4096 rows 1.8-2.7x;
/// at 16385-24576 rows 2.1-2.5x; past that erratic for 1536-row outputs: at 28672 rows one
/// shape 6% slower and the rest 1.4-2.2x faster, at 32768 12288→1536 49.8-63.0 ms against 62.6
/// and the rest 2.0-2.3x; README).
/// Past this many (no program here takes such calls; a 12288-wide f32 x of 65536 rows is past a
/// 2 GiB binding anyway) they are tiled; the mat-vec's grid (rows of x / 8 workgroups across)
/// stays far below any device's limit.
pub const QUAD_MATVEC_MAX_M: usize = 32768;

/// Whether a linear of `m` rows of x (k → n) runs as a mat-vec rather than tiled.
fn matvec_rows(env: &Env, weight: Weight, k: usize, n: usize, m: usize) -> bool {
    let quad = !matches!(weight, Weight::F32) && quad_matvec(weight, k, n, 1).is_some();
    matvec_aligned(weight, k) && (m <= MATVEC_MAX_M || (quad && m <= env.quad_rows))
}

/// For the lead of a paired linear whose outputs only a chain of the two reads
/// (`MemoryPlan::glu_chain`): that chain's node and steps, and whether its input 0 is the lead's
/// output, where this call runs the pair as one quad mat-vec (decode) that stores the chain's
/// result instead of the two outputs.
pub(crate) fn glu_fused<'a>(env: &'a Env, lead: usize) -> Option<(usize, &'a [ChainStep], bool)> {
    let c = env.mem.glu_chain.get(lead).copied().flatten()?;
    let second = env.mem.partner.get(lead).copied().flatten()?;
    let (op, op2, chain) = (env.op(lead)?, env.op(second)?, env.op(c)?);
    let (
        OpKind::Linear {
            weight, act_quant, ..
        },
        OpKind::ElementwiseChain { steps },
    ) = (&op.kind, &chain.kind)
    else {
        return None;
    };
    let k = *env.shape(op.inputs[0]).last()?;
    let m = env.numel(op.inputs[0]).checked_div(k)?;
    let rows = env.shape(op.outputs[0]).last()? + env.shape(op2.outputs[0]).last()?;
    let fused = if *act_quant == crate::ir::ActQuant::Xnnpack {
        xnn_matvec_of(env, op, m, k).is_some()
    } else {
        matvec_rows(env, *weight, k, rows, m) && quad_matvec(*weight, k, rows, m).is_some()
    };
    fused.then_some((c, steps.as_slice(), chain.inputs[0] == op.outputs[0]))
}

/// Whether a linear with activation quantization reads its input as `act_quant_packed` int8
/// words (the decode mat-vec and XNNPACK's exact GEMM) rather than quantize-dequantized floats.
fn int_x(
    env: &Env,
    weight: Weight,
    act_quant: crate::ir::ActQuant,
    k: usize,
    n: usize,
    m: usize,
) -> bool {
    let kind_q = !matches!(weight, Weight::F32);
    let matvec = matvec_rows(env, weight, k, n, m);
    let xnn_exact = act_quant == crate::ir::ActQuant::Xnnpack && kind_q;
    act_quant != crate::ir::ActQuant::None
        && kind_q
        && ((matvec && quad_matvec(weight, k, n, 1).is_some())
            || (xnn_exact && matvec_aligned(weight, k)))
}

/// A linear's weight format, activation quantization and rows (m of k, n out) in this call,
/// with the op `by` that a fusion joins it to (the producer of its input).
struct LinearCall<'a> {
    weight: Weight,
    act_quant: crate::ir::ActQuant,
    m: usize,
    k: usize,
    n: usize,
    by: &'a Op,
}

fn linear_call<'a>(env: &'a Env, l: usize, by: usize) -> Option<LinearCall<'a>> {
    let (lop, by) = (env.op(l)?, env.op(by)?);
    let OpKind::Linear {
        weight, act_quant, ..
    } = lop.kind
    else {
        return None;
    };
    let x = lop.inputs[0];
    let k = *env.shape(x).last()?;
    let n = *env.shape(lop.outputs[0]).last()?;
    let m = env.numel(x).checked_div(k)?;
    Some(LinearCall {
        weight,
        act_quant,
        m,
        k,
        n,
        by,
    })
}

/// Slots (pairs of words) per site of the ranges buffer: a producer's workgroups spread their
/// atomics over them, so that thousands of them do not queue on one word.
pub(crate) const RANGE_SLOTS: usize = 256;

/// The word of the ranges buffer where linear `l`'s input's producer (`MemoryPlan::range_by`)
/// leaves the range of what it stores for this call, when both take that path: `l` quantizes one
/// row (decode) into int8 words, and the producer is the gate/up mat-vec storing its chain or an
/// attention split over workgroups, storing exactly `l`'s row. Both ask, so they agree.
pub(crate) fn ranged(env: &Env, l: usize) -> Option<u32> {
    let pn = env.mem.range_by.get(l).copied().flatten()?;
    let site = env.mem.range_site.get(l).copied().flatten()?;
    let LinearCall {
        weight,
        act_quant,
        m,
        k,
        n,
        by: pop,
    } = linear_call(env, l, pn)?;
    if m != 1 || !int_x(env, weight, act_quant, k, n, 1) {
        return None;
    }
    let stored = match pop.kind {
        OpKind::Linear { .. } => {
            let (c, _, _) = glu_fused(env, pn)?;
            env.op(c)?.outputs[0]
        }
        OpKind::Sdpa { layout, .. } => {
            if attn_dims(env, pop, layout)?.s > split_max_s(env.graph, pop, env.mem.max_binding) {
                return None;
            }
            pop.outputs[0]
        }
        _ => return None,
    };
    (env.numel(stored) == k).then_some((site * 2 * RANGE_SLOTS) as u32)
}

/// Elements in a 16-byte quad of a packed weight (the quad mat-vec's unit); None for f32.
fn packed_quad(weight: Weight) -> Option<usize> {
    match weight {
        Weight::Q4 { .. } => Some(32),
        Weight::Q8 { .. } => Some(16),
        Weight::F32 => None,
    }
}

/// The longest row a linear chains as it loads it: every workgroup computes the whole row in
/// workgroup memory (linear.wgsl `CHAIN_K4`; E2B's per-layer input: 256).
const CHAIN_LOAD_MAX_K: usize = 512;

/// For linear `l` whose input an element-wise chain makes (`MemoryPlan::chain_load`): that
/// chain's op and steps, where this call computes the chain in `l`'s mat-vec as it loads its
/// inputs (linear.wgsl `CHAIN_X`): one row of int8 activations, short enough that each lane of
/// a team takes one quad of it, the weight in one binding, and the chain's inputs in buffers of
/// their own (one is bound read-write). Both ask, so they agree.
pub(crate) fn chain_loaded<'a>(env: &'a Env, l: usize) -> Option<(&'a Op, &'a [ChainStep])> {
    let c = env.mem.chain_load.get(l).copied().flatten()?;
    let LinearCall {
        weight,
        act_quant,
        m,
        k,
        n,
        by,
    } = linear_call(env, l, c)?;
    let (OpKind::ElementwiseChain { steps }, Some(lop)) = (&by.kind, env.op(l)) else {
        return None;
    };
    let per_quad = packed_quad(weight)?;
    let (team, _, _) = quad_matvec(weight, k, n, 1)?;
    let shape = env.shape(by.outputs[0]);
    let storage = |t: TensorId| env.view_of[env.mem.root[t]];
    // XNNPACK's mat-vec chains the row with the whole workgroup, its ksums bound after the
    // chain's second input (`linear_xnn`).
    let fits = if act_quant == crate::ir::ActQuant::Xnnpack {
        xnn_matvec_of(env, lop, m, k).is_some() && env.max_storage >= WIDE_BINDINGS
    } else {
        k <= team * per_quad
    };
    let ok = m == 1
        && int_x(env, weight, act_quant, k, n, 1)
        && fits
        && k <= CHAIN_LOAD_MAX_K
        && env.chunks(lop.inputs[1], n).1 == 1
        && by.inputs.iter().all(|&i| env.shape(i) == shape)
        && (by.inputs.len() < 2 || storage(by.inputs[0]) != storage(by.inputs[1]));
    ok.then_some((by, steps.as_slice()))
}

/// The most rows a linear may have whose workgroups each norm its input row (`norm_loaded`):
/// every workgroup repeats the norm. Measured at E2B's 256 rows (43 workgroups of 384
/// invocations); linears quantizing their own row in 48 or more workgroups measured no faster
/// than apart (README), so not many more.
const NORM_LOAD_MAX_N: usize = 512;

/// Storage buffers `linear_norm` binds: the mat-vec's eight, the norm's output and its weight.
const NORM_LOAD_BINDINGS: u32 = 10;

/// An rms_norm whose one row only linear `l` reads quantized, run in `l`'s mat-vec
/// (linear.wgsl `matvec_normed`): its op, eps, weight, chain (normed value's input index and
/// steps), its workgroup and lanes as its own dispatch would have them, and the mat-vec's
/// workgroup. Where a call gives one row, a linear of few rows with no partner, bias or other
/// fusion, the norm not paired or storing into a cache, and at most one other chain input of the
/// norm's shape. Both the norm and the linear ask, so they agree.
pub(crate) struct NormLoad<'a> {
    pub op: &'a Op,
    pub eps: f32,
    pub weighted: bool,
    pub chain: Option<(usize, &'a [ChainStep])>,
    pub norm_wg: usize,
    pub lanes: usize,
    pub wg: usize,
}

pub(crate) fn norm_loaded<'a>(env: &'a Env, l: usize) -> Option<NormLoad<'a>> {
    let pn = env.mem.norm_load.get(l).copied().flatten()?;
    prequantized(env, l)?;
    let LinearCall {
        weight,
        act_quant,
        m,
        k,
        n,
        by,
    } = linear_call(env, l, pn)?;
    let (eps, weighted, chain) = match &by.kind {
        OpKind::RmsNorm { eps } => (*eps, by.inputs.len() > 1, None),
        OpKind::RmsNormChain {
            eps,
            weighted,
            norm_input,
            steps,
        } => (*eps, *weighted, Some((*norm_input, steps.as_slice()))),
        _ => return None,
    };
    let lop = env.op(l)?;
    let OpKind::Linear { has_bias, .. } = lop.kind else {
        return None;
    };
    let per_quad = packed_quad(weight)?;
    let (team, _, _) = quad_matvec(weight, k, n, 1)?;
    let (norm_wg, lanes) = norm_workgroup(env, k / 4);
    // XNNPACK's mat-vec (`xnn_matvec_normed`) binds its ksums after the norm's weight.
    let xnn = act_quant == crate::ir::ActQuant::Xnnpack;
    let (wg, sums) = match (xnn, xnn_matvec_of(env, lop, m, k), weight) {
        // Its workgroup's rows' sums and scales, the row's groups' sums, the chain's stores.
        (true, Some((_, (xr, xwg))), Weight::Q4 { group }) => {
            let groups = k / group;
            (
                xwg.max(norm_wg),
                4 * (xr * (groups | 1) * 2 + groups + 1 + xr),
            )
        }
        (true, ..) => return None,
        // The team sums' (a vec4 an invocation).
        (false, ..) => {
            let wg = norm_wg.div_ceil(team) * team;
            (wg, 16 * wg)
        }
    };
    // Its workgroup arrays: the mat-vec's, the row's words as floats and packed, the norm's
    // sums and the range's (quant.wgsl, two floats an invocation).
    let shared = sums + 20 * (k / 4) + 4 * norm_wg + 8 * wg;
    let out = by.outputs[0];
    let others = &by.inputs[1 + weighted as usize..];
    let ok = m == 1
        && int_x(env, weight, act_quant, k, n, 1)
        && k % per_quad == 0
        && k / 4 <= norm_wg
        && k <= NORM_PAIR_MAX_D
        && n <= NORM_LOAD_MAX_N
        && !has_bias
        && env.numel(out) == k
        && others.len() == chain.is_some() as usize
        && others.iter().all(|&o| env.shape(o) == env.shape(out))
        && env.mem.partner[l].is_none()
        && env.mem.third[l].is_none()
        && env.chunks(lop.inputs[1], n).1 == 1
        && chain_loaded(env, l).is_none()
        && env.mem.norm_cache[pn].is_none()
        && env.mem.paired_norm[pn].is_none()
        && norm_pair(env, pn).is_none()
        && wg <= env.max_invocations as usize
        && shared <= env.max_workgroup_bytes as usize
        && env.max_storage >= NORM_LOAD_BINDINGS + xnn as u32;
    ok.then_some(NormLoad {
        op: by,
        eps,
        weighted,
        chain,
        norm_wg,
        lanes,
        wg,
    })
}

/// A mat-vec's parameters and constants for running the norm that makes its x (`norm_loaded`;
/// linear.wgsl `norm_row`, K = `k`).
fn norm_load_params(p: P, nl: &NormLoad, k: usize, consts: &mut Vec<(&'static str, f64)>) -> P {
    let (q, cc) = chain_steps(p.u(0), nl.chain.map_or(&[], |(_, st)| st));
    consts.extend(cc);
    consts.extend([
        ("NORM_X", 1.0),
        ("CHAIN_K4", (k / 4) as f64),
        ("NORM_W", b(nl.weighted)),
        ("NORM_CHAIN", b(nl.chain.is_some())),
        ("NORM_WG", nl.norm_wg as f64),
        ("NORM_LANES", nl.lanes as f64),
    ]);
    q.f(nl.eps).u(nl.chain.map_or(0, |(i, _)| i))
}

/// A gate/up pair's mat-vec storing the chain of its two outputs (`glu_fused`: the chain's node,
/// steps, and whether its input 0 is the lead's output): its parameters (the ranges site, then
/// the chain's words), constants and output (the chain's). Where its stores leave their range
/// (`range`), the ranges buffer takes the second output's binding, `y2`.
fn glu_params(
    env: &Env,
    (c, chain, first): (usize, &[ChainStep], bool),
    range: Option<u32>,
    p: P,
    y2: &mut Res,
    consts: &mut Vec<(&'static str, f64)>,
) -> Result<(P, Res), String> {
    if range.is_some() {
        *y2 = Res::Ranges;
        consts.push(("RANGE_SLOTS", RANGE_SLOTS as f64));
    }
    let (q, cc) = chain_steps(p.u(range.unwrap_or(0) as usize), chain);
    consts.extend(cc);
    consts.extend([("GLU", 1.0), ("GLU_FIRST", b(first))]);
    let cop = env.op(c).ok_or("a fused chain is not an op")?;
    Ok((q, Res::Tensor(cop.outputs[0])))
}

/// A mat-vec's parameters and constants for computing the chain that makes its x as it loads
/// the chain's inputs (`chain_loaded`; linear.wgsl `chain_quad`, K = `k`).
fn chain_load_params(
    p: P,
    chain: &[ChainStep],
    k: usize,
    consts: &mut Vec<(&'static str, f64)>,
) -> P {
    let (q, cc) = chain_steps(p.u(0), chain);
    consts.extend(cc);
    consts.extend([("CHAIN_X", 1.0), ("CHAIN_K4", (k / 4) as f64)]);
    q
}

/// `ranged` for the linear that producer `node` leaves its range for, if any.
fn range_out(env: &Env, node: usize) -> Option<u32> {
    ranged(env, env.mem.range_for.get(node).copied().flatten()?)
}

/// The longest element-wise chain row that quantizes for its linear (`prequantized`).
const MAX_CHAIN_ROW: usize = 2048;

/// How the norm that produces linear `l`'s input (`MemoryPlan::quant_into`) packs it for `l`.
struct Prequant {
    /// 4-bit weights: each 8 elements in a weight word's nibble order.
    nibble_order: bool,
    xnn: bool,
}

/// Whether linear `l` takes its input already quantized by the rms_norm that produced it: for
/// these shapes `l` reads packed int8 words, and the norm's rows are `l`'s rows in whole 16-byte
/// words (8 elements for 4-bit). Both the norm and the linear ask, so they agree.
fn prequantized(env: &Env, l: usize) -> Option<Prequant> {
    let pn = env.mem.quant_by.get(l).copied().flatten()?;
    let LinearCall {
        weight,
        act_quant,
        m,
        k,
        n,
        by: nop,
    } = linear_call(env, l, pn)?;
    let d = *env.shape(nop.outputs[0]).last()?;
    // A chain's rows are read as its first input's (rms_norm.wgsl with NORM off), and only
    // short ones: one workgroup walking a long row costs more than the dispatch it saves (E2B's
    // 6144- and 12288-wide gelu · up rows: 4.76 -> 4.84 ms of GPU time per decode step).
    if matches!(nop.kind, OpKind::ElementwiseChain { .. })
        && (env.shape(nop.inputs[0]) != env.shape(nop.outputs[0]) || d > MAX_CHAIN_ROW)
    {
        return None;
    }
    let nibble_order = matches!(weight, Weight::Q4 { .. });
    let whole = d % if nibble_order { 8 } else { 4 } == 0;
    (int_x(env, weight, act_quant, k, n, m)
        && d == k
        && env.numel(nop.outputs[0]) == m * k
        && whole)
        .then_some(Prequant {
            nibble_order,
            xnn: act_quant == crate::ir::ActQuant::Xnnpack,
        })
}

/// `xnn_matvec`'s rows a workgroup and invocations, where it takes an XNNPACK-quantized linear
/// (one row of x, 4-bit weights in groups of a multiple of 32): enough rows that their 16-byte
/// weight quads fill about four passes of 256 invocations (at least 2, a gate/up pair's one of
/// each), but no more than leave `floor` workgroups for the `n` rows (`XNN_WORKGROUP_FLOOR` on
/// GPUs; none on a CPU's Vulkan driver, where lavapipe's demo step took 405 ms without against
/// 462-508 with), within 16 KiB of shared memory (two words a row's group and one a group).
/// `PTERIA_XNN_QUADS=N` (weight quads a workgroup, 1024 by default) and `PTERIA_XNN_WGS=N` (the
/// floor; 0: none) override, for benchmark sweeps. Measured on an H200, a step of the
/// E2B-shaped XNNPACK program: two passes and at least 8 rows 3.13-3.15 ms, at least 2 rows
/// (K >= 6144 in more workgroups) 3.06, one pass 3.29; four passes 2.97 against 3.02 for two,
/// eight 3.19 against 3.01-3.04 for four; later (shuffled sums) no floor 2.70 ms, a floor of
/// 128 workgroups 2.66, 256 2.62, 512 2.64 (README).
fn xnn_matvec_layout(
    kind: u32,
    m: usize,
    k: usize,
    n: usize,
    group: usize,
    floor: usize,
) -> Option<(usize, usize)> {
    let groups = k.checked_div(group)?;
    if kind != 1 || m != 1 || group % 32 != 0 || groups == 0 {
        return None;
    }
    let quads = k / 32;
    // (Read once: layouts are asked for at every recording.)
    static TUNE: std::sync::OnceLock<(Option<usize>, Option<usize>)> = std::sync::OnceLock::new();
    let (budget, min_wgs) = *TUNE.get_or_init(|| {
        let var = |name| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
        };
        (var("PTERIA_XNN_QUADS"), var("PTERIA_XNN_WGS"))
    });
    // About four passes of 256 invocations a workgroup, and few enough rows that `floor`
    // workgroups share them.
    let (budget, min_wgs) = (budget.unwrap_or(1024), min_wgs.unwrap_or(floor));
    let mut rows = 1usize << (budget / quads).clamp(2, 32).ilog2();
    if let Some(per) = n.checked_div(min_wgs) {
        rows = rows.min(1 << per.clamp(2, 32).ilog2());
    }
    // (And a word a row for a gate/up pair's chain, `xnn_glu`.)
    let words = rows * (groups | 1) * 2 + groups + 1 + rows;
    let wg = (rows * quads).next_power_of_two().clamp(64, 256);
    (words <= 4096).then_some((rows, wg))
}

/// `xnn_matvec`'s specialization for `xnn_matvec_layout`'s rows and workgroup.
fn xnn_matvec_consts(
    env: &Env,
    xr: usize,
    wg: usize,
    k: usize,
    group: usize,
) -> [(&'static str, f64); 6] {
    [
        ("XR", xr as f64),
        ("XG", (k / group) as f64),
        ("XS", ((k / group) | 1) as f64),
        ("WG", wg as f64),
        ("FMA_NATIVE", b(env.fused_fma)),
        ("XSG", env.subgroup.unwrap_or(1) as f64),
    ]
}

/// `xnn_matvec`'s floor of workgroups for a linear's rows on a GPU (`xnn_matvec_layout`).
pub(crate) const XNN_WORKGROUP_FLOOR: usize = 256;

/// XNNPACK's decode mat-vec for linear `op` over `m` rows of x (k wide), where it takes the
/// call: the ksums computed at load (src/gpu/ksums.rs, in one binding) and `xnn_matvec_layout`.
fn xnn_matvec_of(env: &Env, op: &Op, m: usize, k: usize) -> Option<(TensorId, (usize, usize))> {
    let OpKind::Linear {
        weight: Weight::Q4 { group },
        act_quant: crate::ir::ActQuant::Xnnpack,
        has_bias,
    } = op.kind
    else {
        return None;
    };
    let ksums = *op.inputs.get(4 + has_bias as usize)?;
    if env.mem.split[env.mem.root[ksums]].is_some() {
        return None;
    }
    let n = env.numel(op.outputs[0]) / m.max(1);
    Some((ksums, xnn_matvec_layout(1, m, k, n, group, env.xnn_floor)?))
}

fn linear(
    env: &Env,
    node: usize,
    op: &Op,
    weight: Weight,
    act_quant: crate::ir::ActQuant,
    has_bias: bool,
) -> Result<Vec<Step>, String> {
    let out = op.outputs[0];
    let x = op.inputs[0];
    let xs = env.shape(x);
    let k = *xs.last().ok_or("linear of a scalar")?;
    let nn = *env.shape(out).last().ok_or("linear output is a scalar")?;
    let m = env.numel(x).checked_div(k).unwrap_or(0);
    // A paired linear's rows are computed by its partner (src/gpu/memory.rs).
    if m == 0 || nn == 0 || env.mem.merged_into.get(node).copied().flatten().is_some() {
        return Ok(Vec::new());
    }
    // This linear's partner (and third), its output and rows, computed here after this one's.
    let merged = |of: &[Option<usize>]| -> Result<Option<(TensorId, usize)>, String> {
        match of.get(node).copied().flatten().and_then(|pn| env.op(pn)) {
            Some(o) => {
                let o2 = o.outputs[0];
                let n2 = *env.shape(o2).last().ok_or("linear output is a scalar")?;
                Ok(Some((o2, n2)))
            }
            None => Ok(None),
        }
    };
    let second = merged(&env.mem.partner)?;
    let third = merged(&env.mem.third)?;
    let wc = weight.tensor_count();
    let w = op.inputs[1];
    let (kind, group) = match weight {
        Weight::F32 => (0, 32),
        Weight::Q4 { group } => (1, group),
        Weight::Q8 { group } => (2, group),
    };
    if group == 0 || (kind != 0 && k % group != 0) {
        return Err(format!("K={k} is not a multiple of the group size {group}"));
    }
    let mut steps = Vec::new();
    let mut xsrc = Res::Tensor(x);
    let matvec = matvec_rows(env, weight, k, nn, m);
    // XNNPACK's qd8 GEMMs are reproduced bit for bit (any M): a deep 8da4w model turns a
    // last-bit difference into a flipped activation rounding a few layers on.
    let xnn_exact = act_quant == crate::ir::ActQuant::Xnnpack && kind != 0;
    if xnn_exact && !matvec_aligned(weight, k) {
        return Err(format!(
            "an XNNPACK-quantized linear needs K ({k}) and its group ({group}) in whole \
             {} elements",
            if kind == 1 { 8 } else { 4 }
        ));
    }
    // Dynamic int8 activations meet 4/8-bit weights in integer dot products on the decode path.
    let int_x = int_x(env, weight, act_quant, k, nn, m);
    // An earlier linear of the same input left its quantized rows in the scratch we share, or
    // the norm that produced the input quantized it into ours.
    let shared = env.mem.quant_from.get(node).copied().flatten().is_some()
        || prequantized(env, node).is_some();
    // The chain that makes x, computed from its inputs as the mat-vec loads them.
    let loaded = chain_loaded(env, node);
    // The norm that makes x, run in the mat-vec.
    let normed = norm_loaded(env, node);
    if let Some(nl) = &normed {
        xsrc = Res::Tensor(nl.op.inputs[0]);
    } else if let Some((cop, _)) = loaded {
        xsrc = Res::Tensor(cop.inputs[0]);
    } else if act_quant != crate::ir::ActQuant::None && shared {
        xsrc = Res::Scratch(0);
    } else if act_quant != crate::ir::ActQuant::None {
        let xnn = act_quant == crate::ir::ActQuant::Xnnpack;
        // One workgroup per row, about one 16-byte word per invocation up to 256: a decode
        // row's latency is the cost (a long loop of dependent loads in few invocations cost an
        // H100 17 us at K = 12288; 4 words each still left ~6 us per quantization at K = 1536;
        // past 256 the longer reduction cost more than the shorter loop: E2B decode step 5.19 ->
        // 5.13 ms with 1024 -> 256, 5.36 ms with 128. Since the one-barrier reductions: up to
        // 1024 invocations, each keeping its words in registers, 3.04 -> 3.28 ms; 8 words or
        // pairs each kept in registers at up to 256, instead of reading the row twice: 3.07 ->
        // 3.16).
        let aq_wg = (k / 4)
            .next_power_of_two()
            .clamp(64, env.max_invocations.clamp(64, 256) as usize);
        let aq_lanes = env.subgroup.map_or(1, |s| aq_wg.min(s as usize));
        if let Some(at) = ranged(env, node) {
            // The producer left the row's range: each invocation quantizes one unit (8
            // elements for 4-bit weights, else 4) over as many workgroups as that takes.
            let units = if kind == 1 { k / 8 } else { k / 4 };
            let wg = units.next_power_of_two().clamp(32, 256);
            steps.push(step(
                "linear",
                "act_quant_ranged",
                vec![
                    ("WG", wg as f64),
                    ("XNN_ROUNDING", b(xnn)),
                    ("KIND", kind as f64),
                    (
                        "SG_LANES",
                        env.subgroup.map_or(1, |s| wg.min(s as usize)) as f64,
                    ),
                    ("RANGE_SLOTS", RANGE_SLOTS as f64),
                ],
                P::default()
                    .u(m)
                    .u(0)
                    .u(k)
                    .u(0)
                    .u(0)
                    .u(0)
                    .u(0)
                    .u(at as usize),
                Res::Scratch(0),
                vec![Res::Tensor(x), Res::Ranges],
                [units.div_ceil(wg) as u32, 1, 1],
            ));
        } else {
            steps.push(step(
                "linear",
                if int_x {
                    "act_quant_packed"
                } else {
                    "act_quant"
                },
                vec![
                    ("WG", aq_wg as f64),
                    ("XNN_ROUNDING", b(xnn)),
                    ("KIND", kind as f64),
                    ("SG_LANES", aq_lanes as f64),
                ],
                P::default().u(m).u(0).u(k).u(0).u(0).u(0),
                Res::Scratch(0),
                vec![Res::Tensor(x)],
                env.grid(m, 1),
            ));
        }
        xsrc = Res::Scratch(0);
    }
    let n3 = third.map_or(0, |(_, n3)| n3);
    let (per, count, rows) = match second {
        // Paired weights are never split (the planner checks they fit one binding together).
        Some((_, n2)) => (nn + n2 + n3, 1, nn + n2 + n3),
        None => {
            let (per, count) = env.chunks(w, nn);
            (per, count, nn)
        }
    };
    let (mut y2, split) = match second {
        Some((o2, _)) => (Res::Tensor(o2), nn),
        // The chain's second input, read where a second output would be written.
        None => match loaded.and_then(|(cop, _)| cop.inputs.get(1)).or_else(|| {
            let nl = normed.as_ref()?;
            nl.op.inputs.get(1 + nl.weighted as usize)
        }) {
            Some(&z) => (Res::Tensor(z), u32::MAX as usize),
            // Binding the output again keeps the layout the same; no row reaches it.
            None => (Res::Tensor(out), u32::MAX as usize),
        },
    };
    let bias = if has_bias {
        Res::Tensor(op.inputs[1 + wc])
    } else {
        Res::Dummy
    };
    let (tpr, rpw) = (32usize, 8usize);
    let derived = derived_bias(env, op);
    // A third linear's rows go to a third output binding, in linear.wgsl's `linear3` variant.
    let kernel = if third.is_some() { "linear3" } else { "linear" };
    for c in 0..count {
        let n0 = c * per;
        let nc = per.min(rows - n0);
        let q = |i: usize| {
            if kind == 0 || (derived && i == 3) {
                Res::Dummy
            } else {
                Res::Chunk(op.inputs[i], c)
            }
        };
        let inputs = vec![xsrc, Res::Chunk(w, c), q(2), q(3), bias];
        let mut p = P::default()
            .u(m)
            .u(nc)
            .u(k)
            .u(nn)
            .u(n0)
            .u(k / group)
            .u(split);
        // `linear3` finds the third's rows from here on (a triple is never ranged or chained).
        if let (Some((_, n2)), Some(_)) = (second, third) {
            p = p.u(nn + n2);
        }
        let mut consts = vec![
            ("KIND", kind as f64),
            ("GROUP", group as f64),
            ("HAS_BIAS", b(has_bias)),
            ("DERIVED_BIAS", b(derived)),
        ];
        let quad = if matvec {
            quad_matvec(weight, k, nc, m)
        } else {
            None
        };
        // The rows' ksums, computed at load (src/gpu/ksums.rs) where the weights are
        // constants, in one binding.
        let ksums = op
            .inputs
            .get(1 + wc + has_bias as usize)
            .copied()
            .filter(|&t| env.mem.split[env.mem.root[t]].is_none());
        // A pair's (or a gate/up chain's ranges) binding precedes the ksums (`linear_xnn`), a
        // triple's two outputs (`linear3`).
        let xnn_kernel = match (second, third) {
            (_, Some(_)) => "linear3",
            (Some(_), None) => "linear_xnn",
            (None, None) if loaded.is_some() => "linear_xnn",
            (None, None) => kernel,
        };
        let xnn_writes = |y2: Res| match third {
            Some((o3, _)) => vec![y2, Res::Tensor(o3)],
            None if second.is_some() || loaded.is_some() => vec![y2],
            None => Vec::new(),
        };
        if let Some((ksums, (xr, wg))) = xnn_matvec_of(env, op, m, k) {
            consts.extend(xnn_matvec_consts(env, xr, wg, k, group));
            // Storing a chain of the pair's two outputs (as the quad mat-vec's GLU), its
            // range maybe in the ranges buffer bound where the second output would be.
            let glu = second.and_then(|_| glu_fused(env, node));
            let range = glu.and_then(|_| range_out(env, node));
            let (mut p, mut y, mut groups) = (p, Res::Tensor(out), nc.div_ceil(xr));
            if let Some(g) = glu {
                (p, y) = glu_params(env, g, range, p, &mut y2, &mut consts)?;
                if range.is_some() {
                    let lanes = env.subgroup.map_or(1, |s| (xr / 2).min(s as usize));
                    consts.push(("SG_LANES", lanes as f64));
                }
                // (A workgroup's rows of the gate, and as many of the up.)
                groups = nn.div_ceil(xr / 2);
            }
            // The chain making x, computed and quantized by every workgroup (`chain_quad`).
            if let Some((_, chain)) = loaded {
                p = chain_load_params(p, chain, k, &mut consts);
                consts.push(("XNN_ROUNDING", 1.0));
            }
            // The norm making x, run by every workgroup (`norm_row`), stored by the first.
            if let Some(nl) = &normed {
                p = norm_load_params(p, nl, k, &mut consts);
                consts.retain(|(name, _)| *name != "WG");
                consts.extend([("WG", nl.wg as f64), ("XNN_ROUNDING", 1.0)]);
            }
            let mut s = step(
                if normed.is_some() {
                    "linear_norm"
                } else {
                    xnn_kernel
                },
                if range.is_some() {
                    "xnn_matvec_ranged"
                } else if normed.is_some() {
                    "xnn_matvec_normed"
                } else {
                    "xnn_matvec"
                },
                consts,
                p,
                y,
                inputs,
                env.grid(groups, 1),
            );
            s.writes = xnn_writes(y2);
            // `linear_norm`: the norm's rows (stored by the first workgroup) and weight, then
            // the ksums.
            if let Some(nl) = &normed {
                s.writes = vec![y2, Res::Tensor(nl.op.outputs[0])];
                s.reads_after.push(if nl.weighted {
                    Res::Tensor(nl.op.inputs[1])
                } else {
                    Res::Dummy
                });
            }
            s.reads_after.push(Res::Tensor(ksums));
            steps.push(s);
        } else if let Some(((xr, wg), ksums)) = xnn_exact
            .then(|| xnn_matvec_layout(kind, 1, k, nc, group, 0))
            .flatten()
            .zip(ksums)
            .filter(|_| m <= env.quad_rows)
        {
            // A prompt's rows of x as mat-vecs, one row of x a workgroup (`xnn_matvec_rows`).
            consts.extend(xnn_matvec_consts(env, xr, wg, k, group));
            let [bx, by, _] = env.grid(nc.div_ceil(xr), 1);
            let mut s = step(
                xnn_kernel,
                "xnn_matvec_rows",
                consts,
                p,
                Res::Tensor(out),
                inputs,
                [m as u32, bx, by],
            );
            s.writes = xnn_writes(y2);
            s.reads_after.push(Res::Tensor(ksums));
            steps.push(s);
        } else if xnn_exact {
            // XR weight rows and XM rows of x a workgroup; the integer sums of XC groups at a
            // time in shared memory (under 15 KiB with the kernel's other arrays).
            let (xr, xm) = (8usize, m.min(8));
            let rpg = if kind == 1 && group % 16 == 0 {
                group / 16
            } else {
                1
            };
            let words = |c: usize| xr * xm * c + xr * c + xm * c + xr * c * rpg;
            let mut xc = (k / group).min(128);
            while xc > 1 && words(xc) > 3584 {
                xc -= 1;
            }
            consts.extend([
                ("XR", xr as f64),
                ("XM", xm as f64),
                ("XC", xc as f64),
                ("RPG", rpg as f64),
                ("WG", 64.0),
                ("FMA_NATIVE", b(env.fused_fma)),
                ("KSUMS", b(ksums.is_some())),
            ]);
            let mut s = step(
                xnn_kernel,
                "xnn_gemm",
                consts,
                p,
                Res::Tensor(out),
                inputs,
                env.grid(nc.div_ceil(xr), m.div_ceil(xm)),
            );
            s.writes = xnn_writes(y2);
            // (Bound either way: the kernel names it, read or not.)
            s.reads_after.push(ksums.map_or(Res::Dummy, Res::Tensor));
            steps.push(s);
        } else if let Some((team, wg, mut rpt)) = quad {
            // Storing a chain of the pair's two outputs: a team owns rows of both halves.
            let glu = second.and_then(|_| glu_fused(env, node));
            let (mut p, mut y) = (p, Res::Tensor(out));
            // A chain's stores may leave their range for the linear that quantizes them, in
            // the ranges buffer bound where the second output would be (`matvec_ranged`).
            let range = glu.and_then(|_| range_out(env, node));
            if let Some(g) = glu {
                rpt = rpt.max(2);
                (p, y) = glu_params(env, g, range, p, &mut y2, &mut consts)?;
            }
            if let Some((_, chain)) = loaded {
                p = chain_load_params(p, chain, k, &mut consts);
            }
            let mut wg = wg;
            if let Some(nl) = &normed {
                p = norm_load_params(p, nl, k, &mut consts);
                wg = nl.wg;
            }
            consts.extend([
                ("TEAM", team as f64),
                ("WG", wg as f64),
                ("RPT", rpt as f64),
                ("INT_X", b(int_x)),
                (
                    "SG_LANES",
                    env.subgroup.map_or(1, |s| team.min(s as usize)) as f64,
                ),
            ]);
            let groups = nc.div_ceil(wg / team * rpt);
            // A prompt's rows of x, several a workgroup (`matvec_rows`) where x is int8 rows
            // the mat-vec reads as they are.
            let plain = range.is_none() && normed.is_none() && loaded.is_none();
            let xrows = if plain && int_x && m > 1 {
                env.x_rows.unwrap_or_else(|| x_rows(m))
            } else {
                1
            };
            let entry = if range.is_some() {
                "matvec_ranged"
            } else if normed.is_some() {
                "matvec_normed"
            } else if xrows > 1 {
                consts.push(("XROWS", xrows as f64));
                "matvec_rows"
            } else {
                "matvec"
            };
            // Rows of x first (linear.wgsl `quad_grid`): the rows that one block of weights
            // serves run next to each other, so that its loads serve them all from the cache
            // (m is at most QUAD_MATVEC_MAX_M, far below any device's grid limit).
            let g = env.grid(groups, 1);
            let grid = [m.div_ceil(xrows) as u32, g[0], g[1]];
            steps.push(step(
                if normed.is_some() {
                    "linear_norm"
                } else {
                    kernel
                },
                entry,
                consts,
                p,
                y,
                inputs,
                grid,
            ));
        } else if matvec && kind == 0 {
            consts.extend([
                ("TPR", tpr as f64),
                ("RPW", rpw as f64),
                ("WG", (tpr * rpw) as f64),
            ]);
            steps.push(step(
                kernel,
                "matvec_f32",
                consts,
                p,
                Res::Tensor(out),
                inputs,
                env.grid(nc.div_ceil(rpw), m),
            ));
        } else if matvec {
            // Groups smaller than a 16-byte quad: single words, 8 rows per workgroup.
            let per_word = if kind == 1 { 8 } else { 4 };
            let wg = (k / per_word)
                .div_ceil(4)
                .next_power_of_two()
                .clamp(32, 256);
            consts.push(("WG", wg as f64));
            steps.push(step(
                kernel,
                "matvec_q",
                consts,
                p,
                Res::Tensor(out),
                inputs,
                env.grid(nc.div_ceil(MATVEC_ROWS), m),
            ));
        } else {
            let groups = [nc.div_ceil(64) as u32, m.div_ceil(64) as u32, 1];
            if groups[0] > env.max_groups || groups[1] > env.max_groups {
                return Err(format!(
                    "linear of {m}x{k} by {nn} rows needs too many workgroups"
                ));
            }
            consts.push(("WORDS", b(kind != 0 && matvec_aligned(weight, k))));
            steps.push(step(
                kernel,
                "tiled",
                consts,
                p,
                Res::Tensor(out),
                inputs,
                groups,
            ));
        }
        if !xnn_exact {
            if let Some(s) = steps.last_mut() {
                s.writes = match third {
                    Some((o3, _)) => vec![y2, Res::Tensor(o3)],
                    None => vec![y2],
                };
                // `linear_norm`: the norm's rows (stored by the first workgroup) and weight.
                if let Some(nl) = &normed {
                    s.writes.push(Res::Tensor(nl.op.outputs[0]));
                    s.reads_after.push(if nl.weighted {
                        Res::Tensor(nl.op.inputs[1])
                    } else {
                        Res::Dummy
                    });
                }
            }
        }
    }
    Ok(steps)
}

fn matmul(env: &Env, op: &Op, transpose_b: bool) -> Result<Vec<Step>, String> {
    let (a, bt, out) = (op.inputs[0], op.inputs[1], op.outputs[0]);
    let (as_, bs, os) = (
        env.shape(a).to_vec(),
        env.shape(bt).to_vec(),
        env.shape(out).to_vec(),
    );
    let n = bs[bs.len() - if transpose_b { 2 } else { 1 }];
    let (m, k) = (as_[as_.len() - 2], as_[as_.len() - 1]);
    let batch = &os[..os.len() - 2];
    if batch.len() > 4 {
        return Err("more than 4 batch dims".into());
    }
    let nb: usize = batch.iter().product();
    if nb == 0 || m == 0 || n == 0 {
        return Ok(Vec::new());
    }
    let mat_strides = |s: &[usize], mat: usize| -> Vec<usize> {
        broadcast_strides(&s[..s.len() - 2], batch)
            .iter()
            .map(|v| v * mat)
            .collect()
    };
    let mm = Mm {
        a_strides: mat_strides(&as_, m * k),
        b_strides: mat_strides(&bs, k * n),
        ..Mm::dense(
            m,
            k,
            n,
            batch.to_vec(),
            transpose_b,
            env.mem.repr[bt] == Repr::F16,
        )
    };
    Ok(vec![matmul_step(
        env,
        &mm,
        Res::Tensor(out),
        Res::Tensor(a),
        Res::Tensor(bt),
    )?])
}

/// A batched matmul's sizes: batch dims (up to 4), each operand's element stride per batch
/// dim and between its rows (b's as stored: N-rows when transposed).
struct Mm {
    m: usize,
    k: usize,
    n: usize,
    batch: Vec<usize>,
    a_strides: Vec<usize>,
    b_strides: Vec<usize>,
    y_strides: Vec<usize>,
    lda: usize,
    ldb: usize,
    ldy: usize,
    transpose_b: bool,
    b_f16: bool,
    /// Attention over a cache: what `matmul.wgsl`'s SPAN leaves out past the keys a query
    /// sees, the start's slot and the query count (tiled `main` only, so more than 4 rows).
    span: Option<Span>,
}

#[derive(Clone, Copy)]
struct Span {
    /// 1: the columns past it are not computed; 2: nor the K steps past it.
    kind: u32,
    causal: bool,
    start_slot: u32,
    len: usize,
}

impl Mm {
    /// Every operand contiguous: rows of their length, matrices one after another.
    fn dense(
        m: usize,
        k: usize,
        n: usize,
        batch: Vec<usize>,
        transpose_b: bool,
        b_f16: bool,
    ) -> Mm {
        let run = |mat: usize| -> Vec<usize> { strides(&batch).iter().map(|s| s * mat).collect() };
        Mm {
            a_strides: run(m * k),
            b_strides: run(k * n),
            y_strides: run(m * n),
            lda: k,
            ldb: if transpose_b { k } else { n },
            ldy: n,
            m,
            k,
            n,
            batch,
            transpose_b,
            b_f16,
            span: None,
        }
    }
}

fn matmul_step(env: &Env, mm: &Mm, out: Res, a: Res, bt: Res) -> Result<Step, String> {
    matmul_parts(env, mm, out, a, bt, 1)
}

/// `mm`'s params as `matmul.wgsl` reads them.
fn matmul_params(mm: &Mm) -> P {
    P::default()
        .u(mm.m)
        .u(mm.k)
        .u(mm.n)
        .u(mm.batch.len())
        .arr(&mm.batch, 4)
        .arr(&mm.a_strides, 4)
        .arr(&mm.b_strides, 4)
        .arr(&mm.y_strides, 4)
        .u(mm.lda)
        .u(mm.ldb)
        .u(mm.ldy)
        .u(mm.span.map_or(0, |s| s.start_slot as usize))
        .u(mm.span.map_or(0, |s| s.len))
}

/// The matmul, its K split `ksplit` ways (`main` only): then `out` is the scratch of partial
/// tiles that `ksum` adds up.
fn matmul_parts(
    env: &Env,
    mm: &Mm,
    out: Res,
    a: Res,
    bt: Res,
    ksplit: usize,
) -> Result<Step, String> {
    let (m, k, n) = (mm.m, mm.k, mm.n);
    let nb: usize = mm.batch.iter().product();
    let p = matmul_params(mm);
    // Up to 4 rows of a (decode), a row per workgroup row beats 64-row tiles of padding.
    let few = m <= 4;
    let groups = if few {
        [n.div_ceil(16) as u32, m as u32, nb as u32]
    } else {
        [
            n.div_ceil(64) as u32,
            m.div_ceil(64) as u32,
            (nb * ksplit) as u32,
        ]
    };
    if groups.iter().any(|&g| g > env.max_groups) {
        return Err(format!("matmul {m}x{k}x{n} needs too many workgroups"));
    }
    // K-slices of `rows`: each invocation walks about 4 unrolled steps of 4 loads.
    let ks = (k / 16)
        .next_power_of_two()
        .clamp(4, 64)
        .min((env.max_invocations as usize / 16).max(1));
    let (entry, mut consts) = match (few, mm.transpose_b) {
        (true, true) => ("rows_bt", vec![]),
        (true, false) => ("rows", vec![("KS", ks as f64)]),
        (false, t) if ksplit > 1 => ("parts", vec![("TRANS_B", b(t))]),
        (false, t) => ("main", vec![("TRANS_B", b(t))]),
    };
    consts.push(("B_F16", b(mm.b_f16)));
    if let Some(s) = mm.span {
        if few {
            return Err("a matmul span needs the tiled kernel (more than 4 rows)".into());
        }
        consts.push(("SPAN", s.kind as f64));
        consts.push(("SPAN_CAUSAL", b(s.causal)));
    }
    if ksplit > 1 {
        if few {
            return Err("a split K needs the tiled kernel".into());
        }
        consts.push(("KSPLIT", ksplit as f64));
    }
    Ok(step("matmul", entry, consts, p, out, vec![a, bt], groups))
}

/// Ways to split the K of tiled matmul `mm` so that its tiles fill the GPU, where `room` bytes
/// hold the partial tiles: powers of two while the workgroups stay within `KSPLIT_GROUPS` and
/// each keeps `KSPLIT_SLICES` K slices.
fn k_splits(mm: &Mm, room: u64) -> usize {
    let nb: usize = mm.batch.iter().product();
    if mm.m <= 4 {
        return 1;
    }
    let tiles = mm.n.div_ceil(64) * mm.m.div_ceil(64) * nb;
    let part = (nb * mm.m * mm.n * 4) as u64;
    let mut ks = 1;
    while tiles * ks * 2 <= KSPLIT_GROUPS
        && mm.k.div_ceil(16) >= ks * 2 * KSPLIT_SLICES
        && part * (ks as u64 * 2) <= room
    {
        ks *= 2;
    }
    ks
}

/// Workgroups a split K aims for (four an H100 multiprocessor), and the fewest 16-deep K slices
/// each part keeps. H100, TTFT of the E2B-shaped program at 33 / 64 / 128 tokens: no split 16.2 /
/// 20.3 / 28.9 ms; aiming for 128 workgroups 12.3 / 16.3-16.8 / 26.8-26.9, 256 11.9-17.1 /
/// 16.0-26.1 / 25.3-25.4, 512 11.6-11.8 / 15.6-15.9 / 24.9-25.0, 1024 11.7-11.8 / 15.8-15.9 /
/// 25.1 (p·V split alone; 2 slices a part measured alike).
const KSPLIT_GROUPS: usize = 512;
const KSPLIT_SLICES: usize = 4;

/// `mm` with its K split where that fills the GPU (`k_splits`): the partial tiles in `parts`
/// (`room` bytes), then their sum into `out`.
fn matmul_split_k(
    env: &Env,
    mm: &Mm,
    out: Res,
    a: Res,
    bt: Res,
    (parts, room): (Res, u64),
) -> Result<Vec<Step>, String> {
    // With SPAN 1 the tiles past the span leave their partials unwritten; only `probs`, which
    // reads the span alone, may sum those.
    let ks = if mm.span.is_some_and(|s| s.kind == 1) {
        1
    } else {
        k_splits(mm, room)
    };
    if ks == 1 {
        return Ok(vec![matmul_step(env, mm, out, a, bt)?]);
    }
    let nb: usize = mm.batch.iter().product();
    Ok(vec![
        matmul_parts(env, mm, parts, a, bt, ks)?,
        step(
            "matmul",
            "ksum",
            vec![("KSPLIT", ks as f64)],
            matmul_params(mm),
            out,
            vec![parts, Res::Dummy],
            env.grid((nb * mm.m * mm.n).div_ceil(256), 1),
        ),
    ])
}

fn embedding(env: &Env, op: &Op, weight: Weight) -> Result<Vec<Step>, String> {
    let out = op.outputs[0];
    let wc = weight.tensor_count();
    let w = op.inputs[0];
    let ids = op.inputs[wc];
    let cols = *env
        .shape(out)
        .last()
        .ok_or("embedding output is a scalar")?;
    let rows = env.shape(w).first().copied().unwrap_or(0);
    let n = env.numel(ids) * cols;
    if n == 0 {
        return Ok(Vec::new());
    }
    let (kind, group) = match weight {
        Weight::F32 => (0, 32),
        Weight::Q4 { group } => (1, group),
        Weight::Q8 { group } => (2, group),
    };
    if group == 0 || (kind != 0 && cols % group != 0) {
        return Err(format!(
            "{cols} columns are not a multiple of the group size {group}"
        ));
    }
    let (per, count) = env.chunks(w, rows);
    let derived = derived_bias(env, op);
    let consts = vec![
        ("KIND", kind as f64),
        ("GROUP", group as f64),
        ("IDS_INT", b(env.int(ids))),
        ("DERIVED_BIAS", b(derived)),
    ];
    Ok((0..count)
        .map(|c| {
            let q = |i: usize| {
                if kind == 0 || (derived && i == 2) {
                    Res::Dummy
                } else {
                    Res::Chunk(op.inputs[i], c)
                }
            };
            let p = P::default()
                .u(n)
                .u(cols)
                .u(c * per)
                .u(per.min(rows - c * per))
                .u(rows)
                .u(cols / group);
            step(
                "embedding",
                "main",
                consts.clone(),
                p,
                Res::Tensor(out),
                vec![Res::Chunk(w, c), Res::Tensor(ids), q(1), q(2)],
                env.grid(n.div_ceil(WG), 1),
            )
        })
        .collect())
}

/// Sdpa's attributes.
struct Attn {
    layout: AttnLayout,
    scale: f32,
    causal: bool,
    window: Option<usize>,
    softcap: Option<f32>,
    start: Int,
    all_rows: bool,
}

fn sdpa(env: &Env, node: usize, op: &Op, at: Attn) -> Result<Vec<Step>, String> {
    let (q, k, v, out) = (op.inputs[0], op.inputs[1], op.inputs[2], op.outputs[0]);
    let (qs, ks) = (env.shape(q).to_vec(), env.shape(k).to_vec());
    if qs.len() != 4 || ks.len() != 4 {
        return Err(format!("sdpa needs 4-D q and k, got {qs:?} / {ks:?}"));
    }
    let Some(AttnDims {
        b: bq,
        s,
        hq,
        d,
        cl,
        hkv,
    }) = at
        .layout
        .dims(&qs, &ks)
        .filter(|_| env.shape(v) == ks.as_slice())
    else {
        return Err(format!("q {qs:?} does not fit k/v {ks:?}"));
    };
    if bq * s * hq * d == 0 {
        return Ok(Vec::new());
    }
    // Element strides of (batch, position, head).
    let (qst, kst) = match at.layout {
        AttnLayout::Bshd => ([s * hq * d, hq * d, d], [cl * hkv * d, hkv * d, d]),
        AttnLayout::Bhsd => ([hq * s * d, d, s * d], [hkv * cl * d, d, cl * d]),
    };
    let kv_len = if at.all_rows { cl } else { 0 };
    let mask = op.inputs.get(3).copied();
    let mask_stride = match mask {
        Some(mt) => match crate::ir::cpu::mask_rows(env.shape(mt)) {
            Some((rows, cols)) if rows >= s && cols >= kv_len => cols,
            _ => {
                return Err(format!(
                    "mask {:?} must be [.., S >= {s}, kv_len]",
                    env.shape(mt)
                ))
            }
        },
        None => 0,
    };
    let split = s <= split_max_s(env.graph, op, env.mem.max_binding);
    let keys = split_keys(cl);
    let chunks = cl.div_ceil(keys);
    let p = || {
        P::default()
            .u(s)
            .u(hq)
            .u(hq / hkv)
            .u(d)
            .u(cl)
            .u((env.slot)(at.start) as usize)
            .u(at.window.unwrap_or(0).min(i32::MAX as usize))
            .u(mask_stride)
            .arr(&qst, 4)
            .arr(&kst, 4)
            .f(at.scale)
            .f(at.softcap.unwrap_or(1.0))
            .u(chunks)
    };
    let wg = if split { SPLIT_WG as f64 } else { 64.0 };
    let consts = vec![
        ("WG", wg),
        ("DMAX", d as f64),
        ("CK", keys as f64),
        ("CHUNKS", chunks as f64),
        ("CAUSAL", b(at.causal)),
        ("WINDOW", b(at.window.is_some())),
        ("SOFTCAP", b(at.softcap.is_some())),
        ("HAS_MASK", b(mask.is_some())),
        ("ALL_ROWS", b(at.all_rows)),
        ("K_F16", b(env.mem.repr[k] == Repr::F16)),
        ("V_F16", b(env.mem.repr[v] == Repr::F16)),
    ];
    let inputs = vec![
        Res::Tensor(q),
        Res::Tensor(k),
        Res::Tensor(v),
        mask.map_or(Res::Dummy, Res::Tensor),
    ];
    if !split && by_matmuls(env.graph, op, env.mem.max_binding) {
        // Per (batch, kv head, head of its group): q's and the output's heads, k's and v's
        // kv heads, read in place in either layout; the scores [B, Hq, S, cache] in scratch.
        let group = hq / hkv;
        let (k16, v16) = (env.mem.repr[k] == Repr::F16, env.mem.repr[v] == Repr::F16);
        let batch = vec![bq, hkv, group];
        let heads = vec![qst[0], group * qst[2], qst[2]];
        let kv_heads = vec![kst[0], kst[2], 0];
        let scores_at = vec![hq * s * cl, group * s * cl, s * cl];
        // Attention bounded by its start (not every row, the mask deciding) skips what lies
        // past the keys its queries see.
        let span = |kind| {
            (!at.all_rows).then(|| Span {
                kind,
                causal: at.causal,
                start_slot: (env.slot)(at.start),
                len: s,
            })
        };
        let scores = Mm {
            a_strides: heads.clone(),
            b_strides: kv_heads.clone(),
            y_strides: scores_at.clone(),
            lda: qst[1],
            ldb: kst[1],
            span: span(1),
            ..Mm::dense(s, d, cl, batch.clone(), true, k16)
        };
        let pv = Mm {
            a_strides: scores_at,
            b_strides: kv_heads,
            y_strides: heads,
            ldb: kst[1],
            ldy: qst[1],
            span: span(2),
            ..Mm::dense(s, cl, d, batch, false, v16)
        };
        let mask_only = vec![
            Res::Dummy,
            Res::Dummy,
            Res::Dummy,
            mask.map_or(Res::Dummy, Res::Tensor),
        ];
        let mut consts = consts;
        consts[0] = ("WG", 256.0);
        // Split's scratch, unused here, holds the matmuls' partial tiles where their K splits:
        // the scores' summed by `probs` as it reads them, p·V's by `ksum`.
        let room = scratch_bytes(env.graph, op, env.mem.max_binding)[0].min(env.mem.max_binding);
        let score_parts = k_splits(&scores, room);
        let mut mask_only = mask_only;
        let mut scores_out = Res::Scratch(1);
        if score_parts > 1 {
            consts.push(("SCORE_PARTS", score_parts as f64));
            mask_only[0] = Res::Scratch(0);
            scores_out = Res::Scratch(0);
        }
        return Ok(vec![
            matmul_parts(
                env,
                &scores,
                scores_out,
                Res::Tensor(q),
                Res::Tensor(k),
                score_parts,
            )?,
            step(
                "sdpa",
                "probs",
                consts,
                p(),
                Res::Scratch(1),
                mask_only,
                env.grid(s * hq, bq),
            ),
        ]
        .into_iter()
        .chain(matmul_split_k(
            env,
            &pv,
            Res::Tensor(out),
            Res::Scratch(1),
            Res::Tensor(v),
            (Res::Scratch(0), room),
        )?)
        .collect());
    }
    if !split {
        return Ok(vec![step(
            "sdpa",
            "main",
            consts,
            p(),
            Res::Tensor(out),
            inputs,
            env.grid(s * hq, bq),
        )]);
    }
    let per_query = [chunks as u32, hq as u32, (s * bq) as u32];
    // q is a rotated norm's rows, which split norms and rotates for its head itself.
    let (mut split_consts, mut split_p, mut split_inputs) = (consts.clone(), p(), inputs);
    let mut entry = "split";
    if let Some(qn) = q_normed(env, node) {
        entry = "split_normed";
        let (eps, [half, seq_stride, seq_len, start, table_rows]) = qn.words;
        split_p = split_p
            .u(0)
            .f(eps)
            .u(half)
            .u(seq_stride)
            .u(seq_len)
            .u(start)
            .u(table_rows);
        split_consts.extend([
            ("HAS_W", b(qn.weighted)),
            ("INTERLEAVED", b(qn.interleaved)),
            ("NORM_WG", qn.wg as f64),
            ("NORM_LANES", qn.lanes as f64),
        ]);
        let ins = &qn.op.inputs;
        split_inputs[0] = Res::Tensor(ins[0]);
        split_inputs.extend([
            if qn.weighted {
                Res::Tensor(ins[1])
            } else {
                Res::Dummy
            },
            Res::Tensor(qn.cos),
            Res::Tensor(qn.sin),
        ]);
    }
    // The step's new k and v rows, normed (k rotated) and stored into the caches by split.
    let kv = kv_split(env, node);
    if let Some(kv) = &kv {
        let (k_eps, v_eps, words) = kv.words;
        split_p = split_p.f(k_eps).f(v_eps);
        for w in words {
            split_p = split_p.u(w);
        }
    }
    let mut split_step = step(
        "sdpa",
        entry,
        split_consts,
        split_p,
        Res::Scratch(0),
        split_inputs,
        per_query,
    );
    if let Some(kv) = kv {
        split_step.kernel = "sdpa_kv";
        split_step.entry = "split_kv";
        split_step.constants.extend([
            ("KV_NEW", 1.0),
            ("KV_D", d as f64),
            ("HAS_KW", b(kv.weighted)),
        ]);
        // q, then the caches read-write (bindings 4 and 5), then the rest as before, the new
        // rows, k's weight and the update's indices (10 to 13).
        let mut rest = split_step.inputs.split_off(1);
        split_step.writes = rest.drain(..2).collect();
        rest.extend([
            Res::Tensor(kv.k.inputs[0]),
            Res::Tensor(kv.v.inputs[0]),
            if kv.weighted {
                Res::Tensor(kv.k.inputs[1])
            } else {
                Res::Dummy
            },
            kv.indices.map_or(Res::Dummy, Res::Tensor),
        ]);
        split_step.reads_after = rest;
    }
    Ok(vec![split_step, {
        // Attention's stores leave their range for the linear that quantizes them.
        let range = range_out(env, node);
        let mut consts = consts;
        consts.extend([
            ("RANGE", b(range.is_some())),
            ("RANGE_SLOTS", RANGE_SLOTS as f64),
        ]);
        Step {
            writes: vec![range.map_or(Res::Dummy, |_| Res::Ranges)],
            ..step(
                "sdpa",
                "combine",
                consts,
                p().u(range.unwrap_or(0) as usize),
                Res::Tensor(out),
                vec![Res::Scratch(0)],
                [hq as u32, d.div_ceil(16) as u32, (s * bq) as u32],
            )
        }
    }])
}
