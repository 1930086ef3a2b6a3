//! The full-size synthetic Gemma 4 E2B Vulkan program (the benchmark file, ~3 GB, not in the
//! repository) loads through the Vulkan front end and runs a prefill and decode steps end to end.
//! Its weights are synthetic, so this checks that it runs and how fast, not what it outputs.
//!
//! ```sh
//! gunzip -k e2b_shape_vulkan_8da4w.pte.gz
//! PTERIA_E2B_VULKAN=$PWD/e2b_shape_vulkan_8da4w.pte \
//!     cargo test --release --test e2b_shape -- --ignored --nocapture
//! # PTERIA_E2B_DEVICE=gpu runs the delegates on the GPU executor instead of the CPU one.
//! ```

use pteria::pte::Program;
use pteria::runtime::delegate::{executor_for, Device};
use pteria::runtime::{HostTensor, Method, Output};
use std::time::Instant;

/// Peak resident memory of this process so far, from /proc (Linux), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// CPU seconds (user + system, all threads) this process has used, from /proc (Linux): on a
/// shared machine it shows the work a call did apart from the time it waited for a core.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<f64> = rest
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    f.get(11)
        .zip(f.get(12))
        .map_or(f64::NAN, |(u, s)| (u + s) / 100.0)
}

#[test]
#[ignore = "needs the full-size benchmark program: set PTERIA_E2B_VULKAN"]
fn e2b_shape_vulkan_program_prefills_and_decodes() {
    let Ok(path) = std::env::var("PTERIA_E2B_VULKAN") else {
        panic!("set PTERIA_E2B_VULKAN to the decompressed e2b_shape_vulkan_8da4w.pte");
    };
    let device: Device = std::env::var("PTERIA_E2B_DEVICE")
        .unwrap_or_else(|_| "cpu".into())
        .parse()
        .unwrap();
    let (t0, c0) = (Instant::now(), cpu_secs());
    let program = Program::open(std::path::Path::new(&path), &[]).expect("program");
    let (make, note) = executor_for(device).expect("executor");
    if let Some(n) = note {
        println!("{n}");
    }
    let backends = pteria::frontend::backends(make);
    let mut method = Method::load(&program, "forward", &backends).expect("forward loads");
    let load = t0.elapsed();
    println!(
        "load: {:.2} s wall, {:.2} s CPU, peak RSS {:.0} MiB",
        load.as_secs_f64(),
        cpu_secs() - c0,
        peak_rss_mib().unwrap_or(f64::NAN)
    );

    let prompt = [2i64, 105, 2364, 107];
    let mut calls: Vec<Vec<i64>> = vec![prompt.to_vec()];
    calls.extend([[818i64], [236764], [1234]].iter().map(|t| t.to_vec()));
    let mut pos = 0i64;
    let mut decode_secs = Vec::new();
    for toks in &calls {
        let n = toks.len();
        let positions: Vec<i64> = (pos..pos + n as i64).collect();
        let (t, c) = (Instant::now(), cpu_secs());
        let out = method
            .execute(&[
                HostTensor::from_i64(&[1, n], toks),
                HostTensor::from_i64(&[n], &positions),
            ])
            .unwrap_or_else(|e| panic!("call at position {pos}: {e}"));
        let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_secs() - c);
        let Output::Tensor(logits) = &out[0] else {
            panic!("no logits")
        };
        assert_eq!(logits.sizes, [1, 1, 262144]);
        let v = logits.to_f32().unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "non-finite logits");
        // The final softcap bounds every logit by 30.
        assert!(v.iter().all(|x| x.abs() <= 30.0), "logits past the softcap");
        println!(
            "{} of {n} token(s) at position {pos}: {secs:.2} s wall, {cpu:.2} s CPU",
            if n > 1 { "prefill" } else { "decode" }
        );
        if n == 1 {
            decode_secs.push((secs, cpu));
        }
        pos += n as i64;
    }
    let n = decode_secs.len() as f64;
    let wall = decode_secs.iter().map(|d| d.0).sum::<f64>() / n;
    let cpu = decode_secs.iter().map(|d| d.1).sum::<f64>() / n;
    println!(
        "decode: {wall:.2} s/token wall, {cpu:.2} s/token CPU; peak RSS {:.0} MiB",
        peak_rss_mib().unwrap_or(f64::NAN)
    );
}
