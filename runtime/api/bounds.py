"""What a named observation value and a batch may hold: read by the request schemas
(:mod:`runtime.api.schemas`, pydantic) and by the array checks of the batch route
(:mod:`runtime.api.parsing`), which the batch worker runs without importing pydantic."""

from __future__ import annotations

from runtime.observation import ObservationField

MAX_BATCH = 4096
"""The most observations one ``POST /v1/decide/batch`` request may carry."""


def field_bounds(f: ObservationField) -> dict[str, float]:
    """The bounds a named value must lie in (``ge``, ``le``): physically bounded quantities are
    checked (a count cannot be negative, a fraction cannot exceed 1, a knob lies in its range)
    so that a unit mistake is a 422 rather than a silent clip; otherwise values outside the raw
    range are clipped, as in training. The schema and the batch route's array checks
    (:mod:`runtime.api.parsing`) both read them here."""
    bounds: dict[str, float] = {}
    if f.transform == "knob":
        bounds = {"ge": f.low, "le": f.high}
    elif f.transform in ("log", "linear") and f.low == 0.0:
        bounds = {"ge": 0.0}
        if f.unit == "fraction":
            bounds["le"] = 1.0
    return bounds
