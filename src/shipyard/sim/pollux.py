"""Pollux's throughput model (OSDI 2021), as Sia (SOSP 2023) fits it to the step times a job has
run and decides on it: what Sia's program *believes* a job's speed on a placement is.

A step is ``accum`` passes of forward/backward at the per-GPU batch (``alpha_c + beta_c * bsz``
seconds each) and a last pass overlapped with the gradient exchange, whose time is a constant
and a term growing with the replicas beyond 2, inter-node (``_n``) or within a node (``_r``),
the two combined as a ``gamma``-norm (1: no overlap, 10: almost full). The parameters are fitted
in log space with Pollux's priors: terms the profile cannot tell apart are held at their floor,
and a job that never ran on several nodes is assumed no faster across nodes than within one.
With so few points the fit is optimistic where the job has not run: that is Sia's knowledge,
reproduced here to check Shipyard's simulator against Sia's (``goodput.py: fit_perf_params``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, minimize

FLOOR = 1e-8
"""The lower bound of every time term (Pollux's slack against numerical trouble)."""
_START = np.array([1e-1, 1e-2, 1e-1, 1e-2, 1e-1, 1e-2, 1.0 + 1e-3])
_LOWER = np.array([FLOOR] * 6 + [1.0])
_UPPER = np.array([np.inf] * 6 + [10.0])
_COMPLEX_STEP = 1e-20


@dataclass(frozen=True, slots=True)
class Profile:
    """One measured configuration: its nodes, GPUs, per-GPU batch, and seconds per step, of which
    ``sync_s`` the last pass's exchange did not hide."""

    nodes: int
    replicas: int
    atomic_bsz: float
    step_s: float
    sync_s: float


@dataclass(frozen=True, slots=True)
class PerfParams:
    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def step_s(self, nodes: int, replicas: int, atomic_bsz: float, accum: int) -> float:
        """Seconds of one optimizer step: ``accum`` bare passes, then one with the exchange."""
        params = np.array([getattr(self, name) for name in self.__slots__])
        one = np.array([nodes], dtype=float), np.array([replicas], dtype=float)
        accum_s = params[0] + params[1] * atomic_bsz
        optim_s = np.exp(_log_optim_s(params, accum_s, _network_s(params, *one)))[0]
        return float(accum * accum_s + optim_s)


def fit(profiles: Mapping[tuple[int, int, float], tuple[float, float]]) -> PerfParams:
    """Pollux's fit of a job's profiles on one GPU type: (nodes, replicas, atomic batch) ->
    (step seconds, sync seconds)."""
    keys = list(profiles)
    nodes = np.array([k[0] for k in keys], dtype=float)
    replicas = np.array([k[1] for k in keys], dtype=float)
    bsz = np.array([k[2] for k in keys], dtype=float)
    step = np.array([profiles[k][0] for k in keys])
    accum = step - np.array([profiles[k][1] for k in keys])
    start, lower, upper = _START.copy(), _LOWER.copy(), _UPPER.copy()
    fixed = np.zeros(7, dtype=bool)

    def hold(index: int, value: float) -> None:
        start[index] = lower[index] = upper[index] = value
        fixed[index] = True

    if len(np.unique(bsz)) == 1:  # one batch size: split the pass time evenly (Pollux's prior)
        hold(0, float(np.mean(accum)) / 2)
    if not np.any(nodes > 1):
        hold(2, FLOOR)
        hold(3, FLOOR)
    if not np.any((nodes == 1) & (replicas > 1)):
        hold(4, FLOOR)
        hold(5, FLOOR)
    if not np.any(replicas > 2):
        hold(3, FLOOR)
        hold(5, FLOOR)
    free = ~fixed
    data = (nodes, replicas, bsz, np.log(accum), np.log(step))

    def full(x: np.ndarray) -> np.ndarray:
        params = start.astype(x.dtype)
        params[free] = x
        return params

    def objective(x: np.ndarray) -> float:
        return float(_loss(full(x), *data).real)

    def gradient(x: np.ndarray) -> np.ndarray:  # complex step: exact to rounding, no autograd
        out = np.empty(len(x))
        for i in range(len(x)):
            shifted = x.astype(complex)
            shifted[i] += 1j * _COMPLEX_STEP
            out[i] = _loss(full(shifted), *data).imag / _COMPLEX_STEP
        return out

    params = start
    if free.any():
        bounds = Bounds(lower[free], upper[free], keep_feasible=True)
        result = minimize(objective, start[free], jac=gradient, bounds=bounds, tol=1e-5)
        params = full(result.x)
    if not np.any(nodes > 1):  # never across nodes: no faster there than within a node
        params[2] = max(params[2], params[4] * 1.1)
        params[3] = max(params[3], params[5] * 1.1)
    return PerfParams(*(float(p) for p in params))


def _network_s(params: np.ndarray, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
    across, within = nodes > 1, replicas > 1
    constant = np.where(across, params[2], np.where(within, params[4], FLOOR))
    growth = np.where(across, params[3], np.where(within, params[5], FLOOR))
    return constant + growth * np.maximum(replicas - 2, FLOOR)  # type: ignore[no-any-return]


def _log_optim_s(params: np.ndarray, accum_s: np.ndarray, network_s: np.ndarray) -> np.ndarray:
    gamma = params[6]
    return np.log(accum_s**gamma + network_s**gamma) / gamma  # type: ignore[no-any-return]


def _loss(
    params: np.ndarray,
    nodes: np.ndarray,
    replicas: np.ndarray,
    bsz: np.ndarray,
    log_accum: np.ndarray,
    log_step: np.ndarray,
) -> np.ndarray:
    accum_s = params[0] + params[1] * bsz
    log_optim = _log_optim_s(params, accum_s, _network_s(params, nodes, replicas))
    error = np.sqrt(np.mean((np.log(accum_s) - log_accum) ** 2)) + np.sqrt(
        np.mean((log_optim - log_step) ** 2)
    )
    regular = 1e-3 * (params[6] - 1) ** 2 + 1e-2 * (
        (params[3] / params[2]) ** 2 + (params[5] / params[4]) ** 2
    )
    return error + regular  # type: ignore[no-any-return]
