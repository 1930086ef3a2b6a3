//! The model catalog: which models and variants exist, where their files live, and which variant
//! suits this device. `assets/catalog.toml` is compiled in; `download` fetches what it names and
//! the shells show it.

mod device;
mod fit;
mod select;

pub use device::{probe, DeviceFacts, DeviceType, GpuAdapter, GpuApi, Memory, Os};
pub use fit::{estimate, tables_on_gpu, FitEstimate, Light, MemoryPool, TABLES_ON_GPU_MIN_HEAP};
pub use select::{choose, Choice, Reason};

use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

/// The catalog shipped with this build.
const BUILTIN: &str = include_str!("../../assets/catalog.toml");

/// Bytes per cached K or V element when a variant does not say: fp32, the largest a cache can be.
const DEFAULT_KV_BYTES_PER_VALUE: u64 = 4;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog is not valid TOML: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("catalog entry `{entry}`: {reason}")]
    Invalid { entry: String, reason: String },
    #[error("no model `{id}` in the catalog (known: {known})")]
    UnknownModel { id: String, known: String },
    #[error("model `{model}` has no variant `{variant}` (known: {known})")]
    UnknownVariant {
        model: String,
        variant: String,
        known: String,
    },
}

/// Every model Pteria knows, plus the GPU drivers it will not pick by default.
#[derive(Debug, Clone)]
pub struct Catalog {
    models: Vec<Model>,
    gpu_deny: Vec<DenyRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub id: String,
    pub name: String,
    pub source: Source,
    /// Files every variant needs besides its program (tokenizer, its config), as paths in the
    /// source.
    pub shared_files: Vec<String>,
    /// The context length a fit estimate assumes.
    pub context_length: u32,
    /// K and V elements one token adds across every layer that owns a cache.
    pub kv_values_per_token: u64,
    /// Memory the runtime needs beside the weights and the cache.
    pub overhead_bytes: u64,
    pub variants: Vec<Variant>,
}

/// Where a model's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A Hugging Face repository pinned at a revision (a tag or commit, so files never change
    /// under a cache).
    Hub { repo: String, revision: String },
    /// Shipped with the app, in this directory relative to the assets directory.
    Bundled { dir: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    pub id: String,
    pub backend: Backend,
    pub quantization: String,
    /// The program (`.pte`), as a path in the model's source.
    pub file: String,
    pub approx_bytes: u64,
    pub kv_bytes_per_value: u64,
    /// The program's sha256 (lowercase hex) where the catalog pins it: a bundled program that is
    /// produced locally rather than shipped is checked against it.
    pub sha256: Option<String>,
}

/// The ExecuTorch delegate a variant's program was exported for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Mlx,
    Vulkan,
    Xnnpack,
    /// No delegate: portable operators only.
    Portable,
}

impl Backend {
    /// The GPU API the backend needs, or `None` for a CPU backend.
    pub fn gpu_api(self) -> Option<GpuApi> {
        match self {
            Backend::Mlx => Some(GpuApi::Metal),
            Backend::Vulkan => Some(GpuApi::Vulkan),
            Backend::Xnnpack | Backend::Portable => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Mlx => "mlx",
            Backend::Vulkan => "vulkan",
            Backend::Xnnpack => "xnnpack",
            Backend::Portable => "portable",
        }
    }
}

/// A GPU driver that is never chosen by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenyRule {
    /// Lower-case text matched against the adapter's device and driver names.
    pub pattern: String,
    pub reason: String,
}

impl DenyRule {
    pub fn matches(&self, adapter: &GpuAdapter) -> bool {
        [&adapter.name, &adapter.driver, &adapter.driver_info]
            .iter()
            .any(|s| s.to_lowercase().contains(&self.pattern))
    }
}

impl Catalog {
    /// The catalog compiled into this build.
    pub fn builtin() -> Result<Catalog, CatalogError> {
        Catalog::from_toml(BUILTIN)
    }

    pub fn from_toml(text: &str) -> Result<Catalog, CatalogError> {
        let raw: raw::Catalog = toml::from_str(text)?;
        let mut models: Vec<Model> = Vec::with_capacity(raw.model.len());
        for m in raw.model {
            let model = m.validate()?;
            if models.iter().any(|other| other.id == model.id) {
                return Err(invalid(&model.id, "model id appears twice"));
            }
            models.push(model);
        }
        let gpu_deny = raw
            .gpu_deny
            .into_iter()
            .map(|d| DenyRule {
                pattern: d.pattern.to_lowercase(),
                reason: d.reason,
            })
            .collect();
        Ok(Catalog { models, gpu_deny })
    }

    pub fn models(&self) -> &[Model] {
        &self.models
    }

    pub fn gpu_deny(&self) -> &[DenyRule] {
        &self.gpu_deny
    }

    pub fn model(&self, id: &str) -> Result<&Model, CatalogError> {
        self.models
            .iter()
            .find(|m| m.id == id)
            .ok_or_else(|| CatalogError::UnknownModel {
                id: id.to_string(),
                known: join(self.models.iter().map(|m| m.id.as_str())),
            })
    }

    /// Looks up `model` or `model:variant`, the spelling the shells accept.
    pub fn resolve(&self, spec: &str) -> Result<(&Model, Option<&Variant>), CatalogError> {
        let (model_id, variant_id) = match spec.split_once(':') {
            Some((m, v)) => (m, Some(v)),
            None => (spec, None),
        };
        let model = self.model(model_id)?;
        let variant = variant_id.map(|v| model.variant(v)).transpose()?;
        Ok((model, variant))
    }
}

impl Model {
    pub fn variant(&self, id: &str) -> Result<&Variant, CatalogError> {
        self.variants
            .iter()
            .find(|v| v.id == id)
            .ok_or_else(|| CatalogError::UnknownVariant {
                model: self.id.clone(),
                variant: id.to_string(),
                known: join(self.variants.iter().map(|v| v.id.as_str())),
            })
    }

    /// Every file one variant needs, its program first.
    pub fn files<'a>(&'a self, variant: &'a Variant) -> impl Iterator<Item = &'a str> + 'a {
        std::iter::once(variant.file.as_str()).chain(self.shared_files.iter().map(String::as_str))
    }

    pub fn is_bundled(&self) -> bool {
        matches!(self.source, Source::Bundled { .. })
    }

    /// For a bundled model, its directory under `assets_dir` when every file of `variant` is there.
    pub fn bundled_dir(&self, variant: &Variant, assets_dir: &Path) -> Option<PathBuf> {
        let Source::Bundled { dir } = &self.source else {
            return None;
        };
        let dir = assets_dir.join(dir);
        self.files(variant)
            .all(|f| dir.join(f).is_file())
            .then_some(dir)
    }

    /// `model:variant`, the spelling `resolve` accepts.
    pub fn spec(&self, variant: &Variant) -> String {
        format!("{}:{}", self.id, variant.id)
    }
}

fn invalid(entry: &str, reason: &str) -> CatalogError {
    CatalogError::Invalid {
        entry: entry.to_string(),
        reason: reason.to_string(),
    }
}

fn join<'a>(ids: impl Iterator<Item = &'a str>) -> String {
    ids.collect::<Vec<_>>().join(", ")
}

/// A catalog path must stay inside the model's directory once joined to it.
fn check_relative(entry: &str, path: &str) -> Result<(), CatalogError> {
    let p = Path::new(path);
    let inside = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if inside {
        Ok(())
    } else {
        Err(invalid(
            entry,
            &format!("path `{path}` must be relative, without `..`"),
        ))
    }
}

/// The TOML's shape, checked into the public types by `validate`.
mod raw {
    use serde::Deserialize;

    use super::{check_relative, invalid, Backend, CatalogError, Source};

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Catalog {
        #[serde(default)]
        pub model: Vec<Model>,
        #[serde(default)]
        pub gpu_deny: Vec<Deny>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Deny {
        #[serde(rename = "match")]
        pub pattern: String,
        pub reason: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Model {
        id: String,
        name: String,
        repo: Option<String>,
        revision: Option<String>,
        bundled: Option<String>,
        #[serde(default)]
        files: Vec<String>,
        context_length: u32,
        kv_values_per_token: u64,
        overhead_bytes: u64,
        #[serde(default)]
        variant: Vec<Variant>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Variant {
        id: String,
        backend: Backend,
        quantization: String,
        file: String,
        approx_bytes: u64,
        kv_bytes_per_value: Option<u64>,
        sha256: Option<String>,
    }

    fn check_id(entry: &str, id: &str) -> Result<(), CatalogError> {
        let ok = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if ok && !id.starts_with('.') {
            Ok(())
        } else {
            Err(invalid(
                entry,
                &format!(
                    "id `{id}` must be letters, digits, `-`, `_` or `.` (it names a directory)"
                ),
            ))
        }
    }

    impl Model {
        pub fn validate(self) -> Result<super::Model, CatalogError> {
            let id = self.id;
            check_id(&id, &id)?;
            let source =
                match (self.repo, self.revision, self.bundled) {
                    (Some(repo), Some(revision), None) => {
                        check_relative(&id, &repo)?;
                        check_id(&id, &revision)?;
                        Source::Hub { repo, revision }
                    }
                    (None, None, Some(dir)) => {
                        check_relative(&id, &dir)?;
                        Source::Bundled { dir }
                    }
                    _ => return Err(invalid(
                        &id,
                        "needs either `repo` and `revision` (downloaded) or `bundled` (shipped)",
                    )),
                };
            for f in &self.files {
                check_relative(&id, f)?;
            }
            if self.variant.is_empty() {
                return Err(invalid(&id, "has no variant"));
            }
            let mut variants: Vec<super::Variant> = Vec::with_capacity(self.variant.len());
            for v in self.variant {
                let entry = format!("{id}:{}", v.id);
                check_id(&entry, &v.id)?;
                check_relative(&entry, &v.file)?;
                if variants.iter().any(|o| o.id == v.id) {
                    return Err(invalid(&entry, "variant id appears twice"));
                }
                if let Some(h) = &v.sha256 {
                    let hex = h.len() == 64
                        && h.bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                    if !hex {
                        return Err(invalid(&entry, "sha256 must be 64 lowercase hex digits"));
                    }
                }
                variants.push(super::Variant {
                    id: v.id,
                    backend: v.backend,
                    quantization: v.quantization,
                    file: v.file,
                    approx_bytes: v.approx_bytes,
                    kv_bytes_per_value: v
                        .kv_bytes_per_value
                        .unwrap_or(super::DEFAULT_KV_BYTES_PER_VALUE),
                    sha256: v.sha256,
                });
            }
            Ok(super::Model {
                id,
                name: self.name,
                source,
                shared_files: self.files,
                context_length: self.context_length,
                kv_values_per_token: self.kv_values_per_token,
                overhead_bytes: self.overhead_bytes,
                variants,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalog_lists_gemma_variants_pinned_to_the_release() {
        let catalog = Catalog::builtin().unwrap();
        let gemma = catalog.model("gemma-4-e2b").unwrap();
        assert_eq!(
            gemma.source,
            Source::Hub {
                repo: "software-mansion/react-native-executorch-gemma-4".into(),
                revision: "v0.9.0".into()
            }
        );
        let files: Vec<(&str, Backend, &str)> = gemma
            .variants
            .iter()
            .map(|v| (v.id.as_str(), v.backend, v.file.as_str()))
            .collect();
        assert_eq!(
            files,
            [
                ("mlx-int4", Backend::Mlx, "e2b/mlx/gemma4_e2b_mlx_int4.pte"),
                (
                    "xnnpack-8da4w",
                    Backend::Xnnpack,
                    "e2b/xnnpack/gemma_4_e2b_xnnpack_8da4w.pte"
                ),
                (
                    "vulkan-8da4w",
                    Backend::Vulkan,
                    "e2b/vulkan/gemma_4_e2b_vulkan_8da4w.pte"
                ),
            ]
        );
        let vulkan = gemma.variant("vulkan-8da4w").unwrap();
        assert_eq!(
            gemma.files(vulkan).collect::<Vec<_>>(),
            [
                "e2b/vulkan/gemma_4_e2b_vulkan_8da4w.pte",
                "e2b/tokenizer.json",
                "e2b/tokenizer_config.json"
            ]
        );
        assert_eq!(
            gemma.variant("mlx-int4").unwrap().approx_bytes,
            2_900_000_000
        );
        assert_eq!(vulkan.approx_bytes, 2_500_000_000);
        // 12 sliding layers x 2 x 256 + 3 global layers x 2 x 512 (docs: shared/notes/gemma4.md §1.6).
        assert_eq!(gemma.kv_values_per_token, 12 * 2 * 256 + 3 * 2 * 512);
    }

    #[test]
    fn builtin_catalog_has_the_bundled_demo_model() {
        let catalog = Catalog::builtin().unwrap();
        let demo = catalog.model("smollm2-135m-instruct").unwrap();
        assert!(demo.is_bundled());
        let variant = &demo.variants[0];
        assert_eq!(
            demo.files(variant).collect::<Vec<_>>(),
            ["model.pte", "tokenizer.json", "tokenizer_config.json"]
        );
    }

    /// The demo entry describes the program golden.json was made from (and the program in
    /// assets/, where one has been produced).
    #[test]
    fn demo_variant_matches_the_program_its_golden_describes() {
        let catalog = Catalog::builtin().unwrap();
        let demo = catalog.model("smollm2-135m-instruct").unwrap();
        let v = &demo.variants[0];
        assert_eq!(
            (v.id.as_str(), v.backend),
            ("xnnpack-8da4w", Backend::Xnnpack)
        );
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/models/smollm2-135m-instruct");
        let text = std::fs::read_to_string(dir.join("golden.json")).unwrap();
        let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
        let file = &golden["file"];
        assert_eq!(file["name"].as_str(), Some(v.file.as_str()));
        assert_eq!(file["bytes"].as_u64(), Some(v.approx_bytes));
        assert_eq!(file["sha256"].as_str(), v.sha256.as_deref());
        if let Ok(meta) = std::fs::metadata(dir.join(&v.file)) {
            assert_eq!(meta.len(), v.approx_bytes);
        }
    }

    #[test]
    fn malformed_sha256_is_rejected() {
        let bad = ONE_MODEL.replace("approx_bytes = 1", "approx_bytes = 1\nsha256 = \"ABC\"");
        let err = Catalog::from_toml(&bad).unwrap_err().to_string();
        assert!(err.contains("sha256"), "{err}");
    }

    #[test]
    fn bundled_model_is_available_only_when_all_its_files_exist() {
        let catalog = Catalog::builtin().unwrap();
        let demo = catalog.model("smollm2-135m-instruct").unwrap();
        let variant = &demo.variants[0];
        let assets = tempfile::tempdir().unwrap();
        let dir = assets.path().join("models/smollm2-135m-instruct");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.pte"), b"pte").unwrap();
        std::fs::write(dir.join("tokenizer.json"), b"{}").unwrap();
        assert_eq!(demo.bundled_dir(variant, assets.path()), None);
        std::fs::write(dir.join("tokenizer_config.json"), b"{}").unwrap();
        assert_eq!(demo.bundled_dir(variant, assets.path()), Some(dir));
    }

    #[test]
    fn resolve_accepts_model_and_model_colon_variant() {
        let catalog = Catalog::builtin().unwrap();
        let (m, v) = catalog.resolve("gemma-4-e2b").unwrap();
        assert_eq!((m.id.as_str(), v), ("gemma-4-e2b", None));
        let (_, v) = catalog.resolve("gemma-4-e2b:xnnpack-8da4w").unwrap();
        assert_eq!(v.unwrap().backend, Backend::Xnnpack);
        let err = catalog.resolve("gemma-4-e2b:cuda").unwrap_err().to_string();
        assert!(
            err.contains("no variant `cuda`") && err.contains("vulkan-8da4w"),
            "{err}"
        );
        let err = catalog.resolve("llama").unwrap_err().to_string();
        assert!(
            err.contains("no model `llama`") && err.contains("gemma-4-e2b"),
            "{err}"
        );
    }

    const ONE_MODEL: &str = r#"
        [[model]]
        id = "m"
        name = "M"
        repo = "org/m"
        revision = "v1"
        context_length = 1024
        kv_values_per_token = 10
        overhead_bytes = 0
        [[model.variant]]
        id = "cpu"
        backend = "xnnpack"
        quantization = "8da4w"
        file = "m.pte"
        approx_bytes = 1
    "#;

    #[test]
    fn adding_a_model_is_adding_entries() {
        let catalog = Catalog::from_toml(ONE_MODEL).unwrap();
        let m = catalog.model("m").unwrap();
        assert_eq!(m.variants[0].kv_bytes_per_value, DEFAULT_KV_BYTES_PER_VALUE);
        assert!(m.shared_files.is_empty());
    }

    #[test]
    fn paths_escaping_the_model_directory_are_rejected() {
        let bad = ONE_MODEL.replace("m.pte", "../m.pte");
        let err = Catalog::from_toml(&bad).unwrap_err().to_string();
        assert!(err.contains("`../m.pte`"), "{err}");
        let bad = ONE_MODEL.replace("m.pte", "/etc/m.pte");
        assert!(Catalog::from_toml(&bad).is_err());
    }

    #[test]
    fn a_model_needs_exactly_one_source() {
        let bad = ONE_MODEL.replace("revision = \"v1\"", "bundled = \"x\"");
        let err = Catalog::from_toml(&bad).unwrap_err().to_string();
        assert!(err.contains("either `repo` and `revision`"), "{err}");
    }

    #[test]
    fn unknown_fields_and_backends_are_errors_not_ignored() {
        let bad = ONE_MODEL.replace("backend = \"xnnpack\"", "backend = \"cuda\"");
        assert!(matches!(
            Catalog::from_toml(&bad),
            Err(CatalogError::Parse(_))
        ));
        let bad = ONE_MODEL.replace("approx_bytes = 1", "approx_bytes = 1\nsize = 2");
        assert!(matches!(
            Catalog::from_toml(&bad),
            Err(CatalogError::Parse(_))
        ));
    }
}
