//! Every command through Tauri's mock runtime, on a real chat core over temporary files (the
//! tiny Llama fixture as bundled and as hub model): plain commands through the IPC
//! (`get_ipc_response`, so argument names and result JSON are what the web UI sees), streaming
//! ones by calling the command with a Channel that records what it is sent.

#[allow(dead_code)]
#[path = "../../tests/downloads/hub.rs"]
mod hub;
#[allow(dead_code)]
#[path = "../../tests/support/tiny_chat.rs"]
mod tiny;

use super::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tauri::ipc::{CallbackFn, InvokeBody, InvokeResponseBody};
use tauri::test::{get_ipc_response, mock_builder, MockRuntime};
use tauri::webview::{InvokeRequest, WebviewWindowBuilder};
use tauri::{App, WebviewWindow};

const TIMEOUT: Duration = Duration::from_secs(120);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

struct Fixture {
    _dir: tempfile::TempDir,
    hub: hub::Hub,
    app: App<MockRuntime>,
    webview: WebviewWindow<MockRuntime>,
}

fn setup() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let hub = hub::Hub::start();
    for (path, bytes, lfs) in tiny::remote_files(&fixtures()) {
        hub.add_file(tiny::REPO, tiny::REV, path, bytes, lfs);
    }
    let core = ChatCore::open(tiny::config(dir.path(), &fixtures(), hub.endpoint())).unwrap();
    // The app's real context: its capability file decides what the page may call.
    let app = with_commands(mock_builder())
        .manage(core)
        .build(tauri::generate_context!())
        .unwrap();
    let webview = match app.get_webview_window("main") {
        Some(w) => w,
        None => WebviewWindowBuilder::new(&app, "main", Default::default())
            .build()
            .unwrap(),
    };
    Fixture {
        _dir: dir,
        hub,
        app,
        webview,
    }
}

impl Fixture {
    /// Invokes `cmd` through the IPC as the web UI does; the JSON result or the error text.
    fn call(&self, cmd: &str, args: Value) -> std::result::Result<Value, String> {
        let request = InvokeRequest {
            cmd: cmd.into(),
            callback: CallbackFn(0),
            error: CallbackFn(1),
            url: "tauri://localhost".parse().unwrap(),
            body: InvokeBody::Json(args),
            headers: Default::default(),
            invoke_key: tauri::test::INVOKE_KEY.to_string(),
        };
        match get_ipc_response(&self.webview, request) {
            Ok(body) => Ok(json_of(body)),
            Err(e) => Err(e.as_str().map_or_else(|| e.to_string(), str::to_string)),
        }
    }

    fn ok(&self, cmd: &str, args: Value) -> Value {
        self.call(cmd, args)
            .unwrap_or_else(|e| panic!("{cmd} failed: {e}"))
    }

    fn core(&self) -> State<'_, ChatCore> {
        self.app.state::<ChatCore>()
    }

    /// Greedy six-token replies on the CPU, through `update_settings`.
    fn greedy(&self, max_tokens: Option<usize>) {
        let mut s = self.ok("get_settings", json!({}));
        s["temperature"] = json!(0.0);
        s["max_tokens"] = json!(max_tokens);
        s["device"] = json!("cpu");
        self.ok("update_settings", json!({ "settings": s }));
    }

    fn load(&self, spec: Option<&str>) -> Vec<Value> {
        let (channel, rx) = recorder();
        block_on(load_model(self.core(), spec.map(str::to_string), channel)).unwrap();
        let events = until(&rx, |e| e["type"] != "loading");
        assert_eq!(events.last().unwrap()["type"], "loaded", "{events:?}");
        events
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tauri::async_runtime::block_on(f)
}

fn json_of(body: InvokeResponseBody) -> Value {
    match body {
        InvokeResponseBody::Json(s) => serde_json::from_str(&s).unwrap(),
        InvokeResponseBody::Raw(b) => serde_json::from_slice(&b).unwrap(),
    }
}

/// A Channel that forwards each message it is sent, as JSON, to the returned receiver.
fn recorder<T: tauri::ipc::IpcResponse>() -> (Channel<T>, mpsc::Receiver<Value>) {
    let (tx, rx) = mpsc::channel();
    let tx = Arc::new(Mutex::new(tx));
    let channel = Channel::new(move |body| {
        let _ = tx.lock().unwrap().send(json_of(body));
        Ok(())
    });
    (channel, rx)
}

/// Messages until (and including) the first for which `last` holds.
fn until(rx: &mpsc::Receiver<Value>, last: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let e = rx.recv_timeout(TIMEOUT).expect("the stream never ended");
        let done = last(&e);
        out.push(e);
        if done {
            return out;
        }
    }
}

fn is_final(e: &Value) -> bool {
    e["type"] == "finished" || e["type"] == "failed"
}

#[test]
fn every_registered_command_answers_through_the_ipc() {
    let f = setup();
    for cmd in COMMANDS {
        // Missing arguments are the command's own error; an unknown command would say so.
        if let Err(e) = f.call(cmd, json!({})) {
            assert!(!e.contains("not found"), "{cmd}: {e}");
        }
    }
    let e = f.call("no_such_command", json!({})).unwrap_err();
    assert!(e.contains("not found"), "{e}");
    // Least privilege: the page may not use core plugins the app does not grant.
    let e = f
        .call(
            "plugin:event|emit",
            json!({ "event": "x", "payload": null }),
        )
        .unwrap_err();
    assert!(e.contains("not allowed"), "{e}");
}

#[test]
fn app_info_settings_and_conversations_round_trip_through_the_ipc() {
    let f = setup();
    let info = f.ok("app_info", json!({}));
    assert_eq!(info["warnings"], json!([]));
    assert_eq!(info["loaded"], Value::Null);
    assert!(info["data_dir"].as_str().unwrap().ends_with("data"));

    f.greedy(Some(6));
    let s = f.ok("get_settings", json!({}));
    assert_eq!(
        (s["temperature"].as_f64(), s["device"].as_str()),
        (Some(0.0), Some("cpu"))
    );
    let mut bad = s.clone();
    bad["top_p"] = json!(2.0);
    let e = f
        .call("update_settings", json!({ "settings": bad }))
        .unwrap_err();
    assert!(e.contains("top_p"), "{e}");
    // The web UI's embedding tables select: "auto" by default; GPU memory on the CPU refused.
    assert_eq!(s["tables"], "auto");
    let mut bad = s.clone();
    bad["tables"] = json!("gpu");
    let e = f
        .call("update_settings", json!({ "settings": bad }))
        .unwrap_err();
    assert!(e.contains("tables"), "{e}");
    let mut host = s.clone();
    host["tables"] = json!("host");
    assert_eq!(
        f.ok("update_settings", json!({ "settings": host }))["tables"],
        "host"
    );

    let c = f.ok("create_conversation", json!({ "title": null }));
    let id = c["id"].as_str().unwrap();
    assert_eq!(c["title"], "New chat");
    let renamed = f.ok(
        "rename_conversation",
        json!({ "id": id, "title": "Renamed" }),
    );
    assert_eq!(renamed["title"], "Renamed");
    let list = f.ok("list_conversations", json!({}));
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["title"], "Renamed");
    assert_eq!(
        f.ok("open_conversation", json!({ "id": id }))["messages"],
        json!([])
    );
    assert_eq!(f.ok("context_usage", json!({ "id": id })), Value::Null);
    f.ok("delete_conversation", json!({ "id": id }));
    let e = f
        .call("open_conversation", json!({ "id": id }))
        .unwrap_err();
    assert!(e.contains("no conversation"), "{e}");
    assert!(f
        .call("open_conversation", json!({ "id": "../../etc" }))
        .is_err());
}

#[test]
fn list_models_shows_the_bundled_model_and_the_hub_one() {
    let f = setup();
    let models = f.ok("list_models", json!({}));
    let specs: Vec<(&str, &str)> = models
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["variants"].as_array().unwrap())
        .map(|v| {
            (
                v["spec"].as_str().unwrap(),
                v["state"]["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        specs,
        [(tiny::BUNDLED, "bundled"), (tiny::REMOTE, "remote")]
    );
    assert_eq!(models[0]["variants"][0]["fit"]["light"], "green");
    assert_eq!(models[0]["variants"][0]["platform_default"], true);
}

#[test]
fn a_reply_streams_through_a_channel_and_is_saved() {
    let f = setup();
    f.greedy(Some(6));
    let events = f.load(None);
    assert_eq!(events[0]["type"], "loading");
    assert_eq!(events[1]["model"]["spec"], tiny::BUNDLED);
    assert_eq!(f.ok("app_info", json!({}))["loaded"]["spec"], tiny::BUNDLED);

    let c = f.ok("create_conversation", json!({ "title": null }));
    let id = c["id"].as_str().unwrap().to_string();
    let (channel, rx) = recorder();
    let started = block_on(send_message(f.core(), id.clone(), "hi".into(), channel)).unwrap();
    assert_eq!(started.title, "hi");
    let events = until(&rx, is_final);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "finished", "{events:?}");
    let streamed: String = events
        .iter()
        .filter(|e| e["type"] == "delta")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert!(!streamed.is_empty());
    assert_eq!(last["message"]["content"], streamed.as_str());
    assert_eq!(last["message"]["stats"]["generated_tokens"], 6);
    assert_eq!(
        last["usage"],
        json!({ "used_tokens": 13, "context_tokens": 32 })
    );

    // What the UI reloads after the stream: the saved conversation and its context use.
    let saved = f.ok("open_conversation", json!({ "id": id }));
    assert_eq!(saved["messages"][1]["content"], streamed.as_str());
    assert_eq!(
        f.ok("context_usage", json!({ "id": id })),
        json!({ "used_tokens": 13, "context_tokens": 32 })
    );

    // Regenerate: the same greedy reply, saved in place of the first.
    let (channel, rx) = recorder();
    block_on(regenerate(f.core(), id.clone(), channel)).unwrap();
    let events = until(&rx, is_final);
    assert_eq!(
        events.last().unwrap()["message"]["content"],
        streamed.as_str()
    );
    let saved = f.ok("open_conversation", json!({ "id": id }));
    assert_eq!(saved["messages"].as_array().unwrap().len(), 2);
}

#[test]
fn stop_generation_cancels_a_streaming_reply() {
    let f = setup();
    f.greedy(None);
    f.load(Some(tiny::BUNDLED));
    let c = f.ok("create_conversation", json!({ "title": "stop" }));
    let id = c["id"].as_str().unwrap().to_string();
    assert_eq!(f.ok("stop_generation", json!({})), json!(false));
    // The Channel holds the reply at its first text until the test has called stop.
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let gate_rx = Mutex::new(gate_rx);
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let channel: Channel<ChatEvent> = Channel::new(move |body| {
        let e = json_of(body);
        let first_text = e["type"] == "delta";
        let _ = tx.lock().unwrap().send(e);
        if first_text {
            let _ = gate_rx.lock().unwrap().recv_timeout(TIMEOUT);
        }
        Ok(())
    });
    block_on(send_message(f.core(), id.clone(), "hi".into(), channel)).unwrap();
    let first = rx.recv_timeout(TIMEOUT).unwrap();
    assert_eq!(first["type"], "prefill");
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap()["type"], "delta");
    // A second message while one is written is refused, through the IPC.
    let e = f
        .call(
            "send_message",
            json!({ "conversationId": id, "text": "again", "onEvent": "__CHANNEL__:7" }),
        )
        .unwrap_err();
    assert!(e.contains("a reply is being written"), "{e}");
    assert_eq!(f.ok("stop_generation", json!({})), json!(true));
    drop(gate_tx);
    let events = until(&rx, is_final);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "finished", "{events:?}");
    assert_eq!(last["message"]["stopped"], true);
    assert_eq!(last["message"]["stats"]["stop"], "cancelled");
    // Without the stop the fixture would write until its 32-token context is full.
    assert!(
        last["message"]["stats"]["generated_tokens"]
            .as_u64()
            .unwrap()
            < 4
    );
    let saved = f.ok("open_conversation", json!({ "id": id }));
    assert_eq!(saved["messages"][1]["stopped"], true);
}

#[test]
fn downloads_stream_progress_cancel_resume_and_delete() {
    let f = setup();
    f.hub.fail_next_get(
        "cpu/model.pte",
        hub::Fault::Trickle {
            chunk: 4096,
            every: Duration::from_millis(20),
        },
    );
    let (channel, rx) = recorder();
    block_on(download_model(f.core(), tiny::REMOTE.into(), channel)).unwrap();
    until(&rx, |e| {
        e["type"] == "progress" && e["done"].as_u64() > Some(8192)
    });
    assert_eq!(
        f.ok("cancel_download", json!({ "spec": tiny::REMOTE })),
        json!(true)
    );
    let events = until(&rx, |e| e["type"] != "progress");
    assert_eq!(
        (
            &events.last().unwrap()["type"],
            &events.last().unwrap()["cancelled"]
        ),
        (&json!("failed"), &json!(true))
    );
    assert_eq!(
        f.ok("list_models", json!({}))[1]["variants"][0]["state"]["kind"],
        "partial"
    );

    let (channel, rx) = recorder();
    block_on(download_model(f.core(), tiny::REMOTE.into(), channel)).unwrap();
    let events = until(&rx, |e| e["type"] != "progress");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "finished", "{events:?}");
    let progress = &events[events.len() - 2];
    assert_eq!(progress["done"], progress["total"]);
    assert_eq!(progress["total"], last["bytes"]);

    f.load(Some(tiny::REMOTE));
    let freed = f.ok("delete_model", json!({ "spec": tiny::REMOTE }));
    assert_eq!(freed, last["bytes"]);
    assert_eq!(f.ok("app_info", json!({}))["loaded"], Value::Null);
    let e = f
        .call("delete_model", json!({ "spec": tiny::BUNDLED }))
        .unwrap_err();
    assert!(e.contains("ships with the app"), "{e}");
}
