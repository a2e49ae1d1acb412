// golden view: the page. It asks the server (view.rs) for the state of the comparison, uploads the
// files dropped on each side, lists the pairs and shows the values of the one opened. Every name
// and value is written as text (textContent), never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
let state = null;
let shownKey = "";
let open = null; // { row, data: the row's JSON, shape, mode, mark: flat index to outline }
let lastFound = null;
// The latest request of show(): the answer to an earlier one (a window since replaced, by a mode
// change and then a click) arrives late and is dropped, never drawn over the newer one.
let shown = 0;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function num(x) {
  if (typeof x === "string") return x; // NaN, inf, -inf
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e-4 && a < 1e6) return String(Number(x.toPrecision(7)));
  return x.toExponential(6);
}

function short(x) {
  if (typeof x === "string") return x;
  if (x === 0) return "0";
  return x.toExponential(1);
}

function setStatus(text) {
  $("status").textContent = text;
}

// This launch's token, from the page's address (the one golden view printed): every request to
// the server carries it in a header, which no page of another site can send without asking first.
const TOKEN = new URLSearchParams(location.search).get("token") || "";

async function getJson(url, options) {
  const o = Object.assign({}, options || {});
  o.headers = Object.assign({ "X-Golden-Token": TOKEN }, o.headers || {});
  const r = await fetch(url, o);
  let body = null;
  try {
    body = await r.json();
  } catch (e) {
    body = { error: `${r.status} ${r.statusText}` };
  }
  if (!r.ok) throw new Error(body && body.error ? body.error : `${r.status}`);
  return body;
}

// --- uploads ---------------------------------------------------------------------------------

async function upload(side, file) {
  setStatus(`uploading ${file.name} as ${side.toUpperCase()} (${file.size} bytes)…`);
  try {
    await getJson(`/api/upload?side=${side}&name=${encodeURIComponent(file.name)}`, {
      method: "POST",
      body: file,
    });
    setStatus(`${file.name} is ${side.toUpperCase()}`);
  } catch (e) {
    setStatus(`${file.name} could not be read: ${e.message}`);
  }
  refresh();
}

for (const side of ["a", "b"]) {
  const zone = $(`drop-${side}`);
  const input = $(`file-${side}`);
  input.addEventListener("change", () => {
    if (input.files.length) upload(side, input.files[0]);
  });
  zone.addEventListener("dragover", (e) => {
    e.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    if (e.dataTransfer.files.length) upload(side, e.dataTransfer.files[0]);
  });
}

// --- the list of pairs -----------------------------------------------------------------------

function renderSides() {
  state.sides.forEach((s, k) => {
    const side = k ? "b" : "a";
    $(`name-${side}`).textContent = s ? s.name : "drop a file or archive here, or click to choose";
    $(`info-${side}`).textContent = s ? `${s.form}, ${s.files} tensor file${s.files === 1 ? "" : "s"}` : "";
  });
}

function renderNotes(diff) {
  const notes = $("notes");
  notes.replaceChildren();
  const lines = [];
  state.sides.forEach((s, k) => {
    if (s) for (const n of s.notes) lines.push(`${k ? "B" : "A"}: ${n}`);
  });
  if (diff) {
    for (const k of diff.skipped) lines.push(`skipped in ${k.side} (${k.file}), not a tensor: ${k.name} (${k.what})`);
  }
  if (!lines.length) return;
  notes.append(el("h3", "Notes"));
  const ul = el("ul");
  for (const l of lines) ul.append(el("li", l));
  notes.append(ul);
}

function renderPairs() {
  const diff = state.diff;
  const table = $("pairs");
  const body = table.querySelector("tbody");
  body.replaceChildren();
  const summary = $("summary");
  summary.className = "summary";
  if (!diff) {
    table.hidden = true;
    summary.textContent = "";
    return;
  }
  table.hidden = false;
  const first = new Set(diff.first_divergence_candidates);
  diff.tensors.forEach((r, i) => {
    const tr = el("tr", null, "row");
    tr.dataset.row = String(i);
    tr.dataset.name = r.name;
    tr.dataset.status = r.status;
    if (first.has(r.name)) tr.classList.add("first");
    const shape = (s) => (s ? `[${s.shape.join(", ")}]` : "-");
    const shapes = r.a && r.b && shape(r.a) !== shape(r.b) ? `${shape(r.a)} / ${shape(r.b)}` : shape(r.a || r.b);
    const dtype = r.a && r.b && r.a.dtype !== r.b.dtype ? `${r.a.dtype}/${r.b.dtype}` : (r.a || r.b || {}).dtype || "-";
    tr.append(el("td", i + 1, "num"), el("td", r.name), el("td", shapes), el("td", dtype));
    if (r.numel !== undefined) {
      tr.append(el("td", short(r.max_abs), "num"), el("td", typeof r.cosine === "number" ? r.cosine.toFixed(7) : r.cosine, "num"));
      tr.append(el("td", `${r.mismatched} of ${r.numel}`, "num"));
    } else {
      tr.append(el("td"), el("td"), el("td"));
    }
    const status = el("td");
    status.append(el("span", r.status.replaceAll("_", " "), `badge ${r.status}`));
    if (first.has(r.name)) status.append(el("span", diff.first_divergence ? " first divergence" : " first divergence?"));
    tr.append(status);
    const how = [];
    if (r.explained) how.push(r.explained.note);
    if (r.why) how.push(r.why);
    if (r.error) how.push(r.error);
    if (r.b_names && !(r.explained && r.explained.as.startsWith("torch.cat"))) how.push(`B: ${r.b_names.join(", ")}`);
    tr.append(el("td", how.join("; "), "how"));
    tr.addEventListener("click", () => openRow(i));
    body.append(tr);
  });
  if (diff.nothing_compared) {
    summary.textContent = diff.nothing_compared;
    summary.classList.add("bad");
  } else if (diff.match) {
    summary.textContent = `all ${diff.tensors.length} tensors match`;
  } else if (diff.first_divergence) {
    summary.textContent = `first divergence: ${diff.first_divergence}`;
    summary.classList.add("bad");
  } else if (diff.first_divergence_candidates.length) {
    summary.textContent = `first divergence: one of ${diff.first_divergence_candidates.join(", ")} (their order is a guess)`;
    summary.classList.add("bad");
  } else {
    summary.textContent = "no tensor both sides have differs";
  }
}

async function refresh() {
  try {
    state = await getJson("/api/state");
  } catch (e) {
    setStatus(`the server does not answer: ${e.message}`);
    return;
  }
  document.body.dataset.status = state.status;
  document.body.dataset.generation = String(state.generation);
  renderSides();
  if (state.status === "comparing") {
    const [done, total] = state.progress;
    setStatus(`comparing… ${done} of ${total || "?"} pairs of files`);
  } else if (state.status === "failed") {
    setStatus(`the comparison failed: ${state.error}`);
  } else if (state.status === "waiting") {
    setStatus(state.sides[0] || state.sides[1] ? "waiting for the other side" : "");
  } else if (!$("status").textContent.startsWith("uploading")) {
    setStatus("");
  }
  const key = `${state.generation}/${state.status}`;
  if (key !== shownKey) {
    shownKey = key;
    renderPairs();
    renderNotes(state.diff);
    if (open && (state.status !== "ready" || open.generation !== state.generation)) closeRow();
  }
}

// --- one pair's values -----------------------------------------------------------------------

function closeRow() {
  open = null;
  $("detail").hidden = true;
}

function openRow(i) {
  const r = state.diff.tensors[i];
  document.querySelectorAll("tr.open").forEach((t) => t.classList.remove("open"));
  const tr = document.querySelector(`tr[data-row="${i}"]`);
  if (tr) tr.classList.add("open");
  $("detail").hidden = false;
  $("detail-name").textContent = r.name;
  $("detail-note").textContent = r.explained ? r.explained.note : "";
  $("values").replaceChildren();
  if (!r.a || !r.b || r.status === "error" || r.status === "shape") {
    open = null;
    $("detail-info").textContent = r.status === "shape" ? `not compared: ${r.why}` : r.error || "on one side only";
    return;
  }
  open = { row: i, data: r, shape: r.a.shape, mode: "flat", generation: state.generation, mark: null };
  lastFound = null;
  $("mode").value = "flat";
  buildAxes();
  show();
}

// The inputs of the window: per axis start/end, or a flat start/end.
function buildAxes() {
  const axes = $("axes");
  axes.replaceChildren();
  const shape = open.shape;
  const n = shape.reduce((a, b) => a * b, 1);
  const add = (label, k, lo, hi) => {
    const span = el("span", null, "axis");
    span.append(el("span", `${label} `));
    const s = el("input");
    s.id = `start-${k}`;
    s.value = String(lo);
    const e = el("input");
    e.id = `end-${k}`;
    e.value = String(hi);
    span.append(s, el("span", " : "), e, el("span", "  "));
    axes.append(span);
  };
  if (open.mode === "flat" || shape.length === 0) {
    add(`flat (${n})`, 0, 0, Math.min(n, 10));
    return;
  }
  const ranged = open.mode === "2d" ? 2 : 1;
  shape.forEach((d, k) => {
    const isRanged = k >= shape.length - ranged;
    add(`axis ${k} (${d})`, k, 0, isRanged ? Math.min(d, 10) : Math.min(d, 1));
  });
}

function windowOf() {
  const count = open.mode === "flat" || open.shape.length === 0 ? 1 : open.shape.length;
  const start = [];
  const end = [];
  for (let k = 0; k < count; k++) {
    start.push(parseInt($(`start-${k}`).value, 10) || 0);
    end.push(parseInt($(`end-${k}`).value, 10) || 0);
  }
  return { start, end };
}

function setWindow(start, end) {
  start.forEach((s, k) => {
    $(`start-${k}`).value = String(s);
    $(`end-${k}`).value = String(end[k]);
  });
}

async function show() {
  if (!open) return;
  const { start, end } = windowOf();
  const flat = open.mode === "flat" || open.shape.length === 0;
  const url = `/api/values?row=${open.row}&start=${start.join(",")}&end=${end.join(",")}${flat ? "&flat=true" : ""}`;
  const ticket = ++shown;
  let v;
  try {
    v = await getJson(url);
  } catch (e) {
    if (ticket === shown) $("detail-info").textContent = `cannot read the values: ${e.message}`;
    return;
  }
  if (ticket !== shown || !open) return;
  const b = v.b_shape ? ` / B [${v.b_shape.join(", ")}] ${v.b_dtype}` : "";
  $("detail-info").textContent = `A [${v.shape.join(", ")}] ${v.a_dtype}${b}; tolerance ${v.rule}; ${v.cells.length} values shown${v.truncated ? " (the window is cut)" : ""}`;
  renderValues(v, flat);
}

function renderValues(v, flat) {
  const box = $("values");
  box.replaceChildren();
  const table = el("table", null, "values");
  const mark = (td, cell) => {
    if (cell[4]) td.classList.add("out");
    if (open.mark !== null && cell[0] === open.mark) td.classList.add("at");
  };
  if (open.mode === "2d" && !flat && v.shape.length >= 2) {
    // Rows: the second-to-last axis; columns: the last; each cell A over B. Leading axes fixed.
    const last = v.shape.length - 1;
    const cols = [];
    for (let c = v.start[last]; c < v.end[last]; c++) cols.push(c);
    const head = el("tr");
    head.append(el("th", "index"));
    for (const c of cols) head.append(el("th", `j=${c}`));
    table.append(head);
    // One row per index of the leading axes and i (leading axes may span more than one).
    const rows = new Map();
    for (const cell of v.cells) {
      const key = cell[1].slice(0, -1).join(", ");
      if (!rows.has(key)) rows.set(key, []);
      rows.get(key).push(cell);
    }
    for (const [key, cells] of rows) {
      const tr = el("tr");
      tr.append(el("th", `[${key}, j]`));
      for (const cell of cells) {
        const td = el("td");
        td.dataset.flat = String(cell[0]);
        td.append(el("div", num(cell[2]), "a"), el("div", num(cell[3]), "b"));
        mark(td, cell);
        tr.append(td);
      }
      table.append(tr);
    }
  } else {
    const head = el("tr");
    for (const h of ["index", "flat", "A", "B", "|A − B|"]) head.append(el("th", h));
    table.append(head);
    for (const cell of v.cells) {
      const tr = el("tr");
      tr.dataset.flat = String(cell[0]);
      const a = el("td", num(cell[2]), "a");
      const b = el("td", num(cell[3]), "b");
      const d = typeof cell[2] === "number" && typeof cell[3] === "number" ? num(Math.abs(cell[2] - cell[3])) : "";
      const dt = el("td", d, "d");
      for (const td of [a, b, dt]) mark(td, cell);
      tr.append(el("td", `[${cell[1].join(", ")}]`), el("td", cell[0]), a, b, dt);
      table.append(tr);
    }
  }
  box.append(table);
}

// Move the window by its own width along the axis it walks.
function step(direction) {
  if (!open) return;
  const { start, end } = windowOf();
  const flat = open.mode === "flat" || open.shape.length === 0;
  const k = flat ? 0 : open.mode === "2d" ? open.shape.length - 2 : open.shape.length - 1;
  const size = flat ? open.shape.reduce((a, b) => a * b, 1) : open.shape[k];
  const width = Math.max(1, end[k] - start[k]);
  const s = Math.min(Math.max(0, start[k] + direction * width), Math.max(0, size - 1));
  start[k] = s;
  end[k] = Math.min(size, s + width);
  setWindow(start, end);
  open.mark = null;
  show();
}

function unravel(flat, shape) {
  const index = new Array(shape.length).fill(0);
  for (let k = shape.length - 1; k >= 0; k--) {
    index[k] = flat % shape[k];
    flat = Math.floor(flat / shape[k]);
  }
  return index;
}

function ravel(index, shape) {
  return index.reduce((acc, i, k) => acc * shape[k] + i, 0);
}

// Show a window that holds the element at `index` (a multi-index), outlined.
function jumpTo(index) {
  const shape = open.shape;
  open.mark = ravel(index, shape);
  const flat = open.mode === "flat" || shape.length === 0;
  if (flat) {
    const s = Math.max(0, open.mark - 4);
    setWindow([s], [Math.min(s + 10, shape.reduce((a, b) => a * b, 1))]);
  } else {
    const ranged = open.mode === "2d" ? 2 : 1;
    const start = [];
    const end = [];
    shape.forEach((d, k) => {
      if (k >= shape.length - ranged) {
        const s = Math.max(0, Math.min(index[k] - 4, d - 10));
        start.push(s);
        end.push(Math.min(d, s + 10));
      } else {
        start.push(index[k]);
        end.push(index[k] + 1);
      }
    });
    setWindow(start, end);
  }
  show();
}

$("mode").addEventListener("change", () => {
  if (!open) return;
  open.mode = $("mode").value;
  open.mark = null;
  buildAxes();
  show();
});
$("show").addEventListener("click", () => {
  if (open) open.mark = null;
  show();
});
$("prev").addEventListener("click", () => step(-1));
$("next").addEventListener("click", () => step(1));
$("go").addEventListener("click", () => {
  if (!open) return;
  const parts = $("jump").value.split(",").map((x) => parseInt(x.trim(), 10));
  if (parts.some((x) => Number.isNaN(x) || x < 0)) return;
  const shape = open.shape;
  const n = shape.reduce((a, b) => a * b, 1);
  let index;
  if (parts.length === shape.length && shape.length > 0) index = parts;
  else if (parts.length === 1) index = unravel(Math.min(parts[0], Math.max(0, n - 1)), shape);
  else return;
  if (index.some((x, k) => x >= shape[k])) return;
  jumpTo(index);
});
$("worst").addEventListener("click", () => {
  if (open && open.data.worst) jumpTo(open.data.worst.index);
  else if (open) $("find-result").textContent = "no element is outside the tolerance";
});
$("find-next").addEventListener("click", async () => {
  if (!open) return;
  const text = $("find").value.trim();
  const range = text.split("..");
  const lo = parseFloat(range[0]);
  if (Number.isNaN(lo)) return;
  let url = `/api/find?row=${open.row}&side=${$("find-side").value}`;
  if (range.length === 2) {
    const hi = parseFloat(range[1]);
    if (Number.isNaN(hi)) return;
    url += `&lo=${lo}&hi=${hi}`;
  } else {
    // A value as typed: any element that rounds to it at the digits typed (-0.1984 finds
    // -0.19843), or within the pair's tolerance of it.
    const m = /^[-+]?\d*\.(\d+)$/.exec(text);
    if (m) {
      const half = 0.5 * Math.pow(10, -m[1].length);
      url += `&lo=${lo - half}&hi=${lo + half}`;
    } else {
      url += `&lo=${lo}`;
    }
  }
  if (lastFound !== null) url += `&after=${lastFound}`;
  try {
    const f = await getJson(url);
    if (f.flat === null) {
      $("find-result").textContent = "not found";
      lastFound = null;
      return;
    }
    lastFound = f.flat;
    $("find-result").textContent = `found at [${f.index.join(", ")}] (flat ${f.flat})`;
    jumpTo(f.index);
  } catch (e) {
    $("find-result").textContent = e.message;
  }
});
$("find").addEventListener("input", () => {
  lastFound = null;
});

refresh();
setInterval(refresh, 700);
