//! Where every tensor lives on the GPU, decided once at load from the graph's upper-bound shapes.
//!
//! - Representation: kernels compute in f32 and i32 only, so float tensors of any width are held
//!   as f32 and integer/bool tensors as i32 (converted at upload and readback); packed 4/8-bit
//!   weights stay raw bytes, read as u32 words by `linear` and `embedding`. With
//!   `ContextOptions::f16_kv_cache`, KV caches are held as f16 (`kv_caches`).
//! - Constants get their own buffers, uploaded once (a paired linear's weights share its
//!   partner's, laid after them); States get persistent buffers (zero, or their
//!   initial value); each Input gets a buffer at its max size, written every call.
//! - Activations share a pool: each alias root lives from the op that writes it to its last
//!   reader, and takes the smallest free pooled buffer that fits (allocation before release, so an
//!   op never reads and writes one buffer). Reshape outputs, and cache updates' outputs, alias
//!   their input.
//! - Weights larger than one storage binding (a 262144x1536 f32 table is 1.5 GiB; lavapipe binds
//!   128 MiB) are split by rows into several buffers; `linear` and `embedding` run one dispatch per
//!   chunk, each writing its own output columns or ids. A weight's scales and biases split at the
//!   same rows. Any other tensor past the limit makes the graph unsupported.

use super::ops;
use crate::ir::{Graph, Node, OpKind, Role, TensorId};

/// How a tensor's elements are held on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repr {
    F32,
    I32,
    /// Packed quantized weight bytes.
    Raw,
    /// Two f16 a u32 word (element 2i in the low half), as WGSL's `pack2x16float` lays them: no
    /// device feature needed. Only KV caches, read as f32 by the ops `ops::reads_f16` names.
    F16,
}

#[derive(Debug, Clone)]
pub(crate) enum BufferKind {
    /// Bytes `range` of the tensor's GPU representation.
    Constant {
        tensor: TensorId,
        range: std::ops::Range<u64>,
        /// Constants laid after the range, in order (merged linears' weights).
        then: Vec<TensorId>,
    },
    State(TensorId),
    Input,
    Pool,
}

#[derive(Debug, Clone)]
pub(crate) struct BufferSpec {
    pub size: u64,
    pub kind: BufferKind,
}

#[derive(Debug, Clone)]
pub(crate) struct MemoryPlan {
    /// The device's max storage binding the plan was made for.
    pub max_binding: u64,
    pub repr: Vec<Repr>,
    /// Per root: a KV cache (a State that a cache update writes in place).
    pub kv_cache: Vec<bool>,
    /// The tensor whose storage this one shares (itself when it owns storage).
    pub root: Vec<TensorId>,
    /// Per root: rows per chunk when split (with the bytes of one row), else `None`.
    pub split: Vec<Option<(usize, u64)>>,
    /// Per root: its buffers, one per chunk; empty for tensors nothing reads.
    pub place: Vec<Vec<usize>>,
    /// Per node: op-private scratch buffers.
    pub scratch: Vec<Vec<usize>>,
    /// Per node: for a linear whose input an earlier linear quantizes the same way (q/k/v,
    /// gate/up), that node; it shares the earlier one's scratch, kept alive until then.
    pub quant_from: Vec<Option<usize>>,
    /// Per node: a later linear of the same input, activation quantization and weight format
    /// whose rows this one computes in the same dispatch, its weights laid after this one's.
    pub partner: Vec<Option<usize>>,
    /// Per node: a third such linear whose rows this one also computes (q/k/v: `Fusions::
    /// triples`), its weights laid after the partner's.
    pub third: Vec<Option<usize>>,
    /// Per node: the linear that computes this one's rows (the inverse of `partner` and
    /// `third`).
    pub merged_into: Vec<Option<usize>>,
    /// Per root: a 4-bit weight's biases that are -8 · its scales bit for bit (symmetric
    /// weights, whose nibbles hold q + 8: the Vulkan front end derives such biases). Kernels
    /// compute them from the scales (`ops::derived_bias`); they get no buffer.
    pub derived_bias: Vec<bool>,
    /// Per node: for an rms_norm or element-wise chain whose output a quantized linear quantizes
    /// first, that linear; the producer writes the quantized rows into the linear's scratch
    /// (allocated at the producer) where the linear takes them packed (`ops::prequantized`),
    /// saving a dispatch on the decode path.
    pub quant_into: Vec<Option<usize>>,
    /// The inverse of `quant_into`: per linear, the producer that quantizes its input.
    pub quant_by: Vec<Option<usize>>,
    /// Per node: for the lead of a paired linear, the element-wise chain of its two outputs that
    /// it can store instead of them (the gate/up and gelu(gate) · up of an MLP); `glu_lead` is the
    /// inverse. Whether a call does is `ops::glu_fused`.
    pub glu_chain: Vec<Option<usize>>,
    pub glu_lead: Vec<Option<usize>>,
    /// Per node: for an rms_norm that stores its rows straight into a KV cache, the cache update
    /// that then is not dispatched; `cache_filled` is the inverse.
    pub norm_cache: Vec<Option<usize>>,
    pub cache_filled: Vec<Option<usize>>,
    /// Per node: for an rms_norm (plain or with a chain) whose rows a plain rms_norm reads that
    /// only quantizes them for its linears, that norm: its row, still in the workgroup, is normed
    /// again and quantized in the same dispatch where the linear takes it packed
    /// (`ops::norm_pair`), the residual stream's post-norm and the next pre-norm of Gemma.
    /// `paired_norm` is the inverse.
    pub norm_pair: Vec<Option<usize>>,
    pub paired_norm: Vec<Option<usize>>,
    /// Per node: for a linear that quantizes its input itself (int8 activations), the op whose
    /// stores make that input (a gate/up mat-vec storing its chain, or attention): that op
    /// also leaves the range of what it stores in the linear's slots of the ranges buffer
    /// (`range_site`), so the quantization needs no pass over the row first and spreads over
    /// many workgroups (`ops::ranged`). `range_for` is the inverse.
    pub range_by: Vec<Option<usize>>,
    pub range_for: Vec<Option<usize>>,
    pub range_site: Vec<Option<usize>>,
    /// Sites in the ranges buffer, cleared at the start of every call.
    pub range_sites: usize,
    /// Per node: for a linear whose input an element-wise chain quantizes for it (`quant_by`)
    /// and nothing else reads, that chain: where a call allows (`ops::chain_loaded`), the
    /// linear's mat-vec computes the chain as it loads its inputs and quantizes the row itself,
    /// and the chain is not dispatched (the per-layer input's gelu(gate) · input of Gemma).
    /// The chain's inputs live until the linear. `loaded_by` is the inverse.
    pub chain_load: Vec<Option<usize>>,
    pub loaded_by: Vec<Option<usize>>,
    /// Per node: for a linear that alone reads an rms_norm's rows quantized (`quant_by`), that
    /// norm: where a call allows (`ops::norm_loaded`), the linear's mat-vec norms the row in
    /// every workgroup, the first stores it, and the norm is not dispatched (Gemma's post-norm
    /// before the per-layer input's gate). The norm's inputs live until the linear, so that the
    /// norm's output, stored while other workgroups still read them, never takes their memory.
    pub norm_load: Vec<Option<usize>>,
    /// Per node: for an attention whose q is (through reshapes and permutes nothing else reads)
    /// the rows of a rotated rms_norm that nothing else reads, that norm: where a call allows
    /// (`ops::q_normed`), attention's `split` norms and rotates its head's row itself and the
    /// norm is not dispatched (Gemma's q norm with RoPE). Its inputs live until the attention.
    /// `normed_q` is the inverse.
    pub q_norm: Vec<Option<usize>>,
    pub normed_q: Vec<Option<usize>>,
    /// Per node: for an rms_norm storing its rows into a KV cache (`norm_cache`), an earlier
    /// one storing as many rows into a cache of the same shape at the same rows, unweighted and
    /// not rotated (Gemma's v norm before its k norm): where a call allows
    /// (`ops::kv_norms`), this norm's dispatch runs that one too (`main4_cache_kv`) and that one
    /// dispatches nothing. Nothing between the two touches the earlier's cache, and its input
    /// lives until this one. `kv_guest_of` is the inverse.
    pub kv_guest: Vec<Option<usize>>,
    pub kv_guest_of: Vec<Option<usize>>,
    /// Per node: for an attention that norms its own q (`q_norm`) and reads the KV caches that
    /// a k norm with its v guest (`kv_guest`) stores into, nothing else touching them in
    /// between, that k norm: where a call allows (`ops::kv_split`), the attention's split norms
    /// the new k and v rows itself and stores them into the caches, and the pair is not
    /// dispatched. Their inputs live until the attention. `kv_split_of` is the inverse.
    pub kv_split: Vec<Option<usize>>,
    pub kv_split_of: Vec<Option<usize>>,
    /// Per node: a permute, or a select by a literal index, whose input is kept live as long as
    /// its output, so that where it is a view for a call's shapes (`ops::views`) the executor
    /// skips it and reads its input instead (a select from an offset into it).
    pub view_op: Vec<bool>,
    pub buffers: Vec<BufferSpec>,
}

/// Which fusions the plan may make: linears of one input paired, norms quantizing for their
/// linears, gate/up linears storing their chain, norms storing into KV caches, norms running
/// the norm that reads their rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fusions {
    pub pair_linears: bool,
    pub quant: bool,
    pub glu: bool,
    pub cache_update: bool,
    pub norm_pairs: bool,
    pub ranges: bool,
    pub chain_loads: bool,
    pub norm_loads: bool,
    pub q_norms: bool,
    pub kv_norms: bool,
    pub kv_splits: bool,
    /// Compute 4-bit biases that are -8 · scales instead of storing them (`derived_bias`).
    pub derived_biases: bool,
    /// Pair linears in threes (`third`: a third output binding, `ops::WIDE_BINDINGS`).
    pub triples: bool,
    /// Storage buffers a kernel may bind: XNNPACK's linears bind their ksums after their
    /// outputs, so a pair of them needs 9 and a triple 10.
    pub storage_buffers: u32,
}

/// The constants a paired linear's partner appends to its own (`MemoryPlan::partner`): its
/// weight's, and XNNPACK's ksums (src/gpu/ksums.rs, its last input).
fn pair_tensors(op: &crate::ir::Op) -> Vec<TensorId> {
    match op.kind {
        OpKind::Linear {
            act_quant: crate::ir::ActQuant::Xnnpack,
            has_bias: false,
            ..
        } => op.inputs[1..].to_vec(),
        _ => ops::weight_tensors(op),
    }
}

/// Per root: whether it is a 4-bit weight's biases equal to -8 · its scales bit for bit (as the
/// kernels form it: `neg8_bits`), for every op that reads it (4-bit linears and embeddings, whose
/// last weight tensor it is). Such biases are what symmetric 4-bit weights (nibbles q + 8)
/// carry; a kernel forming -8 · scale gets the same f32 the front end stored, so nothing changes
/// but the bytes: E2B's 4-bit per-layer embedding table alone has 294 MB of them.
fn derive_biases(g: &Graph, root: &[TensorId], reads: &[Vec<usize>]) -> Vec<bool> {
    use crate::ir::Weight;
    let nt = g.tensors.len();
    let mut derived = vec![false; nt];
    // f32 constants (both are f32 where a front end derived the biases).
    let data = |t: TensorId| match &g.tensors[t].role {
        Role::Constant(b) if root[t] == t && g.tensors[t].dtype == crate::ir::DType::F32 => Some(b),
        _ => None,
    };
    // The (scales, biases) pairs already compared.
    let mut seen: Vec<((TensorId, TensorId), bool)> = Vec::new();
    for (b, readers) in reads.iter().enumerate() {
        if readers.is_empty() || root[b] != b {
            continue;
        }
        derived[b] = readers.iter().all(|&n| {
            let Node::Op(op) = &g.nodes[n] else {
                return false;
            };
            let q4 = matches!(
                op.kind,
                OpKind::Linear {
                    weight: Weight::Q4 { .. },
                    ..
                } | OpKind::Embedding {
                    weight: Weight::Q4 { .. }
                }
            );
            let ws = ops::weight_tensors(op);
            if !q4 || ws.len() != 3 || ws[2] != b || ws[1..].iter().any(|&t| root[t] != t) {
                return false;
            }
            let pair = (ws[1], b);
            if let Some(&(_, ok)) = seen.iter().find(|(p, _)| *p == pair) {
                return ok;
            }
            let n = g.tensors[b].max_bytes();
            let ok = match (data(pair.0), data(pair.1)) {
                (Some(sc), Some(bi))
                    if g.tensors[pair.0].max_bytes() == n && sc.len() >= n && bi.len() >= n =>
                {
                    match bi.neg8_of() {
                        // Made from these scales: only they are read (the biases never are).
                        Some(src) if src.same_as(sc) => all_neg8(&sc[..n], None),
                        _ => all_neg8(&sc[..n], Some(&bi[..n])),
                    }
                }
                _ => false,
            };
            seen.push((pair, ok));
            ok
        });
    }
    derived
}

/// Whether every f32 of `bi` is -8 · the f32 of `sc` at its place, as kernels form it
/// (`neg8_bits`) and as the product is: bits compared as integers, on every core for large
/// tensors (E2B's per-layer embedding has 73M scales: a standalone copy of this loop took
/// 0.10 s over as many on one core of this project's build machine, the float comparison
/// before it 0.13 s). Without `bi` (biases made as -8 · these scales, `Blob::neg8`), whether
/// every product is a normal float, where the product's bits are neg8's.
fn all_neg8(sc: &[u8], bi: Option<&[u8]>) -> bool {
    let piece = |sc: &[u8], bi: Option<&[u8]>| {
        let normal = |s: u32| {
            // -8 · s is a normal float (so its bits are neg8's) for exponents 1..=251.
            let e = (s >> 23) & 0xff;
            (1..=251).contains(&e)
        };
        let word = |w: &[u8]| u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        match bi {
            Some(bi) => sc.chunks_exact(4).zip(bi.chunks_exact(4)).all(|(s, b)| {
                let s = word(s);
                normal(s) && word(b) == neg8_bits(f32::from_bits(s))
            }),
            None => sc.chunks_exact(4).all(|s| normal(word(s))),
        }
    };
    // Pieces of at least 16 MiB, one a core.
    let threads = crate::ir::cpu::threads().min(sc.len() >> 24).max(1);
    if threads == 1 {
        return piece(sc, bi);
    }
    let per = (sc.len() / 4).div_ceil(threads) * 4;
    std::thread::scope(|scope| {
        let parts: Vec<_> = sc
            .chunks(per)
            .enumerate()
            .map(|(k, s)| {
                let b = bi.map(|bi| &bi[k * per..(k * per + s.len()).min(bi.len())]);
                scope.spawn(move || piece(s, b))
            })
            .collect();
        parts.into_iter().all(|h| h.join().unwrap_or(false))
    })
}

/// The bits of -8 · s as kernels compute a derived bias (common.wgsl `neg8`): exponent + 3, sign
/// flipped. Those of the product wherever that is a normal float (not for zeros or subnormals).
fn neg8_bits(s: f32) -> u32 {
    (s.to_bits() ^ 0x8000_0000).wrapping_add(3 << 23)
}

/// Bytes per element of a representation, given the IR dtype's size.
pub(crate) fn elem_bytes(repr: Repr, dtype_size: usize) -> u64 {
    match repr {
        Repr::Raw => dtype_size as u64,
        Repr::F16 => 2,
        _ => 4,
    }
}

/// Buffer sizes are rounded up to 16 bytes: kernels read some tensors as `array<vec4<f32>>`.
pub(crate) fn padded(bytes: u64) -> u64 {
    bytes.max(16).div_ceil(16) * 16
}

/// Byte totals by role, for `inspect` and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryReport {
    pub constants: u64,
    pub states: u64,
    pub inputs: u64,
    pub activations: u64,
    /// Of `states`: the KV caches (States that a cache update writes in place), and how many of
    /// them are held as f16.
    pub kv_cache: u64,
    pub kv_caches: usize,
    pub f16_kv_caches: usize,
}

impl MemoryReport {
    pub fn total(&self) -> u64 {
        self.constants + self.states + self.inputs + self.activations
    }
}

impl MemoryPlan {
    pub fn bytes(&self, t: TensorId, g: &Graph) -> u64 {
        g.tensors[t].max_numel() as u64 * elem_bytes(self.repr[t], g.tensors[t].dtype.size())
    }

    pub fn report(&self) -> MemoryReport {
        let mut r = MemoryReport::default();
        for b in &self.buffers {
            match b.kind {
                BufferKind::Constant { .. } => r.constants += b.size,
                BufferKind::State(t) => {
                    r.states += b.size;
                    if self.kv_cache[t] {
                        r.kv_cache += b.size;
                        r.kv_caches += 1;
                        r.f16_kv_caches += (self.repr[t] == Repr::F16) as usize;
                    }
                }
                BufferKind::Input => r.inputs += b.size,
                BufferKind::Pool => r.activations += b.size,
            }
        }
        r
    }

    /// Plans storage, with a line for every tensor that cannot be placed (the plan is then only
    /// good for reporting). `f16_kv`: hold the KV caches as f16 where every op on them can.
    pub fn new(
        g: &Graph,
        max_binding: u64,
        f16_kv: bool,
        fusions: Fusions,
    ) -> (MemoryPlan, Vec<String>) {
        let Fusions {
            pair_linears: merge,
            quant: fuse_quant,
            glu: fuse_glu,
            cache_update: fuse_cache,
            norm_pairs: fuse_norm_pairs,
            ranges: fuse_ranges,
            chain_loads: fuse_chain_loads,
            norm_loads: fuse_norm_loads,
            q_norms: fuse_q_norms,
            kv_norms: fuse_kv_norms,
            kv_splits: fuse_kv_splits,
            derived_biases,
            triples,
            storage_buffers,
        } = fusions;
        let nt = g.tensors.len();
        let mut errors = Vec::new();
        let mut root: Vec<TensorId> = (0..nt).collect();
        for node in &g.nodes {
            if let Node::Op(op) = node {
                if let Some((out, input)) = ops::alias(g, op) {
                    root[out] = root[input];
                }
            }
        }
        // Representation per root, from dtype and from being read as a packed weight.
        let mut repr: Vec<Repr> = g
            .tensors
            .iter()
            .map(|t| {
                if t.dtype.is_float() {
                    Repr::F32
                } else {
                    Repr::I32
                }
            })
            .collect();
        for op in g.ops() {
            if let Some(t) = ops::packed_weight(op) {
                repr[root[t]] = Repr::Raw;
            }
        }
        let kv_cache = kv_caches(g, &root);
        if f16_kv {
            for t in f16_kv_caches(g, &root, &repr, &kv_cache) {
                repr[t] = Repr::F16;
            }
        }
        for t in 0..nt {
            repr[t] = repr[root[t]];
        }
        let plan_bytes = |t: TensorId, repr: &[Repr]| {
            g.tensors[t].max_numel() as u64 * elem_bytes(repr[t], g.tensors[t].dtype.size())
        };
        let mut bytes = vec![0u64; nt];
        for t in 0..nt {
            let b = plan_bytes(t, &repr);
            bytes[root[t]] = bytes[root[t]].max(b);
        }

        // Row splitting: a group (a weight and its scales/biases) splits at the same rows; a
        // tensor in several groups (a tied embedding) takes the smallest chunk of any of them.
        let groups: Vec<Vec<TensorId>> = g
            .ops()
            .map(ops::weight_tensors)
            .filter(|v| !v.is_empty())
            .collect();
        let row_bytes = |t: TensorId| -> Option<(usize, u64)> {
            match g.tensors[t].max_shape.as_slice() {
                [r, c] => Some((
                    *r,
                    *c as u64 * elem_bytes(repr[t], g.tensors[t].dtype.size()),
                )),
                _ => None,
            }
        };
        let mut split: Vec<Option<(usize, u64)>> = vec![None; nt];
        for group in &groups {
            if !group.iter().any(|&t| bytes[root[t]] > max_binding) {
                continue;
            }
            for &t in group {
                let Some((rows, rb)) = row_bytes(t) else {
                    errors.push(format!(
                        "tensor {t} `{}` is too large to bind and is not 2-D",
                        g.tensors[t].name
                    ));
                    continue;
                };
                if rb > max_binding {
                    errors.push(format!(
                        "tensor {t} `{}`: one row of {rb} bytes exceeds the device's {max_binding}-byte storage binding",
                        g.tensors[t].name
                    ));
                    continue;
                }
                let per = ((max_binding / rb.max(1)) as usize).min(rows.max(1));
                let r = root[t];
                split[r] = Some(match split[r] {
                    Some((p, b)) if b != rb => {
                        errors.push(format!(
                            "tensor {t} `{}` is split with two row sizes",
                            g.tensors[t].name
                        ));
                        (p, b)
                    }
                    Some((p, b)) => (p.min(per), b),
                    None => (per, rb),
                });
            }
        }
        // Members of one group must agree on rows per chunk: settle on the minimum.
        loop {
            let mut changed = false;
            for group in &groups {
                let min = group
                    .iter()
                    .filter_map(|&t| split[root[t]].map(|s| s.0))
                    .min();
                let Some(min) = min else { continue };
                for &t in group {
                    let r = root[t];
                    match split[r] {
                        Some((p, b)) if p != min => {
                            split[r] = Some((min, b));
                            changed = true;
                        }
                        None => {
                            if let Some((_, rb)) = row_bytes(t) {
                                split[r] = Some((min, rb));
                                changed = true;
                            }
                        }
                        _ => {}
                    }
                }
            }
            if !changed {
                break;
            }
        }

        // Who reads what, and when.
        let never = usize::MAX;
        let mut first_write = vec![never; nt];
        let mut last_read = vec![0usize; nt];
        let mut used = vec![false; nt];
        let mut writers = vec![0usize; nt];
        // Per root, the nodes that read it (once per input) and that write it, in order.
        let mut reads: Vec<Vec<usize>> = vec![Vec::new(); nt];
        let mut writes: Vec<Vec<usize>> = vec![Vec::new(); nt];
        for (n, node) in g.nodes.iter().enumerate() {
            let Node::Op(op) = node else { continue };
            let weights = ops::weight_tensors(op);
            // A reshape that shares its input's storage reads it but writes nothing.
            let view = reshape_view(g, op);
            for &t in &op.inputs {
                let r = root[t];
                used[r] = true;
                last_read[r] = last_read[r].max(n);
                reads[r].push(n);
                if split[r].is_some() && !weights.contains(&t) {
                    errors.push(format!(
                        "tensor {t} `{}` is split by rows (too large to bind) but {} reads it whole",
                        g.tensors[t].name,
                        op.kind.label()
                    ));
                }
            }
            for &t in &op.outputs {
                let r = root[t];
                used[r] = true;
                first_write[r] = first_write[r].min(n);
                writers[r] += !view as usize;
                writes[r].push(n);
            }
        }
        for (k, &t) in g.outputs.iter().enumerate() {
            let r = root[t];
            used[r] = true;
            last_read[r] = never;
            if split[r].is_some() && !matches!(g.tensors[r].role, Role::Constant(_)) {
                errors.push(format!("output {k} is too large to bind"));
            }
        }
        // A permute that moves only dims of size 1 for a call's shapes (a decode step's attention
        // heads) is a view for that call (`ops::permute_is_view`): its input then lives as long
        // as its output, so that the executor can read the input in its place and skip the copy.
        // A select by a literal index of a dim after size-1 dims is a contiguous slice: a view
        // at an offset (the per-layer input's select, 35 a decode step).
        // (Latest first, so that a chain of such views keeps its first input.)
        let mut view_op = vec![false; g.nodes.len()];
        for (n, node) in g.nodes.iter().enumerate().rev() {
            let Node::Op(op) = node else { continue };
            let viewable = matches!(
                op.kind,
                OpKind::Permute { .. }
                    | OpKind::Select {
                        index: crate::ir::Int::Lit(_),
                        ..
                    }
            );
            if let (true, Some(&x), Some(&y)) = (viewable, op.inputs.first(), op.outputs.first()) {
                let (i, o) = (root[x], root[y]);
                let act = |t: TensorId| matches!(g.tensors[t].role, Role::Activation);
                // (Not a graph output: those are read back from their own storage.)
                let one_writer = writers[o] == 1 && last_read[o] != never;
                if i != o && act(i) && act(o) && repr[i] == repr[o] && one_writer {
                    view_op[n] = true;
                    last_read[i] = last_read[i].max(last_read[o]);
                }
            }
        }
        for t in 0..nt {
            if root[t] == t && used[t] && split[t].is_none() && bytes[t] > max_binding {
                errors.push(format!(
                    "tensor {t} `{}` needs {} bytes, more than the device's {max_binding}-byte storage binding",
                    g.tensors[t].name, bytes[t]
                ));
            }
        }

        let derived_bias = if derived_biases {
            derive_biases(g, &root, &reads)
        } else {
            vec![false; nt]
        };

        // Linears reading one input with one activation quantization and weight format (q/k,
        // gate/up) pair up: the first computes both in one dispatch (a decode mat-vec's cost is
        // mostly fixed), each of its weight tensors sharing one buffer with the second's, laid
        // end to end. With `triples`, a third joins (q/k/v: the E2B-shaped decode step 2605 ->
        // 2575 us on an H100, 15 dispatches fewer). Only unsplit constants read by nothing else,
        // without bias, and outputs in the pool (the second's is written at the first's node);
        // not XNNPACK's exact GEMM.
        let mut partner: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut third: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut merged_into: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut joined: Vec<Vec<TensorId>> = vec![Vec::new(); nt];
        let mut absorbed = vec![false; nt];
        if merge {
            let key = |op: &crate::ir::Op| -> Option<(TensorId, String)> {
                let OpKind::Linear {
                    weight,
                    act_quant,
                    has_bias,
                } = &op.kind
                else {
                    return None;
                };
                let out = *op.outputs.first()?;
                // XNNPACK's: 4-bit with ksums (xnn_matvec's), one more binding for them.
                let xnn = *act_quant == crate::ir::ActQuant::Xnnpack;
                let ok = !*has_bias
                    && (!xnn
                        || (matches!(weight, crate::ir::Weight::Q4 { .. })
                            && storage_buffers >= ops::WIDE_BINDINGS))
                    && op.inputs.len() == 1 + weight.tensor_count() + xnn as usize
                    && pair_tensors(op).iter().all(|&t| {
                        root[t] == t
                            && reads[t].len() == 1
                            && split[t].is_none()
                            && matches!(g.tensors[t].role, Role::Constant(_))
                    })
                    && root[out] == out
                    && matches!(g.tensors[out].role, Role::Activation);
                // Partners' biases lie in one buffer: both stored, or both derived.
                let derived = ops::weight_tensors(op)
                    .last()
                    .is_some_and(|&b| derived_bias[root[b]]);
                ok.then(|| {
                    (
                        root[op.inputs[0]],
                        format!("{weight:?}/{act_quant:?}/{derived}"),
                    )
                })
            };
            // Leads open to a partner (or, with triples, to a third).
            let mut open: Vec<((TensorId, String), usize)> = Vec::new();
            for (n, node) in g.nodes.iter().enumerate() {
                let Node::Op(op) = node else { continue };
                if let Some(k) = key(op) {
                    match open.iter().position(|(o, _)| *o == k) {
                        Some(i) => {
                            let m = open.remove(i).1;
                            let Node::Op(lead) = &g.nodes[m] else {
                                continue;
                            };
                            let lead_w = pair_tensors(lead);
                            let fits = lead_w.iter().zip(pair_tensors(op)).all(|(&a, b)| {
                                let laid: u64 = joined[a].iter().map(|&j| bytes[j]).sum();
                                (bytes[a] + laid) % 4 == 0
                                    && bytes[a] + laid + bytes[b] <= max_binding
                            });
                            if fits {
                                if partner[m].is_none() {
                                    partner[m] = Some(n);
                                    // (An XNNPACK triple's ksums bind after a third output.)
                                    let xnn = matches!(
                                        lead.kind,
                                        OpKind::Linear {
                                            act_quant: crate::ir::ActQuant::Xnnpack,
                                            ..
                                        }
                                    );
                                    if triples && (!xnn || storage_buffers > ops::WIDE_BINDINGS) {
                                        open.push((k, m));
                                    }
                                } else {
                                    third[m] = Some(n);
                                }
                                merged_into[n] = Some(m);
                                let out = op.outputs[0];
                                first_write[out] = first_write[out].min(m);
                                for (a, b) in lead_w.into_iter().zip(pair_tensors(op)) {
                                    joined[a].push(b);
                                    absorbed[b] = true;
                                }
                            } else {
                                open.push((k, n));
                            }
                        }
                        None => open.push((k, n)),
                    }
                }
                for &o in &op.outputs {
                    open.retain(|((r, _), _)| *r != root[o]);
                }
            }
        }

        // A paired linear whose two outputs are read only by one element-wise chain of the two
        // (gate/up, then gelu(gate) · up) can store the chain's result itself where it runs as
        // a mat-vec: the team that computes a row of the first computes the same row of the
        // second (`ops::glu_fused`), and the chain is not dispatched. Its output is then
        // written at the linear's node. Such a chain never quantizes for a linear (the calls
        // that run it apart would need it to).
        let mut glu_chain: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut glu_lead: Vec<Option<usize>> = vec![None; g.nodes.len()];
        if merge && fuse_glu {
            let out_of = |n: usize| match &g.nodes[n] {
                Node::Op(op) => op.outputs.first().copied(),
                Node::Sym(_) => None,
            };
            for m in 0..g.nodes.len() {
                let Some(n) = partner[m] else { continue };
                if third[m].is_some() {
                    continue;
                }
                let (Some(o1), Some(o2)) = (out_of(m), out_of(n)) else {
                    continue;
                };
                let Some(&c) = reads[o1].first() else {
                    continue;
                };
                let Node::Op(chain) = &g.nodes[c] else {
                    continue;
                };
                let Some(&cout) = chain.outputs.first() else {
                    continue;
                };
                let shape = &g.tensors[o1].max_shape;
                let ok = matches!(chain.kind, OpKind::ElementwiseChain { .. })
                    && reads[o1] == [c]
                    && reads[o2] == [c]
                    && (chain.inputs == [o1, o2] || chain.inputs == [o2, o1])
                    && !g.outputs.contains(&o1)
                    && !g.outputs.contains(&o2)
                    && root[cout] == cout
                    && matches!(g.tensors[cout].role, Role::Activation)
                    && g.tensors[o2].max_shape == *shape
                    && g.tensors[cout].max_shape == *shape;
                if ok {
                    glu_chain[m] = Some(c);
                    glu_lead[c] = Some(m);
                    first_write[cout] = first_write[cout].min(m);
                }
            }
        }

        let mut buffers = Vec::new();
        let mut place: Vec<Vec<usize>> = vec![Vec::new(); nt];
        let mut pooled = Vec::new();
        for t in 0..nt {
            if root[t] != t || !used[t] || absorbed[t] || derived_bias[t] {
                continue;
            }
            let size = bytes[t];
            match &g.tensors[t].role {
                Role::Constant(_) => {
                    let chunk = split[t]
                        .map_or(size.max(1), |(rows, rb)| rows as u64 * rb)
                        .max(1);
                    let then = joined[t].clone();
                    let more: u64 = then.iter().map(|&b| bytes[b]).sum();
                    let mut start = 0;
                    while start < size.max(1) {
                        let end = (start + chunk).min(size);
                        place[t].push(buffers.len());
                        buffers.push(BufferSpec {
                            size: padded(end - start + more),
                            kind: BufferKind::Constant {
                                tensor: t,
                                range: start..end,
                                then: then.clone(),
                            },
                        });
                        start += chunk;
                    }
                }
                Role::State(_) => {
                    place[t].push(buffers.len());
                    buffers.push(BufferSpec {
                        size: padded(size),
                        kind: BufferKind::State(t),
                    });
                }
                Role::Input(_) => {
                    place[t].push(buffers.len());
                    buffers.push(BufferSpec {
                        size: padded(size),
                        kind: BufferKind::Input,
                    });
                }
                Role::Activation => pooled.push(t),
            }
        }

        // Linears reading one input with one activation quantization quantize it once: the
        // first one's scratch serves the others until the input is written again.
        let mut quant_from: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut last_sharer: Vec<usize> = (0..g.nodes.len()).collect();
        let mut quant_into: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut quant_by: Vec<Option<usize>> = vec![None; g.nodes.len()];
        {
            // The row-wise producer (an rms_norm, plain or with a chain but not rotated, or an
            // element-wise chain) that writes a tensor, by root.
            let mut row_producer: Vec<Option<usize>> = vec![None; nt];
            for (n, node) in g.nodes.iter().enumerate() {
                if let Node::Op(op) = node {
                    if glu_lead[n].is_none()
                        && matches!(
                            op.kind,
                            OpKind::RmsNorm { .. }
                                | OpKind::RmsNormChain { .. }
                                | OpKind::ElementwiseChain { .. }
                        )
                    {
                        for &o in &op.outputs {
                            row_producer[root[o]] = Some(n);
                        }
                    }
                }
            }
            let mut owners: Vec<((TensorId, String), usize)> = Vec::new();
            for (n, node) in g.nodes.iter().enumerate() {
                let Node::Op(op) = node else { continue };
                if let OpKind::Linear {
                    weight, act_quant, ..
                } = &op.kind
                {
                    // (An owner without outputs would quantize nothing for the others.)
                    let n_out = g.tensors[op.outputs[0]].max_shape.last().copied();
                    if *act_quant != crate::ir::ActQuant::None && n_out != Some(0) {
                        let key = (root[op.inputs[0]], format!("{weight:?}/{act_quant:?}"));
                        match owners.iter().find(|(k, _)| *k == key) {
                            Some(&(_, m)) => {
                                quant_from[n] = Some(m);
                                last_sharer[m] = n;
                            }
                            None => {
                                owners.push((key, n));
                                let by = row_producer[root[op.inputs[0]]];
                                if let Some(pn) = by.filter(|&pn| {
                                    fuse_quant
                                        && quant_into[pn].is_none()
                                        && !matches!(weight, crate::ir::Weight::F32)
                                }) {
                                    quant_into[pn] = Some(n);
                                    quant_by[n] = Some(pn);
                                }
                            }
                        }
                    }
                }
                for &o in &op.outputs {
                    owners.retain(|((r, _), _)| *r != root[o]);
                }
            }
        }

        // An element-wise chain quantizing for a linear that alone reads it, of inputs of its
        // own shape (at most two: the mat-vec binds them where x and a second output go), for a
        // linear whose scratch no other linear shares and that computes its rows alone.
        let mut chain_load: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut loaded_by: Vec<Option<usize>> = vec![None; g.nodes.len()];
        if fuse_chain_loads {
            for (l, node) in g.nodes.iter().enumerate() {
                let (Node::Op(lop), Some(c)) = (node, quant_by[l]) else {
                    continue;
                };
                let Node::Op(cop) = &g.nodes[c] else { continue };
                let Some(&o) = cop.outputs.first() else {
                    continue;
                };
                let shape = &g.tensors[o].max_shape;
                let ok = matches!(cop.kind, OpKind::ElementwiseChain { .. })
                    && matches!(lop.kind, OpKind::Linear { act_quant, .. }
                        if act_quant != crate::ir::ActQuant::None)
                    && (1..=2).contains(&cop.inputs.len())
                    && (cop.inputs.iter())
                        .all(|&i| g.tensors[i].max_shape == *shape && repr[root[i]] == Repr::F32)
                    && root[o] == o
                    && reads[o] == [l]
                    && !g.outputs.contains(&o)
                    && last_sharer[l] == l
                    && partner[l].is_none()
                    && merged_into[l].is_none()
                    && distinct_roots(&root, &cop.inputs);
                if ok {
                    chain_load[l] = Some(c);
                    loaded_by[c] = Some(l);
                    read_until(&mut last_read, &root, &cop.inputs, l);
                }
            }
        }

        let mut norm_load: Vec<Option<usize>> = vec![None; g.nodes.len()];
        if fuse_norm_loads {
            for (l, node) in g.nodes.iter().enumerate() {
                let (Node::Op(lop), Some(pn)) = (node, quant_by[l]) else {
                    continue;
                };
                let Node::Op(nop) = &g.nodes[pn] else {
                    continue;
                };
                let Some(&o) = nop.outputs.first() else {
                    continue;
                };
                // Its rows exist once the linear runs: nothing but views reads them before.
                let later = reads[root[o]]
                    .iter()
                    .all(|&r| r >= l || matches!(&g.nodes[r], Node::Op(v) if reshape_view(g, v)));
                let ok = later
                    && matches!(
                        nop.kind,
                        OpKind::RmsNorm { .. } | OpKind::RmsNormChain { .. }
                    )
                    && matches!(lop.kind, OpKind::Linear { act_quant, .. }
                        if act_quant != crate::ir::ActQuant::None)
                    && last_sharer[l] == l
                    && partner[l].is_none()
                    && merged_into[l].is_none()
                    && chain_load[l].is_none()
                    && distinct_roots(&root, &nop.inputs);
                if ok {
                    norm_load[l] = Some(pn);
                    read_until(&mut last_read, &root, &nop.inputs, l);
                }
            }
        }

        // An rms_norm (plain or rotated, rows in 16-byte words, not quantizing for a linear)
        // whose output only an in-place update of an f32 cache reads, as the rows it writes
        // along the axis before the last, stores its rows straight into the cache (rms_norm.wgsl
        // `main4_cache`) and the update is not dispatched: the k and v of a decode layer. Its
        // rows then land at the norm's node, so nothing between the two may touch the cache,
        // and the update's indices must exist by then.
        let mut norm_cache: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut cache_filled: Vec<Option<usize>> = vec![None; g.nodes.len()];
        if fuse_cache {
            for (n, node) in g.nodes.iter().enumerate() {
                let Node::Op(op) = node else { continue };
                if !matches!(op.kind, OpKind::RmsNorm { .. } | OpKind::RmsNormRope { .. })
                    || quant_into[n].is_some()
                {
                    continue;
                }
                let Some(&o) = op.outputs.first() else {
                    continue;
                };
                let ([u], [_]) = (&reads[root[o]][..], &writes[root[o]][..]) else {
                    continue;
                };
                let u = *u;
                let Node::Op(up) = &g.nodes[u] else { continue };
                let OpKind::CacheUpdate { axis, .. } = up.kind else {
                    continue;
                };
                let (Some(&cache), Some(&value), Some(&cout)) =
                    (up.inputs.first(), up.inputs.get(1), up.outputs.first())
                else {
                    continue;
                };
                let vshape = &g.tensors[value].max_shape;
                let c = root[cache];
                let ok = value == o
                    && root[o] == o
                    && cache != o
                    && !g.outputs.contains(&o)
                    && vshape.len() >= 2
                    && axis + 2 == vshape.len()
                    && vshape.last().is_some_and(|d| d % 4 == 0)
                    && repr[c] == Repr::F32
                    && aliases(g, &up.kind, cout, cache)
                    && (reads[c].iter().chain(&writes[c])).all(|&v| v <= n || v >= u)
                    && (up.inputs.get(2))
                        .is_none_or(|&i| writes[root[i]].first().is_none_or(|&w| w < n));
                if ok {
                    norm_cache[n] = Some(u);
                    cache_filled[u] = Some(n);
                }
            }
        }

        // Norms storing into caches, each with the nearest earlier one (`kv_guest`): the
        // earlier's rows then land at the later norm's node.
        let mut kv_guest: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut kv_guest_of: Vec<Option<usize>> = vec![None; g.nodes.len()];
        if fuse_kv_norms {
            // (cache update, its cache's root) of a norm storing into a cache.
            let update = |n: usize| {
                let Node::Op(up) = &g.nodes[norm_cache[n]?] else {
                    return None;
                };
                Some((up, root[*up.inputs.first()?]))
            };
            for h in 0..g.nodes.len() {
                let Some((hup, hc)) = update(h) else { continue };
                let Node::Op(hop) = &g.nodes[h] else { continue };
                for e in (0..h).rev() {
                    let (Some((eup, ec)), Node::Op(eop)) = (update(e), &g.nodes[e]) else {
                        continue;
                    };
                    let shape = |t: Option<&TensorId>| t.map(|&t| &g.tensors[t].max_shape);
                    let ok = matches!(eop.kind, OpKind::RmsNorm { .. })
                        && eop.inputs.len() == 1
                        && kv_guest_of[e].is_none()
                        && kv_guest[e].is_none()
                        && ec != hc
                        && eup.kind == hup.kind
                        && eup.inputs.get(2) == hup.inputs.get(2)
                        && shape(eup.inputs.first()) == shape(hup.inputs.first())
                        && shape(eop.outputs.first()) == shape(hop.outputs.first())
                        && (reads[ec].iter().chain(&writes[ec]))
                            .all(|&v| v <= e || v > h || Some(v) == norm_cache[e]);
                    if ok {
                        kv_guest[h] = Some(e);
                        kv_guest_of[e] = Some(h);
                        read_until(&mut last_read, &root, &eop.inputs, h);
                    }
                    break;
                }
            }
        }

        // A plain rms_norm B quantizing for its linears whose input another rms_norm A (not
        // rotated, not quantizing, not storing into a cache) writes alone: A's dispatch may norm
        // its rows again as B (the second norm's f32 rows are not stored), so everything that
        // reads B's output must take it quantized, B's weight must exist before A, and the
        // quantized rows' scratch lives from A.
        let mut norm_pair: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut paired_norm: Vec<Option<usize>> = vec![None; g.nodes.len()];
        if fuse_norm_pairs {
            let is_view = |n: usize| matches!(&g.nodes[n], Node::Op(op) if reshape_view(g, op));
            for (b, node) in g.nodes.iter().enumerate() {
                let Node::Op(bop) = node else { continue };
                let (OpKind::RmsNorm { .. }, Some(&x), Some(&o)) =
                    (&bop.kind, bop.inputs.first(), bop.outputs.first())
                else {
                    continue;
                };
                if quant_into[b].is_none() {
                    continue;
                }
                let producers: Vec<usize> = writes[root[x]]
                    .iter()
                    .copied()
                    .filter(|&w| !is_view(w))
                    .collect();
                let [a] = producers[..] else { continue };
                let Node::Op(aop) = &g.nodes[a] else { continue };
                let quantized_by_b = |r: usize| {
                    is_view(r)
                        || quant_by[r] == Some(b)
                        || quant_from[r].is_some_and(|m| quant_by[m] == Some(b))
                };
                let ok = matches!(
                    aop.kind,
                    OpKind::RmsNorm { .. } | OpKind::RmsNormChain { .. }
                ) && a < b
                    && aop.outputs.first().is_some_and(|&ao| root[ao] == root[x])
                    && quant_into[a].is_none()
                    && norm_cache[a].is_none()
                    && root[o] == o
                    && !g.outputs.contains(&o)
                    && reads[o].iter().all(|&r| quantized_by_b(r))
                    && (bop.inputs[1..].iter()).all(|&i| writes[root[i]].iter().all(|&w| w < a));
                if ok {
                    norm_pair[a] = Some(b);
                    paired_norm[b] = Some(a);
                }
            }
        }

        // Attentions that norm and rotate their own q (`q_norm`).
        let mut q_norm: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut normed_q: Vec<Option<usize>> = vec![None; g.nodes.len()];
        if fuse_q_norms {
            for (a, node) in g.nodes.iter().enumerate() {
                let Node::Op(op) = node else { continue };
                if !matches!(op.kind, OpKind::Sdpa { .. }) {
                    continue;
                }
                let Some(nn) = rotated_q(g, &root, &reads, &writes, a) else {
                    continue;
                };
                if norm_cache[nn].is_some() || norm_pair[nn].is_some() || normed_q[nn].is_some() {
                    continue;
                }
                q_norm[a] = Some(nn);
                normed_q[nn] = Some(a);
                if let Node::Op(nop) = &g.nodes[nn] {
                    read_until(&mut last_read, &root, &nop.inputs, a);
                }
            }
        }
        // Attentions that norm their q and whose k and v caches the nearest earlier norm pair
        // storing into caches fills (`kv_guest`: a k norm with its v guest), nothing else
        // touching those caches in between: the attention's split may norm the new rows too.
        let mut kv_split: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut kv_split_of: Vec<Option<usize>> = vec![None; g.nodes.len()];
        if fuse_kv_splits {
            for (a, node) in g.nodes.iter().enumerate() {
                let Node::Op(op) = node else { continue };
                if q_norm[a].is_none() || op.inputs.len() < 3 {
                    continue;
                }
                let Some(h) = (0..a).rev().find(|&h| kv_guest[h].is_some()) else {
                    continue;
                };
                let (Some(e), Some(uk)) = (kv_guest[h], norm_cache[h]) else {
                    continue;
                };
                let Some(uv) = norm_cache[e] else { continue };
                let cache_of = |u: usize| match &g.nodes[u] {
                    Node::Op(up) => up.inputs.first().map(|&c| root[c]),
                    _ => None,
                };
                let (Some(kc), Some(vc)) = (cache_of(uk), cache_of(uv)) else {
                    continue;
                };
                let (Node::Op(hop), Node::Op(eop)) = (&g.nodes[h], &g.nodes[e]) else {
                    continue;
                };
                // (Reshapes sharing a cache's storage touch nothing.)
                let is_view = |n: usize| matches!(&g.nodes[n], Node::Op(op) if reshape_view(g, op));
                let alone = |c: TensorId| {
                    (reads[c].iter().chain(&writes[c]))
                        .all(|&n| n <= h || n >= a || n == uk || n == uv || is_view(n))
                };
                let ok = matches!(hop.kind, OpKind::RmsNormRope { .. })
                    && root[op.inputs[1]] == kc
                    && root[op.inputs[2]] == vc
                    && alone(kc)
                    && alone(vc)
                    && kv_split_of[h].is_none();
                if ok {
                    kv_split[a] = Some(h);
                    kv_split_of[h] = Some(a);
                    read_until(&mut last_read, &root, &hop.inputs, a);
                    read_until(&mut last_read, &root, &eop.inputs, a);
                }
            }
        }
        // A view read in place keeps its input as long as itself (as above), now that the fused
        // ops' inputs live longer.
        for (n, node) in g.nodes.iter().enumerate().rev() {
            if let (true, Node::Op(op)) = (view_op[n], node) {
                let (i, o) = (root[op.inputs[0]], root[op.outputs[0]]);
                last_read[i] = last_read[i].max(last_read[o]);
            }
        }

        // Liveness-ordered pool: at each node, allocate what it writes (and its scratch), then
        // release what it read last.
        let mut scratch: Vec<Vec<usize>> = vec![Vec::new(); g.nodes.len()];
        let mut free: Vec<usize> = Vec::new();
        let take = |size: u64, buffers: &mut Vec<BufferSpec>, free: &mut Vec<usize>| -> usize {
            let size = padded(size);
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, &b)| buffers[b].size >= size)
                .min_by_key(|(_, &b)| buffers[b].size)
                .map(|(i, _)| i);
            match best {
                Some(i) => free.swap_remove(i),
                None => {
                    buffers.push(BufferSpec {
                        size,
                        kind: BufferKind::Pool,
                    });
                    buffers.len() - 1
                }
            }
        };
        // Activations nothing writes (a malformed graph) still get storage, live throughout.
        for &t in &pooled {
            if first_write[t] == never {
                place[t].push(take(bytes[t], &mut buffers, &mut free));
            }
        }
        for (n, node) in g.nodes.iter().enumerate() {
            let Node::Op(op) = node else { continue };
            for &t in &pooled {
                if first_write[t] == n {
                    place[t].push(take(bytes[t], &mut buffers, &mut free));
                }
            }
            // A norm quantizing for a linear writes that linear's scratch: it lives from here,
            // or from the norm whose dispatch may run it.
            let quantizer = match (norm_pair[n], paired_norm[n]) {
                (Some(b), _) => Some(b),
                (None, Some(_)) => None,
                (None, None) => Some(n),
            };
            if let Some(l) = quantizer.and_then(|q| quant_into[q]) {
                if let Node::Op(lop) = &g.nodes[l] {
                    for s in ops::scratch_bytes(g, lop, max_binding) {
                        scratch[l].push(take(s, &mut buffers, &mut free));
                    }
                }
            }
            match quant_from[n] {
                Some(m) => {
                    scratch[n] = scratch[m].clone();
                    if last_sharer[m] == n {
                        free.extend(scratch[m].iter().copied());
                    }
                }
                None => {
                    if quant_by[n].is_none() {
                        for s in ops::scratch_bytes(g, op, max_binding) {
                            scratch[n].push(take(s, &mut buffers, &mut free));
                        }
                    }
                    if last_sharer[n] == n {
                        free.extend(scratch[n].iter().copied());
                    }
                }
            }
            for &t in &pooled {
                if first_write[t] != never && last_read[t].max(first_write[t]) == n {
                    free.extend(place[t].iter().copied());
                }
            }
        }
        // A linear quantizing its input itself whose input is a rearrangement (reshapes,
        // permutes: the same elements, so the same range) of what a gate/up mat-vec's chain or
        // an attention stores: that producer takes the range as it stores.
        let mut range_by: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut range_for: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut range_site: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut range_sites = 0;
        if fuse_ranges {
            for (l, node) in g.nodes.iter().enumerate() {
                let Node::Op(op) = node else { continue };
                let OpKind::Linear {
                    weight, act_quant, ..
                } = &op.kind
                else {
                    continue;
                };
                if *act_quant == crate::ir::ActQuant::None
                    || matches!(weight, crate::ir::Weight::F32)
                    || quant_from[l].is_some()
                    || quant_by[l].is_some()
                    || merged_into[l].is_some()
                {
                    continue;
                }
                let Some(producer) = range_producer(g, &root, &writes, &glu_lead, op.inputs[0])
                else {
                    continue;
                };
                if range_for[producer].is_none() {
                    range_by[l] = Some(producer);
                    range_for[producer] = Some(l);
                    range_site[l] = Some(range_sites);
                    range_sites += 1;
                }
            }
        }
        let plan = MemoryPlan {
            max_binding,
            repr,
            kv_cache,
            root,
            split,
            place,
            scratch,
            quant_from,
            partner,
            third,
            merged_into,
            derived_bias,
            quant_into,
            quant_by,
            glu_chain,
            glu_lead,
            norm_cache,
            cache_filled,
            norm_pair,
            paired_norm,
            range_by,
            range_for,
            range_site,
            range_sites,
            chain_load,
            loaded_by,
            norm_load,
            q_norm,
            normed_q,
            kv_guest,
            kv_guest_of,
            kv_split,
            kv_split_of,
            view_op,
            buffers,
        };
        (plan, errors)
    }
}

/// The op whose stores are tensor `x`'s elements, through ops that only rearrange them
/// (reshapes, permutes), where it can take their range as it stores them: the gate/up mat-vec
/// that stores its chain (`glu_lead`), or an attention. `None` where anything else writes them.
fn range_producer(
    g: &Graph,
    root: &[TensorId],
    writes: &[Vec<usize>],
    glu_lead: &[Option<usize>],
    x: TensorId,
) -> Option<usize> {
    let mut t = x;
    // (Exports put a reshape or two and a permute between; a longer walk is not worth it.)
    for _ in 0..8 {
        let w = sole_writer(g, writes, root[t])?;
        let Node::Op(op) = &g.nodes[w] else {
            return None;
        };
        match op.kind {
            OpKind::Sdpa { .. } => return Some(w),
            OpKind::ElementwiseChain { .. } => return glu_lead[w],
            OpKind::Reshape { .. } | OpKind::Permute { .. } => t = *op.inputs.first()?,
            _ => return None,
        }
    }
    None
}

/// The one node that writes root `r`: a reshape sharing its input's storage is listed as a writer
/// but writes nothing.
fn sole_writer(g: &Graph, writes: &[Vec<usize>], r: TensorId) -> Option<usize> {
    let real: Vec<usize> = (writes[r].iter().copied())
        .filter(|&w| !matches!(&g.nodes[w], Node::Op(op) if reshape_view(g, op)))
        .collect();
    match real[..] {
        [w] => Some(w),
        _ => None,
    }
}

/// Whether `inputs` lie in storage of their own each. A fused kernel that binds one of them
/// read-write (a mat-vec's chain operand sits at a read-write slot) cannot take one buffer
/// twice: wgpu refuses a buffer bound read-only and read-write in one dispatch (a norm chain
/// `x · rms_norm(x)` found by the random-graph test).
fn distinct_roots(root: &[TensorId], inputs: &[TensorId]) -> bool {
    (inputs.iter().enumerate()).all(|(i, &t)| !inputs[..i].iter().any(|&u| root[u] == root[t]))
}

/// Keeps the storage of `inputs` (the inputs of an op that a later node `n` runs) until `n`.
fn read_until(last_read: &mut [usize], root: &[TensorId], inputs: &[TensorId], n: usize) {
    for &i in inputs {
        last_read[root[i]] = last_read[root[i]].max(n);
    }
}

/// The rotated rms_norm whose rows attention `a` reads as q through reshapes and permutes, where
/// nothing else reads the norm's output or anything on the way and none of it is a graph output.
fn rotated_q(
    g: &Graph,
    root: &[TensorId],
    reads: &[Vec<usize>],
    writes: &[Vec<usize>],
    a: usize,
) -> Option<usize> {
    let Node::Op(op) = &g.nodes[a] else {
        return None;
    };
    let (mut t, mut reader) = (*op.inputs.first()?, a);
    let is_view = |n: usize| matches!(&g.nodes[n], Node::Op(op) if reshape_view(g, op));
    for _ in 0..8 {
        let r = root[t];
        let w = sole_writer(g, writes, r)?;
        // (Reshapes sharing the storage read it too, and so do their readers.)
        let alone = reads[r].iter().all(|&n| n == reader || is_view(n))
            && reads[r].iter().filter(|&&n| n == reader).count() == 1
            && !g.outputs.iter().any(|&o| root[o] == r);
        let Node::Op(wop) = &g.nodes[w] else {
            return None;
        };
        match wop.kind {
            OpKind::RmsNormRope { .. } if alone => return Some(w),
            OpKind::Permute { .. } if alone => (t, reader) = (*wop.inputs.first()?, w),
            _ => return None,
        }
    }
    None
}

/// Whether `op` is a reshape that shares its input's storage (it writes nothing).
fn reshape_view(g: &Graph, op: &crate::ir::Op) -> bool {
    matches!(op.kind, OpKind::Reshape { .. }) && ops::alias(g, op).is_some()
}

/// Per root: whether it is a KV cache, a float State that a cache update writes in place.
fn kv_caches(g: &Graph, root: &[TensorId]) -> Vec<bool> {
    let mut kv = vec![false; g.tensors.len()];
    for op in g.ops() {
        if let (OpKind::CacheUpdate { .. }, Some(&c)) = (&op.kind, op.inputs.first()) {
            let r = root[c];
            kv[r] |= matches!(g.tensors[r].role, Role::State(_))
                && g.tensors[r].dtype.is_float()
                && root[op.outputs[0]] == r;
        }
    }
    kv
}

/// The KV caches that can be held as f16: every op that reads one can read f16
/// (`ops::reads_f16`); only in-place cache updates write it (others would race on the two halves
/// of a word), each moving whole words (an even count of elements after the cache axis); and
/// only f32 values are written into it.
fn f16_kv_caches(g: &Graph, root: &[TensorId], repr: &[Repr], kv: &[bool]) -> Vec<TensorId> {
    let mut ok = kv.to_vec();
    for op in g.ops() {
        for (k, &t) in op.inputs.iter().enumerate() {
            if !ops::reads_f16(g, op, k) {
                ok[root[t]] = false;
            }
        }
        let in_place = ops::alias(g, op).is_some();
        for &o in &op.outputs {
            let r = root[o];
            match op.kind {
                OpKind::Reshape { .. } if in_place => {}
                OpKind::CacheUpdate { axis, .. } if in_place => {
                    let inner: usize = g.tensors[r].max_shape.iter().skip(axis + 1).product();
                    let value = op.inputs.get(1).map(|&v| repr[root[v]]);
                    ok[r] &= inner % 2 == 0 && value == Some(Repr::F32);
                }
                _ => ok[r] = false,
            }
        }
    }
    (0..g.tensors.len()).filter(|&t| ok[t]).collect()
}

/// Whether an op's output should alias its input rather than be copied.
pub(crate) fn aliases(g: &Graph, kind: &OpKind, out: TensorId, input: TensorId) -> bool {
    let out_state = matches!(g.tensors[out].role, Role::State(_));
    match kind {
        OpKind::Reshape { .. } => !out_state,
        OpKind::CacheUpdate { .. } => !out_state || out == input,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Large tensors are compared in pieces on several threads: a flaw in any piece, the last
    /// one included, keeps the biases stored, as do zero, subnormal and overflowing scales.
    #[test]
    fn derived_biases_are_checked_in_every_piece() {
        let n = 10 << 20;
        let sc: Vec<f32> = (0..n).map(|i| 1e-3 + (i % 977) as f32 * 1e-6).collect();
        let good: Vec<f32> = sc.iter().map(|s| -8.0 * s).collect();
        assert!(all_neg8(&bytes_of(&sc), Some(&bytes_of(&good))));
        assert!(all_neg8(&bytes_of(&sc), None));
        for at in [0, n / 2, n - 1] {
            let mut bad = good.clone();
            bad[at] = f32::from_bits(bad[at].to_bits() ^ 1);
            assert!(
                !all_neg8(&bytes_of(&sc), Some(&bytes_of(&bad))),
                "flaw at {at}"
            );
            // Biases made from the scales: a scale whose product is not normal, in any piece.
            let mut zero = sc.clone();
            zero[at] = 0.0;
            assert!(!all_neg8(&bytes_of(&zero), None), "zero scale at {at}");
        }
        for s in [0.0f32, -0.0, 1e-40, 5e37, f32::INFINITY, f32::NAN] {
            let b = -8.0 * s;
            assert!(
                !all_neg8(&bytes_of(&[s]), Some(&bytes_of(&[b]))),
                "scale {s:e}"
            );
            assert!(!all_neg8(&bytes_of(&[s]), None), "scale {s:e}");
        }
        // The largest and smallest scales whose products are normal floats.
        for s in [
            f32::from_bits(251 << 23 | 0x7f_ffff),
            f32::MIN_POSITIVE,
            -0.5,
        ] {
            assert!(
                all_neg8(&bytes_of(&[s]), Some(&bytes_of(&[-8.0 * s]))),
                "scale {s:e}"
            );
            assert!(all_neg8(&bytes_of(&[s]), None), "scale {s:e}");
        }
    }
}
