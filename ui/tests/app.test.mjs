// The real ui/web files in headless Chromium, with the Tauri IPC replaced by mock-tauri.js.
// Pages are served over HTTP with the CSP from src-tauri/tauri.conf.json, so the UI is tested
// under the policy the app enforces (the sanitiser test turns it off to test the sanitiser
// alone). Run: node --test (ui/tests), after npm ci; Chromium from Debian's `chromium`.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../web");
const conf = JSON.parse(fs.readFileSync(path.resolve(here, "../../src-tauri/tauri.conf.json"), "utf8"));
const csp = Object.entries(conf.app.security.csp)
  .map(([k, v]) => `${k} ${v}`)
  .join("; ");
const types = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png" };

let server;
let base;
let browser;

before(async () => {
  server = http.createServer((req, res) => {
    const url = new URL(req.url, "http://localhost");
    const rel = url.pathname === "/" ? "index.html" : decodeURIComponent(url.pathname.slice(1));
    const file = path.resolve(root, rel);
    if (!file.startsWith(root) || !fs.existsSync(file) || fs.statSync(file).isDirectory()) {
      res.writeHead(404).end();
      return;
    }
    const headers = { "content-type": types[path.extname(file)] || "application/octet-stream" };
    if (!url.searchParams.has("nocsp")) headers["content-security-policy"] = csp;
    res.writeHead(200, headers);
    fs.createReadStream(file).pipe(res);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${server.address().port}/`;
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--no-first-run",
    ],
  });
});

after(async () => {
  await browser?.close();
  server?.close();
});

// A fresh page on the app with the mock IPC; `errors` collects page errors and CSP violations.
async function open({ query = "" } = {}) {
  const context = await browser.newContext();
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(`console: ${m.text()}`);
  });
  await page.addInitScript({ path: path.join(here, "mock-tauri.js") });
  await page.goto(base + query);
  await page.waitForSelector("body[data-ready=true]");
  return { page, context, errors };
}

const calls = (page, cmd) => page.evaluate((c) => window.__mock.calls.filter((x) => x.cmd === c), cmd);

async function waitModelLoaded(page) {
  await page.waitForFunction(() => /SmolLM2/.test(document.getElementById("model-status").textContent));
}

test("the bundled demo loads at start and a model is picked from grouped variants", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.click("#open-models");
  await page.waitForSelector(".model[data-model=gemma-4-e2b] .variant");
  const groups = await page.$$eval(".model h3", (hs) => hs.map((h) => h.textContent));
  assert.equal(groups.length, 2);
  assert.match(groups[0], /Gemma 4 E2B/);
  const rows = await page.$$eval(".model[data-model=gemma-4-e2b] .variant", (rs) =>
    rs.map((r) => ({
      spec: r.dataset.spec,
      badge: r.querySelector(".backend").textContent,
      size: r.querySelector(".size").textContent,
      fit: r.querySelector(".fit").className,
      fitTitle: r.querySelector(".fit").title,
      isDefault: !!r.querySelector(".default"),
    })),
  );
  assert.deepEqual(
    rows.map((r) => [r.spec, r.badge, r.size, r.isDefault]),
    [
      ["gemma-4-e2b:mlx-int4", "mlx · GPU", "2.9 GB", false],
      ["gemma-4-e2b:xnnpack-8da4w", "xnnpack · CPU", "3.5 GB", false],
      ["gemma-4-e2b:vulkan-8da4w", "vulkan · GPU", "2.5 GB", true],
    ],
  );
  assert.equal(rows[2].fit, "fit green");
  assert.match(rows[2].fitTitle, /Memory fit: green/);
  // The bundled demo is marked offline and loaded.
  const demo = page.locator(".model[data-model=smollm2-135m-instruct]");
  assert.equal(await demo.locator(".badge.offline").count(), 1);
  assert.equal(await demo.locator(".badge.loaded").count(), 1);
  assert.deepEqual(await calls(page, "load_model"), [{ cmd: "load_model", args: { spec: null, onEvent: "[channel]" } }]);
  assert.deepEqual(errors, []);
  await context.close();
});

test("a download shows progress, can be cancelled, finishes, loads and is deleted", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.evaluate(() => {
    window.__mock.downloadSteps = 8;
    window.__mock.downloadEvery = 120;
  });
  await page.click("#open-models");
  const row = page.locator('[data-spec="gemma-4-e2b:vulkan-8da4w"]');
  await row.locator("button.download").click();
  // Progress moves: the bar's value and the text grow before the end.
  await page.waitForFunction(() => {
    const bar = document.querySelector('[data-spec="gemma-4-e2b:vulkan-8da4w"] progress');
    return bar && bar.value > 0 && bar.value < bar.max;
  });
  const text = await row.locator(".progress-text").textContent();
  assert.match(text, /^\d+ MB of 2\.5 GB · 50\.0 MB\/s · \d+ s left$/);
  // Cancel another download midway.
  const other = page.locator('[data-spec="gemma-4-e2b:mlx-int4"]');
  await other.locator("button.download").click();
  await other.locator("progress").waitFor();
  await other.locator("button.cancel").click();
  await other.locator("button.download").waitFor();
  assert.equal((await calls(page, "cancel_download")).length, 1);
  // The first one finishes: Load and Delete replace the progress.
  await row.locator("button.load").waitFor({ timeout: 10000 });
  await row.locator("button.load").click();
  await page.waitForFunction(() => /Gemma 4 E2B/.test(document.getElementById("model-status").textContent));
  await row.locator(".badge.loaded").waitFor();
  await row.locator("button.delete").click();
  await row.locator("button.download").waitFor();
  assert.deepEqual(
    (await calls(page, "delete_model")).map((c) => c.args.spec),
    ["gemma-4-e2b:vulkan-8da4w"],
  );
  assert.deepEqual(errors, []);
  await context.close();
});

test("a reply streams as markdown with code blocks, stats and context use, and is restored", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.evaluate(() => (window.__mock.every = 40));
  await page.fill("#input", "Show me some Rust");
  await page.press("#input", "Enter");
  await page.waitForSelector(".message.user");
  // Mid-stream: some text, not all, and Stop offered instead of Send.
  await page.waitForFunction(() => {
    const body = document.querySelector(".message.assistant.pending .body");
    return body && body.textContent.length > 0;
  });
  assert.equal(await page.isVisible("#stop"), true);
  assert.equal(await page.isVisible("#send"), false);
  await page.waitForSelector(".message.assistant .stats");
  const reply = page.locator(".message.assistant").last();
  assert.equal(await reply.locator("strong").textContent(), "bold");
  assert.equal(await reply.locator(".code .lang").textContent(), "rust");
  assert.match(await reply.locator("pre code").textContent(), /fn main\(\) \{\n {4}println!\("hi"\);\n\}/);
  assert.equal(await reply.locator("li").count(), 2);
  // The mock counts a token per 4 characters, after a 20-token prompt.
  const tokens = await page.evaluate(() => Math.ceil(window.__mock.reply.length / 4));
  assert.equal(await reply.locator(".stats").textContent(), `TTFT 43 ms · 37.3 tok/s · ${tokens} tokens`);
  assert.equal(await page.textContent("#context-text"), `${20 + tokens} / 2048`);
  assert.equal(await page.textContent("#chat-title"), "Show me some Rust");
  assert.equal(await page.isVisible("#send"), true);
  // The conversation is listed and comes back after a reload.
  await page.reload();
  await page.waitForSelector("body[data-ready=true]");
  await page.waitForSelector(".message.assistant .stats");
  assert.equal(await page.locator("#conversations li").count(), 1);
  assert.equal(await page.locator("#conversations li.active .open").textContent(), "Show me some Rust");
  assert.equal(await page.locator(".message").count(), 2);
  // Regenerate writes the last reply again.
  await page.click(".message.assistant .regenerate");
  await page.waitForSelector(".message.assistant.pending");
  await page.waitForSelector(".message.assistant:not(.pending) .stats");
  assert.equal((await calls(page, "regenerate")).length, 1);
  assert.equal(await page.locator(".message").count(), 2);
  assert.deepEqual(errors, []);
  await context.close();
});

test("stop ends the reply where it is and keeps what was written", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.evaluate(() => {
    window.__mock.every = 100;
    window.__mock.chunk = 2;
  });
  await page.fill("#input", "Tell me a long story");
  await page.click("#send");
  await page.waitForFunction(() => (document.querySelector(".message.assistant.pending .body")?.textContent.length ?? 0) >= 4);
  await page.click("#stop");
  await page.waitForSelector(".message.assistant .stopped");
  const shown = await page.locator(".message.assistant .body").textContent();
  const full = await page.evaluate(() => window.__mock.reply);
  assert.ok(shown.length > 0 && shown.length < 40, `shown: ${JSON.stringify(shown)}`);
  assert.ok(full.startsWith(shown.slice(0, 4)));
  assert.equal((await calls(page, "stop_generation")).length, 1);
  assert.equal(await page.isVisible("#send"), true);
  assert.equal(await page.isVisible("#stop"), false);
  assert.deepEqual(errors, []);
  await context.close();
});

test("settings are saved, survive a reload, and bad values are explained", async () => {
  const { page, context, errors } = await open();
  await page.click("#open-settings");
  await page.fill("[name=system_prompt]", "You are terse.");
  await page.fill("[name=temperature]", "0.3");
  await page.fill("[name=top_k]", "12");
  await page.fill("[name=max_tokens]", "");
  await page.check("[name=thinking]");
  await page.selectOption("[name=device]", "cpu");
  await page.selectOption("[name=tables]", "host");
  await page.click("#settings-form button[type=submit]");
  await page.waitForFunction(() => document.getElementById("settings-saved").textContent === "Saved");
  const saved = (await calls(page, "update_settings"))[0].args.settings;
  assert.equal(saved.temperature, 0.3);
  assert.equal(saved.top_k, 12);
  assert.equal(saved.max_tokens, null);
  assert.equal(saved.thinking, true);
  assert.equal(saved.device, "cpu");
  assert.equal(saved.tables, "host");

  await page.reload();
  await page.waitForSelector("body[data-ready=true]");
  await page.click("#open-settings");
  assert.equal(await page.inputValue("[name=system_prompt]"), "You are terse.");
  assert.equal(await page.inputValue("[name=temperature]"), "0.3");
  assert.equal(await page.inputValue("[name=top_k]"), "12");
  assert.equal(await page.inputValue("[name=max_tokens]"), "");
  assert.equal(await page.isChecked("[name=thinking]"), true);
  assert.equal(await page.inputValue("[name=device]"), "cpu");
  assert.equal(await page.inputValue("[name=tables]"), "host");

  // Tables in GPU memory on the CPU: the core's refusal is shown.
  await page.selectOption("[name=tables]", "gpu");
  await page.click("#settings-form button[type=submit]");
  await page.waitForSelector("#settings-error:not([hidden])");
  assert.match(await page.textContent("#settings-error"), /tables in GPU memory need the GPU/);
  await page.selectOption("[name=tables]", "host");
  await page.click("#settings-form button[type=submit]");
  await page.waitForSelector("#settings-error", { state: "hidden" });

  await page.fill("[name=top_p]", "1.5");
  await page.click("#settings-form button[type=submit]");
  await page.waitForSelector("#settings-error:not([hidden])");
  assert.match(await page.textContent("#settings-error"), /Top-p must be between 0.01 and 1, not 1.5/);
  assert.deepEqual(errors, []);
  await context.close();
});

test("markup in model output stays inert text (sanitiser alone, no CSP)", async () => {
  const { page, context, errors } = await open({ query: "?nocsp" });
  await waitModelLoaded(page);
  const payload =
    '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">' +
    '\n\n**<b onclick="window.__pwned=3">x</b>** [click](javascript:window.__pwned=4) ' +
    '`<svg onload=window.__pwned=5>`\n\n```html\n<iframe src="javascript:window.__pwned=6"></iframe>\n```\n' +
    '[ok](https://example.org/a?b=1&c="x")';
  await page.evaluate((p) => {
    window.__mock.reply = p;
    window.__mock.chunk = 7;
  }, payload);
  await page.fill("#input", "attack");
  await page.press("#input", "Enter");
  await page.waitForSelector(".message.assistant .stats");
  const reply = page.locator(".message.assistant .body");
  for (const tag of ["script", "img", "b", "svg", "iframe"]) {
    assert.equal(await reply.locator(tag).count(), 0, `a <${tag}> element was created`);
  }
  const text = await reply.textContent();
  assert.ok(text.includes("<script>window.__pwned = 1</script>"), text);
  assert.ok(text.includes('<img src=x onerror="window.__pwned = 2">'), text);
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  // Only the http(s) link became a link, with its quotes escaped inside the attribute.
  const links = await reply.locator("a").evaluateAll((as) => as.map((a) => a.getAttribute("href")));
  assert.deepEqual(links, ['https://example.org/a?b=1&c="x"']);
  assert.equal(await reply.locator("[onclick], [onerror], [onload]").count(), 0);
  assert.deepEqual(errors, []);
  await context.close();
});

test("errors from commands show inline with what to do", async () => {
  const { page, context } = await open();
  await waitModelLoaded(page);
  // The model went away behind the UI's back: the core refuses the message.
  await page.evaluate(() => {
    const core = window.__TAURI__.core;
    const real = core.invoke;
    core.invoke = (cmd, args) =>
      cmd === "send_message" ? Promise.reject("no model is loaded: pick one in the model list first") : real(cmd, args);
  });
  await page.fill("#input", "hi");
  await page.press("#input", "Enter");
  await page.waitForSelector("#banner:not([hidden])");
  assert.match(await page.textContent("#banner"), /pick one in the model list/);
  assert.equal(await page.locator(".message").count(), 0);
  assert.equal(await page.isVisible("#send"), true);
  assert.equal(await page.inputValue("#input"), "hi", "the message is kept to send again");
  await context.close();
});

test("a failed download or delete keeps its message after the list refreshes", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.evaluate(() => {
    window.__mock.downloadSteps = 1;
    window.__mock.downloadEvery = 10;
    const core = window.__TAURI__.core;
    const real = core.invoke;
    core.invoke = (cmd, args) => {
      if (cmd === "download_model" && args.spec.endsWith("vulkan-8da4w")) {
        setTimeout(() => args.onEvent.onmessage({ type: "failed", spec: args.spec, error: "connection reset", cancelled: false }), 30);
        return Promise.resolve(null);
      }
      if (cmd === "delete_model") return Promise.reject("a reply is being written; stop it or wait for it to finish");
      return real(cmd, args);
    };
  });
  await page.click("#open-models");
  const row = page.locator('[data-spec="gemma-4-e2b:vulkan-8da4w"]');
  await row.locator("button.download").click();
  await page.waitForSelector("#models-error:not([hidden])");
  // The list's refresh after the failure has run (the row offers the download again); the
  // reason stays on screen.
  await page.waitForFunction(() => window.__mock.calls.filter((c) => c.cmd === "list_models").length >= 2);
  await row.locator("button.download").waitFor();
  await page.waitForTimeout(50);
  assert.equal(await page.isVisible("#models-error"), true);
  assert.match(await page.textContent("#models-error"), /Download of gemma-4-e2b:vulkan-8da4w failed: connection reset/);
  // A refused delete: its reason stays too, after the refresh that follows it.
  const mlx = page.locator('[data-spec="gemma-4-e2b:mlx-int4"]');
  await mlx.locator("button.download").click();
  await mlx.locator("button.delete").waitFor();
  const lists = (await calls(page, "list_models")).length;
  await mlx.locator("button.delete").click();
  await page.waitForFunction((n) => window.__mock.calls.filter((c) => c.cmd === "list_models").length > n, lists);
  await page.waitForTimeout(50);
  assert.equal(await page.isVisible("#models-error"), true);
  assert.match(await page.textContent("#models-error"), /Could not delete gemma-4-e2b:mlx-int4: a reply is being written/);
  assert.deepEqual(errors, []);
  await context.close();
});

test("conversations are renamed and deleted through the page's own dialog", async () => {
  // WKWebView shows nothing for window.prompt / confirm; Playwright dismisses them alike, so a
  // rename or delete that asked through them would do nothing here.
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.fill("#input", "hello");
  await page.press("#input", "Enter");
  await page.waitForSelector(".message.assistant .stats");
  await page.click("#conversations li.active .rename");
  await page.waitForSelector("#ask-dialog[open]");
  assert.equal(await page.inputValue("#ask-input"), "hello");
  await page.fill("#ask-input", "Greetings");
  await page.press("#ask-input", "Enter");
  await page.waitForFunction(() => document.querySelector("#conversations li.active .open")?.textContent === "Greetings");
  assert.equal(await page.textContent("#chat-title"), "Greetings");
  assert.deepEqual((await calls(page, "rename_conversation")).map((c) => c.args.title), ["Greetings"]);
  // Cancel keeps it; Delete removes it.
  await page.click("#conversations li.active .delete");
  await page.waitForSelector("#ask-dialog[open]");
  assert.match(await page.textContent("#ask-title"), /Delete “Greetings”\?/);
  await page.click("#ask-dialog button[value=cancel]");
  await page.waitForSelector("#ask-dialog", { state: "hidden" });
  assert.equal((await calls(page, "delete_conversation")).length, 0);
  assert.equal(await page.locator("#conversations li").count(), 1);
  await page.click("#conversations li.active .delete");
  await page.click("#ask-dialog button[value=ok]");
  await page.waitForFunction(() => document.querySelectorAll("#conversations li").length === 0);
  assert.equal((await calls(page, "delete_conversation")).length, 1);
  assert.equal(await page.textContent("#chat-title"), "New chat");
  assert.deepEqual(errors, []);
  await context.close();
});

test("a reply that could not be saved stays on screen with the reason", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.evaluate(() => {
    const core = window.__TAURI__.core;
    const real = core.invoke;
    core.invoke = async (cmd, args) => {
      if (cmd !== "send_message") return real(cmd, args);
      // The core's event when the store refuses the finished reply: the message has no error
      // of its own, the event says why.
      const ch = args.onEvent;
      setTimeout(() => ch.onmessage({ type: "delta", text: "Paris." }), 20);
      const message = { id: "m-unsaved", author: "assistant", content: "Paris.", created_at: 1, stats: null, stopped: false, error: null };
      setTimeout(() => ch.onmessage({ type: "failed", message, error: "the reply could not be saved: No space left on device" }), 60);
      const c = await real("open_conversation", { id: args.conversationId });
      return { conversation_id: c.id, user_message: { id: "u1", author: "user", content: args.text, created_at: 1 }, assistant_id: "m-unsaved", title: c.title };
    };
  });
  await page.fill("#input", "capital of France?");
  await page.press("#input", "Enter");
  await page.waitForSelector(".message.assistant .error");
  // Once the conversation is read back from the store (which lacks the reply), it is still shown.
  await page.waitForFunction(() => window.__mock.calls.filter((c) => c.cmd === "open_conversation").length >= 2);
  await page.waitForTimeout(50);
  assert.equal(await page.locator(".message.assistant").count(), 1);
  assert.equal(await page.textContent(".message.assistant .body"), "Paris.");
  assert.match(await page.textContent(".message.assistant .error"), /could not be saved: No space left on device/);
  assert.equal(await page.isVisible("#send"), true);
  assert.deepEqual(errors, []);
  await context.close();
});

test("a second Enter while a new chat starts sends nothing more, and the composer is free at once", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.evaluate(() => {
    window.__mock.every = 40;
    const core = window.__TAURI__.core;
    const real = core.invoke;
    core.invoke = async (cmd, args) => {
      if (cmd === "create_conversation") await new Promise((r) => setTimeout(r, 60));
      return real(cmd, args);
    };
  });
  await page.fill("#input", "hello");
  await page.evaluate(() => {
    const input = document.getElementById("input");
    for (let k = 0; k < 2; k++) input.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true, cancelable: true }));
  });
  // Typed while the conversation is created: kept.
  await page.type("#input", "next");
  await page.waitForSelector(".message.assistant.pending");
  assert.equal(await page.isVisible("#stop"), true);
  assert.equal(await page.isVisible("#send"), false);
  await page.waitForSelector(".message.assistant .stats");
  assert.equal((await calls(page, "create_conversation")).length, 1);
  assert.equal((await calls(page, "send_message")).length, 1);
  assert.equal(await page.inputValue("#input"), "next");
  assert.equal(await page.locator(".message").count(), 2);
  assert.equal(await page.isVisible("#banner"), false);
  assert.deepEqual(errors, []);
  await context.close();
});

test("deleting the loaded model updates the header", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.evaluate(() => {
    window.__mock.downloadSteps = 1;
    window.__mock.downloadEvery = 10;
  });
  await page.click("#open-models");
  const row = page.locator('[data-spec="gemma-4-e2b:vulkan-8da4w"]');
  await row.locator("button.download").click();
  await row.locator("button.load").click();
  await page.waitForFunction(() => /Gemma 4 E2B/.test(document.getElementById("model-status").textContent));
  await row.locator("button.delete").click();
  await page.waitForFunction(() => document.getElementById("model-status").textContent === "No model loaded");
  assert.match(await page.textContent("#messages .empty"), /Load a model/);
  assert.deepEqual(errors, []);
  await context.close();
});

test("a reply keeps streaming into its own conversation while another is open", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.evaluate(() => (window.__mock.every = 60));
  await page.fill("#input", "first");
  await page.press("#input", "Enter");
  await page.waitForFunction(() => (document.querySelector(".message.assistant.pending .body")?.textContent.length ?? 0) > 0);
  // Away and back mid-reply: the reply is shown again, still streaming.
  await page.click("#new-chat");
  assert.equal(await page.locator(".message").count(), 0);
  await page.click("#conversations li .open");
  await page.waitForSelector(".message.assistant.pending");
  const before = (await page.textContent(".message.assistant.pending .body")).length;
  await page.waitForFunction((n) => (document.querySelector(".message.assistant.pending .body")?.textContent.length ?? 0) > n, before);
  // Away until it ends: the new chat gets neither the reply nor its context use.
  await page.click("#new-chat");
  await page.waitForFunction(() => document.getElementById("stop").hidden, null, { timeout: 10000 });
  await page.waitForTimeout(100);
  assert.equal(await page.locator(".message").count(), 0);
  assert.equal(await page.textContent("#context-text"), "");
  assert.equal(await page.textContent("#chat-title"), "New chat");
  await page.click("#conversations li .open");
  await page.waitForSelector(".message.assistant .stats");
  assert.equal(await page.locator(".message").count(), 2);
  assert.match(await page.textContent("#context-text"), /^\d+ \/ 2048$/);
  assert.deepEqual(errors, []);
  await context.close();
});

test("empty or out-of-range numbers in settings are refused with a message", async () => {
  const { page, context, errors } = await open();
  await page.click("#open-settings");
  await page.fill("[name=temperature]", "");
  await page.click("#settings-form button[type=submit]");
  await page.waitForSelector("#settings-error:not([hidden])");
  assert.match(await page.textContent("#settings-error"), /Temperature needs a number/);
  await page.fill("[name=temperature]", "7");
  await page.click("#settings-form button[type=submit]");
  await page.waitForFunction(() => /Temperature must be between 0 and 5, not 7/.test(document.getElementById("settings-error").textContent));
  await page.fill("[name=temperature]", "0.7");
  await page.fill("[name=top_k]", "");
  await page.click("#settings-form button[type=submit]");
  await page.waitForFunction(() => /Top-k needs a number/.test(document.getElementById("settings-error").textContent));
  assert.equal((await calls(page, "update_settings")).length, 0);
  // Empty max tokens means no limit.
  await page.fill("[name=top_k]", "40");
  await page.fill("[name=max_tokens]", "");
  await page.click("#settings-form button[type=submit]");
  await page.waitForFunction(() => document.getElementById("settings-saved").textContent === "Saved");
  const saved = (await calls(page, "update_settings"))[0].args.settings;
  assert.deepEqual([saved.temperature, saved.top_k, saved.max_tokens], [0.7, 40, null]);
  assert.equal(await page.isVisible("#settings-error"), false);
  assert.deepEqual(errors, []);
  await context.close();
});

test("emphasis marks inside a link's address stay as written", async () => {
  const { page, context, errors } = await open();
  await waitModelLoaded(page);
  await page.evaluate(() => {
    window.__mock.reply = "**See [the docs](https://docs.python.org/3/reference/datamodel.html#object.__init__)** and [x](https://x.org/a*b*c~~d~~).";
    window.__mock.chunk = 50;
  });
  await page.fill("#input", "q");
  await page.press("#input", "Enter");
  await page.waitForSelector(".message.assistant .stats");
  const reply = page.locator(".message.assistant .body");
  const links = await reply.locator("a").evaluateAll((as) => as.map((a) => [a.getAttribute("href"), a.textContent]));
  assert.deepEqual(links, [
    ["https://docs.python.org/3/reference/datamodel.html#object.__init__", "the docs"],
    ["https://x.org/a*b*c~~d~~", "x"],
  ]);
  assert.equal(await reply.locator("strong").textContent(), "See the docs");
  assert.deepEqual(errors, []);
  await context.close();
});
