"""Baseline controllers. Every one implements ``decide(observation) -> Decision`` and ``reset()``
(:class:`runtime.decider.controller.Controller`); static and PID live in ``runtime/`` because the
decider falls back to them in production."""
