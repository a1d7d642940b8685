"""Every wait has an end, every read a size: the tuner's own questions to a server (is it ready, what does it run,
flush its cache) end by one deadline for the whole question, however the server drips its answer, and a signal
ends them at once; no answer is read past a cap.

httpx's timeouts are per read: a server that sends one byte every few seconds never trips them. So the question
runs in a thread of its own and the caller waits for it with the deadline (``within``); the client it uses
(``client``) reads every body up to a cap and refuses compressed ones (a small body could unpack without end). A
question left behind at its deadline ends at its client's next read, once the caller closes the client.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

#: how often a waiting caller looks at its stop request (seconds)
POLL = 0.1
#: the most bytes of one answer's body the tuner reads (SGLang's /server_info is a few kB, llama.cpp's /props
#: with its chat template some tens)
MAX_BODY = 8 << 20


class Overran(Exception):
    """The question did not end by its deadline."""


class Stopped(Exception):
    """A stop was requested while waiting."""


class TooLarge(httpx.TransportError):
    """An answer whose body goes past the cap, or is compressed."""


def within(seconds: float, question: Callable[[], T], should_stop: Callable[[], bool] = lambda: False) -> T:
    """``question()``'s result (or its exception), asked in a thread of its own; ``Overran`` once ``seconds`` have
    passed, ``Stopped`` as soon as ``should_stop()`` says so."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def ask() -> None:
        try:
            box["value"] = question()
        except BaseException as e:  # handed to the caller, whatever it is
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=ask, name="bounded-question", daemon=True).start()
    end = time.monotonic() + seconds
    while not done.wait(max(0.0, min(POLL, end - time.monotonic()))):
        if should_stop():
            raise Stopped()
        if time.monotonic() >= end:
            raise Overran(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def client(base_url: str, headers: Mapping[str, str], timeout: float, cap: int = MAX_BODY) -> httpx.Client:
    """An httpx client for ``base_url`` whose answers are read up to ``cap`` bytes each (``TooLarge`` past it) and
    asked for uncompressed; ``timeout`` is httpx's, per read."""
    return httpx.Client(base_url=base_url, headers={**headers, "Accept-Encoding": "identity"}, timeout=timeout,
                        transport=_Capped(cap))


class _Capped(httpx.HTTPTransport):
    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        length = response.headers.get("content-length", "0").strip()
        why = (f"a body encoded as {encoding!r}, not the identity asked" if encoding not in ("", "identity") else
               f"a body of {length} bytes, more than {self.cap}" if length.isdigit() and int(length) > self.cap
               else None)
        if why is not None:
            response.close()
            raise TooLarge(why, request=request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(response.status_code, headers=response.headers, extensions=response.extensions,
                              stream=_CappedStream(response.stream, self.cap, request))


class _CappedStream(httpx.SyncByteStream):
    def __init__(self, stream: httpx.SyncByteStream, cap: int, request: httpx.Request) -> None:
        self.stream, self.cap, self.request = stream, cap, request

    def __iter__(self) -> Iterator[bytes]:
        size = 0
        for chunk in self.stream:
            size += len(chunk)
            if size > self.cap:
                raise TooLarge(f"a body of more than {self.cap} bytes", request=self.request)
            yield chunk

    def close(self) -> None:
        self.stream.close()
