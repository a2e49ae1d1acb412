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
  const badge = (status) => `<span class="badge ${status === "pass" ? "pass" : "fail"}">${status === "pass" ? "pass" : "FAIL"}</span>`;
  const id = (c) => "check-" + (c.crate + "-" + c.check).replace(/[^A-Za-z0-9_-]/g, "_");
  const worstOf = (c) => (c.leaves || []).reduce((m, l) => Math.max(m, ratio(l.worst_ratio) || 0), 0);
  // Cases: how many ran, or for a failure how many passed before it.
  const casesOf = (c) => (c.status === "pass" ? c.cases ?? "–" : `${c.passed_before ?? 0} + 1 failing`);
  const maxAbsOf = (c) => (c.leaves || []).reduce((m, l) => Math.max(m, ratio(l.max_abs) || 0), 0);

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
    let html = `<h2>${badge(c.status)} ${esc(c.check)} <span class="muted">— ${esc(c.kind || "forward")} check of <code>${esc(c.reference)}</code></span></h2>`;
    html += `<p class="muted">${esc(c.source || "")} · ${casesOf(c)} cases${c.case ? " · failing case " + esc(c.case) : ""} · ${num(c.seconds)} s${c.crate ? " · crate " + esc(c.crate) : ""}</p>`;
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
    const figures = c.figures || {};
    if (Object.keys(figures).length) {
      html += `<h3>Figures</h3><table>` + Object.entries(figures).map(([k, v]) => `<tr><td><code>${esc(k)}</code></td><td class="num">${num(v)}</td></tr>`).join("") + `</table>`;
    }
    if ((c.health || []).length) html += `<h3>Gradient health</h3><ul>` + c.health.map((h) => `<li>${esc(h)}</li>`).join("") + `</ul>`;
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

  const failing = checks.filter((c) => c.status !== "pass");
  let top = `<h1>golden report</h1><p class="muted">From <code>${esc(data.results)}</code>.</p>` +
    `<div class="chips"><span>${checks.length} checks</span><span>${checks.length - failing.length} pass</span>` +
    `<span>${failing.length} fail</span></div>` +
    `<h2>Checks</h2><table class="checks"><tr><th></th><th>check</th><th>kind</th><th>dtypes</th><th>cases</th>` +
    `<th>max |port − ref|</th><th>worst / allowed</th><th>seconds</th></tr>`;
  for (const c of checks) {
    top += `<tr class="clickable" data-target="${id(c)}"><td>${badge(c.status)}</td><td><code>${esc(c.check)}</code>${c.trace ? ' <span class="muted">(trace)</span>' : ""}</td>` +
      `<td>${esc(c.kind || "forward")}</td><td>${esc((c.dtypes || []).join(", "))}</td><td class="num">${casesOf(c)}</td>` +
      `<td class="num">${num(maxAbsOf(c))}</td><td class="num">${num(worstOf(c))}</td><td class="num">${num(c.seconds)}</td></tr>`;
  }
  top += `</table>`;
  root.innerHTML = top;
  root.querySelectorAll("tr.clickable").forEach((tr) => tr.addEventListener("click", () => document.getElementById(tr.dataset.target).scrollIntoView()));
  // Failing checks first, then the rest.
  for (const c of [...failing, ...checks.filter((c) => c.status === "pass")]) root.appendChild(checkSection(c));
  document.title = `golden report: ${checks.length} checks, ${failing.length} failing`;
  document.body.dataset.rendered = "1";
})();
