"""Download the Azure LLM inference traces of 2023 (and Mooncake's) into the traces folder.

    python scripts/download_traces.py                  # both, into traces_dir()
    python scripts/download_traces.py --kind conv --dest /data/traces
    python scripts/download_traces.py --dry-run        # say what it would do; no network

Fetches ``AzureLLMInferenceTrace_conv.csv`` (about 0.7 MB, 19,366 requests) and
``AzureLLMInferenceTrace_code.csv`` (about 0.3 MB, 8,819 requests) from the Azure Public Dataset
(github.com/Azure/AzurePublicDataset, ``data/``) into ``DEST/azure-llm-2023/``, where
:func:`env.traces.azure_trace_path` looks for them. ``DEST`` defaults to
:func:`env.traces.traces_dir` (``../shared/traces`` beside the repository, or
``$BATCHPILOT_TRACES_DIR``). Files already present are skipped (``--force`` fetches them again);
a download goes to a ``.part`` file that is renamed only when complete. Every file, fetched or
present, is then read with the Azure reader and its rows and span are printed; a fetched file
that does not parse is deleted.

The traces are released under CC-BY-4.0. Their documentation asks users to cite Splitwise:
Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase Splitting", ISCA 2024.

``--kind mooncake`` fetches Mooncake's synthetic long-context trace (about 1.1 MB, 3,993
requests; kvcache-ai/Mooncake, ``FAST25-release/traces/synthetic_trace.jsonl``, Apache-2.0; cite
Qin et al., "Mooncake: Trading More Storage for Less Computation", FAST 2025) into
``DEST/mooncake-fast25/``, where ``--trace mooncake`` looks for it.

This script needs the network, so the download itself cannot be tested offline (the project's
machines have none); its tests cover the arguments, the plan and the write-and-verify path with
a stand-in for the network. Run it from the repository root with the package importable
(``pip install -e .`` or ``PYTHONPATH=.``).
"""

from __future__ import annotations

import dataclasses
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from env.traces.errors import TraceFormatError
from env.traces.load import load_trace
from env.traces.locations import AZURE_TRACE_FILES, MOONCAKE_TRACE_FILE, traces_dir

AZURE_BASE_URL = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
"""the raw-file URL of the dataset's ``data/`` folder; a file's URL is this plus its name"""
MOONCAKE_URL = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/"
                "traces/synthetic_trace.jsonl")
"""the raw-file URL of Mooncake's synthetic trace"""
CHUNK_BYTES = 1 << 16
"""bytes read from the network at a time"""


@dataclass
class Args:
    dest: Path | None = None
    """the traces folder to download into (default: traces_dir(), i.e. $BATCHPILOT_TRACES_DIR
    or ../shared/traces)"""
    kinds: Annotated[tuple[Literal["conv", "code", "mooncake"], ...],
                     tyro.conf.UseAppendAction, tyro.conf.arg(name="kind")] = ()
    """which trace to fetch; repeatable (default: conv and code)"""
    force: bool = False
    """download again even where the file is present"""
    dry_run: bool = False
    """print what would be downloaded and skipped; touch nothing"""
    timeout: float = 60.0
    """seconds to wait for the server on each read"""


def parse_args(argv: list[str] | None = None) -> Args:
    """The command line: ``--dest``, ``--kind`` (repeatable), ``--force``, ``--dry-run``,
    ``--timeout``; the folder and kinds resolved (each kind once, in order)."""
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    if not args.timeout > 0:
        print(f"download_traces: --timeout must be > 0 seconds, got {args.timeout}",
              file=sys.stderr)
        raise SystemExit(2)
    return dataclasses.replace(args, dest=args.dest or traces_dir(),
                               kinds=tuple(dict.fromkeys(args.kinds or ("conv", "code"))))


def plan(dest: Path, kinds: list[str]) -> list[tuple[str, Path]]:
    """``(url, path)`` for each kind, in the order given."""
    return [(MOONCAKE_URL, dest / MOONCAKE_TRACE_FILE) if kind == "mooncake" else
            (AZURE_BASE_URL + Path(AZURE_TRACE_FILES[kind]).name, dest / AZURE_TRACE_FILES[kind])
            for kind in kinds]


def download(url: str, path: Path, timeout_s: float) -> int:
    """Fetch ``url`` into ``path`` through ``path.part``, printing progress; returns bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    received = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, \
                open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            while chunk := response.read(CHUNK_BYTES):
                out.write(chunk)
                received += len(chunk)
                of_total = (f" of {total / 1e6:.2f} MB ({100 * received / total:.0f}%)"
                            if total else "")
                print(f"\r  {path.name}: {received / 1e6:.2f} MB{of_total}", end="",
                      file=sys.stderr, flush=True)
        print(file=sys.stderr)
        if total and received != total:
            raise OSError(f"{url}: received {received} bytes, the server announced {total}")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)
    return received


def main(argv: list[str] | None = None) -> int:
    """Download what is missing, verify every file; exit status 0 when all parse."""
    args = parse_args(argv)
    print("Azure LLM inference traces 2023 (CC-BY-4.0; cite Splitwise, Patel et al., ISCA 2024)")
    failed = 0
    for url, path in plan(args.dest, args.kinds):
        present = path.is_file()
        fetch = args.force or not present
        if args.dry_run:
            print(f"would {'download ' + url + ' to' if fetch else 'skip (present)'} {path}")
            continue
        if fetch:
            print(f"downloading {url}\n  to {path}")
            try:
                download(url, path, args.timeout)
            except OSError as e:
                print(f"  failed: {e}", file=sys.stderr)
                failed += 1
                continue
        else:
            print(f"present, skipped: {path}")
        try:
            trace = load_trace(path)
        except TraceFormatError as e:
            print(f"  does not parse: {e}", file=sys.stderr)
            if fetch:
                path.unlink()
                print(f"  deleted {path}", file=sys.stderr)
            else:
                print("  run again with --force to download it afresh", file=sys.stderr)
            failed += 1
            continue
        print(f"  ok: {len(trace):,} requests over {trace.duration_s:,.0f} s; "
              f"{trace.skipped_report()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
