"""Bringing your own traffic: the formats people keep requests in, read into what is sent; on the emulator a study
over a chat dataset sends chat requests that end naturally at the data's lengths, and measures what the emulator's
truth for that dataset says."""
from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from autotune.bench.measure import Bench
from autotune.bench.traffic import parse
from autotune.bench.workload import load_prompts, load_traffic
from autotune.errors import UserError
from autotune.run.plan import Plan, make_plan
from autotune.report.summary import _categories
from autotune.studyfile.spec import read_study_file
from autotune.testing.ports import free_port
from autotune.testing.studies import one_config_space, write_study
from tests.support.cli import run_autotune, status
from tests.support.truths import level_truth

CHAT = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Rewrite: hi there"}],
         "max_tokens": 40, "temperature": 0.7, "top_p": 0.9, "category": "rewrite"},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me a "}, {"type": "text",
                                                                                         "text": "story"}]}]}]


def test_openai_chat_requests_keep_their_lengths_and_sampling() -> None:
    first, second = parse("\n".join(json.dumps(x) for x in CHAT), "c.jsonl")
    assert first.chat and first.messages == (("system", "Be brief."), ("user", "Rewrite: hi there"))
    assert (first.max_tokens, first.temperature, first.top_p, first.category) == (40, 0.7, 0.9, "rewrite")
    assert second.messages == (("user", "Tell me a story"),) and second.max_tokens is None
    assert second.output_tokens(256) == 256 and first.output_tokens(256) == 40


def test_an_openai_batch_file_is_read_from_its_bodies() -> None:
    lines = [{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 9}},
             {"custom_id": "b", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": "Yo"}], "temperature": 0}}]
    got = parse("\n".join(json.dumps(x) for x in lines), "b.jsonl")
    assert [(r.messages, r.max_tokens, r.temperature) for r in got] == [
        ((("user", "Hi"),), 9, None), ((("user", "Yo"),), None, 0.0)]


@pytest.mark.parametrize("layout", ["json", "jsonl"])
def test_sharegpt_prompts_end_at_the_last_human_turn_and_the_reply_sets_the_length(layout: str) -> None:
    convo = {"id": "x", "conversations": [
        {"from": "system", "value": "You help."}, {"from": "human", "value": "First?"},
        {"from": "gpt", "value": "An answer."}, {"from": "human", "value": "And then?"},
        {"from": "gpt", "value": "y" * 400}]}
    other = {"conversations": [{"from": "human", "value": "Only this"}, {"from": "gpt", "value": "Short."}]}
    text = json.dumps([convo, other]) if layout == "json" else f"{json.dumps(convo)}\n{json.dumps(other)}\n"
    first, second = parse(text, "s")
    assert first.messages == (("system", "You help."), ("user", "First?"), ("assistant", "An answer."),
                              ("user", "And then?"))
    assert first.max_tokens == 100  # 400 characters of reply at 4 a token
    assert second.messages == (("user", "Only this"),) and second.max_tokens == 2


def test_raw_prompts_stay_raw() -> None:
    (r,) = parse('{"prompt": "Once upon a time", "max_tokens": 12}\n', "p.jsonl")
    assert not r.chat and r.prompt == "Once upon a time" and r.max_tokens == 12


def test_a_line_ends_only_where_jsonl_says_and_a_byte_order_mark_is_no_text(tmp_path: Path) -> None:
    """U+2028 and U+0085 are valid inside a JSON string (str.splitlines cut lines there); a UTF-8 byte-order mark
    opens many files written on Windows; CRLF and CR end lines as LF does, and lines are counted as an editor counts
    them."""
    lines = ['{"prompt": "one\u2028two"}', '{"prompt": "three\u0085four", "category": "a\u2029b"}',
             '{"prompt": "five"}', "nope"]
    data = ("\ufeff" + lines[0] + "\r\n" + lines[1] + "\r" + lines[2] + "\n\n" + lines[3] + "\n").encode()
    (tmp_path / "d.jsonl").write_bytes(data)
    with pytest.raises(UserError, match=r"d\.jsonl: line 5: not valid JSON"):
        load_traffic("d.jsonl", tmp_path)
    (tmp_path / "d.jsonl").write_bytes(data.replace(b"nope", b""))
    got = load_traffic("d.jsonl", tmp_path)
    assert [(r.prompt, r.line) for r in got] == [("one\u2028two", 1), ("three\u0085four", 2), ("five", 3)]
    (tmp_path / "p.jsonl").write_bytes("\ufeff".encode() + data.replace(b"nope", b"").lstrip(b"\xef\xbb\xbf"))
    assert load_prompts("p.jsonl", tmp_path) == ["one\u2028two", "three\u0085four", "five"]
    (array,) = parse("\ufeff" + json.dumps([{"conversations": [{"from": "human", "value": "a\u2028b"},
                                                              {"from": "gpt", "value": "ok"}]}]), "s.json")
    assert array.messages == (("user", "a\u2028b"),)


def _dataset(rng: random.Random, n: int) -> list[dict]:
    asks = ["Rewrite this paragraph more formally:", "Tell me about a city you like and why:",
            "Write a python function for this:", "Extract all names as JSON from this text:"]
    words = ["alpha", "river", "stone", "market", "quiet", "lantern", "orbit", "meadow"]
    return [{"messages": [{"role": "user", "content": f"{asks[i % 4]} {i} " +
                           " ".join(rng.choice(words) for _ in range(rng.randint(20, 80)))}],
             "max_tokens": rng.randint(30, 120)} for i in range(n)]


def _plan(directory: Path, workload: str, port: int) -> Plan:
    study = write_study(directory, "s", workload=workload, port=port, space=one_config_space(3, 1, 4),
                        args={"sim-speedup": 1})
    plan = make_plan(read_study_file(str(study)))
    return dataclasses.replace(plan, baseline=plan.space.candidate(next(iter(plan.space.configs()))))


def _wait_ready(server: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the emulator did not start (exit status {server.poll()})")


@pytest.mark.slow
def test_a_chat_dataset_is_sent_as_chat_requests_that_end_naturally_and_measures_its_truth(tmp_path: Path) -> None:
    data = _dataset(random.Random(1), 60)
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(x) + "\n" for x in data))
    port = free_port()
    plan = _plan(tmp_path, 'dataset = "chat.jsonl"\nconcurrency = [1, 8]\nrequests = 60\nwindow_generations = 30\n'
                           'warmup = 1\ntolerance = 0.5\nmax_repeats = 1', port)
    truth = level_truth(plan)
    argv = plan.engine.render(["autotune-sim"], plan.baseline.args)
    with (tmp_path / "out.log").open("w") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_ready(server, port)
        m = Bench(f"http://127.0.0.1:{port}", plan.engine, plan.spec.workload, plan.prompts, seed=0).run()
    finally:
        server.kill()
        server.wait()
    posts = Counter(line.split('"')[1].split()[1] for line in (tmp_path / "out.log").read_text().splitlines()
                    if '"POST ' in line)
    assert set(posts) <= {"/v1/chat/completions", "/flush_cache", "/freeze_gc"} and posts["/v1/chat/completions"]
    records = [r for rep in m.repeats for lv in rep for r in lv.records if not r.ramp]
    sizes = {d["max_tokens"] for d in data}
    assert {r.max_tokens for r in records} <= sizes, "each request asks for its own length from the data"
    ends = Counter(r.finish_reason for r in records if r.complete)
    assert ends["stop"] > 0.2 * sum(ends.values()), f"requests end naturally (no ignore_eos): {ends}"
    assert all(r.tokens <= r.max_tokens for r in records)
    for s in m.summaries():
        c = s["concurrency"]
        assert s["output_tok_s"] == pytest.approx(truth[c], rel=0.03), (c, s["output_tok_s"], truth[c])


def test_autotune_workload_says_what_will_be_sent_before_any_launch(tmp_path: Path) -> None:
    data = [{"messages": [{"role": "user", "content": "x" * (40 * (i + 1))}], "max_tokens": 10 * (i + 1),
             "category": "code" if i % 2 else "chat", **({"temperature": 0.7} if i < 3 else {})} for i in range(10)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in data))
    study = write_study(tmp_path, "w", workload='dataset = "d.jsonl"\nconcurrency = [1, 4, 16]\nrequests = 8\n'
                                                'window_generations = 3\ntemperature = 0.2')
    r = run_autotune("workload", "--study", str(study), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "10 requests, sent through the chat endpoint" in out and "ends: natural (no ignore_eos)" in out
    assert "input tokens (about 4 characters a token): p10 19  p50 55  p90 91" in out
    assert "output tokens (10 of 10 from the data): p10 19  p50 55  p90 91  p99 99  min 10  max 100" in out
    assert "temperature: 0.2 x7, 0.7 x3" in out
    assert "categories: chat 5, code 5" in out
    assert "single stream 8, c=4 12, c=16 48 requests" in out
    assert sorted(tmp_path.iterdir()) == [tmp_path / "d.jsonl", study], "nothing launched or written"
    view = json.loads(run_autotune("workload", "--study", str(study), "--json", cwd=tmp_path).stdout)
    assert view["output_lengths"] == [10 * (i + 1) for i in range(10)]


def test_the_builtin_traffic_is_chat_requests_by_category_with_lengths_typical_of_each() -> None:
    requests = load_traffic("builtin", Path("."))
    assert len(requests) >= 150 and all(r.chat and r.max_tokens for r in requests)
    by = {c: [r.max_tokens or 0 for r in requests if r.category == c] for c in {r.category for r in requests}}
    assert set(by) == {"chat", "code", "rewrite", "math", "extraction"} and min(len(v) for v in by.values()) >= 25
    median = {c: sorted(v)[len(v) // 2] for c, v in by.items()}
    assert median["extraction"] < median["chat"] and median["rewrite"] < median["chat"], median
    assert median["math"] > median["extraction"], median


@pytest.mark.slow
def test_the_report_shows_acceptance_and_speed_by_category(tmp_path: Path) -> None:
    """The built-in chat traffic, sent through the chat endpoint as a study sends it: every request's acceptance is
    read from the speculative figures SGLang sends after its finishing event (asked for with
    return_spec_tokens_details), and on the emulator copy-heavy rewrites are accepted far above free chat; the report
    says so per category, with the lengths plot beside it."""
    study = write_study(tmp_path, "cat", launches=1, space=one_config_space(7, 1, 8),
                        args={"speculative-num-steps": 7, "speculative-num-draft-tokens": 8},
                        workload='dataset = "builtin"\nconcurrency = [1, 4]\nrequests = 60\nmax_tokens = 120\n'
                                 'window_generations = 12\nwarmup = 1\ntolerance = 0.5\nmax_repeats = 1')
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    trial = status(study)["trials"][0]
    assert trial["metrics"]["accept_length"] > 1.0, trial["metrics"]
    out = tmp_path / "report"
    assert run_autotune("report", "--study", str(study), "--out", str(out), cwd=tmp_path).returncode == 0
    summary = (out / "summary.md").read_text()
    assert "## By category" in summary and (out / "lengths.html").exists()
    rows = [line.split("|") for line in summary.splitlines() if line.startswith("| trial ") and "| c1 |" in line]
    accept = {cells[3].strip(): float(cells[6]) for cells in rows}
    assert set(accept) == {"chat", "code", "rewrite", "math", "extraction"}, summary
    # chat-templated, every category is drafted 12% better than raw and the chain's 8 tokens a verify step cap the
    # best: this chain accepts about 6.5 tokens a step on chat requests, 7.3-7.6 on rewrites and extractions
    assert accept["rewrite"] > 1.05 * accept["chat"] and accept["extraction"] > 1.05 * accept["chat"], accept


@pytest.mark.slow
def test_every_trial_measures_its_single_stream_on_the_same_requests(tmp_path: Path) -> None:
    """Requests of different lengths decode at different speeds: two configs are compared on the same requests, in
    the same order (common random numbers), not each on its own draw from the dataset."""
    data = _dataset(random.Random(3), 40)
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(x) + "\n" for x in data))
    study = write_study(tmp_path, "crn", launches=3, args={"sim-speedup": 8},
                        workload='dataset = "chat.jsonl"\nconcurrency = [1, 4]\nrequests = 8\n'
                                 'window_generations = 2\nwarmup = 1\ntolerance = 0.5\nmax_repeats = 1')
    r = run_autotune("run", "--study", str(study), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    single = {}
    for path in sorted((tmp_path / "crn-logs").glob("trial-*.records.json")):
        records = json.loads(path.read_text())
        single[path.name] = [x["max_tokens"] for x in records if x["concurrency"] == 1 and x["repeat"] == 0]
    configs = {json.dumps(t["params"], sort_keys=True) for t in status(study)["trials"] if t["launched"]}
    assert len(single) >= 2 and len(configs) >= 2, (single, configs)
    first = next(iter(single.values()))
    assert len(first) == 8 and len(set(first)) > 1, first
    assert all(lengths == first for lengths in single.values()), single


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["sharegpt", "batch"])
def test_a_sharegpt_file_and_a_batch_file_validate_and_run(tmp_path: Path, layout: str) -> None:
    rng = random.Random(2)
    items = _dataset(rng, 24)
    if layout == "sharegpt":
        text = json.dumps([{"id": str(i), "conversations": [{"from": "human", "value": x["messages"][0]["content"]},
                                                            {"from": "gpt", "value": "w " * x["max_tokens"] * 2}]}
                           for i, x in enumerate(items)])
        name = "share.json"
    else:
        text = "".join(json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/chat/completions",
                                   "body": {"model": "m", **x}}) + "\n" for i, x in enumerate(items))
        name = "batch.jsonl"
    (tmp_path / name).write_text(text)
    port = free_port()
    plan = _plan(tmp_path, f'dataset = "{name}"\nconcurrency = [1, 4]\nrequests = 6\nwindow_generations = 3\n'
                           'warmup = 1\ntolerance = 0.5\nmax_repeats = 1', port)
    r = run_autotune("validate", "--study", str(tmp_path / "s.toml"), cwd=tmp_path)
    assert r.returncode == 0 and "24 requests" in r.stdout, r.stderr
    argv = plan.engine.render(["autotune-sim"], plan.baseline.args)
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_ready(server, port)
        m = Bench(f"http://127.0.0.1:{port}", plan.engine, plan.spec.workload, plan.prompts, seed=0).run()
    finally:
        server.kill()
        server.wait()
    records = [r for rep in m.repeats for lv in rep for r in lv.records]
    assert records and not [r for r in records if not r.ok]
    assert {r.max_tokens for r in records if not r.ramp} <= {x.max_tokens for x in plan.prompts}
    assert all(s["output_tok_s"] > 0 for s in m.summaries())


def test_the_report_says_what_ignore_eos_does_to_a_datasets_acceptance(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"prompt": "Once upon a time", "max_tokens": 40}\n')
    forced = read_study_file(str(write_study(tmp_path, "f", workload='dataset = "d.jsonl"\nignore_eos = true')))
    natural = read_study_file(str(write_study(tmp_path, "n", workload='dataset = "d.jsonl"')))
    assert forced.workload.forced_length and not natural.workload.forced_length
    text = "\n".join(_categories(forced, None, None))
    assert "ran to its length (ignore_eos)" in text and "not the traffic's own" in text
    assert _categories(natural, None, None) == []
