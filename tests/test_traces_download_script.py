"""scripts/download_traces.py offline: its arguments, its plan, and the write-and-verify path
with a stand-in for the network (the real download needs a network these machines lack)."""

from __future__ import annotations

import importlib.util
import io
import sys
import urllib.request
from pathlib import Path

import pytest

from env.traces.locations import traces_dir

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "download_traces.py"
AZURE_CSV = (b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
             b"2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")


@pytest.fixture
def script(monkeypatch):
    spec = importlib.util.spec_from_file_location("download_traces", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "download_traces", module)  # its dataclass looks it up
    spec.loader.exec_module(module)
    return module


class FakeResponse(io.BytesIO):
    def __init__(self, body: bytes, announced: int | None = None):
        super().__init__(body)
        self.headers = {"Content-Length": str(len(body) if announced is None else announced)}


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the network was used")
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


def serve(monkeypatch, body: bytes, announced: int | None = None) -> list[str]:
    requested: list[str] = []

    def urlopen(url, timeout):
        requested.append(url)
        return FakeResponse(body, announced)
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return requested


def test_defaults_are_both_traces_into_traces_dir(script, monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHPILOT_TRACES_DIR", str(tmp_path))
    args = script.parse_args([])
    assert args.dest == traces_dir() == tmp_path
    assert args.kinds == ("conv", "code")
    assert (args.force, args.dry_run, args.timeout) == (False, False, 60.0)


def test_kind_and_dest_choose_what_and_where(script, tmp_path):
    args = script.parse_args(["--kind", "code", "--kind", "code", "--dest", str(tmp_path)])
    assert args.kinds == ("code",) and args.dest == tmp_path


@pytest.mark.parametrize("argv", [["--kind", "chat"], ["--timeout", "0"]])
def test_bad_arguments_exit_with_usage_error(script, argv):
    with pytest.raises(SystemExit) as caught:
        script.parse_args(argv)
    assert caught.value.code == 2


def test_plan_fetches_the_raw_files_of_the_public_dataset(script, tmp_path):
    base = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
    assert script.plan(tmp_path, ["conv", "code"]) == [
        (base + "AzureLLMInferenceTrace_conv.csv",
         tmp_path / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"),
        (base + "AzureLLMInferenceTrace_code.csv",
         tmp_path / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"),
    ]


def test_dry_run_touches_neither_network_nor_disk(script, no_network, tmp_path, capsys):
    assert script.main(["--dry-run", "--dest", str(tmp_path)]) == 0
    assert "would download https://raw.githubusercontent.com/" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_download_writes_and_verifies_the_file(script, monkeypatch, tmp_path, capsys):
    requested = serve(monkeypatch, AZURE_CSV)
    assert script.main(["--kind", "conv", "--dest", str(tmp_path)]) == 0
    path = tmp_path / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
    assert path.read_bytes() == AZURE_CSV
    assert requested == [script.AZURE_BASE_URL + "AzureLLMInferenceTrace_conv.csv"]
    assert "ok: 2 requests over 4 s" in capsys.readouterr().out
    assert not path.with_name(path.name + ".part").exists()


def test_present_file_is_skipped_but_verified(script, no_network, tmp_path, capsys):
    path = tmp_path / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
    path.parent.mkdir()
    path.write_bytes(AZURE_CSV)
    assert script.main(["--kind", "code", "--dest", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"present, skipped: {path}" in out and "ok: 2 requests" in out


def test_downloaded_file_that_does_not_parse_is_deleted(script, monkeypatch, tmp_path, capsys):
    serve(monkeypatch, b"<html>rate limited</html>\n")
    assert script.main(["--kind", "conv", "--dest", str(tmp_path)]) == 1
    assert "does not parse: AzureLLMInferenceTrace_conv.csv, line 1" in capsys.readouterr().err
    assert list((tmp_path / "azure-llm-2023").iterdir()) == []


def test_truncated_download_leaves_nothing_behind(script, monkeypatch, tmp_path, capsys):
    serve(monkeypatch, AZURE_CSV, announced=len(AZURE_CSV) + 100)
    assert script.main(["--kind", "conv", "--dest", str(tmp_path)]) == 1
    assert "the server announced" in capsys.readouterr().err
    assert list((tmp_path / "azure-llm-2023").iterdir()) == []
