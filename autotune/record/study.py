"""The study's own record: its objective and study file, the traffic and space it was created with (study_terms.py),
the baseline's figures the relative objectives divide by, the configs a new study measures after its baseline (its
opening), and the answers of the engine on the target (hostresolve.py)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import hashlib

import optuna

from autotune.redact import mask, mask_mapping


#: the study attr that says autotune created the study
CREATOR = "created_by"


def describe(study: optuna.Study, objective: str, study_file: str, study_path: str) -> None:
    """What a new study records about itself: that autotune made it, its objective and the study file it was created
    from."""
    study.set_user_attr(CREATOR, "autotune")
    study.set_user_attr("objective", objective)
    study.set_user_attr("study_file", mask(study_file))  # the dashboard shows it
    study.set_user_attr("study_path", study_path)


def is_autotunes(study: optuna.Study) -> bool:
    """Whether autotune created the study (an older autotune recorded only its objective and study file)."""
    attrs = study.user_attrs
    return attrs.get(CREATOR) == "autotune" or {"objective", "study_file", "study_path"} <= attrs.keys()


def is_blank(study: optuna.Study) -> bool:
    """A study with no trial and no attribute (as a study is between its creation and autotune's record of it).

    The trials are read before the attributes, and a caller asks this before ``is_autotunes``: autotune records
    itself before its first trial, so whoever sees another worker's first trial then sees its record (read the other
    way round, the record could land between the two reads and the trial before the second)."""
    return not study.get_trials(deepcopy=False) and not study.user_attrs


def objective(study: optuna.Study) -> str | None:
    return study.user_attrs.get("objective")


def traffic(study: optuna.Study) -> dict[str, Any] | None:
    """The traffic the study measures (study_terms.traffic; None: an older autotune recorded none)."""
    return study.user_attrs.get("traffic")


def set_traffic(study: optuna.Study, terms: Mapping[str, Any]) -> None:
    study.set_user_attr("traffic", dict(terms))


def space(study: optuna.Study) -> tuple[dict[str, Any] | None, int]:
    """The space the study searches (study_terms.space; None: an older autotune recorded none) and the first trial
    number searched under it."""
    attrs = study.user_attrs
    return attrs.get("space"), int(attrs.get("space_since") or 0)


def set_space(study: optuna.Study, terms: Mapping[str, Any], since: int) -> None:
    """The space searched from trial ``since`` on."""
    study.set_user_attr("space", dict(terms))
    study.set_user_attr("space_since", since)


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


#: the study attr that counts the times its hosts' answers were forgotten (`run --forget-host-answers`): an answer
#: kept before the last time is forgotten
FORGOTTEN = "host_answers_forgotten"
_HOST_ANSWER = "host_answer:"


def _host_attr(key: str) -> str:
    return _HOST_ANSWER + hashlib.sha256(key.encode()).hexdigest()[:20]


def host_answer(study: optuna.Study, key: str) -> dict[str, Any] | None:
    """What the engine on the target answered when asked about the config of ``key`` before its launch
    (``set_host_answer``); None when it was never asked, or the answer was forgotten since."""
    attrs = study.user_attrs
    answer = attrs.get(_host_attr(key))
    if not isinstance(answer, dict) or answer.get("config_key") != key:
        return None
    return answer if answer.get("forgotten", 0) == attrs.get(FORGOTTEN, 0) else None


def set_host_answer(study: optuna.Study, key: str, answer: Mapping[str, Any]) -> None:
    """Keep the engine's answer for the config of ``key`` (``{"answer": "resolved", "changes": {flag: value}}``
    or ``{"answer": "rejected", "message": ...}``, with the ``"host"`` that gave it), so that no worker, and no
    resumed run, asks again."""
    study.set_user_attr(_host_attr(key), {**mask_mapping(answer), "config_key": key,
                                          "forgotten": study.user_attrs.get(FORGOTTEN, 0)})


def forget_host_answers(study: optuna.Study) -> int:
    """Forget every answer kept so far (each config is asked again); how many there were."""
    attrs = study.user_attrs
    rounds = attrs.get(FORGOTTEN, 0)
    kept = sum(1 for name, answer in attrs.items() if name.startswith(_HOST_ANSWER) and isinstance(answer, dict)
               and answer.get("forgotten", 0) == rounds)
    study.set_user_attr(FORGOTTEN, rounds + 1)
    return kept
