"""The serving engine: requests, the paged KV block pool, the scheduler, executors and their
profiles, SLOs and metrics.

Importing the package registers the roofline catalogue with :meth:`Profile.load
<runtime.engine.profile.Profile.load>` (:data:`runtime.engine.profile.PROFILE_SOURCES`), so a
profile name such as ``h100-llama3.1-8b-40gib-roofline`` resolves wherever a path is taken.
"""

from runtime.engine import roofline as _roofline  # noqa: F401  (registers the catalogue)
