//! XNNPACK's ksums, computed once at load. Its qd8-f32-qb4w GEMM starts each output from the
//! packed `ksum · zero point`, where ksum sums every 16 columns' weights times their scale, in
//! order: a chain as long as K / 16 that depends on the weights alone. The decode mat-vec
//! (`xnn_matvec`) reads each row's from a constant instead of summing every weight again each call
//! (at K = 12288, 768 dependent adds a row).

use crate::ir::{ActQuant, DType, Graph, Node, OpKind, Role, Weight};
use crate::pte::{Blob, Bytes};
use std::sync::Arc;

/// Gives each XNNPACK-quantized 4-bit linear over constant weights a last input, its rows'
/// ksums (f32 `[n]`, computed on the host the way the CPU executor does), after its bias if it
/// has one. Returns how many it gave.
pub(crate) fn attach(g: &mut Graph) -> usize {
    let mut added = 0;
    for i in 0..g.nodes.len() {
        let Node::Op(op) = &g.nodes[i] else { continue };
        let OpKind::Linear {
            weight: Weight::Q4 { group },
            act_quant: ActQuant::Xnnpack,
            has_bias,
        } = op.kind
        else {
            continue;
        };
        if op.inputs.len() != 4 + has_bias as usize || group % 32 != 0 {
            continue;
        }
        let (w, s) = (op.inputs[1], op.inputs[2]);
        let (wt, st) = (&g.tensors[w], &g.tensors[s]);
        let (Role::Constant(wb), Role::Constant(sb)) = (&wt.role, &st.role) else {
            continue;
        };
        let (&[n, half], DType::F32) = (&wt.max_shape[..], st.dtype) else {
            continue;
        };
        let Some(ks) = crate::ir::cpu::xnn_q4_ksums(wb, sb, [half * 2, n], group) else {
            continue;
        };
        // The upload reads them again, page by page: until then they need not stay resident
        // (E2B's XNNPACK weights are 1.1 GB).
        wb.release_pages();
        sb.release_pages();
        let bytes: Vec<u8> = ks.iter().flat_map(|v| v.to_le_bytes()).collect();
        let blob = Blob::whole(Arc::new(Bytes::Owned(bytes)));
        let name = format!("{} ksums", g.tensors[w].name);
        let t = g.add_tensor(name, DType::F32, vec![n], Role::Constant(blob));
        if let Node::Op(op) = &mut g.nodes[i] {
            op.inputs.push(t);
            added += 1;
        }
    }
    added
}
