//! Fetches catalog models from a Hugging Face compatible hub into the local cache: resumable,
//! verified, cancellable, with progress. `catalog` says what to fetch; the runtime loads what
//! `Cache::local_model` returns, with no network.

mod cache;
mod fetch;
mod http;
mod progress;

pub use cache::{Cache, LocalModel, HOME_ENV};
pub use http::{HubConfig, RemoteFile, DEFAULT_ENDPOINT};
pub use progress::{CancelToken, Progress};

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Disk left free beyond what a download needs, so the cache never fills the disk to the byte.
pub const SPACE_HEADROOM: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("no data directory on this platform: set {HOME_ENV} or pass one to Cache::new")]
    NoDataDir,
    #[error("`{model}` ships with the app; there is nothing to download")]
    NotDownloadable { model: String },
    #[error("`{model}` is not downloaded")]
    NotCached { model: String },
    #[error("hub endpoint `{endpoint}` is not a URL: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("cannot set up the HTTP client: {0}")]
    Client(String),
    #[error("401 Unauthorized from {url}: the hub wants a token that can read this repository (set HF_TOKEN)")]
    Unauthorized { url: String },
    #[error("403 Forbidden from {url}: this token may not read the repository (a gated model needs its terms accepted on the hub)")]
    Forbidden { url: String },
    #[error("404 Not Found: {url} (is the catalog's repository, revision or path right?)")]
    NotFound { url: String },
    #[error("HTTP {status} from {url}")]
    Status { url: String, status: u16 },
    #[error("no answer from {url} within {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("connection to {url} failed: {reason}")]
    Network { url: String, reason: String },
    #[error("{url}: the hub did not say how large the file is")]
    MissingSize { url: String },
    #[error("`{model}`: the sizes the hub announced add up to 2^64 bytes or more ({sizes})")]
    SizeOverflow { model: String, sizes: String },
    #[error("{url}: too many redirects")]
    TooManyRedirects { url: String },
    #[error("{url}: bad redirect: {reason}")]
    BadRedirect { url: String, reason: String },
    #[error("{url}: bad ranged response: {reason}")]
    BadRange { url: String, reason: String },
    #[error("gave up after {attempts} {}: {last}", tries(.attempts))]
    GaveUp {
        attempts: u32,
        last: Box<DownloadError>,
    },
    #[error("{file}: received {actual} bytes where the hub announced {expected}; the partial file was deleted")]
    SizeMismatch {
        file: String,
        expected: u64,
        actual: u64,
    },
    #[error(
        "{file}: sha256 {actual} does not match the hub's {expected}; the corrupt file was deleted"
    )]
    ChecksumMismatch {
        file: String,
        expected: String,
        actual: String,
    },
    #[error("not enough disk space in {}: the download needs {needed} more bytes plus {SPACE_HEADROOM} spare, and {available} are free", dir.display())]
    InsufficientSpace {
        dir: PathBuf,
        needed: u64,
        available: u64,
    },
    #[error("the disk filled up while writing {}; free some space and download again to resume", path.display())]
    DiskFull { path: PathBuf },
    #[error("a download of `{model}` is running, in this process or another (lock {}); wait for it to finish or cancel it", lock.display())]
    Busy { model: String, lock: PathBuf },
    #[error("download cancelled; run it again to resume")]
    Cancelled,
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn tries(n: &u32) -> &'static str {
    if *n == 1 {
        "try"
    } else {
        "tries"
    }
}

impl DownloadError {
    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> DownloadError {
        if source.kind() == std::io::ErrorKind::StorageFull {
            return DownloadError::DiskFull {
                path: path.to_path_buf(),
            };
        }
        DownloadError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The error behind retries, for callers that branch on the kind of failure.
    pub fn root(&self) -> &DownloadError {
        match self {
            DownloadError::GaveUp { last, .. } => last.root(),
            e => e,
        }
    }
}

/// How often, and how patiently, a failing request is tried again.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries in a row that make no progress before giving up; a try that received bytes starts
    /// the count again, so a flaky connection still finishes a long file.
    pub attempts: u32,
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// Exponential backoff: the delay before try `n + 1` after `n` failures.
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.first_delay.saturating_mul(factor).min(self.max_delay)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone)]
pub struct DownloadOptions {
    pub retry: RetryPolicy,
    pub connect_timeout: Duration,
    /// Longest wait for response headers or for the next chunk of a body.
    pub idle_timeout: Duration,
    /// Free bytes to assume on the cache's disk instead of asking the OS: for apps that keep
    /// space in reserve, and for tests.
    pub available_space: Option<u64>,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(30),
            available_space: None,
        }
    }
}

/// Downloads catalog variants into a cache.
pub struct Downloader {
    http: http::Http,
    cache: Cache,
    options: DownloadOptions,
}

impl Downloader {
    pub fn new(
        cache: Cache,
        hub: HubConfig,
        options: DownloadOptions,
    ) -> Result<Downloader, DownloadError> {
        let http = http::Http::new(hub, options.connect_timeout, options.idle_timeout)?;
        Ok(Downloader {
            http,
            cache,
            options,
        })
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy {
            attempts: 10,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
        };
        let delays: Vec<u128> = (1..=5).map(|n| p.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 500, 500]);
    }

    #[test]
    fn root_sees_through_retries() {
        let e = DownloadError::GaveUp {
            attempts: 3,
            last: Box::new(DownloadError::Status {
                url: "u".into(),
                status: 500,
            }),
        };
        assert!(matches!(
            e.root(),
            DownloadError::Status { status: 500, .. }
        ));
        assert_eq!(e.to_string(), "gave up after 3 tries: HTTP 500 from u");
    }

    #[test]
    fn a_full_disk_gets_its_own_error() {
        let e = DownloadError::io(
            "writing",
            Path::new("x.part"),
            std::io::Error::from(std::io::ErrorKind::StorageFull),
        );
        assert!(matches!(e, DownloadError::DiskFull { .. }));
    }
}
