"""Generated dataset files for the fuzzer (tests/bench/test_fuzz_dataset.py), each with what a correct reader must do
with it: real requests (the built-in traffic set and prompts, in every format autotune reads) mutated, each mutation
known to make the file one to refuse (a lone surrogate, an empty user turn, broken JSON, a wrong type, a number of 5,000
digits, a repeated request, chat among raw prompts...), one to accept (a line separator inside a string, a byte-order
mark, CRLF or CR line ends, blank lines, unknown keys, odd but valid text and categories), or one either way. The cases
run through study_fuzz's runner (`autotune validate` or `autotune workload` in ``main()``).

``cases(seed, n)`` is deterministic for a seed."""
from __future__ import annotations

import base64
import copy
import json
import random
from importlib import resources
from typing import Any

from tests.support.study_texts import VALID

REFUSE, ACCEPT, EITHER = "refuse", "accept", "either"
#: text that is valid and odd: what a reader must take, and show only as visible text
ODD_TEXT = ["\u2028", "\u2029", "\u0085", "\x1b[2J", "<script>alert(1)</script>", "a|b|c", "\u202eevil", "日本語",
            "😀", "\t", "\\", "\"", "\u0000"]
#: stands for a whole number too long for json.dumps to write (Python's limit): put in after
LONG = "@digits@"
#: the formats a line can be written in, from one request
FORMATS = ("chat", "batch", "sharegpt", "raw")


def _builtin() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The built-in chat requests and raw prompts, as the files hold them."""
    files = resources.files("autotune.bench")
    chat = [json.loads(line) for line in files.joinpath("traffic.jsonl").read_text().splitlines() if line.strip()]
    raw = [json.loads(line) for line in files.joinpath("prompts.jsonl").read_text().splitlines() if line.strip()]
    return chat, raw


def _as(fmt: str, chat: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """One request in format ``fmt``: a chat request's messages (chat, batch, ShareGPT) or a raw prompt."""
    item = copy.deepcopy(chat if fmt != "raw" else raw)
    if fmt == "batch":
        return {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                "body": {k: v for k, v in item.items() if k != "category"}, "category": item.get("category")}
    if fmt == "sharegpt":
        speaker = {"system": "system", "user": "human", "assistant": "gpt"}
        turns = [{"from": speaker[m["role"]], "value": m["content"]} for m in item["messages"]]
        return {"id": "x", "conversations": [*turns, {"from": "gpt", "value": "An answer of a few words."}]}
    return item


def _texts(item: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The places in ``item`` that hold a user's text: (the object, its key)."""
    body = item.get("body", item)
    if "prompt" in body:
        return [(body, "prompt")]
    if "conversations" in item:
        return [(t, "value") for t in item["conversations"] if t["from"] == "human"]
    return [(m, "content") for m in body["messages"] if m["role"] == "user"]


def _item_mutation(item: dict[str, Any], rng: random.Random, reads: frozenset[str]) -> tuple[str, str]:
    """Mutate one request in place; (what it did, the verdict it calls for). ``reads``: what of a request the file's
    format reads besides its text ("lengths", "sampling", "category"); the rest is ignored, so anything goes."""
    body = item.get("body", item)
    place, key = rng.choice(_texts(item))
    kind = rng.choice(["surrogate", "empty", "odd", "odd", "unknown", "type", "tokens", "sampling", "category",
                       "category", "long number", "number", "last turn"])
    if kind == "surrogate":
        place[key] += rng.choice(["\ud800", "\udfff", "\udc80 x", "\ud83d"])
        return kind, REFUSE
    if kind == "empty":
        place[key] = rng.choice(["", " ", "\n\t", "\u2028"])
        return kind, REFUSE
    if kind == "odd":
        place[key] += rng.choice(ODD_TEXT)
        return kind, ACCEPT
    if kind == "unknown":
        item[rng.choice(["id", "metadata", "x-extra"])] = rng.choice([None, 1, "a", [1, 2], {"k": "v"}, 10**4000])
        return kind, ACCEPT
    if kind == "type":
        value = rng.choice([None, 3, 2.5, True, [], {}, [1], ["a"]])
        place[key] = value
        return f"{kind} {value!r}", REFUSE
    if kind == "tokens":
        value = rng.choice([0, -1, 1.5, True, "64", 10**7, None, 1, 1_000_000])
        body["max_tokens"] = value
        ok = (value in (None, 1, 1_000_000) and value is not True) or "lengths" not in reads
        return f"max_tokens {value!r}", ACCEPT if ok else REFUSE
    if kind == "sampling":
        name = rng.choice(["temperature", "top_p"])
        value = rng.choice([-0.1, 2.5, "hot", True, float("nan"), 0, 0.5, 1])
        ok = (name == "temperature" and value in (0, 0.5, 1)) or (name == "top_p" and value in (0.5, 1))
        body[name] = value
        return f"{name} {value!r}", ACCEPT if (ok and value is not True) or "sampling" not in reads else REFUSE
    if kind == "category":
        value = rng.choice(["", " ", "x" * 41, 7, ["a"], "code", *ODD_TEXT[:8], "a\nb", "a\ud800"])
        ok = isinstance(value, str) and value.strip() and len(value) <= 40 and "\ud800" not in value
        item["category"] = value
        return f"category {value!r}", ACCEPT if ok or "category" not in reads else REFUSE
    if kind == "long number":
        digits = rng.choice([4301, 5000, 20000])
        item["n"] = f"{LONG}{digits}"
        return f"a number of {digits} digits", REFUSE
    if kind == "number":
        item["n"] = int("7" * rng.choice([1, 300, 4300]))
        return "a long number within the limit", ACCEPT
    if "conversations" in item:
        item["conversations"] = [t for t in item["conversations"] if t["from"] != "gpt"]
        return "no reply", REFUSE
    if "messages" in body:
        body["messages"].append({"role": "assistant", "content": "Sure."})
        return "ends with the assistant", REFUSE
    body["prompt"] = rng.choice([[], 3])
    return "prompt not text", REFUSE


def _line_mutation(lines: list[str], rng: random.Random) -> tuple[str, str]:
    """Mutate the JSONL text's lines in place; (what it did, the verdict)."""
    kind = rng.choice(["truncate", "stray", "blank", "not an object", "bytes"])
    i = rng.randrange(len(lines))
    if kind == "truncate":
        lines[i] = lines[i][:rng.randrange(1, max(2, len(lines[i]) - 1))]
        return kind, REFUSE
    if kind == "stray":
        lines[i] = lines[i] + rng.choice(["}", ",", "x", "]"])
        return kind, REFUSE
    if kind == "blank":
        lines.insert(i, rng.choice(["", " ", "\t"]))
        return kind, ACCEPT
    if kind == "not an object":
        lines[i] = rng.choice(["[1, 2]", "3", '"text"', "null"])
        return kind, REFUSE
    return "not UTF-8", REFUSE  # applied to the bytes: see _encode


def _long(text: str) -> str:
    """``text`` with each stand-in for a long number replaced by its digits."""
    while (at := text.find(f'"{LONG}')) >= 0:
        end = text.index('"', at + 1)
        text = text[:at] + "7" * int(text[at + 1 + len(LONG):end]) + text[end + 1:]
    return text


def _encode(text: str, rng: random.Random, broken: bool) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    if broken:
        at = rng.randrange(len(data) + 1)
        data = data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80"]) + data[at:]
    return data


def cases(seed: int, n: int) -> list[dict[str, Any]]:
    """``n`` cases: a study file naming a dataset (or a prompts file), the dataset's bytes, the command to run, what
    was done and the verdict it calls for."""
    rng = random.Random(seed)
    chat, raw = _builtin()
    out = []
    for number in range(n):
        prompts_file = rng.random() < 0.15
        fmt = "raw" if prompts_file else rng.choice(FORMATS)
        items = [_as(fmt, c, r) for c, r in zip(rng.sample(chat, 6), rng.sample(raw, 6), strict=True)]
        if prompts_file:
            items = [{"prompt": i["prompt"], **({"category": i["category"]} if "category" in i else {})}
                     for i in items]
        reads = frozenset() if prompts_file else frozenset(
            ["category"] if fmt == "sharegpt" else ["lengths", "sampling", "category"])
        done: list[tuple[str, str]] = []
        for index in rng.sample(range(len(items)), rng.choice([0, 1, 1, 2, 3])):
            done.append(_item_mutation(items[index], rng, reads))
        if rng.random() < 0.1:
            items.append(copy.deepcopy(items[0]))
            done.append(("a repeated request", REFUSE))
        if not prompts_file and rng.random() < 0.05:
            items.append(_as("raw" if fmt != "raw" else "chat", rng.choice(chat), rng.choice(raw)))
            done.append(("chat and raw prompts mixed", REFUSE))
        array = fmt == "sharegpt" and rng.random() < 0.5
        lines = [_long(json.dumps(i, ensure_ascii=rng.random() < 0.5)) for i in items]
        broken = False
        if not array and rng.random() < 0.25:
            what = _line_mutation(lines, rng)
            broken = what[0] == "not UTF-8"
            done.append(what)
        end = rng.choice(["\n", "\n", "\r\n", "\r"])
        text = _long(json.dumps(items)) if array else end.join(lines) + rng.choice(["", end])
        if rng.random() < 0.1:
            text = "\ufeff" + text
            done.append(("byte-order mark", ACCEPT))
        if rng.random() < 0.02:
            text = rng.choice(["", "\n\n", "\ufeff", " "])
            done.append(("no requests", REFUSE))
        name = "d.json" if array else "d.jsonl"
        key = "prompts" if prompts_file else "dataset"
        verdicts = {v for _, v in done}
        expect = REFUSE if REFUSE in verdicts else EITHER if EITHER in verdicts else ACCEPT
        out.append({"number": number, "text": f'{VALID}[workload]\n{key} = "{name}"\n',
                    "files": {name: base64.b64encode(_encode(text, rng, broken)).decode()},
                    "argv": [rng.choice(["validate", "workload", "workload"]), "--study", "S.toml"],
                    "expect": expect, "done": [f"{what}: {verdict}" for what, verdict in done] or ["as it was"]})
    return out
