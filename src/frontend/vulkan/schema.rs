//! Owned, typed mirror of `backends/vulkan/serialization/schema.fbs` (namespace `vkgraph`).
//!
//! `read.rs` fills these from the flatbuffer after validating every id, enum and size, so code
//! downstream (the IR lowering) can index `values` and read constant bytes without re-checking.

use crate::pte::Blob;
use std::fmt;

/// `VkDataType : byte`. The values are the schema's; 8..=126 are unassigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VkDataType {
    Bool,
    Uint8,
    Int8,
    Int32,
    Float16,
    Float32,
    Float64,
    Int64,
    /// Only meaningful for `staging_datatype`: "same as `datatype`" (blobs from before the field).
    Unset,
}

impl VkDataType {
    pub fn from_code(code: i8) -> Option<Self> {
        use VkDataType::*;
        Some(match code {
            0 => Bool,
            1 => Uint8,
            2 => Int8,
            3 => Int32,
            4 => Float16,
            5 => Float32,
            6 => Float64,
            7 => Int64,
            127 => Unset,
            _ => return None,
        })
    }

    /// Bytes per element; `None` for `Unset`.
    pub fn size(self) -> Option<usize> {
        use VkDataType::*;
        match self {
            Bool | Uint8 | Int8 => Some(1),
            Float16 => Some(2),
            Int32 | Float32 => Some(4),
            Float64 | Int64 => Some(8),
            Unset => None,
        }
    }

    /// The schema's spelling, as `flatc --json` prints it.
    pub fn name(self) -> &'static str {
        use VkDataType::*;
        match self {
            Bool => "BOOL",
            Uint8 => "UINT8",
            Int8 => "INT8",
            Int32 => "INT32",
            Float16 => "FLOAT16",
            Float32 => "FLOAT32",
            Float64 => "FLOAT64",
            Int64 => "INT64",
            Unset => "UNSET",
        }
    }
}

impl fmt::Display for VkDataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `VkStorageType : ubyte`; values match upstream `utils::StorageType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VkStorageType {
    Buffer,
    Texture3d,
    Texture2d,
    /// The runtime chooses (upstream: texture 3D unless the tensor exceeds texture limits).
    Default,
}

impl VkStorageType {
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => VkStorageType::Buffer,
            1 => VkStorageType::Texture3d,
            2 => VkStorageType::Texture2d,
            255 => VkStorageType::Default,
            _ => return None,
        })
    }
}

/// `VkMemoryLayout : ubyte`; values match upstream `utils::GPUMemoryLayout` (7 is unassigned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VkMemoryLayout {
    TensorWidthPacked,
    TensorHeightPacked,
    TensorChannelsPacked,
    PackedInt8_4W4C,
    PackedInt8_4H4W,
    PackedInt8_4W,
    PackedInt8_4C,
    PackedInt8_4C1W,
    /// Upstream treats it as `PackedInt8_4C1W`.
    PackedInt8Conv2d,
    /// The runtime chooses.
    Default,
}

impl VkMemoryLayout {
    pub fn from_code(code: u8) -> Option<Self> {
        use VkMemoryLayout::*;
        Some(match code {
            0 => TensorWidthPacked,
            1 => TensorHeightPacked,
            2 => TensorChannelsPacked,
            3 => PackedInt8_4W4C,
            4 => PackedInt8_4H4W,
            5 => PackedInt8_4W,
            6 => PackedInt8_4C,
            8 => PackedInt8_4C1W,
            9 => PackedInt8Conv2d,
            255 => Default,
            _ => return None,
        })
    }
}

/// `VkTensor`. Dims are PyTorch (NCHW) order and, for dynamic dims, upper bounds: the runtime
/// allocates at these sizes once and resizes within them.
#[derive(Debug, Clone, PartialEq)]
pub struct VkTensor {
    pub datatype: VkDataType,
    pub dims: Vec<usize>,
    /// Index into `VkGraph::constants`; `None` (negative in the file) for a computed tensor.
    pub constant_id: Option<usize>,
    /// Shared allocation id; `None` (negative in the file) for a dedicated allocation.
    /// Constants ignore it (mutable-buffer constants such as KV caches still carry one).
    pub mem_obj_id: Option<usize>,
    pub storage_type: VkStorageType,
    pub memory_layout: VkMemoryLayout,
    /// Dtype of host-side input/output copies (`Unset` means `datatype`).
    pub staging_datatype: VkDataType,
}

impl VkTensor {
    /// Product of `dims`; `None` on overflow (never for a tensor `parse` returned).
    pub fn numel(&self) -> Option<usize> {
        self.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// `numel × datatype size`; `None` on overflow or an `Unset` datatype (never for a tensor
    /// `parse` returned).
    pub fn nbytes(&self) -> Option<usize> {
        self.numel()?.checked_mul(self.datatype.size()?)
    }
}

/// `VkValue`: one entry of the graph's flat value table. Operator args, inputs and outputs are
/// indexes into that table.
#[derive(Debug, Clone, PartialEq)]
pub enum VkValue {
    Null,
    Int(i64),
    Double(f64),
    Bool(bool),
    Tensor(VkTensor),
    /// Raw integers (unlike ExecuTorch's `IntList`, not value ids).
    IntList(Vec<i64>),
    DoubleList(Vec<f64>),
    BoolList(Vec<bool>),
    /// Value ids: tensor lists, multi-output op results, and shapes that contain `SymInt`s.
    ValueList(Vec<usize>),
    String(String),
    /// A run-time integer (sequence length, position) computed on the host; the payload is the
    /// serialized initial value (0 in current exports).
    SymInt(i32),
}

impl VkValue {
    /// The union member's name in the schema.
    pub fn kind(&self) -> &'static str {
        match self {
            VkValue::Null => "Null",
            VkValue::Int(_) => "Int",
            VkValue::Double(_) => "Double",
            VkValue::Bool(_) => "Bool",
            VkValue::Tensor(_) => "VkTensor",
            VkValue::IntList(_) => "IntList",
            VkValue::DoubleList(_) => "DoubleList",
            VkValue::BoolList(_) => "BoolList",
            VkValue::ValueList(_) => "ValueList",
            VkValue::String(_) => "String",
            VkValue::SymInt(_) => "SymInt",
        }
    }

    pub fn as_tensor(&self) -> Option<&VkTensor> {
        match self {
            VkValue::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// `OperatorCall`: run op `name` on `args` (value ids; by upstream convention the op schema's
/// arguments in order with defaults filled in, then the output value id last).
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorCall {
    /// Debug handle linking back to the exported graph node.
    pub node_id: u32,
    pub name: String,
    pub args: Vec<usize>,
}

/// `VkBytes`, resolved: `data` is exactly `length` bytes, a zero-copy view either of named data
/// (`offset == u64::MAX`, looked up by `named_key`) or of the blob's raw constant region.
#[derive(Debug, Clone)]
pub struct VkBytes {
    pub offset: u64,
    pub length: u64,
    pub named_key: Option<String>,
    pub data: Blob,
}

impl VkBytes {
    /// ExecuTorch's serializer marks named-data constants with this offset.
    pub const NAMED: u64 = u64::MAX;

    pub fn is_named(&self) -> bool {
        self.offset == Self::NAMED
    }
}

/// The `VH00` header in front of the flatbuffer. Offsets are relative to the blob's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VulkanHeader {
    pub flatbuffer_offset: usize,
    pub flatbuffer_size: usize,
    /// Start of the raw constant region (inline constants' `offset` is relative to it).
    pub bytes_offset: usize,
    /// 0 when every constant is named data.
    pub bytes_size: usize,
}

/// `VkGraph`, validated: every id is in range and every constant resolved.
#[derive(Debug, Clone)]
pub struct VkGraph {
    pub header: VulkanHeader,
    /// Schema version string ("0" in current exports).
    pub version: String,
    pub chain: Vec<OperatorCall>,
    pub values: Vec<VkValue>,
    /// Value ids of the delegate's inputs, in call order (tensors or `SymInt`s).
    pub input_ids: Vec<usize>,
    /// Value ids of the delegate's outputs (mutated buffers such as KV caches are not among them).
    pub output_ids: Vec<usize>,
    pub constants: Vec<VkBytes>,
    /// Custom shaders; the upstream serializer never writes any.
    pub shaders: Vec<VkBytes>,
    /// Applies to tensors whose own `storage_type` is `Default`.
    pub storage_type_override: VkStorageType,
    /// Applies to tensors whose own `memory_layout` is `Default`.
    pub memory_layout_override: VkMemoryLayout,
}
