//! What the Vulkan driver itself charges for a dispatch: a chain of small dispatches recorded
//! through `ash`, with no wgpu in between, timed with the GPU's timestamps
//! (`kernels/dispatch_probe.wgsl`, compiled to SPIR-V by naga). A decode step is such a chain, so
//! this says how much of the step's dispatch floor (`bench::dependent_dispatch`) is the driver's
//! and how much is ours. A benchmark's, for `pteria bench --kernels`; no model runs through it.

use std::ffi::CStr;

use ash::vk;
use serde::Serialize;

/// Dispatches a chain runs: odd, so the chain's last slot holds -1 where every link ran.
const LINKS: usize = 255;
/// Floats a link negates (as `bench::dependent_dispatch`'s).
const N: usize = 1536;
const SLOT: u64 = (N * 4) as u64;

/// GPU time per dispatch, in µs, of chains of 255 negations of 1536 floats.
#[derive(Debug, Clone, Serialize)]
pub struct RawDispatch {
    /// Each dispatch after a pipeline barrier on the last one's writes.
    pub dependent_us: f64,
    /// The same, the kernel's guard read from a uniform before its first load (as every kernel
    /// of ours reads its `Params`).
    pub dependent_uniform_us: f64,
    /// Back to back, no barriers: what a dispatch costs where nothing makes it wait.
    pub back_to_back_us: f64,
}

/// Times the chains on the Vulkan device named `adapter` (the name wgpu reports), each for
/// about `seconds` of GPU time. An error says why not: no loader, no such device, no timestamps.
pub fn raw_dispatch(adapter: &str, seconds: f64) -> Result<RawDispatch, String> {
    let code = spirv()?;
    // SAFETY: `Probe::open` and the calls below follow the Vulkan valid-usage rules the comments
    // there give; every handle is made and destroyed by `Probe`.
    unsafe {
        let mut probe = Probe::open(adapter, &code)?;
        let plain = probe.pipeline(c"plain")?;
        let param = probe.pipeline(c"param")?;
        Ok(RawDispatch {
            dependent_us: probe.time(plain, true, seconds)? * 1e6,
            dependent_uniform_us: probe.time(param, true, seconds)? * 1e6,
            back_to_back_us: probe.time(plain, false, seconds)? * 1e6,
        })
    }
}

/// The probe's kernels as one SPIR-V module, each entry point named as its WGSL function.
fn spirv() -> Result<Vec<u32>, String> {
    let src = include_str!("../../kernels/dispatch_probe.wgsl");
    let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .map_err(|e| format!("dispatch_probe.wgsl: {e}"))?;
    naga::back::spv::write_vec(&module, &info, &naga::back::spv::Options::default(), None)
        .map_err(|e| format!("dispatch_probe.wgsl to SPIR-V: {e}"))
}

fn err(what: &str) -> impl Fn(vk::Result) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// A device with the chain's buffers and descriptor sets; `Drop` destroys all of it.
struct Probe {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: Option<ash::Device>,
    queue: vk::Queue,
    period_ns: f64,
    memory: vk::PhysicalDeviceMemoryProperties,
    buffers: Vec<(vk::Buffer, vk::DeviceMemory)>,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pool: vk::DescriptorPool,
    sets: Vec<vk::DescriptorSet>,
    pipelines: Vec<vk::Pipeline>,
    module: vk::ShaderModule,
    commands: vk::CommandPool,
    cmd: vk::CommandBuffer,
    queries: vk::QueryPool,
    fence: vk::Fence,
    /// The chain's slots, the uniform, and the host-visible copy of the last slot.
    slots: vk::Buffer,
    uniform: vk::Buffer,
    readback: (vk::Buffer, vk::DeviceMemory),
}

impl Probe {
    /// # Safety
    /// Loads the system's Vulkan loader, which runs its library initialisers.
    unsafe fn open(adapter: &str, code: &[u32]) -> Result<Probe, String> {
        let entry = ash::Entry::load().map_err(|e| format!("no Vulkan loader: {e}"))?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"pteria")
            .api_version(vk::API_VERSION_1_0);
        let instance = entry
            .create_instance(
                &vk::InstanceCreateInfo::default().application_info(&app),
                None,
            )
            .map_err(err("Vulkan instance"))?;
        let mut probe = Probe {
            _entry: entry,
            instance,
            device: None,
            queue: vk::Queue::null(),
            period_ns: 0.0,
            memory: vk::PhysicalDeviceMemoryProperties::default(),
            buffers: Vec::new(),
            set_layout: vk::DescriptorSetLayout::null(),
            layout: vk::PipelineLayout::null(),
            pool: vk::DescriptorPool::null(),
            sets: Vec::new(),
            pipelines: Vec::new(),
            module: vk::ShaderModule::null(),
            commands: vk::CommandPool::null(),
            cmd: vk::CommandBuffer::null(),
            queries: vk::QueryPool::null(),
            fence: vk::Fence::null(),
            slots: vk::Buffer::null(),
            uniform: vk::Buffer::null(),
            readback: (vk::Buffer::null(), vk::DeviceMemory::null()),
        };
        probe.init(adapter, code)?;
        Ok(probe)
    }

    unsafe fn init(&mut self, adapter: &str, code: &[u32]) -> Result<(), String> {
        let inst = &self.instance;
        let pd = inst
            .enumerate_physical_devices()
            .map_err(err("Vulkan devices"))?
            .into_iter()
            .find(|&pd| {
                let props = inst.get_physical_device_properties(pd);
                props
                    .device_name_as_c_str()
                    .ok()
                    .and_then(|c| c.to_str().ok())
                    == Some(adapter)
            })
            .ok_or_else(|| format!("no Vulkan device named {adapter:?}"))?;
        let props = inst.get_physical_device_properties(pd);
        self.period_ns = props.limits.timestamp_period as f64;
        self.memory = inst.get_physical_device_memory_properties(pd);
        let family = inst
            .get_physical_device_queue_family_properties(pd)
            .iter()
            .position(|q| {
                q.queue_flags.contains(vk::QueueFlags::COMPUTE) && q.timestamp_valid_bits > 0
            })
            .ok_or("no compute queue with timestamps")? as u32;
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        let device = inst
            .create_device(
                pd,
                &vk::DeviceCreateInfo::default().queue_create_infos(&queues),
                None,
            )
            .map_err(err("Vulkan device"))?;
        self.queue = device.get_device_queue(family, 0);
        self.device = Some(device);
        let device = self.device.as_ref().unwrap().clone();

        let local = vk::MemoryPropertyFlags::DEVICE_LOCAL;
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let transfer = vk::BufferUsageFlags::TRANSFER_DST | vk::BufferUsageFlags::TRANSFER_SRC;
        self.slots = self
            .buffer(
                SLOT * (LINKS as u64 + 1),
                vk::BufferUsageFlags::STORAGE_BUFFER | transfer,
                local,
            )?
            .0;
        self.uniform = self
            .buffer(16, vk::BufferUsageFlags::UNIFORM_BUFFER | transfer, local)?
            .0;
        self.readback = self.buffer(SLOT, transfer, host)?;

        let binding = |i: u32, ty: vk::DescriptorType| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(i)
                .descriptor_type(ty)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        };
        let bindings = [
            binding(0, vk::DescriptorType::STORAGE_BUFFER),
            binding(1, vk::DescriptorType::STORAGE_BUFFER),
            binding(2, vk::DescriptorType::UNIFORM_BUFFER),
        ];
        self.set_layout = device
            .create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                None,
            )
            .map_err(err("descriptor set layout"))?;
        let set_layouts = [self.set_layout];
        self.layout = device
            .create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts),
                None,
            )
            .map_err(err("pipeline layout"))?;
        self.module = device
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(code), None)
            .map_err(err("shader module"))?;
        let sizes = [
            vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(2 * LINKS as u32),
            vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::UNIFORM_BUFFER)
                .descriptor_count(LINKS as u32),
        ];
        self.pool = device
            .create_descriptor_pool(
                &vk::DescriptorPoolCreateInfo::default()
                    .max_sets(LINKS as u32)
                    .pool_sizes(&sizes),
                None,
            )
            .map_err(err("descriptor pool"))?;
        let layouts = vec![self.set_layout; LINKS];
        self.sets = device
            .allocate_descriptor_sets(
                &vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(self.pool)
                    .set_layouts(&layouts),
            )
            .map_err(err("descriptor sets"))?;
        // Link i reads slot i and writes slot i + 1 (6144-byte slots suit any storage offset
        // alignment, which Vulkan caps at 256).
        for (i, &set) in self.sets.iter().enumerate() {
            let range = |b: vk::Buffer, slot: u64, bytes: u64| {
                [vk::DescriptorBufferInfo::default()
                    .buffer(b)
                    .offset(slot * bytes)
                    .range(bytes)]
            };
            let (src, dst, uni) = (
                range(self.slots, i as u64, SLOT),
                range(self.slots, i as u64 + 1, SLOT),
                range(self.uniform, 0, 16),
            );
            let write = |b: u32, ty: vk::DescriptorType, info| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(b)
                    .descriptor_type(ty)
                    .buffer_info(info)
            };
            device.update_descriptor_sets(
                &[
                    write(0, vk::DescriptorType::STORAGE_BUFFER, &src),
                    write(1, vk::DescriptorType::STORAGE_BUFFER, &dst),
                    write(2, vk::DescriptorType::UNIFORM_BUFFER, &uni),
                ],
                &[],
            );
        }
        self.commands = device
            .create_command_pool(
                &vk::CommandPoolCreateInfo::default()
                    .queue_family_index(family)
                    .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                None,
            )
            .map_err(err("command pool"))?;
        self.cmd = device
            .allocate_command_buffers(
                &vk::CommandBufferAllocateInfo::default()
                    .command_pool(self.commands)
                    .command_buffer_count(1),
            )
            .map_err(err("command buffer"))?[0];
        self.queries = device
            .create_query_pool(
                &vk::QueryPoolCreateInfo::default()
                    .query_type(vk::QueryType::TIMESTAMP)
                    .query_count(2),
                None,
            )
            .map_err(err("query pool"))?;
        self.fence = device
            .create_fence(&vk::FenceCreateInfo::default(), None)
            .map_err(err("fence"))?;
        Ok(())
    }

    fn device(&self) -> &ash::Device {
        self.device.as_ref().expect("opened")
    }

    /// A buffer bound to memory of its own with `flags`, kept for `Drop`.
    unsafe fn buffer(
        &mut self,
        size: u64,
        usage: vk::BufferUsageFlags,
        flags: vk::MemoryPropertyFlags,
    ) -> Result<(vk::Buffer, vk::DeviceMemory), String> {
        let device = self.device().clone();
        let buffer = device
            .create_buffer(
                &vk::BufferCreateInfo::default().size(size).usage(usage),
                None,
            )
            .map_err(err("buffer"))?;
        let req = device.get_buffer_memory_requirements(buffer);
        let Some(kind) = (0..self.memory.memory_type_count).find(|&i| {
            req.memory_type_bits & (1 << i) != 0
                && self.memory.memory_types[i as usize]
                    .property_flags
                    .contains(flags)
        }) else {
            device.destroy_buffer(buffer, None);
            return Err(format!("no memory type with flags {:#x}", flags.as_raw()));
        };
        let memory = match device.allocate_memory(
            &vk::MemoryAllocateInfo::default()
                .allocation_size(req.size)
                .memory_type_index(kind),
            None,
        ) {
            Ok(m) => m,
            Err(e) => {
                device.destroy_buffer(buffer, None);
                return Err(format!("buffer memory: {e}"));
            }
        };
        self.buffers.push((buffer, memory));
        device
            .bind_buffer_memory(buffer, memory, 0)
            .map_err(err("binding buffer memory"))?;
        Ok((buffer, memory))
    }

    /// The pipeline of the module's entry point `entry`.
    unsafe fn pipeline(&mut self, entry: &CStr) -> Result<vk::Pipeline, String> {
        let device = self.device().clone();
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(self.module)
            .name(entry);
        let pipeline = device
            .create_compute_pipelines(
                vk::PipelineCache::null(),
                &[vk::ComputePipelineCreateInfo::default()
                    .stage(stage)
                    .layout(self.layout)],
                None,
            )
            .map_err(|(_, e)| format!("compute pipeline: {e}"))?[0];
        self.pipelines.push(pipeline);
        Ok(pipeline)
    }

    /// Seconds a dispatch, the median of runs after some unmeasured ones (an idle GPU starts at
    /// low clocks). With `barriers`, each run also checks that the chain negated its input 255
    /// times: a dispatch lost or run out of order leaves a zero in the last slot.
    unsafe fn time(
        &self,
        pipeline: vk::Pipeline,
        barriers: bool,
        seconds: f64,
    ) -> Result<f64, String> {
        let first = self.run(pipeline, barriers)?;
        let runs = ((seconds / (first * LINKS as f64).max(1e-6)) as usize).clamp(5, 400);
        for _ in 0..runs / 4 {
            self.run(pipeline, barriers)?;
        }
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            times.push(self.run(pipeline, barriers)?);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[runs / 2])
    }

    unsafe fn run(&self, pipeline: vk::Pipeline, barriers: bool) -> Result<f64, String> {
        let d = self.device();
        let cmd = self.cmd;
        d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
            .map_err(err("resetting the command buffer"))?;
        d.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())
            .map_err(err("recording"))?;
        // The first slot 1.0 (0x3f800000), every other zero, the uniform's n the slot's length.
        // The fills must not overlap: transfers are not ordered among themselves without a
        // barrier (overlapping ones left some of the first slot zero on an H200).
        d.cmd_fill_buffer(cmd, self.slots, 0, SLOT, 0x3f80_0000);
        d.cmd_fill_buffer(cmd, self.slots, SLOT, vk::WHOLE_SIZE, 0);
        d.cmd_update_buffer(cmd, self.uniform, 0, &(N as u32).to_le_bytes());
        let barrier = |src, dst, src_access, dst_access| {
            let m = [vk::MemoryBarrier::default()
                .src_access_mask(src_access)
                .dst_access_mask(dst_access)];
            d.cmd_pipeline_barrier(cmd, src, dst, vk::DependencyFlags::empty(), &m, &[], &[]);
        };
        let (transfer, compute) = (
            vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::COMPUTE_SHADER,
        );
        let (read, write) = (vk::AccessFlags::SHADER_READ, vk::AccessFlags::SHADER_WRITE);
        barrier(
            transfer,
            compute,
            vk::AccessFlags::TRANSFER_WRITE,
            read | write | vk::AccessFlags::UNIFORM_READ,
        );
        d.cmd_reset_query_pool(cmd, self.queries, 0, 2);
        d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
        d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, self.queries, 0);
        let groups = N.div_ceil(256) as u32;
        for (i, &set) in self.sets.iter().enumerate() {
            d.cmd_bind_descriptor_sets(
                cmd,
                vk::PipelineBindPoint::COMPUTE,
                self.layout,
                0,
                &[set],
                &[],
            );
            d.cmd_dispatch(cmd, groups, 1, 1);
            if barriers && i + 1 < LINKS {
                barrier(compute, compute, write, read | write);
            }
        }
        d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, self.queries, 1);
        barrier(compute, transfer, write, vk::AccessFlags::TRANSFER_READ);
        let last = [vk::BufferCopy::default()
            .src_offset(LINKS as u64 * SLOT)
            .size(SLOT)];
        d.cmd_copy_buffer(cmd, self.slots, self.readback.0, &last);
        d.end_command_buffer(cmd).map_err(err("recording"))?;
        let cmds = [cmd];
        d.queue_submit(
            self.queue,
            &[vk::SubmitInfo::default().command_buffers(&cmds)],
            self.fence,
        )
        .map_err(err("submit"))?;
        d.wait_for_fences(&[self.fence], true, 60_000_000_000)
            .map_err(err("waiting for the GPU"))?;
        d.reset_fences(&[self.fence]).map_err(err("fence"))?;
        let mut stamps = [0u64; 2];
        d.get_query_pool_results(
            self.queries,
            0,
            &mut stamps,
            vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
        )
        .map_err(err("timestamps"))?;
        if barriers {
            let ptr = d
                .map_memory(self.readback.1, 0, SLOT, vk::MemoryMapFlags::empty())
                .map_err(err("mapping the readback"))?;
            let words = std::slice::from_raw_parts(ptr as *const f32, N);
            let wrong = words.iter().filter(|&&v| v != -1.0).count();
            d.unmap_memory(self.readback.1);
            if wrong > 0 {
                return Err(format!(
                    "the chain of {LINKS} negations left {wrong} of {N} values other than -1"
                ));
            }
        }
        let ns = stamps[1].saturating_sub(stamps[0]) as f64 * self.period_ns;
        Ok(ns * 1e-9 / LINKS as f64)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // SAFETY: every handle was made from this instance and device, none is in use once the
        // device is idle, and each is destroyed once.
        unsafe {
            if let Some(d) = self.device.take() {
                let _ = d.device_wait_idle();
                d.destroy_fence(self.fence, None);
                d.destroy_query_pool(self.queries, None);
                d.destroy_command_pool(self.commands, None);
                for &p in &self.pipelines {
                    d.destroy_pipeline(p, None);
                }
                d.destroy_shader_module(self.module, None);
                d.destroy_descriptor_pool(self.pool, None);
                d.destroy_pipeline_layout(self.layout, None);
                d.destroy_descriptor_set_layout(self.set_layout, None);
                for &(b, m) in &self.buffers {
                    d.destroy_buffer(b, None);
                    d.free_memory(m, None);
                }
                d.destroy_device(None);
            }
            self.instance.destroy_instance(None);
        }
    }
}
