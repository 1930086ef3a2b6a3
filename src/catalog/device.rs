//! What this device offers a model: OS, GPU adapters, memory. `probe` fills `DeviceFacts`; every
//! decision over them (`select`, `fit`) is a pure function so it is tested without hardware.

use std::ffi::CStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    MacOs,
    Ios,
    Android,
    Linux,
    Windows,
    Other,
}

impl Os {
    pub fn current() -> Os {
        match std::env::consts::OS {
            "macos" => Os::MacOs,
            "ios" => Os::Ios,
            "android" => Os::Android,
            "linux" => Os::Linux,
            "windows" => Os::Windows,
            _ => Os::Other,
        }
    }

    pub fn is_apple(self) -> bool {
        matches!(self, Os::MacOs | Os::Ios)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuApi {
    Vulkan,
    Metal,
}

/// Vulkan's `VkPhysicalDeviceType`, which Metal adapters map onto too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceType {
    Discrete,
    Integrated,
    Virtual,
    /// A software rasterizer (llvmpipe/lavapipe, SwiftShader): never a suitable GPU.
    Cpu,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuAdapter {
    pub api: GpuApi,
    pub name: String,
    pub vendor_id: u32,
    pub device_type: DeviceType,
    /// The driver's own name (`VkPhysicalDeviceDriverProperties::driverName`: "radv", "NVIDIA",
    /// "llvmpipe"); empty when the driver predates Vulkan 1.2.
    pub driver: String,
    pub driver_info: String,
    /// The largest device-local memory heap. On integrated GPUs this is carved out of system RAM.
    pub device_local_bytes: u64,
}

impl GpuAdapter {
    /// The PCI vendor for display (PCI-SIG ids; Khronos ids for vendors without one).
    pub fn vendor(&self) -> &'static str {
        match self.vendor_id {
            0x10DE => "NVIDIA",
            0x1002 => "AMD",
            0x8086 => "Intel",
            0x13B5 => "ARM",
            0x5143 => "Qualcomm",
            0x1010 => "Imagination",
            0x106B => "Apple",
            0x144D => "Samsung",
            0x10005 => "Mesa",
            _ => "unknown vendor",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub total_bytes: u64,
    /// What can be allocated without swapping (`MemAvailable` on Linux).
    pub available_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    pub os: Os,
    pub gpus: Vec<GpuAdapter>,
    /// `None` where this build cannot read it.
    pub memory: Option<Memory>,
    /// Why a probe step found nothing ("no Vulkan loader: ..."), for `models list` to show.
    pub notes: Vec<String>,
}

/// Looks at this device. Never fails: what cannot be read is left out and noted.
pub fn probe() -> DeviceFacts {
    let os = Os::current();
    let mut notes = Vec::new();
    let gpus = if os.is_apple() {
        apple_gpu(&mut notes)
    } else {
        vulkan::adapters(&mut notes)
    };
    let memory = read_memory(&mut notes);
    DeviceFacts {
        os,
        gpus,
        memory,
        notes,
    }
}

/// MLX runs on Apple silicon, whose unified-memory GPU is always present; Intel Macs have no MLX
/// GPU path. We do not link Metal just to confirm what the architecture already says.
/// The Metal adapter as wgpu reports it. Metal exposes no heap sizes (memory is unified), so the
/// fit estimate uses system memory.
fn apple_gpu(notes: &mut Vec<String>) -> Vec<GpuAdapter> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::METAL;
    let instance = wgpu::Instance::new(desc.with_env());
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        force_fallback_adapter: false,
        compatible_surface: None,
        apply_limit_buckets: false,
    }));
    match adapter {
        Ok(a) => {
            let i = a.get_info();
            vec![GpuAdapter {
                api: GpuApi::Metal,
                name: i.name,
                vendor_id: i.vendor,
                device_type: match i.device_type {
                    wgpu::DeviceType::DiscreteGpu => DeviceType::Discrete,
                    wgpu::DeviceType::IntegratedGpu => DeviceType::Integrated,
                    wgpu::DeviceType::VirtualGpu => DeviceType::Virtual,
                    wgpu::DeviceType::Cpu => DeviceType::Cpu,
                    wgpu::DeviceType::Other => DeviceType::Other,
                },
                driver: i.driver,
                driver_info: i.driver_info,
                device_local_bytes: 0,
            }]
        }
        Err(e) => {
            notes.push(format!("no Metal adapter: {e}"));
            Vec::new()
        }
    }
}

fn read_memory(notes: &mut Vec<String>) -> Option<Memory> {
    if cfg!(any(target_os = "linux", target_os = "android")) {
        match std::fs::read_to_string("/proc/meminfo") {
            Ok(text) => {
                let memory = parse_meminfo(&text);
                if memory.is_none() {
                    notes.push("/proc/meminfo has no MemTotal/MemAvailable".into());
                }
                memory
            }
            Err(e) => {
                notes.push(format!("cannot read /proc/meminfo: {e}"));
                None
            }
        }
    } else {
        notes.push("available memory is not read on this OS yet".into());
        None
    }
}

/// `MemAvailable` (Linux 3.14+) already counts reclaimable page cache, unlike `MemFree`.
fn parse_meminfo(text: &str) -> Option<Memory> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let rest = line[name.len()..].trim_start_matches(':').trim();
        let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
        kib.checked_mul(1024)
    };
    Some(Memory {
        total_bytes: field("MemTotal")?,
        available_bytes: field("MemAvailable")?,
    })
}

fn c_text(s: Result<&CStr, std::ffi::FromBytesUntilNulError>) -> String {
    s.map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

mod vulkan {
    //! Vulkan adapter facts through the system loader, loaded at run time so a device without
    //! Vulkan simply reports none.

    use ash::vk;

    use super::{c_text, DeviceType, GpuAdapter, GpuApi};

    pub fn adapters(notes: &mut Vec<String>) -> Vec<GpuAdapter> {
        // SAFETY: loading the Vulkan loader runs its library initialisers, as in any Vulkan
        // program; nothing of ours is shared with it yet.
        let entry = match unsafe { ash::Entry::load() } {
            Ok(entry) => entry,
            Err(e) => {
                notes.push(format!("no Vulkan loader ({e}): no Vulkan GPU"));
                return Vec::new();
            }
        };
        // SAFETY: `entry` holds a loaded loader.
        let instance_version = match unsafe { entry.try_enumerate_instance_version() } {
            Ok(v) => v.unwrap_or(vk::API_VERSION_1_0),
            Err(e) => {
                notes.push(format!("Vulkan loader cannot report its version: {e}"));
                return Vec::new();
            }
        };
        // Driver names need vkGetPhysicalDeviceProperties2, core since 1.1.
        let api_version = instance_version.min(vk::API_VERSION_1_2);
        let app = vk::ApplicationInfo::default()
            .application_name(c"pteria")
            .api_version(api_version);
        let info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: `info` and `app` outlive the call; no extensions or layers are asked for.
        let instance = match unsafe { entry.create_instance(&info, None) } {
            Ok(i) => i,
            Err(e) => {
                notes.push(format!("cannot create a Vulkan instance: {e}"));
                return Vec::new();
            }
        };
        let mut found = Vec::new();
        // SAFETY: the instance is live until `destroy_instance` below, and every physical device
        // handle comes from it.
        unsafe {
            match instance.enumerate_physical_devices() {
                Ok(devices) => {
                    for pd in devices {
                        found.push(describe(&instance, pd, api_version));
                    }
                }
                Err(e) => notes.push(format!("cannot list Vulkan devices: {e}")),
            }
            instance.destroy_instance(None);
        }
        if found.is_empty() && notes.is_empty() {
            notes.push("the Vulkan loader found no device".into());
        }
        found
    }

    /// # Safety
    /// `pd` must come from `instance`, which must be live.
    unsafe fn describe(
        instance: &ash::Instance,
        pd: vk::PhysicalDevice,
        api_version: u32,
    ) -> GpuAdapter {
        let props = instance.get_physical_device_properties(pd);
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        // VkPhysicalDeviceDriverProperties is core in 1.2; chaining it on an older device is invalid.
        let has_driver_props =
            api_version >= vk::API_VERSION_1_1 && props.api_version >= vk::API_VERSION_1_2;
        if has_driver_props {
            let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut driver);
            instance.get_physical_device_properties2(pd, &mut props2);
        }
        let memory = instance.get_physical_device_memory_properties(pd);
        let device_local_bytes = memory
            .memory_heaps_as_slice()
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
            .unwrap_or(0);
        let device_type = match props.device_type {
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceType::Discrete,
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceType::Integrated,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceType::Virtual,
            vk::PhysicalDeviceType::CPU => DeviceType::Cpu,
            _ => DeviceType::Other,
        };
        let (driver_name, driver_info) = if has_driver_props {
            (
                c_text(driver.driver_name_as_c_str()),
                c_text(driver.driver_info_as_c_str()),
            )
        } else {
            (String::new(), String::new())
        };
        GpuAdapter {
            api: GpuApi::Vulkan,
            name: c_text(props.device_name_as_c_str()),
            vendor_id: props.vendor_id,
            device_type,
            driver: driver_name,
            driver_info,
            device_local_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_gives_total_and_available_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some(Memory {
                total_bytes: 24_576_000 * 1024,
                available_bytes: 20_000_000 * 1024
            })
        );
    }

    #[test]
    fn meminfo_without_available_is_unknown() {
        assert_eq!(parse_meminfo("MemTotal: 100 kB\nMemFree: 50 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: lots\nMemAvailable: 1 kB\n"), None);
    }

    #[test]
    fn probe_never_fails_and_explains_what_it_could_not_see() {
        let facts = probe();
        assert_eq!(facts.os, Os::current());
        if cfg!(target_os = "linux") {
            let memory = facts.memory.expect("Linux always has /proc/meminfo");
            assert!(memory.available_bytes <= memory.total_bytes);
            assert!(memory.total_bytes > 0);
        }
        if facts.gpus.is_empty() {
            assert!(!facts.notes.is_empty(), "an empty GPU list must say why");
        }
        for gpu in &facts.gpus {
            assert!(!gpu.name.is_empty());
        }
    }
}
