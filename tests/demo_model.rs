//! The bundled demo model (assets/models/smollm2-135m-instruct): the chat template from its
//! tokenizer_config.json and its tokenizer.json reproduce the golden prompt ids, and greedy
//! generation reproduces the ExecuTorch Python runtime's token ids (golden.json, written by
//! tests/fixtures/export_demo_model.py on the same model.pte) with the whole method lowered to the
//! IR and run on the CPU executor. The one accepted difference is a near-tie: where the sequences
//! first part, the golden's top-2 logits are within `NEAR_TIE`. On the GPU executor, whose
//! softmax is not bit for bit the CPU's, the golden ids fed back pick the golden's tokens.

use pteria::llm::{
    CancelToken, ChatTemplate, LoadOptions, Message, Model, ModelFiles, RenderOptions, Role,
    Sampler, SamplingParams, Tokenizer,
};
use pteria::runtime::delegate::Device;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Instant;

/// Largest gap between the golden's top-2 logits at which a different pick is accepted.
const NEAR_TIE: f64 = 1e-3;

fn demo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/models/smollm2-135m-instruct")
}

struct GoldenPrompt {
    messages: Vec<Message>,
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    /// Per generated token: the golden's top-2 (id, logit).
    top2: Vec<[(u32, f64); 2]>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("an id")).expect("a u32 id"))
        .collect()
}

fn golden() -> Vec<GoldenPrompt> {
    let text = std::fs::read_to_string(demo_dir().join("golden.json")).expect("golden.json");
    let g: Value = serde_json::from_str(&text).expect("golden.json is JSON");
    g["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| GoldenPrompt {
            messages: p["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .map(|m| {
                    let content = m["content"].as_str().expect("content").to_string();
                    let role = match m["role"].as_str().expect("role") {
                        "system" => Role::System,
                        "user" => Role::User,
                        "assistant" => Role::Assistant,
                        r => panic!("unexpected role {r}"),
                    };
                    Message { role, content }
                })
                .collect(),
            prompt_ids: ids(&p["prompt_ids"]),
            generated_ids: ids(&p["generated_ids"]),
            top2: p["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .map(|s| {
                    let i = ids(&s["top2_ids"]);
                    let l: Vec<f64> = s["top2_logits"]
                        .as_array()
                        .expect("top2_logits")
                        .iter()
                        .map(|x| x.as_f64().expect("a logit"))
                        .collect();
                    [(i[0], l[0]), (i[1], l[1])]
                })
                .collect(),
        })
        .collect()
}

fn render(template: &ChatTemplate, tokenizer: &Tokenizer, messages: &[Message]) -> Vec<u32> {
    let text = template
        .render(
            messages,
            RenderOptions {
                add_generation_prompt: true,
                enable_thinking: false,
            },
        )
        .expect("the template renders");
    tokenizer.encode(&text).expect("the prompt tokenizes")
}

#[test]
fn template_and_tokenizer_reproduce_the_golden_prompt_ids() {
    let dir = demo_dir();
    let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json")).expect("tokenizer.json");
    let template = ChatTemplate::from_config_file(&dir.join("tokenizer_config.json"))
        .expect("tokenizer_config.json");
    let golden = golden();
    assert_eq!(golden.len(), 3);
    for (i, g) in golden.iter().enumerate() {
        assert_eq!(
            render(&template, &tokenizer, &g.messages),
            g.prompt_ids,
            "prompt {i}"
        );
    }
}

/// Greedy generation of the golden prompts `which` on `device`; panics on a difference that is not
/// a near-tie.
fn check_device(device: Device, which: &[usize]) {
    let dir = demo_dir();
    let files = ModelFiles::in_dir(&dir).expect("model files");
    let (options, note) = LoadOptions::on_device(device).expect("device opens");
    if let Some(n) = note {
        eprintln!("{n}");
    }
    let mut model = Model::load(files, &options).expect("the demo model loads");
    let stop_ids = model.stop_ids().to_vec();
    let never = CancelToken::new();
    let mut sampler = Sampler::new(SamplingParams::greedy()).expect("greedy sampler");
    for (p, g) in golden().iter().enumerate() {
        if !which.contains(&p) {
            continue;
        }
        let prompt = render(model.template(), model.tokenizer(), &g.messages);
        assert_eq!(prompt, g.prompt_ids, "{device:?}, prompt {p}");
        let runner = model.runner_mut();
        let mut seq = prompt.clone();
        let mut got: Vec<u32> = Vec::new();
        let start = Instant::now();
        for step in 0..g.generated_ids.len() {
            // A prefill that extends the cache runs only the new token: the decode call.
            runner
                .prefill(&seq, &never, &mut |_, _| {})
                .unwrap_or_else(|e| panic!("{device:?}, prompt {p}, step {step}: {e}"));
            let logits = runner.logits().expect("logits after prefill").to_vec();
            let tok = sampler.sample(&logits, &seq).expect("greedy pick");
            got.push(tok);
            let want = g.generated_ids[step];
            if tok != want {
                let [(a, la), (b, lb)] = g.top2[step];
                let ours = |id: u32| logits[id as usize];
                let info = format!(
                    "{device:?}, prompt {p}: first divergence at step {step}: golden picks {want}, \
                     Pteria {tok}; golden top-2 ({a}: {la:.6}, {b}: {lb:.6}, gap {:.2e}); Pteria's \
                     logits for them {:.6}, {:.6}",
                    la - lb,
                    ours(a),
                    ours(b)
                );
                eprintln!("{info}");
                let near_tie = (la - lb).abs() <= NEAR_TIE && [a, b].contains(&tok);
                assert!(near_tie, "{info}: not a near-tie");
                break;
            }
            if stop_ids.contains(&tok) {
                break;
            }
            seq.push(tok);
        }
        let text = model.tokenizer().decode(&got, false).unwrap_or_default();
        eprintln!(
            "{device:?}, prompt {p}: {} tokens in {:.1} s: {text:?}",
            got.len(),
            start.elapsed().as_secs_f64()
        );
        if got == g.generated_ids {
            continue;
        }
        // Only a near-tie (asserted above) may end the comparison early.
        assert!(got.len() < g.generated_ids.len() || got == g.generated_ids);
    }
}

/// All three golden chats (the first, "What is the capital of France?", 37 prompt tokens prefilled
/// in two chunks, 16 generated; then 64 and 25 generated) are reproduced token for token on the
/// CPU executor. This needs XNNPACK's exact blockwise 4-bit GEMM arithmetic (unsigned activations,
/// fused per-block multiply-add; `linear_qd8` in src/ir/cpu.rs): with the earlier arithmetic
/// (signed activations, separately rounded products) the second chat parted at step 2.
#[test]
fn demo_model_greedy_ids_match_the_golden_on_the_cpu_executor() {
    check_device(Device::Cpu, &[0, 1, 2]);
}

/// Fed the golden ids (teacher forcing) on `device`: per step, whether its pick is the golden's
/// and how far the golden's pick lies below its top logit; printed, and returned for asserts.
fn teacher_forced(device: Device) -> Vec<(bool, f32)> {
    let files = ModelFiles::in_dir(&demo_dir()).expect("model files");
    let (options, _) = LoadOptions::on_device(device).expect("device opens");
    let mut model = Model::load(files, &options).expect("the demo model loads");
    let never = CancelToken::new();
    let mut steps = Vec::new();
    for (p, g) in golden().iter().enumerate() {
        let mut seq = render(model.template(), model.tokenizer(), &g.messages);
        let runner = model.runner_mut();
        // A new chat: the runner resets its cache where the sequence does not extend it.
        for (step, &want) in g.generated_ids.iter().enumerate() {
            runner
                .prefill(&seq, &never, &mut |_, _| {})
                .unwrap_or_else(|e| panic!("{device:?}, prompt {p}, step {step}: {e}"));
            let logits = runner.logits().expect("logits after prefill");
            let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let below = top - logits[want as usize];
            steps.push((below == 0.0, below));
            seq.push(want);
        }
    }
    let agree = steps.iter().filter(|s| s.0).count();
    let worst = steps.iter().map(|s| s.1).fold(0f32, f32::max);
    eprintln!(
        "{device:?}, teacher forced: the golden's pick is the top logit at {agree} of {} steps; \
         at most {worst:.4} below it",
        steps.len()
    );
    steps
}

/// The export's 121 means (60 of attention's dot products, 61 of RMSNorm's squares) and the portable
/// ops between its delegates lower with them to one IR graph, where each mean of products becomes
/// one reduction (`fuse_mul_mean`: the products are never stored, with the same bits), so the
/// goldens above check those on every call.
#[test]
fn the_demo_program_runs_as_one_graph_with_its_means_fused() {
    let program = pteria::pte::Program::open(&demo_dir().join("model.pte"), &[]).expect("program");
    let backends = pteria::frontend::backends(pteria::runtime::delegate::cpu_executor());
    let method = pteria::runtime::Method::load(&program, "forward", &backends).expect("loads");
    assert!(method.runs_whole(), "{:?}", method.whole_note());
    let plan = program.plan("forward").expect("forward");
    let g = pteria::runtime::whole::lower_method(plan, &program.named_data, &backends).unwrap();
    let count = |f: fn(&pteria::ir::OpKind) -> bool| g.ops().filter(|o| f(&o.kind)).count();
    let mul_means = count(|k| matches!(k, pteria::ir::OpKind::MulMean { .. }));
    let means = count(|k| matches!(k, pteria::ir::OpKind::Mean { .. }));
    assert_eq!((mul_means, means), (121, 0));
}

/// The GPU executor runs the whole method in WGSL: softmax's exp is not the C library's, and in
/// this 8da4w export a last-bit difference grows by flipping activations' int8 roundings (one
/// ulp in the embeddings moves the first call's logits by 8.5e-2 rel-L2 on the CPU executor), so
/// greedy ids part from the golden's at a close call (step 11 of the first chat). Fed the golden
/// ids, the GPU must pick the golden's token at 90 % of the steps and never rank it more than 1.5
/// below its top logit (lavapipe: 101 of 105, at most 0.74; a broken cache or mask picks noise).
#[test]
fn demo_model_follows_the_golden_on_the_gpu_executor() {
    if std::env::var("PTERIA_NO_GPU_TESTS").is_ok_and(|v| v == "1") {
        return;
    }
    let steps = teacher_forced(Device::Gpu);
    assert_eq!(steps.len(), 16 + 64 + 25);
    let agree = steps.iter().filter(|s| s.0).count();
    assert!(agree * 10 >= steps.len() * 9, "{agree} of {}", steps.len());
    assert!(steps.iter().all(|s| s.1 <= 1.5), "{steps:?}");
}

#[test]
fn the_demo_program_is_the_one_the_catalog_pins() {
    use sha2::{Digest, Sha256};
    let catalog = pteria::catalog::Catalog::builtin().expect("catalog");
    let demo = catalog.model("smollm2-135m-instruct").expect("demo entry");
    let v = &demo.variants[0];
    let path = demo_dir().join(&v.file);
    let bytes = std::fs::read(&path).expect("the bundled model.pte");
    let hex: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        Some(hex.as_str()),
        v.sha256.as_deref(),
        "{}",
        path.display()
    );
}
