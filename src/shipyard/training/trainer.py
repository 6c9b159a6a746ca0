"""The training loop. One rhythm per step: set LR, forward/backward over the micro-batches with
gradient accumulation, clip, step, log; evaluate and checkpoint on their intervals; stop cleanly
(checkpoint first) when the executor sends SIGTERM."""

from __future__ import annotations

import json
import math
import resource
import signal
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import torch
from torch import nn

from shipyard.errors import InvalidSpec
from shipyard.schemas.jobspec import JobSpec, ScheduleSection
from shipyard.schemas.launch import (
    CHECKPOINT_DIR,
    EXPORT_DIR,
    METRICS_FILE,
    AttemptResult,
    LaunchPlan,
)
from shipyard.schemas.presets import PRESETS
from shipyard.training import checkpoint, hf, parallel
from shipyard.training.data import TokenWindows, prepare
from shipyard.training.model import Transformer


def lr_factor(step: int, total_steps: int, schedule: ScheduleSection) -> float:
    """Multiplier of the peak LR at ``step`` (0-based): linear warmup, then the decay."""
    if step < schedule.warmup_steps:
        return (step + 1) / schedule.warmup_steps
    if schedule.decay == "constant":
        return 1.0
    span = max(1, total_steps - schedule.warmup_steps - 1)
    progress = min(1.0, (step - schedule.warmup_steps) / span)
    floor = schedule.min_lr_ratio
    if schedule.decay == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def resolve_precision(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type in ("hpu", "xpu"):
        return "bf16"
    if device.type == "cpu":
        cpu = torch.backends.cpu.get_cpu_capability()
        # bf16 pays off only with native bf16 dot products (AVX512-BF16 or AMX).
        native = (
            getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
            or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        )
        return "bf16" if native and "AVX512" in cpu else "fp32"
    return "fp32"


class StopSignal:
    """Turns SIGTERM/SIGINT into a flag the loop checks between steps."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.requested = True
        print(f"received {signal.Signals(signum).name}: checkpointing and stopping", flush=True)


@dataclass
class Trainer:
    plan: LaunchPlan
    out: TextIO = field(default_factory=lambda: sys.stdout)

    def __post_init__(self) -> None:
        self.spec: JobSpec = self.plan.spec
        self.run_dir = Path(self.plan.run_dir)
        self.metrics_path = self.run_dir / METRICS_FILE

    def log(self, message: str) -> None:
        if self.dist.is_main:
            print(message, file=self.out, flush=True)

    def record(self, **metrics: Any) -> None:
        if self.dist.is_main:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(metrics) + "\n")

    def run(self) -> AttemptResult:
        spec, plan = self.spec, self.plan
        torch.set_num_threads(plan.threads_per_process)
        self.dist = d = parallel.init(plan.torch_device)
        stop = StopSignal()
        try:
            return self._train(spec, plan, d, stop)
        finally:
            parallel.shutdown(d)

    def _train(self, spec: JobSpec, plan: LaunchPlan, d: parallel.Dist, stop: StopSignal) -> AttemptResult:
        t = spec.training
        torch.manual_seed(t.seed)
        cache = Path(plan.cache_dir)

        # 1. Data: rank 0 tokenizes (or finds the cache), the others then read the same shards.
        if d.is_main:
            data = prepare(spec.data, cache, log=self.log)
        parallel.barrier(d)
        if not d.is_main:
            data = prepare(spec.data, cache, log=lambda _: None)
        windows = TokenWindows(data, t.seq_len, spec.data.eval_fraction, t.seed)

        # 2. Model: a preset from scratch, or a Hugging Face directory to fine-tune.
        if spec.model.path:
            raw_model = hf.load_model(Path(spec.model.path))
        else:
            raw_model = Transformer(PRESETS[spec.model.preset or ""].with_vocab(data.vocab_size))
        arch = raw_model.arch
        if arch.vocab_size < data.vocab_size:
            raise InvalidSpec(
                f"the tokenizer has {data.vocab_size} tokens but the model only {arch.vocab_size}",
                hint="use the model's own tokenizer (data.tokenizer.path = model.path)",
            )
        if t.seq_len > arch.max_seq_len:
            raise InvalidSpec(
                f"training.seq_len {t.seq_len} exceeds the model's max_seq_len {arch.max_seq_len}",
                hint=f"set training.seq_len to at most {arch.max_seq_len}",
            )
        precision = resolve_precision(t.precision, d.device)
        raw_model.to(d.device)
        fsdp = t.parallelism == "fsdp" and d.enabled
        model = parallel.wrap(raw_model, d, t.parallelism, bf16=precision == "bf16")
        forward: nn.Module = torch.compile(model) if t.compile else model  # type: ignore[assignment]

        # 3. Optimizer: no weight decay on norms (1-D parameters).
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        o = t.optimizer
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": o.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=o.lr,
            betas=o.betas,
            eps=o.eps,
            # One vectorised kernel instead of a loop over parameters (what HF Trainer defaults to);
            # FSDP2's sharded parameters keep the default implementation.
            fused=(d.device.type in ("cpu", "cuda") and not fsdp) or None,
        )
        total = t.total_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, total, t.schedule)
        )
        scaler = torch.amp.GradScaler(d.device.type, enabled=precision == "fp16")
        autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

        def autocast() -> AbstractContextManager[Any]:
            if autocast_dtype is None or fsdp:  # FSDP2 casts through its MixedPrecisionPolicy
                return nullcontext()
            return torch.autocast(d.device.type, dtype=autocast_dtype)

        # 4. Resume: model, optimizer, scheduler, data position and RNG state.
        start_step = 0
        if plan.resume_from:
            state = checkpoint.load(Path(plan.resume_from))
            parallel.load_full_state(
                model if fsdp else raw_model, optimizer, state["model"], state["optimizer"], d, fsdp
            )
            scheduler.load_state_dict(state["scheduler"])
            start_step = state["step"]
            rngs = state["rng_by_rank"]
            checkpoint.set_rng_state(rngs[d.rank % len(rngs)])
            self.log(f"resumed from {plan.resume_from} at step {start_step}")

        accum = t.grad_accum_steps(d.world_size)
        micro = t.micro_batch_size
        samples_per_step = t.global_batch_tokens // t.seq_len
        flops_per_token = raw_model.flops_per_token(t.seq_len)
        peak = plan.peak_tflops_bf16 if precision in ("bf16", "fp16") else plan.peak_tflops_fp32
        peak_flops = peak * 1e12 * d.world_size
        n_params = arch.num_params()
        self.log(
            f"model: {n_params / 1e6:.2f}M parameters ({spec.model.preset or spec.model.path}), "
            f"vocab {arch.vocab_size}; {data.n_tokens:,} tokens; precision {precision}; "
            f"{d.world_size} x {d.device.type} ({t.parallelism if d.enabled else 'single'}); "
            f"{accum} micro-steps of {micro}x{t.seq_len} per device per step; steps {start_step}->{total}"
        )
        if d.is_main and start_step == 0:
            self.metrics_path.unlink(missing_ok=True)
            self.record(
                kind="start",
                params=n_params,
                tokens=data.n_tokens,
                total_steps=total,
                precision=precision,
                world_size=d.world_size,
                flops_per_token=flops_per_token,
            )

        def evaluate(step: int) -> float:
            model.eval()
            losses = []
            with torch.no_grad():
                for i in range(d.rank, t.eval_batches, d.world_size):
                    x, y = windows.eval_batch(i, micro)
                    with autocast():
                        losses.append(float(forward(x.to(d.device), y.to(d.device))))
            model.train()
            loss = parallel.all_reduce_mean(sum(losses) / max(1, len(losses)), d)
            self.record(kind="eval", step=step, loss=loss)
            self.log(f"eval step {step}: loss {loss:.4f}")
            return loss

        def save_checkpoint(step: int) -> Path:
            model_state, optim_state = parallel.full_state(model if fsdp else raw_model, optimizer, d, fsdp)
            rngs = _gather_rng(d)
            path = Path(plan.run_dir) / CHECKPOINT_DIR / checkpoint.step_dir_name(step)
            if d.is_main:
                path = checkpoint.save(
                    Path(plan.run_dir) / CHECKPOINT_DIR,
                    step,
                    {
                        "model": model_state,
                        "optimizer": optim_state,
                        "scheduler": scheduler.state_dict(),
                        "step": step,
                        "samples_seen": step * samples_per_step,
                        "arch": vars_of(arch),
                    },
                    rngs,
                    keep=spec.checkpoint.keep,
                )
                self.record(kind="checkpoint", step=step, path=str(path))
            parallel.barrier(d)
            return path

        if start_step == 0:
            evaluate(0)

        # 5. The loop.
        step, train_start, last_loss = start_step, time.perf_counter(), float("nan")
        while step < total:
            step_start = time.perf_counter()
            first = step * samples_per_step + d.rank * accum * micro
            loss_sum = 0.0
            for m in range(accum):
                x, y = windows.train_batch(first + m * micro, micro)
                with parallel.no_sync(model, last_micro_step=m == accum - 1), autocast():
                    loss = forward(x.to(d.device), y.to(d.device)) / accum
                scaler.scale(loss).backward()
                loss_sum += float(loss.detach())
            scaler.unscale_(optimizer)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip or float("inf")))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            step += 1

            last_loss = parallel.all_reduce_mean(loss_sum, d)
            if d.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - step_start
            tokens_per_s = t.global_batch_tokens / elapsed
            mfu = flops_per_token * tokens_per_s / peak_flops if peak_flops else 0.0
            if step % t.log_interval == 0 or step == total:
                eta = (total - step) * elapsed
                self.record(
                    kind="train",
                    step=step,
                    loss=last_loss,
                    lr=lr,
                    grad_norm=grad_norm,
                    tokens_per_s=tokens_per_s,
                    mfu=mfu,
                    mem_gib=_memory_gib(d.device),
                    step_time_s=elapsed,
                    elapsed_s=time.perf_counter() - train_start,
                )
                self.log(
                    f"step {step}/{total} | loss {last_loss:.4f} | lr {lr:.2e} | "
                    f"{tokens_per_s:,.0f} tok/s | mfu {mfu:.2%} | eta {eta:.0f}s"
                )
            if t.eval_interval and step % t.eval_interval == 0 and step < total:
                evaluate(step)
            interrupted = parallel.any_rank(stop.requested, d) or step == plan.stop_at_step
            if interrupted:
                path = save_checkpoint(step)
                return AttemptResult(
                    status="cancelled",
                    step=step,
                    checkpoint=str(path),
                    message=f"stopped after step {step} of {total}; resume with --resume",
                )
            if spec.checkpoint.interval and step % spec.checkpoint.interval == 0 and step < total:
                save_checkpoint(step)

        # 6. The end: final eval, checkpoint and Hugging Face export.
        eval_loss = evaluate(step)
        path = save_checkpoint(step)
        model_state, _ = parallel.full_state(model if fsdp else raw_model, optimizer, d, fsdp)
        export_dir = Path(plan.run_dir) / EXPORT_DIR
        if d.is_main:
            hf.export(model_state, arch, data.tokenizer_path, data.eos_id, export_dir)
            self.log(f"exported Hugging Face model to {export_dir}")
        summary = {"train_loss": last_loss, "eval_loss": eval_loss, "params": float(n_params)}
        return AttemptResult(
            status="completed",
            step=step,
            checkpoint=str(path),
            export_dir=str(export_dir),
            summary=summary,
        )


def vars_of(arch: object) -> dict[str, Any]:
    return {name: getattr(arch, name) for name in arch.__dataclass_fields__}  # type: ignore[attr-defined]


def _gather_rng(d: parallel.Dist) -> list[dict[str, Any]]:
    state = checkpoint.rng_state()
    if not d.enabled:
        return [state]
    import torch.distributed as dist

    gathered: list[Any] = [None] * d.world_size
    dist.all_gather_object(gathered, state)
    return gathered


def _memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # ru_maxrss is KiB on Linux (bytes on macOS; close enough for a progress line there).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
