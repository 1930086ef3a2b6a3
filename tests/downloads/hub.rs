//! A Hugging Face style hub on loopback for the download tests: HTTP/1.1 with keep-alive,
//! `/{repo}/resolve/{rev}/{path}` answered with a 302 to a CDN on another port for LFS files
//! (carrying `X-Linked-Size` and `X-Linked-Etag`) or with the bytes for small git-stored files,
//! Range requests, optional bearer-token checks, made-up sizes and injected failures. It records
//! every request.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// What to do to one response instead of answering it normally.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this status and no body.
    Status(u16),
    /// Announce the full length, send this many body bytes, then close the connection.
    DropAfter(usize),
    /// Flip the byte at this offset of the file.
    Corrupt(u64),
    /// Send the body `chunk` bytes at a time, sleeping `every` between chunks.
    Trickle { chunk: usize, every: Duration },
    /// Read the request and never answer.
    Stall,
    /// Answer 206 with the whole file, whatever the Range asked for, and this Content-Range
    /// header if any: a server that gets ranges wrong.
    WholeBodyAs206 { content_range: Option<String> },
}

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Which listener took it: the hub or the CDN.
    pub cdn: bool,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

impl Request {
    /// The first byte a `Range: bytes=N-` header asked for.
    pub fn range_start(&self) -> Option<u64> {
        self.range
            .as_deref()?
            .strip_prefix("bytes=")?
            .trim_end_matches('-')
            .parse()
            .ok()
    }
}

struct File {
    bytes: Vec<u8>,
    sha256: String,
    /// Stored with Git LFS: served through the CDN redirect, ETag = sha256.
    lfs: bool,
}

#[derive(Default)]
struct Faults {
    next_get: VecDeque<Fault>,
    always_get: Option<Fault>,
    next_head: VecDeque<Fault>,
}

#[derive(Default)]
struct State {
    /// By path in the hub: `{repo}/resolve/{rev}/{file}`.
    files: HashMap<String, File>,
    faults: HashMap<String, Faults>,
    requests: Vec<Request>,
    /// Body bytes sent for each file, over every request.
    sent: HashMap<String, u64>,
    token: Option<String>,
    /// Sizes the hub's HEAD announces instead of the real ones, by path suffix.
    announced: HashMap<String, u64>,
}

pub struct Hub {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Hub {
    pub fn start() -> Hub {
        let std_hub = std::net::TcpListener::bind("127.0.0.1:0").expect("bind hub");
        let std_cdn = std::net::TcpListener::bind("127.0.0.1:0").expect("bind cdn");
        std_hub.set_nonblocking(true).unwrap();
        std_cdn.set_nonblocking(true).unwrap();
        let addr = std_hub.local_addr().unwrap();
        let cdn_addr = std_cdn.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, rx) = oneshot::channel();
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let hub = TcpListener::from_std(std_hub).unwrap();
                let cdn = TcpListener::from_std(std_cdn).unwrap();
                let serve = async {
                    loop {
                        let (stream, is_cdn) = tokio::select! {
                            r = hub.accept() => (r, false),
                            r = cdn.accept() => (r, true),
                        };
                        let Ok((stream, _)) = stream else { continue };
                        let state = shared.clone();
                        tokio::spawn(connection(stream, is_cdn, state, cdn_addr));
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = rx => {}
                }
            });
        });
        Hub {
            addr,
            state,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `bytes` at `{repo}/resolve/{rev}/{path}`.
    pub fn add_file(&self, repo: &str, rev: &str, path: &str, bytes: Vec<u8>, lfs: bool) {
        let key = format!("{repo}/resolve/{rev}/{path}");
        let sha256 = sha256_hex(&bytes);
        self.lock().files.insert(key, File { bytes, sha256, lfs });
    }

    /// Makes the hub's HEAD for the file whose path ends with `path` announce `size` bytes (in
    /// `X-Linked-Size` for LFS files, `Content-Length` for others), whatever the file holds.
    pub fn announce_size(&self, path: &str, size: u64) {
        self.lock().announced.insert(path.to_string(), size);
    }

    pub fn require_token(&self, token: &str) {
        self.lock().token = Some(token.to_string());
    }

    fn faults(&self, path: &str, f: impl FnOnce(&mut Faults)) {
        let mut state = self.lock();
        f(state.faults.entry(path.to_string()).or_default());
    }

    /// The next content GET of the file whose repo path ends with `path` meets `fault`; queued
    /// faults apply in order, one per request.
    pub fn fail_next_get(&self, path: &str, fault: Fault) {
        self.faults(path, |f| f.next_get.push_back(fault));
    }

    /// Every content GET once the queue is empty.
    pub fn fail_every_get(&self, path: &str, fault: Option<Fault>) {
        self.faults(path, |f| f.always_get = fault);
    }

    pub fn fail_next_head(&self, path: &str, fault: Fault) {
        self.faults(path, |f| f.next_head.push_back(fault));
    }

    pub fn requests(&self) -> Vec<Request> {
        self.lock().requests.clone()
    }

    /// Requests whose path ends with `suffix` (the CDN's paths end with the sha256).
    pub fn requests_for(&self, suffix: &str) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.ends_with(suffix))
            .collect()
    }

    /// Body bytes sent so far for the file whose path ends with `path`.
    pub fn sent(&self, path: &str) -> u64 {
        self.lock()
            .sent
            .iter()
            .filter(|(k, _)| k.ends_with(path))
            .map(|(_, v)| *v)
            .sum()
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Head {
    method: String,
    path: String,
    headers: HashMap<String, String>,
}

/// Reads one request head; `None` when the client closed the connection.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Head> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&buf[..end]).to_string();
            buf.drain(..end + 4);
            let mut lines = text.split("\r\n");
            let mut first = lines.next()?.split_whitespace();
            let method = first.next()?.to_string();
            let path = first.next()?.to_string();
            let headers = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            return Some(Head {
                method,
                path,
                headers,
            });
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn connection(
    mut stream: TcpStream,
    is_cdn: bool,
    state: Arc<Mutex<State>>,
    cdn_addr: SocketAddr,
) {
    let mut buf = Vec::new();
    while let Some(head) = read_head(&mut stream, &mut buf).await {
        let keep_open = respond(&mut stream, head, is_cdn, &state, cdn_addr).await;
        if !keep_open {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

async fn write_head(stream: &mut TcpStream, status: u16, headers: &[(&str, String)]) -> bool {
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let mut text = format!("HTTP/1.1 {status} {reason}\r\n");
    for (k, v) in headers {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    text.push_str("\r\n");
    stream.write_all(text.as_bytes()).await.is_ok()
}

struct Decision {
    key: String,
    bytes: Vec<u8>,
    sha256: String,
    lfs: bool,
    fault: Option<Fault>,
    /// The size a HEAD announces.
    announced: u64,
}

/// Records the request and picks the file and the fault for it, or an error status.
fn decide(state: &Mutex<State>, head: &Head, is_cdn: bool, path: &str) -> Result<Decision, u16> {
    let is_head = head.method == "HEAD";
    let authorization = head.headers.get("authorization").cloned();
    let mut s = lock(state);
    s.requests.push(Request {
        method: head.method.clone(),
        path: head.path.clone(),
        cdn: is_cdn,
        range: head.headers.get("range").cloned(),
        authorization: authorization.clone(),
    });
    if let (false, Some(token)) = (is_cdn, &s.token) {
        match &authorization {
            None => return Err(401),
            Some(a) if *a != format!("Bearer {token}") => return Err(403),
            Some(_) => {}
        }
    }
    let key = if is_cdn {
        let sha = path.strip_prefix("cdn/").unwrap_or_default();
        s.files
            .iter()
            .find(|(_, f)| f.lfs && f.sha256 == sha)
            .map(|(k, _)| k.clone())
    } else {
        s.files.contains_key(path).then(|| path.to_string())
    };
    let key = key.ok_or(404u16)?;
    let file = &s.files[&key];
    let (bytes, sha256, lfs) = (file.bytes.clone(), file.sha256.clone(), file.lfs);
    let content_get = !is_head && (is_cdn || !lfs);
    let hub_head = is_head && !is_cdn;
    let faults = s
        .faults
        .iter_mut()
        .find(|(p, _)| key.ends_with(p.as_str()))
        .map(|(_, f)| f);
    let fault = match faults {
        Some(f) if content_get => f.next_get.pop_front().or_else(|| f.always_get.clone()),
        Some(f) if hub_head => f.next_head.pop_front(),
        _ => None,
    };
    let announced = s
        .announced
        .iter()
        .find(|(p, _)| key.ends_with(p.as_str()))
        .map_or(bytes.len() as u64, |(_, size)| *size);
    Ok(Decision {
        key,
        bytes,
        sha256,
        lfs,
        fault,
        announced,
    })
}

/// Answers one request; returns whether the connection stays open.
async fn respond(
    stream: &mut TcpStream,
    head: Head,
    is_cdn: bool,
    state: &Mutex<State>,
    cdn_addr: SocketAddr,
) -> bool {
    let is_head = head.method == "HEAD";
    let range = head.headers.get("range").cloned();
    let path = head.path.trim_start_matches('/').to_string();

    // Decide everything under the lock, then answer without it.
    let decided = decide(state, &head, is_cdn, &path);
    let Decision {
        key,
        bytes,
        sha256,
        lfs,
        fault,
        announced,
    } = match decided {
        Ok(d) => d,
        Err(status) => {
            return write_head(stream, status, &[("Content-Length", "0".into())]).await;
        }
    };

    match fault {
        Some(Fault::Status(status)) => {
            return write_head(stream, status, &[("Content-Length", "0".into())]).await
        }
        Some(Fault::Stall) => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return false;
        }
        _ => {}
    }

    if !is_cdn && lfs {
        let quoted = format!("\"{sha256}\"");
        return write_head(
            stream,
            302,
            &[
                ("Location", format!("http://{cdn_addr}/cdn/{sha256}")),
                ("X-Linked-Size", announced.to_string()),
                ("X-Linked-Etag", quoted.clone()),
                ("ETag", quoted),
                ("Content-Length", "0".into()),
            ],
        )
        .await;
    }

    // Git-stored files carry a 40-digit git hash as their ETag, not a sha256 of the bytes.
    let etag = if lfs {
        sha256.clone()
    } else {
        sha256[..40].to_string()
    };
    let len = bytes.len() as u64;
    if let Some(Fault::WholeBodyAs206 { content_range }) = &fault {
        let mut headers = vec![("Content-Length", len.to_string())];
        if let Some(value) = content_range {
            headers.push(("Content-Range", value.clone()));
        }
        if !write_head(stream, 206, &headers).await {
            return false;
        }
        let written = stream.write_all(&bytes).await.is_ok();
        *lock(state).sent.entry(key.clone()).or_default() += len;
        return written;
    }
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse::<u64>().ok());
    if let Some(start) = start {
        if start >= len {
            return write_head(
                stream,
                416,
                &[
                    ("Content-Range", format!("bytes */{len}")),
                    ("Content-Length", "0".into()),
                ],
            )
            .await;
        }
    }
    let from = start.unwrap_or(0);
    // A HEAD tells the size the hub announces, which a test may have made up.
    let length = if is_head { announced } else { len - from };
    let mut headers = vec![
        ("Content-Length", length.to_string()),
        ("ETag", format!("\"{etag}\"")),
        ("Accept-Ranges", "bytes".into()),
    ];
    let status = if start.is_some() {
        headers.push(("Content-Range", format!("bytes {from}-{}/{len}", len - 1)));
        206
    } else {
        200
    };
    if !write_head(stream, status, &headers).await {
        return false;
    }
    if is_head {
        return true;
    }

    let mut body = bytes[from as usize..].to_vec();
    if let Some(Fault::Corrupt(at)) = fault {
        if let Some(b) = at.checked_sub(from).and_then(|i| body.get_mut(i as usize)) {
            *b ^= 0xFF;
        }
    }
    let (limit, chunk, every) = match fault {
        Some(Fault::DropAfter(n)) => (n.min(body.len()), body.len().max(1), Duration::ZERO),
        Some(Fault::Trickle { chunk, every }) => (body.len(), chunk.max(1), every),
        _ => (body.len(), body.len().max(1), Duration::ZERO),
    };
    let mut written = 0;
    while written < limit {
        let end = (written + chunk).min(limit);
        if stream.write_all(&body[written..end]).await.is_err() {
            return false;
        }
        let _ = stream.flush().await;
        *lock(state).sent.entry(key.clone()).or_default() += (end - written) as u64;
        written = end;
        if !every.is_zero() && written < limit {
            tokio::time::sleep(every).await;
        }
    }
    // A dropped transfer closes the connection with the body unfinished.
    limit == body.len()
}
