//! The `.pte` program container and `.ptd` external data, validated before use.
//!
//! `Program::open` maps the file, checks every offset and size the flatbuffer declares, resolves
//! each tensor's data location, and hands out zero-copy `Blob`s over the mapping. Downstream, the
//! runtime builds methods from `ExecutionPlan`s and delegates read their blobs and named data.

mod header;
mod ptd;
mod scalar_type;

pub use header::ExtendedHeader;
pub use ptd::DataFile;
pub use scalar_type::ScalarType;

use crate::fb::{self, Table};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, Range};
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum PteError {
    #[error("cannot read {path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("malformed flatbuffer in {context}: {source}")]
    Flatbuffer {
        context: String,
        source: fb::FbError,
    },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, PteError>;

fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(PteError::Invalid(msg.into()))
}

/// Adds a description of where we were to a flatbuffer error.
trait Ctx<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Ctx<T> for fb::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| PteError::Flatbuffer {
            context: context(),
            source,
        })
    }
}

/// File bytes, memory-mapped or owned, or derived from other bytes on first read.
pub enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
    /// -8 · each little-endian f32 of `scales`: a symmetric 4-bit weight's biases. A GPU forms
    /// them from the scales and never reads these, so they are made only if something does
    /// (E2B's are 415 MB).
    Neg8 {
        scales: Blob,
        made: std::sync::OnceLock<Vec<u8>>,
    },
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
            Bytes::Neg8 { scales, made } => made.get_or_init(|| {
                scales
                    .chunks_exact(4)
                    .flat_map(|s| {
                        (-8.0 * f32::from_le_bytes([s[0], s[1], s[2], s[3]])).to_le_bytes()
                    })
                    .collect()
            }),
        }
    }
}

impl Bytes {
    pub fn map(path: &Path) -> Result<Arc<Bytes>> {
        let io = |cause| PteError::Io {
            path: path.display().to_string(),
            cause,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return invalid(format!("{} is empty", path.display()));
        }
        // SAFETY: the mapping is read-only; Pteria never writes model files while they are open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(Arc::new(Bytes::Mapped(map)))
    }
}

/// A zero-copy view of a byte range inside a loaded file.
#[derive(Clone)]
pub struct Blob {
    bytes: Arc<Bytes>,
    range: Range<usize>,
}

impl Blob {
    pub fn new(bytes: Arc<Bytes>, range: Range<usize>) -> Result<Self> {
        if range.start > range.end || range.end > bytes.len() {
            return invalid(format!(
                "byte range {}..{} is outside a {}-byte file",
                range.start,
                range.end,
                bytes.len()
            ));
        }
        Ok(Blob { bytes, range })
    }

    pub fn whole(bytes: Arc<Bytes>) -> Self {
        let range = 0..bytes.len();
        Blob { bytes, range }
    }

    /// Where this view begins in the bytes it was cut from (a delegate's blob: its offset in
    /// the program file).
    pub fn start(&self) -> usize {
        self.range.start
    }

    /// -8 · each f32 of `scales` (whole f32s only), made when first read (`Bytes::Neg8`).
    pub fn neg8(scales: Blob) -> Self {
        let range = 0..scales.len() / 4 * 4;
        let made = std::sync::OnceLock::new();
        Blob {
            bytes: Arc::new(Bytes::Neg8 { scales, made }),
            range,
        }
    }

    /// The scales this blob is -8 times, when it is all of a `neg8` blob.
    pub fn neg8_of(&self) -> Option<&Blob> {
        match &*self.bytes {
            Bytes::Neg8 { scales, .. } if self.range == (0..scales.len() / 4 * 4) => Some(scales),
            _ => None,
        }
    }

    /// Whether its bytes exist: false only for a `neg8` blob nothing has read.
    pub fn is_made(&self) -> bool {
        match &*self.bytes {
            Bytes::Neg8 { made, .. } => made.get().is_some(),
            _ => true,
        }
    }

    /// Whether both are the same bytes of the same source (not a comparison of contents).
    pub fn same_as(&self, other: &Blob) -> bool {
        Arc::ptr_eq(&self.bytes, &other.bytes) && self.range == other.range
    }

    /// Its length, known without reading it (a `neg8` blob is not made by asking).
    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// A blob of no bytes (what a tensor keeps once its data lives elsewhere).
    pub fn empty() -> Self {
        Blob::whole(Arc::new(Bytes::Owned(Vec::new())))
    }

    /// Tells the OS this process is done with the blob's file pages: they leave its resident
    /// set (staying in the page cache, the first memory reclaimed) and fault back in from the
    /// file if read again. Only whole pages inside the blob are given up, so neighbours that
    /// share a page keep it; owned bytes are untouched (dropping them frees them).
    pub fn release_pages(&self) {
        // The largest page size of the platforms we ship (arm64 Android/Apple use 4-64 KiB).
        const PAGE: usize = 64 << 10;
        #[cfg(unix)]
        if let Bytes::Mapped(m) = &*self.bytes {
            let start = self.range.start.div_ceil(PAGE) * PAGE;
            let end = self.range.end / PAGE * PAGE;
            if end > start {
                // SAFETY: the mapping is shared and read-only, so MADV_DONTNEED loses nothing:
                // a later read faults the same bytes back in from the file.
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
                };
            }
        }
    }

    /// A sub-range, relative to this blob.
    pub fn slice(&self, r: Range<usize>) -> Result<Blob> {
        if r.start > r.end || r.end > self.len() {
            return invalid(format!(
                "byte range {}..{} is outside a {}-byte blob",
                r.start,
                r.end,
                self.len()
            ));
        }
        Ok(Blob {
            bytes: self.bytes.clone(),
            range: self.range.start + r.start..self.range.start + r.end,
        })
    }
}

impl Deref for Blob {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.range.clone()]
    }
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.len())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dynamism {
    Static,
    /// `sizes` are upper bounds.
    DynamicBound,
    DynamicUnbound,
}

/// Where a tensor's bytes come from.
#[derive(Debug, Clone)]
pub enum TensorData {
    /// Read-only data in the file (constant segment, inline buffer, or named data).
    Constant(Blob),
    /// Memory-planned: `arena` is 0-based (ExecuTorch memory ids are 1-based; id 0 is reserved).
    Planned {
        arena: usize,
        offset: usize,
        initial: Option<Blob>,
    },
    /// Supplied at run time: a method input, or the output of a view kernel.
    Runtime,
}

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub dtype: ScalarType,
    /// Sizes (upper bounds when dynamic).
    pub sizes: Vec<usize>,
    pub dim_order: Vec<u8>,
    pub dynamism: Dynamism,
    pub data: TensorData,
    pub fqn: Option<String>,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

#[derive(Debug, Clone)]
pub enum EValue {
    Null,
    Int(i64),
    Bool(bool),
    Double(f64),
    String(String),
    Tensor(TensorInfo),
    /// Items are value indexes of boxed Ints (so dynamic dims resolve at run time).
    IntList(Vec<usize>),
    DoubleList(Vec<f64>),
    BoolList(Vec<bool>),
    TensorList(Vec<usize>),
    OptionalTensorList(Vec<Option<usize>>),
}

impl EValue {
    pub fn kind(&self) -> &'static str {
        match self {
            EValue::Null => "None",
            EValue::Int(_) => "Int",
            EValue::Bool(_) => "Bool",
            EValue::Double(_) => "Double",
            EValue::String(_) => "String",
            EValue::Tensor(_) => "Tensor",
            EValue::IntList(_) => "IntList",
            EValue::DoubleList(_) => "DoubleList",
            EValue::BoolList(_) => "BoolList",
            EValue::TensorList(_) => "TensorList",
            EValue::OptionalTensorList(_) => "OptionalTensorList",
        }
    }
}

#[derive(Debug, Clone)]
pub enum Instruction {
    Kernel { op: usize, args: Vec<usize> },
    Delegate { delegate: usize, args: Vec<usize> },
    Move { from: usize, to: usize },
    JumpFalse { cond: usize, dest: usize },
    Free { value: usize },
}

#[derive(Debug, Clone)]
pub struct Operator {
    pub name: String,
    pub overload: String,
}

impl Operator {
    /// The kernel lookup key: `name.overload`, or `name` when the overload is empty.
    pub fn key(&self) -> String {
        if self.overload.is_empty() {
            self.name.clone()
        } else {
            format!("{}.{}", self.name, self.overload)
        }
    }
}

#[derive(Debug, Clone)]
pub struct BackendDelegate {
    pub id: String,
    pub data: Blob,
    pub compile_specs: Vec<(String, Vec<u8>)>,
}

#[derive(Debug, Clone)]
pub struct ExecutionPlan {
    pub name: String,
    pub values: Vec<EValue>,
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
    /// Instructions of the (single, in every current export) chain.
    pub instructions: Vec<Instruction>,
    pub operators: Vec<Operator>,
    pub delegates: Vec<BackendDelegate>,
    /// Arena sizes, 0-based (the file's reserved entry 0 is dropped).
    pub arena_sizes: Vec<usize>,
}

impl ExecutionPlan {
    /// A method with no instructions and no inputs only returns constants: LLM metadata.
    pub fn is_constant(&self) -> bool {
        self.instructions.is_empty() && self.inputs.is_empty()
    }
}

/// Named data merged from the program and any `.ptd` files, keyed as delegates look it up.
#[derive(Default, Clone)]
pub struct NamedData {
    entries: BTreeMap<String, Blob>,
}

impl NamedData {
    pub fn get(&self, key: &str) -> Option<&Blob> {
        self.entries.get(key)
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Blob)> {
        self.entries.iter()
    }
    pub fn total_bytes(&self) -> usize {
        self.entries.values().map(|b| b.len()).sum()
    }
    fn insert(&mut self, key: &str, blob: Blob) -> Result<()> {
        if let Some(old) = self.entries.get(key) {
            if old[..] != blob[..] {
                return invalid(format!(
                    "named data key `{key}` appears twice with different bytes"
                ));
            }
            return Ok(());
        }
        self.entries.insert(key.to_string(), blob);
        Ok(())
    }
}

/// Limits that protect the loader against hostile sizes.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest total of memory-planned arenas a program may request.
    pub max_arena_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_arena_bytes: 16 << 30,
        }
    }
}

/// A loaded, validated ExecuTorch program.
pub struct Program {
    bytes: Arc<Bytes>,
    pub header: Option<ExtendedHeader>,
    pub version: u32,
    pub plans: Vec<ExecutionPlan>,
    /// Absolute byte ranges of the data segments.
    pub segments: Vec<Range<usize>>,
    pub named_data: NamedData,
    /// Bytes of the constant segment (the weights not held by delegates).
    pub constant_bytes: usize,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("bytes", &self.bytes.len())
            .field("plans", &self.plans.len())
            .finish()
    }
}

impl Program {
    /// Maps and validates a `.pte`, merging named data from each `.ptd`.
    pub fn open(path: &Path, ptds: &[&Path]) -> Result<Program> {
        let bytes = Bytes::map(path)?;
        let data = ptds
            .iter()
            .map(|p| DataFile::open(p))
            .collect::<Result<Vec<_>>>()?;
        Program::parse(bytes, &data, &Limits::default())
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<Program> {
        Program::parse(Arc::new(Bytes::Owned(bytes)), &[], &Limits::default())
    }

    pub fn file_len(&self) -> usize {
        self.bytes.len()
    }

    pub fn plan(&self, name: &str) -> Option<&ExecutionPlan> {
        self.plans.iter().find(|p| p.name == name)
    }

    pub fn parse(bytes: Arc<Bytes>, ptds: &[DataFile], limits: &Limits) -> Result<Program> {
        let buf: &[u8] = &bytes;
        if buf.len() < 8 {
            return invalid(format!(
                "file is {} bytes: too short to be a .pte",
                buf.len()
            ));
        }
        if &buf[4..8] != b"ET12" {
            return invalid(format!(
                "not an ExecuTorch program: file identifier is {:?}, expected \"ET12\"",
                String::from_utf8_lossy(&buf[4..8])
            ));
        }
        let header = ExtendedHeader::parse(buf)?;
        if let Some(h) = &header {
            h.check(buf.len())?;
        }
        let fb_end = header
            .as_ref()
            .map_or(buf.len(), |h| h.program_size as usize);
        let fbuf = &buf[..fb_end];
        let root = Table::root(fbuf).ctx(|| "program root".into())?;

        let version: u32 = root.scalar(0, 0).ctx(|| "Program.version".into())?;

        // Segments: absolute file ranges, each inside the declared segment region.
        let mut segments = Vec::new();
        if let Some(segs) = root.tables(4).ctx(|| "Program.segments".into())? {
            // Without an extended header there is no segment data; exporters still list empty
            // segments (e.g. an empty constant segment when weights live in a .ptd).
            let base = match &header {
                Some(h) => h.segment_base_offset as usize,
                None => {
                    for (i, s) in segs.iter().enumerate() {
                        let s = s.ctx(|| format!("segment {i}"))?;
                        if s.scalar::<u64>(1, 0).ctx(|| format!("segment {i} size"))? != 0 {
                            return invalid(
                                "program lists non-empty segments but has no extended header",
                            );
                        }
                    }
                    0
                }
            };
            for (i, s) in segs.iter().enumerate() {
                let s = s.ctx(|| format!("segment {i}"))?;
                let off: u64 = s.scalar(0, 0).ctx(|| format!("segment {i} offset"))?;
                let size: u64 = s.scalar(1, 0).ctx(|| format!("segment {i} size"))?;
                let start = (base as u64).checked_add(off);
                let end = start.and_then(|s| s.checked_add(size));
                match (start, end) {
                    (Some(st), Some(en)) if en <= buf.len() as u64 => {
                        segments.push(st as usize..en as usize)
                    }
                    _ => {
                        return invalid(format!(
                            "segment {i} (offset {off}, size {size}) extends past the end of the {}-byte file",
                            buf.len()
                        ))
                    }
                }
            }
        }
        let segment_blob = |idx: u32, what: &str| -> Result<Blob> {
            match segments.get(idx as usize) {
                Some(r) => Blob::new(bytes.clone(), r.clone()),
                None => invalid(format!(
                    "{what} refers to segment {idx}, but the program has {}",
                    segments.len()
                )),
            }
        };

        // Constant segment: offsets[i] is where constant i starts; index 0 is reserved.
        let mut constant_bytes = 0usize;
        let constants: Option<(Blob, Vec<u64>)> =
            match root.table(5).ctx(|| "Program.constant_segment".into())? {
                Some(cs) => {
                    let idx: u32 = cs.scalar(0, 0).ctx(|| "constant_segment".into())?;
                    let offsets: Vec<u64> =
                        cs.vec_of(1).ctx(|| "constant_segment.offsets".into())?;
                    if offsets.is_empty() {
                        None
                    } else {
                        let blob = segment_blob(idx, "the constant segment")?;
                        constant_bytes = blob.len();
                        Some((blob, offsets))
                    }
                }
                None => None,
            };
        // Deprecated inline constant buffers (pre-2024 files).
        let mut inline_constants = Vec::new();
        if let Some(cb) = root.tables(2).ctx(|| "Program.constant_buffer".into())? {
            for (i, b) in cb.iter().enumerate() {
                let b = b.ctx(|| format!("constant_buffer {i}"))?;
                let r = b.bytes_pos(0).ctx(|| format!("constant_buffer {i}"))?;
                let (start, len) = r.unwrap_or((0, 0));
                inline_constants.push(Blob::new(bytes.clone(), start..start + len)?);
            }
        }
        let mut mutable_segments = Vec::new();
        if let Some(ms) = root
            .tables(6)
            .ctx(|| "Program.mutable_data_segments".into())?
        {
            for (i, m) in ms.iter().enumerate() {
                let m = m.ctx(|| format!("mutable_data_segments {i}"))?;
                let idx: u32 = m.scalar(0, 0).ctx(|| "mutable_data_segments".into())?;
                let offsets: Vec<u64> = m.vec_of(1).ctx(|| "mutable_data_segments".into())?;
                mutable_segments.push((segment_blob(idx, "a mutable data segment")?, offsets));
            }
        }

        let mut named_data = NamedData::default();
        if let Some(nd) = root.tables(7).ctx(|| "Program.named_data".into())? {
            for (i, n) in nd.iter().enumerate() {
                let n = n.ctx(|| format!("named_data {i}"))?;
                let key = n
                    .string(0)
                    .ctx(|| format!("named_data {i} key"))?
                    .unwrap_or("");
                let idx: u32 = n.scalar(1, 0).ctx(|| format!("named_data {i}"))?;
                named_data.insert(key, segment_blob(idx, &format!("named data `{key}`"))?)?;
            }
        }
        for p in ptds {
            for (k, b) in p.named.iter() {
                named_data.insert(k, b.clone())?;
            }
        }

        let mut inline_delegates = Vec::new();
        if let Some(dd) = root
            .tables(3)
            .ctx(|| "Program.backend_delegate_data".into())?
        {
            for (i, d) in dd.iter().enumerate() {
                let d = d.ctx(|| format!("backend_delegate_data {i}"))?;
                let (start, len) = d
                    .bytes_pos(0)
                    .ctx(|| format!("backend_delegate_data {i}"))?
                    .unwrap_or((0, 0));
                inline_delegates.push(Blob::new(bytes.clone(), start..start + len)?);
            }
        }

        let ctx = PlanContext {
            bytes: &bytes,
            segment_blob: &segment_blob,
            constants: constants.as_ref(),
            inline_constants: &inline_constants,
            mutable_segments: &mutable_segments,
            named_data: &named_data,
            inline_delegates: &inline_delegates,
            segments_len: segments.len(),
            limits,
        };
        let mut plans = Vec::new();
        let ep = root
            .tables(1)
            .ctx(|| "Program.execution_plan".into())?
            .ok_or_else(|| PteError::Invalid("program has no execution plans".into()))?;
        for (i, p) in ep.iter().enumerate() {
            let p = p.ctx(|| format!("execution plan {i}"))?;
            plans.push(ctx.plan(i, p)?);
        }
        Ok(Program {
            bytes,
            header,
            version,
            plans,
            segments,
            named_data,
            constant_bytes,
        })
    }
}

struct PlanContext<'a> {
    bytes: &'a Arc<Bytes>,
    segment_blob: &'a dyn Fn(u32, &str) -> Result<Blob>,
    constants: Option<&'a (Blob, Vec<u64>)>,
    inline_constants: &'a [Blob],
    mutable_segments: &'a [(Blob, Vec<u64>)],
    named_data: &'a NamedData,
    inline_delegates: &'a [Blob],
    segments_len: usize,
    limits: &'a Limits,
}

fn index(v: i64, len: usize, what: impl FnOnce() -> String) -> Result<usize> {
    if v < 0 || v as u64 >= len as u64 {
        return invalid(format!("{} is {v}, outside 0..{len}", what()));
    }
    Ok(v as usize)
}

impl PlanContext<'_> {
    fn plan(&self, plan_idx: usize, p: Table) -> Result<ExecutionPlan> {
        let name = p
            .string(0)
            .ctx(|| format!("execution plan {plan_idx} name"))?
            .unwrap_or("")
            .to_string();
        let c = |what: &str| format!("method `{name}` {what}");

        let arena_raw: Vec<i64> = p.vec_of(8).ctx(|| c("non_const_buffer_sizes"))?;
        let mut arena_sizes = Vec::new();
        let mut total = 0usize;
        for (i, &s) in arena_raw.iter().enumerate().skip(1) {
            if s < 0 || s as u64 > self.limits.max_arena_bytes as u64 {
                return invalid(format!(
                    "method `{name}`: memory arena {i} asks for {s} bytes (limit {})",
                    self.limits.max_arena_bytes
                ));
            }
            total = total.saturating_add(s as usize);
            arena_sizes.push(s as usize);
        }
        if total > self.limits.max_arena_bytes {
            return invalid(format!(
                "method `{name}`: memory arenas total {total} bytes (limit {})",
                self.limits.max_arena_bytes
            ));
        }

        let vt = p.tables(2).ctx(|| c("values"))?;
        let nvalues = vt.map_or(0, |v| v.len());
        let mut values = Vec::with_capacity(nvalues);
        if let Some(vt) = vt {
            for i in 0..nvalues {
                let v = vt.get(i).ctx(|| c(&format!("value {i}")))?;
                values.push(
                    self.evalue(v, nvalues, &arena_sizes)
                        .map_err(|e| prefix(e, &c(&format!("value {i}"))))?,
                );
            }
        }
        // IntList items must name Int values (dynamic dims are Ints overwritten at run time).
        for (i, v) in values.iter().enumerate() {
            if let EValue::IntList(items) = v {
                for &it in items {
                    if !matches!(values[it], EValue::Int(_)) {
                        return invalid(c(&format!(
                            "value {i}: IntList item {it} is a {}, not an Int",
                            values[it].kind()
                        )));
                    }
                }
            }
        }

        let idx_list = |slot: usize, what: &str| -> Result<Vec<usize>> {
            let raw: Vec<i32> = p.vec_of(slot).ctx(|| c(what))?;
            raw.iter()
                .map(|&v| index(v as i64, nvalues, || c(what)))
                .collect()
        };
        let inputs = idx_list(3, "inputs")?;
        let outputs = idx_list(4, "outputs")?;

        let mut operators = Vec::new();
        if let Some(ops) = p.tables(6).ctx(|| c("operators"))? {
            for (i, o) in ops.iter().enumerate() {
                let o = o.ctx(|| c(&format!("operator {i}")))?;
                operators.push(Operator {
                    name: o
                        .string(0)
                        .ctx(|| c("operator name"))?
                        .unwrap_or("")
                        .to_string(),
                    overload: o
                        .string(1)
                        .ctx(|| c("operator overload"))?
                        .unwrap_or("")
                        .to_string(),
                });
            }
        }

        let mut delegates = Vec::new();
        if let Some(ds) = p.tables(7).ctx(|| c("delegates"))? {
            for (i, d) in ds.iter().enumerate() {
                let d = d.ctx(|| c(&format!("delegate {i}")))?;
                delegates.push(
                    self.delegate(d)
                        .map_err(|e| prefix(e, &c(&format!("delegate {i}"))))?,
                );
            }
        }

        let mut instructions = Vec::new();
        if let Some(chains) = p.tables(5).ctx(|| c("chains"))? {
            if chains.len() > 1 {
                return invalid(c(&format!(
                    "has {} chains; only single-chain programs exist today",
                    chains.len()
                )));
            }
            if let Some(chain) = chains.iter().next() {
                let chain = chain.ctx(|| c("chain 0"))?;
                if let Some(ins) = chain.tables(2).ctx(|| c("instructions"))? {
                    let n = ins.len();
                    for j in 0..n {
                        let t = ins.get(j).ctx(|| c(&format!("instruction {j}")))?;
                        let wh = || c(&format!("instruction {j}"));
                        instructions.push(
                            instruction(t, nvalues, operators.len(), delegates.len(), n)
                                .map_err(|e| prefix(e, &wh()))?,
                        );
                    }
                }
            }
        }

        Ok(ExecutionPlan {
            name,
            values,
            inputs,
            outputs,
            instructions,
            operators,
            delegates,
            arena_sizes,
        })
    }

    fn delegate(&self, d: Table) -> Result<BackendDelegate> {
        let id = d.string(0).ctx(|| "id".into())?.unwrap_or("").to_string();
        let r = d
            .table(1)
            .ctx(|| "processed".into())?
            .ok_or_else(|| PteError::Invalid(format!("backend `{id}` has no data reference")))?;
        let loc: i8 = r.scalar(0, 0).ctx(|| "data location".into())?;
        let idx: u32 = r.scalar(1, 0).ctx(|| "data index".into())?;
        let data = match loc {
            0 => match self.inline_delegates.get(idx as usize) {
                Some(b) => b.clone(),
                None => {
                    return invalid(format!(
                        "backend `{id}` data is inline entry {idx}, but there are {}",
                        self.inline_delegates.len()
                    ))
                }
            },
            1 => {
                if idx as usize >= self.segments_len {
                    return invalid(format!(
                        "backend `{id}` data is segment {idx}, but there are {}",
                        self.segments_len
                    ));
                }
                (self.segment_blob)(idx, "a delegate")?
            }
            other => return invalid(format!("backend `{id}` has unknown data location {other}")),
        };
        let mut compile_specs = Vec::new();
        if let Some(cs) = d.tables(2).ctx(|| "compile_specs".into())? {
            for s in cs.iter() {
                let s = s.ctx(|| "compile spec".into())?;
                let k = s.string(0).ctx(|| "compile spec key".into())?.unwrap_or("");
                let v = s
                    .bytes(1)
                    .ctx(|| "compile spec value".into())?
                    .unwrap_or(&[]);
                compile_specs.push((k.to_string(), v.to_vec()));
            }
        }
        Ok(BackendDelegate {
            id,
            data,
            compile_specs,
        })
    }

    fn evalue(&self, v: Table, nvalues: usize, arenas: &[usize]) -> Result<EValue> {
        let Some((tag, t)) = v.union(0).ctx(|| "EValue".into())? else {
            return Ok(EValue::Null);
        };
        let list_idx = |what: &str| -> Result<Vec<usize>> {
            let raw: Vec<i32> = t.vec_of(0).ctx(|| what.to_string())?;
            raw.iter()
                .map(|&i| index(i as i64, nvalues, || format!("{what} item")))
                .collect()
        };
        Ok(match tag {
            1 => EValue::Null,
            2 => EValue::Int(t.scalar(0, 0i64).ctx(|| "Int".into())?),
            3 => EValue::Bool(t.scalar(0, false).ctx(|| "Bool".into())?),
            4 => EValue::Double(t.scalar(0, 0f64).ctx(|| "Double".into())?),
            5 => EValue::Tensor(self.tensor(t, arenas)?),
            6 => EValue::String(
                t.string(0)
                    .ctx(|| "String".into())?
                    .unwrap_or("")
                    .to_string(),
            ),
            7 => {
                let raw: Vec<i64> = t.vec_of(0).ctx(|| "IntList".into())?;
                EValue::IntList(
                    raw.iter()
                        .map(|&i| index(i, nvalues, || "IntList item".into()))
                        .collect::<Result<_>>()?,
                )
            }
            8 => EValue::DoubleList(t.vec_of(0).ctx(|| "DoubleList".into())?),
            9 => EValue::BoolList(t.vec_of(0).ctx(|| "BoolList".into())?),
            10 => EValue::TensorList(list_idx("TensorList")?),
            11 => {
                let raw: Vec<i32> = t.vec_of(0).ctx(|| "OptionalTensorList".into())?;
                EValue::OptionalTensorList(
                    raw.iter()
                        .map(|&i| {
                            if i == -1 {
                                Ok(None)
                            } else {
                                index(i as i64, nvalues, || "OptionalTensorList item".into())
                                    .map(Some)
                            }
                        })
                        .collect::<Result<_>>()?,
                )
            }
            other => return invalid(format!("unknown EValue type tag {other}")),
        })
    }

    fn tensor(&self, t: Table, arenas: &[usize]) -> Result<TensorInfo> {
        let code: i8 = t.scalar(0, 0).ctx(|| "Tensor.scalar_type".into())?;
        let dtype = ScalarType::from_code(code)
            .ok_or_else(|| PteError::Invalid(format!("tensor has unknown scalar type {code}")))?;
        let storage_offset: i32 = t.scalar(1, 0).ctx(|| "Tensor.storage_offset".into())?;
        if storage_offset != 0 {
            return invalid(format!(
                "tensor has storage_offset {storage_offset}; only 0 is valid"
            ));
        }
        let raw: Vec<i32> = t.vec_of(2).ctx(|| "Tensor.sizes".into())?;
        let mut sizes = Vec::with_capacity(raw.len());
        for &s in &raw {
            if s < 0 {
                return invalid(format!("tensor has a negative size {s} in {raw:?}"));
            }
            sizes.push(s as usize);
        }
        let dim_order: Vec<u8> = t.vec_of(3).ctx(|| "Tensor.dim_order".into())?;
        if !dim_order.is_empty() {
            let mut seen = vec![false; sizes.len()];
            let ok = dim_order.len() == sizes.len()
                && dim_order.iter().all(|&d| {
                    (d as usize) < seen.len() && !std::mem::replace(&mut seen[d as usize], true)
                });
            if !ok {
                return invalid(format!(
                    "tensor dim_order {dim_order:?} is not a permutation of its {} dims",
                    sizes.len()
                ));
            }
        }
        let numel = sizes
            .iter()
            .try_fold(1usize, |a, &s| a.checked_mul(s))
            .ok_or_else(|| PteError::Invalid(format!("tensor sizes {raw:?} overflow")))?;
        let nbytes = numel
            .checked_mul(dtype.size())
            .ok_or_else(|| PteError::Invalid(format!("tensor sizes {raw:?} overflow")))?;
        let buffer_idx: u32 = t.scalar(5, 0).ctx(|| "Tensor.data_buffer_idx".into())?;
        let alloc = t.table(6).ctx(|| "Tensor.allocation_info".into())?;
        let dynamism = match t
            .scalar::<i8>(8, 0)
            .ctx(|| "Tensor.shape_dynamism".into())?
        {
            0 => Dynamism::Static,
            1 => Dynamism::DynamicBound,
            2 => Dynamism::DynamicUnbound,
            d => return invalid(format!("tensor has unknown shape dynamism {d}")),
        };
        let extra = t.table(9).ctx(|| "Tensor.extra_tensor_info".into())?;
        let (fqn, external, mut_idx) = match extra {
            Some(e) => (
                e.string(1)
                    .ctx(|| "fully_qualified_name".into())?
                    .map(str::to_string),
                e.scalar::<i8>(2, 0).ctx(|| "location".into())? == 1,
                e.scalar::<u64>(0, 0)
                    .ctx(|| "mutable_data_segments_idx".into())?,
            ),
            None => (None, false, 0),
        };
        let sized = |b: &Blob, what: &str| -> Result<Blob> {
            if b.len() < nbytes {
                return invalid(format!(
                    "tensor {dtype}{raw:?} needs {nbytes} bytes but {what} has {}",
                    b.len()
                ));
            }
            b.slice(0..nbytes)
        };
        let data = if external {
            let key = fqn.clone().unwrap_or_default();
            let blob = self.named_data.get(&key).ok_or_else(|| {
                PteError::Invalid(format!(
                    "tensor's data is external under key `{key}`, which no loaded .ptd provides"
                ))
            })?;
            let blob = sized(blob, &format!("external data `{key}`"))?;
            match alloc {
                None => TensorData::Constant(blob),
                Some(a) => {
                    let (arena, offset) = self.placement(a, nbytes, arenas)?;
                    TensorData::Planned {
                        arena,
                        offset,
                        initial: Some(blob),
                    }
                }
            }
        } else {
            match (buffer_idx, alloc) {
                (0, None) => TensorData::Runtime,
                (0, Some(a)) => {
                    let (arena, offset) = self.placement(a, nbytes, arenas)?;
                    TensorData::Planned {
                        arena,
                        offset,
                        initial: None,
                    }
                }
                (i, None) => TensorData::Constant(self.constant(i, nbytes, &sized)?),
                (i, Some(a)) => {
                    let (arena, offset) = self.placement(a, nbytes, arenas)?;
                    let (seg, offs) = self.mutable_segments.get(mut_idx as usize).ok_or_else(|| {
                        PteError::Invalid(format!(
                            "tensor's initial value is in mutable segment {mut_idx}, which does not exist"
                        ))
                    })?;
                    let start = *offs.get(i as usize).ok_or_else(|| {
                        PteError::Invalid(format!(
                            "tensor's initial value index {i} is out of range"
                        ))
                    })? as usize;
                    let blob = seg.slice(start.min(seg.len())..seg.len())?;
                    TensorData::Planned {
                        arena,
                        offset,
                        initial: Some(sized(&blob, "its mutable segment")?),
                    }
                }
            }
        };
        Ok(TensorInfo {
            dtype,
            sizes,
            dim_order,
            dynamism,
            data,
            fqn,
        })
    }

    fn constant(
        &self,
        i: u32,
        nbytes: usize,
        sized: &dyn Fn(&Blob, &str) -> Result<Blob>,
    ) -> Result<Blob> {
        if let Some((seg, offs)) = self.constants {
            let start = *offs.get(i as usize).ok_or_else(|| {
                PteError::Invalid(format!(
                    "constant tensor {i} is out of the constant segment's {} entries",
                    offs.len()
                ))
            })?;
            if start > seg.len() as u64 {
                return invalid(format!("constant tensor {i} starts past its segment"));
            }
            let blob = seg.slice(start as usize..seg.len())?;
            return sized(&blob, &format!("constant {i}"));
        }
        match self.inline_constants.get(i as usize) {
            Some(b) => sized(b, &format!("constant buffer {i}")),
            None if nbytes == 0 => Blob::new(self.bytes.clone(), 0..0),
            None => invalid(format!("constant tensor {i} has no data in the program")),
        }
    }

    fn placement(&self, a: Table, nbytes: usize, arenas: &[usize]) -> Result<(usize, usize)> {
        let id: u32 = a.scalar(0, 0).ctx(|| "allocation memory_id".into())?;
        let lo: u32 = a.scalar(1, 0).ctx(|| "allocation offset".into())?;
        let hi: u32 = a.scalar(2, 0).ctx(|| "allocation offset".into())?;
        let offset = (lo as u64) | ((hi as u64) << 32);
        if id == 0 || id as usize > arenas.len() {
            return invalid(format!(
                "tensor is planned in memory {id}, but the method has memories 1..={}",
                arenas.len()
            ));
        }
        let size = arenas[id as usize - 1];
        if offset
            .checked_add(nbytes as u64)
            .is_none_or(|e| e > size as u64)
        {
            return invalid(format!(
                "tensor of {nbytes} bytes at offset {offset} overflows memory {id} of {size} bytes"
            ));
        }
        Ok((id as usize - 1, offset as usize))
    }
}

fn prefix(e: PteError, what: &str) -> PteError {
    match e {
        PteError::Invalid(m) => PteError::Invalid(format!("{what}: {m}")),
        PteError::Flatbuffer { context, source } => PteError::Flatbuffer {
            context: format!("{what}: {context}"),
            source,
        },
        other => other,
    }
}

fn instruction(
    t: Table,
    nvalues: usize,
    nops: usize,
    ndelegates: usize,
    ninstr: usize,
) -> Result<Instruction> {
    let Some((tag, a)) = t.union(0).ctx(|| "instruction".into())? else {
        return invalid("instruction has no arguments");
    };
    let args = |slot: usize| -> Result<Vec<usize>> {
        let raw: Vec<i32> = a.vec_of(slot).ctx(|| "instruction args".into())?;
        raw.iter()
            .map(|&v| index(v as i64, nvalues, || "argument".into()))
            .collect()
    };
    let int = |slot: usize| -> Result<i64> {
        Ok(a.scalar::<i32>(slot, 0).ctx(|| "instruction".into())? as i64)
    };
    Ok(match tag {
        1 => Instruction::Kernel {
            op: index(int(0)?, nops, || "operator index".into())?,
            args: args(1)?,
        },
        2 => Instruction::Delegate {
            delegate: index(int(0)?, ndelegates, || "delegate index".into())?,
            args: args(1)?,
        },
        3 => Instruction::Move {
            from: index(int(0)?, nvalues, || "move source".into())?,
            to: index(int(1)?, nvalues, || "move target".into())?,
        },
        4 => Instruction::JumpFalse {
            cond: index(int(0)?, nvalues, || "jump condition".into())?,
            dest: index(int(1)?, ninstr + 1, || "jump destination".into())?,
        },
        5 => Instruction::Free {
            value: index(int(0)?, nvalues, || "freed value".into())?,
        },
        other => return invalid(format!("unknown instruction type tag {other}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neg8_blobs_are_made_on_first_read() {
        let s = [0.5f32, -1.25e-3, 3.0e30, 0.0, f32::MIN_POSITIVE];
        let mut bytes: Vec<u8> = s.iter().flat_map(|x| x.to_le_bytes()).collect();
        bytes.push(7); // Not a whole f32: left out.
        let scales = Blob::whole(Arc::new(Bytes::Owned(bytes)));
        let b = Blob::neg8(scales.clone());
        assert_eq!(
            (b.len(), b.is_made()),
            (20, false),
            "its length is known unmade"
        );
        assert!(b.neg8_of().unwrap().same_as(&scales));
        assert!(
            b.slice(4..8).unwrap().neg8_of().is_none(),
            "a part is not all of it"
        );
        let want: Vec<u8> = s.iter().flat_map(|x| (-8.0 * x).to_le_bytes()).collect();
        assert_eq!(&b[..], &want[..]);
        assert!(b.is_made());
        assert_eq!(&b.slice(4..8).unwrap()[..], &want[4..8]);
    }

    /// Resident bytes of the mapping that holds `addr` (`/proc/self/smaps`).
    #[cfg(target_os = "linux")]
    fn resident(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if inside && line.starts_with("Rss:") {
                let kb: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
                return kb * 1024;
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn released_pages_leave_the_resident_set_and_read_back_the_same() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..4usize << 20)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        std::fs::write(file.path(), &data).unwrap();
        let bytes = Bytes::map(file.path()).unwrap();
        let addr = bytes.as_ptr() as usize;
        assert_eq!(&bytes[..], &data[..]);
        assert_eq!(resident(addr), data.len(), "every page read in");
        // A blob that starts and ends mid-page gives up only the whole pages inside it.
        let blob = Blob::new(bytes.clone(), 1000..(3 << 20) + 1000).unwrap();
        blob.release_pages();
        // At most what it kept: a kernel mapping the file in huge pages may unmap more.
        let left = resident(addr);
        let kept = data.len() - ((3 << 20) - (64 << 10));
        assert!(left <= kept, "{left} bytes resident, more than {kept}");
        assert_eq!(
            &blob[..],
            &data[1000..(3 << 20) + 1000],
            "read back from the file"
        );
        // A blob inside one page gives up nothing.
        let before = resident(addr);
        Blob::new(bytes.clone(), (3 << 20) + 5..(3 << 20) + 60_000)
            .unwrap()
            .release_pages();
        assert_eq!(resident(addr), before);
    }
}
