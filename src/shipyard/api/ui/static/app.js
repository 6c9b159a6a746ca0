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

function newChart(element, series, data) {
  const options = {
    width: chartWidth(element),
    height: 220,
    scales: { x: { time: false } },
    axes: [{ label: "step" }, {}],
    series: [{ label: "step" }, ...series],
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

// The job's log, appended as it grows, until the job ends.
async function followLog(pre) {
  const job = pre.dataset.log;
  let offset = 0;
  for (;;) {
    try {
      const chunk = await getJson(`/api/v1/jobs/${encodeURIComponent(job)}/logs?offset=${offset}`);
      if (chunk.data) {
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.append(document.createTextNode(chunk.data));
        if (atBottom) pre.scrollTop = pre.scrollHeight;
      }
      offset = chunk.next_offset;
      if (chunk.job_ended && !chunk.data) return;
    } catch (error) {
      pre.append(document.createTextNode(`\n[could not read the log: ${error.message}]\n`));
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

// Two model versions' training loss on one chart.
async function compareCurves(element) {
  const jobs = element.dataset.compare.split(",");
  const labels = element.dataset.labels.split(",");
  const runs = await Promise.all(jobs.map((job) => getJson(metricsUrl(job, "train", -1))));
  const steps = [...new Set(runs.flatMap((r) => r.step))].sort((a, b) => a - b);
  const columns = runs.map((r) => {
    const byStep = new Map(r.step.map((s, i) => [s, r.loss[i]]));
    return steps.map((s) => (byStep.has(s) ? byStep.get(s) : null));
  });
  const colours = ["#1d4e89", "#a4161a"];
  newChart(
    element,
    labels.map((label, i) => ({ label, stroke: colours[i], width: 2, spanGaps: true })),
    [steps, ...columns],
  );
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
  document.body.addEventListener("htmx:afterSwap", focusableWhenScrolling);
  for (const root of document.querySelectorAll(".charts[data-job]")) {
    root.jobCharts = new JobCharts(root); // what the page draws, for whoever inspects it
    root.jobCharts.run();
  }
  for (const pre of document.querySelectorAll("pre[data-log]")) followLog(pre);
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
  for (const element of document.querySelectorAll("[data-compare]")) compareCurves(element);
});
