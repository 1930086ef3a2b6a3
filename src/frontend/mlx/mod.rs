//! `MLXBackend` blobs: the MLX0 header and the `mlx_delegate.MLXGraph` flatbuffer.
//!
//! `parse` turns a delegate blob (handed over by `pte`, with the program's named data) into an owned,
//! fully validated `MlxGraph`: slot counts, instruction chains of typed `Node`s, I/O maps, named
//! slots and tensor metadata. `lower` turns it into the IR.
//!
//! Two `OpNode` union orders exist in the wild: executorch 1.5.1's, and the Software Mansion fork's
//! (which exported the published Gemma 4 MLX files) with `CumMaxNode` inserted at tag 112. Tags
//! below 112 mean the same in both; when a blob uses higher ones, every node is checked against its
//! schema table under both orders and the one that fits is kept (`MlxGraph::tag_table`).

mod fields;
pub mod lower;
mod node;
mod schema;
#[cfg(test)]
mod tests;

pub use node::{FloatOrVid, IntOrVid, IntOrVidOrTid, Node, Tid, Vid, VidOrTid};
pub use schema::NodeKind;

use crate::fb::{self, Table};
use crate::pte::{Blob, NamedData, ScalarType};
use fields::{check_known_fields, Ctx, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The delegate id in the program's `BackendDelegate` (`runtime/backend_options.h kMLXBackendId`).
pub const BACKEND_ID: &str = "MLXBackend";
/// `[0..4)` zero padding, `[4..8)` "MLX0", `[8..16)` u64 data segment offset, `[16..24)` u64 size.
pub const HEADER_LEN: usize = 24;
pub const MAGIC: &[u8; 4] = b"MLX0";
/// `MLXGraph.version` this reader understands (upstream `kMaxSupportedVersion = 1`).
pub const SUPPORTED_VERSION: &str = "1";
/// Cap on tensor and value slot counts, as upstream's loader (`kMaxCollectionSize`).
pub const MAX_SLOTS: u64 = 1_000_000;
/// Cap on tensor rank, as upstream's loader (`kTensorDimensionLimit`).
pub const MAX_RANK: usize = 16;
/// First tag whose meaning differs between the two union orders (the fork's `CumMaxNode`).
const FIRST_DIVERGENT_TAG: u8 = 112;
/// `MLXGraph` has 15 fields in 1.5.1 (and in the fork).
const GRAPH_FIELDS: usize = 15;

/// Which `OpNode` union order the node type tags were read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagTable {
    /// executorch 1.5.1: upstream's append-only order, 136 kinds ending `TruncNode`, `FlipNode`.
    /// Also reported for fork blobs that use no tag from 112 on, where both orders agree.
    Executorch151,
    /// software-mansion-labs/executorch: `CumMaxNode` at 112, later kinds shifted by one, 134 kinds.
    SwmFork,
}

impl TagTable {
    /// Kinds in tag order: tag `t` is `kinds()[t - 1]` (0 is the union's NONE).
    pub fn kinds(self) -> &'static [NodeKind] {
        match self {
            TagTable::Executorch151 => &schema::UPSTREAM_1_5_1,
            TagTable::SwmFork => &schema::SWM_FORK,
        }
    }

    pub fn kind(self, tag: u8) -> Option<NodeKind> {
        let i = usize::from(tag.checked_sub(1)?);
        self.kinds().get(i).copied()
    }

    pub fn tag(self, kind: NodeKind) -> Option<u8> {
        let i = self.kinds().iter().position(|k| *k == kind)?;
        u8::try_from(i + 1).ok()
    }

    fn short(self) -> &'static str {
        match self {
            TagTable::Executorch151 => "the 1.5.1 table",
            TagTable::SwmFork => "the Software Mansion fork table",
        }
    }
}

impl fmt::Display for TagTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TagTable::Executorch151 => "executorch 1.5.1",
            TagTable::SwmFork => "Software Mansion fork (CumMaxNode at tag 112)",
        })
    }
}

/// Why one instruction could not be read under a tag table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFailure {
    pub chain: usize,
    pub index: usize,
    pub tag: u8,
    /// The kind the tag names under the table tried; `None` when the tag is beyond it.
    pub kind: Option<NodeKind>,
    pub msg: String,
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chain {}, instruction {}", self.chain, self.index)?;
        match self.kind {
            Some(k) => write!(f, " (tag {}, {}): {}", self.tag, k.name(), self.msg),
            None => write!(f, ": {}", self.msg),
        }
    }
}

fn tag_layout_message(up: &NodeFailure, fork: &NodeFailure) -> String {
    if up.kind.is_none() && fork.kind.is_none() {
        return format!(
            "MLX node union tag {} is beyond the 1.5.1 table ({} kinds) and the Software Mansion fork \
             table ({} kinds); the blob was written by a different schema (chain {}, instruction {})",
            up.tag,
            schema::UPSTREAM_1_5_1.len(),
            schema::SWM_FORK.len(),
            up.chain,
            up.index
        );
    }
    format!(
        "MLX node tables fit neither known union order; the blob was written by a different schema. \
         Read as executorch 1.5.1: {up}. Read as the Software Mansion fork: {fork}"
    )
}

#[derive(Debug, thiserror::Error)]
pub enum MlxError {
    #[error("MLX blob is {len} bytes, shorter than its {HEADER_LEN}-byte header")]
    TooShort { len: usize },
    #[error("MLX blob magic at bytes 4..8 is {found:?}, expected \"MLX0\"")]
    BadMagic { found: String },
    #[error(
        "MLX header puts the data segment at byte {offset} ({size} bytes), which does not fit a \
         {len}-byte blob with the flatbuffer between byte {HEADER_LEN} and it"
    )]
    BadSegment { offset: u64, size: u64, len: usize },
    #[error("malformed MLXGraph flatbuffer in {context}: {source}")]
    Flatbuffer {
        context: String,
        source: fb::FbError,
    },
    #[error("MLXGraph version is {found}; this reader supports \"{SUPPORTED_VERSION}\"")]
    Version { found: String },
    #[error("MLXGraph: {0}")]
    Invalid(String),
    #[error("MLXGraph {0}")]
    Node(NodeFailure),
    #[error("{}", tag_layout_message(.upstream, .fork))]
    TagLayout {
        upstream: NodeFailure,
        fork: NodeFailure,
    },
    #[error(
        "MLX node tags {detail} decode validly under both the executorch 1.5.1 and the Software \
         Mansion fork union orders, and nothing in the graph tells them apart; refusing to guess"
    )]
    AmbiguousTagLayout { detail: String },
    #[error("MLXGraph named slot `{name}` (constant Tid {tid}) has no entry in the program's named data")]
    MissingNamedData { name: String, tid: u32 },
    #[error("MLXGraph constant Tid {tid} has no named slot, so its data cannot be found")]
    UnnamedConstant { tid: u32 },
}

type Result<T> = std::result::Result<T, MlxError>;

fn flat(context: impl Into<String>) -> impl FnOnce(fb::FbError) -> MlxError {
    let context = context.into();
    move |source| MlxError::Flatbuffer { context, source }
}

fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(MlxError::Invalid(msg.into()))
}

/// What a value slot or tensor slot of an I/O map or named slot refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotType {
    Tensor,
    Int,
    Float,
    Bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotVariant {
    pub idx: u32,
    pub slot_type: SlotType,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedSlot {
    /// `<prefix>/<fqn>`: the named-data key for constants, e.g. `1a14/emb.weight`.
    pub name: String,
    pub slot: SlotVariant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeDim {
    Static(usize),
    /// `max: None` is unbounded.
    Dynamic {
        min: usize,
        max: Option<usize>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    pub shape: Vec<ShapeDim>,
    pub dtype: ScalarType,
    /// Empty for rank 0; otherwise a permutation of `0..rank`.
    pub dim_order: Vec<u8>,
}

impl TensorMeta {
    /// The element count when every dimension is static.
    pub fn static_numel(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, d| match d {
            ShapeDim::Static(s) => n.checked_mul(*s),
            ShapeDim::Dynamic { .. } => None,
        })
    }
}

/// Which region of the tensor slot space a `Tid` lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorClass {
    Constant,
    Input,
    Output,
    MutableBuffer,
    Temp,
}

/// A parsed, validated `MLXGraph`. Every `Tid` in it is below `num_tensors()`, every `Vid` below
/// `num_values`, every chain index in range, and every constant has named data.
#[derive(Debug, Clone, PartialEq)]
pub struct MlxGraph {
    pub version: String,
    pub num_constant_tensors: u32,
    pub num_input_tensors: u32,
    pub num_output_tensors: u32,
    pub num_mutable_buffer_tensors: u32,
    pub num_temp_tensors: u32,
    pub num_values: u32,
    pub chains: Vec<Vec<Node>>,
    /// The chain run on every `execute()`.
    pub main_chain_idx: usize,
    /// The chain run once at load (derived constants such as quantization biases).
    pub init_chain_idx: Option<usize>,
    pub input_map: Vec<SlotVariant>,
    pub output_map: Vec<SlotVariant>,
    pub mutable_buffer_map: Vec<SlotVariant>,
    pub named_slots: Vec<NamedSlot>,
    /// Indexed by `Tid`, for every non-temp tensor slot.
    pub tensor_meta: Vec<TensorMeta>,
    pub tag_table: TagTable,
    /// For each constant `Tid`, the index of its named slot.
    constant_slots: Vec<usize>,
}

impl MlxGraph {
    /// Tensor slots in all: constants, inputs, outputs, mutable buffers, temps.
    pub fn num_tensors(&self) -> usize {
        [
            self.num_constant_tensors,
            self.num_input_tensors,
            self.num_output_tensors,
            self.num_mutable_buffer_tensors,
            self.num_temp_tensors,
        ]
        .iter()
        .map(|&n| n as usize)
        .sum()
    }

    pub fn tensor_class(&self, tid: Tid) -> Option<TensorClass> {
        let mut end = 0u64;
        for (n, class) in [
            (self.num_constant_tensors, TensorClass::Constant),
            (self.num_input_tensors, TensorClass::Input),
            (self.num_output_tensors, TensorClass::Output),
            (self.num_mutable_buffer_tensors, TensorClass::MutableBuffer),
            (self.num_temp_tensors, TensorClass::Temp),
        ] {
            end += u64::from(n);
            if u64::from(tid.0) < end {
                return Some(class);
            }
        }
        None
    }

    pub fn main_chain(&self) -> &[Node] {
        self.chains
            .get(self.main_chain_idx)
            .map_or(&[], |c| c.as_slice())
    }

    pub fn init_chain(&self) -> Option<&[Node]> {
        self.chains.get(self.init_chain_idx?).map(|c| c.as_slice())
    }

    /// Metadata of a non-temp tensor slot.
    pub fn meta(&self, tid: Tid) -> Option<&TensorMeta> {
        self.tensor_meta.get(tid.0 as usize)
    }

    /// How many nodes of each kind (schema table name) appear over all chains.
    pub fn node_histogram(&self) -> BTreeMap<String, usize> {
        let mut h = BTreeMap::new();
        for node in self.chains.iter().flatten() {
            *h.entry(node.name().to_string()).or_insert(0) += 1;
        }
        h
    }

    /// The named-data key of a constant slot.
    pub fn constant_name(&self, tid: Tid) -> Option<&str> {
        let i = *self.constant_slots.get(tid.0 as usize)?;
        self.named_slots.get(i).map(|s| s.name.as_str())
    }

    /// The bytes of a constant slot, from the named data the graph was parsed against.
    pub fn constant_data<'n>(&self, tid: Tid, named: &'n NamedData) -> Result<&'n Blob> {
        let name = self.constant_name(tid).ok_or_else(|| {
            MlxError::Invalid(format!(
                "Tid {} is not a constant slot ({} constants)",
                tid.0, self.num_constant_tensors
            ))
        })?;
        named.get(name).ok_or_else(|| MlxError::MissingNamedData {
            name: name.to_string(),
            tid: tid.0,
        })
    }
}

/// Checks the MLX0 header and returns the flatbuffer region `[24, data_segment_offset)`.
fn flatbuffer_region(blob: &[u8]) -> Result<&[u8]> {
    if blob.len() < HEADER_LEN {
        return Err(MlxError::TooShort { len: blob.len() });
    }
    if &blob[4..8] != MAGIC {
        return Err(MlxError::BadMagic {
            found: String::from_utf8_lossy(&blob[4..8]).into_owned(),
        });
    }
    let offset = fb::read_u64(blob, 8).map_err(flat("MLX0 header"))?;
    let size = fb::read_u64(blob, 16).map_err(flat("MLX0 header"))?;
    let len = blob.len();
    let fits = offset > HEADER_LEN as u64
        && offset
            .checked_add(size)
            .is_some_and(|end| end <= len as u64);
    if !fits {
        return Err(MlxError::BadSegment { offset, size, len });
    }
    // `offset <= len`, so it fits in usize.
    Ok(&blob[HEADER_LEN..offset as usize])
}

/// One instruction as stored: its union tag and node table.
struct RawInstruction<'a> {
    tag: u8,
    table: Table<'a>,
}

/// Nodes decoded generically under one tag table: (tag, kind, field values) per instruction.
type Decoded = Vec<Vec<(u8, NodeKind, Vec<Value>)>>;

fn decode_under(
    raw: &[Vec<RawInstruction>],
    table: TagTable,
    mut ctx: Ctx,
) -> std::result::Result<Decoded, NodeFailure> {
    let mut chains = Vec::with_capacity(raw.len());
    for (c, chain) in raw.iter().enumerate() {
        let mut nodes = Vec::with_capacity(chain.len());
        for (i, ins) in chain.iter().enumerate() {
            let fail = |kind, msg| NodeFailure {
                chain: c,
                index: i,
                tag: ins.tag,
                kind,
                msg,
            };
            let Some(kind) = table.kind(ins.tag) else {
                let msg = format!(
                    "MLX node union tag {} is beyond {} ({} kinds); the blob was written by a different schema",
                    ins.tag,
                    table.short(),
                    table.kinds().len()
                );
                return Err(fail(None, msg));
            };
            let values =
                fields::read_node(&ins.table, kind, &mut ctx).map_err(|m| fail(Some(kind), m))?;
            nodes.push((ins.tag, kind, values));
        }
        chains.push(nodes);
    }
    Ok(chains)
}

/// Reads of temp slots that no node anywhere writes: a graph decoded under the wrong union order
/// reads garbage slots, a real one does not.
fn unwritten_temp_reads(decoded: &Decoded, first_temp: u64) -> usize {
    let mut written = BTreeSet::new();
    let mut reads = Vec::new();
    for (_, kind, values) in decoded.iter().flatten() {
        fields::tensor_io(*kind, values, |tid, w| {
            if w {
                written.insert(tid);
            } else if u64::from(tid.0) >= first_temp {
                reads.push(tid);
            }
        });
    }
    reads.iter().filter(|t| !written.contains(*t)).count()
}

/// Picks the union order the blob was written with; see the module docs.
fn detect(raw: &[Vec<RawInstruction>], ctx: &Ctx, first_temp: u64) -> Result<(TagTable, Decoded)> {
    let divergent: BTreeSet<u8> = raw
        .iter()
        .flatten()
        .map(|r| r.tag)
        .filter(|&t| t >= FIRST_DIVERGENT_TAG)
        .collect();
    if divergent.is_empty() {
        let d = decode_under(raw, TagTable::Executorch151, ctx.clone()).map_err(MlxError::Node)?;
        return Ok((TagTable::Executorch151, d));
    }
    let up = decode_under(raw, TagTable::Executorch151, ctx.clone());
    let fork = decode_under(raw, TagTable::SwmFork, ctx.clone());
    match (up, fork) {
        (Ok(d), Err(_)) => Ok((TagTable::Executorch151, d)),
        (Err(_), Ok(d)) => Ok((TagTable::SwmFork, d)),
        // The same failure under both orders is not about the order (e.g. a Tid out of range in a
        // node whose tag means the same in both).
        (Err(upstream), Err(fork)) if upstream == fork => Err(MlxError::Node(upstream)),
        (Err(upstream), Err(fork)) => Err(MlxError::TagLayout { upstream, fork }),
        (Ok(u), Ok(f)) => {
            let (ru, rf) = (
                unwritten_temp_reads(&u, first_temp),
                unwritten_temp_reads(&f, first_temp),
            );
            if ru < rf {
                return Ok((TagTable::Executorch151, u));
            }
            if rf < ru {
                return Ok((TagTable::SwmFork, f));
            }
            let name = |t: TagTable, tag| t.kind(tag).map_or("?", |k| k.name());
            let detail = divergent
                .iter()
                .map(|&t| {
                    format!(
                        "{t} ({} / {})",
                        name(TagTable::Executorch151, t),
                        name(TagTable::SwmFork, t)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            Err(MlxError::AmbiguousTagLayout { detail })
        }
    }
}

fn slot_variant(t: &Table, what: &str, ctx: &mut Ctx) -> Result<SlotVariant> {
    check_known_fields(t, 2, "SlotVariant", ctx)
        .map_err(|m| MlxError::Invalid(format!("{what}: {m}")))?;
    let idx = t.scalar::<u32>(0, 0).map_err(flat(what))?;
    let slot_type = match t.scalar::<i8>(1, 0).map_err(flat(what))? {
        0 => SlotType::Tensor,
        1 => SlotType::Int,
        2 => SlotType::Float,
        3 => SlotType::Bool,
        other => {
            return invalid(format!(
                "{what}: slot type {other} is not one of TensorSlot..BoolValueSlot (0..3)"
            ))
        }
    };
    Ok(SlotVariant { idx, slot_type })
}

/// Slot-space layout, from the counts: where each class of tensor slot starts and ends.
struct Layout {
    ends: [u64; 5],
    num_values: u64,
}

impl Layout {
    fn class_range(&self, class: TensorClass) -> (u64, u64) {
        let i = class as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        (start, self.ends[i])
    }

    /// Checks a slot against the tensor class it must belong to (or any tensor when `None`).
    fn check(&self, s: &SlotVariant, class: Option<TensorClass>, what: &str) -> Result<()> {
        let idx = u64::from(s.idx);
        match (s.slot_type, class) {
            (SlotType::Tensor, Some(c)) => {
                let (lo, hi) = self.class_range(c);
                if idx < lo || idx >= hi {
                    return invalid(format!(
                        "{what}: Tid {idx} is not a {c:?} slot ({lo}..{hi})"
                    ));
                }
            }
            (SlotType::Tensor, None) if idx >= self.ends[4] => {
                return invalid(format!(
                    "{what}: Tid {idx} is out of range ({} tensor slots)",
                    self.ends[4]
                ));
            }
            (SlotType::Tensor, None) => {}
            (_, _) if idx >= self.num_values => {
                return invalid(format!(
                    "{what}: Vid {idx} is out of range ({} value slots)",
                    self.num_values
                ));
            }
            _ => {}
        }
        Ok(())
    }
}

fn slot_map(
    root: &Table,
    slot: usize,
    name: &str,
    class: TensorClass,
    layout: &Layout,
    ctx: &mut Ctx,
) -> Result<Vec<SlotVariant>> {
    let Some(v) = root.tables(slot).map_err(flat(name))? else {
        return Ok(Vec::new());
    };
    ctx.charge(v.len()).map_err(MlxError::Invalid)?;
    let mut out = Vec::with_capacity(v.len());
    for i in 0..v.len() {
        let what = format!("{name}[{i}]");
        let t = v.get(i).map_err(flat(what.as_str()))?;
        let s = slot_variant(&t, &what, ctx)?;
        layout.check(&s, Some(class), &what)?;
        out.push(s);
    }
    Ok(out)
}

fn read_tensor_meta(t: &Table, tid: usize, ctx: &mut Ctx) -> Result<TensorMeta> {
    let what = format!("tensor_meta[{tid}]");
    let bad = |m: String| MlxError::Invalid(format!("{what}: {m}"));
    check_known_fields(t, 3, "TensorMeta", ctx).map_err(bad)?;
    let dims = t
        .tables(0)
        .map_err(flat(what.as_str()))?
        .ok_or_else(|| bad("has no shape (a required field)".into()))?;
    if dims.len() > MAX_RANK {
        return Err(bad(format!(
            "rank {} exceeds the limit of {MAX_RANK}",
            dims.len()
        )));
    }
    let mut shape = Vec::with_capacity(dims.len());
    for j in 0..dims.len() {
        let d = dims.get(j).map_err(flat(what.as_str()))?;
        check_known_fields(&d, 3, "ShapeDim", ctx).map_err(bad)?;
        let value = d.scalar::<i32>(0, -1).map_err(flat(what.as_str()))?;
        let min = d.scalar::<i32>(1, 0).map_err(flat(what.as_str()))?;
        let max = d.scalar::<i32>(2, -1).map_err(flat(what.as_str()))?;
        shape.push(match value {
            v if v >= 0 => ShapeDim::Static(v as usize),
            -1 if min < 0 => return Err(bad(format!("dim {j} has negative min_value {min}"))),
            -1 if max != -1 && max < min => {
                return Err(bad(format!(
                    "dim {j} has max_value {max} < min_value {min}"
                )));
            }
            -1 => ShapeDim::Dynamic {
                min: min as usize,
                max: (max >= 0).then_some(max as usize),
            },
            v => {
                return Err(bad(format!(
                    "dim {j} has value {v}; dims are >= 0, or -1 for dynamic"
                )))
            }
        });
    }
    let code = t.scalar::<i8>(1, 0).map_err(flat(what.as_str()))?;
    let dtype = ScalarType::from_code(code).ok_or_else(|| {
        bad(format!(
            "scalar type code {code} is not an ExecuTorch ScalarType"
        ))
    })?;
    let dim_order = t.vec_of::<u8>(2).map_err(flat(what.as_str()))?;
    if !dim_order.is_empty() {
        let mut seen = [false; MAX_RANK];
        let ok = dim_order.len() == shape.len()
            && dim_order.iter().all(|&d| {
                let fresh =
                    seen.get(usize::from(d)).is_some_and(|s| !s) && usize::from(d) < shape.len();
                if fresh {
                    seen[usize::from(d)] = true;
                }
                fresh
            });
        if !ok {
            return Err(bad(format!(
                "dim_order {dim_order:?} is not a permutation of 0..{}",
                shape.len()
            )));
        }
    }
    Ok(TensorMeta {
        shape,
        dtype,
        dim_order,
    })
}

/// Parses and validates an `MLXBackend` delegate blob. Constants are looked up in `named` (the
/// program's named data merged with any `.ptd`), which must hold every constant slot's key.
pub fn parse(blob: &[u8], named: &NamedData) -> Result<MlxGraph> {
    let buf = flatbuffer_region(blob)?;
    let root = Table::root(buf).map_err(flat("the MLXGraph root"))?;
    // Legitimate buffers materialise at most about one element per byte; see `Ctx`.
    let mut ctx = Ctx {
        num_tensors: 0,
        num_values: 0,
        num_chains: 0,
        budget: buf.len().saturating_mul(2).saturating_add(4096),
    };
    check_known_fields(&root, GRAPH_FIELDS, "MLXGraph", &mut ctx).map_err(MlxError::Invalid)?;

    let version = root.string(0).map_err(flat("MLXGraph.version"))?;
    if version != Some(SUPPORTED_VERSION) {
        return Err(MlxError::Version {
            found: version.map_or_else(|| "absent".to_string(), |v| format!("{v:?}")),
        });
    }

    let mut counts = [0u32; 6];
    for (i, c) in counts.iter_mut().enumerate() {
        *c = root
            .scalar::<u32>(1 + i, 0)
            .map_err(flat("MLXGraph slot counts"))?;
    }
    let [nc, ni, no, nm, nt, nv] = counts;
    let mut ends = [0u64; 5];
    let mut end = 0u64;
    for (e, n) in ends.iter_mut().zip([nc, ni, no, nm, nt]) {
        end += u64::from(n);
        *e = end;
    }
    if end > MAX_SLOTS || u64::from(nv) > MAX_SLOTS {
        return invalid(format!(
            "declares {end} tensor slots and {nv} value slots; at most {MAX_SLOTS} of each are accepted"
        ));
    }
    let layout = Layout {
        ends,
        num_values: u64::from(nv),
    };
    ctx.num_tensors = end;
    ctx.num_values = u64::from(nv);

    let chains = root
        .tables(7)
        .map_err(flat("MLXGraph.instruction_chains"))?
        .ok_or_else(|| MlxError::Invalid("has no instruction_chains (a required field)".into()))?;
    ctx.num_chains = chains.len();
    let mut raw = Vec::with_capacity(chains.len());
    for c in 0..chains.len() {
        let what = format!("instruction chain {c}");
        let chain = chains.get(c).map_err(flat(what.as_str()))?;
        check_known_fields(&chain, 1, "InstructionChain", &mut ctx).map_err(MlxError::Invalid)?;
        let instrs = chain
            .tables(0)
            .map_err(flat(what.as_str()))?
            .ok_or_else(|| {
                MlxError::Invalid(format!(
                    "{what} has no instructions vector (a required field)"
                ))
            })?;
        // Chains sharing one instruction vector would multiply the work; the budget refuses that.
        ctx.charge(instrs.len()).map_err(MlxError::Invalid)?;
        let mut list = Vec::with_capacity(instrs.len());
        for i in 0..instrs.len() {
            let at = || format!("{what}, instruction {i}");
            let ins = instrs.get(i).map_err(flat(at()))?;
            check_known_fields(&ins, 2, "Instruction", &mut ctx)
                .map_err(|m| MlxError::Invalid(format!("{}: {m}", at())))?;
            match ins.union(0).map_err(flat(at()))? {
                Some((tag, table)) => list.push(RawInstruction { tag, table }),
                None => return invalid(format!("{} has no op (union tag NONE)", at())),
            }
        }
        raw.push(list);
    }

    let main = root
        .scalar::<u32>(8, 0)
        .map_err(flat("MLXGraph.main_chain_idx"))?;
    let init = root
        .scalar::<i32>(9, -1)
        .map_err(flat("MLXGraph.init_chain_idx"))?;
    let main_chain_idx = main as usize;
    if main_chain_idx >= raw.len() {
        return invalid(format!(
            "main_chain_idx {main} is out of range ({} chains)",
            raw.len()
        ));
    }
    let init_chain_idx = match init {
        -1 => None,
        i if i >= 0 && (i as usize) < raw.len() => Some(i as usize),
        i => {
            return invalid(format!(
                "init_chain_idx {i} is neither -1 nor one of {} chains",
                raw.len()
            ))
        }
    };

    let (tag_table, decoded) = detect(&raw, &ctx, ends[3])?;
    let mut chains_out = Vec::with_capacity(decoded.len());
    for (c, chain) in decoded.iter().enumerate() {
        let mut nodes = Vec::with_capacity(chain.len());
        for (i, (tag, kind, values)) in chain.iter().enumerate() {
            let node = Node::from_fields(*kind, *tag, values).map_err(|msg| {
                MlxError::Node(NodeFailure {
                    chain: c,
                    index: i,
                    tag: *tag,
                    kind: Some(*kind),
                    msg,
                })
            })?;
            nodes.push(node);
        }
        chains_out.push(nodes);
    }
    drop(decoded);

    let input_map = slot_map(
        &root,
        10,
        "input_map",
        TensorClass::Input,
        &layout,
        &mut ctx,
    )?;
    let output_map = slot_map(
        &root,
        11,
        "output_map",
        TensorClass::Output,
        &layout,
        &mut ctx,
    )?;
    let mutable_buffer_map = slot_map(
        &root,
        12,
        "mutable_buffer_map",
        TensorClass::MutableBuffer,
        &layout,
        &mut ctx,
    )?;

    // Tensor metadata first: its length (bounded by the buffer) must match the non-temp slot
    // count, which then bounds everything allocated per constant below.
    let non_temp = ends[3];
    let metas = root.tables(14).map_err(flat("MLXGraph.tensor_meta"))?;
    let meta_len = metas.map_or(0, |m| m.len());
    if meta_len as u64 != non_temp {
        return invalid(format!(
            "has {meta_len} tensor_meta entries for {non_temp} non-temp tensor slots \
             ({nc} constants, {ni} inputs, {no} outputs, {nm} mutable buffers)"
        ));
    }
    let mut tensor_meta = Vec::with_capacity(meta_len);
    if let Some(metas) = metas {
        ctx.charge(meta_len).map_err(MlxError::Invalid)?;
        for i in 0..meta_len {
            let t = metas.get(i).map_err(flat(format!("tensor_meta[{i}]")))?;
            tensor_meta.push(read_tensor_meta(&t, i, &mut ctx)?);
        }
    }

    let mut named_slots = Vec::new();
    let mut constant_slots: Vec<Option<usize>> = vec![None; nc as usize];
    if let Some(v) = root.tables(13).map_err(flat("MLXGraph.named_slots"))? {
        ctx.charge(v.len()).map_err(MlxError::Invalid)?;
        named_slots.reserve(v.len());
        for i in 0..v.len() {
            let what = format!("named_slots[{i}]");
            let t = v.get(i).map_err(flat(what.as_str()))?;
            check_known_fields(&t, 2, "NamedSlot", &mut ctx)
                .map_err(|m| MlxError::Invalid(format!("{what}: {m}")))?;
            let name = t.string(0).map_err(flat(what.as_str()))?.ok_or_else(|| {
                MlxError::Invalid(format!("{what} has no name (a required field)"))
            })?;
            ctx.charge(name.len()).map_err(MlxError::Invalid)?;
            let st = t.table(1).map_err(flat(what.as_str()))?.ok_or_else(|| {
                MlxError::Invalid(format!("{what} `{name}` has no slot (a required field)"))
            })?;
            let slot = slot_variant(&st, &what, &mut ctx)?;
            layout.check(&slot, None, &format!("{what} `{name}`"))?;
            if slot.slot_type == SlotType::Tensor && u64::from(slot.idx) < u64::from(nc) {
                if named.get(name).is_none() {
                    return Err(MlxError::MissingNamedData {
                        name: name.to_string(),
                        tid: slot.idx,
                    });
                }
                constant_slots[slot.idx as usize].get_or_insert(named_slots.len());
            }
            named_slots.push(NamedSlot {
                name: name.to_string(),
                slot,
            });
        }
    }
    let constant_slots = constant_slots
        .into_iter()
        .enumerate()
        .map(|(tid, s)| s.ok_or(MlxError::UnnamedConstant { tid: tid as u32 }))
        .collect::<Result<Vec<usize>>>()?;

    Ok(MlxGraph {
        version: SUPPORTED_VERSION.to_string(),
        num_constant_tensors: nc,
        num_input_tensors: ni,
        num_output_tensors: no,
        num_mutable_buffer_tensors: nm,
        num_temp_tensors: nt,
        num_values: nv,
        chains: chains_out,
        main_chain_idx,
        init_chain_idx,
        input_map,
        output_map,
        mutable_buffer_map,
        named_slots,
        tensor_meta,
        tag_table,
        constant_slots,
    })
}
