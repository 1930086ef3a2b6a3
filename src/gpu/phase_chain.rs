//! `pteria bench --phases`: would a persistent kernel beat a decode step's dispatch floor?
//!
//! A decode step is a chain: each linear needs all of the one before's outputs, so through
//! wgpu every one is a dispatch after a pipeline barrier (about 2.1 µs on an H200 before a
//! byte moves). One dispatch could run the chain's phases in turn with a barrier across its
//! workgroups between them (`kernels/grid_sync.wgsl`, 1.6 µs on an H200), and, since weights
//! do not depend on the phase before, load the next phase's first weights before waiting.
//! `kernels/phase_chain.wgsl` runs Gemma 4 E2B's per-layer mat-vecs (4-bit, group 128, f32
//! activations) chained over many layers all three ways, from the same code, so the times
//! compare the boundaries alone; the outputs must agree bit for bit (a stale read or a missed
//! wait would change them). Not used by any model. `PTERIA_PHASE_SKIP` leaves parts out to time
//! the rest: bit 1 the staging of x in workgroup memory, bit 2 the arithmetic (the outputs are
//! then meaningless but still written).

use super::context::Slot;
use super::{Context, GpuError};
use serde::Serialize;
use std::sync::Arc;
use wgpu::util::DeviceExt;

/// One layer's mat-vecs, K → N in order: q/k/v 1536→2560 (8 query heads of 256, one of k and
/// v), o 2048→1536, gate/up 1536→12288, down 6144→1536, the per-layer input's gate 1536→256
/// and projection 256→1536. Each phase takes the first K of the one before's N outputs.
pub const LAYER_SHAPES: [(usize, usize); 6] = [
    (1536, 2560),
    (2048, 1536),
    (1536, 12288),
    (6144, 1536),
    (1536, 256),
    (256, 1536),
];

/// Phases a chain may have (the kernel's table).
pub const MAX_PHASES: usize = 256;
/// The longest x a phase may take.
pub const MAX_K: usize = 6144;
const WG: u32 = 256;

/// How the chain's phases are separated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PhaseMode {
    /// A dispatch a phase: wgpu's pipeline barrier between two.
    Dispatches,
    /// One dispatch, a grid barrier between phases.
    Persistent,
    /// One dispatch, each lane loading its first chunks of the next phase's weights between the
    /// barrier's arrival and its wait.
    Prefetch,
}

impl PhaseMode {
    pub const ALL: [PhaseMode; 3] = [
        PhaseMode::Dispatches,
        PhaseMode::Persistent,
        PhaseMode::Prefetch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PhaseMode::Dispatches => "a dispatch a phase",
            PhaseMode::Persistent => "one dispatch, grid barriers",
            PhaseMode::Prefetch => "one dispatch, grid barriers, next weights loaded in the wait",
        }
    }
}

/// A phase's sizes and where its data lies (words of the weights, floats of the scales and of
/// the activations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Phase {
    k: usize,
    n: usize,
    w: usize,
    s: usize,
    x: usize,
    y: usize,
}

/// The chain's layout: phases, and the sizes of the buffers they index.
#[derive(Debug, Clone)]
pub struct Layout {
    phases: Vec<Phase>,
    words: usize,
    scales: usize,
    floats: usize,
}

impl Layout {
    /// `layers` copies of `shapes`, each phase reading the first K of the one before's outputs
    /// (the first phase a K-float input). Refuses shapes the kernel does not take.
    pub fn new(shapes: &[(usize, usize)], layers: usize) -> Result<Layout, GpuError> {
        let bad = |m: String| Err(GpuError::Device(format!("phase chain: {m}")));
        let count = shapes.len().saturating_mul(layers);
        if count == 0 || count > MAX_PHASES {
            return bad(format!(
                "{count} phases; between 1 and {MAX_PHASES} run in one chain"
            ));
        }
        let (mut words, mut scales, mut floats) =
            (0usize, 0usize, shapes[0].0.div_ceil(64) * 64 + 64);
        let mut phases: Vec<Phase> = Vec::with_capacity(count);
        let mut prev = shapes[0].0;
        for i in 0..count {
            let (k, n) = shapes[i % shapes.len()];
            if k == 0 || n == 0 || k % 128 != 0 || k > MAX_K || k > prev {
                return bad(format!(
                    "phase {i} is {k}→{n}: K must be a multiple of 128, at most {MAX_K} and \
                     at most the phase before's N ({prev})"
                ));
            }
            let x = if i == 0 { 0 } else { phases[i - 1].y };
            let ph = Phase {
                k,
                n,
                w: words,
                s: scales,
                x,
                y: floats,
            };
            let grow = |a: usize, b: usize| a.checked_add(b).filter(|v| *v < 1 << 31);
            // Each output region starts a cache line (256 bytes) past the one before's end.
            let (Some(w), Some(s), Some(f)) = (
                grow(words, n * k / 8),
                grow(scales, n * k / 128),
                grow(floats, n.div_ceil(64) * 64 + 64),
            ) else {
                return bad("past 2^31 words of one buffer".into());
            };
            (words, scales, floats) = (w, s, f);
            phases.push(ph);
            prev = n;
        }
        Ok(Layout {
            phases,
            words,
            scales,
            floats,
        })
    }

    /// Bytes the chain's weights take: packed words and scales.
    pub fn weight_bytes(&self) -> u64 {
        4 * (self.words + self.scales) as u64
    }

    pub fn phases(&self) -> usize {
        self.phases.len()
    }

    /// The last phase's output count.
    pub fn outputs(&self) -> usize {
        self.phases.last().map_or(0, |p| p.n)
    }
}

/// Weight word `i` of a chain drawn from `seed`: any nibbles.
fn word(seed: u64, i: usize) -> u32 {
    let mut z = (seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_add(0x632B_E59B);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

/// Scale `i` of a phase taking `k` inputs: about one over the products' spread, so that values
/// stay near 1 along any number of phases.
fn scale(seed: u64, i: usize, k: usize) -> f32 {
    let u = word(seed ^ 0x5CA1E, i) >> 8;
    let spread = (21.25 * k as f64).sqrt() as f32;
    (0.5 + u as f32 / (1u32 << 24) as f32) / spread
}

/// The chain's input: `k` floats in [-1, 1).
fn input(seed: u64, k: usize) -> Vec<f32> {
    (0..k)
        .map(|i| (word(seed ^ 0x1A9, i) >> 8) as f32 / (1u32 << 23) as f32 - 1.0)
        .collect()
}

/// The last phase's outputs computed on the host, each row's sum in f64.
pub fn reference(layout: &Layout, seed: u64) -> Vec<f32> {
    let mut x = input(seed, layout.phases[0].k);
    for ph in &layout.phases {
        let words = ph.k / 8;
        let y: Vec<f32> = (0..ph.n)
            .map(|r| {
                let mut acc = 0f64;
                for j in 0..words {
                    let wd = word(seed, ph.w + r * words + j);
                    let sc = scale(seed, ph.s + r * (ph.k / 128) + j / 16, ph.k) as f64;
                    let mut part = 0f64;
                    for b in 0..8 {
                        let q = ((wd >> (4 * b)) & 15) as f64 - 8.0;
                        part += q * x[8 * j + b] as f64;
                    }
                    acc += sc * part;
                }
                acc as f32
            })
            .collect();
        x = y;
    }
    x
}

/// The chain's buffers on the GPU, filled once.
pub struct PhaseChain {
    ctx: Arc<Context>,
    layout: Layout,
    team: u32,
    /// `PTERIA_PHASE_SKIP`, read once.
    skip: u32,
    table: wgpu::Buffer,
    weights: wgpu::Buffer,
    scales: wgpu::Buffer,
    act: wgpu::Buffer,
    sync: wgpu::Buffer,
}

/// One run of the chain.
#[derive(Debug, Clone)]
pub struct PhaseRun {
    /// GPU time (timestamps where the device has them, else the wall clock around its submit
    /// and wait).
    pub seconds: f64,
    /// Grid waits that gave up: the workgroups were not all resident at once.
    pub failures: u32,
    /// The last phase's outputs.
    pub out: Vec<f32>,
}

impl PhaseChain {
    /// Uploads `layout`'s weights drawn from `seed`. Refuses buffers past the device's binding.
    pub fn new(ctx: &Arc<Context>, layout: Layout, seed: u64) -> Result<PhaseChain, GpuError> {
        let max = ctx.max_storage_binding();
        let wbytes = 4 * layout.words as u64;
        if wbytes > max || 4 * layout.scales as u64 > max || 4 * layout.floats as u64 > max {
            return Err(GpuError::Device(format!(
                "phase chain: {wbytes} bytes of weights past the device's {max}-byte binding"
            )));
        }
        let shared = ctx.limits().max_compute_workgroup_storage_size;
        if (shared as usize) < 4 * MAX_K {
            return Err(GpuError::Device(format!(
                "phase chain: needs {} bytes of workgroup memory, the device has {shared}",
                4 * MAX_K
            )));
        }
        let dev = &ctx.device;
        let storage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let buffer = |label, size: u64, usage| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: size.max(16),
                usage,
                mapped_at_creation: false,
            })
        };
        let weights = buffer("phase weights", wbytes, storage);
        // In pieces, so that the host never holds all of a big chain at once.
        const PIECE: usize = 1 << 24;
        for start in (0..layout.words).step_by(PIECE) {
            let v: Vec<u32> = (start..(start + PIECE).min(layout.words))
                .map(|i| word(seed, i))
                .collect();
            ctx.queue
                .write_buffer(&weights, 4 * start as u64, bytemuck::cast_slice(&v));
        }
        let mut sc = vec![0f32; layout.scales];
        for ph in &layout.phases {
            for (i, v) in sc[ph.s..ph.s + ph.n * ph.k / 128].iter_mut().enumerate() {
                *v = scale(seed, ph.s + i, ph.k);
            }
        }
        let scales = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("phase scales"),
            contents: bytemuck::cast_slice(&sc),
            usage: storage,
        });
        let act = buffer(
            "phase activations",
            4 * layout.floats as u64,
            storage | wgpu::BufferUsages::COPY_SRC,
        );
        ctx.queue.write_buffer(
            &act,
            0,
            bytemuck::cast_slice(&input(seed, layout.phases[0].k)),
        );
        let mut words = vec![0u32; 8 * MAX_PHASES];
        for (i, ph) in layout.phases.iter().enumerate() {
            let v = [ph.k, ph.n, ph.w, ph.s, ph.x, ph.y];
            for (d, s) in words[8 * i..8 * i + 6].iter_mut().zip(v) {
                *d = s as u32;
            }
        }
        let table = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("phase table"),
            contents: bytemuck::cast_slice(&words),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let sync = buffer("phase sync", 16, storage | wgpu::BufferUsages::COPY_SRC);
        // Lanes a row: 16 where subgroups hold that many, else what they hold; without
        // subgroups an invocation a row.
        let team = match ctx.subgroup_min() {
            Some(lo) if ctx.features().contains(wgpu::Features::SUBGROUP) => lo.clamp(1, 16),
            _ => 1,
        };
        ctx.take_errors()?;
        Ok(PhaseChain {
            ctx: ctx.clone(),
            layout,
            team,
            skip: std::env::var("PTERIA_PHASE_SKIP")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            table,
            weights,
            scales,
            act,
            sync,
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Runs the whole chain once on `workgroups` workgroups of 256 invocations.
    pub fn run(&self, workgroups: u32, mode: PhaseMode) -> Result<PhaseRun, GpuError> {
        let ctx = &self.ctx;
        if workgroups == 0 || workgroups > ctx.max_workgroups() {
            return Err(GpuError::Device(format!(
                "phase chain: {workgroups} workgroups is not a dispatch this device runs"
            )));
        }
        let _turn = ctx.turn();
        let pipe = ctx.pipeline(
            "phase_chain",
            "main",
            &[
                ("WG", WG as f64),
                ("TEAM", self.team as f64),
                ("SKIP", self.skip as f64),
            ],
            &[
                Slot::Uniform,
                Slot::Uniform,
                Slot::Read,
                Slot::Read,
                Slot::Write,
                Slot::Write,
            ],
        )?;
        let dev = &ctx.device;
        let count = self.layout.phases.len() as u32;
        // (first, count, prefetch) of each dispatch.
        let calls: Vec<[u32; 4]> = match mode {
            PhaseMode::Dispatches => (0..count).map(|i| [i, 1, 0, 0]).collect(),
            PhaseMode::Persistent => vec![[0, count, 0, 0]],
            PhaseMode::Prefetch => vec![[0, count, 1, 0]],
        };
        let binds: Vec<wgpu::BindGroup> = calls
            .iter()
            .map(|c| {
                let params = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("phase params"),
                    contents: bytemuck::cast_slice(c),
                    usage: wgpu::BufferUsages::UNIFORM,
                });
                super::bench::bind_in_order(
                    ctx,
                    &pipe.layout,
                    &[
                        &params,
                        &self.table,
                        &self.weights,
                        &self.scales,
                        &self.act,
                        &self.sync,
                    ],
                )
            })
            .collect();
        let last = self.layout.phases[self.layout.phases.len() - 1];
        let out_bytes = 4 * last.n as u64;
        let read = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("phase read"),
            size: 16 + out_bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let out_at = 4 * last.y as u64;
        let binds: Vec<&wgpu::BindGroup> = binds.iter().collect();
        let seconds = super::bench::timed_dispatches(
            ctx,
            &pipe.pipeline,
            &binds,
            workgroups,
            |enc| {
                enc.clear_buffer(&self.sync, 0, None);
                // Every output region zero, the input kept: a stale read reads zeros.
                enc.clear_buffer(&self.act, 4 * self.layout.phases[0].y as u64, None);
            },
            |enc| {
                enc.copy_buffer_to_buffer(&self.sync, 0, &read, 0, 16);
                enc.copy_buffer_to_buffer(&self.act, out_at, &read, 16, out_bytes);
            },
        )?;
        let bytes = super::executor::read_back(ctx, &read)?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes[..16]);
        let out: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes[16..]);
        let mut failures = words[1];
        // Every workgroup counted once a barrier, unless a failure ended the waiting.
        if mode != PhaseMode::Dispatches && failures == 0 && words[0] != (count - 1) * workgroups {
            failures = 1;
        }
        Ok(PhaseRun {
            seconds,
            failures,
            out,
        })
    }
}

/// One mode's timing of a chain (`phase_bench`).
#[derive(Debug, Clone, Serialize)]
pub struct PhaseResult {
    pub mode: PhaseMode,
    pub workgroups: u32,
    /// The least and the median GPU time of the timed runs, in µs; `None` where a run failed.
    pub min_us: Option<f64>,
    pub median_us: Option<f64>,
    pub failures: u32,
    /// Whether the outputs equal the first mode's bit for bit.
    pub same_bits: bool,
}

/// The chain in every mode on each of `grids` workgroup counts: `runs` timed runs after two
/// untimed.
pub fn phase_bench(
    chain: &PhaseChain,
    grids: &[u32],
    runs: usize,
) -> Result<Vec<PhaseResult>, GpuError> {
    let mut first: Option<Vec<u32>> = None;
    let mut out = Vec::new();
    for &g in grids {
        for mode in PhaseMode::ALL {
            let mut times = Vec::new();
            let mut failures = 0;
            let mut same = true;
            for i in 0..runs + 2 {
                let r = chain.run(g, mode)?;
                if r.failures > 0 {
                    failures = r.failures;
                    break;
                }
                let bits: Vec<u32> = r.out.iter().map(|v| v.to_bits()).collect();
                match &first {
                    Some(f) => same &= *f == bits,
                    None => first = Some(bits),
                }
                if i >= 2 {
                    times.push(r.seconds * 1e6);
                }
            }
            times.sort_by(f64::total_cmp);
            let ok = failures == 0 && !times.is_empty();
            out.push(PhaseResult {
                mode,
                workgroups: g,
                min_us: ok.then(|| times[0]),
                median_us: ok.then(|| times[times.len() / 2]),
                failures,
                same_bits: same,
            });
        }
    }
    Ok(out)
}
