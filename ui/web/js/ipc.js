// The only module that knows about Tauri: commands by name, and Channels for streams. Tauri
// injects `window.__TAURI__` (app.withGlobalTauri), so no bundler or npm package is needed; the
// UI tests inject a mock with the same shape.

function core() {
  const tauri = window.__TAURI__;
  if (!tauri || !tauri.core) throw new Error("The Tauri IPC is not available (open the app, not the file).");
  return tauri.core;
}

export function invoke(command, args = {}) {
  return core().invoke(command, args);
}

// A Channel whose messages go to `onMessage`, in order.
export function channel(onMessage) {
  const ch = new (core().Channel)();
  ch.onmessage = onMessage;
  return ch;
}
