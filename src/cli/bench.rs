//! `pteria bench --kernels`: the decode mat-vec table at Gemma 4 E2B shapes against the device's
//! streaming bandwidth. `pteria bench FILE.pte`: prefill and decode speed of a program.

use anyhow::{bail, Result};
use pteria::gpu::bench::{kernel_bench, KernelBenchOptions, MatVecResult};
use pteria::gpu::HostTimes;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// The program to benchmark (not with --kernels).
    file: Option<PathBuf>,
    /// Benchmark the decode mat-vec kernels instead of a program.
    #[arg(long)]
    kernels: bool,
    /// Benchmark a decode step's chain of mat-vecs as a dispatch a phase against one persistent
    /// dispatch with barriers across its workgroups (an experiment, not a program).
    #[arg(long)]
    phases: bool,
    /// Phases: layers of Gemma 4 E2B's six mat-vecs the chain runs (at most 42).
    #[arg(long, default_value_t = 35)]
    layers: usize,
    /// Phases: workgroup counts to run the chain on (default: one and two a multiprocessor of
    /// an H100/H200, 132 and 264, and 528).
    #[arg(long, value_delimiter = ',')]
    grids: Vec<u32>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Kernels: MiB each case chains through, weights and activations (keep it well past the
    /// GPU's caches).
    #[arg(long, default_value_t = 256)]
    mib: u64,
    /// Kernels: only these K→N shapes, e.g. `1536x6144,12288x1536`.
    #[arg(long, value_delimiter = ',')]
    shapes: Vec<String>,
    /// Kernels: only these weight formats: f32, q8g128, q4g128, q4g128dq8, q4g32.
    #[arg(long, value_delimiter = ',')]
    weights: Vec<String>,
    /// Kernels: leave subgroup operations off (the shared-memory reduction paths).
    #[arg(long)]
    no_subgroups: bool,
    /// Kernels: rows of x each linear takes (1: the decode mat-vec; more: a prompt's linear,
    /// whose table adds its rate in tera-operations a second, a multiply-add being two).
    #[arg(long, default_value_t = 1)]
    rows: usize,
    /// Program: prompt tokens in the prefill call.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Program: position of the prompt's first token: a chat turn after that many earlier
    /// tokens (their cache rows hold whatever the calls before left; attention reads them).
    #[arg(long, default_value_t = 0)]
    start: usize,
    /// Program: decode steps after the prompt. With 0 the GPU time by op is the prompt's call's.
    #[arg(long, default_value_t = 32)]
    decode: usize,
    /// Program: auto | cpu | gpu
    #[arg(long, default_value = "auto")]
    device: String,
    /// Program: f32 | f16, how the GPU executor holds KV caches. f16 also runs the calls with
    /// f32 caches and reports the logits' error against them.
    #[arg(long, default_value = "f32")]
    kv: String,
    /// Program: auto | host | gpu, where big embedding tables live. On the host the host
    /// gathers their rows before each call; on the GPU (+their size in GPU memory) decode steps
    /// can also run one ahead, fed the last step's pick on the device; auto puts them on a
    /// discrete GPU with at least 8 GiB of its own memory.
    #[arg(long, default_value = "auto")]
    tables: String,
    /// Program: method to run (takes tokens [1, T] and positions).
    #[arg(long, default_value = "forward")]
    method: String,
    /// Program: also list a decode step's dispatches in recording order, each with its op,
    /// kernel entry, workgroups and GPU time.
    #[arg(long)]
    trace: bool,
}

pub fn run(a: Args) -> Result<()> {
    if a.kernels {
        return kernels(&a);
    }
    if a.phases {
        return phases(&a);
    }
    let Some(file) = &a.file else {
        bail!("give a program to benchmark, or --kernels");
    };
    program(&a, file)
}

/// A field of this process's `/proc/self/status` (Linux), in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Peak resident host memory of this process (`VmHWM`), in bytes: file pages it mapped count.
fn peak_host_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

#[derive(serde::Serialize)]
struct OpShare {
    op: String,
    calls: usize,
    us: f64,
    pct: f64,
}

#[derive(serde::Serialize)]
struct TracedDispatch {
    node: usize,
    op: String,
    entry: String,
    groups: [u32; 3],
    us: f64,
}

/// A warm prompt's call on the host, ms: as `HostTimes` (nothing is encoded ahead of a prompt),
/// and the rest of the call (the runtime outside the executors: glue ops, host gathers).
#[derive(serde::Serialize, Clone, Copy)]
struct PrefillHost {
    prepare: f64,
    encode: f64,
    wait: f64,
    outputs: f64,
    other: f64,
}

#[derive(serde::Serialize)]
struct ProgramReport {
    file: String,
    device: String,
    load_s: f64,
    prompt_len: usize,
    /// Position of the prompt's first token.
    start: usize,
    decode_steps: usize,
    /// The first prefill call, pipelines and recordings made on the way.
    ttft_cold_ms: f64,
    /// A prefill of the same length once recorded: time to first token.
    ttft_ms: f64,
    prefill_tok_per_s: f64,
    /// The first decode step (records the decode call).
    decode_first_ms: f64,
    decode_ms: f64,
    decode_tok_per_s: f64,
    /// GPU memory the delegates' executors hold (weights, KV caches, activations).
    gpu_bytes: Option<u64>,
    /// Of `gpu_bytes`: the KV caches, and how many of them are held as f16 (`--kv f16`).
    kv_cache_bytes: Option<u64>,
    kv_caches: Option<usize>,
    f16_kv_caches: Option<usize>,
    /// With `--kv f16`: the worst and the last call's rel-L2 of the logits against the same
    /// calls with f32 KV caches (the prompt, then the decode steps).
    kv_f16_rel_l2_worst: Option<f64>,
    kv_f16_rel_l2_last: Option<f64>,
    peak_host_bytes: Option<u64>,
    /// Resident host memory once loaded: anonymous (the process's own, what a phone counts
    /// against it) and mapped file pages (the program file's, which the OS can drop).
    host_anon_bytes: Option<u64>,
    host_file_bytes: Option<u64>,
    /// GPU time of one decode step by op, from timestamps (summed over delegates).
    decode_gpu_us: Option<f64>,
    decode_ops: Vec<OpShare>,
    /// With `--trace`: a decode step's dispatches in recording order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    decode_trace: Vec<TracedDispatch>,
    /// With `--decode 0`: the GPU time of the prompt's call by op, from timestamps.
    prefill_gpu_us: Option<f64>,
    prefill_ops: Vec<OpShare>,
    /// `whole` (one IR graph per call) or why the method runs delegate by delegate.
    execution: String,
    /// GPU submits per decode step.
    submits_per_token: Option<f64>,
    /// The warm prompt's call on the host, ms.
    prefill_host_ms: Option<PrefillHost>,
    /// Of `decode_ms`, the executors' host phases per step: shape inference and recording
    /// lookup, input writes and encoding (or submitting what was encoded ahead), encoding the
    /// next step's commands ahead while the GPU runs, waiting for the GPU, and the outputs' copy; `decode_other_ms` is the rest (the runtime around the executors).
    decode_prepare_ms: Option<f64>,
    decode_encode_ms: Option<f64>,
    decode_ahead_ms: Option<f64>,
    decode_wait_ms: Option<f64>,
    decode_outputs_ms: Option<f64>,
    decode_other_ms: Option<f64>,
    /// Picking a token from the last call's logits (`llm::sampler`), in µs: greedy, and Gemma's
    /// defaults (temperature 1, top-k 64, top-p 0.95). The chat adds it to each token's time.
    sample_greedy_us: Option<f64>,
    sample_default_us: Option<f64>,
    /// Decode steps with the token picked and fed back, greedy and Gemma's defaults.
    picked_greedy: Option<Picked>,
    picked_default: Option<Picked>,
    /// Dispatches per decode step.
    dispatches_per_token: Option<usize>,
    /// The longest chain among them of dispatches that wait for an earlier one's data
    /// (`ExecutorStats::last_chain`): the fewest barriers a step could run with.
    dispatch_chain_per_token: Option<usize>,
    /// GPU time of a decode step's dispatches replayed back to back in one pass (no host work).
    decode_replay_gpu_us: Option<f64>,
    /// Linear weight bytes a decode step reads (the floor on its time).
    decode_weight_bytes: Option<u64>,
    /// The device's copy bandwidth (read + write), GB/s.
    stream_gb_per_s: Option<f64>,
    /// decode_replay_gpu_us over (decode_weight_bytes / stream bandwidth).
    decode_vs_bandwidth_floor: Option<f64>,
    /// GPU time of a dispatch that waits for the one before, µs (`gpu::bench::dependent_dispatch`).
    dependent_dispatch_us: Option<f64>,
    /// decode_replay_gpu_us over (dispatches_per_token × dependent_dispatch_us): how far a step is
    /// from the floor its chain of dispatches sets.
    decode_vs_dispatch_floor: Option<f64>,
}

fn program(a: &Args, file: &std::path::Path) -> Result<()> {
    use pteria::runtime::delegate::{self, Device};
    use pteria::runtime::{HostTensor, Method};
    use std::time::Instant;
    let device: Device = a.device.parse().map_err(anyhow::Error::msg)?;
    let kv: delegate::KvCache = a.kv.parse().map_err(anyhow::Error::msg)?;
    let tables: delegate::Tables = a.tables.parse().map_err(anyhow::Error::msg)?;
    let open = || delegate::open_gpu(kv, tables);
    let gpu_ctx = match device {
        Device::Cpu => None,
        Device::Gpu => Some(open()?),
        Device::Auto => open().ok().filter(|c| !c.adapter().is_cpu()),
    };
    if gpu_ctx.is_none() && kv == delegate::KvCache::F16 {
        bail!("--kv f16 needs the GPU executor (--device gpu)");
    }
    if gpu_ctx.is_none() && tables == delegate::Tables::Gpu {
        bail!("--tables gpu needs the GPU executor (--device gpu)");
    }
    let gpu_ctx = gpu_ctx.map(Arc::new);
    // The yardsticks, before the model's gigabytes are allocated.
    let stream = match &gpu_ctx {
        Some(ctx) if a.decode > 0 => {
            Some(pteria::gpu::bench::stream_bandwidth(ctx, 0.15).map_err(anyhow::Error::msg)?)
        }
        _ => None,
    };
    let dependent = match &gpu_ctx {
        Some(ctx) if a.decode > 0 => {
            Some(pteria::gpu::bench::dependent_dispatch(ctx, 0.2).map_err(anyhow::Error::msg)?)
        }
        _ => None,
    };
    let (make, handles, device_name) = match &gpu_ctx {
        Some(ctx) => {
            let name = ctx.adapter().to_string();
            let (f, h) = delegate::profiled_gpu_executor(ctx.clone());
            (f, Some(h), name)
        }
        None => (delegate::cpu_executor(), None, "cpu".to_string()),
    };
    let t0 = Instant::now();
    let program = pteria::pte::Program::open(file, &[])?;
    let backends = pteria::frontend::backends(make);
    let mut method = Method::load(&program, &a.method, &backends)?;
    let load_s = t0.elapsed().as_secs_f64();
    let (host_anon_bytes, host_file_bytes) = (status_bytes("RssAnon:"), status_bytes("RssFile:"));
    let specs = method.input_specs();
    if specs.len() != 2 {
        bail!(
            "method `{}` takes {} inputs; a benchmark needs (tokens [1, T], positions)",
            a.method,
            specs.len()
        );
    }
    let max_t = specs[0].1.last().copied().unwrap_or(1);
    let pos_is_start = specs[1].1.iter().product::<usize>() == 1 && max_t > 1;
    if a.prompt_len == 0 || a.prompt_len > max_t {
        bail!("--prompt-len must be 1..={max_t} for this method");
    }
    // The cache's length, as the export declares it (ModelMetadata's rule, without its
    // defaults for LLM runners); without the metadata methods, one position more than the
    // longest call (ExecuTorch exports T up to max_seq_len - 1). A metadata method that fails
    // is an error, not a guess.
    let raw = pteria::llm::RawMetadata::read(&program)?;
    let positions = (raw.max_context_len)
        .or(raw.max_seq_len)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n > 0)
        .unwrap_or(max_t + 1);
    let end = a
        .start
        .checked_add(a.prompt_len)
        .and_then(|e| e.checked_add(a.decode));
    if end.is_none_or(|e| e > positions) {
        let last = end.map_or_else(|| "past 2^64".to_string(), |e| (e - 1).to_string());
        bail!(
            "--start {} with --prompt-len {} and --decode {} reaches position {last}, past the \
             {positions} this program's cache holds",
            a.start,
            a.prompt_len,
            a.decode,
        );
    }
    // The last call's first output: the sampler is timed on its last row of logits.
    let mut last_out: Option<HostTensor> = None;
    let mut call = |tokens: &[i64], pos: i64| -> Result<f64> {
        let positions: Vec<i64> = if pos_is_start {
            vec![pos]
        } else {
            (pos..pos + tokens.len() as i64).collect()
        };
        let tok = HostTensor::from_i64(&[1, tokens.len()], tokens).cast(specs[0].0);
        let p = HostTensor::from_i64(&[positions.len()], &positions).cast(specs[1].0);
        let t = Instant::now();
        let outs = method.execute(&[tok, p])?;
        let dt = t.elapsed().as_secs_f64();
        if let Some(pteria::runtime::Output::Tensor(h)) = outs.into_iter().next() {
            last_out = Some(h);
        }
        Ok(dt)
    };
    // Token ids well inside any vocabulary; speed does not depend on them.
    let prompt: Vec<i64> = (0..a.prompt_len as i64).map(|i| 2 + i % 100).collect();
    // Submits and host phase times summed over the executors.
    let counters = |h: &Option<delegate::ProfiledHandles>| -> Option<(usize, HostTimes)> {
        let list = h.as_ref()?.lock().ok()?;
        let mut host = HostTimes::default();
        let mut submits = 0;
        for e in list.iter() {
            let s = e.lock().ok()?.stats();
            submits += s.submits;
            host.add(&s.host);
        }
        Some((submits, host))
    };
    let cold = call(&prompt, a.start as i64)?;
    let before = counters(&handles);
    let ttft = call(&prompt, a.start as i64)?;
    // Where the warm prompt's time went on the host (the rest is the runtime's own work).
    let prefill_host = match (before, counters(&handles)) {
        (Some((_, h0)), Some((_, h1))) => {
            let h = h1.since(&h0);
            Some([h.prepare_ns, h.encode_ns, h.wait_ns, h.outputs_ns].map(|ns| ns as f64 / 1e6))
        }
        _ => None,
    };
    let mut first = 0.0;
    let mut decode_total = 0.0;
    let mut counters0 = None;
    for i in 0..a.decode {
        if i == 1 {
            counters0 = counters(&handles);
        }
        let dt = call(&[7], (a.start + a.prompt_len + i) as i64)?;
        if i == 0 {
            first = dt;
        } else {
            decode_total += dt;
        }
    }
    let sampling = match last_out.as_ref().and_then(last_row) {
        Some(row) if !row.is_empty() => Some(sample_cost(&row)?),
        _ => None,
    };
    let timed = a.decode.saturating_sub(1).max(1) as f64;
    let decode_ms = if a.decode > 1 {
        decode_total / timed * 1e3
    } else {
        first * 1e3
    };
    let (submits_per_token, host) = match (counters0, counters(&handles)) {
        (Some((s0, h0)), Some((s1, h1))) if a.decode > 1 => {
            (Some((s1 - s0) as f64 / timed), Some(h1.since(&h0)))
        }
        _ => (None, None),
    };
    // The chat's decode: each step's token picked and fed back, from the whole row and (where
    // the method reduces rows on the GPU) from its candidates. It ends on a plain step, so that
    // the replays below time the same recording as before.
    let picked = if a.decode > 1 {
        use pteria::llm::sampler::SamplingParams;
        let steps = Steps {
            specs: &specs,
            start: a.start + a.prompt_len,
            steps: a.decode,
        };
        Some([
            picked_decode(&mut method, &steps, SamplingParams::greedy())?,
            picked_decode(&mut method, &steps, SamplingParams::default())?,
        ])
    } else {
        None
    };
    let per_step = |ns: u64| ns as f64 / timed / 1e6;
    let host_ms = host.map(|h| {
        [
            h.prepare_ns,
            h.encode_ns,
            h.ahead_ns,
            h.wait_ns,
            h.outputs_ns,
        ]
        .map(per_step)
    });
    let mut ops: Vec<OpShare> = Vec::new();
    let mut trace: Vec<TracedDispatch> = Vec::new();
    let mut gpu_bytes = None;
    let mut kv_mem = pteria::gpu::MemoryReport::default();
    let mut decode_gpu = None;
    let (mut replay_us, mut weight_bytes, mut dispatches) = (None, None, None);
    let mut chain = None;
    if let Some(h) = &handles {
        let list = h
            .lock()
            .map_err(|_| anyhow::anyhow!("executor list poisoned"))?;
        let mut total_mem = 0;
        let mut total_t = 0.0;
        let mut any = false;
        for e in list.iter() {
            let mut e = e.lock().map_err(|_| anyhow::anyhow!("executor poisoned"))?;
            let m = e.memory();
            total_mem += m.total();
            kv_mem.kv_cache += m.kv_cache;
            kv_mem.kv_caches += m.kv_caches;
            kv_mem.f16_kv_caches += m.f16_kv_caches;
            // Without decode steps the last call is the prompt's: only its ops are timed.
            if a.decode > 0 {
                *weight_bytes.get_or_insert(0) += e.linear_weight_bytes();
                *dispatches.get_or_insert(0) += e.stats().last_dispatches;
                *chain.get_or_insert(0) += e.stats().last_chain;
                if let Some(t) = e.time_last(10).map_err(anyhow::Error::msg)? {
                    *replay_us.get_or_insert(0.0) += t.seconds * 1e6;
                }
            }
            if let Some(times) = e.profile_last().map_err(anyhow::Error::msg)? {
                any = true;
                for t in times {
                    total_t += t.seconds;
                    if a.trace && a.decode > 0 {
                        trace.extend(t.dispatches.iter().map(|(entry, groups, s)| {
                            TracedDispatch {
                                node: t.node,
                                op: t.op.clone(),
                                entry: entry.clone(),
                                groups: *groups,
                                us: s * 1e6,
                            }
                        }));
                    }
                    match ops.iter_mut().find(|o| o.op == t.op) {
                        Some(o) => {
                            o.calls += 1;
                            o.us += t.seconds * 1e6;
                        }
                        None => ops.push(OpShare {
                            op: t.op,
                            calls: 1,
                            us: t.seconds * 1e6,
                            pct: 0.0,
                        }),
                    }
                }
            }
        }
        gpu_bytes = Some(total_mem);
        if any {
            decode_gpu = Some(total_t * 1e6);
            ops.iter_mut()
                .for_each(|o| o.pct = 100.0 * o.us / (total_t * 1e6).max(1e-9));
            ops.sort_by(|x, y| y.us.total_cmp(&x.us));
        }
    }
    let floor = match (replay_us, weight_bytes, stream) {
        (Some(us), Some(b), Some(bw)) if b > 0 => Some(us * 1e-6 / (b as f64 / bw)),
        _ => None,
    };
    // The f16 caches' error: the prompt and the decode steps again (each call overwrites the
    // cache rows it attends to), against a fresh load with f32 caches on the same device.
    let mut kv_err: Option<Vec<f64>> = None;
    if kv == delegate::KvCache::F16 {
        let decode: Vec<i64> = vec![7; a.decode];
        let f16 = super::logits::run_steps(&mut method, &prompt, &decode)?;
        let ctx = Arc::new(pteria::gpu::Context::new()?);
        let backends = pteria::frontend::backends(delegate::gpu_executor(ctx));
        let mut reference = Method::load(&program, &a.method, &backends)?;
        let f32 = super::logits::run_steps(&mut reference, &prompt, &decode)?;
        kv_err = Some(
            f16.iter()
                .zip(&f32)
                .map(|(x, y)| pteria::runtime::rel_l2(x, y))
                .collect(),
        );
    }
    // Without decode steps the timed call was the prompt's.
    let ((decode_gpu_us, decode_ops), (prefill_gpu_us, prefill_ops)) = if a.decode > 0 {
        ((decode_gpu, ops), (None, Vec::new()))
    } else {
        ((None, Vec::new()), (decode_gpu, ops))
    };
    let report = ProgramReport {
        execution: match method.whole_note() {
            _ if method.runs_whole() => "whole".into(),
            Some(why) => format!("per delegate ({why})"),
            None => "per delegate".into(),
        },
        submits_per_token,
        prefill_host_ms: prefill_host.map(|h| PrefillHost {
            prepare: h[0],
            encode: h[1],
            wait: h[2],
            outputs: h[3],
            other: ttft * 1e3 - h.iter().sum::<f64>(),
        }),
        decode_prepare_ms: host_ms.map(|h| h[0]),
        decode_encode_ms: host_ms.map(|h| h[1]),
        decode_ahead_ms: host_ms.map(|h| h[2]),
        decode_wait_ms: host_ms.map(|h| h[3]),
        decode_outputs_ms: host_ms.map(|h| h[4]),
        decode_other_ms: host_ms.map(|h| decode_ms - h.iter().sum::<f64>()),
        picked_greedy: picked.map(|p| p[0]),
        picked_default: picked.map(|p| p[1]),
        sample_greedy_us: sampling.map(|s| s.0),
        sample_default_us: sampling.map(|s| s.1),
        dispatches_per_token: dispatches,
        dispatch_chain_per_token: chain,
        decode_replay_gpu_us: replay_us,
        decode_weight_bytes: weight_bytes,
        stream_gb_per_s: stream.map(|b| b / 1e9),
        decode_vs_bandwidth_floor: floor,
        dependent_dispatch_us: dependent.map(|s| s * 1e6),
        decode_vs_dispatch_floor: match (replay_us, dispatches, dependent) {
            (Some(us), Some(n), Some(d)) if n > 0 => Some(us * 1e-6 / (n as f64 * d)),
            _ => None,
        },
        file: file.display().to_string(),
        device: device_name,
        load_s,
        prompt_len: a.prompt_len,
        start: a.start,
        decode_steps: a.decode,
        ttft_cold_ms: cold * 1e3,
        ttft_ms: ttft * 1e3,
        prefill_tok_per_s: a.prompt_len as f64 / ttft,
        decode_first_ms: first * 1e3,
        decode_ms,
        decode_tok_per_s: if a.decode > 0 { 1e3 / decode_ms } else { 0.0 },
        gpu_bytes,
        kv_cache_bytes: gpu_bytes.map(|_| kv_mem.kv_cache),
        kv_caches: gpu_bytes.map(|_| kv_mem.kv_caches),
        f16_kv_caches: gpu_bytes.map(|_| kv_mem.f16_kv_caches),
        kv_f16_rel_l2_worst: kv_err
            .as_ref()
            .map(|e| e.iter().fold(0f64, |m, &x| m.max(x))),
        kv_f16_rel_l2_last: kv_err.as_ref().and_then(|e| e.last().copied()),
        peak_host_bytes: peak_host_bytes(),
        host_anon_bytes,
        host_file_bytes,
        decode_gpu_us,
        decode_ops,
        decode_trace: trace,
        prefill_gpu_us,
        prefill_ops,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    let mib = |b: Option<u64>| {
        b.map_or("-".to_string(), |b| {
            format!("{:.1} MiB", b as f64 / 1048576.0)
        })
    };
    println!("{} on {}", report.file, report.device);
    println!(
        "load {:.2} s; execution: {}",
        report.load_s, report.execution
    );
    let from = match report.start {
        0 => String::new(),
        s => format!(" from position {s}"),
    };
    println!(
        "prefill {} tokens{from}: TTFT {:.2} ms ({:.2} ms cold), {:.1} tok/s",
        report.prompt_len, report.ttft_ms, report.ttft_cold_ms, report.prefill_tok_per_s
    );
    println!(
        "decode {} steps: {:.3} ms/token ({:.3} ms first), {:.1} tok/s",
        report.decode_steps, report.decode_ms, report.decode_first_ms, report.decode_tok_per_s
    );
    println!(
        "memory: GPU {}, peak host {}; host once loaded: {} anonymous, {} of mapped file",
        mib(report.gpu_bytes),
        mib(report.peak_host_bytes),
        mib(report.host_anon_bytes),
        mib(report.host_file_bytes)
    );
    if let (Some(b), Some(n), Some(h)) = (
        report.kv_cache_bytes,
        report.kv_caches,
        report.f16_kv_caches,
    ) {
        let b = super::inspect::fmt_bytes(b as usize);
        println!("KV cache: {b} in {n} caches, {h} of them f16");
    }
    if let (Some(w), Some(l)) = (report.kv_f16_rel_l2_worst, report.kv_f16_rel_l2_last) {
        println!("f16 KV cache vs f32: logits rel-L2 {w:.2e} worst call, {l:.2e} last call");
    }
    if let (Some(s), Some(d)) = (report.submits_per_token, report.dispatches_per_token) {
        print!("decode step: {s:.1} submits, {d} dispatches");
        match report.dispatch_chain_per_token {
            Some(c) => println!(", {c} of them on its longest chain of dependent ones"),
            None => println!(),
        }
    }
    if let Some(h) = &report.prefill_host_ms {
        println!(
            "prefill on the host: prepare {:.3} ms, inputs + submit {:.3} ms, wait for the GPU \
             {:.3} ms, outputs {:.3} ms, rest of the runtime {:.3} ms",
            h.prepare, h.encode, h.wait, h.outputs, h.other
        );
    }
    if let (Some(p), Some(e), Some(x), Some(w), Some(o), Some(r)) = (
        report.decode_prepare_ms,
        report.decode_encode_ms,
        report.decode_ahead_ms,
        report.decode_wait_ms,
        report.decode_outputs_ms,
        report.decode_other_ms,
    ) {
        println!(
            "decode step on the host: prepare {p:.3} ms, inputs + submit {e:.3} ms, next step \
             encoded ahead {x:.3} ms, wait for the GPU {w:.3} ms, outputs {o:.3} ms, rest of the \
             runtime {r:.3} ms"
        );
    }
    for (what, p) in [
        ("greedy", report.picked_greedy),
        (
            "temperature 1 / top-k 64 / top-p 0.95",
            report.picked_default,
        ),
    ] {
        let Some(p) = p else { continue };
        if let Some(a) = p.ahead_ms {
            println!(
                "decode with {what} picks fed back one step ahead on the GPU: {a:.3} ms/token ({} \
                 of {} picks undecided or not the host's, timed as kept)",
                p.missed, p.steps
            );
        }
        match p.candidates_ms {
            Some(c) => println!(
                "decode with {what} picks fed back: {:.3} ms/token reading the whole row, {c:.3} \
                 reading its candidates ({} of {} steps read the row too)",
                p.row_ms, p.fallbacks, p.steps
            ),
            None => println!(
                "decode with {what} picks fed back: {:.3} ms/token (no candidates here)",
                p.row_ms
            ),
        }
    }
    if let (Some(g), Some(d)) = (report.sample_greedy_us, report.sample_default_us) {
        println!(
            "sampling a token from the last logits: greedy {g:.1} us, temperature 1 / top-k 64 / \
             top-p 0.95 {d:.1} us"
        );
    }
    if let (Some(us), Some(b), Some(bw), Some(f)) = (
        report.decode_replay_gpu_us,
        report.decode_weight_bytes,
        report.stream_gb_per_s,
        report.decode_vs_bandwidth_floor,
    ) {
        println!(
            "decode step GPU time (replayed, one pass): {us:.1} us; linear weights {:.1} MiB at \
             {bw:.0} GB/s copy bandwidth = {:.1} us floor; ratio {f:.2}x",
            b as f64 / 1048576.0,
            b as f64 / (bw * 1e9) * 1e6
        );
    }
    if let (Some(d), Some(n), Some(f)) = (
        report.dependent_dispatch_us,
        report.dispatches_per_token,
        report.decode_vs_dispatch_floor,
    ) {
        println!(
            "a dispatch that waits for the one before: {d:.2} us; {n} of them = {:.1} us floor; \
             ratio {f:.2}x",
            n as f64 * d
        );
    }
    for (what, us, ops) in [
        ("decode step", report.decode_gpu_us, &report.decode_ops),
        ("prompt's call", report.prefill_gpu_us, &report.prefill_ops),
    ] {
        if let Some(us) = us {
            println!("{what} GPU time by op (timestamps, one pass per dispatch): {us:.1} us");
            for o in ops.iter().take(15) {
                println!(
                    "  {:<28} {:>5} calls {:>10.1} us {:>5.1}%",
                    o.op, o.calls, o.us, o.pct
                );
            }
        }
    }
    if !report.decode_trace.is_empty() {
        println!("decode step dispatches (node, op, kernel entry, workgroups, us):");
        for t in &report.decode_trace {
            let [x, y, z] = t.groups;
            println!(
                "  {:>5} {:<28} {:<28} {x}x{y}x{z} {:.1}",
                t.node, t.op, t.entry, t.us
            );
        }
    }
    Ok(())
}

/// A token's pick from a row of logits that the GPU makes each call (`gpu::bench::row_graph`,
/// model-like logits): the call and the pick, in µs, reading the row or its candidates.
#[derive(Debug, Clone, serde::Serialize)]
struct PickBench {
    vocab: usize,
    calls: usize,
    greedy_row_us: f64,
    greedy_candidates_us: f64,
    default_row_us: f64,
    default_candidates_us: f64,
    /// Candidates the last call with Gemma's defaults (top-k 64) found.
    default_found: usize,
    /// Calls one ahead, each fed the last one's pick on the device (greedy, then the defaults'
    /// draw), the host checking each pick from the candidates.
    greedy_ahead_us: f64,
    default_ahead_us: f64,
    /// Of the defaults' picks one ahead, those where the device's draw was not the host's.
    default_ahead_missed: usize,
}

fn pick_bench(ctx: &Arc<pteria::gpu::Context>) -> Result<PickBench> {
    use pteria::gpu::bench::{model_like_logits, row_graph};
    use pteria::ir::InputValue;
    use pteria::llm::sampler::{Sampler, SamplingParams};
    let (vocab, calls) = (262144, 200);
    let mut gpu =
        pteria::gpu::GpuExecutor::new(ctx.clone(), row_graph(&model_like_logits(vocab, 11)?, 1))?;
    let zero = 0f32.to_le_bytes();
    let inputs = [InputValue::Tensor {
        shape: vec![1],
        data: &zero,
    }];
    let mut time = |params: SamplingParams, cands: bool| -> Result<(f64, usize)> {
        let mut s = Sampler::new(SamplingParams {
            seed: Some(1),
            ..params
        })?;
        let mut found = 0;
        let mut t0 = std::time::Instant::now();
        for i in 0..calls + 10 {
            if i == 10 {
                t0 = std::time::Instant::now();
            }
            match s.candidates_wanted().filter(|_| cands) {
                Some(k) => {
                    let (_, c) = gpu.run_candidates(&inputs, 0, k)?;
                    found = c.found;
                    if s.sample_candidates(&c)?.is_none() {
                        bail!("{} candidates for k {k} did not decide the pick", c.found);
                    }
                }
                None => {
                    let out = gpu.run(&inputs)?;
                    let row: &[f32] = bytemuck::try_cast_slice(&out[0].data)
                        .map_err(|e| anyhow::anyhow!("logits: {e}"))?;
                    s.sample(row, &[])?;
                }
            }
        }
        Ok((t0.elapsed().as_secs_f64() * 1e6 / calls as f64, found))
    };
    // The same row made by a call whose token input is fed the last call's pick: two calls
    // in flight, as `Runner::decode_ahead` runs them.
    let mut fed = pteria::gpu::GpuExecutor::new(
        ctx.clone(),
        pteria::gpu::bench::token_row_graph(&model_like_logits(vocab, 11)?),
    )?;
    let mut ahead = |params: SamplingParams| -> Result<(f64, usize)> {
        use pteria::runtime::candidates::DevicePick;
        let s = Sampler::new(SamplingParams {
            seed: Some(1),
            ..params
        })?;
        let mut s = s;
        let greedy = s.is_greedy();
        let k = if greedy {
            1
        } else {
            s.candidates_wanted().unwrap_or(1)
        };
        let token = 7i64.to_le_bytes();
        let input = [InputValue::Tensor {
            shape: vec![1, 1],
            data: &token,
        }];
        let pick = |s: &Sampler, fed: bool| DevicePick {
            feed: 0,
            fed,
            draw: s.draw_ahead(fed as usize),
        };
        let mut missed = 0;
        let n = calls + 10;
        fed.start_candidates(&input, 0, k, Some(pick(&s, false)))?;
        let mut t0 = std::time::Instant::now();
        for i in 0..n {
            if i == 10 {
                t0 = std::time::Instant::now();
            }
            if i + 1 < n {
                fed.start_candidates(&input, 0, k, Some(pick(&s, true)))?;
            }
            let (_, c) = fed.finish_candidates()?;
            let (host, device) = if greedy {
                (c.first, c.first)
            } else {
                (s.sample_candidates(&c)?, c.drawn)
            };
            if host.is_none() {
                bail!("{} candidates for k {k} did not decide the pick", c.found);
            }
            missed += (host != device) as usize;
        }
        Ok((t0.elapsed().as_secs_f64() * 1e6 / calls as f64, missed))
    };
    // Two interleaved rounds; the faster of each.
    let mut best = [f64::MAX; 6];
    let mut default_found = 0;
    let mut default_ahead_missed = 0;
    for _ in 0..2 {
        let runs = [
            time(SamplingParams::greedy(), false)?,
            time(SamplingParams::greedy(), true)?,
            time(SamplingParams::default(), false)?,
            time(SamplingParams::default(), true)?,
            ahead(SamplingParams::greedy())?,
            ahead(SamplingParams::default())?,
        ];
        for (b, r) in best.iter_mut().zip(&runs) {
            *b = b.min(r.0);
        }
        default_found = runs[3].1;
        default_ahead_missed += runs[5].1;
    }
    Ok(PickBench {
        vocab,
        calls,
        greedy_row_us: best[0],
        greedy_candidates_us: best[1],
        default_row_us: best[2],
        default_candidates_us: best[3],
        default_found,
        greedy_ahead_us: best[4],
        default_ahead_us: best[5],
        default_ahead_missed,
    })
}

/// The last row (last dim) of a float output as f32: what a pick reads.
fn last_row(h: &pteria::runtime::HostTensor) -> Option<Vec<f32>> {
    if !h.dtype.is_float() {
        return None;
    }
    let v = pteria::runtime::tensor::to_f32(h.dtype, &h.data);
    let n = h.sizes.last().copied().unwrap_or(0).min(v.len());
    Some(v[v.len() - n..].to_vec())
}

/// A decode that picks each step's token and feeds it back (the chat's).
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Picked {
    steps: usize,
    /// ms a step, the pick included, reading the whole row of logits.
    row_ms: f64,
    /// The same reading the row's candidates (`Method::execute_candidates`), where it can.
    candidates_ms: Option<f64>,
    /// Steps whose candidates did not decide the pick, so that the row was read too.
    fallbacks: usize,
    /// Steps one ahead, each submitted with the last one's pick on the device
    /// (`Method::start_candidates`), where the method can feed its token input.
    ahead_ms: Option<f64>,
    /// Of those, steps whose pick the host could not decide from the candidates, or decided
    /// otherwise than the device (where the runner drops the step after and runs it again).
    missed: usize,
}

struct Steps<'a> {
    specs: &'a [(pteria::runtime::DType, Vec<usize>)],
    /// The first position (the steps overwrite the same cache rows each run).
    start: usize,
    steps: usize,
}

/// Times `s.steps` one-token decode steps picking with `params`, after two warm-up steps, both
/// ways, then runs the last plain step again.
fn picked_decode(
    method: &mut pteria::runtime::Method,
    s: &Steps,
    params: pteria::llm::sampler::SamplingParams,
) -> Result<Picked> {
    use pteria::llm::sampler::Sampler;
    use pteria::runtime::{HostTensor, Output};
    let inputs = |tok: u32, pos: usize| {
        [
            HostTensor::from_i64(&[1, 1], &[tok as i64]).cast(s.specs[0].0),
            HostTensor::from_i64(&[1], &[pos as i64]).cast(s.specs[1].0),
        ]
    };
    let row = |out: Output| -> Result<Vec<f32>> {
        match out {
            Output::Tensor(h) => last_row(&h),
            _ => None,
        }
        .ok_or_else(|| anyhow::anyhow!("the first output is not a float tensor"))
    };
    let mut sampler = Sampler::new(pteria::llm::sampler::SamplingParams {
        seed: Some(1),
        ..params
    })?;
    let mut fallbacks = 0;
    let mut run = |method: &mut pteria::runtime::Method, cands: bool| -> Result<f64> {
        let mut tok = 7u32;
        let mut t0 = std::time::Instant::now();
        for i in 0..s.steps + 2 {
            if i == 2 {
                t0 = std::time::Instant::now();
            }
            let io = inputs(tok, s.start + i % s.steps);
            tok = match sampler.candidates_wanted().filter(|_| cands) {
                Some(k) => {
                    let (_, c) = method.execute_candidates(&io, 0, k)?;
                    // As the runner picks: a greedy pick is also the device's own.
                    let pick = match sampler.sample_candidates(&c)? {
                        None if k == 1 => c.first,
                        t => t,
                    };
                    match pick {
                        Some(t) => t,
                        None => {
                            fallbacks += (i >= 2) as usize;
                            sampler.sample(&row(method.read_output(0)?)?, &[])?
                        }
                    }
                }
                None => {
                    let out = method.execute(&io)?.into_iter().next();
                    let out = out.ok_or_else(|| anyhow::anyhow!("no outputs"))?;
                    sampler.sample(&row(out)?, &[])?
                }
            };
        }
        Ok(t0.elapsed().as_secs_f64() * 1e3 / s.steps as f64)
    };
    let row_ms = run(method, false)?;
    let candidates_ms = if method.supports_candidates(0) {
        Some(run(method, true)?)
    } else {
        None
    };
    // Steps as the runner's `decode_ahead` makes them: step i + 1 submitted, fed step i's pick
    // on the device, before step i is read; the host then picks from step i's candidates and
    // counts where its pick is not the device's (the runner would drop step i + 1 there).
    let greedy = sampler.is_greedy();
    let mut missed = 0;
    let ahead_ms = match sampler.candidates_wanted() {
        Some(k) if (greedy || sampler.draw_ahead(0).is_some()) && method.supports_feed(0) => {
            let k = if greedy { 1 } else { k };
            let pick = |sampler: &Sampler, fed: bool| pteria::runtime::candidates::DevicePick {
                feed: 0,
                fed,
                draw: sampler.draw_ahead(fed as usize),
            };
            let n = s.steps + 2;
            let first = pick(&sampler, false);
            method.start_candidates(&inputs(7, s.start), 0, k, Some(first))?;
            let mut t0 = std::time::Instant::now();
            for i in 0..n {
                if i == 2 {
                    t0 = std::time::Instant::now();
                }
                if i + 1 < n {
                    let io = inputs(0, s.start + (i + 1) % s.steps);
                    method.start_candidates(&io, 0, k, Some(pick(&sampler, true)))?;
                }
                let (_, c) = method.finish_candidates()?;
                let (host, device) = if greedy {
                    (c.first, c.first)
                } else {
                    (sampler.sample_candidates(&c)?, c.drawn)
                };
                missed += (i >= 2 && (host.is_none() || host != device)) as usize;
            }
            Some(t0.elapsed().as_secs_f64() * 1e3 / s.steps as f64)
        }
        _ => None,
    };
    // The bench's last decode step again (its position too: attention's work grows with it).
    method.execute(&inputs(7, s.start + s.steps - 1))?;
    Ok(Picked {
        steps: s.steps,
        row_ms,
        candidates_ms,
        fallbacks,
        ahead_ms,
        missed,
    })
}

/// Microseconds a token's pick takes from `logits`: greedy, and Gemma's defaults, each the mean
/// of 50 draws after 5.
fn sample_cost(logits: &[f32]) -> Result<(f64, f64)> {
    use pteria::llm::sampler::{Sampler, SamplingParams};
    let us = |p: SamplingParams| -> Result<f64> {
        let mut s = Sampler::new(SamplingParams { seed: Some(1), ..p })?;
        for _ in 0..5 {
            s.sample(logits, &[])?;
        }
        let t = std::time::Instant::now();
        for _ in 0..50 {
            s.sample(logits, &[])?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / 50.0)
    };
    Ok((
        us(SamplingParams::greedy())?,
        us(SamplingParams::default())?,
    ))
}

fn phases(a: &Args) -> Result<()> {
    use pteria::gpu::phase_chain::{phase_bench, Layout, PhaseChain, LAYER_SHAPES};
    let layout = Layout::new(&LAYER_SHAPES, a.layers)?;
    if a.grids.contains(&0) {
        bail!("--grids: a grid of 0 workgroups runs nothing");
    }
    let ctx = Arc::new(pteria::gpu::Context::new()?);
    let stream = pteria::gpu::bench::stream_bandwidth(&ctx, 0.1)?;
    let dependent = pteria::gpu::bench::dependent_dispatch(&ctx, 0.2)?;
    let bytes = layout.weight_bytes();
    let chain = PhaseChain::new(&ctx, layout, 7)?;
    let grids = if a.grids.is_empty() {
        vec![132, 264, 528]
    } else {
        a.grids.clone()
    };
    let results = phase_bench(&chain, &grids, 9)?;
    let phases = chain.layout().phases();
    let floor_us = bytes as f64 / stream * 1e6;
    if a.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            adapter: String,
            layers: usize,
            phases: usize,
            weight_bytes: u64,
            stream_gb_per_s: f64,
            dependent_dispatch_us: f64,
            results: &'a [pteria::gpu::phase_chain::PhaseResult],
        }
        let o = Out {
            adapter: ctx.adapter().to_string(),
            layers: a.layers,
            phases,
            weight_bytes: bytes,
            stream_gb_per_s: stream / 1e9,
            dependent_dispatch_us: dependent * 1e6,
            results: &results,
        };
        println!("{}", serde_json::to_string(&o)?);
        return Ok(());
    }
    println!("{}", ctx.adapter());
    println!(
        "{} layers, {phases} phases, {:.1} MiB of weights: {floor_us:.1} us at the copy \
         bandwidth ({:.0} GB/s); a dispatch that waits for the one before {:.2} us",
        a.layers,
        bytes as f64 / (1u64 << 20) as f64,
        stream / 1e9,
        dependent * 1e6
    );
    for r in &results {
        match (r.min_us, r.median_us) {
            (Some(lo), Some(mid)) => println!(
                "{:>5} workgroups, {:<56} {lo:>9.1} us (median {mid:.1}), {:.2}x the bandwidth \
                 floor, {:.2} us a phase{}",
                r.workgroups,
                r.mode.name(),
                lo / floor_us,
                lo / phases as f64,
                if r.same_bits { "" } else { "; OUTPUTS DIFFER" }
            ),
            _ => println!(
                "{:>5} workgroups, {:<56} failed ({} waits gave up)",
                r.workgroups,
                r.mode.name(),
                r.failures
            ),
        }
    }
    Ok(())
}

fn kernels(a: &Args) -> Result<()> {
    if a.rows == 0 {
        bail!("--rows must be at least 1");
    }
    let ctx = Arc::new(pteria::gpu::Context::with_options(
        pteria::gpu::ContextOptions {
            no_subgroups: a.no_subgroups,
            ..Default::default()
        },
    )?);
    let mut opts = KernelBenchOptions {
        bytes: a.mib << 20,
        rows: a.rows,
        ..Default::default()
    };
    if !a.shapes.is_empty() {
        opts.shapes = a
            .shapes
            .iter()
            .map(|s| {
                let (k, n) = s
                    .split_once('x')
                    .ok_or_else(|| anyhow::anyhow!("shape `{s}` is not KxN"))?;
                Ok((k.trim().parse()?, n.trim().parse()?))
            })
            .collect::<Result<_>>()?;
    }
    if !a.weights.is_empty() {
        let name = |c: &pteria::gpu::bench::WeightCase| c.name();
        for w in &a.weights {
            if !opts.weights.iter().any(|c| name(c) == *w) {
                bail!("unknown weight format `{w}` (f32, q8g128, q4g128, q4g128dq8, q4g32)");
            }
        }
        opts.weights.retain(|c| a.weights.contains(&name(c)));
    }
    // Before the header: a case this device cannot run is refused with nothing printed.
    pteria::gpu::bench::check_cases(&ctx, &opts)?;
    let json = a.json;
    if !json {
        eprintln!("{}", ctx.adapter());
        println!(
            "{:>5} {:>6} {:>7} {:>12} {:>6} {:>9} {:>8} {:>7} {:>6} {:>6}",
            "M", "K", "N", "weights", "layers", "us", "GB/s", "stream%", "TOPS", "arith%"
        );
    }
    let row = |r: &MatVecResult| {
        if !json {
            let name = r.case.name();
            println!(
                "{:>5} {:>6} {:>7} {:>12} {:>6} {:>9.2} {:>8.0} {:>6.1}% {:>6.1} {:>5.1}%",
                r.m,
                r.k,
                r.n,
                name,
                r.layers,
                r.us,
                r.gb_per_s,
                r.pct_of_stream,
                r.tops,
                r.pct_of_arith
            );
        }
    };
    let report = kernel_bench(&ctx, &opts, row)?;
    let picks = pick_bench(&ctx)?;
    if json {
        #[derive(serde::Serialize)]
        struct Kernels<'a> {
            #[serde(flatten)]
            report: &'a pteria::gpu::bench::KernelReport,
            picks: &'a PickBench,
        }
        let all = Kernels {
            report: &report,
            picks: &picks,
        };
        println!("{}", serde_json::to_string(&all)?);
    } else {
        let sizes: Vec<String> = report
            .stream_sizes
            .iter()
            .map(|&(b, g)| format!("{} MiB {g:.0}", b >> 20))
            .collect();
        println!(
            "stream (WGSL copy, read+write): {:.0} GB/s, the best of {} GB/s; timestamps: {}",
            report.stream_gb_per_s,
            sizes.join(", "),
            report.timestamps
        );
        println!(
            "a dispatch that waits for the one before: {:.2} us; one that waits for nothing: {:.2} us",
            report.dependent_dispatch_us, report.independent_dispatch_us
        );
        println!(
            "integer dot products of 4 int8 pairs (dot4I8Packed): {:.2} T/s ({:.1} TOPS, a \
             multiply-add two); f32 multiply-adds: {:.2} T/s ({:.1} TFLOPS)",
            report.arith.dots_per_s / 1e12,
            8.0 * report.arith.dots_per_s / 1e12,
            report.arith.fmas_per_s / 1e12,
            2.0 * report.arith.fmas_per_s / 1e12
        );
        match (&report.raw_vulkan, &report.raw_vulkan_error) {
            (Some(r), _) => println!(
                "the same through the Vulkan driver alone (no wgpu): {:.2} us after a barrier, \
                 {:.2} us with the guard of its first load from a uniform; {:.2} us back to back \
                 without barriers",
                r.dependent_us, r.dependent_uniform_us, r.back_to_back_us
            ),
            (None, Some(e)) => println!("the Vulkan driver alone: not measured ({e})"),
            (None, None) => {}
        }
        for g in &report.grid_barrier {
            match g.us {
                Some(us) => println!(
                    "a barrier across {} workgroups of {} in one dispatch: {us:.2} us",
                    g.workgroups, g.invocations
                ),
                None => println!(
                    "a barrier across {} workgroups of {} in one dispatch: failed ({} waits gave up, {} stale reads)",
                    g.workgroups, g.invocations, g.failures, g.stale
                ),
            }
        }
        println!(
            "a token's pick from a {}-logit row the GPU makes (a call and the pick, host and GPU, \
             {} calls): greedy {:.1} us reading the row, {:.1} reading its candidates; \
             temperature 1 / top-k 64 / top-p 0.95 {:.1} us and {:.1} ({} candidates)",
            picks.vocab,
            picks.calls,
            picks.greedy_row_us,
            picks.greedy_candidates_us,
            picks.default_row_us,
            picks.default_candidates_us,
            picks.default_found
        );
        println!(
            "  the same one step ahead (each call fed the last one's pick on the GPU, the host \
             checking it): greedy {:.1} us, temperature 1 / top-k 64 / top-p 0.95 {:.1} us ({} \
             of {} device draws not the host's)",
            picks.greedy_ahead_us,
            picks.default_ahead_us,
            picks.default_ahead_missed,
            2 * (picks.calls + 10)
        );
        println!("prefill attention (8 heads on 1 kv head, causal from its start, [B, S, H, D]):");
        for r in &report.attention {
            let window = r.window.map_or("none".to_string(), |w| w.to_string());
            println!(
                "  {:>4} queries from {:>3}, head dim {:>3}, cache {}, window {:>4}: {:>9.1} us in {} dispatches",
                r.queries, r.start, r.head_dim, r.cache, window, r.us, r.dispatches
            );
        }
    }
    Ok(())
}
