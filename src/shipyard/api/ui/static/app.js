// Shipyard dashboard: live curves (uPlot over /api/v1/jobs/{id}/metrics) and the log as it is
// written (/api/v1/jobs/{id}/logs). Everything from the server is put in the page as text.
"use strict";

const POLL_MS = 2000;

async function getJson(url) {
  const answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!answer.ok) throw new Error(`${url}: ${answer.status}`);
  return answer.json();
}

function metricsUrl(job, kind, afterStep) {
  return `/api/v1/jobs/${encodeURIComponent(job)}/metrics?kind=${kind}&max_points=2000&after_step=${afterStep}`;
}

function chartWidth(element) {
  return Math.max(280, element.clientWidth || element.parentElement.clientWidth - 16);
}

function newChart(element, series, data, xLabel = "step") {
  const options = {
    width: chartWidth(element),
    height: 220,
    scales: { x: { time: false } },
    axes: [{ label: xLabel }, {}],
    series: [{ label: xLabel }, ...series],
  };
  return new uPlot(options, data, element);
}

// One job's four charts: loss (train and eval on one step axis), tokens/s, MFU, memory.
class JobCharts {
  constructor(root) {
    this.job = root.dataset.job;
    this.live = root.dataset.live === "yes";
    this.train = { step: [], loss: [], tokens_per_s: [], mfu: [], mem_gib: [] };
    this.eval = new Map();
    this.afterTrain = -1;
    this.afterEval = -1;
    this.elements = {};
    for (const el of root.querySelectorAll("[data-chart]")) this.elements[el.dataset.chart] = el;
    this.charts = {};
    this.note = document.querySelector(`[data-points="${CSS.escape(this.job)}"]`);
  }

  async refresh() {
    const [train, evals] = await Promise.all([
      getJson(metricsUrl(this.job, "train", this.afterTrain)),
      getJson(metricsUrl(this.job, "eval", this.afterEval)),
    ]);
    for (const key of Object.keys(this.train)) this.train[key].push(...train[key]);
    if (train.last_step !== null) this.afterTrain = train.last_step;
    evals.step.forEach((step, i) => this.eval.set(step, evals.loss[i]));
    if (evals.last_step !== null) this.afterEval = evals.last_step;
    this.draw();
    if (this.note) {
      const n = this.train.step.length;
      this.note.textContent = n ? `${n} points, the last at step ${this.train.step[n - 1]}` : "No step logged yet.";
    }
    return train.step.length + evals.step.length;
  }

  draw() {
    const steps = this.train.step;
    // Evals on their own steps (step 0, and those between the thinned training points): the loss
    // chart's axis is both sets' steps, the training line drawn across the evals-only ones.
    const lossSteps = [...new Set([...steps, ...this.eval.keys()])].sort((a, b) => a - b);
    const trainAt = new Map(steps.map((step, i) => [step, this.train.loss[i]]));
    const trainLoss = lossSteps.map((step) => (trainAt.has(step) ? trainAt.get(step) : null));
    const evalLoss = lossSteps.map((step) => (this.eval.has(step) ? this.eval.get(step) : null));
    const mfuPercent = this.train.mfu.map((v) => (v == null ? null : v * 100));
    const sets = {
      loss: [[{ label: "train", stroke: "#1d4e89", width: 2, spanGaps: true }, { label: "eval", stroke: "#a4161a", width: 2, spanGaps: true, points: { show: true } }], [lossSteps, trainLoss, evalLoss]],
      tokens_per_s: [[{ label: "tokens/s", stroke: "#1e6b36" }], [steps, this.train.tokens_per_s]],
      mfu: [[{ label: "MFU %", stroke: "#7a4d00", value: (u, v) => (v == null ? "–" : `${v.toFixed(1)} %`) }], [steps, mfuPercent]],
      mem_gib: [[{ label: "GiB", stroke: "#5c3b8a" }], [steps, this.train.mem_gib]],
    };
    for (const [name, [series, data]] of Object.entries(sets)) {
      const element = this.elements[name];
      if (!element) continue;
      if (this.charts[name]) this.charts[name].setData(data);
      else this.charts[name] = newChart(element, series, data);
    }
  }

  async run() {
    for (;;) {
      try {
        await this.refresh();
      } catch (error) {
        if (this.note) this.note.textContent = `Could not read the metrics: ${error.message}`;
      }
      if (!this.live) return;
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
  }
}

// The job's log, appended as it grows, until the job ends (or another attempt's is picked).
async function followLog(pre, attempt = null) {
  const job = pre.dataset.log;
  const reading = (pre.reading = (pre.reading || 0) + 1);
  const which = attempt ? `&attempt=${attempt}` : "";
  pre.replaceChildren();
  let offset = 0;
  for (;;) {
    if (pre.reading !== reading) return; // another attempt's log was asked for
    try {
      const chunk = await getJson(`/api/v1/jobs/${encodeURIComponent(job)}/logs?offset=${offset}${which}`);
      if (pre.reading !== reading) return;
      if (chunk.data) {
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.append(document.createTextNode(chunk.data));
        if (atBottom) pre.scrollTop = pre.scrollHeight;
      }
      offset = chunk.next_offset;
      if ((chunk.job_ended || attempt) && !chunk.data) return;
    } catch (error) {
      pre.append(document.createTextNode(`\n[could not read the log: ${error.message}]\n`));
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

// Any logged series of one or more jobs (/api/v1/series), overlaid on one axis per metric: EMA
// smoothing with the raw line faint behind, a log scale, x as step, wall time or tokens, and each
// downsampled bucket's lowest and highest value as a band (spikes stay visible).
const COLOURS = ["#1d4e89", "#a4161a", "#1e6b36", "#7a4d00", "#5c3b8a", "#00707a", "#8a3b6b", "#4a5461"];
const FAVOURITES = ["loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "data_wait_s"];
const SERIES_WORDS = {
  loss: "Training loss", eval_loss: "Eval loss", lr: "Learning rate", grad_norm: "Gradient norm",
  tokens_per_s: "Tokens per second", mfu: "MFU (% of peak)", mem_gib: "Peak memory (GiB)",
  mem_live_gib: "Live memory (GiB)", step_time_s: "Step time (s)", data_wait_s: "Waiting for data (s)",
  elapsed_s: "Seconds since the attempt began",
};

function smoothed(values, weight) {
  // TensorBoard's debiased EMA: early points are not pulled towards zero.
  if (!weight) return values;
  let last = 0, count = 0;
  return values.map((v) => {
    if (v == null || !Number.isFinite(v)) return v;
    last = last * weight + (1 - weight) * v;
    count += 1;
    return last / (1 - weight ** count);
  });
}

class SeriesExplorer {
  constructor(root) {
    this.root = root;
    this.jobs = root.dataset.jobs.split(",");
    this.live = root.dataset.live === "yes";
    this.store = new Map(); // "job|name" -> {step, value, at, low, high}
    this.after = new Map();
    this.meta = new Map(); // job -> names view
    this.charts = new Map();
    this.picker = root.querySelector("[data-pick]");
    this.area = root.querySelector("[data-area]");
    this.smoothing = root.querySelector("[name=smoothing]");
    this.logScale = root.querySelector("[name=log]");
    this.axis = root.querySelector("[name=x]");
    for (const control of [this.smoothing, this.logScale, this.axis]) {
      control.addEventListener("input", () => this.redraw(true));
    }
  }

  chosen() {
    return [...this.picker.querySelectorAll("input:checked")].map((box) => box.value);
  }

  async names() {
    const query = this.jobs.map((j) => `job=${encodeURIComponent(j)}`).join("&");
    const views = await getJson(`/api/v1/series/names?${query}`);
    const all = new Set();
    for (const view of views) {
      this.meta.set(view.job_id, view);
      view.names.forEach((n) => all.add(n));
    }
    const known = new Set([...this.picker.querySelectorAll("input")].map((box) => box.value));
    const ordered = [...FAVOURITES.filter((n) => all.has(n)), ...[...all].filter((n) => !FAVOURITES.includes(n)).sort()];
    for (const name of ordered) {
      if (known.has(name)) continue;
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.value = name;
      box.checked = FAVOURITES.slice(0, 4).includes(name);
      box.addEventListener("change", () => this.refresh().catch(() => {}));
      label.append(box, document.createTextNode(` ${SERIES_WORDS[name] || name}`));
      this.picker.append(label);
    }
    return all.size;
  }

  async refresh() {
    const names = this.chosen();
    if (!names.length) return this.redraw(false);
    const groups = new Map(); // after_step -> names (one request per job and starting step)
    for (const job of this.jobs) {
      for (const name of names) {
        const after = this.after.get(`${job}|${name}`) ?? -1;
        const key = `${job}|${after}`;
        if (!groups.has(key)) groups.set(key, { job, after, names: [] });
        groups.get(key).names.push(name);
      }
    }
    const answers = await Promise.all(
      [...groups.values()].map(({ job, after, names: wanted }) =>
        getJson(`/api/v1/series?job=${encodeURIComponent(job)}&${wanted.map((n) => `name=${encodeURIComponent(n)}`).join("&")}&max_points=1000&after_step=${after}`),
      ),
    );
    for (const series of answers.flat()) {
      const key = `${series.job_id}|${series.name}`;
      const held = this.store.get(key) || { step: [], value: [], at: [], low: [], high: [] };
      held.step.push(...series.step);
      held.value.push(...series.value);
      held.at.push(...series.at);
      held.low.push(...(series.low || series.value));
      held.high.push(...(series.high || series.value));
      this.store.set(key, held);
      if (series.last_step !== null) this.after.set(key, series.last_step);
    }
    this.redraw(false);
  }

  x(job, held) {
    const mode = this.axis.value;
    if (mode === "time") {
      // Minutes since the job's first logged point: runs overlay from their own start.
      const firsts = [...this.store].filter(([key]) => key.startsWith(`${job}|`)).map(([, h]) => h.at[0]);
      const origin = Math.min(...firsts.filter(Number.isFinite));
      return held.at.map((t) => (t - origin) / 60);
    }
    if (mode === "tokens") {
      const perStep = this.meta.get(job)?.tokens_per_step || 0;
      return held.step.map((s) => s * perStep);
    }
    return held.step;
  }

  redraw(rebuild) {
    const names = this.chosen();
    const weight = Number(this.smoothing.value);
    for (const [name, chart] of this.charts) {
      if (rebuild || !names.includes(name)) {
        chart.figure.remove();
        chart.plot.destroy();
        this.charts.delete(name);
      }
    }
    for (const name of names) {
      const lines = [];
      const xs = new Set();
      this.jobs.forEach((job, i) => {
        const held = this.store.get(`${job}|${name}`);
        if (!held || !held.step.length) return;
        const x = this.x(job, held);
        x.forEach((v) => xs.add(v));
        const scale = name === "mfu" ? 100 : 1;
        const raw = held.value.map((v) => v * scale);
        lines.push({ job, colour: COLOURS[i % COLOURS.length], x, raw, smooth: smoothed(raw, weight), low: held.low.map((v) => v * scale), high: held.high.map((v) => v * scale) });
      });
      if (!lines.length) continue;
      const axis = [...xs].sort((a, b) => a - b);
      const at = (line, values) => {
        const byX = new Map(line.x.map((v, k) => [v, values[k]]));
        return axis.map((v) => (byX.has(v) ? byX.get(v) : null));
      };
      const series = [];
      const data = [axis];
      const bands = [];
      for (const line of lines) {
        const label = this.meta.get(line.job)?.job_name || line.job;
        const tag = this.jobs.length > 1 ? `${label} (${line.job})` : label;
        const banded = line.low.some((v, k) => v !== line.raw[k]);
        if (banded) {
          series.push({ label: `${tag} high`, stroke: line.colour, alpha: 0.25, width: 0.5, spanGaps: true });
          data.push(at(line, line.high));
          series.push({ label: `${tag} low`, stroke: line.colour, alpha: 0.25, width: 0.5, spanGaps: true });
          data.push(at(line, line.low));
          bands.push({ series: [data.length - 2, data.length - 1], fill: `${line.colour}22` });
        }
        if (weight) {
          series.push({ label: `${tag} raw`, stroke: `${line.colour}55`, width: 1, spanGaps: true });
          data.push(at(line, line.raw));
        }
        series.push({ label: tag, stroke: line.colour, width: 2, spanGaps: true, points: { show: line.x.length < 60 } });
        data.push(at(line, weight ? line.smooth : line.raw));
      }
      const existing = this.charts.get(name);
      if (existing) {
        existing.plot.setData(data);
        continue;
      }
      const figure = document.createElement("figure");
      const caption = document.createElement("figcaption");
      caption.textContent = SERIES_WORDS[name] || name;
      const holder = document.createElement("div");
      holder.className = "chart";
      holder.dataset.series = name;
      figure.append(caption, holder);
      this.area.append(figure);
      const xLabel = { step: "step", time: "minutes since it began", tokens: "tokens" }[this.axis.value];
      const log = this.logScale.checked && name !== "lr" ? 10 : 1;
      const plot = new uPlot(
        { width: chartWidth(holder), height: 220, scales: { x: { time: false }, y: { distr: log === 10 ? 3 : 1 } }, axes: [{ label: xLabel }, {}], series: [{ label: xLabel }, ...series], bands },
        data,
        holder,
      );
      this.charts.set(name, { figure, plot });
    }
    this.root.explored = Object.fromEntries([...this.charts].map(([name, chart]) => [name, chart.plot.data]));
  }

  async run() {
    for (;;) {
      try {
        await this.names();
        await this.refresh();
      } catch (error) {
        this.area.textContent = `Could not read the metrics: ${error.message}`;
      }
      if (!this.live) return;
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
  }
}

// Telemetry of devices over time (a job's devices, or a node's), one chart per figure.
const TELEMETRY_FIGURES = [
  ["utilization", "Utilization (%)", 100],
  ["memory_gib", "Memory in use (GiB)", 1],
  ["power_w", "Power (W)", 1],
  ["temperature_c", "Temperature (°C)", 1],
  ["io_mib_s", "Disk traffic (MiB/s)", 1],
];

async function drawTelemetry(root) {
  const devices = await getJson(root.dataset.telemetry);
  root.replaceChildren();
  if (!devices.length) {
    const none = document.createElement("p");
    none.className = "hint";
    none.textContent = "No samples yet: the agent samples its node's devices every few seconds.";
    root.append(none);
    return;
  }
  const start = Math.min(...devices.map((d) => d.at[0] ?? Infinity));
  const throttled = devices.flatMap((d) => d.throttle.filter(Boolean).map((why) => `${d.device === "cpu" ? "CPU" : `device ${d.device}`}: ${why}`));
  for (const [figure, caption, scale] of TELEMETRY_FIGURES) {
    const shown = devices.filter((d) => d[figure].some((v) => v != null));
    if (!shown.length) continue;
    const xs = [...new Set(shown.flatMap((d) => d.at))].sort((a, b) => a - b);
    const data = [xs.map((t) => (t - start) / 60)];
    for (const d of shown) {
      const byAt = new Map(d.at.map((t, k) => [t, d[figure][k]]));
      data.push(xs.map((t) => (byAt.get(t) == null ? null : byAt.get(t) * scale)));
    }
    const holder = document.createElement("figure");
    const title = document.createElement("figcaption");
    title.textContent = caption;
    const chart = document.createElement("div");
    chart.className = "chart";
    chart.dataset.figure = figure;
    holder.append(title, chart);
    root.append(holder);
    const label = (d) => `${d.attempt ? `attempt ${d.attempt}, ` : ""}${d.device === "cpu" ? "host CPU" : `device ${d.device}`}`;
    newChart(chart, shown.map((d, i) => ({ label: label(d), stroke: COLOURS[i % COLOURS.length], spanGaps: true })), data, "minutes");
  }
  if (throttled.length) {
    const note = document.createElement("p");
    note.className = "reason";
    note.textContent = `Slowed down: ${[...new Set(throttled)].join("; ")}`;
    root.append(note);
  }
  root.drawnTelemetry = devices;
}

// Sortable columns: a header's button sorts by it (numbers as numbers), again the other way; the
// order holds when the table refreshes itself.
const sortOrders = new Map();

function sortable(table) {
  const key = table.dataset.sortable;
  table.querySelectorAll("thead th").forEach((th, column) => {
    if (th.querySelector("button.sort") || th.dataset.nosort !== undefined) return;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "sort";
    button.append(...th.childNodes);
    th.append(button);
    button.addEventListener("click", () => {
      const [current, ascending] = sortOrders.get(key) || [-1, false];
      sortOrders.set(key, [column, current === column ? !ascending : true]);
      applySort(table);
    });
  });
  applySort(table);
}

function cellValue(row, column) {
  const cell = row.children[column];
  const text = (cell?.dataset.value ?? cell?.textContent ?? "").trim();
  const number = Number(text.replace(/[,%\s]/g, ""));
  return text !== "" && Number.isFinite(number) ? number : text.toLowerCase();
}

function applySort(table) {
  const order = sortOrders.get(table.dataset.sortable);
  if (!order) return;
  const [column, ascending] = order;
  const body = table.tBodies[0];
  const rows = [...body.rows].filter((row) => row.children.length > 1);
  rows.sort((a, b) => {
    const [x, y] = [cellValue(a, column), cellValue(b, column)];
    const sign = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : typeof x === "number" ? -1 : 1;
    return ascending ? sign : -sign;
  });
  body.append(...rows);
  table.querySelectorAll("thead th").forEach((th, i) => {
    if (i === column) th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    else th.removeAttribute("aria-sort");
  });
}

// A list, the overview or the queues refreshing themselves, filters kept (the page's own address
// is read again), but never under a user who is ticking or typing in it.
function selfRefreshing(region) {
  const every = Number(region.dataset.refresh) * 1000;
  setInterval(async () => {
    if (document.hidden || region.querySelector("input:checked") || region.contains(document.activeElement)) return;
    try {
      const answer = await fetch(location.href, { credentials: "same-origin" });
      if (!answer.ok) return;
      const fresh = new DOMParser().parseFromString(await answer.text(), "text/html").getElementById(region.id);
      if (!fresh) return;
      region.replaceChildren(...fresh.childNodes);
      for (const table of region.querySelectorAll("table[data-sortable]")) sortable(table);
      focusableWhenScrolling();
      region.dataset.refreshed = String(Number(region.dataset.refreshed || 0) + 1);
    } catch {
      // the next tick tries again
    }
  }, every);
}

// Search within the log shown: the matching lines, with their count, above the whole log.
function searchLog(input) {
  const pre = document.querySelector(input.dataset.logSearch);
  const found = document.querySelector(input.dataset.results);
  const count = document.querySelector(input.dataset.count);
  const run = () => {
    const wanted = input.value.trim().toLowerCase();
    if (!wanted) {
      found.hidden = true;
      count.textContent = "";
      return;
    }
    const lines = pre.textContent.split("\n").filter((line) => line.toLowerCase().includes(wanted));
    found.textContent = lines.join("\n");
    found.hidden = !lines.length;
    count.textContent = `${lines.length} matching line${lines.length === 1 ? "" : "s"}`;
  };
  input.addEventListener("input", run);
}

// A table (or the heatmap) wider than a phone scrolls within itself: the keyboard must reach it.
function focusableWhenScrolling() {
  for (const table of document.querySelectorAll("main table, .heatmap-wrap")) {
    if (table.scrollWidth > table.clientWidth + 1) table.setAttribute("tabindex", "0");
    else table.removeAttribute("tabindex");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  focusableWhenScrolling();
  window.addEventListener("resize", focusableWhenScrolling);
  document.body.addEventListener("htmx:afterSwap", (event) => {
    focusableWhenScrolling();
    for (const table of event.target.querySelectorAll?.("table[data-sortable]") ?? []) sortable(table);
    if (event.target.matches?.("table[data-sortable]")) sortable(event.target);
  });
  for (const root of document.querySelectorAll(".charts[data-job]")) {
    root.jobCharts = new JobCharts(root); // what the page draws, for whoever inspects it
    root.jobCharts.run();
  }
  for (const pre of document.querySelectorAll("pre[data-log]")) followLog(pre);
  for (const picker of document.querySelectorAll("select[data-log-attempt]")) {
    const pre = document.querySelector(picker.dataset.logAttempt);
    picker.addEventListener("change", () => followLog(pre, picker.selectedIndex === 0 ? null : picker.value));
  }
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
  for (const root of document.querySelectorAll(".explorer[data-jobs]")) {
    root.seriesExplorer = new SeriesExplorer(root);
    root.seriesExplorer.run();
  }
  for (const root of document.querySelectorAll("[data-telemetry]")) {
    const draw = () => drawTelemetry(root).catch((error) => {
      root.textContent = `Could not read the telemetry: ${error.message}`;
    });
    const folded = root.closest("details");
    if (folded && !folded.open) folded.addEventListener("toggle", draw, { once: true });
    else draw();
  }
  for (const region of document.querySelectorAll("[data-refresh]")) selfRefreshing(region);
  for (const table of document.querySelectorAll("table[data-sortable]")) sortable(table);
  for (const input of document.querySelectorAll("input[data-log-search]")) searchLog(input);
});
