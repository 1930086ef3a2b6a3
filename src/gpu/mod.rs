//! The GPU executor: runs an `ir::Graph` through wgpu with Pteria's WGSL kernels (`kernels/`, one
//! file per op family, found by `OpKind::name()`).
//!
//! `context` opens the device and caches pipelines; `memory` decides where each tensor lives;
//! `ops` turns one IR op into kernel dispatches; `executor` records a whole call once per shape
//! signature and replays it. The CPU executor (`ir::cpu`) is the reference every kernel is tested
//! against, and the fallback when `Context::new` finds no usable GPU.

pub mod bench;
mod context;
mod executor;
mod host_gather;
mod ksums;
mod memory;
mod ops;
pub mod phase_chain;
pub mod raw_vulkan;
mod wait;

pub use context::{AdapterSummary, Context, ContextOptions};
pub use executor::{ExecutorStats, GpuExecutor, HostTimes, OpTime, ReplayTiming};
pub use host_gather::host_gathered_tables;
pub use memory::MemoryReport;
pub use ops::{QUAD_MATVEC_MAX_M, SPLIT_MAX_S, SPLIT_MAX_S_ALL_ROWS};

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    #[error("GPU device: {0}")]
    Device(String),
    #[error("the GPU executor does not support this graph:\n  {}", .0.join("\n  "))]
    Unsupported(Vec<String>),
    #[error("kernel `{kernel}` entry `{entry}`: {msg}")]
    Shader {
        kernel: &'static str,
        entry: &'static str,
        msg: String,
    },
    #[error(transparent)]
    Ir(#[from] crate::ir::IrError),
}
