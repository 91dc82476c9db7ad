"""Bad input is refused with a TraceFormatError naming the file, the line and the column."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from env.traces.azure import read_azure
from env.traces.burstgpt import read_burstgpt
from env.traces.errors import TraceFormatError
from env.traces.mooncake import read_mooncake
from env.traces.plain_csv import read_plain_csv

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"

CASES = [
    # (reader, file name, contents, the exact message)
    pytest.param(read_azure, "conv.csv", "",
                 "conv.csv, line 1: empty file; expected a header with columns "
                 "TIMESTAMP,ContextTokens,GeneratedTokens[,slo_class]", id="azure-empty-file"),
    pytest.param(read_azure, "conv.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n",
                 "conv.csv, line 1, column GeneratedTokens: missing from the header "
                 "'TIMESTAMP,ContextTokens'", id="azure-missing-column"),
    pytest.param(read_azure, "conv.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP\n",
                 "conv.csv, line 1, column TIMESTAMP: named twice in the header "
                 "'TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP'",
                 id="azure-duplicate-column"),
    pytest.param(read_azure, "conv.csv", HEADER,
                 "conv.csv, line 2: no requests: the file has no rows", id="azure-header-only"),
    pytest.param(read_azure, "conv.csv", HEADER + ROW + "2023-11-16 18:15:47.0,12\n",
                 "conv.csv, line 3, column GeneratedTokens: expected 3 fields "
                 "(TIMESTAMP,ContextTokens,GeneratedTokens), got 2", id="azure-too-few-fields"),
    pytest.param(read_azure, "conv.csv", HEADER + ROW + "2023-11-16 18:15:47.0,12,3,4\n",
                 "conv.csv, line 3, column 4: expected 3 fields "
                 "(TIMESTAMP,ContextTokens,GeneratedTokens), got 4", id="azure-too-many-fields"),
    pytest.param(read_azure, "AzureLLMInferenceTrace_conv.csv",
                 HEADER + ROW * 15 + "2023-11-16 18:15:47.0,abc,3\n",
                 "AzureLLMInferenceTrace_conv.csv, line 17, column ContextTokens: expected a "
                 "non-negative integer, got 'abc'", id="azure-non-numeric"),
    pytest.param(read_azure, "conv.csv", HEADER + ROW + "2023-11-16 18:15:47.0,12,-5\n",
                 "conv.csv, line 3, column GeneratedTokens: expected a non-negative integer, "
                 "got '-5'", id="azure-negative"),
    pytest.param(read_azure, "conv.csv", HEADER + "2023-11-16 18:15:47.0,12.5,5\n",
                 "conv.csv, line 2, column ContextTokens: expected a non-negative integer, "
                 "got '12.5'", id="azure-fraction"),
    pytest.param(read_azure, "conv.csv", HEADER + "2023-11-16 18:15:47.0,,5\n",
                 "conv.csv, line 2, column ContextTokens: expected a non-negative integer, "
                 "got ''", id="azure-empty-field"),
    pytest.param(read_azure, "conv.csv", HEADER + ROW + "2023/11/16 18:15:47.0,1,1\n",
                 "conv.csv, line 3, column TIMESTAMP: expected a timestamp "
                 "YYYY-MM-DD HH:MM:SS.fffffff, got '2023/11/16 18:15:47.0'",
                 id="azure-malformed-timestamp"),
    pytest.param(read_azure, "conv.csv", HEADER + ROW + "2023-11-16 18:15:47.0+00:00,1,1\n",
                 "conv.csv, line 3, column TIMESTAMP: expected a timestamp "
                 "YYYY-MM-DD HH:MM:SS.fffffff, got '2023-11-16 18:15:47.0+00:00'",
                 id="azure-timestamp-with-zone"),
    pytest.param(read_azure, "conv.csv", HEADER + ROW + "2023-13-16 18:15:47.0,1,1\n",
                 "conv.csv, line 3, column TIMESTAMP: not a valid date and time: "
                 "'2023-13-16 18:15:47.0' (Month out of range in datetime string "
                 "\"2023-13-16 18:15:47.0\")", id="azure-month-13"),
    pytest.param(read_azure, "conv.csv", HEADER + ROW + "\n" + ROW,
                 "conv.csv, line 3: blank line before the row on line 4", id="azure-blank-line"),
    pytest.param(read_azure, "conv.csv", HEADER + "2023-11-16 18:15:47.0,0,1\n"
                 "2023-11-16 18:15:48.0,5,0\n",
                 "conv.csv, line 4: no requests: all 2 rows were skipped by rule: "
                 "1 zero_prompt_tokens (engine cannot serve), "
                 "1 zero_output_tokens (engine cannot serve)", id="azure-all-rows-skipped"),
    pytest.param(read_mooncake, "mc.jsonl", "",
                 "mc.jsonl, line 1: empty file; expected JSON lines with keys timestamp, "
                 "input_length, output_length", id="mooncake-empty-file"),
    pytest.param(read_mooncake, "mc.jsonl",
                 '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
                 '{"timestamp": 0, "input_length": 1\n',
                 "mc.jsonl, line 2, column 35: invalid JSON: Expecting ',' delimiter",
                 id="mooncake-invalid-json"),
    pytest.param(read_mooncake, "mc.jsonl", "[1, 2]\n",
                 "mc.jsonl, line 1: expected a JSON object, got list", id="mooncake-not-object"),
    pytest.param(read_mooncake, "mc.jsonl", '{"timestamp": 0, "input_length": 1}\n',
                 "mc.jsonl, line 1, column output_length: missing (the object has timestamp, "
                 "input_length)", id="mooncake-missing-key"),
    pytest.param(read_mooncake, "mc.jsonl",
                 '{"timestamp": 0, "input_length": -3, "output_length": 1}\n',
                 "mc.jsonl, line 1, column input_length: expected a non-negative integer, "
                 "got -3", id="mooncake-negative"),
    pytest.param(read_mooncake, "mc.jsonl",
                 '{"timestamp": 0, "input_length": "12", "output_length": 1}\n',
                 "mc.jsonl, line 1, column input_length: expected a non-negative integer, "
                 "got '12'", id="mooncake-string-length"),
    pytest.param(read_mooncake, "mc.jsonl",
                 '{"timestamp": true, "input_length": 1, "output_length": 1}\n',
                 "mc.jsonl, line 1, column timestamp: expected a non-negative number of "
                 "milliseconds, got True", id="mooncake-bool-timestamp"),
    pytest.param(read_mooncake, "mc.jsonl",
                 '{"timestamp": -1, "input_length": 1, "output_length": 1}\n',
                 "mc.jsonl, line 1, column timestamp: expected a non-negative number of "
                 "milliseconds, got -1", id="mooncake-negative-timestamp"),
    pytest.param(read_mooncake, "mc.jsonl",
                 '{"timestamp": 0, "input_length": 1, "output_length": 1}\n\n'
                 '{"timestamp": 1, "input_length": 1, "output_length": 1}\n',
                 "mc.jsonl, line 2: blank line before the request on line 3",
                 id="mooncake-blank-line"),
    pytest.param(read_burstgpt, "b.csv", "Timestamp,Model,Request tokens\n1,ChatGPT,3\n",
                 "b.csv, line 1, column Response tokens: missing from the header "
                 "'Timestamp,Model,Request tokens'", id="burstgpt-missing-column"),
    pytest.param(read_burstgpt, "b.csv",
                 "Timestamp,Request tokens,Response tokens\n1,2,3\nsoon,2,3\n",
                 "b.csv, line 3, column Timestamp: expected a non-negative number of seconds, "
                 "got 'soon'", id="burstgpt-non-numeric-timestamp"),
    pytest.param(read_burstgpt, "b.csv",
                 "Timestamp,Request tokens,Response tokens\n-1,2,3\n",
                 "b.csv, line 2, column Timestamp: expected a non-negative number of seconds, "
                 "got '-1'", id="burstgpt-negative-timestamp"),
    pytest.param(read_burstgpt, "b.csv",
                 'Timestamp,Model,Request tokens,Response tokens\n1,"Chat\nGPT",2,3\n2,x,y,3\n',
                 "b.csv, line 4, column Request tokens: expected a non-negative integer, "
                 "got 'y'", id="burstgpt-line-after-multiline-field"),
    pytest.param(read_burstgpt, "b.csv",
                 "Timestamp,Request tokens,Response tokens\n1,2,0\n2,3,0\n",
                 "b.csv, line 4: no requests: all 2 rows were skipped by rule: "
                 "2 zero_response_tokens (failed request)", id="burstgpt-all-failed"),
    pytest.param(read_plain_csv, "p.csv", "arrival_s,prompt_tokens,output_tokens,slo_clas\n",
                 "p.csv, line 1, column slo_clas: unknown column; expected "
                 "arrival_s,prompt_tokens,output_tokens[,slo_class]", id="plain-unknown-column"),
    pytest.param(read_plain_csv, "p.csv",
                 "arrival_s,prompt_tokens,output_tokens,slo_class\n0,1,1,\n",
                 "p.csv, line 2, column slo_class: expected a name, got ''",
                 id="plain-empty-class"),
    pytest.param(read_plain_csv, "p.csv", "arrival_s,prompt_tokens,output_tokens\nnan,1,1\n",
                 "p.csv, line 2, column arrival_s: expected a non-negative number of seconds, "
                 "got 'nan'", id="plain-nan-arrival"),
    pytest.param(read_plain_csv, "p.csv", "arrival_s,prompt_tokens,output_tokens\ninf,1,1\n",
                 "p.csv, line 2, column arrival_s: expected a non-negative number of seconds, "
                 "got 'inf'", id="plain-infinite-arrival"),
]


@pytest.mark.parametrize("reader, name, text, message", CASES)
def test_bad_input_is_refused_naming_file_line_and_column(
        tmp_path: Path, reader: Callable, name: str, text: str, message: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TraceFormatError, match=f"^{re.escape(message)}$"):
        reader(path)


def test_error_carries_file_line_and_column_as_attributes(tmp_path):
    path = tmp_path / "conv.csv"
    path.write_text(HEADER + ROW + "2023-11-16 18:15:47.0,abc,3\n")
    with pytest.raises(TraceFormatError) as caught:
        read_azure(path)
    error = caught.value
    assert (error.path, error.line, error.column) == (path, 3, "ContextTokens")
    assert error.problem == "expected a non-negative integer, got 'abc'"
    assert isinstance(error, ValueError)


def test_text_that_is_not_utf8_is_refused_with_its_line(tmp_path):
    path = tmp_path / "conv.csv"
    path.write_bytes((HEADER + ROW).encode() + b"2023-11-16 18:15:47.0,\xff,3\n")
    message = ("conv.csv, line 3: not UTF-8 text: invalid start byte "
               "(byte 0xff at byte 23 of the line)")
    with pytest.raises(TraceFormatError, match=f"^{re.escape(message)}$"):
        read_azure(path)


def test_mooncake_text_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_bytes(b'{"timestamp": 0, "input_length": 1, "output_length": 1}\n\xff\n')
    message = ("mc.jsonl, line 2: not UTF-8 text: invalid start byte "
               "(byte 0xff at byte 1 of the line)")
    with pytest.raises(TraceFormatError, match=f"^{re.escape(message)}$"):
        read_mooncake(path)
