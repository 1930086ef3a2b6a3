//! Delegate-blob front ends: each parses one backend's blob format (validated, zero-copy over the
//! program's bytes) and lowers it into the one op-graph IR.

pub mod mlx;
pub mod vulkan;
pub mod xnnpack;
