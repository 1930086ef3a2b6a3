//! Tensors as the CPU runtime holds them, and the conversions kernels compute through.

use crate::pte::{Blob, ScalarType};
use half::{bf16, f16};
use std::borrow::Cow;

/// Element types the CPU runtime computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl DType {
    pub fn from_scalar(s: ScalarType) -> Option<DType> {
        Some(match s {
            ScalarType::Float => DType::F32,
            ScalarType::Double => DType::F64,
            ScalarType::Half => DType::F16,
            ScalarType::BFloat16 => DType::BF16,
            ScalarType::Long => DType::I64,
            ScalarType::Int => DType::I32,
            ScalarType::Short => DType::I16,
            ScalarType::Char | ScalarType::QInt8 => DType::I8,
            ScalarType::Byte | ScalarType::QUInt8 => DType::U8,
            ScalarType::Bool => DType::Bool,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
}

/// Where a live tensor's bytes are.
#[derive(Debug, Clone)]
pub enum Storage {
    Constant(Blob),
    Arena { arena: usize, offset: usize },
    Input(usize),
    Unset,
}

/// A live tensor: current sizes, the byte capacity its storage was planned for, and where it is.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub dtype: DType,
    pub sizes: Vec<usize>,
    pub max_bytes: usize,
    pub dim_order: Vec<u8>,
    pub storage: Storage,
}

impl Tensor {
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    /// True when the memory layout is the default contiguous (row-major) order.
    pub fn is_contiguous(&self) -> bool {
        self.dim_order
            .iter()
            .enumerate()
            .all(|(i, &d)| d as usize == i)
    }
}

/// A tensor owned by the caller: method inputs and outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub sizes: Vec<usize>,
    pub data: Vec<u8>,
}

impl HostTensor {
    pub fn from_f32(sizes: &[usize], v: &[f32]) -> HostTensor {
        HostTensor {
            dtype: DType::F32,
            sizes: sizes.to_vec(),
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
    pub fn from_i64(sizes: &[usize], v: &[i64]) -> HostTensor {
        HostTensor {
            dtype: DType::I64,
            sizes: sizes.to_vec(),
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
    pub fn to_f32(&self) -> Result<Vec<f32>, String> {
        Ok(to_f32(self.dtype, &self.data).into_owned())
    }
    pub fn to_i64(&self) -> Result<Vec<i64>, String> {
        if self.dtype.is_float() {
            return Err(format!(
                "expected an integer tensor, got {}",
                self.dtype.name()
            ));
        }
        Ok(to_i64(self.dtype, &self.data))
    }
    /// Converts to another dtype (integers narrow or widen; floats round).
    pub fn cast(&self, dtype: DType) -> HostTensor {
        let data = if self.dtype.is_float() || dtype.is_float() {
            from_f64(dtype, &to_f64(self.dtype, &self.data))
        } else {
            from_i64(dtype, &to_i64(self.dtype, &self.data))
        };
        HostTensor {
            dtype,
            sizes: self.sizes.clone(),
            data,
        }
    }
}

/// A kernel's input, detached from method memory (constants stay zero-copy).
#[derive(Debug, Clone)]
pub struct TensorIn {
    pub dtype: DType,
    pub sizes: Vec<usize>,
    pub data: Cow<'static, [u8]>,
    blob: Option<Blob>,
}

impl TensorIn {
    pub fn owned(dtype: DType, sizes: Vec<usize>, data: Vec<u8>) -> TensorIn {
        TensorIn {
            dtype,
            sizes,
            data: Cow::Owned(data),
            blob: None,
        }
    }
    pub fn borrowed(dtype: DType, sizes: Vec<usize>, blob: Blob) -> TensorIn {
        TensorIn {
            dtype,
            sizes,
            data: Cow::Owned(Vec::new()),
            blob: Some(blob),
        }
    }
    pub fn bytes(&self) -> &[u8] {
        match &self.blob {
            Some(b) => &b[..self.numel() * self.dtype.size()],
            None => &self.data,
        }
    }
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
    pub fn f32(&self) -> Cow<'_, [f32]> {
        to_f32(self.dtype, self.bytes())
    }
    pub fn f64(&self) -> Vec<f64> {
        to_f64(self.dtype, self.bytes())
    }
    pub fn i64(&self) -> Vec<i64> {
        to_i64(self.dtype, self.bytes())
    }
    pub fn bools(&self) -> Vec<bool> {
        to_f64(self.dtype, self.bytes())
            .iter()
            .map(|&x| x != 0.0)
            .collect()
    }
}

pub fn to_f32(dtype: DType, b: &[u8]) -> Cow<'_, [f32]> {
    match dtype {
        DType::F32 => match bytemuck::try_cast_slice::<u8, f32>(b) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => Cow::Owned(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
        },
        DType::F16 => Cow::Owned(
            b.chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        DType::BF16 => Cow::Owned(
            b.chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        _ => Cow::Owned(to_f64(dtype, b).into_iter().map(|x| x as f32).collect()),
    }
}

pub fn to_f64(dtype: DType, b: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F64 => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        DType::F32 | DType::F16 | DType::BF16 => {
            to_f32(dtype, b).iter().map(|&x| x as f64).collect()
        }
        _ => to_i64(dtype, b).into_iter().map(|x| x as f64).collect(),
    }
}

pub fn to_i64(dtype: DType, b: &[u8]) -> Vec<i64> {
    match dtype {
        DType::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        DType::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        DType::I16 => b
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
            .collect(),
        DType::I8 => b.iter().map(|&x| x as i8 as i64).collect(),
        DType::U8 => b.iter().map(|&x| x as i64).collect(),
        DType::Bool => b.iter().map(|&x| (x != 0) as i64).collect(),
        // Float to integer truncates toward zero, as a C cast does.
        _ => to_f64(dtype, b).into_iter().map(|x| x as i64).collect(),
    }
}

pub fn from_f32(dtype: DType, v: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => bytemuck::cast_slice(v).to_vec(),
        DType::F16 => v
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        DType::BF16 => v
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
        _ => from_f64(dtype, &v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
    }
}

pub fn from_f64(dtype: DType, v: &[f64]) -> Vec<u8> {
    match dtype {
        DType::F64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F32 => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        DType::F16 | DType::BF16 => {
            from_f32(dtype, &v.iter().map(|&x| x as f32).collect::<Vec<_>>())
        }
        DType::Bool => v.iter().map(|&x| (x != 0.0) as u8).collect(),
        _ => from_i64(dtype, &v.iter().map(|&x| x as i64).collect::<Vec<_>>()),
    }
}

pub fn from_i64(dtype: DType, v: &[i64]) -> Vec<u8> {
    match dtype {
        DType::I64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::I32 => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
        DType::I16 => v.iter().flat_map(|&x| (x as i16).to_le_bytes()).collect(),
        DType::I8 => v.iter().map(|&x| x as i8 as u8).collect(),
        DType::U8 => v.iter().map(|&x| x as u8).collect(),
        DType::Bool => v.iter().map(|&x| (x != 0) as u8).collect(),
        _ => from_f64(dtype, &v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
    }
}
