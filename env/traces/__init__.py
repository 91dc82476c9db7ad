"""Request traces: read them from files, transform them, or generate them.

``load_trace(path)`` reads any supported format (Azure, Mooncake, BurstGPT, plain CSV);
``default_trace()`` is the embedded synthetic stand-in for the Azure conversation trace;
``split(trace, "train" | "eval")`` is the project's held-out convention.
"""

from env.traces.azure import read_azure
from env.traces.burstgpt import read_burstgpt
from env.traces.errors import TraceFormatError
from env.traces.lengths import LogNormalLengths, lognormal_params
from env.traces.load import TRACE_READERS, detect_format, load_trace
from env.traces.locations import TRACES_DIR_ENV, azure_trace_path, traces_dir
from env.traces.mooncake import read_mooncake
from env.traces.plain_csv import read_plain_csv
from env.traces.synthetic import (
    AZURE_CONV_TARGETS,
    bursty,
    default_trace,
    diurnal,
    on_off,
    poisson,
    ramp,
)
from env.traces.trace import Trace
from env.traces.transforms import TRAIN_SPLIT_S, jitter, rate_scale, split, time_window

__all__ = [
                                  "AZURE_CONV_TARGETS",
                                  "TRACES_DIR_ENV",
                                  "TRACE_READERS",
                                  "TRAIN_SPLIT_S",
                                  "LogNormalLengths",
                                  "Trace",
                                  "TraceFormatError",
                                  "azure_trace_path",
                                  "bursty",
                                  "default_trace",
                                  "detect_format",
                                  "diurnal",
                                  "jitter",
                                  "load_trace",
                                  "lognormal_params",
                                  "on_off",
                                  "poisson",
                                  "ramp",
                                  "rate_scale",
                                  "read_azure",
                                  "read_burstgpt",
                                  "read_mooncake",
                                  "read_plain_csv",
                                  "split",
                                  "time_window",
                                  "traces_dir",
]
