//! Unit tests on hand-built MLX blobs: a tiny forward-only FlatBuffers writer lays out an
//! `MLXGraph` the way the exporter would, so each check (tag layouts, ranges, header) can be pinned
//! without fixtures, Python or flatc.

use super::*;

/// A field value for the test writer; `Obj` fields are listed by slot (`None` = absent).
#[derive(Clone)]
enum F {
    U8(u8),
    I8(i8),
    U32(u32),
    I32(i32),
    I64(i64),
    F32(f32),
    /// A 4-byte inline struct (`Tid`, `Vid`).
    S(u32),
    T(Obj),
    Str(&'static str),
    Tables(Vec<Obj>),
    U32s(Vec<u32>),
    U8s(Vec<u8>),
    /// An offset patched later by the test (to build shared tables).
    Later,
}

#[derive(Clone)]
struct Obj(Vec<Option<F>>);

fn inline_size(f: &F) -> usize {
    match f {
        F::U8(_) | F::I8(_) => 1,
        F::I64(_) => 8,
        _ => 4,
    }
}

/// Writes objects front to back (children after parents, offsets patched), aligned as FlatBuffers
/// requires relative to the buffer start.
struct Writer {
    b: Vec<u8>,
    later: Vec<usize>,
}

impl Writer {
    fn align(&mut self, a: usize) {
        while self.b.len() % a != 0 {
            self.b.push(0);
        }
    }

    fn put_u32(&mut self, at: usize, v: u32) {
        self.b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn table(&mut self, o: &Obj) -> usize {
        let n = o.0.len();
        self.align(2);
        let vt = self.b.len();
        self.b.resize(vt + 4 + 2 * n, 0);
        self.align(8);
        let tp = self.b.len();
        let mut entries = vec![0u16; n];
        let mut off = 4usize;
        for (i, f) in o.0.iter().enumerate() {
            if let Some(f) = f {
                let s = inline_size(f);
                off = off.div_ceil(s) * s;
                entries[i] = off as u16;
                off += s;
            }
        }
        let table_len = off.div_ceil(4) * 4;
        self.b.resize(tp + table_len, 0);
        self.b[tp..tp + 4].copy_from_slice(&((tp - vt) as i32).to_le_bytes());
        self.b[vt..vt + 2].copy_from_slice(&((4 + 2 * n) as u16).to_le_bytes());
        self.b[vt + 2..vt + 4].copy_from_slice(&(table_len as u16).to_le_bytes());
        for (i, e) in entries.iter().enumerate() {
            self.b[vt + 4 + 2 * i..vt + 6 + 2 * i].copy_from_slice(&e.to_le_bytes());
        }
        for (i, f) in o.0.iter().enumerate() {
            let Some(f) = f else { continue };
            let at = tp + entries[i] as usize;
            match f {
                F::U8(v) => self.b[at] = *v,
                F::I8(v) => self.b[at] = *v as u8,
                F::U32(v) | F::S(v) => self.put_u32(at, *v),
                F::I32(v) => self.put_u32(at, *v as u32),
                F::F32(v) => self.put_u32(at, v.to_bits()),
                F::I64(v) => self.b[at..at + 8].copy_from_slice(&v.to_le_bytes()),
                F::Later => self.later.push(at),
                child => {
                    let c = self.child(child);
                    self.put_u32(at, (c - at) as u32);
                }
            }
        }
        tp
    }

    fn child(&mut self, f: &F) -> usize {
        match f {
            F::T(o) => self.table(o),
            F::Str(s) => {
                self.align(4);
                let p = self.b.len();
                self.b.extend_from_slice(&(s.len() as u32).to_le_bytes());
                self.b.extend_from_slice(s.as_bytes());
                self.b.push(0);
                p
            }
            F::Tables(v) => {
                self.align(4);
                let p = self.b.len();
                self.b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                self.b.resize(p + 4 + 4 * v.len(), 0);
                for (i, o) in v.iter().enumerate() {
                    let c = self.table(o);
                    let at = p + 4 + 4 * i;
                    self.put_u32(at, (c - at) as u32);
                }
                p
            }
            F::U32s(v) => {
                self.align(4);
                let p = self.b.len();
                self.b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                v.iter()
                    .for_each(|x| self.b.extend_from_slice(&x.to_le_bytes()));
                p
            }
            F::U8s(v) => {
                self.align(4);
                let p = self.b.len();
                self.b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                self.b.extend_from_slice(v);
                p
            }
            _ => unreachable!("inline value used as a child"),
        }
    }
}

/// MLX0 header + flatbuffer of `root`, padded to 16 like `mlx_graph_serialize.py`.
fn blob_of(root: &Obj) -> Vec<u8> {
    let mut w = Writer {
        b: vec![0; 8],
        later: Vec::new(),
    };
    let r = w.table(root);
    w.put_u32(0, r as u32);
    framed(w)
}

fn framed(mut w: Writer) -> Vec<u8> {
    w.align(16);
    let mut blob = vec![0u8; HEADER_LEN];
    blob[4..8].copy_from_slice(MAGIC);
    let end = (HEADER_LEN + w.b.len()) as u64;
    blob[8..16].copy_from_slice(&end.to_le_bytes());
    blob.extend_from_slice(&w.b);
    blob
}

fn s(i: u32) -> Option<F> {
    Some(F::S(i))
}
fn iov(n: i64) -> Obj {
    Obj(vec![Some(F::I64(n))])
}
fn iov_vid(v: u32) -> Obj {
    Obj(vec![None, s(v), Some(F::U8(1))])
}

/// One instruction of `kind`, tagged as `table` numbers it.
fn ins(table: TagTable, kind: NodeKind, fields: Vec<Option<F>>) -> Obj {
    let tag = table.tag(kind).expect("kind in table");
    Obj(vec![Some(F::U8(tag)), Some(F::T(Obj(fields)))])
}

fn meta(shape: &[i32]) -> Obj {
    let dims = shape.iter().map(|&d| Obj(vec![Some(F::I32(d))])).collect();
    let order = (0..shape.len() as u8).collect();
    Obj(vec![
        Some(F::Tables(dims)),
        Some(F::I8(6)),
        Some(F::U8s(order)),
    ])
}

fn slot(idx: u32) -> Obj {
    Obj(vec![Some(F::U32(idx))])
}

/// The toy graph's `QuantizedMatmul`: temp 4 = x · dequant(w, scales), group 32, 4 bits.
fn toy_matmul(table: TagTable) -> Obj {
    let fields = vec![
        s(0),
        s(1),
        s(2),
        s(4),
        None,
        Some(F::I32(32)),
        Some(F::I32(4)),
        Some(F::Str("affine")),
    ];
    ins(table, NodeKind::QuantizedMatmul, fields)
}

/// A toy graph: inputs x, w (packed int4), scales; output y; temps 4, 5; one value slot.
/// `SymSize; QuantizedMatmul; Rope(offset = v0); Stack; IdCopy`, tagged under `table`.
fn toy_graph(table: TagTable) -> Obj {
    let chain = vec![
        ins(table, NodeKind::SymSize, vec![s(0), Some(F::I32(1)), s(0)]),
        toy_matmul(table),
        ins(
            table,
            NodeKind::Rope,
            vec![
                s(4),
                s(5),
                Some(F::I32(8)),
                Some(F::T(Obj(vec![s(0), None, Some(F::U8(1))]))),
                None,
                None,
                Some(F::F32(10000.0)),
            ],
        ),
        ins(table, NodeKind::Stack, vec![Some(F::U32s(vec![5])), s(4)]),
        ins(
            table,
            NodeKind::Reshape,
            vec![
                s(4),
                s(5),
                Some(F::Tables(vec![iov(1), iov_vid(0), iov(-1)])),
            ],
        ),
        ins(
            table,
            NodeKind::Slice,
            vec![
                s(5),
                s(4),
                Some(F::T(iov(1))),
                Some(F::T(iov(0))),
                Some(F::T(iov_vid(0))),
            ],
        ),
        ins(table, NodeKind::IdCopy, vec![s(4), s(3)]),
    ];
    graph(chain, [0, 3, 1, 0, 2, 1])
}

fn graph(chain: Vec<Obj>, counts: [u32; 6]) -> Obj {
    let non_temp = counts[..4].iter().sum::<u32>();
    let first_in = counts[0];
    let first_out = first_in + counts[1];
    Obj(vec![
        Some(F::Str("1")),
        Some(F::U32(counts[0])),
        Some(F::U32(counts[1])),
        Some(F::U32(counts[2])),
        Some(F::U32(counts[3])),
        Some(F::U32(counts[4])),
        Some(F::U32(counts[5])),
        Some(F::Tables(vec![Obj(vec![Some(F::Tables(chain))])])),
        None,
        Some(F::I32(-1)),
        Some(F::Tables((first_in..first_out).map(slot).collect())),
        Some(F::Tables(
            (first_out..first_out + counts[2]).map(slot).collect(),
        )),
        None,
        Some(F::Tables(vec![Obj(vec![
            Some(F::Str("ab12/x")),
            Some(F::T(slot(first_in))),
        ])])),
        Some(F::Tables((0..non_temp).map(|_| meta(&[1, 64])).collect())),
    ])
}

fn parse_ok(blob: &[u8]) -> MlxGraph {
    parse(blob, &NamedData::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn parse_err(blob: &[u8]) -> String {
    parse(blob, &NamedData::default())
        .expect_err("blob was accepted")
        .to_string()
}

#[test]
fn toy_graph_decodes_every_field() {
    let g = parse_ok(&blob_of(&toy_graph(TagTable::Executorch151)));
    assert_eq!(g.tag_table, TagTable::Executorch151);
    assert_eq!(g.num_tensors(), 6);
    assert_eq!(g.init_chain_idx, None);
    assert_eq!(g.tensor_class(Tid(3)), Some(TensorClass::Output));
    assert_eq!(g.tensor_class(Tid(5)), Some(TensorClass::Temp));
    assert_eq!(g.tensor_class(Tid(6)), None);
    let main = g.main_chain();
    assert_eq!(
        main[0],
        Node::SymSize {
            a: Tid(0),
            dim: 1,
            out: Vid(0)
        }
    );
    assert_eq!(
        main[1],
        Node::QuantizedMatmul {
            x: Tid(0),
            w: Tid(1),
            scales: Tid(2),
            out: Tid(4),
            biases: None,
            group_size: 32,
            bits: 4,
            mode: "affine".into(),
            transpose: true,
        }
    );
    // Schema defaults fill absent fields: traditional=false, scale=1.
    assert_eq!(
        main[2],
        Node::Rope {
            x: Tid(4),
            out: Tid(5),
            dims: 8,
            offset: VidOrTid::Vid(Vid(0)),
            freqs: None,
            traditional: false,
            base: 10000.0,
            scale: 1.0,
        }
    );
    assert_eq!(
        main[3],
        Node::Stack {
            tensors: vec![Tid(5)],
            out: Tid(4),
            axis: 0
        }
    );
    assert_eq!(
        main[4],
        Node::Reshape {
            x: Tid(4),
            out: Tid(5),
            shape: vec![IntOrVid::Int(1), IntOrVid::Vid(Vid(0)), IntOrVid::Int(-1)]
        }
    );
    assert_eq!(
        main[5],
        Node::Slice {
            x: Tid(5),
            out: Tid(4),
            axis: IntOrVid::Int(1),
            start: IntOrVid::Int(0),
            stop: IntOrVid::Vid(Vid(0)),
            step: 1,
        }
    );
    assert_eq!(g.input_map.len(), 3);
    assert_eq!(g.named_slots[0].name, "ab12/x");
    assert_eq!(
        g.tensor_meta[0].shape,
        vec![ShapeDim::Static(1), ShapeDim::Static(64)]
    );
    let h = g.node_histogram();
    assert_eq!(h["QuantizedMatmulNode"], 1);
    assert_eq!(h.values().sum::<usize>(), 7);
}

#[test]
fn fork_tag_layout_is_detected_and_decodes_to_the_same_nodes() {
    // The same graph as the Software Mansion fork writes it: tags from CumMaxNode (112) on shift.
    let up = parse_ok(&blob_of(&toy_graph(TagTable::Executorch151)));
    let fork_blob = blob_of(&toy_graph(TagTable::SwmFork));
    assert_ne!(fork_blob, blob_of(&toy_graph(TagTable::Executorch151)));
    let fork = parse_ok(&fork_blob);
    assert_eq!(fork.tag_table, TagTable::SwmFork);
    assert_eq!(fork.chains, up.chains);
}

#[test]
fn tag_tables_agree_below_cummax_and_shift_after_it() {
    let (up, fork) = (TagTable::Executorch151, TagTable::SwmFork);
    assert_eq!(up.kinds().len(), 136);
    assert_eq!(fork.kinds().len(), 134);
    for tag in 1..FIRST_DIVERGENT_TAG {
        assert_eq!(up.kind(tag), fork.kind(tag), "tag {tag}");
    }
    assert_eq!(up.kind(111), Some(NodeKind::Cumsum));
    assert_eq!(fork.kind(112), Some(NodeKind::CumMax));
    assert_eq!(up.kind(121), Some(NodeKind::QuantizedMatmul));
    assert_eq!(fork.kind(122), Some(NodeKind::QuantizedMatmul));
    assert_eq!(up.kind(135), Some(NodeKind::Trunc));
    assert_eq!(up.kind(136), Some(NodeKind::Flip));
    assert_eq!(fork.kind(134), Some(NodeKind::RandomBits));
    assert_eq!(up.kind(0), None);
    assert_eq!(up.kind(137), None);
    assert_eq!(up.tag(NodeKind::CumMax), None);
}

#[test]
fn impossible_tag_is_rejected_naming_both_tables() {
    let mut g = toy_graph(TagTable::Executorch151);
    let chain = vec![Obj(vec![
        Some(F::U8(140)),
        Some(F::T(Obj(vec![s(0), s(3)]))),
    ])];
    g.0[7] = Some(F::Tables(vec![Obj(vec![Some(F::Tables(chain))])]));
    let e = parse_err(&blob_of(&g));
    assert!(
        e.contains("MLX node union tag 140 is beyond the 1.5.1 table (136 kinds)"),
        "{e}"
    );
    assert!(
        e.contains("fork table (134 kinds)") && e.contains("different schema"),
        "{e}"
    );
}

#[test]
fn node_that_fits_neither_table_is_rejected_with_both_reasons() {
    // Tag 121 carrying a node with ten fields: neither QuantizedMatmulNode (9) nor ArgPartitionNode.
    let fields = (0..10).map(|_| s(0)).collect();
    let chain = vec![Obj(vec![Some(F::U8(121)), Some(F::T(Obj(fields)))])];
    let e = parse_err(&blob_of(&graph(chain, [0, 3, 1, 0, 2, 1])));
    assert!(e.contains("fit neither known union order"), "{e}");
    assert!(e.contains("QuantizedMatmulNode sets field slot 9"), "{e}");
    assert!(e.contains("ArgPartitionNode"), "{e}");
}

#[test]
fn a_failure_common_to_both_layouts_is_reported_plainly() {
    // A QuantizedMatmul makes the blob divergent, but the broken node is an IdCopy (tag 2 in both).
    let mut g = toy_graph(TagTable::Executorch151);
    let chain = vec![
        ins(TagTable::Executorch151, NodeKind::IdCopy, vec![s(9), s(3)]),
        toy_matmul(TagTable::Executorch151),
    ];
    g.0[7] = Some(F::Tables(vec![Obj(vec![Some(F::Tables(chain))])]));
    let e = parse_err(&blob_of(&g));
    assert_eq!(
        e,
        "MLXGraph chain 0, instruction 0 (tag 2, IdCopyNode): field `x`: Tid 9 is out of range (6 tensor slots)"
    );
}

#[test]
fn indistinguishable_layouts_are_refused_rather_than_guessed() {
    // ArgsortNode (upstream 118) and SortNode (fork 118) have identical tables.
    let chain = vec![
        ins(
            TagTable::Executorch151,
            NodeKind::Argsort,
            vec![s(0), s(4), Some(F::I32(1))],
        ),
        ins(TagTable::Executorch151, NodeKind::IdCopy, vec![s(4), s(3)]),
    ];
    let e = parse_err(&blob_of(&graph(chain, [0, 3, 1, 0, 2, 1])));
    assert!(
        e.contains("118 (ArgsortNode / SortNode)") && e.contains("refusing to guess"),
        "{e}"
    );
}

#[test]
fn garbage_temp_reads_break_a_tie_between_layouts() {
    let node = |kind, v: Vec<Value>| (0u8, kind, v);
    let sane: Decoded = vec![vec![
        node(NodeKind::Silu, vec![Value::Tid(Tid(0)), Value::Tid(Tid(4))]),
        node(
            NodeKind::IdCopy,
            vec![Value::Tid(Tid(4)), Value::Tid(Tid(3))],
        ),
    ]];
    let garbage: Decoded = vec![vec![node(
        NodeKind::IdCopy,
        vec![Value::Tid(Tid(5)), Value::Tid(Tid(3))],
    )]];
    assert_eq!(unwritten_temp_reads(&sane, 4), 0);
    assert_eq!(unwritten_temp_reads(&garbage, 4), 1);
}

#[test]
fn out_of_range_slots_are_rejected_naming_the_field() {
    let chain = vec![ins(
        TagTable::Executorch151,
        NodeKind::IdCopy,
        vec![s(0), s(6)],
    )];
    let e = parse_err(&blob_of(&graph(chain, [0, 3, 1, 0, 2, 1])));
    assert!(
        e.contains("IdCopyNode")
            && e.contains("field `out`: Tid 6 is out of range (6 tensor slots)"),
        "{e}"
    );

    let chain = vec![ins(
        TagTable::Executorch151,
        NodeKind::ItemInt,
        vec![s(0), s(1)],
    )];
    let e = parse_err(&blob_of(&graph(chain, [0, 3, 1, 0, 2, 1])));
    assert!(e.contains("Vid 1 is out of range (1 value slots)"), "{e}");

    let chain = vec![ins(TagTable::Executorch151, NodeKind::IdCopy, vec![s(0)])];
    let e = parse_err(&blob_of(&graph(chain, [0, 3, 1, 0, 2, 1])));
    assert!(e.contains("required field `out` is missing"), "{e}");
}

#[test]
fn bool_bytes_other_than_0_and_1_are_rejected() {
    let chain = vec![ins(
        TagTable::Executorch151,
        NodeKind::Softmax,
        vec![s(0), s(4), Some(F::I32(-1)), Some(F::U8(2))],
    )];
    let e = parse_err(&blob_of(&graph(chain, [0, 3, 1, 0, 2, 1])));
    assert!(
        e.contains("field `precise`: bool field holds byte 0x02"),
        "{e}"
    );
}

#[test]
fn header_is_checked() {
    let good = blob_of(&toy_graph(TagTable::Executorch151));
    assert!(parse_err(&good[..10]).contains("shorter than its 24-byte header"));
    let mut b = good.clone();
    b[4..8].copy_from_slice(b"MLX1");
    assert!(parse_err(&b).contains("\"MLX1\", expected \"MLX0\""));
    for (offset, size) in [
        (24u64, 0u64),
        (good.len() as u64 + 1, 0),
        (good.len() as u64, 1),
        (u64::MAX, 2),
    ] {
        let mut b = good.clone();
        b[8..16].copy_from_slice(&offset.to_le_bytes());
        b[16..24].copy_from_slice(&size.to_le_bytes());
        assert!(
            parse_err(&b).contains("does not fit"),
            "offset {offset} size {size}"
        );
    }
}

#[test]
fn graph_level_fields_are_checked() {
    let base = toy_graph(TagTable::Executorch151);
    let with = |slot: usize, f: Option<F>| {
        let mut g = base.clone();
        if g.0.len() <= slot {
            g.0.resize(slot + 1, None);
        }
        g.0[slot] = f;
        parse_err(&blob_of(&g))
    };
    assert!(with(0, Some(F::Str("2"))).contains("version is \"2\""));
    assert!(with(0, None).contains("version is absent"));
    assert!(with(8, Some(F::U32(1))).contains("main_chain_idx 1 is out of range (1 chains)"));
    assert!(with(9, Some(F::I32(3))).contains("init_chain_idx 3 is neither -1 nor one of 1 chains"));
    assert!(with(15, Some(F::U32(7))).contains("MLXGraph sets field slot 15"));
    assert!(with(5, Some(F::U32(2_000_000))).contains("at most 1000000"));
    assert!(with(14, Some(F::Tables(vec![meta(&[1])])))
        .contains("1 tensor_meta entries for 4 non-temp"));
    let e = with(10, Some(F::Tables(vec![slot(4)])));
    assert!(
        e.contains("input_map[0]: Tid 4 is not a Input slot (0..3)"),
        "{e}"
    );
    let bad_meta = Obj(vec![
        Some(F::Tables(vec![])),
        Some(F::I8(6)),
        Some(F::U8s(vec![0])),
    ]);
    let e = with(
        14,
        Some(F::Tables(vec![
            bad_meta.clone(),
            meta(&[1]),
            meta(&[1]),
            meta(&[1]),
        ])),
    );
    assert!(
        e.contains("dim_order [0] is not a permutation of 0..0"),
        "{e}"
    );
    let dyn_meta = Obj(vec![Some(F::Tables(vec![Obj(vec![
        Some(F::I32(-1)),
        Some(F::I32(5)),
        Some(F::I32(2)),
    ])]))]);
    let e = with(
        14,
        Some(F::Tables(vec![
            dyn_meta,
            meta(&[1]),
            meta(&[1]),
            meta(&[1]),
        ])),
    );
    assert!(e.contains("max_value 2 < min_value 5"), "{e}");
}

#[test]
fn constants_must_have_named_data() {
    // One constant (Tid 0) whose named slot points at a key the (empty) named data lacks.
    let chain = vec![ins(
        TagTable::Executorch151,
        NodeKind::IdCopy,
        vec![s(0), s(2)],
    )];
    let mut g = graph(chain, [1, 1, 1, 0, 0, 0]);
    g.0[13] = Some(F::Tables(vec![Obj(vec![
        Some(F::Str("ab12/w")),
        Some(F::T(slot(0))),
    ])]));
    match parse(&blob_of(&g), &NamedData::default()) {
        Err(MlxError::MissingNamedData { name, tid: 0 }) => assert_eq!(name, "ab12/w"),
        other => panic!("{other:?}"),
    }
    g.0[13] = None;
    assert!(parse_err(&blob_of(&g)).contains("constant Tid 0 has no named slot"));
}

#[test]
fn shared_vectors_cannot_blow_up_the_decode() {
    // 2000 instructions all pointing at one Concatenate table with a 4000-element Tid vector: about
    // 64 KB of buffer that would materialise 8M Tids. The work budget refuses it.
    let tag = TagTable::Executorch151.tag(NodeKind::Concatenate).unwrap();
    let chain = (0..2000)
        .map(|_| Obj(vec![Some(F::U8(tag)), Some(F::Later)]))
        .collect();
    let mut w = Writer {
        b: vec![0; 8],
        later: Vec::new(),
    };
    let r = w.table(&graph(chain, [0, 3, 1, 0, 2, 1]));
    w.put_u32(0, r as u32);
    let node = w.table(&Obj(vec![Some(F::U32s(vec![0; 4000])), s(3)]));
    for at in std::mem::take(&mut w.later) {
        w.put_u32(at, (node - at) as u32);
    }
    let blob = framed(w);
    let e = parse_err(&blob);
    assert!(e.contains("far more elements than its size allows"), "{e}");
}
