//! Scalar ("prim") ops: symbolic sizes and host-side integer/float arithmetic.

use super::{KernelCtx, KernelFn, KernelResult, Scalar};
use crate::runtime::Value;

pub const KERNELS: &[(&str, KernelFn)] = &[
    ("aten::sym_size.int", sym_size),
    ("aten::sym_numel", sym_numel),
    ("aten::_local_scalar_dense", local_scalar_dense),
    ("aten::_assert_scalar", assert_scalar),
    ("aten::sym_constrain_range_for_size", noop),
    ("executorch_prim::add.Scalar", add),
    ("executorch_prim::sub.Scalar", sub),
    ("executorch_prim::mul.Scalar", mul),
    ("executorch_prim::floordiv.Scalar", floordiv),
    ("executorch_prim::floordiv.int", floordiv),
    ("executorch_prim::truediv.Scalar", truediv),
    ("executorch_prim::mod.Scalar", modulo),
    ("executorch_prim::mod.int", modulo),
    ("executorch_prim::eq.Scalar", eq),
    ("executorch_prim::gt.Scalar", gt),
    ("executorch_prim::ge.Scalar", ge),
    ("executorch_prim::lt.Scalar", lt),
    ("executorch_prim::le.Scalar", le),
    ("executorch_prim::neg.Scalar", neg),
    ("executorch_prim::sym_max.Scalar", sym_max),
    ("executorch_prim::sym_min.Scalar", sym_min),
];

fn noop(_: &mut KernelCtx) -> KernelResult {
    Ok(())
}

fn sym_size(k: &mut KernelCtx) -> KernelResult {
    let sizes = k.meta(0)?.sizes.clone();
    let d = super::norm_dim(k.int(1)?, sizes.len())?;
    let o = k.last();
    k.set_int(o, sizes[d] as i64)
}

fn sym_numel(k: &mut KernelCtx) -> KernelResult {
    let n = k.meta(0)?.numel();
    let o = k.last();
    k.set_int(o, n as i64)
}

/// Reads a one-element tensor into the scalar kind the program declared for the result.
fn local_scalar_dense(k: &mut KernelCtx) -> KernelResult {
    let t = k.input(0)?;
    if t.numel() != 1 {
        return Err(format!("expected a one-element tensor, got {:?}", t.sizes));
    }
    let o = k.last();
    let v = match k.value(o)? {
        Value::Double(_) => Value::Double(t.f64()[0]),
        Value::Bool(_) => Value::Bool(t.f64()[0] != 0.0),
        _ if t.dtype.is_float() => Value::Double(t.f64()[0]),
        _ => Value::Int(t.i64()[0]),
    };
    k.set_value(o, v)
}

fn assert_scalar(k: &mut KernelCtx) -> KernelResult {
    if k.boolean(0)? {
        Ok(())
    } else {
        Err("a shape assertion in the program failed (input outside the exported range?)".into())
    }
}

fn arith(
    k: &mut KernelCtx,
    fi: impl Fn(i64, i64) -> Result<i64, String>,
    ff: impl Fn(f64, f64) -> f64,
) -> KernelResult {
    let (a, b) = (k.scalar(0)?, k.scalar(1)?);
    let o = k.last();
    let v = match (a, b) {
        (Scalar::Float(_), _) | (_, Scalar::Float(_)) => Value::Double(ff(a.f64(), b.f64())),
        _ => Value::Int(fi(a.f64() as i64, b.f64() as i64)?),
    };
    k.set_value(o, v)
}

fn add(k: &mut KernelCtx) -> KernelResult {
    arith(k, |a, b| Ok(a.wrapping_add(b)), |a, b| a + b)
}
fn sub(k: &mut KernelCtx) -> KernelResult {
    arith(k, |a, b| Ok(a.wrapping_sub(b)), |a, b| a - b)
}
fn mul(k: &mut KernelCtx) -> KernelResult {
    arith(k, |a, b| Ok(a.wrapping_mul(b)), |a, b| a * b)
}
fn floordiv(k: &mut KernelCtx) -> KernelResult {
    arith(
        k,
        |a, b| {
            if b == 0 {
                return Err("integer division by zero".into());
            }
            Ok(a.div_euclid(b) - if a.rem_euclid(b) != 0 && b < 0 { 1 } else { 0 })
        },
        |a, b| (a / b).floor(),
    )
}
fn modulo(k: &mut KernelCtx) -> KernelResult {
    // Python semantics: the result has the divisor's sign.
    arith(
        k,
        |a, b| {
            if b == 0 {
                return Err("integer modulo by zero".into());
            }
            let r = a % b;
            Ok(if r != 0 && ((r < 0) != (b < 0)) {
                r + b
            } else {
                r
            })
        },
        |a, b| a - b * (a / b).floor(),
    )
}
fn truediv(k: &mut KernelCtx) -> KernelResult {
    let (a, b) = (k.scalar(0)?.f64(), k.scalar(1)?.f64());
    let o = k.last();
    k.set_value(o, Value::Double(a / b))
}
fn sym_max(k: &mut KernelCtx) -> KernelResult {
    arith(k, |a, b| Ok(a.max(b)), f64::max)
}
fn sym_min(k: &mut KernelCtx) -> KernelResult {
    arith(k, |a, b| Ok(a.min(b)), f64::min)
}
fn neg(k: &mut KernelCtx) -> KernelResult {
    let o = k.last();
    let v = match k.scalar(0)? {
        Scalar::Float(f) => Value::Double(-f),
        s => Value::Int(-(s.f64() as i64)),
    };
    k.set_value(o, v)
}

fn cmp(k: &mut KernelCtx, f: impl Fn(f64, f64) -> bool) -> KernelResult {
    let (a, b) = (k.scalar(0)?.f64(), k.scalar(1)?.f64());
    let o = k.last();
    k.set_value(o, Value::Bool(f(a, b)))
}
fn eq(k: &mut KernelCtx) -> KernelResult {
    cmp(k, |a, b| a == b)
}
fn gt(k: &mut KernelCtx) -> KernelResult {
    cmp(k, |a, b| a > b)
}
fn ge(k: &mut KernelCtx) -> KernelResult {
    cmp(k, |a, b| a >= b)
}
fn lt(k: &mut KernelCtx) -> KernelResult {
    cmp(k, |a, b| a < b)
}
fn le(k: &mut KernelCtx) -> KernelResult {
    cmp(k, |a, b| a <= b)
}
