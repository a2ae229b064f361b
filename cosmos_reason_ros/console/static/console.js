// The cosmos_reason console page: one WebSocket to the console server (server.py).
// Plain browser APIs only (WebSocket, canvas, Page Visibility), nothing loaded from elsewhere.
"use strict";

// Colours of drawn items, in order; the first is what the browser tests look for.
const COLOURS = ["#ff2bd6", "#00e5ff", "#ffd400", "#7cff4f", "#ff7a1a", "#b18cff"];
const RECONNECT_MS = 2000;

const state = {
  ws: null,
  tasks: [],
  cameras: [],
  running: false,
  streamText: "",   // model text of the running goal so far (reasoning included)
  shown: null,      // the result on the answer canvas (tests read it)
  shownKey: "",
  framesReceived: 0,
  maxRequestBytes: 0,  // the console's bound on one request (hello): larger ones close the socket
};
window.consoleState = state;

const $ = (id) => document.getElementById(id);
const token = new URLSearchParams(location.search).get("token");
const withToken = (path) => token ? `${path}${path.includes("?") ? "&" : "?"}token=${encodeURIComponent(token)}` : path;

// --- connection -------------------------------------------------------------------------

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}${withToken("/ws")}`);
  ws.binaryType = "arraybuffer";
  state.ws = ws;
  ws.onopen = () => {
    $("connection").textContent = "connected";
    sendVisibility();
  };
  ws.onclose = () => {
    $("connection").textContent = "disconnected: reconnecting…";
    $("status").dataset.level = "";
    setRunning(false);
    setTimeout(connect, RECONNECT_MS);
  };
  ws.onmessage = (event) => {
    if (typeof event.data === "string") {
      onMessage(JSON.parse(event.data));
    } else {
      onPicture(event.data);
    }
  };
}

function send(message) {
  if (state.ws && state.ws.readyState === WebSocket.OPEN) {
    state.ws.send(JSON.stringify(message));
    return true;
  }
  return false;
}

// Streaming stops while the tab is hidden: the server sends no pictures to a hidden page.
function sendVisibility() {
  send({type: "visibility", visible: !document.hidden});
}
document.addEventListener("visibilitychange", sendVisibility);

function onMessage(m) {
  switch (m.type) {
    case "hello": return onHello(m);
    case "status": return onStatus(m);
    case "results": return showResultList(m.results);
    case "accepted": return onAccepted();
    case "progress": return onProgress(m);
    case "answer": return onAnswer(m);
    case "error": return onError(m.message);
  }
}

// --- live panes -------------------------------------------------------------------------

function onHello(m) {
  $("node").textContent = m.node;
  state.tasks = m.tasks;
  state.cameras = m.cameras;
  state.maxRequestBytes = m.max_request_bytes;
  const task = $("task");
  const chosen = task.value;
  task.replaceChildren(...m.tasks.map((t) => new Option(t.name, t.name)));
  if (chosen) task.value = chosen;
  const source = $("source");
  if (!source.options.length) source.replaceChildren(...m.sources.map((s) => new Option(s, s)));
  buildPanes(m.cameras);
  buildCameraChoice(m.cameras);
  updateHints();
  showResultList(m.results);
}

function buildPanes(cameras) {
  const panes = $("panes");
  const current = [...panes.children].map((figure) => figure.dataset.camera);
  if (current.join("\n") === cameras.join("\n")) return;  // a repeated hello keeps the panes
  panes.replaceChildren(...cameras.map((name) => {
    const figure = document.createElement("figure");
    figure.className = "pane";
    figure.dataset.camera = name;
    const img = document.createElement("img");
    img.alt = `camera ${name}`;
    const caption = document.createElement("figcaption");
    caption.innerHTML = "<span class=\"name\"></span><span class=\"info\">waiting for frames…</span>";
    caption.querySelector(".name").textContent = name;
    figure.append(img, caption);
    return figure;
  }));
}

function buildCameraChoice(cameras) {
  const box = $("camera-choice");
  const current = [...box.querySelectorAll("input")].map((input) => input.value);
  if (current.join("\n") === cameras.join("\n")) return;
  box.replaceChildren();
  if (cameras.length < 2) return;  // one camera: the goal names none (the default camera)
  for (const [i, name] of cameras.entries()) {
    const label = document.createElement("label");
    label.className = "check";
    const input = document.createElement("input");
    input.type = "checkbox";
    input.value = name;
    input.checked = i === 0;
    label.append(input, name);
    box.append(label);
  }
}

// A picture message: 4-byte header length, JSON header, JPEG bytes.
function onPicture(buffer) {
  const length = new DataView(buffer).getUint32(0);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 4, length)));
  const pane = document.querySelector(`figure.pane[data-camera="${CSS.escape(header.camera)}"]`);
  if (!pane) return;
  const img = pane.querySelector("img");
  const url = URL.createObjectURL(new Blob([new Uint8Array(buffer, 4 + length)], {type: "image/jpeg"}));
  const previous = img.dataset.url;
  img.onload = () => { if (previous) URL.revokeObjectURL(previous); };
  img.src = url;
  img.dataset.url = url;
  img.dataset.stamp = header.stamp;
  state.framesReceived += 1;
  pane.querySelector(".info").textContent =
    `${header.source === "annotated" ? "node's annotated image" : "camera"} · stamp ${formatStamp(header.stamp)}`;
}

// A stamp as the time of day when it is wall-clock time, else seconds (sim time, bags).
function formatStamp(ns) {
  const ms = Number(BigInt(ns) / 1000000n);
  if (ms < 1e12) return `${(ms / 1000).toFixed(3)} s`;
  const time = new Date(ms).toLocaleTimeString([], {hour12: false});
  return `${time}.${String(ms % 1000).padStart(3, "0")}`;
}

// --- status strip -----------------------------------------------------------------------

function onStatus(m) {
  const v = m.values || {};
  $("status").dataset.level = m.level;
  $("engine-state").textContent = v.engine_state || "–";
  $("ttft").textContent = v.ttft_p50_s ? `${(Number(v.ttft_p50_s) * 1000).toFixed(0)} ms` : "–";
  const ages = state.cameras.length > 1
    ? state.cameras.map((c) => `${c} ${age(v[`${c}.frame_age_s`])}`).join(", ")
    : age(v.frame_age_s);
  $("camera-age").textContent = ages;
  $("goals").textContent = `${v.goals_active ?? "–"} running, ${v.goals_queued ?? "–"} queued`;
  $("status-message").textContent = m.message && m.message !== "ok" ? m.message : "";
}

function age(value) {
  return value ? `${Number(value).toFixed(1)} s` : "–";
}

// --- asking -----------------------------------------------------------------------------

function updateHints() {
  const spec = state.tasks.find((t) => t.name === $("task").value);
  if (!spec) return;
  $("prompt").placeholder = spec.needs_prompt ? `needed: ${spec.prompt_means}` : "optional";
  $("targets").disabled = !spec.needs_targets && spec.answer !== "boxes" && spec.answer !== "points";
  if (spec.needs_video) $("source").value = "clip";
}
$("task").addEventListener("change", updateHints);

$("ask-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const targets = $("targets").disabled ? [] :
    $("targets").value.split(",").map((t) => t.trim()).filter((t) => t);
  const cameras = [...document.querySelectorAll("#camera-choice input:checked")].map((i) => i.value);
  const request = {
    type: "ask", task: $("task").value, prompt: $("prompt").value, targets, cameras,
    source: $("source").value, reasoning: $("reasoning").checked,
    max_tokens: Number($("max-tokens").value) || 0, greedy: $("greedy").checked,
    clip_duration_s: Number($("clip-duration").value) || 0,
    response_schema: $("response-schema").value.trim(),
  };
  $("answer-error").textContent = "";  // an error shown belongs to the previous request
  // The server closes a socket whose message is over its bound ("message too big") and the
  // page would only see a reconnect: say which field is too long instead.
  const bytes = new TextEncoder().encode(JSON.stringify(request)).length;
  if (state.maxRequestBytes && bytes > state.maxRequestBytes) {
    onError(`request not sent: ${bytes} bytes, over the console's limit of ` +
            `${state.maxRequestBytes} bytes (prompt: ${request.prompt.length} characters; ` +
            `response schema: ${request.response_schema.length})`);
    return;
  }
  if (!send(request)) onError("not connected to the console");
});

$("cancel-button").addEventListener("click", () => send({type: "cancel"}));

function setRunning(running) {
  state.running = running;
  $("ask-button").disabled = running;
  $("cancel-button").disabled = !running;
  if (!running) $("stage").textContent = "";
}

function onAccepted() {
  setRunning(true);
  state.streamText = "";
  clearAnswer();
  $("answer").dataset.status = "running";
  $("answer-status").textContent = "sent";
}

function onProgress(m) {
  state.streamText += m.text;
  $("stage").textContent = `${m.stage} · ${m.output_tokens} tokens · ${m.elapsed_s.toFixed(1)} s`;
  // The raw text: "<think>reasoning</think>answer" with reasoning on, the answer otherwise.
  const text = state.streamText;
  const open = text.indexOf("<think>");
  const close = text.indexOf("</think>");
  if (open >= 0) {
    $("reasoning-box").hidden = false;
    $("reasoning-text").textContent = text.slice(open + 7, close >= 0 ? close : undefined).trim();
    $("answer-text").textContent = close >= 0 ? text.slice(close + 8).trim() : "";
  } else {
    $("answer-text").textContent = text;
  }
}

function onAnswer(m) {
  setRunning(false);
  showResult(m.result, m.key);
}

function onError(message) {
  // Console-side refusals (the node's own messages arrive with their result).
  $("answer-error").textContent = message;
  if (!state.running) $("answer").dataset.status = "error";
}

// --- results ----------------------------------------------------------------------------

function clearAnswer() {
  for (const id of ["answer-error", "answer-text", "reasoning-text", "answer-code"]) $(id).textContent = "";
  $("answer-frames").replaceChildren();
  $("answer-items").replaceChildren();
  $("reasoning-box").hidden = true;
}

function showResult(r, key) {
  clearAnswer();
  state.shown = r;
  state.shownKey = key;
  const answer = $("answer");
  answer.dataset.status = r.status;
  answer.dataset.key = key;
  $("answer-status").textContent = `${r.status} · ${r.task || "vqa"} · ${r.origin || "goal"}`;
  $("answer-code").textContent = r.error_code_name !== "OK" ? r.error_code_name : "";
  $("answer-error").textContent = r.error_message;  // the node's message, verbatim
  $("reasoning-text").textContent = r.reasoning;
  $("reasoning-box").hidden = !r.reasoning;
  $("answer-text").textContent = r.answer;
  const items = $("answer-items");
  for (const [i, b] of r.boxes.entries()) items.append(item(`box ${b.label}`, i, b.position_3d));
  for (const [i, p] of r.points.entries()) items.append(item(`point ${p.label}`, r.boxes.length + i, p.position_3d));
  for (const t of r.trajectories) items.append(item(`trajectory ${t.label} (${t.points.length} points)`, -1, null));
  for (const s of r.spans) items.append(item(`${s.start_s.toFixed(2)}–${s.end_s.toFixed(2)} s ${s.caption}`, -1, null));
  for (const frame of r.camera_frames) drawFrame(r, key, frame);
}

function item(text, index, position3d) {
  const li = document.createElement("li");
  li.textContent = text + distance(position3d);
  if (index >= 0) li.style.color = COLOURS[index % COLOURS.length];
  return li;
}

// 3D: the item's distance from the camera and its position in the result's frame_3d.
function distance(position3d) {
  if (!position3d || !position3d.valid) return "";
  const p = position3d.position;
  const d = Math.hypot(p.x, p.y, p.z);
  return ` · ${d.toFixed(2)} m (x ${p.x.toFixed(2)}, y ${p.y.toFixed(2)}, z ${p.z.toFixed(2)})`;
}

// Draw the answer over the frame it is about (the server keeps it by the result's stamp).
function drawFrame(r, key, frame) {
  const wrap = document.createElement("div");
  const canvas = document.createElement("canvas");
  canvas.dataset.camera = frame.camera;
  canvas.width = frame.image_width || 640;
  canvas.height = frame.image_height || 480;
  const note = document.createElement("div");
  note.className = "frame-note";
  const source = (r.frames || {})[frame.camera];
  note.textContent = `${frame.camera} · frame ${formatStamp(frame.stamp)}` +
    (source ? (source.source === "annotated" ? " · the node's annotated copy" : "") : " · frame no longer held");
  wrap.append(canvas, note);
  $("answer-frames").append(wrap);
  const ctx = canvas.getContext("2d");
  const overlay = () => {
    drawItems(ctx, r, frame.camera, canvas.width);
    canvas.dataset.drawn = "true";
  };
  if (!source) {
    ctx.fillStyle = "#222";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    overlay();
    return;
  }
  const img = new Image();
  img.onload = () => {
    ctx.drawImage(img, 0, 0, canvas.width, canvas.height);
    overlay();
  };
  img.onerror = overlay;
  img.src = withToken(`/frame/${encodeURIComponent(key)}/${encodeURIComponent(frame.camera)}`);
}

function drawItems(ctx, r, camera, width) {
  const line = Math.max(3, Math.round(width / 200));
  const font = Math.max(13, Math.round(width / 40));
  ctx.lineWidth = line;
  ctx.font = `600 ${font}px system-ui, sans-serif`;
  const mine = (x) => !x.camera || x.camera === camera;
  r.boxes.forEach((b, i) => {
    if (!mine(b)) return;
    const colour = COLOURS[i % COLOURS.length];
    // The label first: the box's own lines stay on top, exactly where the result puts them.
    label(ctx, b.label + distance(b.position_3d), b.x_min, b.y_min, colour, font);
    ctx.strokeStyle = colour;
    ctx.strokeRect(b.x_min, b.y_min, b.x_max - b.x_min, b.y_max - b.y_min);
  });
  r.points.forEach((p, i) => {
    if (!mine(p)) return;
    const colour = COLOURS[(r.boxes.length + i) % COLOURS.length];
    ctx.fillStyle = colour;
    ctx.beginPath();
    ctx.arc(p.x, p.y, line * 2.5, 0, 2 * Math.PI);
    ctx.fill();
    label(ctx, p.label + distance(p.position_3d), p.x + line * 3, p.y, colour, font);
  });
  r.trajectories.forEach((t, i) => {
    if (!mine(t) || !t.points.length) return;
    const colour = COLOURS[(i + 2) % COLOURS.length];
    ctx.strokeStyle = ctx.fillStyle = colour;
    ctx.beginPath();
    t.points.forEach((p, j) => (j ? ctx.lineTo(p.x, p.y) : ctx.moveTo(p.x, p.y)));
    ctx.stroke();
    for (const p of t.points) {
      ctx.beginPath();
      ctx.arc(p.x, p.y, line * 1.5, 0, 2 * Math.PI);
      ctx.fill();
    }
    label(ctx, t.label, t.points[0].x, t.points[0].y, colour, font);
  });
}

// A label above (x, y) on a dark band, so it reads on any picture.
function label(ctx, text, x, y, colour, font) {
  if (!text) return;
  const width = ctx.measureText(text).width + 8;
  const top = Math.max(0, y - font - 6);
  ctx.fillStyle = "rgba(0, 0, 0, 0.7)";
  ctx.fillRect(x, top, width, font + 6);
  ctx.fillStyle = colour;
  ctx.fillText(text, x + 4, top + font);
}

function showResultList(results) {
  $("results").replaceChildren(...results.map((s) => {
    const li = document.createElement("li");
    li.dataset.key = s.key;
    const head = document.createElement("span");
    head.className = "meta";
    head.textContent = `${s.origin || "goal"} · ${s.task || "vqa"} · ${formatStamp(s.stamp)}`;
    const body = document.createElement("span");
    if (s.error_code !== "OK") {
      body.className = "err";
      body.textContent = s.error_code;
    } else {
      body.textContent = s.answer || "(no answer)";
    }
    li.append(head, body);
    li.addEventListener("click", () => reopen(s.key));
    return li;
  }));
}

async function reopen(key) {
  const response = await fetch(withToken(`/result/${encodeURIComponent(key)}`));
  if (!response.ok) {
    onError(await response.text());
    return;
  }
  showResult(await response.json(), key);
}

connect();
