"""SGLang's command line: argparse errors exit 2, argument-rule errors exit 1 with a traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest

from autotune.sim.args import ArgRuleError, build_parser, resolve
from autotune.sim.profile import load_profile
from tests.support.emulator import QWEN


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune.sim", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def resolved(*args: str, profile: str = "qwen122b"):
    ns = build_parser().parse_args(list(args))
    warnings: list[str] = []
    return resolve(ns, list(args), load_profile(profile), warnings.append), warnings


def test_unknown_flag_exits_2():
    proc = run(*QWEN, "--no-such-flag", "1")
    assert proc.returncode == 2
    assert "usage: sglang serve" in proc.stderr
    assert "sglang serve: error: unrecognized arguments: --no-such-flag 1" in proc.stderr


def test_removed_cuda_graph_max_bs_is_an_ambiguous_prefix():
    proc = run(*QWEN, "--cuda-graph-max-bs", "16")
    assert proc.returncode == 2
    assert ("error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
            "--cuda-graph-max-bs-prefill") in proc.stderr


def test_missing_model_path_and_bad_value_exit_2():
    assert "the following arguments are required: --model-path/--model" in run("--port", "1").stderr
    proc = run(*QWEN, "--speculative-num-steps", "abc")
    assert proc.returncode == 2
    assert "argument --speculative-num-steps: invalid int value: 'abc'" in proc.stderr


def test_abbreviations_and_aliases_resolve_like_argparse_in_sglang():
    ns = build_parser().parse_args(["--model", "/m", "--tp", "4", "--speculative-draft-model", "/d"])
    assert (ns.model_path, ns.tp_size, ns.speculative_draft_model_path) == ("/m", 4, "/d")
    assert build_parser().parse_args(["--model-path", "/m", "--context-length", "32k"]).context_length == 32000


def test_bad_fault_spec_is_an_argparse_error():
    proc = run(*QWEN, "--sim-fault", "explode")
    assert proc.returncode == 2
    assert "argument --sim-fault: unknown fault 'explode'" in proc.stderr
    proc = run(*QWEN, "--sim-fault", "crash-after:lots")
    assert proc.returncode == 2
    assert "argument --sim-fault: fault 'crash-after' needs a number" in proc.stderr


def test_partial_speculative_triple_fails_at_resolution_with_exit_1():
    proc = run(*QWEN, "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "2")
    assert proc.returncode == 1
    assert "Traceback (most recent call last):" in proc.stderr
    assert proc.stderr.rstrip().endswith("AssertionError")
    proc = run(*QWEN, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    assert proc.returncode == 1
    assert "TypeError: '>' not supported between instances of 'NoneType' and 'int'" in proc.stderr


def test_unknown_algorithm_and_long_context_exit_1():
    proc = run(*QWEN, "--speculative-algorithm", "MEDUSA")
    assert proc.returncode == 1
    assert "ValueError: Unknown speculative algorithm name: MEDUSA" in proc.stderr
    proc = run(*QWEN, "--context-length", "1000000")
    assert proc.returncode == 1
    assert "User-specified context_length (1000000) is greater than the derived context_length" in proc.stderr


def test_speculative_defaults_auto_choice_and_topk1_rewrite():
    r, warnings = resolved(*QWEN, "--speculative-algorithm", "NEXTN")
    assert r.algorithm == "EAGLE"
    f = r.fields
    assert (f["speculative_num_steps"], f["speculative_eagle_topk"], f["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert f["max_running_requests"] == 48
    assert warnings == ["Max running requests is reset to 48 for speculative decoding. You can override this by "
                        "explicitly setting --max-running-requests."]
    r, warnings = resolved(*QWEN, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
                           "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "7",
                           "--max-running-requests", "32")
    assert r.fields["speculative_num_draft_tokens"] == 3
    assert r.fields["max_running_requests"] == 32
    assert warnings == ["speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                        "speculative_eagle_topk == 1"]
    r, _ = resolved("--model-path", "/m", "--sim-profile", "llama8b", "--speculative-algorithm", "EAGLE3",
                    profile="llama8b")
    assert (r.config.spec.steps, r.config.spec.topk, r.config.spec.draft) == (5, 4, 8)


def test_tree_rules_and_backend_rules():
    r, _ = resolved(*QWEN, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
                    "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "8")
    assert r.deferred_error == ("graph", "RuntimeError: selected index k out of range")
    r, _ = resolved(*QWEN, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
                    "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4")
    assert r.deferred_error == ("running", "RuntimeError: selected index k out of range")
    r, _ = resolved(*QWEN, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
                    "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "7")
    assert r.deferred_error is None
    with pytest.raises(ArgRuleError, match="trtllm_mha backend only supports topk = 1"):
        resolved(*QWEN, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
                 "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4",
                 "--attention-backend", "trtllm_mha")
    with pytest.raises(ArgRuleError, match="speculative_eagle_topk > 1 with page_size > 1"):
        resolved(*QWEN, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
                 "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4",
                 "--attention-backend", "flashmla", "--page-size", "64")
