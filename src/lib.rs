//! Pteria: read ExecuTorch programs (`.pte`/`.ptd`) and run them on-device, on the CPU or the GPU.
//!
//! Layers, upstream to downstream: `fb` (safe FlatBuffers) → `pte` (validated program view) →
//! `runtime` (CPU reference executor) → LLM runner → chat core → shells.

pub mod catalog;
pub mod chat;
pub mod download;
pub mod fb;
pub mod frontend;
pub mod gpu;
pub mod ir;
pub mod llm;
pub mod pte;
pub mod runtime;
