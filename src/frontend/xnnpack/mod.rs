//! `XnnpackBackend` blobs: the XH00 header and the XN01 `fb_xnnpack.XNNGraph` flatbuffer.
//!
//! `parse` turns a delegate blob (from `pte::Program`) into an owned, fully validated `XnnGraph`
//! whose constants are zero-copy `Blob`s over the program's bytes or its named data; lowering to
//! the IR is a separate step downstream. Slot numbers follow `serialization/schema.fbs`.

mod header;
pub mod lower;
mod node;
mod value;

#[cfg(test)]
mod tests;

pub use header::XnnHeader;
pub use node::{
    ArgMaxPooling2d, Binary, Concatenate, Conv, Elu, FullyConnected, LeakyRelu, NodeKind,
    OutputMinMax, Pooling2d, ScaledDotProductAttention, StaticConstantPad, StaticReshape,
    StaticResizeBilinear2d, StaticSlice, StaticTranspose, Unary, XNode,
};
pub use value::{
    Datatype, PerChannelGroupQuant, PerChannelQuant, PerTensorQuant, PerTokenDynamicQuant,
    QuantParams, TensorValue, XValue, FLAG_EXTERNAL_INPUT, FLAG_EXTERNAL_OUTPUT, INVALID_ID,
};

use crate::fb::{FbError, Table};
use crate::pte::{Blob, NamedData};
use std::collections::{BTreeMap, BTreeSet};

/// The backend id under which programs store these blobs.
pub const BACKEND_ID: &str = "XnnpackBackend";
/// The flatbuffer file identifier this parser reads.
pub const IDENTIFIER: &[u8; 4] = b"XN01";
/// `ConstantDataOffset.offset` meaning "look the bytes up in named data under `named_key`".
pub const NAMED_OFFSET: u64 = u64::MAX;
/// The C++ runtime refuses graphs with more externals than this (`XNNCompiler.cpp`).
pub const MAX_EXTERNS: u32 = 4096;

/// Everything that can be wrong with an XNNPACK blob. `at` names the table and field, e.g.
/// `xvalues[2]` or `xnodes[1] (XNNFullyConnected).filter_id`.
#[derive(Debug, thiserror::Error)]
pub enum XnnError {
    #[error("XNNPACK blob header: {0}")]
    Header(String),
    #[error("XNNPACK graph, {at}: malformed flatbuffer: {source}")]
    Flatbuffer { at: String, source: FbError },
    #[error("XNNPACK graph, {at}: unknown {what} value {tag}")]
    UnknownTag {
        what: &'static str,
        tag: i64,
        at: String,
    },
    #[error("XNNPACK graph, {at}: {msg}")]
    Invalid { at: String, msg: String },
    #[error(
        "XNNPACK graph, constant_data[{index}]: named data `{key}` is in neither the program nor \
         its .ptd files"
    )]
    MissingNamedData { index: usize, key: String },
}

pub type Result<T> = std::result::Result<T, XnnError>;

impl XnnError {
    fn fb(at: impl Into<String>, source: FbError) -> Self {
        XnnError::Flatbuffer {
            at: at.into(),
            source,
        }
    }

    fn invalid(at: impl Into<String>, msg: impl Into<String>) -> Self {
        XnnError::Invalid {
            at: at.into(),
            msg: msg.into(),
        }
    }

    /// Prefixes the location with an enclosing one (`xvalues[3]` + `XNNTensorValue.datatype`).
    fn within(self, outer: &str) -> Self {
        let join = |at: String| format!("{outer}, {at}");
        match self {
            XnnError::Flatbuffer { at, source } => XnnError::Flatbuffer {
                at: join(at),
                source,
            },
            XnnError::UnknownTag { what, tag, at } => XnnError::UnknownTag {
                what,
                tag,
                at: join(at),
            },
            XnnError::Invalid { at, msg } => XnnError::Invalid { at: join(at), msg },
            other => other,
        }
    }
}

/// `ConstantDataOffset`, with its bytes resolved.
#[derive(Debug, Clone)]
pub struct ConstantData {
    /// Offset from the header's constant data offset, or `NAMED_OFFSET`.
    pub offset: u64,
    pub size: u64,
    /// The named-data key (`sha256hex` of the bytes, `scale_<sha256hex>` for scales); None for
    /// inline data.
    pub named_key: Option<String>,
    /// Exactly `size` bytes; None only for the reserved entry 0.
    pub data: Option<Blob>,
}

/// A parsed, validated `fb_xnnpack.XNNGraph`.
#[derive(Debug, Clone)]
pub struct XnnGraph {
    pub header: XnnHeader,
    pub version: String,
    pub nodes: Vec<XNode>,
    pub values: Vec<XValue>,
    /// Number of external values (delegate arguments): inputs plus outputs.
    pub num_externs: u32,
    /// `id_out`s of the external inputs, in argument order.
    pub input_ids: Vec<u32>,
    /// `id_out`s of the external outputs.
    pub output_ids: Vec<u32>,
    /// Entry 0 is reserved ("no constant").
    pub constant_data: Vec<ConstantData>,
    /// `id_out` → index in `values`.
    by_id: BTreeMap<u32, usize>,
}

impl XnnGraph {
    /// The value nodes and `input_ids`/`output_ids` call `id`.
    pub fn value(&self, id: u32) -> Option<&XValue> {
        self.by_id.get(&id).map(|&i| &self.values[i])
    }

    /// How many nodes of each kind, keyed by schema name (`XNNFullyConnected`, …).
    pub fn node_histogram(&self) -> BTreeMap<String, usize> {
        let mut h = BTreeMap::new();
        for n in &self.nodes {
            *h.entry(n.kind.name().to_string()).or_insert(0) += 1;
        }
        h
    }
}

/// Parses and validates an `XnnpackBackend` delegate blob, resolving constants against the
/// blob's inline constant data and `named` (the program's named data merged with its `.ptd`s).
pub fn parse(blob: &Blob, named: &NamedData) -> Result<XnnGraph> {
    let header = XnnHeader::parse(blob)?;
    let fb = &blob[header.flatbuffer_range()];
    // Exports before the named-data era used XN00 with constants inside the flatbuffer.
    let ident = &fb[4..8];
    if ident != IDENTIFIER {
        return Err(XnnError::Header(format!(
            "flatbuffer identifier is {:?}, expected \"XN01\"{}",
            String::from_utf8_lossy(ident),
            if ident == b"XN00" {
                " (legacy XN00 graphs with in-flatbuffer constant buffers are not supported)"
            } else {
                ""
            }
        )));
    }
    let root =
        Table::root_with_identifier(fb, IDENTIFIER).map_err(|e| XnnError::fb("XNNGraph", e))?;
    let field = |name: &str| format!("XNNGraph.{name}");

    // XNNGraph: version 0, xnodes 1, xvalues 2, num_externs 3, input_ids 4, output_ids 5,
    // constant_buffer 6 (deprecated), mem_buffer_sizes 7 (deprecated), constant_data 8.
    let version = root
        .string(0)
        .map_err(|e| XnnError::fb(field("version"), e))?
        .unwrap_or("")
        .to_string();
    let num_externs: u32 = root
        .scalar(3, 0)
        .map_err(|e| XnnError::fb(field("num_externs"), e))?;
    if num_externs > MAX_EXTERNS {
        return Err(XnnError::invalid(
            field("num_externs"),
            format!("{num_externs} exceeds the runtime's limit of {MAX_EXTERNS}"),
        ));
    }
    let input_ids: Vec<u32> = root
        .vec_of(4)
        .map_err(|e| XnnError::fb(field("input_ids"), e))?;
    let output_ids: Vec<u32> = root
        .vec_of(5)
        .map_err(|e| XnnError::fb(field("output_ids"), e))?;
    if root.has(6) {
        return Err(XnnError::invalid(
            field("constant_buffer"),
            "is set; this deprecated in-flatbuffer storage is not supported",
        ));
    }

    let constant_data = parse_constant_data(root, &header, blob, named)?;

    let xvalues = root
        .tables(2)
        .map_err(|e| XnnError::fb(field("xvalues"), e))?
        .ok_or_else(|| XnnError::invalid("XNNGraph", "has no xvalues"))?;
    let mut values = Vec::with_capacity(xvalues.len());
    let mut by_id = BTreeMap::new();
    for (i, t) in xvalues.iter().enumerate() {
        let t = t.map_err(|e| XnnError::fb(format!("xvalues[{i}]"), e))?;
        let mut v = value::decode(i, t)?;
        let at = format!("xvalues[{i}] (id {})", v.tensor.id_out);
        check_value(&mut v, num_externs, &constant_data).map_err(|e| e.within(&at))?;
        if v.tensor.id_out == INVALID_ID {
            return Err(XnnError::invalid(at, "id_out is XNN_INVALID_VALUE_ID"));
        }
        if by_id.insert(v.tensor.id_out, i).is_some() {
            return Err(XnnError::invalid(at, "id_out is used by an earlier value"));
        }
        values.push(v);
    }
    check_externals(&values, &input_ids, &output_ids)?;

    let xnodes = root
        .tables(1)
        .map_err(|e| XnnError::fb(field("xnodes"), e))?
        .ok_or_else(|| XnnError::invalid("XNNGraph", "has no xnodes"))?;
    let mut nodes = Vec::with_capacity(xnodes.len());
    for (i, t) in xnodes.iter().enumerate() {
        let t = t.map_err(|e| XnnError::fb(format!("xnodes[{i}]"), e))?;
        let n = node::decode(i, t)?;
        let fields = n
            .kind
            .input_fields()
            .into_iter()
            .chain(n.kind.output_fields());
        for (name, id) in fields {
            let at = || format!("xnodes[{i}] ({}).{name}", n.kind.name());
            if id == INVALID_ID {
                return Err(XnnError::invalid(
                    at(),
                    "is XNN_INVALID_VALUE_ID but is required",
                ));
            }
            if !by_id.contains_key(&id) {
                return Err(XnnError::invalid(
                    at(),
                    format!("value {id} does not exist"),
                ));
            }
        }
        nodes.push(n);
    }

    Ok(XnnGraph {
        header,
        version,
        nodes,
        values,
        num_externs,
        input_ids,
        output_ids,
        constant_data,
        by_id,
    })
}

fn parse_constant_data(
    root: Table<'_>,
    header: &XnnHeader,
    blob: &Blob,
    named: &NamedData,
) -> Result<Vec<ConstantData>> {
    let Some(entries) = root
        .tables(8)
        .map_err(|e| XnnError::fb("XNNGraph.constant_data", e))?
    else {
        return Ok(Vec::new());
    };
    let region = header.constant_data_range();
    let mut out = Vec::with_capacity(entries.len());
    for (i, t) in entries.iter().enumerate() {
        let at = format!("constant_data[{i}]");
        let fbe = |e| XnnError::fb(at.clone(), e);
        let t = t.map_err(fbe)?;
        // ConstantDataOffset: offset 0, size 1, named_key 2.
        let offset: u64 = t.scalar(0, 0).map_err(fbe)?;
        let size: u64 = t.scalar(1, 0).map_err(fbe)?;
        let named_key = t
            .string(2)
            .map_err(fbe)?
            .filter(|k| !k.is_empty())
            .map(str::to_string);
        // Index 0 is reserved for "not a constant" and never read.
        if i == 0 {
            out.push(ConstantData {
                offset,
                size,
                named_key,
                data: None,
            });
            continue;
        }
        let data = if offset == NAMED_OFFSET {
            let Some(key) = &named_key else {
                return Err(XnnError::invalid(
                    at,
                    "offset is UINT64_MAX (named) but named_key is empty",
                ));
            };
            let Some(b) = named.get(key) else {
                return Err(XnnError::MissingNamedData {
                    index: i,
                    key: key.clone(),
                });
            };
            if size > b.len() as u64 {
                return Err(XnnError::invalid(
                    at,
                    format!(
                        "size is {size} but named data `{key}` holds {} bytes",
                        b.len()
                    ),
                ));
            }
            b.slice(0..size as usize)
                .map_err(|e| XnnError::invalid(&at, e.to_string()))?
        } else {
            if let Some(key) = &named_key {
                return Err(XnnError::invalid(
                    at,
                    format!("has both an inline offset {offset} and named_key `{key}`"),
                ));
            }
            let region_len = (region.end - region.start) as u64;
            match offset.checked_add(size) {
                Some(end) if end <= region_len => {}
                _ => {
                    return Err(XnnError::invalid(
                        at,
                        format!(
                            "{size} bytes at offset {offset} extend past the {region_len}-byte \
                             constant data region"
                        ),
                    ))
                }
            }
            let start = region.start + offset as usize;
            blob.slice(start..start + size as usize)
                .map_err(|e| XnnError::invalid(&at, e.to_string()))?
        };
        out.push(ConstantData {
            offset,
            size,
            named_key,
            data: Some(data),
        });
    }
    Ok(out)
}

/// The bytes of `constant_data[idx]` for a value or scale that refers to it.
fn constant(constant_data: &[ConstantData], idx: u32, what: &str) -> Result<Blob> {
    match constant_data.get(idx as usize).and_then(|c| c.data.clone()) {
        Some(b) => Ok(b),
        None => Err(XnnError::invalid(
            what,
            format!(
                "is {idx}, outside constant_data (entries 1..{})",
                constant_data.len()
            ),
        )),
    }
}

/// Checks one value and resolves its constant bytes and scales.
fn check_value(v: &mut XValue, num_externs: u32, constant_data: &[ConstantData]) -> Result<()> {
    let t = &mut v.tensor;
    let dt = t.datatype;
    if t.flags & !(FLAG_EXTERNAL_INPUT | FLAG_EXTERNAL_OUTPUT) != 0 {
        return Err(XnnError::invalid(
            "flags",
            format!("has unknown bits {:#x}", t.flags),
        ));
    }
    match t.external_id {
        Some(e) if e >= num_externs => {
            return Err(XnnError::invalid(
                "external_id",
                format!("{e} is not below num_externs {num_externs}"),
            ))
        }
        None if t.flags != 0 => {
            return Err(XnnError::invalid(
                "flags",
                "mark an external input/output but external_id is XNN_INVALID_VALUE_ID",
            ))
        }
        _ => {}
    }
    if dt.is_quantized() != v.quant.is_some() {
        return Err(XnnError::invalid(
            "datatype",
            if v.quant.is_some() {
                format!("{} is not a quantized type but has quant_params", dt.name())
            } else {
                format!("{} needs quant_params but the value has none", dt.name())
            },
        ));
    }

    if t.constant_buffer_idx != 0 {
        let data = constant(constant_data, t.constant_buffer_idx, "constant_buffer_idx")?;
        let Some(want) = dt.constant_bytes(&t.dims) else {
            return Err(XnnError::invalid(
                "datatype",
                format!(
                    "{} {:?} cannot be a constant (no dense layout, or its size overflows)",
                    dt.name(),
                    t.dims
                ),
            ));
        };
        if want != data.len() as u64 {
            return Err(XnnError::invalid(
                "constant_buffer_idx",
                format!(
                    "{} {:?} needs {want} bytes but constant_data[{}] holds {}",
                    dt.name(),
                    t.dims,
                    t.constant_buffer_idx,
                    data.len()
                ),
            ));
        }
        t.data = Some(data);
    }

    let Some(q) = &mut v.quant else {
        return Ok(());
    };
    let t = &v.tensor;
    let qat = q.name();
    let bad = |msg: String| Err(XnnError::invalid(qat, msg));
    match q {
        QuantParams::PerTensor(_) => {
            if !matches!(dt, Datatype::Qint8 | Datatype::Quint8 | Datatype::Qint32) {
                return bad(format!("does not apply to {}", dt.name()));
            }
        }
        QuantParams::PerTokenDynamic(p) => {
            if !matches!(dt, Datatype::Qdint8 | Datatype::Qpint8) {
                return bad(format!("does not apply to {}", dt.name()));
            }
            if t.data.is_some() {
                return bad("a dynamically quantized value cannot be a constant".into());
            }
            if p.num_nonbatch_dims < 0 || p.num_nonbatch_dims as usize > t.dims.len() {
                return bad(format!(
                    "num_nonbatch_dims {} is outside 0..={} for dims {:?}",
                    p.num_nonbatch_dims,
                    t.dims.len(),
                    t.dims
                ));
            }
        }
        QuantParams::PerChannel(p) => {
            if !matches!(dt, Datatype::Qcint8 | Datatype::Qcint32 | Datatype::Qcint4) {
                return bad(format!("does not apply to {}", dt.name()));
            }
            let Some(&channels) = usize::try_from(p.channel_dim)
                .ok()
                .and_then(|d| t.dims.get(d))
            else {
                return bad(format!(
                    "channel_dim {} is outside dims {:?}",
                    p.channel_dim, t.dims
                ));
            };
            if p.scale_buffer_idx != 0 {
                let s = constant(constant_data, p.scale_buffer_idx, "scale_buffer_idx")
                    .map_err(|e| e.within(qat))?;
                if p.num_scales != channels || s.len() as u64 != channels as u64 * 4 {
                    return bad(format!(
                        "{channels} channels need {channels} fp32 scales, but num_scales is {} \
                         and constant_data[{}] holds {} bytes",
                        p.num_scales,
                        p.scale_buffer_idx,
                        s.len()
                    ));
                }
                p.scale_data = Some(s);
            } else if p.scale.len() != channels as usize {
                return bad(format!(
                    "{channels} channels but {} inline scales",
                    p.scale.len()
                ));
            }
        }
        QuantParams::PerChannelGroup(p) => {
            // XNNPACK's blockwise filters: qbint4 [N, K], blocks of group_size along K, scales
            // [N, K / group_size] (XNNCompiler reads dims 0 and 1; the serializer asserts axis 0).
            if dt != Datatype::Qbint4 {
                return bad(format!("does not apply to {}", dt.name()));
            }
            let [n, k] = t.dims[..] else {
                return bad(format!("needs a 2-D [N, K] filter, got dims {:?}", t.dims));
            };
            if p.channel_dim != 0 {
                return bad(format!("channel_dim is {}, expected 0", p.channel_dim));
            }
            if p.group_size <= 0 || k % p.group_size as u32 != 0 {
                return bad(format!(
                    "group_size {} does not divide K = {k}",
                    p.group_size
                ));
            }
            let want = n as u64 * (k / p.group_size as u32) as u64;
            if p.scale_buffer_idx != 0 {
                let s = constant(constant_data, p.scale_buffer_idx, "scale_buffer_idx")
                    .map_err(|e| e.within(qat))?;
                if p.num_scales as u64 != want || Some(s.len() as u64) != want.checked_mul(2) {
                    return bad(format!(
                        "[{n}, {k}] in groups of {} needs {want} bf16 scales, but num_scales is \
                         {} and constant_data[{}] holds {} bytes",
                        p.group_size,
                        p.num_scales,
                        p.scale_buffer_idx,
                        s.len()
                    ));
                }
                p.scale_data = Some(s);
            } else if p.scale.len() as u64 != want {
                return bad(format!(
                    "[{n}, {k}] in groups of {} needs {want} scales but {} are inline",
                    p.group_size,
                    p.scale.len()
                ));
            }
        }
    }
    Ok(())
}

/// `input_ids`/`output_ids` must list exactly the values flagged as external inputs/outputs, and
/// no two values may share an external id (it is their position in the delegate's arguments).
fn check_externals(values: &[XValue], input_ids: &[u32], output_ids: &[u32]) -> Result<()> {
    let mut seen = BTreeMap::new();
    for (i, v) in values.iter().enumerate() {
        if let Some(e) = v.tensor.external_id {
            if let Some(j) = seen.insert(e, i) {
                return Err(XnnError::invalid(
                    format!("xvalues[{i}]"),
                    format!("external_id {e} is also used by xvalues[{j}]"),
                ));
            }
        }
    }
    for (list, name, flag) in [
        (input_ids, "input_ids", FLAG_EXTERNAL_INPUT),
        (output_ids, "output_ids", FLAG_EXTERNAL_OUTPUT),
    ] {
        let flagged: BTreeSet<u32> = values
            .iter()
            .filter(|v| v.tensor.flags & flag != 0)
            .map(|v| v.tensor.id_out)
            .collect();
        let listed: BTreeSet<u32> = list.iter().copied().collect();
        if listed.len() != list.len() {
            return Err(XnnError::invalid(
                format!("XNNGraph.{name}"),
                format!("{list:?} lists a value twice"),
            ));
        }
        if flagged != listed {
            return Err(XnnError::invalid(
                format!("XNNGraph.{name}"),
                format!(
                    "{list:?} differs from the values flagged external (ids {flagged:?}); \
                     every id must name an existing value"
                ),
            ));
        }
    }
    Ok(())
}
