"""The interface every serving engine keeps, as tests (after optuna's testing/pytest_storages.py): resolution, fatal
log lines, the check of what a running server reports, command rendering.

A test module gives each engine of ``autotune.engines.ENGINES`` an ``EngineCase`` (what that engine accepts,
rejects, logs and reports) and runs the suite for it by subclassing ``EngineContract`` with a ``case`` fixture:

    class TestEngines(EngineContract):
        @pytest.fixture(params=sorted(CASES))
        def case(self, request):
            return CASES[request.param]
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from autotune.engines import ENGINES, ArgValue, Engine, config_key
from autotune.errors import REASONS, InvalidConfig


@dataclass(frozen=True)
class EngineCase:
    """One engine's examples: ``valid`` a config it runs, ``invalid`` one it refuses; ``fatal`` log lines and the
    kind of failure each proves, ``ordinary`` lines of a healthy start; ``server`` the JSON a running server answers
    at each path its ``server_info`` reads, and ``reported`` what that server runs with (flag -> value)."""

    engine: Engine
    valid: Mapping[str, ArgValue]
    invalid: Mapping[str, ArgValue]
    fatal: Mapping[str, str]
    ordinary: Sequence[str]
    server: Mapping[str, Any]
    reported: Mapping[str, ArgValue]
    command: Sequence[str] = field(default=("server",))


def _server(answers: Mapping[str, Any]) -> httpx.Client:
    """A client of a server that answers ``answers``' JSON at their paths (404 elsewhere; one generated token for
    any POST)."""
    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(200, json={"content": "x", "tokens_predicted": 1, "stop": True})
        if request.url.path in answers:
            return httpx.Response(200, content=json.dumps(answers[request.url.path]).encode(),
                                  headers={"content-type": "application/json"})
        return httpx.Response(404, json={"error": "not found"})

    return httpx.Client(base_url="http://engine.test", transport=httpx.MockTransport(handle))


class EngineContract:
    """The suite; a subclass supplies the ``case`` fixture."""

    @pytest.fixture
    def case(self) -> EngineCase:
        raise NotImplementedError("a test module gives each engine its EngineCase")

    def test_registered_under_its_kind(self, case: EngineCase) -> None:
        assert ENGINES[case.engine.kind] is type(case.engine)
        assert case.engine.readiness_paths, "a server's readiness is asked somewhere"

    def test_resolve_keeps_a_valid_config_and_is_settled(self, case: EngineCase) -> None:
        resolved = case.engine.resolve(case.valid)
        assert case.engine.resolve(resolved) == resolved, "resolving the effective config changes nothing"
        assert config_key(case.engine.resolve(dict(reversed(list(case.valid.items()))))) == config_key(resolved)

    def test_resolve_refuses_an_invalid_config_in_one_line(self, case: EngineCase) -> None:
        with pytest.raises(InvalidConfig) as refused:
            case.engine.resolve(case.invalid)
        assert str(refused.value) and "\n" not in str(refused.value)

    def test_fatal_lines_name_a_known_failure(self, case: EngineCase) -> None:
        assert case.fatal
        for line, kind in case.fatal.items():
            assert case.engine.fatal_reason(line) == kind, line
            assert kind in case.engine.fatal_kinds
        assert [kind for kind, _ in case.engine.fatal_lines([*case.ordinary, *case.fatal])] == list(
            case.fatal.values())

    def test_ordinary_lines_are_not_fatal(self, case: EngineCase) -> None:
        assert case.ordinary
        assert [line for line in case.ordinary if case.engine.fatal_reason(line)] == []
        assert case.engine.fatal_lines(case.ordinary) == []

    def test_exit_reason_is_a_known_failure(self, case: EngineCase) -> None:
        for status in (1, 2, -9, -11):
            assert case.engine.exit_reason(status) in REASONS

    def test_server_info_reports_what_runs_and_its_mismatches(self, case: EngineCase) -> None:
        with _server(case.server) as client:
            info = case.engine.server_info(client)
        assert {k: info.applied.get(k) for k in case.reported} == dict(case.reported)
        assert case.engine.mismatches(case.reported, info) == []
        name, value = next(iter(case.reported.items()))
        other = f"{value}-other" if isinstance(value, str) else not value if isinstance(value, bool) else value + 1
        lines = case.engine.mismatches({name: other}, info)
        assert len(lines) == 1 and name in lines[0]

    def test_render_starts_with_the_command_and_spells_every_flag(self, case: EngineCase) -> None:
        engine = case.engine
        args = {**engine.resolve(case.valid), engine.port_flag: 31555}
        argv = engine.render(list(case.command), args)
        assert argv[: len(case.command)] == list(case.command)
        assert "31555" in argv and all("\n" not in a for a in argv)
        assert engine.render(list(case.command), {}) == list(case.command)
        assert engine.render(list(case.command), args) == argv, "the same config renders the same command"
        for name, value in args.items():
            if value is False or value is None:
                continue
            assert f"-{name}" in argv or f"--{name}" in argv, name
            if value is not True:
                assert str(value) in argv, (name, value)
