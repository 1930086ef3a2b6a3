//! Where downloaded models live, and what counts as downloaded.
//!
//! Layout under the data directory:
//! `models/<model>/<revision>/<path in repo>` for verified files, `<path>.part` and
//! `<path>.part.json` beside it while one downloads, and `models/<model>/<revision>/.variants/<id>.json`,
//! written only after every file of a variant is verified: a variant is downloaded when its record
//! exists and its files are all there at the recorded sizes, so nothing partial is ever listed.
//! `locks/<model>@<revision>.lock` is held by a download of the model and by a deletion of one of
//! its variants, so neither pulls files from under the other.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::DownloadError;
use crate::catalog::{Catalog, Model, Source, Variant};

/// Environment variable that moves the data directory (tests, portable installs).
pub const HOME_ENV: &str = "PTERIA_HOME";

/// The model cache under one data directory.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

/// A variant whose every file is on disk and verified: what the runtime loads, with no network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalModel {
    pub model_id: String,
    pub variant_id: String,
    /// The `.pte` program.
    pub program: PathBuf,
    /// Every file of the variant, the program first.
    pub files: Vec<PathBuf>,
    /// The directory the repository paths are relative to (the tokenizer's location follows).
    pub dir: PathBuf,
    pub bytes: u64,
}

/// What `write_record` stores once a variant is complete.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct VariantRecord {
    pub files: Vec<FileRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FileRecord {
    pub path: String,
    pub size: u64,
    pub sha256: Option<String>,
}

impl Cache {
    /// A cache in `data_dir`: what mobile apps call with their own data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Cache {
        Cache {
            root: data_dir.into(),
        }
    }

    /// `PTERIA_HOME` when set, else the platform's data directory (desktop only: Android has none
    /// that a library can find, so apps there use `Cache::new`).
    pub fn default_location() -> Result<Cache, DownloadError> {
        if let Some(home) = std::env::var_os(HOME_ENV).filter(|h| !h.is_empty()) {
            return Ok(Cache::new(home));
        }
        directories::ProjectDirs::from("dev", "pteria", "Pteria")
            .map(|d| Cache::new(d.data_dir()))
            .ok_or(DownloadError::NoDataDir)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn models_dir(&self) -> PathBuf {
        self.root.join("models")
    }

    /// The directory a model's repository paths are relative to; `None` for bundled models.
    pub fn model_dir(&self, model: &Model) -> Option<PathBuf> {
        match &model.source {
            Source::Hub { revision, .. } => Some(self.models_dir().join(&model.id).join(revision)),
            Source::Bundled { .. } => None,
        }
    }

    fn record_path(dir: &Path, variant: &Variant) -> PathBuf {
        dir.join(".variants").join(format!("{}.json", variant.id))
    }

    pub(crate) fn read_record(
        dir: &Path,
        variant: &Variant,
    ) -> Result<Option<VariantRecord>, DownloadError> {
        let path = Self::record_path(dir, variant);
        match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(record) => Ok(Some(record)),
                // A damaged record only means the variant must be checked again by a download.
                Err(_) => Ok(None),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(DownloadError::io("reading", &path, e)),
        }
    }

    /// Writes the record that makes a variant count as downloaded; atomic, so a crash leaves the
    /// old state or the new one.
    pub(crate) fn write_record(
        dir: &Path,
        variant: &Variant,
        record: &VariantRecord,
    ) -> Result<(), DownloadError> {
        let path = Self::record_path(dir, variant);
        let parent = dir.join(".variants");
        fs::create_dir_all(&parent).map_err(|e| DownloadError::io("creating", &parent, e))?;
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(record).unwrap_or_default();
        fs::write(&tmp, text).map_err(|e| DownloadError::io("writing", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| DownloadError::io("renaming", &tmp, e))
    }

    /// The variant if it is completely downloaded. Reads the disk only.
    pub fn local_model(
        &self,
        model: &Model,
        variant: &Variant,
    ) -> Result<Option<LocalModel>, DownloadError> {
        let Some(dir) = self.model_dir(model) else {
            return Ok(None);
        };
        let Some(record) = Self::read_record(&dir, variant)? else {
            return Ok(None);
        };
        let mut files = Vec::new();
        let mut bytes = 0;
        for wanted in model.files(variant) {
            let Some(entry) = record.files.iter().find(|f| f.path == wanted) else {
                return Ok(None);
            };
            let path = dir.join(wanted);
            match fs::metadata(&path) {
                Ok(m) if m.is_file() && m.len() == entry.size => bytes += m.len(),
                _ => return Ok(None),
            }
            files.push(path);
        }
        Ok(Some(LocalModel {
            model_id: model.id.clone(),
            variant_id: variant.id.clone(),
            program: files[0].clone(),
            files,
            dir,
            bytes,
        }))
    }

    /// Every downloaded variant of the catalog's models.
    pub fn list(&self, catalog: &Catalog) -> Result<Vec<LocalModel>, DownloadError> {
        let mut found = Vec::new();
        for model in catalog.models() {
            for variant in &model.variants {
                if let Some(local) = self.local_model(model, variant)? {
                    found.push(local);
                }
            }
        }
        Ok(found)
    }

    /// Bytes of an unfinished download of `variant` that a resume keeps, 0 if none was left
    /// behind. Only the variant's own program says whether one was: a download fetches the
    /// program first, so an unfinished one left it partial, or complete without the variant's
    /// record. A partial shared file alone may be another variant's; once the program says the
    /// variant is partial, the shared files' bytes on disk count too, as the resume counts them.
    pub fn partial_bytes(&self, model: &Model, variant: &Variant) -> u64 {
        let Some(dir) = self.model_dir(model) else {
            return 0;
        };
        let len = |path: &Path| fs::metadata(path).map_or(0, |m| m.len());
        let program = dir.join(&variant.file);
        let started = part_path(&program).exists()
            || (program.exists() && !Self::record_path(&dir, variant).exists());
        if !started {
            return 0;
        }
        model
            .files(variant)
            .map(|f| {
                let path = dir.join(f);
                match len(&part_path(&path)) {
                    0 => len(&path),
                    part => part,
                }
            })
            .fold(0, u64::saturating_add)
    }

    /// Everything under the cache: complete files, partial ones and records.
    pub fn total_bytes(&self) -> Result<u64, DownloadError> {
        dir_size(&self.models_dir())
    }

    /// Takes the model's download lock without waiting; `Busy` while another holder has it, in
    /// this process or another. One lock per model and revision, not per variant, because
    /// variants share files.
    pub(crate) fn lock_model(&self, model: &Model) -> Result<ModelLock, DownloadError> {
        use fs4::fs_std::FileExt;

        let Source::Hub { revision, .. } = &model.source else {
            return Err(DownloadError::NotDownloadable {
                model: model.id.clone(),
            });
        };
        let dir = self.root.join("locks");
        fs::create_dir_all(&dir).map_err(|e| DownloadError::io("creating", &dir, e))?;
        let path = dir.join(format!("{}@{revision}.lock", model.id));
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| DownloadError::io("opening", &path, e))?;
        match FileExt::try_lock_exclusive(&file) {
            Ok(true) => Ok(ModelLock { _file: file }),
            Ok(false) => Err(DownloadError::Busy {
                model: model.id.clone(),
                lock: path,
            }),
            Err(e) => Err(DownloadError::io("locking", &path, e)),
        }
    }

    /// Deletes a variant: its record, its program, its partial files, and the shared files no
    /// other downloaded variant of the model still lists. Returns the bytes freed; an error if
    /// there was nothing to delete, and `Busy` while a download of the model runs.
    pub fn remove(&self, model: &Model, variant: &Variant) -> Result<u64, DownloadError> {
        let not_cached = || DownloadError::NotCached {
            model: model.spec(variant),
        };
        let dir = self.model_dir(model).ok_or_else(not_cached)?;
        // A running download writes `.part` files and sidecars here, the shared files' too;
        // deleting them under it makes it fail at the rename, or finish as not cached.
        let _lock = self.lock_model(model)?;
        let mut freed = 0;
        let mut removed_any = false;
        let record = Self::record_path(&dir, variant);
        removed_any |= remove_file(&record)?.is_some();
        let still_needed: Vec<String> = model
            .variants
            .iter()
            .filter(|v| v.id != variant.id)
            .filter_map(|v| Self::read_record(&dir, v).ok().flatten())
            .flat_map(|r| r.files.into_iter().map(|f| f.path))
            .collect();
        for f in model.files(variant) {
            let path = dir.join(f);
            for p in [part_path(&path), sidecar_path(&path)] {
                if let Some(n) = remove_file(&p)? {
                    freed += n;
                    removed_any = true;
                }
            }
            if !still_needed.iter().any(|s| s == f) {
                if let Some(n) = remove_file(&path)? {
                    freed += n;
                    removed_any = true;
                }
            }
        }
        if !removed_any {
            return Err(not_cached());
        }
        prune_empty_dirs(&dir, &self.models_dir());
        Ok(freed)
    }
}

/// Holds a model's lock; released when dropped, or when the process dies.
pub(crate) struct ModelLock {
    _file: fs::File,
}

pub(crate) fn part_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    path.with_file_name(name)
}

pub(crate) fn sidecar_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".part.json");
    path.with_file_name(name)
}

/// Removes a file, returning its size, or `None` if it was not there.
fn remove_file(path: &Path) -> Result<Option<u64>, DownloadError> {
    let size = match fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DownloadError::io("reading", path, e)),
    };
    match fs::remove_file(path) {
        Ok(()) => Ok(Some(size)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DownloadError::io("deleting", path, e)),
    }
}

/// Removes now-empty directories from the model's tree up to (not including) `stop`. Best
/// effort: a directory that still holds something simply stays.
fn prune_empty_dirs(dir: &Path, stop: &Path) {
    fn prune(dir: &Path) {
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    prune(&e.path());
                }
            }
        }
        let _ = fs::remove_dir(dir);
    }
    prune(dir);
    let mut up = dir.parent();
    while let Some(d) = up {
        if d == stop || !d.starts_with(stop) || fs::remove_dir(d).is_err() {
            break;
        }
        up = d.parent();
    }
}

fn dir_size(dir: &Path) -> Result<u64, DownloadError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(DownloadError::io("listing", dir, e)),
    };
    let mut total = 0;
    for entry in entries {
        let entry = entry.map_err(|e| DownloadError::io("listing", dir, e))?;
        let meta = entry
            .metadata()
            .map_err(|e| DownloadError::io("reading", &entry.path(), e))?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog::builtin().unwrap()
    }

    /// Puts a variant's files in place and writes its record, as a finished download would.
    fn install(cache: &Cache, model: &Model, variant: &Variant, size: usize) {
        let dir = cache.model_dir(model).unwrap();
        let mut files = Vec::new();
        for f in model.files(variant) {
            let path = dir.join(f);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, vec![7u8; size]).unwrap();
            files.push(FileRecord {
                path: f.to_string(),
                size: size as u64,
                sha256: None,
            });
        }
        Cache::write_record(&dir, variant, &VariantRecord { files }).unwrap();
    }

    #[test]
    fn a_variant_without_its_record_is_not_downloaded() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        let catalog = catalog();
        let gemma = catalog.model("gemma-4-e2b").unwrap();
        let xnn = gemma.variant("xnnpack-8da4w").unwrap();
        let dir = cache.model_dir(gemma).unwrap();
        for f in gemma.files(xnn) {
            let path = dir.join(f);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, b"x").unwrap();
        }
        assert_eq!(cache.local_model(gemma, xnn).unwrap(), None);
        assert!(cache.list(&catalog).unwrap().is_empty());
    }

    #[test]
    fn a_file_of_the_wrong_size_makes_the_variant_not_downloaded() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        let catalog = catalog();
        let gemma = catalog.model("gemma-4-e2b").unwrap();
        let xnn = gemma.variant("xnnpack-8da4w").unwrap();
        install(&cache, gemma, xnn, 10);
        let local = cache.local_model(gemma, xnn).unwrap().unwrap();
        assert_eq!(local.bytes, 30);
        assert!(local
            .program
            .ends_with("e2b/xnnpack/gemma_4_e2b_xnnpack_8da4w.pte"));
        fs::write(&local.files[1], b"short").unwrap();
        assert_eq!(cache.local_model(gemma, xnn).unwrap(), None);
    }

    #[test]
    fn removing_a_variant_keeps_files_another_variant_still_uses() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        let catalog = catalog();
        let gemma = catalog.model("gemma-4-e2b").unwrap();
        let xnn = gemma.variant("xnnpack-8da4w").unwrap();
        let vk = gemma.variant("vulkan-8da4w").unwrap();
        install(&cache, gemma, xnn, 10);
        install(&cache, gemma, vk, 10);
        assert_eq!(cache.list(&catalog).unwrap().len(), 2);
        assert!(cache.total_bytes().unwrap() > 40);

        // Only the program goes: the tokenizer files are still Vulkan's.
        assert_eq!(cache.remove(gemma, xnn).unwrap(), 10);
        assert!(cache.local_model(gemma, vk).unwrap().is_some());
        assert_eq!(cache.remove(gemma, vk).unwrap(), 30);
        assert!(cache.list(&catalog).unwrap().is_empty());
        assert_eq!(cache.total_bytes().unwrap(), 0);
        assert!(matches!(
            cache.remove(gemma, vk),
            Err(DownloadError::NotCached { .. })
        ));
    }

    #[test]
    fn removing_a_partial_download_frees_its_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        let catalog = catalog();
        let gemma = catalog.model("gemma-4-e2b").unwrap();
        let vk = gemma.variant("vulkan-8da4w").unwrap();
        let program = cache.model_dir(gemma).unwrap().join(&vk.file);
        fs::create_dir_all(program.parent().unwrap()).unwrap();
        fs::write(part_path(&program), vec![0u8; 100]).unwrap();
        assert_eq!(cache.partial_bytes(gemma, vk), 100);
        assert_eq!(cache.remove(gemma, vk).unwrap(), 100);
        assert_eq!(cache.partial_bytes(gemma, vk), 0);
    }

    #[test]
    fn a_partial_shared_file_makes_only_the_variant_that_fetched_it_partial() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        let catalog = catalog();
        let gemma = catalog.model("gemma-4-e2b").unwrap();
        let xnn = gemma.variant("xnnpack-8da4w").unwrap();
        let vk = gemma.variant("vulkan-8da4w").unwrap();
        // XNNPACK's download verified its program, then stopped in the first shared file.
        let dir = cache.model_dir(gemma).unwrap();
        let program = dir.join(&xnn.file);
        fs::create_dir_all(program.parent().unwrap()).unwrap();
        fs::write(&program, vec![0u8; 100]).unwrap();
        let shared = dir.join(&gemma.shared_files[0]);
        fs::write(part_path(&shared), vec![0u8; 7]).unwrap();
        assert_eq!(cache.partial_bytes(gemma, xnn), 107);
        assert_eq!(cache.partial_bytes(gemma, vk), 0);
        // Complete, with its record, the variant is no longer partial.
        install(&cache, gemma, xnn, 10);
        assert_eq!(cache.partial_bytes(gemma, xnn), 0);
    }

    #[test]
    fn explicit_data_dir_wins() {
        let cache = Cache::new("app-data");
        assert_eq!(cache.root(), Path::new("app-data"));
    }
}
