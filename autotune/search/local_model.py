"""The search's model of the objective: a small Gaussian process over the configs measured so far.

Each config is a point with one coordinate per tuned flag: its place among the values that flag may take there (0 to
1; for a flag whose range depends on others, like draft tokens, its place inside that range). Ordered flags are
close when their places are; an unordered one (a string, a boolean) is either the same or not. The model is fitted
to the log of each config's pooled value (less a prior mean, physics.py's prediction, when there is one), with each
measurement's own precision as its noise; a config that failed or was stopped early counts at the worst value seen
(a memory failure is not given to it: feasibility.py keeps those). The length scale is the one of a few under which
the measurements are most likely. The whole-space search ranks every unmeasured config by its expected improvement
over the leader (``improvement``); the local one ranks the leader's neighbours by the optimistic value, mean plus
``SearchSettings.kappa`` standard deviations (``rank``).

Kept small on purpose: a few to a few hundred points and up to a few thousand candidates, in numpy. Optuna's
GPSampler needs torch (an optional extra), ignores pruned trials and knows nothing of the memory boundary.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.search.settings import SearchSettings

#: the least noise assumed for a measurement (relative standard deviation)
MIN_NOISE = 0.01


@dataclass(frozen=True)
class Point:
    """A config's coordinates (its place per tuned flag) and, if it was measured, the log of its value and that
    value's noise."""

    places: tuple[float, ...]
    log_value: float | None = None  # None: failed or stopped early
    noise: float = MIN_NOISE        # relative standard deviation of the value
    prior: float = 0.0              # the prior mean of the log value here (search/physics.py's prediction)


def informed(measured: Sequence[Point], settings: SearchSettings) -> bool:
    """Whether the model has enough measured values to rank anything."""
    return sum(p.log_value is not None for p in measured) >= settings.min_points


def rank(measured: Sequence[Point], candidates: Sequence[tuple[float, ...]], unordered: Sequence[bool],
         settings: SearchSettings) -> list[int]:
    """Indices of ``candidates``, most promising first; their given order when the model has too little to go on."""
    if not informed(measured, settings) or not candidates:
        return list(range(len(candidates)))
    mu, sd = posterior(measured, candidates, unordered, settings)
    score = mu + settings.kappa * sd
    return sorted(range(len(candidates)), key=lambda i: -score[i])


def improvement(measured: Sequence[Point], candidates: Sequence[tuple[float, ...]], unordered: Sequence[bool],
                best: float, settings: SearchSettings, prior: Sequence[float] | None = None) -> np.ndarray:
    """Each candidate's expected improvement of the log value over ``best`` (the leader's), under the model;
    ``prior``: the candidates' prior means (the measured points carry theirs)."""
    mu, sd = posterior(measured, candidates, unordered, settings, prior)
    sd = np.maximum(sd, 1e-9)
    z = (mu - best) / sd
    return (mu - best) * _cdf(z) + sd * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def posterior(measured: Sequence[Point], candidates: Sequence[tuple[float, ...]], unordered: Sequence[bool],
              settings: SearchSettings, prior: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The model's mean and standard deviation of the log value at each candidate. The model is fitted to the
    measured points' departures from their prior means (a point without a value counts at the worst value seen)
    under the likeliest length scale."""
    values = [p.log_value for p in measured if p.log_value is not None]
    floor = min(values)
    x = np.array([p.places for p in measured], dtype=float)
    y = np.array([(floor if p.log_value is None else p.log_value) - p.prior for p in measured])
    noise = np.array([max(p.noise, MIN_NOISE) ** 2 for p in measured])
    mask = np.array(unordered, dtype=bool)
    mean = float(y.mean())
    signal = max(float(y.var()), settings.min_signal)
    fits = [_fit(x, y - mean, noise, signal, ell, mask) for ell in settings.lengthscales]
    best = max(fits, key=lambda f: f.likelihood)
    c = np.array(candidates, dtype=float)
    k = signal * _kernel(c, x, best.lengthscale, mask)
    mu = mean + k @ best.alpha + (np.zeros(len(c)) if prior is None else np.array(prior, dtype=float))
    v = np.linalg.solve(best.chol, k.T)
    sd = np.sqrt(np.maximum(signal - (v * v).sum(axis=0), 0.0))
    return mu, sd


def _cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))


@dataclass
class _Fit:
    lengthscale: float
    chol: np.ndarray
    alpha: np.ndarray
    likelihood: float


def _fit(x: np.ndarray, y: np.ndarray, noise: np.ndarray, signal: float, ell: float, mask: np.ndarray) -> _Fit:
    k = signal * _kernel(x, x, ell, mask) + np.diag(noise)
    chol = np.linalg.cholesky(k + 1e-9 * np.eye(len(y)))
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    likelihood = -0.5 * float(y @ alpha) - float(np.log(np.diag(chol)).sum()) - 0.5 * len(y) * math.log(2 * math.pi)
    return _Fit(ell, chol, alpha, likelihood)


def _kernel(a: np.ndarray, b: np.ndarray, ell: float, mask: np.ndarray) -> np.ndarray:
    """Squared-exponential on the places; an unordered flag adds a full unit of distance when it differs."""
    d = np.abs(a[:, None, :] - b[None, :, :])
    d = np.where(mask, (d > 0).astype(float), d)
    return np.exp(-0.5 * (d ** 2).sum(axis=2) / ell ** 2)
