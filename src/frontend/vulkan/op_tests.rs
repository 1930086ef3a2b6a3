//! The LLM ops of the Vulkan delegate (quantized linear and embedding, RoPE, the gemma fork's
//! SDPA with KV cache and KV sharing), each in a small hand-built VkGraph blob, lowered to the
//! IR and run on the CPU executor against reference outputs from ExecuTorch's own Python
//! implementations (`tests/fixtures/vulkan_ops/make_goldens.py` writes `goldens.json`).

use super::tests::{blob_of, flatbuffer, inline_bytes, op, tensor, value, F, T};
use super::*;
use crate::ir::cpu::CpuExecutor;
use crate::ir::InputValue;
use serde_json::Value;

const UINT8: i8 = 1;
const INT32: i8 = 3;
const FLOAT32: i8 = 5;

fn goldens() -> Value {
    serde_json::from_str(include_str!(
        "../../../tests/fixtures/vulkan_ops/goldens.json"
    ))
    .expect("goldens.json")
}

fn floats(v: &Value) -> Vec<f32> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| match x.as_str() {
            Some("-inf") => f32::NEG_INFINITY,
            _ => x.as_f64().unwrap() as f32,
        })
        .collect()
}

fn f32_bytes(v: &Value) -> Vec<u8> {
    floats(v).iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u8_bytes(v: &Value) -> Vec<u8> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u8)
        .collect()
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn shape(v: &Value) -> Vec<usize> {
    v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// `got` matches the reference `want` to f32 rounding.
fn assert_close(got: &crate::runtime::HostTensor, want: &Value, what: &str) {
    assert_eq!(got.sizes, shape(want), "{what}: shape");
    let (g, w) = (got.to_f32().unwrap(), floats(want));
    let scale = w.iter().fold(1f32, |m, x| m.max(x.abs()));
    let worst = g
        .iter()
        .zip(&w)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 2e-5 * scale, "{what}: max |diff| {worst:e}");
}

/// Builds a VkGraph blob value by value; constants are inline.
#[derive(Default)]
struct Vk {
    values: Vec<T>,
    chain: Vec<T>,
    consts: Vec<T>,
    raw: Vec<u8>,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
}

impl Vk {
    fn push(&mut self, tag: u8, payload: T) -> i32 {
        self.values.push(value(tag, payload));
        self.values.len() as i32 - 1
    }
    fn act(&mut self, dt: i8, dims: &[u32]) -> i32 {
        self.push(5, tensor(dt, dims, -1, -1))
    }
    fn konst(&mut self, dt: i8, dims: &[u32], bytes: &[u8]) -> i32 {
        self.raw.resize(self.raw.len().div_ceil(16) * 16, 0);
        let off = self.raw.len() as u64;
        self.raw.extend_from_slice(bytes);
        self.consts.push(inline_bytes(off, bytes.len() as u64));
        let cid = self.consts.len() as i32 - 1;
        self.push(5, tensor(dt, dims, cid, -1))
    }
    fn int(&mut self, v: i64) -> i32 {
        self.push(2, T(vec![(0, F::I64(v))]))
    }
    fn boolean(&mut self, v: bool) -> i32 {
        self.push(4, T(vec![(0, F::Bool(v))]))
    }
    fn null(&mut self) -> i32 {
        self.push(1, T(vec![]))
    }
    fn sym(&mut self) -> i32 {
        self.push(11, T(vec![(0, F::I32(0))]))
    }
    fn string(&mut self, s: &'static str) -> i32 {
        self.push(10, T(vec![(0, F::Str(s))]))
    }
    fn int_list(&mut self, v: &[i64]) -> i32 {
        self.push(6, T(vec![(0, F::VecI64(v.to_vec()))]))
    }
    fn list(&mut self, ids: &[i32]) -> i32 {
        self.push(9, T(vec![(0, F::VecI32(ids.to_vec()))]))
    }
    fn call(&mut self, name: &'static str, args: &[i32]) {
        self.chain.push(op(name, args));
    }
    fn io(&mut self, inputs: &[i32], outputs: &[i32]) {
        self.inputs = inputs.iter().map(|&i| i as u32).collect();
        self.outputs = outputs.iter().map(|&i| i as u32).collect();
    }
    /// The blob, parsed and lowered to the IR.
    fn lower(self) -> Result<crate::ir::Graph, String> {
        let fields = vec![
            (0, F::Str("0")),
            (1, F::Tables(self.chain)),
            (2, F::Tables(self.values)),
            (3, F::VecU32(self.inputs)),
            (4, F::VecU32(self.outputs)),
            (5, F::Tables(self.consts)),
        ];
        let blob = blob_of(&flatbuffer(&T(fields), b"VK00"), &self.raw);
        let vk = parse(&blob, &NamedData::default()).map_err(|e| e.to_string())?;
        lower::lower(&vk)
    }
    fn executor(self) -> CpuExecutor {
        CpuExecutor::new(self.lower().unwrap_or_else(|e| panic!("{e}"))).unwrap()
    }
}

fn f32_input(v: &Value) -> (Vec<usize>, Vec<u8>) {
    (shape(v), f32_bytes(v))
}

#[test]
fn embedding_q4gsw_matches_executorch_for_both_nibble_orders() {
    let gold = goldens();
    for (linear, name) in [
        (true, "et_vk.embedding_q4gsw.default"),
        (false, "embedding_q4gsw.default"),
    ] {
        let c = &gold[format!("embedding_q4gsw_linear_{linear}")];
        let mut b = Vk::default();
        let w = b.konst(UINT8, &[5, 32], &u8_bytes(&c["weight"]));
        let s = b.konst(FLOAT32, &[5, 2], &f32_bytes(&c["scales"]));
        let group = b.int(32);
        let idx = b.act(INT32, &[1, 3]);
        let lin = b.boolean(linear);
        let out = b.act(FLOAT32, &[1, 3, 64]);
        b.call(name, &[w, s, group, idx, lin, out]);
        b.io(&[idx], &[out]);
        let ids = i32_bytes(&[4, 0, 2]);
        let y = b
            .executor()
            .run(&[InputValue::Tensor {
                shape: vec![1, 3],
                data: &ids,
            }])
            .unwrap();
        assert_close(&y[0], &c["out"], name);
    }
}

#[test]
fn quantized_linears_match_executorch_and_torchao() {
    let gold = goldens();
    // Weight-only, namespaced spelling.
    let c = &gold["linear_q4gsw"];
    let mut b = Vk::default();
    let x = b.act(FLOAT32, &[1, 3, 64]);
    let w = b.konst(UINT8, &[12, 32], &u8_bytes(&c["weight"]));
    let s = b.konst(FLOAT32, &[2, 12], &f32_bytes(&c["scales"]));
    let group = b.int(32);
    let bias = b.konst(FLOAT32, &[12], &f32_bytes(&c["bias"]));
    let out = b.act(FLOAT32, &[1, 3, 12]);
    b.call("et_vk.linear_q4gsw.default", &[x, w, s, group, bias, out]);
    b.io(&[x], &[out]);
    let (xs, xd) = f32_input(&c["x"]);
    let y = b
        .executor()
        .run(&[InputValue::Tensor {
            shape: xs.clone(),
            data: &xd,
        }])
        .unwrap();
    assert_close(&y[0], &c["out"], "linear_q4gsw");

    // Dynamic int8 activations from in-graph torchao qparams, bare spelling.
    let c = &gold["linear_dq8ca_q4gsw"];
    let mut b = Vk::default();
    let x = b.act(FLOAT32, &[1, 3, 64]);
    let (scale, zp) = (b.act(FLOAT32, &[1, 3]), b.act(2, &[1, 3]));
    let qp = b.list(&[scale, zp]);
    let (mapping, block) = (b.string("ASYMMETRIC"), b.int_list(&[1, 1, 64]));
    let (lo, hi, none) = (b.int(-128), b.int(127), b.null());
    let keep = b.boolean(false);
    b.call(
        "torchao.choose_qparams_affine.default",
        &[x, mapping, block, none, lo, hi, none, none, none, keep, qp],
    );
    let w = b.konst(UINT8, &[12, 32], &u8_bytes(&c["weight"]));
    let sums = b.act(INT32, &[2, 12]);
    let s = b.konst(FLOAT32, &[2, 12], &f32_bytes(&c["scales"]));
    let group = b.int(32);
    let bias = b.konst(FLOAT32, &[12], &f32_bytes(&c["bias"]));
    let out = b.act(FLOAT32, &[1, 3, 12]);
    b.call(
        "linear_dq8ca_q4gsw.default",
        &[x, scale, zp, w, sums, s, group, bias, out],
    );
    b.io(&[x], &[out]);
    let y = b
        .executor()
        .run(&[InputValue::Tensor {
            shape: xs,
            data: &xd,
        }])
        .unwrap();
    assert_close(&y[0], &c["out"], "linear_dq8ca_q4gsw");
}

#[test]
fn rotary_embeddings_match_executorch() {
    let gold = goldens();
    // Llama pairs, tables sliced per call, as graph inputs.
    let c = &gold["apply_rotary_emb"];
    let mut b = Vk::default();
    let (xq, xk) = (b.act(FLOAT32, &[1, 3, 2, 8]), b.act(FLOAT32, &[1, 3, 1, 8]));
    let (cos, sin) = (b.act(FLOAT32, &[3, 4]), b.act(FLOAT32, &[3, 4]));
    let (oq, ok) = (b.act(FLOAT32, &[1, 3, 2, 8]), b.act(FLOAT32, &[1, 3, 1, 8]));
    let outs = b.list(&[oq, ok]);
    b.call("et_vk.apply_rotary_emb.default", &[xq, xk, cos, sin, outs]);
    b.io(&[xq, xk, cos, sin], &[oq, ok]);
    let ins: Vec<_> = ["xq", "xk", "cos", "sin"]
        .iter()
        .map(|k| f32_input(&c[k]))
        .collect();
    let inputs: Vec<InputValue> = ins
        .iter()
        .map(|(s, d)| InputValue::Tensor {
            shape: s.clone(),
            data: d,
        })
        .collect();
    let y = b.executor().run(&inputs).unwrap();
    assert_close(&y[0], &c["out_q"], "apply_rotary_emb q");
    assert_close(&y[1], &c["out_k"], "apply_rotary_emb k");

    // HF rotate_half on 6 of 8 dims, constant [10, 6] tables, start position as a SymInt input.
    let c = &gold["apply_rotary_emb_hf"];
    let mut b = Vk::default();
    let (xq, xk) = (b.act(FLOAT32, &[1, 3, 2, 8]), b.act(FLOAT32, &[1, 3, 1, 8]));
    let cos = b.konst(FLOAT32, &[10, 6], &f32_bytes(&c["cos"]));
    let sin = b.konst(FLOAT32, &[10, 6], &f32_bytes(&c["sin"]));
    let start = b.sym();
    let (oq, ok) = (b.act(FLOAT32, &[1, 3, 2, 8]), b.act(FLOAT32, &[1, 3, 1, 8]));
    let outs = b.list(&[oq, ok]);
    b.call(
        "apply_rotary_emb_hf.default",
        &[xq, xk, cos, sin, start, outs],
    );
    b.io(&[xq, xk, start], &[oq, ok]);
    let (q, k) = (f32_input(&c["xq"]), f32_input(&c["xk"]));
    let y = b
        .executor()
        .run(&[
            InputValue::Tensor {
                shape: q.0,
                data: &q.1,
            },
            InputValue::Tensor {
                shape: k.0,
                data: &k.1,
            },
            InputValue::Sym(c["start"].as_i64().unwrap()),
        ])
        .unwrap();
    assert_close(&y[0], &c["out_q"], "apply_rotary_emb_hf q");
    assert_close(&y[1], &c["out_k"], "apply_rotary_emb_hf k");
}

/// Layer 0: `gemma_sdpa_with_kv_cache` with a sliding-window mask; layer 1: the same op,
/// namespaced, causal; layer 2: `gemma_custom_sdpa` on caches that are other constants with the
/// same bytes, which must read layer 1's (the latest donor), not layer 0's nor zeros. A prefill
/// of 5 then a decode step, positions through `select_as_symint`.
#[test]
fn gemma_sdpa_ops_match_the_fork_kernels_across_calls() {
    let gold = goldens();
    let c = &gold["gemma_sdpa"];
    let zeros = vec![0u8; 16 * 8 * 4];
    let mut b = Vk::default();
    let pos = b.act(INT32, &[1]);
    let start = b.sym();
    let (zero, seq) = (b.int(0), b.int(1));
    b.call("et_vk.select_as_symint.default", &[pos, zero, zero, start]);
    let mask = b.act(FLOAT32, &[1, 1, 5, 16]);
    let mut ins = vec![pos, mask];
    let mut outs = Vec::new();
    for layer in 0..3 {
        let q = b.act(FLOAT32, &[1, 5, 4, 8]);
        ins.push(q);
        let kc = b.konst(FLOAT32, &[1, 16, 1, 8], &zeros);
        let vc = b.konst(FLOAT32, &[1, 16, 1, 8], &zeros);
        let out = b.act(FLOAT32, &[1, 5, 4, 8]);
        outs.push(out);
        if layer < 2 {
            let (k, v) = (b.act(FLOAT32, &[1, 5, 1, 8]), b.act(FLOAT32, &[1, 5, 1, 8]));
            ins.extend([k, v]);
            let (m, causal) = if layer == 0 {
                (mask, b.boolean(false))
            } else {
                (b.null(), b.boolean(true))
            };
            let name = if layer == 0 {
                "gemma_sdpa_with_kv_cache.default"
            } else {
                "et_vk.gemma_sdpa_with_kv_cache.default"
            };
            b.call(name, &[q, k, v, kc, vc, start, seq, m, causal, out]);
        } else {
            let (none, causal) = (b.null(), b.boolean(true));
            b.call(
                "gemma_custom_sdpa.default",
                &[q, kc, vc, start, seq, none, causal, out],
            );
        }
    }
    b.io(&ins, &outs);
    let mut exec = b.executor();
    for step in c["steps"].as_array().unwrap() {
        let s = step["S"].as_u64().unwrap() as usize;
        let p = i32_bytes(&[step["start"].as_i64().unwrap() as i32]);
        let mut data = vec![f32_input(&step["mask"])];
        for layer in ["layer0", "layer1"] {
            for k in ["q", "k", "v"] {
                data.push(f32_input(&step[layer][k]));
            }
        }
        data.push(f32_input(&step["shared"]["q"]));
        // Graph input order: pos, mask, q0, k0, v0, q1, k1, v1, q2.
        let mut inputs = vec![InputValue::Tensor {
            shape: vec![1],
            data: &p,
        }];
        inputs.extend(data.iter().map(|(sh, d)| InputValue::Tensor {
            shape: sh.clone(),
            data: d,
        }));
        let y = exec.run(&inputs).unwrap();
        assert_eq!(y[0].sizes, [1, s, 4, 8]);
        assert_close(&y[0], &step["layer0"]["out"], "window-masked layer");
        assert_close(&y[1], &step["layer1"]["out"], "causal layer");
        assert_close(&y[2], &step["shared"]["out"], "KV-shared layer");
    }
}

#[test]
fn gemma_sdpa_refuses_what_the_ir_cannot_express() {
    // A per-head mask and a softcap after the mask are the fork's audio-encoder variants.
    for (mask_dims, softcap, want) in [
        ([1u32, 4, 5, 16], 0.0, "per-head"),
        ([1, 1, 5, 16], 50.0, "softcap"),
    ] {
        let mut b = Vk::default();
        let q = b.act(FLOAT32, &[1, 5, 4, 8]);
        let kc = b.konst(FLOAT32, &[1, 16, 1, 8], &[0; 512]);
        let vc = b.konst(FLOAT32, &[1, 16, 1, 8], &[0; 512]);
        let start = b.sym();
        let seq = b.int(1);
        let mask = b.act(FLOAT32, &mask_dims);
        let causal = b.boolean(false);
        let cap = b.push(3, T(vec![(0, F::F64(softcap))]));
        let out = b.act(FLOAT32, &[1, 5, 4, 8]);
        b.call(
            "gemma_custom_sdpa.default",
            &[q, kc, vc, start, seq, mask, causal, cap, out],
        );
        b.io(&[q, start, mask], &[out]);
        let err = b.lower().expect_err("lowered");
        assert!(
            err.contains(want) && err.contains("gemma_custom_sdpa"),
            "{err}"
        );
    }
}
