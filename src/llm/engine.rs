//! The engine handle shells hold: a worker thread owns the loaded model (one at a time) and runs
//! requests in order, so no UI thread ever blocks on a forward call. `Engine` is `Send + Sync`;
//! generations stream `Event`s through a channel (`Generation`) or a callback.

use super::model::{Completion, Event, GenerateOptions, LoadOptions, Model, ModelFiles, ModelInfo};
use super::template::Message;
use super::{CancelToken, LlmError, Result};
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::thread::JoinHandle;

type Sink = Box<dyn FnMut(Event) + Send>;

enum Command {
    Load {
        files: Box<ModelFiles>,
        options: LoadOptions,
        reply: mpsc::Sender<Result<ModelInfo>>,
    },
    Unload {
        reply: mpsc::Sender<()>,
    },
    Reset {
        reply: mpsc::Sender<Result<()>>,
    },
    Chat {
        messages: Vec<Message>,
        options: GenerateOptions,
        cancel: CancelToken,
        sink: Sink,
    },
}

pub struct Engine {
    tx: Option<mpsc::Sender<Command>>,
    worker: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the worker thread; no model is loaded yet.
    pub fn new() -> Result<Engine> {
        let (tx, rx) = mpsc::channel::<Command>();
        let worker = std::thread::Builder::new()
            .name("pteria-engine".into())
            .spawn(move || worker(rx))
            .map_err(|source| LlmError::Io {
                path: "(engine thread)".into(),
                source,
            })?;
        Ok(Engine {
            tx: Some(tx),
            worker: Some(worker),
        })
    }

    fn send(&self, cmd: Command) -> Result<()> {
        self.tx
            .as_ref()
            .ok_or(LlmError::EngineStopped)?
            .send(cmd)
            .map_err(|_| LlmError::EngineStopped)
    }

    /// Loads a model, replacing the current one. The current model is freed before the new one
    /// loads (two models rarely fit in a phone's memory), so a failed load leaves none loaded.
    /// Blocks until loaded; queued generations run first.
    pub fn load(&self, files: ModelFiles, options: LoadOptions) -> Result<ModelInfo> {
        let (reply, rx) = mpsc::channel();
        self.send(Command::Load {
            files: Box::new(files),
            options,
            reply,
        })?;
        rx.recv().map_err(|_| LlmError::EngineStopped)?
    }

    /// Frees the loaded model, if any.
    pub fn unload(&self) -> Result<()> {
        let (reply, rx) = mpsc::channel();
        self.send(Command::Unload { reply })?;
        rx.recv().map_err(|_| LlmError::EngineStopped)
    }

    /// Forgets the KV cache (the next prompt is prefilled in full).
    pub fn reset(&self) -> Result<()> {
        let (reply, rx) = mpsc::channel();
        self.send(Command::Reset { reply })?;
        rx.recv().map_err(|_| LlmError::EngineStopped)?
    }

    /// Queues a reply to `messages`; events arrive on the returned handle.
    pub fn chat(&self, messages: Vec<Message>, options: GenerateOptions) -> Result<Generation> {
        let (tx, events) = mpsc::channel();
        let cancel = self.chat_with(messages, options, move |e| {
            // The receiver may have been dropped (the caller lost interest): nothing to do.
            let _ = tx.send(e);
        })?;
        Ok(Generation { events, cancel })
    }

    /// Queues a reply to `messages`, calling `on_event` on the worker thread for each event.
    pub fn chat_with(
        &self,
        messages: Vec<Message>,
        options: GenerateOptions,
        on_event: impl FnMut(Event) + Send + 'static,
    ) -> Result<CancelToken> {
        let cancel = CancelToken::new();
        self.send(Command::Chat {
            messages,
            options,
            cancel: cancel.clone(),
            sink: Box::new(on_event),
        })?;
        Ok(cancel)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the channel ends the worker after the request in progress.
        self.tx = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn worker(rx: mpsc::Receiver<Command>) {
    let mut model: Option<Model> = None;
    while let Ok(cmd) = rx.recv() {
        match cmd {
            Command::Load {
                files,
                options,
                reply,
            } => {
                model = None;
                let info = match guarded(|| Model::load(*files, &options)) {
                    Ok(m) => {
                        let info = m.info();
                        model = Some(m);
                        Ok(info)
                    }
                    Err(e) => Err(e),
                };
                let _ = reply.send(info);
            }
            Command::Unload { reply } => {
                model = None;
                let _ = reply.send(());
            }
            Command::Reset { reply } => {
                let r = match model.as_mut() {
                    Some(m) => guarded(|| m.reset()),
                    None => Ok(()),
                };
                let _ = reply.send(r);
            }
            Command::Chat {
                messages,
                options,
                cancel,
                mut sink,
            } => {
                let Some(m) = model.as_mut() else {
                    sink(Event::Failed(LlmError::NoModel));
                    continue;
                };
                let result = guarded(|| m.chat(&messages, &options, &cancel, &mut sink));
                match result {
                    Ok(c) => sink(Event::Finished(c)),
                    Err(e) => {
                        if e.unloads_model() {
                            // A kernel panicked mid-call: the model's state is unknown.
                            model = None;
                        }
                        sink(Event::Failed(e));
                    }
                }
            }
        }
    }
}

/// Runs `f`, turning a panic (a bug in a kernel, not bad input) into an error so one bad request
/// does not take the engine down.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(LlmError::Internal(format!(
            "{}; the model was unloaded",
            super::panic_text(&*p)
        ))),
    }
}

/// A queued or running reply.
pub struct Generation {
    events: mpsc::Receiver<Event>,
    cancel: CancelToken,
}

impl Generation {
    /// Stops the reply at the next chunk or token boundary; `Finished` still arrives, with
    /// stop reason `Cancelled`.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    /// The next event; `None` once the final event has been taken.
    pub fn recv(&self) -> Option<Event> {
        self.events.recv().ok()
    }

    /// The raw channel, for `select`-style loops.
    pub fn events(&self) -> &mpsc::Receiver<Event> {
        &self.events
    }

    /// Blocks until the reply finishes, passing each text delta to `on_text`.
    pub fn wait(self, mut on_text: impl FnMut(&str)) -> Result<Completion> {
        while let Some(e) = self.recv() {
            match e {
                Event::Text(t) => on_text(&t),
                Event::Prefill { .. } => {}
                Event::Finished(c) => return Ok(c),
                Event::Failed(e) => return Err(e),
            }
        }
        Err(LlmError::EngineStopped)
    }
}

const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Engine>();
};
