"""The lookahead oracle: an upper bound on what run-time control of the engine's levers can buy.

Every ``period_s`` it forks the engine (:meth:`runtime.engine.engine.Engine.fork`: a copy of the
state now, with the future arrivals of the trace known), runs each candidate setting
``horizon_s`` ahead on its own fork, and applies the one that scored best until the next search.
It sees the future, so it is labelled "oracle (upper bound)" wherever it is reported. It is a
receding-horizon greedy search, not a proof of optimality: a setting that pays off only after the
horizon, or a sequence of settings within one horizon, is not searched.

Look ahead. By default (``rollout``) a candidate holds for one period, as a decision does, and
the anchor setting (best static's, in the arena) runs the rest of the horizon: a rollout over a
base policy, so every candidate is judged by what it does in its period and what it leaves
behind, not by holding it longer than it would hold. Measured on the held-out splits against
holding each candidate the whole horizon (attainment gain over best static, same runs otherwise):
azure-code x0.64 +1.66 pt against +0.68, x0.9 +1.28 against +1.36; azure-conv x1.75 +0.19
against -0.13, x1.99 -0.23 against -0.50.

Score. Over the horizon, interactive SLO-meeting completions minus ``violation_weight`` times
interactive violations that became certain, plus ``batch_token_value`` per token of a batch
request finished by its deadline, minus ``memory_price`` per GiB of KV pool held on average.
Violations are counted when they become certain (the engine's interval counters: a waiting
request past its TTFT target counts when it passes it, not when it finishes), so the interactive
part is what SLO attainment is made of, counted on the horizon's events; requests still
undecided at the horizon's end count for nothing. Ties (common in calm traffic, when every
setting serves everything) keep the current setting if it is among the best, otherwise the
earliest candidate: the anchor (best static's setting, put first by the arena), so an oracle that
finds nothing better behaves as best static does.

Candidates. A candidate is a whole :class:`Setting`: the five knobs (``window``, ``chunk``,
``ratio``, ``batch_share``, ``admission_slack`` in a grid) and the value of every extra lever the
grid names (engine settings that are not knobs: the admission policy, ``max_num_seqs``). Levers
are looked up by name in :data:`LEVERS`; a new engine lever becomes searchable by adding a
:class:`Lever` there (how to set it on an engine, its grid) and naming it in
``OracleConfig.candidates``.

The interface the arena and the labeller use is small: :func:`score_setting` (fork an engine,
apply a setting, run to the horizon, score) and :class:`LookaheadOracle` (a controller that reads
the engine of the session it is bound to).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from runtime.decider.decision import Decision, decided_by
from runtime.engine.admission import AdmissionPolicy
from runtime.engine.engine import Engine
from runtime.engine.request import Request, Status
from runtime.knobs import DEFAULT_KNOBS, KNOB_NAMES, Knobs

ORACLE_NAME = "oracle"
"""the oracle's name in the controller registry and on command lines"""
ORACLE_LABEL = "oracle (upper bound)"
"""how every table names the oracle's row: in the arena, the best at every load of the search
anchored on hindsight static and the fixed settings' own runs (:mod:`agents.oracle_bound`), which
bounds them by construction"""
SEARCH_ONLY_NAME = "oracle-search"
"""the controller name of the search anchored on best static, as training's periodic evaluation
runs it: it sees the future, but no bound is proven for a receding-horizon search"""
FORECAST_NAME = "oracle-forecast"
"""the controller name of the oracle's search on forecast arrivals: not an upper bound"""
CAUSAL_NAME = "oracle-causal"
"""the controller name of its search on forecast arrivals and output lengths: it knows nothing a
controller could not"""
SEARCHES: dict[str, tuple[str, str, str]] = {
    ORACLE_NAME: ("trace", "trace", ORACLE_LABEL),
    SEARCH_ONLY_NAME: ("trace", "trace", "oracle's search (no proven bound)"),
    FORECAST_NAME: ("repeat", "trace", "oracle's search, arrivals forecast"),
    CAUSAL_NAME: ("repeat", "forecast", "oracle's search, arrivals and lengths forecast"),
}
"""every controller the oracle's search runs as: name -> (``OracleConfig.arrivals``,
``OracleConfig.output_lengths``, how tables name its row)"""
SEARCH_NAMES = tuple(SEARCHES)
"""every controller name the oracle's search runs under"""
LENGTH_HISTORY_S = 120.0
"""seconds of past arrivals whose finished requests make the output-length forecast"""


@dataclass(frozen=True)
class Lever:
    """A control beyond the knobs that the oracle may set on an engine (a deployment
    setting)."""

    name: str
    """its name in a candidate grid (``name=v1,v2,...``)"""
    doc: str
    """what it sets, with its unit"""
    low: float
    """the smallest value allowed"""
    high: float
    """the largest value allowed"""
    apply: Callable[[Engine, float], None]
    """sets the lever on an engine (a fork or the session's own); must not change state that
    the engine shares with its forks (its config object is shared: replace it, never edit it)"""
    integer: bool = False
    """values are rounded to whole numbers"""
    choices: tuple[str, ...] = ()
    """a categorical lever's values by name: a grid names them, a setting holds the index"""

    def parse(self, text: str) -> float:
        """A grid value: a number, or one of ``choices`` (its index)."""
        text = text.strip()
        if self.choices:
            if text not in self.choices:
                raise ValueError(f"candidates: {self.name}={text!r} is not one of "
                                 f"{', '.join(self.choices)}")
            return float(self.choices.index(text))
        try:
            v = float(text)
        except ValueError:
            raise ValueError(f"candidates: {self.name}={text!r} is not a number") from None
        if not self.low <= v <= self.high:
            raise ValueError(f"candidates: {self.name}={v:g} is outside its range "
                             f"[{self.low:g}, {self.high:g}]")
        return float(round(v)) if self.integer else v

    def show(self, value: float) -> str:
        return self.choices[int(value)] if self.choices else f"{value:g}"


def _set_max_num_seqs(engine: Engine, value: float) -> None:
    if engine.config.max_num_seqs != int(value):
        engine.config = dataclasses.replace(engine.config, max_num_seqs=int(value))


_ADMISSION_CHOICES = tuple(p.value for p in AdmissionPolicy)


def _set_admission(engine: Engine, value: float) -> None:
    mode = _ADMISSION_CHOICES[int(value)]
    if mode != engine.admission:
        engine.set_admission(mode)


LEVERS: dict[str, Lever] = {
    "max_num_seqs": Lever(
        "max_num_seqs", "the most requests running at once (vLLM's max_num_seqs), requests",
        1, 4096, _set_max_num_seqs, integer=True),
    "admission": Lever(
        "admission", "what happens to an interactive request late for its first token",
        0, len(_ADMISSION_CHOICES) - 1, _set_admission, integer=True,
        choices=_ADMISSION_CHOICES),
}
"""Levers the oracle can search besides the knobs, by name."""

_KNOB_KEYS = dict(zip(("window", "chunk", "ratio", *KNOB_NAMES[3:]), KNOB_NAMES))
"""names of the knobs in a candidate grid (short ones for the first three)"""


@dataclass(frozen=True)
class Setting:
    """One candidate: the knobs and a value for each extra lever (by name, sorted)."""

    knobs: Knobs
    """the knobs (all five)"""
    levers: tuple[tuple[str, float], ...] = ()
    """``(name, value)`` of each extra lever in :data:`LEVERS`, sorted by name (a categorical
    lever's value is the index of its choice)"""

    def apply(self, engine: Engine) -> None:
        """Set the knobs and the levers on ``engine``."""
        engine.set_knobs(self.knobs)
        for name, value in self.levers:
            LEVERS[name].apply(engine, value)

    def values(self) -> dict[str, float]:
        """Every value by its full name: the knobs', then the levers'."""
        return {**self.knobs.as_dict(), **dict(self.levers)}

    def label(self) -> str:
        """``window=.. chunk=.. ratio=..``, then the class and admission knobs where they
        differ from the static default's, then the levers."""
        k = self.knobs
        knobs = "".join(f" {n}={getattr(k, n):g}" for n in KNOB_NAMES[3:]
                        if getattr(k, n) != getattr(DEFAULT_KNOBS, n))
        extra = "".join(f" {n}={LEVERS[n].show(v)}" for n, v in self.levers)
        return (f"window={k.batch_window_ms:g} chunk={k.prefill_chunk_tokens} "
                f"ratio={k.kv_cache_ratio:g}{knobs}{extra}")


DEFAULT_CANDIDATES = "window=5;chunk=256,512,1024,2048,4096,8192,16384;ratio=0.95"
"""the first search the oracle ran: every prefill chunk size from 256 to 16384 tokens at a
5 ms window and a 0.95 ratio (best static's window and ratio on both Azure traces)"""


KV_RATIOS: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
"""the KV ratios searched when a co-tenant uses the memory the pool leaves"""
KV_CANDIDATES = "ratio=" + ",".join(f"{r:g}" for r in KV_RATIOS)
"""the co-tenant search: every ratio of :data:`KV_RATIOS`, the other knobs the anchor's (best
static's, in the arena); run it with :data:`KV_MEMORY_PRICE`"""
KV_MEMORY_PRICE = 0.01
"""the memory price of the co-tenant search (``OracleConfig.memory_price``): 100 GiB more KV
pool held on average over a horizon scores as one interactive request less
(scripts/experiments/oracle_headroom.py's kv lever was measured with it)"""


def parse_candidates(spec: str, base: Knobs = DEFAULT_KNOBS) -> list[Setting]:
    """The settings of a grid ``key=v1,v2,...;key=...``: every combination, in order.

    Keys: ``window`` (ms), ``chunk`` (tokens), ``ratio``, ``batch_share``, ``admission_slack``
    (TTFT targets), or a lever of :data:`LEVERS` (``admission``, ``max_num_seqs``). A knob left
    out takes its value in ``base`` (the static default, or the oracle's anchor); a lever left
    out is not set.
    """
    grid: dict[str, list[float]] = {}
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        key, sep, values = part.partition("=")
        key = key.strip()
        if not sep or not values.strip():
            raise ValueError(f"candidates: {part!r} is not key=v1,v2,...")
        if key not in _KNOB_KEYS and key not in LEVERS:
            raise ValueError(f"candidates: unknown key {key!r} (knobs: {', '.join(_KNOB_KEYS)}; "
                             f"levers: {', '.join(sorted(LEVERS)) or 'none'})")
        if key in grid:
            raise ValueError(f"candidates: {key!r} is given twice")
        texts = [v for v in values.split(",") if v.strip()]
        if key in LEVERS:
            grid[key] = [LEVERS[key].parse(v) for v in texts]
            continue
        try:
            grid[key] = [float(v) for v in texts]
        except ValueError:
            raise ValueError(f"candidates: {key}={values!r} holds a value that is not a "
                             "number") from None
    knob_axes = [grid.get(short, [getattr(base, full)]) for short, full in _KNOB_KEYS.items()]
    lever_names = sorted(k for k in grid if k in LEVERS)
    settings = []
    for w, c, r, share, slack, *lv in itertools.product(*knob_axes,
                                                        *(grid[n] for n in lever_names)):
        try:
            knobs = Knobs(float(w), int(c), float(r), float(share), float(slack))
        except ValueError as e:
            raise ValueError(f"candidates: {e}") from None
        settings.append(Setting(knobs, tuple(zip(lever_names, lv))))
    if not settings:
        raise ValueError(f"candidates: {spec!r} names no setting")
    return list(dict.fromkeys(settings))


@dataclass(frozen=True)
class OracleConfig:
    """How the oracle searches."""

    period_s: float = 1.0
    """simulated seconds between searches (rounded to whole decision intervals); the chosen
    setting holds in between"""
    horizon_s: float = 10.0
    """simulated seconds each candidate runs ahead, with the future arrivals known"""
    candidates: str = DEFAULT_CANDIDATES
    """the grid searched, ``key=v1,v2,...;...`` (see :func:`parse_candidates`)"""
    violation_weight: float = 1.0
    """score = met - violation_weight * violations over the horizon (interactive requests)"""
    batch_token_value: float = 1e-4
    """score per token of a batch request finished by its deadline within the horizon (1e-4:
    10,000 batch tokens are worth one interactive request met)"""
    memory_price: float = 0.0
    """score per GiB of KV pool held on average over the horizon (positive when a co-tenant
    can use what the pool leaves; 0 for a dedicated accelerator)"""
    rollout: bool = True
    """each candidate holds for one period, then the anchor (the base setting) runs to the
    horizon's end, as a rollout algorithm does; False holds each candidate the whole horizon
    (without an anchor, candidates always hold the whole horizon)"""
    arrivals: Literal["trace", "repeat"] = "trace"
    """what arrives in the forks: ``trace``, the trace's own future (the upper bound); ``repeat``,
    the last ``horizon_s`` of arrivals again, ``horizon_s`` later (a persistence forecast: the
    same search without sight of the future arrivals, to measure how much of the oracle's gain
    is foresight; it still knows the output lengths of the requests in flight)"""
    output_lengths: Literal["trace", "forecast"] = "trace"
    """how long the requests in the forks run: their true output lengths (``trace``), or a
    forecast from the requests finished so far (``forecast``, :func:`length_forecast`; only
    with ``arrivals`` ``repeat``: then the search knows nothing a controller could not)"""

    def __post_init__(self) -> None:
        for name in ("period_s", "horizon_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"OracleConfig.{name} must be a positive number of seconds, "
                                 f"got {v}")
        if self.arrivals not in ("trace", "repeat"):
            raise ValueError(f"OracleConfig.arrivals must be 'trace' or 'repeat', got "
                             f"{self.arrivals!r}")
        if self.output_lengths not in ("trace", "forecast"):
            raise ValueError(f"OracleConfig.output_lengths must be 'trace' or 'forecast', got "
                             f"{self.output_lengths!r}")
        if self.output_lengths == "forecast" and self.arrivals != "repeat":
            raise ValueError("OracleConfig.output_lengths 'forecast' needs arrivals 'repeat': "
                             "a search that sees the trace's arrivals sees their lengths too")
        if not (math.isfinite(self.violation_weight) and self.violation_weight >= 0):
            raise ValueError("OracleConfig.violation_weight must be a finite number >= 0, got "
                             f"{self.violation_weight}")
        parse_candidates(self.candidates)


def _rollout_to_hold(engine: Engine, setting: Setting, horizon_s: float, hold_s: float | None,
                     tail: Setting | None, arrivals: Sequence[Request] | None,
                     output_tokens: Callable[[Request], int] | None) -> Engine:
    """A fork of ``engine`` with ``setting`` applied and, in a rollout (``hold_s`` shorter than
    the horizon, a ``tail``), run for ``hold_s`` and handed to ``tail``: what is left to run to
    the horizon is the same for every candidate from there."""
    fork = engine.fork(horizon_s, arrivals, output_tokens)
    fork.collect_interval(state=False)  # count from now: the fork inherits the open interval's
    setting.apply(fork)
    if tail is not None and hold_s is not None and hold_s < horizon_s:
        fork.run_until(engine.now + hold_s)
        tail.apply(fork)
    return fork


def _horizon_score(fork: Engine, end_s: float, violation_weight: float,
                   batch_token_value: float, memory_price: float) -> float:
    """Run ``fork`` to ``end_s`` and score its interval (see :func:`score_setting`)."""
    fork.run_until(end_s)
    iv = fork.collect_interval(state=False)
    return (iv.met - iv.batch_met - violation_weight * (iv.violations - iv.batch_violations)
            + batch_token_value * iv.batch_goodput_tokens
            - memory_price * iv.kv_gib_s / max(iv.duration_s, 1e-9))


def score_setting(engine: Engine, setting: Setting, horizon_s: float,
                  violation_weight: float = 1.0, *, hold_s: float | None = None,
                  tail: Setting | None = None, batch_token_value: float = 0.0,
                  memory_price: float = 0.0, arrivals: Sequence[Request] | None = None,
                  output_tokens: Callable[[Request], int] | None = None) -> float:
    """Fork ``engine``, apply ``setting``, run it ``horizon_s`` ahead and score the horizon:
    met - violation_weight * violations. With ``hold_s`` and ``tail``, ``setting`` holds for
    ``hold_s`` only and ``tail`` runs the rest of the horizon. With ``arrivals`` the fork sees
    those arrive instead of the trace's future, and with ``output_tokens`` its requests run as
    long as that forecasts (:meth:`Engine.fork`). ``engine`` is left as it was."""
    fork = _rollout_to_hold(engine, setting, horizon_s, hold_s, tail, arrivals, output_tokens)
    return _horizon_score(fork, engine.now + horizon_s, violation_weight, batch_token_value,
                          memory_price)


@dataclass(frozen=True)
class Search:
    """One search: the setting kept and what every candidate scored."""

    best: Setting
    """the setting kept"""
    scores: tuple[float, ...]
    """each candidate's score, in candidate order"""
    rollouts: int = 0
    """how many candidates' tails were run (the others reached a state already run, and took
    its score)"""


def search(engine: Engine, candidates: Sequence[Setting], horizon_s: float, *,
           violation_weight: float = 1.0, current: Setting | None = None,
           hold_s: float | None = None, tail: Setting | None = None,
           batch_token_value: float = 0.0, memory_price: float = 0.0,
           arrivals: Sequence[Request] | None = None,
           output_tokens: Callable[[Request], int] | None = None) -> Search:
    """Score every candidate on its own fork of ``engine`` (see :func:`score_setting`); keep
    the best (ties: ``current`` if it is among the best, else the earliest).

    In a rollout every candidate hands over to ``tail`` after ``hold_s``; candidates that left
    the engine in the same state there (:meth:`Engine.state_key`: a chunk size no prefill of the
    hold reached, a ratio whose pool nothing filled) have the same tail and the same score, to
    the bit, so a tail is run once per state reached, not once per candidate."""
    end = engine.now + horizon_s
    # states reached, by their hash: a key holds every request's counts and the free block
    # list, and a tuple does not keep its hash, so a dict keyed by the tuples would hash each
    # new one twice (look up, then store)
    scored: dict[int, list[tuple[tuple, float]]] = {}
    num_states = 0
    scores = []
    for s in candidates:
        fork = _rollout_to_hold(engine, s, horizon_s, hold_s, tail, arrivals, output_tokens)
        key = fork.state_key(memory=memory_price != 0)
        same = scored.setdefault(hash(key), [])
        score = next((v for k, v in same if k == key), None)
        if score is None:
            score = _horizon_score(fork, end, violation_weight, batch_token_value, memory_price)
            same.append((key, score))
            num_states += 1
        scores.append(score)
    top = max(scores)
    best = next(s for s, v in zip(candidates, scores) if v == top)
    if current is not None:
        for s, v in zip(candidates, scores):
            if v == top and s == current:
                best = current
                break
    return Search(best, tuple(scores), num_states)


def search_name(config: OracleConfig) -> str:
    """The controller name of the search ``config`` runs (:data:`SEARCHES`)."""
    return next(name for name, (arrivals, lengths, _) in SEARCHES.items()
                if (arrivals, lengths) == (config.arrivals, config.output_lengths))


def search_config(name: str, config: OracleConfig) -> OracleConfig:
    """``config`` with what the search named ``name`` sees (:data:`SEARCHES`)."""
    arrivals, lengths, _ = SEARCHES[name]
    return dataclasses.replace(config, arrivals=arrivals, output_lengths=lengths)


def length_forecast(history: Sequence[Request]) -> Callable[[Request], int]:
    """An output-length forecast from the requests of ``history`` that have finished: a request
    of class ``c`` that has generated ``k`` tokens runs to the mean output length of the
    finished requests of class ``c`` longer than ``k`` (the conditional mean, rounded); with
    none such, to twice what it has (at least one more)."""
    done: dict[str, list[int]] = {}
    for r in history:
        if r.status == Status.FINISHED:
            done.setdefault(r.slo_class, []).append(r.output_tokens)
    tables = {}
    for c, lengths in done.items():
        ordered = np.sort(np.asarray(lengths, dtype=np.int64))
        # tail[i]: the sum of ordered[i:] (tail[n] = 0)
        tail = np.concatenate((np.cumsum(ordered[::-1])[::-1], [0]))
        tables[c] = (ordered, tail)

    def forecast(r: Request) -> int:
        k = r.num_output_tokens
        table = tables.get(r.slo_class)
        if table is not None:
            ordered, tail = table
            i = int(np.searchsorted(ordered, k, side="right"))
            if i < len(ordered):
                return round(int(tail[i]) / (len(ordered) - i))
        return max(2 * k, k + 1)

    return forecast


class LookaheadOracle:
    """A controller that sees the future: bound to a session, it searches the candidates on
    forks of the session's engine every ``config.period_s`` and keeps the best. With
    ``config.arrivals`` ``repeat`` it does not see the future arrivals, and is no upper bound
    (its name and label are then :data:`SEARCHES`'s for its config: :func:`search_name`).

    :param config: period, horizon, candidate grid and score weight
    :param anchor: a setting put first among the candidates (in the arena hindsight static's for
        the oracle, best static's for the others), so that it wins ties and runs the rest of
        each horizon; knobs the candidate grid leaves out take its values
    :param extra: more whole settings searched beside the grid (the arena's oracle: best
        static's), after the anchor
    :param interval_s: the decision interval of the sessions it will be bound to
    :param name: its controller name (default: :data:`SEARCHES`'s for its config)
    """

    def __init__(self, config: OracleConfig | None = None, *, anchor: Setting | Knobs | None = None,
                 extra: Sequence[Setting] = (), interval_s: float = 0.25,
                 name: str | None = None) -> None:
        self.config = config if config is not None else OracleConfig()
        self.name = name if name is not None else search_name(self.config)
        self.label = SEARCHES[self.name][2]
        if anchor is not None:
            anchor = anchor if isinstance(anchor, Setting) else Setting(anchor)
            # knobs the grid leaves out keep the anchor's (the deployment's batch share, slack)
            candidates = parse_candidates(self.config.candidates, anchor.knobs)
            candidates = list(dict.fromkeys([anchor, *extra, *candidates]))
        else:
            candidates = parse_candidates(self.config.candidates)
        self.anchor: Setting | None = anchor
        self.interval_s = interval_s
        self.candidates: list[Setting] = candidates
        self.every = max(1, round(self.config.period_s / interval_s))
        self._engine: Engine | None = None
        self.current: Setting | None = None
        self.last_search: Search | None = None
        self.searches = 0
        self._calls = 0
        self._decisions: dict[Setting, Decision] = {}

    def bind(self, engine: Engine) -> None:
        """Control ``engine`` (a session's) from now on; forgets the previous one."""
        self._engine = engine
        self.reset()

    def reset(self) -> None:
        self._calls = 0
        self.current = None
        self.last_search = None
        self.searches = 0

    def decide_setting(self) -> Setting:
        """The setting for the next interval (a search every ``every`` calls)."""
        if self._engine is None:
            raise RuntimeError("LookaheadOracle.bind(engine) must be called before it decides: "
                               "the oracle reads the engine, not the observation")
        if self.current is None or self._calls % self.every == 0:
            cfg = self.config
            rollout = cfg.rollout and self.anchor is not None
            arrivals = (self._engine.repeated_arrivals(cfg.horizon_s)
                        if cfg.arrivals == "repeat" else None)
            lengths = (length_forecast(self._engine.arrived_within(LENGTH_HISTORY_S))
                       if cfg.output_lengths == "forecast" else None)
            found = search(self._engine, self.candidates, cfg.horizon_s,
                           violation_weight=cfg.violation_weight, current=self.current,
                           hold_s=self.every * self.interval_s if rollout else None,
                           tail=self.anchor if rollout else None,
                           batch_token_value=cfg.batch_token_value,
                           memory_price=cfg.memory_price, arrivals=arrivals,
                           output_tokens=lengths)
            self.last_search = found
            self.current = found.best
            self.searches += 1
        self._calls += 1
        return self.current

    def decide(self, observation: np.ndarray) -> Decision:
        """The knobs for the next interval. Extra levers of the setting are set on the bound
        engine here, since the session applies only the knobs."""
        setting = self.decide_setting()
        for name, value in setting.levers:
            LEVERS[name].apply(self._engine, value)
        decision = self._decisions.get(setting)
        if decision is None:
            decision = self._decisions[setting] = decided_by(setting.knobs, self.name)
        return decision


def setting_names(candidates: Sequence[Setting]) -> tuple[str, ...]:
    """The columns of a label: the knobs', then every lever any candidate sets."""
    levers = sorted({n for s in candidates for n, _ in s.levers})
    return (*KNOB_NAMES, *levers)


def setting_vector(setting: Setting, names: Sequence[str]) -> np.ndarray:
    """``setting``'s values in the order of ``names`` (NaN for a lever it leaves unset)."""
    values = setting.values()
    return np.array([values.get(n, math.nan) for n in names], dtype=np.float32)
