//! Schema-driven reading of one node table: every field of the kind's schema is read, type- and
//! range-checked (Tid/Vid against the slot counts, chain indices, ScalarType codes, bool bytes), and
//! a table that sets a slot its kind does not have is refused. The same check is how the tag table is
//! detected: a node read under the wrong union order almost always fails it.

use super::node::{FloatOrVid, IntOrVid, IntOrVidOrTid, Tid, Vid, VidOrTid};
use super::schema::{Dflt, NodeKind, Ty};
use crate::fb::{self, Table};
use crate::pte::ScalarType;

/// A checked field value, by the schema's type.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Absent,
    Tid(Tid),
    Vid(Vid),
    Int(i64),
    U64(u64),
    Float(f64),
    Bool(bool),
    ScalarType(ScalarType),
    Str(String),
    IntOrVid(IntOrVid),
    FloatOrVid(FloatOrVid),
    VidOrTid(VidOrTid),
    IntOrVidOrTid(IntOrVidOrTid),
    Tids(Vec<Tid>),
    IntOrVids(Vec<IntOrVid>),
    I32s(Vec<i32>),
    /// Validated but not kept (string and int8 lists, only used by `MetalKernelNode`).
    Skipped,
}

/// What field values are checked against, plus a work budget: FlatBuffers lets many tables share
/// one vector or string, so the number of elements materialised is capped in proportion to the
/// buffer size rather than trusted.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub num_tensors: u64,
    pub num_values: u64,
    pub num_chains: usize,
    pub budget: usize,
}

impl Ctx {
    pub fn charge(&mut self, units: usize) -> Result<(), String> {
        match self.budget.checked_sub(units) {
            Some(left) => {
                self.budget = left;
                Ok(())
            }
            None => Err(
                "the blob expands to far more elements than its size allows \
                         (shared vectors or strings referenced over and over)"
                    .into(),
            ),
        }
    }

    fn tid(&self, idx: u32) -> Result<Tid, String> {
        if u64::from(idx) < self.num_tensors {
            Ok(Tid(idx))
        } else {
            Err(format!(
                "Tid {idx} is out of range ({} tensor slots)",
                self.num_tensors
            ))
        }
    }

    fn vid(&self, idx: u32) -> Result<Vid, String> {
        if u64::from(idx) < self.num_values {
            Ok(Vid(idx))
        } else {
            Err(format!(
                "Vid {idx} is out of range ({} value slots)",
                self.num_values
            ))
        }
    }
}

fn fbe(e: fb::FbError) -> String {
    e.to_string()
}

/// Position and slot count of a table's vtable (already bounds-checked by `Table::at`).
fn vtable(t: &Table) -> Result<(usize, usize), String> {
    let buf = t.buf();
    let soff = fb::read_i32(buf, t.pos()).map_err(fbe)?;
    let vt = usize::try_from(t.pos() as i64 - i64::from(soff))
        .map_err(|_| "vtable before the buffer start")?;
    let len = usize::from(fb::read_u16(buf, vt).map_err(fbe)?);
    Ok((vt, len.saturating_sub(4) / 2))
}

fn present(t: &Table, slot: usize) -> Result<bool, String> {
    let (vt, slots) = vtable(t)?;
    if slot >= slots {
        return Ok(false);
    }
    Ok(fb::read_u16(t.buf(), vt + 4 + 2 * slot).map_err(fbe)? != 0)
}

/// Refuses a table whose vtable sets a slot beyond the `known` fields of its schema type: the writer
/// used a different (newer or forked) definition, and reading on would misinterpret it.
pub(crate) fn check_known_fields(
    t: &Table,
    known: usize,
    what: &str,
    ctx: &mut Ctx,
) -> Result<(), String> {
    let (vt, slots) = vtable(t)?;
    if slots > known {
        ctx.charge(slots - known)?;
    }
    for slot in known..slots {
        if fb::read_u16(t.buf(), vt + 4 + 2 * slot).map_err(fbe)? != 0 {
            return Err(format!(
                "{what} sets field slot {slot}, but the schema gives {what} only {known} fields"
            ));
        }
    }
    Ok(())
}

fn struct_u32(t: &Table, slot: usize) -> Result<Option<u32>, String> {
    match t.struct_bytes(slot, 4).map_err(fbe)? {
        Some(b) => {
            let a: [u8; 4] = b.try_into().map_err(|_| "struct of the wrong size")?;
            Ok(Some(u32::from_le_bytes(a)))
        }
        None => Ok(None),
    }
}

fn bool_at(t: &Table, slot: usize, default: bool) -> Result<bool, String> {
    match t.scalar::<u8>(slot, u8::from(default)).map_err(fbe)? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(format!("bool field holds byte {b:#04x}, not 0 or 1")),
    }
}

fn scalar_type(code: i8) -> Result<ScalarType, String> {
    ScalarType::from_code(code)
        .ok_or_else(|| format!("scalar type code {code} is not an ExecuTorch ScalarType"))
}

fn int_or_vid(t: &Table, ctx: &mut Ctx) -> Result<IntOrVid, String> {
    check_known_fields(t, 3, "IntOrVid", ctx)?;
    let literal = t.scalar::<i64>(0, 0).map_err(fbe)?;
    let vid = struct_u32(t, 1)?.map(|v| ctx.vid(v)).transpose()?;
    match (bool_at(t, 2, false)?, vid) {
        (true, Some(v)) => Ok(IntOrVid::Vid(v)),
        (true, None) => Err("IntOrVid has is_vid set but no vid".into()),
        (false, _) => Ok(IntOrVid::Int(literal)),
    }
}

fn float_or_vid(t: &Table, ctx: &mut Ctx) -> Result<FloatOrVid, String> {
    check_known_fields(t, 3, "FloatOrVid", ctx)?;
    let literal = t.scalar::<f64>(0, 0.0).map_err(fbe)?;
    let vid = struct_u32(t, 1)?.map(|v| ctx.vid(v)).transpose()?;
    match (bool_at(t, 2, false)?, vid) {
        (true, Some(v)) => Ok(FloatOrVid::Vid(v)),
        (true, None) => Err("FloatOrVid has is_vid set but no vid".into()),
        (false, _) => Ok(FloatOrVid::Float(literal)),
    }
}

fn vid_or_tid(t: &Table, ctx: &mut Ctx) -> Result<VidOrTid, String> {
    check_known_fields(t, 3, "VidOrTid", ctx)?;
    let vid = struct_u32(t, 0)?.map(|v| ctx.vid(v)).transpose()?;
    let tid = struct_u32(t, 1)?.map(|v| ctx.tid(v)).transpose()?;
    match (bool_at(t, 2, false)?, vid, tid) {
        (true, Some(v), _) => Ok(VidOrTid::Vid(v)),
        (false, _, Some(t)) => Ok(VidOrTid::Tid(t)),
        (true, None, _) => Err("VidOrTid has is_vid set but no vid".into()),
        (false, _, None) => Err("VidOrTid has is_vid unset but no tid".into()),
    }
}

fn int_or_vid_or_tid(t: &Table, ctx: &mut Ctx) -> Result<IntOrVidOrTid, String> {
    check_known_fields(t, 4, "IntOrVidOrTid", ctx)?;
    let literal = t.scalar::<i64>(0, 0).map_err(fbe)?;
    let vid = struct_u32(t, 1)?.map(|v| ctx.vid(v)).transpose()?;
    let tid = struct_u32(t, 2)?.map(|v| ctx.tid(v)).transpose()?;
    match (t.scalar::<u8>(3, 0).map_err(fbe)?, vid, tid) {
        (0, _, _) => Ok(IntOrVidOrTid::Int(literal)),
        (1, Some(v), _) => Ok(IntOrVidOrTid::Vid(v)),
        (2, _, Some(t)) => Ok(IntOrVidOrTid::Tid(t)),
        (1, None, _) => Err("IntOrVidOrTid has kind 1 (vid) but no vid".into()),
        (2, _, None) => Err("IntOrVidOrTid has kind 2 (tid) but no tid".into()),
        (k, _, _) => Err(format!(
            "IntOrVidOrTid kind is {k}; the schema defines 0 (int), 1 (vid), 2 (tid)"
        )),
    }
}

fn sub_table<'a>(t: &Table<'a>, slot: usize) -> Result<Option<Table<'a>>, String> {
    t.table(slot).map_err(fbe)
}

/// Reads one field; `Ok(None)` when it is absent.
fn read_field(t: &Table, slot: usize, ty: Ty, ctx: &mut Ctx) -> Result<Option<Value>, String> {
    Ok(match ty {
        Ty::Tid => struct_u32(t, slot)?
            .map(|i| ctx.tid(i).map(Value::Tid))
            .transpose()?,
        Ty::Vid => struct_u32(t, slot)?
            .map(|i| ctx.vid(i).map(Value::Vid))
            .transpose()?,
        Ty::IntOrVid => match sub_table(t, slot)? {
            Some(s) => Some(Value::IntOrVid(int_or_vid(&s, ctx)?)),
            None => None,
        },
        Ty::FloatOrVid => match sub_table(t, slot)? {
            Some(s) => Some(Value::FloatOrVid(float_or_vid(&s, ctx)?)),
            None => None,
        },
        Ty::VidOrTid => match sub_table(t, slot)? {
            Some(s) => Some(Value::VidOrTid(vid_or_tid(&s, ctx)?)),
            None => None,
        },
        Ty::IntOrVidOrTid => match sub_table(t, slot)? {
            Some(s) => Some(Value::IntOrVidOrTid(int_or_vid_or_tid(&s, ctx)?)),
            None => None,
        },
        _ if !present(t, slot)? => None,
        Ty::I32 => Some(Value::Int(i64::from(
            t.scalar::<i32>(slot, 0).map_err(fbe)?,
        ))),
        Ty::U64 => Some(Value::U64(t.scalar::<u64>(slot, 0).map_err(fbe)?)),
        Ty::F32 => Some(Value::Float(f64::from(
            t.scalar::<f32>(slot, 0.0).map_err(fbe)?,
        ))),
        Ty::Bool => Some(Value::Bool(bool_at(t, slot, false)?)),
        Ty::ScalarType => Some(Value::ScalarType(scalar_type(
            t.scalar::<i8>(slot, 0).map_err(fbe)?,
        )?)),
        Ty::ChainIdxI32 | Ty::ChainIdxU32 => {
            let idx = if ty == Ty::ChainIdxI32 {
                i64::from(t.scalar::<i32>(slot, 0).map_err(fbe)?)
            } else {
                i64::from(t.scalar::<u32>(slot, 0).map_err(fbe)?)
            };
            if idx < 0 || idx as u64 >= ctx.num_chains as u64 {
                return Err(format!(
                    "chain index {idx} is out of range ({} chains)",
                    ctx.num_chains
                ));
            }
            Some(Value::Int(idx))
        }
        Ty::Str => match t.string(slot).map_err(fbe)? {
            Some(s) => {
                ctx.charge(s.len() + 1)?;
                Some(Value::Str(s.to_string()))
            }
            None => None,
        },
        Ty::TidVec => match t.vector::<u32>(slot).map_err(fbe)? {
            Some(v) => {
                ctx.charge(v.len() + 1)?;
                let mut out = Vec::with_capacity(v.len());
                for i in 0..v.len() {
                    out.push(ctx.tid(v.get(i).map_err(fbe)?)?);
                }
                Some(Value::Tids(out))
            }
            None => None,
        },
        Ty::IntOrVidVec => match t.tables(slot).map_err(fbe)? {
            Some(v) => {
                ctx.charge(v.len() + 1)?;
                let mut out = Vec::with_capacity(v.len());
                for e in v.iter() {
                    out.push(int_or_vid(&e.map_err(fbe)?, ctx)?);
                }
                Some(Value::IntOrVids(out))
            }
            None => None,
        },
        Ty::I32Vec => match t.vector::<i32>(slot).map_err(fbe)? {
            Some(v) => {
                ctx.charge(v.len() + 1)?;
                Some(Value::I32s(v.to_vec().map_err(fbe)?))
            }
            None => None,
        },
        Ty::I8Vec => match t.vector::<i8>(slot).map_err(fbe)? {
            Some(v) => {
                ctx.charge(v.len() + 1)?;
                Some(Value::Skipped)
            }
            None => None,
        },
        Ty::StrVec => match t.tables(slot).map_err(fbe)? {
            Some(v) => {
                ctx.charge(v.len() + 1)?;
                let strings = t.strings(slot).map_err(fbe)?;
                ctx.charge(strings.iter().map(|s| s.len()).sum())?;
                Some(Value::Skipped)
            }
            None => None,
        },
    })
}

/// Reads and checks every field of a `kind` node table, in slot order.
pub(crate) fn read_node(t: &Table, kind: NodeKind, ctx: &mut Ctx) -> Result<Vec<Value>, String> {
    let fields = kind.fields();
    ctx.charge(1 + fields.len())?;
    check_known_fields(t, fields.len(), kind.name(), ctx)?;
    let mut values = Vec::with_capacity(fields.len());
    for (slot, f) in fields.iter().enumerate() {
        let v = read_field(t, slot, f.ty, ctx).map_err(|e| format!("field `{}`: {e}", f.name))?;
        values.push(match v {
            Some(v) => v,
            None if f.required => return Err(format!("required field `{}` is missing", f.name)),
            None => default_value(f.default, f.ty),
        });
    }
    Ok(values)
}

/// The value of an absent field: its schema default, or `Absent` for optional ones.
fn default_value(default: Dflt, ty: Ty) -> Value {
    match default {
        Dflt::Absent => Value::Absent,
        Dflt::Bool(b) => Value::Bool(b),
        Dflt::Int(n) => Value::Int(n),
        Dflt::Float(x) => Value::Float(x),
        Dflt::Zero => match ty {
            Ty::F32 => Value::Float(0.0),
            Ty::Bool => Value::Bool(false),
            // ScalarType code 0.
            Ty::ScalarType => Value::ScalarType(ScalarType::Byte),
            Ty::U64 => Value::U64(0),
            _ => Value::Int(0),
        },
    }
}

/// Calls `f(tid, written)` for every tensor slot a node reads or writes, judged by field name: the
/// schema names outputs `out`, `outs` and `outputs` (and `ScanNode` writes `sliced` and `carry`).
pub(crate) fn tensor_io(kind: NodeKind, values: &[Value], mut f: impl FnMut(Tid, bool)) {
    for (field, v) in kind.fields().iter().zip(values) {
        let written = matches!(field.name, "out" | "outs" | "outputs" | "sliced" | "carry");
        match v {
            Value::Tid(t)
            | Value::VidOrTid(VidOrTid::Tid(t))
            | Value::IntOrVidOrTid(IntOrVidOrTid::Tid(t)) => f(*t, written),
            Value::Tids(ts) => ts.iter().for_each(|t| f(*t, written)),
            _ => {}
        }
    }
}
