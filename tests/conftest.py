"""Shared test configuration: hypothesis profiles (STYLE R10).

`HYPOTHESIS_PROFILE=deep pytest …` runs every property with 2000 examples; the default `fast`
profile keeps the ordinary run quick.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("fast", max_examples=100)
settings.register_profile("deep", max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))
