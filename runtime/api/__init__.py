"""The REST API over the decider: settings, request and response models, metrics, middleware and
routes by topic (``routes/``). ``runtime.server`` assembles the app."""
