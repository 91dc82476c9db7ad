"""SLO classes from every trace format, the mixed workload and the co-tenant's demand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from env.traces.cotenant import cotenant_demand
from env.traces.errors import TraceFormatError
from env.traces.load import load_trace
from env.traces.mixed import BatchDrops, batch_drops, mixed
from env.traces.resolve import resolve_trace, trace_label
from env.traces.synthetic import default_trace

FILES = {
    "azure": ("conv.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,slo_class\n"
              "2023-11-16 18:15:46.68,3,4,interactive\n2023-11-16 18:15:47.68,5,6,batch\n"),
    "burstgpt": ("b.csv", "Timestamp,Model,Request tokens,Response tokens,slo_class\n"
                 "0,ChatGPT,3,4,interactive\n1,ChatGPT,5,6,batch\n"),
    "mooncake": ("m.jsonl", '{"timestamp": 0, "input_length": 3, "output_length": 4}\n'
                 '{"timestamp": 1000, "input_length": 5, "output_length": 6, '
                 '"slo_class": "batch"}\n'),
    "plain": ("p.csv", "arrival_s,prompt_tokens,output_tokens,slo_class\n"
              "0,3,4,interactive\n1,5,6,batch\n"),
}


@pytest.mark.parametrize("fmt", FILES)
def test_every_format_reads_an_slo_class_per_request(tmp_path: Path, fmt: str):
    name, text = FILES[fmt]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    trace = load_trace(path)
    assert trace.slo_class.tolist() == ["interactive", "batch"]
    assert trace.prompt_tokens.tolist() == [3, 5]


def test_an_empty_class_in_a_mooncake_line_is_refused_naming_line_and_key(tmp_path: Path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 3, "output_length": 4, "slo_class": ""}\n')
    with pytest.raises(TraceFormatError, match=r"m.jsonl, line 1, column slo_class: expected a "
                                               r"class name, got ''$"):
        load_trace(path)


def test_batch_drops_land_on_schedule_with_every_request_in_the_batch_class():
    t = batch_drops(3600.0, BatchDrops(every_s=1200.0, first_s=300.0, size=100, spread_s=2.0))
    assert len(t) == 300 and set(t.slo_class.tolist()) == {"batch"}
    for start in (300.0, 1500.0, 2700.0):
        assert int(((t.arrival_s >= start) & (t.arrival_s < start + 2.0)).sum()) == 100


def test_mixed_puts_the_drops_on_an_interactive_trace_in_one_arrival_order():
    base = default_trace(duration_s=1800.0)
    t = mixed(base)
    assert len(t) == len(base) + 2 * 800  # drops at 300 s and 1500 s
    assert (t.slo_class == "batch").sum() == 1600
    assert np.all(np.diff(t.arrival_s) >= 0)
    same = resolve_trace("mixed:synthetic")
    assert len(same) == len(mixed(default_trace())) and trace_label("mixed:synthetic") == \
        "mixed-synthetic"


def test_co_tenant_demand_swings_around_its_mean_with_spikes():
    d = cotenant_demand(3600.0, mean_gib=6.0, amplitude=0.5, spikes_per_hour=0.0)
    assert d.gib.min() == pytest.approx(3.0) and d.gib.max() == pytest.approx(9.0, rel=1e-4)
    spiky = cotenant_demand(3600.0, seed=1)
    assert spiky.gib.max() > 9.0 and "spikes_per_hour=6" in spiky.source
