//! Delegates executed through the IR: a front end lowers the blob to an `ir::Graph`, an IR
//! executor (CPU reference or GPU) runs it, and this adapter moves values between the method's
//! memory and the graph's inputs and outputs.

use super::candidates::DevicePick;
use super::{Backend, Candidates, DelegateExecutor, HostTensor, Memory, Value};
use crate::ir::{self, Io};
use crate::pte::{BackendDelegate, NamedData};
use crate::runtime::tensor::{from_f64, from_i64, to_f64, to_i64};
use std::sync::Arc;

/// Turns one delegate format into the IR.
pub trait FrontEnd: Send + Sync {
    /// The backend id the format is registered under (`VulkanBackend`, …).
    fn backend_id(&self) -> &'static str;
    fn lower(&self, delegate: &BackendDelegate, named: &NamedData) -> Result<ir::Graph, String>;
    /// Every operator of the blob that `lower` has no lowering for (empty if unknown).
    fn unsupported_ops(&self, _delegate: &BackendDelegate, _named: &NamedData) -> Vec<String> {
        Vec::new()
    }
}

/// Runs IR graphs; implemented by the CPU executor and the GPU executor.
pub trait IrExecutor: Send {
    fn run(&mut self, inputs: &[ir::InputValue]) -> Result<Vec<HostTensor>, String>;

    /// `run` for a caller that copies the outputs on: the CPU executor lends its values
    /// instead of encoding each into a new buffer first (a demo model prefill's attention
    /// products are 72 MiB a layer).
    fn run_outputs(&mut self, inputs: &[ir::InputValue]) -> Result<Vec<RunOutput>, String> {
        Ok(self.run(inputs)?.into_iter().map(RunOutput::Host).collect())
    }

    /// Whether `run_candidates` can reduce output `output`.
    fn candidates_supported(&self, _output: usize) -> bool {
        false
    }

    /// A call as `run` makes it, with output `output`'s last row handed back as its sampling
    /// candidates for `k` (`runtime::candidates`) and an empty tensor in its place; `None`
    /// where this executor cannot.
    fn run_candidates(
        &mut self,
        _inputs: &[ir::InputValue],
        _output: usize,
        _k: usize,
    ) -> Option<CandidateRun> {
        None
    }

    /// Output `output` of the last call in full (what `run_candidates` left out).
    fn read_output(&mut self, output: usize) -> Result<HostTensor, String> {
        Err(format!(
            "output {output}: this executor hands back every output with its call"
        ))
    }

    /// Whether `start_candidates` can feed input `input` a call's greedy pick.
    fn feed_supported(&self, _input: usize) -> bool {
        false
    }

    /// Submits a call as `run_candidates` makes it without waiting for it (see
    /// `GpuExecutor::start_candidates`: `pick` chains decode steps on the device); `None` where
    /// this executor cannot.
    fn start_candidates(
        &mut self,
        _inputs: &[ir::InputValue],
        _output: usize,
        _k: usize,
        _pick: Option<DevicePick>,
    ) -> Option<Result<(), String>> {
        None
    }

    /// The oldest started call's outputs and candidates.
    fn finish_candidates(&mut self) -> CandidateRun {
        Err("this executor starts no calls".into())
    }
}

impl IrExecutor for ir::cpu::CpuExecutor {
    fn run(&mut self, inputs: &[ir::InputValue]) -> Result<Vec<HostTensor>, String> {
        ir::cpu::CpuExecutor::run(self, inputs).map_err(|e| e.to_string())
    }

    fn run_outputs(&mut self, inputs: &[ir::InputValue]) -> Result<Vec<RunOutput>, String> {
        let outs = self.run_shared(inputs).map_err(|e| e.to_string())?;
        Ok(outs.into_iter().map(RunOutput::Cpu).collect())
    }
}

/// An output of `IrExecutor::run_outputs`.
pub enum RunOutput {
    Host(HostTensor),
    Cpu(ir::cpu::CpuOutput),
}

impl RunOutput {
    fn parts(&self) -> (ir::DType, &[usize], std::borrow::Cow<'_, [u8]>) {
        match self {
            RunOutput::Host(h) => (h.dtype, &h.sizes, h.data.as_slice().into()),
            RunOutput::Cpu(c) => (c.dtype, &c.sizes, c.bytes()),
        }
    }
}

/// A call's outputs (the reduced one empty) and that output's candidates.
pub type CandidateRun = Result<(Vec<HostTensor>, Candidates), String>;

/// Builds an executor for a lowered graph (the device choice lives here, not in front ends).
pub type ExecutorFactory =
    Arc<dyn Fn(ir::Graph) -> Result<Box<dyn IrExecutor>, String> + Send + Sync>;

/// The CPU reference executor factory.
pub fn cpu_executor() -> ExecutorFactory {
    Arc::new(|g| {
        Ok(
            Box::new(ir::cpu::CpuExecutor::new(g).map_err(|e| e.to_string())?)
                as Box<dyn IrExecutor>,
        )
    })
}

/// A backend that lowers through `front` and executes with `make`.
pub struct IrBackend {
    front: Arc<dyn FrontEnd>,
    make: ExecutorFactory,
}

impl IrBackend {
    pub fn new(front: Arc<dyn FrontEnd>, make: ExecutorFactory) -> Self {
        IrBackend { front, make }
    }
}

impl Backend for IrBackend {
    fn id(&self) -> &str {
        self.front.backend_id()
    }

    fn unsupported_ops(&self, delegate: &BackendDelegate, named: &NamedData) -> Vec<String> {
        self.front.unsupported_ops(delegate, named)
    }

    fn lower(
        &self,
        delegate: &BackendDelegate,
        named: &NamedData,
    ) -> Option<Result<ir::Graph, String>> {
        Some(self.front.lower(delegate, named).and_then(|g| {
            g.validate().map_err(|e| e.to_string())?;
            Ok(g)
        }))
    }

    fn init(
        &self,
        delegate: &BackendDelegate,
        named: &NamedData,
    ) -> Result<Box<dyn DelegateExecutor>, String> {
        self.init_graph(self.front.lower(delegate, named)?)
    }

    fn init_graph(&self, mut graph: ir::Graph) -> Result<Box<dyn DelegateExecutor>, String> {
        ir::passes::finish(&mut graph);
        graph.validate().map_err(|e| e.to_string())?;
        let inputs = graph.inputs.clone();
        let outputs: Vec<(ir::DType, usize)> = graph
            .outputs
            .iter()
            .map(|&t| (graph.tensors[t].dtype, t))
            .collect();
        let input_dtypes: Vec<Option<ir::DType>> = inputs
            .iter()
            .map(|io| match io {
                Io::Tensor(t) => Some(graph.tensors[*t].dtype),
                Io::Sym(_) => None,
            })
            .collect();
        // A one-element argument fits a one-element input of any rank (XNNPACK, for one, declares
        // 0-dim tensors as [1]).
        let scalar_shapes: Vec<Option<Vec<usize>>> = inputs
            .iter()
            .map(|io| match io {
                Io::Tensor(t) if graph.tensors[*t].max_numel() == 1 => {
                    Some(graph.tensors[*t].max_shape.clone())
                }
                _ => None,
            })
            .collect();
        // Symbol outputs are host values: a copy of the graph (constants are shared views)
        // re-derives them from the call's inputs, the same way the executor does.
        let sym_graph = (!graph.sym_outputs.is_empty()).then(|| graph.clone());
        let exec = (self.make)(graph)?;
        Ok(Box::new(IrDelegate {
            exec,
            input_dtypes,
            scalar_shapes,
            n_outputs: outputs.len(),
            sym_graph,
        }))
    }
}

struct IrDelegate {
    exec: Box<dyn IrExecutor>,
    input_dtypes: Vec<Option<ir::DType>>,
    scalar_shapes: Vec<Option<Vec<usize>>>,
    /// Tensor outputs only.
    n_outputs: usize,
    sym_graph: Option<ir::Graph>,
}

/// The bytes in `to`'s dtype; a view when the dtypes already agree (a KV cache handed to an
/// attention delegate every step is not copied on the way in).
fn convert(bytes: &[u8], from: ir::DType, to: ir::DType) -> std::borrow::Cow<'_, [u8]> {
    if from == to {
        bytes.into()
    } else if from.is_float() || to.is_float() {
        from_f64(to, &to_f64(from, bytes)).into()
    } else {
        // Vulkan programs take int64 token ids and positions narrowed to int32.
        from_i64(to, &to_i64(from, bytes)).into()
    }
}

impl DelegateExecutor for IrDelegate {
    fn execute(&mut self, mem: &mut Memory, args: &[usize]) -> Result<(), String> {
        let n_in = self.input_dtypes.len();
        let n_syms = self.sym_graph.as_ref().map_or(0, |g| g.sym_outputs.len());
        if args.len() != n_in + self.n_outputs + n_syms {
            return Err(format!(
                "delegate call has {} arguments; the graph has {n_in} inputs and {} outputs",
                args.len(),
                self.n_outputs + n_syms
            ));
        }
        let mut owned: Vec<(Vec<usize>, std::borrow::Cow<[u8]>)> = Vec::new();
        let mut syms: Vec<Option<i64>> = Vec::new();
        for (k, (&id, dt)) in args[..n_in].iter().zip(&self.input_dtypes).enumerate() {
            match (dt, &mem.values[id]) {
                (Some(dt), Value::Tensor(t)) => {
                    let b = mem.bytes(t)?;
                    let sizes = match &self.scalar_shapes[k] {
                        Some(s) if t.numel() == 1 => s.clone(),
                        _ => t.sizes.clone(),
                    };
                    owned.push((sizes, convert(b, t.dtype, *dt)));
                    syms.push(None);
                }
                (None, Value::Int(v)) => {
                    owned.push((vec![], Default::default()));
                    syms.push(Some(*v));
                }
                (None, Value::Tensor(t)) if t.numel() == 1 => {
                    let v = to_i64(t.dtype, mem.bytes(t)?)[0];
                    owned.push((vec![], Default::default()));
                    syms.push(Some(v));
                }
                (_, v) => {
                    return Err(format!(
                        "delegate input {k} is a {}, which the graph cannot take there",
                        v.kind()
                    ))
                }
            }
        }
        let inputs: Vec<ir::InputValue> = owned
            .iter()
            .zip(&syms)
            .map(|((shape, data), s)| match s {
                Some(v) => ir::InputValue::Sym(*v),
                None => ir::InputValue::Tensor {
                    shape: shape.clone(),
                    data,
                },
            })
            .collect();
        let outs = self.exec.run_outputs(&inputs)?;
        let sym_plan = match &self.sym_graph {
            Some(g) => Some(ir::infer_shapes(g, &inputs).map_err(|e| e.to_string())?),
            None => None,
        };
        // The inputs borrow the method's memory, which the outputs now write.
        drop(inputs);
        drop(owned);
        let mut out_ids: Vec<usize> = args[n_in..].to_vec();
        if let (Some(g), Some(plan)) = (&self.sym_graph, sym_plan) {
            for &(k, s) in &g.sym_outputs {
                mem.values[out_ids[k]] = Value::Int(plan.syms[s]);
            }
            let syms: Vec<usize> = g.sym_outputs.iter().map(|&(k, _)| k).collect();
            out_ids = (0..out_ids.len())
                .filter(|k| !syms.contains(k))
                .map(|k| out_ids[k])
                .collect();
        }
        for (out, &id) in outs.iter().zip(&out_ids) {
            let t = mem.tensor(id)?.clone();
            let (dtype, sizes, bytes) = out.parts();
            let data = convert(&bytes, dtype, t.dtype);
            let mut ctx = super::kernels::KernelCtx::new(mem, std::slice::from_ref(&id));
            ctx.write(0, sizes, &data)?;
        }
        Ok(())
    }
}

impl IrExecutor for crate::gpu::GpuExecutor {
    fn run(&mut self, inputs: &[ir::InputValue]) -> Result<Vec<HostTensor>, String> {
        crate::gpu::GpuExecutor::run(self, inputs).map_err(|e| e.to_string())
    }

    fn candidates_supported(&self, output: usize) -> bool {
        self.candidates_check(output).is_ok()
    }

    fn run_candidates(
        &mut self,
        inputs: &[ir::InputValue],
        output: usize,
        k: usize,
    ) -> Option<CandidateRun> {
        Some(
            crate::gpu::GpuExecutor::run_candidates(self, inputs, output, k)
                .map_err(|e| e.to_string()),
        )
    }

    fn read_output(&mut self, output: usize) -> Result<HostTensor, String> {
        crate::gpu::GpuExecutor::read_output(self, output).map_err(|e| e.to_string())
    }

    fn feed_supported(&self, input: usize) -> bool {
        self.feed_check(input).is_ok()
    }

    fn start_candidates(
        &mut self,
        inputs: &[ir::InputValue],
        output: usize,
        k: usize,
        pick: Option<DevicePick>,
    ) -> Option<Result<(), String>> {
        Some(
            crate::gpu::GpuExecutor::start_candidates(self, inputs, output, k, pick)
                .map_err(|e| e.to_string()),
        )
    }

    fn finish_candidates(&mut self) -> CandidateRun {
        crate::gpu::GpuExecutor::finish_candidates(self).map_err(|e| e.to_string())
    }
}

/// The GPU executor factory on an opened device.
pub fn gpu_executor(ctx: Arc<crate::gpu::Context>) -> ExecutorFactory {
    gpu_executor_tallied(ctx, KvTally::default())
}

/// The KV caches that the GPU executors of one factory hold, and how many of them as f16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvCount {
    pub caches: usize,
    pub f16: usize,
}

impl KvCount {
    /// What a user who asked for f16 caches should hear when not all of them are: `None` when
    /// every cache is f16.
    pub fn f16_note(&self) -> Option<String> {
        match (self.caches, self.f16) {
            (0, _) => Some(
                "--kv f16: this program keeps no KV cache on the GPU (its caches live with CPU \
                 ops), so none is held as f16"
                    .into(),
            ),
            (n, f) if f < n => Some(format!(
                "--kv f16: {f} of the program's {n} KV caches on the GPU are f16; the others \
                 are written by ops other than cache updates and stay f32"
            )),
            _ => None,
        }
    }
}

/// Counts what `KvCount` says over the executors a factory makes (all the delegates of a load).
#[derive(Clone, Debug, Default)]
pub struct KvTally(Arc<std::sync::Mutex<KvCount>>);

impl KvTally {
    pub fn get(&self) -> KvCount {
        self.0.lock().map(|c| *c).unwrap_or_default()
    }

    fn add(&self, m: &crate::gpu::MemoryReport) {
        if let Ok(mut c) = self.0.lock() {
            c.caches += m.kv_caches;
            c.f16 += m.f16_kv_caches;
        }
    }
}

/// `gpu_executor` that adds each executor's KV caches to `tally`.
pub fn gpu_executor_tallied(ctx: Arc<crate::gpu::Context>, tally: KvTally) -> ExecutorFactory {
    Arc::new(move |g| {
        let e = crate::gpu::GpuExecutor::new(ctx.clone(), g).map_err(|e| e.to_string())?;
        tally.add(&e.memory());
        Ok(Box::new(e) as Box<dyn IrExecutor>)
    })
}

/// Where delegate graphs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The GPU when one opens, else the CPU.
    Auto,
    Cpu,
    Gpu,
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu),
            d => Err(format!("unknown device `{d}` (expected auto, cpu or gpu)")),
        }
    }
}

/// How the GPU executor holds KV caches (`--kv`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KvCache {
    /// The reference.
    #[default]
    F32,
    /// Half the bytes; never on unless asked for (its error against f32 is in the README).
    F16,
}

impl std::str::FromStr for KvCache {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(KvCache::F32),
            "f16" => Ok(KvCache::F16),
            k => Err(format!("unknown KV cache type `{k}` (expected f32 or f16)")),
        }
    }
}

/// Where the GPU executor keeps big embedding tables (`--tables`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tables {
    /// On the GPU where it is a discrete one with room for them (`catalog::tables_on_gpu`),
    /// else on the host.
    #[default]
    Auto,
    /// In host memory, their rows gathered on the host before each call (`gpu::host_gather`).
    Host,
    /// In GPU memory, as every other weight: more of it, but calls need no token on the host
    /// first, so decode steps can run one ahead (`llm::Runner`).
    Gpu,
}

impl std::str::FromStr for Tables {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Tables::Auto),
            "host" => Ok(Tables::Host),
            "gpu" => Ok(Tables::Gpu),
            t => Err(format!(
                "unknown table placement `{t}` (expected auto, host or gpu)"
            )),
        }
    }
}

/// The GPU context options that hold KV caches as `kv` says.
pub fn gpu_options(kv: KvCache) -> crate::gpu::ContextOptions {
    gpu_options_placed(kv, Tables::Host)
}

/// Opens the GPU with KV caches and big embedding tables as `kv` and `tables` say (`Auto`
/// decided on the adapter it opened).
pub fn open_gpu(kv: KvCache, tables: Tables) -> Result<crate::gpu::Context, crate::gpu::GpuError> {
    let mut ctx = crate::gpu::Context::with_options(gpu_options_placed(kv, tables))?;
    if tables == Tables::Auto && auto_tables_on_gpu(ctx.adapter()) {
        ctx.keep_tables_on_gpu();
    }
    Ok(ctx)
}

/// `Tables::Auto`'s choice for an opened adapter: its facts (kind, own memory) as the catalog's
/// probe reads them, matched by name.
fn auto_tables_on_gpu(adapter: &crate::gpu::AdapterSummary) -> bool {
    adapter.device_type == "discrete"
        && crate::catalog::probe()
            .gpus
            .iter()
            .any(|g| g.name == adapter.name && crate::catalog::tables_on_gpu(g))
}

/// `gpu_options`, with big embedding tables where `tables` says (`Auto` as on the host: `open_gpu`
/// decides it once the adapter is open).
pub fn gpu_options_placed(kv: KvCache, tables: Tables) -> crate::gpu::ContextOptions {
    crate::gpu::ContextOptions {
        f16_kv_cache: kv == KvCache::F16,
        host_gather_min_bytes: (tables == Tables::Gpu).then_some(u64::MAX),
        ..Default::default()
    }
}

/// Picks the executor for `device`. With `Auto` and no usable GPU, returns the CPU executor and
/// the one-line reason, for the caller to show.
pub fn executor_for(device: Device) -> Result<(ExecutorFactory, Option<String>), String> {
    executor_with(device, KvCache::F32)
}

/// `executor_for` with KV caches held as `kv`. f16 caches are a GPU executor option: asking for
/// them where the CPU executor would run is an error, never a silent f32.
pub fn executor_with(
    device: Device,
    kv: KvCache,
) -> Result<(ExecutorFactory, Option<String>), String> {
    executor_tallied(device, kv).map(|(make, note, _)| (make, note))
}

/// `executor_with`, and the tally of the KV caches its GPU executors hold (empty on the CPU).
pub fn executor_tallied(
    device: Device,
    kv: KvCache,
) -> Result<(ExecutorFactory, Option<String>, KvTally), String> {
    executor_placed(device, kv, Tables::Auto)
}

/// `executor_tallied`, with big embedding tables where `tables` says. Like f16 caches, tables
/// on the GPU are a GPU executor option: an error where the CPU executor would run.
pub fn executor_placed(
    device: Device,
    kv: KvCache,
    tables: Tables,
) -> Result<(ExecutorFactory, Option<String>, KvTally), String> {
    let tally = KvTally::default();
    let open = || open_gpu(kv, tables);
    let gpu = |ctx| gpu_executor_tallied(Arc::new(ctx), tally.clone());
    // Named in words the app shows too, with the command line's flag.
    let gpu_only = match (kv, tables) {
        (KvCache::F16, _) => Some("f16 KV caches (--kv f16)"),
        (_, Tables::Gpu) => Some("embedding tables in GPU memory (--tables gpu)"),
        _ => None,
    };
    let cpu = |why: String| match gpu_only {
        Some(what) => Err(format!("{what} need the GPU executor, but {why}")),
        None => Ok((cpu_executor(), Some(format!("running on the CPU: {why}")))),
    };
    let (make, note) = match device {
        Device::Cpu if gpu_only.is_some() => {
            return Err(format!(
                "{} need the GPU executor (--device gpu), not --device cpu",
                gpu_only.unwrap_or_default()
            ))
        }
        Device::Cpu => (cpu_executor(), None),
        Device::Gpu => (gpu(open().map_err(|e| format!("--device gpu: {e}"))?), None),
        // A software Vulkan driver (lavapipe) is slower than our CPU executor: auto skips it.
        Device::Auto => match open() {
            Ok(ctx) if !ctx.adapter().is_cpu() => (gpu(ctx), None),
            Ok(ctx) => cpu(format!(
                "the only GPU adapter, {}, is a software renderer",
                ctx.adapter().name
            ))?,
            Err(e) => cpu(e.to_string())?,
        },
    };
    Ok((make, note, tally))
}

/// A GPU executor that a benchmark can reach after the method owning it has run: it keeps its
/// last call's inputs so that call can be replayed under GPU timestamps.
pub struct ProfiledGpu {
    exec: crate::gpu::GpuExecutor,
    last: Vec<OwnedInput>,
}

enum OwnedInput {
    Tensor(Vec<usize>, Vec<u8>),
    Sym(i64),
}

/// The profiled executors a factory from [`profiled_gpu_executor`] has made, one per delegate.
pub type ProfiledHandles = Arc<std::sync::Mutex<Vec<Arc<std::sync::Mutex<ProfiledGpu>>>>>;

struct SharedGpu(Arc<std::sync::Mutex<ProfiledGpu>>);

impl IrExecutor for SharedGpu {
    fn run(&mut self, inputs: &[ir::InputValue]) -> Result<Vec<HostTensor>, String> {
        let mut p = self
            .0
            .lock()
            .map_err(|_| "GPU executor poisoned".to_string())?;
        p.last = owned_inputs(inputs);
        p.exec.run(inputs).map_err(|e| e.to_string())
    }

    fn candidates_supported(&self, output: usize) -> bool {
        self.0
            .lock()
            .is_ok_and(|p| p.exec.candidates_check(output).is_ok())
    }

    fn run_candidates(
        &mut self,
        inputs: &[ir::InputValue],
        output: usize,
        k: usize,
    ) -> Option<CandidateRun> {
        let mut p = match self.0.lock() {
            Ok(p) => p,
            Err(_) => return Some(Err("GPU executor poisoned".into())),
        };
        p.last = owned_inputs(inputs);
        Some(
            p.exec
                .run_candidates(inputs, output, k)
                .map_err(|e| e.to_string()),
        )
    }

    fn read_output(&mut self, output: usize) -> Result<HostTensor, String> {
        let mut p = self
            .0
            .lock()
            .map_err(|_| "GPU executor poisoned".to_string())?;
        p.exec.read_output(output).map_err(|e| e.to_string())
    }

    fn feed_supported(&self, input: usize) -> bool {
        self.0
            .lock()
            .is_ok_and(|p| p.exec.feed_check(input).is_ok())
    }

    fn start_candidates(
        &mut self,
        inputs: &[ir::InputValue],
        output: usize,
        k: usize,
        pick: Option<DevicePick>,
    ) -> Option<Result<(), String>> {
        let mut p = match self.0.lock() {
            Ok(p) => p,
            Err(_) => return Some(Err("GPU executor poisoned".into())),
        };
        p.last = owned_inputs(inputs);
        Some(
            p.exec
                .start_candidates(inputs, output, k, pick)
                .map_err(|e| e.to_string()),
        )
    }

    fn finish_candidates(&mut self) -> CandidateRun {
        let mut p = self
            .0
            .lock()
            .map_err(|_| "GPU executor poisoned".to_string())?;
        p.exec.finish_candidates().map_err(|e| e.to_string())
    }
}

fn owned_inputs(inputs: &[ir::InputValue]) -> Vec<OwnedInput> {
    inputs
        .iter()
        .map(|v| match v {
            ir::InputValue::Tensor { shape, data } => {
                OwnedInput::Tensor(shape.clone(), data.to_vec())
            }
            ir::InputValue::Sym(s) => OwnedInput::Sym(*s),
        })
        .collect()
}

impl ProfiledGpu {
    /// The last call's inputs for a replay; `None` before any call. A free-standing borrow of
    /// `last` so the executor can be borrowed mutably beside it.
    fn last_inputs(last: &[OwnedInput], takes_inputs: bool) -> Option<Vec<ir::InputValue<'_>>> {
        let inputs: Vec<ir::InputValue> = last
            .iter()
            .map(|v| match v {
                OwnedInput::Tensor(shape, data) => ir::InputValue::Tensor {
                    shape: shape.clone(),
                    data,
                },
                OwnedInput::Sym(s) => ir::InputValue::Sym(*s),
            })
            .collect();
        (!inputs.is_empty() || !takes_inputs).then_some(inputs)
    }

    /// GPU time per graph node of the last call, replayed; `None` without GPU timestamps.
    pub fn profile_last(&mut self) -> Result<Option<Vec<crate::gpu::OpTime>>, String> {
        let takes_inputs = !self.exec.graph().inputs.is_empty();
        let Some(inputs) = Self::last_inputs(&self.last, takes_inputs) else {
            return Ok(None);
        };
        self.exec.profile(&inputs).map_err(|e| e.to_string())
    }

    pub fn memory(&self) -> crate::gpu::MemoryReport {
        self.exec.memory()
    }

    pub fn stats(&self) -> crate::gpu::ExecutorStats {
        self.exec.stats()
    }

    /// GPU time of the last call's dispatches, replayed `reps` times back to back in one pass.
    pub fn time_last(&mut self, reps: u32) -> Result<Option<crate::gpu::ReplayTiming>, String> {
        let takes_inputs = !self.exec.graph().inputs.is_empty();
        let Some(inputs) = Self::last_inputs(&self.last, takes_inputs) else {
            return Ok(None);
        };
        // A benchmark knob: PTERIA_REPLAY_SKIP=kernel,entry,kernel:entry,... leaves those
        // dispatches out of the program's timed replays (`GpuExecutor::time_replays_skipping`);
        // the kernel benchmarks and the bandwidth yardstick never skip.
        let skip: Vec<String> = std::env::var("PTERIA_REPLAY_SKIP")
            .unwrap_or_default()
            .split(',')
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect();
        self.exec
            .time_replays_skipping(&inputs, reps, &skip)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    pub fn linear_weight_bytes(&self) -> u64 {
        self.exec.linear_weight_bytes()
    }
}

/// A GPU executor factory whose executors stay reachable through the returned handles.
pub fn profiled_gpu_executor(ctx: Arc<crate::gpu::Context>) -> (ExecutorFactory, ProfiledHandles) {
    let handles: ProfiledHandles = Arc::default();
    let made = handles.clone();
    let factory: ExecutorFactory = Arc::new(move |g| {
        let exec = crate::gpu::GpuExecutor::new(ctx.clone(), g).map_err(|e| e.to_string())?;
        let p = Arc::new(std::sync::Mutex::new(ProfiledGpu {
            exec,
            last: Vec::new(),
        }));
        made.lock()
            .map_err(|_| "executor list poisoned".to_string())?
            .push(p.clone());
        Ok(Box::new(SharedGpu(p)) as Box<dyn IrExecutor>)
    });
    (factory, handles)
}
