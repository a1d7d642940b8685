"""A resumed study is the same study (autotune/run/study_terms.py): the traffic it was created with is the traffic it
measures, whatever its file is called now; its space may widen, and a widened space is searched, an exhausted study
resumed over it included; a grid resumed over a changed space tries only the configs it has not tried."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.run import study_terms
from autotune.errors import UserError
from autotune.run.plan import requests_of
from autotune.studyfile.spec import read_study_file
from autotune.testing.studies import write_study
from tests.support.cli import kept, run_autotune, status

STEPS = '[space.speculative-num-steps]\ntype = "int"\nlow = 1\nhigh = {high}\n'


def test_the_traffic_is_the_requests_content_not_the_files_name(tmp_path: Path) -> None:
    lines = ['{"prompt": "Once upon a time", "max_tokens": 20}', '{"prompt": "In a land far away"}']
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.jsonl").write_text("\ufeff" + "\r\n".join(lines))  # the same requests, written on Windows

    def terms(dataset: str, max_tokens: int = 48) -> dict:
        spec = read_study_file(str(write_study(tmp_path, workload=f'dataset = "{dataset}"\nmax_tokens = {max_tokens}')))
        return study_terms.traffic(spec, requests_of(spec))

    then = terms("a.jsonl")
    study_terms.refuse_other_traffic("t", "sqlite:///t.db", then, terms("b.jsonl"))
    with pytest.raises(UserError, match=r"created with other traffic: max_tokens = 48, the study file now sends "
                                        r"max_tokens = 64"):
        study_terms.refuse_other_traffic("t", "sqlite:///t.db", then, terms("a.jsonl", 64))
    (tmp_path / "b.jsonl").write_text("\n".join([*lines, '{"prompt": "And then"}']))
    with pytest.raises(UserError, match=r"created with other traffic: 2 requests of a\.jsonl \(digest [0-9a-f]+\), "
                                        r"the study file now sends 3 requests of b\.jsonl"):
        study_terms.refuse_other_traffic("t", "sqlite:///t.db", then, terms("b.jsonl"))


@pytest.mark.slow
def test_an_exhausted_study_resumed_over_a_widened_space_searches_it(tmp_path: Path) -> None:
    study = write_study(tmp_path, launches=4, space=STEPS.format(high=2), args={"speculative-num-draft-tokens": None})
    first = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert first.returncode == 0 and "stopped (exhausted)" in first.stdout, first.stderr + first.stdout[-3000:]
    before = len(status(study)["trials"])

    study.write_text(study.read_text().replace("high = 2", "high = 3").replace("launches = 4", "launches = 6"))
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout[-3000:]
    assert re.search(r"the space changed \(speculative-num-steps 1\.\.2 -> 1\.\.3\): searched as it is now from "
                     rf"trial {before} on", r.stdout), r.stdout[-3000:]
    trials = kept(status(study)["trials"])
    new = [t for t in trials if t["number"] >= before and t["launched"] and t["params"]["speculative-num-steps"] == 3]
    assert new and new[0]["state"] == "COMPLETE", trials[before:]
    # found before the sampler had idled for long, not after another 50 trials that launch nothing
    assert new[0]["number"] - before < 10, [(t["number"], t["params"], t["launched"]) for t in trials[before:]]


@pytest.mark.slow
def test_a_grid_resumed_over_a_widened_space_tries_only_its_new_configs(tmp_path: Path) -> None:
    study = write_study(tmp_path, sampler="grid", launches=3, space=STEPS.format(high=2),
                        args={"speculative-num-draft-tokens": None})
    first = run_autotune("run", "--study", str(study), cwd=tmp_path)
    assert first.returncode == 0, first.stderr + first.stdout[-3000:]
    before = len(status(study)["trials"])

    study.write_text(study.read_text().replace("high = 2", "high = 4").replace("launches = 3", "launches = 6"))
    r = run_autotune("run", "--study", str(study), "--forget-host-answers", cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout[-3000:]
    # the answer about steps 2 (the baseline's was asked at preflight, before the study opened, and not kept)
    assert "--forget-host-answers: 1 kept answer of the host forgotten; each config is asked again" in r.stdout
    resumed = kept(status(study)["trials"])[before:]
    assert sorted(t["params"]["speculative-num-steps"] for t in resumed) == [3, 4], resumed
    assert all(t["launched"] and t["reused_from"] is None for t in resumed), resumed
