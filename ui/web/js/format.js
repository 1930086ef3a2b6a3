// Small display helpers shared by the views.

export function bytes(n) {
  if (n == null) return "?";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let v = n;
  let i = 0;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

export function duration(seconds) {
  if (seconds == null || !isFinite(seconds)) return "";
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

// "TTFT 120 ms · 35.2 tok/s · 64 tokens" for a reply's stats.
export function replyStats(stats) {
  if (!stats) return "";
  const parts = [];
  if (stats.ttft_ms != null) parts.push(`TTFT ${Math.round(stats.ttft_ms)} ms`);
  parts.push(`${stats.decode_tokens_per_s.toFixed(1)} tok/s`);
  parts.push(`${stats.generated_tokens} tokens`);
  if (stats.stop === "max tokens") parts.push("stopped at max tokens");
  if (stats.stop === "context full") parts.push("context full");
  if (stats.dropped_messages) parts.push(`${stats.dropped_messages} older messages left out`);
  return parts.join(" · ");
}

// Creates an element: el("button", { class: "x", text: "Hi", onclick }, children...).
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value == null || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child != null) node.append(child);
  }
  return node;
}
