//! Will a variant fit in this device's memory? Weights + KV cache for the context + runtime
//! overhead, against the memory the variant would run from, with the numbers kept for display.

use std::fmt;

use super::{DeviceFacts, DeviceType, GpuAdapter, Model, Variant};

/// Below this share of the available memory a model runs comfortably.
const GREEN_BELOW: f64 = 0.60;
/// Below this it runs, but other apps may be pushed out or the OS may kill it.
const YELLOW_BELOW: f64 = 0.90;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Light {
    Green,
    Yellow,
    Red,
    /// The available memory could not be read on this device.
    Unknown,
}

impl Light {
    pub fn name(self) -> &'static str {
        match self {
            Light::Green => "green",
            Light::Yellow => "yellow",
            Light::Red => "red",
            Light::Unknown => "unknown",
        }
    }
}

/// Which memory the variant would live in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryPool {
    /// System RAM: CPU backends and GPUs that share it (integrated, Apple silicon).
    System,
    /// A discrete GPU's own device-local heap.
    GpuHeap { adapter: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitEstimate {
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    pub overhead_bytes: u64,
    pub context_tokens: u32,
    pub pool: MemoryPool,
    pub available_bytes: Option<u64>,
}

impl FitEstimate {
    pub fn total_bytes(&self) -> u64 {
        self.weights_bytes
            .saturating_add(self.kv_cache_bytes)
            .saturating_add(self.overhead_bytes)
    }

    /// The share of the available memory the model would take.
    pub fn share(&self) -> Option<f64> {
        let available = self.available_bytes?;
        Some(if available == 0 {
            f64::INFINITY
        } else {
            self.total_bytes() as f64 / available as f64
        })
    }

    pub fn light(&self) -> Light {
        match self.share() {
            None => Light::Unknown,
            Some(s) if s < GREEN_BELOW => Light::Green,
            Some(s) if s < YELLOW_BELOW => Light::Yellow,
            Some(_) => Light::Red,
        }
    }
}

impl fmt::Display for FitEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} weights + {} KV cache ({} tokens) + {} overhead = {}",
            self.light().name(),
            gb(self.weights_bytes),
            gb(self.kv_cache_bytes),
            self.context_tokens,
            gb(self.overhead_bytes),
            gb(self.total_bytes()),
        )?;
        let pool = match &self.pool {
            MemoryPool::System => "memory".to_string(),
            MemoryPool::GpuHeap { adapter } => format!("{adapter} memory"),
        };
        match (self.available_bytes, self.share()) {
            (Some(a), Some(s)) => write!(f, " of {} available {pool} ({:.0}%)", gb(a), s * 100.0),
            _ => write!(f, " (available {pool} unknown)"),
        }
    }
}

fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

/// A discrete GPU's own memory from which big embedding tables (Gemma 4 E2B's: 1.6 GiB, 3.3 GiB
/// with the rest of the model) are kept on the GPU by default: there they leave more than half
/// of it free.
pub const TABLES_ON_GPU_MIN_HEAP: u64 = 8 << 30;

/// Whether a program's big embedding tables go in `gpu`'s memory by default rather than stay
/// in host memory, gathered there a row a token (`runtime::delegate::Tables::Auto`). On the GPU
/// a decode step needs no token on the host before it is submitted, so steps run one ahead;
/// that is worth their memory on a discrete GPU with room for them, not where the GPU's memory
/// is the system's (integrated, Apple silicon, phones), whose host copy the OS can reclaim.
pub fn tables_on_gpu(gpu: &GpuAdapter) -> bool {
    gpu.device_type == DeviceType::Discrete && gpu.device_local_bytes >= TABLES_ON_GPU_MIN_HEAP
}

/// The estimate for `variant` at `context_tokens`, run from `gpu` (or the CPU when `None`).
/// `weights_bytes` overrides the catalog's approximate size once the real file size is known.
pub fn estimate(
    model: &Model,
    variant: &Variant,
    context_tokens: u32,
    gpu: Option<&GpuAdapter>,
    facts: &DeviceFacts,
    weights_bytes: Option<u64>,
) -> FitEstimate {
    let kv_cache_bytes = model
        .kv_values_per_token
        .saturating_mul(variant.kv_bytes_per_value)
        .saturating_mul(u64::from(context_tokens));
    let system = facts.memory.map(|m| m.available_bytes);
    let (pool, available_bytes) = match gpu {
        Some(a) if a.device_type == DeviceType::Discrete => (
            MemoryPool::GpuHeap {
                adapter: a.name.clone(),
            },
            Some(a.device_local_bytes),
        ),
        _ => (MemoryPool::System, system),
    };
    FitEstimate {
        weights_bytes: weights_bytes.unwrap_or(variant.approx_bytes),
        kv_cache_bytes,
        overhead_bytes: model.overhead_bytes,
        context_tokens,
        pool,
        available_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, GpuApi, Memory, Os};

    const GB: u64 = 1_000_000_000;

    fn facts(available: u64) -> DeviceFacts {
        DeviceFacts {
            os: Os::Linux,
            gpus: Vec::new(),
            memory: Some(Memory {
                total_bytes: 2 * available,
                available_bytes: available,
            }),
            notes: Vec::new(),
        }
    }

    #[test]
    fn tables_go_on_discrete_gpus_with_room() {
        let gpu = |device_type, gib: u64| GpuAdapter {
            api: GpuApi::Vulkan,
            name: "gpu".into(),
            vendor_id: 0x10DE,
            device_type,
            driver: String::new(),
            driver_info: String::new(),
            device_local_bytes: gib << 30,
        };
        assert!(tables_on_gpu(&gpu(DeviceType::Discrete, 8)));
        assert!(tables_on_gpu(&gpu(DeviceType::Discrete, 80)));
        assert!(!tables_on_gpu(&gpu(DeviceType::Discrete, 6)));
        assert!(!tables_on_gpu(&gpu(DeviceType::Integrated, 16)));
        assert!(!tables_on_gpu(&gpu(DeviceType::Cpu, 64)));
    }

    fn gemma_vulkan() -> (Model, Variant) {
        let catalog = Catalog::builtin().unwrap();
        let model = catalog.model("gemma-4-e2b").unwrap().clone();
        let variant = model.variant("vulkan-8da4w").unwrap().clone();
        (model, variant)
    }

    #[test]
    fn estimate_adds_weights_kv_cache_and_overhead() {
        let (model, variant) = gemma_vulkan();
        let e = estimate(&model, &variant, 4096, None, &facts(16 * GB), None);
        assert_eq!(e.weights_bytes, 2_500_000_000);
        assert_eq!(e.kv_cache_bytes, 9216 * 4 * 4096);
        assert_eq!(e.overhead_bytes, model.overhead_bytes);
        assert_eq!(
            e.total_bytes(),
            2_500_000_000 + 9216 * 4 * 4096 + model.overhead_bytes
        );
        assert_eq!(e.pool, MemoryPool::System);
    }

    #[test]
    fn lights_follow_the_share_of_available_memory() {
        let (model, variant) = gemma_vulkan();
        let total = estimate(&model, &variant, 4096, None, &facts(100 * GB), None).total_bytes();
        let light = |available: u64| {
            estimate(&model, &variant, 4096, None, &facts(available), None).light()
        };
        assert_eq!(light(total * 2), Light::Green);
        assert_eq!(light(total * 10 / 6 + 1_000), Light::Green);
        assert_eq!(light(total * 10 / 6 - 1_000), Light::Yellow);
        assert_eq!(light(total * 10 / 9 + 1_000), Light::Yellow);
        assert_eq!(light(total * 10 / 9 - 1_000), Light::Red);
        assert_eq!(light(total / 2), Light::Red);
        assert_eq!(light(0), Light::Red);
    }

    #[test]
    fn unknown_memory_gives_an_unknown_light_not_a_guess() {
        let (model, variant) = gemma_vulkan();
        let mut f = facts(GB);
        f.memory = None;
        let e = estimate(&model, &variant, 1024, None, &f, None);
        assert_eq!(e.light(), Light::Unknown);
        assert!(e.to_string().contains("available memory unknown"), "{e}");
    }

    #[test]
    fn discrete_gpus_are_measured_against_their_own_heap() {
        let (model, variant) = gemma_vulkan();
        let gpu = GpuAdapter {
            api: GpuApi::Vulkan,
            name: "Radeon".into(),
            vendor_id: 0x1002,
            device_type: DeviceType::Discrete,
            driver: "radv".into(),
            driver_info: String::new(),
            device_local_bytes: 2 * GB,
        };
        let e = estimate(&model, &variant, 4096, Some(&gpu), &facts(64 * GB), None);
        assert_eq!(
            e.pool,
            MemoryPool::GpuHeap {
                adapter: "Radeon".into()
            }
        );
        assert_eq!(e.light(), Light::Red);
        let text = e.to_string();
        assert!(
            text.starts_with("red: 2.50 GB weights + 0.15 GB KV cache (4096 tokens)"),
            "{text}"
        );
        assert!(
            text.contains("of 2.00 GB available Radeon memory"),
            "{text}"
        );
    }

    #[test]
    fn real_file_size_replaces_the_catalog_estimate() {
        let (model, variant) = gemma_vulkan();
        let e = estimate(&model, &variant, 0, None, &facts(GB), Some(123));
        assert_eq!(e.weights_bytes, 123);
        assert_eq!(e.kv_cache_bytes, 0);
    }
}
