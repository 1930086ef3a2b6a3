//! `pteria inspect FILE.pte [--ptd FILE]`: what a program contains.

use anyhow::Result;
use pteria::pte::{EValue, Program, TensorData};
use pteria::runtime::{constant_method, Output};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The .pte program.
    file: PathBuf,
    /// External data (.ptd) files to merge.
    #[arg(long)]
    ptd: Vec<PathBuf>,
    /// Also list every method's instructions with their arguments (values as `%N`).
    #[arg(long)]
    instructions: bool,
    /// Also list each method's IR graph as the executors run it (after the load-time passes).
    #[arg(long)]
    ir: bool,
}

pub fn run(a: Args) -> Result<()> {
    let ptds: Vec<&std::path::Path> = a.ptd.iter().map(|p| p.as_path()).collect();
    let p = Program::open(&a.file, &ptds)?;
    let mut text = describe(&p)?;
    if a.instructions {
        for m in p.plans.iter().filter(|m| !m.is_constant()) {
            text += &instructions(m);
        }
    }
    if a.ir {
        for m in p.plans.iter().filter(|m| !m.is_constant()) {
            text += &ir_listing(&p, m);
        }
    }
    // A reader that stops early (`| head`) is not an error; `print!` would panic on it.
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

pub(crate) fn fmt_bytes(n: usize) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

fn tensor_desc(v: &EValue) -> String {
    match v {
        EValue::Tensor(t) => {
            let dims: Vec<String> = t.sizes.iter().map(|s| s.to_string()).collect();
            let dynamic = match t.dynamism {
                pteria::pte::Dynamism::Static => "",
                _ => " (dynamic, upper bounds)",
            };
            format!("{}[{}]{dynamic}", t.dtype, dims.join(", "))
        }
        other => other.kind().to_string(),
    }
}

/// One value as an instruction argument: `%N` and what it holds (lists by their members).
fn arg_desc(m: &pteria::pte::ExecutionPlan, v: usize) -> String {
    let member = |v: usize| match m.values.get(v) {
        Some(EValue::Int(i)) => format!("%{v}={i}"),
        _ => format!("%{v}"),
    };
    let body = match m.values.get(v) {
        None => "missing".to_string(),
        Some(EValue::Int(i)) => i.to_string(),
        Some(EValue::Double(d)) => d.to_string(),
        Some(EValue::Bool(b)) => b.to_string(),
        Some(EValue::IntList(l)) | Some(EValue::TensorList(l)) => {
            format!(
                "[{}]",
                l.iter().map(|&v| member(v)).collect::<Vec<_>>().join(", ")
            )
        }
        Some(EValue::OptionalTensorList(l)) => format!(
            "[{}]",
            l.iter()
                .map(|v| v.map_or("None".into(), |v| format!("%{v}")))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Some(t @ EValue::Tensor(info)) => {
            let place = match info.data {
                TensorData::Constant(_) => " const",
                _ => "",
            };
            format!("{}{place}", tensor_desc(t))
        }
        Some(e) => e.kind().to_string(),
    };
    format!("%{v}: {body}")
}

/// `inspect --instructions`: each instruction of a method, one a line.
fn instructions(m: &pteria::pte::ExecutionPlan) -> String {
    use pteria::pte::Instruction;
    let mut s = format!("instructions of {}:\n", m.name);
    for (i, ins) in m.instructions.iter().enumerate() {
        let (name, args) = match ins {
            Instruction::Kernel { op, args } => (
                m.operators.get(*op).map_or("?".into(), |o| o.key()),
                args.clone(),
            ),
            Instruction::Delegate { delegate, args } => {
                let id = m.delegates.get(*delegate).map_or("?", |d| d.id.as_str());
                (format!("delegate {delegate} ({id})"), args.clone())
            }
            Instruction::Move { from, to } => ("move".into(), vec![*from, *to]),
            Instruction::JumpFalse { cond, dest } => (format!("jump_false to {dest}"), vec![*cond]),
            Instruction::Free { value } => ("free".into(), vec![*value]),
        };
        let args: Vec<String> = args.iter().map(|&v| arg_desc(m, v)).collect();
        s += &format!("  {i:5} {name}({})\n", args.join(", "));
    }
    s
}

/// One line a node of the method's graph: ops with their tensors (`%id dtype[upper bounds]`,
/// the role where it is not an activation), host integers as they are computed.
fn ir_listing(p: &Program, m: &pteria::pte::ExecutionPlan) -> String {
    use pteria::ir::{Node, Role};
    use std::fmt::Write;
    let backends = pteria::frontend::backends(pteria::runtime::delegate::cpu_executor());
    let g = pteria::runtime::whole::lower_method(m, &p.named_data, &backends);
    let mut s = format!("  {} IR:\n", m.name);
    let g = match g {
        Ok(g) => g,
        Err(why) => {
            let _ = writeln!(s, "    (not one graph: {why})");
            return s;
        }
    };
    let t = |id: usize| {
        let d = &g.tensors[id];
        let role = match d.role {
            Role::Activation => "",
            Role::Input(_) => " input",
            Role::Constant(_) => " const",
            Role::State(_) => " state",
        };
        format!("%{id} {:?}{:?}{role}", d.dtype, d.max_shape)
    };
    for (i, n) in g.nodes.iter().enumerate() {
        let _ = match n {
            Node::Op(o) => {
                let ins: Vec<String> = o.inputs.iter().map(|&x| t(x)).collect();
                let outs: Vec<String> = o.outputs.iter().map(|&x| t(x)).collect();
                writeln!(
                    s,
                    "    {i:5} {} {:?} ({}) -> ({})",
                    o.kind.name(),
                    o.kind,
                    ins.join(", "),
                    outs.join(", ")
                )
            }
            Node::Sym(op) => writeln!(s, "    {i:5} {op:?}"),
        };
    }
    let outs: Vec<String> = g.outputs.iter().map(|&x| t(x)).collect();
    let _ = writeln!(s, "    outputs: {}", outs.join(", "));
    s
}

fn output_desc(o: &Output) -> String {
    match o {
        Output::Int(i) => i.to_string(),
        Output::Bool(b) => b.to_string(),
        Output::Double(d) => d.to_string(),
        Output::String(s) => format!("{s:?}"),
        Output::IntList(l) => format!("{l:?}"),
        Output::None => "None".into(),
        Output::Tensor(t) => format!("tensor {}{:?}", t.dtype.name(), t.sizes),
    }
}

/// The text `inspect` prints; a library-free function so tests can call the binary and read it.
pub fn describe(p: &Program) -> Result<String> {
    use std::fmt::Write;
    let mut s = String::new();
    writeln!(
        s,
        "program: {} bytes, schema version {}",
        p.file_len(),
        p.version
    )?;
    let (methods, metadata): (Vec<_>, Vec<_>) = p.plans.iter().partition(|m| !m.is_constant());
    writeln!(s, "methods:")?;
    for m in &methods {
        writeln!(s, "  {}:", m.name)?;
        for (i, &v) in m.inputs.iter().enumerate() {
            writeln!(s, "    input {i}: {}", tensor_desc(&m.values[v]))?;
        }
        for (i, &v) in m.outputs.iter().enumerate() {
            writeln!(s, "    output {i}: {}", tensor_desc(&m.values[v]))?;
        }
        let kernels = m
            .instructions
            .iter()
            .filter(|i| matches!(i, pteria::pte::Instruction::Kernel { .. }))
            .count();
        let delegate_calls = m.instructions.len() - kernels;
        writeln!(
            s,
            "    instructions: {} ({kernels} kernel calls, {delegate_calls} other)",
            m.instructions.len()
        )?;
        let mut hist = std::collections::BTreeMap::<String, usize>::new();
        for i in &m.instructions {
            if let pteria::pte::Instruction::Kernel { op, .. } = i {
                *hist.entry(m.operators[*op].key()).or_default() += 1;
            }
        }
        if !hist.is_empty() {
            writeln!(s, "    operators outside delegates (CPU runtime kernels):")?;
            for (k, n) in &hist {
                let mark = if pteria::runtime::kernels::lookup(k).is_some() {
                    ""
                } else {
                    "  [not supported]"
                };
                writeln!(s, "      {n:4} x {k}{mark}")?;
            }
        }
        if !m.delegates.is_empty() {
            let backends = pteria::frontend::backends(pteria::runtime::delegate::cpu_executor());
            match pteria::runtime::whole::lower_method(m, &p.named_data, &backends) {
                Ok(g) => {
                    let states: Vec<_> = g
                        .tensors
                        .iter()
                        .filter(|t| matches!(t.role, pteria::ir::Role::State(_)))
                        .collect();
                    writeln!(
                        s,
                        "    execution: whole method as one IR graph ({} ops, delegates and the ops \
                         between them; {} state tensors, {}, stay on the executor's device)",
                        g.ops().count(),
                        states.len(),
                        fmt_bytes(states.iter().map(|t| t.max_bytes()).sum())
                    )?;
                    let tables = pteria::gpu::host_gathered_tables(&g);
                    if !tables.is_empty() {
                        writeln!(
                            s,
                            "    on a GPU: {} embedding table(s), {}, stay in host memory and are \
                             gathered there (the GPU gets their rows), unless --tables puts them \
                             on the GPU (auto does on a discrete GPU with 8 GiB or more)",
                            tables.len(),
                            fmt_bytes(tables.iter().sum())
                        )?;
                    }
                }
                Err(why) => {
                    writeln!(
                        s,
                        "    execution: delegate by delegate, CPU kernels between them (not one \
                         graph: {why})"
                    )?;
                    let n = pteria::runtime::means_absorbed(m, &p.named_data, &backends);
                    if n > 0 {
                        writeln!(
                            s,
                            "    {n} x aten::mean.out run inside the delegate whose products \
                             they average (no products tensor)"
                        )?;
                    }
                }
            }
        }
        let arena: usize = m.arena_sizes.iter().sum();
        writeln!(
            s,
            "    planned memory: {} in {} arena(s)",
            fmt_bytes(arena),
            m.arena_sizes.len()
        )?;
        let consts: usize = m
            .values
            .iter()
            .filter_map(|v| match v {
                EValue::Tensor(t) if matches!(t.data, TensorData::Constant(_)) => Some(t.nbytes()),
                _ => None,
            })
            .sum();
        writeln!(s, "    constant tensors: {}", fmt_bytes(consts))?;
        // Delegates with the same ops print once (an LLM export repeats one per layer).
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, d) in m.delegates.iter().enumerate() {
            let mut body = String::new();
            match pteria::frontend::delegate_histogram(d, &p.named_data) {
                Some(Ok(hist)) => {
                    writeln!(body, "      blob ops:")?;
                    for (k, n) in &hist {
                        writeln!(body, "        {n:4} x {k}")?;
                    }
                }
                Some(Err(e)) => writeln!(body, "      blob does not parse: {e}")?,
                None => writeln!(body, "      (no front end reads this backend's format)")?,
            }
            match pteria::frontend::delegate_ir_histogram(d, &p.named_data) {
                Some(Ok(hist)) => {
                    writeln!(body, "      IR ops:")?;
                    for (k, n) in &hist {
                        writeln!(body, "        {n:4} x {k}")?;
                    }
                }
                Some(Err(e)) => writeln!(body, "      does not lower to the IR: {e}")?,
                None => {}
            }
            for (k, v) in &d.compile_specs {
                writeln!(body, "      compile spec {k}: {} bytes", v.len())?;
            }
            let key = format!("{}\n{body}", d.id);
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) => g.1.push(i),
                None => groups.push((key, vec![i])),
            }
        }
        if !m.delegates.is_empty() {
            writeln!(
                s,
                "    delegates: {} ({} distinct)",
                m.delegates.len(),
                groups.len()
            )?;
        }
        for (key, ids) in &groups {
            let d = &m.delegates[ids[0]];
            writeln!(
                s,
                "    delegate {}: backend {} ({} blob)",
                ids[0],
                d.id,
                fmt_bytes(d.data.len())
            )?;
            if ids.len() > 1 {
                let shown: Vec<String> = ids[1..].iter().take(12).map(|i| i.to_string()).collect();
                let more = if ids.len() > 13 { ", …" } else { "" };
                writeln!(
                    s,
                    "      same ops in {} more: {}{more}",
                    ids.len() - 1,
                    shown.join(", ")
                )?;
            }
            s.push_str(key.split_once('\n').map_or("", |k| k.1));
        }
    }
    if !metadata.is_empty() {
        writeln!(s, "metadata:")?;
        for m in &metadata {
            let out = constant_method(p, &m.name)?.unwrap_or_default();
            let vals: Vec<String> = out.iter().map(output_desc).collect();
            // A method returning several values (get_eos_ids) prints as a list.
            if vals.len() == 1 {
                writeln!(s, "  {} = {}", m.name, vals[0])?;
            } else {
                writeln!(s, "  {} = [{}]", m.name, vals.join(", "))?;
            }
        }
    }
    writeln!(s, "segments: {}", p.segments.len())?;
    // A per-layer export has a segment per delegate and weight: list the first few.
    const SHOWN: usize = 16;
    if p.segments.len() > SHOWN {
        writeln!(s, "  (first {SHOWN})")?;
    }
    for (i, r) in p.segments.iter().enumerate().take(SHOWN) {
        writeln!(
            s,
            "  segment {i}: {} at offset {}",
            fmt_bytes(r.len()),
            r.start
        )?;
    }
    writeln!(
        s,
        "named data: {} entries, {}",
        p.named_data.len(),
        fmt_bytes(p.named_data.total_bytes())
    )?;
    writeln!(s, "constant segment: {}", fmt_bytes(p.constant_bytes))?;
    writeln!(
        s,
        "weights total: {}",
        fmt_bytes(p.constant_bytes + p.named_data.total_bytes())
    )?;
    Ok(s)
}
