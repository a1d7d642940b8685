"""Adaptive speculative decoding's arithmetic, called directly: argument resolution, the fallback reasons, routing
by batch size, the controller's moves and the memory a schedule takes."""
from __future__ import annotations

import json

import pytest

from autotune.sim import adaptive_controller, model
from autotune.sim.adaptive_controller import Controller, Schedule, Slot, SlotConfig
from autotune.sim.args import ArgRuleError, build_parser, resolve
from autotune.sim.profile import load_profile

from tests.support.emulator import LLAMA, QWEN

EAGLE = ["--speculative-algorithm", "EAGLE"]


def resolved(*args: str, profile: str = "qwen122b"):
    ns = build_parser().parse_args(list(args))
    warnings: list[str] = []
    return resolve(ns, list(args), load_profile(profile), warnings.append), warnings


def schedule_file(tmp_path, content) -> str:
    path = tmp_path / "schedule.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


# ------------------------------------------------------------------------------------------ argument resolution


def test_default_schedule_starts_at_the_middle_of_the_union_with_draft_steps_plus_one():
    r, warnings = resolved(*QWEN, *EAGLE, "--speculative-adaptive")
    f = r.fields
    assert (f["speculative_num_steps"], f["speculative_eagle_topk"], f["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert f["speculative_adaptive"] is True
    assert r.config.adaptive.candidate_steps == [0, 1, 3, 5, 7]
    assert [(s.key, s.candidate_steps) for s in r.config.adaptive.slots] == [
        (1, (1, 3, 5, 7)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,))]
    assert [s.down_hysteresis for s in r.config.adaptive.slots] == [-0.25, 0.0, 0.0, 0.0]
    assert not any("adjusted" in w for w in warnings)


def test_draft_tokens_are_overwritten_without_the_topk1_warning(tmp_path):
    path = schedule_file(tmp_path, {"1": {"candidate_steps": [2, 5]}})
    r, warnings = resolved(*QWEN, *EAGLE, "--speculative-adaptive", "--speculative-adaptive-config", path,
                           "--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
                           "--speculative-num-draft-tokens", "3")
    assert (r.fields["speculative_num_steps"], r.fields["speculative_num_draft_tokens"]) == (5, 6)
    assert r.config.spec == model.Spec(5, 1, 6)
    assert warnings == ["Max running requests is reset to 48 for speculative decoding. You can override this by "
                        "explicitly setting --max-running-requests."]


def test_nextn_is_adaptive_and_the_middle_of_an_even_union_is_the_upper_one(tmp_path):
    path = schedule_file(tmp_path, {"1": {"candidate_steps": [6, 1]}, "16": {"candidate_steps": [2, 4]}})
    r, _ = resolved(*QWEN, "--speculative-algorithm", "nextn", "--speculative-adaptive",
                    "--speculative-adaptive-config", path)
    assert r.fields["speculative_algorithm"] == "EAGLE"
    assert r.fields["speculative_num_steps"] == 4  # union [1, 2, 4, 6], index 4 // 2
    assert r.config.adaptive.initial_steps == 4


def test_global_knobs_merge_into_every_slot_and_a_slot_overrides_them(tmp_path):
    path = schedule_file(tmp_path, {"ema_alpha": 0.5, "warmup_batches": 2, "strategy": "ignored",
                                    "1": {"candidate_steps": [3, 1, 3]},
                                    "8": {"candidate_steps": [1], "warmup_batches": 7}})
    r, _ = resolved(*QWEN, *EAGLE, "--speculative-adaptive", "--speculative-adaptive-config", path)
    first, second = r.config.adaptive.slots
    assert first.candidate_steps == (1, 3)
    assert (first.ema_alpha, first.warmup_batches, first.update_interval) == (0.5, 2, 5)
    assert (second.ema_alpha, second.warmup_batches) == (0.5, 7)


def test_steps_zero_is_a_plain_decode_start():
    r, _ = resolved(*QWEN, *EAGLE, "--speculative-adaptive", "--speculative-num-steps", "0")
    assert r.config.spec == model.Spec(0, 1, 1)
    assert r.config.width == 1 and r.config.max_draft == 8


@pytest.mark.parametrize("content,message", [
    ({"candidate_steps": [1, 3, 7], "ema_alpha": 0.2},
     "ValueError: speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
     "{\"1\": {\"candidate_steps\": [1,3,7]}}. Got keys: ['candidate_steps', 'ema_alpha']"),
    ({"1": {"candidate_steps": []}}, "ValueError: BS 1: candidate_steps must be a list of non-negative ints, got []"),
    ({"1": {"candidate_steps": [1]}, "8": {"candidate_steps": [1, -2]}},
     "ValueError: BS 8: candidate_steps must be a list of non-negative ints, got [1, -2]"),
    ({"4": {"ema_alpha": 0.1}}, "ValueError: BS 4: candidate_steps must be a list of non-negative ints, got None"),
    ({"1": {"candidate_steps": [1.0, 3]}},
     "ValueError: BS 1: candidate_steps must be a list of non-negative ints, got [1.0, 3]"),
    ({"1": {"candidate_steps": "1,3"}},
     "ValueError: BS 1: candidate_steps must be a list of non-negative ints, got '1,3'"),
    ([{"1": {"candidate_steps": [1]}}], "AttributeError: 'list' object has no attribute 'items'"),
    ("{\"1\": {\"candidate_steps\": [1, 3,]}}",
     "json.decoder.JSONDecodeError: Expecting value: line 1 column 33 (char 32)"),
])
def test_invalid_schedules_raise_sglangs_errors(tmp_path, content, message):
    path = schedule_file(tmp_path, content)
    with pytest.raises(ArgRuleError) as e:
        resolved(*QWEN, *EAGLE, "--speculative-adaptive", "--speculative-adaptive-config", path)
    assert str(e.value) == message
    assert e.value.frames[-1][:3] == ("srt/speculative/adaptive_spec_params.py", 104, "_load_adaptive_config")


def test_steps_outside_the_union_raise_sglangs_value_error():
    with pytest.raises(ArgRuleError) as e:
        resolved(*QWEN, *EAGLE, "--speculative-adaptive", "--speculative-num-steps", "4")
    assert str(e.value) == ("ValueError: --speculative-num-steps=4 is not in the adaptive config candidate_steps "
                            "[0, 1, 3, 5, 7]. Pass one of those values.")


def test_without_the_flag_the_file_is_never_read(tmp_path):
    r, _ = resolved(*QWEN, *EAGLE, "--speculative-adaptive-config", str(tmp_path / "missing.json"))
    assert r.config.adaptive is None and r.fields["speculative_num_steps"] == 3


# ---------------------------------------------------------------------------------------- fallback to static


FALLBACK = "speculative_adaptive disabled: {}. Falling back to static speculative params."


@pytest.mark.parametrize("extra,reason", [
    ([*EAGLE, "--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"],
     "speculative_eagle_topk=2 (only topk=1 is supported)"),
    (["--speculative-algorithm", "standalone", "--speculative-draft-model-path", "/d"],
     "speculative_algorithm=STANDALONE (only EAGLE/EAGLE3 are supported)"),
    ([], "speculative_algorithm=None (only EAGLE/EAGLE3 are supported)"),
    ([*EAGLE, "--enable-dp-attention"],
     "enable_dp_attention=True is not supported (adaptive tier decisions are not synchronized across DP ranks)"),
    ([*EAGLE, "--attn-dp-size", "2"],
     "enable_dp_attention=True is not supported (adaptive tier decisions are not synchronized across DP ranks)"),
    ([*EAGLE, "--enable-multi-layer-eagle"],
     "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)"),
    ([*EAGLE, "--enable-two-batch-overlap"],
     "enable_two_batch_overlap=True is not supported (adaptive state swap would discard the TboAttnBackend wrapper)"),
    ([*EAGLE, "--enable-pdmux"],
     "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)"),
])
def test_unsupported_settings_fall_back_to_static_params_with_a_warning(tmp_path, extra, reason):
    # the file is not even read on the way back to static params
    r, warnings = resolved(*LLAMA, *extra, "--speculative-adaptive", "--speculative-adaptive-config",
                           str(tmp_path / "missing.json"), profile="llama8b")
    assert FALLBACK.format(reason) in warnings
    assert r.fields["speculative_adaptive"] is False and r.config.adaptive is None


def test_a_topk2_fallback_keeps_the_tree_it_was_given():
    r, _ = resolved(*QWEN, *EAGLE, "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                    "--speculative-num-draft-tokens", "6", "--speculative-adaptive")
    assert r.config.spec == model.Spec(3, 2, 6)


# ------------------------------------------------------------------------------------------------- routing


def sched(*slots: tuple[int, list[int]], initial: int = 1, **knobs) -> Schedule:
    return Schedule(tuple(SlotConfig(k, tuple(sorted(set(s))), **knobs) for k, s in slots), initial)


def test_a_batch_is_padded_to_the_next_captured_size_then_takes_the_largest_key_below():
    s = sched((2, [5]), (9, [3]), (32, [1]))
    graphs = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 24, 32]
    assert s.key_for_batch(1, graphs) == 2  # below the smallest key: floored to it
    assert s.key_for_batch(8, graphs) == 2
    assert s.key_for_batch(9, graphs) == 9  # padded to 10
    assert s.key_for_batch(17, graphs) == 9  # padded to 24
    assert s.key_for_batch(25, graphs) == 32  # padded to 32
    assert s.key_for_batch(31, None) == 9  # no graphs: no padding
    assert s.key_for_batch(40, graphs) == 32  # above the largest captured size: as is
    assert s.graph_bs_for_step(5, graphs) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert s.graph_bs_for_step(3, graphs) == [10, 12, 14, 16, 24]
    assert s.graph_bs_for_step(7, graphs) == []


def test_each_batch_size_runs_its_own_slots_step():
    c = Controller(sched((1, [7]), (8, [0, 3]), initial=7), [1, 2, 4, 8, 16], lambda m: None)
    # slot 8 cannot start on 7: it starts on the middle of its own candidates
    assert [c.steps_for_batch(b) for b in (1, 3, 5, 8, 12)] == [7, 7, 3, 3, 3]


# --------------------------------------------------------------------------------------------- controller


def feed(slot: Slot, accepted: int, batches: int) -> list[int]:
    """The step after each of ``batches`` verify batches of two requests accepting ``accepted`` drafts each."""
    steps = []
    for _ in range(batches):
        slot.update([accepted, accepted])
        steps.append(slot.current_steps)
    return steps


def test_high_acceptance_walks_up_after_warmup_and_then_every_interval():
    lines: list[str] = []
    slot = Slot(SlotConfig(1, (1, 3, 5, 7), warmup_batches=3, update_interval=2), 3, lines.append)
    assert slot.ema == 2.0
    steps = feed(slot, 6, 9)
    # batch 5 is the first recompute (warmup 3, then every 2): the EMA (6 - 4 * 0.8^5) is past 2.5 and 4.5, so the
    # walk climbs two tiers at once; batch 7 and 9 recompute again and stay on the top candidate
    assert steps == [3, 3, 3, 3, 7, 7, 7, 7, 7]
    assert lines == ["Adaptive spec params updated: steps 3 -> 7 (ema_accept_len=4.69)"]


def test_several_tiers_in_one_recompute_and_the_down_hysteresis():
    slot = Slot(SlotConfig(1, (1, 2, 3, 4, 5, 6, 7), warmup_batches=0, update_interval=1, ema_alpha=1.0), 1,
                lambda m: None)
    slot.update([5])
    assert slot.current_steps == 6  # 5 > 0.5, 1.5, ..., 4.5 but not 5.5: up five tiers to 6
    slot.update([5])
    assert slot.current_steps == 6  # 5 <= 5 - 0.5 - 0.25 is false: stays
    slot.update([4, 4, 4, 5])
    assert slot.current_steps == 5  # mean 4.25 <= 4.25: one tier down, not further (4.25 > 3.25)
    slot.update([0])
    assert slot.current_steps == 1  # all the way down in one recompute


def test_steps_zero_keeps_its_ema_and_always_probes_up():
    lines: list[str] = []
    slot = Slot(SlotConfig(8, (0, 1, 3), warmup_batches=0, update_interval=1, down_hysteresis=0.0), 0,
                lines.append)
    assert slot.ema == -1.0
    slot.update([0, 0])  # at steps 0 nothing is drafted: the EMA stays, and the slot probes step 1
    assert slot.current_steps == 1 and slot.ema == 0.0
    assert lines == ["Adaptive spec params updated: steps 0 -> 1 (ema_accept_len=0.00)"]
    slot.update([0, 0])  # step 1 accepting nothing: 0 <= 0.5 drops back to 0
    assert slot.current_steps == 0
    slot.update([0])
    assert slot.current_steps == 1  # probes again


def test_ceiling_caps_a_non_upward_move():
    slot = Slot(SlotConfig(1, (1, 3, 7), warmup_batches=0, update_interval=1, ema_alpha=0.0, ceiling_coeff=0.5),
                7, lambda m: None)
    slot.ema = 5.0  # walking says stay at 7 (5 > 2.5 - 0.25); the ceiling max(1, ceil(2.5)) = 3 caps it
    slot.update([5])
    assert slot.current_steps == 3


def test_warmup_and_interval_count_per_slot():
    lines: list[str] = []
    c = Controller(sched((1, [1, 3]), (4, [1, 3]), initial=1, warmup_batches=2, update_interval=1), None,
                   lines.append)
    for _ in range(2):
        assert c.on_verify_complete([3] * 4, 4) is None
    assert c.on_verify_complete([3], 1) is None  # slot 1's first batch: still in its own warmup
    assert c.on_verify_complete([3] * 4, 4) == 3
    assert (c.steps_for_batch(1), c.steps_for_batch(4)) == (1, 3)


# ------------------------------------------------------------------------------------------------- memory


def test_buffers_are_sized_for_the_widest_step():
    profile = load_profile("qwen122b")
    r, _ = resolved(*QWEN, *EAGLE, "--speculative-adaptive")
    fixed = {s: model.memory_plan(profile, model.Config(tp=4, spec=model.Spec(s, 1, s + 1), max_running_requests=48))
             for s in (3, 7)}
    plan = model.memory_plan(profile, r.config)
    # a hybrid model's state pool holds max(candidate_steps) + 1 draft tokens per request, whatever the live step
    assert plan.max_running_requests == fixed[7].max_running_requests < fixed[3].max_running_requests
    assert r.config.kv_reserve_tokens == 8


def test_every_other_candidate_step_gets_graphs_for_the_sizes_that_route_to_it(tmp_path):
    profile = load_profile("llama8b")
    path = schedule_file(tmp_path, {"1": {"candidate_steps": [7]}, "9": {"candidate_steps": [3]}})
    r, _ = resolved(*LLAMA, *EAGLE, "--speculative-adaptive", "--speculative-adaptive-config", path,
                    profile="llama8b")
    plan = model.memory_plan(profile, r.config)
    assert r.config.spec.steps == 7 and plan.capture_bs[-1] == 48
    (state,) = plan.adaptive_states
    assert state.steps == 3 and state.capture_bs == [10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48]
    fixed3 = model.memory_plan(profile, model.Config(spec=model.Spec(3, 1, 4), max_running_requests=48))
    assert state.graph_gb == pytest.approx(fixed3.graph_gb - profile.memory.graph_base_gb)
    assert plan.error is None
    assert model.startup_seconds(profile, r.config, plan)["adaptive_graphs"] == pytest.approx(
        15 * (profile.startup.graph_capture_s_per_bs + 2 * profile.startup.draft_graph_capture_s_per_bs))


def test_a_schedule_too_large_for_the_host_fails_where_each_of_its_steps_alone_fits(tmp_path):
    profile = load_profile("llama8b")
    path = schedule_file(tmp_path, {"1": {"candidate_steps": [1, 80, 100, 120]}})
    r, _ = resolved(*LLAMA, *EAGLE, "--speculative-adaptive", "--speculative-adaptive-config", path,
                    "--speculative-num-steps", "1", profile="llama8b")
    plan = model.memory_plan(profile, r.config)
    assert plan.error_phase == "graph" and plan.error_step == 100
    assert plan.error.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert [s.steps for s in plan.adaptive_states] == [80]
    for steps in (80, 100, 120):
        alone = model.memory_plan(profile, model.Config(spec=model.Spec(steps, 1, steps + 1), max_running_requests=48))
        assert alone.error is None


def test_initialized_line_names_the_smallest_slot():
    r, _ = resolved(*QWEN, *EAGLE, "--speculative-adaptive")
    assert adaptive_controller.initialized_line(r.config.adaptive) == \
        "AdaptiveSpeculativeParams initialized: steps=3, candidate_steps=[1, 3, 5, 7]"
