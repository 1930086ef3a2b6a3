//! Delegate-blob front ends: each parses one backend's blob format (validated, zero-copy over the
//! program's bytes) and lowers it into the one op-graph IR.

pub mod mlx;
pub mod vulkan;
pub mod xnnpack;

use crate::pte::{BackendDelegate, NamedData};
use std::collections::BTreeMap;

/// The node/op histogram of a delegate blob in a format we read, for `inspect`; `None` for a
/// backend id no front end knows.
pub fn delegate_histogram(
    d: &BackendDelegate,
    named: &NamedData,
) -> Option<Result<BTreeMap<String, usize>, String>> {
    Some(match d.id.as_str() {
        "VulkanBackend" => vulkan::parse(&d.data, named)
            .map(|g| g.op_histogram())
            .map_err(|e| e.to_string()),
        "MLXBackend" => mlx::parse(&d.data, named)
            .map(|g| g.node_histogram())
            .map_err(|e| e.to_string()),
        "XnnpackBackend" => xnnpack::parse(&d.data, named)
            .map(|g| g.node_histogram())
            .map_err(|e| e.to_string()),
        _ => return None,
    })
}

/// The IR ops a delegate blob lowers to (after the load-time passes), by label, for `inspect`;
/// `None` for a backend id no front end knows.
pub fn delegate_ir_histogram(
    d: &BackendDelegate,
    named: &NamedData,
) -> Option<Result<BTreeMap<String, usize>, String>> {
    use crate::runtime::delegate::FrontEnd;
    let front: &dyn FrontEnd = match d.id.as_str() {
        vulkan::BACKEND_ID => &VulkanFrontEnd,
        mlx::BACKEND_ID => &MlxFrontEnd,
        xnnpack::BACKEND_ID => &XnnpackFrontEnd,
        _ => return None,
    };
    Some(front.lower(d, named).map(|g| g.op_histogram()))
}

/// The Vulkan delegate format as an IR front end.
pub struct VulkanFrontEnd;

impl crate::runtime::delegate::FrontEnd for VulkanFrontEnd {
    fn backend_id(&self) -> &'static str {
        vulkan::BACKEND_ID
    }
    fn lower(&self, d: &BackendDelegate, named: &NamedData) -> Result<crate::ir::Graph, String> {
        let vk = vulkan::parse(&d.data, named).map_err(|e| e.to_string())?;
        let mut g = vulkan::lower::lower(&vk)?;
        crate::ir::passes::optimize(&mut g);
        Ok(g)
    }
    fn unsupported_ops(&self, d: &BackendDelegate, named: &NamedData) -> Vec<String> {
        // A blob that does not parse is reported by `lower`, with its reason.
        vulkan::parse(&d.data, named)
            .map_or_else(|_| Vec::new(), |vk| vulkan::lower::unsupported(&vk))
    }
}

/// The XNNPACK delegate format as an IR front end.
pub struct XnnpackFrontEnd;

impl crate::runtime::delegate::FrontEnd for XnnpackFrontEnd {
    fn backend_id(&self) -> &'static str {
        xnnpack::BACKEND_ID
    }
    fn lower(&self, d: &BackendDelegate, named: &NamedData) -> Result<crate::ir::Graph, String> {
        let x = xnnpack::parse(&d.data, named).map_err(|e| e.to_string())?;
        let mut g = xnnpack::lower::lower(&x)?;
        crate::ir::passes::optimize(&mut g);
        Ok(g)
    }
}

/// The MLX delegate format as an IR front end.
pub struct MlxFrontEnd;

impl crate::runtime::delegate::FrontEnd for MlxFrontEnd {
    fn backend_id(&self) -> &'static str {
        mlx::BACKEND_ID
    }
    fn lower(&self, d: &BackendDelegate, named: &NamedData) -> Result<crate::ir::Graph, String> {
        let m = mlx::parse(&d.data, named).map_err(|e| e.to_string())?;
        let mut g = mlx::lower::lower(&m, named)?;
        crate::ir::passes::optimize(&mut g);
        Ok(g)
    }
}

/// A registry with every delegate format we can lower, each executed by `make`.
pub fn backends(
    make: crate::runtime::delegate::ExecutorFactory,
) -> crate::runtime::BackendRegistry {
    use crate::runtime::delegate::IrBackend;
    use std::sync::Arc;
    let mut r = crate::runtime::BackendRegistry::default();
    r.register(Arc::new(IrBackend::new(
        Arc::new(VulkanFrontEnd),
        make.clone(),
    )));
    r.register(Arc::new(IrBackend::new(
        Arc::new(XnnpackFrontEnd),
        make.clone(),
    )));
    r.register(Arc::new(IrBackend::new(
        Arc::new(MlxFrontEnd),
        make.clone(),
    )));
    r.set_whole_method(Some(make));
    r
}
