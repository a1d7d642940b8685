"""Runs a command with its output masked as it streams: ``python -m autotune.maskrun LOG FD -- ARGV...``, started
by ``redact.MaskedLaunch`` (the local target's launches).

Reads the secrets to mask (a JSON list) from file descriptor FD, starts ARGV with its standard output and error on a
pipe, and appends what arrives to LOG through ``redact.MaskedFile``. It ends as the command ends: with the same exit
status, or killed by the same signal, so that whoever watches this process sees the command's own end. SIGTERM, SIGINT
and SIGHUP are ignored here (they reach the command through its process group, which this process leads), so that
the command's last lines are still read and masked after a stop; SIGKILL to the group ends both.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
from pathlib import Path

from autotune.redact import MaskedFile, remember

#: seconds of quiet after the command exited before this process stops reading (its children may hold the pipe)
DRAIN = 0.5
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main(args: list[str]) -> int:
    log, fd, argv = Path(args[0]), int(args[1]), args[3:]
    with os.fdopen(fd, "rb") as f:
        for value in json.loads(f.read() or b"[]"):
            remember(value)
    for sig in STOPS:
        signal.signal(sig, signal.SIG_IGN)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the command
        for sig in STOPS:
            signal.signal(sig, signal.SIG_DFL)
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(read)
        os.close(write)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"cannot start {argv[0]}: {e.strerror}\n".encode())
            os._exit(127)
    os.close(write)
    out = MaskedFile(log)
    status = None
    while True:
        ready, _, _ = select.select([read], [], [], DRAIN)
        if ready:
            data = os.read(read, 1 << 16)
            if not data:
                break  # every writer is gone
            out.write(data)
            continue
        if status is not None:
            break  # the command has exited and its output went quiet
        done, waited = os.waitpid(pid, os.WNOHANG)
        if done:
            status = waited
    if status is None:
        status = os.waitpid(pid, 0)[1]
    out.close()
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled, nor need resetting
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
