//! CPU kernels, keyed by ExecuTorch operator name (`name.overload`): adding an op is adding one
//! function and one registry line in its family's file.
//!
//! Argument convention (ExecuTorch `KernelCall.args`): the schema's arguments in order, then the
//! out argument(s), then the return value(s); for out-variants the return is the out tensor again.

mod elementwise;
pub use elementwise::erf;
pub use linalg::matmul_f32;
mod linalg;
mod llm;
mod prim;
mod reduce;
mod shape;
pub(crate) use shape::slice_scatter_in_place;

use super::tensor::{from_f32, from_f64, from_i64, DType, Storage, Tensor, TensorIn};
use super::{Memory, Value};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::OnceLock;

pub type KernelResult = std::result::Result<(), String>;
pub type KernelFn = fn(&mut KernelCtx) -> KernelResult;

fn registry() -> &'static HashMap<&'static str, KernelFn> {
    static REG: OnceLock<HashMap<&'static str, KernelFn>> = OnceLock::new();
    REG.get_or_init(|| {
        let mut m = HashMap::new();
        for table in [
            elementwise::KERNELS,
            linalg::KERNELS,
            llm::KERNELS,
            prim::KERNELS,
            reduce::KERNELS,
            shape::KERNELS,
        ] {
            for &(name, f) in table {
                m.insert(name, f);
            }
        }
        m
    })
}

pub fn lookup(key: &str) -> Option<KernelFn> {
    registry().get(key).copied()
}

/// Every operator key the CPU runtime implements, sorted.
pub fn supported() -> Vec<&'static str> {
    let mut v: Vec<_> = registry().keys().copied().collect();
    v.sort_unstable();
    v
}

/// A scalar argument, as ATen `Scalar`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    pub fn f64(self) -> f64 {
        match self {
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
            Scalar::Bool(b) => b as i64 as f64,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, Scalar::Float(_))
    }
}

/// What a kernel sees: its argument value ids and the method's memory.
pub struct KernelCtx<'a> {
    pub mem: &'a mut Memory,
    pub args: &'a [usize],
}

impl<'a> KernelCtx<'a> {
    pub fn new(mem: &'a mut Memory, args: &'a [usize]) -> Self {
        KernelCtx { mem, args }
    }

    pub fn id(&self, i: usize) -> Result<usize, String> {
        self.args.get(i).copied().ok_or_else(|| {
            format!(
                "expected at least {} arguments, got {}",
                i + 1,
                self.args.len()
            )
        })
    }

    /// Index of the last argument: the out tensor of an out-variant.
    pub fn last(&self) -> usize {
        self.args.len().saturating_sub(1)
    }

    pub fn value(&self, i: usize) -> Result<&Value, String> {
        let id = self.id(i)?;
        self.mem
            .values
            .get(id)
            .ok_or_else(|| format!("value {id} does not exist"))
    }

    pub fn is_none(&self, i: usize) -> bool {
        matches!(self.value(i), Ok(Value::None) | Err(_))
    }

    pub fn int(&self, i: usize) -> Result<i64, String> {
        match self.value(i)? {
            Value::Int(v) => Ok(*v),
            Value::Bool(b) => Ok(*b as i64),
            v => Err(format!("argument {i} is a {}, expected an Int", v.kind())),
        }
    }

    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, String> {
        if self.is_none(i) {
            return Ok(None);
        }
        self.int(i).map(Some)
    }

    pub fn double(&self, i: usize) -> Result<f64, String> {
        Ok(self.scalar(i)?.f64())
    }

    pub fn opt_double(&self, i: usize) -> Result<Option<f64>, String> {
        if self.is_none(i) {
            return Ok(None);
        }
        self.double(i).map(Some)
    }

    pub fn boolean(&self, i: usize) -> Result<bool, String> {
        match self.value(i)? {
            Value::Bool(b) => Ok(*b),
            Value::Int(v) => Ok(*v != 0),
            v => Err(format!("argument {i} is a {}, expected a Bool", v.kind())),
        }
    }

    pub fn scalar(&self, i: usize) -> Result<Scalar, String> {
        match self.value(i)? {
            Value::Int(v) => Ok(Scalar::Int(*v)),
            Value::Double(v) => Ok(Scalar::Float(*v)),
            Value::Bool(v) => Ok(Scalar::Bool(*v)),
            v => Err(format!("argument {i} is a {}, expected a Scalar", v.kind())),
        }
    }

    pub fn string(&self, i: usize) -> Result<String, String> {
        match self.value(i)? {
            Value::String(s) => Ok(s.clone()),
            v => Err(format!("argument {i} is a {}, expected a String", v.kind())),
        }
    }

    /// An IntList (items resolved through their Int values) or a single Int.
    pub fn int_list(&self, i: usize) -> Result<Vec<i64>, String> {
        match self.value(i)? {
            Value::IntList(items) => items
                .iter()
                .map(|&it| match self.mem.values.get(it) {
                    Some(Value::Int(v)) => Ok(*v),
                    _ => Err(format!("argument {i}: IntList item {it} is not an Int")),
                })
                .collect(),
            Value::Int(v) => Ok(vec![*v]),
            Value::None => Ok(vec![]),
            v => Err(format!(
                "argument {i} is a {}, expected an IntList",
                v.kind()
            )),
        }
    }

    pub fn tensor_ids(&self, i: usize) -> Result<Vec<usize>, String> {
        match self.value(i)? {
            Value::TensorList(l) => Ok(l.clone()),
            v => Err(format!(
                "argument {i} is a {}, expected a TensorList",
                v.kind()
            )),
        }
    }

    pub fn opt_tensor_ids(&self, i: usize) -> Result<Vec<Option<usize>>, String> {
        match self.value(i)? {
            Value::OptionalTensorList(l) => Ok(l.clone()),
            Value::TensorList(l) => Ok(l.iter().map(|&x| Some(x)).collect()),
            v => Err(format!(
                "argument {i} is a {}, expected a list of optional tensors",
                v.kind()
            )),
        }
    }

    pub fn meta(&self, i: usize) -> Result<&Tensor, String> {
        self.mem.tensor(self.id(i)?)
    }

    pub fn meta_of(&self, id: usize) -> Result<&Tensor, String> {
        self.mem.tensor(id)
    }

    /// Reads argument `i` as a tensor (contiguous, current sizes).
    pub fn input(&self, i: usize) -> Result<TensorIn, String> {
        self.input_of(self.id(i)?)
            .map_err(|e| format!("argument {i}: {e}"))
    }

    /// Argument `i`'s tensor and its bytes where they lie: no copy, for kernels that read all
    /// of an input before writing (`input` copies, so a kernel may write while holding it).
    pub fn input_ref(&self, i: usize) -> Result<(&Tensor, &[u8]), String> {
        let t = self.mem.tensor(self.id(i)?)?;
        if !t.is_contiguous() {
            return Err(format!(
                "argument {i}: tensor with dim order {:?} is not supported",
                t.dim_order
            ));
        }
        Ok((t, self.mem.bytes(t)?))
    }

    pub fn opt_input(&self, i: usize) -> Result<Option<TensorIn>, String> {
        if self.is_none(i) {
            return Ok(None);
        }
        self.input(i).map(Some)
    }

    pub fn input_of(&self, id: usize) -> Result<TensorIn, String> {
        let t = self.mem.tensor(id)?;
        if !t.is_contiguous() {
            return Err(format!(
                "tensor with dim order {:?} is not supported",
                t.dim_order
            ));
        }
        Ok(match &t.storage {
            Storage::Constant(b) => {
                if b.len() < t.nbytes() {
                    return Err("constant is smaller than its shape".into());
                }
                TensorIn::borrowed(t.dtype, t.sizes.clone(), b.clone())
            }
            _ => TensorIn::owned(t.dtype, t.sizes.clone(), self.mem.bytes(t)?.to_vec()),
        })
    }

    pub fn out_dtype(&self, i: usize) -> Result<DType, String> {
        Ok(self.meta(i)?.dtype)
    }

    /// Resizes tensor argument `i` to `sizes` (within its planned capacity) and writes `bytes`.
    pub fn write(&mut self, i: usize, sizes: &[usize], bytes: &[u8]) -> Result<(), String> {
        let id = self.id(i)?;
        self.write_id(id, sizes, bytes)
    }

    pub fn write_id(&mut self, id: usize, sizes: &[usize], bytes: &[u8]) -> Result<(), String> {
        let mut t = self.mem.tensor(id)?.clone();
        let numel: usize = sizes.iter().product();
        if numel * t.dtype.size() != bytes.len() {
            return Err(format!(
                "internal: {} bytes for shape {sizes:?} of {}",
                bytes.len(),
                t.dtype.name()
            ));
        }
        if bytes.len() > t.max_bytes {
            return Err(format!(
                "output shape {sizes:?} exceeds the planned size ({} bytes, bounds {:?})",
                t.max_bytes, t.sizes
            ));
        }
        if !t.is_contiguous() {
            return Err(format!(
                "output with dim order {:?} is not supported",
                t.dim_order
            ));
        }
        t.sizes = sizes.to_vec();
        self.mem.bytes_mut(&t)?.copy_from_slice(bytes);
        self.mem.values[id] = Value::Tensor(t);
        Ok(())
    }

    pub fn write_f32(&mut self, i: usize, sizes: &[usize], v: &[f32]) -> Result<(), String> {
        let dt = self.out_dtype(i)?;
        self.write(i, sizes, &from_f32(dt, v))
    }

    pub fn write_f64(&mut self, i: usize, sizes: &[usize], v: &[f64]) -> Result<(), String> {
        let dt = self.out_dtype(i)?;
        self.write(i, sizes, &from_f64(dt, v))
    }

    pub fn write_i64(&mut self, i: usize, sizes: &[usize], v: &[i64]) -> Result<(), String> {
        let dt = self.out_dtype(i)?;
        self.write(i, sizes, &from_i64(dt, v))
    }

    /// Writes a tensor given in its own dtype, converting to the out dtype.
    pub fn write_like(&mut self, i: usize, src: &TensorIn) -> Result<(), String> {
        let dt = self.out_dtype(i)?;
        if dt == src.dtype {
            return self.write(i, &src.sizes.clone(), src.bytes());
        }
        let data = if src.dtype.is_float() || dt.is_float() {
            from_f64(dt, &src.f64())
        } else {
            from_i64(dt, &src.i64())
        };
        self.write(i, &src.sizes.clone(), &data)
    }

    /// Overwrites an Int value (`sym_size` and friends write dynamic dims this way).
    pub fn set_int(&mut self, i: usize, v: i64) -> Result<(), String> {
        let id = self.id(i)?;
        self.mem.values[id] = Value::Int(v);
        Ok(())
    }

    pub fn set_value(&mut self, i: usize, v: Value) -> Result<(), String> {
        let id = self.id(i)?;
        self.mem.values[id] = v;
        Ok(())
    }
}

/// Normalises a possibly negative dim against a rank.
pub fn norm_dim(d: i64, rank: usize) -> Result<usize, String> {
    let r = rank.max(1) as i64;
    let d2 = if d < 0 { d + r } else { d };
    if d2 < 0 || d2 >= r {
        return Err(format!("dim {d} is out of range for rank {rank}"));
    }
    Ok(d2 as usize)
}

/// Row-major strides of a shape.
pub fn strides(sizes: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * sizes[i + 1];
    }
    s
}

/// Strides of a row-major `src` read at each dim of `out` (0 where `src` repeats: a size-1
/// dim, or one `out` adds on the left).
pub fn bcast_strides(src: &[usize], out: &[usize]) -> Vec<usize> {
    let st = strides(src);
    (0..out.len())
        .map(|d| match (d + src.len()).checked_sub(out.len()) {
            Some(j) if src[j] != 1 => st[j],
            _ => 0,
        })
        .collect()
}

/// `src` (row-major) read at `out_strides[d]` per output dim into a new row-major tensor of
/// shape `out`; permutes and broadcasts copy runs of the innermost dim at once.
pub fn strided_copy<T: Copy>(src: &[T], out: &[usize], out_strides: &[usize]) -> Vec<T> {
    let n: usize = out.iter().product();
    let mut res = Vec::with_capacity(n);
    if n == 0 {
        return res;
    }
    let r = out.len();
    if r == 0 {
        res.push(src[0]);
        return res;
    }
    let (inner, ist) = (out[r - 1], out_strides[r - 1]);
    let mut idx = vec![0usize; r - 1];
    let mut offs = [0usize];
    for _ in 0..n / inner {
        let off = offs[0];
        match ist {
            1 => res.extend_from_slice(&src[off..off + inner]),
            0 => res.extend(std::iter::repeat_n(src[off], inner)),
            _ => res.extend((0..inner).map(|i| src[off + i * ist])),
        }
        next_index(&mut idx, &out[..r - 1], &[&out_strides[..r - 1]], &mut offs);
    }
    res
}

/// Advances `idx` to the next index of `shape` in row-major order, moving each operand's offset
/// `offs[i]` by its strides `strides[i]` (back to its start where a dim wraps).
pub fn next_index(idx: &mut [usize], shape: &[usize], strides: &[&[usize]], offs: &mut [usize]) {
    for d in (0..shape.len()).rev() {
        idx[d] += 1;
        offs.iter_mut().zip(strides).for_each(|(o, st)| *o += st[d]);
        if idx[d] < shape[d] {
            return;
        }
        offs.iter_mut()
            .zip(strides)
            .for_each(|(o, st)| *o -= st[d] * idx[d]);
        idx[d] = 0;
    }
}

/// `v` (shape `src`) broadcast to `out` (NumPy rules): borrowed when that changes nothing, else
/// copied by strides (no index per element, unlike `broadcast_indices`).
pub fn expand<'a, T: Copy>(v: &'a [T], src: &[usize], out: &[usize]) -> Cow<'a, [T]> {
    let n: usize = out.iter().product();
    let same = src.iter().product::<usize>() == n
        && src.len() <= out.len()
        && src.iter().rev().zip(out.iter().rev()).all(|(a, b)| a == b);
    match same {
        true => Cow::Borrowed(&v[..n]),
        false => Cow::Owned(strided_copy(v, out, &bcast_strides(src, out))),
    }
}

/// Broadcast result shape of two shapes (NumPy rules).
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        };
    }
    Ok(out)
}

/// For each element of `out` (row-major), the index into a tensor of shape `src` broadcast to it.
pub fn broadcast_indices(src: &[usize], out: &[usize]) -> Vec<usize> {
    let n = out.len();
    let numel: usize = out.iter().product();
    if src.iter().product::<usize>() == numel && src.len() <= n {
        let same = src.iter().rev().zip(out.iter().rev()).all(|(a, b)| a == b);
        if same {
            return (0..numel).collect();
        }
    }
    let bs = bcast_strides(src, out);
    let mut idx = vec![0usize; n];
    let mut res = Vec::with_capacity(numel);
    let mut off = [0usize];
    for _ in 0..numel {
        res.push(off[0]);
        next_index(&mut idx, out, &[&bs], &mut off);
    }
    res
}

/// A contiguous float32 tensor value of `sizes` in `storage`, for kernel tests.
#[cfg(test)]
pub(crate) fn f32_tensor(storage: Storage, sizes: Vec<usize>) -> Value {
    let n: usize = sizes.iter().product();
    Value::Tensor(Tensor {
        dtype: DType::F32,
        dim_order: (0..sizes.len() as u8).collect(),
        sizes,
        max_bytes: 4 * n,
        storage,
    })
}
