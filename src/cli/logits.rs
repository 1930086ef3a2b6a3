//! `pteria logits FILE.pte --prompt 5,7,9 --decode 3,8`: runs `forward` on the prompt, then each
//! decode token at the next position, and prints `{"steps":[[...],...]}`. Checks outside the test
//! suite parse this output, so its shape is a stable interface.

use anyhow::{bail, Context, Result};
use pteria::pte::Program;
use pteria::runtime::{DType, HostTensor, Method, Output};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    file: PathBuf,
    /// Prompt token ids, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    prompt: Vec<i64>,
    /// Tokens to feed one at a time after the prompt.
    #[arg(long, value_delimiter = ',')]
    decode: Vec<i64>,
    /// auto | cpu | gpu
    #[arg(long, default_value = "auto")]
    device: String,
    /// f32 | f16: how the GPU executor holds KV caches (f16: half the bytes, see README).
    #[arg(long, default_value = "f32")]
    kv: String,
    #[arg(long)]
    ptd: Vec<PathBuf>,
    /// Method to run.
    #[arg(long, default_value = "forward")]
    method: String,
}

pub fn run(a: Args) -> Result<()> {
    let device: pteria::runtime::delegate::Device = a.device.parse().map_err(anyhow::Error::msg)?;
    let kv: pteria::runtime::delegate::KvCache = a.kv.parse().map_err(anyhow::Error::msg)?;
    let ptds: Vec<&std::path::Path> = a.ptd.iter().map(|p| p.as_path()).collect();
    let program = Program::open(&a.file, &ptds)?;
    let (make, note, tally) =
        pteria::runtime::delegate::executor_tallied(device, kv).map_err(anyhow::Error::msg)?;
    if let Some(n) = note {
        eprintln!("{n}");
    }
    let backends = pteria::frontend::backends(make);
    let mut method = Method::load(&program, &a.method, &backends)?;
    if kv == pteria::runtime::delegate::KvCache::F16 {
        if let Some(n) = tally.get().f16_note() {
            eprintln!("{n}");
        }
    }
    let steps = run_steps(&mut method, &a.prompt, &a.decode)?;
    let json = serde_json::json!({ "steps": steps });
    println!("{json}");
    Ok(())
}

/// Feeds the prompt then each decode token; returns every call's flattened first output.
pub fn run_steps(method: &mut Method, prompt: &[i64], decode: &[i64]) -> Result<Vec<Vec<f32>>> {
    let specs = method.input_specs();
    if specs.len() != 2 {
        bail!(
            "method `{}` takes {} tensor inputs; expected (tokens, input_pos)",
            method.name(),
            specs.len()
        );
    }
    let (tok_dt, tok_bounds) = &specs[0];
    let (pos_dt, pos_bounds) = &specs[1];
    // input_pos is either one position per token ([T]) or just the start position ([1]).
    let max_t = tok_bounds.last().copied().unwrap_or(1);
    let pos_is_start = pos_bounds.iter().product::<usize>() == 1 && max_t > 1;
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let mut out = Vec::new();
    let mut pos = 0i64;
    let mut calls: Vec<&[i64]> = vec![prompt];
    calls.extend(decode.iter().map(std::slice::from_ref));
    for toks in calls {
        let t = toks.len();
        let positions: Vec<i64> = if pos_is_start {
            vec![pos]
        } else {
            (pos..pos + t as i64).collect()
        };
        let tok = HostTensor::from_i64(&[1, t], toks).cast(*tok_dt);
        let p = HostTensor::from_i64(&[positions.len()], &positions).cast(*pos_dt);
        let res = method
            .execute(&[tok, p])
            .with_context(|| format!("call at position {pos}"))?;
        match res.first() {
            Some(Output::Tensor(t)) if t.dtype.is_float() => {
                out.push(t.to_f32().map_err(anyhow::Error::msg)?)
            }
            Some(Output::Tensor(t)) => bail!("output is {}, not a float tensor", t.dtype.name()),
            _ => bail!("method returned no tensor"),
        }
        pos += t as i64;
    }
    let _ = DType::F32;
    Ok(out)
}
