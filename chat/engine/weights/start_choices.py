"""Start-up choices measured once per machine and remembered, so later starts skip the timing.

`CHAT_ENGINE quant=auto` times decode steps of each candidate at load (about 2-3 s on 2 cores).
The answer depends only on the machine, the weights and the software, so it is kept in a small
JSON file keyed by all of those; a start with the same key reuses it, anything else (another
CPU, another torch, other weights, another thread count) measures again. A close call is not
kept: it is measured again at the next start rather than frozen on one noisy reading.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Beside the database and the converted model, under CHAT_DATA_DIR.
START_CHOICES_FILE = "start-choices.json"
# Kept only when the loser took at least this much longer than the winner.
DECISIVE = 1.25


def machine_identity() -> str:
    """The CPU's model name and feature flags, hashed: what makes kernels fast or slow."""
    model, flags = platform.processor(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() == "model name" and not model:
                    model = value.strip()
                elif name.strip() == "flags" and not flags:
                    flags = value.strip()
    except OSError:
        pass
    return hashlib.sha256(f"{model}|{flags}".encode()).hexdigest()[:16]


def decisive(timings: dict[str, float]) -> bool:
    """Whether the fastest of `timings` beat every other by the DECISIVE margin."""
    ordered = sorted(timings.values())
    return len(ordered) < 2 or ordered[1] >= ordered[0] * DECISIVE


class StartChoices:
    """A JSON file of remembered choices; every failure to read or write only costs a timing."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def get(self, name: str, key: dict[str, Any]) -> dict[str, Any] | None:
        entry = self._read().get(name)
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        value = entry.get("value")
        return value if isinstance(value, dict) else None

    def put(self, name: str, key: dict[str, Any], value: dict[str, Any]) -> None:
        data = self._read()
        data[name] = {"key": key, "value": value}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Written whole then renamed: two servers starting at once never read half a file.
            with tempfile.NamedTemporaryFile(
                "w", dir=self.path.parent, delete=False, suffix=".tmp", encoding="utf-8"
            ) as out:
                json.dump(data, out, indent=1, sort_keys=True)
            os.replace(out.name, self.path)
        except OSError as exc:
            log.warning("could not remember the start-up choice in %s: %s", self.path, exc)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
