//! Downloads against a real HTTP server on loopback (tests/downloads/hub.rs) that speaks the
//! hub's protocol and injects failures: resume after an interrupted transfer or a killed process,
//! integrity errors, HTTP errors, retries, timeouts, cancel, and a full disk. Whatever fails,
//! nothing partial may ever be reported as downloaded.

#[path = "downloads/hub.rs"]
mod hub;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hub::{sha256_hex, Fault, Hub};
use pteria::catalog::{Catalog, Model, Variant};
use pteria::download::{
    Cache, CancelToken, DownloadError, DownloadOptions, Downloader, HubConfig, LocalModel,
    Progress, RetryPolicy,
};
use tempfile::TempDir;

const REPO: &str = "org/tiny";
const REV: &str = "v1";
const PROGRAM: &str = "tiny/cpu/model.pte";
const GPU_PROGRAM: &str = "tiny/gpu/model.pte";
const TOKENIZER: &str = "tiny/tokenizer.json";

/// Every test finishes well inside this, or fails.
const TEST_LIMIT: Duration = Duration::from_secs(60);

fn catalog() -> Catalog {
    Catalog::from_toml(&format!(
        r#"
        [[model]]
        id = "tiny"
        name = "Tiny"
        repo = "{REPO}"
        revision = "{REV}"
        files = ["{TOKENIZER}"]
        context_length = 16
        kv_values_per_token = 1
        overhead_bytes = 0

        [[model.variant]]
        id = "cpu"
        backend = "xnnpack"
        quantization = "8da4w"
        file = "{PROGRAM}"
        approx_bytes = 1000

        [[model.variant]]
        id = "gpu"
        backend = "vulkan"
        quantization = "8da4w"
        file = "{GPU_PROGRAM}"
        approx_bytes = 1000
        "#
    ))
    .unwrap()
}

/// Deterministic bytes that do not compress or repeat, so a misplaced range shows.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

struct Setup {
    hub: Hub,
    home: TempDir,
    catalog: Catalog,
    program: Vec<u8>,
    tokenizer: Vec<u8>,
}

impl Setup {
    fn new(program_len: usize) -> Setup {
        let hub = Hub::start();
        let program = noise(program_len, 1);
        let tokenizer = br#"{"model": {"type": "BPE"}}"#.to_vec();
        hub.add_file(REPO, REV, PROGRAM, program.clone(), true);
        hub.add_file(REPO, REV, TOKENIZER, tokenizer.clone(), false);
        Setup {
            hub,
            home: tempfile::tempdir().unwrap(),
            catalog: catalog(),
            program,
            tokenizer,
        }
    }

    fn model(&self) -> &Model {
        self.catalog.model("tiny").unwrap()
    }

    fn variant(&self, id: &str) -> &Variant {
        self.model().variant(id).unwrap()
    }

    fn cache(&self) -> Cache {
        Cache::new(self.home.path())
    }

    /// Downloads `variant` with `fast_options()`.
    fn download(&self, variant: &str) -> Result<LocalModel, DownloadError> {
        download(&self.downloader(fast_options()), self, variant)
    }

    fn downloader(&self, options: DownloadOptions) -> Downloader {
        self.downloader_with(options, None)
    }

    fn downloader_with(&self, options: DownloadOptions, token: Option<&str>) -> Downloader {
        let hub = HubConfig {
            endpoint: self.hub.endpoint(),
            token: token.map(str::to_string),
        };
        Downloader::new(self.cache(), hub, options).unwrap()
    }

    fn program_path(&self) -> PathBuf {
        self.home.path().join("models/tiny").join(REV).join(PROGRAM)
    }

    /// The CDN GETs for the program's bytes.
    fn program_gets(&self) -> Vec<hub::Request> {
        content_gets(&self.hub, &sha256_hex(&self.program))
    }

    /// Asserts `local` holds the program and its last GET resumed at `offset`.
    fn assert_resumed_at(&self, local: &LocalModel, offset: u64) {
        assert_eq!(std::fs::read(&local.program).unwrap(), self.program);
        assert_eq!(
            self.program_gets().last().unwrap().range_start(),
            Some(offset)
        );
    }

    /// Asserts the cache lists nothing for the model and holds no complete copy of the program.
    fn assert_not_downloaded(&self) {
        let cache = self.cache();
        assert!(cache.list(&self.catalog).unwrap().is_empty());
        assert_eq!(
            cache
                .local_model(self.model(), self.variant("cpu"))
                .unwrap(),
            None
        );
        assert!(!self.program_path().exists());
    }
}

fn fast_options() -> DownloadOptions {
    DownloadOptions {
        retry: RetryPolicy {
            attempts: 3,
            first_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
        },
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(2),
        available_space: None,
    }
}

/// Runs a future on a fresh runtime, failing the test if it overruns `TEST_LIMIT`.
fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(TEST_LIMIT, f)
                .await
                .expect("test ran past its time limit")
        })
}

/// Downloads `variant` (never cancelled), with the progress it reported.
fn download_with_progress(
    d: &Downloader,
    s: &Setup,
    variant: &str,
) -> (Result<LocalModel, DownloadError>, Vec<Progress>) {
    let mut events = Vec::new();
    let result = block_on(d.download(
        s.model(),
        s.variant(variant),
        &CancelToken::new(),
        &mut |p| events.push(p.clone()),
    ));
    (result, events)
}

fn download(d: &Downloader, s: &Setup, variant: &str) -> Result<LocalModel, DownloadError> {
    download_with_progress(d, s, variant).0
}

/// Files under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                found.extend(files_under(&p));
            } else {
                found.push(p);
            }
        }
    }
    found
}

fn content_gets(hub: &Hub, sha: &str) -> Vec<hub::Request> {
    hub.requests_for(sha)
        .into_iter()
        .filter(|r| r.method == "GET" && r.cdn)
        .collect()
}

#[test]
fn downloads_a_variant_through_the_cdn_redirect_and_verifies_it() {
    let s = Setup::new(300_000);
    let d = s.downloader(fast_options());
    let (result, events) = download_with_progress(&d, &s, "cpu");
    let local = result.unwrap();

    assert_eq!(local.program, s.program_path());
    assert_eq!(std::fs::read(&local.program).unwrap(), s.program);
    assert_eq!(std::fs::read(&local.files[1]).unwrap(), s.tokenizer);
    assert_eq!(local.bytes, (s.program.len() + s.tokenizer.len()) as u64);
    assert_eq!(s.cache().list(&s.catalog).unwrap(), vec![local.clone()]);

    // HEAD on the hub for each file, the program's bytes from the CDN it redirects to.
    let heads: Vec<_> = s
        .hub
        .requests()
        .into_iter()
        .filter(|r| r.method == "HEAD")
        .collect();
    assert_eq!(heads.len(), 2);
    assert!(heads.iter().all(|r| !r.cdn));
    let gets = s.program_gets();
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0].range, None);

    // No partial files or sidecars are left behind.
    let leftovers: Vec<_> = files_under(s.home.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".part"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Progress only grows and ends at the total, over both files.
    let total = local.bytes;
    assert!(events.windows(2).all(|w| w[0].done <= w[1].done));
    let last = events.last().unwrap();
    assert_eq!((last.done, last.total), (total, total));
    assert_eq!(last.file_count, 2);
    assert!(events
        .iter()
        .any(|p| p.file == PROGRAM && p.file_total == 300_000));
    assert!(events.iter().all(|p| p.file_done <= p.file_total));
}

/// The app shells run downloads on their own tasks while the UI goes on.
#[test]
fn a_download_runs_on_a_spawned_task() {
    let s = Setup::new(20_000);
    let d = std::sync::Arc::new(s.downloader(fast_options()));
    let model = s.model().clone();
    let variant = s.variant("cpu").clone();
    let local = block_on(async move {
        tokio::spawn(async move {
            d.download(&model, &variant, &CancelToken::new(), &mut |_| {})
                .await
        })
        .await
        .unwrap()
    })
    .unwrap();
    assert_eq!(std::fs::read(&local.program).unwrap(), s.program);
}

#[test]
fn a_dropped_transfer_resumes_with_a_range_request() {
    let s = Setup::new(400_000);
    s.hub.fail_next_get(PROGRAM, Fault::DropAfter(100_000));
    let d = s.downloader(fast_options());
    let local = download(&d, &s, "cpu").unwrap();

    assert_eq!(std::fs::read(&local.program).unwrap(), s.program);
    let gets = s.program_gets();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0].range_start(), None);
    assert_eq!(gets[1].range_start(), Some(100_000));
}

#[test]
fn an_interrupted_download_is_resumed_by_the_next_one() {
    let s = Setup::new(400_000);
    s.hub.fail_next_get(PROGRAM, Fault::DropAfter(150_000));
    let no_retries = DownloadOptions {
        retry: RetryPolicy {
            attempts: 1,
            ..fast_options().retry
        },
        ..fast_options()
    };
    let err = download(&s.downloader(no_retries), &s, "cpu").unwrap_err();
    assert!(matches!(err.root(), DownloadError::Network { .. }), "{err}");
    assert!(
        err.to_string().contains("after 150000 of 400000 bytes"),
        "{err}"
    );
    s.assert_not_downloaded();
    let partial = s.cache().partial_bytes(s.model(), s.variant("cpu"));
    assert_eq!(partial, 150_000);

    s.assert_resumed_at(&s.download("cpu").unwrap(), partial);
}

#[test]
fn corrupted_bytes_fail_the_integrity_check_and_nothing_is_cached() {
    let s = Setup::new(200_000);
    s.hub.fail_next_get(PROGRAM, Fault::Corrupt(123_456));
    let err = s.download("cpu").unwrap_err();
    match &err {
        DownloadError::ChecksumMismatch { file, expected, .. } => {
            assert_eq!(file, PROGRAM);
            assert_eq!(expected, &sha256_hex(&s.program));
        }
        other => panic!("expected a checksum error, got {other}"),
    }
    s.assert_not_downloaded();
    // The corrupt bytes are gone too, so the next try cannot resume from them.
    let leftovers: Vec<_> = files_under(&s.home.path().join("models"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("model.pte"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_missing_file_is_a_clear_404_without_retries() {
    let s = Setup::new(1000);
    // The hub has no gpu program.
    let err = s.download("gpu").unwrap_err();
    assert!(matches!(err, DownloadError::NotFound { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with("404 Not Found")
            && text.contains(&format!("/{REPO}/resolve/{REV}/{GPU_PROGRAM}")),
        "{text}"
    );
    assert_eq!(s.hub.requests_for(GPU_PROGRAM).len(), 1);
}

#[test]
fn server_errors_are_retried_until_the_server_recovers() {
    let s = Setup::new(50_000);
    s.hub.fail_next_head(TOKENIZER, Fault::Status(503));
    s.hub.fail_next_get(PROGRAM, Fault::Status(500));
    s.hub.fail_next_get(PROGRAM, Fault::Status(500));
    let local = s.download("cpu").unwrap();
    assert_eq!(std::fs::read(&local.program).unwrap(), s.program);
    assert_eq!(s.program_gets().len(), 3);
    let tokenizer_heads = s
        .hub
        .requests_for(TOKENIZER)
        .into_iter()
        .filter(|r| r.method == "HEAD")
        .count();
    assert_eq!(tokenizer_heads, 2);
}

#[test]
fn persistent_server_errors_give_up_after_bounded_retries() {
    let s = Setup::new(50_000);
    s.hub.fail_every_get(PROGRAM, Some(Fault::Status(500)));
    let err = s.download("cpu").unwrap_err();
    assert!(
        matches!(
            err,
            DownloadError::GaveUp { attempts: 3, ref last } if matches!(**last, DownloadError::Status { status: 500, .. })
        ),
        "{err}"
    );
    assert_eq!(s.program_gets().len(), 3);
    s.assert_not_downloaded();
}

#[test]
fn a_stalled_server_times_out_instead_of_hanging() {
    let s = Setup::new(50_000);
    s.hub.fail_every_get(PROGRAM, Some(Fault::Stall));
    let options = DownloadOptions {
        idle_timeout: Duration::from_millis(300),
        ..fast_options()
    };
    let started = Instant::now();
    let err = download(&s.downloader(options), &s, "cpu").unwrap_err();
    assert!(matches!(err.root(), DownloadError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("no answer from"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    s.assert_not_downloaded();
}

#[test]
fn the_hub_gets_the_token_and_the_cdn_does_not() {
    let s = Setup::new(20_000);
    s.hub.require_token("secret");

    let err = s.download("cpu").unwrap_err();
    assert!(matches!(err, DownloadError::Unauthorized { .. }), "{err}");
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");

    let wrong = s.downloader_with(fast_options(), Some("guess"));
    let err = download(&wrong, &s, "cpu").unwrap_err();
    assert!(matches!(err, DownloadError::Forbidden { .. }), "{err}");

    let right = s.downloader_with(fast_options(), Some("secret"));
    download(&right, &s, "cpu").unwrap();
    let requests = s.hub.requests();
    let auth = |cdn: bool| {
        requests
            .iter()
            .filter(|r| r.cdn == cdn)
            .map(|r| r.authorization.clone())
            .collect::<Vec<_>>()
    };
    assert!(auth(false).contains(&Some("Bearer secret".into())));
    assert!(!auth(true).is_empty());
    assert!(auth(true).iter().all(Option::is_none), "{:?}", auth(true));
}

#[test]
fn a_slow_download_can_be_cancelled_and_resumed_later() {
    let s = Setup::new(2_000_000);
    s.hub.fail_every_get(
        PROGRAM,
        Some(Fault::Trickle {
            chunk: 8 * 1024,
            every: Duration::from_millis(20),
        }),
    );
    let cancel = CancelToken::new();
    let d = s.downloader(fast_options());
    let mut cancelled_at = None;
    let result = block_on(d.download(s.model(), s.variant("cpu"), &cancel, &mut |p| {
        if p.done > 100_000 && cancelled_at.is_none() {
            cancelled_at = Some(Instant::now());
            cancel.cancel();
        }
    }));
    assert!(
        matches!(result, Err(DownloadError::Cancelled)),
        "{result:?}"
    );
    let stopped_in = cancelled_at.expect("progress was reported").elapsed();
    assert!(stopped_in < Duration::from_secs(2), "took {stopped_in:?}");
    s.assert_not_downloaded();
    let partial = s.cache().partial_bytes(s.model(), s.variant("cpu"));
    assert!(partial > 100_000 && partial < 2_000_000, "{partial}");

    s.hub.fail_every_get(PROGRAM, None);
    s.assert_resumed_at(&download(&d, &s, "cpu").unwrap(), partial);
}

#[test]
fn not_enough_disk_space_fails_before_any_byte_is_written() {
    let s = Setup::new(100_000);
    let options = DownloadOptions {
        available_space: Some(50_000_000),
        ..fast_options()
    };
    let err = download(&s.downloader(options), &s, "cpu").unwrap_err();
    let needed = (s.program.len() + s.tokenizer.len()) as u64;
    match &err {
        DownloadError::InsufficientSpace {
            needed: n,
            available,
            ..
        } => assert_eq!((*n, *available), (needed, 50_000_000)),
        other => panic!("expected a disk space error, got {other}"),
    }
    assert!(err.to_string().contains("not enough disk space"), "{err}");
    assert!(s.hub.requests().iter().all(|r| r.method == "HEAD"));
    assert!(files_under(s.home.path()).is_empty());
    s.assert_not_downloaded();
}

#[test]
fn a_cached_model_loads_without_the_network() {
    let s = Setup::new(30_000);
    s.download("cpu").unwrap();
    let Setup {
        hub,
        home,
        catalog,
        program,
        ..
    } = s;
    let dead_endpoint = hub.endpoint();
    drop(hub);

    let cache = Cache::new(home.path());
    let model = catalog.model("tiny").unwrap();
    let variant = model.variant("cpu").unwrap();
    let local = cache.local_model(model, variant).unwrap().unwrap();
    assert_eq!(std::fs::read(&local.program).unwrap(), program);

    // Downloading again answers from the cache without a request.
    let offline = Downloader::new(
        cache,
        HubConfig {
            endpoint: dead_endpoint,
            token: None,
        },
        fast_options(),
    )
    .unwrap();
    let again = block_on(offline.download(model, variant, &CancelToken::new(), &mut |_| {}));
    assert_eq!(again.unwrap(), local);
}

#[test]
fn files_shared_between_variants_are_fetched_once() {
    let s = Setup::new(10_000);
    s.hub
        .add_file(REPO, REV, GPU_PROGRAM, noise(20_000, 2), true);
    let d = s.downloader(fast_options());
    download(&d, &s, "cpu").unwrap();
    download(&d, &s, "gpu").unwrap();
    let tokenizer_gets = s
        .hub
        .requests_for(TOKENIZER)
        .into_iter()
        .filter(|r| r.method == "GET")
        .count();
    assert_eq!(tokenizer_gets, 1);
    assert_eq!(s.cache().list(&s.catalog).unwrap().len(), 2);

    // Deleting one variant keeps the tokenizer the other still needs.
    s.cache().remove(s.model(), s.variant("cpu")).unwrap();
    let gpu = s
        .cache()
        .local_model(s.model(), s.variant("gpu"))
        .unwrap()
        .unwrap();
    assert_eq!(std::fs::read(&gpu.files[1]).unwrap(), s.tokenizer);
}

#[test]
fn a_partial_file_of_another_version_is_not_resumed() {
    let s = Setup::new(60_000);
    let program = s.program_path();
    std::fs::create_dir_all(program.parent().unwrap()).unwrap();
    let part = program.with_file_name("model.pte.part");
    std::fs::write(&part, noise(20_000, 9)).unwrap();
    std::fs::write(
        program.with_file_name("model.pte.part.json"),
        r#"{"url":"x","size":60000,"etag":"0000"}"#,
    )
    .unwrap();
    let local = s.download("cpu").unwrap();
    assert_eq!(std::fs::read(&local.program).unwrap(), s.program);
    let gets = s.program_gets();
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0].range, None);
}

#[test]
fn a_second_download_of_the_same_model_is_refused_while_one_runs() {
    let s = Setup::new(1_000_000);
    s.hub.fail_every_get(
        PROGRAM,
        Some(Fault::Trickle {
            chunk: 8 * 1024,
            every: Duration::from_millis(20),
        }),
    );
    let first = s.downloader(fast_options());
    let second = s.downloader(fast_options());
    let cancel = CancelToken::new();
    let mut quiet = |_: &Progress| {};
    let mut quiet_too = |_: &Progress| {};
    let (a, b) = block_on(async {
        let a = first.download(s.model(), s.variant("cpu"), &cancel, &mut quiet);
        let b = async {
            // Start once the first holds the lock and is receiving bytes.
            while s.hub.sent(PROGRAM) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let r = second
                .download(
                    s.model(),
                    s.variant("cpu"),
                    &CancelToken::new(),
                    &mut quiet_too,
                )
                .await;
            cancel.cancel();
            r
        };
        tokio::join!(a, b)
    });
    assert!(matches!(a, Err(DownloadError::Cancelled)), "{a:?}");
    assert!(matches!(b, Err(DownloadError::Busy { .. })), "{b:?}");
}

/// One try per request, so a fault leaves its partial file behind.
fn no_retries() -> DownloadOptions {
    DownloadOptions {
        retry: RetryPolicy {
            attempts: 1,
            ..fast_options().retry
        },
        ..fast_options()
    }
}

/// Interrupts the program's download at `at` bytes, leaving a partial file to resume.
fn interrupt_program(s: &Setup, at: usize) {
    s.hub.fail_next_get(PROGRAM, Fault::DropAfter(at));
    let err = download(&s.downloader(no_retries()), s, "cpu").unwrap_err();
    assert!(matches!(err.root(), DownloadError::Network { .. }), "{err}");
    assert_eq!(
        s.cache().partial_bytes(s.model(), s.variant("cpu")),
        at as u64
    );
}

#[test]
fn deleting_a_model_while_it_downloads_is_refused_and_the_download_finishes() {
    let s = Setup::new(400_000);
    s.hub.fail_every_get(
        PROGRAM,
        Some(Fault::Trickle {
            chunk: 8 * 1024,
            every: Duration::from_millis(10),
        }),
    );
    let d = s.downloader(fast_options());
    let cache = s.cache();
    let cancel = CancelToken::new();
    let mut quiet = |_: &Progress| {};
    let (downloaded, removed) = block_on(async {
        let download = d.download(s.model(), s.variant("cpu"), &cancel, &mut quiet);
        let remove = async {
            while s.hub.sent(PROGRAM) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // The variant being fetched, and another that shares its tokenizer.
            [
                cache.remove(s.model(), s.variant("cpu")),
                cache.remove(s.model(), s.variant("gpu")),
            ]
        };
        tokio::join!(download, remove)
    });
    for r in &removed {
        assert!(matches!(r, Err(DownloadError::Busy { .. })), "{r:?}");
    }
    let text = removed[0].as_ref().unwrap_err().to_string();
    assert!(text.contains("download of `tiny` is running"), "{text}");
    let local = downloaded.unwrap();
    assert_eq!(std::fs::read(&local.program).unwrap(), s.program);
    assert_eq!(
        cache.local_model(s.model(), s.variant("cpu")).unwrap(),
        Some(local)
    );
    // Once the download is over, deleting works.
    cache.remove(s.model(), s.variant("cpu")).unwrap();
    s.assert_not_downloaded();
}

#[test]
fn sizes_that_overflow_when_added_are_an_error_not_a_panic() {
    let s = Setup::new(1000);
    s.hub.announce_size(PROGRAM, 1 << 63);
    s.hub.announce_size(TOKENIZER, 1 << 63);
    let err = s.download("cpu").unwrap_err();
    assert!(matches!(err, DownloadError::SizeOverflow { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("{PROGRAM}: 9223372036854775808 bytes"))
            && text.contains(&format!("{TOKENIZER}: 9223372036854775808 bytes")),
        "{text}"
    );
    assert!(s.hub.requests().iter().all(|r| r.method == "HEAD"));
    s.assert_not_downloaded();
}

#[test]
fn a_206_of_the_whole_file_replaces_the_partial_instead_of_failing_every_time() {
    let s = Setup::new(400_000);
    interrupt_program(&s, 150_000);
    let len = s.program.len();
    s.hub.fail_every_get(
        PROGRAM,
        Some(Fault::WholeBodyAs206 {
            content_range: Some(format!("bytes 0-{}/{len}", len - 1)),
        }),
    );
    let local = s.download("cpu").unwrap();
    assert_eq!(std::fs::read(&local.program).unwrap(), s.program);
    // Asked to resume, took the whole file in the same answer.
    let gets = s.program_gets();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[1].range_start(), Some(150_000));
}

#[test]
fn a_206_without_content_range_discards_the_partial_and_starts_over() {
    let s = Setup::new(400_000);
    interrupt_program(&s, 150_000);
    s.hub.fail_next_get(
        PROGRAM,
        Fault::WholeBodyAs206 {
            content_range: None,
        },
    );
    let local = s.download("cpu").unwrap();
    assert_eq!(std::fs::read(&local.program).unwrap(), s.program);
    let starts: Vec<_> = s.program_gets().iter().map(|r| r.range_start()).collect();
    assert_eq!(starts, [None, Some(150_000), None]);
}

#[test]
fn a_206_for_a_file_of_another_size_is_refused() {
    let s = Setup::new(400_000);
    interrupt_program(&s, 150_000);
    s.hub.fail_next_get(
        PROGRAM,
        Fault::WholeBodyAs206 {
            content_range: Some("bytes 150000-499999/500000".into()),
        },
    );
    let err = s.download("cpu").unwrap_err();
    assert!(matches!(err, DownloadError::BadRange { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("500000") && text.contains("400000"), "{text}");
    s.assert_not_downloaded();
    // The partial is still a prefix of the file the hub announced; a sane answer resumes it.
    s.assert_resumed_at(&s.download("cpu").unwrap(), 150_000);
}

#[test]
fn a_download_stopped_in_a_shared_file_leaves_only_its_own_variant_partial() {
    let s = Setup::new(50_000);
    s.hub.fail_next_get(TOKENIZER, Fault::DropAfter(10));
    let err = download(&s.downloader(no_retries()), &s, "cpu").unwrap_err();
    assert!(matches!(err.root(), DownloadError::Network { .. }), "{err}");
    let cache = s.cache();
    assert_eq!(
        cache.local_model(s.model(), s.variant("cpu")).unwrap(),
        None
    );
    // The gpu variant shares the tokenizer but was never downloaded.
    assert_eq!(cache.partial_bytes(s.model(), s.variant("gpu")), 0);
    // The cpu variant's resume keeps its verified program and the tokenizer's first bytes.
    assert_eq!(cache.partial_bytes(s.model(), s.variant("cpu")), 50_010);
}

/// The real binary, pointed at the loopback hub and a private data directory.
fn pteria(hub: &Hub, home: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pteria"));
    cmd.args(args)
        .env("HF_ENDPOINT", hub.endpoint())
        .env("PTERIA_HOME", home)
        .env_remove("HF_TOKEN");
    cmd
}

#[test]
fn a_download_killed_mid_transfer_resumes_when_run_again() {
    const GEMMA_REPO: &str = "software-mansion/react-native-executorch-gemma-4";
    const GEMMA_REV: &str = "v0.9.0";
    const PTE: &str = "e2b/xnnpack/gemma_4_e2b_xnnpack_8da4w.pte";
    const SPEC: &str = "gemma-4-e2b:xnnpack-8da4w";
    let hub = Hub::start();
    let program = noise(3_000_000, 7);
    hub.add_file(GEMMA_REPO, GEMMA_REV, PTE, program.clone(), true);
    hub.add_file(
        GEMMA_REPO,
        GEMMA_REV,
        "e2b/tokenizer.json",
        b"{}".to_vec(),
        false,
    );
    hub.add_file(
        GEMMA_REPO,
        GEMMA_REV,
        "e2b/tokenizer_config.json",
        b"{\"bos_token\": \"<bos>\"}".to_vec(),
        false,
    );
    hub.fail_every_get(
        PTE,
        Some(Fault::Trickle {
            chunk: 32 * 1024,
            every: Duration::from_millis(20),
        }),
    );
    let home = tempfile::tempdir().unwrap();

    let mut child = pteria(&hub, home.path(), &["models", "download", SPEC])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while hub.sent(PTE) < 500_000 {
        assert!(Instant::now() < deadline, "the download never got going");
        assert!(child.try_wait().unwrap().is_none(), "pteria exited early");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let final_path = home
        .path()
        .join("models/gemma-4-e2b")
        .join(GEMMA_REV)
        .join(PTE);
    let part = final_path.with_file_name("gemma_4_e2b_xnnpack_8da4w.pte.part");
    let part_len = std::fs::metadata(&part).unwrap().len();
    assert!(
        part_len > 0 && part_len < program.len() as u64,
        "{part_len}"
    );

    // Killed half-way, the model is not downloaded, only partial.
    let out = pteria(&hub, home.path(), &["models", "path", SPEC])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not downloaded"));
    let out = pteria(&hub, home.path(), &["models", "list"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(listing.contains("partial"), "{listing}");

    hub.fail_every_get(PTE, None);
    let out = pteria(&hub, home.path(), &["models", "download", SPEC])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("downloaded {SPEC}")));
    let gets = content_gets(&hub, &sha256_hex(&program));
    assert_eq!(gets.last().unwrap().range_start(), Some(part_len));
    assert_eq!(std::fs::read(&final_path).unwrap(), program);
    assert!(!part.exists());

    let out = pteria(&hub, home.path(), &["models", "path", SPEC])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        final_path.to_string_lossy()
    );
    let out = pteria(&hub, home.path(), &["models", "rm", "gemma-4-e2b"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!final_path.exists());
}
