//! One variant's download: ask the hub for sizes and hashes, check the disk has room, then fetch
//! each file into `<file>.part` (resuming with a Range request), verify it, and rename it into
//! place. A sidecar `<file>.part.json` records what the partial file is a prefix of, so a resume
//! after the process was killed never appends to bytes of a different file.

use std::fs;
use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::header;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::cache::{part_path, sidecar_path, FileRecord, VariantRecord};
use super::http::{Failure, RemoteFile};
use super::progress::RateMeter;
use super::{Cache, CancelToken, DownloadError, Downloader, LocalModel, Progress, SPACE_HEADROOM};
use crate::catalog::{Model, Source, Variant};

/// Progress callbacks and speed samples at most this often: per-chunk calls would be thousands a
/// second on a fast link.
const REPORT_EVERY: Duration = Duration::from_millis(50);
const SPEED_WINDOW: Duration = Duration::from_secs(5);

/// What a partial file is a prefix of.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Sidecar {
    url: String,
    size: u64,
    etag: Option<String>,
}

impl Sidecar {
    fn of(remote: &RemoteFile) -> Sidecar {
        Sidecar {
            url: remote.url.to_string(),
            size: remote.size,
            etag: remote.etag.clone(),
        }
    }

    /// The same file if the hub's etag agrees; without an etag, the same URL and size.
    fn same_file(&self, other: &Sidecar) -> bool {
        self.size == other.size
            && match (&self.etag, &other.etag) {
                (Some(a), Some(b)) => a == b,
                (None, None) => self.url == other.url,
                _ => false,
            }
    }
}

/// Reports a model download's progress as its files arrive.
struct Reporter<'a> {
    callback: &'a mut (dyn FnMut(&Progress) + Send),
    meter: RateMeter,
    last: Option<Instant>,
    progress: Progress,
    /// Model bytes in the files before the current one.
    done_before: u64,
}

impl Reporter<'_> {
    fn start_file(&mut self, index: usize, file: &str, total: u64, done_before: u64) {
        self.done_before = done_before;
        self.progress.file_index = index;
        self.progress.file = file.to_string();
        self.progress.file_total = total;
        self.progress.file_done = 0;
    }

    /// Records the current file's bytes on disk; `received` of them came over the wire just now.
    fn update(&mut self, file_done: u64, received: u64, force: bool) {
        let now = Instant::now();
        self.meter.add(received);
        self.progress.file_done = file_done;
        self.progress.done = self.done_before + file_done;
        if force
            || self
                .last
                .is_none_or(|t| now.duration_since(t) >= REPORT_EVERY)
        {
            self.meter.sample(now);
            self.progress.bytes_per_sec = self.meter.bytes_per_sec();
            self.last = Some(now);
            (self.callback)(&self.progress);
        }
    }
}

impl Downloader {
    /// Downloads `variant` of `model` unless it is already cached, and returns where it lies.
    /// Nothing counts as downloaded until every file is verified; on any error the variant stays
    /// not downloaded, and partial files (except corrupt ones) stay for the next try to resume.
    pub async fn download(
        &self,
        model: &Model,
        variant: &Variant,
        cancel: &CancelToken,
        progress: &mut (dyn FnMut(&Progress) + Send),
    ) -> Result<LocalModel, DownloadError> {
        let Source::Hub { repo, revision } = &model.source else {
            return Err(DownloadError::NotDownloadable {
                model: model.id.clone(),
            });
        };
        if let Some(local) = self.cache.local_model(model, variant)? {
            return Ok(local);
        }
        let dir = self
            .cache
            .model_dir(model)
            .ok_or_else(|| DownloadError::NotDownloadable {
                model: model.id.clone(),
            })?;

        let mut remotes = Vec::new();
        for path in model.files(variant) {
            let url = self.http.hub().resolve_url(repo, revision, path)?;
            let remote = self.with_retries(cancel, || self.http.head(&url)).await?;
            remotes.push((path, remote));
        }

        let on_disk: Vec<u64> = remotes
            .iter()
            .map(|(path, remote)| bytes_on_disk(&dir.join(path), remote))
            .collect();
        let total = total_size(&model.spec(variant), &remotes)?;
        // Each file's bytes on disk are at most its size, so their sum fits where `total` did.
        let needed = total.saturating_sub(on_disk.iter().sum());
        self.check_space(&dir, needed)?;

        let _lock = self.cache.lock_model(model)?;
        let mut reporter = Reporter {
            callback: progress,
            meter: RateMeter::new(SPEED_WINDOW),
            last: None,
            progress: Progress {
                file: String::new(),
                file_index: 0,
                file_count: remotes.len(),
                file_done: 0,
                file_total: 0,
                done: 0,
                total,
                bytes_per_sec: 0.0,
            },
            done_before: 0,
        };
        let mut records = Vec::new();
        let mut done_before = 0;
        for (index, (path, remote)) in remotes.iter().enumerate() {
            reporter.start_file(index, path, remote.size, done_before);
            let target = dir.join(path);
            self.fetch_file(path, remote, &target, cancel, &mut reporter)
                .await?;
            reporter.update(remote.size, 0, true);
            done_before += remote.size;
            records.push(FileRecord {
                path: path.to_string(),
                size: remote.size,
                sha256: remote.sha256.clone(),
            });
        }
        Cache::write_record(&dir, variant, &VariantRecord { files: records })?;
        self.cache
            .local_model(model, variant)?
            .ok_or_else(|| DownloadError::NotCached {
                model: model.spec(variant),
            })
    }

    fn check_space(&self, dir: &Path, needed: u64) -> Result<(), DownloadError> {
        if needed == 0 {
            return Ok(());
        }
        let available = match self.options.available_space {
            Some(bytes) => bytes,
            None => {
                // The model's directory may not exist yet; its nearest existing ancestor is on
                // the same file system in any layout that matters.
                let existing = dir
                    .ancestors()
                    .find(|d| d.exists())
                    .unwrap_or(Path::new("."));
                fs4::available_space(existing)
                    .map_err(|e| DownloadError::io("measuring free space on", existing, e))?
            }
        };
        if needed.saturating_add(SPACE_HEADROOM) > available {
            return Err(DownloadError::InsufficientSpace {
                dir: dir.to_path_buf(),
                needed,
                available,
            });
        }
        Ok(())
    }

    /// Runs `op` until it succeeds, fails for good, or fails `attempts` times in a row.
    async fn with_retries<T, F, Fut>(
        &self,
        cancel: &CancelToken,
        mut op: F,
    ) -> Result<T, DownloadError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let mut failures = 0;
        loop {
            if cancel.is_cancelled() {
                return Err(DownloadError::Cancelled);
            }
            let outcome = tokio::select! {
                _ = cancel.cancelled() => return Err(DownloadError::Cancelled),
                r = op() => r,
            };
            match outcome {
                Ok(v) => return Ok(v),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry(e)) => {
                    failures += 1;
                    self.back_off(failures, e, cancel).await?;
                }
            }
        }
    }

    /// Waits before the next try, or gives up once the policy's tries are spent.
    async fn back_off(
        &self,
        failures: u32,
        error: DownloadError,
        cancel: &CancelToken,
    ) -> Result<(), DownloadError> {
        let policy = &self.options.retry;
        if failures >= policy.attempts {
            return Err(DownloadError::GaveUp {
                attempts: failures,
                last: Box::new(error),
            });
        }
        tokio::select! {
            _ = cancel.cancelled() => Err(DownloadError::Cancelled),
            _ = tokio::time::sleep(policy.delay(failures)) => Ok(()),
        }
    }

    async fn fetch_file(
        &self,
        name: &str,
        remote: &RemoteFile,
        target: &Path,
        cancel: &CancelToken,
        reporter: &mut Reporter<'_>,
    ) -> Result<(), DownloadError> {
        if complete_file(target, remote) {
            return Ok(());
        }
        let parent = target.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(parent).map_err(|e| DownloadError::io("creating", parent, e))?;
        let part = part_path(target);
        let sidecar = sidecar_path(target);
        let mut state = PartFile::open(&part, &sidecar, remote).await?;
        reporter.update(state.len, 0, true);

        let mut failures = 0;
        while state.len < remote.size {
            if cancel.is_cancelled() {
                return Err(DownloadError::Cancelled);
            }
            let before = state.len;
            match self
                .transfer(name, remote, &mut state, cancel, reporter)
                .await
            {
                Ok(()) if state.len < remote.size => {
                    let error = DownloadError::Network {
                        url: remote.url.to_string(),
                        reason: format!(
                            "connection closed after {} of {} bytes",
                            state.len, remote.size
                        ),
                    };
                    failures = if state.len > before { 1 } else { failures + 1 };
                    self.back_off(failures, error, cancel).await?;
                }
                Ok(()) => {}
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry(e)) => {
                    failures = if state.len > before { 1 } else { failures + 1 };
                    self.back_off(failures, e, cancel).await?;
                }
            }
        }
        state.finish(name, remote, target).await
    }

    /// One GET from the partial file's end to the end of the body.
    async fn transfer(
        &self,
        name: &str,
        remote: &RemoteFile,
        state: &mut PartFile,
        cancel: &CancelToken,
        reporter: &mut Reporter<'_>,
    ) -> Result<(), Failure> {
        let url = &remote.url;
        let mut resp = tokio::select! {
            _ = cancel.cancelled() => return Err(Failure::Fatal(DownloadError::Cancelled)),
            r = self.http.get(url, state.len) => r?,
        };
        match resp.status() {
            StatusCode::PARTIAL_CONTENT => match content_range(resp.headers()) {
                // The file the server has is not the one the hub announced: keep the partial,
                // whose sidecar a new HEAD on the next run will judge.
                Some(ContentRange {
                    total: Some(total), ..
                }) if total != remote.size => {
                    return Err(Failure::Fatal(DownloadError::BadRange {
                        url: url.to_string(),
                        reason: format!(
                            "Content-Range says the file has {total} bytes; the hub announced {}",
                            remote.size
                        ),
                    }));
                }
                Some(range) if range.start == state.len => {}
                // The whole file despite the Range: take it, as for a 200.
                Some(range) if range.start == 0 => state.restart().await?,
                // Bytes that cannot be placed: keeping the partial would make every later try
                // send the same Range and fail the same way, so the next try starts from 0.
                _ => {
                    let asked = state.len;
                    state.restart().await?;
                    return Err(Failure::Retry(DownloadError::BadRange {
                        url: url.to_string(),
                        reason: format!(
                            "asked for bytes from {asked}, got Content-Range {:?}; starting the file over",
                            resp.headers().get(header::CONTENT_RANGE)
                        ),
                    }));
                }
            },
            // The server ignored the Range: take the whole body again.
            StatusCode::OK if state.len > 0 => state.restart().await?,
            StatusCode::OK => {}
            StatusCode::RANGE_NOT_SATISFIABLE => {
                // Our partial file is not a prefix of what the server has: start over.
                state.restart().await?;
                return Err(Failure::Retry(DownloadError::Status {
                    url: url.to_string(),
                    status: 416,
                }));
            }
            other => {
                return Err(Failure::Fatal(DownloadError::Status {
                    url: url.to_string(),
                    status: other.as_u16(),
                }))
            }
        }
        loop {
            let chunk = tokio::select! {
                _ = cancel.cancelled() => return Err(Failure::Fatal(DownloadError::Cancelled)),
                c = self.http.chunk(url, &mut resp) => c.map_err(|f| at(f, state.len, remote.size))?,
            };
            let Some(chunk) = chunk else {
                return Ok(());
            };
            let bytes = chunk.as_ref();
            let after = state.len.saturating_add(bytes.len() as u64);
            if after > remote.size {
                state.discard();
                return Err(Failure::Fatal(DownloadError::SizeMismatch {
                    file: name.to_string(),
                    expected: remote.size,
                    actual: after,
                }));
            }
            state.append(bytes).await.map_err(Failure::Fatal)?;
            reporter.update(state.len, bytes.len() as u64, false);
        }
    }
}

/// Says how far a broken transfer got, which the transport's own message does not.
fn at(failure: Failure, done: u64, size: u64) -> Failure {
    match failure {
        Failure::Retry(DownloadError::Network { url, reason }) => {
            Failure::Retry(DownloadError::Network {
                url,
                reason: format!("{reason} (after {done} of {size} bytes)"),
            })
        }
        other => other,
    }
}

/// A `.part` file being filled, with the running hash of what it holds.
struct PartFile {
    file: tokio::fs::File,
    path: PathBuf,
    sidecar: PathBuf,
    len: u64,
    hasher: Sha256,
}

impl PartFile {
    /// Opens the partial file to resume it when its sidecar names the same remote file, or
    /// starts a new one.
    async fn open(
        path: &Path,
        sidecar: &Path,
        remote: &RemoteFile,
    ) -> Result<PartFile, DownloadError> {
        let wanted = Sidecar::of(remote);
        let resumable = fs::read(sidecar)
            .ok()
            .and_then(|b| serde_json::from_slice::<Sidecar>(&b).ok())
            .is_some_and(|s| s.same_file(&wanted));
        if !resumable {
            remove_if_present(path)?;
            let text = serde_json::to_vec(&wanted).unwrap_or_default();
            fs::write(sidecar, text).map_err(|e| DownloadError::io("writing", sidecar, e))?;
        }
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .await
            .map_err(|e| DownloadError::io("opening", path, e))?;
        let mut len = file
            .metadata()
            .await
            .map_err(|e| DownloadError::io("reading", path, e))?
            .len();
        if len > remote.size {
            file.set_len(0)
                .await
                .map_err(|e| DownloadError::io("truncating", path, e))?;
            len = 0;
        }
        // The hash must cover the bytes a previous run wrote, so read them back once.
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut left = len;
        while left > 0 {
            let n = file
                .read(&mut buf)
                .await
                .map_err(|e| DownloadError::io("reading", path, e))?;
            if n == 0 {
                break;
            }
            let n = n.min(usize::try_from(left).unwrap_or(usize::MAX));
            hasher.update(&buf[..n]);
            left -= n as u64;
        }
        file.seek(SeekFrom::Start(len))
            .await
            .map_err(|e| DownloadError::io("seeking in", path, e))?;
        Ok(PartFile {
            file,
            path: path.to_path_buf(),
            sidecar: sidecar.to_path_buf(),
            len,
            hasher,
        })
    }

    async fn append(&mut self, bytes: &[u8]) -> Result<(), DownloadError> {
        self.file
            .write_all(bytes)
            .await
            .map_err(|e| DownloadError::io("writing", &self.path, e))?;
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
        Ok(())
    }

    async fn restart(&mut self) -> Result<(), Failure> {
        let result: io::Result<()> = async {
            self.file.set_len(0).await?;
            self.file.seek(SeekFrom::Start(0)).await?;
            Ok(())
        }
        .await;
        result.map_err(|e| Failure::Fatal(DownloadError::io("truncating", &self.path, e)))?;
        self.len = 0;
        self.hasher = Sha256::new();
        Ok(())
    }

    /// Deletes the partial file and its sidecar: what they hold can never become the file.
    fn discard(&self) {
        let _ = fs::remove_file(&self.path);
        let _ = fs::remove_file(&self.sidecar);
    }

    /// Verifies the complete file and renames it into place.
    async fn finish(
        mut self,
        name: &str,
        remote: &RemoteFile,
        target: &Path,
    ) -> Result<(), DownloadError> {
        let synced: io::Result<()> = async {
            self.file.flush().await?;
            self.file.sync_all().await
        }
        .await;
        synced.map_err(|e| DownloadError::io("writing", &self.path, e))?;
        let actual_len = self
            .file
            .metadata()
            .await
            .map_err(|e| DownloadError::io("reading", &self.path, e))?
            .len();
        if actual_len != remote.size {
            self.discard();
            return Err(DownloadError::SizeMismatch {
                file: name.to_string(),
                expected: remote.size,
                actual: actual_len,
            });
        }
        let digest = hex(&self.hasher.finalize_reset());
        if let Some(expected) = &remote.sha256 {
            if &digest != expected {
                self.discard();
                return Err(DownloadError::ChecksumMismatch {
                    file: name.to_string(),
                    expected: expected.clone(),
                    actual: digest,
                });
            }
        }
        // Windows cannot rename an open file.
        drop(self.file);
        fs::rename(&self.path, target).map_err(|e| DownloadError::io("renaming", &self.path, e))?;
        let _ = fs::remove_file(&self.sidecar);
        sync_dir(target.parent().unwrap_or(Path::new(".")));
        Ok(())
    }
}

/// The model's size: the sum of the sizes the hub announced, which come from response headers
/// and so may be anything; a sum past `u64` is the hub's error, not a reason to panic or wrap.
fn total_size(spec: &str, remotes: &[(&str, RemoteFile)]) -> Result<u64, DownloadError> {
    remotes
        .iter()
        .try_fold(0u64, |sum, (_, r)| sum.checked_add(r.size))
        .ok_or_else(|| DownloadError::SizeOverflow {
            model: spec.to_string(),
            sizes: remotes
                .iter()
                .map(|(path, r)| format!("{path}: {} bytes", r.size))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Bytes of a file already on disk: all of it when complete, else a resumable prefix.
fn bytes_on_disk(target: &Path, remote: &RemoteFile) -> u64 {
    if complete_file(target, remote) {
        return remote.size;
    }
    let resumable = fs::read(sidecar_path(target))
        .ok()
        .and_then(|b| serde_json::from_slice::<Sidecar>(&b).ok())
        .is_some_and(|s| s.same_file(&Sidecar::of(remote)));
    if !resumable {
        return 0;
    }
    fs::metadata(part_path(target))
        .map(|m| m.len())
        .unwrap_or(0)
        .min(remote.size)
}

/// A file is only ever renamed into place after verification, so one of the right size is done
/// (another variant of the same model fetched it).
fn complete_file(target: &Path, remote: &RemoteFile) -> bool {
    fs::metadata(target).is_ok_and(|m| m.is_file() && m.len() == remote.size)
}

/// What a 206's `Content-Range: bytes START-END/TOTAL` says; TOTAL may be `*`, unknown.
#[derive(Debug, PartialEq, Eq)]
struct ContentRange {
    start: u64,
    total: Option<u64>,
}

fn content_range(headers: &header::HeaderMap) -> Option<ContentRange> {
    let value = headers.get(header::CONTENT_RANGE)?.to_str().ok()?;
    let (range, total) = value.trim().strip_prefix("bytes ")?.split_once('/')?;
    let start = range.split('-').next()?.trim().parse().ok()?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some(ContentRange { start, total })
}

fn remove_if_present(path: &Path) -> Result<(), DownloadError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DownloadError::io("deleting", path, e)),
    }
}

/// Makes a rename durable on Unix, where the directory entry is what a crash could lose.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_is_read_from_the_header() {
        let read = |value: &str| {
            let mut h = header::HeaderMap::new();
            h.insert(header::CONTENT_RANGE, value.parse().unwrap());
            content_range(&h)
        };
        let range = |start, total| Some(ContentRange { start, total });
        assert_eq!(read("bytes 100-199/200"), range(100, Some(200)));
        assert_eq!(read("bytes 100-199/*"), range(100, None));
        assert_eq!(read("items 1-2/3"), None);
        assert_eq!(read("bytes 100-199"), None);
        assert_eq!(read("bytes 100-199/many"), None);
        assert_eq!(content_range(&header::HeaderMap::new()), None);
    }

    #[test]
    fn sidecars_match_on_etag_or_on_url_without_one() {
        let a = Sidecar {
            url: "u1".into(),
            size: 5,
            etag: Some("e".into()),
        };
        let moved = Sidecar {
            url: "u2".into(),
            size: 5,
            etag: Some("e".into()),
        };
        assert!(a.same_file(&moved));
        let changed = Sidecar {
            url: "u1".into(),
            size: 5,
            etag: Some("f".into()),
        };
        assert!(!a.same_file(&changed));
        let no_etag = |url: &str| Sidecar {
            url: url.into(),
            size: 5,
            etag: None,
        };
        assert!(no_etag("u").same_file(&no_etag("u")));
        assert!(!no_etag("u").same_file(&no_etag("v")));
    }

    #[test]
    fn sizes_past_u64_are_an_error_naming_them() {
        let remote = |size| RemoteFile {
            url: reqwest::Url::parse("http://h/f").unwrap(),
            size,
            etag: None,
            sha256: None,
        };
        let fits = [("a", remote(u64::MAX - 2)), ("b", remote(2))];
        assert_eq!(total_size("m:v", &fits).unwrap(), u64::MAX);
        let too_big = [("a", remote(u64::MAX - 1)), ("b", remote(2))];
        let err = total_size("m:v", &too_big).unwrap_err();
        let wanted = "`m:v`: the sizes the hub announced add up to 2^64 bytes or more";
        let sizes = format!("(a: {} bytes, b: 2 bytes)", u64::MAX - 1);
        assert_eq!(err.to_string(), format!("{wanted} {sizes}"));
    }

    #[test]
    fn hex_is_lowercase_two_digits_per_byte() {
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }
}
