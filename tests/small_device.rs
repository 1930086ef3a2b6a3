//! A phone-class device: every Vulkan, MLX and XNNPACK fixture matches its golden on every call
//! on a GPU context that asks for no more than WebGPU's default limits (16 KiB of workgroup
//! memory, 256 invocations a workgroup, 8 storage buffers a kernel, 128 MiB bindings and 256 MiB
//! buffers), as many phones' GPUs offer. The kernels' plans read the limits (workgroup sizes,
//! workgroup arrays, fusions that bind more buffers), so a plan that outgrew them would fail to
//! build its pipelines here rather than on a phone.

mod common;

use pteria::gpu::{Context, ContextOptions};
use pteria::runtime::delegate::gpu_executor;
use std::sync::Arc;

#[test]
fn fixtures_match_goldens_within_webgpu_default_limits() {
    // The usual context first: it skips (PTERIA_NO_GPU_TESTS) or explains a missing driver.
    let Some(full) = common::gpu_context() else {
        return;
    };
    let ctx = Arc::new(
        Context::with_options(ContextOptions {
            webgpu_limits: true,
            ..Default::default()
        })
        .expect("the GPU opened once already"),
    );
    let (have, l, d) = (full.limits(), ctx.limits(), wgpu::Limits::default());
    println!(
        "adapter: {:?}\nits limits: {} B workgroup memory, {} invocations, {} storage buffers, \
         {} B binding, {} B buffer",
        ctx.adapter(),
        have.max_compute_workgroup_storage_size,
        have.max_compute_invocations_per_workgroup,
        have.max_storage_buffers_per_shader_stage,
        have.max_storage_buffer_binding_size,
        have.max_buffer_size
    );
    assert!(l.max_compute_workgroup_storage_size <= d.max_compute_workgroup_storage_size);
    assert!(l.max_compute_invocations_per_workgroup <= d.max_compute_invocations_per_workgroup);
    assert!(l.max_storage_buffers_per_shader_stage <= d.max_storage_buffers_per_shader_stage);
    assert!(l.max_storage_buffer_binding_size <= d.max_storage_buffer_binding_size);
    assert!(l.max_buffer_size <= d.max_buffer_size);
    assert!(ctx.adapter().max_storage_binding <= d.max_storage_buffer_binding_size);

    let m = common::manifest();
    let mut failures = Vec::new();
    let mut ran = 0;
    for backend in ["vulkan", "mlx", "xnnpack"] {
        for e in common::manifest_programs(&m, backend) {
            let file = e["file"].as_str().expect("file");
            let tol = e["tolerance_rel_l2_per_call"].as_f64().expect("tolerance");
            let errs = common::load_whole(file, gpu_executor(ctx.clone()))
                .and_then(|mut method| common::golden_rel_l2_per_call(&mut method, &e, &m));
            ran += 1;
            match errs {
                Ok(errs) => {
                    let calls: Vec<String> = errs.iter().map(|x| format!("{x:.2e}")).collect();
                    println!(
                        "{file}: per call [{}] (tolerance {tol:.0e})",
                        calls.join(", ")
                    );
                    // NaN fails too.
                    if !errs.iter().all(|&x| x <= tol) {
                        failures.push(format!("{file}: [{}] > {tol:.0e}", calls.join(", ")));
                    }
                }
                Err(err) => failures.push(format!("{file}: {err}")),
            }
        }
    }
    assert!(
        ran >= 6,
        "expected the Vulkan, MLX and XNNPACK fixtures, found {ran}"
    );
    // (A pipeline or binding past the limits is a validation error, which fails its call.)
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
