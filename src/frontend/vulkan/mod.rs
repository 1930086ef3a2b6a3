//! `VulkanBackend` blobs: the VH00 header and the VK00 `vkgraph.VkGraph` flatbuffer.
//!
//! `parse` takes a delegate's blob (from `pte::BackendDelegate.data`) and the program's named
//! data, and returns an owned, validated `VkGraph` whose constants are zero-copy `Blob`s. Lowering
//! to the IR reads from here and never touches the raw bytes again.

mod header;
pub mod lower;
#[cfg(test)]
mod op_tests;
mod read;
mod schema;
#[cfg(test)]
mod tests;

pub use header::HEADER_LEN;
pub use schema::{
    OperatorCall, VkBytes, VkDataType, VkGraph, VkMemoryLayout, VkStorageType, VkTensor, VkValue,
    VulkanHeader,
};

use crate::fb::FbError;
use crate::pte::{Blob, NamedData};
use std::collections::BTreeMap;

/// The id ExecuTorch records in `BackendDelegate.id` for these blobs.
pub const BACKEND_ID: &str = "VulkanBackend";

/// Why a Vulkan blob was rejected; each message says what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum VulkanError {
    #[error("Vulkan blob header: {0}")]
    Header(String),
    /// `source.at` is a byte offset in the blob (not in the flatbuffer).
    #[error("malformed VkGraph flatbuffer ({context}): {source}")]
    Flatbuffer { context: String, source: FbError },
    #[error("VkGraph: {0}")]
    Graph(String),
    #[error("VkGraph value {index}: {what}")]
    Value { index: usize, what: String },
    #[error("VkGraph operator call {index} (`{name}`): {what}")]
    Operator {
        index: usize,
        name: String,
        what: String,
    },
    /// `list` is "input" or "output".
    #[error("VkGraph {list} {index}: {what}")]
    Io {
        list: &'static str,
        index: usize,
        what: String,
    },
    /// `list` is "constant" or "shader".
    #[error("VkGraph {list} {index}: {what}")]
    Bytes {
        list: &'static str,
        index: usize,
        what: String,
    },
}

/// Parses and validates a Vulkan delegate blob.
///
/// Named-data constants (offset `u64::MAX`) are looked up in `named`; inline constants are
/// sliced from `blob`'s raw constant region. Both stay zero-copy views of the loaded file.
pub fn parse(blob: &Blob, named: &NamedData) -> Result<VkGraph, VulkanError> {
    read::parse(blob, named)
}

impl VkGraph {
    /// How many times each operator name occurs in the chain.
    pub fn op_histogram(&self) -> BTreeMap<String, usize> {
        let mut h = BTreeMap::new();
        for op in &self.chain {
            *h.entry(op.name.clone()).or_insert(0) += 1;
        }
        h
    }

    /// The tensor at value id `id`, if that value is a tensor.
    pub fn tensor(&self, id: usize) -> Option<&VkTensor> {
        self.values.get(id)?.as_tensor()
    }

    /// The constant bytes behind a tensor value (`None` for computed tensors).
    pub fn constant_data(&self, id: usize) -> Option<&Blob> {
        Some(&self.constants.get(self.tensor(id)?.constant_id?)?.data)
    }
}
