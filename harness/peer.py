"""The peers: other OpenAI-compatible servers on loopback, running the same model.

- `transformers serve --continuous-batching` on the bundled model folder: the library's own
  continuous-batching server, what the local engine is measured against (`make benchmark`) and the
  real engine the remote tier is tested against (tests/conftest.py's `peer` fixture). It needs
  the `transformers[serving]` extra (requirements-dev.txt).
- llama.cpp's own C++ server (`llama-server`, continuous batching in slots) on the very GGUF
  file the product ships: a measuring peer only, never a dependency of the tests. `make
  llama-peer` builds it once per machine from the llama.cpp sources vendored in PyPI's
  `llama-cpp-python` source package (about 6 minutes on 2 quiet cores; docs/benchmarks.md).
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


# Where `make llama-peer` builds llama-server; LLAMA_SERVER names another binary.
LLAMA_SERVER = ROOT / "var" / "llama-peer" / "build" / "bin" / "llama-server"


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


class ServerProcess:
    """An OpenAI-compatible server in a child process on a free loopback port; a context manager.

    `base_url` ends in /v1 like every OpenAI-compatible server; `model` is the name its requests
    use. Subclasses say how to start it (`command`).
    """

    name = "server"

    def __init__(self, model: str, *, log_path: Path | None = None):
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.ready_s: float | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def start(self, timeout: float = 240):
        command = self.command()
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = self.environment()
        started = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        while time.perf_counter() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}: {self.log_tail()}"
                )
            if self._answers():
                self.ready_s = time.perf_counter() - started
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} not listening after {timeout:.0f} s")

    def _answers(self) -> bool:
        """Any HTTP answer means it listens (transformers serve's /v1/models answers 500 for a
        forced model)."""
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

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class TransformersServe(ServerProcess):
    """`transformers serve --continuous-batching` on the bundled model folder.

    The model is named by its folder path in requests (`model`), which is how that server finds
    it. `dtype="auto"` is the library's own default (the checkpoint's: bf16 for the converted
    folder); the benchmark runs it both ways.
    """

    name = "transformers serve"

    def __init__(
        self,
        model_dir: Path | str = DEFAULT_MODEL_DIR,
        *,
        dtype: str = "float32",
        extra_args: tuple[str, ...] = DEFAULT_ARGS,
        log_path: Path | None = None,
    ):
        super().__init__(os.path.realpath(model_dir), log_path=log_path)
        self.dtype = dtype
        self.extra_args = tuple(extra_args)

    def command(self) -> list[str]:
        cli = transformers_cli()
        if cli is None or not serving_available():
            raise RuntimeError(
                "transformers serve needs the serving extra: pip install -r requirements-dev.txt"
            )
        if not Path(self.model, "config.json").exists():
            raise RuntimeError(
                f"no model folder at {self.model} (run python -m chat.engine.weights.convert)"
            )
        return [
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


def llama_quantize() -> str | None:
    """The `llama-quantize` binary built beside llama-server (LLAMA_QUANTIZE names another), or
    None: it makes the benchmark's files of each GGUF format from the bundled one."""
    named = os.environ.get("LLAMA_QUANTIZE")
    candidate = Path(named) if named else LLAMA_SERVER.with_name("llama-quantize")
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def llama_server() -> str | None:
    """The `llama-server` binary (LLAMA_SERVER, else the one `make llama-peer` built), or None."""
    named = os.environ.get("LLAMA_SERVER")
    candidate = Path(named) if named else LLAMA_SERVER
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


class LlamaServer(ServerProcess):
    """llama.cpp's own C++ server (`llama-server`) on a GGUF file: `slots` sequences decode together
    (continuous batching, its default), on `threads` threads, `context` tokens per slot.

    That is the server people run on a CPU. Its chat template is the GGUF's own, through its
    Jinja engine (`--jinja`), as the product's is the tokenizer's own; greedy requests
    (temperature 0) take its greedy path.
    """

    name = "llama-server"

    def __init__(
        self,
        gguf: Path | str,
        *,
        binary: str,
        slots: int,
        threads: int | None = None,
        context: int = 2048,
        log_path: Path | None = None,
    ):
        super().__init__("smollm2-gguf", log_path=log_path)
        self.gguf = str(gguf)
        self.binary = binary
        self.threads = threads or os.cpu_count() or 1  # every core, as the product's engine
        self.slots = slots
        self.context = context

    def environment(self) -> dict[str, str]:
        """llama.cpp's own environment: without the OMP_WAIT_POLICY=PASSIVE that the product's
        settings set in this process (project/settings.py), which made llama-server's OpenMP
        threads sleep at each of its barriers: 20 ms a token instead of 7.4 on the 2-core EPYC."""
        env = super().environment()
        if os.environ.get("OMP_WAIT_POLICY") == "PASSIVE":
            env.pop("OMP_WAIT_POLICY")
        return env

    def command(self) -> list[str]:
        return [
            self.binary,
            "--model",
            self.gguf,
            "--alias",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--threads",
            str(self.threads),
            "--threads-batch",
            str(self.threads),
            "--parallel",
            str(self.slots),
            "--ctx-size",  # shared by the slots
            str(self.context * self.slots),
            "--jinja",
            "--no-webui",
            *self.repack_flags(),
        ]

    @staticmethod
    def repack_flags() -> list[str]:
        """Extra buffer types off on an AMX CPU only: there the one for the bundled file's Q4_1
        and Q8_0 blocks is AMX, whose kernel (ggml_backend_amx_mul_mat) segfaulted at the first
        matmul on the Xeon it was measured on. Elsewhere they stay on, as a user runs
        llama-server: its repacked Q4_0 and Q4_K layouts are its fastest kernels for those files."""
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ["--no-repack"]
        return ["--no-repack"] if "amx_tile" in flags else []
