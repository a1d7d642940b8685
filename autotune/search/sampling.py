"""Samplers and the configs they start from, built from the study file."""
from __future__ import annotations

import importlib

import optuna

from autotune.engines import ArgValue
from autotune.errors import UserError
from autotune.studyfile.space import Space
from autotune.studyfile.spec import StudySpec

#: configs measured before the model-based samplers and the tuner's own model take over (when the study does not
#: say): the baseline and the first two of the engine's starting points (SearchSettings.starting_points)
DEFAULT_STARTUP_TRIALS = 3
#: samplers that start with a few configs before their model takes over: the ones an initial design feeds
MODEL_BASED = ("tpe", "gp")


def startup_launches(spec: StudySpec) -> int:
    """Launches before the model-based samplers and the local search take over."""
    return DEFAULT_STARTUP_TRIALS if spec.startup_trials is None else spec.startup_trials


def make_sampler(spec: StudySpec, space: Space, finished: int) -> optuna.samplers.BaseSampler:
    """The study's sampler. A fixed seed is offset by the trials already run, so a resumed study does not replay the
    configs it started with (a sampler seeded alike draws the same first configs again)."""
    seed = None if spec.seed is None else spec.seed + finished
    startup = startup_launches(spec)
    if spec.sampler == "tpe":
        return optuna.samplers.TPESampler(n_startup_trials=startup, seed=seed, multivariate=True)
    if spec.sampler == "gp":
        check_sampler(spec)
        return optuna.samplers.GPSampler(n_startup_trials=startup, seed=seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return Grid(space.grid(), seed=seed)


class Grid(optuna.samplers.GridSampler):
    """Optuna's grid, which also counts as visited a point an earlier trial tried under another grid: Optuna counts
    only trials of the same grid (and gives its first trials the point of their own number, tried or not), so a study
    resumed over a changed space would try again every config it has (each a trial that launches nothing) before
    the new ones."""

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if "grid_id" in trial.system_attrs or "fixed_params" in trial.system_attrs:
            return
        unvisited = self._get_unvisited_grid_ids(study)
        if not unvisited or (0 <= trial.number < self._n_min_trials and trial.number in unvisited):
            super().before_trial(study, trial)  # Optuna's own choice
            return
        study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._search_space)
        study._storage.set_trial_system_attr(trial._trial_id, "grid_id", int(self._rng.rng.choice(unvisited)))

    def _get_unvisited_grid_ids(self, study: optuna.Study) -> list[int]:
        unvisited = super()._get_unvisited_grid_ids(study)
        tried = {tuple(t.params.get(n) for n in self._param_names)
                 for t in study.get_trials(deepcopy=False) if t.state.is_finished()
                 and set(self._param_names) <= t.params.keys()}
        return [g for g in unvisited if tuple(self._all_grids[g]) not in tried]


def initial_design(spec: StudySpec, space: Space) -> list[dict[str, ArgValue]]:
    """The configs a new study measures right after the baseline, in order: the engine's starting points for a
    model-based sampler (``[study] initial_design = "engine"``), none otherwise. Random search and the grid stay
    what they say they are."""
    if spec.sampler not in MODEL_BASED or spec.initial_design != "engine":
        return []
    return space.starting_points()


def check_sampler(spec: StudySpec) -> None:
    """Raise ``UserError`` if the study's sampler cannot run here: GPSampler needs torch and scipy, which are an
    optional extra (checked before anything is created, so a study is never half made)."""
    if spec.sampler != "gp":
        return
    missing = [name for name in ("torch", "scipy") if not _importable(name)]
    if missing:
        raise UserError(f"{spec.path}: [study] sampler = \"gp\" needs torch and scipy ({' and '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} missing): pip install 'autotune[gp]'")


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True
