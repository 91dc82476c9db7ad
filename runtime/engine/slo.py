"""SLO classes: per-class targets for time to first token and time per output token, or a
completion deadline.

Two kinds of class share the engine. An *interactive* class (no deadline) meets its SLO when its
first token comes within ``ttft_s`` of its arrival and its tokens stream at ``tpot_s`` or faster.
A *batch* class (``deadline_s`` set) meets it when the whole request finishes within
``deadline_s`` of its arrival; its TTFT and TPOT do not matter, so it may wait.

An interactive class's TTFT target may grow with the prompt: ``ttft_s +
ttft_per_prompt_token_s x prompt tokens``. A fixed 1 s target cannot hold for a 100k-token
prompt, whose prefill alone takes seconds on any accelerator; the allowance lets a long prompt
meet its class when it is served without queueing. The default classes keep fixed targets
(allowance 0), as the Azure traces' results were made with; :data:`LONG_CONTEXT_SLO_CLASSES`
are for long-context traffic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SloTarget:
    """Latency targets of one class. A request meets its SLO when both hold."""

    ttft_s: float
    """time to first token: first token time - arrival"""
    tpot_s: float
    """time per output token: (finish - first token) / (output tokens - 1)"""
    deadline_s: float | None = None
    """completion deadline from arrival; set for a batch class (its TTFT and TPOT are then not
    judged), None for an interactive one"""
    ttft_per_prompt_token_s: float = 0.0
    """allowance added to the TTFT target per prompt token (0: a fixed target)"""

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError(f"SLO targets must be positive, got ttft_s={self.ttft_s}, "
                             f"tpot_s={self.tpot_s}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"SLO deadline_s must be positive or None, got {self.deadline_s}")
        if not self.ttft_per_prompt_token_s >= 0:
            raise ValueError(f"ttft_per_prompt_token_s must be >= 0, "
                             f"got {self.ttft_per_prompt_token_s}")

    def ttft_target_s(self, prompt_tokens: int) -> float:
        """The TTFT target of a request with ``prompt_tokens`` of prompt."""
        return self.ttft_s + self.ttft_per_prompt_token_s * prompt_tokens

    @property
    def is_batch(self) -> bool:
        """A deferrable class, judged by its completion deadline."""
        return self.deadline_s is not None


BATCH_DEADLINE_S = 3600.0
"""the default batch class's completion deadline: an hour"""

DEFAULT_SLO_CLASSES: dict[str, SloTarget] = {
    # A chat or code-completion user watching tokens stream: a second to the first token and a
    # stream at least as fast as reading speed (20 tokens/s).
    "interactive": SloTarget(ttft_s=1.0, tpot_s=0.05),
    # Offline jobs (evaluations, summarisation, synthetic data) submitted in drops: done within
    # the hour is on time, however long each waits. TTFT and TPOT are not judged; the values
    # only bound the ratios the interval stats report.
    "batch": SloTarget(ttft_s=BATCH_DEADLINE_S, tpot_s=1.0, deadline_s=BATCH_DEADLINE_S),
}
DEFAULT_SLO_CLASS = "interactive"
BATCH_SLO_CLASS = "batch"
LONG_CONTEXT_SLO_CLASSES: dict[str, SloTarget] = {
    # 0.15 ms per prompt token is about 1.5x Llama-3.1-8B's derived H100 prefill of a 100k-token
    # prompt (about 9 s with its attention): 16 s for 100k tokens, 20.7 s for 131k.
    "interactive": SloTarget(ttft_s=1.0, tpot_s=0.05, ttft_per_prompt_token_s=0.15e-3),
    "batch": DEFAULT_SLO_CLASSES["batch"],
}
"""classes for long-context traffic: the interactive target plus a per-prompt-token allowance"""
PER_TOKEN_SUFFIX = "/tok"


def parse_slo_classes(text: str) -> dict[str, SloTarget]:
    """Parse ``name:ttft_s:tpot_s[:deadline_s][,...]``, e.g. ``interactive:1:0.05`` or
    ``batch:3600:1:3600`` (a batch class with an hour's completion deadline). ``ttft_s`` may
    carry a per-prompt-token allowance, ``BASE+PER_TOKEN/tok``: ``interactive:1+0.00015/tok:0.05``
    is 1 s plus 0.15 ms per prompt token."""
    classes: dict[str, SloTarget] = {}
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        fields = part.strip().split(":")
        if len(fields) not in (3, 4):
            raise ValueError(f"SLO class #{i + 1} {part!r}: expected "
                             "name:ttft_s:tpot_s[:deadline_s]")
        name, ttft, tpot = fields[:3]
        try:
            deadline = float(fields[3]) if len(fields) == 4 else None
            base, plus, per_token = ttft.partition("+")
            if plus and not per_token.endswith(PER_TOKEN_SUFFIX):
                raise ValueError(f"ttft {ttft!r}: an allowance is written BASE+SECONDS/tok")
            allowance = float(per_token.removesuffix(PER_TOKEN_SUFFIX)) if plus else 0.0
            classes[name] = SloTarget(float(base), float(tpot), deadline, allowance)
        except ValueError as e:
            raise ValueError(f"SLO class {name!r}: {e}") from None
    if not classes:
        raise ValueError("no SLO class given")
    return classes


SLO_PRESETS: dict[str, dict[str, SloTarget]] = {"default": DEFAULT_SLO_CLASSES,
                                                "long-context": LONG_CONTEXT_SLO_CLASSES}
"""named sets of classes a command line may give instead of a list"""


def slo_classes_from_arg(text: str) -> dict[str, SloTarget]:
    """A preset of :data:`SLO_PRESETS` by name, or a list for :func:`parse_slo_classes`; the
    first class is the one requests without a class get."""
    preset = SLO_PRESETS.get(text.strip())
    return dict(preset) if preset is not None else parse_slo_classes(text)
