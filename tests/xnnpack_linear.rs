//! One XNNPACK 8da4w linear (K = 576 → N = 1536, group 32; tests/fixtures/export_xnnpack_linear.py)
//! run by the ExecuTorch Python runtime: Pteria's CPU executor reproduces its output bit for bit.
//! XNNPACK's qd8-f32-qb4w GEMM quantizes each row to int8, sums int8 × int4 products exactly per
//! weight group, scales each group sum, starts from the packed `ksum · zero point` and scales the
//! row last; a deep 8da4w model turns any last-bit difference into flipped activation roundings.

use pteria::pte::Program;
use pteria::runtime::delegate::Device;
use pteria::runtime::{DType, HostTensor, Method, Output};
use std::path::PathBuf;

fn fixture(ext: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("xnnpack_linear_8da4w.{ext}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn xnnpack_8da4w_linear_matches_executorch_bit_for_bit_on_the_cpu_executor() {
    let (make, _) = pteria::runtime::delegate::executor_for(Device::Cpu).expect("cpu executor");
    let backends = pteria::frontend::backends(make);
    let program = Program::open(&fixture("pte"), &[]).expect("fixture program");
    let mut method = Method::load(&program, "forward", &backends).expect("forward loads");
    let x = std::fs::read(fixture("x.bin")).expect("input");
    let want = f32s(&std::fs::read(fixture("y.bin")).expect("ExecuTorch output"));
    let rows = x.len() / 4 / 576;
    let out = method
        .execute(&[HostTensor {
            dtype: DType::F32,
            sizes: vec![1, rows, 576],
            data: x,
        }])
        .expect("forward runs");
    let Some(Output::Tensor(y)) = out.first() else {
        panic!("forward returns a tensor, got {out:?}");
    };
    assert_eq!(y.sizes, vec![1, rows, 1536]);
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
        "{} of {} outputs differ from ExecuTorch's, first {:?}",
        differ.len(),
        want.len(),
        &differ[..differ.len().min(5)]
    );
}
