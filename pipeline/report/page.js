// The record browser of `refine report`: filters, sorts and pages the embedded rows, and
// shows one record's iterations side by side with a word diff between consecutive answers.
// Everything is built with createElement/textContent: record text is never parsed as HTML.
"use strict";
(function () {
  const PAGE = 50; // rows per page: the DOM stays small however many records are listed
  const MAX_EDITS = 2000; // past this many word edits a diff shows "replaced" instead

  // -- data -----------------------------------------------------------------------------------

  function embedded(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }
  const meta = embedded("report-meta");
  const rows = embedded("report-rows") || [];
  const details = new Map(Object.entries(embedded("report-details") || {}));
  // Row layout, written by pipeline/report/browser.py.
  const ID = 0, LINE = 1, STATUS = 2, STOP = 3, MADE = 4, CHOSEN = 5, COST = 6, ERR = 7, VALUES = 8, SERIES = 9;

  // -- small helpers --------------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function badge(text, style) {
    return el("span", { class: "badge" + (style ? " " + style : "") }, text);
  }

  function number(value) {
    if (value === null || value === undefined) return "-";
    if (typeof value === "boolean") return value ? "true" : "false";
    if (typeof value !== "number") return String(value);
    return Number.isInteger(value) ? value.toLocaleString("en-US") : value.toFixed(3);
  }

  function measured(value, m, digits) {
    // One precision per column, as in the overview's tables: 0.400 and 0.000, not 0.4 and 0.
    return m.rate ? (100 * value).toFixed(1) + "%" : value.toFixed(digits);
  }

  function signed(value, m, digits) {
    if (value === null || Number.isNaN(value)) return "";
    const text = m.rate ? (100 * value).toFixed(1) + " pp" : value.toFixed(digits);
    return value > 0 ? "+" + text : value < 0 ? text.replace("-", "−") : "±0";
  }

  function dollars(value) {
    if (value === null || value === undefined) return "unknown";
    // One call often costs less than a hundredth of a cent: keep two significant digits.
    return "$" + (value > 0 && value < 0.001 ? value.toPrecision(2) : value.toFixed(4));
  }

  function seconds(value) {
    if (value === null || value === undefined) return "-";
    return value < 1 ? Math.round(value * 1000) + " ms" : value.toFixed(2) + " s";
  }

  // -- word diff (Myers' O(ND) algorithm over words, spaces and punctuation) ------------------

  function tokens(text) {
    return text.match(/\s+|[\p{L}\p{N}_]+|[^\s\p{L}\p{N}_]/gu) || [];
  }

  function edits(a, b) {
    // Returns [op, token] pairs (op "=", "-" or "+"), or null past MAX_EDITS edits.
    const n = a.length, m = b.length, max = n + m;
    const v = new Int32Array(2 * max + 3);
    const off = max + 1;
    const trace = [];
    let found = -1;
    for (let d = 0; d <= Math.min(max, MAX_EDITS) && found < 0; d++) {
      trace.push(v.slice(off - d - 1, off + d + 2)); // what round d reads: k in [-d-1, d+1]
      for (let k = -d; k <= d; k += 2) {
        let x = k === -d || (k !== d && v[off + k - 1] < v[off + k + 1]) ? v[off + k + 1] : v[off + k - 1] + 1;
        let y = x - k;
        while (x < n && y < m && a[x] === b[y]) { x++; y++; }
        v[off + k] = x;
        if (x >= n && y >= m) { found = d; break; }
      }
    }
    if (found < 0) return null;
    const out = [];
    let x = n, y = m;
    for (let d = found; d >= 0; d--) {
      const snap = trace[d], at = (k) => snap[k + d + 1];
      const k = x - y;
      const prevK = k === -d || (k !== d && at(k - 1) < at(k + 1)) ? k + 1 : k - 1;
      const prevX = d === 0 ? 0 : at(prevK), prevY = prevX - prevK;
      while (x > prevX && y > prevY) { out.push(["=", a[x - 1]]); x--; y--; }
      if (d > 0) {
        if (x === prevX) out.push(["+", b[prevY]]);
        else out.push(["-", a[prevX]]);
        x = prevX; y = prevY;
      }
    }
    return out.reverse();
  }

  function diff(before, after) {
    // [op, text] runs turning `before` into `after`.
    if (before === after) return [["=", after]];
    const a = tokens(before), b = tokens(after);
    let head = 0;
    while (head < a.length && head < b.length && a[head] === b[head]) head++;
    let tail = 0;
    while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
    const middle = edits(a.slice(head, a.length - tail), b.slice(head, b.length - tail));
    const ops = [
      ...a.slice(0, head).map((t) => ["=", t]),
      ...(middle || [["-", a.slice(head, a.length - tail).join("")], ["+", b.slice(head, b.length - tail).join("")]]),
      ...a.slice(a.length - tail).map((t) => ["=", t]),
    ];
    const runs = [];
    for (const [op, text] of ops) {
      if (!text) continue;
      const last = runs[runs.length - 1];
      if (last && last[0] === op) last[1] += text;
      else runs.push([op, text]);
    }
    return runs;
  }

  function diffNode(before, after) {
    return el("pre", { class: "diff" }, diff(before, after).map(([op, text]) =>
      op === "=" ? text : el(op === "+" ? "ins" : "del", {}, text)));
  }

  // -- the list -------------------------------------------------------------------------------

  const state = { q: "", status: "", stop: "", measure: meta && meta.main !== null ? meta.main : -1,
    change: "", round: "", embedded: false, sort: "line", asc: true, page: 0 };
  let first = new Float64Array(rows.length), last = new Float64Array(rows.length);
  let series = []; // each row's value of the chosen measure at every iteration (or null)
  let digits = 0; // decimals of the chosen measure's column

  function pickMeasure() {
    first = new Float64Array(rows.length).fill(NaN);
    last = new Float64Array(rows.length).fill(NaN);
    series = rows.map((row) => {
      const pairs = row[SERIES] || [];
      for (let j = 0; j < pairs.length; j += 2) if (pairs[j] === state.measure) return pairs[j + 1];
      return null;
    });
    rows.forEach((row, i) => {
      const flat = row[VALUES];
      for (let j = 0; j < flat.length; j += 3) {
        if (flat[j] === state.measure) {
          if (flat[j + 1] !== null) first[i] = flat[j + 1];
          if (flat[j + 2] !== null) last[i] = flat[j + 2];
        }
      }
    });
    // As the overview's tables: whole numbers stay whole; else by the largest value.
    const whole = (v) => Number.isNaN(v) || Number.isInteger(v);
    let top = 0;
    for (const v of [...first, ...last]) if (!Number.isNaN(v)) top = Math.max(top, Math.abs(v));
    digits = first.every(whole) && last.every(whole) ? 0 : top <= 1 ? 3 : top < 100 ? 2 : 0;
  }

  function valueAt(i, t) {
    // A record whose loop stopped before t keeps its last answer (carried forward).
    const values = series[i];
    if (!values || !values.length) return NaN;
    const v = values[Math.min(t, values.length - 1)];
    return v === null || v === undefined ? NaN : v;
  }

  function better() {
    // +1 when higher is better (booleans, the critic's score), -1 when the job declares lower.
    const m = measureInfo();
    return m && m.better === "lower" ? -1 : 1;
  }

  function roundFilter() {
    if (!state.round) return null;
    const [direction, t] = state.round.split(":");
    return { direction, t: Number(t) };
  }

  function keep(i) {
    const row = rows[i];
    if (state.q && !row[ID].toLowerCase().includes(state.q)) return false;
    if (state.status !== "" && row[STATUS] !== Number(state.status)) return false;
    if (state.stop !== "" && row[STOP] !== Number(state.stop)) return false;
    if (state.embedded && !details.has(row[ID])) return false;
    const round = roundFilter();
    if (round) {
      const step = (valueAt(i, round.t) - valueAt(i, round.t - 1)) * better();
      if (Number.isNaN(step) || (round.direction === "worse" ? step >= 0 : step <= 0)) return false;
    }
    const a = first[i], b = last[i];
    switch (state.change) {
      case "improved": return (b - a) * better() > 0;
      case "worsened": return (b - a) * better() < 0;
      case "unchanged": return a === b;
      case "value": return !Number.isNaN(b);
      case "none": return Number.isNaN(b);
      default: return true;
    }
  }

  const SORTS = {
    line: (i) => rows[i][LINE], id: (i) => rows[i][ID], made: (i) => rows[i][MADE],
    chosen: (i) => rows[i][CHOSEN], cost: (i) => rows[i][COST], first: (i) => first[i],
    last: (i) => last[i], gain: (i) => last[i] - first[i],
  };

  function selected() {
    const out = [];
    for (let i = 0; i < rows.length; i++) if (keep(i)) out.push(i);
    const key = SORTS[state.sort], dir = state.asc ? 1 : -1;
    const missing = (v) => v === null || v === undefined || Number.isNaN(v);
    out.sort((i, j) => {
      const a = key(i), b = key(j);
      if (missing(a) || missing(b)) return missing(a) - missing(b) || i - j; // missing last
      return (a < b ? -1 : a > b ? 1 : 0) * dir || i - j;
    });
    return out;
  }

  function measureInfo() {
    return meta && state.measure >= 0 ? meta.measures[state.measure] : null;
  }

  function header() {
    const m = measureInfo();
    const cols = [["id", "id"], ["line", "line"], [null, "status"], [null, "stop reason"],
      ["made", "refinements"], ["chosen", "chosen"]];
    if (m) cols.push(["first", m.label + " initial"], ["last", m.label + " chosen"], ["gain", "gain"]);
    cols.push(["cost", "cost"], [null, "iterations"]);
    return el("tr", {}, cols.map(([key, label]) => el("th", {
      class: [key ? "sortable" : "", state.sort === key ? "sorted" : "", state.sort === key && state.asc ? "asc" : ""].join(" ").trim() || null,
      on: key ? { click: () => { state.asc = state.sort === key ? !state.asc : key === "line" || key === "id"; state.sort = key; state.page = 0; render(); } } : null,
    }, label)));
  }

  function rowNode(i, current) {
    const row = rows[i], m = measureInfo();
    const status = meta.statuses[row[STATUS]];
    const cells = [
      el("td", { class: "mono" }, row[ID]),
      el("td", { class: "num" }, row[LINE]),
      el("td", {}, badge(status, status), row[ERR] !== null ? " " + meta.error_types[row[ERR]] : ""),
      el("td", {}, meta.stops[row[STOP]]),
      el("td", { class: "num" }, row[MADE]),
      el("td", { class: "num" }, row[CHOSEN] === null ? "-" : row[CHOSEN]),
    ];
    if (m) {
      const gain = last[i] - first[i];
      cells.push(
        el("td", { class: "num" }, Number.isNaN(first[i]) ? "-" : measured(first[i], m, digits)),
        el("td", { class: "num" }, Number.isNaN(last[i]) ? "-" : measured(last[i], m, digits)),
        el("td", { class: "num " + (gain > 0 ? "up" : gain < 0 ? "down" : "") }, signed(gain, m, digits)));
    }
    cells.push(el("td", { class: "num" }, dollars(row[COST])),
      el("td", {}, details.has(row[ID]) ? "embedded" : "row only"));
    return el("tr", {
      class: row[ID] === current ? "selected" : null, "data-id": row[ID],
      on: { click: () => { location.hash = "record=" + encodeURIComponent(row[ID]); } },
    }, cells);
  }

  function renderList() {
    const picked = selected();
    const pages = Math.max(1, Math.ceil(picked.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const current = currentRecord();
    const body = el("tbody", {}, picked.slice(state.page * PAGE, (state.page + 1) * PAGE).map((i) => rowNode(i, current)));
    document.getElementById("record-list").replaceChildren(el("thead", {}, header()), body);
    document.getElementById("record-count").textContent =
      `${picked.length.toLocaleString("en-US")} of ${rows.length.toLocaleString("en-US")} listed records match`;
    document.getElementById("pager").replaceChildren(
      el("button", { type: "button", disabled: state.page === 0, on: { click: () => { state.page--; renderList(); } } }, "‹ previous"),
      `page ${state.page + 1} of ${pages}`,
      el("button", { type: "button", disabled: state.page >= pages - 1, on: { click: () => { state.page++; renderList(); } } }, "next ›"));
  }

  // -- one record -----------------------------------------------------------------------------

  let showChanges = true;

  function scalar(value) {
    return value === null || ["string", "number", "boolean"].includes(typeof value);
  }

  function metricChips(it) {
    const chips = [];
    if (it.score !== null && it.score !== undefined) chips.push(badge("score " + number(it.score)));
    for (const [key, value] of Object.entries(it.metrics || {})) {
      if (Array.isArray(value)) {
        const shown = value.slice(0, 12).map(String).join(", ") + (value.length > 12 ? ", …" : "");
        chips.push(el("span", { class: "badge", title: value.map(String).join(", ") }, `${key} (${value.length}): ${shown || "none"}`));
      } else if (scalar(value)) {
        chips.push(badge(`${key} ${number(value)}`));
      } else {
        chips.push(badge(`${key} ${JSON.stringify(value)}`));
      }
    }
    return chips.length ? el("div", { class: "chips" }, chips) : null;
  }

  function feedbackNode(fb) {
    if (!fb) return el("p", { class: "note" }, "No feedback on this answer (the loop stopped here).");
    const parts = [];
    const critic = new Set();
    if (fb.findings) {
      for (const f of fb.findings) if (f.source === "critic") critic.add(f.text);
      parts.push(fb.findings.length
        ? el("ul", { class: "findings" }, fb.findings.map((f) => el("li", {}, badge(f.source, f.source), " ", f.text)))
        : el("p", { class: "note" }, "No findings."));
    }
    const chips = [];
    for (const [key, value] of Object.entries(fb.parsed || {})) {
      if (Array.isArray(value)) {
        // The critic's actions are already listed among the findings, with their source.
        if (value.length && value.every((v) => critic.has(String(v)))) continue;
        parts.push(el("div", {}, el("strong", {}, key), value.length
          ? el("ul", {}, value.map((v) => el("li", {}, scalar(v) ? String(v) : JSON.stringify(v))))
          : el("span", { class: "note" }, " none")));
      } else {
        chips.push(badge(`${key} ${scalar(value) ? number(value) : JSON.stringify(value)}`, key === "done" && value === true ? "done" : null));
      }
    }
    if (chips.length) parts.unshift(el("div", { class: "chips" }, chips));
    if (fb.error) parts.push(el("div", { class: "error-box" }, `${fb.error.type}: ${fb.error.message}`));
    if (fb.response !== null && fb.response !== undefined) parts.push(el("h4", {}, "raw feedback"), el("pre", {}, fb.response));
    return el("div", { class: "feedback" }, parts);
  }

  function callsNode(it) {
    const lines = it.calls.map((c) => el("div", {}, [c.role, c.model, `${c.tokens[0]}+${c.tokens[1]} tokens`,
      seconds(c.latency), `${c.attempts} attempt${c.attempts === 1 ? "" : "s"}` + (c.tries ? ` (${c.tries.join(", ")})` : ""),
      c.cost === null ? null : dollars(c.cost),
      c.batch ? "batch " + c.batch : null].filter(Boolean).join(" · ")));
    return el("div", { class: "calls" }, lines, el("div", {}, "iteration cost " + dollars(it.cost)));
  }

  function checksNode(it) {
    if (!Array.isArray(it.checks)) return null; // the job has no checks, or they were off
    if (!it.checks.length) return el("div", { class: "chips" }, badge("checks passed", "done"));
    // The feedback lists the check's findings with the critic's: say so rather than repeat them.
    if (it.feedback && it.feedback.findings) return el("div", { class: "chips" }, badge(`checks found ${it.checks.length} problem${it.checks.length === 1 ? "" : "s"} (see feedback)`, "check"));
    return el("div", {}, el("h4", {}, "checks found"), el("ul", {}, it.checks.map((c) => el("li", {}, c))));
  }

  function iterationNode(it, previous, chosen) {
    const isChosen = it.t === chosen;
    const answer = it.output === null || it.output === undefined ? null : it.output;
    const canDiff = showChanges && previous && previous.output !== null && answer !== null;
    return el("article", { class: "iteration" + (isChosen ? " chosen" : ""), "data-t": it.t },
      el("h3", {}, `Iteration ${it.t}`, it.role ? badge(it.role) : null,
        isChosen ? badge("chosen", "chosen") : null, it.error ? badge(it.error.type, "error") : null),
      metricChips(it),
      it.error ? el("div", { class: "error-box" }, `${it.error.type}: ${it.error.message}`) : null,
      checksNode(it),
      el("h4", {}, canDiff ? `answer: changes from iteration ${previous.t}` : "answer"),
      answer === null ? el("p", { class: "note" }, "No answer (the call did not complete).")
        : canDiff ? diffNode(previous.output, answer) : el("pre", { class: "answer" }, answer),
      it.copies.length ? el("details", {}, el("summary", {}, `${it.copies.length} earlier attempt(s) copied the previous answer and were retried`),
        it.copies.map((c) => el("pre", {}, c))) : null,
      (it.cut_off || []).length ? el("details", {}, el("summary", {}, `${it.cut_off.length} earlier attempt(s) ran into max_tokens and were asked again`),
        it.cut_off.map((c) => el("pre", {}, c))) : null,
      (it.drafts || []).length ? el("details", {}, el("summary", {}, `${it.drafts.length} other draft(s) of this iteration (opt-in strategies), not gone on with`),
        it.drafts.map((c) => el("pre", {}, c))) : null,
      (it.retried_feedback || []).map((fb) => el("div", { class: "retried" },
        el("h4", {}, "feedback (retried)"), feedbackNode(fb))),
      el("h4", {}, "feedback"),
      feedbackNode(it.feedback),
      callsNode(it));
  }

  function comparedPair(row) {
    // What the filters ask about: the two answers of a round, or the first and the chosen.
    const round = roundFilter();
    if (round) return [round.t - 1, round.t, `what round ${round.t} did`];
    if ((state.change === "improved" || state.change === "worsened") && row[CHOSEN] !== null) {
      return [0, row[CHOSEN], "the first answer and the chosen output"];
    }
    return null;
  }

  function compareNode(index, detail) {
    const pair = comparedPair(rows[index]);
    if (!pair || !detail || pair[0] === pair[1]) return null;
    const [from, to, what] = pair;
    const at = (t) => detail.iterations.find((it) => it.t === t);
    const a = at(from), b = at(to);
    if (!a || !b) return null;
    const m = measureInfo();
    const side = (it) => {
      const v = valueAt(index, it.t);
      const shown = Number.isNaN(v) ? "-" : m && m.rate ? String(v === 1) : m ? measured(v, m, digits) : "";
      const value = m ? ` · ${m.label} ${shown}` : "";
      return el("div", { class: "side", "data-t": it.t }, el("h4", {}, `Iteration ${it.t}${value}`),
        it.output === null || it.output === undefined
          ? el("p", { class: "note" }, "No answer (the call did not complete).")
          : el("pre", { class: "answer" }, it.output));
    };
    return el("section", { class: "compare" }, el("h3", {}, `Side by side: ${what}`),
      el("div", { class: "pair" }, side(a), side(b)));
  }

  function renderRecord(id) {
    const box = document.getElementById("record");
    if (id === null) { box.replaceChildren(); return; }
    const index = rows.findIndex((row) => row[ID] === id);
    if (index < 0) {
      box.replaceChildren(el("p", { class: "note" }, `No record ${id} is listed in this page.`));
      return;
    }
    const row = rows[index], detail = details.get(id), status = meta.statuses[row[STATUS]];
    const head = el("div", { class: "record-head" },
      el("h2", {}, "Record ", el("code", {}, id)),
      badge(status, status), badge("stop: " + meta.stops[row[STOP]]), badge("line " + row[LINE]),
      badge(`${row[MADE]} refinement${row[MADE] === 1 ? "" : "s"}`),
      row[CHOSEN] !== null ? badge("chosen iteration " + row[CHOSEN], "chosen") : null,
      badge("cost " + dollars(row[COST])),
      detail && detail.why ? el("span", { class: "note" }, "embedded: " + detail.why) : null);
    const parts = [head];
    if (detail && detail.error) parts.push(el("div", { class: "error-box" }, `${detail.error.type}: ${detail.error.message}`));
    if (!detail) {
      parts.push(el("p", { class: "note" }, "This record's iterations are not embedded in this page (see the limits above). " +
        "To see them, put its id in a file and run refine report RUN_DIR --records FILE."));
    } else if (!detail.iterations.length) {
      parts.push(el("p", { class: "note" }, "No call of this record completed."));
    } else {
      parts.push(el("div", { class: "view" }, "Show each answer",
        el("button", { type: "button", "aria-pressed": String(!showChanges), on: { click: () => { showChanges = false; renderRecord(id); } } }, "as written"),
        el("button", { type: "button", "aria-pressed": String(showChanges), on: { click: () => { showChanges = true; renderRecord(id); } } }, "as changes from the previous one")));
      const its = detail.iterations;
      const compared = compareNode(index, detail);
      if (compared) parts.push(compared);
      parts.push(el("div", { class: "iterations" }, its.map((it, i) => iterationNode(it, i > 0 ? its[i - 1] : null, row[CHOSEN]))));
    }
    box.replaceChildren(...parts);
  }

  // -- navigation -----------------------------------------------------------------------------

  function currentRecord() {
    const hash = location.hash.slice(1);
    return hash.startsWith("record=") ? decodeURIComponent(hash.slice("record=".length)) : null;
  }

  function showTab(name) {
    for (const tab of document.querySelectorAll("section.tab")) tab.hidden = tab.id !== name;
    for (const link of document.querySelectorAll("nav.tabs a")) link.classList.toggle("active", link.dataset.tab === name);
  }

  function render() {
    const id = currentRecord();
    showTab(id !== null || location.hash === "#records" ? "records" : "overview");
    renderList();
    renderRecord(id);
  }

  function controls() {
    const fill = (select, names) => names.forEach((name, i) => select.append(el("option", { value: i }, name)));
    fill(document.getElementById("f-status"), meta.statuses);
    fill(document.getElementById("f-stop"), meta.stops);
    const measure = document.getElementById("f-measure");
    fill(measure, meta.measures.map((m) => m.label));
    const round = document.getElementById("f-round");
    for (let t = 1; t <= (meta.rounds || 0); t++) {
      round.append(el("option", { value: `worse:${t}` }, `round ${t} made worse`),
        el("option", { value: `better:${t}` }, `round ${t} made better`));
    }
    measure.value = String(state.measure);
    const bind = (id, key, event, read) => document.getElementById(id).addEventListener(event, (e) => {
      state[key] = read(e.target);
      state.page = 0;
      if (key === "measure") pickMeasure();
      renderList();
      renderRecord(currentRecord()); // the side-by-side answers follow the filters
    });
    bind("f-search", "q", "input", (t) => t.value.trim().toLowerCase());
    bind("f-status", "status", "change", (t) => t.value);
    bind("f-stop", "stop", "change", (t) => t.value);
    bind("f-measure", "measure", "change", (t) => Number(t.value));
    bind("f-change", "change", "change", (t) => t.value);
    bind("f-round", "round", "change", (t) => t.value);
    bind("f-embedded", "embedded", "change", (t) => t.checked);
  }

  if (meta) {
    controls();
    pickMeasure();
    window.addEventListener("hashchange", render);
    render();
  }
  // For the page's own tests: the diff, and how much was read.
  window.refineReport = { diff, rows: rows.length, details: details.size };
})();
