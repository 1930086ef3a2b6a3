//! The CPU reference runtime: loads a method from a validated `pte::Program` and executes its
//! instructions exactly as the ExecuTorch runtime does.
//!
//! Memory-planned tensors live in per-method arenas that persist across calls (so KV caches held
//! in mutable buffers survive), constants are zero-copy views of the file, kernels are looked up by
//! operator name in `kernels`, and delegate calls go through a `BackendRegistry`.

mod absorb;
pub mod candidates;
pub mod delegate;
pub mod kernels;
pub mod tensor;
pub mod whole;

pub use candidates::Candidates;
pub use tensor::{DType, HostTensor, Storage, Tensor, TensorIn};

/// ||a - b|| / ||b||, in f64: how far one run's outputs are from another's (the conformance
/// suites' and `pteria bench --kv f16`'s measure).
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

use crate::pte::{
    self, BackendDelegate, EValue, ExecutionPlan, Instruction, NamedData, Program, TensorData,
};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Program(#[from] pte::PteError),
    #[error("program has no method `{0}`")]
    NoMethod(String),
    #[error("method `{method}` uses operators this runtime does not implement: {ops}")]
    UnsupportedOps { method: String, ops: String },
    #[error("method `{method}` delegates to backend `{backend}`, which is not supported yet")]
    UnsupportedBackend { method: String, backend: String },
    #[error("input {index} of method `{method}`: {msg}")]
    BadInput {
        method: String,
        index: usize,
        msg: String,
    },
    #[error("method `{method}`, instruction {instr} ({op}): {msg}")]
    Kernel {
        method: String,
        instr: usize,
        op: String,
        msg: String,
    },
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, RuntimeError>;

/// A runtime value: the live form of an `EValue`.
#[derive(Debug, Clone)]
pub enum Value {
    None,
    Int(i64),
    Bool(bool),
    Double(f64),
    String(String),
    Tensor(Tensor),
    IntList(Vec<usize>),
    DoubleList(Vec<f64>),
    BoolList(Vec<bool>),
    TensorList(Vec<usize>),
    OptionalTensorList(Vec<Option<usize>>),
}

impl Value {
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Int(_) => "Int",
            Value::Bool(_) => "Bool",
            Value::Double(_) => "Double",
            Value::String(_) => "String",
            Value::Tensor(_) => "Tensor",
            Value::IntList(_) => "IntList",
            Value::DoubleList(_) => "DoubleList",
            Value::BoolList(_) => "BoolList",
            Value::TensorList(_) => "TensorList",
            Value::OptionalTensorList(_) => "OptionalTensorList",
        }
    }
}

/// What a method call hands back: tensors copied out of the arenas, or scalars.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Tensor(HostTensor),
    Int(i64),
    Bool(bool),
    Double(f64),
    String(String),
    IntList(Vec<i64>),
    None,
}

/// Method memory: the values, their arenas, and the buffers that hold method inputs.
pub struct Memory {
    pub values: Vec<Value>,
    pub arenas: Vec<Vec<u8>>,
    /// Storage for inputs the program did not plan (LLM exports use `alloc_graph_input=False`).
    pub inputs: Vec<Vec<u8>>,
}

impl Memory {
    pub fn tensor(&self, id: usize) -> std::result::Result<&Tensor, String> {
        match self.values.get(id) {
            Some(Value::Tensor(t)) => Ok(t),
            Some(v) => Err(format!("value {id} is a {}, expected a Tensor", v.kind())),
            None => Err(format!("value {id} does not exist")),
        }
    }

    /// The current bytes of a tensor (sized to its current shape).
    pub fn bytes<'a>(&'a self, t: &'a Tensor) -> std::result::Result<&'a [u8], String> {
        let n = t.nbytes();
        let all: &[u8] = match &t.storage {
            Storage::Constant(b) => b,
            Storage::Arena { arena, offset } => self
                .arenas
                .get(*arena)
                .and_then(|a| a.get(*offset..))
                .ok_or("tensor lies outside its arena")?,
            Storage::Input(i) => self
                .inputs
                .get(*i)
                .ok_or("tensor's input buffer is missing")?,
            Storage::Unset => {
                return Err("tensor has no data yet (an input that was not set?)".into())
            }
        };
        all.get(..n)
            .ok_or_else(|| format!("tensor of {n} bytes exceeds its {}-byte storage", all.len()))
    }

    pub fn bytes_mut(&mut self, t: &Tensor) -> std::result::Result<&mut [u8], String> {
        let n = t.nbytes();
        let all: &mut [u8] = match &t.storage {
            Storage::Constant(_) => return Err("cannot write into a constant tensor".into()),
            Storage::Arena { arena, offset } => self
                .arenas
                .get_mut(*arena)
                .and_then(|a| a.get_mut(*offset..))
                .ok_or("tensor lies outside its arena")?,
            Storage::Input(i) => self
                .inputs
                .get_mut(*i)
                .ok_or("tensor's input buffer is missing")?,
            Storage::Unset => return Err("tensor has no storage".into()),
        };
        let len = all.len();
        all.get_mut(..n)
            .ok_or_else(|| format!("tensor of {n} bytes exceeds its {len}-byte storage"))
    }
}

/// An initialised delegate, ready to run its part of a method.
pub trait DelegateExecutor: Send {
    /// `args` are the value ids of the delegate's inputs followed by its outputs.
    fn execute(&mut self, mem: &mut Memory, args: &[usize]) -> std::result::Result<(), String>;
}

/// A backend turns a delegate blob into an executor.
pub trait Backend: Send + Sync {
    fn id(&self) -> &str;
    fn init(
        &self,
        delegate: &BackendDelegate,
        named_data: &NamedData,
    ) -> std::result::Result<Box<dyn DelegateExecutor>, String>;
    /// The operators in `delegate` this backend cannot run, every one of them (empty when it
    /// can run them all, or cannot tell without `init`), so that a load error lists them all.
    fn unsupported_ops(&self, _delegate: &BackendDelegate, _named_data: &NamedData) -> Vec<String> {
        Vec::new()
    }
    /// Initialises from `graph`: this backend's own `lower` of a delegate, which the runtime
    /// may have extended (`absorb`). Only asked of backends whose `lower` gives a graph.
    fn init_graph(
        &self,
        _graph: crate::ir::Graph,
    ) -> std::result::Result<Box<dyn DelegateExecutor>, String> {
        Err(format!("backend `{}` does not run IR graphs", self.id()))
    }
    /// The delegate as an IR graph, for backends that run through the IR (`None` otherwise);
    /// whole-method lowering joins these.
    fn lower(
        &self,
        _delegate: &BackendDelegate,
        _named_data: &NamedData,
    ) -> Option<std::result::Result<crate::ir::Graph, String>> {
        None
    }
}

/// Backends by id; a delegate whose id is not registered is a load-time error.
#[derive(Default, Clone)]
pub struct BackendRegistry {
    backends: BTreeMap<String, Arc<dyn Backend>>,
    /// Runs a whole method lowered into one IR graph (`whole`), when set: then a method whose
    /// delegates and glue ops all lower runs as one graph instead of delegate by delegate.
    whole_method: Option<delegate::ExecutorFactory>,
}

impl BackendRegistry {
    pub fn set_whole_method(&mut self, make: Option<delegate::ExecutorFactory>) {
        self.whole_method = make;
    }
    pub fn whole_method(&self) -> Option<&delegate::ExecutorFactory> {
        self.whole_method.as_ref()
    }
    pub fn register(&mut self, b: Arc<dyn Backend>) {
        self.backends.insert(b.id().to_string(), b);
    }
    pub fn get(&self, id: &str) -> Option<&Arc<dyn Backend>> {
        self.backends.get(id)
    }
    pub fn ids(&self) -> Vec<String> {
        self.backends.keys().cloned().collect()
    }
}

enum Step {
    Kernel(kernels::KernelFn, String, Vec<usize>),
    Delegate(usize, Vec<usize>),
    Move(usize, usize),
    JumpFalse(usize, usize),
    Free,
}

/// Kernels that read their argument 0 into a new tensor (no view of it) and write only their
/// last arguments.
const COPYING_READS: &[&str] = &[
    "aten::slice_copy.Tensor_out",
    "aten::select_copy.int_out",
    "aten::permute_copy.out",
    "aten::index_select.out",
    "aten::clone.out",
];

/// Functionalised exports update a KV cache as `new = slice_scatter(cache, src, ..)`, read
/// `new`, and `copy_(cache, new)` at the end: two copies of the cache a layer and step. Where
/// nothing else can see the difference, the scatter writes the cache in place (its out value
/// becomes the cache) and the copy-back goes: the cache is referenced only by that pair and by
/// copying reads before it, `new` by copying reads between them and nothing after (nor is it
/// an output), and the method has no control flow.
fn scatter_in_place(steps: &mut [Step], mem: &Memory, outputs: &[usize]) -> usize {
    if steps
        .iter()
        .any(|s| matches!(s, Step::Move(..) | Step::JumpFalse(..)))
    {
        return 0;
    }
    fn args(s: &Step) -> &[usize] {
        match s {
            Step::Kernel(_, _, a) | Step::Delegate(_, a) => a,
            _ => &[],
        }
    }
    fn op(s: &Step) -> Option<&str> {
        match s {
            Step::Kernel(_, op, _) => Some(op),
            _ => None,
        }
    }
    let copying_read = |s: &Step, v: usize| {
        let (Some(op), a) = (op(s), args(s)) else {
            return false;
        };
        COPYING_READS.contains(&op) && a.first() == Some(&v) && a.iter().skip(1).all(|&x| x != v)
    };
    let same_layout = |a: usize, b: usize| match (mem.values.get(a), mem.values.get(b)) {
        (Some(Value::Tensor(x)), Some(Value::Tensor(y))) => {
            x.dtype == y.dtype
                && x.max_bytes == y.max_bytes
                && x.is_contiguous()
                && y.is_contiguous()
                && matches!(x.storage, tensor::Storage::Arena { .. })
        }
        _ => false,
    };
    let mut rewrites = Vec::new();
    for i in 0..steps.len() {
        let a = args(&steps[i]);
        if op(&steps[i]) != Some("aten::slice_scatter.out") || a.len() != 8 {
            continue;
        }
        let (cache, out) = (a[0], a[6]);
        if a[7] != out
            || a[1] == cache
            || a[1] == out
            || outputs.contains(&out)
            || !same_layout(cache, out)
        {
            continue;
        }
        let Some(c) = (i + 1..steps.len()).find(|&j| args(&steps[j]).contains(&cache)) else {
            continue;
        };
        let ca = args(&steps[c]);
        if op(&steps[c]) != Some("aten::copy_")
            || ca.len() != 4
            || ca[0] != cache
            || ca[1] != out
            || ca[3] != cache
        {
            continue;
        }
        let ok = steps.iter().enumerate().all(|(j, s)| {
            let a = args(s);
            let (has_cache, has_out) = (a.contains(&cache), a.contains(&out));
            match j {
                _ if j == i || j == c => true,
                _ if j < i => !has_out && (!has_cache || copying_read(s, cache)),
                _ if j < c => !has_cache && (!has_out || copying_read(s, out)),
                _ => !has_cache && !has_out,
            }
        });
        if ok {
            rewrites.push((i, c));
        }
    }
    for &(i, c) in &rewrites {
        if let Step::Kernel(f, op, _) = &mut steps[i] {
            *f = kernels::slice_scatter_in_place;
            op.push_str(" (in place)");
        }
        steps[c] = Step::Free;
    }
    rewrites.len()
}

/// A loaded method: its memory persists across `execute` calls.
pub struct Method {
    pub plan: ExecutionPlan,
    mem: Memory,
    steps: Vec<Step>,
    delegates: Vec<Box<dyn DelegateExecutor>>,
    /// The whole method as one IR graph, when it lowered (then `delegates` is empty).
    whole: Option<Box<dyn delegate::IrExecutor>>,
    /// Why the method runs delegate by delegate although whole-method execution was asked for.
    whole_note: Option<String>,
    trace: Option<TraceHook>,
    /// Cache writes (`slice_scatter` + `copy_`) done in place (`scatter_in_place`).
    scatters_in_place: usize,
    means_absorbed: usize,
}

/// Called after each instruction with (instruction index, operator key, memory, args); used by
/// differential debugging tools to compare intermediate values with another runtime.
pub type TraceHook = Box<dyn FnMut(usize, &str, &Memory, &[usize]) + Send>;

/// Keeps glibc from handing every large temporary back to the OS. The CPU paths allocate
/// megabytes per op (the demo model's attention products are 2.4 MB a decode step and 38 MB in
/// a 16-token prompt); at glibc's defaults those come from fresh mmaps or a re-grown heap each
/// time, zeroed page by page: 5.4 M page faults in a 16-token prompt and 8 decode steps, about
/// half the time. Freed chunks now stay in the heap for the next call; `malloc_trim` (after a
/// GPU load) still returns them. One arena: a thread's own arena grows in heaps of 64 MiB and
/// maps anything larger afresh, so an engine thread faulted as before (`pteria generate`: 9.6
/// -> 4.2 s). Binaries call this first, before they start threads; loading a method calls it too.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only changes the allocator's thresholds; it is thread-safe.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
                libc::mallopt(libc::M_ARENA_MAX, 1);
            }
        });
    }
}

/// How many `mean.out` calls a delegate-by-delegate load of `plan` runs inside the delegates
/// whose products they read (`absorb`), for `inspect`.
pub fn means_absorbed(
    plan: &ExecutionPlan,
    named: &NamedData,
    backends: &BackendRegistry,
) -> usize {
    let mut graphs: Vec<Option<crate::ir::Graph>> = plan
        .delegates
        .iter()
        .map(|d| backends.get(&d.id)?.lower(d, named)?.ok())
        .collect();
    absorb::absorb_means(plan, &mut graphs).len()
}

impl Method {
    pub fn load(program: &Program, name: &str, backends: &BackendRegistry) -> Result<Method> {
        tune_allocator();
        let plan = program
            .plan(name)
            .ok_or_else(|| RuntimeError::NoMethod(name.to_string()))?
            .clone();

        // Resolve every kernel first so one error lists all missing operators.
        let mut missing = Vec::new();
        let mut op_fns = Vec::new();
        for op in &plan.operators {
            let key = op.key();
            match kernels::lookup(&key) {
                Some(f) => op_fns.push(Some(f)),
                None => {
                    if !missing.contains(&key) {
                        missing.push(key);
                    }
                    op_fns.push(None)
                }
            }
        }
        // Only operators actually called count as missing.
        let used: std::collections::BTreeSet<usize> = plan
            .instructions
            .iter()
            .filter_map(|i| match i {
                Instruction::Kernel { op, .. } => Some(*op),
                _ => None,
            })
            .collect();
        missing.retain(|k| used.iter().any(|&o| plan.operators[o].key() == *k));
        let mut problems: Vec<String> = missing
            .iter()
            .map(|k| format!("{k} (CPU kernel)"))
            .collect();
        // Every delegate's unsupported operators too, before any (slow) delegate init.
        let mut in_delegates: BTreeMap<(String, String), usize> = BTreeMap::new();
        for d in &plan.delegates {
            if let Some(b) = backends.get(&d.id) {
                for op in b.unsupported_ops(d, &program.named_data) {
                    *in_delegates.entry((d.id.clone(), op)).or_default() += 1;
                }
            }
        }
        for ((backend, op), n) in &in_delegates {
            let times = if *n > 1 {
                format!(", {n} delegates")
            } else {
                String::new()
            };
            problems.push(format!("{op} ({backend}{times})"));
        }
        if !problems.is_empty() {
            return Err(RuntimeError::UnsupportedOps {
                method: name.to_string(),
                ops: problems.join(", "),
            });
        }

        let (mut whole, mut whole_note) = (None, None);
        if let Some(make) = backends.whole_method() {
            if !plan.delegates.is_empty() {
                match whole::lower_method(&plan, &program.named_data, backends)
                    .and_then(|g| make(g))
                {
                    Ok(e) => whole = Some(e),
                    Err(why) => whole_note = Some(why),
                }
            }
        }
        let mut delegates = Vec::new();
        let mut absorbed = Vec::new();
        if whole.is_none() {
            let failed = |d: &BackendDelegate, msg: String| {
                RuntimeError::Other(format!(
                    "method `{name}`: backend `{}` failed to load: {msg}",
                    d.id
                ))
            };
            let mut found = Vec::new();
            let mut graphs = Vec::new();
            for d in &plan.delegates {
                let backend =
                    backends
                        .get(&d.id)
                        .ok_or_else(|| RuntimeError::UnsupportedBackend {
                            method: name.to_string(),
                            backend: d.id.clone(),
                        })?;
                let graph = match backend.lower(d, &program.named_data) {
                    Some(g) => Some(g.map_err(|msg| failed(d, msg))?),
                    None => None,
                };
                found.push(backend);
                graphs.push(graph);
            }
            absorbed = absorb::absorb_means(&plan, &mut graphs);
            for ((d, backend), graph) in plan.delegates.iter().zip(found).zip(graphs) {
                let exec = match graph {
                    Some(g) => backend.init_graph(g),
                    None => backend.init(d, &program.named_data),
                };
                delegates.push(exec.map_err(|msg| failed(d, msg))?);
            }
        }

        let mut arenas = Vec::with_capacity(plan.arena_sizes.len());
        for &s in &plan.arena_sizes {
            // Sizes were bounded by `pte::Limits` at parse time; zeroed allocation maps pages lazily.
            arenas.push(vec![0u8; s]);
        }
        let mut mem = Memory {
            values: Vec::with_capacity(plan.values.len()),
            arenas,
            inputs: Vec::new(),
        };
        for v in &plan.values {
            let val = match v {
                EValue::Null => Value::None,
                EValue::Int(i) => Value::Int(*i),
                EValue::Bool(b) => Value::Bool(*b),
                EValue::Double(d) => Value::Double(*d),
                EValue::String(s) => Value::String(s.clone()),
                EValue::IntList(l) => Value::IntList(l.clone()),
                EValue::DoubleList(l) => Value::DoubleList(l.clone()),
                EValue::BoolList(l) => Value::BoolList(l.clone()),
                EValue::TensorList(l) => Value::TensorList(l.clone()),
                EValue::OptionalTensorList(l) => Value::OptionalTensorList(l.clone()),
                EValue::Tensor(t) => {
                    let storage = match &t.data {
                        TensorData::Constant(b) => Storage::Constant(b.clone()),
                        TensorData::Planned {
                            arena,
                            offset,
                            initial,
                        } => {
                            if let Some(init) = initial {
                                // Mutable buffers with an initial state start from the file's bytes.
                                let dst = &mut mem.arenas[*arena][*offset..*offset + init.len()];
                                dst.copy_from_slice(init);
                            }
                            Storage::Arena {
                                arena: *arena,
                                offset: *offset,
                            }
                        }
                        TensorData::Runtime => Storage::Unset,
                    };
                    let dtype = DType::from_scalar(t.dtype).ok_or_else(|| {
                        RuntimeError::Other(format!(
                            "method `{name}`: tensors of type {} are not supported by the CPU runtime",
                            t.dtype
                        ))
                    });
                    // Tensors of exotic dtypes are fine as long as no kernel touches them.
                    let dtype = dtype.unwrap_or(DType::U8);
                    Value::Tensor(Tensor {
                        dtype,
                        sizes: t.sizes.clone(),
                        max_bytes: t.nbytes(),
                        dim_order: t.dim_order.clone(),
                        storage,
                    })
                }
            };
            mem.values.push(val);
        }

        let mut steps: Vec<Step> = plan
            .instructions
            .iter()
            .map(|i| match i {
                Instruction::Kernel { op, args } => Step::Kernel(
                    op_fns[*op].expect("resolved above"),
                    plan.operators[*op].key(),
                    args.clone(),
                ),
                Instruction::Delegate { delegate, args } => Step::Delegate(*delegate, args.clone()),
                Instruction::Move { from, to } => Step::Move(*from, *to),
                Instruction::JumpFalse { cond, dest } => Step::JumpFalse(*cond, *dest),
                Instruction::Free { .. } => Step::Free,
            })
            .collect();
        for a in &absorbed {
            if let Step::Delegate(_, args) = &mut steps[a.call] {
                args[a.arg] = a.value;
            }
            steps[a.mean] = Step::Free;
        }
        let scatters_in_place = scatter_in_place(&mut steps, &mem, &plan.outputs);

        Ok(Method {
            plan,
            mem,
            steps,
            delegates,
            whole,
            whole_note,
            trace: None,
            scatters_in_place,
            means_absorbed: absorbed.len(),
        })
    }

    pub fn name(&self) -> &str {
        &self.plan.name
    }

    /// `mean.out` instructions taken into the delegates whose products they read (`absorb`).
    pub fn means_absorbed(&self) -> usize {
        self.means_absorbed
    }

    /// Buffer updates (`slice_scatter` then `copy_` back) the CPU runtime does in place.
    pub fn scatters_in_place(&self) -> usize {
        self.scatters_in_place
    }

    /// Whether a call runs as one IR graph (all delegates and the ops between them).
    pub fn runs_whole(&self) -> bool {
        self.whole.is_some()
    }

    /// Why the method runs delegate by delegate although whole-method execution was available.
    pub fn whole_note(&self) -> Option<&str> {
        self.whole_note.as_deref()
    }

    /// Per-instruction traces need the per-delegate path: a method loaded whole ignores the hook.
    pub fn set_trace(&mut self, hook: Option<TraceHook>) {
        self.trace = hook;
    }

    /// Input tensors' declared (dtype, upper-bound sizes).
    pub fn input_specs(&self) -> Vec<(DType, Vec<usize>)> {
        self.plan
            .inputs
            .iter()
            .filter_map(|&i| match &self.mem.values[i] {
                Value::Tensor(t) => Some((t.dtype, t.sizes.clone())),
                _ => None,
            })
            .collect()
    }

    /// Runs the method. Tensor inputs must match the declared dtype and fit the declared bounds.
    pub fn execute(&mut self, inputs: &[HostTensor]) -> Result<Vec<Output>> {
        Ok(self.execute_inner(inputs, None)?.0)
    }

    /// Whether `execute_candidates` can reduce output `output`: a whole-method graph on an
    /// executor that reduces rows (the GPU's).
    pub fn supports_candidates(&self, output: usize) -> bool {
        self.whole
            .as_ref()
            .is_some_and(|w| w.candidates_supported(output))
    }

    /// Runs the method as `execute` does, but hands back output `output`'s last row as its
    /// sampling candidates for `k` (`candidates`): that output's place holds an empty tensor,
    /// and `read_output` reads it in full until the next call.
    pub fn execute_candidates(
        &mut self,
        inputs: &[HostTensor],
        output: usize,
        k: usize,
    ) -> Result<(Vec<Output>, Candidates)> {
        if !self.supports_candidates(output) {
            return Err(RuntimeError::Other(format!(
                "method `{}`: output {output} cannot be reduced to candidates here",
                self.plan.name
            )));
        }
        let (outs, c) = self.execute_inner(inputs, Some((output, k)))?;
        let c = c.ok_or_else(|| RuntimeError::Other("candidates missing after a call".into()))?;
        Ok((outs, c))
    }

    /// Whether `start_candidates` can feed input `input` each call's greedy pick on the device.
    pub fn supports_feed(&self, input: usize) -> bool {
        self.whole.as_ref().is_some_and(|w| w.feed_supported(input))
    }

    /// Submits a call as `execute_candidates` makes it, without waiting; `finish_candidates`
    /// hands back its outputs. With `pick` the call picks a token on the device (greedy, or a
    /// draw) and copies it into input `pick.feed`, and a next call made with `pick.fed` reads
    /// its token from there (its value for that input then only gives the shape): a decode step
    /// submitted before the last one's token is known (`GpuExecutor::start_candidates`).
    pub fn start_candidates(
        &mut self,
        inputs: &[HostTensor],
        output: usize,
        k: usize,
        pick: Option<candidates::DevicePick>,
    ) -> Result<()> {
        let method = self.plan.name.clone();
        if !self.supports_candidates(output) {
            return Err(RuntimeError::Other(format!(
                "method `{method}`: output {output} cannot be reduced to candidates here"
            )));
        }
        self.check_inputs(inputs)?;
        let vals = self.whole_inputs(inputs);
        let exec = self
            .whole
            .as_mut()
            .ok_or_else(|| RuntimeError::Other("no whole-method graph".into()))?;
        exec.start_candidates(&vals, output, k, pick)
            .unwrap_or_else(|| Err("this executor does not start calls".into()))
            .map_err(|m| RuntimeError::Other(format!("method `{method}`: {m}")))
    }

    /// The outputs and candidates of the oldest call `start_candidates` submitted.
    pub fn finish_candidates(&mut self) -> Result<(Vec<Output>, Candidates)> {
        let method = self.plan.name.clone();
        let exec = self
            .whole
            .as_mut()
            .ok_or_else(|| RuntimeError::Other(format!("method `{method}` does not run whole")))?;
        let (outs, c) = exec
            .finish_candidates()
            .map_err(|m| RuntimeError::Other(format!("method `{method}`: {m}")))?;
        Ok((self.whole_outputs(outs), c))
    }

    /// Output `output` of the last call of a whole-method graph, read again in full (what
    /// `execute_candidates` left out).
    pub fn read_output(&mut self, output: usize) -> Result<Output> {
        let method = self.plan.name.clone();
        let exec = self
            .whole
            .as_mut()
            .ok_or_else(|| RuntimeError::Other(format!("method `{method}` does not run whole")))?;
        let h = exec
            .read_output(output)
            .map_err(|m| RuntimeError::Other(format!("method `{method}`: {m}")))?;
        let vid = *self.plan.outputs.get(output).ok_or_else(|| {
            RuntimeError::Other(format!("method `{method}` has no output {output}"))
        })?;
        Ok(Output::Tensor(self.whole_output(h, vid)))
    }

    fn execute_inner(
        &mut self,
        inputs: &[HostTensor],
        cands: Option<(usize, usize)>,
    ) -> Result<(Vec<Output>, Option<Candidates>)> {
        let method = self.plan.name.clone();
        self.check_inputs(inputs)?;
        if self.whole.is_some() {
            return self.execute_whole(inputs, cands);
        }

        let mut pc = 0usize;
        let mut budget = self.steps.len().saturating_mul(64).max(1024);
        while pc < self.steps.len() {
            budget -= 1;
            if budget == 0 {
                return Err(RuntimeError::Other(format!(
                    "method `{method}` does not terminate"
                )));
            }
            let kerr = |op: &str, msg: String| RuntimeError::Kernel {
                method: method.clone(),
                instr: pc,
                op: op.to_string(),
                msg,
            };
            match &self.steps[pc] {
                Step::Kernel(f, op, args) => {
                    let mut ctx = kernels::KernelCtx::new(&mut self.mem, args);
                    f(&mut ctx).map_err(|m| kerr(op, m))?;
                    if let Some(t) = &mut self.trace {
                        t(pc, op, &self.mem, args);
                    }
                }
                Step::Delegate(d, args) => {
                    let id = self.plan.delegates[*d].id.clone();
                    self.delegates[*d]
                        .execute(&mut self.mem, args)
                        .map_err(|m| kerr(&format!("delegate {id}"), m))?;
                    if let Some(t) = &mut self.trace {
                        t(pc, &format!("delegate {id}"), &self.mem, args);
                    }
                }
                Step::Move(from, to) => {
                    let v = self.mem.values[*from].clone();
                    self.mem.values[*to] = v;
                }
                Step::JumpFalse(cond, dest) => {
                    let c = match &self.mem.values[*cond] {
                        Value::Bool(b) => *b,
                        Value::Tensor(t) if t.numel() == 1 => {
                            let b = self.mem.bytes(t).map_err(|m| kerr("jump", m))?;
                            b.iter().any(|&x| x != 0)
                        }
                        v => return Err(kerr("jump", format!("condition is a {}", v.kind()))),
                    };
                    if !c {
                        pc = *dest;
                        continue;
                    }
                }
                Step::Free => {}
            }
            pc += 1;
        }

        self.plan
            .outputs
            .iter()
            .map(|&o| self.output(o))
            .collect::<std::result::Result<Vec<_>, String>>()
            .map(|outs| (outs, None))
            .map_err(|m| RuntimeError::Other(format!("method `{method}` output: {m}")))
    }

    /// Checks the call's inputs against the method's declaration and stores them.
    fn check_inputs(&mut self, inputs: &[HostTensor]) -> Result<()> {
        let method = self.plan.name.clone();
        if inputs.len() != self.plan.inputs.len() {
            return Err(RuntimeError::Other(format!(
                "method `{method}` takes {} inputs, got {}",
                self.plan.inputs.len(),
                inputs.len()
            )));
        }
        let input_ids = self.plan.inputs.clone();
        for (k, (&vid, host)) in input_ids.iter().zip(inputs).enumerate() {
            self.set_input(k, vid, host)
                .map_err(|msg| RuntimeError::BadInput {
                    method: method.clone(),
                    index: k,
                    msg,
                })?;
        }
        Ok(())
    }

    /// The whole-method graph's inputs for a call whose inputs `check_inputs` stored.
    fn whole_inputs<'a>(&self, inputs: &'a [HostTensor]) -> Vec<crate::ir::InputValue<'a>> {
        self.plan
            .inputs
            .iter()
            .zip(inputs)
            .map(|(&vid, host)| match &self.mem.values[vid] {
                Value::Int(v) => crate::ir::InputValue::Sym(*v),
                _ => crate::ir::InputValue::Tensor {
                    shape: host.sizes.clone(),
                    data: &host.data,
                },
            })
            .collect()
    }

    /// One call of the whole-method graph; inputs were checked and stored by `set_input`.
    fn execute_whole(
        &mut self,
        inputs: &[HostTensor],
        cands: Option<(usize, usize)>,
    ) -> Result<(Vec<Output>, Option<Candidates>)> {
        let method = self.plan.name.clone();
        let vals = self.whole_inputs(inputs);
        let exec = self
            .whole
            .as_mut()
            .ok_or_else(|| RuntimeError::Other("no whole-method graph".into()))?;
        let err = |m: String| RuntimeError::Other(format!("method `{method}`: {m}"));
        let (outs, c) = match cands {
            None => (exec.run(&vals).map_err(err)?, None),
            Some((output, k)) => {
                let (outs, c) = exec
                    .run_candidates(&vals, output, k)
                    .unwrap_or_else(|| Err("this executor does not reduce outputs".into()))
                    .map_err(err)?;
                (outs, Some(c))
            }
        };
        Ok((self.whole_outputs(outs), c))
    }

    /// A whole-method graph's outputs as the method declares them (`whole_output`).
    fn whole_outputs(&self, outs: Vec<HostTensor>) -> Vec<Output> {
        outs.into_iter()
            .zip(&self.plan.outputs)
            .map(|(h, &vid)| Output::Tensor(self.whole_output(h, vid)))
            .collect()
    }

    /// A whole-method graph's output as the method declares it: integer widths are not
    /// converted inside the graph.
    fn whole_output(&self, mut h: HostTensor, vid: usize) -> HostTensor {
        if let Value::Tensor(t) = &self.mem.values[vid] {
            if t.dtype != h.dtype && !t.dtype.is_float() && !h.dtype.is_float() {
                h.data = tensor::from_i64(t.dtype, &tensor::to_i64(h.dtype, &h.data));
                h.dtype = t.dtype;
            }
        }
        h
    }

    fn set_input(
        &mut self,
        k: usize,
        vid: usize,
        host: &HostTensor,
    ) -> std::result::Result<(), String> {
        let t = match &self.mem.values[vid] {
            Value::Tensor(t) => t.clone(),
            Value::Int(_) => {
                // A scalar input: accept a one-element integer tensor.
                let v = host
                    .to_i64()?
                    .first()
                    .copied()
                    .ok_or("empty scalar input")?;
                self.mem.values[vid] = Value::Int(v);
                return Ok(());
            }
            v => return Err(format!("inputs of kind {} are not supported", v.kind())),
        };
        if host.dtype != t.dtype {
            return Err(format!(
                "expected dtype {}, got {}",
                t.dtype.name(),
                host.dtype.name()
            ));
        }
        if host.sizes.len() != t.sizes.len() && !t.sizes.is_empty() {
            return Err(format!(
                "expected rank {} (bounds {:?}), got shape {:?}",
                t.sizes.len(),
                t.sizes,
                host.sizes
            ));
        }
        let nbytes = host.data.len();
        if nbytes > t.max_bytes {
            return Err(format!(
                "shape {:?} exceeds the declared bounds {:?}",
                host.sizes, t.sizes
            ));
        }
        let mut t = t;
        if let Storage::Unset | Storage::Input(_) = t.storage {
            let slot = match t.storage {
                Storage::Input(i) => i,
                _ => {
                    self.mem.inputs.push(vec![0u8; t.max_bytes]);
                    self.mem.inputs.len() - 1
                }
            };
            t.storage = Storage::Input(slot);
        }
        t.sizes = host.sizes.clone();
        self.mem.bytes_mut(&t)?.copy_from_slice(&host.data);
        let _ = k;
        self.mem.values[vid] = Value::Tensor(t);
        Ok(())
    }

    fn output(&self, id: usize) -> std::result::Result<Output, String> {
        Ok(match &self.mem.values[id] {
            Value::Tensor(t) => Output::Tensor(HostTensor {
                dtype: t.dtype,
                sizes: t.sizes.clone(),
                data: self.mem.bytes(t)?.to_vec(),
            }),
            Value::Int(i) => Output::Int(*i),
            Value::Bool(b) => Output::Bool(*b),
            Value::Double(d) => Output::Double(*d),
            Value::String(s) => Output::String(s.clone()),
            Value::IntList(items) => Output::IntList(
                items
                    .iter()
                    .map(|&i| match &self.mem.values[i] {
                        Value::Int(v) => Ok(*v),
                        v => Err(format!("IntList item is a {}", v.kind())),
                    })
                    .collect::<std::result::Result<_, String>>()?,
            ),
            Value::None => Output::None,
            v => return Err(format!("outputs of kind {} are not supported", v.kind())),
        })
    }

    pub fn memory(&self) -> &Memory {
        &self.mem
    }
}

/// Reads a constant method (LLM metadata) into a single output, if it exists.
pub fn constant_method(program: &Program, name: &str) -> Result<Option<Vec<Output>>> {
    let Some(plan) = program.plan(name) else {
        return Ok(None);
    };
    if !plan.is_constant() {
        return Err(RuntimeError::Other(format!(
            "method `{name}` is not a constant method"
        )));
    }
    let mut m = Method::load(program, name, &BackendRegistry::default())?;
    Ok(Some(m.execute(&[])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nop(_: &mut kernels::KernelCtx) -> kernels::KernelResult {
        Ok(())
    }

    fn k(op: &str, args: &[usize]) -> Step {
        Step::Kernel(nop, op.to_string(), args.to_vec())
    }

    /// Values 0 (cache) and 1 (the scatter's out) alike in planned memory; 2.. small tensors.
    fn memory() -> Memory {
        let t = |offset| {
            Value::Tensor(Tensor {
                dtype: DType::F32,
                sizes: vec![1, 4, 8],
                max_bytes: 128,
                dim_order: vec![0, 1, 2],
                storage: tensor::Storage::Arena { arena: 0, offset },
            })
        };
        Memory {
            values: (0..8).map(|v| t(v * 128)).collect(),
            arenas: vec![vec![0; 8 * 128]],
            inputs: vec![],
        }
    }

    /// cache 0, src 2, out 1, a read 3 of out, the copy back: how functionalised exports
    /// update a KV cache. `extra` goes in at `at`.
    fn program(extra: Option<(usize, Step)>) -> Vec<Step> {
        let mut steps = vec![
            k("aten::slice_copy.Tensor_out", &[0, 7, 7, 7, 7, 5, 5]),
            k("aten::slice_scatter.out", &[0, 2, 7, 7, 7, 7, 1, 1]),
            k("aten::slice_copy.Tensor_out", &[1, 7, 7, 7, 7, 3, 3]),
            k("aten::copy_", &[0, 1, 7, 0]),
        ];
        if let Some((at, s)) = extra {
            steps.insert(at, s);
        }
        steps
    }

    fn rewritten(steps: &mut [Step]) -> bool {
        let n = scatter_in_place(steps, &memory(), &[3]);
        let free = steps.iter().filter(|s| matches!(s, Step::Free)).count();
        assert_eq!(n, free, "one copy-back dropped per scatter");
        n == 1
    }

    #[test]
    fn cache_writes_go_in_place_only_where_nothing_else_sees_the_cache() {
        let mut steps = program(None);
        assert!(rewritten(&mut steps));
        assert!(matches!(&steps[1], Step::Kernel(_, op, _) if op.ends_with("(in place)")));
        assert!(matches!(steps[3], Step::Free));
        for (why, at, step) in [
            ("cache read between", 2, k("aten::mul.out", &[0, 6, 6])),
            (
                "out read after the copy",
                4,
                k("aten::slice_copy.Tensor_out", &[1, 7, 7, 7, 7, 6, 6]),
            ),
            (
                "cache viewed before",
                0,
                k("executorch_prim::et_view.default", &[0, 7, 6]),
            ),
            ("out written between", 2, k("aten::copy_", &[1, 6, 7, 1])),
            ("out read by a delegate", 2, Step::Delegate(0, vec![1, 6])),
            ("control flow", 4, Step::JumpFalse(6, 0)),
        ] {
            let mut steps = program(Some((at, step)));
            assert!(!rewritten(&mut steps), "{why}");
        }
        // An out the method returns stays apart from the cache.
        let mut steps = program(None);
        assert_eq!(scatter_in_place(&mut steps, &memory(), &[1]), 0);
        // A cache in another dtype than the out is converted, not aliased.
        let mut mem = memory();
        if let Value::Tensor(t) = &mut mem.values[1] {
            t.dtype = DType::F16;
            t.max_bytes = 64;
        }
        assert_eq!(scatter_in_place(&mut program(None), &mem, &[]), 0);
    }
}
