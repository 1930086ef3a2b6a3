//! Vulkan delegate blobs of the fixture programs: every blob parses with every constant resolved
//! zero-copy, its facts match a `flatc` dump of the same blob (executorch 1.5.1 schema), and
//! mutated blobs never panic the parser.

mod common;

use pteria::frontend::vulkan::{self, VkDataType, VkGraph, VkStorageType, VkValue};
use pteria::pte::{Blob, Bytes, NamedData, Program};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Every fixture program with at least one `VulkanBackend` delegate, with those blobs.
fn vulkan_fixtures() -> Vec<(PathBuf, Program, Vec<Blob>)> {
    common::delegate_fixtures(vulkan::BACKEND_ID)
        .into_iter()
        .map(|(path, program, blobs)| {
            let blobs = blobs.into_iter().map(|(_, _, b)| b).collect();
            (path, program, blobs)
        })
        .collect()
}

/// The single Vulkan graph of fixture `name`, or `None` (with a note) when the file is absent.
fn fixture(name: &str) -> Option<(VkGraph, Program)> {
    let path = common::fixtures().join(name);
    if !path.exists() {
        eprintln!("{name} is missing; skipping its flatc facts");
        return None;
    }
    let program = Program::open(&path, &[]).unwrap();
    let blobs: Vec<_> = program
        .plans
        .iter()
        .flat_map(|p| &p.delegates)
        .filter(|d| d.id == vulkan::BACKEND_ID)
        .collect();
    assert_eq!(blobs.len(), 1, "{name}: one Vulkan delegate");
    let g = vulkan::parse(&blobs[0].data, &program.named_data)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Some((g, program))
}

fn hist(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// (datatype, dims) of a tensor value.
fn tensor_sig(g: &VkGraph, id: usize) -> (VkDataType, Vec<usize>) {
    let t = g
        .tensor(id)
        .unwrap_or_else(|| panic!("value {id} is not a tensor"));
    (t.datatype, t.dims.clone())
}

#[test]
fn every_vulkan_blob_parses_with_every_constant_resolved_zero_copy() {
    for (path, program, blobs) in vulkan_fixtures() {
        let name = path.display();
        for blob in blobs {
            let g =
                vulkan::parse(&blob, &program.named_data).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(g.version, "0", "{name}");
            assert!(!g.chain.is_empty() && !g.input_ids.is_empty() && !g.output_ids.is_empty());
            // The 1.5.1 serializer puts every weight in named data, none inline.
            assert_eq!(g.header.flatbuffer_offset, 32, "{name}");
            assert_eq!(g.header.bytes_size, 0, "{name}");
            for (i, c) in g.constants.iter().enumerate() {
                assert_eq!(c.data.len() as u64, c.length, "{name}: constant {i}");
                if c.length == 0 {
                    continue;
                }
                assert!(c.is_named(), "{name}: constant {i} is inline");
                let key = c.named_key.as_deref().unwrap();
                let named = program.named_data.get(key).unwrap();
                // Zero-copy: the very bytes of the program's mapping, not a copy.
                assert_eq!(c.data.as_ptr(), named.as_ptr(), "{name}: constant {i}");
            }
            // Every constant is used by a tensor of exactly its size.
            let mut used = vec![false; g.constants.len()];
            for (id, v) in g.values.iter().enumerate() {
                let VkValue::Tensor(t) = v else { continue };
                if let Some(c) = t.constant_id {
                    used[c] = true;
                    assert_eq!(g.constant_data(id).unwrap().len(), t.nbytes().unwrap());
                }
            }
            assert!(used.iter().all(|&u| u), "{name}: an unused constant");
            let ops = g.op_histogram();
            assert_eq!(ops.values().sum::<usize>(), g.chain.len());
        }
    }
}

/// Counts of each value kind, by schema name.
fn kinds(g: &VkGraph) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for v in &g.values {
        *h.entry(v.kind().to_string()).or_insert(0) += 1;
    }
    h
}

/// Facts both Gemma 4 Vulkan exports share: the same decoder, so the same non-linear ops.
fn check_gemma4_common(g: &VkGraph, name: &str) {
    // tokens int32 [1, T<=31] and input_pos int32 [T] (int64 narrowed by the serializer);
    // logits for the last position only.
    let io: Vec<_> = g.input_ids.iter().map(|&i| tensor_sig(g, i)).collect();
    assert_eq!(
        io,
        [
            (VkDataType::Int32, vec![1, 31]),
            (VkDataType::Int32, vec![31])
        ],
        "{name}"
    );
    assert_eq!(g.output_ids.len(), 1);
    assert_eq!(
        tensor_sig(g, g.output_ids[0]),
        (VkDataType::Float32, vec![1, 1, 256])
    );
    // RMSNorm eps is stored as the f32-rounded 1e-6 widened to f64 (flatc prints "1e-06").
    let eps = VkValue::Double(1e-6f32 as f64);
    assert!(g.values.contains(&eps), "{name}: rms_norm eps");
    // gelu(approximate="tanh") carries its mode as a String value.
    let strings: Vec<_> = g
        .values
        .iter()
        .filter_map(|v| match v {
            VkValue::String(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(strings.iter().filter(|&&s| s == "tanh").count(), 12);
    assert!(
        g.values.contains(&VkValue::Int(i64::MAX)),
        "{name}: open slice end"
    );
    assert_eq!(g.chain[0].name, "et_vk.prepack.default");
    let max_mem = g
        .values
        .iter()
        .filter_map(|v| v.as_tensor()?.mem_obj_id)
        .max();
    assert_eq!(max_mem, Some(20), "{name}");
}

#[test]
fn gemma4_vulkan_fp32_matches_its_flatc_dump() {
    let Some((g, program)) = fixture("gemma4_tiny_vulkan_fp32.pte") else {
        return;
    };
    assert_eq!(
        (g.values.len(), g.chain.len(), g.constants.len()),
        (1302, 745, 138)
    );
    assert_eq!(g.input_ids, [180, 181]);
    assert_eq!(g.output_ids, [1301]);
    check_gemma4_common(&g, "fp32");
    assert_eq!(
        kinds(&g),
        hist(&[
            ("VkTensor", 876),
            ("ValueList", 174),
            ("Null", 143),
            ("IntList", 76),
            ("Int", 15),
            ("String", 12),
            ("Double", 3),
            ("Bool", 2),
            ("SymInt", 1),
        ])
    );
    assert_eq!(
        g.op_histogram(),
        hist(&[
            ("aten._softmax.default", 6),
            ("aten.add.Tensor", 51),
            ("aten.arange.start_step", 4),
            ("aten.bmm.default", 20),
            ("aten.cat.default", 16),
            ("aten.clamp.default", 12),
            ("aten.clone.default", 31),
            ("aten.cos.default", 6),
            ("aten.div.Tensor", 1),
            ("aten.embedding.default", 2),
            ("aten.eq.Tensor", 4),
            ("aten.expand_copy.default", 20),
            ("aten.gelu.default", 12),
            ("aten.index_select.default", 10),
            ("aten.linear.default", 52),
            ("aten.mean.dim", 4),
            ("aten.mul.Tensor", 67),
            ("aten.neg.default", 10),
            ("aten.permute_copy.default", 27),
            ("aten.pow.Tensor_Scalar", 4),
            ("aten.rsqrt.default", 4),
            ("aten.select_copy.int", 6),
            ("aten.sin.default", 6),
            ("aten.slice_copy.Tensor", 32),
            ("aten.squeeze_copy.dims", 19),
            ("aten.sub.Tensor", 4),
            ("aten.sum.dim_IntList", 4),
            ("aten.tanh.default", 1),
            ("aten.unsqueeze_copy.default", 65),
            ("aten.view_copy.default", 150),
            ("dim_order_ops._to_dim_order_copy.default", 10),
            ("et_vk.prepack.default", 42),
            ("et_vk.rms_norm.default", 42),
            ("sym_size.int", 1),
        ])
    );
    // All weights are float32 named data; identical tensors (zero KV caches, shared norms)
    // share one sha256 key.
    let consts: Vec<_> = g
        .values
        .iter()
        .filter_map(|v| v.as_tensor())
        .filter(|t| t.constant_id.is_some())
        .collect();
    assert_eq!(consts.len(), 138);
    assert!(consts.iter().all(|t| t.datatype == VkDataType::Float32));
    let total: u64 = g.constants.iter().map(|c| c.length).sum();
    assert_eq!(total, 1_602_600);
    let keys: std::collections::BTreeSet<_> =
        g.constants.iter().map(|c| c.named_key.clone()).collect();
    assert_eq!(keys.len(), 115);
    assert!(keys
        .iter()
        .all(|k| program.named_data.get(k.as_deref().unwrap()).is_some()));
    assert_eq!(g.chain[0].args, [4, 5]);
    let storage = g
        .values
        .iter()
        .filter_map(|v| v.as_tensor())
        .filter(|t| t.storage_type == VkStorageType::Buffer)
        .count();
    assert_eq!(storage, 407);
}

#[test]
fn gemma4_vulkan_8da4w_matches_its_flatc_dump() {
    let Some((g, _)) = fixture("gemma4_tiny_vulkan_8da4w.pte") else {
        return;
    };
    assert_eq!(
        (g.values.len(), g.chain.len(), g.constants.len()),
        (1734, 727, 242)
    );
    assert_eq!(g.input_ids, [284, 285]);
    assert_eq!(g.output_ids, [1733]);
    check_gemma4_common(&g, "8da4w");
    assert_eq!(
        kinds(&g),
        hist(&[
            ("VkTensor", 1014),
            ("Null", 347),
            ("ValueList", 162),
            ("IntList", 127),
            ("String", 64),
            ("Int", 14),
            ("Double", 3),
            ("Bool", 2),
            ("SymInt", 1),
        ])
    );
    let ops = g.op_histogram();
    // Every linear became dynamic-int8-activation × int4-weight, each fed by its own qparams op.
    assert_eq!(ops.get("aten.linear.default"), None);
    assert_eq!(ops["et_vk.linear_dq8ca_q4gsw.default"], 52);
    assert_eq!(ops["torchao.choose_qparams_affine.default"], 52);
    assert_eq!(ops["aten.view_copy.default"], 86);
    assert_eq!(ops["et_vk.rms_norm.default"], 42);
    assert_eq!(ops.len(), 35);
    assert_eq!(ops.values().sum::<usize>(), 727);
    let total: u64 = g.constants.iter().map(|c| c.length).sum();
    assert_eq!(total, 544_296);

    // The first quantized linear (q_proj of layer 0, 64 -> 192, group 32), as flatc shows it.
    let (qp, lin) = (&g.chain[45], &g.chain[46]);
    assert_eq!(qp.name, "torchao.choose_qparams_affine.default");
    assert_eq!(
        qp.args,
        [291, 292, 293, 294, 295, 296, 297, 298, 299, 289, 302]
    );
    assert_eq!(g.values[292], VkValue::String("ASYMMETRIC".into()));
    assert_eq!(g.values[293], VkValue::IntList(vec![1, 1, 64]));
    assert_eq!(g.values[302], VkValue::ValueList(vec![300, 301]));
    assert_eq!(lin.name, "et_vk.linear_dq8ca_q4gsw.default");
    assert_eq!(lin.args, [291, 300, 301, 53, 51, 54, 303, 304, 305]);
    assert_eq!(tensor_sig(&g, 300), (VkDataType::Float32, vec![1, 31]));
    assert_eq!(tensor_sig(&g, 301), (VkDataType::Int8, vec![1, 31]));
    assert_eq!(tensor_sig(&g, 53), (VkDataType::Uint8, vec![192, 32]));
    assert_eq!(tensor_sig(&g, 51), (VkDataType::Int32, vec![2, 192]));
    assert_eq!(tensor_sig(&g, 54), (VkDataType::Float32, vec![2, 192]));
    assert_eq!(g.values[303], VkValue::Int(32));
    assert_eq!(g.values[304], VkValue::Null);
    assert_eq!(tensor_sig(&g, 305), (VkDataType::Float32, vec![1, 31, 192]));

    // Every dq8ca linear: weight uint8 [N, K/2] (two int4 per byte), weight sums int32 and
    // scales f32 both [K/group, N], all resolved to exactly that many bytes.
    let mut shapes = BTreeMap::new();
    for op in g
        .chain
        .iter()
        .filter(|o| o.name == "et_vk.linear_dq8ca_q4gsw.default")
    {
        let a = &op.args;
        let k = *g.tensor(a[0]).unwrap().dims.last().unwrap();
        let VkValue::Int(group) = g.values[a[6]] else {
            panic!("group size")
        };
        let w = g.tensor(a[3]).unwrap();
        assert_eq!(w.datatype, VkDataType::Uint8);
        let n = w.dims[0];
        assert_eq!(w.dims, [n, k / 2]);
        assert_eq!(g.constant_data(a[3]).unwrap().len(), n * k / 2);
        let groups = k / group as usize;
        assert_eq!(tensor_sig(&g, a[4]), (VkDataType::Int32, vec![groups, n]));
        assert_eq!(tensor_sig(&g, a[5]), (VkDataType::Float32, vec![groups, n]));
        *shapes.entry((k, n)).or_insert(0) += 1;
    }
    assert_eq!(shapes.len(), 9);
    assert_eq!(shapes[&(64, 128)], 10);
    // Each choose_qparams_affine returns (scale f32, zero point int8) as a ValueList.
    for op in g
        .chain
        .iter()
        .filter(|o| o.name.starts_with("torchao.choose_qparams"))
    {
        let VkValue::ValueList(out) = &g.values[*op.args.last().unwrap()] else {
            panic!("choose_qparams output is not a ValueList")
        };
        let dtypes: Vec<_> = out.iter().map(|&i| g.tensor(i).unwrap().datatype).collect();
        assert_eq!(dtypes, [VkDataType::Float32, VkDataType::Int8]);
    }
}

/// Parses a mutant; `true` when it was accepted.
fn exercise(bytes: Vec<u8>, named: &NamedData) -> bool {
    let blob = Blob::whole(Arc::new(Bytes::Owned(bytes)));
    let Ok(g) = vulkan::parse(&blob, named) else {
        return false;
    };
    // Whatever parsed must be safe to walk by its ids.
    let _ = g.op_histogram();
    for op in &g.chain {
        for &a in &op.args {
            let _ = g.values[a].kind();
        }
    }
    for id in 0..g.values.len() {
        let _ = g.constant_data(id).map(|d| d.len());
    }
    true
}

#[test]
fn mutated_vulkan_blobs_never_panic() {
    let fixtures = vulkan_fixtures();
    let n_blobs: usize = fixtures.iter().map(|(_, _, b)| b.len()).sum();
    // About 3000 mutants in all keeps this test at a few seconds in the dev profile.
    let per_seed = common::fuzz::iters((3000 / n_blobs).max(200));
    let mut seeds = Vec::new();
    let mut named = Vec::new();
    for (path, program, blobs) in &fixtures {
        for (bi, blob) in blobs.iter().enumerate() {
            // One mutation in eight aims at the VH00 header.
            let seed =
                common::fuzz::Seed::new(format!("{} blob {bi}", path.display()), blob.to_vec());
            seeds.push(seed.with_hot((0..32).collect()));
            named.push(&program.named_data);
        }
    }
    common::fuzz::run(
        "vulkan blob",
        &seeds,
        per_seed,
        0x5EED_7C2B_0000_0000,
        |si, m| exercise(m, named[si]),
    );
}
