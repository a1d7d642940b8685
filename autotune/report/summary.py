"""summary.md: the best config with its full command line and its gain over the baseline (with 95% intervals), the
baseline, the top configs, the failures by reason and the launches saved; one function per section."""
from __future__ import annotations

import math
import shlex
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.results.best import capacity_curves, capacity_label, per_concurrency, slo_text
from autotune.results import adaptive_versus_fixed, tally
from autotune import record
from autotune.record import TrialRecord, rate_text
from autotune.report.plots import PlotResult
from autotune.studyfile.spec import StudySpec
from autotune.visible import cell

TOP = 5


@dataclass
class Gain:
    """``ratio`` of a trial's figure to the baseline's, with the 95% interval of the ratio when both are known."""

    name: str
    ratio: float
    low: float | None = None
    high: float | None = None

    def text(self) -> str:
        pct = f"{(self.ratio - 1) * 100:+.1f}%"
        if self.low is None or self.high is None:
            return f"{pct} (interval unknown)"
        return f"{pct} (95% CI {(self.low - 1) * 100:+.1f}% to {(self.high - 1) * 100:+.1f}%)"


def gain(name: str, value: float | None, ref: float | None, rel: float | None, rel_ref: float | None) -> Gain | None:
    """value / ref; independent relative errors combine as for a quotient: sqrt(a^2 + b^2)."""
    if value is None or not ref:
        return None
    ratio = value / ref
    if rel is None or rel_ref is None:
        return Gain(name, ratio)
    r = math.sqrt(rel * rel + rel_ref * rel_ref)
    return Gain(name, ratio, ratio * (1 - r), ratio * (1 + r))


def _rel_half_width(value: float | None, ci: list[float] | None) -> float | None:
    if value is None or not ci or ci[0] is None or ci[1] is None or value == 0:
        return None
    return abs(ci[1] - ci[0]) / 2 / abs(value)


def gains(best: TrialRecord, base: TrialRecord) -> list[Gain]:
    """The best trial against the baseline: the objective (from each trial's value_ci) and both throughputs (from
    the per-level confidence intervals)."""
    out: list[Gain] = []
    if best.values and len(best.values) == 1 and base.state == TrialState.COMPLETE and base.values:
        v, v0 = best.values[0], base.values[0]
        g = gain("objective", v, v0, _rel_half_width(v, best.value_ci), _rel_half_width(v0, base.value_ci))
        if g:
            out.append(g)
    m, m0 = best.metrics, base.metrics
    top, top0 = m.get("concurrency"), m0.get("concurrency")
    for key, c, c0 in (("single_tok_s", 1, 1), ("concurrent_tok_s", top, top0)):
        g = gain(key, m.get(key), m0.get(key), best.level(c).get("output_tok_s_rel_ci"),
                 base.level(c0).get("output_tok_s_rel_ci"))
        if g:
            out.append(g)
    return out


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _params(rec: TrialRecord) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in rec.params.items()) or "(fixed args)"


def _value_text(rec: TrialRecord) -> str:
    text = rec.values_text()
    if text != "-" and rec.value_ci and rec.values and len(rec.values) == 1:
        text += f" [{_fmt(rec.value_ci[0])}, {_fmt(rec.value_ci[1])}]"
    return text


def launches_saved(recs: list[TrialRecord]) -> dict[str, Any]:
    """Trials that cost no deployment: a reused measurement of the same effective config, an invalid config
    rejected by the engine's rules (or by the engine on the target, asked before the launch), a config given up on
    (its retry failed for the infrastructure too), or one at least as large as a config that ran out of memory; and
    roughly the time that saved (the median deployed trial's duration)."""
    reused = [r for r in recs if r.reused_from is not None]
    invalid = [r for r in recs if r.reason in ("invalid_config", "host_rejected")]
    given_up = [r for r in recs if r.reason == "given_up" and r.reused_from is None]
    too_large = [r for r in recs if r.reason == "oom_predicted" and r.reused_from is None]
    deployed = [r.duration_s for r in recs if r.duration_s and r.launched and r.state in tally.FINISHED]
    median = statistics.median(deployed) if deployed else None
    saved = len(reused) + len(invalid) + len(given_up) + len(too_large)
    return {"reused": len(reused), "invalid": len(invalid), "given_up": len(given_up), "too_large": len(too_large),
            "saved": saved,
            "seconds": saved * median if median is not None else None}


def _heading(study: optuna.Study, spec: StudySpec | None, recs: list[TrialRecord]) -> list[str]:
    name = spec.name if spec else study.study_name
    objective = record.study.objective(study) or (spec.objective if spec else "?")
    states = Counter(r.state.name for r in recs)
    launches = tally.launches(study.get_trials(deepcopy=False))
    return [f"# Study `{name}`", "",
            f"Objective `{objective}` ({', '.join(study.metric_names or ['value'])}), "
            f"{len(recs)} trials ({', '.join(f'{n} {s}' for s, n in sorted(states.items()))}), "
            f"{len(launches)} launches (servers started) counted against the budget"
            + (f" of {spec.launches}" if spec else "") + f". Written {time.strftime('%Y-%m-%d %H:%M:%S')}.", ""]


def _best(name: str, best: TrialRecord | None, base: TrialRecord | None, leader: tally.Estimate | None,
          study: optuna.Study | None = None) -> list[str]:
    lines = ["## Best", ""]
    if best is None:
        return [*lines, "No feasible measured trial yet.", ""]
    m = best.metrics
    pooled = "" if leader is None or leader.launches < 2 else (
        f"; over its {leader.launches} launches (trials {', '.join(map(str, leader.trials))}) "
        f"{_fmt(leader.value)} [{_fmt(leader.low)}, {_fmt(leader.high)}]")
    lines += [f"Trial **{best.number}**: value {_value_text(best)}{pooled}"
              + (" (the baseline itself)" if best.baseline else "") + ".", "",
              f"- params: {_params(best)}",
              f"- {best.figures_text()}, accept length {_fmt(m.get('accept_length'), 3)}, "
              f"TTFT p99 {_fmt(m.get('ttft_p99_ms'))} ms"]
    if base is not None and base.number != best.number and base.state == TrialState.COMPLETE:
        lines += [f"- {g.name} vs the baseline (trial {base.number}): {g.text()}" for g in gains(best, base)]
    chosen = tally.pick(study) if study is not None else None
    if chosen is not None and chosen.tied:
        lines.append(f"- the pick: {chosen.tie_text()}")
    predicted = tally.predictions(list(study.get_trials(deepcopy=False))) if study is not None else None
    if predicted is not None:
        lines.append(f"- how far to trust the pick: {predicted.text()}")
    lines.append("")
    if best.command:
        lines += ["Server command line:", "", "```sh", shlex.join(best.command), "```", ""]
    return [*lines, f"`autotune best --study {name} --format unit` prints it as a systemd service; "
                    f"`autotune apply --study {name}` deploys it.", ""]


def _baseline(base: TrialRecord | None) -> list[str]:
    if base is None:
        return ["## Baseline", "", "The baseline has not finished yet.", ""]
    why = f", {base.reason}" if base.reason else ""
    return ["## Baseline", "", f"Trial {base.number} ({base.state.name}{why}): {_params(base)}; value "
                               f"{_value_text(base)}; {base.figures_text() or 'not measured'}.", ""]


def _top(study: optuna.Study, recs: list[TrialRecord]) -> list[str]:
    lines = [f"## Top {TOP}", ""]
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    ranked = sorted((r for r in recs if r.feasible and r.reused_from is None),
                    key=lambda r: (-tally.score(by_number[r.number], study), r.number))[:TOP]
    if not ranked:
        return [*lines, "No feasible measured trial yet.", ""]
    again = Counter(r.reused_from for r in recs if r.reused_from is not None)
    lines += ["| rank | trial | value [95% CI] | params | single tok/s | concurrent tok/s | max running | "
              "proposed again |", "|---:|---:|---|---|---:|---:|---:|---:|"]
    for i, r in enumerate(ranked, 1):
        m, tag = r.metrics, f" ({r.role})" if r.role else ""
        lines.append(f"| {i} | {r.number}{tag} | {_value_text(r)} | {_params(r)} | {rate_text(m.get('single_tok_s'))} "
                     f"| {rate_text(m.get('concurrent_tok_s'))} | {_fmt(m.get('max_running_requests'))} | "
                     f"{again.get(r.number, 0)} |")
    return [*lines, "", "Trials that reused an identical effective config are listed once, under the trial that "
                        "measured it (\"proposed again\").", ""]


def _failures(study: optuna.Study, recs: list[TrialRecord]) -> list[str]:
    lines = ["## Failures by reason", ""]
    failed: dict[str, list[TrialRecord]] = {}
    for r in recs:
        if r.reason is not None and r.state != TrialState.RUNNING:
            failed.setdefault(r.reason, []).append(r)
    if not failed:
        return [*lines, "None.", ""]
    lines += ["| reason | trials | states | numbers |", "|---|---:|---|---|"]
    for reason, rs in sorted(failed.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        states = ", ".join(f"{n} {s}" for s, n in sorted(Counter(r.state.name for r in rs).items()))
        lines.append(f"| {reason} | {len(rs)} | {states} | {', '.join(str(r.number) for r in rs)} |")
    lines.append("")
    retried = tally.retried(study.get_trials(deepcopy=False))
    if retried:
        lines += [f"Infrastructure failures queue their config again once; {len(retried)} trial(s) were retried "
                  "and do not count against the budget.", ""]
    return lines


def _saved(recs: list[TrialRecord]) -> list[str]:
    saved = launches_saved(recs)
    secs = f", about {saved['seconds'] / 60:.1f} min of deployments" if saved["seconds"] else ""
    return ["## Launches saved", "",
            f"{saved['saved']} of {len(recs)} trials deployed nothing{secs}: {saved['reused']} reused the "
            f"measurement of an identical effective config, {saved['invalid']} were invalid configs rejected by "
            "the engine's rules before deployment"
            + (f", {saved['given_up']} proposed a config given up on (it failed for the infrastructure after its "
               "retry)" if saved["given_up"] else "")
            + (f", {saved['too_large']} were at least as large as a config that ran out of memory"
               if saved["too_large"] else "") + ".", ""]


def _plots(plots: list[PlotResult]) -> list[str]:
    lines = ["## Plots", ""]
    lines += [f"- [{p.title}]({p.path.name})" if p.path else f"- {p.title}: not drawn ({p.note})" for p in plots]
    return [*lines, ""]


def _per_concurrency(study: optuna.Study) -> list[str]:
    lines = ["## Best config per load", "",
             "The best feasible config at each measured concurrency level (output tok/s pooled over its launches; "
             "\"measured once\" has not been confirmed by a second launch):", ""]
    lines += ["| load | trial | output tok/s [95% CI] | vs baseline | confirmed | config |",
              "|---|---:|---|---:|---|---|"]
    for r in per_concurrency(study):
        config = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "the fixed args"
        gain = f"{r['gain'] - 1:+.1%}" if r["gain"] else "-"
        sure = f"yes ({r['launches']} launches)" if r["confirmed"] else "measured once"
        lines.append(f"| c{r['concurrency']} | {r['trial']} | {r['output_tok_s']:.1f} [{r['low']:.1f}, "
                     f"{r['high']:.1f}] | {gain} | {sure} | {config} |")
    return [*lines, ""]


def _categories(spec: StudySpec | None, best: TrialRecord | None, base: TrialRecord | None) -> list[str]:
    """The best config's and the baseline's figures by the data's category, at each level: acceptance from each
    request's own counts, and the requests' decode speed."""
    shown = [(f"trial {r.number}", r) for r in (best, base) if r is not None]
    rows = [(label, lv) for label, r in shown for lv in r.levels if lv.get("categories")]
    forced = spec is not None and spec.workload.forced_length and spec.workload.dataset is not None
    note = ["Every request ran to its length (ignore_eos): the text past an answer's natural end is drafted "
            "differently from the answer, so the acceptance measured is not the traffic's own, and every request "
            "was as long as it could be.", ""] if forced else []
    if not rows:
        return ["## Traffic", "", *note] if note else []
    lines = ["## By category", "",
             "Each category of the traffic as it was measured (accept length: tokens over verify steps of its "
             "requests; n/a where the engine reports none for the endpoint, as SGLang's chat endpoint):", "",
             "| trial | load | category | requests | mean output tokens | accept length | decode tok/s per request |",
             "|---|---|---|---:|---:|---:|---:|"]
    for label, lv in rows:
        for name, f in lv["categories"].items():
            accept = f"{f['accept_length']:.2f}" if f.get("accept_length") else "n/a"
            decode = f"{f['decode_tok_s']:.1f}" if f.get("decode_tok_s") else "n/a"
            lines.append(f"| {label} | c{lv['concurrency']} | {cell(name)} | {f['measured']} | "
                         f"{f['tokens_mean']:.0f} | {accept} | {decode} |")
    return [*lines, "", *note]


def _capacity(study: optuna.Study) -> list[str]:
    curves = capacity_curves(study)
    if not curves:
        return []
    bounds = slo_text(curves[0]["slo"])
    lines = ["## Capacity within the SLO", "",
             f"Each launch's capacity curve, most capacity first: the loads it probed within one server start, their "
             f"throughput and p99s, and whether they met the SLO ({bounds}). The capacity is the highest load that "
             "met it below the lowest that broke it (\"+\": no load of the ladder broke it).", ""]
    for c in curves:
        config = ", ".join(f"{k}={v}" for k, v in c["params"].items()) or "the fixed args"
        load = capacity_label(c)
        lines += [f"**Trial {c['trial']}** ({config}): capacity {load}, {c['output_tok_s']:.1f} tok/s", "",
                  "| load | output tok/s | TTFT p99 ms | ITL p99 ms | SLO |", "|---|---:|---:|---:|---|"]
        for p in c["curve"]:
            ttft = "-" if p["ttft_ms_p99"] is None else f"{p['ttft_ms_p99']:.1f}"
            itl = "-" if p["itl_ms_p99"] is None else f"{p['itl_ms_p99']:.1f}"
            lines.append(f"| c{p['concurrency']} | {p['output_tok_s'] or 0.0:.1f} | {ttft} | {itl} | "
                         f"{'met' if p['meets_slo'] else 'broken'} |")
        lines.append("")
    return lines


def _adaptive(study: optuna.Study) -> list[str]:
    c = adaptive_versus_fixed.compare(study)
    if c is None:
        return []
    lines = ["## Adaptive server against the best fixed config", "", adaptive_versus_fixed.headline(c) + ".", "",
             "Output tok/s at each load, the adaptive server's against the best fixed config's and against the fixed "
             "config fastest at that load (\"beat\" or \"lost\" only when the 95% intervals do not overlap):", "",
             "| load | adaptive [95% CI] | best fixed config [95% CI] | vs it | fastest fixed here [95% CI] (trial) "
             "| vs that |", "|---|---|---|---:|---|---:|"]
    for lv in c.levels:
        gain, word = lv.against(lv.fixed)
        here, word_here = lv.against(lv.best_here)
        fixed = "-" if lv.fixed is None else f"{lv.fixed.value:.1f} [{lv.fixed.low:.1f}, {lv.fixed.high:.1f}]"
        lines.append(f"| c{lv.concurrency} | {lv.adaptive.value:.1f} [{lv.adaptive.low:.1f}, {lv.adaptive.high:.1f}] "
                     f"| {fixed} | {adaptive_versus_fixed.said(gain, word)} | {lv.best_here.value:.1f} "
                     f"[{lv.best_here.low:.1f}, {lv.best_here.high:.1f}] ({lv.best_here_trial}) "
                     f"| {adaptive_versus_fixed.said(here, word_here)} |")
    return [*lines, ""]


def summary_markdown(study: optuna.Study, spec: StudySpec | None, plots: list[PlotResult] | None = None) -> str:
    trials = study.get_trials(deepcopy=False)
    recs = record.records(trials)
    best_t, base_t = tally.best(study), tally.baseline(trials)
    best = TrialRecord.of(best_t) if best_t is not None else None
    base = TrialRecord.of(base_t) if base_t is not None else None
    lines = _heading(study, spec, recs)
    lines += _best(spec.name if spec else study.study_name, best, base, tally.leader(study), study)
    lines += _baseline(base)
    lines += _per_concurrency(study)
    lines += _categories(spec, best, base)
    lines += _capacity(study)
    lines += _adaptive(study)
    lines += _top(study, recs)
    lines += _failures(study, recs)
    lines += _saved(recs)
    if plots is not None:
        lines += _plots(plots)
    return "\n".join(lines)
