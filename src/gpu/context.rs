//! The device: adapter choice, device creation with the optional features we use, the limits we
//! plan against, and the caches every executor on this device shares (shader modules, bind group
//! layouts, pipelines keyed by kernel, entry point and `override` constants).

use super::GpuError;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// WGSL sources by `OpKind::name()`; one file per op family.
fn kernel_source(name: &str) -> Option<&'static str> {
    Some(match name {
        // Kernels that apply element-wise chains start with the shared op definitions.
        "elementwise" => concat!(
            include_str!("../../kernels/chain.wgsl"),
            include_str!("../../kernels/elementwise.wgsl")
        ),
        "rms_norm" => concat!(
            include_str!("../../kernels/chain.wgsl"),
            include_str!("../../kernels/quant.wgsl"),
            include_str!("../../kernels/norm_sum.wgsl"),
            include_str!("../../kernels/rms_norm.wgsl")
        ),
        // Activation quantization (quant.wgsl) is shared with rms_norm, which can do it too.
        // A paired linear can store a chain of its two outputs (chain.wgsl; `GLU`). Rows'
        // ranges (range.wgsl) pass from the linears and attention that store them to the
        // linears that quantize them.
        // `linear3`: the variant with a third output (`variant_blocks`).
        "linear" | "linear3" | "linear_xnn" => concat!(
            include_str!("../../kernels/chain.wgsl"),
            include_str!("../../kernels/quant.wgsl"),
            include_str!("../../kernels/range.wgsl"),
            include_str!("../../kernels/linear.wgsl")
        ),
        // `linear_norm`: the variant that norms its input row as rms_norm does (norm_sum.wgsl).
        "linear_norm" => concat!(
            include_str!("../../kernels/chain.wgsl"),
            include_str!("../../kernels/quant.wgsl"),
            include_str!("../../kernels/range.wgsl"),
            include_str!("../../kernels/norm_sum.wgsl"),
            include_str!("../../kernels/linear.wgsl")
        ),
        "matmul" => include_str!("../../kernels/matmul.wgsl"),
        "embedding" => include_str!("../../kernels/embedding.wgsl"),
        "softmax" => include_str!("../../kernels/softmax.wgsl"),
        "reduce" => include_str!("../../kernels/reduce.wgsl"),
        "mul_mean" => include_str!("../../kernels/mul_mean.wgsl"),
        "rope" => include_str!("../../kernels/rope.wgsl"),
        // Attention may norm its q as rms_norm does (norm_sum.wgsl, `split_normed`), and with
        // `sdpa_kv` (the variant writing the caches) the step's new k and v (`split_kv`).
        "sdpa" | "sdpa_kv" => concat!(
            include_str!("../../kernels/range.wgsl"),
            include_str!("../../kernels/norm_sum.wgsl"),
            include_str!("../../kernels/sdpa.wgsl")
        ),
        "cache_update" => include_str!("../../kernels/cache_update.wgsl"),
        "layout" => include_str!("../../kernels/layout.wgsl"),
        "full" => include_str!("../../kernels/full.wgsl"),
        // The executor's, after a call's ops: a row of logits reduced for sampling.
        "candidates" => include_str!("../../kernels/candidates.wgsl"),
        // A benchmark's, not an op's (src/gpu/bench.rs `grid_barrier`).
        "grid_barrier" => concat!(
            include_str!("../../kernels/grid_barrier.wgsl"),
            include_str!("../../kernels/grid_sync.wgsl")
        ),
        // A benchmark's (src/gpu/bench.rs `phase_chain`).
        "phase_chain" => concat!(
            include_str!("../../kernels/phase_chain.wgsl"),
            include_str!("../../kernels/grid_sync.wgsl")
        ),
        // A benchmark's (src/gpu/bench.rs `arith_rate`).
        "arith_probe" => include_str!("../../kernels/arith_probe.wgsl"),
        _ => return None,
    })
}

/// The `// #if` blocks a kernel variant keeps beyond the device's (a variant shares its file).
/// `linear3`: linear.wgsl with a third output binding (`triple`), which every other linear
/// would otherwise have to bind too: a binding that a kernel names must be in its layout.
/// XNNPACK's ksums follow the outputs a variant binds: at 8 (`ks8`) where no second output is
/// bound, 9 in `linear_xnn` (a pair's second output or a chain's ranges at 8), 10 in `linear3`,
/// 11 in `linear_norm` (after the norm's output and weight); `xnn_wide` stores by `put`.
/// `sdpa_kv`: sdpa.wgsl with its caches bound read-write (`kv_write`, for `split_kv`), where
/// every other attention binds them read-only (`kv_read`).
fn variant_blocks(kernel: &str) -> &'static [&'static str] {
    match kernel {
        "linear" => &["ks8"],
        "linear3" => &["triple", "xnn_wide"],
        "linear_xnn" => &["ks9", "xnn_wide"],
        "linear_norm" => &["norm"],
        "sdpa" => &["kv_read"],
        "sdpa_kv" => &["kv_write"],
        _ => &[],
    }
}

/// A kernel's source with the lines between `// #if NAME` and `// #endif` kept only where NAME
/// is on. `subgroups` is on for devices with the feature: a module that names subgroup builtins
/// fails validation on a device without it, and `override` constants cannot hide them (naga 30
/// wants no `enable subgroups;`); an `override` still picks the path at run time. The others
/// are variants' (`variant_blocks`).
fn with_blocks(src: &'static str, on: &[&str]) -> std::borrow::Cow<'static, str> {
    if !src.contains("// #if ") {
        return src.into();
    }
    let mut out = String::with_capacity(src.len());
    let mut keep = true;
    for line in src.lines() {
        let l = line.trim();
        if let Some(name) = l.strip_prefix("// #if ") {
            keep = on.contains(&name.trim());
        } else if l == "// #endif" {
            keep = true;
        } else if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.into()
}

/// How a context is opened.
#[derive(Debug, Clone, Default)]
pub struct ContextOptions {
    /// Plan as if the device's largest storage binding were at most this many bytes. Tests use
    /// it to force the row splitting of big weights on any device.
    pub max_storage_binding: Option<u64>,
    /// Ask for at most this many storage buffers per kernel. Tests use it to run as a device
    /// with WebGPU's default 8, where the fusions that bind 9 stay apart.
    pub max_storage_buffers: Option<u32>,
    /// Backends to try; `None` means every one wgpu offers here (`WGPU_BACKEND` still applies).
    pub backends: Option<wgpu::Backends>,
    /// Ask for no more than WebGPU's default limits (16 KiB of workgroup memory, 256 invocations
    /// a workgroup, 8 storage buffers a kernel, 128 MiB bindings), which many phones' GPUs do not
    /// pass: tests run as such a device (`PTERIA_WEBGPU_LIMITS=1` does the same for any program).
    pub webgpu_limits: bool,
    /// Leave subgroup operations off even where the adapter has them, so that the kernels'
    /// shared-memory paths run (tests cover both).
    pub no_subgroups: bool,
    /// Run every linear in its own dispatch, never two of one input in one (tests compare).
    pub separate_linears: bool,
    /// Hold KV caches (State tensors that a cache update writes) as f16, half the bytes; all
    /// math stays f32. Off by default: its error against f32 is measured, not assumed (README).
    pub f16_kv_cache: bool,
    /// Quantize a linear's activations in their own dispatch, never in the rms_norm that
    /// produces them (tests compare).
    pub separate_quant: bool,
    /// Run the element-wise chain of a paired gate/up linear's outputs in its own dispatch,
    /// never in the linear's (tests compare).
    pub separate_glu: bool,
    /// Run KV cache updates in their own dispatch, never in the rms_norm that produces their
    /// rows (tests compare).
    pub separate_cache_update: bool,
    /// Run a norm that reads another norm's rows in its own dispatch, never in that norm's
    /// (tests compare).
    pub separate_norms: bool,
    /// Quantize a linear's int8 activations after a pass over the row for its range, never
    /// from the range the producer of the row left as it stored it (tests compare).
    pub separate_ranges: bool,
    /// Run an element-wise chain that quantizes for its linear in its own dispatch, never in the
    /// linear's loads (tests compare).
    pub separate_chain_loads: bool,
    /// Run an rms_norm that quantizes for its linear in its own dispatch, never in the linear's
    /// workgroups (tests compare).
    pub separate_norm_loads: bool,
    /// Run the q norm with RoPE in its own dispatch, never in the attention's that reads it
    /// (tests compare).
    pub separate_q_norms: bool,
    /// Run the k and v norms that store into KV caches in a dispatch each, never together
    /// (tests compare).
    pub separate_kv_norms: bool,
    /// Run the k and v norms that store into KV caches in their own dispatch, never in the
    /// split of the attention that reads them (tests compare).
    pub separate_kv_splits: bool,
    /// Store every 4-bit weight's biases, never compute those that are -8 · scale from the
    /// scales (tests compare).
    pub stored_biases: bool,
    /// Round XNNPACK's multiply-adds once by the kernels' own sequence even where WGSL's
    /// `fma()` is fused (tests compare).
    pub emulated_fma: bool,
    /// Run three linears of one input as a pair and one alone, never all three in one dispatch
    /// (tests compare).
    pub separate_triples: bool,
    /// Gather tables at least this large (embeddings read by token ids the host knows) stay in
    /// host memory and are gathered there (`host_gather`); `None`: 64 MiB. Tests lower it.
    pub host_gather_min_bytes: Option<u64>,
    /// Run quantized linears of 16-byte quads as mat-vecs up to this many rows of x (at most
    /// `QUAD_MATVEC_MAX_M`, which `None` means), tiled past them. Tests lower it, so that both
    /// kernels run at small sizes.
    pub quad_matvec_rows: Option<usize>,
    /// Rows of x every workgroup of a prompt's quad mat-vec takes (1, 2, 4 or 8); `None`: as
    /// many as the prompt's rows call for (`ops::x_rows`). Tests compare.
    pub matvec_x_rows: Option<usize>,
    /// Store at most this many sampling candidates a call (at most `candidates::CAPACITY`, which
    /// `None` means): tests lower it so that a small vocabulary's candidates overflow.
    pub candidate_capacity: Option<usize>,
    /// Wait for each call's outputs blocked in the driver, never polling the end of the wait
    /// (which wakes sooner but spends a core on it; `PTERIA_POLL_OUTPUTS=0` does the same).
    pub block_on_outputs: bool,
}

/// `have` no higher than WebGPU's defaults where a kernel's plan reads the limit (and no lower
/// where a lower value is the better one).
fn webgpu_clamped(have: &wgpu::Limits) -> wgpu::Limits {
    let d = wgpu::Limits::default();
    let mut l = have.clone();
    macro_rules! at_most {
        ($($f:ident),*) => { $( l.$f = l.$f.min(d.$f); )* };
    }
    macro_rules! at_least {
        ($($f:ident),*) => { $( l.$f = l.$f.max(d.$f); )* };
    }
    at_most!(
        max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup,
        max_compute_workgroup_size_x,
        max_compute_workgroup_size_y,
        max_compute_workgroup_size_z,
        max_compute_workgroups_per_dimension,
        max_storage_buffers_per_shader_stage,
        max_storage_buffer_binding_size,
        max_uniform_buffer_binding_size,
        max_buffer_size,
        max_bind_groups,
        max_bindings_per_bind_group
    );
    at_least!(
        min_storage_buffer_offset_alignment,
        min_uniform_buffer_offset_alignment
    );
    l
}

/// What `pteria inspect` and the catalog show about the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    pub name: String,
    /// `vulkan`, `metal`, `dx12`, `gl`.
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
    /// `discrete`, `integrated`, `virtual`, `cpu`, `other`.
    pub device_type: String,
    /// Subgroup sizes the adapter reports, when it has subgroup operations.
    pub subgroup_sizes: Option<(u32, u32)>,
    pub shader_f16: bool,
    /// The largest storage binding the executor plans with (after `ContextOptions`).
    pub max_storage_binding: u64,
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}, {}", self.name, self.backend, self.device_type)?;
        if !self.driver.is_empty() {
            write!(f, ", {} {}", self.driver, self.driver_info)?;
        }
        write!(f, ", max binding {} MiB)", self.max_storage_binding >> 20)
    }
}

/// One binding slot of a kernel's bind group layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    Uniform,
    Read,
    Write,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PipelineKey {
    kernel: &'static str,
    entry: &'static str,
    /// `override` name and value bits, in the order given.
    constants: Vec<(&'static str, u64)>,
    slots: Vec<Slot>,
}

#[derive(Clone)]
pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

/// An open GPU device and the caches shared by every executor on it.
pub struct Context {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    summary: AdapterSummary,
    limits: wgpu::Limits,
    features: wgpu::Features,
    max_binding: u64,
    f16_kv_cache: bool,
    emulated_fma: bool,
    /// Whether WGSL's `fma()` rounds once here, probed on first use (`fused_fma`).
    fused_fma: std::sync::OnceLock<bool>,
    host_gather_min_bytes: u64,
    quad_matvec_rows: usize,
    matvec_x_rows: Option<usize>,
    candidate_capacity: usize,
    poll_outputs: bool,
    /// The planner's fusions, decided once from the options and the device's limits.
    fusions: super::memory::Fusions,
    /// Errors wgpu reports outside an error scope; checked after every submit. wgpu's default
    /// handler panics, which an engine must never do.
    uncaptured: Arc<Mutex<Vec<String>>>,
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    layouts: Mutex<HashMap<Vec<Slot>, (wgpu::BindGroupLayout, wgpu::PipelineLayout)>>,
    pipelines: Mutex<HashMap<PipelineKey, Pipeline>>,
    /// Input and activation buffers shared by the executors of this context, per slot number.
    shared: Mutex<HashMap<usize, Vec<wgpu::Buffer>>>,
    /// Held while an executor uses the shared buffers, so that executors on other threads wait.
    turn: Mutex<()>,
    /// Calls made on the shared buffers so far: an output read after its call is that call's
    /// only while no other has run.
    calls: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these caches half-written: each insert is one call.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn backend_name(b: wgpu::Backend) -> &'static str {
    match b {
        wgpu::Backend::Vulkan => "vulkan",
        wgpu::Backend::Metal => "metal",
        wgpu::Backend::Dx12 => "dx12",
        wgpu::Backend::Gl => "gl",
        wgpu::Backend::BrowserWebGpu => "webgpu",
        _ => "other",
    }
}

impl AdapterSummary {
    /// Whether the adapter is a CPU's driver (lavapipe, SwiftShader, WARP).
    pub fn is_cpu(&self) -> bool {
        self.device_type == device_type_name(wgpu::DeviceType::Cpu)
    }
}

fn device_type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

impl Context {
    /// Opens the best adapter wgpu finds (Vulkan, Metal, DX12 or GL). No adapter, or a device
    /// that cannot be created, is an error value: the caller falls back to the CPU executor.
    pub fn new() -> Result<Context, GpuError> {
        Context::with_options(ContextOptions::default())
    }

    pub fn with_options(opts: ContextOptions) -> Result<Context, GpuError> {
        let open = |backends: wgpu::Backends| {
            let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
            desc.backends = backends;
            let instance = wgpu::Instance::new(desc.with_env());
            pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            }))
        };
        // GL only when no Vulkan/Metal/DX12 adapter exists: probing EGL is slow and noisy.
        let adapter = match opts.backends {
            Some(b) => open(b),
            None => open(wgpu::Backends::PRIMARY).or_else(|_| open(wgpu::Backends::SECONDARY)),
        }
        .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        let info = adapter.get_info();
        let wanted =
            wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
        let mut features = adapter.features() & wanted;
        if opts.no_subgroups {
            features.remove(wgpu::Features::SUBGROUP);
        }
        // Ask for everything the adapter offers: weights want the largest bindings and buffers,
        // kernels up to eight storage bindings, and some fusions nine where the device has them
        // (`ops::WIDE_BINDINGS`).
        let mut limits = adapter.limits();
        if opts.webgpu_limits || std::env::var("PTERIA_WEBGPU_LIMITS").is_ok_and(|v| v == "1") {
            limits = webgpu_clamped(&limits);
        }
        if let Some(n) = opts.max_storage_buffers {
            let have = limits.max_storage_buffers_per_shader_stage;
            limits.max_storage_buffers_per_shader_stage = have.min(n);
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("pteria"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| {
            GpuError::Device(format!(
                "{} ({}): {e}",
                info.name,
                backend_name(info.backend)
            ))
        })?;
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            lock(&sink).push(e.to_string())
        }));
        let device_max = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let max_binding = opts
            .max_storage_binding
            .map_or(device_max, |m| m.min(device_max))
            & !15;
        let summary = AdapterSummary {
            name: info.name.clone(),
            backend: backend_name(info.backend).into(),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            device_type: device_type_name(info.device_type).into(),
            subgroup_sizes: features
                .contains(wgpu::Features::SUBGROUP)
                .then_some((info.subgroup_min_size, info.subgroup_max_size)),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            max_storage_binding: max_binding,
        };
        let fusions = super::memory::Fusions {
            pair_linears: !opts.separate_linears,
            quant: !opts.separate_quant,
            glu: !opts.separate_glu,
            cache_update: !opts.separate_cache_update,
            norm_pairs: !opts.separate_norms,
            ranges: !opts.separate_ranges,
            chain_loads: !opts.separate_chain_loads,
            norm_loads: !opts.separate_norm_loads,
            q_norms: !opts.separate_q_norms,
            kv_norms: !opts.separate_kv_norms,
            kv_splits: !opts.separate_kv_splits,
            derived_biases: !opts.stored_biases,
            // The third output binds one more storage buffer.
            triples: !opts.separate_linears
                && !opts.separate_triples
                && limits.max_storage_buffers_per_shader_stage >= super::ops::WIDE_BINDINGS,
            storage_buffers: limits.max_storage_buffers_per_shader_stage,
        };
        Ok(Context {
            device,
            queue,
            summary,
            limits,
            features,
            max_binding,
            f16_kv_cache: opts.f16_kv_cache,
            emulated_fma: opts.emulated_fma,
            fused_fma: std::sync::OnceLock::new(),
            quad_matvec_rows: opts
                .quad_matvec_rows
                .map_or(super::ops::QUAD_MATVEC_MAX_M, |r| {
                    r.min(super::ops::QUAD_MATVEC_MAX_M)
                }),
            matvec_x_rows: opts
                .matvec_x_rows
                .map(|r| r.clamp(1, 8).next_power_of_two()),
            host_gather_min_bytes: opts
                .host_gather_min_bytes
                .unwrap_or(super::host_gather::DEFAULT_MIN_BYTES),
            candidate_capacity: opts
                .candidate_capacity
                .map_or(crate::runtime::candidates::CAPACITY, |c| {
                    c.clamp(1, crate::runtime::candidates::CAPACITY)
                }),
            poll_outputs: !opts.block_on_outputs
                && std::env::var("PTERIA_POLL_OUTPUTS").map_or(true, |v| v != "0"),
            fusions,
            uncaptured,
            modules: Mutex::default(),
            layouts: Mutex::default(),
            pipelines: Mutex::default(),
            shared: Mutex::default(),
            turn: Mutex::default(),
            calls: Default::default(),
        })
    }

    /// A buffer of at least `size` bytes for an executor's `slot`-th input or activation
    /// buffer, shared with the same slot of this context's other executors. A call rewrites
    /// its inputs and recomputes its activations before reading them and waits for the GPU
    /// before it returns, so executors that take turns (`turn`) need only the largest plan's
    /// memory instead of the sum: a program's delegates (an LLM export has one or more per
    /// layer, each planned for the longest prompt) run one after another anyway.
    /// Exclusive use of the shared buffers for one call.
    pub(crate) fn turn(&self) -> MutexGuard<'_, ()> {
        lock(&self.turn)
    }

    /// Counts a call (made under `turn`) and returns its number.
    pub(crate) fn count_call(&self) -> u64 {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
    }

    /// The number of the last call counted.
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn shared_buffer(
        &self,
        slot: usize,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, String> {
        let mut shared = lock(&self.shared);
        let list = shared.entry(slot).or_default();
        if let Some(b) = list.iter().find(|b| b.size() >= size && b.usage() == usage) {
            return Ok(b.clone());
        }
        let b = self.scoped(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("shared"),
                size,
                usage,
                mapped_at_creation: false,
            })
        })?;
        list.push(b.clone());
        Ok(b)
    }

    pub fn adapter(&self) -> &AdapterSummary {
        &self.summary
    }

    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    pub fn features(&self) -> wgpu::Features {
        self.features
    }

    /// The smallest subgroup size, where kernels may use subgroup operations.
    pub fn subgroup_min(&self) -> Option<u32> {
        self.summary.subgroup_sizes.map(|(lo, _)| lo)
    }

    /// Whether GPU timestamps can time passes.
    pub fn has_timestamps(&self) -> bool {
        self.features.contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// The largest storage binding the executor plans with.
    pub fn max_storage_binding(&self) -> u64 {
        self.max_binding
    }

    /// Whether a call polls for the end of its wait for outputs (`wait::await_map`).
    pub(crate) fn poll_outputs(&self) -> bool {
        self.poll_outputs
    }

    /// Which of the planner's fusions are on (`ContextOptions` turns each off for tests).
    pub(crate) fn fusions(&self) -> super::memory::Fusions {
        self.fusions
    }

    /// Rows of x up to which quantized linears run as mat-vecs (`ContextOptions::quad_matvec_rows`).
    pub(crate) fn quad_matvec_rows(&self) -> usize {
        self.quad_matvec_rows
    }

    /// Rows of x a prompt's quad mat-vec workgroup takes, if fixed (`ContextOptions::matvec_x_rows`).
    pub(crate) fn matvec_x_rows(&self) -> Option<usize> {
        self.matvec_x_rows
    }

    /// The smallest gather table kept in host memory (`ContextOptions::host_gather_min_bytes`).
    pub fn host_gather_min_bytes(&self) -> u64 {
        self.host_gather_min_bytes
    }

    /// The most sampling candidates a call stores (`ContextOptions::candidate_capacity`).
    pub fn candidate_capacity(&self) -> usize {
        self.candidate_capacity
    }

    /// Keeps every gather table in GPU memory from now on (for executors made after it).
    pub fn keep_tables_on_gpu(&mut self) {
        self.host_gather_min_bytes = u64::MAX;
    }

    /// Whether WGSL's `fma()` rounds once on this device, as XNNPACK's fused multiply-adds
    /// do: a kernel may then call it where it otherwise computes the one rounding itself (about
    /// twenty dependent operations). SPIR-V's Fma does not promise it (lavapipe multiplies, then
    /// adds), so one dispatch asks, the first time: fma(a, a, c) with a = 1 + 2^-12 and
    /// c = -(1 + 2^-11) is 2^-24 fused and 0 unfused. A probe that fails reads as unfused.
    pub fn fused_fma(&self) -> bool {
        !self.emulated_fma
            && *self
                .fused_fma
                .get_or_init(|| self.probe_fma().unwrap_or(false))
    }

    /// `fused_fma` as probed so far (false before the first probe): for a call's recording,
    /// which must not submit work of its own.
    pub(crate) fn fused_fma_probed(&self) -> bool {
        !self.emulated_fma && self.fused_fma.get().copied().unwrap_or(false)
    }

    fn probe_fma(&self) -> Result<bool, GpuError> {
        use wgpu::util::DeviceExt;
        let pipe = self.pipeline(
            "arith_probe",
            "fma_probe",
            &[],
            &[Slot::Uniform, Slot::Write],
        )?;
        let dev = &self.device;
        let (a, c) = (1.0f32 + 2f32.powi(-12), -(1.0f32 + 2f32.powi(-11)));
        let params = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("fma probe params"),
            contents: bytemuck::cast_slice(&[a.to_bits(), c.to_bits(), 0, 0]),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let out = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("fma probe out"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let read = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("fma probe read"),
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind = super::bench::bind_in_order(self, &pipe.layout, &[&params, &out]);
        let mut enc = dev.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipe.pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        enc.copy_buffer_to_buffer(&out, 0, &read, 0, 16);
        self.queue.submit([enc.finish()]);
        let bytes = super::executor::read_back(self, &read)?;
        let got = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        Ok(got == 2f32.powi(-24))
    }

    /// Whether executors hold KV caches as f16 (`ContextOptions::f16_kv_cache`).
    pub fn f16_kv_cache(&self) -> bool {
        self.f16_kv_cache
    }

    pub(crate) fn max_workgroups(&self) -> u32 {
        self.limits.max_compute_workgroups_per_dimension
    }

    /// Errors wgpu reported outside an error scope since the last call, as one error.
    pub(crate) fn take_errors(&self) -> Result<(), GpuError> {
        let errs = std::mem::take(&mut *lock(&self.uncaptured));
        if errs.is_empty() {
            Ok(())
        } else {
            Err(GpuError::Device(errs.join("; ")))
        }
    }

    /// Runs `f` inside a validation and out-of-memory error scope; `Err` is what it raised.
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> T) -> Result<T, String> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let v = f();
        let errs = [
            pollster::block_on(validation.pop()),
            pollster::block_on(oom.pop()),
        ];
        match errs.into_iter().flatten().next() {
            None => Ok(v),
            Some(e) => Err(e.to_string()),
        }
    }

    fn layout(&self, slots: &[Slot]) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
        let mut cache = lock(&self.layouts);
        if let Some(l) = cache.get(slots) {
            return l.clone();
        }
        let entries: Vec<wgpu::BindGroupLayoutEntry> = slots
            .iter()
            .enumerate()
            .map(|(i, s)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match s {
                        Slot::Uniform => wgpu::BufferBindingType::Uniform,
                        Slot::Read => wgpu::BufferBindingType::Storage { read_only: true },
                        Slot::Write => wgpu::BufferBindingType::Storage { read_only: false },
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let bgl = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: None,
                entries: &entries,
            });
        let pl = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
        cache.insert(slots.to_vec(), (bgl.clone(), pl.clone()));
        (bgl, pl)
    }

    /// The pipeline for one entry point of a kernel, specialised by `override` constants.
    pub(crate) fn pipeline(
        &self,
        kernel: &'static str,
        entry: &'static str,
        constants: &[(&'static str, f64)],
        slots: &[Slot],
    ) -> Result<Pipeline, GpuError> {
        let key = PipelineKey {
            kernel,
            entry,
            constants: constants.iter().map(|(k, v)| (*k, v.to_bits())).collect(),
            slots: slots.to_vec(),
        };
        if let Some(p) = lock(&self.pipelines).get(&key) {
            return Ok(p.clone());
        }
        let shader_err = |msg: String| GpuError::Shader { kernel, entry, msg };
        let module = {
            let mut modules = lock(&self.modules);
            match modules.get(kernel) {
                Some(m) => m.clone(),
                None => {
                    let src =
                        kernel_source(kernel).ok_or_else(|| shader_err("no such kernel".into()))?;
                    let mut on = variant_blocks(kernel).to_vec();
                    if self.features.contains(wgpu::Features::SUBGROUP) {
                        on.push("subgroups");
                    }
                    let src = with_blocks(src, &on);
                    let src = format!("{src}\n{}", include_str!("../../kernels/common.wgsl"));
                    let m = self
                        .scoped(|| {
                            let desc = wgpu::ShaderModuleDescriptor {
                                label: Some(kernel),
                                source: wgpu::ShaderSource::Wgsl(src.into()),
                            };
                            // Bounds checks stay on. The loop counters that naga would add to
                            // every loop (in case one never ends) cost a 128-token prefill on
                            // an H100 half its speed (979 -> 2048 tok/s without them) and a
                            // decode step 4%. SAFETY: every loop in kernels/ ends: counters step
                            // by a nonzero constant toward a bound that is a tensor size below
                            // 2^31, halve toward zero, or (`divmod`, `pow_i`) move monotonically
                            // to their exit.
                            let checks = wgpu::ShaderRuntimeChecks {
                                force_loop_bounding: false,
                                ..wgpu::ShaderRuntimeChecks::checked()
                            };
                            unsafe { self.device.create_shader_module_trusted(desc, checks) }
                        })
                        .map_err(shader_err)?;
                    modules.insert(kernel, m.clone());
                    m
                }
            }
        };
        let (bgl, pl) = self.layout(slots);
        let pipeline = self
            .scoped(|| {
                self.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(entry),
                        layout: Some(&pl),
                        module: &module,
                        entry_point: Some(entry),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants,
                            // Kernels initialise the shared memory they read.
                            zero_initialize_workgroup_memory: false,
                        },
                        cache: None,
                    })
            })
            .map_err(|e| shader_err(format!("{e} (constants {constants:?})")))?;
        let p = Pipeline {
            pipeline,
            layout: bgl,
        };
        lock(&self.pipelines).insert(key, p.clone());
        Ok(p)
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("adapter", &self.summary)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each `// #if NAME` block is kept only where NAME is on: the device's subgroups and a
    /// variant's blocks (`linear3`'s third output) apart.
    #[test]
    fn blocks_are_kept_by_name() {
        let src = "a\n// #if subgroups\nb\n// #endif\nc\n  // #if triple\nd\n  // #endif\ne\n";
        let kept = |on: &[&str]| with_blocks(src, on).lines().collect::<Vec<_>>().join("");
        assert_eq!(kept(&[]), "ace");
        assert_eq!(kept(&["subgroups"]), "abce");
        assert_eq!(kept(variant_blocks("linear3")), "acde");
        assert_eq!(kept(&["subgroups", "triple"]), "abcde");
        assert_eq!(variant_blocks("linear"), ["ks8"]);
        assert_eq!(variant_blocks("linear_xnn"), ["ks9", "xnn_wide"]);
    }
}
