//! The hub's HTTP protocol: resolve URLs, the HEAD that gives a file's size and hash, and GETs
//! that follow the hub's redirect to its CDN with a Range header for resuming.

use std::time::Duration;

use reqwest::header::{self, HeaderMap};
use reqwest::{Client, Method, Response, StatusCode, Url};

use super::DownloadError;

/// Redirects the hub may chain (hub → CDN, and a CDN may add one).
const MAX_REDIRECTS: usize = 5;

/// Where and how to reach a Hugging Face compatible hub.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Scheme, host and optional path prefix, e.g. `https://huggingface.co`.
    pub endpoint: String,
    /// Sent as a bearer token to the hub itself, never to the hosts it redirects to.
    pub token: Option<String>,
}

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

impl HubConfig {
    /// `HF_ENDPOINT` and `HF_TOKEN`, the variables the Hugging Face tools read.
    pub fn from_env() -> HubConfig {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        HubConfig {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            token: var("HF_TOKEN"),
        }
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{path}`.
    pub fn resolve_url(
        &self,
        repo: &str,
        revision: &str,
        path: &str,
    ) -> Result<Url, DownloadError> {
        let text = format!(
            "{}/{repo}/resolve/{revision}/{path}",
            self.endpoint.trim_end_matches('/')
        );
        Url::parse(&text).map_err(|e| DownloadError::InvalidEndpoint {
            endpoint: self.endpoint.clone(),
            reason: e.to_string(),
        })
    }
}

/// What the hub says about a file before we fetch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    pub url: Url,
    pub size: u64,
    /// The hub's ETag, unquoted; for LFS files it is the content's sha256.
    pub etag: Option<String>,
    pub sha256: Option<String>,
}

/// One try's failure, sorted into what a retry may fix and what it cannot.
#[derive(Debug)]
pub(crate) enum Failure {
    Retry(DownloadError),
    Fatal(DownloadError),
}

pub(crate) struct Http {
    client: Client,
    hub: HubConfig,
    /// The endpoint parsed, for telling the hub's own URLs from its CDN's.
    hub_url: Option<Url>,
    /// How long to wait for response headers or for the next body chunk.
    pub idle_timeout: Duration,
}

impl Http {
    pub fn new(
        hub: HubConfig,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Result<Http, DownloadError> {
        let client = Client::builder()
            // Redirects are followed by hand so the token stays with the hub and every hop's
            // headers can be read.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(connect_timeout)
            .user_agent(concat!("pteria/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| DownloadError::Client(e.to_string()))?;
        let hub_url = Url::parse(&hub.endpoint).ok();
        Ok(Http {
            client,
            hub,
            hub_url,
            idle_timeout,
        })
    }

    pub fn hub(&self) -> &HubConfig {
        &self.hub
    }

    async fn send(
        &self,
        method: Method,
        url: &Url,
        range_from: Option<u64>,
    ) -> Result<Response, Failure> {
        let mut req = self.client.request(method, url.clone());
        if let (Some(token), Some(hub)) = (&self.hub.token, &self.hub_url) {
            if url.origin() == hub.origin() {
                req = req.bearer_auth(token);
            }
        }
        if let Some(from) = range_from {
            req = req.header(header::RANGE, format!("bytes={from}-"));
        }
        match tokio::time::timeout(self.idle_timeout, req.send()).await {
            Err(_) => Err(Failure::Retry(DownloadError::Timeout {
                url: url.to_string(),
                after: self.idle_timeout,
            })),
            Ok(Err(e)) => Err(transport_failure(url, e, self.idle_timeout)),
            Ok(Ok(resp)) => Ok(resp),
        }
    }

    /// HEAD on the resolve URL. The hub answers LFS files with a redirect that already carries
    /// `X-Linked-Size` and `X-Linked-Etag`; only when a hop lacks them do we follow it.
    pub async fn head(&self, url: &Url) -> Result<RemoteFile, Failure> {
        let mut current = url.clone();
        let mut etag = None;
        for _ in 0..=MAX_REDIRECTS {
            let resp = self.send(Method::HEAD, &current, None).await?;
            let status = resp.status();
            let headers = resp.headers();
            if etag.is_none() {
                etag = header_text(headers, "x-linked-etag")
                    .or_else(|| header_text(headers, "etag"))
                    .map(|e| unquote(&e));
            }
            let linked_size = header_text(headers, "x-linked-size").and_then(|s| s.parse().ok());
            if status.is_redirection() {
                if let Some(size) = linked_size {
                    return Ok(remote(url, size, etag));
                }
                current = next_hop(&current, headers)?;
                continue;
            }
            check_status(&current, status)?;
            let size = linked_size.or_else(|| {
                header_text(headers, header::CONTENT_LENGTH.as_str()).and_then(|s| s.parse().ok())
            });
            return match size {
                Some(size) => Ok(remote(url, size, etag)),
                None => Err(Failure::Fatal(DownloadError::MissingSize {
                    url: url.to_string(),
                })),
            };
        }
        Err(Failure::Fatal(DownloadError::TooManyRedirects {
            url: url.to_string(),
        }))
    }

    /// GET from `range_from` on, following redirects and keeping the Range on every hop.
    pub async fn get(&self, url: &Url, range_from: u64) -> Result<Response, Failure> {
        let range = (range_from > 0).then_some(range_from);
        let mut current = url.clone();
        for _ in 0..=MAX_REDIRECTS {
            let resp = self.send(Method::GET, &current, range).await?;
            let status = resp.status();
            if status.is_redirection() {
                current = next_hop(&current, resp.headers())?;
                continue;
            }
            if status == StatusCode::RANGE_NOT_SATISFIABLE {
                return Ok(resp);
            }
            check_status(&current, status)?;
            return Ok(resp);
        }
        Err(Failure::Fatal(DownloadError::TooManyRedirects {
            url: url.to_string(),
        }))
    }

    /// The next body chunk, or `None` at its end; a stall longer than the idle timeout fails.
    pub async fn chunk(
        &self,
        url: &Url,
        resp: &mut Response,
    ) -> Result<Option<impl AsRef<[u8]>>, Failure> {
        match tokio::time::timeout(self.idle_timeout, resp.chunk()).await {
            Err(_) => Err(Failure::Retry(DownloadError::Timeout {
                url: url.to_string(),
                after: self.idle_timeout,
            })),
            Ok(Err(e)) => Err(transport_failure(url, e, self.idle_timeout)),
            Ok(Ok(chunk)) => Ok(chunk),
        }
    }
}

fn remote(url: &Url, size: u64, etag: Option<String>) -> RemoteFile {
    let sha256 = etag.as_deref().filter(|e| is_sha256(e)).map(str::to_string);
    RemoteFile {
        url: url.clone(),
        size,
        etag,
        sha256,
    }
}

/// LFS files' ETags are their sha256; git-stored files get a 40-digit git hash instead, which
/// is not a hash of the bytes alone, so only size checks those.
fn is_sha256(etag: &str) -> bool {
    etag.len() == 64 && etag.bytes().all(|b| b.is_ascii_hexdigit())
}

fn unquote(etag: &str) -> String {
    etag.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_ascii_lowercase()
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn next_hop(from: &Url, headers: &HeaderMap) -> Result<Url, Failure> {
    let location = header_text(headers, header::LOCATION.as_str()).ok_or_else(|| {
        Failure::Fatal(DownloadError::BadRedirect {
            url: from.to_string(),
            reason: "no Location header".into(),
        })
    })?;
    // The hub sends relative Locations for same-host redirects, absolute ones for its CDN.
    from.join(&location).map_err(|e| {
        Failure::Fatal(DownloadError::BadRedirect {
            url: from.to_string(),
            reason: format!("Location `{location}`: {e}"),
        })
    })
}

fn check_status(url: &Url, status: StatusCode) -> Result<(), Failure> {
    let url = url.to_string();
    match status.as_u16() {
        200..=299 => Ok(()),
        401 => Err(Failure::Fatal(DownloadError::Unauthorized { url })),
        403 => Err(Failure::Fatal(DownloadError::Forbidden { url })),
        404 => Err(Failure::Fatal(DownloadError::NotFound { url })),
        // Request timeout and rate limiting clear up on their own, like server errors.
        408 | 429 | 500..=599 => Err(Failure::Retry(DownloadError::Status {
            url,
            status: status.as_u16(),
        })),
        s => Err(Failure::Fatal(DownloadError::Status { url, status: s })),
    }
}

fn transport_failure(url: &Url, e: reqwest::Error, idle: Duration) -> Failure {
    if e.is_timeout() {
        Failure::Retry(DownloadError::Timeout {
            url: url.to_string(),
            after: idle,
        })
    } else if e.is_builder() {
        Failure::Fatal(DownloadError::Client(e.to_string()))
    } else {
        Failure::Retry(DownloadError::Network {
            url: url.to_string(),
            reason: error_chain(&e),
        })
    }
}

/// reqwest's top-level message is generic ("error sending request"); the cause says what broke.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_url_follows_the_hub_layout() {
        let hub = HubConfig {
            endpoint: "https://hub.example/".into(),
            token: None,
        };
        let url = hub
            .resolve_url("org/repo", "v0.9.0", "e2b/tokenizer.json")
            .unwrap();
        assert_eq!(
            url.as_str(),
            "https://hub.example/org/repo/resolve/v0.9.0/e2b/tokenizer.json"
        );
        let bad = HubConfig {
            endpoint: "not a url".into(),
            token: None,
        };
        assert!(matches!(
            bad.resolve_url("o/r", "v", "f"),
            Err(DownloadError::InvalidEndpoint { .. })
        ));
    }

    #[test]
    fn only_64_digit_etags_are_sha256() {
        let sha = "a".repeat(64);
        assert_eq!(unquote(&format!("\"{}\"", sha.to_uppercase())), sha);
        assert_eq!(unquote("W/\"abc\""), "abc");
        assert!(is_sha256(&sha));
        assert!(!is_sha256(&"a".repeat(40)));
        assert!(!is_sha256(&"g".repeat(64)));
    }

    #[test]
    fn statuses_map_to_clear_errors_and_retry_only_what_can_clear_up() {
        let url = Url::parse("http://h/f").unwrap();
        let fatal = |s: u16| {
            matches!(
                check_status(&url, StatusCode::from_u16(s).unwrap()),
                Err(Failure::Fatal(_))
            )
        };
        let retry = |s: u16| {
            matches!(
                check_status(&url, StatusCode::from_u16(s).unwrap()),
                Err(Failure::Retry(_))
            )
        };
        assert!(check_status(&url, StatusCode::PARTIAL_CONTENT).is_ok());
        assert!(fatal(401) && fatal(403) && fatal(404) && fatal(400));
        assert!(retry(500) && retry(502) && retry(503) && retry(429) && retry(408));
    }
}
