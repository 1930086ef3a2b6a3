//! A portable `aten::mean.out` that alone reads an output of an IR delegate, where the
//! delegate's graph computes that output by an f32 `mul`, moves into that graph, and the IR's
//! `fuse_mul_mean` makes the pair one reduction (the move is undone where it does not): the
//! products are never stored nor handed across the delegate boundary (the demo export's
//! attention: element-wise products of 2.4 MB a layer and step, 72 MiB in a 32-token prompt,
//! written, copied out and read again).
//!
//! The delegate now writes the mean's output where it ran, earlier than the mean did, so the
//! mean's out tensor must not share bytes with anything the instructions in between touch (the
//! memory planner may give a tensor born at the mean the bytes of one that died before it).

use crate::ir::{self, DType, OpKind, Role};
use crate::pte::{EValue, ExecutionPlan, Instruction, ScalarType, TensorData};

/// One mean moved into its delegate.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Absorbed {
    /// The delegate's instruction, and the position in its arguments of the output that now
    /// holds the mean (`value`).
    pub call: usize,
    pub arg: usize,
    pub value: usize,
    /// The mean's instruction, which no longer runs.
    pub mean: usize,
}

/// Every value an instruction names, tensor-list members included.
fn refs(plan: &ExecutionPlan, ins: &Instruction) -> Vec<usize> {
    let args: &[usize] = match ins {
        Instruction::Kernel { args, .. } | Instruction::Delegate { args, .. } => args,
        _ => &[],
    };
    let mut out = args.to_vec();
    for &a in args {
        match plan.values.get(a) {
            Some(EValue::TensorList(l)) => out.extend(l),
            Some(EValue::OptionalTensorList(l)) => out.extend(l.iter().flatten()),
            _ => {}
        }
    }
    out
}

/// `(arena, start, end)` of a planned tensor value.
fn planned(plan: &ExecutionPlan, v: usize) -> Option<(usize, usize, usize)> {
    match plan.values.get(v)? {
        EValue::Tensor(t) => match &t.data {
            TensorData::Planned { arena, offset, .. } => {
                Some((*arena, *offset, *offset + t.nbytes()))
            }
            _ => None,
        },
        _ => None,
    }
}

fn is_f32(plan: &ExecutionPlan, v: usize) -> bool {
    matches!(plan.values.get(v), Some(EValue::Tensor(t)) if t.dtype == ScalarType::Float)
}

/// The mean's reduced dims (normalised, ascending) and keepdim, if `args` are a `mean.out` of
/// `v` into an f32 out tensor that is also its returned value.
fn mean_of(
    plan: &ExecutionPlan,
    args: &[usize],
    v: usize,
    rank: usize,
) -> Option<(Vec<usize>, bool, usize)> {
    let [x, dims, keep, dtype, out, ret] = args else {
        return None;
    };
    if *x != v || out != ret || !is_f32(plan, *out) {
        return None;
    }
    let int = |id: usize| match plan.values.get(id) {
        Some(EValue::Int(i)) => Some(*i),
        _ => None,
    };
    let listed: Vec<i64> = match plan.values.get(*dims)? {
        EValue::IntList(l) => l.iter().map(|&id| int(id)).collect::<Option<_>>()?,
        EValue::Int(i) => vec![*i],
        EValue::Null => vec![],
        _ => return None,
    };
    let mut dims: Vec<usize> = if listed.is_empty() {
        (0..rank).collect()
    } else {
        let r = rank as i64;
        listed
            .iter()
            .map(|&d| {
                (-r..r)
                    .contains(&d)
                    .then_some(d.rem_euclid(r.max(1)) as usize)
            })
            .collect::<Option<_>>()?
    };
    dims.sort_unstable();
    dims.dedup();
    let keep = match plan.values.get(*keep)? {
        EValue::Bool(b) => *b,
        _ => return None,
    };
    // No dtype, or float32's (ScalarType code 6).
    match plan.values.get(*dtype)? {
        EValue::Null => {}
        EValue::Int(6) => {}
        _ => return None,
    }
    Some((dims, keep, *out))
}

/// Takes such means into `graphs` (per delegate, `None` where the backend gives no IR graph)
/// and says which; the caller points each call's output at the mean's value and drops the
/// mean's instruction.
pub(super) fn absorb_means(
    plan: &ExecutionPlan,
    graphs: &mut [Option<ir::Graph>],
) -> Vec<Absorbed> {
    let ins = &plan.instructions;
    if ins
        .iter()
        .any(|i| matches!(i, Instruction::Move { .. } | Instruction::JumpFalse { .. }))
    {
        return Vec::new();
    }
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); plan.values.len()];
    for (i, instr) in ins.iter().enumerate() {
        for v in refs(plan, instr) {
            if let Some(r) = readers.get_mut(v) {
                if r.last() != Some(&i) {
                    r.push(i);
                }
            }
        }
    }
    let mut calls = vec![0usize; graphs.len()];
    for instr in ins {
        if let Instruction::Delegate { delegate, .. } = instr {
            if let Some(c) = calls.get_mut(*delegate) {
                *c += 1;
            }
        }
    }
    let mut done = Vec::new();
    for (i, instr) in ins.iter().enumerate() {
        let Instruction::Delegate { delegate, args } = instr else {
            continue;
        };
        let Some(Some(g)) = graphs.get_mut(*delegate) else {
            continue;
        };
        if calls[*delegate] != 1 {
            continue;
        }
        let n_in = g.inputs.len();
        let sym_pos: Vec<usize> = g.sym_outputs.iter().map(|&(k, _)| k).collect();
        let tensor_pos: Vec<usize> = (0..args.len().saturating_sub(n_in))
            .filter(|k| !sym_pos.contains(k))
            .collect();
        for (j, &k) in tensor_pos.iter().enumerate().take(g.outputs.len()) {
            let (arg, v) = (n_in + k, args[n_in + k]);
            let Some(t) = g.outputs.get(j).copied() else {
                continue;
            };
            if plan.outputs.contains(&v) || plan.inputs.contains(&v) || !is_f32(plan, v) {
                continue;
            }
            let Some(&[me, m]) = readers.get(v).map(|r| &r[..]) else {
                continue;
            };
            if me != i {
                continue;
            }
            let Instruction::Kernel { op, args: margs } = &ins[m] else {
                continue;
            };
            if plan.operators.get(*op).map(|o| o.key()).as_deref() != Some("aten::mean.out") {
                continue;
            }
            let rank = g.tensors[t].max_shape.len();
            let Some((dims, keepdim, out)) = mean_of(plan, margs, v, rank) else {
                continue;
            };
            // Nothing the calls from this delegate's to the mean's touch may share the out
            // tensor's bytes (the delegate's own inputs and other outputs included).
            let Some((arena, lo, hi)) = planned(plan, out) else {
                continue;
            };
            let clash = (i..m).any(|s| {
                refs(plan, &ins[s]).into_iter().any(|w| {
                    w != v
                        && planned(plan, w)
                            .is_some_and(|(a, l, h)| a == arena && l < hi && lo < h && l < h)
                })
            });
            if clash || lo >= hi {
                continue;
            }
            let kind = OpKind::Mean { dims, keepdim };
            let max = g.tensors[t].max_shape.clone();
            let Ok(mut shapes) = ir::op_shapes(&kind, &[&max], &[]) else {
                continue;
            };
            let name = format!("mean({})", g.tensors[t].name);
            let y = g.add_tensor(name, DType::F32, shapes.remove(0), Role::Activation);
            g.op(kind, vec![t], vec![y]);
            g.outputs[j] = y;
            // Only where the IR's own pass makes the pair one `MulMean` (an f32 product nothing
            // else reads): a mean left apart would run as the executors' `Mean`, whose GPU
            // form sums in another order than the portable kernel. Otherwise undone (the mean
            // is still the last node and `y` the last tensor: the pass only rewrites in place).
            ir::passes::fuse_mul_mean(g);
            let fused = g
                .ops()
                .any(|o| o.outputs.contains(&y) && matches!(o.kind, OpKind::MulMean { .. }));
            if !fused {
                g.nodes.pop();
                g.tensors.pop();
                g.outputs[j] = t;
                continue;
            }
            done.push(Absorbed {
                call: i,
                arg,
                value: out,
                mean: m,
            });
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Io;
    use crate::pte::{BackendDelegate, Blob, Bytes, Dynamism, Operator, TensorInfo};
    use std::sync::Arc;

    fn tensor(sizes: &[usize], at: Option<usize>) -> EValue {
        EValue::Tensor(TensorInfo {
            dtype: ScalarType::Float,
            sizes: sizes.to_vec(),
            dim_order: (0..sizes.len() as u8).collect(),
            dynamism: Dynamism::Static,
            data: match at {
                Some(offset) => TensorData::Planned {
                    arena: 0,
                    offset,
                    initial: None,
                },
                None => TensorData::Runtime,
            },
            fqn: None,
        })
    }

    /// x [4, 8] -> delegate 0 (p = x * x) -> mean(p, -1) into v6 [4], v6 the method's output;
    /// `between` runs in between, writing v7 at the given offset.
    fn plan(between: Option<usize>) -> ExecutionPlan {
        let mut values = vec![
            tensor(&[4, 8], None),
            tensor(&[4, 8], Some(0)),
            EValue::Int(-1),
            EValue::IntList(vec![2]),
            EValue::Bool(false),
            EValue::Null,
            tensor(&[4], Some(512)),
        ];
        let mut instructions = vec![Instruction::Delegate {
            delegate: 0,
            args: vec![0, 1],
        }];
        if let Some(offset) = between {
            values.push(tensor(&[4], Some(offset)));
            instructions.push(Instruction::Kernel {
                op: 1,
                args: vec![0, 7],
            });
        }
        instructions.push(Instruction::Kernel {
            op: 0,
            args: vec![1, 3, 4, 5, 6, 6],
        });
        let op = |name: &str, overload: &str| Operator {
            name: name.into(),
            overload: overload.into(),
        };
        ExecutionPlan {
            name: "forward".into(),
            values,
            inputs: vec![0],
            outputs: vec![6],
            instructions,
            operators: vec![op("aten::mean", "out"), op("aten::sum", "out")],
            delegates: vec![BackendDelegate {
                id: "IR".into(),
                data: Blob::whole(Arc::new(Bytes::Owned(vec![]))),
                compile_specs: vec![],
            }],
            arena_sizes: vec![1024],
        }
    }

    fn square(op: ir::BinaryOp) -> ir::Graph {
        let mut g = ir::Graph::default();
        let x = g.add_tensor("x", DType::F32, vec![4, 8], Role::Input(0));
        let p = g.add_tensor("p", DType::F32, vec![4, 8], Role::Activation);
        g.op(OpKind::Binary(op), vec![x, x], vec![p]);
        g.inputs = vec![Io::Tensor(x)];
        g.outputs = vec![p];
        g
    }

    fn absorb(plan: &ExecutionPlan, op: ir::BinaryOp) -> (Vec<Absorbed>, ir::Graph) {
        let mut graphs = vec![Some(square(op))];
        let done = absorb_means(plan, &mut graphs);
        (done, graphs.remove(0).unwrap())
    }

    #[test]
    fn a_mean_of_a_delegates_product_moves_into_its_graph() {
        let (done, g) = absorb(&plan(None), ir::BinaryOp::Mul);
        let want = Absorbed {
            call: 0,
            arg: 1,
            value: 6,
            mean: 1,
        };
        assert_eq!(done, [want]);
        let last = g.ops().last().unwrap();
        assert_eq!(
            last.kind,
            OpKind::MulMean {
                dims: vec![1],
                keepdim: false
            }
        );
        assert_eq!(g.outputs, last.outputs);
        assert_eq!(g.tensors[g.outputs[0]].max_shape, [4]);
        g.validate().unwrap();
        // Something in between that keeps clear of the mean's bytes changes nothing.
        assert_eq!(absorb(&plan(Some(256)), ir::BinaryOp::Mul).0.len(), 1);
    }

    #[test]
    fn means_that_would_change_what_anything_sees_stay_where_they_are() {
        let none = |p: &ExecutionPlan, op| absorb(p, op).0.is_empty();
        // Not a product: the mean would run as the IR's tree sum, other bits.
        assert!(none(&plan(None), ir::BinaryOp::Add));
        // ... and the graph is left as it was.
        let g = absorb(&plan(None), ir::BinaryOp::Add).1;
        assert_eq!(
            (g.ops().count(), g.tensors.len(), &g.outputs[..]),
            (1, 2, &[1][..])
        );
        // An instruction in between touches the mean's bytes before the mean ran.
        assert!(none(&plan(Some(512 + 8)), ir::BinaryOp::Mul));
        // The products are also an output of the method, or something else reads them.
        let mut p = plan(None);
        p.outputs.push(1);
        assert!(none(&p, ir::BinaryOp::Mul));
        let mut p = plan(Some(256));
        if let Instruction::Kernel { args, .. } = &mut p.instructions[1] {
            args[0] = 1;
        }
        assert!(none(&p, ir::BinaryOp::Mul));
        // The delegate runs twice, or the method has control flow.
        let mut p = plan(None);
        p.instructions.push(p.instructions[0].clone());
        assert!(none(&p, ir::BinaryOp::Mul));
        let mut p = plan(None);
        p.instructions.push(Instruction::Move { from: 6, to: 6 });
        assert!(none(&p, ir::BinaryOp::Mul));
        // The mean casts, or its out is not its returned value.
        let mut p = plan(None);
        p.values[5] = EValue::Int(7);
        assert!(none(&p, ir::BinaryOp::Mul));
        let mut p = plan(None);
        if let Instruction::Kernel { args, .. } = &mut p.instructions[1] {
            args[5] = 1;
        }
        assert!(none(&p, ir::BinaryOp::Mul));
    }
}
