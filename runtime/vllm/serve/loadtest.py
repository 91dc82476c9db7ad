"""A load test through vLLM's OpenAI completions API: a window of requests sent at their arrival
times, each one streamed, its TTFT and TPOT measured from the stream.

Every request is a ``POST /v1/completions`` with its prompt as token ids of its length (random
ids: the tiny model has no tokenizer, and prefix caching must find nothing to share),
``max_tokens`` its output length, ``ignore_eos`` (it runs to that length), ``stream`` and
``return_token_ids`` (each chunk carries its tokens), ``temperature`` 0, and its class in
``vllm_xargs`` (``{"slo_class": "batch"}``). The first chunk with a token gives the TTFT, the
last one the TPOT (``(last - first) / (tokens - 1)``). A request ends one of these ways, counted
so that ``sent = completed + shed + ended + refused + errors + cut``:

=============  =================================================================================
``completed``  the stream ended with ``finish_reason`` ``length`` (or ``stop``)
``shed``       deadline-aware admission gave it up, late for its first token: the answer
               has ``finish_reason`` ``abort`` and ``stop_reason`` ``batchpilot:shed``; a
               stream carries no such chunk (vLLM streams no chunk for a request that produced
               no token), so a stream that ends cleanly (``data: [DONE]``) before any token
               counts as shed
``ended``      another end by the server: ``abort`` with another reason (``batchpilot:expired``,
               ``batchpilot:exceeds_kv_capacity``, or none)
``refused``    an HTTP status in 400-499 (the body's first 200 characters are kept)
``errors``     a 5xx status, a broken connection, a stream that ended without a finish reason
``cut``        still running when the test's time ran out (``max_s``)
=============  =================================================================================

It is bounded (at most ``max_requests`` requests, ``max_s`` seconds in all: then the streams
still open are closed and counted ``cut``), it stops by itself, and it targets loopback only (a
URL whose host is not a loopback address is refused): it is a test of one's own server, not a
load generator for others'.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import math
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.engine.slo import DEFAULT_SLO_CLASS, SloTarget
from runtime.vllm.engine import FIRST_TOKEN_ID

SHED_STOP_REASON = "batchpilot:shed"
"""the ``stop_reason`` of a request the server shed"""
OUTCOMES = ("completed", "shed", "ended", "refused", "errors", "cut")


class LoadTestError(ValueError):
    """A load test that may not run (a target that is not loopback, limits out of range)."""


def check_loopback(url: str) -> tuple[str, int]:
    """(host, port) of ``url`` when every address its host resolves to is a loopback one;
    :class:`LoadTestError` otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise LoadTestError(f"{url!r}: expected http://HOST:PORT of a server on this machine")
    port = parts.port or 80
    try:
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise LoadTestError(f"{url!r}: cannot resolve {parts.hostname} ({e})") from None
    for info in infos:
        addr = ipaddress.ip_address(info[4][0])
        if not addr.is_loopback:
            raise LoadTestError(f"{url!r}: {parts.hostname} is {addr}, not a loopback address: "
                                "the load test targets only a server on this machine")
    return parts.hostname, port


@dataclass
class Sent:
    """One request and what became of it."""

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    slo_class: str
    sent_s: float = math.nan
    """when it was sent, seconds from the test's start"""
    outcome: str = "cut"
    status: int | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | None = None
    detail: str | None = None
    done_s: float = math.nan

    def met(self, target: SloTarget) -> bool:
        """Whether it met its class's SLO (only a completed request can)."""
        if self.outcome != "completed":
            return False
        if target.deadline_s is not None:
            return self.done_s - self.sent_s <= target.deadline_s
        if self.ttft_s is None or self.ttft_s > target.ttft_target_s(self.prompt_tokens):
            return False
        return self.tpot_s is None or self.tpot_s <= target.tpot_s


@dataclass
class LoadTest:
    """One load test against a server (see the module docstring)."""

    url: str
    """the server, ``http://127.0.0.1:PORT`` (loopback only)"""
    model: str
    """the model name the server serves (its ``--model``)"""
    slo_classes: dict[str, SloTarget]
    """the targets the requests are judged against (the server's own classes)"""
    max_requests: int = 2000
    """send at most this many requests"""
    max_s: float = 600.0
    """stop this many seconds after the start, closing what is still open"""
    vocab_size: int = 32000
    """prompt ids are drawn from [3, vocab_size)"""
    seed: int = 0
    """seed of the prompts' ids"""
    results: list[Sent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.host, self.port = check_loopback(self.url)
        if not 1 <= self.max_requests <= 100_000:
            raise LoadTestError(f"max_requests must lie in [1, 100000], got {self.max_requests}")
        if not 0 < self.max_s <= 24 * 3600:
            raise LoadTestError(f"max_s must lie in (0, 86400] seconds, got {self.max_s}")

    def run(self, arrival_s: Sequence[float], prompt_tokens: Sequence[int],
            output_tokens: Sequence[int], slo_class: Sequence[str] | None = None) -> dict:
        """Send the requests at their arrival times (seconds from now, sorted), wait for every
        one to end or for ``max_s``; returns :meth:`summary`."""
        n = min(len(arrival_s), self.max_requests)
        rng = np.random.default_rng(self.seed)
        self.results = [Sent(i, float(arrival_s[i]), int(prompt_tokens[i]),
                             int(output_tokens[i]),
                             str(slo_class[i]) if slo_class is not None else DEFAULT_SLO_CLASS)
                        for i in range(n)]
        self.t0 = time.perf_counter()
        self.run_id = f"bp-load-{os.getpid()}-{int(time.time() * 1000) % 10 ** 9}"
        """each request's ``X-Request-Id`` is this and its index (vLLM's log and the shed
        lines name it)"""
        self.deadline = self.t0 + self.max_s
        threads = []
        for r in self.results:
            wait = self.t0 + r.arrival_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            if time.perf_counter() >= self.deadline:
                break
            ids = rng.integers(FIRST_TOKEN_ID, self.vocab_size, size=r.prompt_tokens).tolist()
            t = threading.Thread(target=self._one, args=(r, ids), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(max(0.0, self.deadline - time.perf_counter()) + 5.0)
        return self.summary()

    def _one(self, r: Sent, ids: list[int]) -> None:
        body = {"model": self.model, "prompt": ids, "max_tokens": r.output_tokens,
                "ignore_eos": True, "stream": True, "return_token_ids": True,
                "temperature": 0.0, "vllm_xargs": {"slo_class": r.slo_class}}
        payload = json.dumps(body).encode()
        conn = None
        try:
            left = self.deadline - time.perf_counter()
            conn = http.client.HTTPConnection(self.host, self.port, timeout=max(0.5, left))
            start = time.perf_counter()
            r.sent_s = start - self.t0
            conn.request("POST", "/v1/completions", payload,
                         {"Content-Type": "application/json",
                          "X-Request-Id": f"{self.run_id}-{r.index}"})
            resp = conn.getresponse()
            r.status = resp.status
            if resp.status != 200:
                r.detail = resp.read(200).decode(errors="replace")
                r.outcome = "refused" if 400 <= resp.status < 500 else "errors"
                return
            first = last = None
            done = False
            for line in resp:
                now = time.perf_counter()
                if now > self.deadline:
                    r.outcome = "cut"
                    return
                if line.startswith(b"data: [DONE]"):
                    done = True
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", ()):
                    k = len(choice.get("token_ids") or ())
                    if k:
                        if first is None:
                            first = now
                        last = now
                        r.tokens += k
                    if choice.get("finish_reason") is not None:
                        r.finish_reason = choice["finish_reason"]
                        r.stop_reason = choice.get("stop_reason")
            r.done_s = time.perf_counter() - self.t0
            if first is not None:
                r.ttft_s = first - start
                if r.tokens > 1 and last is not None:
                    r.tpot_s = (last - first) / (r.tokens - 1)
            if r.finish_reason in ("length", "stop"):
                r.outcome = "completed"
            elif r.finish_reason == "abort":
                r.outcome = "shed" if r.stop_reason == SHED_STOP_REASON else "ended"
            elif r.finish_reason is None and r.tokens == 0 and done:
                # vLLM does not stream the end of a request that produced no token (it skips
                # empty chunks while a prompt prefills), so a stream that ends cleanly before
                # any token is a request the server gave up before its first token: a shed
                r.outcome = "shed"
                r.stop_reason = SHED_STOP_REASON
            else:
                r.outcome = "errors"
                r.detail = f"stream ended without a finish reason ({r.finish_reason!r})"
        except (OSError, http.client.HTTPException, ValueError) as e:
            if time.perf_counter() >= self.deadline:
                r.outcome = "cut"
            else:
                r.outcome = "errors"
                r.detail = f"{type(e).__name__}: {e}"[:200]
        finally:
            if conn is not None:
                conn.close()

    def summary(self) -> dict[str, Any]:
        """Counts by outcome, attainment by class, TTFT and TPOT percentiles of the completed
        interactive requests, 5xx count; ``conserved``: sent = the outcomes' sum."""
        sent = [r for r in self.results if not math.isnan(r.sent_s)]
        counts = {k: sum(r.outcome == k for r in sent) for k in OUTCOMES}
        by_class: dict[str, dict[str, float]] = {}
        for cls in sorted({r.slo_class for r in sent}):
            rs = [r for r in sent if r.slo_class == cls]
            target = self.slo_classes.get(cls)
            met = sum(r.met(target) for r in rs) if target is not None else 0
            by_class[cls] = {"requests": len(rs), "met": met,
                             "attainment": met / len(rs) if rs else math.nan,
                             "shed": sum(r.outcome == "shed" for r in rs)}
        done = [r for r in sent if r.outcome == "completed" and not
                (self.slo_classes.get(r.slo_class) or SloTarget(1, 1)).is_batch]
        ttft = [r.ttft_s for r in done if r.ttft_s is not None]
        tpot = [r.tpot_s for r in done if r.tpot_s is not None]

        def pct(xs: list[float], q: float) -> float:
            return float(np.percentile(xs, q)) if xs else math.nan

        return {"sent": len(sent), "not_sent": len(self.results) - len(sent), **counts,
                "status_5xx": sum(1 for r in sent if r.status is not None and r.status >= 500),
                "conserved": len(sent) == sum(counts.values()),
                "by_class": by_class,
                "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
                "tpot_p50_s": pct(tpot, 50), "tpot_p99_s": pct(tpot, 99),
                "errors_detail": sorted({r.detail for r in sent
                                         if r.outcome == "errors" and r.detail})[:5]}
