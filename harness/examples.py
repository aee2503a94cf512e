"""How many examples a property-based test draws: all of them in `make test`, fewer in the fast
unit run (`make test-unit` sets CHAT_TEST_FUZZ_SCALE), which trades depth for a quick answer."""

from __future__ import annotations

import os

# Below this a fuzzer hardly explores; the scaled-down run never goes under it.
MINIMUM = 100


def fuzz_examples(full: int) -> int:
    """`full` scaled by CHAT_TEST_FUZZ_SCALE (1 when unset), never below MINIMUM or above `full`."""
    scale = float(os.environ.get("CHAT_TEST_FUZZ_SCALE") or 1)
    return min(full, max(MINIMUM, round(full * scale)))
