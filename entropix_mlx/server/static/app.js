// The chat page: streams each answer from /v1/chat/completions (the same API
// other clients use), colouring tokens as they arrive.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const state = { info: null, messages: [], busy: false, controller: null, last: null };

  const headers = () => {
    const h = { "Content-Type": "application/json" };
    const key = $("api-key").value || localStorage.getItem("entropix-api-key");
    if (key) h.Authorization = `Bearer ${key}`;
    return h;
  };

  function notice(text) {   // a problem outside any answer (no key yet, server gone)
    $("notice").textContent = text ? `error: ${text}` : "";
    $("notice").hidden = !text;
  }

  function needKey() {
    $("key-label").hidden = false;
    $("api-key").focus();
  }

  async function loadInfo() {
    const r = await fetch("/v1/entropix/info", { headers: headers() });
    if (r.status === 401) { needKey(); throw new Error("this server needs an API key: enter it above"); }
    if (!r.ok) throw new Error(`could not read /v1/entropix/info (${r.status})`);
    state.info = await r.json();
    notice("");
    $("model").textContent = `${state.info.model} · thresholds: ${state.info.thresholds_from}`;
    $("sampler").replaceChildren(...state.info.samplers.map((s) => new Option(s, s)));
    showLegend();
  }

  function showLegend() {
    const sampler = $("sampler").value;
    EntropixView.legend($("legend"), state.info, state.info.legends[sampler] || []);
  }

  function addMessage(role, text) {
    const msg = document.createElement("div");
    msg.className = `msg ${role}`;
    const who = document.createElement("div");
    who.className = "who";
    who.textContent = role;
    const body = document.createElement("div");
    body.className = "body";
    if (text !== undefined) body.textContent = text;
    msg.append(who, body);
    $("chat").append(msg);
    return { msg, body };
  }

  // Server-sent events from a fetch body: yields each `data:` payload.
  async function* events(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (data) yield data;
      }
    }
  }

  async function send(text) {
    if (state.busy || !text.trim()) return;
    if (!state.info) {
      try { await loadInfo(); } catch (e) { notice(e.message); return; }
    }
    state.busy = true;
    $("hint").hidden = true;
    $("send").disabled = true;
    $("stop").hidden = false;
    addMessage("user", text);
    state.messages.push({ role: "user", content: text });
    const { msg, body } = addMessage("assistant");
    const view = EntropixView.answer(body, state.info);
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("class", "chart");
    const status = document.createElement("div");
    status.className = "status";
    status.textContent = "waiting…";
    msg.append(svg, status);
    const sampler = $("sampler").value;
    const request = {
      model: state.info.model, messages: state.messages, sampler, stream: true,
      stream_options: { include_usage: true }, logprobs: true, top_logprobs: 5,
    };
    const seed = $("seed").value.trim(), maxTokens = $("max-tokens").value;
    if (maxTokens !== "") request.max_tokens = Number(maxTokens);
    if ($("json-answer").checked) request.response_format = { type: "json_object" };
    // Seeds go up to 2^63, past what a JavaScript number holds exactly: the seed
    // travels as its digits, spliced into the JSON text, never through Number.
    let payload = JSON.stringify(request);
    if (/^\d+$/.test(seed)) payload = payload.slice(0, -1) + `,"seed":${seed}}`;
    else if (seed !== "") payload = payload.slice(0, -1) + `,"seed":${JSON.stringify(seed)}}`;
    state.controller = new AbortController();
    let text_ = "", finish = null, usage = null, usedSeed = null, redraw = 0;
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: payload, signal: state.controller.signal,
      });
      if (!r.ok) {
        const err = await r.json().catch(() => ({}));
        if (r.status === 401) needKey();
        throw new Error((err.error && err.error.message) || `HTTP ${r.status}`);
      }
      status.textContent = "generating…";
      for await (const data of events(r)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.seed !== undefined) usedSeed = /"seed":\s*(\d+)/.exec(data)[1];  // its exact digits
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices[0];
        if (!choice) continue;
        const entries = (choice.logprobs && choice.logprobs.content) || [];
        (choice.entropix || []).forEach((rec, i) => {
          const lp = entries[i];
          view.add({ ...rec, alternatives: lp ? lp.top_logprobs.map((a) => ({ token: a.token, logprob: a.logprob })) : [] });
        });
        if (choice.delta && choice.delta.content) text_ += choice.delta.content;
        if (choice.finish_reason) finish = choice.finish_reason;
        if (choice.entropix_fields) EntropixView.shadeFields(body, choice.entropix_fields, msg);
        if (choice.entropix_deliberation) EntropixView.deliberation(msg, choice.entropix_deliberation);
        if (!redraw) redraw = requestAnimationFrame(() => { redraw = 0; EntropixView.chart(svg, view.tokens, state.info.thresholds); });
      }
    } catch (e) {
      if (e.name === "AbortError") finish = "stopped";
      else { status.classList.add("error"); status.textContent = `error: ${e.message}`; }
    } finally {
      EntropixView.chart(svg, view.tokens, state.info.thresholds);
      state.messages.push({ role: "assistant", content: text_ });
      if (!status.classList.contains("error")) {
        const parts = [`${view.tokens.length} tokens`];
        if (usage) parts.push(`prompt ${usage.prompt_tokens} (cached ${usage.prompt_tokens_details.cached_tokens})`);
        parts.push(`sampler ${sampler}`, `seed ${usedSeed}`, `stopped: ${finish}`);
        status.textContent = parts.join(" · ");
      }
      state.last = { model: state.info.model, sampler, seed: usedSeed, messages: state.messages.slice(0, -1),
                     tokens: view.tokens, summary: status.textContent, info: state.info };
      $("export").disabled = false;
      state.busy = false;
      $("send").disabled = false;
      $("stop").hidden = true;
      msg.scrollIntoView({ block: "end" });
    }
  }

  // Export: the same self-contained file as `entropix-mlx run --html`.
  async function exportAnswer() {
    if (!state.last) return;
    const [css, script] = await Promise.all(["/static/style.css", "/static/view.js"].map((u) => fetch(u).then((r) => r.text())));
    const html = EntropixView.exportHtml(css, script, state.last);
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([html], { type: "text/html" }));
    a.download = "entropix-answer.html";
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }

  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("prompt").value;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("sampler").addEventListener("change", showLegend);
  $("new-chat").addEventListener("click", () => {
    if (!state.busy) { state.messages = []; $("chat").replaceChildren(); $("hint").hidden = false; }
  });
  $("export").addEventListener("click", exportAnswer);
  $("api-key").addEventListener("change", () => {
    localStorage.setItem("entropix-api-key", $("api-key").value);
    loadInfo().catch((e) => notice(e.message));
  });
  EntropixView.attachTooltip($("chat"), $("tooltip"));
  loadInfo().catch((e) => notice(e.message));
})();
