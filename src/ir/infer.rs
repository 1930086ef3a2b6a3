//! Per-call planning: evaluate host symbols and every tensor's actual shape from the inputs, in
//! graph order. Both executors run this first; the GPU executor keys its recorded command
//! streams by the resulting shapes.

use super::*;

/// A delegate input as the executors receive it.
#[derive(Debug, Clone)]
pub enum InputValue<'a> {
    Tensor { shape: Vec<usize>, data: &'a [u8] },
    Sym(i64),
}

/// Shapes and symbol values of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub shapes: Vec<Vec<usize>>,
    pub syms: Vec<i64>,
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

pub(crate) fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    crate::runtime::kernels::broadcast_shape(a, b)
}

fn slice_len(start: i64, end: i64, step: usize, n: usize) -> (usize, usize) {
    let n = n as i64;
    let fix = |v: i64| (if v < 0 { v + n } else { v }).clamp(0, n) as usize;
    let (s, e) = (fix(start), fix(end));
    let e = e.max(s);
    (s, (e - s).div_ceil(step.max(1)))
}

/// Columns of a weight given its first tensor's shape.
fn weight_cols(w: Weight, shape: &[usize]) -> Result<(usize, usize), String> {
    match (w, shape) {
        (Weight::Q4 { .. }, [r, c2]) => Ok((*r, c2 * 2)),
        (Weight::F32 | Weight::Q8 { .. }, [r, c]) => Ok((*r, *c)),
        _ => Err(format!("weight must be 2-D, got {shape:?}")),
    }
}

/// Output shapes of one op from its input shapes.
pub fn op_shapes(kind: &OpKind, ins: &[&[usize]], syms: &[i64]) -> Result<Vec<Vec<usize>>, String> {
    let arg = |i: usize| -> Result<&[usize], String> {
        ins.get(i)
            .copied()
            .ok_or_else(|| format!("missing input {i}"))
    };
    Ok(vec![match kind {
        OpKind::Unary(_) | OpKind::Cast | OpKind::Clamp { .. } | OpKind::Copy => arg(0)?.to_vec(),
        OpKind::RmsNorm { .. }
        | OpKind::RmsNormRope { .. }
        | OpKind::Softmax
        | OpKind::Rope { .. }
        | OpKind::Sdpa { .. } => arg(0)?.to_vec(),
        OpKind::BinaryScalar { .. } => arg(0)?.to_vec(),
        OpKind::Binary(_) => broadcast(arg(0)?, arg(1)?)?,
        OpKind::Where => broadcast(&broadcast(arg(0)?, arg(1)?)?, arg(2)?)?,
        OpKind::RmsNormChain { weighted, .. } => {
            let x = arg(0)?;
            for k in 1 + *weighted as usize..ins.len() {
                if broadcast(x, arg(k)?)? != x {
                    return Err(format!(
                        "chain input {:?} does not broadcast to {x:?}",
                        arg(k)?
                    ));
                }
            }
            x.to_vec()
        }
        OpKind::ElementwiseChain { .. } => {
            let mut s = arg(0)?.to_vec();
            for k in 1..ins.len() {
                s = broadcast(&s, arg(k)?)?;
            }
            s
        }
        OpKind::Linear { weight, .. } => {
            let x = arg(0)?;
            let (n, k) = weight_cols(*weight, arg(1)?)?;
            if x.last() != Some(&k) {
                return Err(format!("input {x:?} does not end in K={k}"));
            }
            let mut s = x.to_vec();
            *s.last_mut().unwrap() = n;
            s
        }
        OpKind::MatMul { transpose_b } => {
            let (a, b) = (arg(0)?, arg(1)?);
            let (bk, bn) = match transpose_b {
                false => (b.len().wrapping_sub(2), b.len().wrapping_sub(1)),
                true => (b.len().wrapping_sub(1), b.len().wrapping_sub(2)),
            };
            if a.len() < 2 || b.len() < 2 || a[a.len() - 1] != b[bk] {
                return Err(format!(
                    "matmul {a:?} x {b:?} (b transposed: {transpose_b})"
                ));
            }
            let mut s = broadcast(&a[..a.len() - 2], &b[..b.len() - 2])?;
            s.push(a[a.len() - 2]);
            s.push(b[bn]);
            s
        }
        OpKind::Embedding { weight } => {
            let (_, c) = weight_cols(*weight, arg(0)?)?;
            let mut s = arg(weight.tensor_count())?.to_vec();
            s.push(c);
            s
        }
        OpKind::Arange { start, end, step } => {
            let (a, b) = (start.eval(syms), end.eval(syms));
            if *step == 0 {
                return Err("arange step is zero".into());
            }
            let n = (b - a + step - step.signum()) / step;
            vec![n.max(0) as usize]
        }
        OpKind::Mean { dims, keepdim }
        | OpKind::Sum { dims, keepdim }
        | OpKind::MulMean { dims, keepdim } => {
            let x = match kind {
                OpKind::MulMean { .. } => broadcast(arg(0)?, arg(1)?)?,
                _ => arg(0)?.to_vec(),
            };
            if let Some(d) = dims.iter().find(|&&d| d >= x.len()) {
                return Err(format!("reduced dim {d} of a rank-{} tensor", x.len()));
            }
            x.iter()
                .enumerate()
                .filter_map(|(i, &d)| {
                    if dims.contains(&i) {
                        keepdim.then_some(1)
                    } else {
                        Some(d)
                    }
                })
                .collect()
        }
        OpKind::CacheUpdate { .. } => arg(0)?.to_vec(),
        OpKind::Reshape { shape } => {
            let n = numel(arg(0)?);
            let req: Vec<i64> = shape.iter().map(|v| v.eval(syms)).collect();
            let known: i64 = req.iter().filter(|&&d| d != -1).product();
            let holes = req.iter().filter(|&&d| d == -1).count();
            let out: Vec<usize> = req
                .iter()
                .map(|&d| {
                    if d == -1 && known > 0 {
                        n / known as usize
                    } else {
                        d.max(0) as usize
                    }
                })
                .collect();
            if holes > 1 || numel(&out) != n {
                return Err(format!("cannot reshape {:?} to {req:?}", arg(0)?));
            }
            out
        }
        OpKind::Permute { perm } => {
            let x = arg(0)?;
            if perm.len() != x.len() || perm.iter().any(|&p| p >= x.len()) {
                return Err(format!("bad permutation {perm:?} of {x:?}"));
            }
            perm.iter().map(|&p| x[p]).collect()
        }
        OpKind::Slice {
            dim,
            start,
            end,
            step,
        } => {
            let mut s = arg(0)?.to_vec();
            let d = *s.get(*dim).ok_or("slice dim out of range")?;
            s[*dim] = slice_len(start.eval(syms), end.eval(syms), *step, d).1;
            s
        }
        OpKind::Select { dim, index } => {
            let mut s = arg(0)?.to_vec();
            let n = *s.get(*dim).ok_or("select dim out of range")? as i64;
            let i = index.eval(syms);
            if !(-n..n).contains(&i) {
                return Err(format!("select index {i} out of range for size {n}"));
            }
            s.remove(*dim);
            s
        }
        OpKind::Concat { dim } => {
            let mut s = arg(0)?.to_vec();
            if *dim >= s.len() {
                return Err("concat dim out of range".into());
            }
            s[*dim] = 0;
            for x in ins {
                if x.len() != s.len() || (0..s.len()).any(|i| i != *dim && x[i] != s[i]) {
                    return Err(format!("concat of {:?} and {x:?}", arg(0)?));
                }
                s[*dim] += x[*dim];
            }
            s
        }
        OpKind::Expand { shape } => {
            let shape: Vec<usize> = shape.iter().map(|v| v.eval(syms).max(0) as usize).collect();
            broadcast(arg(0)?, &shape)?;
            shape
        }
        OpKind::IndexSelect { dim } => {
            let mut s = arg(0)?.to_vec();
            if *dim >= s.len() {
                return Err("index_select dim out of range".into());
            }
            s[*dim] = numel(arg(1)?);
            s
        }
        OpKind::Full { shape, .. } => shape.iter().map(|v| v.eval(syms).max(0) as usize).collect(),
    }])
}

/// The symbols `op_shapes` reads for this op (the plan cache re-runs an op when one changes).
pub fn shape_syms(kind: &OpKind) -> Vec<SymId> {
    let ints: Vec<Int> = match kind {
        OpKind::Arange { start, end, .. } | OpKind::Slice { start, end, .. } => vec![*start, *end],
        OpKind::Reshape { shape } | OpKind::Expand { shape } | OpKind::Full { shape, .. } => {
            shape.clone()
        }
        OpKind::Select { index, .. } => vec![*index],
        _ => Vec::new(),
    };
    ints.into_iter()
        .filter_map(|v| match v {
            Int::Sym(s) => Some(s),
            Int::Lit(_) => None,
        })
        .collect()
}

/// Checks the inputs against the graph, sets the input tensors' shapes and the input symbols,
/// and returns the input tensors' bytes (symbols may read them).
fn bind_inputs<'a>(
    g: &Graph,
    inputs: &[InputValue<'a>],
    shapes: &mut [Vec<usize>],
    syms: &mut [i64],
) -> Result<Vec<(TensorId, &'a [u8])>, IrError> {
    if inputs.len() != g.inputs.len() {
        return Err(IrError::Invalid(format!(
            "graph takes {} inputs, got {}",
            g.inputs.len(),
            inputs.len()
        )));
    }
    let mut data_of = Vec::new();
    for (k, (io, v)) in g.inputs.iter().zip(inputs).enumerate() {
        match (io, v) {
            (Io::Tensor(t), InputValue::Tensor { shape, data }) => {
                let def = &g.tensors[*t];
                if shape.len() != def.max_shape.len()
                    || shape.iter().zip(&def.max_shape).any(|(a, b)| a > b)
                {
                    return Err(IrError::Invalid(format!(
                        "input {k}: shape {shape:?} exceeds the bounds {:?}",
                        def.max_shape
                    )));
                }
                if data.len() != numel(shape) * def.dtype.size() {
                    return Err(IrError::Invalid(format!(
                        "input {k}: {} bytes for shape {shape:?}",
                        data.len()
                    )));
                }
                if shapes[*t] != *shape {
                    shapes[*t].clone_from(shape);
                }
                data_of.push((*t, *data));
            }
            (Io::Sym(s), InputValue::Sym(v)) => syms[*s] = *v,
            _ => {
                return Err(IrError::Invalid(format!(
                    "input {k}: tensor/symbol kind mismatch"
                )))
            }
        }
    }
    Ok(data_of)
}

/// Evaluates sym node `n`.
fn eval_sym(
    g: &Graph,
    n: usize,
    s: &SymOp,
    shapes: &[Vec<usize>],
    syms: &mut [i64],
    data_of: &[(TensorId, &[u8])],
) -> Result<(), IrError> {
    let err = |msg: String| IrError::Node {
        node: n,
        op: "sym".into(),
        msg,
    };
    match s {
        SymOp::Size { out, tensor, dim } => {
            syms[*out] = *shapes[*tensor].get(*dim).ok_or_else(|| {
                err(format!(
                    "dim {dim} of a rank-{} tensor",
                    shapes[*tensor].len()
                ))
            })? as i64;
        }
        SymOp::ReadInput { out, tensor, index } => {
            let data = data_of
                .iter()
                .find(|(t, _)| t == tensor)
                .map(|(_, d)| *d)
                .ok_or_else(|| err("reads a tensor that is not an input".into()))?;
            let dt = g.tensors[*tensor].dtype;
            let vals = crate::runtime::tensor::to_i64(dt, data);
            syms[*out] = *vals.get(*index).ok_or_else(|| {
                err(format!(
                    "index {index} past the input's {} elements",
                    vals.len()
                ))
            })?;
        }
        SymOp::Arith { out, op, a, b } => {
            let (x, y) = (a.eval(syms), b.eval(syms));
            syms[*out] = match op {
                SymArith::Add => x.wrapping_add(y),
                SymArith::Sub => x.wrapping_sub(y),
                SymArith::Mul => x.wrapping_mul(y),
                SymArith::FloorDiv if y != 0 => {
                    x.div_euclid(y) - i64::from(x.rem_euclid(y) != 0 && y < 0)
                }
                SymArith::Mod if y != 0 => ((x % y) + y) % y,
                SymArith::Max => x.max(y),
                SymArith::Min => x.min(y),
                _ => return Err(err("division by zero in a symbol".into())),
            };
        }
    }
    Ok(())
}

/// The output shapes of op node `n` from the current shapes.
fn node_shapes(
    n: usize,
    o: &Op,
    shapes: &[Vec<usize>],
    syms: &[i64],
) -> Result<Vec<Vec<usize>>, IrError> {
    let ins: Vec<&[usize]> = o.inputs.iter().map(|&t| shapes[t].as_slice()).collect();
    op_shapes(&o.kind, &ins, syms).map_err(|msg| IrError::Node {
        node: n,
        op: o.kind.label(),
        msg,
    })
}

/// Evaluates symbols and shapes for a call.
pub fn infer_shapes(g: &Graph, inputs: &[InputValue]) -> Result<Plan, IrError> {
    let mut shapes: Vec<Vec<usize>> = g.tensors.iter().map(|t| t.max_shape.clone()).collect();
    let mut syms = vec![0i64; g.sym_names.len()];
    let data_of = bind_inputs(g, inputs, &mut shapes, &mut syms)?;
    for (n, node) in g.nodes.iter().enumerate() {
        match node {
            Node::Sym(s) => eval_sym(g, n, s, &shapes, &mut syms, &data_of)?,
            Node::Op(o) => {
                let outs = node_shapes(n, o, &shapes, &syms)?;
                for (&t, s) in o.outputs.iter().zip(outs) {
                    if numel(&s) > g.tensors[t].max_numel() {
                        return Err(IrError::Node {
                            node: n,
                            op: o.kind.label(),
                            msg: format!(
                                "output shape {s:?} exceeds the bounds {:?}",
                                g.tensors[t].max_shape
                            ),
                        });
                    }
                    shapes[t] = s;
                }
            }
        }
    }
    Ok(Plan { shapes, syms })
}

/// Plans calls, reusing the last plan's shapes when a call provably has the same ones: the same
/// input shapes, and every op whose shape reads a symbol that changed giving the same shape
/// (every other op's shape follows from its inputs' shapes alone). Decode steps differ only in
/// symbol values (the position), so a step evaluates its symbols and a few ops, not the graph.
pub struct PlanCache {
    /// Sym nodes, and the ops whose shapes read symbols with those symbols, in graph order.
    steps: Vec<(usize, Vec<SymId>)>,
    last: Option<Plan>,
}

impl PlanCache {
    pub fn new(g: &Graph) -> PlanCache {
        let steps = g
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(n, node)| match node {
                Node::Sym(_) => Some((n, Vec::new())),
                Node::Op(o) => {
                    let syms = shape_syms(&o.kind);
                    (!syms.is_empty()).then_some((n, syms))
                }
            })
            .collect();
        PlanCache { steps, last: None }
    }

    /// Forgets the last plan: the next call plans from scratch.
    pub fn forget(&mut self) {
        self.last = None;
    }

    /// This call's plan, and whether its shapes equal the previous call's.
    pub fn plan(&mut self, g: &Graph, inputs: &[InputValue]) -> Result<(&Plan, bool), IrError> {
        if let Some(last) = self.last.take() {
            if let Some(p) = self.replan(g, inputs, last)? {
                return Ok((self.last.insert(p), true));
            }
        }
        let p = infer_shapes(g, inputs)?;
        Ok((self.last.insert(p), false))
    }

    /// `last` with this call's symbols, if its shapes hold for this call.
    fn replan(
        &self,
        g: &Graph,
        inputs: &[InputValue],
        mut last: Plan,
    ) -> Result<Option<Plan>, IrError> {
        let same_inputs = inputs.len() == g.inputs.len()
            && g.inputs.iter().zip(inputs).all(|(io, v)| match (io, v) {
                (Io::Tensor(t), InputValue::Tensor { shape, .. }) => last.shapes[*t] == *shape,
                (Io::Sym(_), InputValue::Sym(_)) => true,
                _ => false,
            });
        if !same_inputs {
            return Ok(None);
        }
        let before = last.syms.clone();
        let data_of = bind_inputs(g, inputs, &mut last.shapes, &mut last.syms)?;
        for (n, reads) in &self.steps {
            let n = *n;
            match &g.nodes[n] {
                Node::Sym(s) => eval_sym(g, n, s, &last.shapes, &mut last.syms, &data_of)?,
                // Its symbols as in the last call: its shapes too.
                Node::Op(_) if reads.iter().all(|&s| last.syms[s] == before[s]) => {}
                Node::Op(o) => {
                    let outs = node_shapes(n, o, &last.shapes, &last.syms)?;
                    if o.outputs
                        .iter()
                        .zip(&outs)
                        .any(|(&t, s)| last.shapes[t] != *s)
                    {
                        return Ok(None);
                    }
                }
            }
        }
        Ok(Some(last))
    }
}
