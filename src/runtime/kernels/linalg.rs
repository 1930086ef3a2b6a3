//! Matrix products. Accumulation is in f32, as ExecuTorch's portable kernels do for f32 inputs.

use super::{KernelCtx, KernelFn, KernelResult};
use crate::runtime::tensor::TensorIn;

pub const KERNELS: &[(&str, KernelFn)] = &[
    ("aten::mm.out", mm),
    ("aten::bmm.out", bmm),
    ("aten::addmm.out", addmm),
    ("aten::linear.out", linear),
];

/// `c[m,n] = sum_k a[m,k] * b[k,n]` (or `b[n,k]` when `b_transposed`), row-major.
pub fn matmul_f32(
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    b_transposed: bool,
) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    if b_transposed {
        for i in 0..m {
            let ar = &a[i * k..(i + 1) * k];
            for j in 0..n {
                let br = &b[j * k..(j + 1) * k];
                c[i * n + j] = ar.iter().zip(br).map(|(x, y)| x * y).sum();
            }
        }
    } else {
        for i in 0..m {
            let cr = &mut c[i * n..(i + 1) * n];
            for p in 0..k {
                let av = a[i * k + p];
                let br = &b[p * n..(p + 1) * n];
                for (cv, bv) in cr.iter_mut().zip(br) {
                    *cv += av * bv;
                }
            }
        }
    }
    c
}

fn dims2(t: &TensorIn, what: &str) -> Result<(usize, usize), String> {
    match t.sizes[..] {
        [r, c] => Ok((r, c)),
        _ => Err(format!("{what} must be 2-D, got {:?}", t.sizes)),
    }
}

fn mm(k: &mut KernelCtx) -> KernelResult {
    let (a, b) = (k.input(0)?, k.input(1)?);
    let ((m, ka), (kb, n)) = (dims2(&a, "self")?, dims2(&b, "mat2")?);
    if ka != kb {
        return Err(format!("mm: {:?} x {:?}", a.sizes, b.sizes));
    }
    let c = matmul_f32(&a.f32(), &b.f32(), m, ka, n, false);
    let o = k.last();
    k.write_f32(o, &[m, n], &c)
}

fn bmm(k: &mut KernelCtx) -> KernelResult {
    let (a, b) = (k.input(0)?, k.input(1)?);
    let (&[ba, m, ka], &[bb, kb, n]) = (&a.sizes[..], &b.sizes[..]) else {
        return Err(format!(
            "bmm needs 3-D inputs, got {:?} and {:?}",
            a.sizes, b.sizes
        ));
    };
    if ba != bb || ka != kb {
        return Err(format!("bmm: {:?} x {:?}", a.sizes, b.sizes));
    }
    let (av, bv) = (a.f32(), b.f32());
    let mut c = Vec::with_capacity(ba * m * n);
    for i in 0..ba {
        c.extend(matmul_f32(
            &av[i * m * ka..(i + 1) * m * ka],
            &bv[i * ka * n..(i + 1) * ka * n],
            m,
            ka,
            n,
            false,
        ));
    }
    let o = k.last();
    k.write_f32(o, &[ba, m, n], &c)
}

fn add_bias(c: &mut [f32], bias: &TensorIn, m: usize, n: usize, beta: f32) -> Result<(), String> {
    let bv = bias.f32();
    let idx = super::broadcast_indices(&bias.sizes, &[m, n]);
    for (j, cv) in c.iter_mut().enumerate() {
        *cv += beta * bv[idx[j]];
    }
    Ok(())
}

fn addmm(k: &mut KernelCtx) -> KernelResult {
    let (bias, a, b) = (k.input(0)?, k.input(1)?, k.input(2)?);
    let (beta, alpha) = (k.double(3)? as f32, k.double(4)? as f32);
    let ((m, ka), (kb, n)) = (dims2(&a, "mat1")?, dims2(&b, "mat2")?);
    if ka != kb {
        return Err(format!("addmm: {:?} x {:?}", a.sizes, b.sizes));
    }
    let mut c = matmul_f32(&a.f32(), &b.f32(), m, ka, n, false);
    if alpha != 1.0 {
        c.iter_mut().for_each(|x| *x *= alpha);
    }
    add_bias(&mut c, &bias, m, n, beta)?;
    let o = k.last();
    k.write_f32(o, &[m, n], &c)
}

/// `linear(input[..., K], weight[N, K], bias?)`.
fn linear(k: &mut KernelCtx) -> KernelResult {
    let (x, w) = (k.input(0)?, k.input(1)?);
    let (n, kw) = dims2(&w, "weight")?;
    let kx = *x.sizes.last().ok_or("linear input is a scalar")?;
    if kx != kw {
        return Err(format!(
            "linear: input {:?} with weight {:?}",
            x.sizes, w.sizes
        ));
    }
    let m = x.numel() / kx.max(1);
    let mut c = matmul_f32(&x.f32(), &w.f32(), m, kx, n, true);
    if let Some(b) = k.opt_input(2)? {
        add_bias(&mut c, &b, m, n, 1.0)?;
    }
    let mut sizes = x.sizes.clone();
    *sizes.last_mut().unwrap() = n;
    let o = k.last();
    k.write_f32(o, &sizes, &c)
}
