"""The Gymnasium environment: retune the knobs of a serving engine every interval."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec

from env.session import RewardWeights, ServingSession
from env.traces import split as split_trace
from env.traces.resolve import resolve_trace
from env.traces.trace import Trace
from env.windows import cut_window, draw_window, window_config
from runtime.decider.guard import DEFAULT_MAX_STEP, slew_limit_one
from runtime.engine.engine import EngineConfig
from runtime.engine.factory import make_executor
from runtime.engine.profile import Profile
from runtime.knobs import (
    DEFAULT_KNOBS,
    KNOB_NAMES,
    KNOB_SPECS,
    NUM_KNOBS,
    action_to_knobs,
    current_action,
)
from runtime.observation import OBS_DIM, OBS_HIGH, OBS_LOW, observation_table
from runtime.session import DEFAULT_INTERVAL_S

_KNOB_ROWS = "\n".join(f"    | {i} | `{k.name}` | {k.low:g} .. {k.high:g} {k.unit}: {k.doc} |"
                       for i, k in enumerate(KNOB_SPECS))


class ServingEnv(gym.Env):
    __doc__ = f"""
    ## Description
    An LLM serving engine (continuous batching, chunked prefill, paged KV cache) replays a
    window of a real or synthetic request trace. Every decision interval the agent sets the
    engine's knobs; the engine then runs for one interval of simulated time (or
    real time with the torch executor) and the agent observes what happened.

    ## Action Space
    ``Box(-1, 1, ({NUM_KNOBS},), float32)``, mapped to knobs by
    :func:`runtime.knobs.action_to_knobs` (each knob on its scale, rounded to its step; the
    chunk to 16 tokens). As in production, the action is first clamped to ``max_step`` action
    units from the current knobs (the decider's slew limit), so a policy trains under the limit
    it will serve under. The admission policy is the engine config's (a deployment setting); the
    slack acts under ``shed`` and ``late_to_back`` only:

    | index | knob | range |
    |---|---|---|
{_KNOB_ROWS}

    ## Observation Space
    ``Box(low, high, ({OBS_DIM},), float32)`` built by :class:`runtime.observation.FeatureBuilder`
    from the last interval's engine stats (the decider builds it the same way in production):

{observation_table()}

    ## Rewards
    Per interval (see :class:`env.session.RewardWeights`):
    ``(met_interactive + batch_weight * met_batch - violation_weight * violations)
    / expected_requests_per_interval - memory_price * kv_cache_ratio
    + cotenant_value * cotenant_served_share - oom_penalty * ooms``, where ``met_*`` count
    completions within their SLO (a batch request: by its deadline) and ``violations`` the requests
    whose miss became certain in the interval (a waiting request that passes its TTFT target counts
    then; shed and expired requests when they are dropped).

    ## Starting State
    A window of ``episode_s`` simulated seconds is drawn from the trace split (its start uniform
    over the split) and compressed by a rate scale drawn log-uniformly from
    ``rate_scale_range``; both come from ``self.np_random`` only. The engine starts with the
    static default knobs (window 5 ms, chunk 2048, ratio 0.9) and runs one interval before the
    first observation. ``options={{"start_s": s, "rate_scale": x}}`` fixes the window.

    ## Episode End
    - Truncation: the window's last request has arrived and its interval is over (requests
      still in flight are then aborted, and not counted as SLO outcomes).
    - Termination: never (serving has no terminal state).

    ## Arguments
    - ``trace``: ``"synthetic"`` (default, the embedded trace), ``"azure-conv"``,
      ``"azure-code"``, a trace file path, or a :class:`env.traces.Trace`
    - ``split``: ``"train"`` (first 40 minutes, default), ``"eval"`` (the rest) or ``"all"``
    - ``episode_s``: window length in simulated seconds after rate scaling (default 120)
    - ``rate_scale_range``: (low, high) of the rate scale (default (0.5, 4))
    - ``interval_s``: decision interval, default {DEFAULT_INTERVAL_S} s (why: see
      :data:`runtime.session.DEFAULT_INTERVAL_S`)
    - ``executor``: ``"sim"`` (the simulated executor, default) or ``"torch"`` (a real
      Llama-architecture model, :class:`runtime.engine.torch_executor.TorchExecutor`; its
      shape, device and memory budget come from ``torch_executor``, default the tiny CPU shape)
      ``"vllm"`` runs a live vLLM engine (``runtime/vllm/``, docs/vllm.md) in wall-clock
      time: ``vllm_server`` a started ``runtime.vllm.engine.VllmServer`` (shared by every
      episode), or ``vllm`` the fields of ``runtime.vllm.engine.VllmSettings`` to start one on
      the first reset; slow, for evaluation and fine-tuning, not for PPO's millions of steps
    - ``profile``: executor profile path for ``"sim"`` (default: roofline H200 Llama-2-7B)
    - ``max_step``: the slew limit in action units per decision (default: the decider's,
      :data:`runtime.decider.guard.DEFAULT_MAX_STEP`; 2 disables it)
    - ``violation_weight``, ``memory_price``, ``oom_penalty``, ``batch_weight``,
      ``cotenant_value``: reward weights (:class:`env.session.RewardWeights`)
    - ``engine_config``: an :class:`runtime.engine.engine.EngineConfig` (limits, SLO classes)
    - ``render_mode``: ``None`` or ``"ansi"``
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    _spec: EnvSpec | None = None

    @property  # type: ignore[override]
    def spec(self) -> EnvSpec | None:
        """The registration spec; with a real engine (``torch``, ``vllm``) marked
        ``nondeterministic``: its intervals are wall-clock time, so one seed does not give one
        episode (gymnasium's checker then skips its determinism checks, as it intends)."""
        return self._spec

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        if (value is not None and getattr(self, "executor_kind", "sim") != "sim"
                and not value.nondeterministic):
            value = dataclasses.replace(value, nondeterministic=True)
        self._spec = value

    def __init__(self, trace: str | Trace = "synthetic", *, split: str = "train",
                 episode_s: float = 120.0, rate_scale_range: tuple[float, float] = (0.5, 4.0),
                 interval_s: float = DEFAULT_INTERVAL_S, executor: str = "sim",
                 profile: str | None = None, torch_executor: dict | None = None,
                 max_step: float = DEFAULT_MAX_STEP,
                 violation_weight: float = RewardWeights.violation_weight,
                 memory_price: float = RewardWeights.memory_price,
                 oom_penalty: float = RewardWeights.oom_penalty,
                 batch_weight: float = RewardWeights.batch_weight,
                 cotenant_value: float = RewardWeights.cotenant_value,
                 engine_config: EngineConfig | None = None, trace_seed: int = 0,
                 render_mode: str | None = None, vllm: dict | None = None,
                 vllm_server: Any = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        lo, hi = rate_scale_range
        if not 0 < lo <= hi:
            raise ValueError(f"rate_scale_range must satisfy 0 < low <= high, got {lo}, {hi}")
        if not episode_s > interval_s > 0:
            raise ValueError(f"need episode_s > interval_s > 0, got {episode_s}, {interval_s}")
        if executor not in ("sim", "torch", "vllm"):
            raise ValueError(f"executor must be 'sim', 'torch' or 'vllm', got {executor!r}")
        if executor == "vllm" and vllm_server is None and not (vllm or {}).get("model"):
            raise ValueError("executor 'vllm' needs vllm_server (a started VllmServer) or "
                             "vllm={'model': FOLDER, ...}")
        self.render_mode = render_mode
        full = trace if isinstance(trace, Trace) else resolve_trace(trace, seed=trace_seed)
        self.trace = split_trace(full, split)
        if len(self.trace) < 2:
            raise ValueError(f"trace {self.trace.name!r} ({split}) has {len(self.trace)} "
                             "requests; an episode needs at least 2")
        self.episode_s = episode_s
        self.rate_scale_range = (float(lo), float(hi))
        self.interval_s = interval_s
        if not max_step > 0:
            raise ValueError(f"max_step must be positive, got {max_step}")
        self.executor_kind = executor
        self.torch_executor = dict(torch_executor or {})
        self.vllm_settings = dict(vllm or {})
        self.vllm_server = vllm_server
        self.max_step = max_step
        self.profile = Profile.load(profile) if executor == "sim" else None
        self.engine_config = engine_config
        self.episode_config = engine_config
        """the current episode's engine config: ``engine_config`` with the co-tenant's demand
        from the window's start (:func:`env.windows.window_config`)"""
        self.weights = RewardWeights(violation_weight, memory_price, oom_penalty, batch_weight,
                                     cotenant_value)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(NUM_KNOBS,), dtype=np.float32)
        self.observation_space = spaces.Box(OBS_LOW, OBS_HIGH, dtype=np.float32)
        self.session: ServingSession | None = None
        self.rate_scale = 1.0
        self.start_s = 0.0
        self._last: dict[str, Any] = {}

    # ------------------------------------------------------------------ episode
    def _executor(self):
        if self.executor_kind == "sim":
            return None  # ServingSession builds a simulated one from the profile
        return make_executor("torch", **self.torch_executor)  # torch imported only here

    def _engine(self, window: Trace) -> dict[str, Any]:
        """The ServingSession arguments of the engine: an executor, or a live vLLM engine with
        the window's requests queued (the episode before, if any, aborted first)."""
        if self.executor_kind != "vllm":
            return {"executor": self._executor()}
        from runtime.vllm.engine import VllmPacer, VllmServer, VllmSettings  # vLLM only here

        if self.vllm_server is None:
            self.vllm_server = VllmServer.start(VllmSettings(**self.vllm_settings))
        if self.session is not None and self.session.has_work:
            self.session.abort()
        engine = self.vllm_server.engine(self.engine_config, DEFAULT_KNOBS)
        engine.add_requests(window.arrival_s, window.prompt_tokens, window.output_tokens,
                            window.slo_class)
        return {"engine": (engine, VllmPacer())}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "rate_scale" in options:
            scale = float(options["rate_scale"])
            scale_range = (scale, scale)
        else:
            scale_range = self.rate_scale_range
        if "start_s" in options:
            start = float(options["start_s"])
            scale = scale_range[0] if scale_range[0] == scale_range[1] else math.exp(
                self.np_random.uniform(*np.log(scale_range)))
        else:
            start, scale = draw_window(self.np_random, self.trace, self.episode_s, scale_range)
        window = cut_window(self.trace, start, scale, self.episode_s)
        if len(window) < 2:
            raise ValueError(f"the window of {self.episode_s:g} s at start_s={start:g} "
                             f"(rate scale {scale:g}) holds {len(window)} requests; an episode "
                             "needs at least 2")
        self.rate_scale, self.start_s = scale, start
        self.episode_config = window_config(self.engine_config, start)
        self.session = ServingSession(window, interval_s=self.interval_s, profile=self.profile,
                                      config=self.episode_config, knobs=DEFAULT_KNOBS,
                                      weights=self.weights,
                                      **self._engine(window))  # type: ignore[arg-type]
        # the knobs the engine starts with: the static default's, with the engine config's batch
        # share and admission slack (EngineConfig.start_knobs)
        result = self.session.step(self.session.engine.knobs)
        info = self._info(result)
        return result.observation, info

    def step(self, action):
        session = self.session
        if session is None:
            raise RuntimeError("call reset() before step()")
        values = action.tolist() if hasattr(action, "tolist") else list(action)
        if len(values) != NUM_KNOBS:
            raise ValueError(f"an action has {NUM_KNOBS} components, got {len(values)}")
        current = current_action(session.engine.knobs)
        result = session.step(action_to_knobs(slew_limit_one(values, current, self.max_step)))
        truncated = session.window_over
        info = self._info(result)
        if truncated:
            info["aborted_requests"] = session.abort()
            info["episode_summary"] = session.engine.summary().as_dict()
        return result.observation, float(result.reward), False, truncated, info

    def _info(self, result) -> dict[str, Any]:
        s = result.stats
        duration = s.end_s - s.start_s
        info = {
            "time_s": s.end_s, "rate_scale": self.rate_scale, "window_start_s": self.start_s,
            "slo_attainment": s.slo_attainment, "met": s.met, "violations": s.violations,
            "finished": s.finished, "arrivals": s.arrivals,
            "goodput_rps": s.met / duration if duration > 0 else 0.0,
            "ttft_p99_ratio": s.ttft_p99_ratio, "tpot_p99_ratio": s.tpot_p99_ratio,
            "preemptions": s.preemptions, "ooms": s.ooms, "waiting": s.waiting,
            "running": s.running, "kv_utilization": s.kv_utilization,
            "reward_terms": result.reward_terms,
        }
        info.update(zip(KNOB_NAMES, result.knobs.as_tuple()))
        self._last = info
        return info

    def render(self):
        if self.render_mode != "ansi" or not self._last:
            return None
        i = self._last
        return (f"t={i['time_s']:8.2f}s x{i['rate_scale']:.2f} | window {i['batch_window_ms']:5.0f}"
                f" ms chunk {i['prefill_chunk_tokens']:5d} kv {i['kv_cache_ratio']:.2f} | "
                f"wait {i['waiting']:4d} run {i['running']:3d} kv-used {i['kv_utilization']:.2f}"
                f" | SLO {i['slo_attainment']:.2f} pre {i['preemptions']} oom {i['ooms']}")

