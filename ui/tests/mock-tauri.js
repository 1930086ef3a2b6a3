// A stand-in for the Tauri IPC, injected before the page's scripts: `window.__TAURI__.core` with
// `invoke` and `Channel`, answering the app's commands like src-tauri/src/lib.rs does (same
// names, argument names, result and event shapes). State lives in sessionStorage so a reload
// sees what was saved, as the real app sees its data directory. Tests steer it via
// `window.__mock` (reply text, speed) and read `window.__mock.calls`.
(() => {
  const KEY = "__pteria_mock_state";
  const defaults = () => ({
    settings: {
      system_prompt: "",
      temperature: 1,
      top_p: 0.95,
      top_k: 64,
      min_p: 0,
      max_tokens: 1024,
      thinking: false,
      device: "auto",
      tables: "auto",
      model: null,
    },
    conversations: {},
    downloaded: [],
    loaded: null,
    nextId: 1,
  });
  const load = () => {
    try {
      return JSON.parse(sessionStorage.getItem(KEY)) || defaults();
    } catch {
      return defaults();
    }
  };
  let db = load();
  const save = () => sessionStorage.setItem(KEY, JSON.stringify(db));
  const id = () => `m${String(db.nextId++).padStart(6, "0")}`;
  const now = () => Date.now();

  const mock = {
    calls: [],
    reply: "Hello! Here is **bold**, `code` and a list:\n\n- one\n- two\n\n```rust\nfn main() {\n    println!(\"hi\");\n}\n```\nDone.",
    chunk: 6, // characters per delta
    every: 25, // ms between deltas
    downloadSteps: 6,
    downloadEvery: 60,
  };
  window.__mock = mock;

  class Channel {
    constructor() {
      this.id = Math.floor(Math.random() * 1e9);
      this.onmessage = () => {};
    }
  }
  const emit = (ch, message) => setTimeout(() => ch.onmessage(message), 0);

  const variant = (model, v, extra) => ({
    spec: `${model}:${v.id}`,
    id: v.id,
    backend: v.backend,
    gpu: v.backend === "vulkan" || v.backend === "mlx",
    quantization: v.quantization,
    bytes: v.bytes,
    platform_default: !!v.default,
    default_reason: v.default ? "this platform's GPU backend" : null,
    fit: { light: v.light, summary: `${v.light}: ${v.bytes} bytes of 8 GB`, total_bytes: v.bytes, available_bytes: 8e9 },
    loaded: db.loaded === `${model}:${v.id}`,
    ...extra,
  });
  const downloads = new Map(); // spec -> { timer, channel, done }
  const gemma = [
    { id: "mlx-int4", backend: "mlx", quantization: "int4", bytes: 2.9e9, light: "yellow" },
    { id: "xnnpack-8da4w", backend: "xnnpack", quantization: "8da4w", bytes: 3.55e9, light: "yellow" },
    { id: "vulkan-8da4w", backend: "vulkan", quantization: "8da4w", bytes: 2.5e9, light: "green", default: true },
  ];
  const models = () => [
    {
      id: "gemma-4-e2b",
      name: "Gemma 4 E2B",
      bundled: false,
      variants: gemma.map((v) => {
        const spec = `gemma-4-e2b:${v.id}`;
        const d = downloads.get(spec);
        const state = d
          ? { kind: "downloading", done: d.done, total: v.bytes }
          : db.downloaded.includes(spec)
            ? { kind: "downloaded" }
            : { kind: "remote" };
        return variant("gemma-4-e2b", v, { state });
      }),
    },
    {
      id: "smollm2-135m-instruct",
      name: "SmolLM2 135M Instruct (bundled demo)",
      bundled: true,
      variants: [
        variant(
          "smollm2-135m-instruct",
          { id: "portable-fp32", backend: "xnnpack", quantization: "8da4w", bytes: 7.9e7, light: "green", default: true },
          { state: { kind: "bundled" } },
        ),
      ],
    },
  ];
  const names = { "smollm2-135m-instruct": "SmolLM2 135M Instruct (bundled demo)", "gemma-4-e2b": "Gemma 4 E2B" };
  const conv = (cid) => {
    const c = db.conversations[cid];
    if (!c) throw `no conversation \`${cid}\``;
    return c;
  };
  const summary = (c) => ({
    id: c.id,
    title: c.title,
    created_at: c.created_at,
    updated_at: c.updated_at,
    message_count: c.messages.length,
    preview: (c.messages.at(-1)?.content || "").slice(0, 80),
  });
  let active = null; // the reply being written: { cancelled }

  function reply(cid, ch) {
    if (!db.loaded) throw "no model is loaded: pick one in the model list first";
    if (active) throw "a reply is being written; stop it or wait for it to finish";
    const assistantId = id();
    const text = mock.reply;
    const run = { cancelled: false };
    active = run;
    const t0 = performance.now();
    let pos = 0;
    emit(ch, { type: "prefill", done: 8, total: 8 });
    const finish = () => {
      active = null;
      const generated = Math.ceil(pos / 4);
      const message = {
        id: assistantId,
        author: "assistant",
        content: text.slice(0, pos),
        created_at: now(),
        stats: {
          model: db.loaded,
          prompt_tokens: 20,
          cached_tokens: 0,
          generated_tokens: generated,
          ttft_ms: 42.5,
          prefill_tokens_per_s: 300,
          decode_tokens_per_s: 37.25,
          stop: run.cancelled ? "cancelled" : "end of turn",
          dropped_messages: 0,
          context_tokens: 2048,
          seed: 7,
        },
        ...(run.cancelled ? { stopped: true } : {}),
      };
      conv(cid).messages.push(message);
      conv(cid).updated_at = now();
      save();
      ch.onmessage({ type: "finished", message, usage: { used_tokens: 20 + generated, context_tokens: 2048 } });
    };
    const step = () => {
      if (run.cancelled || pos >= text.length) return finish();
      const piece = text.slice(pos, pos + mock.chunk);
      pos += piece.length;
      ch.onmessage({ type: "delta", text: piece });
      setTimeout(step, mock.every);
    };
    setTimeout(step, mock.every);
    void t0;
    return { assistantId };
  }

  const commands = {
    app_info: () => ({ version: "0.1.0", data_dir: "/mock", warnings: [], loaded: db.loaded ? loadedModel(db.loaded) : null, replying: !!active }),
    list_models: () => models(),
    get_settings: () => db.settings,
    update_settings: ({ settings }) => {
      if (!(settings.top_p > 0 && settings.top_p <= 1)) throw `settings: sampling: top_p must be in (0, 1], got ${settings.top_p}`;
      if (!(settings.temperature >= 0)) throw `settings: sampling: temperature must be a finite number >= 0, got ${settings.temperature}`;
      if (settings.device === "cpu" && settings.tables === "gpu") throw "settings: embedding tables in GPU memory need the GPU: the device is the CPU";
      db.settings = { ...settings, model: db.settings.model };
      save();
      return db.settings;
    },
    load_model: ({ spec, onEvent }) => {
      const wanted = spec || db.settings.model || "smollm2-135m-instruct:portable-fp32";
      const exact = wanted.includes(":") ? wanted : models().find((m) => m.id === wanted).variants[0].spec;
      emit(onEvent, { type: "loading", spec: exact });
      setTimeout(() => {
        db.loaded = exact;
        db.settings.model = exact;
        save();
        onEvent.onmessage({ type: "loaded", model: loadedModel(exact) });
      }, 30);
      return exact;
    },
    download_model: ({ spec, onEvent }) => {
      if (downloads.has(spec)) throw `\`${spec}\` is already downloading`;
      const total = gemma.find((v) => spec.endsWith(v.id)).bytes;
      const d = { done: 0, channel: onEvent, step: 0 };
      downloads.set(spec, d);
      const tick = () => {
        d.step++;
        d.done = Math.round((total * d.step) / mock.downloadSteps);
        onEvent.onmessage({ type: "progress", spec, file: "model.pte", file_index: 0, file_count: 3, done: d.done, total, bytes_per_sec: 5e7, eta_s: (total - d.done) / 5e7 });
        if (d.step >= mock.downloadSteps) {
          downloads.delete(spec);
          db.downloaded.push(spec);
          save();
          onEvent.onmessage({ type: "finished", spec, bytes: total });
        } else d.timer = setTimeout(tick, mock.downloadEvery);
      };
      d.timer = setTimeout(tick, mock.downloadEvery);
      return null;
    },
    cancel_download: ({ spec }) => {
      const d = downloads.get(spec);
      if (!d) return false;
      clearTimeout(d.timer);
      downloads.delete(spec);
      emit(d.channel, { type: "failed", spec, error: "download cancelled; run it again to resume", cancelled: true });
      return true;
    },
    delete_model: ({ spec }) => {
      if (!db.downloaded.includes(spec)) throw `\`${spec}\` is not downloaded`;
      db.downloaded = db.downloaded.filter((s) => s !== spec);
      if (db.loaded === spec) db.loaded = null;
      save();
      return 1;
    },
    list_conversations: () => Object.values(db.conversations).map(summary).sort((a, b) => b.updated_at - a.updated_at),
    create_conversation: ({ title }) => {
      const c = { id: id(), title: title || "New chat", created_at: now(), updated_at: now(), messages: [] };
      db.conversations[c.id] = c;
      save();
      return c;
    },
    open_conversation: ({ id: cid }) => conv(cid),
    rename_conversation: ({ id: cid, title }) => {
      conv(cid).title = title.trim();
      save();
      return summary(conv(cid));
    },
    delete_conversation: ({ id: cid }) => {
      conv(cid);
      delete db.conversations[cid];
      save();
      return null;
    },
    context_usage: ({ id: cid }) => {
      const s = conv(cid).messages.filter((m) => m.stats).at(-1)?.stats;
      return s ? { used_tokens: s.prompt_tokens + s.generated_tokens, context_tokens: s.context_tokens } : null;
    },
    send_message: ({ conversationId, text, onEvent }) => {
      const c = conv(conversationId);
      if (!text.trim()) throw "the message is empty";
      if (!db.loaded) throw "no model is loaded: pick one in the model list first";
      if (active) throw "a reply is being written; stop it or wait for it to finish";
      const user = { id: id(), author: "user", content: text, created_at: now() };
      if (c.title === "New chat") c.title = text.split("\n")[0].slice(0, 48);
      c.messages.push(user);
      c.updated_at = now();
      save();
      const { assistantId } = reply(conversationId, onEvent);
      return { conversation_id: c.id, user_message: user, assistant_id: assistantId, title: c.title };
    },
    stop_generation: () => {
      if (!active) return false;
      active.cancelled = true;
      return true;
    },
    regenerate: ({ conversationId, onEvent }) => {
      const c = conv(conversationId);
      const last = c.messages.map((m) => m.author).lastIndexOf("user");
      if (last < 0) throw "nothing to regenerate";
      c.messages = c.messages.slice(0, last + 1);
      save();
      const { assistantId } = reply(conversationId, onEvent);
      return { conversation_id: c.id, user_message: null, assistant_id: assistantId, title: c.title };
    },
  };
  function loadedModel(spec) {
    return { spec, name: names[spec.split(":")[0]], context_tokens: 2048, device: "auto", note: null, chat_format: "template", load_ms: 30 };
  }

  async function invoke(cmd, args = {}) {
    mock.calls.push({ cmd, args: JSON.parse(JSON.stringify(args, (k, v) => (v instanceof Channel ? "[channel]" : v))) });
    const handler = commands[cmd];
    if (!handler) throw `command ${cmd} not found`;
    await new Promise((r) => setTimeout(r, 1));
    return handler(args);
  }

  window.__TAURI__ = { core: { invoke, Channel } };
})();
