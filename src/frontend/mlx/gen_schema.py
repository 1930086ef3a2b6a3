"""Generate schema.rs (Pteria's MLX node schema) from an ExecuTorch `backends/mlx/serialization/schema.fbs`.

    python3 src/frontend/mlx/gen_schema.py \
        $VENV/lib/python3.*/site-packages/executorch/backends/mlx/serialization/schema.fbs \
        > src/frontend/mlx/schema.rs && rustfmt --edition 2021 src/frontend/mlx/schema.rs

Only needed when the exporter's schema changes; the build and tests never run it. The Software
Mansion fork's union order (CumMaxNode inserted after CumsumNode, ending at RandomBitsNode) is
written down below from software-mansion-labs/executorch's schema.fbs (commit cbf650a).
"""
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r"//[^\n]*", "", src)
tables = {}
order = []
for m in re.finditer(r"\btable\s+(\w+)\s*\{(.*?)\}", src, re.S):
    name, body = m.group(1), m.group(2)
    fields = []
    for f in body.split(";"):
        f = f.strip()
        if not f: continue
        fm = re.match(r"(\w+)\s*:\s*(\[?\w+\]?)\s*(\(([^)]*)\))?\s*(=\s*(\S+))?\s*$", f)
        assert fm, (name, f)
        fname, ty, attrs, dflt = fm.group(1), fm.group(2), fm.group(4) or "", fm.group(6)
        fields.append((fname, ty, "required" in attrs, dflt))
    tables[name] = fields
    order.append(name)
um = re.search(r"union\s+OpNode\s*\{(.*?)\}", src, re.S)
union = [x.strip() for x in um.group(1).split(",") if x.strip()]
assert len(union) == 136, len(union)
# The Software Mansion fork inserts CumMaxNode {x, out, axis} after CumsumNode and ends at RandomBitsNode
# (software-mansion-labs/executorch, backends/mlx/serialization/schema.fbs at cbf650a).
tables["CumMaxNode"] = [("x", "Tid", True, None), ("out", "Tid", True, None), ("axis", "int32", False, None)]
ci = union.index("CumsumNode")
fork = union[:ci+1] + ["CumMaxNode"] + union[ci+1:union.index("RandomBitsNode")+1]
assert len(fork) == 134
kinds = union + ["CumMaxNode"]

SCALAR = {"int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64", "float": "F32", "double": "F64",
          "bool": "Bool", "int8": "I8", "uint8": "U8"}
def ty_of(fname, ty):
    if ty.startswith("["):
        inner = ty[1:-1]
        return {"Tid": "TidVec", "IntOrVid": "IntOrVidVec", "int32": "I32Vec", "int8": "I8Vec", "string": "StrVec"}[inner]
    if ty in ("Tid", "Vid", "IntOrVid", "FloatOrVid", "VidOrTid", "IntOrVidOrTid"): return ty
    if ty == "string": return "Str"
    if fname.endswith("_chain_idx"): return "ChainIdx" + SCALAR[ty]
    if fname in ("scalar_type", "dtype", "out_dtype") and ty == "int8": return "ScalarType"
    return SCALAR[ty]
def dflt_of(ty, d):
    if d is None:
        if ty in SCALAR: return "Dflt::Zero"
        return "Dflt::Absent"
    if d == "null": return "Dflt::Absent"
    if d in ("true", "false"): return f"Dflt::Bool({d})"
    if ty in ("float", "double"): return f"Dflt::Float({float(d)!r})"
    return f"Dflt::Int({int(d)})"

def variant(n): return n[:-4] if n.endswith("Node") else n
out = []
w = out.append
w("//! The MLX delegate's node schema, generated from executorch 1.5.1's")
w("//! `backends/mlx/serialization/schema.fbs` (plus the Software Mansion fork's `CumMaxNode`) by")
w("//! `gen_schema.py` beside this file: regenerate rather than edit. Fields are in declaration order,")
w("//! which is FlatBuffers slot order.")
w("")
w("/// One MLX op-node table type (`OpNode` union member), named as in the schema without `Node`.")
w("#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]")
w("pub enum NodeKind {")
for k in kinds: w(f"    {variant(k)},")
w("}")
w("")
w("/// How a field is stored and what it means; drives validation of every node table.")
w("#[derive(Debug, Clone, Copy, PartialEq, Eq)]")
w("pub(crate) enum Ty {")
used = []
for k in kinds:
    for (fn, ty, req, d) in tables[k]:
        t = ty_of(fn, ty)
        if t not in used: used.append(t)
for t in ["Tid", "Vid", "IntOrVid", "FloatOrVid", "VidOrTid", "IntOrVidOrTid", "I32", "U32", "I64", "U64", "F32", "F64", "Bool", "I8", "U8",
          "ScalarType", "ChainIdxI32", "ChainIdxU32", "Str", "TidVec", "IntOrVidVec", "I32Vec", "I8Vec", "StrVec"]:
    if t in used: w(f"    {t},")
w("}")
w("")
w("/// A field's value when it is absent from the table.")
w("#[derive(Debug, Clone, Copy, PartialEq)]")
w("pub(crate) enum Dflt {")
w("    /// Offsets, structs and `= null` scalars: absent means \"none\".")
w("    Absent,")
w("    Zero,")
w("    Int(i64),")
w("    Float(f64),")
w("    Bool(bool),")
w("}")
w("")
w("#[derive(Debug)]")
w("pub(crate) struct Field {")
w("    pub name: &'static str,")
w("    pub ty: Ty,")
w("    pub required: bool,")
w("    pub default: Dflt,")
w("}")
w("")
w("const fn field(name: &'static str, ty: Ty, required: bool, default: Dflt) -> Field {")
w("    Field { name, ty, required, default }")
w("}")
w("")
w("impl NodeKind {")
w(f"    pub const ALL: [NodeKind; {len(kinds)}] = [")
for k in kinds: w(f"        NodeKind::{variant(k)},")
w("    ];")
w("")
w("    /// The schema's table name, e.g. `RMSNormNode`.")
w("    pub fn name(self) -> &'static str {")
w("        match self {")
for k in kinds: w(f"            NodeKind::{variant(k)} => \"{k}\",")
w("        }")
w("    }")
w("")
w("    pub(crate) fn fields(self) -> &'static [Field] {")
w("        use Dflt::*;")
w("        match self {")
for k in kinds:
    fs = tables[k]
    if not fs:
        w(f"            NodeKind::{variant(k)} => &[],"); continue
    w(f"            NodeKind::{variant(k)} => {{")
    w(f"                const F: &[Field] = &[")
    for (fn, ty, req, d) in fs:
        dd = dflt_of(ty, d).replace("Dflt::", "")
        w(f"                    field(\"{fn}\", Ty::{ty_of(fn, ty)}, {'true' if req else 'false'}, {dd}),")
    w("                ];")
    w("                F")
    w("            }")
w("        }")
w("    }")
w("}")
w("")
w("/// `OpNode` union members of executorch 1.5.1 in tag order (tag = index + 1): upstream's")
w("/// append-only list, with `TruncNode` (135) and `FlipNode` (136) appended by the wheel.")
w(f"pub(crate) const UPSTREAM_1_5_1: [NodeKind; {len(union)}] = [")
for k in union: w(f"    NodeKind::{variant(k)},")
w("];")
w("")
w("/// The Software Mansion fork's union (software-mansion-labs/executorch, the exporter of the published")
w("/// Gemma 4 MLX files): `CumMaxNode` inserted after `CumsumNode` (tag 112), so every later member is")
w("/// upstream's tag + 1, ending at `RandomBitsNode` (134); no `UpdateAndAttend`, `Trunc` or `Flip`.")
w(f"pub(crate) const SWM_FORK: [NodeKind; {len(fork)}] = [")
for k in fork: w(f"    NodeKind::{variant(k)},")
w("];")
print("\n".join(out))
