"""Deciding knobs from observations: the controller interface, static and PID controllers, and the
guarded ONNX policy decider that production runs."""
