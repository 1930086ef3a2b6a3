//! XNNPACK 8da4w linears (tests/fixtures/export_xnnpack_linear.py: K = 576 → N = 1536 at group 32,
//! K = 1536 → N = 576 at group 64) run by the ExecuTorch Python runtime: Pteria's CPU and GPU
//! executors reproduce their outputs bit for bit.
//! XNNPACK's qd8-f32-qb4w GEMM (on AVX512-VNNI its qdu8 form) quantizes each row to int8, shifts
//! it to unsigned, sums u8 × int4 products exactly per weight block, adds each block sum times its
//! bf16 scale with one fused multiply-add onto the packed `ksum · zero point` and scales the row
//! last; a deep 8da4w model turns any last-bit difference into flipped activation roundings.

use pteria::pte::Program;
use pteria::runtime::delegate::Device;
use pteria::runtime::{DType, HostTensor, Method, Output};
use std::path::PathBuf;

fn fixture(name: &str, ext: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.{ext}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs fixture `name` (`forward(x: f32 [1, rows, k]) -> [1, rows, n]`) and compares every output's bits.
fn assert_bit_exact(device: Device, name: &str, k: usize, n: usize) {
    let (make, _) = pteria::runtime::delegate::executor_for(device).expect("executor");
    let backends = pteria::frontend::backends(make);
    let program = Program::open(&fixture(name, "pte"), &[]).expect("fixture program");
    let mut method = Method::load(&program, "forward", &backends).expect("forward loads");
    let x = std::fs::read(fixture(name, "x.bin")).expect("input");
    let want = f32s(&std::fs::read(fixture(name, "y.bin")).expect("ExecuTorch output"));
    let rows = x.len() / 4 / k;
    let out = method
        .execute(&[HostTensor {
            dtype: DType::F32,
            sizes: vec![1, rows, k],
            data: x,
        }])
        .expect("forward runs");
    let Some(Output::Tensor(y)) = out.first() else {
        panic!("forward returns a tensor, got {out:?}");
    };
    assert_eq!(y.sizes, vec![1, rows, n]);
    let got = f32s(&y.data);
    let differ: Vec<(usize, f32, f32)> = got
        .iter()
        .zip(&want)
        .enumerate()
        .filter(|(_, (a, b))| a.to_bits() != b.to_bits())
        .map(|(i, (a, b))| (i, *a, *b))
        .collect();
    assert!(
        differ.is_empty(),
        "{name} on {device:?}: {} of {} outputs differ from ExecuTorch's, first {:?}",
        differ.len(),
        want.len(),
        &differ[..differ.len().min(5)]
    );
}

#[test]
fn xnnpack_8da4w_linear_matches_executorch_bit_for_bit_on_the_cpu_executor() {
    assert_bit_exact(Device::Cpu, "xnnpack_linear_8da4w", 576, 1536);
}

#[test]
fn xnnpack_8da4w_linear_matches_executorch_bit_for_bit_on_the_gpu_executor() {
    assert_bit_exact(Device::Gpu, "xnnpack_linear_8da4w", 576, 1536);
}

/// Group 64: a block's integer sum times its bf16 scale no longer fits float32's mantissa, so
/// only the kernel's own rounding sequence (fused multiply-add per block) matches.
#[test]
fn xnnpack_8da4w_group_64_linear_matches_executorch_bit_for_bit_on_the_cpu_executor() {
    assert_bit_exact(Device::Cpu, "xnnpack_linear_8da4w_g64", 1536, 576);
}

/// The same on the GPU, whose WGSL has no fused multiply-add it can count on (lavapipe's
/// `fma()` is a multiply and an add): the kernel rounds each block's term once by itself.
#[test]
fn xnnpack_8da4w_group_64_linear_matches_executorch_bit_for_bit_on_the_gpu_executor() {
    assert_bit_exact(Device::Gpu, "xnnpack_linear_8da4w_g64", 1536, 576);
}
