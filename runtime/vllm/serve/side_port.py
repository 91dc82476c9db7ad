"""The controller's side port in vLLM's engine-core process: Prometheus metrics, its state, and
the two operator actions (policy reload, controller switch).

vLLM's own ``/metrics`` is served by its API-server process, which learns of the engine core only
through vLLM's stats messages; the controller lives in the engine core, so it serves its own
metrics on a side port (``BATCHPILOT_VLLM_METRICS_PORT``, 8001 by default, on 127.0.0.1), read at
scrape time from the controller's counters: nothing is done on vLLM's thread for a scrape.

==========================  =====================================================================
route                       what
==========================  =====================================================================
``GET /metrics``            Prometheus text format (docs/vllm-serve.md lists every metric)
``GET /v1/state``           JSON: knobs, who decides, the last decision, counts, the policy, blocks
``POST /v1/policy/reload``  ``{"name": "policy-b.onnx"}`` (default: the current file): load it from
                            the policy folder, swap it in once checked; 422 and the old policy
                            kept on a refusal
``POST /v1/controller``     ``{"controller": "policy"|"pid"|"static", "knobs": {...},
                            "admission": ...}``: who decides from the next interval on (``static``
                            holds ``knobs``, default the static knobs: the operator's switch to
                            take the controller out)
==========================  =====================================================================

The POST routes need ``Authorization: Bearer <BATCHPILOT_VLLM_RELOAD_TOKEN>`` (403 while no token
is set). Bodies over 4 KiB get 413; a connection idle for 5 s is closed; at most 8 requests are
served at once (503 beyond).
"""

from __future__ import annotations

import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from runtime.decider.decision import FALLBACK_REASONS, SOURCES
from runtime.knobs import KNOB_NAMES, Knobs
from runtime.vllm.serve.settings import MAX_BODY_BYTES, ServeSettings

MAX_IN_FLIGHT = 8
"""requests the side port serves at once"""
TIMEOUT_S = 5.0
"""a connection's socket timeout"""
OUTCOMES = ("arrivals", "finished", "met", "violations", "rejected", "shed", "expired", "late")
"""the request counts of ``batchpilot_vllm_requests_total``"""


def _histogram(name: str, doc: str, h: Any) -> HistogramMetricFamily:
    buckets, total = [], 0
    for le, n in zip(h.buckets, h.counts):
        total += n
        buckets.append((repr(le), total))
    buckets.append(("+Inf", total + h.counts[-1]))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.sum_s)


class ControllerCollector(Collector):
    """Every metric, read from the controller when scraped."""

    def __init__(self, controller: Any) -> None:
        self.c = controller

    def collect(self) -> Iterator[Metric]:
        c = self.c
        sch = c.scheduler
        knobs = sch.knobs
        g = GaugeMetricFamily("batchpilot_vllm_knob", "each knob's value in force now",
                              labels=["knob"])
        for name in KNOB_NAMES:
            g.add_metric([name], float(getattr(knobs, name)))
        yield g
        yield GaugeMetricFamily("batchpilot_vllm_token_budget",
                                "the prefill chunk vLLM applies: prefill_chunk_tokens capped at "
                                "its start-up --max-num-batched-tokens", value=float(sch.bp_chunk))
        yield CounterMetricFamily("batchpilot_vllm_chunk_capped",
                                  "knob changes whose prefill_chunk_tokens exceeded vLLM's "
                                  "start-up --max-num-batched-tokens (the budget was capped)",
                                  value=sch.bp_chunk_capped)
        g = GaugeMetricFamily("batchpilot_vllm_static_knob",
                              "the static knobs (what a fault or the static controller holds)",
                              labels=["knob"])
        for name in KNOB_NAMES:
            g.add_metric([name], float(getattr(c.static, name)))
        yield g
        g = GaugeMetricFamily("batchpilot_vllm_controller", "1 for who decides now "
                              "(policy: the guarded decider; pid; static)", labels=["controller"])
        for mode in ("policy", "pid", "static"):
            g.add_metric([mode], 1.0 if c.mode == mode else 0.0)
        yield g
        last = c.last
        g = GaugeMetricFamily("batchpilot_vllm_last_decision",
                              "1 for the source of the last decision (with its fallback reason)",
                              labels=["source", "reason"])
        if last is not None:
            g.add_metric([last.source, last.reason or ""], 1.0)
        yield g
        by_source = dict(c.by_source)
        m = CounterMetricFamily("batchpilot_vllm_decisions", "decisions by source",
                                labels=["source"])
        for s in sorted(set(SOURCES) | set(by_source)):
            m.add_metric([s], by_source.get(s, 0))
        yield m
        by_reason = dict(c.by_reason)
        m = CounterMetricFamily("batchpilot_vllm_fallbacks",
                                "decisions not made by the policy, by reason", labels=["reason"])
        for r in sorted(set(FALLBACK_REASONS) | set(by_reason)):
            m.add_metric([r], by_reason.get(r, 0))
        yield m
        m = CounterMetricFamily("batchpilot_vllm_controller_faults",
                                "faults of the controller itself (static knobs held), by kind",
                                labels=["kind"])
        for k, n in sorted(dict(c.faults).items()):
            m.add_metric([k], n)
        yield m
        totals = vars(c.totals)
        m = CounterMetricFamily("batchpilot_vllm_requests",
                                "requests by what happened to them (as the intervals closed)",
                                labels=["outcome"])
        for k in OUTCOMES:
            m.add_metric([k], totals[k])
        yield m
        m = CounterMetricFamily("batchpilot_vllm_rejected", "requests ended without finishing, "
                                "by reason (shed, expired, aborted by the client, ...)",
                                labels=["reason"])
        for k, n in sorted(dict(c.rejected_by_reason).items()):
            m.add_metric([k], n)
        yield m
        yield CounterMetricFamily("batchpilot_vllm_preemptions",
                                  "requests preempted (vLLM's, and the KV cap's)",
                                  value=totals["preemptions"])
        g = GaugeMetricFamily("batchpilot_vllm_kv_blocks", "KV blocks: vLLM's pool, the cap, "
                              "withheld from vLLM by the cap, held by requests",
                              labels=["state"])
        for k, v in (("pool", sch.bp_pool_blocks), ("cap", sch.bp_cap),
                     ("withheld", len(sch.bp_withheld)), ("used", sch.used_blocks())):
            g.add_metric([k], float(v))
        yield g
        policy = c.guarded.policy
        g = GaugeMetricFamily("batchpilot_vllm_policy_loaded",
                              "1 when an ONNX policy is loaded (labelled with its version)",
                              labels=["policy_version"])
        g.add_metric([policy.policy_version if policy is not None else ""],
                     1.0 if policy is not None else 0.0)
        yield g
        m = CounterMetricFamily("batchpilot_vllm_policy_reloads",
                                "policy reloads by outcome (ok, or why it was refused)",
                                labels=["outcome"])
        for k, n in sorted(dict(c.reloads).items()):
            m.add_metric([k], n)
        yield m
        slow = c.guarded.slow_guard
        yield GaugeMetricFamily("batchpilot_vllm_policy_slow",
                                "1 while the PID decides in place of a policy whose decisions "
                                "took longer than the decision limit", value=float(
                                    slow is not None and slow.handed_over))
        yield CounterMetricFamily("batchpilot_vllm_slow_decisions",
                                  "policy decisions that took longer than the decision limit",
                                  value=slow.slow_decisions if slow is not None else 0)
        g = GaugeMetricFamily("batchpilot_vllm_breaker_state",
                              "1 for the circuit breaker's state", labels=["state"])
        for s in ("closed", "open", "half_open"):
            g.add_metric([s], 1.0 if c.guarded.breaker.state == s else 0.0)
        yield g
        yield GaugeMetricFamily("batchpilot_vllm_passthrough",
                                "1 when the knobs' per-step application failed and vLLM runs "
                                "on its own start-up scheduling", value=float(
                                    bool(getattr(sch, "bp_passthrough", False))))
        yield GaugeMetricFamily("batchpilot_vllm_window_held",
                                "1 when new requests are held for the batch window, 0 when it "
                                "is released (they enter vLLM's queue at once)",
                                value=float(sch.bp_hold_window))
        yield GaugeMetricFamily("batchpilot_vllm_interval_attainment",
                                "SLO attainment of the last closed interval",
                                value=last.stats.slo_attainment if last is not None else 1.0)
        yield _histogram("batchpilot_vllm_decision_seconds", "one decision", c.decide_s)
        yield _histogram("batchpilot_vllm_tick_seconds", "one interval's whole work (close, "
                         "observe, decide, apply)", c.tick_s)


class _Handler(BaseHTTPRequestHandler):
    server_version = "batchpilot-vllm"
    timeout = TIMEOUT_S
    controller: Any = None
    settings: ServeSettings
    registry: CollectorRegistry
    slots: threading.BoundedSemaphore

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape a second must not fill vLLM's log

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, (json.dumps(obj) + "\n").encode())

    def _guarded(self, handle: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self._json(503, {"detail": "busy"})
            return
        try:
            handle()
        except Exception as e:  # noqa: BLE001 - the side port answers, whatever happens
            self._json(500, {"detail": f"{type(e).__name__}: {e}"})
        finally:
            self.slots.release()

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _get(self) -> None:
        if self.path == "/metrics":
            self._send(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif self.path == "/v1/state":
            self._json(200, self.controller.state())
        else:
            self._json(404, {"detail": "routes: GET /metrics, GET /v1/state, POST "
                                       "/v1/policy/reload, POST /v1/controller"})

    def _body(self) -> dict | None:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._json(400, {"detail": "bad Content-Length"})
            return None
        if n > MAX_BODY_BYTES:
            self._json(413, {"detail": f"a body of at most {MAX_BODY_BYTES} bytes"})
            return None
        raw = self.rfile.read(n) if n else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self._json(400, {"detail": f"not JSON: {e}"})
            return None
        if not isinstance(body, dict):
            self._json(400, {"detail": "expected a JSON object"})
            return None
        return body

    def _authorised(self) -> bool:
        token = self.settings.reload_token
        if token is None or not token.get_secret_value():
            self._json(403, {"detail": "disabled: the server has no token (set "
                                       "BATCHPILOT_VLLM_RELOAD_TOKEN)"})
            return False
        given = self.headers.get("Authorization", "")
        expected = f"Bearer {token.get_secret_value()}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            self._json(401, {"detail": "a valid bearer token is required"})
            return False
        return True

    def _post(self) -> None:
        if self.path not in ("/v1/policy/reload", "/v1/controller"):
            self._json(404, {"detail": "POST routes: /v1/policy/reload, /v1/controller"})
            return
        body = self._body()
        if body is None or not self._authorised():
            return
        c = self.controller
        if self.path == "/v1/policy/reload":
            name = body.get("name", c.policy_path.name if c.policy_path is not None else None)
            if not isinstance(name, str) or not name:
                self._json(422, {"detail": "field 'name': a policy file in the policy folder"})
                return
            ok, what = c.reload(name)
            kept = c.guarded.policy
            self._json(200 if ok else 422, {
                "ok": ok, "detail": what,
                "policy_version": kept.policy_version if kept is not None else None})
            return
        unknown = sorted(set(body) - {"controller", "knobs", "admission"})
        if unknown:
            self._json(422, {"detail": f"unknown field(s) {unknown}: expected controller, "
                                       "knobs, admission"})
            return
        try:
            knobs = None
            if body.get("knobs") is not None:
                given = body["knobs"]
                if not isinstance(given, dict):
                    raise ValueError("field 'knobs': an object of knob values")
                knobs = Knobs(**{**c.static.as_dict(), **given})
            admission = body.get("admission")
            if admission is not None and admission not in ("fcfs", "shed", "late_to_back"):
                raise ValueError("field 'admission': fcfs, shed or late_to_back")
            c.switch(body.get("controller", c.mode), knobs, admission)
        except (TypeError, ValueError) as e:
            self._json(422, {"detail": str(e)})
            return
        self._json(200, {"ok": True, "detail": "applied from the next interval on"})


def start_side_port(controller: Any, settings: ServeSettings) -> ThreadingHTTPServer:
    """Serve the side port on a daemon thread; returns the server (``server_address`` has the
    port bound). OSError when the port cannot be bound."""
    registry = CollectorRegistry()
    registry.register(ControllerCollector(controller))
    handler = type("Handler", (_Handler,), {
        "controller": controller, "settings": settings, "registry": registry,
        "slots": threading.BoundedSemaphore(MAX_IN_FLIGHT)})
    server = ThreadingHTTPServer((settings.metrics_host, settings.metrics_port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="batchpilot-side-port",
                     daemon=True).start()
    return server
