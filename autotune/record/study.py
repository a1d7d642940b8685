"""The study's own record: its objective and study file, the baseline's figures the relative objectives divide by,
and the configs a new study measures after its baseline (its opening)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from autotune.redact import mask


def describe(study: optuna.Study, objective: str, study_file: str, study_path: str) -> None:
    """What a new study records about itself: its objective and the study file it was created from."""
    study.set_user_attr("objective", objective)
    study.set_user_attr("study_file", mask(study_file))  # the dashboard shows it
    study.set_user_attr("study_path", study_path)


def objective(study: optuna.Study) -> str | None:
    return study.user_attrs.get("objective")


def reference(study: optuna.Study) -> dict[str, Any] | None:
    """The baseline's figures the weighted objective divides by (None until the baseline is measured)."""
    return study.user_attrs.get("reference")


def set_reference(study: optuna.Study, figures: Mapping[str, Any], number: int) -> dict[str, Any]:
    ref = {**figures, "trial": number}
    study.set_user_attr("reference", ref)
    return ref


def opening(study: optuna.Study) -> list[dict[str, Any]]:
    """The configs a new study measures after its baseline: ``{"params", "role", "origin"}`` each, in order."""
    return list(study.user_attrs.get("opening") or [])


def set_opening(study: optuna.Study, configs: list[dict[str, Any]]) -> None:
    study.set_user_attr("opening", configs)
