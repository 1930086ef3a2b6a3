// The app: conversation list, chat (streaming, stop, regenerate, copy, stats, context use),
// settings and the model picker, over the commands in src-tauri/src/lib.rs. Everything long
// (loading, downloads, replies) arrives through Channels, so the page never waits on it.

import { invoke, channel } from "./ipc.js";
import { renderMarkdown } from "./markdown.js";
import { ModelPicker } from "./models.js";
import { el, replyStats } from "./format.js";

const $ = (id) => document.getElementById(id);

const state = {
  conversations: [],
  current: null, // the open Conversation
  loaded: null, // LoadedModel
  loading: null, // spec being loaded
  replying: false,
  // The reply being written: its conversation's id and its pending node, which keeps streaming
  // while another conversation is open and is shown again when its own is.
  reply: null,
  settings: null,
};

// ---------------------------------------------------------------------------------------------
// Errors and status

function banner(text) {
  const b = $("banner");
  b.hidden = !text;
  b.textContent = text || "";
}

function showModelStatus() {
  const s = $("model-status");
  if (state.loading) s.textContent = `Loading ${state.loading}…`;
  else if (state.loaded) s.textContent = state.loaded.name + (state.loaded.note ? ` (${state.loaded.note})` : "");
  else s.textContent = "No model loaded";
  s.title = state.loaded ? `${state.loaded.spec}, ${state.loaded.context_tokens} tokens of context` : "";
}

function showContext(usage) {
  const meter = $("context-meter");
  const text = $("context-text");
  if (!usage) {
    meter.value = 0;
    text.textContent = "";
    return;
  }
  meter.value = usage.used_tokens / Math.max(1, usage.context_tokens);
  text.textContent = `${usage.used_tokens} / ${usage.context_tokens}`;
}

function setReplying(on) {
  state.replying = on;
  $("send").hidden = on;
  $("stop").hidden = !on;
  for (const b of document.querySelectorAll(".regenerate")) b.disabled = on;
}

// ---------------------------------------------------------------------------------------------
// Conversations

async function refreshConversations() {
  state.conversations = await invoke("list_conversations");
  const list = $("conversations");
  list.replaceChildren(
    ...state.conversations.map((c) =>
      el(
        "li",
        { class: state.current?.id === c.id ? "active" : "", dataset: { id: c.id } },
        el("button", { type: "button", class: "open", text: c.title, title: c.preview, onclick: () => openConversation(c.id) }),
        el("button", { type: "button", class: "rename", text: "✎", "aria-label": "Rename", onclick: () => renameConversation(c) }),
        el("button", { type: "button", class: "delete", text: "🗑", "aria-label": "Delete", onclick: () => deleteConversation(c) }),
      ),
    ),
  );
}

async function openConversation(id) {
  try {
    state.current = await invoke("open_conversation", { id });
    renderConversation();
    showContext(await invoke("context_usage", { id }));
    banner(null);
  } catch (e) {
    banner(`Could not open the conversation: ${e}`);
  }
  await refreshConversations();
  document.body.classList.remove("sidebar-open");
}

function newConversation() {
  state.current = null;
  renderConversation();
  showContext(null);
  refreshConversations();
  $("input").focus();
}

// Asks in the page: WKWebView (macOS, iOS) shows nothing for window.prompt / confirm, whose
// answers are then null and false. Resolves to the text typed (`value` given), true, or null.
function ask({ title, text = "", value = null, ok }) {
  const dialog = $("ask-dialog");
  $("ask-title").textContent = title;
  $("ask-text").textContent = text;
  $("ask-text").hidden = !text;
  const input = $("ask-input");
  input.hidden = value == null;
  input.value = value ?? "";
  $("ask-ok").textContent = ok;
  dialog.returnValue = "";
  dialog.showModal();
  if (value != null) input.select();
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue !== "ok" ? null : value == null ? true : input.value),
      { once: true },
    );
  });
}

async function renameConversation(c) {
  const title = await ask({ title: "Rename the conversation", value: c.title, ok: "Rename" });
  if (title == null || !title.trim()) return;
  try {
    await invoke("rename_conversation", { id: c.id, title });
    if (state.current?.id === c.id) {
      state.current.title = title.trim();
      $("chat-title").textContent = state.current.title;
    }
  } catch (e) {
    banner(`Could not rename: ${e}`);
  }
  await refreshConversations();
}

async function deleteConversation(c) {
  if (!(await ask({ title: `Delete “${c.title}”?`, text: "Its messages cannot be restored.", ok: "Delete" }))) return;
  try {
    await invoke("delete_conversation", { id: c.id });
    if (state.current?.id === c.id) newConversation();
  } catch (e) {
    banner(`Could not delete: ${e}`);
  }
  await refreshConversations();
}

// ---------------------------------------------------------------------------------------------
// Messages

function messageNode(m) {
  const body = el("div", { class: "body" });
  const node = el("article", { class: `message ${m.author}`, dataset: { id: m.id } }, body);
  fillMessage(node, m);
  return node;
}

// (Re)draws a message: markdown for replies, plain text for the user's, stats, actions.
function fillMessage(node, m) {
  const body = node.querySelector(".body");
  if (m.author === "assistant") body.innerHTML = renderMarkdown(m.content);
  else body.textContent = m.content;
  node.querySelector(".meta")?.remove();
  node.classList.toggle("failed", !!m.error);
  if (m.author !== "assistant" || m.pending) return;
  const meta = el("div", { class: "meta" });
  if (m.error) meta.append(el("div", { class: "error", role: "alert", text: errorAdvice(m.error) }));
  if (m.stopped) meta.append(el("span", { class: "stopped", text: "stopped" }));
  if (m.stats) meta.append(el("span", { class: "stats", text: replyStats(m.stats) }));
  meta.append(
    el("button", { type: "button", class: "copy", text: "Copy", onclick: () => copy(m.content, node.querySelector(".copy")) }),
    el("button", { type: "button", class: "regenerate", text: "Regenerate", disabled: state.replying, onclick: regenerate }),
  );
  node.append(meta);
}

function errorAdvice(error) {
  if (/no model is loaded/i.test(error)) return `${error}`;
  if (/context/i.test(error)) return `${error}. Start a new chat or shorten the message.`;
  return `${error}. Try Regenerate, or load another model.`;
}

function renderConversation() {
  const c = state.current;
  $("chat-title").textContent = c ? c.title : "New chat";
  const box = $("messages");
  box.replaceChildren(...(c ? c.messages.map(messageNode) : []));
  if (c && state.reply?.conversationId === c.id) box.append(state.reply.node);
  if (!c || !box.children.length) {
    box.append(el("p", { class: "empty", text: state.loaded ? "Ask anything." : "Load a model to start (Models)." }));
  }
  // Only the last reply can be regenerated.
  const regens = box.querySelectorAll(".regenerate");
  regens.forEach((b, i) => (b.hidden = i !== regens.length - 1));
  box.scrollTop = box.scrollHeight;
}

async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = el("textarea", { class: "offscreen" });
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  if (button) {
    button.textContent = "Copied";
    setTimeout(() => (button.textContent = "Copy"), 1200);
  }
}

// Streams one reply of conversation `conversationId` into a pending message node; markdown is
// redrawn at most once a frame. Another conversation may be open by the time it ends.
function streamInto(node, conversationId) {
  let text = "";
  let scheduled = false;
  const box = $("messages");
  return channel((e) => {
    if (e.type === "delta") {
      text += e.text;
      if (!scheduled) {
        scheduled = true;
        requestAnimationFrame(() => {
          scheduled = false;
          node.querySelector(".body").innerHTML = renderMarkdown(text);
          box.scrollTop = box.scrollHeight;
        });
      }
    } else if (e.type === "prefill") {
      node.querySelector(".body").dataset.prefill = `${e.done}/${e.total}`;
    } else if (e.type === "finished" || e.type === "failed") {
      // A reply that could not be saved comes with the error beside its message.
      const message = e.type === "failed" ? { ...e.message, error: e.message.error || e.error } : e.message;
      node.classList.remove("pending");
      fillMessage(node, message);
      state.reply = null;
      setReplying(false);
      if (state.current?.id !== conversationId) {
        refreshConversations();
        return;
      }
      if (e.usage) showContext(e.usage);
      reloadCurrent(message);
    }
  });
}

// The saved conversation is the truth once a reply is done; a reply the store does not hold
// (its save failed) stays on screen with its error.
async function reloadCurrent(reply = null) {
  if (state.current) {
    try {
      state.current = await invoke("open_conversation", { id: state.current.id });
      if (reply && !state.current.messages.some((m) => m.id === reply.id)) state.current.messages.push(reply);
    } catch (e) {
      banner(`${e}`);
    }
  }
  renderConversation();
  await refreshConversations();
}

// Puts text that was not sent back in the composer, before anything typed since.
function restoreInput(text) {
  const input = $("input");
  input.value = input.value ? `${text}\n${input.value}` : text;
}

async function send(text) {
  if (!text.trim() || state.replying) return;
  banner(null);
  // Replying from here on, so that a second Enter while the conversation is created is no
  // second send; the composer is free for the next message at once.
  setReplying(true);
  $("input").value = "";
  try {
    if (!state.current) state.current = await invoke("create_conversation", { title: null });
  } catch (e) {
    setReplying(false);
    restoreInput(text);
    banner(`Could not start a conversation: ${e}`);
    return;
  }
  const box = $("messages");
  box.querySelector(".empty")?.remove();
  const userNode = messageNode({ id: "pending-user", author: "user", content: text });
  const replyNode = messageNode({ id: "pending", author: "assistant", content: "", pending: true });
  replyNode.classList.add("pending");
  box.append(userNode, replyNode);
  box.scrollTop = box.scrollHeight;
  const conversation = state.current;
  state.reply = { conversationId: conversation.id, node: replyNode };
  try {
    const started = await invoke("send_message", {
      conversationId: conversation.id,
      text,
      onEvent: streamInto(replyNode, conversation.id),
    });
    conversation.title = started.title;
    if (state.current === conversation) $("chat-title").textContent = started.title;
    userNode.dataset.id = started.user_message.id;
    replyNode.dataset.id = started.assistant_id;
    refreshConversations();
  } catch (e) {
    state.reply = null;
    setReplying(false);
    userNode.remove();
    replyNode.remove();
    restoreInput(text);
    banner(`${e}`);
  }
}

async function regenerate() {
  if (!state.current || state.replying) return;
  banner(null);
  const c = state.current;
  const lastUser = c.messages.map((m) => m.author).lastIndexOf("user");
  const replyNode = messageNode({ id: "pending", author: "assistant", content: "", pending: true });
  replyNode.classList.add("pending");
  c.messages = c.messages.slice(0, lastUser + 1);
  state.reply = { conversationId: c.id, node: replyNode };
  renderConversation();
  setReplying(true);
  try {
    const started = await invoke("regenerate", { conversationId: c.id, onEvent: streamInto(replyNode, c.id) });
    replyNode.dataset.id = started.assistant_id;
  } catch (e) {
    state.reply = null;
    setReplying(false);
    banner(`${e}`);
    reloadCurrent();
  }
}

// ---------------------------------------------------------------------------------------------
// Models

const picker = new ModelPicker({
  list: $("models-list"),
  error: $("models-error"),
  onLoad: (spec) => loadModel(spec),
  onChanged: () => refreshLoaded(),
});

// Deleting the loaded model unloads it in the core: the header and the empty chat follow.
async function refreshLoaded() {
  try {
    const info = await invoke("app_info");
    if (state.loading) return;
    state.loaded = info.loaded;
  } catch (e) {
    banner(`${e}`);
    return;
  }
  showModelStatus();
  renderConversation();
}

async function loadModel(spec) {
  state.loading = spec || "the last model";
  picker.busy = spec;
  picker.render();
  showModelStatus();
  const onEvent = channel((e) => {
    if (e.type === "loaded") {
      state.loaded = e.model;
      state.loading = null;
      banner(null);
    } else if (e.type === "failed") {
      state.loaded = null;
      state.loading = null;
      banner(`Could not load ${e.spec}: ${e.error}. Pick another model in Models.`);
    } else {
      state.loading = e.spec;
    }
    if (e.type !== "loading") {
      picker.busy = null;
      picker.refresh();
      renderConversation();
    }
    showModelStatus();
  });
  try {
    await invoke("load_model", { spec: spec ?? null, onEvent });
  } catch (e) {
    state.loading = null;
    picker.busy = null;
    picker.render();
    showModelStatus();
    banner(`${e}`);
  }
}

// ---------------------------------------------------------------------------------------------
// Settings

function fillSettings(s) {
  const f = $("settings-form");
  f.system_prompt.value = s.system_prompt;
  f.temperature.value = s.temperature;
  f.top_p.value = s.top_p;
  f.top_k.value = s.top_k;
  f.min_p.value = s.min_p;
  f.max_tokens.value = s.max_tokens ?? "";
  f.device.value = s.device;
  f.tables.value = s.tables;
  f.thinking.checked = s.thinking;
}

async function saveSettings(event) {
  event.preventDefault();
  const f = $("settings-form");
  const error = $("settings-error");
  const refuse = (text) => {
    error.hidden = false;
    error.textContent = text;
    $("settings-saved").textContent = "";
  };
  // A number field's value: an empty field is "" (Number("") is 0) and so is one the browser
  // cannot read (validity.badInput), so both are refused, as is a value past the field's range.
  const num = (input, label) => {
    const v = Number(input.value);
    const min = input.min === "" ? -Infinity : Number(input.min);
    const max = input.max === "" ? Infinity : Number(input.max);
    if (input.validity.badInput || input.value.trim() === "" || !Number.isFinite(v)) {
      throw `${label} needs a number`;
    }
    if (v < min || v > max) throw `${label} must be between ${input.min || "-∞"} and ${input.max || "∞"}, not ${v}`;
    return v;
  };
  let wanted;
  try {
    wanted = {
      ...state.settings,
      system_prompt: f.system_prompt.value,
      temperature: num(f.temperature, "Temperature"),
      top_p: num(f.top_p, "Top-p"),
      top_k: Math.round(num(f.top_k, "Top-k")),
      min_p: num(f.min_p, "Min-p"),
      // Empty means no limit.
      max_tokens: f.max_tokens.value === "" && !f.max_tokens.validity.badInput ? null : Math.round(num(f.max_tokens, "Max tokens")),
      device: f.device.value,
      tables: f.tables.value,
      thinking: f.thinking.checked,
    };
  } catch (e) {
    refuse(`${e}`);
    return;
  }
  try {
    state.settings = await invoke("update_settings", { settings: wanted });
    fillSettings(state.settings);
    error.hidden = true;
    $("settings-saved").textContent = "Saved";
  } catch (e) {
    refuse(`${e}`);
  }
}

// ---------------------------------------------------------------------------------------------
// Wiring

function wire() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send($("input").value);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send($("input").value);
    }
  });
  $("stop").addEventListener("click", () => invoke("stop_generation"));
  $("new-chat").addEventListener("click", newConversation);
  $("toggle-sidebar").addEventListener("click", () => document.body.classList.toggle("sidebar-open"));
  $("open-models").addEventListener("click", () => {
    $("models-dialog").showModal();
    picker.refresh();
  });
  $("open-settings").addEventListener("click", () => {
    fillSettings(state.settings);
    $("settings-saved").textContent = "";
    $("settings-error").hidden = true;
    $("settings-dialog").showModal();
  });
  $("settings-form").addEventListener("submit", saveSettings);
  for (const b of document.querySelectorAll("[data-close]")) {
    b.addEventListener("click", () => $(b.dataset.close).close());
  }
  // Code-block copy buttons and links inside rendered replies (written by markdown.js).
  $("messages").addEventListener("click", (e) => {
    const button = e.target.closest(".copy-code");
    if (button) copy(button.closest(".code").querySelector("code").textContent, button);
    const link = e.target.closest("a.ext");
    if (link) {
      // External pages never open inside the app's webview: the address is copied instead.
      e.preventDefault();
      copy(link.getAttribute("href"));
      banner(`Link copied: ${link.getAttribute("href")}`);
    }
  });
}

async function start() {
  wire();
  try {
    const info = await invoke("app_info");
    state.settings = await invoke("get_settings");
    state.loaded = info.loaded;
    if (info.warnings.length) banner(info.warnings.join("\n"));
    await refreshConversations();
    if (state.conversations.length) await openConversation(state.conversations[0].id);
    else renderConversation();
    showModelStatus();
    // The last model (or the bundled demo) loads at once, so the app is ready to chat.
    if (!state.loaded) loadModel(state.settings.model ?? null);
  } catch (e) {
    banner(`Pteria could not start: ${e}`);
  }
  document.body.dataset.ready = "true";
}

start();
