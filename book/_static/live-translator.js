// The live translator (book/notebooks/93_translator_live): chapter 7's shipped model,
// exported to ONNX by tools/onnx_export.py, run in the page by ONNX Runtime Web.
//
// Nothing is fetched until the reader starts the model: then the runtime (its
// WebAssembly build, from the site's own _vendor/onnxruntime-web) and the model
// (_vendor/translator). Greedy decoding as mha.translator.greedy_decode does it: encode
// once, run the decoder on the whole prefix at every step, take the last row's argmax,
// stop at </s> or after max_len - 1 tokens. The decoder has no cache, so the last
// step's maps hold every step's row: row t is the step that wrote word t.
//
// Every word the interface shows comes from the page (the containers named
// live-s-<key>), so that the Chinese edition's catalog translates them.
// window.liveTranslator is what the browser tests drive (tests/test_site.py).
(() => {
  // The site's _vendor folder, beside _static (shared by both editions). The script is
  // loaded in the page's head: the rest waits for the page's body.
  const VENDOR = new URL("../_vendor/", document.currentScript.src).href;
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", () => livePage(VENDOR));
  } else {
    livePage(VENDOR);
  }
})();

// Everything below is one function, called once the page's body is there.
function livePage(VENDOR) {
  const root = document.querySelector(".live-translator");
  if (!root) return;
  const RUNTIME = `${VENDOR}onnxruntime-web/`;
  const MODEL = `${VENDOR}translator/`;
  const STEP_DELAY_MS = 150; // so that a reader sees the words come one by one
  const ATTENTIONS = ["encoder", "decoderSelf", "cross"];

  // --- the page's words --------------------------------------------------------------
  // (ids are lower-case, as docutils writes them; a word the page lacks is an error)
  const words = {};
  document.querySelectorAll(".live-string").forEach((box) => {
    words[box.id.replace(/^live-s-/, "")] = box.textContent.trim();
  });
  const S = new Proxy(words, { get: (all, key) => {
    const found = all[String(key).toLowerCase()];
    if (found === undefined) throw new Error(`live-translator: the page has no live-s-${key}`);
    return found;
  } });
  const fill = (text, values) => text.replace(/\{(\w+)\}/g, (m, k) => (k in values ? values[k] : m));

  // --- small DOM helpers ---------------------------------------------------------------
  const SVG = "http://www.w3.org/2000/svg";
  function el(tag, attrs = {}, ...children) {
    const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const child of children.flat()) if (child) node.append(child);
    return node;
  }
  let uid = 0;
  const newId = (stem) => `live-${stem}-${++uid}`;

  // --- the grammar: which sentences the model was made for ------------------------------
  // States of a left-to-right reading (tools/onnx_export.py: grammar_tables says what a
  // sentence is). null: the words cannot go on.
  let G = null; // filled from translator.json
  function tables(meta) {
    const g = meta.grammar;
    const pairs = (list) => new Map(list.flatMap(([sg, pl]) => [[sg, 0], [pl, 1]]));
    return {
      sg: new Set(g.singular_determiners), pl: new Set(g.plural_determiners),
      adjectives: new Set(g.adjectives), nouns: pairs(g.nouns),
      intransitive: pairs(g.intransitive_verbs), transitive: pairs(g.transitive_verbs),
      phrases: g.phrases.map((p) => p.split(" ")),
      vocab: new Map(meta.src_vocab.map((w, i) => [w, i])),
    };
  }
  const vowel = (w) => /^[aeiou]/.test(w);
  function determiner(word, object) {
    const numbers = [];
    const article = word === "a" || word === "an";
    if (G.sg.has(word) || article) numbers.push(0);
    if (G.pl.has(word) && !article) numbers.push(1);
    return numbers.length ? { at: "det", numbers, article: article ? word : null, object } : null;
  }
  function step(state, word) {
    const s = state;
    if (s.at === "start") {
      const det = determiner(word, false);
      if (det) return det;
      const phrases = G.phrases.filter((p) => p[0] === word);
      return phrases.length ? { at: "phrase", phrases, n: 1 } : null;
    }
    if (s.at === "phrase") {
      const phrases = s.phrases.filter((p) => p[s.n] === word);
      return phrases.length ? { at: "phrase", phrases, n: s.n + 1 } : null;
    }
    if (s.at === "det" || s.at === "adj") {
      if (s.article && (s.article === "an") !== vowel(word)) return null; // a cat, an old cat
      if (G.adjectives.has(word) && !(s.adjectives || []).includes(word)) {
        return { ...s, at: "adj", article: null, adjectives: [...(s.adjectives || []), word] };
      }
      if (G.nouns.has(word) && s.numbers.includes(G.nouns.get(word))) {
        return s.object ? { at: "object" } : { at: "subject", plural: G.nouns.get(word) };
      }
      return null;
    }
    if (s.at === "subject") {
      if (G.intransitive.get(word) === s.plural) return { at: "verb", plural: s.plural };
      if (G.transitive.get(word) === s.plural) return { at: "transitive" };
      return null;
    }
    if (s.at === "transitive") return determiner(word, true);
    if (s.at === "verb") return word === "and" ? { at: "and", plural: s.plural } : null;
    if (s.at === "and") { // a second verb of the same subject, or a new clause
      if (G.intransitive.get(word) === s.plural) return { at: "second" };
      return determiner(word, false);
    }
    if (s.at === "second" || s.at === "object") return word === "and" ? { at: "clause" } : null;
    if (s.at === "clause") return determiner(word, false);
    return null;
  }
  const complete = (s) => ["verb", "second", "object"].includes(s.at)
    || (s.at === "phrase" && s.phrases.some((p) => p.length === s.n));
  const tokenize = (text) => text.toLowerCase().replace(/[.,;:!?¡¿"]/g, " ").split(/\s+/)
    .filter(Boolean);

  // The reader's sentence against the grammar: {words} or {problem}.
  function check(text, maxLen) {
    const words = tokenize(text);
    if (!words.length) return { problem: S.empty };
    const unknown = words.find((w) => !G.vocab.has(w) || G.vocab.get(w) < 3);
    if (unknown !== undefined) return { problem: fill(S.unknown, { word: unknown }) };
    if (words.length > maxLen) return { problem: fill(S.long, { max: maxLen }) };
    let state = { at: "start" };
    for (const word of words) {
      state = step(state, word);
      if (!state) return { problem: fill(S.from, { word }) };
    }
    return complete(state) ? { words } : { problem: S.incomplete };
  }
  // The words that may come next after `words` (all valid so far).
  function nextWords(words) {
    let state = { at: "start" };
    for (const word of words) {
      state = step(state, word);
      if (!state) return [];
    }
    return [...G.vocab.keys()].filter((w) => G.vocab.get(w) >= 3 && step(state, w));
  }

  // --- the model -------------------------------------------------------------------------
  let model = null; // {meta, encoder, decoder}
  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const script = el("script", { src });
      script.onload = resolve;
      script.onerror = () => reject(new Error(`${src} did not load`));
      document.head.append(script);
    });
  }
  async function loadModel() {
    if (model) return model;
    await loadScript(`${RUNTIME}ort.wasm.min.js`);
    const ort = window.ort;
    // One thread: more need cross-origin isolation, which a static host does not give.
    ort.env.wasm.numThreads = 1;
    ort.env.wasm.wasmPaths = RUNTIME;
    const meta = await (await fetch(`${MODEL}translator.json`)).json();
    const [encoder, decoder] = await Promise.all([meta.encoder, meta.decoder].map((f) =>
      ort.InferenceSession.create(`${MODEL}${f}`, { executionProviders: ["wasm"] })));
    G = tables(meta);
    model = { meta, encoder, decoder, ort };
    return model;
  }
  const ids = (list) => BigInt64Array.from(list, (i) => BigInt(i));
  // (1, H, R, C) output -> [H][R] rows of C floats (views, no copies)
  function heads(tensor) {
    const [, H, R, C] = tensor.dims;
    return Array.from({ length: H }, (_, h) => Array.from({ length: R }, (_, r) =>
      tensor.data.subarray((h * R + r) * C, (h * R + r + 1) * C)));
  }
  function headMask(silenced, kind, layers, H) {
    const mask = new Float32Array(layers * H).fill(1);
    for (const key of silenced) {
      const [k, l, h] = key.split(":");
      if (k === kind) mask[Number(l) * H + Number(h)] = 0;
    }
    return new model.ort.Tensor("float32", mask, [layers, H]);
  }
  // Greedy decoding; onStep(state) after each word. Returns the state.
  async function translate(words, silenced, onStep, delay) {
    const { meta, encoder, decoder, ort } = model;
    const H = meta.num_heads;
    const src = new ort.Tensor("int64", ids(words.map((w) => G.vocab.get(w))), [1, words.length]);
    const enc = await encoder.run({ src, head_mask: headMask(silenced, "encoder", meta.num_encoder_layers, H) });
    const encoderMaps = meta.encoder_outputs.slice(1).map((name) => heads(enc[name]));
    const masks = {
      self_head_mask: headMask(silenced, "decoderSelf", meta.num_decoder_layers, H),
      cross_head_mask: headMask(silenced, "cross", meta.num_decoder_layers, H),
    };
    const out = [meta.bos_id];
    const state = { source: words, target: [], ids: [], encoder: encoderMaps, decoderSelf: [],
      cross: [], done: false };
    for (let t = 0; t < meta.max_len - 1; t += 1) {
      const tgt = new ort.Tensor("int64", ids(out), [1, out.length]);
      const dec = await decoder.run({ tgt_in: tgt, memory: enc.memory, src, ...masks });
      const V = dec.logits.dims[2];
      const last = dec.logits.data.subarray((out.length - 1) * V, out.length * V);
      let best = 0; // the first of equal maxima, as torch's argmax
      for (let v = 1; v < V; v += 1) if (last[v] > last[best]) best = v;
      out.push(best);
      state.ids.push(best);
      state.target.push(meta.tgt_vocab[best]);
      const outputs = meta.decoder_outputs;
      state.decoderSelf = outputs.filter((n) => n.startsWith("decoder_self")).map((n) => heads(dec[n]));
      state.cross = outputs.filter((n) => n.startsWith("cross")).map((n) => heads(dec[n]));
      state.done = best === meta.eos_id;
      if (onStep) onStep(state);
      if (state.done) break;
      if (delay) await new Promise((r) => setTimeout(r, delay));
    }
    return state;
  }

  // --- the interface ---------------------------------------------------------------------
  const noscript = document.querySelector(".live-noscript");
  if (noscript) noscript.remove();
  const ui = {};
  const inputId = newId("sentence");
  const listId = newId("completions");
  ui.input = el("input", { id: inputId, type: "text", list: listId, autocomplete: "off",
    spellcheck: "false", value: root.dataset.example || "" });
  ui.list = el("datalist", { id: listId });
  ui.next = el("select", { id: newId("next") });
  ui.start = el("button", { type: "button", class: "live-start", text: S.start });
  ui.clear = el("button", { type: "button", text: S.clear });
  ui.status = el("p", { class: "live-status", role: "status", "aria-live": "polite" });
  ui.output = el("div", { class: "live-output", hidden: true });
  const hintId = newId("hint");
  ui.input.setAttribute("aria-describedby", hintId);
  root.append(
    el("div", { class: "live-form" },
      el("label", { for: inputId, text: S.sentence }),
      el("p", { id: hintId, class: "live-hint", text: S.hint }),
      ui.input, ui.list,
      el("div", { class: "live-row" },
        el("label", { for: ui.next.id, text: S.next }), ui.next),
      el("div", { class: "live-row" }, ui.start, ui.clear)),
    ui.status, ui.output);

  // Completion, offered only once the grammar is known (it comes with the model):
  // before that the lists hold the words of the example.
  function refreshChoices() {
    if (!G) {
      ui.next.replaceChildren(el("option", { value: "", text: S.nextBefore }));
      ui.next.disabled = true;
      return;
    }
    ui.next.disabled = false;
    const text = ui.input.value;
    const words = tokenize(text);
    const partial = /\s$/.test(text) || !text.trim() ? "" : words.pop() || "";
    const options = nextWords(words);
    const prefix = words.length ? `${words.join(" ")} ` : "";
    ui.list.replaceChildren(...options.filter((w) => w.startsWith(partial)).map((w) =>
      el("option", { value: prefix + w })));
    // The list: every word that may follow the whole words typed (one begun is replaced).
    ui.next.replaceChildren(el("option", { value: "", text: S.nextPick }),
      ...options.map((w) => el("option", { value: w, text: w })));
    ui.whole = words;
  }
  ui.input.addEventListener("input", refreshChoices);
  ui.next.addEventListener("change", () => {
    if (!ui.next.value) return;
    ui.input.value = [...ui.whole, ui.next.value].join(" ");
    refreshChoices();
    ui.next.focus();
  });
  ui.clear.addEventListener("click", () => {
    ui.input.value = "";
    refreshChoices();
    ui.input.focus();
  });

  // The view's choices: step, layer, head, and the silenced heads ("kind:layer:head").
  const view = { step: 0, layer: 0, head: 0, silenced: new Set(), state: null, heard: null };

  function select(label, options, value, onChange) {
    const id = newId("select");
    const node = el("select", { id, "data-focus": label }, options.map(([v, text]) =>
      el("option", { value: v, text, selected: String(v) === String(value) })));
    node.addEventListener("change", () => onChange(Number(node.value)));
    return el("div", { class: "live-row" }, el("label", { for: id, text: label }), node);
  }

  // A heat map (SVG, one <rect> per weight, its value in data-weight) and the same
  // weights as a table. masked(r, c): a cell the mask hides. rowMark: the row to ring.
  function heatmap(title, rows, cols, matrix, { masked = () => false, rowMark = -1, kind }) {
    const cell = 34, left = 8 + 8 * Math.max(...rows.map((w) => w.length)), top = 8 + 7 *
      Math.max(...cols.map((w) => w.length));
    const width = left + cell * cols.length + 8, height = top + cell * rows.length + 8;
    const svg = el("svg:svg", { viewBox: `0 0 ${width} ${height}`, class: "live-heatmap",
      role: "img", "aria-label": `${title}. ${S.tableBelow}`, style: `max-width:${width}px` });
    svg.append(el("svg:rect", { x: 0, y: 0, width, height, fill: "#ffffff" }));
    cols.forEach((w, c) => svg.append(el("svg:text", { x: left + c * cell + cell / 2, y: top - 6,
      transform: `rotate(-60 ${left + c * cell + cell / 2} ${top - 6})`, class: "live-label",
      text: w })));
    rows.forEach((w, r) => {
      svg.append(el("svg:text", { x: left - 6, y: top + r * cell + cell / 2 + 4,
        "text-anchor": "end", class: "live-label", text: w }));
      cols.forEach((_, c) => {
        const x = left + c * cell, y = top + r * cell;
        if (masked(r, c)) {
          svg.append(el("svg:rect", { x, y, width: cell, height: cell, class: "live-masked",
            fill: "url(#live-hatch)", stroke: "#d0d0d0" }));
          return;
        }
        const w = matrix[r][c];
        svg.append(el("svg:rect", { x, y, width: cell, height: cell, "data-weight": w,
          "data-row": r, "data-col": c, "data-kind": kind,
          fill: `rgb(${Math.round(255 - 247 * w)},${Math.round(255 - 207 * w)},${Math.round(255 - 148 * w)})`,
          stroke: "#d0d0d0" }));
      });
    });
    if (rowMark >= 0) {
      svg.append(el("svg:rect", { x: left - 2, y: top + rowMark * cell - 2, width:
        cell * cols.length + 4, height: cell + 4, fill: "none", stroke: "#b8003a",
        "stroke-width": 3 }));
    }
    const table = el("table", { class: "live-table", "data-kind": kind },
      el("caption", { text: title }),
      el("thead", {}, el("tr", {}, el("th", { scope: "col", text: S.queryKey }),
        cols.map((w) => el("th", { scope: "col", text: w })))),
      el("tbody", {}, rows.map((w, r) => el("tr", {}, el("th", { scope: "row", text: w }),
        cols.map((_, c) => el("td", masked(r, c) ? { text: "–", title: S.masked }
          : { text: matrix[r][c].toFixed(3), "data-weight": matrix[r][c] }))))));
    const box = el("div", { class: "live-scroll", tabindex: 0, role: "region",
      "aria-label": title }, table);
    return el("figure", { class: "live-figure" },
      el("figcaption", { text: title }),
      el("div", { class: "live-scroll" }, svg),
      el("details", {}, el("summary", { text: S.asTable }), box));
  }

  // BertViz's head view: the chosen step's Spanish word (left) joined to every English
  // word (right) by a line as thick and as dark as its weight.
  function lines(title, queries, keys, row, weights) {
    const gap = 26, width = 340, height = 16 + gap * Math.max(queries.length, keys.length);
    const svg = el("svg:svg", { viewBox: `0 0 ${width} ${height}`, class: "live-lines",
      role: "img", "aria-label": `${title}. ${S.tableAbove}`, style: `max-width:${width}px` });
    svg.append(el("svg:rect", { x: 0, y: 0, width, height, fill: "#ffffff" }));
    const y = (i) => 16 + gap * i;
    queries.forEach((w, i) => svg.append(el("svg:text", { x: 110, y: y(i) + 4,
      "text-anchor": "end", class: i === row ? "live-label live-on" : "live-label", text: w })));
    keys.forEach((w, j) => svg.append(el("svg:text", { x: 230, y: y(j) + 4, class: "live-label",
      text: w })));
    keys.forEach((_, j) => svg.append(el("svg:line", { x1: 116, y1: y(row), x2: 224, y2: y(j),
      stroke: "#08306b", "stroke-opacity": Math.max(weights[j], 0.03),
      "stroke-width": 1 + 7 * weights[j], "data-weight": weights[j], "data-col": j,
      "data-kind": "crossLines" })));
    return el("figure", { class: "live-figure" }, el("figcaption", { text: title }),
      el("div", { class: "live-scroll" }, svg));
  }

  const HATCH = () => {
    const svg = el("svg:svg", { width: 0, height: 0, "aria-hidden": "true", class: "live-defs" });
    svg.append(el("svg:defs", {}, el("svg:pattern", { id: "live-hatch", width: 6, height: 6,
      patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
    el("svg:rect", { width: 6, height: 6, fill: "#f2f2f2" }),
    el("svg:line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#9a9a9a", "stroke-width": 2 }))));
    return svg;
  };

  function render() {
    const s = view.state;
    if (!s) return;
    const meta = model.meta;
    const steps = s.target.length;
    view.step = Math.min(view.step, steps - 1);
    const queries = ["<s>", ...s.target.slice(0, -1)]; // the decoder's input, row t
    const written = s.target; // what row t wrote
    const stepNames = written.map((w, t) => [t, `${t + 1}: ${w}`]);
    const layer = view.layer, head = view.head, t = view.step;
    const controls = el("div", { class: "live-controls" },
      select(S.step, stepNames, t, (v) => { view.step = v; render(); }),
      select(S.layer, Array.from({ length: meta.num_decoder_layers }, (_, l) => [l, String(l)]),
        layer, (v) => { view.layer = v; render(); }),
      select(S.head, Array.from({ length: meta.num_heads }, (_, h) => [h, String(h)]), head,
        (v) => { view.head = v; render(); }));
    const silence = el("fieldset", { class: "live-silence" }, el("legend", { text: S.silence }));
    for (const kind of ATTENTIONS) {
      const layers = kind === "encoder" ? meta.num_encoder_layers : meta.num_decoder_layers;
      for (let l = 0; l < layers; l += 1) {
        for (let h = 0; h < meta.num_heads; h += 1) {
          const key = `${kind}:${l}:${h}`, id = newId("silence");
          const box = el("input", { type: "checkbox", id, "data-head": key, "data-focus": key,
            checked: view.silenced.has(key) });
          box.addEventListener("change", () => {
            if (box.checked) view.silenced.add(key); else view.silenced.delete(key);
            serial(() => run(s.source, { keepStep: true })).catch(() => {});
          });
          silence.append(el("div", { class: "live-check" }, box,
            el("label", { for: id, text: fill(S.headName, { attention: S[kind], layer: l, head: h }) })));
        }
      }
    }
    const translation = el("p", { class: "live-translation" },
      el("span", { class: "live-label-text", text: `${S.translation} ` }),
      written.flatMap((w, i) => [el("span", { class: i === t ? "live-word live-on" : "live-word",
        "data-step": i, text: w }), " "]));
    const parts = [translation];
    if (view.silenced.size && view.heard) {
      const same = view.heard.target.join(" ") === s.target.join(" ");
      parts.push(el("p", { class: "live-compare" }, fill(same ? S.same : S.changed,
        { translation: view.heard.target.join(" ") })));
    }
    if (!s.done) parts.push(el("p", { class: "live-compare", text: fill(S.noEnd, { max: meta.max_len - 1 }) }));
    const cross = s.cross[layer][head];
    const dself = s.decoderSelf[layer][head];
    const encLayer = Math.min(layer, meta.num_encoder_layers - 1);
    const tag = (text) => fill(text, { layer, head, step: t + 1, word: written[t],
      query: queries[t] });
    parts.push(controls, silence,
      el("p", { class: "live-step-note", text: tag(S.stepNote) }),
      heatmap(tag(S.crossTitle), queries, s.source, cross, { rowMark: t, kind: "cross" }),
      lines(tag(S.linesTitle), queries, s.source, t, cross[t]),
      heatmap(tag(S.selfTitle), queries, queries, dself,
        { masked: (r, c) => c > r, rowMark: t, kind: "decoderSelf" }),
      heatmap(fill(S.encTitle, { layer: encLayer, head }), s.source, s.source,
        s.encoder[encLayer][head], { kind: "encoder" }));
    // The control that had the focus is drawn anew: the focus goes to its new self.
    const focused = document.activeElement && ui.output.contains(document.activeElement)
      ? document.activeElement.dataset.focus : null;
    ui.output.replaceChildren(HATCH(), ...parts);
    ui.output.hidden = false;
    if (focused) {
      const again = [...ui.output.querySelectorAll("[data-focus]")]
        .find((node) => node.dataset.focus === focused);
      if (again) again.focus();
    }
  }

  // One translation at a time: a run asked for while another one works waits for it.
  let queue = Promise.resolve();
  const serial = (job) => {
    const next = queue.then(job, job);
    queue = next.catch(() => {});
    return next;
  };

  async function run(words, { delay = STEP_DELAY_MS, keepStep = false } = {}) {
    const chosen = view.step;
    ui.start.disabled = true;
    try {
      if (view.silenced.size) {
        view.heard = await translate(words, new Set(), null, 0);
      }
      view.state = null;
      view.step = 0;
      const state = await translate(words, view.silenced, (s) => {
        view.state = s;
        view.step = s.target.length - 1;
        ui.status.textContent = fill(S.writing, { step: s.target.length });
        render();
      }, delay);
      view.step = keepStep ? Math.min(chosen, state.target.length - 1) : 0;
      render();
      ui.status.textContent = fill(S.done, { steps: state.target.length });
      return state;
    } finally {
      ui.start.disabled = false;
    }
  }

  function start({ delay } = {}) {
    return serial(async () => {
      if (!model) {
        ui.status.textContent = S.loading;
        try {
          await loadModel();
        } catch (error) {
          ui.status.textContent = fill(S.failed, { error: error.message || String(error) });
          throw error;
        }
        ui.start.textContent = S.again;
        refreshChoices();
      }
      const checked = check(ui.input.value, model.meta.max_len);
      if (checked.problem) {
        ui.status.textContent = checked.problem;
        ui.output.hidden = true;
        return { problem: checked.problem };
      }
      return run(checked.words, { delay });
    });
  }
  ui.start.addEventListener("click", () => { start().catch(() => {}); });
  ui.input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      start().catch(() => {});
    }
  });
  refreshChoices();

  // For the browser tests: the same path as the button (the drawing included).
  window.liveTranslator = {
    translate: async (sentence, silenced = [], delay = 0) => {
      ui.input.value = sentence;
      view.silenced = new Set(silenced);
      const state = await start({ delay });
      if (!state || state.problem) return state;
      return {
        source: state.source, target: state.target, ids: state.ids, done: state.done,
        heard: view.heard && view.silenced.size ? view.heard.target : null,
        maps: Object.fromEntries(ATTENTIONS.map((k) => [k, state[k].map((layer) =>
          layer.map((head) => head.map((row) => Array.from(row))))])),
      };
    },
    show: (step, layer, head) => { view.step = step; view.layer = layer; view.head = head; render(); },
    loaded: () => model !== null,
  };
}
