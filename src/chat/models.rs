//! The model picker's view of the catalog: every variant with its size, backend, whether it is
//! this device's default, its memory fit, and whether it is bundled, downloaded, downloading or
//! remote; and which files a `model[:variant]` spec loads.

use super::{ChatError, Result};
use crate::catalog::{self, Catalog, DeviceFacts, Model, Variant};
use crate::download::{Cache, Progress};
use crate::llm::ModelFiles;
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelView {
    pub id: String,
    pub name: String,
    pub bundled: bool,
    pub variants: Vec<VariantView>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariantView {
    /// `model:variant`: what download, delete and load take.
    pub spec: String,
    pub id: String,
    /// `mlx`, `vulkan`, `xnnpack` or `portable`.
    pub backend: &'static str,
    /// Runs on a GPU (MLX, Vulkan) rather than the CPU.
    pub gpu: bool,
    pub quantization: String,
    /// The real size once on disk, else the catalog's estimate.
    pub bytes: u64,
    /// The variant this device runs by default for its model.
    pub platform_default: bool,
    /// Why it is (or would be) the default, for a tooltip.
    pub default_reason: Option<String>,
    pub fit: FitView,
    pub state: VariantState,
    /// The model currently loaded for chat.
    pub loaded: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitView {
    /// `green`, `yellow`, `red` or `unknown`.
    pub light: &'static str,
    /// The numbers behind the light, one line.
    pub summary: String,
    pub total_bytes: u64,
    pub available_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum VariantState {
    /// Ships with the app; always available offline.
    Bundled,
    /// A bundled model whose files are missing from this build's assets.
    BundledMissing,
    Downloaded,
    Downloading {
        done: u64,
        total: u64,
    },
    /// An interrupted download; downloading again resumes it.
    Partial {
        bytes: u64,
    },
    Remote,
}

/// Builds the picker's list. `downloads` holds the latest progress of running downloads by spec.
pub fn list(
    catalog: &Catalog,
    cache: &Cache,
    facts: &DeviceFacts,
    assets_dir: &Path,
    downloads: &HashMap<String, Option<Progress>>,
    loaded: Option<&str>,
) -> Result<Vec<ModelView>> {
    let mut out = Vec::new();
    for model in catalog.models() {
        let choice = catalog::choose(model, facts, catalog.gpu_deny(), None)?;
        let mut variants = Vec::new();
        for v in &model.variants {
            let spec = model.spec(v);
            let local = cache.local_model(model, v)?;
            let bundled_dir = model.bundled_dir(v, assets_dir);
            let state = if model.is_bundled() {
                if bundled_dir.is_some() {
                    VariantState::Bundled
                } else {
                    VariantState::BundledMissing
                }
            } else if let Some(p) = downloads.get(&spec) {
                let (done, total) = p
                    .as_ref()
                    .map_or((0, v.approx_bytes), |p| (p.done, p.total));
                VariantState::Downloading { done, total }
            } else if local.is_some() {
                VariantState::Downloaded
            } else {
                match cache.partial_bytes(model, v) {
                    0 => VariantState::Remote,
                    bytes => VariantState::Partial { bytes },
                }
            };
            let real_size = match (&local, &bundled_dir) {
                (Some(l), _) => Some(l.bytes),
                (None, Some(dir)) => std::fs::metadata(dir.join(&v.file)).ok().map(|m| m.len()),
                _ => None,
            };
            let adapter = v
                .backend
                .gpu_api()
                .and_then(|api| facts.gpus.iter().find(|g| g.api == api));
            let fit = catalog::estimate(model, v, model.context_length, adapter, facts, real_size);
            let is_default = choice.variant.id == v.id;
            variants.push(VariantView {
                spec: spec.clone(),
                id: v.id.clone(),
                backend: v.backend.name(),
                gpu: v.backend.gpu_api().is_some(),
                quantization: v.quantization.clone(),
                bytes: real_size.unwrap_or(v.approx_bytes),
                platform_default: is_default,
                default_reason: is_default.then(|| choice.reason.to_string()),
                fit: FitView {
                    light: fit.light().name(),
                    summary: fit.to_string(),
                    total_bytes: fit.total_bytes(),
                    available_bytes: fit.available_bytes,
                },
                state,
                loaded: loaded == Some(spec.as_str()),
            });
        }
        out.push(ModelView {
            id: model.id.clone(),
            name: model.name.clone(),
            bundled: model.is_bundled(),
            variants,
        });
    }
    Ok(out)
}

/// A catalog model and variant from `model:variant`; the variant is required.
pub fn exact<'a>(catalog: &'a Catalog, spec: &str) -> Result<(&'a Model, &'a Variant)> {
    let (model, variant) = catalog.resolve(spec)?;
    let variant = variant.ok_or_else(|| ChatError::VariantRequired {
        spec: spec.to_string(),
    })?;
    Ok((model, variant))
}

/// The files `spec` (`model` or `model:variant`) loads, and the exact `model:variant` chosen.
/// Without a variant: a bundled model's first, else the downloaded one, preferring this device's
/// default when several are downloaded.
pub fn resolve_files(
    catalog: &Catalog,
    cache: &Cache,
    facts: &DeviceFacts,
    assets_dir: &Path,
    spec: &str,
) -> Result<(String, ModelFiles)> {
    let (model, explicit) = catalog.resolve(spec)?;
    if model.is_bundled() {
        let v = explicit
            .or(model.variants.first())
            .ok_or_else(|| ChatError::NotAvailable {
                spec: spec.to_string(),
                reason: "the catalog lists no variant for it".into(),
            })?;
        let dir = model
            .bundled_dir(v, assets_dir)
            .ok_or_else(|| ChatError::NotAvailable {
                spec: model.spec(v),
                reason: format!(
                    "the bundled files are missing from {}",
                    assets_dir.display()
                ),
            })?;
        return Ok((model.spec(v), ModelFiles::beside(dir.join(&v.file))?));
    }
    let candidates: Vec<&Variant> = match explicit {
        Some(v) => vec![v],
        None => {
            let preferred = catalog::choose(model, facts, catalog.gpu_deny(), None)?
                .variant
                .id
                .clone();
            let mut all: Vec<&Variant> = model.variants.iter().collect();
            all.sort_by_key(|v| v.id != preferred);
            all
        }
    };
    for v in candidates {
        if let Some(local) = cache.local_model(model, v)? {
            let files = ModelFiles::from_files(&local.program, &local.files)?;
            return Ok((model.spec(v), files));
        }
    }
    Err(ChatError::NotAvailable {
        spec: spec.to_string(),
        reason: "it is not downloaded; download it first".into(),
    })
}
