"""batchpilot inside ``vllm serve``, measured through the OpenAI API: one command per figure, each
printing its table (and writing JSON with ``--out``). Run it in the vLLM venv (``.venv-vllm``).

    batchpilot bench vllm-serve --figure attainment --trace azure-conv
    batchpilot bench vllm-serve --figure cost
    batchpilot bench vllm-serve --figure faults
    batchpilot bench vllm-serve --figure startup

``attainment``: a held-out window of each trace replayed through one ``batchpilot vllm-serve`` at
two loads, the static default's ``--static-target`` load and best static's capacity, with four
arms switched on the running server between runs (``POST /v1/controller``): ``static`` (the
static default: its knobs, first come first served), ``best-static`` (its knobs and admission,
tuned on the training split by the calibrated simulator), ``pid`` and ``policy`` (the shipped
policy set: the trace's workload policy, through the guarded decider, as the server runs it).
The loads are found on the server itself (``--loads server``: a short geometric search with the
static default, then best static) or by the calibrated simulator (``--loads sim``, as the arena
on vLLM finds them), or given (``--loads 0.2,0.4``). The arms run interleaved, their order
rotated every repeat; a row gives interactive attainment (median and range), requests shed,
errors and 5xx, whether every request sent ended (sent = completed + shed + refused + errors +
cut), and each run's mean decision time (the side port's histogram, over the run's intervals).

``cost``: the same stream through three servers started side by side: vLLM alone, and vLLM with
batchpilot holding static knobs that match vLLM's start-up (the chunk at vLLM's token budget,
the whole KV pool), once with the batch window released (``BATCHPILOT_VLLM_HOLD_WINDOW=false``:
requests enter vLLM's queue as they arrive, so the difference is the controller's own work) and
once held at the knob's floor of 5 ms (the window's cost on top); the order rotated every
repeat; TTFT and TPOT p50 and p99 of each run, their medians per arm and the ratios to vLLM
alone.

``faults``: one server started on a corrupt policy under a steady stream; then a good policy
reloaded, the live policy file replaced by garbage, and a policy that raises in serving
reloaded: per phase the requests that failed and how soon the fallback showed in the metrics.

``startup``: seconds from the launch to vLLM answering, with and without the controller, and to
the controller's first decision, the launches alternated.

The machine's 1-minute load average is printed with every run: the project machines are shared,
and wall-clock figures there say much about the neighbours.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tyro

from runtime.locations import profiles_dir, shipped_policy_dir

ARMS = ("static", "best-static", "pid", "policy")
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
"""the test policies of a source checkout (the faults figure's)"""
RAISING_POLICY = FIXTURES / "policy-raises-in-serving.onnx"
"""a policy that loads cleanly and raises in serving"""
SLOW_POLICY = FIXTURES / "policy-slow-in-serving.onnx"
"""a policy that loads cleanly and takes tens of milliseconds a decision in serving"""
TOKEN = "bench-token"


@dataclass
class Args:
    """One figure of batchpilot inside ``vllm serve`` (see the module docstring)."""

    figure: Literal["attainment", "cost", "faults", "startup"] = "attainment"
    """which figure to measure"""
    trace: str = "azure-conv,azure-code"
    """attainment: the traces, comma-separated (their held-out splits)"""
    loads: str = "server"
    """attainment: server (found on the server), sim (by the calibrated simulator), or rate
    scales, comma-separated"""
    repeats: int = 2
    """runs of every arm at every load (attainment), or of each server (cost, startup)"""
    window_s: float = 15.0
    """seconds of arrivals per run"""
    window_start_s: float = 80.0
    """where the window starts in the held-out split, seconds of the trace"""
    drain_s: float = 90.0
    """a run's requests still open this long after its last arrival are cut"""
    static_target: float = 0.68
    """the static default's interactive attainment at the first load"""
    capacity_target: float = 0.99
    """the attainment that defines best static's capacity (the second load)"""
    admission: Literal["fcfs", "shed", "late_to_back"] = "fcfs"
    """the admission policy of the pid and policy arms (static runs fcfs, best static its own)"""
    profile: Path = dataclasses.field(
        default_factory=lambda: profiles_dir() / "cpu-vllm-tiny-measured.json")
    """the measured vLLM profile: the SLO targets are scaled to it, the simulator calibrated"""
    model: str | None = None
    """the model folder (default: the tiny dummy-weight Llama in a temporary folder)"""
    kv_cache_gib: float = 1 / 16
    """vLLM's KV pool, GiB"""
    max_num_batched_tokens: int = 2048
    """vLLM's start-up token budget"""
    rate: float = 1.0
    """cost: requests/s of the Poisson stream"""
    cost_seconds: float = 20.0
    """cost: seconds of the stream per run"""
    out: Path | None = None
    """write the figure's JSON here"""


# ---------------------------------------------------------------------------- the servers
def load1() -> float:
    return os.getloadavg()[0]


class Server:
    """A started server and its side port."""

    def __init__(self, proc: Any, model: str) -> None:
        self.proc = proc
        self.model = model

    def state(self) -> dict:
        with urllib.request.urlopen(self.proc.side_url + "/v1/state", timeout=30) as r:
            return json.load(r)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.proc.side_url + "/metrics", timeout=30) as r:
            return r.read().decode()

    def decision_seconds(self) -> tuple[float, float]:
        """(seconds, count) of every decision so far, from the side port's histogram."""
        text = self.metrics()
        got = [re.search(rf"^batchpilot_vllm_decision_seconds_{k} (\S+)$", text, re.M)
               for k in ("sum", "count")]
        if None in got:
            raise RuntimeError("the side port's metrics have no decision histogram")
        return float(got[0].group(1)), float(got[1].group(1))  # type: ignore[union-attr]

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.proc.side_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{path}: {e.code} {e.read()[:300]!r}") from None

    def wait(self, what, timeout_s: float = 120.0) -> dict:
        deadline = time.time() + timeout_s
        while True:
            s = self.state()
            if what(s):
                return s
            if time.time() > deadline:
                raise RuntimeError(f"the server did not settle within {timeout_s:g} s: {s}")
            time.sleep(0.1)

    def idle(self) -> dict:
        """Wait until no request is in vLLM and the intervals holding them have closed."""
        s = self.wait(lambda s: s["requests"]["in_engine"] == 0, 600.0)
        time.sleep(2 * s["interval_s"])
        return self.state()


def start(model: str, args: Args, *, controller: bool = True, settings: dict | None = None,
          log: Path | None = None):
    from runtime.vllm.serve.process import ServeProcess, TinyServeFlags

    flags = TinyServeFlags(kv_cache_gib=args.kv_cache_gib,
                           max_num_batched_tokens=args.max_num_batched_tokens)
    return ServeProcess.start(model, controller=controller, flags=flags, log_path=log,
                              settings={"RELOAD_TOKEN": TOKEN, "SLO": f"profile:{args.profile}",
                                        **(settings or {})}, timeout_s=900.0)


def tiny_model(args: Args) -> str:
    from runtime.vllm.model import write_tiny_model

    return args.model or str(write_tiny_model(tempfile.mkdtemp(prefix="tiny-llama-")))


def replay(url: str, model: str, w, args: Args, seed: int = 0) -> dict:
    """The window ``w`` through the completions API (every request streamed)."""
    from runtime.vllm.serve.loadtest import LoadTest
    from runtime.vllm.serve.settings import slo_classes

    end = float(w.arrival_s[-1]) if len(w) else 0.0
    test = LoadTest(url, model, slo_classes(f"profile:{args.profile}"),
                    max_s=end + args.drain_s, seed=seed)
    out = test.run(w.arrival_s.tolist(), w.prompt_tokens.tolist(), w.output_tokens.tolist(),
                   [str(c) for c in w.slo_class.tolist()])
    out["load_1m"] = load1()
    return out


def interactive(summary: dict) -> float:
    row = summary["by_class"].get("interactive")
    return float(row["attainment"]) if row else math.nan


# ---------------------------------------------------------------------------- attainment
def arena(args: Args):
    from agents.vllm_arena import VllmArena

    return VllmArena(window_start_s=args.window_start_s, window_s=args.window_s)


def spec_for(trace: str, args: Args):
    from agents.registry import EvalSpec
    from runtime.engine.config import EngineConfig
    from runtime.vllm.serve.settings import slo_classes

    classes = slo_classes(f"profile:{args.profile}")
    config = EngineConfig(slo_classes=classes, default_slo_class=next(iter(classes)),
                          admission=args.admission)
    return EvalSpec(trace, "eval", str(args.profile), 0.25, config)


def arm_body(arm: str, best, args: Args) -> dict:
    """The ``POST /v1/controller`` body of an arm."""
    from runtime.knobs import DEFAULT_KNOBS

    if arm == "static":
        return {"controller": "static", "knobs": DEFAULT_KNOBS.as_dict(), "admission": "fcfs"}
    if arm == "best-static":
        return {"controller": "static", "knobs": best.knobs.as_dict(),
                "admission": best.admission}
    return {"controller": arm, "admission": args.admission}


def run_arm(server: Server, arm: str, best, w, args: Args, seed: int) -> dict:
    server.post("/v1/controller", arm_body(arm, best, args))
    server.wait(lambda s: s["controller"] == ("static" if "static" in arm else arm))
    server.idle()
    before = server.state()
    s0, n0 = server.decision_seconds()
    out = replay(server.proc.url, server.model, w, args, seed)
    after = server.idle()
    s1, n1 = server.decision_seconds()
    out["decide_us"] = (s1 - s0) / (n1 - n0) * 1e6 if n1 > n0 else math.nan
    out["sources"] = {k: v - before["decisions"].get(k, 0)
                      for k, v in after["decisions"].items()
                      if v - before["decisions"].get(k, 0)}
    out["server_shed"] = (after["requests"]["shed"] - before["requests"]["shed"])
    return out


def find_server_loads(server: Server, trace: str, best, args: Args, start: float,
                      log) -> dict[str, float]:
    """The static default's ``static_target`` load and best static's capacity, measured on the
    server: a geometric search of a few probes each (the probes are noisy, the search short)."""
    from agents.vllm_arena import window

    a = arena(args)

    def probe(arm: str, scale: float) -> float:
        out = run_arm(server, arm, best, window(trace, scale, a), args, seed=99)
        att = interactive(out)
        log(f"  probe {arm} x{scale:.3g}: interactive {att:.1%} (load {out['load_1m']:.1f})")
        return att

    probes = {}
    s = start
    for _ in range(4):  # multiplicative steps toward the target, halving each time
        probes[s] = probe("static", s)
        step = 2.0 ** (1.0 / (1 + len(probes) // 2))
        s = s * step if probes[s] > args.static_target else s / step
    s68 = min(probes, key=lambda k: abs(probes[k] - args.static_target))
    cap, s = 0.0, s68
    tried: dict[float, float] = {}
    for _ in range(4):
        tried[s] = probe("best-static", s)
        if tried[s] >= args.capacity_target:
            cap = max(cap, s)
            s *= 1.5
        else:
            s /= 1.5
    if cap == 0.0:
        cap = min(tried)  # it never held the target: the lightest load tried
    return {f"static@{args.static_target:g}": s68,
            f"best-static capacity@{args.capacity_target:g}": cap}


def figure_attainment(args: Args, log) -> dict:
    from agents.vllm_arena import find_loads, static_load, tuned_best_static, window
    from env.traces.resolve import trace_label
    from runtime.decider.policy_set import POLICY_SET_FILE, PolicySet
    from runtime.engine.profile import Profile

    traces = [t for t in args.trace.split(",") if t]
    model = tiny_model(args)
    policies = PolicySet.load(shipped_policy_dir() / POLICY_SET_FILE)
    a = arena(args)
    profile = Profile.load(args.profile)
    server = Server(start(model, args, settings={"CONTROLLER": "static"}), model)
    log(f"vLLM with batchpilot answered {server.proc.ready_s:.0f} s after the launch "
        f"(load {load1():.1f})")
    rows, loads = [], {}
    try:
        for trace in traces:
            spec = spec_for(trace, args)
            s68_sim = static_load(spec, trace, a, profile)
            best = tuned_best_static(trace, spec, a, s68_sim,
                                     Path(tempfile.gettempdir()) / "batchpilot-best-static")
            name = policies.file_for(trace_label(trace)).name
            got = server.post("/v1/policy/reload", {"name": name})
            log(f"{trace_label(trace)}: policy {got.get('policy_version')} ({name}); best static "
                f"{best.knobs.as_dict()} {best.admission}")
            if args.loads == "sim":
                loads[trace] = find_loads(spec, trace, a, profile, best)
            elif args.loads == "server":
                loads[trace] = find_server_loads(server, trace, best, args, s68_sim, log)
            else:
                loads[trace] = {f"x{float(x):g}": float(x) for x in args.loads.split(",") if x}
            log(f"{trace_label(trace)}: loads {loads[trace]}")
            for load_name, scale in loads[trace].items():
                w = window(trace, scale, a)
                runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
                for k in range(args.repeats):
                    for arm in ARMS[k % len(ARMS):] + ARMS[:k % len(ARMS)]:
                        out = run_arm(server, arm, best, w, args, seed=k)
                        runs[arm].append(out)
                        log(f"  {trace_label(trace)} {load_name} (x{scale:.3g}, {len(w)} "
                            f"requests) {arm} #{k + 1}: interactive {interactive(out):.1%}, "
                            f"shed {out['shed']}, errors {out['errors']}, sources "
                            f"{out['sources']}, decisions {out['decide_us']:.0f} us "
                            f"(load {out['load_1m']:.1f})")
                for arm in ARMS:
                    att = [interactive(r) for r in runs[arm]]
                    rows.append({
                        "trace": trace_label(trace), "load": load_name, "rate_scale": scale,
                        "requests": len(w), "arm": arm,
                        "interactive_attainment": float(np.median(att)),
                        "range": [float(min(att)), float(max(att))],
                        "shed": [r["shed"] for r in runs[arm]],
                        "errors": [r["errors"] for r in runs[arm]],
                        "status_5xx": [r["status_5xx"] for r in runs[arm]],
                        "cut": [r["cut"] for r in runs[arm]],
                        "conserved": all(r["conserved"] for r in runs[arm]),
                        "sources": [r["sources"] for r in runs[arm]],
                        "decide_us": [r["decide_us"] for r in runs[arm]],
                        "load_1m": [r["load_1m"] for r in runs[arm]]})
    finally:
        server.proc.stop()
    return {"figure": "attainment", "rows": rows, "loads": loads, "repeats": args.repeats,
            "window_s": args.window_s, "admission": args.admission}


def table_attainment(result: dict) -> str:
    lines = ["| trace | load | arm | interactive (range) | shed | errors / 5xx / cut | "
             "conserved | decisions | decision us (mean per run) | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lo, hi = r["range"]
        src = "; ".join(", ".join(f"{k} {v}" for k, v in s.items()) for s in r["sources"])
        lines.append(
            f"| {r['trace']} | {r['load']} (x{r['rate_scale']:.3g}, {r['requests']}) | "
            f"{r['arm']} | {r['interactive_attainment']:.1%} ({lo:.1%}-{hi:.1%}) | "
            f"{'/'.join(map(str, r['shed']))} | {sum(r['errors'])} / {sum(r['status_5xx'])} / "
            f"{sum(r['cut'])} | {'yes' if r['conserved'] else 'NO'} | {src} | "
            f"{', '.join(f'{x:.0f}' for x in r.get('decide_us', []))} | "
            f"{'-'.join(f'{x:.0f}' for x in (min(r['load_1m']), max(r['load_1m'])))} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- cost
def poisson_window(args: Args, seed: int = 0):
    from env.traces import LogNormalLengths, poisson

    return poisson(args.rate, args.cost_seconds, seed=seed,
                   prompt=LogNormalLengths(mean=260.0, p99=1024.0, max_tokens=1024),
                   output=LogNormalLengths(mean=30.0, p99=128.0, max_tokens=128))


COST_ARMS = ("vllm", "released", "held")
"""the cost figure's servers: vLLM alone; vLLM with batchpilot holding static knobs, the batch
window released (requests enter vLLM's queue as they arrive, as without batchpilot: the
controller's own cost); the same with the window held at its floor of 5 ms (the knob's cost)"""


def figure_cost(args: Args, log) -> dict:
    from runtime.knobs import KNOB_SPEC_BY_NAME

    model = tiny_model(args)
    ratio_top = KNOB_SPEC_BY_NAME["kv_cache_ratio"].high
    held = {"CONTROLLER": "static", "STATIC_BATCH_WINDOW_MS": "5",
            "STATIC_PREFILL_CHUNK_TOKENS": str(args.max_num_batched_tokens),
            "STATIC_KV_CACHE_RATIO": str(ratio_top)}
    servers: dict[str, Any] = {}
    runs: dict[str, list[dict]] = {arm: [] for arm in COST_ARMS}
    w = poisson_window(args)
    try:
        for arm in COST_ARMS:
            if arm == "vllm":
                servers[arm] = start(model, args, controller=False)
            else:
                servers[arm] = start(model, args, settings={
                    **held, "HOLD_WINDOW": str(arm == "held").lower()})
            log(f"{arm} answered after {servers[arm].ready_s:.0f} s")
        for k in range(args.repeats):
            # every arm first, second and last in turn
            first = k % len(COST_ARMS)
            order = COST_ARMS[first:] + COST_ARMS[:first]
            if k % 2:
                order = order[::-1]
            for arm in order:
                out = replay(servers[arm].url, model, w, args, seed=0)
                runs[arm].append(out)
                log(f"  {arm} #{k + 1}: TTFT p50 {out['ttft_p50_s'] * 1e3:.1f} ms p99 "
                    f"{out['ttft_p99_s'] * 1e3:.1f} ms, TPOT p50 {out['tpot_p50_s'] * 1e3:.2f} "
                    f"ms p99 {out['tpot_p99_s'] * 1e3:.2f} ms, errors {out['errors']} "
                    f"(load {out['load_1m']:.1f})")
                time.sleep(2.0)
        states = {arm: Server(servers[arm], model).state() for arm in COST_ARMS[1:]}
    finally:
        for server in servers.values():
            server.stop()
    keys = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
    med = {arm: {k: float(np.median([r[k] for r in rs])) for k in keys}
           for arm, rs in runs.items()}
    spread = {arm: {k: [float(min(r[k] for r in rs)), float(max(r[k] for r in rs))]
                    for k in keys} for arm, rs in runs.items()}
    # ratios to vLLM alone of each repeat's runs (the arms of one repeat run back to back)
    pairs = {arm: {k: [b[k] / a[k] for a, b in zip(runs["vllm"], runs[arm])] for k in keys}
             for arm in COST_ARMS[1:]}
    return {"figure": "cost", "arms": list(COST_ARMS), "median": med, "range": spread,
            "ratio": {arm: {k: med[arm][k] / med["vllm"][k] for k in keys}
                      for arm in COST_ARMS[1:]},
            "pair_ratios": pairs, "requests": len(w), "repeats": args.repeats,
            "errors": {arm: sum(r["errors"] + r["status_5xx"] for r in rs)
                       for arm, rs in runs.items()},
            "load_1m": {arm: [r["load_1m"] for r in rs] for arm, rs in runs.items()},
            "window_held": {arm: st["window_held"] for arm, st in states.items()},
            "decisions": {arm: st["decisions"] for arm, st in states.items()}}


def table_cost(result: dict) -> str:
    lines = ["| figure | vLLM alone (range) | batchpilot, window released (range) | ratio | "
             "per repeat | batchpilot, window held at 5 ms (range) | ratio | per repeat |",
             "|---|---|---|---|---|---|---|---|"]
    for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
        cells = [f"{k[:4].upper()} {k[5:8]}"]
        for arm in COST_ARMS:
            m, (lo, hi) = result["median"][arm][k], result["range"][arm][k]
            cells.append(f"{m * 1e3:.2f} ms ({lo * 1e3:.2f}-{hi * 1e3:.2f})")
            if arm != "vllm":
                cells.append(f"{result['ratio'][arm][k]:.3f}")
                cells.append(", ".join(f"{x:.3f}" for x in result["pair_ratios"][arm][k]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- faults
def figure_faults(args: Args, log) -> dict:
    from runtime.decider.policy_set import POLICY_SET_FILE, PolicySet

    if not RAISING_POLICY.is_file():
        raise SystemExit(f"the faults figure needs {RAISING_POLICY} (a source checkout)")
    model = tiny_model(args)
    folder = Path(tempfile.mkdtemp(prefix="batchpilot-faults-"))
    (folder / "policy.onnx").write_bytes(b"not an ONNX model\n" * 64)
    good = PolicySet.load(shipped_policy_dir() / POLICY_SET_FILE).file_for("azure-conv")
    shutil.copy(good, folder / "live.onnx")
    shutil.copy(good, folder / "good.onnx")
    shutil.copy(RAISING_POLICY, folder / "raises.onnx")
    shutil.copy(SLOW_POLICY, folder / "slow.onnx")
    server = Server(start(model, args, settings={
        "POLICY_DIR": str(folder), "POLICY_FILE": "policy.onnx", "RELOAD_POLL_S": "0.5",
        "BREAKER_TRIP_AFTER": "0"}), model)
    interval = server.state()["interval_s"]
    rows = []

    def under_load(seconds: float, action) -> tuple[dict, dict]:
        """A steady stream while ``action`` runs; (the stream's summary, what action saw)."""
        w = poisson_window(dataclasses.replace(args, cost_seconds=seconds), seed=len(rows))
        seen: dict = {}
        t = threading.Thread(target=lambda: seen.update(action()))
        t.start()
        out = replay(server.proc.url, model, w, args, seed=len(rows))
        t.join()
        return out, seen

    def visible(pattern: str, t0: float, ticks0: int) -> dict:
        """Poll the metrics until ``pattern`` shows; the seconds and intervals it took."""
        while True:
            text = server.metrics()
            m = re.search(pattern, text, re.M)
            if m is not None and float(m.group(1)) > 0:
                s = server.state()
                return {"after_s": time.time() - t0, "after_intervals": s["ticks"] - ticks0}
            if time.time() - t0 > 120:
                return {"after_s": math.inf, "after_intervals": None}
            time.sleep(0.02)

    try:
        s = server.state()
        first = s["first_decision_unix"] - server.proc.started
        rows.append({"phase": "corrupt policy at start", "fallback": "pid (model corrupt)",
                     "visible_after": f"first decision {first:.0f} s after the launch, "
                                      f"{server.proc.ready_s:.0f} s to vLLM answering",
                     **phase(under_load(5.0, lambda: {})[0])})

        def reload_good() -> dict:
            t0, ticks = time.time(), server.state()["ticks"]
            server.post("/v1/policy/reload", {"name": "live.onnx"})
            return visible(r'^batchpilot_vllm_last_decision\{reason="",source="policy"\} (\S+)',
                           t0, ticks)
        out, seen = under_load(8.0, reload_good)
        rows.append({"phase": "good policy reloaded", "fallback": "policy decides",
                     "visible_after": seen, **phase(out)})

        def garbage() -> dict:
            t0, ticks = time.time(), server.state()["ticks"]
            tmp = folder / "live.tmp"
            tmp.write_bytes(os.urandom(4096))
            os.replace(tmp, folder / "live.onnx")
            return visible(r'^batchpilot_vllm_policy_reloads_total\{outcome="model corrupt"\} '
                           r'(\S+)', t0, ticks)
        out, seen = under_load(8.0, garbage)
        s = server.state()
        rows.append({"phase": "live policy file replaced by garbage",
                     "fallback": f"old policy kept ({s['policy']['version']}, last decision by "
                                 f"{s['last_decision']['source']})",
                     "visible_after": seen, **phase(out)})

        def from_static(name: str, reason: str) -> Callable[[], dict]:
            def act() -> dict:
                server.post("/v1/controller", {"controller": "static"})
                server.wait(lambda s: s["controller"] == "static"
                            and s["knobs"] == s["static_knobs"])
                server.post("/v1/policy/reload", {"name": name})
                t0, ticks = time.time(), server.state()["ticks"]
                server.post("/v1/controller", {"controller": "policy"})
                return visible(r'^batchpilot_vllm_fallbacks_total\{reason="' + reason
                               + r'"\} (\S+)', t0, ticks)
            return act
        out, seen = under_load(8.0, from_static("raises.onnx", "policy error"))
        rows.append({"phase": "a policy that raises in serving", "fallback": "pid (policy error)",
                     "visible_after": seen, **phase(out)})
        out, seen = under_load(8.0, from_static("slow.onnx", "policy slow"))
        slow = server.state()["policy"]["slow_guard"]
        rows.append({"phase": "a policy slower than the decision limit in serving",
                     "fallback": f"pid (policy slow) after {slow['slow_decisions']} slow "
                                 f"decisions (the slowest {slow['slowest_s'] * 1e3:.0f} ms)",
                     "visible_after": seen, **phase(out)})
    finally:
        server.proc.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return {"figure": "faults", "rows": rows, "interval_s": interval}


def phase(out: dict) -> dict:
    return {"sent": out["sent"], "completed": out["completed"], "shed": out["shed"],
            "failed": out["errors"] + out["status_5xx"] + out["cut"] + out["refused"],
            "conserved": out["conserved"], "load_1m": out["load_1m"]}


def table_faults(result: dict) -> str:
    lines = ["| fault | what decides | visible in the metrics after | requests sent / "
             "completed / failed | load avg |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        v = r["visible_after"]
        when = v if isinstance(v, str) else (
            f"{v['after_s']:.2f} s, {v['after_intervals']} interval(s)")
        lines.append(f"| {r['phase']} | {r['fallback']} | {when} | {r['sent']} / "
                     f"{r['completed']} / {r['failed']} | {r['load_1m']:.1f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- start-up
def figure_startup(args: Args, log) -> dict:
    model = tiny_model(args)
    runs: dict[str, list[dict]] = {"vllm": [], "batchpilot": []}
    for k in range(args.repeats):
        for arm in (("vllm", "batchpilot") if k % 2 == 0 else ("batchpilot", "vllm")):
            load = load1()
            proc = start(model, args, controller=arm == "batchpilot")
            row = {"ready_s": proc.ready_s, "load_1m": load}
            if arm == "batchpilot":
                s = Server(proc, model).wait(lambda s: s["first_decision_unix"] is not None)
                row["first_decision_s"] = s["first_decision_unix"] - proc.started
            proc.stop()
            runs[arm].append(row)
            log(f"  {arm} #{k + 1}: {row} ")
    return {"figure": "startup", "runs": runs}


def table_startup(result: dict) -> str:
    lines = ["| server | vLLM answering, s (each launch) | first decision, s | load avg |",
             "|---|---|---|---|"]
    for arm, rs in result["runs"].items():
        first = ", ".join(f"{r['first_decision_s']:.0f}" for r in rs if "first_decision_s" in r)
        ready = ", ".join(f"{r['ready_s']:.0f}" for r in rs)
        loads = ", ".join(f"{r['load_1m']:.0f}" for r in rs)
        name = "vLLM alone" if arm == "vllm" else "vLLM with batchpilot"
        lines.append(f"| {name} | {ready} | {first or '-'} | {loads} |")
    return "\n".join(lines)


FIGURES = {"attainment": (figure_attainment, table_attainment),
           "cost": (figure_cost, table_cost),
           "faults": (figure_faults, table_faults),
           "startup": (figure_startup, table_startup)}


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    measure, table = FIGURES[args.figure]
    t0 = time.time()

    def log(*parts: object) -> None:
        print(*parts, file=sys.stderr, flush=True)

    log(f"figure {args.figure}, machine load {load1():.1f} on {os.cpu_count()} cores")
    result = measure(args, log)
    result["seconds"] = time.time() - t0
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(table(result))
    print(f"\n({result['seconds'] / 60:.1f} min; machine load {load1():.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
