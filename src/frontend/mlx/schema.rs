//! The MLX delegate's node schema, generated from executorch 1.5.1's
//! `backends/mlx/serialization/schema.fbs` (plus the Software Mansion fork's `CumMaxNode`) by
//! `gen_schema.py` beside this file: regenerate rather than edit. Fields are in declaration order,
//! which is FlatBuffers slot order.

/// One MLX op-node table type (`OpNode` union member), named as in the schema without `Node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeKind {
    Noop,
    IdCopy,
    Addmm,
    ItemInt,
    ExpandDims,
    Tile,
    TakeAlongAxis,
    Take,
    RMSNorm,
    LayerNorm,
    Rope,
    Sdpa,
    Add,
    AddInt,
    SubtractInt,
    MultiplyInt,
    FloorDivideInt,
    SymSize,
    Multiply,
    Divide,
    Subtract,
    Conv1D,
    Conv2D,
    Conv3D,
    Gelu,
    ARange,
    Silu,
    Sigmoid,
    Tanh,
    Squeeze,
    Split,
    Rsqrt,
    Maximum,
    Minimum,
    Log,
    Softmax,
    BroadcastTo,
    Pad,
    Where,
    Reshape,
    Transpose,
    AsStrided,
    Contiguous,
    Gather,
    Slice,
    AsType,
    Concatenate,
    Full,
    FullLike,
    Argmax,
    SliceUpdate,
    IndexCopy,
    Dequantize,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Equal,
    NotEqual,
    LogicalNot,
    LogicalAnd,
    LogicalOr,
    Tri,
    Tril,
    Triu,
    Floor,
    Ceil,
    Square,
    Exp,
    Sin,
    Cos,
    Tan,
    Arcsin,
    Arccos,
    Arctan,
    Sinh,
    Cosh,
    Arcsinh,
    Arccosh,
    Arctanh,
    Log2,
    Log10,
    Log1p,
    Erf,
    Expm1,
    Round,
    Reciprocal,
    Sqrt,
    Abs,
    Neg,
    Atan2,
    LogAddExp,
    FloorDivide,
    Power,
    LogSumExp,
    Sum,
    Mean,
    Var,
    Std,
    Prod,
    Max,
    Min,
    Argmin,
    Median,
    ModInt,
    Remainder,
    ConvTranspose1D,
    ConvTranspose2D,
    ConvTranspose3D,
    Clip,
    Cumsum,
    Stack,
    Sign,
    Any,
    All,
    Repeat,
    Sort,
    Argsort,
    Partition,
    ArgPartition,
    QuantizedMatmul,
    ScatterAdd,
    GatherMm,
    GatherQmm,
    Scan,
    MetalKernel,
    BitwiseInvert,
    Roll,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
    If,
    RandomBits,
    UpdateAndAttend,
    Trunc,
    Flip,
    CumMax,
}

/// How a field is stored and what it means; drives validation of every node table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    Tid,
    Vid,
    IntOrVid,
    FloatOrVid,
    VidOrTid,
    IntOrVidOrTid,
    I32,
    U64,
    F32,
    Bool,
    ScalarType,
    ChainIdxI32,
    ChainIdxU32,
    Str,
    TidVec,
    IntOrVidVec,
    I32Vec,
    I8Vec,
    StrVec,
}

/// A field's value when it is absent from the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Dflt {
    /// Offsets, structs and `= null` scalars: absent means "none".
    Absent,
    Zero,
    Int(i64),
    Float(f64),
    Bool(bool),
}

#[derive(Debug)]
pub(crate) struct Field {
    pub name: &'static str,
    pub ty: Ty,
    pub required: bool,
    pub default: Dflt,
}

const fn field(name: &'static str, ty: Ty, required: bool, default: Dflt) -> Field {
    Field {
        name,
        ty,
        required,
        default,
    }
}

impl NodeKind {
    pub const ALL: [NodeKind; 137] = [
        NodeKind::Noop,
        NodeKind::IdCopy,
        NodeKind::Addmm,
        NodeKind::ItemInt,
        NodeKind::ExpandDims,
        NodeKind::Tile,
        NodeKind::TakeAlongAxis,
        NodeKind::Take,
        NodeKind::RMSNorm,
        NodeKind::LayerNorm,
        NodeKind::Rope,
        NodeKind::Sdpa,
        NodeKind::Add,
        NodeKind::AddInt,
        NodeKind::SubtractInt,
        NodeKind::MultiplyInt,
        NodeKind::FloorDivideInt,
        NodeKind::SymSize,
        NodeKind::Multiply,
        NodeKind::Divide,
        NodeKind::Subtract,
        NodeKind::Conv1D,
        NodeKind::Conv2D,
        NodeKind::Conv3D,
        NodeKind::Gelu,
        NodeKind::ARange,
        NodeKind::Silu,
        NodeKind::Sigmoid,
        NodeKind::Tanh,
        NodeKind::Squeeze,
        NodeKind::Split,
        NodeKind::Rsqrt,
        NodeKind::Maximum,
        NodeKind::Minimum,
        NodeKind::Log,
        NodeKind::Softmax,
        NodeKind::BroadcastTo,
        NodeKind::Pad,
        NodeKind::Where,
        NodeKind::Reshape,
        NodeKind::Transpose,
        NodeKind::AsStrided,
        NodeKind::Contiguous,
        NodeKind::Gather,
        NodeKind::Slice,
        NodeKind::AsType,
        NodeKind::Concatenate,
        NodeKind::Full,
        NodeKind::FullLike,
        NodeKind::Argmax,
        NodeKind::SliceUpdate,
        NodeKind::IndexCopy,
        NodeKind::Dequantize,
        NodeKind::Less,
        NodeKind::LessEqual,
        NodeKind::Greater,
        NodeKind::GreaterEqual,
        NodeKind::Equal,
        NodeKind::NotEqual,
        NodeKind::LogicalNot,
        NodeKind::LogicalAnd,
        NodeKind::LogicalOr,
        NodeKind::Tri,
        NodeKind::Tril,
        NodeKind::Triu,
        NodeKind::Floor,
        NodeKind::Ceil,
        NodeKind::Square,
        NodeKind::Exp,
        NodeKind::Sin,
        NodeKind::Cos,
        NodeKind::Tan,
        NodeKind::Arcsin,
        NodeKind::Arccos,
        NodeKind::Arctan,
        NodeKind::Sinh,
        NodeKind::Cosh,
        NodeKind::Arcsinh,
        NodeKind::Arccosh,
        NodeKind::Arctanh,
        NodeKind::Log2,
        NodeKind::Log10,
        NodeKind::Log1p,
        NodeKind::Erf,
        NodeKind::Expm1,
        NodeKind::Round,
        NodeKind::Reciprocal,
        NodeKind::Sqrt,
        NodeKind::Abs,
        NodeKind::Neg,
        NodeKind::Atan2,
        NodeKind::LogAddExp,
        NodeKind::FloorDivide,
        NodeKind::Power,
        NodeKind::LogSumExp,
        NodeKind::Sum,
        NodeKind::Mean,
        NodeKind::Var,
        NodeKind::Std,
        NodeKind::Prod,
        NodeKind::Max,
        NodeKind::Min,
        NodeKind::Argmin,
        NodeKind::Median,
        NodeKind::ModInt,
        NodeKind::Remainder,
        NodeKind::ConvTranspose1D,
        NodeKind::ConvTranspose2D,
        NodeKind::ConvTranspose3D,
        NodeKind::Clip,
        NodeKind::Cumsum,
        NodeKind::Stack,
        NodeKind::Sign,
        NodeKind::Any,
        NodeKind::All,
        NodeKind::Repeat,
        NodeKind::Sort,
        NodeKind::Argsort,
        NodeKind::Partition,
        NodeKind::ArgPartition,
        NodeKind::QuantizedMatmul,
        NodeKind::ScatterAdd,
        NodeKind::GatherMm,
        NodeKind::GatherQmm,
        NodeKind::Scan,
        NodeKind::MetalKernel,
        NodeKind::BitwiseInvert,
        NodeKind::Roll,
        NodeKind::BitwiseAnd,
        NodeKind::BitwiseOr,
        NodeKind::BitwiseXor,
        NodeKind::If,
        NodeKind::RandomBits,
        NodeKind::UpdateAndAttend,
        NodeKind::Trunc,
        NodeKind::Flip,
        NodeKind::CumMax,
    ];

    /// The schema's table name, e.g. `RMSNormNode`.
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::Noop => "NoopNode",
            NodeKind::IdCopy => "IdCopyNode",
            NodeKind::Addmm => "AddmmNode",
            NodeKind::ItemInt => "ItemIntNode",
            NodeKind::ExpandDims => "ExpandDimsNode",
            NodeKind::Tile => "TileNode",
            NodeKind::TakeAlongAxis => "TakeAlongAxisNode",
            NodeKind::Take => "TakeNode",
            NodeKind::RMSNorm => "RMSNormNode",
            NodeKind::LayerNorm => "LayerNormNode",
            NodeKind::Rope => "RopeNode",
            NodeKind::Sdpa => "SdpaNode",
            NodeKind::Add => "AddNode",
            NodeKind::AddInt => "AddIntNode",
            NodeKind::SubtractInt => "SubtractIntNode",
            NodeKind::MultiplyInt => "MultiplyIntNode",
            NodeKind::FloorDivideInt => "FloorDivideIntNode",
            NodeKind::SymSize => "SymSizeNode",
            NodeKind::Multiply => "MultiplyNode",
            NodeKind::Divide => "DivideNode",
            NodeKind::Subtract => "SubtractNode",
            NodeKind::Conv1D => "Conv1DNode",
            NodeKind::Conv2D => "Conv2DNode",
            NodeKind::Conv3D => "Conv3DNode",
            NodeKind::Gelu => "GeluNode",
            NodeKind::ARange => "ARangeNode",
            NodeKind::Silu => "SiluNode",
            NodeKind::Sigmoid => "SigmoidNode",
            NodeKind::Tanh => "TanhNode",
            NodeKind::Squeeze => "SqueezeNode",
            NodeKind::Split => "SplitNode",
            NodeKind::Rsqrt => "RsqrtNode",
            NodeKind::Maximum => "MaximumNode",
            NodeKind::Minimum => "MinimumNode",
            NodeKind::Log => "LogNode",
            NodeKind::Softmax => "SoftmaxNode",
            NodeKind::BroadcastTo => "BroadcastToNode",
            NodeKind::Pad => "PadNode",
            NodeKind::Where => "WhereNode",
            NodeKind::Reshape => "ReshapeNode",
            NodeKind::Transpose => "TransposeNode",
            NodeKind::AsStrided => "AsStridedNode",
            NodeKind::Contiguous => "ContiguousNode",
            NodeKind::Gather => "GatherNode",
            NodeKind::Slice => "SliceNode",
            NodeKind::AsType => "AsTypeNode",
            NodeKind::Concatenate => "ConcatenateNode",
            NodeKind::Full => "FullNode",
            NodeKind::FullLike => "FullLikeNode",
            NodeKind::Argmax => "ArgmaxNode",
            NodeKind::SliceUpdate => "SliceUpdateNode",
            NodeKind::IndexCopy => "IndexCopyNode",
            NodeKind::Dequantize => "DequantizeNode",
            NodeKind::Less => "LessNode",
            NodeKind::LessEqual => "LessEqualNode",
            NodeKind::Greater => "GreaterNode",
            NodeKind::GreaterEqual => "GreaterEqualNode",
            NodeKind::Equal => "EqualNode",
            NodeKind::NotEqual => "NotEqualNode",
            NodeKind::LogicalNot => "LogicalNotNode",
            NodeKind::LogicalAnd => "LogicalAndNode",
            NodeKind::LogicalOr => "LogicalOrNode",
            NodeKind::Tri => "TriNode",
            NodeKind::Tril => "TrilNode",
            NodeKind::Triu => "TriuNode",
            NodeKind::Floor => "FloorNode",
            NodeKind::Ceil => "CeilNode",
            NodeKind::Square => "SquareNode",
            NodeKind::Exp => "ExpNode",
            NodeKind::Sin => "SinNode",
            NodeKind::Cos => "CosNode",
            NodeKind::Tan => "TanNode",
            NodeKind::Arcsin => "ArcsinNode",
            NodeKind::Arccos => "ArccosNode",
            NodeKind::Arctan => "ArctanNode",
            NodeKind::Sinh => "SinhNode",
            NodeKind::Cosh => "CoshNode",
            NodeKind::Arcsinh => "ArcsinhNode",
            NodeKind::Arccosh => "ArccoshNode",
            NodeKind::Arctanh => "ArctanhNode",
            NodeKind::Log2 => "Log2Node",
            NodeKind::Log10 => "Log10Node",
            NodeKind::Log1p => "Log1pNode",
            NodeKind::Erf => "ErfNode",
            NodeKind::Expm1 => "Expm1Node",
            NodeKind::Round => "RoundNode",
            NodeKind::Reciprocal => "ReciprocalNode",
            NodeKind::Sqrt => "SqrtNode",
            NodeKind::Abs => "AbsNode",
            NodeKind::Neg => "NegNode",
            NodeKind::Atan2 => "Atan2Node",
            NodeKind::LogAddExp => "LogAddExpNode",
            NodeKind::FloorDivide => "FloorDivideNode",
            NodeKind::Power => "PowerNode",
            NodeKind::LogSumExp => "LogSumExpNode",
            NodeKind::Sum => "SumNode",
            NodeKind::Mean => "MeanNode",
            NodeKind::Var => "VarNode",
            NodeKind::Std => "StdNode",
            NodeKind::Prod => "ProdNode",
            NodeKind::Max => "MaxNode",
            NodeKind::Min => "MinNode",
            NodeKind::Argmin => "ArgminNode",
            NodeKind::Median => "MedianNode",
            NodeKind::ModInt => "ModIntNode",
            NodeKind::Remainder => "RemainderNode",
            NodeKind::ConvTranspose1D => "ConvTranspose1DNode",
            NodeKind::ConvTranspose2D => "ConvTranspose2DNode",
            NodeKind::ConvTranspose3D => "ConvTranspose3DNode",
            NodeKind::Clip => "ClipNode",
            NodeKind::Cumsum => "CumsumNode",
            NodeKind::Stack => "StackNode",
            NodeKind::Sign => "SignNode",
            NodeKind::Any => "AnyNode",
            NodeKind::All => "AllNode",
            NodeKind::Repeat => "RepeatNode",
            NodeKind::Sort => "SortNode",
            NodeKind::Argsort => "ArgsortNode",
            NodeKind::Partition => "PartitionNode",
            NodeKind::ArgPartition => "ArgPartitionNode",
            NodeKind::QuantizedMatmul => "QuantizedMatmulNode",
            NodeKind::ScatterAdd => "ScatterAddNode",
            NodeKind::GatherMm => "GatherMmNode",
            NodeKind::GatherQmm => "GatherQmmNode",
            NodeKind::Scan => "ScanNode",
            NodeKind::MetalKernel => "MetalKernelNode",
            NodeKind::BitwiseInvert => "BitwiseInvertNode",
            NodeKind::Roll => "RollNode",
            NodeKind::BitwiseAnd => "BitwiseAndNode",
            NodeKind::BitwiseOr => "BitwiseOrNode",
            NodeKind::BitwiseXor => "BitwiseXorNode",
            NodeKind::If => "IfNode",
            NodeKind::RandomBits => "RandomBitsNode",
            NodeKind::UpdateAndAttend => "UpdateAndAttendNode",
            NodeKind::Trunc => "TruncNode",
            NodeKind::Flip => "FlipNode",
            NodeKind::CumMax => "CumMaxNode",
        }
    }

    pub(crate) fn fields(self) -> &'static [Field] {
        use Dflt::*;
        match self {
            NodeKind::Noop => &[],
            NodeKind::IdCopy => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Addmm => {
                const F: &[Field] = &[
                    field("mat1", Ty::Tid, true, Absent),
                    field("mat2", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("bias", Ty::Tid, false, Absent),
                    field("alpha", Ty::F32, false, Float(1.0)),
                    field("beta", Ty::F32, false, Float(1.0)),
                ];
                F
            }
            NodeKind::ItemInt => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Vid, true, Absent),
                ];
                F
            }
            NodeKind::ExpandDims => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::Tile => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("reps", Ty::IntOrVidVec, true, Absent),
                ];
                F
            }
            NodeKind::TakeAlongAxis => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("indices", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::Take => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("index", Ty::IntOrVidOrTid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::RMSNorm => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("weight", Ty::Tid, false, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("eps", Ty::F32, false, Zero),
                ];
                F
            }
            NodeKind::LayerNorm => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("weight", Ty::Tid, false, Absent),
                    field("bias", Ty::Tid, false, Absent),
                    field("eps", Ty::F32, false, Zero),
                ];
                F
            }
            NodeKind::Rope => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("dims", Ty::I32, false, Zero),
                    field("offset", Ty::VidOrTid, true, Absent),
                    field("freqs", Ty::Tid, false, Absent),
                    field("traditional", Ty::Bool, false, Bool(false)),
                    field("base", Ty::F32, false, Float(500000.0)),
                    field("scale", Ty::F32, false, Float(1.0)),
                ];
                F
            }
            NodeKind::Sdpa => {
                const F: &[Field] = &[
                    field("q", Ty::Tid, true, Absent),
                    field("k", Ty::Tid, true, Absent),
                    field("v", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("scale", Ty::F32, false, Zero),
                    field("mask", Ty::Tid, false, Absent),
                    field("causal", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::Add => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::AddInt => {
                const F: &[Field] = &[
                    field("a", Ty::IntOrVid, true, Absent),
                    field("b", Ty::IntOrVid, true, Absent),
                    field("out", Ty::Vid, true, Absent),
                ];
                F
            }
            NodeKind::SubtractInt => {
                const F: &[Field] = &[
                    field("a", Ty::IntOrVid, true, Absent),
                    field("b", Ty::IntOrVid, true, Absent),
                    field("out", Ty::Vid, true, Absent),
                ];
                F
            }
            NodeKind::MultiplyInt => {
                const F: &[Field] = &[
                    field("a", Ty::IntOrVid, true, Absent),
                    field("b", Ty::IntOrVid, true, Absent),
                    field("out", Ty::Vid, true, Absent),
                ];
                F
            }
            NodeKind::FloorDivideInt => {
                const F: &[Field] = &[
                    field("a", Ty::IntOrVid, true, Absent),
                    field("b", Ty::IntOrVid, true, Absent),
                    field("out", Ty::Vid, true, Absent),
                ];
                F
            }
            NodeKind::SymSize => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("dim", Ty::I32, false, Zero),
                    field("out", Ty::Vid, true, Absent),
                ];
                F
            }
            NodeKind::Multiply => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Divide => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Subtract => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Conv1D => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("w", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("stride", Ty::I32, false, Int(1)),
                    field("padding", Ty::I32, false, Int(0)),
                    field("dilation", Ty::I32, false, Int(1)),
                    field("groups", Ty::I32, false, Int(1)),
                ];
                F
            }
            NodeKind::Conv2D => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("w", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("stride_h", Ty::I32, false, Int(1)),
                    field("stride_w", Ty::I32, false, Int(1)),
                    field("padding_h", Ty::I32, false, Int(0)),
                    field("padding_w", Ty::I32, false, Int(0)),
                    field("dilation_h", Ty::I32, false, Int(1)),
                    field("dilation_w", Ty::I32, false, Int(1)),
                    field("groups", Ty::I32, false, Int(1)),
                ];
                F
            }
            NodeKind::Conv3D => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("w", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("stride_d", Ty::I32, false, Int(1)),
                    field("stride_h", Ty::I32, false, Int(1)),
                    field("stride_w", Ty::I32, false, Int(1)),
                    field("padding_d", Ty::I32, false, Int(0)),
                    field("padding_h", Ty::I32, false, Int(0)),
                    field("padding_w", Ty::I32, false, Int(0)),
                    field("dilation_d", Ty::I32, false, Int(1)),
                    field("dilation_h", Ty::I32, false, Int(1)),
                    field("dilation_w", Ty::I32, false, Int(1)),
                    field("groups", Ty::I32, false, Int(1)),
                ];
                F
            }
            NodeKind::Gelu => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("approximate", Ty::Str, true, Absent),
                ];
                F
            }
            NodeKind::ARange => {
                const F: &[Field] = &[
                    field("out", Ty::Tid, true, Absent),
                    field("start", Ty::IntOrVid, true, Absent),
                    field("stop", Ty::IntOrVid, true, Absent),
                    field("step", Ty::IntOrVid, true, Absent),
                    field("scalar_type", Ty::ScalarType, false, Absent),
                ];
                F
            }
            NodeKind::Silu => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Sigmoid => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Tanh => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Squeeze => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("dims", Ty::I32Vec, false, Absent),
                ];
                F
            }
            NodeKind::Split => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("outs", Ty::TidVec, true, Absent),
                    field("sizes", Ty::IntOrVidVec, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::Rsqrt => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Maximum => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Minimum => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Log => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Softmax => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                    field("precise", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::BroadcastTo => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("shape", Ty::IntOrVidVec, true, Absent),
                ];
                F
            }
            NodeKind::Pad => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("pad_width", Ty::IntOrVidVec, true, Absent),
                    field("mode", Ty::Str, true, Absent),
                    field("constant_value", Ty::F32, false, Float(0.0)),
                ];
                F
            }
            NodeKind::Where => {
                const F: &[Field] = &[
                    field("condition", Ty::Tid, true, Absent),
                    field("x", Ty::Tid, true, Absent),
                    field("y", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Reshape => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("shape", Ty::IntOrVidVec, true, Absent),
                ];
                F
            }
            NodeKind::Transpose => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("perm", Ty::I32Vec, true, Absent),
                ];
                F
            }
            NodeKind::AsStrided => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("shape", Ty::IntOrVidVec, true, Absent),
                    field("strides", Ty::IntOrVidVec, true, Absent),
                    field("offset", Ty::U64, false, Int(0)),
                ];
                F
            }
            NodeKind::Contiguous => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Gather => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("indices", Ty::TidVec, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, true, Absent),
                    field("slice_sizes", Ty::I32Vec, true, Absent),
                ];
                F
            }
            NodeKind::Slice => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::IntOrVid, true, Absent),
                    field("start", Ty::IntOrVid, true, Absent),
                    field("stop", Ty::IntOrVid, true, Absent),
                    field("step", Ty::I32, false, Int(1)),
                ];
                F
            }
            NodeKind::AsType => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("scalar_type", Ty::ScalarType, false, Zero),
                ];
                F
            }
            NodeKind::Concatenate => {
                const F: &[Field] = &[
                    field("tensors", Ty::TidVec, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::Full => {
                const F: &[Field] = &[
                    field("out", Ty::Tid, true, Absent),
                    field("shape", Ty::IntOrVidVec, true, Absent),
                    field("v", Ty::FloatOrVid, true, Absent),
                    field("scalar_type", Ty::ScalarType, false, Zero),
                ];
                F
            }
            NodeKind::FullLike => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("v", Ty::FloatOrVid, true, Absent),
                    field("scalar_type", Ty::ScalarType, false, Absent),
                ];
                F
            }
            NodeKind::Argmax => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::SliceUpdate => {
                const F: &[Field] = &[
                    field("dst", Ty::Tid, true, Absent),
                    field("update", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::IntOrVid, true, Absent),
                    field("start", Ty::IntOrVid, true, Absent),
                    field("stop", Ty::IntOrVid, true, Absent),
                    field("step", Ty::I32, false, Int(1)),
                ];
                F
            }
            NodeKind::IndexCopy => {
                const F: &[Field] = &[
                    field("dst", Ty::Tid, true, Absent),
                    field("update", Ty::Tid, true, Absent),
                    field("indices", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::Dequantize => {
                const F: &[Field] = &[
                    field("w", Ty::Tid, true, Absent),
                    field("scales", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("biases", Ty::Tid, false, Absent),
                    field("group_size", Ty::I32, false, Zero),
                    field("bits", Ty::I32, false, Zero),
                    field("mode", Ty::Str, true, Absent),
                    field("global_scale", Ty::Tid, false, Absent),
                    field("dtype", Ty::ScalarType, false, Absent),
                ];
                F
            }
            NodeKind::Less => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::LessEqual => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Greater => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::GreaterEqual => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Equal => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::NotEqual => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::LogicalNot => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::LogicalAnd => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::LogicalOr => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Tri => {
                const F: &[Field] = &[
                    field("out", Ty::Tid, true, Absent),
                    field("n", Ty::IntOrVid, true, Absent),
                    field("m", Ty::IntOrVid, true, Absent),
                    field("k", Ty::I32, false, Int(0)),
                    field("scalar_type", Ty::ScalarType, false, Zero),
                ];
                F
            }
            NodeKind::Tril => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("k", Ty::I32, false, Int(0)),
                ];
                F
            }
            NodeKind::Triu => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("k", Ty::I32, false, Int(0)),
                ];
                F
            }
            NodeKind::Floor => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Ceil => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Square => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Exp => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Sin => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Cos => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Tan => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Arcsin => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Arccos => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Arctan => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Sinh => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Cosh => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Arcsinh => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Arccosh => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Arctanh => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Log2 => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Log10 => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Log1p => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Erf => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Expm1 => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Round => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("decimals", Ty::I32, false, Int(0)),
                ];
                F
            }
            NodeKind::Reciprocal => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Sqrt => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Abs => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Neg => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Atan2 => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::LogAddExp => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::FloorDivide => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Power => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::LogSumExp => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::Sum => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::Mean => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::Var => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                    field("ddof", Ty::I32, false, Int(0)),
                ];
                F
            }
            NodeKind::Std => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                    field("ddof", Ty::I32, false, Int(0)),
                ];
                F
            }
            NodeKind::Prod => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::Max => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::Min => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::Argmin => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::Median => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::ModInt => {
                const F: &[Field] = &[
                    field("a", Ty::IntOrVid, true, Absent),
                    field("b", Ty::IntOrVid, true, Absent),
                    field("out", Ty::Vid, true, Absent),
                ];
                F
            }
            NodeKind::Remainder => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::ConvTranspose1D => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("w", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("stride", Ty::I32, false, Int(1)),
                    field("padding", Ty::I32, false, Int(0)),
                    field("dilation", Ty::I32, false, Int(1)),
                    field("output_padding", Ty::I32, false, Int(0)),
                    field("groups", Ty::I32, false, Int(1)),
                ];
                F
            }
            NodeKind::ConvTranspose2D => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("w", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("stride_h", Ty::I32, false, Int(1)),
                    field("stride_w", Ty::I32, false, Int(1)),
                    field("padding_h", Ty::I32, false, Int(0)),
                    field("padding_w", Ty::I32, false, Int(0)),
                    field("dilation_h", Ty::I32, false, Int(1)),
                    field("dilation_w", Ty::I32, false, Int(1)),
                    field("output_padding_h", Ty::I32, false, Int(0)),
                    field("output_padding_w", Ty::I32, false, Int(0)),
                    field("groups", Ty::I32, false, Int(1)),
                ];
                F
            }
            NodeKind::ConvTranspose3D => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("w", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("stride_d", Ty::I32, false, Int(1)),
                    field("stride_h", Ty::I32, false, Int(1)),
                    field("stride_w", Ty::I32, false, Int(1)),
                    field("padding_d", Ty::I32, false, Int(0)),
                    field("padding_h", Ty::I32, false, Int(0)),
                    field("padding_w", Ty::I32, false, Int(0)),
                    field("dilation_d", Ty::I32, false, Int(1)),
                    field("dilation_h", Ty::I32, false, Int(1)),
                    field("dilation_w", Ty::I32, false, Int(1)),
                    field("output_padding_d", Ty::I32, false, Int(0)),
                    field("output_padding_h", Ty::I32, false, Int(0)),
                    field("output_padding_w", Ty::I32, false, Int(0)),
                    field("groups", Ty::I32, false, Int(1)),
                ];
                F
            }
            NodeKind::Clip => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("a_min", Ty::Tid, false, Absent),
                    field("a_max", Ty::Tid, false, Absent),
                ];
                F
            }
            NodeKind::Cumsum => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                    field("reverse", Ty::Bool, false, Bool(false)),
                    field("inclusive", Ty::Bool, false, Bool(true)),
                ];
                F
            }
            NodeKind::Stack => {
                const F: &[Field] = &[
                    field("tensors", Ty::TidVec, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Int(0)),
                ];
                F
            }
            NodeKind::Sign => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Any => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::All => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, false, Absent),
                    field("keepdims", Ty::Bool, false, Bool(false)),
                ];
                F
            }
            NodeKind::Repeat => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("repeats", Ty::IntOrVid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::Sort => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::Argsort => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::Partition => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("kth", Ty::IntOrVid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::ArgPartition => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("kth", Ty::IntOrVid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::QuantizedMatmul => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("w", Ty::Tid, true, Absent),
                    field("scales", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("biases", Ty::Tid, false, Absent),
                    field("group_size", Ty::I32, false, Zero),
                    field("bits", Ty::I32, false, Zero),
                    field("mode", Ty::Str, true, Absent),
                    field("transpose", Ty::Bool, false, Bool(true)),
                ];
                F
            }
            NodeKind::ScatterAdd => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("indices", Ty::Tid, true, Absent),
                    field("updates", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
            NodeKind::GatherMm => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("lhs_indices", Ty::Tid, false, Absent),
                    field("rhs_indices", Ty::Tid, false, Absent),
                    field("sorted_indices", Ty::Bool, false, Bool(false)),
                    field("sorted_indices_flag", Ty::IntOrVid, false, Absent),
                ];
                F
            }
            NodeKind::GatherQmm => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("w", Ty::Tid, true, Absent),
                    field("scales", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("mode", Ty::Str, true, Absent),
                    field("biases", Ty::Tid, false, Absent),
                    field("lhs_indices", Ty::Tid, false, Absent),
                    field("rhs_indices", Ty::Tid, false, Absent),
                    field("transpose", Ty::Bool, false, Bool(true)),
                    field("group_size", Ty::I32, false, Zero),
                    field("bits", Ty::I32, false, Zero),
                    field("sorted_indices", Ty::Bool, false, Bool(false)),
                    field("sorted_indices_flag", Ty::IntOrVid, false, Absent),
                ];
                F
            }
            NodeKind::Scan => {
                const F: &[Field] = &[
                    field("originals", Ty::TidVec, true, Absent),
                    field("sliced", Ty::TidVec, true, Absent),
                    field("outputs", Ty::TidVec, true, Absent),
                    field("carry", Ty::TidVec, true, Absent),
                    field("body_chain_idx", Ty::ChainIdxI32, false, Zero),
                    field("scan_axis", Ty::I32, false, Int(1)),
                ];
                F
            }
            NodeKind::MetalKernel => {
                const F: &[Field] = &[
                    field("name", Ty::Str, true, Absent),
                    field("source", Ty::Str, true, Absent),
                    field("inputs", Ty::TidVec, true, Absent),
                    field("outputs", Ty::TidVec, true, Absent),
                    field("grid", Ty::IntOrVidVec, true, Absent),
                    field("threadgroup", Ty::IntOrVidVec, true, Absent),
                    field("header", Ty::Str, false, Absent),
                    field("input_names", Ty::StrVec, false, Absent),
                    field("output_names", Ty::StrVec, false, Absent),
                    field("ensure_row_contiguous", Ty::Bool, false, Bool(true)),
                    field("atomic_outputs", Ty::Bool, false, Bool(false)),
                    field("output_shapes_flat", Ty::IntOrVidVec, false, Absent),
                    field("output_shape_lengths", Ty::I32Vec, false, Absent),
                    field("output_dtypes", Ty::I8Vec, false, Absent),
                    field("template_arg_names", Ty::StrVec, false, Absent),
                    field("template_arg_kinds", Ty::I8Vec, false, Absent),
                    field("template_arg_values", Ty::I32Vec, false, Absent),
                    field("init_value", Ty::F32, false, Absent),
                ];
                F
            }
            NodeKind::BitwiseInvert => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Roll => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("shift", Ty::IntOrVidVec, true, Absent),
                    field("axes", Ty::I32Vec, true, Absent),
                ];
                F
            }
            NodeKind::BitwiseAnd => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::BitwiseOr => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::BitwiseXor => {
                const F: &[Field] = &[
                    field("a", Ty::Tid, true, Absent),
                    field("b", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::If => {
                const F: &[Field] = &[
                    field("cond", Ty::IntOrVid, true, Absent),
                    field("then_chain_idx", Ty::ChainIdxU32, false, Zero),
                    field("else_chain_idx", Ty::ChainIdxU32, false, Zero),
                ];
                F
            }
            NodeKind::RandomBits => {
                const F: &[Field] = &[
                    field("out", Ty::Tid, true, Absent),
                    field("shape", Ty::IntOrVidVec, true, Absent),
                    field("seed", Ty::Vid, false, Absent),
                    field("width", Ty::I32, false, Int(4)),
                ];
                F
            }
            NodeKind::UpdateAndAttend => {
                const F: &[Field] = &[
                    field("q", Ty::Tid, true, Absent),
                    field("k", Ty::Tid, true, Absent),
                    field("v", Ty::Tid, true, Absent),
                    field("position", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("layer_id", Ty::I32, false, Absent),
                    field("scale", Ty::F32, false, Absent),
                    field("out_dtype", Ty::ScalarType, false, Absent),
                ];
                F
            }
            NodeKind::Trunc => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                ];
                F
            }
            NodeKind::Flip => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axes", Ty::I32Vec, true, Absent),
                ];
                F
            }
            NodeKind::CumMax => {
                const F: &[Field] = &[
                    field("x", Ty::Tid, true, Absent),
                    field("out", Ty::Tid, true, Absent),
                    field("axis", Ty::I32, false, Zero),
                ];
                F
            }
        }
    }
}

/// `OpNode` union members of executorch 1.5.1 in tag order (tag = index + 1): upstream's
/// append-only list, with `TruncNode` (135) and `FlipNode` (136) appended by the wheel.
pub(crate) const UPSTREAM_1_5_1: [NodeKind; 136] = [
    NodeKind::Noop,
    NodeKind::IdCopy,
    NodeKind::Addmm,
    NodeKind::ItemInt,
    NodeKind::ExpandDims,
    NodeKind::Tile,
    NodeKind::TakeAlongAxis,
    NodeKind::Take,
    NodeKind::RMSNorm,
    NodeKind::LayerNorm,
    NodeKind::Rope,
    NodeKind::Sdpa,
    NodeKind::Add,
    NodeKind::AddInt,
    NodeKind::SubtractInt,
    NodeKind::MultiplyInt,
    NodeKind::FloorDivideInt,
    NodeKind::SymSize,
    NodeKind::Multiply,
    NodeKind::Divide,
    NodeKind::Subtract,
    NodeKind::Conv1D,
    NodeKind::Conv2D,
    NodeKind::Conv3D,
    NodeKind::Gelu,
    NodeKind::ARange,
    NodeKind::Silu,
    NodeKind::Sigmoid,
    NodeKind::Tanh,
    NodeKind::Squeeze,
    NodeKind::Split,
    NodeKind::Rsqrt,
    NodeKind::Maximum,
    NodeKind::Minimum,
    NodeKind::Log,
    NodeKind::Softmax,
    NodeKind::BroadcastTo,
    NodeKind::Pad,
    NodeKind::Where,
    NodeKind::Reshape,
    NodeKind::Transpose,
    NodeKind::AsStrided,
    NodeKind::Contiguous,
    NodeKind::Gather,
    NodeKind::Slice,
    NodeKind::AsType,
    NodeKind::Concatenate,
    NodeKind::Full,
    NodeKind::FullLike,
    NodeKind::Argmax,
    NodeKind::SliceUpdate,
    NodeKind::IndexCopy,
    NodeKind::Dequantize,
    NodeKind::Less,
    NodeKind::LessEqual,
    NodeKind::Greater,
    NodeKind::GreaterEqual,
    NodeKind::Equal,
    NodeKind::NotEqual,
    NodeKind::LogicalNot,
    NodeKind::LogicalAnd,
    NodeKind::LogicalOr,
    NodeKind::Tri,
    NodeKind::Tril,
    NodeKind::Triu,
    NodeKind::Floor,
    NodeKind::Ceil,
    NodeKind::Square,
    NodeKind::Exp,
    NodeKind::Sin,
    NodeKind::Cos,
    NodeKind::Tan,
    NodeKind::Arcsin,
    NodeKind::Arccos,
    NodeKind::Arctan,
    NodeKind::Sinh,
    NodeKind::Cosh,
    NodeKind::Arcsinh,
    NodeKind::Arccosh,
    NodeKind::Arctanh,
    NodeKind::Log2,
    NodeKind::Log10,
    NodeKind::Log1p,
    NodeKind::Erf,
    NodeKind::Expm1,
    NodeKind::Round,
    NodeKind::Reciprocal,
    NodeKind::Sqrt,
    NodeKind::Abs,
    NodeKind::Neg,
    NodeKind::Atan2,
    NodeKind::LogAddExp,
    NodeKind::FloorDivide,
    NodeKind::Power,
    NodeKind::LogSumExp,
    NodeKind::Sum,
    NodeKind::Mean,
    NodeKind::Var,
    NodeKind::Std,
    NodeKind::Prod,
    NodeKind::Max,
    NodeKind::Min,
    NodeKind::Argmin,
    NodeKind::Median,
    NodeKind::ModInt,
    NodeKind::Remainder,
    NodeKind::ConvTranspose1D,
    NodeKind::ConvTranspose2D,
    NodeKind::ConvTranspose3D,
    NodeKind::Clip,
    NodeKind::Cumsum,
    NodeKind::Stack,
    NodeKind::Sign,
    NodeKind::Any,
    NodeKind::All,
    NodeKind::Repeat,
    NodeKind::Sort,
    NodeKind::Argsort,
    NodeKind::Partition,
    NodeKind::ArgPartition,
    NodeKind::QuantizedMatmul,
    NodeKind::ScatterAdd,
    NodeKind::GatherMm,
    NodeKind::GatherQmm,
    NodeKind::Scan,
    NodeKind::MetalKernel,
    NodeKind::BitwiseInvert,
    NodeKind::Roll,
    NodeKind::BitwiseAnd,
    NodeKind::BitwiseOr,
    NodeKind::BitwiseXor,
    NodeKind::If,
    NodeKind::RandomBits,
    NodeKind::UpdateAndAttend,
    NodeKind::Trunc,
    NodeKind::Flip,
];

/// The Software Mansion fork's union (software-mansion-labs/executorch, the exporter of the published
/// Gemma 4 MLX files): `CumMaxNode` inserted after `CumsumNode` (tag 112), so every later member is
/// upstream's tag + 1, ending at `RandomBitsNode` (134); no `UpdateAndAttend`, `Trunc` or `Flip`.
pub(crate) const SWM_FORK: [NodeKind; 134] = [
    NodeKind::Noop,
    NodeKind::IdCopy,
    NodeKind::Addmm,
    NodeKind::ItemInt,
    NodeKind::ExpandDims,
    NodeKind::Tile,
    NodeKind::TakeAlongAxis,
    NodeKind::Take,
    NodeKind::RMSNorm,
    NodeKind::LayerNorm,
    NodeKind::Rope,
    NodeKind::Sdpa,
    NodeKind::Add,
    NodeKind::AddInt,
    NodeKind::SubtractInt,
    NodeKind::MultiplyInt,
    NodeKind::FloorDivideInt,
    NodeKind::SymSize,
    NodeKind::Multiply,
    NodeKind::Divide,
    NodeKind::Subtract,
    NodeKind::Conv1D,
    NodeKind::Conv2D,
    NodeKind::Conv3D,
    NodeKind::Gelu,
    NodeKind::ARange,
    NodeKind::Silu,
    NodeKind::Sigmoid,
    NodeKind::Tanh,
    NodeKind::Squeeze,
    NodeKind::Split,
    NodeKind::Rsqrt,
    NodeKind::Maximum,
    NodeKind::Minimum,
    NodeKind::Log,
    NodeKind::Softmax,
    NodeKind::BroadcastTo,
    NodeKind::Pad,
    NodeKind::Where,
    NodeKind::Reshape,
    NodeKind::Transpose,
    NodeKind::AsStrided,
    NodeKind::Contiguous,
    NodeKind::Gather,
    NodeKind::Slice,
    NodeKind::AsType,
    NodeKind::Concatenate,
    NodeKind::Full,
    NodeKind::FullLike,
    NodeKind::Argmax,
    NodeKind::SliceUpdate,
    NodeKind::IndexCopy,
    NodeKind::Dequantize,
    NodeKind::Less,
    NodeKind::LessEqual,
    NodeKind::Greater,
    NodeKind::GreaterEqual,
    NodeKind::Equal,
    NodeKind::NotEqual,
    NodeKind::LogicalNot,
    NodeKind::LogicalAnd,
    NodeKind::LogicalOr,
    NodeKind::Tri,
    NodeKind::Tril,
    NodeKind::Triu,
    NodeKind::Floor,
    NodeKind::Ceil,
    NodeKind::Square,
    NodeKind::Exp,
    NodeKind::Sin,
    NodeKind::Cos,
    NodeKind::Tan,
    NodeKind::Arcsin,
    NodeKind::Arccos,
    NodeKind::Arctan,
    NodeKind::Sinh,
    NodeKind::Cosh,
    NodeKind::Arcsinh,
    NodeKind::Arccosh,
    NodeKind::Arctanh,
    NodeKind::Log2,
    NodeKind::Log10,
    NodeKind::Log1p,
    NodeKind::Erf,
    NodeKind::Expm1,
    NodeKind::Round,
    NodeKind::Reciprocal,
    NodeKind::Sqrt,
    NodeKind::Abs,
    NodeKind::Neg,
    NodeKind::Atan2,
    NodeKind::LogAddExp,
    NodeKind::FloorDivide,
    NodeKind::Power,
    NodeKind::LogSumExp,
    NodeKind::Sum,
    NodeKind::Mean,
    NodeKind::Var,
    NodeKind::Std,
    NodeKind::Prod,
    NodeKind::Max,
    NodeKind::Min,
    NodeKind::Argmin,
    NodeKind::Median,
    NodeKind::ModInt,
    NodeKind::Remainder,
    NodeKind::ConvTranspose1D,
    NodeKind::ConvTranspose2D,
    NodeKind::ConvTranspose3D,
    NodeKind::Clip,
    NodeKind::Cumsum,
    NodeKind::CumMax,
    NodeKind::Stack,
    NodeKind::Sign,
    NodeKind::Any,
    NodeKind::All,
    NodeKind::Repeat,
    NodeKind::Sort,
    NodeKind::Argsort,
    NodeKind::Partition,
    NodeKind::ArgPartition,
    NodeKind::QuantizedMatmul,
    NodeKind::ScatterAdd,
    NodeKind::GatherMm,
    NodeKind::GatherQmm,
    NodeKind::Scan,
    NodeKind::MetalKernel,
    NodeKind::BitwiseInvert,
    NodeKind::Roll,
    NodeKind::BitwiseAnd,
    NodeKind::BitwiseOr,
    NodeKind::BitwiseXor,
    NodeKind::If,
    NodeKind::RandomBits,
];
