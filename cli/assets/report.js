// golden's HTML report: renders the data embedded in #golden-data (see cli/src/report.rs).
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("golden-data").textContent);
  const root = document.getElementById("report");
  const checks = data.checks;

  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const num = (x) => {
    if (x === null || x === undefined) return "–";
    if (typeof x === "string") return x;
    if (x === 0) return "0";
    const a = Math.abs(x);
    return a >= 1e-3 && a < 1e5 ? String(+x.toPrecision(4)) : x.toExponential(2);
  };
  const ratio = (x) => (typeof x === "string" ? (x === "inf" ? Infinity : NaN) : x);
  // A stale result (not from the last run) gets a grey badge: its status is history.
  const badge = (status, stale) => stale
    ? `<span class="badge stale">stale</span> <span class="muted">(${status === "pass" ? "passed" : "failed"})</span>`
    : `<span class="badge ${status === "pass" ? "pass" : "fail"}">${status === "pass" ? "pass" : "FAIL"}</span>`;
  const id = (c) => "check-" + (c.crate + "-" + c.check).replace(/[^A-Za-z0-9_-]/g, "_");
  // Leaves' figures; a training's parity against what it allows; none ("–") for a check that
  // compared nothing (a configuration error), not 0.
  const worstOf = (c) => {
    if (c.training) return ratio(c.training.worst_ratio);
    const leaves = c.leaves || [];
    return leaves.length ? leaves.reduce((m, l) => Math.max(m, ratio(l.worst_ratio) || 0), 0) : null;
  };
  // Cases: how many ran, or for a failure how many passed before it; a training has one batch.
  const casesOf = (c) => (c.kind === "overfit" ? "1 batch" : c.status === "pass" ? c.cases ?? "–" : `${c.passed_before ?? 0} + 1 failing`);
  const maxAbsOf = (c) => {
    if (c.training) return `loss ${num(ratio(c.training.loss_initial))} → ${num(ratio(c.training.loss_final))}`;
    const leaves = c.leaves || [];
    return leaves.length ? num(leaves.reduce((m, l) => Math.max(m, ratio(l.max_abs) || 0), 0)) : "–";
  };
  // How much older than the last run's newest result a result is.
  const age = (ms) => {
    if (ms === null || ms === undefined) return "of an unknown run";
    const s = ms / 1000;
    const text = s < 90 ? `${Math.round(s)} s` : s < 5400 ? `${Math.round(s / 60)} min` : s < 172800 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} days`;
    return `${text} older than the last run`;
  };

  // Speed (see runtime/src/run/speed.rs): the port's time over the reference's, medians of warm
  // runs, with the range the runs agree on (the port's lower quartile over the reference's upper
  // one, its upper quartile over their lower one).
  const secs = (x) => {
    if (x === null || x === undefined) return "–";
    const a = Math.abs(x);
    const [v, u] = a === 0 ? [0, "s"] : a < 1e-6 ? [x * 1e9, "ns"] : a < 1e-3 ? [x * 1e6, "µs"] : a < 1 ? [x * 1e3, "ms"] : [x, "s"];
    return `${+v.toPrecision(3)} ${u}`;
  };
  const times = (x) => (x === null || x === undefined ? "–" : String(+x.toPrecision(x < 10 ? 3 : 2)));
  const ratioText = (r) => (r ? `${times(r.median)}× <span class="muted">(${times(r.lo)}–${times(r.hi)}×)</span>` : "–");
  const bytes = (n) => (n === null || n === undefined ? "–" : n < 1024 ? `${n} B` : n < 1048576 ? `${+(n / 1024).toPrecision(3)} KiB` : `${+(n / 1048576).toPrecision(3)} MiB`);
  // The checks table's cell: the port over the reference in each dtype timed, or the port alone.
  const speedOf = (c) => {
    const runs = c.speed || [];
    if (!runs.length) return '<span class="muted">–</span>';
    return runs.map((s) => {
      const dtype = runs.length > 1 ? ` <span class="muted">${esc(s.dtype)}</span>` : "";
      const slow = c.speed_limit && c.speed_limit.exceeded ? ' class="point diverged"' : "";
      return s.ratio ? `<span${slow}>${times(s.ratio.median)}×</span>${dtype}` : `<span class="muted">${secs(s.port.seconds.median)} (port only)</span>${dtype}`;
    }).join("<br>");
  };

  // Where the time goes in a whole model: a pair of bars per trace point (the port's above, the
  // reference's below), on one scale, indented by how deep the point is; the ratio beside them, in
  // red where it is over 1.5 times the whole model's.
  // At most `MAX_ROWS` rows: a deep model's points down to the depth that fits (its layers at
  // least); the deeper ones are in the results file.
  const MAX_ROWS = 80;
  function speedChart(s) {
    let depth = 0;
    while (s.points.filter((p) => p.depth <= depth + 1).length <= MAX_ROWS && s.points.some((p) => p.depth > depth)) depth++;
    const points = s.points.filter((p) => p.depth <= depth);
    const rowH = 22, left = 300, right = 150, w = 1100, barW = w - left - right, top = 24;
    const h = top + points.length * rowH + 30;
    const longest = Math.max(...points.map((p) => Math.max(p.port.median, p.reference.median)), 1e-12);
    const x = (v) => (v / longest) * barW;
    const whole = s.ratio ? s.ratio.median : null;
    let rows = "";
    points.forEach((p, i) => {
      const y = top + i * rowH;
      const r = p.ratio ? p.ratio.median : null;
      const hot = whole !== null && r !== null && r > 1.5 * whole;
      const layer = p.depth === 0 ? ' class="layer"' : "";
      rows += `<g class="speed-point" data-point="${esc(p.point)}"><title>${esc(p.point)}: the port ${secs(p.port.median)} (${secs(p.port.min)}–${secs(p.port.max)}), the reference ${secs(p.reference.median)} (${secs(p.reference.min)}–${secs(p.reference.max)})</title>` +
        `<text x="${4 + 12 * p.depth}" y="${y + 14}"${layer}>${esc(p.point)}</text>` +
        `<rect class="port-bar" x="${left}" y="${y + 3}" width="${Math.max(1, x(p.port.median)).toFixed(1)}" height="8" fill="#0969da"/>` +
        `<rect class="reference-bar" x="${left}" y="${y + 12}" width="${Math.max(1, x(p.reference.median)).toFixed(1)}" height="8" fill="#8250df"/>` +
        `<text class="speed-ratio${hot ? " hot" : ""}" x="${left + barW + 8}" y="${y + 14}">${r === null ? "–" : times(r) + "×"}</text></g>`;
    });
    const legend = `<rect x="${left}" y="6" width="10" height="8" fill="#0969da"/><text x="${left + 14}" y="14">the port</text>` +
      `<rect x="${left + 90}" y="6" width="10" height="8" fill="#8250df"/><text x="${left + 104}" y="14">the reference</text>` +
      `<text x="${left + barW + 8}" y="14">port / reference</text>`;
    const axis = `<text x="${left}" y="${h - 8}">0</text><text x="${left + barW - 60}" y="${h - 8}">${secs(longest)}</text>`;
    const hidden = s.points.length - points.length;
    const more = hidden ? `<p class="muted">${hidden} deeper points are left out of the chart (at most ${MAX_ROWS} rows); the results file has them all.</p>` : "";
    return `<svg class="speed-chart" width="${w}" height="${h}" role="img" aria-label="where the time goes, port against reference">${legend}${rows}${axis}</svg>${more}`;
  }

  function speedSection(c) {
    const runs = c.speed || [];
    if (!runs.length) return "";
    let html = `<h3>Speed beside the reference</h3><table class="speed"><tr><th>dtype</th><th>case</th><th>the port</th><th>the reference</th><th>port / reference</th><th>threads</th><th>peak memory rise (port / reference)</th></tr>`;
    const threads = (side) => (side && side.threads !== null && side.threads !== undefined ? side.threads : "?");
    for (const s of runs) {
      const ref = s.reference;
      html += `<tr><td>${esc(s.dtype)}</td><td><code>${esc(s.case)}</code></td>` +
        `<td class="num">${secs(s.port.seconds.median)} <span class="muted">(${secs(s.port.seconds.min)}–${secs(s.port.seconds.max)})</span></td>` +
        `<td class="num">${ref ? `${secs(ref.seconds.median)} <span class="muted">(${secs(ref.seconds.min)}–${secs(ref.seconds.max)})</span>` : "not timed"}</td>` +
        `<td class="num">${ratioText(s.ratio)}</td>` +
        `<td>${threads(s.port)} / ${threads(ref)} <span class="muted">(candle alone: ${s.port_default_threads})</span></td>` +
        `<td class="num">${bytes(s.port.peak_bytes)} / ${ref ? bytes(ref.peak_bytes) : "–"}</td></tr>`;
      for (const [what, ph] of [["prefill", s.prefill], ["decode", s.decode]]) {
        if (!ph) continue;
        const rate = (x) => (x === null || x === undefined ? "–" : `${+x.toPrecision(3)} tok/s`);
        html += `<tr class="phase"><td></td><td>${what}: ${ph.tokens} token${ph.tokens === 1 ? "" : "s"}, ${ph.steps} step${ph.steps === 1 ? "" : "s"}</td>` +
          `<td class="num">${secs(ph.port.median)} · ${rate(ph.port_tokens_per_second)}</td>` +
          `<td class="num">${ph.reference ? secs(ph.reference.median) + " · " + rate(ph.reference_tokens_per_second) : "–"}</td>` +
          `<td class="num">${ratioText(ph.ratio)}</td><td></td><td></td></tr>`;
      }
    }
    html += `</table>`;
    const s0 = runs[0];
    html += `<p class="muted">Medians of ${s0.port.seconds.runs} timed runs on each side after ${s0.warmup} warm-up, the same inputs, parameters and dtype; ` +
      `in brackets each side's fastest and slowest run, and the range of the ratio the middle half of each side's runs agree on. A ${esc(s0.build || "?")} build of golden` + (s0.build === "debug" ? " (the port's time is its build's: optimise its dependencies for figures that mean speed)" : "") +
      `. The timing cost the check ${secs(s0.spent)}.</p>`;
    const notes = [...new Set(runs.flatMap((s) => s.notes || []))];
    if (notes.length) html += `<ul class="muted">` + notes.map((n) => `<li>${esc(n)}</li>`).join("") + `</ul>`;
    for (const s of runs) {
      if (!(s.points || []).length) continue;
      html += `<h3>Where the time goes, layer by layer (${esc(s.dtype)})</h3><p class="muted">Each trace point from the end of the point before it to its own end, ` +
        `the points inside it included; ${s.points.length} points both sides have (work between points only one side has counts in the next one both have: compare the layers, in bold, first).</p>` + speedChart(s);
    }
    return html;
  }

  // float32 values from base64
  const decode = (b64) => {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  };

  // A bar chart of an error histogram (log2 bins of |port - ref| / allowed); the red line is 1x.
  function histogramSvg(h) {
    const counts = (h && h.counts) || [];
    const w = 260, ht = 48, n = counts.length;
    if (!n && !(h && h.exact)) return '<span class="muted">–</span>';
    const top = Math.max(1, ...counts, h.exact || 0);
    const bw = w / (n + 1);
    let bars = "";
    const bar = (i, c, color) => {
      const hh = c ? Math.max(1, (Math.log1p(c) / Math.log1p(top)) * (ht - 12)) : 0;
      bars += `<rect x="${(i * bw).toFixed(1)}" y="${(ht - 10 - hh).toFixed(1)}" width="${(bw - 1).toFixed(1)}" height="${hh.toFixed(1)}" fill="${color}"><title>${c}</title></rect>`;
    };
    bar(0, h.exact || 0, "#8c959f");
    counts.forEach((c, i) => bar(i + 1, c, h.lowest_log2 + i >= 0 ? "#cf222e" : "#0969da"));
    const one = (1 - h.lowest_log2) * bw;
    return `<svg class="hist" width="${w}" height="${ht}" role="img" aria-label="error histogram">${bars}` +
      `<line x1="${one}" x2="${one}" y1="0" y2="${ht - 10}" stroke="#cf222e" stroke-dasharray="3 2"/>` +
      `<text x="0" y="${ht - 1}">exact</text><text x="${one - 8}" y="${ht - 1}">1×</text></svg>`;
  }

  // A reference point the port has no tap for: shown, but not as an error.
  const untapped = (p) => !p.port || p.worst_ratio === null || p.worst_ratio === undefined;

  // Drift against depth: log10(error / allowed) at each trace point; above the red line fails.
  // The line joins the tapped points; untapped ones are hollow grey dots on the bottom axis.
  function driftSvg(points, onPick) {
    const w = 760, h = 200, pad = 34;
    const ys = points.map((p) => {
      const r = ratio(p.worst_ratio);
      return r === 0 ? -8 : Number.isFinite(r) ? Math.max(-8, Math.min(4, Math.log10(r))) : 4;
    });
    const x = (i) => pad + (points.length > 1 ? (i * (w - 2 * pad)) / (points.length - 1) : (w - 2 * pad) / 2);
    const y = (v) => h - pad - ((v + 8) / 12) * (h - 2 * pad);
    let path = "", dots = "";
    ys.forEach((v, i) => {
      if (untapped(points[i])) {
        dots += `<circle class="dot untapped" data-i="${i}" cx="${x(i).toFixed(1)}" cy="${y(-8).toFixed(1)}" r="4" fill="#fff" stroke="#8c959f"><title>${esc(points[i].point)}: not tapped by the port</title></circle>`;
        return;
      }
      path += (path ? " L" : "M") + x(i).toFixed(1) + " " + y(v).toFixed(1);
      const bad = v > 0;
      dots += `<circle class="dot" data-i="${i}" cx="${x(i).toFixed(1)}" cy="${y(v).toFixed(1)}" r="4" fill="${bad ? "#cf222e" : "#1a7f37"}"><title>${esc(points[i].point)}: ${num(ratio(points[i].worst_ratio))}× allowed</title></circle>`;
    });
    let grid = "";
    for (let v = -8; v <= 4; v += 2) grid += `<line x1="${pad}" x2="${w - pad}" y1="${y(v)}" y2="${y(v)}" stroke="#eaeef2"/><text x="2" y="${y(v) + 3}">1e${v}</text>`;
    const svg = `<svg class="drift" width="${w}" height="${h}" role="img" aria-label="drift against depth">${grid}` +
      `<line x1="${pad}" x2="${w - pad}" y1="${y(0)}" y2="${y(0)}" stroke="#cf222e" stroke-dasharray="4 3"/>` +
      `<path d="${path}" fill="none" stroke="#0969da" stroke-width="2"/>${dots}` +
      `<text x="${pad}" y="${h - 8}">trace points in execution order →   (error / allowed, log scale; red line: the tolerance)</text></svg>`;
    const holder = document.createElement("div");
    holder.innerHTML = svg;
    holder.querySelectorAll("circle.dot").forEach((c) => c.addEventListener("click", () => onPick(+c.dataset.i)));
    return holder;
  }

  // Two tensors side by side, and their difference, over a range of flat indices.
  function viewer(section, points) {
    const box = document.createElement("div");
    const options = points.map((p, i) => `<option value="${i}">${i + 1}. ${esc(p.point)}</option>`).join("");
    box.innerHTML = `<h3>Slice viewer</h3><div class="controls">` +
      `<label>point <select class="pick">${options}</select></label>` +
      `<label>from <input class="from" type="number" min="0" value="0"></label>` +
      `<label>count <input class="count" type="number" min="1" value="32"></label>` +
      `<span class="muted info"></span></div><div class="viewer">` +
      `<div><b>reference</b><pre class="ref"></pre></div><div><b>port</b><pre class="port"></pre></div>` +
      `<div><b>port − reference</b><pre class="diff"></pre></div></div>`;
    section.appendChild(box);
    const pick = box.querySelector(".pick"), from = box.querySelector(".from"), count = box.querySelector(".count");
    const show = () => {
      const p = points[+pick.value];
      const ref = p.reference && p.reference.data ? decode(p.reference.data) : new Float32Array(0);
      const port = p.port && p.port.data ? decode(p.port.data) : null;
      const a = Math.max(0, +from.value | 0), n = Math.max(1, +count.value | 0);
      const rows = [], prow = [], drow = [];
      for (let i = a; i < Math.min(ref.length, a + n); i++) {
        const r = ref[i], q = port ? port[i] : NaN, d = q - r;
        // Highlighted: outside assert_close's float32 bound (the check's own rule may be wider).
        const off = port && !(Math.abs(d) <= 1e-5 + 1.3e-6 * Math.abs(r));
        const cls = off ? ' class="off"' : "";
        rows.push(`<span${cls}>[${i}] ${num(r)}</span>`);
        prow.push(`<span${cls}>[${i}] ${port ? num(q) : "not tapped"}</span>`);
        drow.push(`<span${cls}>[${i}] ${port ? num(d) : "–"}</span>`);
      }
      box.querySelector(".ref").innerHTML = rows.join("\n");
      box.querySelector(".port").innerHTML = prow.join("\n");
      box.querySelector(".diff").innerHTML = drow.join("\n");
      const shape = p.reference ? JSON.stringify(p.reference.shape) : "?";
      const cut = p.reference && p.reference.numel > ref.length ? ` (the first ${ref.length} of ${p.reference.numel} are embedded)` : "";
      box.querySelector(".info").textContent = `${p.point}: shape ${shape}, flat indices${cut}; error/allowed ${num(ratio(p.worst_ratio))}`;
    };
    [pick, from, count].forEach((el) => el.addEventListener("input", show));
    show();
    return (i) => { pick.value = String(i); show(); };
  }

  function checkSection(c) {
    const s = document.createElement("section");
    s.id = id(c);
    const leaves = c.leaves || [];
    let html = `<h2>${badge(c.status, c.stale)} ${esc(c.check)} <span class="muted">— ${esc(c.kind || "forward")} check of <code>${esc(c.reference)}</code></span></h2>`;
    if (c.stale) html += `<p class="stale-note">Not from the last run: ${esc(age(c.age_ms))} (run ${esc(c.run || "unknown")}). The check may have been removed, renamed or not run this time.</p>`;
    html += `<p class="muted">${esc(c.source || "")} · ${casesOf(c)}${c.kind === "overfit" ? "" : " cases"}${c.case ? " · failing case " + esc(c.case) : ""} · ${num(c.seconds)} s${c.crate ? " · crate " + esc(c.crate) : ""}</p>`;
    if (c.failure) {
      html += `<pre class="failure">${esc(c.failure)}</pre>`;
      if (c.artifacts) html += `<p>Artifacts (inputs, outputs, repro.py): <code>${esc(c.artifacts)}</code></p>`;
    }
    const rows = leaves.filter((l) => !String(l.leaf).startsWith("trace."));
    if (rows.length) {
      html += `<table><tr><th>leaf</th><th>dtype</th><th>shape</th><th>max |port − ref|</th><th>worst / allowed</th><th>errors / allowed (log₂ bins; exact, …, 1×, …)</th></tr>`;
      for (const l of rows) {
        html += `<tr><td><code>${esc(l.leaf)}</code></td><td>${esc(l.dtype || "")}</td><td>${esc(JSON.stringify(l.shape ?? []))}</td>` +
          `<td class="num">${num(ratio(l.max_abs))}</td><td class="num">${num(ratio(l.worst_ratio))}</td><td>${histogramSvg(l.histogram)}</td></tr>`;
      }
      html += `</table>`;
    }
    const t = c.training;
    if (t) {
      html += `<h3>Training on one batch, beside PyTorch</h3><table class="training">` +
        `<tr><th>loss, first step</th><th>loss, last step</th><th>loss vs PyTorch (worst step, relative)</th><th>updates vs PyTorch (worst parameter, relative)</th><th>worst / allowed</th></tr>` +
        `<tr><td class="num">${num(ratio(t.loss_initial))}</td><td class="num">${num(ratio(t.loss_final))}</td>` +
        `<td class="num">${num(ratio(t.parity_loss))} <span class="muted">(allowed ${num(t.parity_loss_allowed)})</span></td>` +
        `<td class="num">${num(ratio(t.parity_update))} <span class="muted">(allowed ${num(t.parity_update_allowed)})</span></td>` +
        `<td class="num">${num(ratio(t.worst_ratio))}</td></tr></table>`;
    }
    const figures = c.figures || {};
    if (Object.keys(figures).length) {
      html += `<h3>Figures</h3><table>` + Object.entries(figures).map(([k, v]) => `<tr><td><code>${esc(k)}</code></td><td class="num">${num(v)}</td></tr>`).join("") + `</table>`;
    }
    if ((c.health || []).length) html += `<h3>Gradient health</h3><ul>` + c.health.map((h) => `<li>${esc(h)}</li>`).join("") + `</ul>`;
    html += speedSection(c);
    s.innerHTML = html;
    const points = c.trace_points || [];
    if (points.length) {
      const first = points.findIndex((p) => !untapped(p) && !(ratio(p.worst_ratio) <= 1));
      const tapped = points.filter((p) => !untapped(p));
      const head = document.createElement("div");
      // Numbered like the failure message: among the points the port tapped.
      head.innerHTML = `<h3>Trace: drift against depth</h3><p>${points.length} reference points, ${tapped.length} tapped by the port; ` +
        (first >= 0 ? `<span class="point diverged">first divergence: ${esc(points[first].point)} (tapped point ${tapped.indexOf(points[first]) + 1} of ${tapped.length})</span>` : "every tapped point within its tolerance") + `</p>`;
      s.appendChild(head);
      let pickPoint = () => {};
      s.appendChild(driftSvg(points, (i) => pickPoint(i)));
      pickPoint = viewer(s, points);
      if (first >= 0) pickPoint(first);
    }
    return s;
  }

  // The last run's checks, and older results (see cli/src/report.rs: what a run is).
  const current = checks.filter((c) => !c.stale);
  const stale = checks.filter((c) => c.stale);
  const failing = current.filter((c) => c.status !== "pass");
  const row = (c) => `<tr class="clickable" data-target="${id(c)}"><td>${badge(c.status, c.stale)}</td><td><code>${esc(c.check)}</code>${c.trace ? ' <span class="muted">(trace)</span>' : ""}</td>` +
    `<td>${esc(c.kind || "forward")}</td><td>${esc((c.dtypes || []).join(", "))}</td><td class="num">${casesOf(c)}</td>` +
    `<td class="num">${maxAbsOf(c)}</td><td class="num">${num(worstOf(c))}</td><td class="num speed">${speedOf(c)}</td><td class="num">${c.stale ? esc(age(c.age_ms)) : num(c.seconds)}</td></tr>`;
  const head = (last) => `<tr><th></th><th>check</th><th>kind</th><th>dtypes</th><th>cases</th>` +
    `<th>max |port − ref|</th><th>worst / allowed</th><th>port / reference time</th><th>${last}</th></tr>`;
  const run = data.last_run || {};
  let top = `<h1>golden report</h1><p class="muted">From <code>${esc(data.results)}</code>: the last run` +
    (run.id ? ` (<code>${esc(run.id)}</code>, its newest result written ${esc(new Date(run.written_ms).toISOString())})` : "") + `.</p>` +
    `<div class="chips"><span>${current.length} checks</span><span>${current.length - failing.length} pass</span>` +
    `<span>${failing.length} fail</span>${stale.length ? `<span class="stale-chip">${stale.length} stale</span>` : ""}</div>` +
    `<h2>Checks of the last run</h2><table class="checks">${head("seconds")}${current.map(row).join("")}</table>`;
  if (stale.length) {
    top += `<h2 id="stale">Older results, not from the last run</h2><p class="muted">Left in the results folder by ` +
      `earlier runs: checks since removed or renamed, or not run this time (another test target, a filter, an earlier mode). ` +
      `They count in no figure above; delete the folder to drop them.</p>` +
      `<table class="checks stale">${head("age")}${stale.map(row).join("")}</table>`;
  }
  root.innerHTML = top;
  root.querySelectorAll("tr.clickable").forEach((tr) => tr.addEventListener("click", () => document.getElementById(tr.dataset.target).scrollIntoView()));
  // Failing checks first, then the rest, then the stale ones.
  for (const c of [...failing, ...current.filter((c) => c.status === "pass"), ...stale]) root.appendChild(checkSection(c));
  document.title = `golden report: ${current.length} checks, ${failing.length} failing` +
    (stale.length ? `; ${stale.length} stale from earlier runs` : "");
  document.body.dataset.rendered = "1";
})();
