// The model picker: variants grouped by model with size, backend badge, this device's default,
// memory fit light, and download / progress / cancel / delete / load actions. The core says what
// each variant's state is; this view only shows it and forwards clicks.

import { invoke, channel } from "./ipc.js";
import { bytes, duration, el } from "./format.js";

export class ModelPicker {
  constructor({ list, error, onLoad, onChanged }) {
    this.list = list;
    this.error = error;
    this.onLoad = onLoad;
    this.onChanged = onChanged;
    this.models = [];
    this.progress = new Map(); // spec -> latest Progress event
    this.busy = null; // spec of the model loading
    this.listFailed = false; // whether the error shown is the listing's own
  }

  // A refresh clears only its own failure: a failed download's or delete's message stays until
  // the user acts again (a refresh follows each of them).
  async refresh() {
    try {
      this.models = await invoke("list_models");
      if (this.listFailed) this.showError(null);
    } catch (e) {
      this.showError(`Could not list the models: ${e}`);
      this.listFailed = true;
    }
    this.render();
  }

  showError(text) {
    this.listFailed = false;
    this.error.hidden = !text;
    this.error.textContent = text || "";
  }

  async download(spec) {
    this.showError(null);
    this.progress.set(spec, { done: 0, total: 0, bytes_per_sec: 0 });
    this.render();
    const onEvent = channel((e) => {
      if (e.type === "progress") {
        this.progress.set(spec, e);
        this.renderProgress(spec);
        return;
      }
      this.progress.delete(spec);
      if (e.type === "failed" && !e.cancelled) {
        this.showError(`Download of ${spec} failed: ${e.error}. Check the connection and try again; it resumes where it stopped.`);
      }
      this.refresh();
      this.onChanged?.();
    });
    try {
      await invoke("download_model", { spec, onEvent });
    } catch (e) {
      this.progress.delete(spec);
      this.showError(`Could not start the download: ${e}`);
      this.render();
    }
  }

  async cancel(spec) {
    try {
      await invoke("cancel_download", { spec });
    } catch (e) {
      this.showError(`Could not cancel the download of ${spec}: ${e}`);
    }
  }

  async remove(spec) {
    this.showError(null);
    try {
      await invoke("delete_model", { spec });
      this.showError(null);
    } catch (e) {
      this.showError(`Could not delete ${spec}: ${e}`);
    }
    await this.refresh();
    this.onChanged?.();
  }

  renderProgress(spec) {
    const row = this.list.querySelector(`[data-spec="${CSS.escape(spec)}"]`);
    const p = this.progress.get(spec);
    if (!row || !p) return;
    const bar = row.querySelector("progress");
    const label = row.querySelector(".progress-text");
    if (bar && p.total) {
      bar.max = p.total;
      bar.value = p.done;
    }
    if (label) {
      const speed = p.bytes_per_sec ? ` · ${bytes(p.bytes_per_sec)}/s` : "";
      const eta = p.eta_s != null ? ` · ${duration(p.eta_s)} left` : "";
      label.textContent = `${bytes(p.done)} of ${bytes(p.total)}${speed}${eta}`;
    }
  }

  render() {
    this.list.replaceChildren(...this.models.map((m) => this.renderModel(m)));
    for (const spec of this.progress.keys()) this.renderProgress(spec);
  }

  renderModel(model) {
    return el(
      "section",
      { class: "model", dataset: { model: model.id } },
      el("h3", { text: model.name }, model.bundled ? el("span", { class: "badge offline", text: "offline" }) : null),
      el("ul", { class: "variants" }, model.variants.map((v) => this.renderVariant(v))),
    );
  }

  renderVariant(v) {
    const downloading = this.progress.has(v.spec) || v.state.kind === "downloading";
    const actions = [];
    const state = v.state.kind;
    if (downloading) {
      actions.push(
        el("progress", { max: 1, value: 0 }),
        el("span", { class: "progress-text", text: "starting…" }),
        el("button", { type: "button", class: "cancel", text: "Cancel", onclick: () => this.cancel(v.spec) }),
      );
    } else if (state === "remote" || state === "partial") {
      const label = state === "partial" ? `Resume (${bytes(v.state.bytes)} done)` : "Download";
      actions.push(el("button", { type: "button", class: "download", text: label, onclick: () => this.download(v.spec) }));
    }
    if (!downloading && (state === "bundled" || state === "downloaded")) {
      actions.push(
        v.loaded
          ? el("span", { class: "badge loaded", text: "loaded" })
          : el("button", {
              type: "button",
              class: "load primary",
              text: this.busy === v.spec ? "Loading…" : "Load",
              disabled: this.busy != null,
              onclick: () => this.onLoad(v.spec),
            }),
      );
    }
    if (!downloading && (state === "downloaded" || state === "partial")) {
      actions.push(el("button", { type: "button", class: "delete", text: "Delete", onclick: () => this.remove(v.spec) }));
    }
    if (state === "bundled_missing") {
      actions.push(el("span", { class: "muted", text: "missing from this build" }));
    }
    return el(
      "li",
      { class: "variant", dataset: { spec: v.spec, state } },
      el("span", { class: `fit ${v.fit.light}`, title: `Memory fit: ${v.fit.summary}`, "aria-label": `fit ${v.fit.light}` }),
      el("span", { class: "variant-id", text: v.id }),
      el("span", { class: `badge backend ${v.gpu ? "gpu" : "cpu"}`, text: `${v.backend} · ${v.gpu ? "GPU" : "CPU"}` }),
      el("span", { class: "quant", text: v.quantization }),
      el("span", { class: "size", text: bytes(v.bytes) }),
      v.platform_default ? el("span", { class: "badge default", text: "default here", title: v.default_reason || "" }) : null,
      el("span", { class: "actions" }, actions),
    );
  }
}
