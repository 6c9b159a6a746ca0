"""The linear programs behind the optimization policies, solved with HiGHS (SciPy) or ECOS,
Gavel's own solver (see the package's description for why both)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, identity, vstack

from shipyard.errors import DependencyMissing
from shipyard.scheduling.model import Allocation, Job, PolicyInput
from shipyard.scheduling.policies.common import Solver, types_of


@dataclass(frozen=True, slots=True)
class Problem:
    """Variables x[(j,k)] for every job and allowed type, with throughputs and capacity rows."""

    jobs: list[Job]
    pairs: list[tuple[int, str]]
    throughput: np.ndarray
    types: list[str]

    @classmethod
    def of(cls, inp: PolicyInput) -> Problem:
        jobs = list(inp.jobs)
        pairs: list[tuple[int, str]] = []
        throughput: list[float] = []
        for j, job in enumerate(jobs):
            for k in types_of(job, inp):
                pairs.append((j, k))
                throughput.append(inp.throughputs.of(job, k))
        return cls(jobs, pairs, np.asarray(throughput), sorted(inp.capacity))

    def base_rows(self, inp: PolicyInput) -> tuple[list[int], list[int], list[float], list[float]]:
        """Each job's shares sum to <= 1; each type's gangs fit its devices."""
        rows, cols, vals, rhs = [], [], [], []
        for v, (j, _) in enumerate(self.pairs):
            rows.append(j)
            cols.append(v)
            vals.append(1.0)
        rhs += [1.0] * len(self.jobs)
        offset = len(self.jobs)
        type_row = {k: offset + i for i, k in enumerate(self.types)}
        for v, (j, k) in enumerate(self.pairs):
            rows.append(type_row[k])
            cols.append(v)
            vals.append(float(self.jobs[j].devices))
        rhs += [float(inp.capacity[k]) for k in self.types]
        return rows, cols, vals, rhs

    def solve(
        self,
        inp: PolicyInput,
        objective: np.ndarray,
        extra_rows: list[tuple[list[int], list[float], float]],
        extra_vars: int,
        solver: Solver = "highs",
        *,
        exact: bool = False,
    ) -> Allocation | None:
        """The allocation at the optimum; None when the program is infeasible (with ``exact``,
        ECOS's answers to reduced accuracy count as infeasible, as Gavel's bisection has it)."""
        if not self.pairs:
            return {}
        rows, cols, vals, rhs = self.base_rows(inp)
        n_vars = len(self.pairs) + extra_vars
        for r, (c_idx, c_val, bound) in enumerate(extra_rows, start=len(rhs)):
            rows += [r] * len(c_idx)
            cols += c_idx
            vals += c_val
            rhs.append(bound)
        a_ub = coo_matrix((vals, (rows, cols)), shape=(len(rhs), n_vars))
        if solver == "ecos":
            x = _ecos(objective, a_ub, np.asarray(rhs), exact=exact)
        else:
            x = _highs(objective, a_ub, rhs)
        if x is None:
            return None
        allocation: dict[str, dict[str, float]] = {}
        for v, (j, k) in enumerate(self.pairs):
            share = float(x[v])
            if share > 1e-6:
                allocation.setdefault(self.jobs[j].id, {})[k] = min(1.0, share)
        return allocation

    def max_min(self, inp: PolicyInput, scale: np.ndarray, solver: Solver = "highs") -> Allocation:
        """Maximize t with sum_k scale_j * T[j,k] * x[j,k] >= t for every job."""
        t = len(self.pairs)
        objective = np.zeros(t + 1)
        objective[t] = -1.0
        per_job: dict[int, tuple[list[int], list[float]]] = {}
        for v, (j, _) in enumerate(self.pairs):
            cols, coefs = per_job.setdefault(j, ([], []))
            cols.append(v)
            coefs.append(-float(scale[j] * self.throughput[v]))
        extra = [([*cols, t], [*coefs, 1.0], 0.0) for cols, coefs in per_job.values()]
        return self.solve(inp, objective, extra, extra_vars=1, solver=solver) or {}


def _highs(objective: np.ndarray, a_ub: coo_matrix, rhs: list[float]) -> np.ndarray | None:
    result = linprog(objective, A_ub=a_ub.tocsr(), b_ub=rhs, bounds=(0, None), method="highs")
    return result.x if result.status == 0 else None


def _ecos(objective: np.ndarray, a_ub: coo_matrix, rhs: np.ndarray, *, exact: bool) -> np.ndarray | None:
    """min c.x over A x <= b, x >= 0 with ECOS (its defaults, as cvxpy hands Gavel's programs to it)."""
    try:
        import ecos
    except ImportError:
        raise DependencyMissing(
            "the gavel_* policies solve with ECOS, Gavel's solver, which is not installed",
            hint="pip install 'shipyard[gavel]'",
        ) from None
    n = a_ub.shape[1]
    g = vstack([a_ub, -identity(n, format="coo")]).tocsc()
    h = np.concatenate([rhs, np.zeros(n)])
    cones = {"l": g.shape[0], "q": [], "e": 0}
    found = ecos.solve(np.asarray(objective, dtype=float), g, h, cones, verbose=False)
    # 0: optimal; 10: optimal to reduced accuracy, which cvxpy calls "optimal_inaccurate" and
    # Gavel's max-min policies use all the same.
    return np.asarray(found["x"]) if found["info"]["exitFlag"] in ((0,) if exact else (0, 10)) else None
