"""`manage.py benchmark`: the numbers of docs/benchmarks.md, side by side in one run, against the targets.

In one process: bare model.generate (the floor), the engine streaming the same answer, a real
WebSocket client against a real daphne on 127.0.0.1 (first chunk, done, cache hits), concurrent
clients against a queueing (CHAT_ENGINE=batch=1) and a batching daphne, memory and start-up time.
It always exits 0 when it could measure; a target not met is a finding, not a failure.
"""

import os
import tempfile
import time
import traceback
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

import chat.engine  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads, as the server does)
from bench import benchmark_options, in_process, memory_load, prefix_reuse, prefix_reuse_report
from bench import benchmarking as bm
from bench.benchmark_api import ApiRuns
from bench.benchmark_live import LiveRuns
from bench.benchmark_report import Report
from bench.benchmark_targets import Targets, met
from bench.gguf_formats import FORMATS
from chat.management.engine_loading import load


class Command(Targets, LiveRuns, ApiRuns, Report, BaseCommand):
    help = "Benchmark the chat end to end on 127.0.0.1 and compare with the targets in docs/benchmarks.md."

    def add_arguments(self, parser):
        benchmark_options.add_arguments(parser)

    # -- orchestration ------------------------------------------------------------

    def handle(self, *args, **opts):
        quick = self.quick = opts["quick"]
        self.tokens = opts["tokens"] or (12 if quick else 128)
        self.ctokens = opts["concurrent_tokens"] or (12 if quick else 64)
        self.levels = sorted(
            {
                int(x)
                for x in (opts["concurrency"] or ("1,2" if quick else "1,2,4,8")).split(",")
                if x.strip()
            }
        )
        if not self.levels or min(self.levels) < 1 or max(self.levels) > 32:
            raise CommandError("--concurrency takes numbers from 1 to 32, e.g. 1,2,4,8")
        self.newcomer_tokens = opts["newcomer_tokens"] or (40 if quick else 800)
        self.hits = max(1, min(opts["hits"] or (3 if quick else 20), 200))
        self.runs = max(1, min(opts["runs"], 10))
        self.prompt = opts["prompt"]
        compare = opts["batch_compare"] if opts["batch_compare"] is not None else not quick
        weights = opts["weights_compare"] if opts["weights_compare"] is not None else not quick
        batch = opts["batch"]
        self.batch_label = f"batch={batch}" if batch else "batch default"
        self.batch_env = {"CHAT_ENGINE": f"batch={batch}"} if batch else {}
        self.llama_levels = sorted(
            {
                int(x)
                for x in (opts["llama_levels"] or ("1,2" if quick else "1,4,8,16")).split(",")
                if x.strip()
            }
        )
        if not self.llama_levels or min(self.llama_levels) < 1 or max(self.llama_levels) > 32:
            raise CommandError("--llama-levels takes numbers from 1 to 32, e.g. 1,4,8,16")
        self.llama_rounds = max(1, min(opts["llama_rounds"] or (1 if quick else 3), 10))
        self.engine_users = 1 if quick else 4  # streams per engine in the two-engine row
        self.slots = int(batch) if batch else settings.CHAT_MAX_BATCH
        self.failures: list[str] = []
        self.servers: list[bm.ServerRun] = []
        self.results: dict = {}
        started = time.perf_counter()
        self.results["load_start"] = os.getloadavg()[0]
        formats = self.later_rows_options(opts, quick)
        alone = ("memory_only", "llama_only", "engines_only", "relay_only")
        if formats or any(opts[name] for name in alone):
            self.rows_alone(opts, formats, started)
            return

        self.note(
            f"benchmark: {self.tokens} tokens, concurrency {self.levels} x {self.ctokens} tokens, "
            f"{self.hits} cache hits, batch compare {'on' if compare else 'off'}"
        )
        if self.tokens > 256 or self.ctokens > 256:
            self.note(
                "  note: the `chat` policy stores max_new_tokens=256, so a server answer stops at 256 tokens"
            )

        backend = load(self)
        if opts["prefix_only"]:
            self.section("prefix reuse and coalescing", self.prefix_rows, backend)
            self.results["bench_rss_mb"] = bm.self_peak_rss_mb()
            self.prefix_report()
            if self.failures:
                raise CommandError("could not measure: " + "; ".join(self.failures))
            return
        self.section("in-process generation", self.in_process, backend)
        self.section("prefix reuse and coalescing", self.prefix_rows, backend)
        self.section("a newcomer during a long answer", self.newcomer, backend)
        with tempfile.TemporaryDirectory(prefix="chat-benchmark-") as tmp:
            self.workdir = Path(tmp)
            self.first_server = True
            # Sections 3-4 on the shipped configuration; its concurrent rounds too when the sizes agree.
            reuse = self.ctokens == self.tokens
            self.section("WebSocket stream and cache", self.live_single, backend, reuse)
            self.floors_for_live(backend)
            modes = [("queue", "batch=1", {"CHAT_ENGINE": "batch=1"})] if compare else []
            if weights:
                fp32 = ",".join(filter(None, [self.batch_env.get("CHAT_ENGINE"), "quant=none"]))
                modes.append(("fp32", "fp32 weights", {"CHAT_ENGINE": fp32}))
            if not reuse:
                modes.append(("batch", self.batch_label, self.batch_env))
            for key, label, env in modes:
                self.section(f"concurrency ({label})", self.live_concurrency, key, label, env)
            self.results["api"] = []
            if opts["peer"]:
                self.section("over the OpenAI API: the product's local engine", self.api_local)
                self.section(
                    "over the OpenAI API: the peer, and the product in front of it", self.api_peer
                )
                self.section(
                    "over the OpenAI API: the peer in its own default dtype",
                    self.api_peer_default_dtype,
                )
            if opts["llama"]:
                self.section("the product against llama-server", self.head_to_head)
                self.section("the web tier as a relay", self.relay)
                self.section("both engines busy at once", self.two_engines)
                self.section(
                    "GGUF formats against llama-server",
                    self.gguf_formats,
                    list(FORMATS),
                    self.quality_limit,
                )
            self.section("memory after the load", self.memory_rows)
        self.results["bench_rss_mb"] = bm.self_peak_rss_mb()
        self.results["elapsed_s"] = time.perf_counter() - started
        self.results["load_end"] = os.getloadavg()[0]
        self.report()
        if self.failures:
            raise CommandError("could not measure: " + "; ".join(self.failures))

    def later_rows_options(self, opts, quick: bool) -> list[str]:
        """The options of the rows after the race (GGUF formats, memory): checked, kept on self;
        returns the formats asked for alone."""
        formats = [f.strip().upper() for f in (opts["gguf_formats"] or "").split(",") if f.strip()]
        unknown = sorted(set(formats) - set(FORMATS))
        if unknown:
            raise CommandError(f"--gguf-formats: {', '.join(unknown)}: expected some of {FORMATS}")
        self.quality_limit = (
            opts["quality_prompts"] if opts["quality_prompts"] is not None else (8 if quick else 0)
        )
        self.memory_seconds = opts["memory_seconds"] or (20.0 if quick else 60.0)
        default_candidates = ",".join(memory_load.CANDIDATES) if opts["memory_only"] else "shipped"
        self.memory_candidates = [
            x.strip() for x in (opts["memory_candidates"] or default_candidates).split(",")
        ]
        unknown = sorted(set(self.memory_candidates) - set(memory_load.CANDIDATES))
        if unknown:
            raise CommandError(f"--memory-candidates: no {', '.join(unknown)}")
        return formats

    def rows_alone(self, opts, formats: list[str], started: float) -> None:
        """`--memory-only`, `--llama-only`, `--relay-only`, `--engines-only`, `--gguf-formats`:
        those rows without the in-process and live sections, and their own report."""
        with tempfile.TemporaryDirectory(prefix="chat-benchmark-") as tmp:
            self.workdir, self.first_server = Path(tmp), True
            if opts["memory_only"]:
                self.section("memory after the load", self.memory_rows)
            if opts["llama_only"]:
                self.section("the product against llama-server", self.head_to_head)
            if opts["llama_only"] or opts["relay_only"]:
                self.section("the web tier as a relay", self.relay)
            if opts["llama_only"] or opts["engines_only"]:
                self.section("both engines busy at once", self.two_engines)
            if formats:
                self.section(
                    "GGUF formats against llama-server",
                    self.gguf_formats,
                    formats,
                    self.quality_limit,
                )
        self.results["load_end"] = os.getloadavg()[0]
        self.results["elapsed_s"] = time.perf_counter() - started
        if opts["memory_only"]:
            self.memory_report()
        if not opts["memory_only"] or opts["llama_only"] or opts["relay_only"] or formats:
            self.head_to_head_report()
        if self.failures:
            raise CommandError("could not measure: " + "; ".join(self.failures))

    def note(self, line: str) -> None:
        self.stderr.write(line)

    def section(self, name, fn, *args):
        self.note(f"-- {name}")
        try:
            fn(*args)
        except Exception as exc:  # report it and go on: the other sections still measure
            self.failures.append(f"{name}: {type(exc).__name__}: {exc}")
            self.stderr.write(traceback.format_exc())

    # -- 1 and 2: in process ------------------------------------------------------

    def in_process(self, backend):
        import torch

        messages = [{"role": "user", "content": self.prompt}]
        self.input_ids = backend.encode(messages)  # exactly what the server feeds the model
        self.results["prompt_tokens"] = len(self.input_ids)
        self.results["threads"] = torch.get_num_threads()
        in_process.bare_generate(
            backend, self.input_ids, 8
        )  # warm-up: the first call pays one-off allocations
        self.floors: dict[int, in_process.Timed] = {}

        def median_of(fn):
            runs = [fn() for _ in range(self.runs)]
            runs = [r for r in runs if r is not None]
            if not runs:
                return None
            return sorted(runs, key=lambda r: r.total_s)[len(runs) // 2]

        self.note(f"  bare model.generate, {self.tokens} tokens")
        self.floors[self.tokens] = median_of(
            lambda: in_process.bare_generate(backend, self.input_ids, self.tokens)
        )
        self.note("  engine, streamed, same tokens forced")
        how = []

        def forced():
            timed, way = in_process.engine_forced_generate(
                backend, messages, self.input_ids, self.tokens
            )
            how.append(way)
            return timed

        forced_timed = median_of(forced)
        self.results["engine_forced"] = forced_timed
        self.results["engine_forced_how"] = how[-1] if how else None
        if forced_timed:
            self.floor_for(backend, forced_timed.tokens)  # a stop string may still end it early
        self.note("  backend.generate (public engine path, eos allowed)")
        engine = median_of(lambda: in_process.engine_generate(backend, messages, self.tokens))
        self.results["engine"] = engine
        self.floor_for(backend, engine.tokens)

    def newcomer(self, backend):
        self.note(
            f"  {in_process.NEWCOMER!r} alone, then while a {self.newcomer_tokens}-token answer decodes"
        )
        self.results["newcomer"] = in_process.newcomer_first_chunk(backend, self.newcomer_tokens)

    def prefix_rows(self, backend):
        self.results["prefix"] = prefix_reuse.run_all(
            backend, self.note, quick=self.quick, redis_url=self.coalescing_redis()
        )

    def coalescing_redis(self) -> str | None:
        """The completion cache's Redis, for the two-process coalescing row, if it answers."""
        import redis

        url = settings.CHAT_CACHE_REDIS_URL
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
            client.ping()
            client.close()
        except (redis.RedisError, OSError):
            self.note(f"  no Redis at {url}: the two-process coalescing row is skipped")
            return None
        return url

    def prefix_report(self):
        out = self.stdout.write
        results = self.results.get("prefix") or {}
        out("")
        for line in prefix_reuse_report.report(results):
            out(line)
        out("")
        out(f"  {'figure':50} {'measured':52} {'target':>10}  result")
        for name, measured, target, ok in prefix_reuse_report.targets(results):
            out(f"  {name:50} {measured:52} {target:>10}  {met(ok)}")

    def memory_rows(self):
        runs = self.results["memory"] = []
        for label in self.memory_candidates:
            runs.append(
                memory_load.measure(
                    self.workdir,
                    label,
                    memory_load.CANDIDATES[label],
                    sockets=memory_load.SOCKETS,
                    seconds=self.memory_seconds,
                    documents=memory_load.DOCUMENTS,
                    redis_url=settings.REDIS_URL,
                    note=self.note,
                )
            )

    def memory_report(self):
        out = self.stdout.write
        out("")
        for line in self.memory_lines():
            out(line)
        out("")
        out(f"  {'figure':50} {'measured':52} {'target':>10}  result")
        for name, measured, target, ok in memory_load.targets(self.results.get("memory") or []):
            out(f"  {name:50} {measured:52} {target:>10}  {met(ok)}")
        load = f"{self.results['load_start']:.1f} -> {self.results['load_end']:.1f}"
        out(f"  load average {load}")

    def memory_lines(self) -> list[str]:
        runs = self.results.get("memory")
        if not runs:
            return []
        return memory_load.report(
            runs,
            sockets=memory_load.SOCKETS,
            seconds=self.memory_seconds,
            documents=memory_load.DOCUMENTS,
        )

    def floor_for(self, backend, tokens: int):
        """The bare-generate floor for exactly `tokens` tokens (measured once, on demand)."""
        if tokens and tokens not in self.floors and getattr(self, "input_ids", None):
            self.note(
                f"  bare model.generate, {tokens} tokens (floor for an answer that ended early)"
            )
            self.floors[tokens] = in_process.bare_generate(backend, self.input_ids, tokens)
        return self.floors.get(tokens)

    def floors_for_live(self, backend):
        live = self.results.get("live")
        if live and live.ok and hasattr(self, "floors"):
            try:
                self.floor_for(backend, live.new_tokens)
            except Exception as exc:
                self.failures.append(f"floor for {live.new_tokens} tokens: {exc}")

    # -- 3, 4 (and 5 when sizes agree): one daphne with the shipped configuration ----

    async def cache_hits(self, server, prompt):
        answers = []
        for i in range(self.hits):
            answer = await bm.ask(server, prompt, f"hit-{i}", timeout=30)
            answers.append(answer)
            if not answer.ok or not answer.cached:
                break  # a miss generates again: do not repeat that 20 times
        return answers

    # -- 5: concurrent clients ------------------------------------------------------

    async def rounds(self, server, key):
        rows = {}
        for users in self.levels:
            prompts = [f"{self.prompt} (variant {key}-{users}-{k})" for k in range(users)]
            self.note(f"  {users} concurrent client(s)")
            # Queued answers run one after another: allow each its turn, and a margin.
            timeout = 60 + users * self.ctokens * 0.5
            rows[users] = await bm.ask_together(server, prompts, timeout)
        return rows

    # -- 6: over the OpenAI API, one client for the product and the peer -----------------

    # -- the report -------------------------------------------------------------------
