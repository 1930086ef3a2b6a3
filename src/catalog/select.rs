//! Which variant of a model to run here: the user's choice if any; else the platform's GPU
//! backend (MLX on Apple, Vulkan elsewhere) on a suitable adapter; else a CPU variant.

use std::fmt;

use super::{
    estimate, Backend, CatalogError, DenyRule, DeviceFacts, DeviceType, GpuAdapter, GpuApi, Light,
    Model, Variant,
};

#[derive(Debug, Clone, PartialEq)]
pub struct Choice<'a> {
    pub variant: &'a Variant,
    /// The adapter a GPU variant runs on; `None` for CPU variants.
    pub adapter: Option<GpuAdapter>,
    pub reason: Reason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The user named the variant.
    Explicit,
    /// The platform's GPU backend on a suitable adapter.
    PlatformGpu,
    /// The platform's GPU backend is not usable here; the string says why.
    CpuFallback(String),
    /// The model has no variant for this platform's backends; its first variant is all there is.
    OnlyChoice,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Explicit => write!(f, "chosen explicitly"),
            Reason::PlatformGpu => write!(f, "this platform's GPU backend"),
            Reason::CpuFallback(why) => write!(f, "CPU fallback: {why}"),
            Reason::OnlyChoice => write!(f, "the model's only usable variant"),
        }
    }
}

/// Picks the variant of `model` to run on the device described by `facts`. An explicit choice
/// always wins; an unknown explicit id is an error rather than a silent default.
pub fn choose<'a>(
    model: &'a Model,
    facts: &DeviceFacts,
    deny: &[DenyRule],
    explicit: Option<&str>,
) -> Result<Choice<'a>, CatalogError> {
    if let Some(id) = explicit {
        let variant = model.variant(id)?;
        let adapter = variant
            .backend
            .gpu_api()
            .and_then(|api| facts.gpus.iter().find(|g| g.api == api).cloned());
        return Ok(Choice {
            variant,
            adapter,
            reason: Reason::Explicit,
        });
    }

    let gpu_backend = if facts.os.is_apple() {
        Backend::Mlx
    } else {
        Backend::Vulkan
    };
    let why_not_gpu = match model.variants.iter().find(|v| v.backend == gpu_backend) {
        None => format!("no {} variant", gpu_backend.name()),
        Some(variant) => match suitable_adapter(model, variant, facts, deny) {
            Ok(adapter) => {
                return Ok(Choice {
                    variant,
                    adapter: Some(adapter),
                    reason: Reason::PlatformGpu,
                })
            }
            Err(why) => why,
        },
    };

    let cpu = [Backend::Xnnpack, Backend::Portable]
        .iter()
        .find_map(|b| model.variants.iter().find(|v| v.backend == *b));
    match cpu {
        Some(variant) => Ok(Choice {
            variant,
            adapter: None,
            reason: Reason::CpuFallback(why_not_gpu),
        }),
        None => Ok(Choice {
            variant: &model.variants[0],
            adapter: None,
            reason: Reason::OnlyChoice,
        }),
    }
}

/// The first adapter that can run `variant`, or why none can.
fn suitable_adapter(
    model: &Model,
    variant: &Variant,
    facts: &DeviceFacts,
    deny: &[DenyRule],
) -> Result<GpuAdapter, String> {
    let api = variant.backend.gpu_api().unwrap_or(GpuApi::Vulkan);
    let candidates: Vec<&GpuAdapter> = facts.gpus.iter().filter(|g| g.api == api).collect();
    if candidates.is_empty() {
        return Err(format!("no {api:?} GPU adapter"));
    }
    let mut rejected = Vec::new();
    for gpu in candidates {
        if gpu.device_type == DeviceType::Cpu {
            rejected.push(format!("{} is a CPU (software) device", gpu.name));
            continue;
        }
        if let Some(rule) = deny.iter().find(|r| r.matches(gpu)) {
            rejected.push(format!("{}: {}", gpu.name, rule.reason));
            continue;
        }
        let fit = estimate(model, variant, model.context_length, Some(gpu), facts, None);
        if fit.light() == Light::Red {
            rejected.push(format!("{}: not enough memory ({fit})", gpu.name));
            continue;
        }
        return Ok(gpu.clone());
    }
    Err(rejected.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, Memory, Os};

    const GB: u64 = 1_000_000_000;

    fn gpu(api: GpuApi, name: &str, device_type: DeviceType, driver: &str) -> GpuAdapter {
        GpuAdapter {
            api,
            name: name.into(),
            vendor_id: 0,
            device_type,
            driver: driver.into(),
            driver_info: String::new(),
            device_local_bytes: 8 * GB,
        }
    }

    fn device(os: Os, gpus: Vec<GpuAdapter>) -> DeviceFacts {
        DeviceFacts {
            os,
            gpus,
            memory: Some(Memory {
                total_bytes: 16 * GB,
                available_bytes: 12 * GB,
            }),
            notes: Vec::new(),
        }
    }

    fn pick(os: Os, gpus: Vec<GpuAdapter>, explicit: Option<&str>) -> (String, Reason) {
        let catalog = Catalog::builtin().unwrap();
        let model = catalog.model("gemma-4-e2b").unwrap();
        let c = choose(model, &device(os, gpus), catalog.gpu_deny(), explicit).unwrap();
        (c.variant.id.clone(), c.reason)
    }

    fn metal() -> GpuAdapter {
        gpu(GpuApi::Metal, "Apple M2", DeviceType::Integrated, "Metal")
    }

    fn adreno() -> GpuAdapter {
        gpu(
            GpuApi::Vulkan,
            "Adreno (TM) 740",
            DeviceType::Integrated,
            "Qualcomm Technologies Inc. Adreno Vulkan Driver",
        )
    }

    #[test]
    fn apple_platforms_default_to_mlx() {
        for os in [Os::MacOs, Os::Ios] {
            assert_eq!(
                pick(os, vec![metal()], None),
                ("mlx-int4".into(), Reason::PlatformGpu)
            );
        }
    }

    #[test]
    fn android_linux_and_windows_default_to_vulkan() {
        for os in [Os::Android, Os::Linux, Os::Windows] {
            assert_eq!(
                pick(os, vec![adreno()], None),
                ("vulkan-8da4w".into(), Reason::PlatformGpu)
            );
        }
    }

    #[test]
    fn no_gpu_falls_back_to_xnnpack_on_every_platform() {
        for os in [Os::MacOs, Os::Ios, Os::Android, Os::Linux, Os::Windows] {
            let (variant, reason) = pick(os, Vec::new(), None);
            assert_eq!(variant, "xnnpack-8da4w");
            assert!(matches!(reason, Reason::CpuFallback(why) if why.contains("no ")));
        }
    }

    #[test]
    fn software_rasterizers_are_not_suitable_gpus() {
        let lavapipe = gpu(
            GpuApi::Vulkan,
            "llvmpipe (LLVM 15.0.6, 256 bits)",
            DeviceType::Cpu,
            "llvmpipe",
        );
        let (variant, reason) = pick(Os::Linux, vec![lavapipe], None);
        assert_eq!(variant, "xnnpack-8da4w");
        assert!(matches!(reason, Reason::CpuFallback(why) if why.contains("CPU (software)")));

        // SwiftShader can report itself as a non-CPU device; the deny-list still catches it.
        let swiftshader = gpu(
            GpuApi::Vulkan,
            "SwiftShader Device (Subzero)",
            DeviceType::Other,
            "SwiftShader driver",
        );
        let (variant, reason) = pick(Os::Android, vec![swiftshader], None);
        assert_eq!(variant, "xnnpack-8da4w");
        assert!(matches!(reason, Reason::CpuFallback(why) if why.contains("software rasterizer")));
    }

    #[test]
    fn denied_driver_is_skipped_for_the_next_adapter() {
        let dozen = gpu(
            GpuApi::Vulkan,
            "Microsoft Direct3D12 (NVIDIA)",
            DeviceType::Discrete,
            "Dozen",
        );
        let nvidia = gpu(GpuApi::Vulkan, "RTX 4060", DeviceType::Discrete, "NVIDIA");
        let catalog = Catalog::builtin().unwrap();
        let model = catalog.model("gemma-4-e2b").unwrap();
        let facts = device(Os::Windows, vec![dozen, nvidia]);
        let c = choose(model, &facts, catalog.gpu_deny(), None).unwrap();
        assert_eq!(c.variant.id, "vulkan-8da4w");
        assert_eq!(c.adapter.unwrap().name, "RTX 4060");
    }

    #[test]
    fn gpu_without_room_for_the_model_falls_back_to_cpu() {
        let mut small = gpu(GpuApi::Vulkan, "GT 710", DeviceType::Discrete, "NVIDIA");
        small.device_local_bytes = 2 * GB;
        let (variant, reason) = pick(Os::Linux, vec![small], None);
        assert_eq!(variant, "xnnpack-8da4w");
        assert!(matches!(reason, Reason::CpuFallback(why) if why.contains("not enough memory")));
    }

    #[test]
    fn metal_adapter_does_not_make_vulkan_suitable() {
        let (variant, _) = pick(Os::Linux, vec![metal()], None);
        assert_eq!(variant, "xnnpack-8da4w");
    }

    #[test]
    fn explicit_choice_always_wins() {
        assert_eq!(
            pick(Os::MacOs, vec![metal()], Some("vulkan-8da4w")),
            ("vulkan-8da4w".into(), Reason::Explicit)
        );
        assert_eq!(
            pick(Os::Linux, Vec::new(), Some("mlx-int4")),
            ("mlx-int4".into(), Reason::Explicit)
        );
        assert_eq!(
            pick(Os::Android, vec![adreno()], Some("xnnpack-8da4w")),
            ("xnnpack-8da4w".into(), Reason::Explicit)
        );
    }

    #[test]
    fn unknown_explicit_variant_is_an_error() {
        let catalog = Catalog::builtin().unwrap();
        let model = catalog.model("gemma-4-e2b").unwrap();
        let err = choose(model, &device(Os::Linux, vec![]), &[], Some("cuda")).unwrap_err();
        assert!(matches!(err, CatalogError::UnknownVariant { .. }));
    }

    /// Where CI has lavapipe installed, this is the real probe meeting a software adapter.
    #[test]
    fn this_device_never_gets_a_software_or_denied_adapter() {
        let catalog = Catalog::builtin().unwrap();
        let model = catalog.model("gemma-4-e2b").unwrap();
        let facts = crate::catalog::probe();
        let c = choose(model, &facts, catalog.gpu_deny(), None).unwrap();
        match &c.adapter {
            Some(a) => {
                assert_ne!(a.device_type, DeviceType::Cpu);
                assert!(!catalog.gpu_deny().iter().any(|r| r.matches(a)));
                assert_eq!(c.reason, Reason::PlatformGpu);
            }
            None => assert_eq!(c.variant.backend, Backend::Xnnpack),
        }
    }

    #[test]
    fn model_with_only_a_cpu_variant_uses_it() {
        let catalog = Catalog::builtin().unwrap();
        let demo = catalog.model("smollm2-135m-instruct").unwrap();
        let c = choose(demo, &device(Os::Linux, vec![adreno()]), &[], None).unwrap();
        assert_eq!(c.variant.id, "xnnpack-8da4w");
        assert!(matches!(c.reason, Reason::CpuFallback(_)));
    }
}
