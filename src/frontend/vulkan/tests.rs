//! Unit tests on hand-built blobs: a tiny forward-writing FlatBuffers builder, a sample graph
//! that uses every value kind, and one mutation per validation rule.

use super::*;
use crate::pte::Bytes;
use std::sync::Arc;

/// A table field for the test builder.
pub(super) enum F {
    I8(i8),
    U8(u8),
    Bool(bool),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(&'static str),
    Table(T),
    Tables(Vec<T>),
    /// One table referenced `n` times from a vector (legal FlatBuffers, used to test the budget).
    SharedTables(Box<T>, usize),
    VecU32(Vec<u32>),
    VecI32(Vec<i32>),
    VecI64(Vec<i64>),
    VecF64(Vec<f64>),
    VecBool(Vec<bool>),
}

/// A table: (slot, field) pairs.
pub(super) struct T(pub(super) Vec<(usize, F)>);

/// Writes tables front to back: a table, then its children, patching forward `uoffset`s.
struct W(Vec<u8>);

impl W {
    fn pad_to(&mut self, align: usize, skew: usize) {
        while (self.0.len() + skew) % align != 0 {
            self.0.push(0);
        }
    }

    fn patch(&mut self, at: usize, target: usize) {
        let off = (target - at) as u32;
        self.0[at..at + 4].copy_from_slice(&off.to_le_bytes());
    }

    fn put(&mut self, b: &[u8]) -> usize {
        let at = self.0.len();
        self.0.extend_from_slice(b);
        at
    }

    fn vector(&mut self, elem: usize, n: usize, bytes: &[u8]) -> usize {
        // Elements aligned to their size, the u32 length just before them.
        self.pad_to(elem.max(4), 4);
        let at = self.put(&(n as u32).to_le_bytes());
        self.put(bytes);
        at
    }

    fn table(&mut self, t: &T) -> usize {
        // Inline layout: soffset, then each field aligned to its size.
        let mut layout = Vec::new();
        let mut size = 4usize;
        for (slot, f) in &t.0 {
            let w = match f {
                F::I8(_) | F::U8(_) | F::Bool(_) => 1,
                F::I64(_) | F::U64(_) | F::F64(_) => 8,
                _ => 4,
            };
            size = size.div_ceil(w) * w;
            layout.push((*slot, size));
            size += w;
        }
        let size = size.div_ceil(8) * 8;
        let n_slots = t.0.iter().map(|(s, _)| s + 1).max().unwrap_or(0);
        self.pad_to(2, 0);
        let vt = self.0.len();
        let mut entries = vec![0u16; n_slots];
        for &(slot, off) in &layout {
            entries[slot] = off as u16;
        }
        self.put(&((4 + 2 * n_slots) as u16).to_le_bytes());
        self.put(&(size as u16).to_le_bytes());
        for e in entries {
            self.put(&e.to_le_bytes());
        }
        self.pad_to(8, 0);
        let pos = self.0.len();
        self.0.resize(pos + size, 0);
        self.0[pos..pos + 4].copy_from_slice(&((pos - vt) as i32).to_le_bytes());
        let mut children = Vec::new();
        for ((_, f), &(_, off)) in t.0.iter().zip(&layout) {
            let at = pos + off;
            let mut set = |b: &[u8]| self.0[at..at + b.len()].copy_from_slice(b);
            match f {
                F::I8(v) => set(&v.to_le_bytes()),
                F::U8(v) => set(&[*v]),
                F::Bool(v) => set(&[*v as u8]),
                F::I32(v) => set(&v.to_le_bytes()),
                F::U32(v) => set(&v.to_le_bytes()),
                F::I64(v) => set(&v.to_le_bytes()),
                F::U64(v) => set(&v.to_le_bytes()),
                F::F64(v) => set(&v.to_le_bytes()),
                _ => children.push((at, f)),
            }
        }
        for (at, f) in children {
            let target = self.child(f);
            self.patch(at, target);
        }
        pos
    }

    fn child(&mut self, f: &F) -> usize {
        fn le<const N: usize>(v: impl Iterator<Item = [u8; N]>) -> Vec<u8> {
            v.flatten().collect()
        }
        match f {
            F::Str(s) => {
                let at = self.vector(1, s.len(), s.as_bytes());
                self.put(&[0]);
                at
            }
            F::Table(t) => self.table(t),
            F::Tables(ts) => self.tables(ts.iter().collect()),
            F::SharedTables(t, n) => self.tables(vec![&**t; *n]),
            F::VecU32(v) => self.vector(4, v.len(), &le(v.iter().map(|x| x.to_le_bytes()))),
            F::VecI32(v) => self.vector(4, v.len(), &le(v.iter().map(|x| x.to_le_bytes()))),
            F::VecI64(v) => self.vector(8, v.len(), &le(v.iter().map(|x| x.to_le_bytes()))),
            F::VecF64(v) => self.vector(8, v.len(), &le(v.iter().map(|x| x.to_le_bytes()))),
            F::VecBool(v) => self.vector(1, v.len(), &le(v.iter().map(|&b| [b as u8]))),
            _ => unreachable!("scalars are inline"),
        }
    }

    /// A vector of tables; identical `&T`s (by address) are written once and shared.
    fn tables(&mut self, ts: Vec<&T>) -> usize {
        let at = self.vector(4, ts.len(), &vec![0u8; 4 * ts.len()]);
        let mut written: Vec<(*const T, usize)> = Vec::new();
        for (i, t) in ts.into_iter().enumerate() {
            let target = match written.iter().find(|(p, _)| std::ptr::eq(*p, t)) {
                Some(&(_, pos)) => pos,
                None => {
                    let pos = self.table(t);
                    written.push((t, pos));
                    pos
                }
            };
            self.patch(at + 4 + 4 * i, target);
        }
        at
    }
}

pub(super) fn flatbuffer(root: &T, ident: &[u8; 4]) -> Vec<u8> {
    let mut w = W(vec![0u8; 8]);
    w.0[4..8].copy_from_slice(ident);
    let pos = w.table(root);
    w.patch(0, pos);
    w.0
}

/// Header + flatbuffer + raw constant region, laid out as the upstream serializer does.
pub(super) fn blob_of(fb: &[u8], raw: &[u8]) -> Blob {
    let fb_off = 32;
    let bytes_off = fb_off + fb.len().div_ceil(16) * 16;
    let h = VulkanHeader {
        flatbuffer_offset: fb_off,
        flatbuffer_size: fb.len(),
        bytes_offset: bytes_off,
        bytes_size: raw.len(),
    };
    let mut b = vec![0u8; bytes_off + raw.len()];
    b[..HEADER_LEN].copy_from_slice(&header::encode(&h));
    b[fb_off..fb_off + fb.len()].copy_from_slice(fb);
    b[bytes_off..].copy_from_slice(raw);
    Blob::whole(Arc::new(Bytes::Owned(b)))
}

pub(super) fn value(tag: u8, payload: T) -> T {
    T(vec![(0, F::U8(tag)), (1, F::Table(payload))])
}

pub(super) fn tensor(datatype: i8, dims: &[u32], constant_id: i32, mem_obj_id: i32) -> T {
    T(vec![
        (0, F::I8(datatype)),
        (1, F::VecU32(dims.to_vec())),
        (2, F::I32(constant_id)),
        (3, F::I32(mem_obj_id)),
    ])
}

pub(super) fn op(name: &'static str, args: &[i32]) -> T {
    T(vec![
        (0, F::U32(7)),
        (1, F::Str(name)),
        (2, F::VecI32(args.to_vec())),
    ])
}

pub(super) fn inline_bytes(offset: u64, length: u64) -> T {
    T(vec![(0, F::U64(offset)), (1, F::U64(length))])
}

const FLOAT32: i8 = 5;
const UINT8: i8 = 1;

/// The parts of the sample graph, each replaceable by a test.
struct Sample {
    values: Vec<T>,
    chain: Vec<T>,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    constants: Vec<T>,
    extra: Vec<(usize, F)>,
    raw: Vec<u8>,
}

/// A linear layer plus a `sym_size`, with every value kind: 2×2 f32 weight inline at 0 and a
/// packed int4 uint8 [2, 1] weight inline at 16.
fn sample() -> Sample {
    let mut input = tensor(FLOAT32, &[1, 2], -1, 0);
    input
        .0
        .extend([(4, F::U8(1)), (5, F::U8(0)), (6, F::I8(FLOAT32))]);
    let mut raw: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    raw.extend([0x98, 0x7f]);
    raw.resize(32, 0);
    Sample {
        values: vec![
            value(5, input),
            value(5, tensor(FLOAT32, &[2, 2], 0, -1)),
            value(1, T(vec![])),
            value(5, tensor(FLOAT32, &[1, 2], -1, 1)),
            value(2, T(vec![(0, F::I64(-7))])),
            value(3, T(vec![(0, F::F64(0.5))])),
            value(4, T(vec![(0, F::Bool(true))])),
            value(6, T(vec![(0, F::VecI64(vec![1, -1]))])),
            value(7, T(vec![(0, F::VecF64(vec![1.5]))])),
            value(8, T(vec![(0, F::VecBool(vec![true, false]))])),
            value(9, T(vec![(0, F::VecI32(vec![4, 11]))])),
            value(11, T(vec![(0, F::I32(3))])),
            value(10, T(vec![(0, F::Str("hi"))])),
            value(5, tensor(UINT8, &[2, 1], 1, -1)),
        ],
        chain: vec![
            op("aten.linear.default", &[0, 1, 2, 3]),
            op("sym_size.int", &[0, 4, 11]),
        ],
        inputs: vec![0, 11],
        outputs: vec![3],
        constants: vec![inline_bytes(0, 16), inline_bytes(16, 2)],
        extra: vec![],
        raw,
    }
}

impl Sample {
    fn blob(self) -> Blob {
        let mut fields = vec![
            (0, F::Str("0")),
            (1, F::Tables(self.chain)),
            (2, F::Tables(self.values)),
            (3, F::VecU32(self.inputs)),
            (4, F::VecU32(self.outputs)),
            (5, F::Tables(self.constants)),
        ];
        fields.extend(self.extra);
        blob_of(&flatbuffer(&T(fields), b"VK00"), &self.raw)
    }

    fn parse(self) -> Result<VkGraph, VulkanError> {
        parse(&self.blob(), &NamedData::default())
    }

    /// The error message, which must mention every one of `want`.
    fn rejected(self, want: &[&str]) {
        let msg = self
            .parse()
            .expect_err("mutated sample was accepted")
            .to_string();
        for w in want {
            assert!(msg.contains(w), "`{msg}` does not mention `{w}`");
        }
    }
}

#[test]
fn parses_every_value_kind_and_resolves_inline_constants() {
    let g = sample().parse().unwrap();
    assert_eq!(g.version, "0");
    assert_eq!(g.values.len(), 14);
    assert_eq!(g.input_ids, [0, 11]);
    assert_eq!(g.output_ids, [3]);
    assert_eq!(
        g.tensor(0).unwrap(),
        &VkTensor {
            datatype: VkDataType::Float32,
            dims: vec![1, 2],
            constant_id: None,
            mem_obj_id: Some(0),
            storage_type: VkStorageType::Texture3d,
            memory_layout: VkMemoryLayout::TensorWidthPacked,
            staging_datatype: VkDataType::Float32,
        }
    );
    // Omitted fields take the schema defaults.
    let w = g.tensor(1).unwrap();
    assert_eq!((w.constant_id, w.mem_obj_id), (Some(0), None));
    assert_eq!(w.storage_type, VkStorageType::Default);
    assert_eq!(w.memory_layout, VkMemoryLayout::Default);
    assert_eq!(w.staging_datatype, VkDataType::Unset);
    assert_eq!(g.values[2], VkValue::Null);
    assert_eq!(g.values[4], VkValue::Int(-7));
    assert_eq!(g.values[5], VkValue::Double(0.5));
    assert_eq!(g.values[6], VkValue::Bool(true));
    assert_eq!(g.values[7], VkValue::IntList(vec![1, -1]));
    assert_eq!(g.values[8], VkValue::DoubleList(vec![1.5]));
    assert_eq!(g.values[9], VkValue::BoolList(vec![true, false]));
    assert_eq!(g.values[10], VkValue::ValueList(vec![4, 11]));
    assert_eq!(g.values[11], VkValue::SymInt(3));
    assert_eq!(g.values[12], VkValue::String("hi".into()));
    assert_eq!(g.chain[0].name, "aten.linear.default");
    assert_eq!(g.chain[0].args, [0, 1, 2, 3]);
    assert_eq!(g.chain[1].node_id, 7);
    let w = g.constant_data(1).unwrap();
    assert_eq!(&w[..4], &1.0f32.to_le_bytes());
    assert_eq!(w.len(), 16);
    assert_eq!(&g.constant_data(13).unwrap()[..], &[0x98, 0x7f]);
    assert!(g.constant_data(0).is_none());
    assert!(!g.constants[0].is_named());
    assert_eq!(g.storage_type_override, VkStorageType::Default);
    assert_eq!(g.memory_layout_override, VkMemoryLayout::Default);
    let h = g.op_histogram();
    assert_eq!(h.len(), 2);
    assert_eq!(h["aten.linear.default"], 1);
}

#[test]
fn union_tags_follow_the_vulkan_order_with_double_before_bool() {
    // Tag 3 is Double in vkgraph (it is Bool in ExecuTorch's KernelTypes).
    let mut s = sample();
    s.values[5] = value(3, T(vec![(0, F::F64(2.0))]));
    s.values[6] = value(4, T(vec![(0, F::Bool(false))]));
    let g = s.parse().unwrap();
    assert_eq!(g.values[5], VkValue::Double(2.0));
    assert_eq!(g.values[6], VkValue::Bool(false));
}

#[test]
fn rejects_unknown_union_tags_and_missing_payloads() {
    let mut s = sample();
    s.values[4] = value(12, T(vec![]));
    s.rejected(&["value 4", "unknown value type tag 12"]);
    let mut s = sample();
    s.values[4] = T(vec![]);
    s.rejected(&["value 4", "union type NONE"]);
}

#[test]
fn rejects_unknown_enum_values() {
    let cases: [(usize, F, &str); 5] = [
        (0, F::I8(8), "unknown datatype 8"),
        (6, F::I8(-1), "unknown staging_datatype -1"),
        (4, F::U8(3), "unknown storage_type 3"),
        // 7 is the gap between PACKED_INT8_4C and PACKED_INT8_4C1W.
        (5, F::U8(7), "unknown memory_layout 7"),
        (0, F::I8(127), "datatype is UNSET"),
    ];
    for (slot, f, want) in cases {
        let mut s = sample();
        s.values[3] = value(
            5,
            T(vec![(slot, f), (1, F::VecU32(vec![1, 2])), (2, F::I32(-1))]),
        );
        s.rejected(&["VkGraph value 3", want]);
    }
    let mut s = sample();
    s.extra.push((7, F::U8(9)));
    s.rejected(&["unknown storage_type_override 9"]);
    let mut s = sample();
    s.extra.push((8, F::U8(200)));
    s.rejected(&["unknown memory_layout_override 200"]);
}

#[test]
fn rejects_ids_out_of_range() {
    let mut s = sample();
    s.chain[1] = op("sym_size.int", &[0, 4, 14]);
    s.rejected(&[
        "operator call 1 (`sym_size.int`)",
        "arg 2",
        "value id 14 out of range (14 values)",
    ]);
    let mut s = sample();
    s.chain[0] = op("aten.linear.default", &[-1]);
    s.rejected(&["operator call 0", "value id -1 out of range"]);
    let mut s = sample();
    s.values[1] = value(5, tensor(FLOAT32, &[2, 2], 900, -1));
    s.rejected(&["VkGraph value 1: constant id 900 out of range (2 constants)"]);
    let mut s = sample();
    s.values[10] = value(9, T(vec![(0, F::VecI32(vec![4, 99]))]));
    s.rejected(&["value 10", "ValueList item 1 is value id 99"]);
    let mut s = sample();
    s.values[10] = value(9, T(vec![(0, F::VecI32(vec![-1]))]));
    s.rejected(&["value 10", "negative"]);
    let mut s = sample();
    s.values[3] = value(5, tensor(FLOAT32, &[1, 2], -1, 14));
    s.rejected(&["value 3", "mem_obj_id 14"]);
    let mut s = sample();
    s.inputs = vec![0, 20];
    s.rejected(&["VkGraph input 1: value id 20 out of range (14 values)"]);
    let mut s = sample();
    s.outputs = vec![4];
    s.rejected(&["VkGraph output 0", "value 4 is a Int"]);
}

#[test]
fn rejects_operator_without_name() {
    let mut s = sample();
    s.chain[0] = T(vec![(2, F::VecI32(vec![0]))]);
    s.rejected(&["operator call 0", "has no name"]);
}

#[test]
fn checks_constant_bytes_against_tensor_sizes() {
    // The packed int4 weight: uint8 [2, 1] needs exactly 2 bytes, whatever the logical K is.
    let mut s = sample();
    s.values[13] = value(5, tensor(UINT8, &[2, 2], 1, -1));
    s.rejected(&[
        "value 13",
        "constant 1 holds 2 bytes but the UINT8 [2, 2] tensor needs 4",
    ]);
    let mut s = sample();
    s.values[1] = value(5, tensor(FLOAT32, &[4294967295, 4294967295, 4], 0, -1));
    s.rejected(&["value 1", "overflows"]);
    // Non-constant tensors are size-checked too.
    let mut s = sample();
    s.values[3] = value(5, tensor(FLOAT32, &[u32::MAX; 3], -1, 1));
    s.rejected(&["value 3", "overflows"]);
}

#[test]
fn rejects_constants_that_do_not_resolve() {
    let mut s = sample();
    s.constants[1] = inline_bytes(16, 17);
    s.rejected(&[
        "VkGraph constant 1",
        "16+17 run past the 32-byte constant region",
    ]);
    let mut s = sample();
    s.constants[1] = inline_bytes(u64::MAX - 1, 2);
    s.rejected(&["VkGraph constant 1", "past the"]);
    let mut s = sample();
    s.constants[0] = T(vec![
        (0, F::U64(u64::MAX)),
        (1, F::U64(16)),
        (2, F::Str("abc")),
    ]);
    s.rejected(&[
        "VkGraph constant 0",
        "named data key `abc` is not in the program",
    ]);
    let mut s = sample();
    s.constants[0] = T(vec![(0, F::U64(u64::MAX)), (1, F::U64(16))]);
    s.rejected(&["VkGraph constant 0", "no named_key"]);
}

#[test]
fn rejects_wrong_identifier_and_accepts_empty_graph() {
    let fb = flatbuffer(&T(vec![(0, F::Str("0"))]), b"XN01");
    let e = parse(&blob_of(&fb, &[]), &NamedData::default())
        .unwrap_err()
        .to_string();
    // Positions are reported in blob bytes: the identifier sits 4 bytes into the flatbuffer at 32.
    assert!(
        e.contains("\"XN01\", expected \"VK00\" (at byte 36)"),
        "{e}"
    );
    let fb = flatbuffer(&T(vec![]), b"VK00");
    let g = parse(&blob_of(&fb, &[]), &NamedData::default()).unwrap();
    assert!(g.values.is_empty() && g.chain.is_empty() && g.version.is_empty());
}

#[test]
fn shared_vectors_cannot_amplify_decoding() {
    // One 1000-dim tensor referenced 5000 times: ~24 KB of flatbuffer, 5M dims if copied.
    let big = value(5, tensor(UINT8, &[1; 1000], -1, -1));
    let fb = flatbuffer(&T(vec![(2, F::SharedTables(Box::new(big), 5000))]), b"VK00");
    let e = parse(&blob_of(&fb, &[]), &NamedData::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("elements per flatbuffer byte"), "{e}");
    // The same tensor referenced a few times is fine.
    let big = value(5, tensor(UINT8, &[1; 1000], -1, -1));
    let fb = flatbuffer(&T(vec![(2, F::SharedTables(Box::new(big), 3))]), b"VK00");
    assert_eq!(
        parse(&blob_of(&fb, &[]), &NamedData::default())
            .unwrap()
            .values
            .len(),
        3
    );
}

#[test]
fn every_truncation_and_byte_flip_of_the_sample_is_an_error_or_a_graph() {
    let good = sample().blob();
    for n in 0..good.len() {
        let cut = Blob::whole(Arc::new(Bytes::Owned(good[..n].to_vec())));
        assert!(
            parse(&cut, &NamedData::default()).is_err(),
            "truncation to {n} accepted"
        );
    }
    for i in 0..good.len() {
        for bit in [0x01u8, 0x80, 0xff] {
            let mut b = good.to_vec();
            b[i] ^= bit;
            let _ = parse(
                &Blob::whole(Arc::new(Bytes::Owned(b))),
                &NamedData::default(),
            );
        }
    }
}
