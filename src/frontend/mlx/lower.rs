//! Lowers a parsed `MlxGraph` into the IR. MLX temp slots are registers reused with new shapes, so
//! every write makes a fresh IR tensor (SSA); their upper-bound shapes are derived here, since the
//! blob only describes non-temp slots. Scalar value slots become host symbols. The init chain is
//! lowered the same way and run once on the CPU executor at load; its results become constants.
//! KV-cache writes (`SliceUpdate` of a mutable buffer, later `IdCopy`'d back) update the buffer in
//! place. Nothing here knows which model the graph came from.

use super::{
    FloatOrVid, IntOrVid, IntOrVidOrTid, MlxGraph, Node, NodeKind, SlotType, TensorClass, Tid,
    VidOrTid,
};
use crate::ir::{
    ActQuant, AttnLayout, BinaryOp, DType, Graph, Int, Io, Node as IrNode, OpKind, Role, RopeStyle,
    SymArith, SymId, SymOp, TensorId, UnaryOp, Weight,
};
use crate::pte::{Blob, Bytes, NamedData, ScalarType};
use crate::runtime::tensor::to_f64;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// Entries in one rotary cos (or sin) table built at load: 2^20 positions of a 256-dim rotary.
const MAX_ROPE_TABLE: usize = 1 << 27;

/// Elements one tensor may have: far past any model, and small enough that byte counts of it
/// cannot overflow.
const MAX_ELEMENTS: usize = 1 << 48;

/// The element count of `shape`, when it is at most `MAX_ELEMENTS`.
fn bounded_numel(shape: &[usize]) -> Result<usize, String> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| format!("shape {shape:?} has more than {MAX_ELEMENTS} elements"))
}

/// Where constant slots' bytes come from (the program's named data, or a test's map).
pub type ConstantSource<'a> = dyn Fn(Tid) -> Result<Blob, String> + 'a;

fn owned(bytes: Vec<u8>) -> Blob {
    Blob::whole(Arc::new(Bytes::Owned(bytes)))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The IR dtype of an MLX tensor's ExecuTorch scalar type.
fn dtype(s: ScalarType) -> Result<DType, String> {
    DType::from_scalar(s).ok_or_else(|| format!("tensors of type {s:?} are not supported"))
}

fn unary(k: NodeKind) -> Option<UnaryOp> {
    use NodeKind as K;
    Some(match k {
        K::Neg => UnaryOp::Neg,
        K::Abs => UnaryOp::Abs,
        K::Exp => UnaryOp::Exp,
        K::Log => UnaryOp::Log,
        K::Sqrt => UnaryOp::Sqrt,
        K::Rsqrt => UnaryOp::Rsqrt,
        K::Tanh => UnaryOp::Tanh,
        K::Sin => UnaryOp::Sin,
        K::Cos => UnaryOp::Cos,
        K::Sigmoid => UnaryOp::Sigmoid,
        K::Silu => UnaryOp::Silu,
        K::Square => UnaryOp::Square,
        K::Reciprocal => UnaryOp::Reciprocal,
        K::Floor => UnaryOp::Floor,
        K::Ceil => UnaryOp::Ceil,
        K::LogicalNot => UnaryOp::LogicalNot,
        _ => return None,
    })
}

fn binary(k: NodeKind) -> Option<BinaryOp> {
    use NodeKind as K;
    Some(match k {
        K::Add => BinaryOp::Add,
        K::Subtract => BinaryOp::Sub,
        K::Multiply => BinaryOp::Mul,
        K::Divide => BinaryOp::Div,
        K::Power => BinaryOp::Pow,
        K::Maximum => BinaryOp::Max,
        K::Minimum => BinaryOp::Min,
        K::Equal => BinaryOp::Eq,
        K::NotEqual => BinaryOp::Ne,
        K::Less => BinaryOp::Lt,
        K::LessEqual => BinaryOp::Le,
        K::Greater => BinaryOp::Gt,
        K::GreaterEqual => BinaryOp::Ge,
        K::LogicalAnd => BinaryOp::And,
        K::LogicalOr => BinaryOp::Or,
        // On bools (the only operands accepted for them below) these are the logical ops.
        K::BitwiseAnd => BinaryOp::And,
        K::BitwiseOr => BinaryOp::Or,
        _ => return None,
    })
}

fn int_arith(k: NodeKind) -> Option<SymArith> {
    use NodeKind as K;
    Some(match k {
        K::AddInt => SymArith::Add,
        K::SubtractInt => SymArith::Sub,
        K::MultiplyInt => SymArith::Mul,
        K::FloorDivideInt => SymArith::FloorDiv,
        K::ModInt => SymArith::Mod,
        _ => return None,
    })
}

/// Why a node cannot be lowered at all, whatever its operands; `None` when it has a lowering.
fn unsupported(n: &Node) -> Option<&'static str> {
    let ok = match n {
        Node::Unary { op, .. } => unary(*op).is_some(),
        Node::Binary { op, .. } => binary(*op).is_some(),
        Node::IntArith { op, .. } => int_arith(*op).is_some(),
        Node::Reduce { op, .. } => matches!(op, NodeKind::Sum | NodeKind::Mean),
        Node::Noop
        | Node::IdCopy { .. }
        | Node::Contiguous { .. }
        | Node::Addmm { .. }
        | Node::ItemInt { .. }
        | Node::SymSize { .. }
        | Node::ExpandDims { .. }
        | Node::Take { .. }
        | Node::RmsNorm { .. }
        | Node::Rope { .. }
        | Node::Sdpa { .. }
        | Node::Gelu { .. }
        | Node::Softmax { .. }
        | Node::Where { .. }
        | Node::Clip { .. }
        | Node::Squeeze { .. }
        | Node::Reshape { .. }
        | Node::Transpose { .. }
        | Node::BroadcastTo { .. }
        | Node::Slice { .. }
        | Node::SliceUpdate { .. }
        | Node::Concatenate { .. }
        | Node::AsType { .. }
        | Node::Full { .. }
        | Node::FullLike { .. }
        | Node::ARange { .. }
        | Node::QuantizedMatmul { .. }
        | Node::Dequantize { .. } => true,
        _ => false,
    };
    (!ok).then(|| n.name())
}

/// Normalises a possibly negative axis for a rank-`rank` tensor.
fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let v = if a < 0 { a + r } else { a };
    if (0..r).contains(&v) {
        Ok(v as usize)
    } else {
        Err(format!("axis {a} is out of range for rank {rank}"))
    }
}

/// Upper-bound broadcast of two max shapes.
fn broadcast_max(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let pick = |s: &[usize]| (i + s.len()).checked_sub(n).map(|j| s[j]);
            match (pick(a), pick(b)) {
                (Some(x), Some(1)) | (Some(x), None) => x,
                (Some(1), Some(y)) | (None, Some(y)) => y,
                (Some(x), Some(y)) => x.max(y),
                (None, None) => 1,
            }
        })
        .collect()
}

/// Lowers the graph, running its init chain (if any) once on the CPU. An error lists every node
/// kind without a lowering at once.
pub fn lower(m: &MlxGraph, named: &NamedData) -> Result<Graph, String> {
    lower_with(m, &|tid| {
        m.constant_data(tid, named)
            .cloned()
            .map_err(|e| e.to_string())
    })
}

/// `lower` with constants from `consts`.
pub fn lower_with(m: &MlxGraph, consts: &ConstantSource) -> Result<Graph, String> {
    let bad: BTreeSet<&str> = m.chains.iter().flatten().filter_map(unsupported).collect();
    if !bad.is_empty() {
        return Err(format!(
            "MLX nodes not supported yet: {}",
            bad.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let mut init = HashMap::new();
    if let Some(chain) = m.init_chain() {
        init = run_init_chain(m, consts, chain)?;
    }
    let mut l = Lower::new(m, consts, init, false);
    l.inputs()?;
    l.mutable_buffers()?;
    for (i, n) in m.main_chain().iter().enumerate() {
        l.node(n)
            .map_err(|e| format!("main chain, instruction {i} ({}): {e}", n.name()))?;
    }
    l.outputs()?;
    Ok(l.g)
}

/// A constant computed by the init chain: dtype, shape, bytes.
type InitConstant = (DType, Vec<usize>, Blob);

/// Lowers the init chain alone (constants in, the constant slots it writes out), runs it on the
/// CPU executor and returns the values it wrote.
fn run_init_chain(
    m: &MlxGraph,
    consts: &ConstantSource,
    chain: &[Node],
) -> Result<HashMap<u32, InitConstant>, String> {
    let mut l = Lower::new(m, consts, HashMap::new(), true);
    for (i, n) in chain.iter().enumerate() {
        l.node(n)
            .map_err(|e| format!("init chain, instruction {i} ({}): {e}", n.name()))?;
    }
    let written: Vec<(u32, TensorId)> = l
        .init_written
        .iter()
        .map(|&slot| (slot, l.cur[&slot]))
        .collect();
    let mut g = l.g;
    g.outputs = written.iter().map(|&(_, t)| t).collect();
    let mut exec = crate::ir::cpu::CpuExecutor::new(g).map_err(|e| format!("init chain: {e}"))?;
    let outs = exec.run(&[]).map_err(|e| format!("init chain: {e}"))?;
    Ok(written
        .iter()
        .zip(outs)
        .map(|(&(slot, _), h)| (slot, (h.dtype, h.sizes, owned(h.data))))
        .collect())
}

struct Lower<'a> {
    m: &'a MlxGraph,
    consts: &'a ConstantSource<'a>,
    g: Graph,
    /// Lowering the init chain: constant slots may be written.
    init_mode: bool,
    /// Constant slots the init chain computed (main chain) or wrote (init chain), in order.
    init: HashMap<u32, InitConstant>,
    init_written: Vec<u32>,
    /// The IR tensor a tensor slot holds now.
    cur: HashMap<u32, TensorId>,
    /// The IR symbol a value slot holds now.
    vals: HashMap<u32, SymId>,
    /// Upper bound of each symbol, where one is known.
    bound: Vec<Option<i64>>,
    /// IR tensors that are element `.1` of input tensor `.0` (so the host can read them).
    host: HashMap<TensorId, (TensorId, usize)>,
    /// Permute outputs that are a transposed 2-D float constant, with that constant.
    transposed: HashMap<TensorId, TensorId>,
    /// Slots whose mutable buffer was updated in place through another slot: MLX would still
    /// read the old value there, which in-place storage no longer has.
    stale: HashSet<u32>,
    /// Size symbols already made, per (tensor, dim).
    sizes: HashMap<(TensorId, usize), SymId>,
    /// Placeholders for rows gathered from a packed (uint32) constant: (constant slot, indices).
    /// Only `Dequantize` reads them, and turns the pair into a quantized embedding.
    packed_rows: HashMap<TensorId, (Tid, TensorId)>,
    /// Rows gathered from a constant by an index tensor: (constant, indices).
    gathered: HashMap<TensorId, (TensorId, TensorId)>,
}

impl<'a> Lower<'a> {
    fn new(
        m: &'a MlxGraph,
        consts: &'a ConstantSource<'a>,
        init: HashMap<u32, InitConstant>,
        init_mode: bool,
    ) -> Self {
        Lower {
            m,
            consts,
            g: Graph::default(),
            init_mode,
            init,
            init_written: Vec::new(),
            cur: HashMap::new(),
            vals: HashMap::new(),
            bound: Vec::new(),
            host: HashMap::new(),
            transposed: HashMap::new(),
            stale: HashSet::new(),
            sizes: HashMap::new(),
            packed_rows: HashMap::new(),
            gathered: HashMap::new(),
        }
    }

    fn class(&self, tid: Tid) -> Result<TensorClass, String> {
        self.m
            .tensor_class(tid)
            .ok_or_else(|| format!("Tid {} is out of range", tid.0))
    }

    fn slot_name(&self, tid: Tid) -> String {
        self.m
            .named_slots
            .iter()
            .find(|s| s.slot.slot_type == SlotType::Tensor && s.slot.idx == tid.0)
            .map_or_else(|| format!("t{}", tid.0), |s| s.name.clone())
    }

    /// Static shape and dtype of a non-temp slot from its metadata.
    fn meta(&self, tid: Tid) -> Result<(DType, Vec<usize>), String> {
        let meta = self
            .m
            .meta(tid)
            .ok_or_else(|| format!("Tid {} has no tensor metadata", tid.0))?;
        let mut shape = Vec::with_capacity(meta.shape.len());
        for d in &meta.shape {
            shape.push(match d {
                super::ShapeDim::Static(n) => *n,
                super::ShapeDim::Dynamic { max: Some(m), .. } => *m,
                super::ShapeDim::Dynamic { max: None, .. } => {
                    return Err(format!(
                        "`{}` has a dynamic dimension without an upper bound",
                        self.slot_name(tid)
                    ))
                }
            });
        }
        bounded_numel(&shape).map_err(|e| format!("`{}`: {e}", self.slot_name(tid)))?;
        Ok((dtype(meta.dtype)?, shape))
    }

    fn ms(&self, t: TensorId) -> Vec<usize> {
        self.g.tensors[t].max_shape.clone()
    }

    fn rank(&self, t: TensorId) -> usize {
        self.g.tensors[t].max_shape.len()
    }

    fn dt(&self, t: TensorId) -> DType {
        self.g.tensors[t].dtype
    }

    fn sym(&mut self, name: String, bound: Option<i64>) -> SymId {
        self.bound.push(bound);
        self.g.add_sym(name)
    }

    /// The current size of `t`'s dim `d` as a symbol.
    fn size_sym(&mut self, t: TensorId, d: usize) -> Int {
        if let Some(&s) = self.sizes.get(&(t, d)) {
            return Int::Sym(s);
        }
        let s = self.sym(format!("size({t},{d})"), Some(self.ms(t)[d] as i64));
        self.g.nodes.push(IrNode::Sym(SymOp::Size {
            out: s,
            tensor: t,
            dim: d,
        }));
        self.sizes.insert((t, d), s);
        Int::Sym(s)
    }

    fn ints(&self, vs: &[IntOrVid]) -> Result<Vec<Int>, String> {
        vs.iter().map(|&v| self.int(v)).collect()
    }

    fn int(&self, v: IntOrVid) -> Result<Int, String> {
        match v {
            IntOrVid::Int(i) => Ok(Int::Lit(i)),
            IntOrVid::Vid(vid) => self
                .vals
                .get(&vid.0)
                .map(|&s| Int::Sym(s))
                .ok_or_else(|| format!("value slot {} is read before it is written", vid.0)),
        }
    }

    fn upper(&self, v: Int) -> Option<i64> {
        match v {
            Int::Lit(i) => Some(i),
            Int::Sym(s) => self.bound[s],
        }
    }

    fn lit(&self, v: IntOrVid, what: &str) -> Result<i64, String> {
        match v {
            IntOrVid::Int(i) => Ok(i),
            IntOrVid::Vid(_) => Err(format!("{what} must be a literal, not a value slot")),
        }
    }

    /// The IR tensor slot `tid` holds now, creating constants on first use.
    fn read(&mut self, tid: Tid) -> Result<TensorId, String> {
        if self.stale.contains(&tid.0) {
            return Err(format!(
                "`{}` is read after a SliceUpdate wrote its mutable buffer in place through another \
                 slot; only the updated value can be read",
                self.slot_name(tid)
            ));
        }
        if let Some(&t) = self.cur.get(&tid.0) {
            if self.packed_rows.contains_key(&t) {
                return Err(format!(
                    "rows of packed weight `{}` are read by a node other than DequantizeNode",
                    self.slot_name(tid)
                ));
            }
            return Ok(t);
        }
        match self.class(tid)? {
            TensorClass::Constant => {
                let name = self.slot_name(tid);
                let (dt, shape, blob) = match self.init.get(&tid.0) {
                    Some(c) => c.clone(),
                    None => {
                        let meta = self.m.meta(tid).map(|m| m.dtype);
                        if meta == Some(ScalarType::UInt32) {
                            return Err(format!(
                                "uint32 constant `{name}` is read as a tensor; only \
                                 QuantizedMatmul reads packed weights"
                            ));
                        }
                        let (dt, shape) = self.meta(tid)?;
                        let blob = (self.consts)(tid)?;
                        let need = bounded_numel(&shape)? * dt.size();
                        if blob.len() < need {
                            return Err(format!(
                                "constant `{name}` has {} bytes of data for {dt:?} {shape:?} \
                                 ({need} bytes)",
                                blob.len()
                            ));
                        }
                        (dt, shape, blob)
                    }
                };
                let t = self.g.add_tensor(name, dt, shape, Role::Constant(blob));
                self.cur.insert(tid.0, t);
                Ok(t)
            }
            _ => Err(format!(
                "`{}` is read before it is written",
                self.slot_name(tid)
            )),
        }
    }

    /// A fresh IR tensor for a write to slot `tid`. Writes to a mutable buffer go to its state.
    fn write(&mut self, tid: Tid, dt: DType, shape: Vec<usize>) -> Result<TensorId, String> {
        bounded_numel(&shape)?;
        self.stale.remove(&tid.0);
        match self.class(tid)? {
            TensorClass::Input => {
                return Err(format!("writes to input `{}`", self.slot_name(tid)));
            }
            TensorClass::Constant if !self.init_mode => {
                return Err(format!(
                    "writes to constant `{}` outside the init chain",
                    self.slot_name(tid)
                ));
            }
            TensorClass::Constant => self.init_written.push(tid.0),
            TensorClass::MutableBuffer => {
                let state = self.read(tid)?;
                let n: usize = shape.iter().product();
                if n > self.g.tensors[state].max_numel() || self.dt(state) != dt {
                    return Err(format!(
                        "writes {dt:?} {shape:?} into mutable buffer `{}` ({:?} {:?})",
                        self.slot_name(tid),
                        self.dt(state),
                        self.ms(state)
                    ));
                }
                return Ok(state);
            }
            _ => {}
        }
        let t = self
            .g
            .add_tensor(format!("t{}", tid.0), dt, shape, Role::Activation);
        self.cur.insert(tid.0, t);
        Ok(t)
    }

    /// A graph-internal activation.
    fn scratch(&mut self, name: &str, dt: DType, shape: Vec<usize>) -> TensorId {
        self.g.add_tensor(name, dt, shape, Role::Activation)
    }

    fn op(&mut self, kind: OpKind, inputs: Vec<TensorId>, out: TensorId) {
        self.g.op(kind, inputs, vec![out]);
    }

    /// One-element constant's value.
    fn scalar_const(&self, t: TensorId) -> Option<f64> {
        self.g.scalar_constant(t)
    }

    fn inputs(&mut self) -> Result<(), String> {
        for (k, s) in self.m.input_map.clone().iter().enumerate() {
            match s.slot_type {
                SlotType::Tensor => {
                    let tid = Tid(s.idx);
                    let (dt, shape) = self.meta(tid)?;
                    let t = self
                        .g
                        .add_tensor(self.slot_name(tid), dt, shape, Role::Input(k));
                    self.cur.insert(s.idx, t);
                    self.g.inputs.push(Io::Tensor(t));
                }
                SlotType::Int => {
                    let sym = self.sym(format!("input{k}"), None);
                    self.vals.insert(s.idx, sym);
                    self.g.inputs.push(Io::Sym(sym));
                }
                other => return Err(format!("input {k} is a {other:?} value slot")),
            }
        }
        Ok(())
    }

    fn mutable_buffers(&mut self) -> Result<(), String> {
        for s in self.m.mutable_buffer_map.clone() {
            let tid = Tid(s.idx);
            let (dt, shape) = self.meta(tid)?;
            let t = self
                .g
                .add_tensor(self.slot_name(tid), dt, shape, Role::State(None));
            self.cur.insert(s.idx, t);
        }
        Ok(())
    }

    fn outputs(&mut self) -> Result<(), String> {
        for (j, s) in self.m.output_map.clone().iter().enumerate() {
            if s.slot_type != SlotType::Tensor {
                return Err(format!("output {j} is a {:?} value slot", s.slot_type));
            }
            let mut t = self.read(Tid(s.idx))?;
            // An output must be a tensor the call writes: copy inputs, constants and states.
            if !matches!(self.g.tensors[t].role, Role::Activation) || self.g.outputs.contains(&t) {
                let (dt, shape) = (self.dt(t), self.ms(t));
                let y = self.scratch(&format!("output{j}"), dt, shape);
                self.op(OpKind::Copy, vec![t], y);
                t = y;
            }
            self.g.outputs.push(t);
        }
        Ok(())
    }

    fn node(&mut self, n: &Node) -> Result<(), String> {
        match n {
            Node::Noop => {}
            Node::SymSize { a, dim, out } => {
                let t = self.read(*a)?;
                let d = axis(i64::from(*dim), self.rank(t))?;
                let bound = self.ms(t)[d] as i64;
                let s = self.sym(format!("v{}", out.0), Some(bound));
                self.g.nodes.push(IrNode::Sym(SymOp::Size {
                    out: s,
                    tensor: t,
                    dim: d,
                }));
                self.vals.insert(out.0, s);
            }
            Node::IntArith { op, a, b, out } => {
                let (a, b) = (self.int(*a)?, self.int(*b)?);
                let arith = int_arith(*op).ok_or("integer op without a lowering")?;
                let (ua, ub) = (self.upper(a), self.upper(b));
                let bound = match arith {
                    SymArith::Add => ua.zip(ub).map(|(x, y)| x.saturating_add(y)),
                    SymArith::Mul => ua.zip(ub).map(|(x, y)| x.saturating_mul(y)),
                    SymArith::FloorDiv => match b {
                        Int::Lit(y) if y > 0 => ua.map(|x| x / y),
                        _ => None,
                    },
                    SymArith::Mod => match b {
                        Int::Lit(y) if y > 0 => Some(y - 1),
                        _ => None,
                    },
                    _ => None,
                };
                let s = self.sym(format!("v{}", out.0), bound);
                self.g.nodes.push(IrNode::Sym(SymOp::Arith {
                    out: s,
                    op: arith,
                    a,
                    b,
                }));
                self.vals.insert(out.0, s);
            }
            Node::ItemInt { x, out } => {
                let t = self.read(*x)?;
                let (input, index) =
                    match self.host.get(&t) {
                        Some(&h) => h,
                        None if matches!(self.g.tensors[t].role, Role::Input(_))
                            && self.g.tensors[t].max_numel() == 1 =>
                        {
                            (t, 0)
                        }
                        None => return Err(
                            "reads a scalar the device computed; only elements of inputs can be \
                             read on the host"
                                .into(),
                        ),
                    };
                let s = self.sym(format!("v{}", out.0), None);
                self.g.nodes.push(IrNode::Sym(SymOp::ReadInput {
                    out: s,
                    tensor: input,
                    index,
                }));
                self.vals.insert(out.0, s);
            }
            Node::IdCopy { x, out } => {
                let src = self.read(*x)?;
                if self.class(*out)? == TensorClass::MutableBuffer {
                    let state = self.write(*out, self.dt(src), self.ms(src))?;
                    if state != src {
                        self.op(OpKind::Copy, vec![src], state);
                    }
                } else {
                    // Values are immutable here, so a copy is the same tensor.
                    self.stale.remove(&out.0);
                    self.cur.insert(out.0, src);
                }
            }
            Node::Contiguous { x, out } => {
                let src = self.read(*x)?;
                let y = self.write(*out, self.dt(src), self.ms(src))?;
                self.op(OpKind::Copy, vec![src], y);
            }
            Node::Unary { op, x, out } => {
                let u = unary(*op).ok_or("unary op without a lowering")?;
                let src = self.read(*x)?;
                let y = self.write(*out, self.dt(src), self.ms(src))?;
                self.op(OpKind::Unary(u), vec![src], y);
            }
            Node::Gelu {
                x,
                out,
                approximate,
            } => {
                let u = match approximate.as_str() {
                    "tanh" => UnaryOp::GeluTanh,
                    "none" | "" => UnaryOp::Gelu,
                    a => return Err(format!("gelu approximation `{a}`")),
                };
                let src = self.read(*x)?;
                let y = self.write(*out, self.dt(src), self.ms(src))?;
                self.op(OpKind::Unary(u), vec![src], y);
            }
            Node::Binary { op, a, b, out } => {
                let bop = binary(*op).ok_or("binary op without a lowering")?;
                let (a, b) = (self.read(*a)?, self.read(*b)?);
                let bitwise = matches!(op, NodeKind::BitwiseAnd | NodeKind::BitwiseOr);
                if bitwise && (self.dt(a) != DType::Bool || self.dt(b) != DType::Bool) {
                    return Err("bitwise and/or of non-bool tensors".into());
                }
                self.binary(bop, a, b, *out)?;
            }
            Node::Where {
                condition,
                x,
                y,
                out,
            } => {
                let (c, a, b) = (self.read(*condition)?, self.read(*x)?, self.read(*y)?);
                let shape = broadcast_max(&broadcast_max(&self.ms(c), &self.ms(a)), &self.ms(b));
                let o = self.write(*out, self.dt(a), shape)?;
                self.g.op(OpKind::Where, vec![c, a, b], vec![o]);
            }
            Node::Clip {
                x,
                out,
                a_min,
                a_max,
            } => {
                let src = self.read(*x)?;
                let bound = |l: &mut Self, t: Option<Tid>| -> Result<Option<f64>, String> {
                    match t {
                        None => Ok(None),
                        Some(t) => {
                            let id = l.read(t)?;
                            l.scalar_const(id).map(Some).ok_or_else(|| {
                                "clip bounds must be one-element constants".to_string()
                            })
                        }
                    }
                };
                let (min, max) = (bound(self, *a_min)?, bound(self, *a_max)?);
                let y = self.write(*out, self.dt(src), self.ms(src))?;
                self.op(OpKind::Clamp { min, max }, vec![src], y);
            }
            Node::RmsNorm {
                x,
                weight,
                out,
                eps,
            } => {
                let src = self.read(*x)?;
                let mut ins = vec![src];
                if let Some(w) = weight {
                    ins.push(self.read(*w)?);
                }
                let y = self.write(*out, self.dt(src), self.ms(src))?;
                self.op(OpKind::RmsNorm { eps: *eps }, ins, y);
            }
            Node::Softmax {
                x, out, axis: a, ..
            } => {
                let src = self.read(*x)?;
                if axis(i64::from(*a), self.rank(src))? + 1 != self.rank(src) {
                    return Err("softmax over an axis other than the last".into());
                }
                let y = self.write(*out, self.dt(src), self.ms(src))?;
                self.op(OpKind::Softmax, vec![src], y);
            }
            Node::Reduce {
                op,
                x,
                out,
                axes,
                keepdims,
            } => {
                let src = self.read(*x)?;
                let r = self.rank(src);
                let mut dims: Vec<usize> = if axes.is_empty() {
                    (0..r).collect()
                } else {
                    axes.iter()
                        .map(|&a| axis(i64::from(a), r))
                        .collect::<Result<_, _>>()?
                };
                dims.sort_unstable();
                dims.dedup();
                let xs = self.ms(src);
                let shape: Vec<usize> = (0..r)
                    .filter_map(|i| {
                        if dims.contains(&i) {
                            keepdims.then_some(1)
                        } else {
                            Some(xs[i])
                        }
                    })
                    .collect();
                let y = self.write(*out, self.dt(src), shape)?;
                let keepdim = *keepdims;
                let kind = if *op == NodeKind::Mean {
                    OpKind::Mean { dims, keepdim }
                } else {
                    OpKind::Sum { dims, keepdim }
                };
                self.op(kind, vec![src], y);
            }
            Node::AsType { x, out, dtype: d } => {
                let src = self.read(*x)?;
                let y = self.write(*out, dtype(*d)?, self.ms(src))?;
                self.op(OpKind::Cast, vec![src], y);
            }
            Node::Transpose { x, out, perm } => {
                let src = self.read(*x)?;
                let r = self.rank(src);
                let perm: Vec<usize> = perm
                    .iter()
                    .map(|&p| axis(i64::from(p), r))
                    .collect::<Result<_, _>>()?;
                let xs = self.ms(src);
                if perm.len() != r || perm.iter().collect::<BTreeSet<_>>().len() != r {
                    return Err(format!("{perm:?} is not a permutation of {r} axes"));
                }
                let shape = perm.iter().map(|&p| xs[p]).collect();
                let y = self.write(*out, self.dt(src), shape)?;
                if perm == [1, 0]
                    && self.dt(src).is_float()
                    && matches!(self.g.tensors[src].role, Role::Constant(_))
                {
                    self.transposed.insert(y, src);
                }
                self.op(OpKind::Permute { perm }, vec![src], y);
            }
            Node::Reshape { x, out, shape } => {
                let src = self.read(*x)?;
                let req = self.ints(shape)?;
                self.reshape(src, req, *out)?;
            }
            Node::ExpandDims { x, out, axis: a } => {
                let src = self.read(*x)?;
                let r = self.rank(src);
                let at = axis(i64::from(*a), r + 1)?;
                let mut req: Vec<Int> = (0..r).map(|d| self.size_sym(src, d)).collect();
                req.insert(at, Int::Lit(1));
                self.reshape(src, req, *out)?;
            }
            Node::Squeeze { x, out, dims } => {
                let src = self.read(*x)?;
                let r = self.rank(src);
                let xs = self.ms(src);
                let drop: BTreeSet<usize> = if dims.is_empty() {
                    (0..r).filter(|&d| xs[d] == 1).collect()
                } else {
                    dims.iter()
                        .map(|&d| axis(i64::from(d), r))
                        .collect::<Result<_, _>>()?
                };
                let req: Vec<Int> = (0..r)
                    .filter(|d| !drop.contains(d))
                    .map(|d| self.size_sym(src, d))
                    .collect();
                self.reshape(src, req, *out)?;
            }
            Node::BroadcastTo { x, out, shape } => {
                let src = self.read(*x)?;
                self.broadcast_to(src, shape, *out)?;
            }
            Node::Slice {
                x,
                out,
                axis: a,
                start,
                stop,
                step,
            } => {
                let src = self.read(*x)?;
                let d = axis(self.lit(*a, "slice axis")?, self.rank(src))?;
                let (start, end) = (self.int(*start)?, self.int(*stop)?);
                if *step < 1 {
                    return Err(format!("slice step {step}"));
                }
                let step = *step as usize;
                let mut shape = self.ms(src);
                let n = shape[d];
                let len = match (start, end) {
                    (Int::Lit(s), Int::Lit(e)) => slice_len(s, e, step, n),
                    (s, e) => {
                        let lo = match s {
                            Int::Lit(v) if v >= 0 => v.min(n as i64) as usize,
                            _ => 0,
                        };
                        let hi = match self.upper(e) {
                            Some(v) if v >= 0 => (v as usize).min(n),
                            _ => n,
                        };
                        hi.saturating_sub(lo).div_ceil(step)
                    }
                };
                shape[d] = len;
                let y = self.write(*out, self.dt(src), shape)?;
                self.op(
                    OpKind::Slice {
                        dim: d,
                        start,
                        end,
                        step,
                    },
                    vec![src],
                    y,
                );
            }
            Node::SliceUpdate {
                dst,
                update,
                out,
                axis: a,
                start,
                stop: _,
                step,
            } => {
                let cache = self.read(*dst)?;
                if !matches!(self.g.tensors[cache].role, Role::State(_)) {
                    return Err(
                        "SliceUpdate into a tensor that is not a mutable buffer (KV cache)".into(),
                    );
                }
                if *step != 1 {
                    return Err(format!("SliceUpdate step {step}"));
                }
                let value = self.read(*update)?;
                let d = axis(self.lit(*a, "SliceUpdate axis")?, self.rank(cache))?;
                if self.rank(value) != self.rank(cache) || self.dt(value) != self.dt(cache) {
                    return Err(format!(
                        "update {:?} {:?} does not match cache {:?} {:?}",
                        self.dt(value),
                        self.ms(value),
                        self.dt(cache),
                        self.ms(cache)
                    ));
                }
                let start = self.int(*start)?;
                self.g.op(
                    OpKind::CacheUpdate { axis: d, start },
                    vec![cache, value],
                    vec![cache],
                );
                // The result is the buffer itself, updated in place.
                if out != dst {
                    self.stale.insert(dst.0);
                }
                self.stale.remove(&out.0);
                if self.class(*out)? == TensorClass::MutableBuffer {
                    let state = self.write(*out, self.dt(cache), self.ms(cache))?;
                    if state != cache {
                        self.op(OpKind::Copy, vec![cache], state);
                    }
                } else {
                    self.cur.insert(out.0, cache);
                }
            }
            Node::Concatenate {
                tensors,
                out,
                axis: a,
            } => {
                let ins: Vec<TensorId> = tensors
                    .iter()
                    .map(|&t| self.read(t))
                    .collect::<Result<_, _>>()?;
                let first = *ins.first().ok_or("concatenation of nothing")?;
                let d = axis(i64::from(*a), self.rank(first))?;
                let mut shape = self.ms(first);
                shape[d] = ins
                    .iter()
                    .map(|&t| self.ms(t).get(d).copied().unwrap_or(0))
                    .sum();
                let y = self.write(*out, self.dt(first), shape)?;
                self.op(OpKind::Concat { dim: d }, ins, y);
            }
            Node::Take {
                x,
                out,
                index,
                axis: a,
            } => {
                let packed = self.class(*x)? == TensorClass::Constant
                    && self.m.meta(*x).map(|m| m.dtype) == Some(ScalarType::UInt32);
                match index {
                    IntOrVidOrTid::Tid(i) if packed && *a == 0 => {
                        // A quantized embedding's row gather; its DequantizeNode follows.
                        let idx = self.read(*i)?;
                        let t = self.write(*out, DType::U8, vec![0])?;
                        self.packed_rows.insert(t, (*x, idx));
                    }
                    _ => {
                        let src = self.read(*x)?;
                        self.take(src, *index, *a, *out)?;
                    }
                }
            }
            Node::Dequantize {
                w,
                scales,
                out,
                biases,
                group_size,
                bits,
                mode,
                global_scale,
                dtype: d,
            } => {
                if mode != "affine" || global_scale.is_some() {
                    return Err(format!(
                        "quantization mode `{mode}` (only affine, without a global scale, is supported)"
                    ));
                }
                let rows = self.cur.get(&w.0).and_then(|t| self.packed_rows.get(t));
                let Some(&(packed, idx)) = rows else {
                    return Err("only rows gathered from a packed constant (a quantized \
                                embedding) can be dequantized"
                        .into());
                };
                let table = |l: &mut Self, t: Tid, what: &str| -> Result<TensorId, String> {
                    let g = l.read(t)?;
                    match l.gathered.get(&g) {
                        Some(&(c, i)) if i == idx => Ok(c),
                        _ => Err(format!(
                            "{what} must be rows of a constant gathered with the weight's indices"
                        )),
                    }
                };
                let st = table(self, *scales, "scales")?;
                let bt = biases.map(|b| table(self, b, "biases")).transpose()?;
                let (weight, tensors) =
                    self.quantized_weight(packed, st, bt, *group_size, *bits)?;
                let k = match weight {
                    Weight::Q4 { .. } => self.g.tensors[tensors[0]].max_shape[1] * 2,
                    _ => self.g.tensors[tensors[0]].max_shape[1],
                };
                let mut shape = self.ms(idx);
                shape.push(k);
                let dt = match d {
                    Some(d) => dtype(*d)?,
                    None => DType::F32,
                };
                if !dt.is_float() {
                    return Err(format!("dequantize to {dt:?}"));
                }
                let y = self.write(*out, dt, shape)?;
                let mut ins = tensors;
                ins.push(idx);
                self.op(OpKind::Embedding { weight }, ins, y);
            }
            Node::FullLike {
                x,
                out,
                value,
                dtype: d,
            } => {
                let src = self.read(*x)?;
                let FloatOrVid::Float(value) = *value else {
                    return Err("fill value from a value slot".into());
                };
                let dt = match d {
                    Some(d) => dtype(*d)?,
                    None => self.dt(src),
                };
                let shape: Vec<Int> = (0..self.rank(src)).map(|i| self.size_sym(src, i)).collect();
                let y = self.write(*out, dt, self.ms(src))?;
                self.g.op(OpKind::Full { value, shape }, vec![], vec![y]);
            }
            Node::Full {
                out,
                shape,
                value,
                dtype: d,
            } => {
                let req = self.ints(shape)?;
                let max = req
                    .iter()
                    .map(|&v| match self.upper(v) {
                        Some(n) if n >= 0 => Ok(n as usize),
                        _ => Err("a full() dimension has no known upper bound".to_string()),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let dt = dtype(*d)?;
                match *value {
                    FloatOrVid::Float(value) => {
                        let y = self.write(*out, dt, max)?;
                        self.g
                            .op(OpKind::Full { value, shape: req }, vec![], vec![y]);
                    }
                    FloatOrVid::Vid(v) => self.full_of_symbol(v, req, max, dt, *out)?,
                }
            }
            Node::ARange {
                out,
                start,
                stop,
                step,
                dtype: d,
            } => {
                let step = self.lit(*step, "arange step")?;
                if step == 0 {
                    return Err("arange step is zero".into());
                }
                let (start, end) = (self.int(*start)?, self.int(*stop)?);
                let n = match (start, end, self.upper(end)) {
                    (Int::Lit(a), Int::Lit(b), _) => ((b as f64 - a as f64) / step as f64).ceil(),
                    (_, _, Some(hi)) if step > 0 => {
                        let lo = match start {
                            Int::Lit(v) => v,
                            Int::Sym(_) => 0,
                        };
                        ((hi as f64 - lo as f64) / step as f64).ceil()
                    }
                    _ => return Err("arange length has no known upper bound".into()),
                };
                let dt = match d {
                    Some(d) => dtype(*d)?,
                    None => DType::I64,
                };
                let y = self.write(*out, dt, vec![n.max(0.0) as usize])?;
                self.g
                    .op(OpKind::Arange { start, end, step }, vec![], vec![y]);
            }
            Node::Addmm {
                mat1,
                mat2,
                out,
                bias,
                alpha,
                beta,
            } => {
                let (a, b) = (self.read(*mat1)?, self.read(*mat2)?);
                let bias = bias.map(|t| self.read(t)).transpose()?;
                self.addmm(a, b, bias, *alpha, *beta, *out)?;
            }
            Node::QuantizedMatmul {
                x,
                w,
                scales,
                out,
                biases,
                group_size,
                bits,
                mode,
                transpose,
            } => {
                if mode != "affine" {
                    return Err(format!(
                        "quantization mode `{mode}` (only affine is supported)"
                    ));
                }
                if !transpose {
                    return Err("QuantizedMatmul with transpose=false".into());
                }
                let x = self.read(*x)?;
                let st = self.read(*scales)?;
                let bt = biases.map(|b| self.read(b)).transpose()?;
                let (weight, tensors) = self.quantized_weight(*w, st, bt, *group_size, *bits)?;
                let n = self.g.tensors[tensors[1]].max_shape[0];
                let mut shape = self.ms(x);
                *shape.last_mut().ok_or("QuantizedMatmul of a scalar")? = n;
                let y = self.write(*out, self.dt(x), shape)?;
                let mut ins = vec![x];
                ins.extend(tensors);
                self.op(
                    OpKind::Linear {
                        weight,
                        act_quant: ActQuant::None,
                        has_bias: false,
                    },
                    ins,
                    y,
                );
            }
            Node::Rope {
                x,
                out,
                dims,
                offset,
                freqs,
                traditional,
                base,
                scale,
            } => {
                let src = self.read(*x)?;
                self.rope(
                    src,
                    *dims,
                    *offset,
                    *freqs,
                    *traditional,
                    *base,
                    *scale,
                    *out,
                )?;
            }
            Node::Sdpa {
                q,
                k,
                v,
                out,
                scale,
                mask,
                causal,
            } => {
                let (q, k, v) = (self.read(*q)?, self.read(*k)?, self.read(*v)?);
                let mask = mask.map(|t| self.read(t)).transpose()?;
                self.sdpa(q, k, v, mask, *scale, *causal, *out)?;
            }
            other => return Err(format!("{} has no lowering", other.name())),
        }
        Ok(())
    }

    /// A tensor filled with a host integer: `arange(v, v + 1)` broadcast to the shape.
    fn full_of_symbol(
        &mut self,
        v: super::Vid,
        req: Vec<Int>,
        max: Vec<usize>,
        dt: DType,
        out: Tid,
    ) -> Result<(), String> {
        let start = self.int(IntOrVid::Vid(v))?;
        let end = self.sym(format!("v{}+1", v.0), self.upper(start).map(|u| u + 1));
        self.g.nodes.push(IrNode::Sym(SymOp::Arith {
            out: end,
            op: SymArith::Add,
            a: start,
            b: Int::Lit(1),
        }));
        let one = self.scratch("full_value", dt, vec![1]);
        self.g.op(
            OpKind::Arange {
                start,
                end: Int::Sym(end),
                step: 1,
            },
            vec![],
            vec![one],
        );
        let ones: Vec<Int> = req.iter().map(|_| Int::Lit(1)).collect();
        if req.iter().all(|r| *r == Int::Lit(1)) {
            let y = self.write(out, dt, max)?;
            self.op(OpKind::Reshape { shape: ones }, vec![one], y);
            return Ok(());
        }
        let unit = self.scratch("full_value", dt, vec![1; req.len()]);
        self.op(OpKind::Reshape { shape: ones }, vec![one], unit);
        let zeros = self.scratch("full_zeros", dt, max.clone());
        self.g.op(
            OpKind::Full {
                value: 0.0,
                shape: req,
            },
            vec![],
            vec![zeros],
        );
        let y = self.write(out, dt, max)?;
        self.op(OpKind::Binary(BinaryOp::Add), vec![unit, zeros], y);
        Ok(())
    }

    fn binary(&mut self, op: BinaryOp, a: TensorId, b: TensorId, out: Tid) -> Result<(), String> {
        let dt = if op.is_comparison() {
            DType::Bool
        } else if !self.dt(a).is_float() && self.dt(b).is_float() {
            self.dt(b)
        } else {
            self.dt(a)
        };
        // A one-element constant operand becomes an immediate (no broadcast, no buffer).
        let (ra, rb) = (self.rank(a), self.rank(b));
        if let Some(s) = self.scalar_const(b).filter(|_| rb <= ra) {
            let y = self.write(out, dt, self.ms(a))?;
            self.op(
                OpKind::BinaryScalar {
                    op,
                    scalar: s,
                    scalar_first: false,
                },
                vec![a],
                y,
            );
            return Ok(());
        }
        if let Some(s) = self.scalar_const(a).filter(|_| ra <= rb) {
            let y = self.write(out, dt, self.ms(b))?;
            self.op(
                OpKind::BinaryScalar {
                    op,
                    scalar: s,
                    scalar_first: true,
                },
                vec![b],
                y,
            );
            return Ok(());
        }
        let shape = broadcast_max(&self.ms(a), &self.ms(b));
        let y = self.write(out, dt, shape)?;
        self.op(OpKind::Binary(op), vec![a, b], y);
        Ok(())
    }

    /// Reshape to `req` (literals, symbols, at most one -1), bounding the output's max shape.
    fn reshape(&mut self, src: TensorId, req: Vec<Int>, out: Tid) -> Result<(), String> {
        let n_in = self.g.tensors[src].max_numel();
        let mut dims: Vec<Option<usize>> = req
            .iter()
            .map(|&v| match v {
                Int::Lit(-1) => None,
                Int::Lit(v) if v >= 0 => Some(v as usize),
                Int::Lit(_) => None,
                s => self.upper(s).filter(|&u| u >= 0).map(|u| u as usize),
            })
            .collect();
        if req.iter().any(|v| matches!(v, Int::Lit(v) if *v < -1)) {
            return Err(format!("reshape to {req:?}"));
        }
        let holes = dims.iter().filter(|d| d.is_none()).count();
        if holes > 1 {
            return Err(format!(
                "reshape to {req:?} has more than one dimension without a known bound"
            ));
        }
        let known = bounded_numel(&dims.iter().flatten().copied().collect::<Vec<_>>())?;
        for d in dims.iter_mut().filter(|d| d.is_none()) {
            *d = Some(if known == 0 { 0 } else { n_in.div_ceil(known) });
        }
        let shape: Vec<usize> = dims.into_iter().flatten().collect();
        let y = self.write(out, self.dt(src), shape)?;
        if let Some(&h) = self.host.get(&src) {
            self.host.insert(y, h);
        }
        self.op(OpKind::Reshape { shape: req }, vec![src], y);
        Ok(())
    }

    fn broadcast_to(&mut self, src: TensorId, shape: &[IntOrVid], out: Tid) -> Result<(), String> {
        let xs = self.ms(src);
        let r = shape.len();
        let off = r
            .checked_sub(xs.len())
            .ok_or("broadcast to fewer dimensions")?;
        let mut req = Vec::with_capacity(r);
        let mut max = Vec::with_capacity(r);
        for (i, &v) in shape.iter().enumerate() {
            let v = self.int(v)?;
            let keep = i >= off && matches!(v, Int::Lit(-1));
            if keep {
                req.push(self.size_sym(src, i - off));
                max.push(xs[i - off]);
            } else {
                let u = self
                    .upper(v)
                    .filter(|&u| u >= 0)
                    .ok_or_else(|| format!("broadcast size {v:?} has no known bound"))?;
                req.push(v);
                max.push(u as usize);
            }
        }
        let dt = self.dt(src);
        let y = self.write(out, dt, max.clone())?;
        self.op(OpKind::Expand { shape: req }, vec![src], y);
        Ok(())
    }

    fn take(
        &mut self,
        src: TensorId,
        index: IntOrVidOrTid,
        a: i32,
        out: Tid,
    ) -> Result<(), String> {
        let r = self.rank(src);
        let d = axis(i64::from(a), r)?;
        let xs = self.ms(src);
        match index {
            IntOrVidOrTid::Int(_) | IntOrVidOrTid::Vid(_) => {
                let index = match index {
                    IntOrVidOrTid::Int(i) => Int::Lit(i),
                    IntOrVidOrTid::Vid(v) => self.int(IntOrVid::Vid(v))?,
                    IntOrVidOrTid::Tid(_) => unreachable!("handled below"),
                };
                let mut shape = xs.clone();
                shape.remove(d);
                let y = self.write(out, self.dt(src), shape)?;
                if let (Int::Lit(i), Role::Input(_)) = (index, &self.g.tensors[src].role) {
                    if r == 1 && i >= 0 {
                        self.host.insert(y, (src, i as usize));
                    }
                }
                self.op(OpKind::Select { dim: d, index }, vec![src], y);
            }
            IntOrVidOrTid::Tid(it) => {
                let idx = self.read(it)?;
                if self.dt(idx).is_float() {
                    return Err("take with float indices".into());
                }
                let is = self.ms(idx);
                let constant = matches!(self.g.tensors[src].role, Role::Constant(_));
                let mut shape: Vec<usize> = xs[..d].to_vec();
                shape.extend(&is);
                shape.extend(&xs[d + 1..]);
                if d == 0 && r == 2 && self.dt(src).is_float() {
                    let y = self.write(out, self.dt(src), shape)?;
                    if constant {
                        self.gathered.insert(y, (src, idx));
                    }
                    self.op(
                        OpKind::Embedding {
                            weight: Weight::F32,
                        },
                        vec![src, idx],
                        y,
                    );
                } else {
                    // Gather along `d` with the indices flattened, then restore their shape.
                    let flat_n: usize = is.iter().product();
                    let flat = self.scratch("take_indices", self.dt(idx), vec![flat_n]);
                    self.op(
                        OpKind::Reshape {
                            shape: vec![Int::Lit(-1)],
                        },
                        vec![idx],
                        flat,
                    );
                    let mut gshape = xs.clone();
                    gshape[d] = flat_n;
                    let g = self.scratch("take", self.dt(src), gshape);
                    self.op(OpKind::IndexSelect { dim: d }, vec![src, flat], g);
                    let mut req: Vec<Int> = (0..d).map(|i| self.size_sym(src, i)).collect();
                    req.extend((0..is.len()).map(|i| self.size_sym(idx, i)));
                    req.extend((d + 1..r).map(|i| self.size_sym(src, i)));
                    let y = self.write(out, self.dt(src), shape)?;
                    if constant && d == 0 {
                        self.gathered.insert(y, (src, idx));
                    }
                    self.op(OpKind::Reshape { shape: req }, vec![g], y);
                }
            }
        }
        Ok(())
    }

    fn addmm(
        &mut self,
        a: TensorId,
        b: TensorId,
        bias: Option<TensorId>,
        alpha: f32,
        beta: f32,
        out: Tid,
    ) -> Result<(), String> {
        let (sa, sb) = (self.ms(a), self.ms(b));
        if sa.len() < 2 || sb.len() < 2 {
            return Err(format!("matmul of {sa:?} and {sb:?}"));
        }
        let n = sb[sb.len() - 1];
        let mut shape = broadcast_max(&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
        shape.extend([sa[sa.len() - 2], n]);
        let dt = self.dt(a);
        // `Transpose(W, [1, 0])` + `Addmm` is how MLX spells a linear layer: read W directly.
        if let (Some(&w), true) = (self.transposed.get(&b), alpha == 1.0 && sb.len() == 2) {
            let bias_ok = bias.is_none_or(|t| beta == 1.0 && self.ms(t) == [n]);
            if bias_ok {
                let y = self.write(out, dt, shape)?;
                let mut ins = vec![a, w];
                ins.extend(bias);
                self.op(
                    OpKind::Linear {
                        weight: Weight::F32,
                        act_quant: ActQuant::None,
                        has_bias: bias.is_some(),
                    },
                    ins,
                    y,
                );
                return Ok(());
            }
        }
        if bias.is_none() && alpha == 1.0 {
            let y = self.write(out, dt, shape)?;
            self.op(OpKind::MatMul { transpose_b: false }, vec![a, b], y);
            return Ok(());
        }
        let mm = self.scratch("addmm", dt, shape.clone());
        self.op(OpKind::MatMul { transpose_b: false }, vec![a, b], mm);
        let mut acc = mm;
        if alpha != 1.0 {
            let t = self.scratch("addmm_alpha", dt, shape.clone());
            self.op(
                OpKind::BinaryScalar {
                    op: BinaryOp::Mul,
                    scalar: f64::from(alpha),
                    scalar_first: false,
                },
                vec![acc],
                t,
            );
            acc = t;
        }
        let Some(mut bias) = bias else {
            let y = self.write(out, dt, shape)?;
            self.op(OpKind::Copy, vec![acc], y);
            return Ok(());
        };
        if beta != 1.0 {
            let t = self.scratch("addmm_beta", dt, self.ms(bias));
            self.op(
                OpKind::BinaryScalar {
                    op: BinaryOp::Mul,
                    scalar: f64::from(beta),
                    scalar_first: false,
                },
                vec![bias],
                t,
            );
            bias = t;
        }
        let shape = broadcast_max(&shape, &self.ms(bias));
        let y = self.write(out, dt, shape)?;
        self.op(OpKind::Binary(BinaryOp::Add), vec![acc, bias], y);
        Ok(())
    }

    /// The IR form of an MLX affine-quantized weight: 4-bit words are already the IR's nibble
    /// layout (element j at bits 4·(j%8) of little-endian word j/8 is the low nibble of byte j/2
    /// for even j); 8-bit values are unsigned (`q + 128`) and become the IR's signed bytes, their
    /// bias absorbing the offset. Scales and biases become f32 `[N, K/group]`.
    fn quantized_weight(
        &mut self,
        w: Tid,
        scales: TensorId,
        biases: Option<TensorId>,
        group: i32,
        bits: i32,
    ) -> Result<(Weight, Vec<TensorId>), String> {
        if self.class(w)? != TensorClass::Constant {
            return Err("quantized weights must be constants".into());
        }
        let meta = self.m.meta(w).ok_or("packed weight has no metadata")?;
        if meta.dtype != ScalarType::UInt32 {
            return Err(format!("packed weight is {:?}, not uint32", meta.dtype));
        }
        let ws: Vec<usize> = meta
            .shape
            .iter()
            .map(|d| match d {
                super::ShapeDim::Static(n) => Ok(*n),
                super::ShapeDim::Dynamic { .. } => Err("packed weight has a dynamic shape"),
            })
            .collect::<Result<_, _>>()?;
        bounded_numel(&ws)?;
        let [n, words] = ws[..] else {
            return Err(format!(
                "packed weight has shape {ws:?}, not [N, K*bits/32]"
            ));
        };
        if !matches!(group, 32 | 64 | 128) {
            return Err(format!("group size {group} (32, 64 or 128 are supported)"));
        }
        let group = group as usize;
        let k = match bits {
            4 => words * 8,
            8 => words * 4,
            b => return Err(format!("{b}-bit weights (4 and 8 are supported)")),
        };
        if k % group != 0 {
            return Err(format!("K={k} is not a multiple of the group size {group}"));
        }
        let groups = k / group;
        let packed = (self.consts)(w)?;
        if packed.len() < n * words * 4 {
            return Err(format!(
                "packed weight has {} bytes for [{n}, {words}] uint32",
                packed.len()
            ));
        }
        let to_f32 = |l: &mut Self, t: TensorId, what: &str| -> Result<Vec<f32>, String> {
            let def = &l.g.tensors[t];
            if def.max_shape.iter().product::<usize>() != n * groups || !def.dtype.is_float() {
                return Err(format!(
                    "{what} are {:?} {:?}, expected [{n}, {groups}] floats",
                    def.dtype, def.max_shape
                ));
            }
            match &def.role {
                Role::Constant(b) => Ok(to_f64(def.dtype, &b[..def.max_bytes()])
                    .into_iter()
                    .map(|v| v as f32)
                    .collect()),
                _ => Err(format!("{what} must be constants")),
            }
        };
        let s = to_f32(self, scales, "scales")?;
        let mut bias = match biases {
            Some(b) => to_f32(self, b, "biases")?,
            None => vec![0.0; n * groups],
        };
        let name = self.slot_name(w);
        let (weight, q) = if bits == 4 {
            let q = packed.slice(0..n * words * 4).map_err(|e| e.to_string())?;
            let q = self
                .g
                .add_tensor(name, DType::U8, vec![n, k / 2], Role::Constant(q));
            (Weight::Q4 { group }, q)
        } else {
            let bytes: Vec<u8> = packed[..n * k].iter().map(|&u| u ^ 0x80).collect();
            for (b, sc) in bias.iter_mut().zip(&s) {
                *b += 128.0 * sc;
            }
            let q = self
                .g
                .add_tensor(name, DType::I8, vec![n, k], Role::Constant(owned(bytes)));
            (Weight::Q8 { group }, q)
        };
        let s = self.g.add_tensor(
            format!("{}.scales", self.slot_name(w)),
            DType::F32,
            vec![n, groups],
            Role::Constant(owned(f32_bytes(&s))),
        );
        let b = self.g.add_tensor(
            format!("{}.biases", self.slot_name(w)),
            DType::F32,
            vec![n, groups],
            Role::Constant(owned(f32_bytes(&bias))),
        );
        Ok((weight, vec![q, s, b]))
    }

    /// A position offset as a host symbol: a value slot, or an element of an input tensor.
    fn offset(&mut self, offset: VidOrTid) -> Result<Int, String> {
        match offset {
            VidOrTid::Vid(v) => self.int(IntOrVid::Vid(v)),
            VidOrTid::Tid(t) => {
                let t = self.read(t)?;
                let (input, index) = match self.host.get(&t) {
                    Some(&h) => h,
                    None if matches!(self.g.tensors[t].role, Role::Input(_)) => (t, 0),
                    None => {
                        return Err(
                            "the offset tensor is computed on the device; only elements of \
                             inputs can be read on the host"
                                .into(),
                        )
                    }
                };
                let s = self.sym("rope_offset".into(), None);
                self.g.nodes.push(IrNode::Sym(SymOp::ReadInput {
                    out: s,
                    tensor: input,
                    index,
                }));
                Ok(Int::Sym(s))
            }
        }
    }

    /// Rows of the rotary tables: the longest mutable buffer axis (a full-attention KV cache
    /// holds every position the model can reach).
    fn max_positions(&self) -> usize {
        self.m
            .mutable_buffer_map
            .iter()
            .filter_map(|s| self.m.meta(Tid(s.idx)))
            .flat_map(|m| m.shape.iter())
            .map(|d| match d {
                super::ShapeDim::Static(n) => *n,
                super::ShapeDim::Dynamic { max, .. } => max.unwrap_or(0),
            })
            .max()
            .unwrap_or(0)
    }

    /// `mx.fast.rope`: the IR's table-driven rope with cos/sin tables built at load for
    /// `inv_freq[i] = base^(-2i/dims)` (or `1/freqs[i]`) and angle `position · scale · inv_freq`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &mut self,
        x: TensorId,
        dims: i32,
        offset: VidOrTid,
        freqs: Option<Tid>,
        traditional: bool,
        base: f32,
        scale: f32,
        out: Tid,
    ) -> Result<(), String> {
        let xs = self.ms(x);
        let r = xs.len();
        if r < 2 {
            return Err(format!("rope of a rank-{r} tensor"));
        }
        let d = xs[r - 1];
        if dims <= 0 || dims % 2 != 0 || dims as usize > d {
            return Err(format!("rope dims {dims} for a head of {d}"));
        }
        let rotary = dims as usize;
        let half = rotary / 2;
        let inv_freq: Vec<f64> = match freqs {
            Some(f) => {
                let t = self.read(f)?;
                let def = &self.g.tensors[t];
                let Role::Constant(b) = &def.role else {
                    return Err("rope freqs must be a constant".into());
                };
                let v = to_f64(def.dtype, &b[..def.max_bytes()]);
                if v.len() != half {
                    return Err(format!("{} rope freqs for {rotary} dims", v.len()));
                }
                v.iter().map(|f| 1.0 / f).collect()
            }
            None => (0..half)
                .map(|i| f64::from(base).powf(-2.0 * i as f64 / rotary as f64))
                .collect(),
        };
        let rows = self.max_positions().max(xs[r - 2]);
        if rows.saturating_mul(half) > MAX_ROPE_TABLE {
            return Err(format!(
                "rotary tables of {rows} positions x {half} exceed {MAX_ROPE_TABLE} entries"
            ));
        }
        let (mut cos, mut sin) = (
            Vec::with_capacity(rows * half),
            Vec::with_capacity(rows * half),
        );
        for p in 0..rows {
            for f in &inv_freq {
                // f32 like MLX's kernel: position·scale·inv_freq rounded before cos/sin.
                let a = (p as f32 * scale * *f as f32) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        let start = self.offset(offset)?;
        let ct = self.g.add_tensor(
            "rope_cos",
            DType::F32,
            vec![rows, half],
            Role::Constant(owned(f32_bytes(&cos))),
        );
        let stt = self.g.add_tensor(
            "rope_sin",
            DType::F32,
            vec![rows, half],
            Role::Constant(owned(f32_bytes(&sin))),
        );
        let y = self.write(out, self.dt(x), xs)?;
        self.op(
            OpKind::Rope {
                style: if traditional {
                    RopeStyle::Interleaved
                } else {
                    RopeStyle::Half
                },
                rotary,
                seq_dim: r - 2,
                start,
            },
            vec![x, ct, stt],
            y,
        );
        Ok(())
    }

    /// `mx.fast.scaled_dot_product_attention` on BHSD tensors: k/v hold exactly the attended
    /// positions, so the IR's start is `kv_len - q_len` (lower-right causal alignment). A bool
    /// mask (true = attend) becomes additive; masks must be `[.., q_len, kv_len]` with unit
    /// leading dims.
    #[allow(clippy::too_many_arguments)]
    fn sdpa(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        causal: bool,
        out: Tid,
    ) -> Result<(), String> {
        let (qs, ks) = (self.ms(q), self.ms(k));
        if qs.len() != 4 || ks.len() != 4 || self.rank(v) != 4 {
            return Err("q, k and v must be 4-D (BHSD)".into());
        }
        if qs[1] % ks[1].max(1) != 0 {
            return Err(format!("{} query heads over {} kv heads", qs[1], ks[1]));
        }
        let (ql, kl) = (self.size_sym(q, 2), self.size_sym(k, 2));
        let start = self.sym("sdpa_start".into(), self.upper(kl));
        self.g.nodes.push(IrNode::Sym(SymOp::Arith {
            out: start,
            op: SymArith::Sub,
            a: kl,
            b: ql,
        }));
        let mut ins = vec![q, k, v];
        if let Some(m) = mask {
            let ms = self.ms(m);
            if ms.len() < 2 || ms[..ms.len() - 2].iter().any(|&d| d != 1) {
                return Err(format!(
                    "attention mask of shape {ms:?}; only [.., q_len, kv_len] with unit leading dims"
                ));
            }
            let r = ms.len();
            let flat_shape = vec![ms[r - 2], ms[r - 1]];
            let req = vec![self.size_sym(m, r - 2), self.size_sym(m, r - 1)];
            let mut m2 = self.scratch("sdpa_mask", self.dt(m), flat_shape.clone());
            self.op(OpKind::Reshape { shape: req.clone() }, vec![m], m2);
            if !self.dt(m).is_float() {
                let zeros = self.scratch("sdpa_mask_zero", DType::F32, flat_shape.clone());
                self.g.op(
                    OpKind::Full {
                        value: 0.0,
                        shape: req.clone(),
                    },
                    vec![],
                    vec![zeros],
                );
                let ninf = self.scratch("sdpa_mask_ninf", DType::F32, flat_shape.clone());
                self.g.op(
                    OpKind::Full {
                        value: f64::NEG_INFINITY,
                        shape: req,
                    },
                    vec![],
                    vec![ninf],
                );
                let add = self.scratch("sdpa_mask_add", DType::F32, flat_shape);
                self.g.op(OpKind::Where, vec![m2, zeros, ninf], vec![add]);
                m2 = add;
            }
            ins.push(m2);
        }
        let y = self.write(out, self.dt(q), qs)?;
        self.op(
            OpKind::Sdpa {
                layout: AttnLayout::Bhsd,
                scale,
                causal,
                window: None,
                softcap: None,
                start: Int::Sym(start),
                all_rows: false,
            },
            ins,
            y,
        );
        Ok(())
    }
}

fn slice_len(start: i64, end: i64, step: usize, n: usize) -> usize {
    let n = n as i64;
    let fix = |v: i64| (if v < 0 { v + n } else { v }).clamp(0, n) as usize;
    let (s, e) = (fix(start), fix(end));
    e.saturating_sub(s).div_ceil(step.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::mlx::{NamedSlot, ShapeDim, SlotVariant, TagTable, TensorMeta, Vid};
    use crate::ir::cpu::CpuExecutor;
    use crate::ir::InputValue;

    fn meta(shape: &[usize], dtype: ScalarType) -> TensorMeta {
        TensorMeta {
            shape: shape.iter().map(|&n| ShapeDim::Static(n)).collect(),
            dtype,
            dim_order: Vec::new(),
        }
    }

    /// A graph over `consts` (meta, bytes), then inputs, outputs and mutable buffers (metas), and
    /// `temps` temp slots; slots are numbered in that order.
    struct Toy {
        m: MlxGraph,
        data: Vec<Vec<u8>>,
    }

    fn toy(
        consts: Vec<(TensorMeta, Vec<u8>)>,
        inputs: Vec<TensorMeta>,
        outputs: Vec<TensorMeta>,
        mutable: Vec<TensorMeta>,
        temps: u32,
        chain: Vec<Node>,
    ) -> Toy {
        let (nc, ni, no, nm) = (consts.len(), inputs.len(), outputs.len(), mutable.len());
        let slots = |from: usize, n: usize| -> Vec<SlotVariant> {
            (from..from + n)
                .map(|i| SlotVariant {
                    idx: i as u32,
                    slot_type: SlotType::Tensor,
                })
                .collect()
        };
        let named_slots = (0..nc)
            .map(|i| NamedSlot {
                name: format!("c/{i}"),
                slot: slots(i, 1)[0],
            })
            .collect();
        let (metas, data): (Vec<TensorMeta>, Vec<Vec<u8>>) = consts.into_iter().unzip();
        let mut tensor_meta = metas;
        tensor_meta.extend(inputs);
        tensor_meta.extend(outputs);
        tensor_meta.extend(mutable);
        Toy {
            m: MlxGraph {
                version: "1".into(),
                num_constant_tensors: nc as u32,
                num_input_tensors: ni as u32,
                num_output_tensors: no as u32,
                num_mutable_buffer_tensors: nm as u32,
                num_temp_tensors: temps,
                num_values: 8,
                chains: vec![chain],
                main_chain_idx: 0,
                init_chain_idx: None,
                input_map: slots(nc, ni),
                output_map: slots(nc + ni, no),
                mutable_buffer_map: slots(nc + ni + no, nm),
                named_slots,
                tensor_meta,
                tag_table: TagTable::Executorch151,
                constant_slots: (0..nc).collect(),
            },
            data,
        }
    }

    impl Toy {
        fn lower(&self) -> Result<Graph, String> {
            lower_with(&self.m, &|t: Tid| {
                self.data
                    .get(t.0 as usize)
                    .map(|b| owned(b.clone()))
                    .ok_or_else(|| format!("no constant {}", t.0))
            })
        }

        fn run(&self, inputs: &[(Vec<usize>, Vec<u8>)]) -> Vec<Vec<f32>> {
            let g = self.lower().unwrap_or_else(|e| panic!("{e}"));
            g.validate().unwrap();
            let mut e = CpuExecutor::new(g).unwrap();
            let ins: Vec<InputValue> = inputs
                .iter()
                .map(|(shape, data)| InputValue::Tensor {
                    shape: shape.clone(),
                    data,
                })
                .collect();
            e.run(&ins)
                .unwrap()
                .into_iter()
                .map(|h| {
                    to_f64(h.dtype, &h.data)
                        .into_iter()
                        .map(|v| v as f32)
                        .collect()
                })
                .collect()
        }
    }

    /// Deterministic values in [-1, 1).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn affine_quantized_matmul_matches_dequantized_reference_for_4_and_8_bits() {
        let (m, n, k) = (3, 5, 256);
        for (bits, group) in [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (8, 128)] {
            let levels = 1u32 << bits;
            let q: Vec<u32> = (0..n * k)
                .map(|i| (i as u32).wrapping_mul(2654435761) % levels)
                .collect();
            // MLX packing: element j at bits `bits * (j % per)` of little-endian word j / per.
            let per = 32 / bits;
            let mut words = vec![0u32; n * k / per];
            for (j, &v) in q.iter().enumerate() {
                words[j / per] |= v << (bits * (j % per));
            }
            let groups = k / group;
            let scales: Vec<f32> = noise(n * groups, 1)
                .iter()
                .map(|v| 0.01 + v.abs() * 0.05)
                .collect();
            let biases: Vec<f32> = noise(n * groups, 2).iter().map(|v| v * 0.3).collect();
            let x = noise(m * k, 3);
            let u32_bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let t = toy(
                vec![
                    (meta(&[n, k * bits / 32], ScalarType::UInt32), u32_bytes),
                    (meta(&[n, groups], ScalarType::Float), f32_bytes(&scales)),
                    (meta(&[n, groups], ScalarType::Float), f32_bytes(&biases)),
                ],
                vec![meta(&[m, k], ScalarType::Float)],
                vec![meta(&[m, n], ScalarType::Float)],
                vec![],
                0,
                vec![Node::QuantizedMatmul {
                    x: Tid(3),
                    w: Tid(0),
                    scales: Tid(1),
                    out: Tid(4),
                    biases: Some(Tid(2)),
                    group_size: group as i32,
                    bits: bits as i32,
                    mode: "affine".into(),
                    transpose: true,
                }],
            );
            let got = &t.run(&[(vec![m, k], f32_bytes(&x))])[0];
            for r in 0..m {
                for c in 0..n {
                    let want: f64 = (0..k)
                        .map(|j| {
                            let g = c * groups + j / group;
                            let w = scales[g] as f64 * q[c * k + j] as f64 + biases[g] as f64;
                            w * x[r * k + j] as f64
                        })
                        .sum();
                    let e = (got[r * n + c] as f64 - want).abs();
                    assert!(
                        e <= 1e-4 * want.abs().max(1.0),
                        "{bits}-bit group {group} [{r},{c}]: {} vs {want}",
                        got[r * n + c]
                    );
                }
            }
        }
    }

    #[test]
    fn unsupported_quantization_is_refused_with_its_parameters() {
        let qmm = |bits: i32, group: i32, mode: &str| Node::QuantizedMatmul {
            x: Tid(3),
            w: Tid(0),
            scales: Tid(1),
            out: Tid(4),
            biases: Some(Tid(2)),
            group_size: group,
            bits,
            mode: mode.into(),
            transpose: true,
        };
        for (node, want) in [
            (qmm(3, 32, "affine"), "3-bit weights"),
            (qmm(4, 16, "affine"), "group size 16"),
            (qmm(4, 32, "mxfp4"), "mode `mxfp4`"),
        ] {
            let t = toy(
                vec![
                    (meta(&[4, 8], ScalarType::UInt32), vec![0; 128]),
                    (meta(&[4, 2], ScalarType::Float), vec![0; 32]),
                    (meta(&[4, 2], ScalarType::Float), vec![0; 32]),
                ],
                vec![meta(&[1, 64], ScalarType::Float)],
                vec![meta(&[1, 4], ScalarType::Float)],
                vec![],
                0,
                vec![node],
            );
            let e = t.lower().unwrap_err();
            assert!(e.contains(want) && e.contains("QuantizedMatmulNode"), "{e}");
        }
    }

    #[test]
    fn nodes_without_a_lowering_are_listed_together() {
        let t = toy(
            vec![],
            vec![meta(&[4], ScalarType::Float)],
            vec![meta(&[4], ScalarType::Float)],
            vec![],
            1,
            vec![
                Node::Cumsum {
                    x: Tid(0),
                    out: Tid(2),
                    axis: 0,
                    reverse: false,
                    inclusive: true,
                },
                Node::Flip {
                    x: Tid(2),
                    out: Tid(1),
                    axes: vec![0],
                },
            ],
        );
        let e = t.lower().unwrap_err();
        assert!(e.contains("CumsumNode") && e.contains("FlipNode"), "{e}");
    }

    /// A KV-cache write through another slot, then a read of the buffer's old value: in-place
    /// storage cannot give it, so lowering refuses instead of computing with the new value.
    #[test]
    fn reading_a_mutable_buffer_after_an_in_place_update_is_refused() {
        let t = toy(
            vec![],
            vec![meta(&[1, 4], ScalarType::Float)],
            vec![meta(&[8, 4], ScalarType::Float)],
            vec![meta(&[8, 4], ScalarType::Float)],
            1,
            vec![
                Node::SliceUpdate {
                    dst: Tid(2),
                    update: Tid(0),
                    out: Tid(3),
                    axis: IntOrVid::Int(0),
                    start: IntOrVid::Int(2),
                    stop: IntOrVid::Int(3),
                    step: 1,
                },
                Node::Contiguous {
                    x: Tid(2),
                    out: Tid(1),
                },
            ],
        );
        let e = t.lower().unwrap_err();
        assert!(e.contains("read after a SliceUpdate"), "{e}");
    }

    #[test]
    fn kv_cache_update_writes_the_rows_and_persists_across_calls() {
        // cache[ItemInt(pos[0]) .. + T] = update, then out = cache (the IdCopy-back form).
        let t = toy(
            vec![],
            vec![
                meta(&[1, 2, 3, 4], ScalarType::Float),
                TensorMeta {
                    shape: vec![ShapeDim::Dynamic {
                        min: 1,
                        max: Some(3),
                    }],
                    dtype: ScalarType::Long,
                    dim_order: Vec::new(),
                },
            ],
            vec![meta(&[1, 2, 6, 4], ScalarType::Float)],
            vec![meta(&[1, 2, 6, 4], ScalarType::Float)],
            2,
            vec![
                Node::Take {
                    x: Tid(1),
                    out: Tid(4),
                    index: IntOrVidOrTid::Int(0),
                    axis: 0,
                },
                Node::ItemInt {
                    x: Tid(4),
                    out: Vid(0),
                },
                Node::SymSize {
                    a: Tid(0),
                    dim: 2,
                    out: Vid(1),
                },
                Node::IntArith {
                    op: NodeKind::AddInt,
                    a: IntOrVid::Vid(Vid(0)),
                    b: IntOrVid::Vid(Vid(1)),
                    out: Vid(2),
                },
                Node::SliceUpdate {
                    dst: Tid(3),
                    update: Tid(0),
                    out: Tid(5),
                    axis: IntOrVid::Int(2),
                    start: IntOrVid::Vid(Vid(0)),
                    stop: IntOrVid::Vid(Vid(2)),
                    step: 1,
                },
                Node::Contiguous {
                    x: Tid(5),
                    out: Tid(2),
                },
                Node::IdCopy {
                    x: Tid(5),
                    out: Tid(3),
                },
            ],
        );
        let g = t.lower().unwrap();
        let mut e = CpuExecutor::new(g).unwrap();
        let mut want = vec![0f32; 2 * 6 * 4];
        for (call, (pos, len)) in [(0usize, 3usize), (3, 1), (4, 2)].into_iter().enumerate() {
            let upd = noise(2 * len * 4, 10 + call as u64);
            for h in 0..2 {
                for r in 0..len {
                    for d in 0..4 {
                        want[(h * 6 + pos + r) * 4 + d] = upd[(h * len + r) * 4 + d];
                    }
                }
            }
            let positions: Vec<u8> = (pos..pos + len)
                .flat_map(|p| (p as i64).to_le_bytes())
                .collect();
            let ub = f32_bytes(&upd);
            let out = e
                .run(&[
                    InputValue::Tensor {
                        shape: vec![1, 2, len, 4],
                        data: &ub,
                    },
                    InputValue::Tensor {
                        shape: vec![len],
                        data: &positions,
                    },
                ])
                .unwrap();
            let got: Vec<f32> = to_f64(out[0].dtype, &out[0].data)
                .into_iter()
                .map(|v| v as f32)
                .collect();
            assert_eq!(got, want, "call {call}");
        }
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        f32_bytes(v)
    }

    /// `mx.fast.rope` by its definition: angle `(offset + t) · scale · inv_freq[i]`, pairs split
    /// in halves or interleaved, dims past `dims` unchanged.
    fn rope_reference(
        x: &[f32],
        shape: [usize; 4],
        dims: usize,
        offset: i64,
        inv_freq: &[f64],
        scale: f64,
        traditional: bool,
    ) -> Vec<f32> {
        let [b, h, t, d] = shape;
        let half = dims / 2;
        let mut y = x.to_vec();
        for row in 0..b * h * t {
            let pos = (offset + (row % t) as i64) as f64;
            let r = &x[row * d..(row + 1) * d];
            for (i, f) in inv_freq.iter().enumerate().take(half) {
                let a = pos * scale * f;
                let (c, s) = (a.cos(), a.sin());
                let (p, q) = if traditional {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + half)
                };
                let (xp, xq) = (r[p] as f64, r[q] as f64);
                y[row * d + p] = (xp * c - xq * s) as f32;
                y[row * d + q] = (xq * c + xp * s) as f32;
            }
        }
        y
    }

    #[test]
    fn rope_with_a_tensor_offset_matches_the_reference() {
        let shape = [1, 2, 3, 8];
        let x = noise(48, 21);
        for (traditional, dims, freqs) in [
            (false, 8, None),
            (true, 6, None),
            (false, 6, Some(vec![1.0f32, 7.5, 60.0])),
        ] {
            let mut consts = Vec::new();
            if let Some(f) = &freqs {
                consts.push((meta(&[3], ScalarType::Float), f32s(f)));
            }
            let nc = consts.len() as u32;
            let (xi, pi, oi) = (nc, nc + 1, nc + 2);
            let t = toy(
                consts,
                vec![
                    meta(&shape, ScalarType::Float),
                    meta(&[1], ScalarType::Long),
                ],
                vec![meta(&shape, ScalarType::Float)],
                vec![meta(&[1, 2, 16, 8], ScalarType::Float)],
                0,
                vec![Node::Rope {
                    x: Tid(xi),
                    out: Tid(oi),
                    dims: dims as i32,
                    offset: VidOrTid::Tid(Tid(pi)),
                    freqs: freqs.as_ref().map(|_| Tid(0)),
                    traditional,
                    base: 10000.0,
                    scale: 0.5,
                }],
            );
            let inv: Vec<f64> = match &freqs {
                Some(f) => f.iter().map(|&v| 1.0 / v as f64).collect(),
                None => (0..dims / 2)
                    .map(|i| 10000f64.powf(-2.0 * i as f64 / dims as f64))
                    .collect(),
            };
            let offset = 5i64;
            let got = &t.run(&[
                (shape.to_vec(), f32s(&x)),
                (vec![1], offset.to_le_bytes().to_vec()),
            ])[0];
            let want = rope_reference(&x, shape, dims, offset, &inv, 0.5, traditional);
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5,
                    "traditional={traditional} dims={dims} freqs={}: [{j}] {g} vs {w}",
                    freqs.is_some()
                );
            }
        }
    }

    #[test]
    fn sdpa_with_a_bool_mask_attends_where_true_with_grouped_heads() {
        // q [1, 4, 2, 8] over k/v [1, 2, 5, 8]; a bool mask [1, 1, 2, 5]; no causal flag.
        let (hq, hkv, s, kv, d) = (4, 2, 2, 5, 8);
        let (q, k, v) = (
            noise(hq * s * d, 31),
            noise(hkv * kv * d, 32),
            noise(hkv * kv * d, 33),
        );
        let mask: Vec<bool> = (0..s * kv).map(|i| i % 3 != 1).collect();
        let t = toy(
            vec![],
            vec![
                meta(&[1, hq, s, d], ScalarType::Float),
                meta(&[1, hkv, kv, d], ScalarType::Float),
                meta(&[1, hkv, kv, d], ScalarType::Float),
                meta(&[1, 1, s, kv], ScalarType::Bool),
            ],
            vec![meta(&[1, hq, s, d], ScalarType::Float)],
            vec![],
            0,
            vec![Node::Sdpa {
                q: Tid(0),
                k: Tid(1),
                v: Tid(2),
                out: Tid(4),
                scale: 0.7,
                mask: Some(Tid(3)),
                causal: false,
            }],
        );
        let got = &t.run(&[
            (vec![1, hq, s, d], f32s(&q)),
            (vec![1, hkv, kv, d], f32s(&k)),
            (vec![1, hkv, kv, d], f32s(&v)),
            (vec![1, 1, s, kv], mask.iter().map(|&m| m as u8).collect()),
        ])[0];
        for h in 0..hq {
            let g = h / (hq / hkv);
            for i in 0..s {
                let qr = &q[(h * s + i) * d..(h * s + i + 1) * d];
                let logits: Vec<f64> = (0..kv)
                    .map(|j| {
                        if !mask[i * kv + j] {
                            return f64::NEG_INFINITY;
                        }
                        let kr = &k[(g * kv + j) * d..(g * kv + j + 1) * d];
                        0.7 * qr.iter().zip(kr).map(|(a, b)| (a * b) as f64).sum::<f64>()
                    })
                    .collect();
                let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = logits.iter().map(|l| (l - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..d {
                    let want: f64 = (0..kv)
                        .map(|j| e[j] / z * v[(g * kv + j) * d + c] as f64)
                        .sum();
                    let gv = got[(h * s + i) * d + c] as f64;
                    assert!((gv - want).abs() <= 1e-5, "h{h} q{i} d{c}: {gv} vs {want}");
                }
            }
        }
    }

    #[test]
    fn a_constant_shorter_than_its_metadata_is_refused() {
        let t = toy(
            vec![(meta(&[4, 4], ScalarType::Float), vec![0; 60])],
            vec![meta(&[4], ScalarType::Float)],
            vec![meta(&[4, 4], ScalarType::Float)],
            vec![],
            0,
            vec![Node::Binary {
                op: NodeKind::Add,
                a: Tid(0),
                b: Tid(1),
                out: Tid(2),
            }],
        );
        let e = t.lower().unwrap_err();
        assert!(
            e.contains("has 60 bytes of data") && e.contains("AddNode"),
            "{e}"
        );
    }

    /// bf16 weights (as MLX exports for Apple GPUs) still become a linear layer reading the
    /// weight in place and an embedding, not a per-call transpose and matmul.
    #[test]
    fn bf16_linear_and_embedding_weights_are_read_in_place() {
        let (m, n, k, v) = (2, 3, 8, 5);
        let bf = |x: &[f32]| -> Vec<u8> {
            x.iter()
                .flat_map(|&f| half::bf16::from_f32(f).to_le_bytes())
                .collect()
        };
        let w = noise(n * k, 41);
        let table = noise(v * k, 42);
        let x = noise(m * k, 43);
        let t = toy(
            vec![
                (meta(&[n, k], ScalarType::BFloat16), bf(&w)),
                (meta(&[v, k], ScalarType::BFloat16), bf(&table)),
            ],
            vec![
                meta(&[m, k], ScalarType::Float),
                meta(&[1, 2], ScalarType::Long),
            ],
            vec![
                meta(&[m, n], ScalarType::Float),
                meta(&[1, 2, k], ScalarType::BFloat16),
            ],
            vec![],
            1,
            vec![
                Node::Transpose {
                    x: Tid(0),
                    out: Tid(6),
                    perm: vec![1, 0],
                },
                Node::Addmm {
                    mat1: Tid(2),
                    mat2: Tid(6),
                    out: Tid(4),
                    bias: None,
                    alpha: 1.0,
                    beta: 1.0,
                },
                Node::Take {
                    x: Tid(1),
                    out: Tid(5),
                    index: IntOrVidOrTid::Tid(Tid(3)),
                    axis: 0,
                },
            ],
        );
        let mut g = t.lower().unwrap();
        crate::ir::passes::optimize(&mut g);
        let labels: Vec<String> = g.ops().map(|o| o.kind.label()).collect();
        assert_eq!(labels, ["linear[f32]", "embedding[f32]"]);
        let ids: Vec<u8> = [4i64, 1].iter().flat_map(|i| i.to_le_bytes()).collect();
        let out = t.run(&[(vec![m, k], f32s(&x)), (vec![1, 2], ids)]);
        let round = |f: f32| half::bf16::from_f32(f).to_f32();
        for r in 0..m {
            for c in 0..n {
                let want: f32 = (0..k).map(|j| x[r * k + j] * round(w[c * k + j])).sum();
                assert!((out[0][r * n + c] - want).abs() < 1e-5, "[{r},{c}]");
            }
        }
        let want: Vec<f32> = [4, 1]
            .iter()
            .flat_map(|&row| table[row * k..(row + 1) * k].iter().map(|&f| round(f)))
            .collect();
        assert_eq!(out[1], want);
    }
}
