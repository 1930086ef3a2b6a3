//! Runs a graph on the GPU. At load: plan memory, upload constants once, zero the states. Per
//! call: plan shapes (`ir::PlanCache`); the first call with a shape signature records every
//! dispatch (pipeline, bind group, grid), later calls replay the recording. Host symbols reach
//! kernels through one small syms buffer written each call, so decode steps at different positions
//! replay the same recording. A call writes its inputs, submits its dispatches and the copies of
//! its outputs into a mappable buffer, encodes the next call's commands while the GPU runs (a
//! decode step replays the same recording, so it then submits once), then waits once. Commands
//! not encoded ahead go in a few submits of growing size, the first starting the GPU while the
//! host encodes the rest.
//!
//! wgpu has no reusable compute command buffers, so a replay still encodes one
//! `set_pipeline`/`set_bind_group`/`dispatch` triple per kernel from the recording, without any
//! lookups, allocation or validation of our own.

use super::context::{Context, Slot};
use super::memory::{elem_bytes, padded, BufferKind, MemoryPlan, MemoryReport, Repr};
use super::ops::{self, Env, Res, Step, XNN_WORKGROUP_FLOOR};
use super::wait::{await_map, WaitClock};
use super::GpuError;
use crate::ir::{Graph, InputValue, Int, Io, IrError, Node, OpKind, Plan, PlanCache, Role};
use crate::runtime::candidates::{self, Candidates, DevicePick};
use crate::runtime::tensor::{from_f32, from_i64, to_f32, to_i64};
use crate::runtime::{DType, HostTensor};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// Recordings kept per executor (least recently used goes first): a decode signature, a few
/// prefill lengths.
const MAX_RECORDINGS: usize = 32;
/// Dispatches in a call's first submit when its commands were not encoded ahead; each later one
/// takes 4 times as many (so a call of 3000 dispatches is 4 submits, one of 400 is 3).
const FIRST_PIECE: usize = 64;
/// Uniform parameter slots: 256 bytes is the largest offset alignment WebGPU allows.
const PARAM_SLOT: u64 = 256;
const PARAM_BUFFER: u64 = 64 * 1024;
/// Parameter memory past which all recordings are dropped and rebuilt on demand.
const PARAM_BUDGET: u64 = 64 << 20;
/// Constants are uploaded in pieces of this size, with a flush every few, to bound staging memory.
const UPLOAD_PIECE: usize = 64 << 20;

struct Dispatch {
    /// The graph node it belongs to (for per-op timings).
    node: usize,
    /// `kernel:entry`, for PTERIA_REPLAY_SKIP.
    what: String,
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    groups: [u32; 3],
}

/// A recording's dispatches and output copies encoded ahead of the call that submits them.
struct Ready {
    rec: usize,
    /// The readback buffer its copies fill.
    slot: usize,
    commands: wgpu::CommandBuffer,
}

/// A call submitted and not yet finished (`start_candidates`).
struct Started {
    rec: usize,
    slot: usize,
    submitted: std::time::Instant,
}

/// Calls one executor may have submitted and not finished: a decode step and the next, fed
/// the first one's pick. Each has a readback buffer of its own.
const MAX_IN_FLIGHT: usize = 2;

struct Recording {
    dispatches: Vec<Dispatch>,
    /// Its longest chain of dependent dispatches (`longest_chain`).
    chain: usize,
    /// (source buffer, bytes, offset in `readback`).
    copies: Vec<(usize, u64, u64)>,
    /// Per graph output: offset in `readback` and shape.
    outputs: Vec<(u64, Vec<usize>)>,
    /// The output whose last row it reduces to candidates (`run_candidates`), and where they
    /// lie in `readback`: that output is not read back.
    cands: Option<(CandidateRequest, u64)>,
    /// Where the outputs are copied: one buffer, and a second once two calls are in flight.
    readbacks: Vec<wgpu::Buffer>,
    readback_size: u64,
    /// The buffer of the input that `CandidateRequest::feed` names: the call's pick is copied
    /// into it, for a next call that is fed it.
    feed: Option<usize>,
    last_used: u64,
    /// How long its last call took from submit to outputs (when to wake for the next).
    wait: WaitClock,
}

/// Counters for tests and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecutorStats {
    /// Recordings made (a new shape signature, or one evicted earlier).
    pub recordings: usize,
    /// Calls served by an existing recording.
    pub replays: usize,
    /// Dispatches in the last call.
    pub last_dispatches: usize,
    /// The longest chain among them of dispatches each of which must wait for the one before
    /// through the data it reads or writes: the fewest barriers the call could run with, were
    /// every dispatch free of the barriers wgpu places before each one.
    pub last_chain: usize,
    /// Queue submits made by calls (one per call encoded ahead, else a few: see `FIRST_PIECE`).
    pub submits: usize,
    /// Bytes of input tensors the last call wrote to the GPU (host symbols not counted): States
    /// never travel, so a decode step uploads its token and position, and the rows of any
    /// table gathered on the host (`host_gather`).
    pub last_upload_bytes: u64,
    /// Bytes the last call read back (the outputs).
    pub last_readback_bytes: u64,
    /// Calls whose wait for outputs slept through most of the last call's time before polling
    /// (`ContextOptions::block_on_outputs` off), rather than blocking from the start.
    pub slept_waits: usize,
    /// Host time spent by calls so far, by phase (a token's host cost beside its GPU time).
    pub host: HostTimes,
}

/// Nanoseconds that calls spent on the host, summed over calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostTimes {
    /// Shape inference and finding (or making) the call's recording.
    pub prepare_ns: u64,
    /// Writing the inputs and encoding and submitting the dispatches.
    pub encode_ns: u64,
    /// Encoding the next call's commands ahead, while the GPU runs this call's.
    pub ahead_ns: u64,
    /// Waiting for the GPU after that, until the outputs are mapped.
    pub wait_ns: u64,
    /// Copying the outputs out and converting them to host tensors.
    pub outputs_ns: u64,
}

impl HostTimes {
    /// The phases' difference from an earlier reading.
    pub fn since(&self, earlier: &HostTimes) -> HostTimes {
        HostTimes {
            prepare_ns: self.prepare_ns.saturating_sub(earlier.prepare_ns),
            encode_ns: self.encode_ns.saturating_sub(earlier.encode_ns),
            ahead_ns: self.ahead_ns.saturating_sub(earlier.ahead_ns),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
            outputs_ns: self.outputs_ns.saturating_sub(earlier.outputs_ns),
        }
    }

    pub fn add(&mut self, other: &HostTimes) {
        self.prepare_ns += other.prepare_ns;
        self.encode_ns += other.encode_ns;
        self.ahead_ns += other.ahead_ns;
        self.wait_ns += other.wait_ns;
        self.outputs_ns += other.outputs_ns;
    }
}

/// How long the GPU took over a call's dispatches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayTiming {
    /// Seconds per replay of the call's dispatches (inputs, outputs and host work excluded).
    pub seconds: f64,
    /// Measured with GPU timestamps (otherwise wall-clock around submit and wait).
    pub timestamps: bool,
    /// Dispatches per replay.
    pub dispatches: usize,
}

/// GPU time of one graph node's dispatches in one call.
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    pub node: usize,
    /// The op's `OpKind::label()`.
    pub op: String,
    pub seconds: f64,
    /// Its dispatches in recording order: `kernel:entry`, workgroups, seconds.
    pub dispatches: Vec<(String, [u32; 3], f64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BindKey {
    slots: Vec<Slot>,
    params: (usize, u64),
    /// (buffer, byte offset) per binding after the parameters.
    buffers: Vec<(usize, u64)>,
}

/// Runs one IR graph on the GPU; State tensors (KV caches) live on the device across calls.
pub struct GpuExecutor {
    ctx: Arc<Context>,
    graph: Graph,
    /// Big embeddings gathered on the host before each call (`host_gather`).
    host: Option<super::host_gather::HostGathers>,
    mem: MemoryPlan,
    /// The plan's buffers, then the dummy, the syms buffer, the ranges buffer and the
    /// candidates buffer.
    buffers: Vec<wgpu::Buffer>,
    dummy: usize,
    syms: usize,
    /// Producers' ranges for the linears that quantize their stores (`ops::ranged`), zeroed at
    /// the start of every call (`encode`): zero is in every range, so it is the atomics'
    /// starting point. Timed replays do not zero it: their ranges only widen.
    ranges: usize,
    /// Sampling candidates of a call's row of logits (kernels/candidates.wgsl's `c`).
    cands: usize,
    literals: Vec<i64>,
    literal_slot: HashMap<i64, u32>,
    /// Per tensor root, whose storage it reads in the call being recorded (`ops::views`).
    view_of: Vec<crate::ir::TensorId>,
    /// Per root: the byte offset of its values in `view_of`'s storage (a select view's).
    view_off: Vec<u64>,
    params: Vec<wgpu::Buffer>,
    param_slots: HashMap<Vec<u32>, (usize, u64)>,
    param_used: u64,
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    /// Recordings by the shapes they were made for.
    recordings: Vec<(Vec<Vec<usize>>, Recording)>,
    /// The recording the last call ran (index into `recordings`).
    last_rec: Option<usize>,
    /// The recording made for the call predicted after the last one (`encode_next`), whose
    /// plan `plans` then holds: a call whose plan matches runs it.
    predicted: Option<usize>,
    /// Inputs that a `ReadInput` symbol reads (positions), by input index.
    position_inputs: Vec<usize>,
    /// The context's number for the last call (`Context::count_call`).
    last_call: u64,
    plans: PlanCache,
    /// The next call's commands, encoded ahead (see `run`), unless PTERIA_ENCODE_AHEAD=0.
    ready: Option<Ready>,
    /// Calls submitted and not yet finished, oldest first.
    in_flight: std::collections::VecDeque<Started>,
    /// Outputs of calls in flight that a call of new shapes finished before it was recorded
    /// (recording may move recordings), oldest first, for `finish_call` to hand back in turn.
    finished: std::collections::VecDeque<(Vec<HostTensor>, Option<Candidates>)>,
    /// The last call started copied its pick into this input, and no call on the context has
    /// run since: a call may be fed it.
    fed_input: Option<usize>,
    encode_ahead: bool,
    clock: u64,
    stats: ExecutorStats,
}

fn ints_of(kind: &OpKind) -> Vec<Int> {
    match kind {
        OpKind::Rope { start, .. }
        | OpKind::Sdpa { start, .. }
        | OpKind::CacheUpdate { start, .. } => vec![*start],
        OpKind::Slice { start, .. } => vec![*start],
        OpKind::Select { index, .. } => vec![*index],
        OpKind::Arange { start, .. } => vec![*start],
        _ => Vec::new(),
    }
}

/// A tensor's elements in its GPU representation, as bytes padded to whole words: borrowed
/// where they are that already (packed weights, f32 of whole words), so uploads copy them once.
fn to_repr(repr: Repr, dtype: DType, data: &[u8]) -> Cow<'_, [u8]> {
    let as_is = repr == Repr::Raw || repr == Repr::F32 && dtype == DType::F32;
    if as_is && data.len() % 4 == 0 {
        return Cow::Borrowed(data);
    }
    let mut v = match repr {
        Repr::F32 if dtype == DType::F32 => data.to_vec(),
        Repr::F32 => bytemuck::cast_slice(&to_f32(dtype, data)).to_vec(),
        Repr::I32 => to_i64(dtype, data)
            .into_iter()
            .flat_map(|x| (x.clamp(i32::MIN as i64, i32::MAX as i64) as i32).to_le_bytes())
            .collect(),
        Repr::Raw => data.to_vec(),
        // Little-endian f16 in element order is the packed words' layout.
        Repr::F16 => from_f32(DType::F16, &to_f32(dtype, data)),
    };
    v.resize(v.len().div_ceil(4) * 4, 0);
    Cow::Owned(v)
}

fn from_repr(repr: Repr, dtype: DType, bytes: &[u8], numel: usize) -> Vec<u8> {
    match repr {
        Repr::F32 if dtype == DType::F32 => bytes[..numel * 4].to_vec(),
        Repr::F32 => {
            let f: Vec<f32> = bytes[..numel * 4]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            from_f32(dtype, &f)
        }
        Repr::I32 => {
            let i: Vec<i64> = bytes[..numel * 4]
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect();
            from_i64(dtype, &i)
        }
        Repr::Raw => bytes[..numel * dtype.size()].to_vec(),
        Repr::F16 => from_f32(dtype, &to_f32(DType::F16, &bytes[..numel * 2])),
    }
}

impl GpuExecutor {
    /// Plans memory and uploads constants. Every op the GPU cannot run is listed in one
    /// `GpuError::Unsupported`.
    pub fn new(ctx: Arc<Context>, mut graph: Graph) -> Result<Self, GpuError> {
        graph.validate()?;
        super::ksums::attach(&mut graph);
        // XNNPACK's linears ask (once a context, not while a call records).
        let xnn = graph.ops().any(|o| {
            matches!(
                o.kind,
                OpKind::Linear {
                    act_quant: crate::ir::ActQuant::Xnnpack,
                    ..
                }
            )
        });
        if xnn {
            ctx.fused_fma();
        }
        let host = super::host_gather::split(&mut graph, ctx.host_gather_min_bytes())
            .map_err(GpuError::Device)?;
        let (mem, mut problems) = MemoryPlan::new(
            &graph,
            ctx.max_storage_binding(),
            ctx.f16_kv_cache(),
            ctx.fusions(),
        );
        for (n, node) in graph.nodes.iter().enumerate() {
            let Node::Op(op) = node else { continue };
            let mut why = ops::check(&graph, &mem, op);
            if why.is_none() && !matches!(op.kind, OpKind::CacheUpdate { .. }) {
                // A kernel cannot read and write one buffer (wgpu forbids the aliasing).
                let roots: Vec<usize> = op.inputs.iter().map(|&t| mem.root[t]).collect();
                if op.outputs.iter().any(|&o| roots.contains(&mem.root[o]))
                    && ops::alias(&graph, op).is_none()
                {
                    why = Some("writes a tensor it reads".into());
                }
            }
            if let Some(why) = why {
                problems.push(format!("node {n} ({}): {why}", op.kind.label()));
            }
        }
        for (k, io) in graph.inputs.iter().enumerate() {
            if let Io::Tensor(t) = io {
                if mem.repr[*t] == Repr::Raw {
                    problems.push(format!("input {k}: packed weights must be constants"));
                }
            }
        }
        if !problems.is_empty() {
            return Err(GpuError::Unsupported(problems));
        }

        let n_syms = graph.sym_names.len();
        let mut literals = Vec::new();
        let mut literal_slot = HashMap::new();
        for op in graph.ops() {
            for i in ints_of(&op.kind) {
                if let Int::Lit(v) = i {
                    literal_slot.entry(v).or_insert_with(|| {
                        literals.push(v);
                        (n_syms + literals.len() - 1) as u32
                    });
                }
            }
        }

        let device = &ctx.device;
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let mut buffers = Vec::with_capacity(mem.buffers.len() + 2);
        let mut slot = 0;
        for spec in &mem.buffers {
            let b = match spec.kind {
                // Constants and states belong to this executor; the rest is rewritten each call.
                BufferKind::Constant { .. } | BufferKind::State(_) => ctx.scoped(|| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: None,
                        size: spec.size,
                        usage,
                        mapped_at_creation: false,
                    })
                }),
                BufferKind::Input | BufferKind::Pool => {
                    slot += 1;
                    ctx.shared_buffer(slot - 1, spec.size, usage)
                }
            };
            buffers.push(b.map_err(|e| {
                GpuError::Device(format!("allocating {} bytes: {e}", mem.report().total()))
            })?);
        }
        let small = |label| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: padded(((n_syms + literals.len()) * 4) as u64),
                usage,
                mapped_at_creation: false,
            })
        };
        buffers.push(small("dummy"));
        buffers.push(small("syms"));
        buffers.push(device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ranges"),
            size: padded(mem.range_sites as u64 * ops::RANGE_SLOTS as u64 * 8),
            usage,
            mapped_at_creation: false,
        }));
        buffers.push(device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("candidates"),
            size: CANDS_WORDS * 4,
            usage,
            mapped_at_creation: false,
        }));
        let plans = PlanCache::new(&graph);
        // Inputs a `ReadInput` symbol reads: positions, which a decode step advances.
        let mut position_inputs: Vec<usize> = (graph.nodes.iter())
            .filter_map(|n| match n {
                Node::Sym(crate::ir::SymOp::ReadInput { tensor, .. }) => graph
                    .inputs
                    .iter()
                    .position(|io| *io == Io::Tensor(*tensor)),
                _ => None,
            })
            .collect();
        position_inputs.sort_unstable();
        position_inputs.dedup();
        let mut ex = GpuExecutor {
            dummy: buffers.len() - 4,
            syms: buffers.len() - 3,
            ranges: buffers.len() - 2,
            cands: buffers.len() - 1,
            ctx,
            graph,
            mem,
            buffers,
            literals,
            literal_slot,
            view_of: Vec::new(),
            view_off: Vec::new(),
            params: Vec::new(),
            param_slots: HashMap::new(),
            param_used: 0,
            bind_groups: HashMap::new(),
            recordings: Vec::new(),
            last_rec: None,
            predicted: None,
            position_inputs,
            last_call: 0,
            plans,
            ready: None,
            in_flight: std::collections::VecDeque::new(),
            finished: std::collections::VecDeque::new(),
            fed_input: None,
            encode_ahead: std::env::var("PTERIA_ENCODE_AHEAD").map_or(true, |v| v != "0"),
            clock: 0,
            stats: ExecutorStats::default(),
            host,
        };
        ex.upload_constants()?;
        ex.release_host_constants();
        Ok(ex)
    }

    /// Gives up the host copies of the constants once the GPU holds them (or, for derived
    /// biases, never needs them): a model's weights would otherwise sit in host memory twice,
    /// which on a phone's unified memory is the GPU's own. The graph keeps their shapes and
    /// roles, which is all recording reads.
    fn release_host_constants(&mut self) {
        let empty = crate::pte::Blob::empty();
        for def in &mut self.graph.tensors {
            if let Role::Constant(b) = &mut def.role {
                b.release_pages();
                *b = empty.clone();
            }
        }
        // glibc keeps freed heap memory below its top (here the load's: front-end tables,
        // upload pieces) resident until trimmed: 150 MB of the E2B-shaped program's load.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free memory to the OS; it is thread-safe.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    fn upload_constants(&mut self) -> Result<(), GpuError> {
        let mut pending = 0usize;
        for (i, spec) in self.mem.buffers.iter().enumerate() {
            let (t, range, then) = match &spec.kind {
                BufferKind::Constant {
                    tensor,
                    range,
                    then,
                } => (*tensor, range.clone(), then.clone()),
                BufferKind::State(t) => (*t, 0..self.mem.bytes(*t, &self.graph), Vec::new()),
                _ => continue,
            };
            // Each laid after the one before.
            let mut at = range.end - range.start;
            let mut laid = vec![(t, range, 0)];
            for b in then {
                let len = self.mem.bytes(b, &self.graph);
                laid.push((b, 0..len, at));
                at += len;
            }
            for (t, range, at) in laid {
                let def = &self.graph.tensors[t];
                let blob = match &def.role {
                    Role::Constant(b) | Role::State(Some(b)) => b,
                    // wgpu zero-fills new buffers: a state without an initial value is ready.
                    _ => continue,
                };
                let repr = self.mem.repr[t];
                let (eb, ds) = (elem_bytes(repr, def.dtype.size()), def.dtype.size() as u64);
                let (e0, e1) = (range.start / eb, range.end / eb);
                // Pieces of whole elements, converted one at a time.
                let per_piece = (UPLOAD_PIECE as u64 / eb.max(ds)).max(1);
                let mut e = e0;
                while e < e1 {
                    let end = (e + per_piece).min(e1);
                    let piece = (e * ds) as usize..(end * ds) as usize;
                    let data = to_repr(repr, def.dtype, &blob[piece.clone()]);
                    let len = data.len();
                    let size = wgpu::BufferSize::new(len as u64)
                        .ok_or_else(|| GpuError::Device("an empty upload piece".into()))?;
                    // Copied straight into the staging memory: with a fresh 64 MiB copy of
                    // each piece in between, faulted in page by page, the E2B-shaped program
                    // loaded in 2.7-3.1 s on the H100's host, against 1.1-1.3 s now.
                    let mut view = self
                        .ctx
                        .queue
                        .write_buffer_with(&self.buffers[i], at + (e - e0) * eb, size)
                        .ok_or_else(|| {
                            GpuError::Device(self.ctx.take_errors().err().map_or_else(
                                || "a constant's upload was refused".into(),
                                |e| e.to_string(),
                            ))
                        })?;
                    view.copy_from_slice(&data);
                    drop(view);
                    // The write copied the piece: its file pages can go now, so the load's peak
                    // holds a piece of the file rather than all of it.
                    if let Ok(p) = blob.slice(piece) {
                        p.release_pages();
                    }
                    pending += len;
                    if pending >= 4 * UPLOAD_PIECE {
                        self.flush()?;
                        pending = 0;
                    }
                    e = end;
                }
            }
        }
        self.flush()
    }

    /// Submits pending writes and waits, so staging memory is released.
    fn flush(&self) -> Result<(), GpuError> {
        self.ctx.queue.submit([]);
        self.ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device(e.to_string()))?;
        self.ctx.take_errors()
    }

    /// The graph this executor runs; its constants hold no bytes (`release_host_constants`).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn memory(&self) -> MemoryReport {
        self.mem.report()
    }

    pub fn stats(&self) -> ExecutorStats {
        self.stats
    }

    /// The last call's dispatches in recording order, as `kernel:entry`.
    pub fn last_entries(&self) -> Vec<String> {
        (self.last_rec.and_then(|i| self.recordings.get(i)))
            .map(|(_, r)| r.dispatches.iter().map(|d| d.what.clone()).collect())
            .unwrap_or_default()
    }

    /// Bytes of linear weights (packed values, scales, biases as held on the GPU: not those
    /// derived from the scales) that every call must read in full, whatever its length: the
    /// floor a decode step's time is held to.
    pub fn linear_weight_bytes(&self) -> u64 {
        let mut seen = std::collections::HashSet::new();
        self.graph
            .ops()
            .filter(|op| matches!(op.kind, OpKind::Linear { .. }))
            .flat_map(ops::weight_tensors)
            .filter(|&t| !self.mem.derived_bias[self.mem.root[t]])
            .filter(|&t| seen.insert(self.mem.root[t]))
            .map(|t| self.mem.bytes(t, &self.graph))
            .sum()
    }

    /// Runs one call; returns the graph outputs, as `ir::cpu::CpuExecutor::run` does.
    pub fn run(&mut self, inputs: &[InputValue]) -> Result<Vec<HostTensor>, GpuError> {
        Ok(self.run_with(inputs, None)?.0)
    }

    /// Runs a call as `run` does, but hands back output `output`'s last row as its sampling
    /// candidates for `k` (src/runtime/candidates.rs) and reads none of that output back: its
    /// place in the outputs holds an empty tensor, and `read_output` reads it until the next
    /// call. A token's pick then reads a few hundred pairs instead of a 1 MB row.
    pub fn run_candidates(
        &mut self,
        inputs: &[InputValue],
        output: usize,
        k: usize,
    ) -> Result<(Vec<HostTensor>, Candidates), GpuError> {
        self.candidates_check(output)?;
        let want = CandidateRequest {
            output,
            k: k.clamp(1, u32::MAX as usize),
            feed: None,
            draw: None,
        };
        let (outs, c) = self.run_with(inputs, Some(want))?;
        let c = c.ok_or_else(|| GpuError::Device("candidates missing after a call".into()))?;
        Ok((outs, c))
    }

    /// Submits a call as `run_candidates` makes it and returns without waiting for it;
    /// `finish_candidates` hands back its outputs, oldest call first. Two calls may be in
    /// flight at once, so a decode step can be submitted before the last one's token is known:
    /// with `pick`, the call also picks a token on the device (greedy for k = 1:
    /// `Candidates::first`; or a draw: `Candidates::drawn`) and copies it into input
    /// `pick.feed`'s buffer, and a next call made with `pick.fed` reads its token from there,
    /// its own value for that input unused. The host checks each pick when it finishes the call
    /// that made it.
    pub fn start_candidates(
        &mut self,
        inputs: &[InputValue],
        output: usize,
        k: usize,
        pick: Option<DevicePick>,
    ) -> Result<(), GpuError> {
        self.candidates_check(output)?;
        let k = k.clamp(1, u32::MAX as usize);
        if let Some(p) = pick {
            self.feed_check(p.feed)?;
            if k != 1 && p.draw.is_none() {
                return Err(GpuError::Device(format!(
                    "input {}: a pick from top-{k}'s candidates needs a draw (greedy is k = 1)",
                    p.feed
                )));
            }
            if let Some(d) = p.draw {
                let ok = d.temperature > 0.0
                    && d.temperature.is_finite()
                    && (0.0..=1.0).contains(&d.min_p)
                    && d.top_p > 0.0
                    && d.top_p <= 1.0
                    && (0.0..1.0).contains(&d.u);
                if !ok {
                    return Err(GpuError::Device(format!(
                        "a draw's settings out of range: {d:?}"
                    )));
                }
            }
        }
        let want = CandidateRequest {
            output,
            k,
            feed: pick.map(|p| p.feed),
            draw: pick
                .and_then(|p| p.draw)
                .map(|d| [d.temperature, d.top_p, d.min_p].map(f32::to_bits)),
        };
        let fed = pick.is_some_and(|p| p.fed);
        let u = pick.and_then(|p| p.draw).map(|d| d.u);
        self.with_gathered(inputs, |ex, all| ex.start_call(all, Some(want), fed, u))
    }

    /// The outputs and candidates of the oldest call `start_candidates` submitted.
    pub fn finish_candidates(&mut self) -> Result<(Vec<HostTensor>, Candidates), GpuError> {
        let (outs, c) = self.finish_call()?;
        let c = c.ok_or_else(|| GpuError::Device("candidates missing after a call".into()))?;
        Ok((outs, c))
    }

    /// Calls submitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.finished.len()
    }

    /// Why input `input` cannot be fed a call's pick, if it cannot: it must be an integer
    /// tensor the GPU holds, read by no embedding gathered on the host (those rows are chosen
    /// before the call is submitted).
    pub fn feed_check(&self, input: usize) -> Result<(), GpuError> {
        let no = |why: &str| Err(GpuError::Device(format!("feeding input {input}: {why}")));
        let Some(Io::Tensor(t)) = self.graph.inputs.get(input) else {
            return no("not a tensor input");
        };
        if self.mem.repr[*t] != Repr::I32 {
            return no("not an integer tensor");
        }
        if self.mem.place[self.mem.root[*t]].is_empty() {
            return no("no GPU buffer holds it");
        }
        if self.host.is_some() {
            return no("embeddings gathered on the host read the inputs before the call");
        }
        Ok(())
    }

    /// Why output `output` cannot be reduced to candidates, if it cannot: it must be f32 in
    /// one buffer (a row longer than the kernel ranks fails the call that makes it).
    pub fn candidates_check(&self, output: usize) -> Result<(), GpuError> {
        let no = |why: String| {
            Err(GpuError::Device(format!(
                "candidates of output {output}: {why}"
            )))
        };
        let Some(&t) = self.graph.outputs.get(output) else {
            return no(format!(
                "the graph has {} outputs",
                self.graph.outputs.len()
            ));
        };
        if self.graph.tensors[t].dtype != DType::F32 || self.mem.repr[t] != Repr::F32 {
            return no("not an f32 tensor".into());
        }
        if self.mem.place[self.mem.root[t]].len() != 1 {
            return no("split over several buffers".into());
        }
        Ok(())
    }

    /// Output `output` of the last call, read from the GPU: what `run_candidates` left out. An
    /// error once another call has run on this context (executors share activation buffers).
    pub fn read_output(&mut self, output: usize) -> Result<HostTensor, GpuError> {
        let ctx = self.ctx.clone();
        let _turn = ctx.turn();
        if self.in_flight() > 0 {
            return Err(GpuError::Device(format!(
                "output {output}: calls are still in flight"
            )));
        }
        if ctx.calls() != self.last_call {
            return Err(GpuError::Device(format!(
                "output {output}: another call on this device has run since this executor's \
                 last, and may have overwritten it"
            )));
        }
        let rec = self
            .last_rec
            .and_then(|i| self.recordings.get(i))
            .map(|(_, r)| r)
            .ok_or_else(|| GpuError::Device("no call has run".into()))?;
        let (&t, (_, shape)) = self
            .graph
            .outputs
            .iter()
            .zip(&rec.outputs)
            .nth(output)
            .ok_or_else(|| GpuError::Device(format!("no output {output}")))?;
        let def = &self.graph.tensors[t];
        let numel: usize = shape.iter().product();
        let bytes = numel as u64 * elem_bytes(self.mem.repr[t], def.dtype.size());
        let read = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("output"),
            size: padded(bytes.div_ceil(4) * 4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let mut at = 0;
        for (b, n) in self.output_pieces(t, bytes) {
            enc.copy_buffer_to_buffer(&self.buffers[b], 0, &read, at, n);
            at += n;
        }
        ctx.queue.submit([enc.finish()]);
        let data = read_back(&ctx, &read)?;
        ctx.take_errors()?;
        Ok(HostTensor {
            dtype: def.dtype,
            sizes: shape.clone(),
            data: from_repr(self.mem.repr[t], def.dtype, &data, numel),
        })
    }

    /// The (buffer, bytes) pieces holding output tensor `t`'s first `bytes`, in order (whole
    /// words): what a call's readback copies, and `read_output`.
    fn output_pieces(&self, t: crate::ir::TensorId, bytes: u64) -> Vec<(usize, u64)> {
        let mut left = bytes.div_ceil(4) * 4;
        let mut pieces = Vec::new();
        for &b in &self.mem.place[self.mem.root[t]] {
            if left == 0 {
                break;
            }
            let n = left.min(self.mem.buffers[b].size);
            pieces.push((b, n));
            left -= n;
        }
        pieces
    }

    fn run_with(
        &mut self,
        inputs: &[InputValue],
        want: Option<CandidateRequest>,
    ) -> Result<(Vec<HostTensor>, Option<Candidates>), GpuError> {
        self.with_gathered(inputs, |ex, all| ex.run_all(all, want))
    }

    /// `call` on the call's inputs, followed by the rows of the tables gathered on the host as
    /// the inputs `host_gather::split` added.
    fn with_gathered<R>(
        &mut self,
        inputs: &[InputValue],
        call: impl FnOnce(&mut Self, &[InputValue]) -> Result<R, GpuError>,
    ) -> Result<R, GpuError> {
        let Some(host) = &mut self.host else {
            return call(self, inputs);
        };
        let rows = host.run(inputs).map_err(GpuError::Device)?;
        let mut all = inputs.to_vec();
        all.extend(rows.iter().map(|(shape, data)| InputValue::Tensor {
            shape: shape.clone(),
            data,
        }));
        call(self, &all)
    }

    fn run_all(
        &mut self,
        inputs: &[InputValue],
        want: Option<CandidateRequest>,
    ) -> Result<(Vec<HostTensor>, Option<Candidates>), GpuError> {
        if self.in_flight() > 0 {
            return Err(GpuError::Device(
                "a call waits while earlier ones are still in flight: finish them first".into(),
            ));
        }
        self.start_call(inputs, want, false, None)?;
        self.finish_call()
    }

    /// Plans a call, writes its inputs (all but the fed one, when `fed`, and the draw's uniform
    /// number `u`) and submits it.
    fn start_call(
        &mut self,
        inputs: &[InputValue],
        want: Option<CandidateRequest>,
        fed: bool,
        u: Option<f64>,
    ) -> Result<(), GpuError> {
        let ctx = self.ctx.clone();
        let _turn = ctx.turn();
        let t_start = std::time::Instant::now();
        if self.in_flight() >= MAX_IN_FLIGHT {
            return Err(GpuError::Device(format!(
                "{MAX_IN_FLIGHT} calls already in flight: finish one first"
            )));
        }
        let feed = want.and_then(|w| w.feed);
        if fed && (feed.is_none() || self.fed_input != feed || ctx.calls() != self.last_call) {
            return Err(GpuError::Device(
                "a fed call must follow a call that picks into the same input, with no other \
                 call on the device between"
                    .into(),
            ));
        }
        let (plan, same) = self.plans.plan(&self.graph, inputs)?;
        self.clock += 1;
        let syms: Vec<i32> = plan
            .syms
            .iter()
            .chain(&self.literals)
            .map(|&v| v.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
            .collect();
        // Same shapes as the last call, or as the call predicted after it (a decode step): its
        // recording, found without comparing every tensor's shape.
        let wants = |r: &Recording| r.cands.map(|c| c.0) == want;
        let found = match self.predicted.take().or(self.last_rec) {
            Some(i) if same && wants(&self.recordings[i].1) => Some(i),
            _ => self
                .recordings
                .iter()
                .position(|(k, r)| *k == plan.shapes && wants(r)),
        };
        let idx = match found {
            Some(i) => {
                self.stats.replays += 1;
                i
            }
            None => {
                let plan = plan.clone();
                // Recordings move below: the calls in flight, which read theirs when they
                // finish, finish first (a graph whose shapes follow a position, decoded ahead).
                while !self.in_flight.is_empty() {
                    let done = self.finish_oldest()?;
                    self.finished.push_back(done);
                }
                // Indices into `recordings` change below.
                self.ready = None;
                if self.param_used > PARAM_BUDGET {
                    self.recordings.clear();
                    self.bind_groups.clear();
                    self.param_slots.clear();
                    self.param_used = 0;
                }
                self.make_room();
                let rec = self.record(&plan, want)?;
                self.recordings.push((plan.shapes, rec));
                self.stats.recordings += 1;
                self.recordings.len() - 1
            }
        };
        self.last_rec = Some(idx);
        self.last_call = ctx.count_call();
        self.fed_input = feed;

        let t_encode = std::time::Instant::now();
        let queue = &self.ctx.queue;
        let mut uploaded = 0u64;
        for (k, (io, v)) in self.graph.inputs.iter().zip(inputs).enumerate() {
            if fed && feed == Some(k) {
                // The last call's pick is already in its buffer.
                continue;
            }
            if let (Io::Tensor(t), InputValue::Tensor { data, .. }) = (io, v) {
                let Some(&b) = self.mem.place[self.mem.root[*t]].first() else {
                    continue;
                };
                if data.is_empty() {
                    continue;
                }
                let def = &self.graph.tensors[*t];
                let bytes = to_repr(self.mem.repr[*t], def.dtype, data);
                queue.write_buffer(&self.buffers[b], 0, &bytes);
                uploaded += bytes.len() as u64;
            }
        }
        if !syms.is_empty() {
            queue.write_buffer(&self.buffers[self.syms], 0, bytemuck::cast_slice(&syms));
        }
        if let Some(u) = u {
            // Rounded down into f32's [0, 1): rounding to nearest could make it 1.
            let mut v = u as f32;
            if f64::from(v) > u {
                v = f32::from_bits(v.to_bits() - 1);
            }
            let at = U_WORD as u64 * 4;
            queue.write_buffer(&self.buffers[self.cands], at, &v.to_bits().to_le_bytes());
        }

        // Its own readback buffer: the lowest that no call in flight fills.
        let busy = |slot: usize| {
            self.in_flight
                .iter()
                .any(|f| f.rec == idx && f.slot == slot)
        };
        let slot = (0..MAX_IN_FLIGHT).find(|&s| !busy(s)).unwrap_or(0);
        // The next call's readback, for the commands encoded ahead below: a call that feeds the
        // next is followed by that one while it runs, into the other readback.
        let next = if feed.is_some() {
            (slot + 1) % MAX_IN_FLIGHT
        } else {
            slot
        };
        self.recordings[idx].1.last_used = self.clock;
        self.readbacks_through(idx, slot.max(next));
        self.stats.last_dispatches = self.recordings[idx].1.dispatches.len();
        self.stats.last_chain = self.recordings[idx].1.chain;
        let rec = &self.recordings[idx].1;
        match self.ready.take().filter(|r| r.rec == idx && r.slot == slot) {
            Some(r) => {
                self.ctx.queue.submit([r.commands]);
                self.stats.submits += 1;
            }
            None => {
                // Growing pieces, each submitted as soon as it is encoded: the GPU starts on the
                // first while the host encodes the rest (a whole-model call has hundreds of
                // dispatches).
                let mut piece = FIRST_PIECE;
                let mut rest = rec.dispatches.as_slice();
                let mut first = true;
                while !rest.is_empty() {
                    let (now, later) = rest.split_at(piece.min(rest.len()));
                    rest = later;
                    let last = rest.is_empty();
                    let commands = self.encode(rec, now, first, last.then_some(slot));
                    self.ctx.queue.submit([commands]);
                    first = false;
                    self.stats.submits += 1;
                    piece *= 4;
                }
            }
        }
        let t_ahead = std::time::Instant::now();
        self.stats.last_upload_bytes = uploaded;
        self.stats.last_readback_bytes = rec.readback_size;
        self.in_flight.push_back(Started {
            rec: idx,
            slot,
            submitted: t_ahead,
        });
        if self.encode_ahead {
            self.encode_next(inputs, want, idx, next);
        }
        let ns = |a: std::time::Instant, b: std::time::Instant| (b - a).as_nanos() as u64;
        let host = &mut self.stats.host;
        host.prepare_ns += ns(t_start, t_encode);
        host.encode_ns += ns(t_encode, t_ahead);
        host.ahead_ns += ns(t_ahead, std::time::Instant::now());
        Ok(())
    }

    /// Waits for the oldest call in flight and hands back its outputs (and candidates).
    fn finish_call(&mut self) -> Result<(Vec<HostTensor>, Option<Candidates>), GpuError> {
        let ctx = self.ctx.clone();
        let _turn = ctx.turn();
        match self.finished.pop_front() {
            Some(done) => Ok(done),
            None => self.finish_oldest(),
        }
    }

    /// The next call's commands, encoded while the GPU runs this call's (`idx`; `next` the
    /// readback slot a next call of the same recording takes): a decode step whose
    /// shapes equal this call's replays its recording, and then only writes its inputs and
    /// submits. Where the graph's shapes follow a position input (an attention over the first
    /// pos + 1 cache rows), the next decode step's are predicted from this one's position plus
    /// one, and its recording made now if it is new, so that its planning, recording and
    /// encoding overlap this call's GPU work too; a next call that is not that step plans anew.
    fn encode_next(
        &mut self,
        inputs: &[InputValue],
        want: Option<CandidateRequest>,
        idx: usize,
        next: usize,
    ) {
        let mut target = (idx, next);
        if let Some(ahead) = self.predicted_inputs(inputs) {
            if self.param_used <= PARAM_BUDGET {
                match self.predict(inputs, &ahead, want, idx) {
                    Ok(Some(rec)) => {
                        self.predicted = Some(rec);
                        // A recording of its own: its lowest readback no call in flight fills.
                        if rec != idx {
                            let busy = |s: usize| {
                                (self.in_flight.iter()).any(|f| f.rec == rec && f.slot == s)
                            };
                            target = (rec, (0..MAX_IN_FLIGHT).find(|&s| !busy(s)).unwrap_or(0));
                        }
                    }
                    Ok(None) => {}
                    // This call is submitted already: a recording that could not be made only
                    // leaves the next call to plan anew (`plans` may hold the predicted plan).
                    Err(_) => self.plans.forget(),
                }
            }
        }
        let (rec, next) = target;
        self.readbacks_through(rec, next);
        let r = &self.recordings[rec].1;
        self.ready = Some(Ready {
            rec,
            slot: next,
            commands: self.encode(r, &r.dispatches, true, Some(next)),
        });
    }

    /// Recording `rec`'s readback buffers up to slot `slot`, made on first use, so that a
    /// recording only ever read one call at a time has one.
    fn readbacks_through(&mut self, rec: usize, slot: usize) {
        let r = &mut self.recordings[rec].1;
        while r.readback_size > 0 && r.readbacks.len() <= slot {
            r.readbacks
                .push(self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("readback"),
                    size: r.readback_size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
        }
    }

    /// This call's inputs as the decode step after it would have them: each position input
    /// (read by a `ReadInput` symbol) of one element, advanced by one. `None` where there is no
    /// position input or one holds more (a prompt: what follows it is not predicted).
    fn predicted_inputs(&self, inputs: &[InputValue]) -> Option<Vec<(usize, Vec<u8>)>> {
        let mut out = Vec::new();
        for &k in &self.position_inputs {
            let (Some(Io::Tensor(t)), Some(InputValue::Tensor { shape, data })) =
                (self.graph.inputs.get(k), inputs.get(k))
            else {
                return None;
            };
            if shape.iter().product::<usize>() != 1 {
                return None;
            }
            let dtype = self.graph.tensors[*t].dtype;
            if dtype.is_float() {
                return None;
            }
            let pos = to_i64(dtype, data).first()?.checked_add(1)?;
            out.push((k, from_i64(dtype, &[pos])));
        }
        (!out.is_empty()).then_some(out)
    }

    /// Plans `inputs` with `ahead`'s position inputs in place of theirs (`plans` then holds that
    /// plan; `idx` is the recording of the call just planned) and finds or makes its recording. `None` where that plan fails (the position past
    /// the cache, say): `plans` then holds none.
    fn predict(
        &mut self,
        inputs: &[InputValue],
        ahead: &[(usize, Vec<u8>)],
        want: Option<CandidateRequest>,
        idx: usize,
    ) -> Result<Option<usize>, GpuError> {
        let mut all = inputs.to_vec();
        for (k, bytes) in ahead {
            if let Some(InputValue::Tensor { shape, .. }) = inputs.get(*k) {
                all[*k] = InputValue::Tensor {
                    shape: shape.clone(),
                    data: bytes,
                };
            }
        }
        let plan = match self.plans.plan(&self.graph, &all) {
            // The shapes of this call (`idx`; a graph whose shapes do not follow the position):
            // its recording, with no shapes compared.
            Ok((_, true)) => return Ok(Some(idx)),
            Ok((plan, false)) => plan.clone(),
            Err(_) => return Ok(None),
        };
        let wants = |r: &Recording| r.cands.map(|c| c.0) == want;
        let found = (self.recordings.iter()).position(|(k, r)| *k == plan.shapes && wants(r));
        if let Some(i) = found {
            return Ok(Some(i));
        }
        self.make_room();
        let rec = self.record(&plan, want)?;
        self.recordings.push((plan.shapes, rec));
        self.stats.recordings += 1;
        Ok(Some(self.recordings.len() - 1))
    }

    /// Room for one more recording without finishing the calls in flight: at MAX_RECORDINGS
    /// the least recently used one that none of them (nor the last call) runs goes, and the
    /// last recording takes its index (what pointed at the last follows it).
    fn make_room(&mut self) {
        if self.recordings.len() < MAX_RECORDINGS {
            return;
        }
        let used = |i: usize| self.last_rec == Some(i) || self.in_flight.iter().any(|f| f.rec == i);
        let Some(i) = (0..self.recordings.len())
            .filter(|&i| !used(i))
            .min_by_key(|&i| self.recordings[i].1.last_used)
        else {
            return;
        };
        let last = self.recordings.len() - 1;
        self.recordings.swap_remove(i);
        for f in &mut self.in_flight {
            if f.rec == last {
                f.rec = i;
            }
        }
        if self.last_rec == Some(last) {
            self.last_rec = Some(i);
        }
    }

    /// Waits for the oldest call in flight and reads its outputs (under the caller's turn).
    fn finish_oldest(&mut self) -> Result<(Vec<HostTensor>, Option<Candidates>), GpuError> {
        let started = self
            .in_flight
            .pop_front()
            .ok_or_else(|| GpuError::Device("no call in flight to finish".into()))?;
        let t_wait = std::time::Instant::now();
        let mut t_outputs = t_wait;
        let rec = &self.recordings[started.rec].1;

        // The outputs, converted straight from the mapped readback buffer.
        let convert = |bytes: &[u8]| -> (Vec<HostTensor>, Option<Candidates>) {
            let mut outs = Vec::with_capacity(self.graph.outputs.len());
            for (i, (&t, (off, shape))) in self.graph.outputs.iter().zip(&rec.outputs).enumerate() {
                let def = &self.graph.tensors[t];
                if rec.cands.is_some_and(|c| c.0.output == i) {
                    outs.push(HostTensor {
                        dtype: def.dtype,
                        sizes: vec![0],
                        data: Vec::new(),
                    });
                    continue;
                }
                let numel: usize = shape.iter().product();
                outs.push(HostTensor {
                    dtype: def.dtype,
                    sizes: shape.clone(),
                    data: from_repr(self.mem.repr[t], def.dtype, &bytes[*off as usize..], numel),
                });
            }
            let cands = rec.cands.map(|(c, at)| {
                let cap = self.ctx.candidate_capacity();
                read_candidates(&bytes[at as usize..], c.k, c.draw.is_some(), cap)
            });
            (outs, cands)
        };
        let mut clock = rec.wait;
        let outs = match rec.readbacks.get(started.slot) {
            Some(rb) => {
                let slice = rb.slice(..);
                let (tx, rx) = std::sync::mpsc::channel();
                slice.map_async(wgpu::MapMode::Read, move |r| {
                    let _ = tx.send(r);
                });
                let spin = self.ctx.poll_outputs();
                let (mapped, done, slept) =
                    await_map(&self.ctx.device, &rx, started.submitted, &mut clock, spin)?;
                t_outputs = done;
                self.stats.slept_waits += slept as usize;
                mapped.map_err(|e| GpuError::Device(format!("reading outputs back: {e}")))?;
                let outs = {
                    let view = slice
                        .get_mapped_range()
                        .map_err(|e| GpuError::Device(format!("reading outputs back: {e}")))?;
                    convert(&view)
                };
                rb.unmap();
                outs
            }
            None => convert(&[]),
        };
        self.recordings[started.rec].1.wait = clock;
        self.ctx.take_errors()?;
        let ns = |a: std::time::Instant, b: std::time::Instant| (b - a).as_nanos() as u64;
        let host = &mut self.stats.host;
        host.wait_ns += ns(t_wait, t_outputs);
        host.outputs_ns += ns(t_outputs, std::time::Instant::now());
        Ok(outs)
    }

    /// Runs one call, then times `reps` replays of its dispatches encoded back to back in one
    /// submit: with GPU timestamps around the pass where the device has them, else by the wall
    /// clock (which then includes one submit and wait, spread over the replays).
    pub fn time_replays(
        &mut self,
        inputs: &[InputValue],
        reps: u32,
    ) -> Result<ReplayTiming, GpuError> {
        self.time_replays_skipping(inputs, reps, &[])
    }

    /// `time_replays` leaving out the dispatches `skip` names (a kernel, an entry, or
    /// `kernel:entry`): their results are then wrong, but the time says what that kind of
    /// kernel costs a step when every dispatch waits for the one before (`pteria bench`'s
    /// `PTERIA_REPLAY_SKIP`). `dispatches` counts those replayed.
    pub fn time_replays_skipping(
        &mut self,
        inputs: &[InputValue],
        reps: u32,
        skip: &[String],
    ) -> Result<ReplayTiming, GpuError> {
        self.run(inputs)?;
        let ctx = self.ctx.clone();
        let _turn = ctx.turn();
        let reps = reps.max(1);
        let skipped = |what: &str| {
            (skip.iter()).any(|t| what == t.as_str() || what.split(':').any(|p| p == t))
        };
        let rec = self
            .last_rec
            .and_then(|i| self.recordings.get(i))
            .map(|(_, r)| r)
            .ok_or_else(|| GpuError::Device("recording missing after a run".into()))?;
        let ctx = &self.ctx;
        let stamps = ctx.has_timestamps().then(|| Stamps::new(ctx, 2));
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: stamps.as_ref().map(|s| s.writes(0)),
            });
            for _ in 0..reps {
                for d in rec.dispatches.iter().filter(|d| !skipped(&d.what)) {
                    pass.set_pipeline(&d.pipeline);
                    pass.set_bind_group(0, &d.bind_group, &[]);
                    pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
                }
            }
        }
        if let Some(s) = &stamps {
            s.resolve(&mut enc);
        }
        let t0 = std::time::Instant::now();
        ctx.queue.submit([enc.finish()]);
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let wall = t0.elapsed().as_secs_f64();
        ctx.take_errors()?;
        let dispatches = rec.dispatches.iter().filter(|d| !skipped(&d.what)).count();
        let seconds = match &stamps {
            Some(s) => {
                let t = s.read(ctx)?;
                t[1].saturating_sub(t[0]) as f64 * ctx.queue.get_timestamp_period() as f64 * 1e-9
            }
            None => wall,
        };
        Ok(ReplayTiming {
            seconds: seconds / reps as f64,
            timestamps: stamps.is_some(),
            dispatches,
        })
    }

    /// Runs one call, then replays it once with every dispatch in its own timed pass and
    /// returns the GPU time per graph node, in graph order; `None` without GPU timestamps.
    /// Separate passes add a little per-dispatch overhead: use the shares, not the sum.
    pub fn profile(&mut self, inputs: &[InputValue]) -> Result<Option<Vec<OpTime>>, GpuError> {
        if !self.ctx.has_timestamps() {
            return Ok(None);
        }
        self.run(inputs)?;
        let turn_ctx = self.ctx.clone();
        let _turn = turn_ctx.turn();
        let rec = self
            .last_rec
            .and_then(|i| self.recordings.get(i))
            .map(|(_, r)| r)
            .ok_or_else(|| GpuError::Device("recording missing after a run".into()))?;
        let ctx = &self.ctx;
        let period = ctx.queue.get_timestamp_period() as f64 * 1e-9;
        let mut per_dispatch: Vec<f64> = Vec::with_capacity(rec.dispatches.len());
        // A query set holds at most 4096 timestamps: 2 per dispatch.
        for chunk in rec.dispatches.chunks(2048) {
            let stamps = Stamps::new(ctx, 2 * chunk.len() as u32);
            let mut enc = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            for (i, d) in chunk.iter().enumerate() {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(stamps.writes(2 * i as u32)),
                });
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[]);
                pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
            }
            stamps.resolve(&mut enc);
            ctx.queue.submit([enc.finish()]);
            let t = stamps.read(ctx)?;
            for i in 0..chunk.len() {
                per_dispatch.push(t[2 * i + 1].saturating_sub(t[2 * i]) as f64 * period);
            }
        }
        ctx.take_errors()?;
        // One entry per node, at its first dispatch: a node's dispatches need not be adjacent.
        let mut at: Vec<Option<usize>> = vec![None; self.graph.nodes.len()];
        let mut out: Vec<OpTime> = Vec::new();
        for (d, &s) in rec.dispatches.iter().zip(&per_dispatch) {
            // The executor's own dispatches (candidates) belong to no node.
            let Some(Node::Op(op)) = self.graph.nodes.get(d.node) else {
                continue;
            };
            let i = *at[d.node].get_or_insert_with(|| {
                out.push(OpTime {
                    node: d.node,
                    op: op.kind.label(),
                    seconds: 0.0,
                    dispatches: Vec::new(),
                });
                out.len() - 1
            });
            out[i].seconds += s;
            out[i].dispatches.push((d.what.clone(), d.groups, s));
        }
        Ok(Some(out))
    }

    /// One command buffer with `dispatches` of `rec`, after zeroing the ranges buffer when
    /// `first` (a call's first), then, when `last`, the copies of the outputs into its readback
    /// buffer.
    fn encode(
        &self,
        rec: &Recording,
        dispatches: &[Dispatch],
        first: bool,
        last: Option<usize>,
    ) -> wgpu::CommandBuffer {
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        if first && self.mem.range_sites > 0 {
            enc.clear_buffer(&self.buffers[self.ranges], 0, None);
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            for d in dispatches {
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[]);
                pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
            }
        }
        if let Some(slot) = last {
            if let Some(rb) = rec.readbacks.get(slot) {
                for &(src, bytes, off) in &rec.copies {
                    enc.copy_buffer_to_buffer(&self.buffers[src], 0, rb, off, bytes);
                }
            }
            if let Some(b) = rec.feed {
                enc.copy_buffer_to_buffer(
                    &self.buffers[self.cands],
                    FEED_WORD as u64 * 4,
                    &self.buffers[b],
                    0,
                    4,
                );
            }
        }
        enc.finish()
    }

    fn record(
        &mut self,
        plan: &Plan,
        want: Option<CandidateRequest>,
    ) -> Result<Recording, GpuError> {
        let mut steps: Vec<(usize, Step)> = Vec::new();
        let align = self.ctx.limits().min_storage_buffer_offset_alignment as u64;
        (self.view_of, self.view_off) = ops::views(&self.graph, &self.mem, &plan.shapes, align);
        {
            let slot = |i: Int| -> u32 {
                match i {
                    Int::Sym(s) => s as u32,
                    Int::Lit(v) => self.literal_slot.get(&v).copied().unwrap_or(0),
                }
            };
            let env = Env {
                graph: &self.graph,
                plan,
                mem: &self.mem,
                slot: &slot,
                max_groups: self.ctx.max_workgroups(),
                subgroup: self.ctx.subgroup_min(),
                max_invocations: self.ctx.limits().max_compute_invocations_per_workgroup,
                max_storage: self.ctx.limits().max_storage_buffers_per_shader_stage,
                max_workgroup_bytes: self.ctx.limits().max_compute_workgroup_storage_size,
                quad_rows: self.ctx.quad_matvec_rows(),
                x_rows: self.ctx.matvec_x_rows(),
                fused_fma: self.ctx.fused_fma_probed(),
                // (A CPU's Vulkan driver runs few workgroups at once: more only cost it.)
                xnn_floor: if self.ctx.adapter().is_cpu() {
                    0
                } else {
                    XNN_WORKGROUP_FLOOR
                },
                view_of: &self.view_of,
            };
            for (n, node) in self.graph.nodes.iter().enumerate() {
                let Node::Op(op) = node else { continue };
                let built = ops::build(&env, n, op).map_err(|msg| IrError::Node {
                    node: n,
                    op: op.kind.label(),
                    msg,
                })?;
                steps.extend(built.into_iter().map(|s| (n, s)));
            }
        }
        if let Some(c) = want {
            let t = self.graph.outputs[c.output];
            let n = plan.shapes[t].last().copied().unwrap_or(1);
            let numel: usize = plan.shapes[t].iter().product();
            let blocks = n.div_ceil(candidates::BLOCK);
            if n == 0 || blocks > candidates::MAX_BLOCKS {
                return Err(GpuError::Device(format!(
                    "candidates of output {}: rows of {n} logits (1 to {} can be reduced)",
                    c.output,
                    candidates::MAX_BLOCKS * candidates::BLOCK
                )));
            }
            let [temperature, top_p, min_p] = c.draw.unwrap_or_default();
            let params = vec![
                (numel - n) as u32,
                n as u32,
                c.k as u32,
                self.ctx.candidate_capacity() as u32,
                blocks as u32,
                temperature,
                top_p,
                min_p,
                candidates::CAPACITY as u32,
            ];
            // A greedy pick (k = 1) is also found over the whole row, in one workgroup; a
            // sampled one from the candidates.
            let entries: &[&'static str] = match (c.draw, c.k) {
                (Some(_), _) => &["block_max", "gather", "draw"],
                (None, 1) => &["block_max", "gather", "pick"],
                (None, _) => &["block_max", "gather"],
            };
            for &entry in entries {
                let step = Step {
                    kernel: "candidates",
                    entry,
                    constants: Vec::new(),
                    params: params.clone(),
                    out: Res::Candidates,
                    inputs: vec![Res::Tensor(t)],
                    writes: Vec::new(),
                    reads_after: Vec::new(),
                    groups: [
                        if matches!(entry, "pick" | "draw") {
                            1
                        } else {
                            blocks as u32
                        },
                        1,
                        1,
                    ],
                };
                steps.push((usize::MAX, step));
            }
        }
        let feed = match want.and_then(|c| c.feed) {
            None => None,
            Some(input) => {
                self.feed_check(input)?;
                let Some(Io::Tensor(t)) = self.graph.inputs.get(input) else {
                    unreachable!("feed_check passed");
                };
                let numel: usize = plan.shapes[*t].iter().product();
                if numel != 1 {
                    return Err(GpuError::Device(format!(
                        "input {input} is fed a pick, so it holds one token, not {numel}"
                    )));
                }
                self.mem.place[self.mem.root[*t]].first().copied()
            }
        };
        let chain = self.longest_chain(&steps);
        let mut dispatches = Vec::with_capacity(steps.len());
        for (n, s) in &steps {
            dispatches.push(self.dispatch(*n, s)?);
        }

        let mut copies = Vec::new();
        let mut outputs = Vec::new();
        let mut size = 0u64;
        for (i, &t) in self.graph.outputs.iter().enumerate() {
            let shape = plan.shapes[t].clone();
            let def = &self.graph.tensors[t];
            let bytes = shape.iter().product::<usize>() as u64
                * elem_bytes(self.mem.repr[t], def.dtype.size());
            outputs.push((size, shape));
            if want.is_some_and(|c| c.output == i) {
                continue;
            }
            for (b, n) in self.output_pieces(t, bytes) {
                copies.push((b, n, size));
                size += n;
            }
        }
        let cands = want.map(|c| {
            // The count, the pairs, the pick.
            let bytes = FEED_WORD as u64 * 4;
            copies.push((self.cands, bytes, size));
            size += bytes;
            (c, size - bytes)
        });
        Ok(Recording {
            dispatches,
            chain,
            copies,
            outputs,
            cands,
            readbacks: Vec::new(),
            readback_size: size,
            feed,
            last_used: 0,
            wait: WaitClock::default(),
        })
    }

    /// The longest chain in `steps` of dispatches each of which must wait for an earlier one:
    /// it reads storage one wrote, or writes storage one read or wrote. Storage is a tensor's
    /// (through its alias root and any view), a node's scratch, or the candidates; the ranges
    /// buffer is left out (its producers and readers also share the tensor it describes), and
    /// so is the reuse of one buffer by tensors whose lives do not overlap, which another plan
    /// could avoid. So the count is the fewest barrier-separated rounds the call's dispatches
    /// could run in, in any order.
    fn longest_chain(&self, steps: &[(usize, Step)]) -> usize {
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        enum Key {
            Tensor(usize),
            Scratch(usize, usize),
            Candidates,
        }
        let key = |node: usize, r: &Res| match *r {
            Res::Tensor(t) | Res::Chunk(t, _) => Some(Key::Tensor(self.storage_root(t))),
            Res::Scratch(k) => Some(Key::Scratch(node, k)),
            Res::ScratchOf(m, k) => Some(Key::Scratch(m, k)),
            Res::Candidates => Some(Key::Candidates),
            Res::Dummy | Res::Ranges => None,
        };
        // Per storage: the round of its last write, and the latest round that read it.
        let mut written: HashMap<Key, usize> = HashMap::new();
        let mut read: HashMap<Key, usize> = HashMap::new();
        let mut longest = 0;
        for (node, s) in steps {
            let reads: Vec<Key> = s
                .inputs
                .iter()
                .chain(&s.reads_after)
                .filter_map(|r| key(*node, r))
                .collect();
            let writes: Vec<Key> = std::iter::once(&s.out)
                .chain(&s.writes)
                .filter_map(|r| key(*node, r))
                .collect();
            let after = |k: &Key, m: &HashMap<Key, usize>| m.get(k).copied().unwrap_or(0);
            let round = 1 + reads
                .iter()
                .map(|k| after(k, &written))
                .chain(
                    writes
                        .iter()
                        .map(|k| after(k, &written).max(after(k, &read))),
                )
                .max()
                .unwrap_or(0);
            for k in reads {
                let r = read.entry(k).or_insert(0);
                *r = (*r).max(round);
            }
            for k in writes {
                written.insert(k, round);
            }
            longest = longest.max(round);
        }
        longest
    }

    /// The root whose storage holds `t`'s values in the call being recorded: its alias root's,
    /// or the viewed tensor's where that root is a view (`ops::views`).
    fn storage_root(&self, t: crate::ir::TensorId) -> crate::ir::TensorId {
        let r = self.mem.root[t];
        self.view_of.get(r).copied().unwrap_or(r)
    }

    /// The buffer a dispatch binds for `r`, and the byte offset it binds from (a select view's).
    fn resolve(&self, node: usize, r: Res) -> Result<(usize, u64), GpuError> {
        if let Res::Tensor(t) = r {
            let root = self.mem.root[t];
            let off = self.view_off.get(root).copied().unwrap_or(0);
            return Ok((self.buffer_of(node, r)?, off));
        }
        Ok((self.buffer_of(node, r)?, 0))
    }

    fn buffer_of(&self, node: usize, r: Res) -> Result<usize, GpuError> {
        let missing =
            |what: String| GpuError::Device(format!("node {node}: {what} has no GPU buffer"));
        match r {
            Res::Dummy => Ok(self.dummy),
            Res::Ranges => Ok(self.ranges),
            Res::Candidates => Ok(self.cands),
            Res::Scratch(k) => self.mem.scratch[node]
                .get(k)
                .copied()
                .ok_or_else(|| missing(format!("scratch {k}"))),
            Res::ScratchOf(n, k) => self.mem.scratch[n]
                .get(k)
                .copied()
                .ok_or_else(|| missing(format!("node {n}'s scratch {k}"))),
            Res::Tensor(t) => {
                let place = &self.mem.place[self.storage_root(t)];
                match place.as_slice() {
                    [b] => Ok(*b),
                    _ => Err(missing(format!(
                        "tensor {t} `{}`",
                        self.graph.tensors[t].name
                    ))),
                }
            }
            Res::Chunk(t, c) => self.mem.place[self.mem.root[t]]
                .get(c)
                .copied()
                .ok_or_else(|| missing(format!("chunk {c} of tensor {t}"))),
        }
    }

    fn param_slot(&mut self, params: &[u32]) -> Result<(usize, u64), GpuError> {
        if let Some(&s) = self.param_slots.get(params) {
            return Ok(s);
        }
        if params.len() * 4 > PARAM_SLOT as usize {
            return Err(GpuError::Device(format!(
                "{} bytes of kernel parameters",
                params.len() * 4
            )));
        }
        let per_buffer = PARAM_BUFFER / PARAM_SLOT;
        let index = self.param_slots.len() as u64;
        let (buf, off) = (
            (index / per_buffer) as usize,
            (index % per_buffer) * PARAM_SLOT,
        );
        if buf == self.params.len() {
            self.params
                .push(self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("params"),
                    size: PARAM_BUFFER,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
        }
        self.ctx
            .queue
            .write_buffer(&self.params[buf], off, bytemuck::cast_slice(params));
        self.param_slots.insert(params.to_vec(), (buf, off));
        self.param_used += PARAM_SLOT;
        Ok((buf, off))
    }

    fn dispatch(&mut self, node: usize, s: &Step) -> Result<Dispatch, GpuError> {
        let mut slots = vec![Slot::Uniform, Slot::Read, Slot::Write];
        slots.extend(s.inputs.iter().map(|_| Slot::Read));
        slots.extend(s.writes.iter().map(|_| Slot::Write));
        slots.extend(s.reads_after.iter().map(|_| Slot::Read));
        let pipeline = self.ctx.pipeline(s.kernel, s.entry, &s.constants, &slots)?;
        let mut buffers = vec![(self.syms, 0), self.resolve(node, s.out)?];
        for &r in s.inputs.iter().chain(&s.writes).chain(&s.reads_after) {
            buffers.push(self.resolve(node, r)?);
        }
        let params = self.param_slot(&s.params)?;
        let key = BindKey {
            slots,
            params,
            buffers,
        };
        let bind_group = match self.bind_groups.get(&key) {
            Some(bg) => bg.clone(),
            None => {
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.params[params.0],
                        offset: params.1,
                        size: wgpu::BufferSize::new(PARAM_SLOT),
                    }),
                }];
                for (i, &(b, off)) in key.buffers.iter().enumerate() {
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &self.buffers[b],
                            offset: off,
                            size: None,
                        }),
                    });
                }
                let bg = self
                    .ctx
                    .scoped(|| {
                        self.ctx
                            .device
                            .create_bind_group(&wgpu::BindGroupDescriptor {
                                label: None,
                                layout: &pipeline.layout,
                                entries: &entries,
                            })
                    })
                    .map_err(|e| {
                        GpuError::Device(format!(
                            "node {node}: binding {} `{}`: {e}",
                            s.kernel, s.entry
                        ))
                    })?;
                self.bind_groups.insert(key, bg.clone());
                bg
            }
        };
        Ok(Dispatch {
            node,
            what: format!("{}:{}", s.kernel, s.entry),
            pipeline: pipeline.pipeline,
            bind_group,
            groups: s.groups,
        })
    }
}

/// A timestamp query set with its resolve and read-back buffers.
pub(crate) struct Stamps {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    count: u32,
}

impl Stamps {
    pub(crate) fn new(ctx: &Context, count: u32) -> Stamps {
        let bytes = count as u64 * 8;
        let buffer = |usage| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamps"),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Stamps {
            set: ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count,
            }),
            resolve: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            read: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            count,
        }
    }

    pub(crate) fn writes(&self, first: u32) -> wgpu::ComputePassTimestampWrites<'_> {
        wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(first),
            end_of_pass_write_index: Some(first + 1),
        }
    }

    pub(crate) fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        enc.resolve_query_set(&self.set, 0..self.count, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, self.count as u64 * 8);
    }

    /// The timestamps, after the submit that resolved them.
    pub(crate) fn read(&self, ctx: &Context) -> Result<Vec<u64>, GpuError> {
        Ok(bytemuck::pod_collect_to_vec(&read_back(ctx, &self.read)?))
    }
}

/// What `run_candidates` asks of a call: output `output`'s last row reduced to its sampling
/// candidates for `k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CandidateRequest {
    output: usize,
    k: usize,
    /// The graph input that the call's pick is copied into, for a next call fed it.
    feed: Option<usize>,
    /// A sampled pick's temperature, top-p and min-p (f32 bits); `None`: greedy where k = 1.
    draw: Option<[u32; 3]>,
}

/// Words of the candidates buffer (kernels/candidates.wgsl's `c`): the count, the pairs, the
/// pick, the pick a fed call reads, the draw's uniform number, the blocks' maxima.
const CANDS_WORDS: u64 = (U_WORD + 1 + candidates::MAX_BLOCKS) as u64;
/// Where the pick lies in it (kernels/candidates.wgsl writes it at `1 + 2 * p.slots`), the pick
/// a fed call's token is copied from, and the draw's uniform number.
const PICK_WORD: usize = 1 + 2 * candidates::CAPACITY;
const FEED_WORD: usize = PICK_WORD + 1;
const U_WORD: usize = PICK_WORD + 2;

/// The candidates a call left: its count, then (id, logit bits) pairs, then the pick: greedy
/// for k = 1, else the draw's where the call drew.
fn read_candidates(bytes: &[u8], k: usize, drew: bool, cap: usize) -> Candidates {
    let word = |i: usize| {
        u32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ])
    };
    let found = word(0) as usize;
    let pairs = (0..found.min(cap))
        .map(|i| (word(1 + 2 * i), f32::from_bits(word(2 + 2 * i))))
        .collect();
    let pick = Some(word(PICK_WORD)).filter(|&w| w != u32::MAX);
    Candidates {
        pairs,
        found,
        k,
        first: pick.filter(|_| k == 1 && !drew),
        drawn: pick.filter(|_| drew),
    }
}

/// The bytes of a MAP_READ buffer, after the submit that filled it.
pub(crate) fn read_back(ctx: &Context, buffer: &wgpu::Buffer) -> Result<Vec<u8>, GpuError> {
    let slice = buffer.slice(..);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| GpuError::Device(e.to_string()))?;
    match rx.recv() {
        Ok(Ok(())) => {}
        _ => return Err(GpuError::Device("reading a buffer back failed".into())),
    }
    let v = slice
        .get_mapped_range()
        .map_err(|e| GpuError::Device(format!("reading a buffer back: {e}")))?
        .to_vec();
    buffer.unmap();
    Ok(v)
}
