// pn's built-in chat page: streams /v1/chat/completions (server-sent events read with fetch),
// shows reasoning collapsed, stops a reply with an AbortController (the server cancels the
// generation when the connection closes), keeps the conversation and settings in
// localStorage. No dependencies, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "pn-chat";
const SETTINGS = ["api-key", "system", "temperature", "max-tokens", "thinking", "effort"];

/** @type {{role: string, content: string, reasoning?: string, stats?: string}[]} */
let conversation = [];
let controller = null;

function load() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE) || "{}");
    conversation = Array.isArray(saved.conversation) ? saved.conversation : [];
    for (const id of SETTINGS) {
      if (saved.settings && typeof saved.settings[id] === "string") $(id).value = saved.settings[id];
    }
  } catch (_) {
    conversation = [];
  }
}

function save() {
  const settings = {};
  for (const id of SETTINGS) settings[id] = $(id).value;
  localStorage.setItem(STORE, JSON.stringify({ conversation, settings }));
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

/** Adds a message element; returns its parts for streaming updates. */
function addMessage(m) {
  const el = document.createElement("div");
  el.className = "msg " + m.role;
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const reasoning = document.createElement("div");
  reasoning.className = "reasoning";
  details.append(summary, reasoning);
  details.hidden = !m.reasoning;
  reasoning.textContent = m.reasoning || "";
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = m.content;
  const stats = document.createElement("span");
  stats.className = "stats muted";
  stats.textContent = m.stats || "";
  el.append(details, content, stats);
  $("messages").append(el);
  el.scrollIntoView({ block: "end" });
  return { el, details, reasoning, content, stats };
}

function render() {
  $("messages").replaceChildren();
  for (const m of conversation) addMessage(m);
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of conversation) messages.push({ role: m.role, content: m.content });
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  const t = parseFloat($("temperature").value);
  if (!Number.isNaN(t)) body.temperature = t;
  const n = parseInt($("max-tokens").value, 10);
  if (n > 0) body.max_tokens = n;
  if ($("thinking").value) body.chat_template_kwargs = { enable_thinking: $("thinking").value === "on" };
  if ($("effort").value) body.reasoning_effort = $("effort").value;
  return body;
}

/** Yields the JSON payloads of a server-sent event stream. */
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = event
        .split(/\r?\n/)
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

async function send(text) {
  conversation.push({ role: "user", content: text });
  addMessage(conversation[conversation.length - 1]);
  const reply = { role: "assistant", content: "", reasoning: "" };
  const view = addMessage(reply);
  view.el.classList.add("streaming");
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  $("status").textContent = "waiting…";
  const started = performance.now();
  let firstToken = null;
  let tokens = 0;
  let usage = null;
  let failed = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(requestBody()),
      signal: controller.signal,
    });
    if (!response.ok) {
      const err = await response.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || response.status + " " + response.statusText);
    }
    for await (const chunk of sseData(response)) {
      if (chunk.error) throw new Error(chunk.error.message || "generation failed");
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (!delta) continue;
      if (delta.reasoning_content || delta.content) {
        if (firstToken === null) firstToken = performance.now();
        tokens += 1;
      }
      if (delta.reasoning_content) {
        reply.reasoning += delta.reasoning_content;
        view.reasoning.textContent = reply.reasoning;
        view.details.hidden = false;
      }
      if (delta.content) {
        reply.content += delta.content;
        view.content.textContent = reply.content;
      }
      const secs = firstToken === null ? 0 : (performance.now() - firstToken) / 1000;
      $("status").textContent = secs > 0 ? (tokens / secs).toFixed(1) + " tok/s" : "generating…";
      view.el.scrollIntoView({ block: "end" });
    }
  } catch (e) {
    if (e.name === "AbortError") reply.stats = "(stopped)";
    else failed = e.message || String(e);
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    view.el.classList.remove("streaming");
  }
  if (failed !== null) {
    view.el.classList.add("error");
    view.content.textContent = "Error: " + failed;
    conversation.pop();
    $("status").textContent = "";
    save();
    return;
  }
  const n = usage ? usage.completion_tokens : tokens;
  const secs = (performance.now() - (firstToken === null ? started : firstToken)) / 1000;
  const rate = secs > 0 ? (n / secs).toFixed(1) : "–";
  reply.stats = [reply.stats, n + " tokens, " + rate + " tok/s"].filter(Boolean).join(" ");
  view.stats.textContent = reply.stats;
  view.el.classList.add("done");
  $("status").textContent = "";
  conversation.push(reply);
  save();
}

async function showModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (!r.ok) {
      $("model").textContent = r.status === 401 ? "(API key needed: Settings)" : "";
      return;
    }
    const models = await r.json();
    $("model").textContent = models.data && models.data[0] ? models.data[0].id : "";
  } catch (_) {
    $("model").textContent = "";
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("new-chat").addEventListener("click", () => {
  if (controller) controller.abort();
  conversation = [];
  save();
  render();
});
$("settings-toggle").addEventListener("click", () => {
  const s = $("settings");
  s.hidden = !s.hidden;
  $("settings-toggle").setAttribute("aria-expanded", String(!s.hidden));
});
for (const id of SETTINGS) $(id).addEventListener("change", () => { save(); if (id === "api-key") showModel(); });

load();
render();
showModel();
