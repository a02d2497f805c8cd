// Rendering shared by the live page (app.js) and an exported answer: tokens
// coloured by strategy, the hover/tap details, the legend, the entropy chart,
// deliberate's reasons.
// A token here is a `run --json` record plus `alternatives`: [{token, logprob}].
"use strict";
const EntropixView = (() => {
  const METRICS = ["entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement", "interaction_strength"];
  const PARAMS = ["temperature", "top_k", "top_p", "min_p"];
  const SVG = "http://www.w3.org/2000/svg";

  function colorOf(info, strategy) {
    if (!info.colors[strategy]) {   // a strategy a newer sampler adds: still its own colour
      const known = Object.keys(info.colors).length;
      info.colors[strategy] = info.spare_colors[known % info.spare_colors.length];
    }
    return info.colors[strategy];
  }

  // A terminal style may be more than a colour ("green underline").
  function paint(node, info, strategy) {
    node.style.color = colorOf(info, strategy);
    const deco = (info.decorations || {})[strategy] || [];
    if (deco.includes("underline")) node.style.textDecoration = "underline";
    if (deco.includes("bold")) node.style.fontWeight = "bold";
    if (deco.includes("italic")) node.style.fontStyle = "italic";
  }

  function el(tag, attrs = {}, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function legend(container, info, strategies) {
    container.replaceChildren(el("span", { class: "meta" }, "strategies: "));
    for (const name of strategies) {
      const entry = el("span", { class: "entry", "data-strategy": name, title: (info.meanings || {})[name] || "" });
      const swatch = el("span", { class: "swatch" });
      swatch.style.background = colorOf(info, name);
      const label = el("span", {}, name);
      paint(label, info, name);
      entry.append(swatch, label);
      container.append(entry);
    }
  }

  const fmt = (v, d = 3) => (v === null || v === undefined ? "–" : typeof v === "number" ? (+v.toFixed(d)).toString() : String(v));
  const visible = (s) => JSON.stringify(s).slice(1, -1);   // "\n" shown as \n, spaces kept

  // One answer: a container of token spans; `tokens` is kept on it for the details.
  function answer(container, info) {
    container.classList.add("answer");
    container.entropixTokens = [];
    return {
      add(tok) {
        const i = container.entropixTokens.push(tok) - 1;
        const span = el("span", { class: "tok", "data-strategy": tok.strategy, "data-index": i }, tok.text);
        paint(span, info, tok.strategy);
        container.append(span);
        return span;
      },
      tokens: container.entropixTokens,
    };
  }

  // A structured answer: each value's tokens shaded by how unsure the model was of
  // it (its lowest token probability), the value and both confidences on hover,
  // and one line per value under the answer, the least sure first.
  function shadeFields(container, fields, after) {
    const spans = container.querySelectorAll("span.tok");
    for (const f of fields) {
      const unsure = 1 - f.min_confidence;
      const tip = `${f.path} = ${JSON.stringify(f.value)}: lowest ${fmt(f.min_confidence, 2)}, mean ${fmt(f.mean_confidence, 2)}`;
      for (let i = f.tokens[0]; i <= f.tokens[1] && i < spans.length; i++) {
        spans[i].style.background = `rgba(204, 85, 90, ${(0.15 + 0.6 * unsure).toFixed(3)})`;
        spans[i].classList.add("field");
        spans[i].setAttribute("data-field", f.path);
        spans[i].title = tip;
      }
    }
    const list = el("div", { class: "fields" });
    list.append(el("div", { class: "meta" }, "values, least sure first (lowest / mean confidence):"));
    for (const f of [...fields].sort((a, b) => a.min_confidence - b.min_confidence)) {
      list.append(el("div", { "data-field": f.path }, `${f.path}  ${JSON.stringify(f.value)}  ${fmt(f.min_confidence, 2)} / ${fmt(f.mean_confidence, 2)}`));
    }
    (after || container).append(list);
  }

  // Deliberate's reasons, as `run` prints them: each candidate's answer (cut to the
  // column, whole on hover), confidence, score, tokens and ending, then the rule line.
  function deliberation(after, d) {
    const table = el("table", { class: "deliberation" });
    const head = el("tr");
    for (const name of ["candidate", "answer", "confidence", "score", "tokens", "ended"]) head.append(el("th", {}, name));
    table.append(head);
    d.table.forEach((r, i) => {
      const row = el("tr", i === d.chosen ? { class: "chosen" } : {});
      const answer = r.answer === null ? "none" : r.answer;
      row.append(el("td", { "data-column": "candidate" }, r.candidate + (i === d.chosen ? " (chosen)" : "")),
                 el("td", { "data-column": "answer", class: "answer-cell", title: answer }, answer),
                 el("td", { "data-column": "confidence", class: "num" }, r.confidence.toFixed(3)),
                 el("td", { "data-column": "score", class: "num" }, r.score === null ? "" : r.score.toFixed(3)),
                 el("td", { "data-column": "tokens", class: "num" }, String(r.tokens)),
                 el("td", { "data-column": "ended" }, r.ended + (r.left_out ? ` (left out: ${r.left_out})` : "")));
      table.append(row);
    });
    const box = el("div", { class: "deliberation" });
    box.append(table, el("div", { class: "meta rule" }, `rule: ${d.reason}`));
    after.append(box);
  }

  function details(tok) {
    const box = document.createElement("div");
    const head = el("div");
    const name = el("b", {}, tok.strategy);
    head.append(name, document.createTextNode(`  “${visible(tok.text)}”  id ${tok.token}`));
    box.append(head);
    const lp = tok.logprob;
    box.append(el("div", {}, `logprob ${fmt(lp)}` + (typeof lp === "number" ? `  (p = ${fmt(Math.exp(lp), 4)})` : "")));
    const table = el("table", { class: "metrics" });
    for (const k of METRICS) {
      const row = el("tr", { "data-metric": k });
      row.append(el("td", {}, k), el("td", { class: "num" }, fmt(tok[k])));
      table.append(row);
    }
    box.append(el("h4", {}, "metrics (bits, bits²)"), table);
    const params = PARAMS.filter((k) => tok[k] !== undefined).map((k) => `${k} ${fmt(tok[k])}`).join(" · ");
    if (params) box.append(el("h4", {}, "sampling"), el("div", {}, params));
    if (tok.note) box.append(el("div", {}, `note: ${tok.note}`));
    if (tok.alternatives && tok.alternatives.length) {
      const alts = el("table", { class: "alternatives" });
      for (const a of tok.alternatives) {
        const row = el("tr", a.token === tok.text ? { class: "chosen" } : {});
        row.append(el("td", {}, `“${visible(a.token)}”`), el("td", { class: "num" }, fmt(a.logprob)),
                   el("td", { class: "num" }, `${fmt(100 * Math.exp(a.logprob), 1)}%`));
        alts.append(row);
      }
      box.append(el("h4", {}, "top alternatives (logprob, p)"), alts);
    } else if (tok.alternatives) {
      // Several tokens chosen in one decision (a branch rollout, a thinking insertion):
      // the model's alternatives exist only for the first of them.
      box.append(el("h4", {}, "top alternatives"), el("div", {}, "none: chosen in one step with the token before"));
    }
    return box;
  }

  // Hover (mouse) or tap (touch) a token for its details; one tooltip for the page.
  function attachTooltip(root, tooltip) {
    let active = null;
    const show = (span, x, y) => {
      const tokens = span.parentElement.entropixTokens;
      if (!tokens) return;
      if (active) active.classList.remove("active");
      active = span;
      span.classList.add("active");
      tooltip.replaceChildren(details(tokens[+span.dataset.index]));
      tooltip.hidden = false;
      const w = tooltip.offsetWidth, h = tooltip.offsetHeight;
      tooltip.style.left = `${Math.max(4, Math.min(x + 12, window.innerWidth - w - 4))}px`;
      tooltip.style.top = `${y + 16 + h > window.innerHeight ? Math.max(4, y - h - 8) : y + 16}px`;
    };
    const hide = () => { tooltip.hidden = true; if (active) active.classList.remove("active"); active = null; };
    root.addEventListener("mouseover", (e) => { const s = e.target.closest(".tok"); if (s) show(s, e.clientX, e.clientY); });
    root.addEventListener("mouseout", (e) => { if (e.target.closest(".tok")) hide(); });
    root.addEventListener("click", (e) => {
      const s = e.target.closest(".tok");
      if (s) { const r = s.getBoundingClientRect(); show(s, r.left, r.bottom - 8); } else hide();
    });
  }

  // Entropy and varentropy per token, with the sampler's thresholds as dashed lines.
  // The series' legend has a band of its own above the plot, so no threshold line
  // crosses it; threshold labels sit in the right margin, a line apart at least.
  function chart(svg, tokens, thresholds) {
    const W = 980, H = 190, L = 34, R = 190, T = 24, B = 22, LINE = 13;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.replaceChildren();
    const t = thresholds || {};
    const values = tokens.flatMap((k) => [k.entropy, k.varentropy]).filter((v) => typeof v === "number");
    const tvals = ["medium_entropy", "high_entropy", "high_varentropy"].map((k) => t[k]).filter((v) => typeof v === "number");
    const ymax = Math.max(1, ...values, ...tvals) * 1.05;
    const n = Math.max(tokens.length, 2);
    const x = (i) => L + (i * (W - L - R)) / (n - 1);
    const y = (v) => T + (1 - v / ymax) * (H - T - B);
    const add = (tag, attrs, text) => {
      const node = document.createElementNS(SVG, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
      return node;
    };
    add("line", { class: "axis", x1: L, x2: W - R, y1: y(0), y2: y(0) });
    add("line", { class: "axis", x1: L, x2: L, y1: T, y2: y(0) });
    for (const v of [0, ymax / 2, ymax / 1.05]) add("text", { x: 2, y: y(v) + 3 }, fmt(v, 1));
    add("text", { x: L, y: H - 6 }, "token 1");
    // Before the second token (while an answer starts streaming) there is no end to name.
    if (tokens.length > 1) add("text", { x: W - R - 40, y: H - 6 }, `token ${tokens.length}`);
    const lines = [["low_entropy", "entropy-t"], ["medium_entropy", "entropy-t"], ["high_entropy", "entropy-t"],
                   ["low_varentropy", "varentropy-t"], ["high_varentropy", "varentropy-t"]];
    const labels = [];
    for (const [name, cls] of lines) {
      if (typeof t[name] !== "number" || t[name] > ymax) continue;
      add("line", { class: `threshold ${cls}`, "data-threshold": name, x1: L, x2: W - R, y1: y(t[name]), y2: y(t[name]) });
      // Thresholds of one metric at one value share a label that names them all
      // ("low/high_varentropy 6.3"): two labels with one number read as two different lines.
      const same = labels.find((l) => l.cls === cls && l.value === fmt(t[name], 2));
      if (same) {
        same.names.push(name);
        const metric = name.slice(name.indexOf("_"));
        same.text = `${same.names.map((m) => m.slice(0, m.indexOf("_"))).join("/")}${metric} ${same.value}`;
        continue;
      }
      labels.push({ y: y(t[name]) + 3, text: `${name} ${fmt(t[name], 2)}`, cls, name, names: [name],
                    value: fmt(t[name], 2), order: labels.length });
    }
    // Each label as near its line as the others allow: top-down at least a line apart,
    // then bottom-up back inside the chart.
    labels.sort((a, b) => a.y - b.y || b.order - a.order);   // equal values: high_ above low_
    const top = T + 2, bottom = H - B + 3;
    labels.forEach((l, i) => { l.y = Math.max(l.y, top, i ? labels[i - 1].y + LINE : top); });
    for (let i = labels.length - 1; i >= 0; i--) {
      const l = labels[i];
      l.y = Math.min(l.y, i < labels.length - 1 ? labels[i + 1].y - LINE : bottom);
    }
    for (const l of labels) add("text", { x: W - R + 4, y: l.y, class: `label ${l.cls}`, "data-label": l.name }, l.text);
    for (const key of ["entropy", "varentropy"]) {
      const pts = tokens.map((k, i) => (typeof k[key] === "number" ? `${x(i)},${y(k[key])}` : null)).filter(Boolean);
      if (pts.length) add("polyline", { class: key, "data-series": key, points: pts.join(" ") });
    }
    add("text", { x: L + 6, y: T - 9, class: "series", style: "fill: var(--entropy)" }, "— entropy (bits)");
    add("text", { x: L + 130, y: T - 9, class: "series", style: "fill: var(--varentropy)" }, "— varentropy (bits²)");
  }

  // A whole answer from data (an export): the conversation, the answer, its chart.
  function renderExport(root, data) {
    const info = data.info;
    root.append(el("h1", {}, "entropix-mlx"),
                el("div", { class: "meta" }, `${data.model} · sampler ${data.sampler} · seed ${data.seed}` +
                   (info.thresholds_from ? ` · thresholds: ${info.thresholds_from}` : "")));
    const leg = el("div", { class: "legend" });
    legend(leg, info, info.legends[data.sampler] || [...new Set(data.tokens.map((t) => t.strategy))]);
    root.append(leg);
    for (const m of data.messages || []) {
      const msg = el("div", { class: `msg ${m.role}` });
      msg.append(el("div", { class: "who" }, m.role), el("div", { class: "body" }, m.content));
      root.append(msg);
    }
    const msg = el("div", { class: "msg assistant" });
    const body = el("div");
    msg.append(el("div", { class: "who" }, "assistant"), body);
    const view = answer(body, info);
    data.tokens.forEach((t) => view.add(t));
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "chart");
    msg.append(svg);
    if (data.summary) msg.append(el("div", { class: "status" }, data.summary));
    root.append(msg);
    chart(svg, data.tokens, info.thresholds);
    const tip = el("div", { class: "tooltip", role: "tooltip", hidden: "" });
    document.body.append(tip);
    attachTooltip(root, tip);
  }

  // The self-contained file an export writes: this script, the sheet and the data inline.
  function exportHtml(css, script, data) {
    const json = JSON.stringify(data).replace(/</g, "\\u003c");
    return `<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n` +
      `<title>entropix-mlx answer</title>\n<style>\n${css}</style>\n</head>\n<body class="export">\n` +
      `<main id="export"></main>\n<script type="application/json" id="entropix-data">${json}<\/script>\n` +
      `<script>\n${script}<\/script>\n<script>EntropixView.renderExport(document.getElementById("export"), ` +
      `JSON.parse(document.getElementById("entropix-data").textContent));<\/script>\n</body>\n</html>\n`;
  }

  return { colorOf, legend, answer, attachTooltip, chart, renderExport, exportHtml, details, shadeFields, deliberation };
})();
