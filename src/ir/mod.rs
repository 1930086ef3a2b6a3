//! The one op-graph IR every delegate front end lowers into, and both executors run.
//!
//! A `Graph` holds tensors (dtype, upper-bound shape, role), host integer symbols (dynamic sizes and
//! positions, computed on the host before any kernel runs), and nodes in execution order. Ops are
//! named canonically (`OpKind::name`), independent of the file format they came from; a GPU kernel
//! is found by that name in `kernels/`. `cpu` is the reference executor the GPU kernels are tested
//! against.

pub mod cpu;
mod infer;
mod mul_mean;
pub mod passes;

pub use crate::runtime::DType;
pub(crate) use infer::broadcast;
pub use infer::{infer_shapes, op_shapes, shape_syms, InputValue, Plan, PlanCache};

use crate::pte::Blob;
use std::fmt;

pub type TensorId = usize;
pub type SymId = usize;

/// An integer attribute that is either fixed or read from a host symbol at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Int {
    Lit(i64),
    Sym(SymId),
}

impl Int {
    pub fn eval(self, syms: &[i64]) -> i64 {
        match self {
            Int::Lit(v) => v,
            Int::Sym(s) => syms[s],
        }
    }
}

/// What a tensor is for; decides where it lives and how long.
#[derive(Debug, Clone)]
pub enum Role {
    /// Computed during a call.
    Activation,
    /// Delegate input number `k`.
    Input(usize),
    /// Read-only weights, resident for the model's lifetime.
    Constant(Blob),
    /// Persists across calls (KV caches); zero at load unless an initial value is given.
    State(Option<Blob>),
}

#[derive(Debug, Clone)]
pub struct TensorDef {
    pub name: String,
    pub dtype: DType,
    /// Upper bounds; a call's actual shapes come from `infer_shapes`.
    pub max_shape: Vec<usize>,
    pub role: Role,
}

impl TensorDef {
    pub fn max_numel(&self) -> usize {
        self.max_shape.iter().product()
    }
    pub fn max_bytes(&self) -> usize {
        self.max_numel() * self.dtype.size()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sin,
    Cos,
    Sigmoid,
    Silu,
    Gelu,
    GeluTanh,
    Relu,
    Square,
    Reciprocal,
    Floor,
    Ceil,
    LogicalNot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge | And | Or)
    }
}

/// How a linear or embedding weight is stored. All 4-bit forms share one byte layout — `u8
/// [rows, cols/2]`, element `2j` in the low nibble, unsigned — and dequantize as
/// `w = scale[row, g] * q + bias[row, g]`, which covers symmetric (bias = -8·scale) and MLX affine
/// packings alike; front ends convert scales/biases to f32 `[rows, cols/group]` at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weight {
    /// Dense f32 `[rows, cols]`.
    F32,
    /// 4-bit, inputs: packed, scales, biases.
    Q4 { group: usize },
    /// 8-bit signed, per group: inputs: i8 `[rows, cols]`, scales, biases (`w = s*q + b`).
    Q8 { group: usize },
}

impl Weight {
    /// Number of weight tensors an op consumes for this format.
    pub fn tensor_count(self) -> usize {
        match self {
            Weight::F32 => 1,
            Weight::Q4 { .. } | Weight::Q8 { .. } => 3,
        }
    }
}

/// A linear's per-row dynamic int8 activation quantization. Both rules take the row's range
/// including 0 and round half to even; they differ in float arithmetic, so values at or near a
/// rounding tie can land on different integers — enough to move a quantized model's logits by
/// percents, so each front end keeps the rule its runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActQuant {
    /// x is used as it is.
    None,
    /// torchao (`choose_qparams_affine` + `quantize_affine`): scale = range / 255,
    /// q = round(x / scale) + zero point. Vulkan's in-graph qparams compute the same.
    Torchao,
    /// XNNPACK's qd8 convert: multiplier = 255 / range, q = round(x · multiplier) + zero point,
    /// the zero point taken from whichever range end rounds with the smaller error.
    Xnnpack,
}

/// Rotary embedding pairing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// HF "rotate_half": dim i pairs with i + rotary/2.
    Half,
    /// Llama/Meta: dims 2i and 2i+1 pair.
    Interleaved,
}

/// Tensor layout of attention operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnLayout {
    /// `[B, S, H, D]` (ExecuTorch llama ops, Vulkan).
    Bshd,
    /// `[B, H, S, D]` (MLX, PyTorch SDPA).
    Bhsd,
}

/// Attention's sizes: batch, queries, query heads, head dim, cache rows, kv heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    pub b: usize,
    pub s: usize,
    pub hq: usize,
    pub d: usize,
    pub cl: usize,
    pub hkv: usize,
}

impl AttnLayout {
    /// The sizes of 4-D q `qs` and k/v `ks` in this layout, if k/v fit q (same batch and head
    /// dim, query heads a multiple of the kv heads).
    pub fn dims(self, qs: &[usize], ks: &[usize]) -> Option<AttnDims> {
        let (&[b, q1, q2, d], &[bk, k1, k2, kd]) = (qs, ks) else {
            return None;
        };
        let ((s, hq), (cl, hkv)) = match self {
            AttnLayout::Bshd => ((q1, q2), (k1, k2)),
            AttnLayout::Bhsd => ((q2, q1), (k2, k1)),
        };
        (bk == b && kd == d && hkv != 0 && hq % hkv == 0).then_some(AttnDims {
            b,
            s,
            hq,
            d,
            cl,
            hkv,
        })
    }
}

/// One step of an `ElementwiseChain`, applied to the running value `v` of each element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ChainStep {
    Unary(UnaryOp),
    /// `v ⊕ inputs[input]`, or `inputs[input] ⊕ v` when `operand_first`.
    Binary {
        op: BinaryOp,
        input: usize,
        operand_first: bool,
    },
    /// `v ⊕ scalar`, or `scalar ⊕ v` when `scalar_first`.
    Scalar {
        op: BinaryOp,
        scalar: f64,
        scalar_first: bool,
    },
    Clamp {
        min: Option<f64>,
        max: Option<f64>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum OpKind {
    Unary(UnaryOp),
    /// Two tensors, NumPy broadcasting; comparisons produce Bool.
    Binary(BinaryOp),
    /// Tensor ⊕ scalar (or scalar ⊕ tensor when `scalar_first`).
    BinaryScalar {
        op: BinaryOp,
        scalar: f64,
        scalar_first: bool,
    },
    /// `where(cond, a, b)` with broadcasting.
    Where,
    /// f32 element-wise ops in sequence without intermediate tensors: `v = inputs[0]`, then each
    /// step in turn; every input broadcasts to the output (what `fuse_elementwise_chains` makes
    /// of a chain whose intermediates nothing else reads).
    ElementwiseChain {
        steps: Vec<ChainStep>,
    },
    Clamp {
        min: Option<f64>,
        max: Option<f64>,
    },
    /// Element-wise dtype conversion to the output's dtype.
    Cast,
    /// `x * rsqrt(mean(x², -1) + eps) * weight`; inputs: x, optional weight.
    RmsNorm {
        eps: f32,
    },
    /// An `RmsNorm` whose result only an `ElementwiseChain` reads, as one op (what
    /// `fuse_norm_chains` makes of the residual adds after Gemma's post-norms): inputs: x, the
    /// weight if `weighted`, then the chain's inputs without the norm's, which is chain input
    /// `norm_input`. The chain's inputs broadcast to x's shape.
    RmsNormChain {
        eps: f32,
        weighted: bool,
        norm_input: usize,
        steps: Vec<ChainStep>,
    },
    /// `y[..., N] = x[..., K] · Wᵀ (+ bias)`; inputs: x, weight tensors (per `weight`), optional bias.
    /// Unless `act_quant` is `None`, x is first quantized per row to asymmetric int8 and
    /// dequantized by that rule (dynamic activation quantization, the "8da" of 8da4w).
    Linear {
        weight: Weight,
        act_quant: ActQuant,
        has_bias: bool,
    },
    /// Batched `a @ b` with broadcast batch dims; `a @ bᵀ` (b's last two dims swapped) when
    /// `transpose_b`, so a transposed operand needs no copy.
    MatMul {
        transpose_b: bool,
    },
    /// Row gather: inputs: weight tensors (per `weight`), then indices; output `[..idx, cols]`.
    Embedding {
        weight: Weight,
    },
    /// Softmax over the last dim.
    Softmax,
    /// Mean over the given (normalised, ascending) dims.
    Mean {
        dims: Vec<usize>,
        keepdim: bool,
    },
    /// Sum over the given (normalised, ascending) dims.
    Sum {
        dims: Vec<usize>,
        keepdim: bool,
    },
    /// `Mean` of `inputs[0] * inputs[1]` (broadcast together) without the products' tensor:
    /// each product rounded to f32, summed in f32 in index order, then divided by the count, so
    /// the bits are those of `Binary(Mul)` then `Mean` on the CPU (what `fuse_mul_mean` makes of
    /// the pair; attention exported as element-wise products and means).
    MulMean {
        dims: Vec<usize>,
        keepdim: bool,
    },
    /// `start, start + step, … < end` in the output's dtype.
    Arange {
        start: Int,
        end: Int,
        step: i64,
    },
    /// An `RmsNorm` (weighted if `weighted`) whose result only a `Rope` rotates, as one op (what
    /// `fuse_norm_ropes` makes of Gemma's q/k norms): inputs: x, the weight if `weighted`, cos,
    /// sin; the rest as `Rope`.
    RmsNormRope {
        eps: f32,
        weighted: bool,
        style: RopeStyle,
        rotary: usize,
        seq_dim: usize,
        start: Int,
    },
    /// Rotary embedding of x `[.., S, .., D]` by cos/sin tables `[max_pos, rotary/2]` at
    /// positions `start..start+S`; dims past `rotary` pass through. `seq_dim` indexes S in x.
    Rope {
        style: RopeStyle,
        rotary: usize,
        seq_dim: usize,
        start: Int,
    },
    /// Attention of q over the first `start + S` rows of k/v caches, or over all of them.
    /// Inputs: q, k, v, optional additive mask `[.., S, >= kv_len]` (leading dims 1).
    Sdpa {
        layout: AttnLayout,
        scale: f32,
        causal: bool,
        /// Sliding window: a query at position p sees keys in `(p - window, p]`.
        window: Option<usize>,
        softcap: Option<f32>,
        start: Int,
        /// Every cache row is a key (the mask decides which count), as when an export's
        /// decomposed attention over the whole cache is fused (`passes::fuse_attention`).
        all_rows: bool,
    },
    /// Writes `value` into `cache` (a State) along `axis` at `start`; output aliases the cache.
    /// Inputs: cache, value, and optionally an index tensor `[value.shape[axis]]`: then row `r`
    /// of value goes to row `indices[r]` of the cache (negative counts from the end) and `start`
    /// is unused (`index_put` with one index tensor, as ExecuTorch's stock KV cache writes).
    CacheUpdate {
        axis: usize,
        start: Int,
    },
    /// Same bytes, new shape (at most one -1).
    Reshape {
        shape: Vec<Int>,
    },
    Permute {
        perm: Vec<usize>,
    },
    Slice {
        dim: usize,
        start: Int,
        end: Int,
        step: usize,
    },
    /// Removes `dim`, taking element `index` (negative counts from the end).
    Select {
        dim: usize,
        index: Int,
    },
    Concat {
        dim: usize,
    },
    /// Broadcast to `shape` (sizes may be host symbols: a dynamic target).
    Expand {
        shape: Vec<Int>,
    },
    /// Gather along `dim` with an index tensor (index_select); inputs: x, indices.
    IndexSelect {
        dim: usize,
    },
    Full {
        value: f64,
        shape: Vec<Int>,
    },
    /// Copy (a materialised identity).
    Copy,
}

impl OpKind {
    /// ExecuTorch's attention over BSHD caches that already hold this call's rows
    /// (`custom_sdpa`, `sdpa_with_kv_cache`), whichever front end meets it: a null scale is
    /// 1/sqrt(head_dim).
    pub fn cached_sdpa(scale: Option<f32>, head_dim: usize, causal: bool, start: Int) -> OpKind {
        OpKind::Sdpa {
            layout: AttnLayout::Bshd,
            scale: scale.unwrap_or(1.0 / (head_dim as f32).sqrt()),
            causal,
            window: None,
            softcap: None,
            start,
            all_rows: false,
        }
    }

    /// Every integer the op takes, symbols among them.
    pub fn ints(&self) -> Vec<Int> {
        match self {
            OpKind::Rope { start, .. }
            | OpKind::Sdpa { start, .. }
            | OpKind::CacheUpdate { start, .. } => vec![*start],
            OpKind::Reshape { shape } | OpKind::Full { shape, .. } | OpKind::Expand { shape } => {
                shape.clone()
            }
            OpKind::Slice { start, end, .. } => vec![*start, *end],
            OpKind::Select { index, .. } => vec![*index],
            OpKind::Arange { start, end, .. } => vec![*start, *end],
            _ => vec![],
        }
    }
    /// The canonical op name; GPU kernels are found by it in `kernels/`.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Unary(_) | OpKind::Binary(_) | OpKind::BinaryScalar { .. } => "elementwise",
            OpKind::Where | OpKind::Clamp { .. } | OpKind::Cast => "elementwise",
            OpKind::ElementwiseChain { .. } => "elementwise",
            OpKind::RmsNorm { .. } | OpKind::RmsNormChain { .. } => "rms_norm",
            OpKind::RmsNormRope { .. } => "rms_norm",
            OpKind::Linear { .. } => "linear",
            OpKind::MatMul { .. } => "matmul",
            OpKind::Embedding { .. } => "embedding",
            OpKind::Softmax => "softmax",
            OpKind::Mean { .. } | OpKind::Sum { .. } => "reduce",
            OpKind::MulMean { .. } => "mul_mean",
            OpKind::Arange { .. } => "full",
            OpKind::Rope { .. } => "rope",
            OpKind::Sdpa { .. } => "sdpa",
            OpKind::CacheUpdate { .. } => "cache_update",
            OpKind::Reshape { .. } => "reshape",
            OpKind::Permute { .. } | OpKind::Slice { .. } | OpKind::Select { .. } => "layout",
            OpKind::Concat { .. } | OpKind::Expand { .. } | OpKind::IndexSelect { .. } => "layout",
            OpKind::Copy => "layout",
            OpKind::Full { .. } => "full",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub kind: OpKind,
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<TensorId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SymArith {
    Add,
    Sub,
    Mul,
    FloorDiv,
    Mod,
    Max,
    Min,
}

/// Host-side integer computations; they run in graph order before and between kernels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SymOp {
    /// Current size of a tensor dim.
    Size {
        out: SymId,
        tensor: TensorId,
        dim: usize,
    },
    /// Element `index` of an input tensor (inputs are on the host, so this needs no readback).
    ReadInput {
        out: SymId,
        tensor: TensorId,
        index: usize,
    },
    Arith {
        out: SymId,
        op: SymArith,
        a: Int,
        b: Int,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Op(Op),
    Sym(SymOp),
}

/// A delegate input or output: a tensor, or a host integer (ExecuTorch `SymInt` arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    Tensor(TensorId),
    Sym(SymId),
}

#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub tensors: Vec<TensorDef>,
    pub sym_names: Vec<String>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<Io>,
    pub outputs: Vec<TensorId>,
    /// Host integers the delegate also returns, as (position among all the delegate's outputs,
    /// symbol); `outputs` fill the other positions in order. (A Vulkan delegate can return a
    /// `sym_size` to the CPU ops around it.)
    pub sym_outputs: Vec<(usize, SymId)>,
}

#[derive(Debug, thiserror::Error)]
pub enum IrError {
    #[error("{0}")]
    Invalid(String),
    #[error("node {node} ({op}): {msg}")]
    Node {
        node: usize,
        op: String,
        msg: String,
    },
}

impl Graph {
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        max_shape: Vec<usize>,
        role: Role,
    ) -> TensorId {
        self.tensors.push(TensorDef {
            name: name.into(),
            dtype,
            max_shape,
            role,
        });
        self.tensors.len() - 1
    }

    pub fn add_sym(&mut self, name: impl Into<String>) -> SymId {
        self.sym_names.push(name.into());
        self.sym_names.len() - 1
    }

    pub fn op(&mut self, kind: OpKind, inputs: Vec<TensorId>, outputs: Vec<TensorId>) {
        self.nodes.push(Node::Op(Op {
            kind,
            inputs,
            outputs,
        }));
    }

    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.nodes.iter().filter_map(|n| match n {
            Node::Op(o) => Some(o),
            _ => None,
        })
    }

    /// Count of ops by canonical name and variant, for `inspect`.
    pub fn op_histogram(&self) -> std::collections::BTreeMap<String, usize> {
        let mut h = std::collections::BTreeMap::new();
        for o in self.ops() {
            *h.entry(o.kind.label()).or_default() += 1;
        }
        h
    }

    /// A one-element constant's value (integers as floats).
    pub fn scalar_constant(&self, t: TensorId) -> Option<f64> {
        let def = self.tensors.get(t)?;
        match &def.role {
            Role::Constant(b) if def.max_numel() == 1 => {
                let bytes = b.get(..def.dtype.size())?;
                Some(if def.dtype.is_float() {
                    crate::runtime::tensor::to_f64(def.dtype, bytes)[0]
                } else {
                    crate::runtime::tensor::to_i64(def.dtype, bytes)[0] as f64
                })
            }
            _ => None,
        }
    }

    /// Bytes of constant data the graph holds.
    pub fn constant_bytes(&self) -> usize {
        self.tensors
            .iter()
            .map(|t| match &t.role {
                Role::Constant(b) => b.len(),
                _ => 0,
            })
            .sum()
    }

    /// Structural checks: ids in range, constants sized to their shapes, inputs declared.
    pub fn validate(&self) -> Result<(), IrError> {
        let nt = self.tensors.len();
        let ns = self.sym_names.len();
        for (i, t) in self.tensors.iter().enumerate() {
            if let Role::Constant(b) | Role::State(Some(b)) = &t.role {
                if b.len() < t.max_bytes() {
                    return Err(IrError::Invalid(format!(
                        "tensor {i} `{}`: {} bytes of data for {} {:?}",
                        t.name,
                        b.len(),
                        t.dtype.name(),
                        t.max_shape
                    )));
                }
            }
        }
        let int_ok = |v: &Int| match v {
            Int::Sym(s) => *s < ns,
            Int::Lit(_) => true,
        };
        for (n, node) in self.nodes.iter().enumerate() {
            let bad = |msg: String| IrError::Node {
                node: n,
                op: match node {
                    Node::Op(o) => o.kind.label(),
                    Node::Sym(_) => "sym".into(),
                },
                msg,
            };
            match node {
                Node::Op(o) => {
                    for &t in o.inputs.iter().chain(&o.outputs) {
                        if t >= nt {
                            return Err(bad(format!("tensor id {t} out of range ({nt} tensors)")));
                        }
                    }
                    for &t in &o.outputs {
                        if matches!(self.tensors[t].role, Role::Constant(_) | Role::Input(_)) {
                            return Err(bad(format!("writes to read-only tensor {t}")));
                        }
                    }
                    if !o.kind.ints().iter().all(int_ok) {
                        return Err(bad("symbol id out of range".into()));
                    }
                }
                Node::Sym(s) => {
                    let (out, ok) = match s {
                        SymOp::Size { out, tensor, .. } => (*out, *tensor < nt),
                        SymOp::ReadInput { out, tensor, .. } => (
                            *out,
                            *tensor < nt && matches!(self.tensors[*tensor].role, Role::Input(_)),
                        ),
                        SymOp::Arith { out, a, b, .. } => (*out, int_ok(a) && int_ok(b)),
                    };
                    if out >= ns || !ok {
                        return Err(bad("bad tensor or symbol reference".into()));
                    }
                }
            }
        }
        for io in &self.inputs {
            match io {
                Io::Tensor(t) if *t >= nt => {
                    return Err(IrError::Invalid(format!("input tensor {t} out of range")))
                }
                Io::Sym(s) if *s >= ns => {
                    return Err(IrError::Invalid(format!("input symbol {s} out of range")))
                }
                _ => {}
            }
        }
        if let Some(&t) = self.outputs.iter().find(|&&t| t >= nt) {
            return Err(IrError::Invalid(format!("output tensor {t} out of range")));
        }
        let total = self.outputs.len() + self.sym_outputs.len();
        for &(k, s) in &self.sym_outputs {
            if s >= ns || k >= total {
                return Err(IrError::Invalid(format!(
                    "symbol output {s} at position {k} out of range"
                )));
            }
        }
        Ok(())
    }
}

impl OpKind {
    /// Renumbers the host symbols the op's integer attributes read (when graphs are joined).
    pub fn map_syms(&mut self, f: impl Fn(SymId) -> SymId) {
        let m = |i: &mut Int| {
            if let Int::Sym(s) = i {
                *s = f(*s);
            }
        };
        match self {
            OpKind::Rope { start, .. }
            | OpKind::Sdpa { start, .. }
            | OpKind::CacheUpdate { start, .. } => m(start),
            OpKind::Reshape { shape } | OpKind::Full { shape, .. } | OpKind::Expand { shape } => {
                shape.iter_mut().for_each(m)
            }
            OpKind::Slice { start, end, .. } | OpKind::Arange { start, end, .. } => {
                m(start);
                m(end)
            }
            OpKind::Select { index, .. } => m(index),
            _ => {}
        }
    }
}

impl OpKind {
    /// Name plus variant, e.g. `linear[q4g32,dq8]`, `elementwise[add]`.
    pub fn label(&self) -> String {
        let w = |w: &Weight| match w {
            Weight::F32 => "f32".to_string(),
            Weight::Q4 { group } => format!("q4g{group}"),
            Weight::Q8 { group } => format!("q8g{group}"),
        };
        match self {
            OpKind::Unary(u) => format!("elementwise[{}]", format!("{u:?}").to_lowercase()),
            OpKind::Binary(b) => format!("elementwise[{}]", format!("{b:?}").to_lowercase()),
            OpKind::BinaryScalar { op, .. } => {
                format!("elementwise[{}_scalar]", format!("{op:?}").to_lowercase())
            }
            OpKind::Where => "elementwise[where]".into(),
            OpKind::Clamp { .. } => "elementwise[clamp]".into(),
            OpKind::ElementwiseChain { steps } => format!("elementwise[{}]", chain_label(steps)),
            OpKind::RmsNormChain { steps, .. } => format!("rms_norm+[{}]", chain_label(steps)),
            OpKind::RmsNormRope { .. } => "rms_norm+rope".into(),
            OpKind::Cast => "elementwise[cast]".into(),
            OpKind::Linear {
                weight, act_quant, ..
            } => {
                format!(
                    "linear[{}{}]",
                    w(weight),
                    match act_quant {
                        ActQuant::None => "",
                        ActQuant::Torchao => ",dq8",
                        ActQuant::Xnnpack => ",dq8-xnn",
                    }
                )
            }
            OpKind::Embedding { weight } => format!("embedding[{}]", w(weight)),
            OpKind::MatMul { transpose_b: true } => "matmul[bt]".into(),
            OpKind::Sum { .. } => "reduce[sum]".into(),
            OpKind::Arange { .. } => "full[arange]".into(),
            OpKind::Permute { .. } => "layout[permute]".into(),
            OpKind::Slice { .. } => "layout[slice]".into(),
            OpKind::Select { .. } => "layout[select]".into(),
            OpKind::Concat { .. } => "layout[concat]".into(),
            OpKind::Expand { .. } => "layout[expand]".into(),
            OpKind::IndexSelect { .. } => "layout[index_select]".into(),
            OpKind::Copy => "layout[copy]".into(),
            k => k.name().to_string(),
        }
    }
}

/// A chain's steps by name: `add+clamp`.
fn chain_label(steps: &[ChainStep]) -> String {
    let names: Vec<String> = steps
        .iter()
        .map(|st| match st {
            ChainStep::Unary(u) => format!("{u:?}").to_lowercase(),
            ChainStep::Binary { op, .. } => format!("{op:?}").to_lowercase(),
            ChainStep::Scalar { op, .. } => format!("{op:?}_scalar").to_lowercase(),
            ChainStep::Clamp { .. } => "clamp".into(),
        })
        .collect();
    names.join("+")
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for n in &self.nodes {
            match n {
                Node::Op(o) => writeln!(f, "{:?} <- {} {:?}", o.outputs, o.kind.label(), o.inputs)?,
                Node::Sym(s) => writeln!(f, "{s:?}")?,
            }
        }
        Ok(())
    }
}
