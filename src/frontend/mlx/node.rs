//! Typed MLX op nodes: what one instruction of an `MLXGraph` chain does, with its operands as tensor
//! slots (`Tid`) and scalar value slots (`Vid`). Built from the schema-checked field values that
//! `fields` reads; lowering to the IR matches on these.

use super::fields::Value;
use super::schema::NodeKind;
use crate::pte::ScalarType;

/// A tensor slot. Slots are numbered constants, inputs, outputs, mutable buffers, then temps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tid(pub u32);

/// A scalar value slot (int64, double or bool at runtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vid(pub u32);

/// An integer known at export time or produced at runtime (e.g. a sequence length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrVid {
    Int(i64),
    Vid(Vid),
}

/// A float known at export time or produced at runtime.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FloatOrVid {
    Float(f64),
    Vid(Vid),
}

/// A scalar value slot or a tensor (RoPE's position offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VidOrTid {
    Vid(Vid),
    Tid(Tid),
}

/// An integer literal, a scalar value slot, or a tensor of indices (`TakeNode`'s index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrVidOrTid {
    Int(i64),
    Vid(Vid),
    Tid(Tid),
}

/// One instruction. Element-wise and reduction families share a variant and carry their `NodeKind`
/// as `op`; kinds this front end reads but does not decode are `Unsupported`.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Noop,
    IdCopy {
        x: Tid,
        out: Tid,
    },
    Contiguous {
        x: Tid,
        out: Tid,
    },
    /// `out = beta * bias + alpha * (mat1 @ mat2)`; a linear is `Transpose(W)` + `Addmm` without bias.
    Addmm {
        mat1: Tid,
        mat2: Tid,
        out: Tid,
        bias: Option<Tid>,
        alpha: f32,
        beta: f32,
    },
    ItemInt {
        x: Tid,
        out: Vid,
    },
    SymSize {
        a: Tid,
        dim: i32,
        out: Vid,
    },
    /// `AddInt`, `SubtractInt`, `MultiplyInt`, `FloorDivideInt`, `ModInt` on scalar slots.
    IntArith {
        op: NodeKind,
        a: IntOrVid,
        b: IntOrVid,
        out: Vid,
    },
    ExpandDims {
        x: Tid,
        out: Tid,
        axis: i32,
    },
    Tile {
        x: Tid,
        out: Tid,
        reps: Vec<IntOrVid>,
    },
    TakeAlongAxis {
        x: Tid,
        indices: Tid,
        out: Tid,
        axis: i32,
    },
    /// The embedding lookup is a `Take` with a tensor index; `x[:, -1]` a literal one.
    Take {
        x: Tid,
        out: Tid,
        index: IntOrVidOrTid,
        axis: i32,
    },
    RmsNorm {
        x: Tid,
        weight: Option<Tid>,
        out: Tid,
        eps: f32,
    },
    LayerNorm {
        x: Tid,
        out: Tid,
        weight: Option<Tid>,
        bias: Option<Tid>,
        eps: f32,
    },
    /// `traditional = false` pairs `x[i]` with `x[i + dims/2]`; `freqs`, when given, replaces
    /// `base^(-2i/dims)` by `1/freqs`.
    Rope {
        x: Tid,
        out: Tid,
        dims: i32,
        offset: VidOrTid,
        freqs: Option<Tid>,
        traditional: bool,
        base: f32,
        scale: f32,
    },
    /// BHSD attention; `causal` is lower-right aligned, GQA when K/V have fewer heads.
    Sdpa {
        q: Tid,
        k: Tid,
        v: Tid,
        out: Tid,
        scale: f32,
        mask: Option<Tid>,
        causal: bool,
    },
    UpdateAndAttend {
        q: Tid,
        k: Tid,
        v: Tid,
        position: Tid,
        out: Tid,
        layer_id: Option<i32>,
        scale: Option<f32>,
        out_dtype: Option<ScalarType>,
    },
    /// One-input element-wise ops (`Silu`, `Rsqrt`, `Exp`, `Neg`, `LogicalNot`, …).
    Unary {
        op: NodeKind,
        x: Tid,
        out: Tid,
    },
    /// Two-input broadcasting element-wise ops, comparisons and logical/bitwise ops.
    Binary {
        op: NodeKind,
        a: Tid,
        b: Tid,
        out: Tid,
    },
    Gelu {
        x: Tid,
        out: Tid,
        approximate: String,
    },
    Round {
        x: Tid,
        out: Tid,
        decimals: i32,
    },
    Softmax {
        x: Tid,
        out: Tid,
        axis: i32,
        precise: bool,
    },
    Where {
        condition: Tid,
        x: Tid,
        y: Tid,
        out: Tid,
    },
    Clip {
        x: Tid,
        out: Tid,
        a_min: Option<Tid>,
        a_max: Option<Tid>,
    },
    /// `Sum`, `Mean`, `Prod`, `Max`, `Min`, `LogSumExp`, `Any`, `All`, `Median`; empty axes = all.
    Reduce {
        op: NodeKind,
        x: Tid,
        out: Tid,
        axes: Vec<i32>,
        keepdims: bool,
    },
    /// `Var` or `Std`.
    Moment {
        op: NodeKind,
        x: Tid,
        out: Tid,
        axes: Vec<i32>,
        keepdims: bool,
        ddof: i32,
    },
    /// `Argmax` or `Argmin`.
    ArgReduce {
        op: NodeKind,
        x: Tid,
        out: Tid,
        axis: i32,
        keepdims: bool,
    },
    Cumsum {
        x: Tid,
        out: Tid,
        axis: i32,
        reverse: bool,
        inclusive: bool,
    },
    /// Only in the Software Mansion fork's schema.
    CumMax {
        x: Tid,
        out: Tid,
        axis: i32,
    },
    /// `Sort` or `Argsort`.
    Sort {
        op: NodeKind,
        x: Tid,
        out: Tid,
        axis: i32,
    },
    Squeeze {
        x: Tid,
        out: Tid,
        dims: Vec<i32>,
    },
    Reshape {
        x: Tid,
        out: Tid,
        shape: Vec<IntOrVid>,
    },
    Transpose {
        x: Tid,
        out: Tid,
        perm: Vec<i32>,
    },
    BroadcastTo {
        x: Tid,
        out: Tid,
        shape: Vec<IntOrVid>,
    },
    Slice {
        x: Tid,
        out: Tid,
        axis: IntOrVid,
        start: IntOrVid,
        stop: IntOrVid,
        step: i32,
    },
    /// Writes `update` into `dst[start:stop:step]` along `axis`; `out` may be `dst` (KV cache update).
    SliceUpdate {
        dst: Tid,
        update: Tid,
        out: Tid,
        axis: IntOrVid,
        start: IntOrVid,
        stop: IntOrVid,
        step: i32,
    },
    IndexCopy {
        dst: Tid,
        update: Tid,
        indices: Tid,
        out: Tid,
        axis: i32,
    },
    Split {
        x: Tid,
        outs: Vec<Tid>,
        sizes: Vec<IntOrVid>,
        axis: i32,
    },
    Concatenate {
        tensors: Vec<Tid>,
        out: Tid,
        axis: i32,
    },
    Stack {
        tensors: Vec<Tid>,
        out: Tid,
        axis: i32,
    },
    Repeat {
        x: Tid,
        out: Tid,
        repeats: IntOrVid,
        axis: i32,
    },
    Pad {
        x: Tid,
        out: Tid,
        pad_width: Vec<IntOrVid>,
        mode: String,
        constant_value: f32,
    },
    Gather {
        x: Tid,
        indices: Vec<Tid>,
        out: Tid,
        axes: Vec<i32>,
        slice_sizes: Vec<i32>,
    },
    ScatterAdd {
        x: Tid,
        indices: Tid,
        updates: Tid,
        out: Tid,
        axis: i32,
    },
    Roll {
        x: Tid,
        out: Tid,
        shift: Vec<IntOrVid>,
        axes: Vec<i32>,
    },
    Flip {
        x: Tid,
        out: Tid,
        axes: Vec<i32>,
    },
    AsType {
        x: Tid,
        out: Tid,
        dtype: ScalarType,
    },
    Full {
        out: Tid,
        shape: Vec<IntOrVid>,
        value: FloatOrVid,
        dtype: ScalarType,
    },
    FullLike {
        x: Tid,
        out: Tid,
        value: FloatOrVid,
        dtype: Option<ScalarType>,
    },
    ARange {
        out: Tid,
        start: IntOrVid,
        stop: IntOrVid,
        step: IntOrVid,
        dtype: Option<ScalarType>,
    },
    Tri {
        out: Tid,
        n: IntOrVid,
        m: IntOrVid,
        k: i32,
        dtype: ScalarType,
    },
    Tril {
        x: Tid,
        out: Tid,
        k: i32,
    },
    Triu {
        x: Tid,
        out: Tid,
        k: i32,
    },
    /// MLX-packed weights: `w` is uint32 `[N, K*bits/32]`, `W = scales*Q + biases` per group;
    /// `y = x @ W^T` when `transpose`.
    QuantizedMatmul {
        x: Tid,
        w: Tid,
        scales: Tid,
        out: Tid,
        biases: Option<Tid>,
        group_size: i32,
        bits: i32,
        mode: String,
        transpose: bool,
    },
    Dequantize {
        w: Tid,
        scales: Tid,
        out: Tid,
        biases: Option<Tid>,
        group_size: i32,
        bits: i32,
        mode: String,
        global_scale: Option<Tid>,
        dtype: Option<ScalarType>,
    },
    /// A kind known by name whose fields were validated but not decoded (convolutions, `Scan`,
    /// `If`, `MetalKernel`, gathered matmuls, …).
    Unsupported {
        tag: u8,
        name: &'static str,
        kind: NodeKind,
    },
}

impl Node {
    pub fn kind(&self) -> NodeKind {
        use NodeKind as K;
        match self {
            Node::Noop => K::Noop,
            Node::IdCopy { .. } => K::IdCopy,
            Node::Contiguous { .. } => K::Contiguous,
            Node::Addmm { .. } => K::Addmm,
            Node::ItemInt { .. } => K::ItemInt,
            Node::SymSize { .. } => K::SymSize,
            Node::ExpandDims { .. } => K::ExpandDims,
            Node::Tile { .. } => K::Tile,
            Node::TakeAlongAxis { .. } => K::TakeAlongAxis,
            Node::Take { .. } => K::Take,
            Node::RmsNorm { .. } => K::RMSNorm,
            Node::LayerNorm { .. } => K::LayerNorm,
            Node::Rope { .. } => K::Rope,
            Node::Sdpa { .. } => K::Sdpa,
            Node::UpdateAndAttend { .. } => K::UpdateAndAttend,
            Node::Gelu { .. } => K::Gelu,
            Node::Round { .. } => K::Round,
            Node::Softmax { .. } => K::Softmax,
            Node::Where { .. } => K::Where,
            Node::Clip { .. } => K::Clip,
            Node::Cumsum { .. } => K::Cumsum,
            Node::CumMax { .. } => K::CumMax,
            Node::Squeeze { .. } => K::Squeeze,
            Node::Reshape { .. } => K::Reshape,
            Node::Transpose { .. } => K::Transpose,
            Node::BroadcastTo { .. } => K::BroadcastTo,
            Node::Slice { .. } => K::Slice,
            Node::SliceUpdate { .. } => K::SliceUpdate,
            Node::IndexCopy { .. } => K::IndexCopy,
            Node::Split { .. } => K::Split,
            Node::Concatenate { .. } => K::Concatenate,
            Node::Stack { .. } => K::Stack,
            Node::Repeat { .. } => K::Repeat,
            Node::Pad { .. } => K::Pad,
            Node::Gather { .. } => K::Gather,
            Node::ScatterAdd { .. } => K::ScatterAdd,
            Node::Roll { .. } => K::Roll,
            Node::Flip { .. } => K::Flip,
            Node::AsType { .. } => K::AsType,
            Node::Full { .. } => K::Full,
            Node::FullLike { .. } => K::FullLike,
            Node::ARange { .. } => K::ARange,
            Node::Tri { .. } => K::Tri,
            Node::Tril { .. } => K::Tril,
            Node::Triu { .. } => K::Triu,
            Node::QuantizedMatmul { .. } => K::QuantizedMatmul,
            Node::Dequantize { .. } => K::Dequantize,
            Node::IntArith { op, .. }
            | Node::Unary { op, .. }
            | Node::Binary { op, .. }
            | Node::Reduce { op, .. }
            | Node::Moment { op, .. }
            | Node::ArgReduce { op, .. }
            | Node::Sort { op, .. } => *op,
            Node::Unsupported { kind, .. } => *kind,
        }
    }

    /// The schema's table name, e.g. `QuantizedMatmulNode`.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Builds the typed node from field values already checked against `kind`'s schema.
    pub(crate) fn from_fields(kind: NodeKind, tag: u8, values: &[Value]) -> Result<Node, String> {
        use NodeKind as K;
        let f = Fields { kind, v: values };
        let op = kind;
        Ok(match kind {
            K::Noop => Node::Noop,
            K::IdCopy => Node::IdCopy {
                x: f.tid(0)?,
                out: f.tid(1)?,
            },
            K::Contiguous => Node::Contiguous {
                x: f.tid(0)?,
                out: f.tid(1)?,
            },
            K::Addmm => Node::Addmm {
                mat1: f.tid(0)?,
                mat2: f.tid(1)?,
                out: f.tid(2)?,
                bias: f.opt_tid(3)?,
                alpha: f.f32(4)?,
                beta: f.f32(5)?,
            },
            K::ItemInt => Node::ItemInt {
                x: f.tid(0)?,
                out: f.vid(1)?,
            },
            K::SymSize => Node::SymSize {
                a: f.tid(0)?,
                dim: f.i32(1)?,
                out: f.vid(2)?,
            },
            K::AddInt | K::SubtractInt | K::MultiplyInt | K::FloorDivideInt | K::ModInt => {
                Node::IntArith {
                    op,
                    a: f.int_or_vid(0)?,
                    b: f.int_or_vid(1)?,
                    out: f.vid(2)?,
                }
            }
            K::ExpandDims => Node::ExpandDims {
                x: f.tid(0)?,
                out: f.tid(1)?,
                axis: f.i32(2)?,
            },
            K::Tile => Node::Tile {
                x: f.tid(0)?,
                out: f.tid(1)?,
                reps: f.int_or_vids(2)?,
            },
            K::TakeAlongAxis => Node::TakeAlongAxis {
                x: f.tid(0)?,
                indices: f.tid(1)?,
                out: f.tid(2)?,
                axis: f.i32(3)?,
            },
            K::Take => Node::Take {
                x: f.tid(0)?,
                out: f.tid(1)?,
                index: f.index(2)?,
                axis: f.i32(3)?,
            },
            K::RMSNorm => Node::RmsNorm {
                x: f.tid(0)?,
                weight: f.opt_tid(1)?,
                out: f.tid(2)?,
                eps: f.f32(3)?,
            },
            K::LayerNorm => Node::LayerNorm {
                x: f.tid(0)?,
                out: f.tid(1)?,
                weight: f.opt_tid(2)?,
                bias: f.opt_tid(3)?,
                eps: f.f32(4)?,
            },
            K::Rope => Node::Rope {
                x: f.tid(0)?,
                out: f.tid(1)?,
                dims: f.i32(2)?,
                offset: f.vid_or_tid(3)?,
                freqs: f.opt_tid(4)?,
                traditional: f.bool(5)?,
                base: f.f32(6)?,
                scale: f.f32(7)?,
            },
            K::Sdpa => Node::Sdpa {
                q: f.tid(0)?,
                k: f.tid(1)?,
                v: f.tid(2)?,
                out: f.tid(3)?,
                scale: f.f32(4)?,
                mask: f.opt_tid(5)?,
                causal: f.bool(6)?,
            },
            K::UpdateAndAttend => Node::UpdateAndAttend {
                q: f.tid(0)?,
                k: f.tid(1)?,
                v: f.tid(2)?,
                position: f.tid(3)?,
                out: f.tid(4)?,
                layer_id: f.opt_i32(5)?,
                scale: f.opt_f32(6)?,
                out_dtype: f.opt_dtype(7)?,
            },
            K::Silu
            | K::Sigmoid
            | K::Tanh
            | K::Rsqrt
            | K::Log
            | K::LogicalNot
            | K::BitwiseInvert
            | K::Floor
            | K::Ceil
            | K::Square
            | K::Exp
            | K::Sin
            | K::Cos
            | K::Tan
            | K::Arcsin
            | K::Arccos
            | K::Arctan
            | K::Sinh
            | K::Cosh
            | K::Arcsinh
            | K::Arccosh
            | K::Arctanh
            | K::Log2
            | K::Log10
            | K::Log1p
            | K::Erf
            | K::Expm1
            | K::Reciprocal
            | K::Sqrt
            | K::Abs
            | K::Neg
            | K::Sign
            | K::Trunc => Node::Unary {
                op,
                x: f.tid(0)?,
                out: f.tid(1)?,
            },
            K::Add
            | K::Multiply
            | K::Divide
            | K::Subtract
            | K::Maximum
            | K::Minimum
            | K::Less
            | K::LessEqual
            | K::Greater
            | K::GreaterEqual
            | K::Equal
            | K::NotEqual
            | K::LogicalAnd
            | K::LogicalOr
            | K::BitwiseAnd
            | K::BitwiseOr
            | K::BitwiseXor
            | K::Atan2
            | K::LogAddExp
            | K::FloorDivide
            | K::Remainder
            | K::Power => Node::Binary {
                op,
                a: f.tid(0)?,
                b: f.tid(1)?,
                out: f.tid(2)?,
            },
            K::Gelu => Node::Gelu {
                x: f.tid(0)?,
                out: f.tid(1)?,
                approximate: f.string(2)?,
            },
            K::Round => Node::Round {
                x: f.tid(0)?,
                out: f.tid(1)?,
                decimals: f.i32(2)?,
            },
            K::Softmax => Node::Softmax {
                x: f.tid(0)?,
                out: f.tid(1)?,
                axis: f.i32(2)?,
                precise: f.bool(3)?,
            },
            K::Where => Node::Where {
                condition: f.tid(0)?,
                x: f.tid(1)?,
                y: f.tid(2)?,
                out: f.tid(3)?,
            },
            K::Clip => Node::Clip {
                x: f.tid(0)?,
                out: f.tid(1)?,
                a_min: f.opt_tid(2)?,
                a_max: f.opt_tid(3)?,
            },
            K::Sum
            | K::Mean
            | K::Prod
            | K::Max
            | K::Min
            | K::LogSumExp
            | K::Any
            | K::All
            | K::Median => Node::Reduce {
                op,
                x: f.tid(0)?,
                out: f.tid(1)?,
                axes: f.i32s(2)?,
                keepdims: f.bool(3)?,
            },
            K::Var | K::Std => Node::Moment {
                op,
                x: f.tid(0)?,
                out: f.tid(1)?,
                axes: f.i32s(2)?,
                keepdims: f.bool(3)?,
                ddof: f.i32(4)?,
            },
            K::Argmax | K::Argmin => Node::ArgReduce {
                op,
                x: f.tid(0)?,
                out: f.tid(1)?,
                axis: f.i32(2)?,
                keepdims: f.bool(3)?,
            },
            K::Cumsum => Node::Cumsum {
                x: f.tid(0)?,
                out: f.tid(1)?,
                axis: f.i32(2)?,
                reverse: f.bool(3)?,
                inclusive: f.bool(4)?,
            },
            K::CumMax => Node::CumMax {
                x: f.tid(0)?,
                out: f.tid(1)?,
                axis: f.i32(2)?,
            },
            K::Sort | K::Argsort => Node::Sort {
                op,
                x: f.tid(0)?,
                out: f.tid(1)?,
                axis: f.i32(2)?,
            },
            K::Squeeze => Node::Squeeze {
                x: f.tid(0)?,
                out: f.tid(1)?,
                dims: f.i32s(2)?,
            },
            K::Reshape => Node::Reshape {
                x: f.tid(0)?,
                out: f.tid(1)?,
                shape: f.int_or_vids(2)?,
            },
            K::Transpose => Node::Transpose {
                x: f.tid(0)?,
                out: f.tid(1)?,
                perm: f.i32s(2)?,
            },
            K::BroadcastTo => Node::BroadcastTo {
                x: f.tid(0)?,
                out: f.tid(1)?,
                shape: f.int_or_vids(2)?,
            },
            K::Slice => Node::Slice {
                x: f.tid(0)?,
                out: f.tid(1)?,
                axis: f.int_or_vid(2)?,
                start: f.int_or_vid(3)?,
                stop: f.int_or_vid(4)?,
                step: f.i32(5)?,
            },
            K::SliceUpdate => Node::SliceUpdate {
                dst: f.tid(0)?,
                update: f.tid(1)?,
                out: f.tid(2)?,
                axis: f.int_or_vid(3)?,
                start: f.int_or_vid(4)?,
                stop: f.int_or_vid(5)?,
                step: f.i32(6)?,
            },
            K::IndexCopy => Node::IndexCopy {
                dst: f.tid(0)?,
                update: f.tid(1)?,
                indices: f.tid(2)?,
                out: f.tid(3)?,
                axis: f.i32(4)?,
            },
            K::Split => Node::Split {
                x: f.tid(0)?,
                outs: f.tids(1)?,
                sizes: f.int_or_vids(2)?,
                axis: f.i32(3)?,
            },
            K::Concatenate => Node::Concatenate {
                tensors: f.tids(0)?,
                out: f.tid(1)?,
                axis: f.i32(2)?,
            },
            K::Stack => Node::Stack {
                tensors: f.tids(0)?,
                out: f.tid(1)?,
                axis: f.i32(2)?,
            },
            K::Repeat => Node::Repeat {
                x: f.tid(0)?,
                out: f.tid(1)?,
                repeats: f.int_or_vid(2)?,
                axis: f.i32(3)?,
            },
            K::Pad => Node::Pad {
                x: f.tid(0)?,
                out: f.tid(1)?,
                pad_width: f.int_or_vids(2)?,
                mode: f.string(3)?,
                constant_value: f.f32(4)?,
            },
            K::Gather => Node::Gather {
                x: f.tid(0)?,
                indices: f.tids(1)?,
                out: f.tid(2)?,
                axes: f.i32s(3)?,
                slice_sizes: f.i32s(4)?,
            },
            K::ScatterAdd => Node::ScatterAdd {
                x: f.tid(0)?,
                indices: f.tid(1)?,
                updates: f.tid(2)?,
                out: f.tid(3)?,
                axis: f.i32(4)?,
            },
            K::Roll => Node::Roll {
                x: f.tid(0)?,
                out: f.tid(1)?,
                shift: f.int_or_vids(2)?,
                axes: f.i32s(3)?,
            },
            K::Flip => Node::Flip {
                x: f.tid(0)?,
                out: f.tid(1)?,
                axes: f.i32s(2)?,
            },
            K::AsType => Node::AsType {
                x: f.tid(0)?,
                out: f.tid(1)?,
                dtype: f.dtype(2)?,
            },
            K::Full => Node::Full {
                out: f.tid(0)?,
                shape: f.int_or_vids(1)?,
                value: f.float_or_vid(2)?,
                dtype: f.dtype(3)?,
            },
            K::FullLike => Node::FullLike {
                x: f.tid(0)?,
                out: f.tid(1)?,
                value: f.float_or_vid(2)?,
                dtype: f.opt_dtype(3)?,
            },
            K::ARange => Node::ARange {
                out: f.tid(0)?,
                start: f.int_or_vid(1)?,
                stop: f.int_or_vid(2)?,
                step: f.int_or_vid(3)?,
                dtype: f.opt_dtype(4)?,
            },
            K::Tri => Node::Tri {
                out: f.tid(0)?,
                n: f.int_or_vid(1)?,
                m: f.int_or_vid(2)?,
                k: f.i32(3)?,
                dtype: f.dtype(4)?,
            },
            K::Tril => Node::Tril {
                x: f.tid(0)?,
                out: f.tid(1)?,
                k: f.i32(2)?,
            },
            K::Triu => Node::Triu {
                x: f.tid(0)?,
                out: f.tid(1)?,
                k: f.i32(2)?,
            },
            K::QuantizedMatmul => Node::QuantizedMatmul {
                x: f.tid(0)?,
                w: f.tid(1)?,
                scales: f.tid(2)?,
                out: f.tid(3)?,
                biases: f.opt_tid(4)?,
                group_size: f.i32(5)?,
                bits: f.i32(6)?,
                mode: f.string(7)?,
                transpose: f.bool(8)?,
            },
            K::Dequantize => Node::Dequantize {
                w: f.tid(0)?,
                scales: f.tid(1)?,
                out: f.tid(2)?,
                biases: f.opt_tid(3)?,
                group_size: f.i32(4)?,
                bits: f.i32(5)?,
                mode: f.string(6)?,
                global_scale: f.opt_tid(7)?,
                dtype: f.opt_dtype(8)?,
            },
            K::Conv1D
            | K::Conv2D
            | K::Conv3D
            | K::ConvTranspose1D
            | K::ConvTranspose2D
            | K::ConvTranspose3D
            | K::AsStrided
            | K::Partition
            | K::ArgPartition
            | K::GatherMm
            | K::GatherQmm
            | K::Scan
            | K::MetalKernel
            | K::If
            | K::RandomBits => Node::Unsupported {
                tag,
                name: kind.name(),
                kind,
            },
        })
    }
}

/// Typed access to a node's field values by slot. A type mismatch here means the schema table and
/// this decoder disagree, which is a bug in Pteria rather than in the file.
struct Fields<'a> {
    kind: NodeKind,
    v: &'a [Value],
}

/// Accessors for fields whose slot must hold one `Value` variant (`required`), may be absent
/// (`optional`), or is a list where absent means empty (`list`).
macro_rules! accessors {
    ($($kind:ident $name:ident -> $ty:ty: $variant:ident, $want:literal;)*) => {$(
        accessors!(@$kind $name, $ty, $variant, $want);
    )*};
    (@required $name:ident, $ty:ty, $variant:ident, $want:literal) => {
        fn $name(&self, i: usize) -> Result<$ty, String> {
            match self.get(i)? {
                Value::$variant(x) => Ok(x.clone()),
                _ => Err(self.bug(i, $want)),
            }
        }
    };
    (@optional $name:ident, $ty:ty, $variant:ident, $want:literal) => {
        fn $name(&self, i: usize) -> Result<Option<$ty>, String> {
            match self.get(i)? {
                Value::$variant(x) => Ok(Some(x.clone())),
                Value::Absent => Ok(None),
                _ => Err(self.bug(i, $want)),
            }
        }
    };
    (@list $name:ident, $ty:ty, $variant:ident, $want:literal) => {
        fn $name(&self, i: usize) -> Result<Vec<$ty>, String> {
            match self.get(i)? {
                Value::$variant(x) => Ok(x.clone()),
                Value::Absent => Ok(Vec::new()),
                _ => Err(self.bug(i, $want)),
            }
        }
    };
}

impl Fields<'_> {
    accessors! {
        required tid -> Tid: Tid, "a Tid";
        optional opt_tid -> Tid: Tid, "an optional Tid";
        required vid -> Vid: Vid, "a Vid";
        required bool -> bool: Bool, "a bool";
        required string -> String: Str, "a string";
        optional opt_dtype -> ScalarType: ScalarType, "a ScalarType";
        required int_or_vid -> IntOrVid: IntOrVid, "an IntOrVid";
        required float_or_vid -> FloatOrVid: FloatOrVid, "a FloatOrVid";
        required vid_or_tid -> VidOrTid: VidOrTid, "a VidOrTid";
        required index -> IntOrVidOrTid: IntOrVidOrTid, "an IntOrVidOrTid";
        list tids -> Tid: Tids, "a [Tid]";
        list int_or_vids -> IntOrVid: IntOrVids, "an [IntOrVid]";
        list i32s -> i32: I32s, "an [int32]";
    }

    fn get(&self, i: usize) -> Result<&Value, String> {
        self.v.get(i).ok_or_else(|| self.bug(i, "a field"))
    }

    fn bug(&self, i: usize, want: &str) -> String {
        format!(
            "internal error: {} field slot {i} does not hold {want} (decoder and schema disagree)",
            self.kind.name()
        )
    }

    fn opt_i32(&self, i: usize) -> Result<Option<i32>, String> {
        match self.get(i)? {
            Value::Int(n) => i32::try_from(*n)
                .map(Some)
                .map_err(|_| self.bug(i, "an int32")),
            Value::Absent => Ok(None),
            _ => Err(self.bug(i, "an int32")),
        }
    }

    fn i32(&self, i: usize) -> Result<i32, String> {
        self.opt_i32(i)?.ok_or_else(|| self.bug(i, "an int32"))
    }

    fn opt_f32(&self, i: usize) -> Result<Option<f32>, String> {
        match self.get(i)? {
            // The schema's `float` fields are stored as f32; widening to f64 and back is exact.
            Value::Float(x) => Ok(Some(*x as f32)),
            Value::Absent => Ok(None),
            _ => Err(self.bug(i, "a float")),
        }
    }

    fn f32(&self, i: usize) -> Result<f32, String> {
        self.opt_f32(i)?.ok_or_else(|| self.bug(i, "a float"))
    }

    fn dtype(&self, i: usize) -> Result<ScalarType, String> {
        self.opt_dtype(i)?
            .ok_or_else(|| self.bug(i, "a ScalarType"))
    }
}
