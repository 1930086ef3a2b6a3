// Markdown for model output, safe by construction: every piece of source text is HTML-escaped
// before it is placed between tags this module writes itself, so no tag, attribute or
// handler in the model's output can reach the DOM. Handles what chat replies use: paragraphs,
// headings, lists, quotes, rules, fenced code (also while still unclosed mid-stream), inline
// code, bold, italic, strikethrough and http(s) links.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

const emphasis = (text) =>
  text
    .replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w])__([^_\n]+)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/(^|[^*\w])\*([^*\n]+)\*(?!\*)/g, "$1<em>$2</em>")
    .replace(/(^|[^_\w])_([^_\n]+)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~([^~\n]+)~~/g, "<del>$1</del>");

// Emphasis and links on already-escaped text (so `*`, `_`, `[` never meet raw HTML). A link's
// address stands aside as a marker while emphasis runs, so that `__init__` or `*` in a URL
// stays as written; the marker's control character is dropped from the text first.
function decorate(escaped) {
  const urls = [];
  const marked = escaped
    .replace(/\u0001/g, "")
    .replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g, (_, label, url) => {
      urls.push(url);
      return `[${label}](\u0001${urls.length - 1}\u0001)`;
    });
  return emphasis(marked).replace(/\[([^\]\n]+)\]\(\u0001(\d+)\u0001\)/g, (_, label, i) => {
    const url = urls[Number(i)];
    return `<a href="${url}" class="ext" title="${url}" rel="noopener noreferrer">${label}</a>`;
  });
}

export function inline(text) {
  // Code spans first: their content is shown as written, never decorated.
  return text
    .split(/(`[^`\n]+`)/)
    .map((part, i) => (i % 2 ? `<code>${escapeHtml(part.slice(1, -1))}</code>` : decorate(escapeHtml(part))))
    .join("");
}

function codeBlock(lang, lines) {
  const label = escapeHtml(lang || "text");
  return (
    `<div class="code"><div class="code-head"><span class="lang">${label}</span>` +
    `<button type="button" class="copy-code">Copy</button></div>` +
    `<pre><code>${escapeHtml(lines.join("\n"))}</code></pre></div>`
  );
}

export function renderMarkdown(source) {
  const lines = String(source).replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let para = [];
  let list = null;
  let quote = [];
  const flushPara = () => {
    if (para.length) out.push(`<p>${para.map(inline).join("<br>")}</p>`);
    para = [];
  };
  const flushList = () => {
    if (list) out.push(`<${list.tag}>${list.items.map((t) => `<li>${inline(t)}</li>`).join("")}</${list.tag}>`);
    list = null;
  };
  const flushQuote = () => {
    if (quote.length) out.push(`<blockquote>${quote.map(inline).join("<br>")}</blockquote>`);
    quote = [];
  };
  const flushAll = () => {
    flushPara();
    flushList();
    flushQuote();
  };

  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/);
    if (fence) {
      flushAll();
      const code = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) code.push(lines[i++]);
      out.push(codeBlock(fence[2], code));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
    const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
    const quoted = line.match(/^\s*>\s?(.*)$/);
    if (!line.trim()) {
      flushAll();
    } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flushAll();
      out.push("<hr>");
    } else if (heading) {
      flushAll();
      const level = Math.min(heading[1].length + 2, 6);
      out.push(`<h${level}>${inline(heading[2])}</h${level}>`);
    } else if (bullet || numbered) {
      flushPara();
      flushQuote();
      const tag = bullet ? "ul" : "ol";
      if (!list || list.tag !== tag) {
        flushList();
        list = { tag, items: [] };
      }
      list.items.push((bullet || numbered)[1]);
    } else if (quoted) {
      flushPara();
      flushList();
      quote.push(quoted[1]);
    } else if (list && /^\s{2,}\S/.test(line)) {
      list.items[list.items.length - 1] += " " + line.trim();
    } else {
      flushList();
      flushQuote();
      para.push(line);
    }
  }
  flushAll();
  return out.join("");
}
