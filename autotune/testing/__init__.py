"""Instruments for tests and benchmarks (like optuna's own ``optuna.testing``): free loopback ports, study files
for the SGLang emulator, a throw-away OpenSSH server and a throw-away PostgreSQL cluster on 127.0.0.1.

Not part of the tuner's data flow: nothing else in autotune imports this package; ``tests/`` and ``scripts/`` do.
"""
