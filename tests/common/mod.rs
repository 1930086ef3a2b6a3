//! Helpers shared by the integration tests: fixture paths, `.npy` reading, error metrics.
#![allow(dead_code)]

pub mod fuzz;

use std::path::{Path, PathBuf};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A float32 or int64 little-endian C-order `.npy` array: (shape, values as f64).
pub fn read_npy(path: &Path) -> (Vec<usize>, Vec<f64>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..6], b"\x93NUMPY", "{} is not .npy", path.display());
    let (hlen, hstart) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    let header = std::str::from_utf8(&b[hstart..hstart + hlen]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_str = header
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape: Vec<usize> = shape_str
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data = &b[hstart + hlen..];
    let vals: Vec<f64> = if header.contains("'<f4'") {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect()
    } else if header.contains("'<i8'") {
        data.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect()
    } else if header.contains("'<f8'") {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    } else {
        panic!("unsupported npy dtype in {header}")
    };
    (shape, vals)
}

/// ||a - b|| / ||b||.
pub fn rel_l2(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-30)).sqrt()
}

/// The GPU for a GPU test: `None` (skip) only when `PTERIA_NO_GPU_TESTS=1`; a missing adapter
/// otherwise fails the test, so a machine without lavapipe cannot pass GPU suites silently.
pub fn gpu_context() -> Option<std::sync::Arc<pteria::gpu::Context>> {
    if std::env::var("PTERIA_NO_GPU_TESTS").is_ok_and(|v| v == "1") {
        println!("PTERIA_NO_GPU_TESTS=1: skipped");
        return None;
    }
    match pteria::gpu::Context::new() {
        Ok(c) => Some(std::sync::Arc::new(c)),
        Err(e) => panic!(
            "no GPU adapter for the GPU tests ({e}). Install lavapipe (Debian: \
             mesa-vulkan-drivers) or set PTERIA_NO_GPU_TESTS=1 to skip them"
        ),
    }
}
