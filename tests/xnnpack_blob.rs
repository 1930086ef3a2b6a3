//! The XNNPACK front end on real exports: every `XnnpackBackend` blob in the fixtures parses, its
//! graph matches what flatc shows for the same bytes, and mutated blobs fail cleanly, never panic.

mod common;

use pteria::frontend::xnnpack::{
    self, Datatype, NodeKind, QuantParams, XnnGraph, FLAG_EXTERNAL_INPUT, FLAG_EXTERNAL_OUTPUT,
};
use pteria::pte::{Blob, Bytes, NamedData, Program};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One fixture program and its XNNPACK delegates as (method, delegate index, blob).
struct Fixture {
    name: String,
    program: Program,
    blobs: Vec<(String, usize, Blob)>,
}

/// Every fixture program with at least one `XnnpackBackend` delegate, sorted by file name.
fn fixtures() -> Vec<Fixture> {
    common::delegate_fixtures(xnnpack::BACKEND_ID)
        .into_iter()
        .map(|(path, program, blobs)| Fixture {
            name: path.file_stem().unwrap().to_string_lossy().into_owned(),
            program,
            blobs,
        })
        .collect()
}

fn parse_all(f: &Fixture) -> Vec<XnnGraph> {
    f.blobs
        .iter()
        .map(|(m, i, b)| {
            xnnpack::parse(b, &f.program.named_data)
                .unwrap_or_else(|e| panic!("{} method `{m}` delegate {i}: {e}", f.name))
        })
        .collect()
}

fn fixture(name: &str) -> Fixture {
    fixtures()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("fixture {name}.pte with an XnnpackBackend delegate is missing"))
}

/// Node histogram summed over all of a program's XNNPACK blobs.
fn histogram(graphs: &[XnnGraph]) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for g in graphs {
        for (k, v) in g.node_histogram() {
            *h.entry(k).or_insert(0) += v;
        }
    }
    h
}

#[test]
fn every_xnnpack_blob_parses_with_consistent_externals_and_constants() {
    let fx = fixtures();
    assert!(!fx.is_empty(), "no fixture has an XnnpackBackend delegate");
    for f in &fx {
        for ((m, i, _), g) in f.blobs.iter().zip(parse_all(f)) {
            let at = format!("{} `{m}` delegate {i}", f.name);
            // The serializer numbers values in definition order: id_out is the index.
            for (j, v) in g.values.iter().enumerate() {
                assert_eq!(v.id() as usize, j, "{at}");
            }
            // Every external is an input or an output; the lists mirror the flags.
            assert_eq!(
                g.num_externs as usize,
                g.input_ids.len() + g.output_ids.len(),
                "{at}"
            );
            for &id in &g.input_ids {
                assert_ne!(
                    g.value(id).unwrap().tensor.flags & FLAG_EXTERNAL_INPUT,
                    0,
                    "{at}"
                );
            }
            for &id in &g.output_ids {
                assert_ne!(
                    g.value(id).unwrap().tensor.flags & FLAG_EXTERNAL_OUTPUT,
                    0,
                    "{at}"
                );
            }
            // Current exports keep no inline constants: everything is named data keyed by the
            // SHA-256 of its bytes (`scale_` + SHA-256 for quantization scales).
            assert_eq!(g.header.constant_data_size, 0, "{at}");
            assert_eq!(g.header.flatbuffer_offset, 32, "{at}");
            for (j, c) in g.constant_data.iter().enumerate().skip(1) {
                assert_eq!(c.offset, xnnpack::NAMED_OFFSET, "{at} constant_data[{j}]");
                let key = c.named_key.as_deref().unwrap();
                let data = c.data.as_ref().unwrap();
                let digest: String = Sha256::digest(&data[..])
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                assert_eq!(
                    key.strip_prefix("scale_").unwrap_or(key),
                    digest,
                    "{at} constant_data[{j}]"
                );
            }
            // Nodes come in execution order: each reads graph inputs, constants or the outputs
            // of earlier nodes.
            let mut ready: BTreeSet<u32> = g
                .values
                .iter()
                .filter(|v| v.tensor.is_external_input() || v.tensor.data.is_some())
                .map(|v| v.id())
                .collect();
            for (j, n) in g.nodes.iter().enumerate() {
                for id in n.kind.inputs() {
                    assert!(
                        ready.contains(&id),
                        "{at}: xnodes[{j}] reads {id} before it is written"
                    );
                }
                ready.extend(n.kind.outputs());
            }
            for &id in &g.output_ids {
                assert!(ready.contains(&id), "{at}: output {id} is never written");
            }
        }
    }
}

/// The 8da4w linear as exported: `Convert(fp32 → qdint8, PerTokenDynamicQuant{1})` feeding a
/// `FullyConnected` whose filter is a constant `qbint4 [N, K]` with bf16 group scales.
fn check_8da4w_linears(name: &str, g: &XnnGraph, group_size: i32) -> usize {
    let mut producers = BTreeMap::new();
    for n in &g.nodes {
        for id in n.kind.outputs() {
            producers.insert(id, &n.kind);
        }
    }
    let mut linears = 0;
    for n in &g.nodes {
        let NodeKind::FullyConnected(fc) = &n.kind else {
            continue;
        };
        linears += 1;
        let act = g.value(fc.input1_id).unwrap();
        assert_eq!(act.tensor.datatype, Datatype::Qdint8, "{name}");
        let Some(QuantParams::PerTokenDynamic(p)) = &act.quant else {
            panic!("{name}: FC input quant {:?}", act.quant)
        };
        assert_eq!(p.num_nonbatch_dims, 1, "{name}");
        let Some(NodeKind::Convert(c)) = producers.get(&fc.input1_id) else {
            panic!(
                "{name}: FC input {} is not produced by a Convert",
                fc.input1_id
            )
        };
        assert_eq!(
            g.value(c.input_id).unwrap().tensor.datatype,
            Datatype::Fp32,
            "{name}"
        );

        let w = g.value(fc.filter_id).unwrap();
        assert_eq!(w.tensor.datatype, Datatype::Qbint4, "{name}");
        let [n_out, k] = w.tensor.dims[..] else {
            panic!("{name}: filter dims {:?}", w.tensor.dims)
        };
        assert_eq!(
            w.tensor.data.as_ref().unwrap().len(),
            (n_out * k / 2) as usize,
            "{name}"
        );
        let Some(QuantParams::PerChannelGroup(q)) = &w.quant else {
            panic!("{name}: filter quant {:?}", w.quant)
        };
        assert_eq!((q.channel_dim, q.group_size), (0, group_size), "{name}");
        assert!(
            q.scale.is_empty() && q.scale_bf16.is_empty(),
            "{name}: inline scales"
        );
        assert_eq!(q.num_scales, n_out * k / group_size as u32, "{name}");
        let scales = q.scale_data.as_ref().unwrap();
        assert_eq!(scales.len(), 2 * q.num_scales as usize, "{name}");
        let key = g.constant_data[q.scale_buffer_idx as usize]
            .named_key
            .as_deref()
            .unwrap();
        assert!(key.starts_with("scale_"), "{name}: scale key {key}");
        assert!(
            q.scales_f32().iter().all(|s| s.is_finite() && *s > 0.0),
            "{name}: scales"
        );
    }
    linears
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

/// Node kinds shared by both Gemma 4 exports (the graph is cut into 121 blobs by the portable
/// ops between them: embedding, KV-cache updates, custom SDPA). Counted with flatc.
const GEMMA_NODES: [(&str, usize); 14] = [
    ("XNNAdd", 33),
    ("XNNClamp", 12),
    ("XNNConcatenate2", 10),
    ("XNNCos", 6),
    ("XNNDiv", 1),
    ("XNNFullyConnected", 52),
    ("XNNGelu", 12),
    ("XNNMultiply", 137),
    ("XNNNegate", 10),
    ("XNNReciprocalSquareRoot", 46),
    ("XNNSin", 6),
    ("XNNSquare", 46),
    ("XNNStaticTranspose", 21),
    ("XNNTanh", 1),
];

#[test]
fn gemma4_fp32_blobs_hold_fp32_linears_and_fp16_range_clamps() {
    let f = fixture("gemma4_tiny_xnnpack_fp32");
    let graphs = parse_all(&f);
    assert_eq!(graphs.len(), 121);
    assert_eq!(histogram(&graphs), counts(&GEMMA_NODES));
    assert_eq!(graphs.iter().map(|g| g.values.len()).sum::<usize>(), 777);
    assert_eq!(graphs.iter().map(|g| g.num_externs).sum::<u32>(), 538);
    // The first blob scales the embedding output by a scalar input and squares the product for
    // the first RMSNorm; activations carry the dynamic sequence dimension at its bound (31).
    let g0 = &graphs[0];
    let names: Vec<_> = g0.nodes.iter().map(|n| n.kind.name()).collect();
    assert_eq!(names, ["XNNMultiply", "XNNSquare"]);
    assert_eq!(
        (&g0.input_ids[..], &g0.output_ids[..]),
        (&[0, 1][..], &[2, 3][..])
    );
    assert_eq!(g0.value(0).unwrap().tensor.dims, [1, 31, 64]);
    assert_eq!(g0.value(1).unwrap().tensor.dims, [1]);
    for g in &graphs {
        assert!(g.values.iter().all(|v| v.quant.is_none()));
        for n in &g.nodes {
            match &n.kind {
                NodeKind::FullyConnected(fc) => {
                    assert_eq!(fc.bias_id, None);
                    let w = g.value(fc.filter_id).unwrap();
                    assert_eq!(w.tensor.datatype, Datatype::Fp32);
                    let [o, i] = w.tensor.dims[..] else {
                        panic!("filter dims {:?}", w.tensor.dims)
                    };
                    assert_eq!(w.tensor.data.as_ref().unwrap().len(), (o * i * 4) as usize);
                }
                NodeKind::Clamp(_) => {
                    let mm = n.output_min_max.unwrap();
                    assert_eq!((mm.output_min, mm.output_max), (-65504.0, 65504.0));
                }
                _ => assert!(n.output_min_max.is_none(), "{:?}", n),
            }
        }
    }
}

#[test]
fn gemma4_8da4w_linears_are_convert_then_fully_connected_on_qbint4() {
    for name in [
        "gemma4_tiny_xnnpack_8da4w",
        "gemma4_tiny_xnnpack_8da4w_emb8",
    ] {
        check_gemma4_8da4w(&fixture(name));
    }
}

/// Quantizing the embeddings (emb8) happens outside the delegates: the XNNPACK blobs are the same
/// bytes as in the plain 8da4w export.
#[test]
fn gemma4_emb8_leaves_the_xnnpack_blobs_unchanged() {
    let a = fixture("gemma4_tiny_xnnpack_8da4w");
    let b = fixture("gemma4_tiny_xnnpack_8da4w_emb8");
    assert_eq!(a.blobs.len(), b.blobs.len());
    for ((_, i, x), (_, _, y)) in a.blobs.iter().zip(&b.blobs) {
        assert!(x[..] == y[..], "delegate {i} differs");
    }
}

/// The qbint4 layout, checked against the fp32 export of the same weights: byte `k / 2` of row
/// `n` holds element `k` in its low nibble when `k` is even, high nibble when odd, stored +8;
/// `w ≈ (q - 8) * bf16_scale[n][k / group_size]` to within half a quantization step.
#[test]
fn gemma4_qbint4_filters_dequantize_to_the_fp32_export_weights() {
    let fp = parse_all(&fixture("gemma4_tiny_xnnpack_fp32"));
    let q = parse_all(&fixture("gemma4_tiny_xnnpack_8da4w"));
    let filters = |graphs: &[XnnGraph]| -> Vec<(Vec<u32>, Blob, Option<Blob>)> {
        let mut out = Vec::new();
        for g in graphs {
            for n in &g.nodes {
                if let NodeKind::FullyConnected(fc) = &n.kind {
                    let w = g.value(fc.filter_id).unwrap();
                    let scales = match &w.quant {
                        Some(QuantParams::PerChannelGroup(p)) => p.scale_data.clone(),
                        _ => None,
                    };
                    out.push((
                        w.tensor.dims.clone(),
                        w.tensor.data.clone().unwrap(),
                        scales,
                    ));
                }
            }
        }
        out
    };
    let (fp, q) = (filters(&fp), filters(&q));
    assert_eq!(fp.len(), 52);
    assert_eq!(fp.len(), q.len());
    let mut worst = 0f32;
    for (li, ((dims, w, _), (qdims, qb, scales))) in fp.iter().zip(&q).enumerate() {
        assert_eq!(dims, qdims, "linear {li}");
        let (n, k) = (dims[0] as usize, dims[1] as usize);
        let scales: Vec<f32> = scales
            .as_ref()
            .unwrap()
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect();
        let groups = k / 32;
        for r in 0..n {
            for c in 0..k {
                let i = r * k + c;
                let want = f32::from_le_bytes(w[4 * i..4 * i + 4].try_into().unwrap());
                let byte = qb[i / 2];
                let nibble = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
                let s = scales[r * groups + c / 32];
                let got = (nibble as f32 - 8.0) * s;
                // Half a step from rounding (plus the scale's later rounding to bf16), unless
                // the weight lay beyond the int4 range and was clamped to -8 or 7.
                let err = (got - want).abs() / s;
                let ok = match nibble {
                    0 => want / s <= -7.45,
                    15 => want / s >= 6.45,
                    _ => {
                        worst = worst.max(err);
                        err <= 0.55
                    }
                };
                assert!(ok, "linear {li} [{r}, {c}]: {got} vs {want} (scale {s})");
            }
        }
    }
    println!("qbint4 vs fp32: worst unclamped error {worst:.3} quantization steps");
}

fn check_gemma4_8da4w(f: &Fixture) {
    let graphs = parse_all(f);
    assert_eq!(graphs.len(), 121);
    let mut want = counts(&GEMMA_NODES);
    want.insert("XNNConvert".into(), 52);
    assert_eq!(histogram(&graphs), want);
    assert_eq!(graphs.iter().map(|g| g.values.len()).sum::<usize>(), 829);
    let linears: usize = graphs
        .iter()
        .map(|g| check_8da4w_linears(&f.name, g, 32))
        .sum();
    assert_eq!(linears, 52);

    let mut shapes = BTreeMap::new();
    for g in &graphs {
        for v in g
            .values
            .iter()
            .filter(|v| v.tensor.datatype == Datatype::Qbint4)
        {
            *shapes.entry(v.tensor.dims.clone()).or_insert(0) += 1;
        }
    }
    let want: BTreeMap<Vec<u32>, usize> = [
        (vec![16, 64], 6),
        (vec![32, 64], 8),
        (vec![64, 32], 6),
        (vec![64, 64], 8),
        (vec![64, 128], 6),
        (vec![64, 256], 2),
        (vec![128, 64], 10),
        (vec![192, 64], 1),
        (vec![256, 64], 5),
    ]
    .into_iter()
    .collect();
    assert_eq!(shapes, want);

    // Every Convert feeds exactly one FullyConnected: q, k and v projections of one input get a
    // Convert each (blob 2: three Converts of value 0, then three FCs).
    for g in &graphs {
        for n in &g.nodes {
            let NodeKind::Convert(c) = &n.kind else {
                continue;
            };
            let users = g
                .nodes
                .iter()
                .filter(|m| m.kind.inputs().contains(&c.output_id))
                .count();
            assert_eq!(users, 1);
        }
    }
    let names: Vec<_> = graphs[2].nodes.iter().map(|n| n.kind.name()).collect();
    assert_eq!(
        names,
        [
            "XNNConvert",
            "XNNConvert",
            "XNNConvert",
            "XNNFullyConnected",
            "XNNFullyConnected",
            "XNNFullyConnected"
        ]
    );
    let NodeKind::Convert(c) = &graphs[2].nodes[2].kind else {
        panic!()
    };
    assert_eq!((c.input_id, c.output_id), (0, 3));
}

/// The Llama export keeps attention inside XNNPACK: per layer, one blob computes the scores with
/// BatchMatrixMultiply, the next adds the causal mask and applies Softmax, a third multiplies by V.
#[test]
fn llama_8da4w_blobs_hold_linears_and_batched_attention() {
    let f = fixture("llama_tiny_xnnpack_8da4w");
    let graphs = parse_all(&f);
    assert_eq!(graphs.len(), 36);
    let want = counts(&[
        ("XNNAdd", 15),
        ("XNNBatchMatrixMultiply", 4),
        ("XNNConcatenate2", 4),
        ("XNNConvert", 15),
        ("XNNFullyConnected", 15),
        ("XNNMultiply", 35),
        ("XNNReciprocalSquareRoot", 5),
        ("XNNSigmoid", 2),
        ("XNNSoftmax", 2),
        ("XNNStaticReshape", 16),
        ("XNNStaticTranspose", 14),
        ("XNNSubtract", 4),
    ]);
    assert_eq!(histogram(&graphs), want);
    assert_eq!(graphs.iter().map(|g| g.values.len()).sum::<usize>(), 229);
    assert_eq!(graphs.iter().map(|g| g.num_externs).sum::<u32>(), 138);
    let linears: usize = graphs
        .iter()
        .map(|g| check_8da4w_linears(&f.name, g, 32))
        .sum();
    assert_eq!(linears, 15);
    assert!(graphs
        .iter()
        .all(|g| g.nodes.iter().all(|n| n.output_min_max.is_none())));

    let names =
        |g: &XnnGraph| -> Vec<&'static str> { g.nodes.iter().map(|n| n.kind.name()).collect() };
    let dims = |g: &XnnGraph, id: u32| g.value(id).unwrap().tensor.dims.clone();
    for layer in [6, 22] {
        let scores = &graphs[layer];
        assert_eq!(
            names(scores),
            [
                "XNNStaticTranspose",
                "XNNStaticReshape",
                "XNNBatchMatrixMultiply"
            ]
        );
        let NodeKind::BatchMatrixMultiply(qk) = &scores.nodes[2].kind else {
            panic!()
        };
        // q [H, T, D] · kᵀ [H, D, S] with H = 4, T = 31 (the bound), D = 16, S = 32.
        assert_eq!(dims(scores, qk.input1_id), [4, 31, 16]);
        assert_eq!(dims(scores, qk.input2_id), [4, 16, 32]);
        assert_eq!(dims(scores, qk.output_id), [4, 31, 32]);

        let softmax = &graphs[layer + 1];
        assert_eq!(names(softmax), ["XNNStaticReshape", "XNNAdd", "XNNSoftmax"]);
        let NodeKind::Add(mask) = &softmax.nodes[1].kind else {
            panic!()
        };
        assert_eq!(dims(softmax, mask.input2_id), [31, 32]);
        // The 2 KV heads are expanded to 4 by a reshape of [1, 2, 2, 32, 16].
        let NodeKind::StaticReshape(r) = &softmax.nodes[0].kind else {
            panic!()
        };
        assert_eq!(dims(softmax, r.input_id), [1, 2, 2, 32, 16]);
        assert_eq!(r.new_shape, [1, 4, 32, 16]);

        let pv = &graphs[layer + 2];
        assert_eq!(names(pv), ["XNNStaticReshape", "XNNBatchMatrixMultiply"]);
        let NodeKind::BatchMatrixMultiply(b) = &pv.nodes[1].kind else {
            panic!()
        };
        assert_eq!(dims(pv, b.output_id), [4, 31, 16]);
    }
    // SwiGLU: silu(gate) * up as Sigmoid, Multiply, Multiply.
    assert_eq!(
        names(&graphs[14]),
        ["XNNSigmoid", "XNNMultiply", "XNNMultiply"]
    );
    // The last blob is the lm_head on the last token only: qbint4 [256, 64] → logits [1, 256].
    let head = &graphs[35];
    assert_eq!(names(head), ["XNNConvert", "XNNFullyConnected"]);
    assert_eq!(dims(head, 2), [256, 64]);
    assert_eq!(dims(head, head.output_ids[0]), [1, 256]);
}

// ---------------------------------------------------------------------------------------------
// Mutation fuzzing

#[test]
fn mutated_blobs_never_panic() {
    let fx = fixtures();
    let blob = |bytes: Vec<u8>| Blob::whole(Arc::new(Bytes::Owned(bytes)));
    let mut seeds = Vec::new();
    let mut named: Vec<&NamedData> = Vec::new();
    for f in &fx {
        for (m, i, b) in &f.blobs {
            let name = format!("{} `{m}` {i}", f.name);
            xnnpack::parse(&blob(b.to_vec()), &f.program.named_data)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            seeds.push(common::fuzz::Seed::new(name, b.to_vec()));
            named.push(&f.program.named_data);
        }
    }
    let per_seed = common::fuzz::iters(100_000).div_ceil(seeds.len().max(1));
    common::fuzz::run(
        "xnnpack blob",
        &seeds,
        per_seed,
        0xD1B5_4A32_D192_ED03,
        |si, m| xnnpack::parse(&blob(m), named[si]).is_ok(),
    );
}
