"""The training loop. One rhythm per step: set LR, forward/backward over the micro-batches with
gradient accumulation, clip, step, log; evaluate and checkpoint on their intervals; stop cleanly
(checkpoint first) when the executor sends SIGTERM."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from shipyard.errors import CheckpointError
from shipyard.schemas.data_roots import refuse_escaped_folders
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.launch import (
    CHECKPOINT_DIR,
    EXPORT_DIR,
    METRICS_FILE,
    AttemptResult,
    LaunchPlan,
)
from shipyard.storage.digests import folder_digest
from shipyard.training import checkpoint, parallel, parallelize, results
from shipyard.training.build import build_model, build_optimizer, describe, resolve_precision
from shipyard.training.data import TokenWindows, job_tokenizer, prepare
from shipyard.training.faults import Faults
from shipyard.training.heartbeat import Pulse
from shipyard.training.metrics_file import MetricsFile
from shipyard.training.optim import moments_in_bf16
from shipyard.training.process import StopSignal, peak_memory_gib
from shipyard.training.samples import SampleRows
from shipyard.training.schedule import BestEval, lr_factor


@dataclass
class Trainer:
    plan: LaunchPlan
    out: TextIO = field(default_factory=lambda: sys.stdout)
    started_pulse: Pulse | None = None
    """The rank's heartbeat, beating since the process started (made here if none was)."""

    def __post_init__(self) -> None:
        self.spec: JobSpec = self.plan.spec
        self.run_dir = Path(self.plan.run_dir)
        self.metrics = MetricsFile(self.run_dir / METRICS_FILE)
        self.data_wait_s = 0.0
        """Seconds the last step waited for its batches (a job starved on input shows it here)."""
        self.best = BestEval()

    def log(self, message: str) -> None:
        if self.dist.is_main:
            print(message, file=self.out, flush=True)

    def record(self, **metrics: Any) -> None:
        if self.dist.is_main:
            self.metrics.append(**metrics)

    def run(self) -> AttemptResult:
        torch.set_num_threads(self.plan.threads_per_process)
        self.dist = parallel.init(self.plan.torch_device, self.spec.training.parallelism)
        self.faults = Faults.of_attempt(self.plan.attempt)
        self.pulse = self.started_pulse or Pulse(self.run_dir, self.dist.rank, step=0)
        if self.started_pulse is None:
            self.pulse.keep_alive()
        stop = StopSignal()
        try:
            self._setup()
            return self._train(stop)
        finally:
            parallel.shutdown(self.dist)

    def _setup(self) -> None:
        spec, plan, d, t = self.spec, self.plan, self.dist, self.spec.training
        torch.manual_seed(t.seed)

        # 1. Data: rank 0 tokenizes (or finds the cache), the others then read the same shards.
        # A job from the server reads only inside its data roots, checked again on the files.
        within = [Path(root) for root in plan.data_roots] if plan.data_roots is not None else None
        if within is not None:
            refuse_escaped_folders(spec, within)
        self.tokenizer_dir = job_tokenizer(spec)
        cache = Path(plan.cache_dir)
        if d.is_main:
            self.data = prepare(
                spec.data, cache, log=self.log, within=within, tokenizer_dir=self.tokenizer_dir
            )
        parallel.barrier(d)
        if not d.is_main:
            self.data = prepare(
                spec.data, cache, log=lambda _: None, within=within, tokenizer_dir=self.tokenizer_dir
            )
        self.windows: TokenWindows | SampleRows = (
            TokenWindows(self.data, t.seq_len, spec.data.eval_fraction, t.seed)
            if spec.data.format == "text"
            else SampleRows(
                self.data.directory,
                self.data.pad_id,
                t.seq_len,
                spec.data.eval_fraction,
                t.seed,
                spec.data.packing,
                pairs=spec.data.format == "preference",
            )
        )

        # 2. Model, spread over the devices; the optimizer and its schedule.
        self.precision = resolve_precision(t.precision, d.device)
        built = build_model(spec, self.data, d, self.precision)
        self.raw_model, self.model, self.spread = built.model, built.forward, built.spread
        # Adapters: checkpoints hold the trained parameters alone, the base is read from model.path.
        self.adapters = spec.adapters
        self.base_digest = folder_digest(Path(spec.model.path)) if spec.model.path else None
        self.model.train()  # from_pretrained hands a model over in eval mode (dropout off)
        self.optimizer = build_optimizer(
            self.raw_model, spec, d.device, sharded=self.spread.fsdp or self.spread.tp
        )
        total = t.total_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, total, t.schedule)
        )
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=self.precision == "fp16")
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        self.checkpointer = checkpoint.Checkpointer(
            self.run_dir / CHECKPOINT_DIR,
            d,
            spec.checkpoint.keep,
            trainable_only=self.adapters,
            faults=self.faults,
        )

        # 3. Resume: model, optimizer, scheduler, data position and RNG state, resharded onto
        # this attempt's layout.
        self.start_step = 0
        if plan.resume_from:
            state = self.checkpointer.load(Path(plan.resume_from), self.raw_model, self.optimizer)
            if state.get("base_digest") != self.base_digest:
                raise CheckpointError(
                    f"checkpoint {plan.resume_from} was written on other base weights than "
                    f"{spec.model.path or spec.model.preset} holds now",
                    hint="resume onto the model it was trained from, or start without --resume",
                )
            if spec.training.optimizer.state_dtype == "bf16":
                moments_in_bf16(self.optimizer)
            self.scheduler.load_state_dict(state["scheduler"])
            self.best = BestEval(**state.get("best_eval") or {})
            if self.best.checkpoint:
                self.checkpointer.kept.add(self.best.checkpoint)
            self.start_step = self.pulse.step = state["step"]
            rngs = state["rng_by_rank"]
            checkpoint.set_rng_state(rngs[d.rank % len(rngs)])
            self.log(f"resumed from {plan.resume_from} at step {self.start_step}")
            self.record(kind="resume", step=self.start_step, path=plan.resume_from)

    def loss_context(self) -> AbstractContextManager[Any]:
        """Under tensor parallelism the loss is computed on the vocabulary shards of the logits,
        forward and backward (``loss_parallel``): no rank ever holds all of them."""
        if not self.spread.tp:
            return nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def to_device(self, *batch: torch.Tensor) -> list[torch.Tensor]:
        """A copy from pageable host memory makes the host wait until the GPU has drained, and the
        GPU then idles while the next micro-step's kernels are launched; a pinned copy does not."""
        device = self.dist.device
        if device.type != "cuda":
            return [t.to(device) for t in batch]
        return [t.pin_memory().to(device, non_blocking=True) for t in batch]

    def autocast(self) -> AbstractContextManager[Any]:
        if self.autocast_dtype is None or self.spread.fsdp:  # FSDP2 casts through its MixedPrecisionPolicy
            return nullcontext()
        return torch.autocast(self.dist.device.type, dtype=self.autocast_dtype)

    def evaluate(self, step: int) -> float:
        d, t = self.dist, self.spec.training
        self.pulse.enter("eval")
        self.model.eval()
        total, counted = 0.0, 0.0
        # Every data-parallel rank runs as many forward passes as the busiest one: under DDP and
        # FSDP each is a collective, and a rank with fewer would leave the others waiting for it.
        # Batches past ``eval_batches`` (more ranks than batches) are run, but not counted; the
        # ranks of a tensor-parallel group run the same batches and count them once.
        ranks = d.dp_size
        with torch.no_grad():
            for i in range(d.dp_rank, math.ceil(t.eval_batches / ranks) * ranks, ranks):
                batch = self.windows.eval_batch(i % t.eval_batches, t.micro_batch_size)
                with self.autocast(), self.loss_context():
                    loss_i = float(parallel.whole(self.model(*self.to_device(*batch))))
                if i < t.eval_batches:
                    total, counted = total + loss_i / d.tp, counted + 1 / d.tp
        self.model.train()
        total, counted = parallel.all_reduce_sum([total, counted], d)
        loss = total / max(1.0, counted)
        self.record(kind="eval", step=step, loss=loss, **self.method_figures())
        self.log(f"eval step {step}: loss {loss:.4f}")
        return loss

    def method_figures(self) -> dict[str, float]:
        """A method's own figures since they were last taken (preference tuning's rewards), over
        all ranks; every rank must ask."""
        take = getattr(self.raw_model, "take_figures", None)
        if take is None:
            return {}
        from shipyard.training.preference import mean_figures

        return mean_figures(parallel.all_reduce_sum(take(), self.dist))

    def save_checkpoint(self, step: int, *, background: bool = False, last: bool = False) -> Path:
        """Checkpoint ``step``; ``background``: write it while the next steps train; ``last``: the
        attempt's final one, after which the host memory kept for writing them is freed."""
        self.pulse.enter("checkpoint")
        t = self.spec.training
        trainer_state = {
            "scheduler": self.scheduler.state_dict(),
            "samples_seen": step * t.global_batch_tokens // t.seq_len,
            "base_digest": self.base_digest,
            "best_eval": dataclasses.asdict(self.best),
        }
        description = {**describe(self.spec, self.raw_model, self.adapters), "base_digest": self.base_digest}
        path = self.checkpointer.save(
            step,
            self.raw_model,
            self.optimizer,
            trainer_state,
            description,
            background=background,
            on_commit=lambda path: self.record(kind="checkpoint", step=step, path=str(path)),
        )
        if last:
            self.checkpointer.close()
        return path

    def train_step(self, step: int) -> tuple[float, float, float]:
        """One optimizer step (0-based ``step``); returns the mean loss over all ranks, the
        gradient norm before clipping, and the seconds it computed before its last collective
        (which a slow device makes long, and the peers waiting for it do not)."""
        d, t = self.dist, self.spec.training
        started = time.perf_counter()
        compute_s = 0.0
        accum, micro = t.grad_accum_steps(d.dp_size), t.micro_batch_size
        # Each data-parallel rank reads its own slice of the step's samples, so any layout sees the
        # same batch (the ranks of a tensor-parallel group read the same slice).
        first = step * (t.global_batch_tokens // t.seq_len) + d.dp_rank * accum * micro
        # Summed on the device: reading each micro-step's loss would make the host wait for the GPU
        # before it could queue the next micro-step's kernels.
        loss_sum = torch.zeros((), device=d.device)
        reading = time.perf_counter()
        batches = [self.windows.train_batch(first + m * micro, micro) for m in range(accum)]
        self.data_wait_s = time.perf_counter() - reading
        # The step's loss is the mean over all its trained tokens, on every micro-batch and rank,
        # as one large batch's: a micro-batch of mostly prompt or padding weighs by what it trains.
        # DDP and FSDP average the ranks' gradients, hence the data-parallel degree.
        units = [self.windows.trained_units(batch) for batch in batches]
        (step_units,) = parallel.all_reduce_sum([float(sum(units))], d)
        step_units = max(1.0, step_units / d.tp)  # a tensor-parallel group reads the same batch
        for m, batch in enumerate(batches):
            self.faults.before_forward(step + 1, d.rank, micro)
            with parallel.no_sync(self.model, last_micro_step=m == accum - 1), self.loss_context():
                with self.autocast():
                    loss = self.model(*self.to_device(*batch)) * (units[m] * d.dp_size / step_units)
                if m == accum - 1:  # what comes next, the last backward, waits for the other ranks
                    if d.device.type == "cuda":
                        torch.cuda.synchronize()
                    compute_s = time.perf_counter() - started
                self.scaler.scale(loss).backward()
            loss_sum += parallel.whole(loss.detach()).float()
        self.scaler.unscale_(self.optimizer)
        clip = t.optimizer.grad_clip or float("inf")
        grad_norm = float(parallel.whole(torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), clip)))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return parallel.all_reduce_mean(float(loss_sum), d), grad_norm, compute_s

    def _announce(self, flops_per_token: float) -> int:
        """Say what is about to train; a fresh run starts its metrics and evaluates the untrained
        model. Returns the parameter count."""
        spec, d, t = self.spec, self.dist, self.spec.training
        total, n_params = t.total_steps, self.raw_model.num_params()
        trained = sum(p.numel() for p in self.raw_model.parameters() if p.requires_grad)
        attention = getattr(self.raw_model, "attention", None)
        method = (
            f"{spec.method} fine-tuning, {trained / 1e6:.2f}M trained, {attention} attention; "
            if spec.method
            else ""
        )
        self.log(
            f"model: {n_params / 1e6:.2f}M parameters ({spec.model.preset or spec.model.path}), {method}"
            f"vocab {self.data.vocab_size}; {self.data.n_tokens:,} tokens; precision {self.precision}; "
            f"{d.world_size} x {d.device.type} ({d.layout.describe() if d.enabled else 'single'}; "
            f"{self.spread.describe()}); {t.grad_accum_steps(d.dp_size)} micro-steps of "
            f"{t.micro_batch_size}x{t.seq_len} per device per step; steps {self.start_step}->{total}"
        )
        if self.start_step == 0:
            if d.is_main:
                self.metrics.path.unlink(missing_ok=True)
            self.record(
                kind="start",
                params=n_params,
                tokens=self.data.n_tokens,
                total_steps=total,
                precision=self.precision,
                world_size=d.world_size,
                flops_per_token=flops_per_token,
            )
            self.watch_eval(0, self.evaluate(0))
        return n_params

    def _train(self, stop: StopSignal) -> AttemptResult:
        spec, plan, d, t = self.spec, self.plan, self.dist, self.spec.training
        total = t.total_steps
        flops_per_token = self.raw_model.flops_per_token(t.seq_len)
        peak = plan.peak_tflops_bf16 if self.precision in ("bf16", "fp16") else plan.peak_tflops_fp32
        peak_flops = peak * 1e12 * d.world_size
        self._announce(flops_per_token)

        # 4. The loop: step, log, evaluate, stop if asked, checkpoint.
        step, train_start, loss = self.start_step, time.perf_counter(), float("nan")
        while step < total:
            step_start = time.perf_counter()
            lr = self.scheduler.get_last_lr()[0]
            loss, grad_norm, compute_s = self.train_step(step)
            figures = self.method_figures()
            step += 1
            if d.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - step_start
            self.pulse.stepped(step, elapsed, compute_s)
            tokens_per_s = t.global_batch_tokens / elapsed
            mfu = flops_per_token * tokens_per_s / peak_flops if peak_flops else 0.0
            if step % t.log_interval == 0 or step == total:
                self.record(
                    kind="train",
                    step=step,
                    loss=loss,
                    lr=lr,
                    grad_norm=grad_norm,
                    tokens_per_s=tokens_per_s,
                    mfu=mfu,
                    **peak_memory_gib(d.device),
                    step_time_s=elapsed,
                    data_wait_s=self.data_wait_s,
                    elapsed_s=time.perf_counter() - train_start,
                    **figures,
                )
                self.log(
                    f"step {step}/{total} | loss {loss:.4f} | lr {lr:.2e} | "
                    f"{tokens_per_s:,.0f} tok/s | mfu {mfu:.2%} | eta {(total - step) * elapsed:.0f}s"
                )
            evaluates = t.eval_interval and step % t.eval_interval == 0 and step < total
            if evaluates and self.watch_eval(step, self.evaluate(step)):
                return self._finish(step, loss, stopped_early=True)
            # Early stopping may have checkpointed this step already.
            saved = self.best.step == step and self.best.checkpoint is not None
            if parallel.any_rank(stop.requested, d) or step == plan.stop_at_step:
                if saved:
                    self.checkpointer.close()
                written = self.checkpointer.directory / str(self.best.checkpoint)
                return AttemptResult(
                    status="cancelled",
                    step=step,
                    checkpoint=str(written if saved else self.save_checkpoint(step, last=True)),
                    message=f"stopped after step {step} of {total}; resume with --resume",
                )
            interval = spec.checkpoint.interval
            if interval and step % interval == 0 and step < total and not saved:
                self.save_checkpoint(step, background=True)
        return self._finish(step, loss)

    def watch_eval(self, step: int, loss: float) -> bool:
        """Early stopping: note an improved eval loss, checkpointing its weights (kept whatever
        ``checkpoint.keep`` says); True when ``patience`` evals in a row have not improved."""
        rule = self.spec.training.early_stopping
        if rule is None:
            return False
        if loss < self.best.loss - rule.min_delta:
            self.best = BestEval(loss=loss, step=step)
            path = self.save_checkpoint(step)
            self.best.checkpoint = path.name
            self.checkpointer.kept.add(path.name)
            return False
        self.best.stale += 1
        return self.best.stale >= rule.patience

    def _finish(self, step: int, loss: float, stopped_early: bool = False) -> AttemptResult:
        """Final eval, checkpoint and Hugging Face export; an early stop exports its best eval's
        weights, read back from their checkpoint."""
        spec, d, t = self.spec, self.dist, self.spec.training
        message = None

        # 5. The end: final eval, checkpoint and Hugging Face export, assembled one tensor at a
        # time from the shards (no process holds the whole model).
        if stopped_early and self.best.checkpoint is not None:
            self.checkpointer.wait()
            path = self.checkpointer.directory / self.best.checkpoint
            self.checkpointer.load(path, self.raw_model, self.optimizer)
            self.checkpointer.close()
            eval_loss = self.best.loss
            rule = t.early_stopping
            message = (
                f"stopped early at step {step}: eval loss did not improve for "
                f"{rule.patience if rule else 0} evals; exported step {self.best.step}, "
                f"whose eval loss {eval_loss:.4f} was the best"
            )
            self.log(message)
            self.record(kind="early_stop", step=step, best_step=self.best.step, best_loss=eval_loss)
        else:
            eval_loss = self.evaluate(step)
            path = self.save_checkpoint(step, last=True)
        export_dir = self.run_dir / EXPORT_DIR
        self.pulse.enter("export")
        tensors = parallelize.full_tensors(self.raw_model, d, trainable_only=self.adapters)
        if d.is_main:
            results.export(self.raw_model, tensors, spec, self.data, self.tokenizer_dir, export_dir)
            self.log(f"exported Hugging Face {'adapters' if self.adapters else 'model'} to {export_dir}")
        else:
            for _ in tensors:  # each tensor is gathered by every rank
                pass
        # The other ranks wait here: one that tears down its process group while rank 0 is
        # still exporting can abort inside gloo ("terminate called without an active exception").
        parallel.barrier(d)
        return AttemptResult(
            status="completed",
            step=step,
            message=message,
            checkpoint=str(path),
            export_dir=str(export_dir),
            summary={
                "train_loss": loss,
                "eval_loss": eval_loss,
                "params": float(self.raw_model.num_params()),
            },
            lineage=results.lineage(spec, self.data, self.base_digest, self.adapters),
        )
