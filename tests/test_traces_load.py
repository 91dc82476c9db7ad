"""load_trace: format detection and dispatch; traces_dir and azure_trace_path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from env.traces.errors import TraceFormatError
from env.traces.load import detect_format, load_trace
from env.traces.locations import azure_trace_path, traces_dir

REPOSITORY_ROOT = Path(__file__).resolve().parents[1]

FILES = {
    "azure": ("conv.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3,4\n"),
    "burstgpt": ("b.csv", "Timestamp,Model,Request tokens,Response tokens\n0,ChatGPT,3,4\n"),
    "plain": ("p.csv", "arrival_s,prompt_tokens,output_tokens\n0,3,4\n"),
    "mooncake": ("m.jsonl", '{"timestamp": 0, "input_length": 3, "output_length": 4}\n'),
}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_format_is_detected_from_the_first_line(tmp_path, fmt):
    path = write(tmp_path, *FILES[fmt])
    assert detect_format(path) == fmt
    trace = load_trace(path, slo_class="batch")
    assert trace.prompt_tokens.tolist() == [3] and trace.output_tokens.tolist() == [4]
    assert trace.slo_class.tolist() == ["batch"]


def test_mooncake_is_detected_whatever_the_extension(tmp_path):
    assert detect_format(write(tmp_path, "trace.txt", FILES["mooncake"][1])) == "mooncake"


def test_header_missing_a_column_reaches_its_reader_which_names_it(tmp_path):
    path = write(tmp_path, "p.csv", "arrival_s,prompt_tokens\n0,3\n")
    message = ("p.csv, line 1, column output_tokens: missing from the header "
               "'arrival_s,prompt_tokens'")
    with pytest.raises(TraceFormatError, match=f"^{re.escape(message)}$"):
        load_trace(path)


def test_unknown_header_is_refused_with_the_known_formats(tmp_path):
    path = write(tmp_path, "x.csv", "time,in,out\n0,1,1\n")
    message = ("x.csv, line 1: cannot tell the trace format from the first line 'time,in,out': "
               "it has the columns of no known CSV format "
               "(azure: TIMESTAMP,ContextTokens,GeneratedTokens; "
               "burstgpt: Timestamp,Request tokens,Response tokens; "
               "plain: arrival_s,prompt_tokens,output_tokens) and is no JSON object (mooncake); "
               "pass fmt= to choose a reader")
    with pytest.raises(TraceFormatError, match=f"^{re.escape(message)}$"):
        load_trace(path)


def test_empty_file_is_refused(tmp_path):
    with pytest.raises(TraceFormatError,
                       match=r"^x\.csv, line 1: empty file; cannot tell the trace format$"):
        load_trace(write(tmp_path, "x.csv", ""))


def test_empty_jsonl_file_reaches_the_mooncake_reader(tmp_path):
    with pytest.raises(TraceFormatError, match=r"^m\.jsonl, line 1: empty file; expected JSON "):
        load_trace(write(tmp_path, "m.jsonl", ""))


def test_fmt_chooses_the_reader(tmp_path):
    path = write(tmp_path, *FILES["plain"])
    with pytest.raises(TraceFormatError, match=r"^p\.csv, line 1, column TIMESTAMP: missing "):
        load_trace(path, fmt="azure")


def test_unknown_fmt_is_refused(tmp_path):
    path = write(tmp_path, *FILES["plain"])
    with pytest.raises(ValueError, match=r"^unknown trace format 'xml'; expected one of azure, "
                                         r"mooncake, burstgpt, plain$"):
        load_trace(path, fmt="xml")


def test_traces_dir_defaults_to_shared_traces_beside_the_repository(monkeypatch):
    monkeypatch.delenv("BATCHPILOT_TRACES_DIR", raising=False)
    assert traces_dir() == REPOSITORY_ROOT.parent / "shared" / "traces"


def test_traces_dir_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHPILOT_TRACES_DIR", str(tmp_path))
    assert traces_dir() == tmp_path


def test_azure_trace_path_finds_the_file_under_traces_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHPILOT_TRACES_DIR", str(tmp_path))
    path = tmp_path / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
    path.parent.mkdir()
    path.write_text(FILES["azure"][1])
    assert azure_trace_path("code") == path


def test_missing_azure_trace_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHPILOT_TRACES_DIR", str(tmp_path))
    path = tmp_path / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
    message = (f"{path} not found; run `batchpilot download-traces` to download the "
               f"Azure traces into {tmp_path}, or set BATCHPILOT_TRACES_DIR to a folder that "
               "holds azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(message)}$"):
        azure_trace_path("conv")


def test_unknown_azure_trace_kind_is_refused():
    with pytest.raises(ValueError, match=r"^unknown Azure trace kind 'chat'; expected one of "
                                         r"conv, code$"):
        azure_trace_path("chat")
