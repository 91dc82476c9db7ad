"""A window of requests to replay: read from a plain CSV or drawn as a Poisson stream.

The trace readers and generators of ``env/traces`` are the project's full set; this module is the
small stand-in the replay scripts use (plain arrays, so either source can be wired in).
CSV columns: ``arrival_s,prompt_tokens,output_tokens`` (a header row; extra columns ignored).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Window:
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.arrival_s)


def read_csv_window(path: str | Path, start_s: float = 0.0,
                    duration_s: float = float("inf")) -> Window:
    """Requests arriving in ``[start_s, start_s + duration_s)``, re-timed to start at 0.
    Refuses malformed rows naming the file, line and column."""
    path = Path(path)
    rows = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        need = ("arrival_s", "prompt_tokens", "output_tokens")
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: line 1: missing column(s) {missing}")
        for line, row in enumerate(reader, start=2):
            try:
                a = float(row["arrival_s"])
                p = int(row["prompt_tokens"])
                o = int(row["output_tokens"])
            except (TypeError, ValueError):
                col = next(c for c in need if not _parses(row.get(c), c != "arrival_s"))
                raise ValueError(f"{path}: line {line}: column {col!r} is not a number: "
                                 f"{row.get(col)!r}") from None
            if start_s <= a < start_s + duration_s:
                rows.append((a - start_s, p, o))
    rows.sort()
    arr = np.array(rows, dtype=np.float64).reshape(-1, 3)
    return Window(arr[:, 0], arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64),
                  f"{path} [{start_s:g}, {start_s + duration_s:g}) s")


def _parses(value: str | None, integer: bool) -> bool:
    try:
        int(value) if integer else float(value)
        return True
    except (TypeError, ValueError):
        return False


def poisson_window(rate_rps: float, duration_s: float, *, prompt_median: float = 200,
                   prompt_sigma: float = 0.8, prompt_max: int = 1024, output_median: float = 24,
                   output_sigma: float = 0.7, output_max: int = 128, seed: int = 0) -> Window:
    """Poisson arrivals with log-normal prompt and output lengths (clipped to [1, max])."""
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError(f"rate_rps and duration_s must be positive, got {rate_rps}, "
                         f"{duration_s}")
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate_rps * duration_s)
    arrival = np.sort(rng.uniform(0.0, duration_s, n))
    prompt = np.clip(np.round(rng.lognormal(np.log(prompt_median), prompt_sigma, n)), 1,
                     prompt_max).astype(np.int64)
    output = np.clip(np.round(rng.lognormal(np.log(output_median), output_sigma, n)), 1,
                     output_max).astype(np.int64)
    return Window(arrival, prompt, output,
                  f"poisson(rate={rate_rps}, duration={duration_s}, prompt~LN({prompt_median}, "
                  f"{prompt_sigma}), output~LN({output_median}, {output_sigma}), seed={seed})")
