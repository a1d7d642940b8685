"""Files in autotune's directory on the target, each operation in the same program that checked the directory
(safedir.py): ``workdir.py WORKDIR SUBDIR OP ...`` prints one JSON object.

    check                              -> {}                      (creates missing directories 0700)
    read NAME                          -> {"data": BASE64 | null}
    write NAME MODE [exclusive]        -> {"written": bool}        (the bytes on standard input)
    remove NAME...                     -> {"removed": [NAME...]}
    rename SRC DST                     -> {}

A directory or file another user could control exits with status 96 and one line on stderr. Runs with the target's
python3 (>= 3.6, standard library only).
"""
import base64
import json
import os
import sys
from typing import List

from autotune.targets.programs import safedir


def main(args: List[str]) -> int:
    os.umask(0o077)
    workdir, subdir, op, rest = args[0], args[1], args[2], args[3:]
    try:
        dfd = safedir.open_private(workdir, subdir)
        if op == "check":
            out = {}
        elif op == "read":
            data = safedir.read_file(dfd, rest[0], "%s/%s/" % (workdir.rstrip("/"), subdir))
            out = {"data": None if data is None else base64.b64encode(data).decode()}
        elif op == "write":
            data = sys.stdin.buffer.read()
            written = safedir.write_file(dfd, rest[0], data, int(rest[1], 8), exclusive="exclusive" in rest[2:])
            out = {"written": written}
        elif op == "remove":
            out = {"removed": [name for name in rest if safedir.remove_file(dfd, name)]}
        elif op == "rename":
            safedir.rename_file(dfd, rest[0], rest[1])
            out = {}
        else:
            sys.stderr.write("usage: workdir.py WORKDIR SUBDIR check|read|write|remove|rename ...\n")
            return 2
    except safedir.Refused as e:
        sys.stderr.write("%s\n" % e)
        return safedir.REFUSED
    except (OSError, ValueError) as e:
        sys.stderr.write("autotune: %s in %s/%s: %s\n" % (op, workdir, subdir, e))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
