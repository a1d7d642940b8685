"""The record: what autotune keeps about each trial, and about the study, in Optuna's user attrs.

Only this package reads or writes user attrs. The objective writes a trial's record as the trial goes
(``record.write``: ``started``, ``candidate``, ``launched``, ``ready``, ``verified``, ``measured``, ``failed``,
``pruned``, ``reused``); everything else reads it back through ``TrialRecord.of(frozen_trial)``, a typed view
(``record.read``, whose names this package re-exports). The study's own attrs are ``record.study``'s.

Keys (user attrs of a trial):
    baseline, starting_point,  why the config was queued (ROLES); a retry keeps them
    warm_start, neighbour,
    model, shrink, coverage,
    confirmation,
    adaptive                   (adaptive: the engine's adaptive speculative server built from the study's measurements)
    origin                     a warm start's source ("study OLD, trial N")
    retry_of                   the trial this one repeats (cut short for the infrastructure's sake)
    target, worker             where and by whom it ran
    owner                      the process that ran it: host, boot, pid, start time (autotune.record.owner)
    params                     the tuned flags as the server ran them (a dependent flag's value, not its fill)
    config, config_key         every server flag after the engine's rules, and its canonical key
    cost                       what the config costs to run (Engine.cost), to settle a tie between configs
    applied_key                the key of what /server_info reported
    command, log               the server's argv (secrets masked) and the local log file of that start
    ready_s, timings           seconds until ready; seconds per phase
    capacity                   max_running_requests and KV tokens the server reported (and its log stated)
    metrics, levels, value_ci  the measurement's flat figures, per-level summaries, the objective's 95% interval
    reason, detail, stage      why it did not give a feasible measurement, and at which stage
    reused_from                the trial whose measurement of the same effective config it copies
    schedule                   an adaptive server's schedule file, the trials it was built from and why
    prediction                 what the search's model expected of a config it queued, before the launch: value,
                               its 95% interval (low, high), physics' own value and interval (physics,
                               physics_low, physics_high; physics None when the prior was not in use)
    prediction_outcome         after the launch: error (measured / predicted - 1), inside (the interval held it),
                               physics_error and physics_inside
Study user attrs: objective, study_file, study_path, reference (the baseline's figures), opening (the configs a
new study measures after its baseline, queued one at a time).

Where the record lives: Optuna's storage (storage.py: a database or study autotune did not create is refused,
reading creates no table), each trial's artifacts (artifacts.py), optuna-dashboard over them (dashboard.py), and the
process that ran a trial (owner.py).
"""
from autotune.record import artifacts, dashboard, storage, study, write
from autotune.record.owner import Owner
from autotune.record.read import (
    ROLES,
    AnyTrial,
    TrialRecord,
    config_keys,
    figures_text,
    is_adaptive,
    is_baseline,
    is_confirmation,
    owner_of,
    rate_text,
    reason_of,
    records,
    retry_of,
    target_of,
    values_text,
)

__all__ = [
    "ROLES", "AnyTrial", "Owner", "TrialRecord", "artifacts", "config_keys", "dashboard", "figures_text",
    "is_adaptive", "is_baseline", "is_confirmation", "owner_of", "rate_text", "reason_of", "records", "retry_of",
    "storage", "study", "target_of", "values_text", "write",
]
