"""The emulator's acceptance depends on the request, as a real server's does: what it asks for (copy-heavy text far
above free prose), a chat template against a raw prompt, the temperature, and the text a request that ignores
end-of-sequence runs on into past its natural end; its truth on the virtual clock says the same."""
from __future__ import annotations

from pathlib import Path

import pytest

from autotune.sim import model, virtual_run
from autotune.sim.profile import load_profile
from autotune.sim.traffic import category_of

PROFILES = Path(model.__file__).parent / "profiles"

ARGV = ["--model-path", "/m", "--tp-size", "4", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "5",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6", "--sim-profile", "qwen14b"]
QUICK = virtual_run.Length(single_requests=200, window_turns=4)


def _accept(max_tokens: int = 200, argv: list[str] = ARGV, **ask: object) -> float:
    asks = [virtual_run.Ask(prompt_tokens=100 + i, max_tokens=max_tokens, **ask)  # type: ignore[arg-type]
            for i in range(20)]
    return virtual_run.figures(argv, asks, max_tokens, [1], runs=QUICK).accept_length


def test_categories_are_told_from_the_instruction() -> None:
    assert category_of("Rewrite the following message in a professional tone:\n\nhi team") == "rewrite"
    assert category_of("Summarise this in two sentences: The council met on Tuesday") == "rewrite"
    assert category_of("Extract every date as JSON from: the 14th of March") == "extraction"
    assert category_of("Write a Python function that sorts a list") == "code"
    assert category_of("Solve for x: 3x + 4 = 19. Explain each step.") == "math"
    assert category_of("What should I see in Lisbon?") == "chat"
    # a client's tag in front is not what is asked, nor a range or a count in it (an independent client's tags once
    # read as arithmetic and made every one of its requests a math one)
    assert category_of("[reference 0-12] What should I see in Lisbon?") == "chat"
    assert category_of("[c8 r0/1 300] What should I see in Lisbon?") == "chat"


def test_copy_heavy_requests_are_accepted_far_above_free_prose_and_chat_above_raw() -> None:
    chat = _accept(category="chat", chat=True)
    rewrite = _accept(category="rewrite", chat=True)
    raw = _accept(category="chat", chat=False)
    hot = _accept(category="chat", chat=True, temperature=1.0)
    assert rewrite > 1.3 * chat > 1.3 * raw, (rewrite, chat, raw)
    assert hot < chat
    profile = load_profile("qwen14b")
    spec = model.Spec(5, 1, 6)
    factor = profile.acceptance.factor("chat", True)
    # the profile's numbers (a request's last step is cut at its end, and the draws vary: within 5%)
    assert abs(chat / model.accept_length(profile, spec, 0.0, factor) - 1) < 0.05


def test_text_past_the_natural_end_is_drafted_as_the_profile_says_under_ignore_eos(tmp_path: Path) -> None:
    # a profile that says what llama-server showed with n-gram drafts (docs/traffic.md): past its answer a model
    # repeats itself, which a draft predicts well; the shipped profiles keep 1 (an EAGLE head's figure is not known)
    text = (PROFILES / "qwen14b.toml").read_text()
    assert "past_end_factor = 1.0" in text
    (tmp_path / "repeats.toml").write_text(text.replace("past_end_factor = 1.0", "past_end_factor = 1.3"))
    argv = [*ARGV[:-1], str(tmp_path / "repeats.toml")]
    # 3,000 tokens forced, five times the profile's answers (600 on average): most of each request runs past its end
    natural = _accept(argv=argv, category="chat", chat=True, ignore_eos=False)
    forced = _accept(3000, argv=argv, category="chat", chat=True, ignore_eos=True)
    profile = load_profile(str(tmp_path / "repeats.toml"))
    past = model.accept_length(profile, model.Spec(5, 1, 6), 0.0,
                               profile.acceptance.factor("chat", True) * profile.acceptance.past_end_factor)
    assert natural * 1.05 < forced < past, (natural, forced, past)
    # the shipped profile: forced lengths are drafted as the answer is
    shipped = _accept(category="chat", chat=True, ignore_eos=False)
    assert _accept(3000, category="chat", chat=True, ignore_eos=True) == pytest.approx(shipped, rel=0.03)
