"""The SGLang emulator: a stand-in for ``python -m sglang.launch_server`` (SGLang 0.5.23) to test the tuner against,
run as ``python -m autotune.sim`` (or ``autotune-sim``) with SGLang's flags and optional ``--sim-*`` options.

Its manual (options, faults, the profile file format, the truth of a workload) is docs/emulator.md. The package
stands alone: it imports nothing from autotune outside autotune/sim.
"""
