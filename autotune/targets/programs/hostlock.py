"""One tuner per server port (and systemd unit) on a host, whoever runs it and from whatever workdir:
``hostlock.py WORKDIR SUBDIR HOLDER NAME...`` (on the target; the local target uses the functions in-process).

Each NAME is an abstract-namespace Unix socket, ``@autotune-lock:NAME``, bound by the holder: binding is atomic, the
name belongs to the host (its network namespace), not to a directory any user could plant something in, and the
kernel frees it when the holder's process ends, however it ends; no other user can unbind or take it meanwhile. A
second tuner that finds a name taken connects to it and learns who holds it: the kernel's account of the holder's
process (SO_PEERCRED: pid and user, which cannot be forged) and the HOLDER description the holder answers with.

The program checks WORKDIR/SUBDIR first (safedir.py), binds every NAME or none, prints ``locked`` and holds the
names until its standard input (the SSH channel) ends; a name taken prints {"busy": NAME, "holder", "pid", "user"}
and exits with status 75. Runs with the target's python3 (>= 3.6, standard library only).
"""
import hashlib
import json
import os
import pwd
import select
import socket
import struct
import sys
from typing import Dict, List, Optional, Tuple

from autotune.targets.programs import safedir

BUSY = 75
PREFIX = "autotune-lock:"
#: the longest abstract socket name Linux takes (sun_path less its leading NUL)
MAX_NAME = 107
HOLDER_LIMIT = 4096
_HOLDER_KEYS = ("pid", "host", "study", "since")


def address(name: str) -> str:
    """The abstract socket address of lock ``name`` (a long name by its hash)."""
    full = PREFIX + name
    if len(full.encode()) > MAX_NAME:
        full = PREFIX + "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    return "\0" + full


def bind(names: List[str]) -> Tuple[List[socket.socket], Optional[str]]:
    """Listening sockets holding every one of ``names`` and None, or ([], the first name already taken)."""
    held = []
    for name in names:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(address(name))
        except OSError:
            s.close()
            for other in held:
                other.close()
            return [], name
        s.listen(16)
        held.append(s)
    return held, None


def _clean(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    if isinstance(value, str):
        return "".join(c for c in value if c.isprintable())[:120]
    return value


def ask(name: str, timeout: float = 2.0) -> Dict[str, object]:
    """Who holds lock ``name``: {"pid", "user"} of the holding process as the kernel knows them, and "holder" (the
    description it answered with, when it is autotune), or {} when the name is free again."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    out = {}  # type: Dict[str, object]
    try:
        s.connect(address(name))
        pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        try:
            user = pwd.getpwuid(uid).pw_name  # type: object
        except KeyError:
            user = uid
        out = {"pid": pid, "user": user, "holder": None}
        data = b""
        while len(data) < HOLDER_LIMIT:
            chunk = s.recv(HOLDER_LIMIT)
            if not chunk:
                break
            data += chunk
        holder = json.loads(data.decode("utf-8")) if data else None
        if isinstance(holder, dict):
            out["holder"] = {k: _clean(holder.get(k)) for k in _HOLDER_KEYS}
    except (OSError, ValueError):
        pass
    finally:
        s.close()
    return out


def answer(listener: socket.socket, holder: bytes) -> None:
    """Tell one asking tuner who holds the lock."""
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    try:
        conn.settimeout(1.0)
        conn.sendall(holder)
    except OSError:
        pass
    finally:
        conn.close()


def main(args: List[str]) -> int:
    os.umask(0o077)
    workdir, subdir, holder, names = args[0], args[1], args[2].encode("utf-8"), args[3:]
    try:
        os.close(safedir.open_private(workdir, subdir))
    except safedir.Refused as e:
        sys.stderr.write("%s\n" % e)
        return safedir.REFUSED
    held, taken = bind(names)
    if taken is not None:
        print(json.dumps(dict(ask(taken), busy=taken)))
        return BUSY
    print("locked")
    sys.stdout.flush()
    while True:
        ready, _, _ = select.select([0, *held], [], [])
        for r in ready:
            if r == 0:
                if not os.read(0, 4096):
                    return 0
            else:
                answer(r, holder)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
