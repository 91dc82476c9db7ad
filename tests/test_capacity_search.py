"""Best static and hindsight static by capacity, and the oracle that bounds them, on a real window
(two minutes of the Azure code trace): every setting's capacity is the arena's own, pruned ones
are proven below the top, hindsight static is at least best static's setting there, and the
oracle is at least both at every load and in capacity at 99% and at 90%."""

from __future__ import annotations

import pytest

from agents.arena import controller_row, find_capacity, summary_at
from agents.controllers.best_static import BestStatic, BestStaticController, parse_grid
from agents.controllers.capacity_search import TOP, capacity_static, probe, rank
from agents.oracle import OracleConfig
from agents.registry import EvalSpec, best_static, hindsight_search, hindsight_static
from env.engine_choice import EngineChoice
from env.traces.locations import azure_trace_path, traces_dir
from env.traces.plain_csv import write_plain_csv
from env.traces.resolve import resolve_trace
from env.traces.transforms import time_window
from runtime.engine.admission import AdmissionPolicy
from runtime.knobs import Knobs
from runtime.locations import CHECKPOINTS_DIR_ENV
from tests.test_arena_figures import private_checkpoints

GRID = parse_grid("window=5;chunk=1024,2048;ratio=0.5,0.95")
CONFIG = EngineChoice(admission=AdmissionPolicy.SHED, admission_slack=0.5,
                      cotenant=True).engine_config()


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    """(a spec of the window, its private checkpoints folder)."""
    try:
        azure_trace_path("code")
    except FileNotFoundError:
        pytest.skip(f"Azure code trace not found in {traces_dir()}")
    tmp = tmp_path_factory.mktemp("capacity")
    w = time_window(resolve_trace("azure-code"), 240.0, 360.0)
    path = write_plain_csv(w, tmp / "code120.csv")
    checkpoints, _ = private_checkpoints(tmp)
    oracle = OracleConfig(period_s=2.0, horizon_s=4.0, candidates="ratio=0.5,0.95",
                          memory_price=0.01)
    # the train split (the whole window: it ends before minute 40), where hindsight static's
    # search is best static's own
    spec = EvalSpec(str(path), "train", None, 0.25, CONFIG, oracle=oracle, static_grid=GRID)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CHECKPOINTS_DIR_ENV, str(checkpoints))
        yield spec, checkpoints


def _capacity(spec: EvalSpec, setting: BestStatic, target: float) -> float:
    c = BestStaticController(setting.knobs, setting.admission)
    return find_capacity(lambda x: summary_at(spec, c, x)["interactive_attainment"], target, {})


def test_a_probe_is_the_arenas_measurement_and_stops_only_on_a_certain_miss(window):
    spec, _ = window
    s = BestStatic(Knobs(5.0, 1024, 0.95, 1.0, 0.5), "shed")
    for scale in (0.5, 1.0, 2.0):
        full = probe(spec, s, scale)
        assert full == summary_at(spec, BestStaticController(s.knobs, s.admission),
                                  scale)["interactive_attainment"]
        early = probe(spec, s, scale, 0.99)
        assert (early is None) is (full < 0.99) and early in (None, full)


def test_every_capacity_is_the_arenas_and_the_rest_are_proven_below_the_top(window):
    spec, checkpoints = window
    found = capacity_static(spec, "train", 0.99, grid=GRID, workers=1, progress=False)
    # cached beside the grid searches
    assert list((checkpoints / "best_static").glob("code120-*-capacity-*.json"))
    table = found["table"]
    assert len(table) >= 5  # the knob grid, then the levers around its best
    top = rank(table)[:TOP]
    assert [e["setting"] for e in top] == [e["setting"] for e in found["top"]]
    for e in table:
        true = _capacity(spec, e["setting"], 0.99)
        if e["capacity"] is not None:
            assert e["capacity"] == true
        else:
            assert true < e["below"] <= top[-1]["capacity"]
    best = found["best"]
    assert best["capacity"] == max(_capacity(spec, e["setting"], 0.99) for e in table)
    # ties: at the same capacity, more attainment there, then less KV ratio
    same = [e for e in top if e["capacity"] == best["capacity"]]
    assert all(best["attainment_at_capacity"] >= e["attainment_at_capacity"] for e in same)
    # the cache answers the same
    assert capacity_static(spec, "train", 0.99, grid=GRID, workers=1,
                           progress=False)["best"] == best


def test_hindsight_static_is_never_below_best_static_and_the_oracle_bounds_both(window):
    from agents.oracle_bound import SEARCH, bound_capacity, bound_row, portfolio

    spec, _ = window
    for target in (0.99, 0.90):
        h = hindsight_search(spec, target)
        assert any(e["setting"] == best_static(spec, target=target) for e in h["table"])
        assert h["best"]["capacity"] >= _capacity(spec, best_static(spec, target=target), target)
    arms = portfolio(spec)
    assert set(arms.values()) >= {best_static(spec), hindsight_static(spec)}
    for scale in (0.7, 1.4):
        row = bound_row(spec, scale, False, controller_row)
        assert row["upper_bound"] and row["oracle_run"] in (SEARCH, *arms)
        for name, setting in arms.items():
            own = summary_at(spec, BestStaticController(setting.knobs, setting.admission),
                             scale)["interactive_attainment"]
            assert row["interactive_attainment"] >= own == row["arms"][name]
        assert row["interactive_attainment"] >= row["search"]["interactive_attainment"]
    cap = bound_capacity(spec, {}, summary_at)
    for target, tag in ((0.99, "99"), (0.90, "90")):
        for setting in arms.values():
            assert cap[f"capacity_{tag}"] >= _capacity(spec, setting, target)
        assert cap[f"capacity_{tag}"] >= cap[f"search_capacity_{tag}"]
