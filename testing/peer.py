"""The peer: `transformers serve --continuous-batching` on loopback, with the bundled model folder.

The library's own continuous-batching server is what the local engine is measured against
(`make benchmark`) and the real engine the remote tier is tested against (tests/conftest.py's
`peer` fixture). It needs the `transformers[serving]` extra (requirements-dev.txt).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from .liveserver import ROOT, free_port

DEFAULT_MODEL_DIR = ROOT / "var" / "models" / "SmolLM2-135M-Instruct"
# The paged KV cache defaults to a share of the accelerator's memory; on a CPU it has to be
# sized by hand. 64 blocks of 256 tokens hold 16k tokens: eight 2k-token rows.
DEFAULT_ARGS = ("--cb-num-blocks", "64")


def transformers_cli() -> str | None:
    """The `transformers` console script of this interpreter's environment, if installed."""
    beside = Path(sys.executable).with_name("transformers")
    return str(beside) if beside.exists() else shutil.which("transformers")


def serving_available() -> bool:
    """True when the serving extra is importable (fastapi and uvicorn come with it)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return False
    return transformers_cli() is not None


class TransformersServe:
    """`transformers serve --continuous-batching` on a free loopback port; a context manager.

    `base_url` ends in /v1 like every OpenAI-compatible server. The model is named by its folder
    path in requests (`model`), which is how that server finds it.
    """

    def __init__(
        self,
        model_dir: Path | str = DEFAULT_MODEL_DIR,
        *,
        dtype: str = "float32",
        extra_args: tuple[str, ...] = DEFAULT_ARGS,
        log_path: Path | None = None,
    ):
        self.model = os.path.realpath(model_dir)
        self.dtype = dtype
        self.extra_args = tuple(extra_args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.ready_s: float | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 240) -> TransformersServe:
        cli = transformers_cli()
        if cli is None or not serving_available():
            raise RuntimeError(
                "transformers serve needs the serving extra: pip install -r requirements-dev.txt"
            )
        if not Path(self.model, "config.json").exists():
            raise RuntimeError(
                f"no model folder at {self.model} (run python -m chat.engine.prepare)"
            )
        command = [
            cli,
            "serve",
            "--continuous-batching",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            *self.extra_args,
            self.model,  # loaded before it listens, so the first answer pays no load
        ]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        started = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        while time.perf_counter() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"transformers serve exited with {self.process.returncode}: {self.log_tail()}"
                )
            if self._answers():
                self.ready_s = time.perf_counter() - started
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"transformers serve not listening after {timeout:.0f} s")

    def _answers(self) -> bool:
        """Any HTTP answer means it listens: its /v1/models answers 500 for a forced model."""
        try:
            with urllib.request.urlopen(self.base_url + "/models", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def log_tail(self, chars: int = 2000) -> str:
        if not self.log_path or not self.log_path.exists():
            return "(no log kept)"
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)

    def __enter__(self) -> TransformersServe:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
