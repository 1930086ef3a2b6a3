//! Unit tests on hand-built blobs: a tiny forward-writing flatbuffer builder stands in for flatc.

use super::*;
use crate::pte::{Bytes, DataFile};
use std::sync::Arc;

/// A field value for the builder.
#[derive(Clone)]
enum F {
    U8(u8),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    Str(String),
    U32s(Vec<u32>),
    F32s(Vec<f32>),
    Table(T),
    Tables(Vec<T>),
}

/// A table: `(slot, value)` pairs.
#[derive(Clone, Default)]
struct T(Vec<(usize, F)>);

impl T {
    fn new() -> T {
        T(Vec::new())
    }
    fn f(mut self, slot: usize, v: F) -> T {
        self.0.retain(|(s, _)| *s != slot);
        self.0.push((slot, v));
        self
    }
    fn without(mut self, slot: usize) -> T {
        self.0.retain(|(s, _)| *s != slot);
        self
    }
}

fn pad_to(b: &mut Vec<u8>, align: usize) {
    while b.len() % align != 0 {
        b.push(0);
    }
}

fn inline_size(f: &F) -> usize {
    match f {
        F::U8(_) => 1,
        F::I16(_) => 2,
        F::U32(_) | F::I32(_) | F::F32(_) => 4,
        F::U64(_) => 8,
        _ => 4,
    }
}

/// Writes `t` at the end of `b` (vtable first, then the table, then its children, so every
/// uoffset points forward) and returns the table's position.
fn write_table(b: &mut Vec<u8>, t: &T) -> usize {
    let slots = t.0.iter().map(|(s, _)| s + 1).max().unwrap_or(0);
    let mut offs = Vec::new();
    let mut off = 4usize;
    for (_, f) in &t.0 {
        let sz = inline_size(f);
        off = off.div_ceil(sz) * sz;
        offs.push(off);
        off += sz;
    }
    let table_len = off.div_ceil(4) * 4;
    pad_to(b, 2);
    let vt = b.len();
    b.extend_from_slice(&((4 + 2 * slots) as u16).to_le_bytes());
    b.extend_from_slice(&(table_len as u16).to_le_bytes());
    let mut entries = vec![0u16; slots];
    for ((slot, _), o) in t.0.iter().zip(&offs) {
        entries[*slot] = *o as u16;
    }
    for e in entries {
        b.extend_from_slice(&e.to_le_bytes());
    }
    pad_to(b, 8);
    let pos = b.len();
    b.resize(pos + table_len, 0);
    b[pos..pos + 4].copy_from_slice(&((pos - vt) as i32).to_le_bytes());
    let mut children = Vec::new();
    for ((_, f), o) in t.0.iter().zip(&offs) {
        let p = pos + o;
        match f {
            F::U8(v) => b[p] = *v,
            F::I16(v) => b[p..p + 2].copy_from_slice(&v.to_le_bytes()),
            F::U32(v) => b[p..p + 4].copy_from_slice(&v.to_le_bytes()),
            F::I32(v) => b[p..p + 4].copy_from_slice(&v.to_le_bytes()),
            F::F32(v) => b[p..p + 4].copy_from_slice(&v.to_le_bytes()),
            F::U64(v) => b[p..p + 8].copy_from_slice(&v.to_le_bytes()),
            other => children.push((p, other)),
        }
    }
    for (p, f) in children {
        pad_to(b, 8);
        let child = b.len();
        match f {
            F::Str(s) => {
                b.extend_from_slice(&(s.len() as u32).to_le_bytes());
                b.extend_from_slice(s.as_bytes());
                b.push(0);
            }
            F::U32s(v) => {
                b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
            }
            F::F32s(v) => {
                b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
            }
            F::Table(t) => {
                let c = write_table(b, t);
                b[p..p + 4].copy_from_slice(&((c - p) as u32).to_le_bytes());
                continue;
            }
            F::Tables(ts) => {
                b.extend_from_slice(&(ts.len() as u32).to_le_bytes());
                let slots = b.len();
                b.resize(slots + 4 * ts.len(), 0);
                for (i, t) in ts.iter().enumerate() {
                    let c = write_table(b, t);
                    let s = slots + 4 * i;
                    b[s..s + 4].copy_from_slice(&((c - s) as u32).to_le_bytes());
                }
            }
            _ => unreachable!("scalars are written inline"),
        }
        b[p..p + 4].copy_from_slice(&((child - p) as u32).to_le_bytes());
    }
    pos
}

/// A flatbuffer with `ident` whose root table follows a `prefix`-byte reserved area.
fn finish(root: &T, ident: &[u8; 4], prefix: usize) -> Vec<u8> {
    let mut b = vec![0u8; prefix.max(8)];
    b[4..8].copy_from_slice(ident);
    let pos = write_table(&mut b, root);
    b[0..4].copy_from_slice(&(pos as u32).to_le_bytes());
    b
}

/// Named data built the way a `.ptd` carries it.
fn named(entries: &[(&str, &[u8])]) -> NamedData {
    let segs: Vec<T> = {
        let mut off = 0u64;
        entries
            .iter()
            .map(|(_, d)| {
                let t = T::new().f(0, F::U64(off)).f(1, F::U64(d.len() as u64));
                off += d.len() as u64;
                t
            })
            .collect()
    };
    let nd: Vec<T> = entries
        .iter()
        .enumerate()
        .map(|(i, (k, _))| T::new().f(0, F::Str(k.to_string())).f(1, F::U32(i as u32)))
        .collect();
    let root = T::new()
        .f(0, F::U32(0))
        .f(1, F::Tables(segs))
        .f(2, F::Tables(nd));
    let mut b = finish(&root, b"FT01", 48);
    let fb_size = b.len() as u64;
    pad_to(&mut b, 16);
    let seg_base = b.len() as u64;
    entries.iter().for_each(|(_, d)| b.extend_from_slice(d));
    b[8..12].copy_from_slice(b"FH01");
    b[12..16].copy_from_slice(&40u32.to_le_bytes());
    b[16..24].copy_from_slice(&0u64.to_le_bytes());
    b[24..32].copy_from_slice(&fb_size.to_le_bytes());
    b[32..40].copy_from_slice(&seg_base.to_le_bytes());
    let seg_size = b.len() as u64 - seg_base;
    b[40..48].copy_from_slice(&seg_size.to_le_bytes());
    DataFile::parse(Arc::new(Bytes::Owned(b)))
        .expect("test .ptd")
        .named
}

/// An XH00 blob around an XNNGraph table, with `inline` as its constant data region.
fn blob_of(graph: &T, inline: &[u8]) -> Vec<u8> {
    let fb = finish(graph, b"XN01", 8);
    let mut b = vec![0u8; 32];
    b[4..8].copy_from_slice(b"XH00");
    b[8..10].copy_from_slice(&30u16.to_le_bytes());
    b[10..14].copy_from_slice(&32u32.to_le_bytes());
    b[14..18].copy_from_slice(&(fb.len() as u32).to_le_bytes());
    b.extend_from_slice(&fb);
    pad_to(&mut b, 16);
    let co = b.len() as u32;
    b[18..22].copy_from_slice(&co.to_le_bytes());
    b[22..30].copy_from_slice(&(inline.len() as u64).to_le_bytes());
    b.extend_from_slice(inline);
    b
}

fn run(bytes: Vec<u8>, nd: &NamedData) -> Result<XnnGraph> {
    parse(&Blob::whole(Arc::new(Bytes::Owned(bytes))), nd)
}

fn tensor(dt: i16, dims: &[u32], cbi: u32, ext: u32, flags: u32, id: u32) -> T {
    T::new()
        .f(0, F::I16(dt))
        .f(1, F::U32(dims.len() as u32))
        .f(2, F::U32s(dims.to_vec()))
        .f(3, F::U32(cbi))
        .f(4, F::U32(ext))
        .f(5, F::U32(flags))
        .f(6, F::U32(id))
}

fn plain(t: T) -> T {
    T::new().f(0, F::U8(1)).f(1, F::Table(t))
}

fn quantized(t: T, qtag: u8, q: T) -> T {
    let qt = T::new()
        .f(0, F::Table(t))
        .f(1, F::U8(qtag))
        .f(2, F::Table(q));
    T::new().f(0, F::U8(2)).f(1, F::Table(qt))
}

fn xnode(tag: u8, body: T, debug: u32) -> T {
    T::new()
        .f(0, F::U8(tag))
        .f(1, F::Table(body))
        .f(2, F::U32(debug))
}

fn constant(offset: u64, size: u64, key: &str) -> T {
    T::new()
        .f(0, F::U64(offset))
        .f(1, F::U64(size))
        .f(2, F::Str(key.into()))
}

fn graph(nodes: Vec<T>, values: Vec<T>, externs: u32, ins: &[u32], outs: &[u32], cd: Vec<T>) -> T {
    T::new()
        .f(0, F::Str("0".into()))
        .f(1, F::Tables(nodes))
        .f(2, F::Tables(values))
        .f(3, F::U32(externs))
        .f(4, F::U32s(ins.to_vec()))
        .f(5, F::U32s(outs.to_vec()))
        .f(8, F::Tables(cd))
}

const FP32: i16 = 1;
const QDINT8: i16 = 9;
const QBINT4: i16 = 10;

/// The 8da4w linear layout real exports use: Convert(fp32 → qdint8 per token) feeding
/// FullyConnected with a qbint4 [N, K] filter and bf16 group scales, both in named data.
fn linear_8da4w(n: u32, k: u32, gs: u32) -> (T, NamedData) {
    let filter = vec![0x88u8; (n * k / 2) as usize];
    let scales: Vec<u8> = (0..n * k / gs)
        .flat_map(|_| 0x3f80u16.to_le_bytes())
        .collect();
    let nd = named(&[("w", &filter), ("scale_w", &scales)]);
    let values = vec![
        plain(tensor(FP32, &[1, k], 0, 0, FLAG_EXTERNAL_INPUT, 0)),
        quantized(
            tensor(QDINT8, &[1, k], 0, INVALID_ID, 0, 1),
            3,
            T::new().f(0, F::I32(1)),
        ),
        quantized(
            tensor(QBINT4, &[n, k], 1, INVALID_ID, 0, 2),
            4,
            T::new()
                .f(0, F::F32s(vec![]))
                .f(1, F::I32(0))
                .f(2, F::I32(gs as i32))
                .f(4, F::U32(2))
                .f(5, F::U32(n * k / gs)),
        ),
        plain(tensor(FP32, &[1, n], 0, 1, FLAG_EXTERNAL_OUTPUT, 3)),
    ];
    let nodes = vec![
        xnode(
            18,
            T::new().f(0, F::U32(0)).f(1, F::U32(1)).f(2, F::U32(0)),
            2,
        ),
        xnode(
            2,
            T::new()
                .f(0, F::U32(1))
                .f(1, F::U32(2))
                .f(2, F::U32(INVALID_ID))
                .f(3, F::U32(3))
                .f(4, F::U32(0)),
            5,
        ),
    ];
    let cd = vec![
        constant(0, 0, ""),
        constant(NAMED_OFFSET, (n * k / 2) as u64, "w"),
        constant(NAMED_OFFSET, (n * k / gs * 2) as u64, "scale_w"),
    ];
    (graph(nodes, values, 2, &[0], &[3], cd), nd)
}

#[test]
fn parses_8da4w_linear_with_named_filter_and_bf16_scales() {
    let (g, nd) = linear_8da4w(32, 64, 32);
    let x = run(blob_of(&g, &[]), &nd).unwrap();
    assert_eq!(x.version, "0");
    assert_eq!(
        (x.num_externs, &x.input_ids[..], &x.output_ids[..]),
        (2, &[0][..], &[3][..])
    );
    assert_eq!(x.values.len(), 4);
    let hist = x.node_histogram();
    assert_eq!(hist.get("XNNConvert"), Some(&1));
    assert_eq!(hist.get("XNNFullyConnected"), Some(&1));
    let NodeKind::FullyConnected(fc) = &x.nodes[1].kind else {
        panic!("{:?}", x.nodes[1].kind)
    };
    assert_eq!(fc.bias_id, None);
    assert_eq!(x.nodes[1].debug_handle, 5);
    let filter = x.value(fc.filter_id).unwrap();
    assert_eq!(filter.tensor.datatype, Datatype::Qbint4);
    assert_eq!(filter.tensor.data.as_ref().unwrap().len(), 32 * 64 / 2);
    let Some(QuantParams::PerChannelGroup(q)) = &filter.quant else {
        panic!("{:?}", filter.quant)
    };
    assert_eq!((q.group_size, q.num_scales), (32, 64));
    assert_eq!(q.scale_data.as_ref().unwrap().len(), 128);
    assert!(q.scales_f32().iter().all(|&s| s == 1.0));
    let act = x.value(fc.input1_id).unwrap();
    assert!(matches!(
        act.quant,
        Some(QuantParams::PerTokenDynamic(PerTokenDynamicQuant {
            num_nonbatch_dims: 1
        }))
    ));
    assert_eq!(x.constant_data[2].named_key.as_deref(), Some("scale_w"));
}

#[test]
fn resolves_inline_constants_relative_to_the_constant_region() {
    // Linear 2 → 1 with an fp32 weight and bias stored inline after the flatbuffer.
    let mut inline = vec![0xEEu8; 4];
    inline.extend([1f32, 2.0].iter().flat_map(|v| v.to_le_bytes()));
    inline.extend(0.5f32.to_le_bytes());
    let values = vec![
        plain(tensor(FP32, &[1, 2], 0, 0, FLAG_EXTERNAL_INPUT, 0)),
        plain(tensor(FP32, &[1, 2], 1, INVALID_ID, 0, 1)),
        plain(tensor(FP32, &[1], 2, INVALID_ID, 0, 2)),
        plain(tensor(FP32, &[1, 1], 0, 1, FLAG_EXTERNAL_OUTPUT, 3)),
    ];
    let fc = T::new()
        .f(0, F::U32(0))
        .f(1, F::U32(1))
        .f(2, F::U32(2))
        .f(3, F::U32(3));
    let g = graph(
        vec![xnode(2, fc, 1)],
        values,
        2,
        &[0],
        &[3],
        vec![constant(0, 0, ""), constant(4, 8, ""), constant(12, 4, "")],
    );
    let x = run(blob_of(&g, &inline), &NamedData::default()).unwrap();
    let w = x.values[1].tensor.data.as_ref().unwrap();
    assert_eq!(&w[..], &inline[4..12]);
    assert_eq!(
        &x.values[2].tensor.data.as_ref().unwrap()[..],
        &0.5f32.to_le_bytes()
    );
    let NodeKind::FullyConnected(fc) = &x.nodes[0].kind else {
        panic!()
    };
    assert_eq!(fc.bias_id, Some(2));
    assert_eq!(x.nodes[0].kind.inputs(), vec![0, 1, 2]);

    // One byte past the region is refused.
    let g = g.f(
        8,
        F::Tables(vec![
            constant(0, 0, ""),
            constant(9, 8, ""),
            constant(12, 4, ""),
        ]),
    );
    let e = run(blob_of(&g, &inline), &NamedData::default()).unwrap_err();
    assert!(e.to_string().contains("constant_data[1]"), "{e}");
    assert!(
        e.to_string()
            .contains("past the 16-byte constant data region"),
        "{e}"
    );
}

#[test]
fn decodes_parameterised_nodes_and_output_min_max() {
    let v = |id: u32| plain(tensor(FP32, &[4, 8], 0, INVALID_ID, 0, id));
    let mut values: Vec<T> = (1..6).map(v).collect();
    values.insert(
        0,
        plain(tensor(FP32, &[4, 8], 0, 0, FLAG_EXTERNAL_INPUT, 0)),
    );
    values.push(plain(tensor(FP32, &[32], 0, 1, FLAG_EXTERNAL_OUTPUT, 6)));
    let clamp = xnode(6, T::new().f(0, F::U32(0)).f(1, F::U32(1)), 1)
        .f(3, F::Table(T::new().f(0, F::F32(0.1)).f(1, F::F32(0.9))));
    let transpose = xnode(
        5,
        T::new()
            .f(0, F::U32(2))
            .f(1, F::U32s(vec![1, 0]))
            .f(2, F::U32(1))
            .f(3, F::U32(2)),
        2,
    );
    let leaky = xnode(
        25,
        T::new().f(0, F::F32(0.2)).f(1, F::U32(2)).f(2, F::U32(3)),
        3,
    );
    let cat = xnode(
        32,
        T::new()
            .f(0, F::U32(1))
            .f(1, F::U32(3))
            .f(2, F::U32(2))
            .f(3, F::U32(INVALID_ID))
            .f(4, F::U32(INVALID_ID))
            .f(5, F::U32(4)),
        4,
    );
    let slice = xnode(
        35,
        T::new()
            .f(0, F::U32(2))
            .f(1, F::U32s(vec![0, 0]))
            .f(2, F::U32s(vec![4, 8]))
            .f(3, F::U32(4))
            .f(4, F::U32(5)),
        5,
    );
    let reshape = xnode(
        20,
        T::new()
            .f(0, F::U32(1))
            .f(1, F::U32s(vec![32]))
            .f(2, F::U32(5))
            .f(3, F::U32(6)),
        6,
    );
    let g = graph(
        vec![clamp, transpose, leaky, cat, slice, reshape],
        values,
        2,
        &[0],
        &[6],
        vec![],
    );
    let x = run(blob_of(&g, &[]), &NamedData::default()).unwrap();
    assert_eq!(
        x.nodes[0].output_min_max,
        Some(OutputMinMax {
            output_min: 0.1,
            output_max: 0.9
        })
    );
    assert_eq!(x.nodes[1].output_min_max, None);
    assert!(matches!(&x.nodes[1].kind, NodeKind::StaticTranspose(t) if t.perm == [1, 0]));
    assert!(matches!(&x.nodes[2].kind, NodeKind::LeakyRelu(l) if l.negative_slope == 0.2));
    let NodeKind::Concatenate2(c) = &x.nodes[3].kind else {
        panic!()
    };
    assert_eq!((c.axis, &c.input_ids[..], c.output_id), (1, &[3, 2][..], 4));
    assert!(matches!(&x.nodes[4].kind, NodeKind::StaticSlice(s) if s.sizes == [4, 8]));
    assert!(matches!(&x.nodes[5].kind, NodeKind::StaticReshape(r) if r.new_shape == [32]));
    let names: Vec<_> = x.nodes.iter().map(|n| n.kind.name()).collect();
    assert_eq!(
        names,
        [
            "XNNClamp",
            "XNNStaticTranspose",
            "XNNLeakyReLU",
            "XNNConcatenate2",
            "XNNStaticSlice",
            "XNNStaticReshape"
        ]
    );
}

#[test]
fn every_known_node_tag_decodes_and_round_trips_its_tag() {
    // A table with every slot 0..20 set to 0 decodes as any member; ids 0 all name value 0.
    let body = (0..20).fold(T::new(), |t, s| t.f(s, F::U32(0)));
    for tag in 1..=47u8 {
        let mut body = body.clone();
        // Vector-valued fields must be vectors; give them num_dims 0 worth of entries.
        match tag {
            5 | 20 => body = body.f(1, F::U32s(vec![])),
            10 => body = body.f(0, F::U32s(vec![])).f(1, F::U32s(vec![])),
            35 => body = body.f(1, F::U32s(vec![])).f(2, F::U32s(vec![])),
            _ => {}
        }
        let g = graph(
            vec![xnode(tag, body, 0)],
            vec![plain(tensor(FP32, &[1], 0, INVALID_ID, 0, 0))],
            0,
            &[],
            &[],
            vec![],
        );
        let x = run(blob_of(&g, &[]), &NamedData::default())
            .unwrap_or_else(|e| panic!("tag {tag}: {e}"));
        assert_eq!(x.nodes[0].kind.tag(), tag);
        assert_eq!(Some(x.nodes[0].kind.name()), node::tag_name(tag));
    }
}

#[test]
fn rejects_unknown_union_and_enum_values() {
    let (g, nd) = linear_8da4w(8, 64, 32);
    let nodes = |tag: u8| {
        F::Tables(vec![xnode(
            tag,
            T::new().f(0, F::U32(0)).f(1, F::U32(1)),
            0,
        )])
    };
    let e = run(blob_of(&g.clone().f(1, nodes(48)), &[]), &nd).unwrap_err();
    assert!(
        matches!(
            e,
            XnnError::UnknownTag {
                what: "XNodeUnion",
                tag: 48,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("xnodes[0]"), "{e}");

    let bad_value = |v: T| {
        let values = vec![v];
        run(
            blob_of(&graph(vec![], values, 0, &[], &[], vec![]), &[]),
            &NamedData::default(),
        )
        .unwrap_err()
    };
    let e = bad_value(plain(tensor(15, &[1], 0, INVALID_ID, 0, 0)));
    assert!(
        matches!(
            e,
            XnnError::UnknownTag {
                what: "XNNDatatype",
                tag: 15,
                ..
            }
        ),
        "{e}"
    );
    let e = bad_value(plain(tensor(0, &[1], 0, INVALID_ID, 0, 0)));
    assert!(
        matches!(
            e,
            XnnError::UnknownTag {
                what: "XNNDatatype",
                tag: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = bad_value(T::new().f(0, F::U8(3)).f(1, F::Table(T::new())));
    assert!(
        matches!(
            e,
            XnnError::UnknownTag {
                what: "XValueUnion",
                tag: 3,
                ..
            }
        ),
        "{e}"
    );
    let e = bad_value(quantized(
        tensor(QDINT8, &[1], 0, INVALID_ID, 0, 0),
        5,
        T::new(),
    ));
    assert!(
        matches!(
            e,
            XnnError::UnknownTag {
                what: "XNNQuantParams",
                tag: 5,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("xvalues[0]"), "{e}");
}

#[test]
fn rejects_dangling_value_ids_and_inconsistent_externals() {
    let (g, nd) = linear_8da4w(8, 64, 32);
    let fc = |filter: u32| {
        xnode(
            2,
            T::new()
                .f(0, F::U32(1))
                .f(1, F::U32(filter))
                .f(2, F::U32(INVALID_ID))
                .f(3, F::U32(3)),
            5,
        )
    };
    let conv = xnode(18, T::new().f(0, F::U32(0)).f(1, F::U32(1)), 2);
    let e = run(
        blob_of(&g.clone().f(1, F::Tables(vec![conv.clone(), fc(9)])), &[]),
        &nd,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("xnodes[1] (XNNFullyConnected).filter_id: value 9 does not exist"),
        "{e}"
    );
    let e = run(
        blob_of(&g.clone().f(1, F::Tables(vec![conv, fc(INVALID_ID)])), &[]),
        &nd,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("filter_id: is XNN_INVALID_VALUE_ID"), "{e}");

    let e = run(blob_of(&g.clone().f(4, F::U32s(vec![7])), &[]), &nd).unwrap_err();
    assert!(e.to_string().contains("XNNGraph.input_ids"), "{e}");
    let e = run(blob_of(&g.clone().f(5, F::U32s(vec![])), &[]), &nd).unwrap_err();
    assert!(e.to_string().contains("XNNGraph.output_ids"), "{e}");
    let e = run(blob_of(&g.clone().f(3, F::U32(1)), &[]), &nd).unwrap_err();
    assert!(e.to_string().contains("not below num_externs 1"), "{e}");
    let e = run(blob_of(&g.f(3, F::U32(5000)), &[]), &nd).unwrap_err();
    assert!(e.to_string().contains("exceeds the runtime's limit"), "{e}");
}

#[test]
fn checks_constant_sizes_group_sizes_and_scale_counts() {
    let (g, nd) = linear_8da4w(8, 64, 32);
    let with_filter = |dims: &[u32], q: T| {
        let values = vec![
            plain(tensor(FP32, &[1, 64], 0, 0, FLAG_EXTERNAL_INPUT, 0)),
            quantized(
                tensor(QDINT8, &[1, 64], 0, INVALID_ID, 0, 1),
                3,
                T::new().f(0, F::I32(1)),
            ),
            quantized(tensor(QBINT4, dims, 1, INVALID_ID, 0, 2), 4, q),
            plain(tensor(FP32, &[1, 8], 0, 1, FLAG_EXTERNAL_OUTPUT, 3)),
        ];
        run(blob_of(&g.clone().f(2, F::Tables(values)), &[]), &nd)
    };
    let q = |gs: i32, idx: u32, n: u32| {
        T::new()
            .f(1, F::I32(0))
            .f(2, F::I32(gs))
            .f(4, F::U32(idx))
            .f(5, F::U32(n))
    };
    with_filter(&[8, 64], q(32, 2, 16)).unwrap();
    // qbint4 [8, 64] is 256 bytes; [8, 128] would need 512.
    let e = with_filter(&[8, 128], q(32, 2, 32))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs 512 bytes but constant_data[1] holds 256"),
        "{e}"
    );
    let e = with_filter(&[8, 64], q(24, 2, 16)).unwrap_err().to_string();
    assert!(e.contains("group_size 24 does not divide K = 64"), "{e}");
    let e = with_filter(&[8, 64], q(0, 2, 16)).unwrap_err().to_string();
    assert!(e.contains("group_size 0"), "{e}");
    let e = with_filter(&[8, 64], q(16, 2, 32)).unwrap_err().to_string();
    assert!(e.contains("needs 32 bf16 scales"), "{e}");
    let e = with_filter(&[8, 64], q(32, 2, 17)).unwrap_err().to_string();
    assert!(e.contains("num_scales is 17"), "{e}");
    let e = with_filter(&[8, 64], q(32, 9, 16)).unwrap_err().to_string();
    assert!(
        e.contains("scale_buffer_idx: is 9, outside constant_data"),
        "{e}"
    );
    let e = with_filter(&[8, 64], q(32, 2, 16).f(1, F::I32(1)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("channel_dim is 1"), "{e}");
    let e = with_filter(&[2, 4, 64], q(32, 2, 16))
        .unwrap_err()
        .to_string();
    assert!(e.contains("2-D"), "{e}");
}

#[test]
fn named_data_must_exist_and_cover_the_declared_size() {
    let (g, _) = linear_8da4w(8, 64, 32);
    let e = run(blob_of(&g, &[]), &NamedData::default()).unwrap_err();
    assert!(
        matches!(&e, XnnError::MissingNamedData { index: 1, key } if key == "w"),
        "{e}"
    );
    let short = named(&[("w", &[0u8; 255]), ("scale_w", &[0u8; 32])]);
    let e = run(blob_of(&g, &[]), &short).unwrap_err().to_string();
    assert!(
        e.contains("size is 256 but named data `w` holds 255 bytes"),
        "{e}"
    );
    let g = g.f(
        8,
        F::Tables(vec![
            constant(0, 0, ""),
            constant(0, 256, "w"),
            constant(NAMED_OFFSET, 32, ""),
        ]),
    );
    let e = run(blob_of(&g, &[]), &short).unwrap_err().to_string();
    assert!(
        e.contains("both an inline offset 0 and named_key `w`"),
        "{e}"
    );
}

#[test]
fn header_fields_are_bounds_checked() {
    let (g, nd) = linear_8da4w(8, 64, 32);
    let good = blob_of(&g, &[]);
    run(good.clone(), &nd).unwrap();
    let patch = |at: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        run(b, &nd).unwrap_err().to_string()
    };
    assert!(patch(4, b"XH01").contains("expected \"XH00\""));
    assert!(patch(8, &29u16.to_le_bytes()).contains("header length is 29"));
    assert!(patch(10, &16u32.to_le_bytes()).contains("inside the 30-byte header"));
    assert!(patch(14, &u32::MAX.to_le_bytes()).contains("extends past the end"));
    assert!(patch(18, &40u32.to_le_bytes()).contains("lies inside the flatbuffer"));
    assert!(patch(22, &u64::MAX.to_le_bytes()).contains("extends past the end"));
    assert!(patch(36, b"XN00").contains("legacy XN00"));
    assert!(patch(36, b"ABCD").contains("expected \"XN01\""));
    let e = run(good[..20].to_vec(), &nd).unwrap_err().to_string();
    assert!(e.contains("shorter than the 30-byte XH00 header"), "{e}");
    for n in 0..good.len() {
        assert!(
            run(good[..n].to_vec(), &nd).is_err(),
            "truncation to {n} accepted"
        );
    }
}

#[test]
fn constant_byte_sizes_follow_datatype_widths() {
    assert_eq!(Datatype::Qbint4.constant_bytes(&[32, 64]), Some(1024));
    assert_eq!(Datatype::Qcint4.constant_bytes(&[3, 5]), Some(9));
    assert_eq!(Datatype::Fp32.constant_bytes(&[8, 16]), Some(512));
    assert_eq!(Datatype::Bf16.constant_bytes(&[]), Some(2));
    assert_eq!(Datatype::Qpint8.constant_bytes(&[4]), None);
    assert_eq!(
        Datatype::Fp32.constant_bytes(&[u32::MAX, u32::MAX, u32::MAX]),
        None
    );
    for code in 1..=14 {
        assert!(Datatype::from_code(code).is_some());
    }
    assert_eq!(Datatype::from_code(0), None);
    assert_eq!(Datatype::from_code(15), None);
}

#[test]
fn num_dims_must_match_dims() {
    let v = plain(tensor(FP32, &[4, 8], 0, INVALID_ID, 0, 0)).f(
        1,
        F::Table(tensor(FP32, &[4, 8], 0, INVALID_ID, 0, 0).f(1, F::U32(3))),
    );
    let e = run(
        blob_of(&graph(vec![], vec![v], 0, &[], &[], vec![]), &[]),
        &NamedData::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("xvalues[0], XNNTensorValue: num_dims is 3 but dims has 2 entries"),
        "{e}"
    );
}

#[test]
fn graph_needs_xvalues_and_xnodes() {
    let (g, nd) = linear_8da4w(8, 64, 32);
    let e = run(blob_of(&g.clone().without(2), &[]), &nd)
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no xvalues"), "{e}");
    let e = run(blob_of(&g.without(1), &[]), &nd)
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no xnodes"), "{e}");
}

#[test]
fn huge_dims_are_rejected_without_overflow() {
    let (g, nd) = linear_8da4w(8, 64, 32);
    let huge = u32::MAX;
    let q = T::new()
        .f(1, F::I32(0))
        .f(2, F::I32(1))
        .f(4, F::U32(2))
        .f(5, F::U32(16));
    let values = vec![
        plain(tensor(FP32, &[1, 64], 0, 0, FLAG_EXTERNAL_INPUT, 0)),
        quantized(
            tensor(QDINT8, &[1, 64], 0, INVALID_ID, 0, 1),
            3,
            T::new().f(0, F::I32(1)),
        ),
        // Not a constant, so only the scale count check sees the [2^32-1, 2^32-1] shape.
        quantized(tensor(QBINT4, &[huge, huge], 0, INVALID_ID, 0, 2), 4, q),
        plain(tensor(
            FP32,
            &[huge, huge, huge],
            1,
            1,
            FLAG_EXTERNAL_OUTPUT,
            3,
        )),
    ];
    let e = run(
        blob_of(&g.clone().f(2, F::Tables(values.clone())), &[]),
        &nd,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bf16 scales"), "{e}");
    let mut values = values;
    values[2] = plain(tensor(FP32, &[1, 1], 0, INVALID_ID, 0, 2));
    let e = run(blob_of(&g.clone().f(2, F::Tables(values)), &[]), &nd)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot be a constant"), "{e}");
    let neg = plain(tensor(-1, &[1], 0, INVALID_ID, 0, 0));
    let e = run(blob_of(&g.f(2, F::Tables(vec![neg])), &[]), &nd).unwrap_err();
    assert!(
        e.to_string().contains("unknown XNNDatatype value -1"),
        "{e}"
    );
}
