"""`manage.py benchmark --gguf-formats`: a row per GGUF format people download, each file made
from the bundled model by llama.cpp's `llama-quantize` and raced against `llama-server` on the
same file (head_to_head.py's race: one stream and 8 users), with the 60-prompt answer yardstick
(`manage.py answerquality`) of the product on that file.

The files are made once per machine under var/gguf-formats/ (`--allow-requantize`: the bundled
file is itself Q4_1, so these are its blocks requantized, as the issue's own figures were
made). Without llama-quantize or llama-server the rows say how to build them and are skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import benchmarking as bm
from . import head_to_head as h2h
from .benchmarking import fmt, ratio

# The formats publishers ship first (llama.cpp's recommendations), and F16 as the float path.
FORMATS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "F16")
# The formats the head-to-head targets hold for: one stream, and 8 users' aggregate.
TARGET_FORMATS = ("Q4_K_M", "Q6_K", "Q8_0")
ONE_STREAM_TARGET, EIGHT_USERS_TARGET = 0.8, 1.0
FILES = Path(__file__).resolve().parent.parent / "var" / "gguf-formats"


def format_file(source: Path, name: str, quantize: str, note=print) -> Path:
    """The bundled model in format `name`, made by llama-quantize on first use and kept."""
    FILES.mkdir(parents=True, exist_ok=True)
    target = FILES / f"{source.stem.split('.')[0]}.{name}.gguf"
    if target.is_file():
        return target
    partial = target.with_suffix(".partial")
    note(f"  making {target.name} with llama-quantize (once per machine)")
    done = subprocess.run(
        [quantize, "--allow-requantize", str(source), str(partial), name],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama-quantize {name} failed: {done.stderr.strip()[-300:]}")
    partial.replace(target)
    return target


class GgufFormatRuns:
    """The per-format rows of `manage.py benchmark`: a mixin of its Command."""

    # The command's, set in handle() or defined on it.
    batch_env: Any
    failures: Any
    llama_rounds: Any
    note: Any
    prompt: Any
    results: Any
    servers: Any
    slots: Any
    start: Any
    tokens: Any
    workdir: Any

    def gguf_formats(self, formats: list[str], quality_limit: int) -> None:
        from chat.engine.weights.loading import bundled_gguf_path
        from harness.peer import llama_quantize, llama_server

        server, quantize = llama_server(), llama_quantize()
        if server is None or quantize is None:
            self.note(
                "  skipped: llama-server and llama-quantize are not built on this machine; "
                "`make llama-peer` builds both once (about 6 minutes on 2 cores)"
            )
            return
        rows = self.results.setdefault("gguf_formats", [])
        for name in formats:
            path = format_file(bundled_gguf_path(), name, quantize, self.note)
            row = {"format": name, "file_mb": path.stat().st_size / 1e6}
            rows.append(row)
            try:
                self.format_race(path, name, server, quality_limit, row)
            except Exception as error:  # the other formats still measure
                row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                self.failures.append(f"format {name}: {row['error']}")

    def format_race(self, path: Path, name: str, binary: str, limit: int, row: dict) -> None:
        """The race on the file (row["race"]), then answerquality on it (row["quality"])."""
        from harness.peer import LlamaServer

        bm.flush_cache_db()
        env = {
            "CHAT_MODEL_PATH": str(path),
            "CHAT_LIMITS": f"new_tokens_cap={self.tokens}",
            **self.batch_env,
        }
        label = f"product /v1 {name}"
        peer = LlamaServer(
            path,
            binary=binary,
            slots=self.slots,
            log_path=self.workdir / f"llama-server-{name}.log",
        )
        self.note(f"  {name}: starting daphne and llama-server on {path.name}")
        with self.start(label, env) as run, peer as server:
            self.servers.append(run)
            product, llama = h2h.sides(run, server, label, f"llama-server {name}")
            h2h.race(
                [product, llama],
                prompt=self.prompt,
                tokens=self.tokens,
                levels=[1, 8],
                busy=self.slots,
                rounds=self.llama_rounds,
                note=self.note,
                newcomer=False,  # the main race measures it; these rows are about tok/s
            )
            llama.peak_rss_mb = bm.process_peak_rss_mb(server.pid)
            row["race"] = (product, llama)
            # The server's settings and database, without the race's cap on an answer's tokens.
            env = {k: v for k, v in run.server.env.items() if k != "CHAT_LIMITS"}
            row["quality"] = self.format_quality(env, name, limit)
        product.peak_rss_mb = run.peak_rss_mb

    def format_quality(self, env: dict[str, str], name: str, limit: int) -> dict:
        """`manage.py answerquality` on the file, in its own process."""
        out = self.workdir / f"answerquality-{name}.json"
        args = ["answerquality", "--json", str(out)] + (["--limit", str(limit)] if limit else [])
        self.note(f"  {name}: answerquality{f' (first {limit} prompts)' if limit else ''}")
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=Path(__file__).resolve().parent.parent,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"answerquality failed: {done.stderr.strip()[-300:]}")
        return json.loads(out.read_text())["summary"]["figures"]

    def gguf_format_lines(self) -> list[str]:
        rows = self.results.get("gguf_formats")
        if not rows:
            return []
        lines = [
            "",
            f"GGUF formats (the bundled model through llama-quantize; product /v1 against "
            f"llama-server on the same file, {self.slots} slots, {self.tokens} tokens, median of "
            f"{self.llama_rounds} round(s); answers: manage.py answerquality)",
            f"  {'format':8} {'MB':>5} {'1 stream tok/s':>22} {'8 users tok/s':>22} "
            f"{'ended well':>10} {'4-gram':>7} {'tokens':>7}",
        ]
        for row in rows:
            if "race" not in row:
                lines.append(f"  {row['format']:8} {row['file_mb']:5.0f}  failed: {row['error']}")
                continue
            one, eight = self.format_ratios(row)
            product, llama = row["race"]
            quality = row.get("quality")
            answers = (
                f"{quality['ended_well_pct']:>9}% {quality['repeated_4gram_mean']:>7.3f} "
                f"{quality['tokens_mean']:>7}"
                if quality
                else f"  failed: {row.get('error', '')}"
            )
            lines.append(
                f"  {row['format']:8} {row['file_mb']:5.0f} "
                f"{self.versus(product, llama, 1, one):>22} {self.versus(product, llama, 8, eight):>22} "
                f"{answers}"
            )
        lines.append(
            "  tok/s: the product's, llama-server's, and their ratio (aggregate over the users); "
            "ended well: eos, stop string or cut at a loop, of the answers"
        )
        return lines

    @staticmethod
    def format_ratios(row: dict) -> tuple[float | None, float | None]:
        product, llama = row["race"]

        def rate(side: h2h.Side, users: int) -> float | None:
            return h2h.spread([r.aggregate_tps() for r in side.levels.get(users, [])] or [None])[0]

        return ratio(rate(product, 1), rate(llama, 1)), ratio(rate(product, 8), rate(llama, 8))

    @staticmethod
    def versus(product: h2h.Side, llama: h2h.Side, users: int, x: float | None) -> str:
        mine = h2h.spread([r.aggregate_tps() for r in product.levels.get(users, [])] or [None])[0]
        theirs = h2h.spread([r.aggregate_tps() for r in llama.levels.get(users, [])] or [None])[0]
        return f"{fmt(mine, '.1f')}/{fmt(theirs, '.1f')} {fmt(x, '.2f', 'x')}"

    def gguf_format_targets(self) -> list[tuple[str, str, str, bool | None]]:
        found = []
        for row in self.results.get("gguf_formats", []):
            if row["format"] not in TARGET_FORMATS or "race" not in row:
                continue
            one, eight = self.format_ratios(row)
            for users, x, target in ((1, one, ONE_STREAM_TARGET), (8, eight, EIGHT_USERS_TARGET)):
                found.append(
                    (
                        f"{row['format']}: {users} user(s) tok/s, product / llama-server",
                        fmt(x, ".2f", "x"),
                        f">= {target}x",
                        None if x is None else x >= target,
                    )
                )
        return found
