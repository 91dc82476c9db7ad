"""The trace readers on small files: values, time base, sorting, skipped rows, SLO classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from env.traces.azure import read_azure
from env.traces.burstgpt import read_burstgpt
from env.traces.mooncake import read_mooncake
from env.traces.plain_csv import read_plain_csv


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55"""


def test_azure_arrivals_are_seconds_from_first_request(tmp_path):
    trace = read_azure(write(tmp_path, "conv.csv", AZURE))
    np.testing.assert_allclose(trace.arrival_s, [0.0, 4.314579, 4.541877], rtol=0, atol=1e-9)
    assert trace.prompt_tokens.tolist() == [374, 396, 879]
    assert trace.output_tokens.tolist() == [44, 109, 55]
    assert trace.prompt_tokens.dtype == np.int64 and trace.output_tokens.dtype == np.int64
    assert trace.slo_class.tolist() == ["interactive"] * 3
    assert trace.name == "conv" and trace.skipped == {}


def test_azure_source_names_file_and_wall_clock_of_time_zero(tmp_path):
    path = write(tmp_path, "conv.csv", AZURE)
    assert read_azure(path).source == (
        f"{path} (Azure LLM inference CSV; time 0 = 2023-11-16T18:15:46.680590000 wall clock "
        "(no time zone))")


def test_azure_slo_class_is_overridable(tmp_path):
    trace = read_azure(write(tmp_path, "conv.csv", AZURE), slo_class="batch")
    assert trace.slo_class.tolist() == ["batch"] * 3


def test_azure_accepts_trailing_newlines_and_spaces_around_fields(tmp_path):
    text = "TIMESTAMP , ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68, 374 ,44\n\n\n"
    trace = read_azure(write(tmp_path, "conv.csv", text))
    assert trace.prompt_tokens.tolist() == [374]


def test_azure_reads_windows_line_endings(tmp_path):
    text = AZURE.replace("\n", "\r\n") + "\r\n"
    trace = read_azure(write(tmp_path, "conv.csv", text))
    assert trace.output_tokens.tolist() == [44, 109, 55]


def test_quoted_and_unquoted_files_read_alike(tmp_path):
    quoted = "\n".join(",".join(f'"{field}"' for field in line.split(","))
                       for line in AZURE.splitlines())
    one = read_azure(write(tmp_path, "plain.csv", AZURE))
    two = read_azure(write(tmp_path, "quoted.csv", quoted))
    assert one.arrival_s.tolist() == two.arrival_s.tolist()
    assert one.prompt_tokens.tolist() == two.prompt_tokens.tolist()


def test_azure_ignores_other_columns(tmp_path):
    text = "Extra,TIMESTAMP,ContextTokens,GeneratedTokens\nx,2023-11-16 18:15:46,3,4\n"
    assert read_azure(write(tmp_path, "conv.csv", text)).output_tokens.tolist() == [4]


def test_unsorted_rows_are_stably_sorted_and_counted_in_source(tmp_path):
    text = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:00:02.0000000,1,1
2023-11-16 18:00:01.0000000,2,1
2023-11-16 18:00:01.0000000,3,1
2023-11-16 18:00:03.0000000,4,1"""
    trace = read_azure(write(tmp_path, "conv.csv", text))
    assert trace.arrival_s.tolist() == [0.0, 0.0, 1.0, 2.0]
    assert trace.prompt_tokens.tolist() == [2, 3, 1, 4]  # ties keep file order
    assert "re-sorted: 3 rows were out of arrival order" in trace.source
    assert "2023-11-16T18:00:01.000000000" in trace.source


def test_rows_with_zero_tokens_are_skipped_and_counted_per_reason(tmp_path):
    text = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:00:00.0000000,0,5
2023-11-16 18:00:01.0000000,10,5
2023-11-16 18:00:02.0000000,10,0
2023-11-16 18:00:03.0000000,0,0
2023-11-16 18:00:04.0000000,10,5"""
    trace = read_azure(write(tmp_path, "conv.csv", text))
    assert trace.arrival_s.tolist() == [0.0, 3.0]  # re-based on the first served request
    assert trace.skipped == {"zero_prompt_tokens (engine cannot serve)": 2,
                             "zero_output_tokens (engine cannot serve)": 1}
    assert trace.skipped_report() == (
        "conv: skipped 3 rows by rule: 2 zero_prompt_tokens (engine cannot serve), "
        "1 zero_output_tokens (engine cannot serve)")


def test_quoted_field_spanning_lines_keeps_line_numbers(tmp_path):
    text = ('Timestamp,Model,Request tokens,Response tokens\n'
            '1,"Chat\nGPT",10,5\n'
            '2,GPT-4,10,5\n')
    trace = read_burstgpt(write(tmp_path, "b.csv", text))
    assert len(trace) == 2


MOONCAKE = """{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1, 2]}
{"timestamp": 3000, "input_length": 200, "output_length": 0}
{"timestamp": 3000, "input_length": 300, "output_length": 30}
{"timestamp": 6000.5, "input_length": 400, "output_length": 40, "other": "ignored"}
"""


def test_mooncake_timestamps_are_milliseconds(tmp_path):
    trace = read_mooncake(write(tmp_path, "mc.jsonl", MOONCAKE))
    assert trace.arrival_s.tolist() == [0.0, 3.0, 6.0005]
    assert trace.prompt_tokens.tolist() == [100, 300, 400]
    assert trace.output_tokens.tolist() == [10, 30, 40]
    assert trace.skipped == {"zero_output_tokens (engine cannot serve)": 1}
    assert trace.source.endswith("(Mooncake JSONL; time 0 = 0 s in the file)")


def test_mooncake_rebases_to_first_request_and_sorts(tmp_path):
    text = ('{"timestamp": 9000, "input_length": 1, "output_length": 1}\n'
            '{"timestamp": 6000, "input_length": 2, "output_length": 1}\n')
    trace = read_mooncake(write(tmp_path, "mc.jsonl", text), slo_class="batch")
    assert trace.arrival_s.tolist() == [0.0, 3.0]
    assert trace.prompt_tokens.tolist() == [2, 1]
    assert trace.slo_class.tolist() == ["batch", "batch"]
    assert "time 0 = 6 s in the file" in trace.source and "re-sorted: 2 rows" in trace.source


BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
46,ChatGPT,0,0,0,Conversation log
60.5,GPT-4,0,12,12,API log
118,GPT-4,417,276,693,API log
"""


def test_burstgpt_skips_failed_requests_by_rule_and_counts_them(tmp_path):
    trace = read_burstgpt(write(tmp_path, "BurstGPT_1.csv", BURSTGPT))
    assert trace.arrival_s.tolist() == [0.0, 113.0]
    assert trace.prompt_tokens.tolist() == [472, 417]
    assert trace.output_tokens.tolist() == [18, 276]
    # the row with zero request and zero response tokens is a failure, counted once
    assert trace.skipped == {"zero_response_tokens (failed request)": 2,
                             "zero_prompt_tokens (engine cannot serve)": 1}


def test_plain_csv_reads_its_slo_class_column(tmp_path):
    text = "arrival_s,prompt_tokens,output_tokens,slo_class\n0,10,5,interactive\n0.25,20,6,batch\n"
    trace = read_plain_csv(write(tmp_path, "p.csv", text), slo_class="ignored")
    assert trace.arrival_s.tolist() == [0.0, 0.25]
    assert trace.slo_class.tolist() == ["interactive", "batch"]


def test_plain_csv_without_slo_class_uses_the_argument(tmp_path):
    text = "output_tokens,arrival_s,prompt_tokens\n5,2.5,10\n6,3.0,20\n"
    trace = read_plain_csv(write(tmp_path, "p.csv", text), slo_class="batch")
    assert trace.arrival_s.tolist() == [0.0, 0.5]  # re-based to the first request
    assert trace.prompt_tokens.tolist() == [10, 20] and trace.output_tokens.tolist() == [5, 6]
    assert trace.slo_class.tolist() == ["batch", "batch"]
    assert "time 0 = 2.5 s in the file" in trace.source


def test_empty_slo_class_argument_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^slo_class must be a non-empty class name$"):
        read_azure(write(tmp_path, "conv.csv", AZURE), slo_class="")
