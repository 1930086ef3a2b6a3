//! Decodes the VK00 flatbuffer into `schema.rs` types and validates it: every id in range, every
//! enum known, every constant resolved and the same size as the tensors that use it.

use super::schema::*;
use super::{header, VulkanError};
use crate::fb::{self, Scalar, Table};
use crate::pte::{Blob, NamedData};

/// Field slots in schema declaration order; a union takes two (type tag, then value).
mod slot {
    pub mod graph {
        pub const VERSION: usize = 0;
        pub const CHAIN: usize = 1;
        pub const VALUES: usize = 2;
        pub const INPUT_IDS: usize = 3;
        pub const OUTPUT_IDS: usize = 4;
        pub const CONSTANTS: usize = 5;
        pub const SHADERS: usize = 6;
        pub const STORAGE_TYPE_OVERRIDE: usize = 7;
        pub const MEMORY_LAYOUT_OVERRIDE: usize = 8;
    }
    pub mod op {
        pub const NODE_ID: usize = 0;
        pub const NAME: usize = 1;
        pub const ARGS: usize = 2;
    }
    pub mod tensor {
        pub const DATATYPE: usize = 0;
        pub const DIMS: usize = 1;
        pub const CONSTANT_ID: usize = 2;
        pub const MEM_OBJ_ID: usize = 3;
        pub const STORAGE_TYPE: usize = 4;
        pub const MEMORY_LAYOUT: usize = 5;
        pub const STAGING_DATATYPE: usize = 6;
    }
    pub mod bytes {
        pub const OFFSET: usize = 0;
        pub const LENGTH: usize = 1;
        pub const NAMED_KEY: usize = 2;
    }
    /// `VkValue.value`: tag in slot 0, table in slot 1.
    pub const VALUE: usize = 0;
    /// The single field of `Int`, `Double`, `Bool`, `String`, the lists and `SymInt`.
    pub const PAYLOAD: usize = 0;
}

/// `GraphTypes` union tags. Unlike ExecuTorch's `KernelTypes`, Double comes before Bool.
mod tag {
    pub const NULL: u8 = 1;
    pub const INT: u8 = 2;
    pub const DOUBLE: u8 = 3;
    pub const BOOL: u8 = 4;
    pub const VK_TENSOR: u8 = 5;
    pub const INT_LIST: u8 = 6;
    pub const DOUBLE_LIST: u8 = 7;
    pub const BOOL_LIST: u8 = 8;
    pub const VALUE_LIST: u8 = 9;
    pub const STRING: u8 = 10;
    pub const SYM_INT: u8 = 11;
}

/// Schema defaults for fields a writer may omit.
const DEFAULT_STORAGE: u8 = 255;
const DEFAULT_LAYOUT: u8 = 255;
const UNSET: i8 = 127;

/// How many vector elements and string bytes one blob may decode to, per flatbuffer byte.
///
/// Each element of an unshared vector occupies at least one byte of the buffer, so honest blobs
/// stay under 1×; the slack allows for shared strings (repeated sha256 keys). Without a cap, a
/// small hostile blob could point thousands of tables at one large vector and make us copy it
/// thousands of times.
const DECODE_BUDGET_PER_BYTE: usize = 4;

struct Budget(usize);

impl Budget {
    fn take(&mut self, n: usize, what: impl FnOnce() -> String) -> Result<(), VulkanError> {
        match self.0.checked_sub(n) {
            Some(left) => {
                self.0 = left;
                Ok(())
            }
            None => Err(VulkanError::Graph(format!(
                "{} would decode past the limit of {DECODE_BUDGET_PER_BYTE} elements per \
                 flatbuffer byte (vectors shared between many tables?)",
                what()
            ))),
        }
    }
}

/// Adds where we were to a flatbuffer error.
trait Ctx<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, VulkanError>;
}

impl<T> Ctx<T> for fb::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, VulkanError> {
        self.map_err(|source| VulkanError::Flatbuffer {
            context: context(),
            source,
        })
    }
}

/// Reads a scalar vector field within the decode budget (empty when absent).
fn vec_field<T: Scalar>(
    t: &Table,
    slot: usize,
    budget: &mut Budget,
    what: impl Fn() -> String,
) -> Result<Vec<T>, VulkanError> {
    match t.vector::<T>(slot).ctx(&what)? {
        Some(v) => {
            budget.take(v.len(), &what)?;
            v.to_vec().ctx(what)
        }
        None => Ok(Vec::new()),
    }
}

fn string_field(
    t: &Table,
    slot: usize,
    budget: &mut Budget,
    what: impl Fn() -> String,
) -> Result<Option<String>, VulkanError> {
    match t.string(slot).ctx(&what)? {
        Some(s) => {
            budget.take(s.len(), &what)?;
            Ok(Some(s.to_string()))
        }
        None => Ok(None),
    }
}

/// Checks ids into a table of `count` entries; `err(i, msg)` builds the error for item `i`.
fn check_ids<I: Copy + Into<i64>>(
    ids: &[I],
    count: usize,
    noun: &str,
    err: impl Fn(usize, String) -> VulkanError,
) -> Result<Vec<usize>, VulkanError> {
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            let id: i64 = id.into();
            match usize::try_from(id) {
                Ok(u) if u < count => Ok(u),
                _ => Err(err(
                    i,
                    format!("{noun} id {id} out of range ({count} {noun}s)"),
                )),
            }
        })
        .collect()
}

/// Parses and validates a whole Vulkan blob; see `super::parse`.
pub fn parse(blob: &Blob, named: &NamedData) -> Result<VkGraph, VulkanError> {
    let header = header::parse(blob)?;
    // Report flatbuffer positions as blob offsets, which is what a hex dump of the blob shows.
    parse_graph(blob, header, named).map_err(|e| match e {
        VulkanError::Flatbuffer {
            context,
            mut source,
        } => {
            source.at = source.at.saturating_add(header.flatbuffer_offset);
            VulkanError::Flatbuffer { context, source }
        }
        other => other,
    })
}

fn parse_graph(
    blob: &Blob,
    header: VulkanHeader,
    named: &NamedData,
) -> Result<VkGraph, VulkanError> {
    let fb = &blob[header.flatbuffer_offset..header.flatbuffer_offset + header.flatbuffer_size];
    let root = Table::root_with_identifier(fb, b"VK00").ctx(|| "root table".into())?;
    let mut budget = Budget(fb.len().saturating_mul(DECODE_BUDGET_PER_BYTE));
    let budget = &mut budget;
    use slot::graph as g;

    let version = string_field(&root, g::VERSION, budget, || "version".into())?.unwrap_or_default();

    let constants = read_bytes_list(
        &root,
        g::CONSTANTS,
        "constant",
        blob,
        &header,
        named,
        budget,
    )?;
    let shaders = read_bytes_list(&root, g::SHADERS, "shader", blob, &header, named, budget)?;

    let values = match root.tables(g::VALUES).ctx(|| "values".into())? {
        Some(ts) => {
            let mut values = Vec::new();
            for i in 0..ts.len() {
                let t = ts.get(i).ctx(|| format!("value {i}"))?;
                values.push(read_value(&t, i, budget)?);
            }
            values
        }
        None => Vec::new(),
    };
    for (i, v) in values.iter().enumerate() {
        check_value(v, i, values.len(), &constants)?;
    }

    let chain = match root.tables(g::CHAIN).ctx(|| "chain".into())? {
        Some(ts) => {
            let mut chain = Vec::new();
            for i in 0..ts.len() {
                let t = ts.get(i).ctx(|| format!("operator call {i}"))?;
                chain.push(read_op(&t, i, values.len(), budget)?);
            }
            chain
        }
        None => Vec::new(),
    };

    let input_ids = read_io(&root, g::INPUT_IDS, "input", &values, budget)?;
    let output_ids = read_io(&root, g::OUTPUT_IDS, "output", &values, budget)?;

    let storage = root
        .scalar::<u8>(g::STORAGE_TYPE_OVERRIDE, DEFAULT_STORAGE)
        .ctx(|| "storage_type_override".into())?;
    let storage_type_override = VkStorageType::from_code(storage)
        .ok_or_else(|| VulkanError::Graph(format!("unknown storage_type_override {storage}")))?;
    let layout = root
        .scalar::<u8>(g::MEMORY_LAYOUT_OVERRIDE, DEFAULT_LAYOUT)
        .ctx(|| "memory_layout_override".into())?;
    let memory_layout_override = VkMemoryLayout::from_code(layout)
        .ok_or_else(|| VulkanError::Graph(format!("unknown memory_layout_override {layout}")))?;

    Ok(VkGraph {
        header,
        version,
        chain,
        values,
        input_ids,
        output_ids,
        constants,
        shaders,
        storage_type_override,
        memory_layout_override,
    })
}

/// `constants` or `shaders`: each resolved to a zero-copy view of exactly `length` bytes.
fn read_bytes_list(
    root: &Table,
    slot: usize,
    list: &'static str,
    blob: &Blob,
    header: &VulkanHeader,
    named: &NamedData,
    budget: &mut Budget,
) -> Result<Vec<VkBytes>, VulkanError> {
    let Some(ts) = root.tables(slot).ctx(|| format!("{list}s"))? else {
        return Ok(Vec::new());
    };
    let err = |index: usize, what: String| VulkanError::Bytes { list, index, what };
    let mut out = Vec::new();
    for i in 0..ts.len() {
        let what = || format!("{list} {i}");
        let t = ts.get(i).ctx(what)?;
        let offset = t.scalar::<u64>(slot::bytes::OFFSET, 0).ctx(what)?;
        let length = t.scalar::<u64>(slot::bytes::LENGTH, 0).ctx(what)?;
        let named_key = string_field(&t, slot::bytes::NAMED_KEY, budget, what)?;
        let data = if offset == VkBytes::NAMED {
            let Some(key) = named_key.as_deref() else {
                return Err(err(
                    i,
                    "is marked as named data (offset u64::MAX) but has no named_key".into(),
                ));
            };
            let Some(found) = named.get(key) else {
                return Err(err(
                    i,
                    format!("named data key `{key}` is not in the program or its .ptd files"),
                ));
            };
            if found.len() as u64 != length {
                return Err(err(
                    i,
                    format!(
                        "named data `{key}` holds {} bytes but the graph declares {length}",
                        found.len()
                    ),
                ));
            }
            found.clone()
        } else {
            // Inline data: `offset` is relative to the header's raw constant region.
            let in_region = offset
                .checked_add(length)
                .is_some_and(|end| end <= header.bytes_size as u64);
            if !in_region {
                return Err(err(
                    i,
                    format!(
                        "inline bytes {offset}+{length} run past the {}-byte constant region",
                        header.bytes_size
                    ),
                ));
            }
            // Both now fit within the blob, hence in usize.
            let start = header.bytes_offset + offset as usize;
            blob.slice(start..start + length as usize)
                .map_err(|e| err(i, e.to_string()))?
        };
        out.push(VkBytes {
            offset,
            length,
            named_key,
            data,
        });
    }
    Ok(out)
}

fn read_value(t: &Table, index: usize, budget: &mut Budget) -> Result<VkValue, VulkanError> {
    let what = || format!("value {index}");
    let verr = |what: String| VulkanError::Value { index, what };
    let Some((tag, v)) = t.union(slot::VALUE).ctx(what)? else {
        return Err(verr("has no payload (union type NONE)".into()));
    };
    let p = slot::PAYLOAD;
    Ok(match tag {
        tag::NULL => VkValue::Null,
        tag::INT => VkValue::Int(v.scalar(p, 0i64).ctx(what)?),
        tag::DOUBLE => VkValue::Double(v.scalar(p, 0f64).ctx(what)?),
        tag::BOOL => VkValue::Bool(v.scalar(p, false).ctx(what)?),
        tag::VK_TENSOR => VkValue::Tensor(read_tensor(&v, index, budget)?),
        tag::INT_LIST => VkValue::IntList(vec_field(&v, p, budget, what)?),
        tag::DOUBLE_LIST => VkValue::DoubleList(vec_field(&v, p, budget, what)?),
        tag::BOOL_LIST => VkValue::BoolList(vec_field(&v, p, budget, what)?),
        tag::VALUE_LIST => {
            // Range-checked against the value table in `check_value`, once its size is known.
            let items: Vec<i32> = vec_field(&v, p, budget, what)?;
            let items = items
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    usize::try_from(id)
                        .map_err(|_| verr(format!("ValueList item {i} is negative ({id})")))
                })
                .collect::<Result<_, _>>()?;
            VkValue::ValueList(items)
        }
        tag::STRING => VkValue::String(string_field(&v, p, budget, what)?.unwrap_or_default()),
        tag::SYM_INT => VkValue::SymInt(v.scalar(p, 0i32).ctx(what)?),
        other => {
            return Err(verr(format!(
                "unknown value type tag {other} (GraphTypes has 1..=11)"
            )))
        }
    })
}

fn read_tensor(t: &Table, index: usize, budget: &mut Budget) -> Result<VkTensor, VulkanError> {
    use slot::tensor as s;
    let what = || format!("value {index} (VkTensor)");
    let verr = |what: String| VulkanError::Value { index, what };
    let dtype = |slot: usize, default: i8, field: &str| -> Result<VkDataType, VulkanError> {
        let code = t.scalar::<i8>(slot, default).ctx(what)?;
        VkDataType::from_code(code).ok_or_else(|| verr(format!("unknown {field} {code}")))
    };
    let datatype = dtype(s::DATATYPE, 0, "datatype")?;
    let staging_datatype = dtype(s::STAGING_DATATYPE, UNSET, "staging_datatype")?;
    let storage = t.scalar::<u8>(s::STORAGE_TYPE, DEFAULT_STORAGE).ctx(what)?;
    let storage_type = VkStorageType::from_code(storage)
        .ok_or_else(|| verr(format!("unknown storage_type {storage}")))?;
    let layout = t.scalar::<u8>(s::MEMORY_LAYOUT, DEFAULT_LAYOUT).ctx(what)?;
    let memory_layout = VkMemoryLayout::from_code(layout)
        .ok_or_else(|| verr(format!("unknown memory_layout {layout}")))?;
    let dims: Vec<u32> = vec_field(t, s::DIMS, budget, what)?;
    let constant_id = t.scalar::<i32>(s::CONSTANT_ID, 0).ctx(what)?;
    let mem_obj_id = t.scalar::<i32>(s::MEM_OBJ_ID, 0).ctx(what)?;
    Ok(VkTensor {
        datatype,
        dims: dims.into_iter().map(|d| d as usize).collect(),
        // The schema: a negative id means "not a constant" / "no shared memory object".
        constant_id: usize::try_from(constant_id).ok(),
        mem_obj_id: usize::try_from(mem_obj_id).ok(),
        storage_type,
        memory_layout,
        staging_datatype,
    })
}

/// Checks that need the whole value table and the resolved constants.
fn check_value(
    v: &VkValue,
    index: usize,
    n_values: usize,
    constants: &[VkBytes],
) -> Result<(), VulkanError> {
    let verr = |what: String| VulkanError::Value { index, what };
    match v {
        VkValue::ValueList(items) => {
            for (i, &id) in items.iter().enumerate() {
                if id >= n_values {
                    return Err(verr(format!(
                        "ValueList item {i} is value id {id}, out of range ({n_values} values)"
                    )));
                }
            }
        }
        VkValue::Tensor(t) => {
            if t.datatype == VkDataType::Unset {
                return Err(verr("tensor datatype is UNSET".into()));
            }
            let Some(nbytes) = t.nbytes() else {
                return Err(verr(format!(
                    "{} tensor with dims {} overflows the address space",
                    t.datatype,
                    show_dims(&t.dims)
                )));
            };
            if let Some(c) = t.constant_id {
                let Some(bytes) = constants.get(c) else {
                    return Err(verr(format!(
                        "constant id {c} out of range ({} constants)",
                        constants.len()
                    )));
                };
                // Packed weights (int4 pairs in a uint8 [N, K/2] tensor) are declared with their
                // packed dims, so the byte count still matches exactly.
                if bytes.length != nbytes as u64 {
                    return Err(verr(format!(
                        "constant {c} holds {} bytes but the {} {} tensor needs {nbytes}",
                        bytes.length,
                        t.datatype,
                        show_dims(&t.dims)
                    )));
                }
            }
            // The planner numbers shared objects densely from 0, each holding at least one
            // value; a larger id is corrupt, and bounding it keeps per-object tables small.
            if let Some(m) = t.mem_obj_id {
                if m >= n_values {
                    return Err(verr(format!(
                        "mem_obj_id {m} out of range (at most {n_values} shared objects)"
                    )));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn show_dims(dims: &[usize]) -> String {
    if dims.len() <= 8 {
        format!("{dims:?}")
    } else {
        format!("[{} dims]", dims.len())
    }
}

fn read_op(
    t: &Table,
    index: usize,
    n_values: usize,
    budget: &mut Budget,
) -> Result<OperatorCall, VulkanError> {
    let what = || format!("operator call {index}");
    let node_id = t.scalar::<u32>(slot::op::NODE_ID, 0).ctx(what)?;
    let Some(name) = string_field(t, slot::op::NAME, budget, what)? else {
        return Err(VulkanError::Operator {
            index,
            name: "<unnamed>".into(),
            what: "has no name".into(),
        });
    };
    let raw: Vec<i32> = vec_field(t, slot::op::ARGS, budget, what)?;
    let args = check_ids(&raw, n_values, "value", |i, msg| VulkanError::Operator {
        index,
        name: name.clone(),
        what: format!("arg {i}: {msg}"),
    })?;
    Ok(OperatorCall {
        node_id,
        name,
        args,
    })
}

/// `input_ids` / `output_ids`: in range, and a tensor or a `SymInt` (the only kinds the runtime
/// can copy in or out).
fn read_io(
    root: &Table,
    slot: usize,
    list: &'static str,
    values: &[VkValue],
    budget: &mut Budget,
) -> Result<Vec<usize>, VulkanError> {
    let raw: Vec<u32> = vec_field(root, slot, budget, || format!("{list}_ids"))?;
    let err = |index, what| VulkanError::Io { list, index, what };
    let ids = check_ids(&raw, values.len(), "value", err)?;
    for (i, &id) in ids.iter().enumerate() {
        match values.get(id) {
            Some(VkValue::Tensor(_) | VkValue::SymInt(_)) => {}
            Some(other) => {
                return Err(err(
                    i,
                    format!("value {id} is a {}, not a tensor or SymInt", other.kind()),
                ))
            }
            None => return Err(err(i, format!("value id {id} out of range"))),
        }
    }
    Ok(ids)
}
