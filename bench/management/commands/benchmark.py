"""`manage.py benchmark`: the numbers of docs/benchmarks.md, side by side in one run, against the targets.

In one process: bare model.generate (the floor), the engine streaming the same answer, a real
WebSocket client against a real daphne on 127.0.0.1 (first chunk, done, cache hits), concurrent
clients against a queueing (CHAT_ENGINE=batch=1) and a batching daphne, memory and start-up time.
It always exits 0 when it could measure; a target not met is a finding, not a failure.
"""

import argparse
import asyncio
import os
import tempfile
import time
import traceback
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

import chat.engine  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads, as the server does)
from bench import benchmarking as bm
from bench import documents, in_process, prefix_reuse, prefix_reuse_report
from bench import head_to_head as h2h
from bench import openai_client as oc
from chat.infra.stats import percentile
from chat.management.commands._engine import load

PROMPT = "Write a long, detailed story about a lighthouse keeper."
PRIMER = (
    "What is the capital of France?"  # short, ends with eos: warms the server and fills the cache
)

TARGETS = {
    "stream": 1.05,  # streamed total <= 1.05 x bare generate
    "first_chunk_ms": 30.0,  # first chunk at the client <= model's first token + 30 ms
    "cache_ms": 10.0,  # cache hit p50
    "scale4": 2.5,
    "newcomer": 1.5,  # a newcomer's first chunk while a long answer runs <= 1.5 x alone  # 4 users' aggregate tok/s >= 2.5 x one user's
    "ready_s": 10.0,  # warm start to ready
    "weights8": 2.0,  # 8 users' aggregate tok/s >= 2 x the same server on fp32 weights
    "weights8_ttft_ms": 2000.0,  # ... with the worst first chunk no later than this
    "rss_mb": 1.5 * 1024,  # RSS with the model
}


# The grace period of the server that times a closed tab (`closed tab to model stopped`).
CLOSED_TAB_GRACE_S = 0.5


def met(ok) -> str:
    return "not measured" if ok is None else ("met" if ok else "not met")


class Command(BaseCommand):
    help = "Benchmark the chat end to end on 127.0.0.1 and compare with the targets in docs/benchmarks.md."

    def add_arguments(self, parser):
        parser.add_argument(
            "--tokens",
            type=int,
            default=None,
            help="new tokens of the single long answer (default 128; --quick 12)",
        )
        parser.add_argument(
            "--concurrency", default=None, help='concurrent clients per round (default "1,2,4,8")'
        )
        parser.add_argument(
            "--concurrent-tokens",
            type=int,
            default=None,
            help="max_new_tokens for the concurrent rounds (default 64; --quick 12)",
        )
        parser.add_argument(
            "--hits", type=int, default=None, help="cache hits to time (default 20; --quick 3)"
        )
        parser.add_argument(
            "--runs", type=int, default=1, help="repeat the in-process generations, report medians"
        )
        parser.add_argument(
            "--batch",
            default=None,
            help="CHAT_ENGINE batch= of the batching server (default: the server's default)",
        )
        parser.add_argument(
            "--batch-compare",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="also run the concurrent rounds against CHAT_ENGINE=batch=1 (default on; off with --quick)",
        )
        parser.add_argument(
            "--newcomer-tokens",
            type=int,
            default=None,
            help="length of the long answer a newcomer arrives during (default 800, ~600 words; --quick 40)",
        )
        parser.add_argument(
            "--weights-compare",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="also run the concurrent rounds with fp32 weights (CHAT_ENGINE=quant=none), the "
            "baseline of the 8-user target (default on; off with --quick)",
        )
        parser.add_argument("--prompt", default=PROMPT, help="the prompt of the long answer")
        parser.add_argument(
            "--peer",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="also measure `transformers serve --continuous-batching` and the product in front "
            "of it over the OpenAI API (default on when the serving extra is installed)",
        )
        parser.add_argument(
            "--llama",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="also race the product's /v1 against llama.cpp's llama-server on the same GGUF "
            "(default on when `make llama-peer` has built it)",
        )
        parser.add_argument(
            "--llama-only",
            action="store_true",
            help="only the race against llama-server (a few minutes; no model in this process)",
        )
        parser.add_argument(
            "--llama-levels",
            default=None,
            help='concurrent users in the race against llama-server (default "1,4,8,16"; --quick "1,2")',
        )
        parser.add_argument(
            "--llama-rounds",
            type=int,
            default=None,
            help="interleaved rounds of the race against llama-server (default 3; --quick 1)",
        )
        parser.add_argument(
            "--quick", action="store_true", help="tiny sizes: a smoke test in well under a minute"
        )
        parser.add_argument(
            "--prefix-only",
            action="store_true",
            help="only the prefix-reuse and coalescing rows (in process, a few minutes)",
        )

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
        self.slots = int(batch) if batch else settings.CHAT_MAX_BATCH
        self.failures: list[str] = []
        self.servers: list[bm.ServerRun] = []
        self.results: dict = {}
        started = time.perf_counter()
        self.results["load_start"] = os.getloadavg()[0]
        if opts["llama_only"]:
            with tempfile.TemporaryDirectory(prefix="chat-benchmark-") as tmp:
                self.workdir, self.first_server = Path(tmp), True
                self.section("the product against llama-server", self.head_to_head)
            self.results["load_end"] = os.getloadavg()[0]
            self.results["elapsed_s"] = time.perf_counter() - started
            self.head_to_head_report()
            if self.failures:
                raise CommandError("could not measure: " + "; ".join(self.failures))
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
        self.results["bench_rss_mb"] = bm.self_peak_rss_mb()
        self.results["elapsed_s"] = time.perf_counter() - started
        self.results["load_end"] = os.getloadavg()[0]
        self.report()
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

    def start(self, label, env):
        run = bm.daphne(self.workdir, label, premigrate=self.first_server, **env)
        self.first_server = False
        return run

    def live_single(self, backend, reuse):
        bm.flush_cache_db()
        env = {
            "CHAT_LIMITS": f"new_tokens={self.tokens},new_tokens_cap={self.tokens}",
            # Short, so the closed tab's answer is still running when it is up (nothing else here
            # closes a socket mid-answer); the report adds the default's difference.
            "CHAT_TIMEOUTS": f"resume={CLOSED_TAB_GRACE_S}",
            **self.batch_env,
        }
        self.note(f"  starting daphne ({self.batch_label}, {self.tokens} tokens)")
        with self.start(self.batch_label, env) as run:
            self.servers.append(run)
            self.note(f"  ready in {run.ready_s:.1f} s; warm-up and cache primer: {PRIMER!r}")
            primer = asyncio.run(bm.ask(run.server, PRIMER, "primer", timeout=60))
            if not primer.ok:
                raise RuntimeError(f"primer failed: {primer.error}")
            primer_cached = primer.finish_reason in bm.CACHEABLE and asyncio.run(
                bm.wait_for_cache_size(1)
            )

            self.note(
                f"  streaming the long answer over the WebSocket ({self.tokens} tokens at most)"
            )
            live = asyncio.run(bm.ask(run.server, self.prompt, "live-1", timeout=180))
            if not live.ok:
                raise RuntimeError(f"the streamed answer failed: {live.error}")
            self.results["live"] = live

            # 4: the same prompt on new connections; the long answer itself if it was cacheable.
            hit_prompt = None
            if live.finish_reason in bm.CACHEABLE and asyncio.run(
                bm.wait_for_cache_size(2 if primer_cached else 1)
            ):
                hit_prompt, which = self.prompt, "the long answer's prompt"
            elif primer_cached:
                hit_prompt, which = (
                    PRIMER,
                    (
                        f"the primer (the long answer ended with {live.finish_reason!r}, "
                        "which is never cached)"
                    ),
                )
            self.results["hit_prompt"] = which if hit_prompt else None
            if hit_prompt:
                self.note(f"  {self.hits} cache hits, each on a new connection, prompt: {which}")
                self.results["hits"] = asyncio.run(self.cache_hits(run.server, hit_prompt))
            else:
                self.failures.append(
                    "cache: no answer ended with eos or a stop string, so nothing was cached"
                )

            self.note("  a closed tab: socket closed at the first chunk, until the model stops")
            self.results["closed_tab"] = asyncio.run(bm.closed_tab_stop(run.server, self.prompt))

            if reuse:
                self.results.setdefault("concurrency", {})["batch"] = (
                    self.batch_label,
                    asyncio.run(self.rounds(run.server, "batch")),
                )

    async def cache_hits(self, server, prompt):
        answers = []
        for i in range(self.hits):
            answer = await bm.ask(server, prompt, f"hit-{i}", timeout=30)
            answers.append(answer)
            if not answer.ok or not answer.cached:
                break  # a miss generates again: do not repeat that 20 times
        return answers

    # -- 5: concurrent clients ------------------------------------------------------

    def live_concurrency(self, key, label, env):
        bm.flush_cache_db()
        env = {"CHAT_LIMITS": f"new_tokens={self.ctokens},new_tokens_cap={self.ctokens}", **env}
        self.note(f"  starting daphne ({label}, {self.ctokens} tokens)")
        with self.start(label, env) as run:
            self.servers.append(run)
            self.note(f"  ready in {run.ready_s:.1f} s")
            warm = asyncio.run(bm.ask(run.server, PRIMER, "warm-up", timeout=60))
            if not warm.ok:
                raise RuntimeError(f"warm-up failed: {warm.error}")
            self.results.setdefault("concurrency", {})[key] = (
                label,
                asyncio.run(self.rounds(run.server, key)),
            )

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

    def api_sizes(self) -> dict:
        return {
            "prompt": self.prompt,
            "tokens": self.tokens,
            "newcomer_tokens": self.newcomer_tokens,
            "levels": self.levels,
            "level_tokens": self.ctokens,
            "note": self.note,
        }

    def api_product(self, label: str, kind: str, env: dict):
        from bench import openai_client as oc

        bm.flush_cache_db()
        env = {"CHAT_LIMITS": f"new_tokens_cap={max(self.tokens, self.newcomer_tokens)}", **env}
        self.note(f"  starting daphne ({label})")
        with self.start(label, env) as run:
            self.servers.append(run)
            target = oc.Target(
                label,
                kind,
                run.server.url + "/v1",
                "smollm2",
                key=bm.api_key(run.server),
                reset=bm.flush_cache_db,  # the newcomer's repeat must be generated, not a cache hit
            )
            rows = oc.measure(target, **self.api_sizes())
            rows.ready_s = run.ready_s
        rows.peak_rss_mb = run.peak_rss_mb  # read as the server stopped
        self.results["api"].append(rows)

    def api_local(self):
        self.api_product("product, local engine", "local", self.batch_env)

    def measure_peer(self, server, label: str, kind: str):
        """A started peer server's rows, with the same client and sizes as the product's."""
        from bench import openai_client as oc

        target = oc.Target(label, kind, server.base_url, server.model)
        rows = oc.measure(target, **self.api_sizes())
        rows.ready_s = server.ready_s
        rows.peak_rss_mb = bm.process_peak_rss_mb(server.pid)
        self.results["api"].append(rows)

    def api_peer_default_dtype(self):
        from harness.peer import TransformersServe, serving_available

        if not serving_available():
            self.note("  skipped: the serving extra is not installed (requirements-dev.txt)")
            return
        peer = TransformersServe(dtype="auto", log_path=self.workdir / "peer-auto.log")
        self.note("  starting transformers serve --continuous-batching (its default dtype)")
        with peer:
            self.measure_peer(peer, "peer: its default dtype", "peer-auto")

    def head_to_head(self):
        """The product's /v1 and llama-server side by side, interleaved (bench/head_to_head.py)."""
        from bench import openai_client as oc
        from chat.engine.weights.loading import bundled_gguf_path
        from harness.peer import LlamaServer, llama_server

        binary = llama_server()
        if binary is None:
            self.note(
                "  skipped: llama-server is not built on this machine; `make llama-peer` builds "
                "it once (about 6 minutes on 2 cores), then `make benchmark` races it"
            )
            return
        bm.flush_cache_db()
        env = {"CHAT_LIMITS": f"new_tokens_cap={self.tokens}", **self.batch_env}
        label = "product /v1"
        llama_server_process = LlamaServer(
            bundled_gguf_path(),
            binary=binary,
            threads=os.cpu_count() or 1,
            slots=self.slots,
            log_path=self.workdir / "llama-server.log",
        )
        self.note(f"  starting daphne ({label}) and llama-server ({self.slots} slots)")
        with self.start(label, env) as run, llama_server_process as server:
            self.servers.append(run)
            product = h2h.Side(
                oc.Target(
                    label,
                    "local",
                    run.server.url + "/v1",
                    "smollm2",
                    key=bm.api_key(run.server),
                    reset=bm.flush_cache_db,  # a repeated prompt is generated, not a cache hit
                ),
                ready_s=run.ready_s,
            )
            llama = h2h.Side(
                oc.Target("llama-server", "llama", server.base_url, server.model),
                ready_s=server.ready_s,
            )
            self.results["h2h"] = (product, llama)
            h2h.race(
                [product, llama],
                prompt=self.prompt,
                tokens=self.tokens,
                levels=self.llama_levels,
                busy=self.slots,
                rounds=self.llama_rounds,
                note=self.note,
            )
            llama.peak_rss_mb = bm.process_peak_rss_mb(server.pid)
            self.documents_race(product.target, binary)
        product.peak_rss_mb = run.peak_rss_mb

    def documents_race(self, product: oc.Target, binary: str) -> None:
        """A pasted document on each side (bench/documents.py): llama-server again, with two
        slots of the bundled model's whole context, so a 6,000-token prompt fits one."""
        from chat.engine.weights.loading import bundled_gguf_path
        from harness.peer import LlamaServer

        reader = LlamaServer(
            bundled_gguf_path(),
            binary=binary,
            threads=os.cpu_count() or 1,
            slots=2,
            context=8192,
            log_path=self.workdir / "llama-server-documents.log",
        )
        self.note("  starting llama-server (2 slots of 8,192 tokens) for the document rows")
        with reader as server:
            sides = [
                documents.DocumentSide(product),
                documents.DocumentSide(
                    oc.Target("llama-server", "llama", server.base_url, server.model)
                ),
            ]
            documents.race(sides, rounds=self.llama_rounds, note=self.note)
        self.results["documents"] = sides

    def head_to_head_lines(self) -> list[str]:
        if "h2h" not in self.results:
            return []
        product, llama = self.results["h2h"]
        lines = [
            "",
            *h2h.report(
                product, llama, slots=self.slots, busy=self.slots, rounds=self.llama_rounds
            ),
        ]
        if "documents" in self.results:
            lines += ["", *documents.report(*self.results["documents"], rounds=self.llama_rounds)]
        return lines

    def head_to_head_report(self):
        """`--llama-only`'s report: the race and its targets."""
        out = self.stdout.write
        r = self.results
        out("")
        out(
            f"== benchmark against llama-server: {os.cpu_count()} CPUs, {self.tokens} tokens per "
            f"answer, 1-min load average {r['load_start']:.1f} at start, {r['load_end']:.1f} at end"
        )
        for line in self.head_to_head_lines():
            out(line)
        out("")
        out(f"  {'figure':50} {'measured':52} {'target':>10}  result")
        for name, measured, target, ok in self.head_to_head_targets():
            out(f"  {name:50} {measured:52} {target:>10}  {met(ok)}")
        out("")
        out(f"benchmark took {r['elapsed_s']:.0f} s")

    def head_to_head_targets(self) -> list:
        if "h2h" not in self.results:
            return []
        found = h2h.targets(*self.results["h2h"])
        if "documents" in self.results:
            found += documents.targets(*self.results["documents"])
        return found

    def api_peer(self):
        from harness.peer import TransformersServe, serving_available

        if not serving_available():
            self.note("  skipped: the serving extra is not installed (requirements-dev.txt)")
            return
        peer = TransformersServe(log_path=self.workdir / "peer.log")
        self.note("  starting transformers serve --continuous-batching (fp32, same model folder)")
        with peer:
            self.measure_peer(peer, "peer: transformers serve", "peer")
            remote = {
                "CHAT_BACKEND": "openai",
                "CHAT_REMOTE": f"{peer.base_url}?model={peer.model}"
                f"&concurrency={max(8, max(self.levels) + 1)}",
            }
            self.api_product("product -> peer (openai)", "remote", remote)

    # -- the report -------------------------------------------------------------------

    def report(self):
        out = self.stdout.write
        r = self.results
        floors = getattr(self, "floors", {})
        floor_n = floors.get(self.tokens)
        out("")
        out(
            f"== benchmark: SmolLM2 on {os.cpu_count()} CPUs, {r.get('threads', '?')} torch threads, "
            f"prompt of {r.get('prompt_tokens', '?')} tokens: {self.prompt!r}"
        )
        out(
            f"   1-min load average {r['load_start']:.1f} at start, {r['load_end']:.1f} at end"
            + (
                " (other work shares the CPUs: figures are noisier and slower than on an idle machine)"
                if max(r["load_start"], r["load_end"]) > 0.5 * (os.cpu_count() or 1)
                else ""
            )
        )
        out("")
        out(
            "Single answer (greedy, same model input everywhere; 'vs floor' = total / bare generate for the same tokens)"
        )
        out(
            f"  {'way':44} {'tokens':>6} {'1st chunk':>10} {'total':>9} {'ms/tok':>7} {'tok/s':>6} {'vs floor':>8}  finish"
        )

        def row(name, tokens, first_ms, total_s, finish):
            floor = floors.get(tokens)
            mspt = total_s * 1000 / tokens if tokens else None
            tps = tokens / total_s if total_s else None
            out(
                f"  {name:44} {tokens:>6} {bm.fmt(first_ms, '.0f', ' ms'):>10} {bm.fmt(total_s, '.2f', ' s'):>9} "
                f"{bm.fmt(mspt, '.1f'):>7} {bm.fmt(tps, '.1f'):>6} "
                f"{bm.fmt(bm.ratio(total_s, floor.total_s if floor else None), '.3f', 'x'):>8}  {finish}"
            )

        for tokens, timed in sorted(floors.items()):
            if timed:
                label = "1. bare model.generate (floor)" + (
                    "" if tokens == self.tokens else ", for an early end"
                )
                row(label, tokens, None, timed.total_s, "forced (min_new_tokens)")
        forced = r.get("engine_forced")
        if forced:
            row(
                "2a. engine streamed, length forced",
                forced.tokens,
                ms(forced.first_s),
                forced.total_s,
                f"forced ({forced.finish})"
                if forced.finish != "length"
                else "forced (min_new_tokens)",
            )
        else:
            out(
                f"  2a. engine streamed, length forced: {r.get('engine_forced_how') or 'not measured'}"
            )
        engine = r.get("engine")
        if engine:
            row(
                "2b. backend.generate + on_text (eos allowed)",
                engine.tokens,
                ms(engine.first_s),
                engine.total_s,
                engine.finish,
            )
        live = r.get("live")
        if live and live.ok:
            row(
                "3. WebSocket client via daphne",
                live.new_tokens,
                live.first_chunk_ms,
                live.done_ms / 1000,
                live.finish_reason,
            )
            m = live.metrics
            out(
                f"     server metrics: queue {m.get('queue_ms')} ms, model first token (ttft) {m.get('ttft_ms')} ms, "
                f"first visible {m.get('ttfv_ms')} ms, total {m.get('total_ms')} ms, {m.get('new_tokens')} tokens, "
                f"{live.chunks} chunks"
            )
            out(
                f"     client: connect {bm.fmt(live.connect_ms, '.1f')} ms, first event {bm.fmt(live.first_event_ms, '.1f')} ms, "
                f"first chunk {bm.fmt(live.first_chunk_ms, '.1f')} ms, done {bm.fmt(live.done_ms, '.1f')} ms"
            )
            if floor_n and live.new_tokens:
                out(
                    f"     per token: WebSocket {live.done_ms / live.new_tokens:.1f} ms vs floor "
                    f"{floor_n.ms_per_token:.1f} ms ({live.done_ms / live.new_tokens / floor_n.ms_per_token:.3f}x)"
                )
            self.closed_tab_report(out, r.get("closed_tab"))
        if r.get("engine_forced"):
            out(f"  2a forces the token count like 1, via {r.get('engine_forced_how')};")
        out(
            "  2b and 3 may end early at eos or the stop string: their floor is a bare run of the same token count."
        )

        newcomer = r.get("newcomer")
        if newcomer:
            x = bm.ratio(newcomer.busy_s, newcomer.alone_s)
            r["newcomer_x"] = x if newcomer.long_running else None
            out("")
            out(
                f"A newcomer ({in_process.NEWCOMER!r}) in the server's scheduler, first chunk from submit: "
                f"alone {bm.fmt(ms(newcomer.alone_s), '.0f', ' ms')}, while a "
                f"{self.newcomer_tokens}-token answer decodes {bm.fmt(ms(newcomer.busy_s), '.0f', ' ms')} "
                f"({bm.fmt(x, '.2f', 'x')}); the long answer "
                + (
                    f"was still running (cancelled after {newcomer.long_tokens} tokens)"
                    if newcomer.long_running
                    else "had already ended"
                )
            )

        hits = r.get("hits")
        out("")
        if hits:
            served = [a for a in hits if a.ok and a.cached]
            p50 = bm.median(a.done_ms for a in served)
            out(
                f"Cache hits ({r.get('hit_prompt')}): {len(served)}/{len(hits)} served cached, each on a new connection"
            )
            out(
                f"  prompt sent -> done: p50 {bm.fmt(p50, '.1f')} ms, p90 {bm.fmt(percentile([a.done_ms for a in served], 90), '.1f')} ms, "
                f"max {bm.fmt(max((a.done_ms for a in served), default=None), '.1f')} ms; "
                f"connect p50 {bm.fmt(bm.median(a.connect_ms for a in served), '.1f')} ms; "
                f"server total_ms p50 {bm.fmt(bm.median(a.metrics.get('total_ms') for a in served), '.1f')} ms"
            )
            r["cache_p50"] = p50 if len(served) == len(hits) else None
        else:
            out("Cache hits: not measured")

        conc = r.get("concurrency") or {}
        out("")
        out(
            f"Concurrent clients ({self.ctokens} max new tokens each, distinct prompts, one connection each; "
            "wall = first prompt sent -> last done)"
        )
        out(
            f"  {'server':24} {'users':>5} {'ok':>5} {'tokens':>6} {'wall':>7} {'agg tok/s':>9} {'user tok/s':>10} "
            f"{'worst ttft':>10} {'x 1 user':>8}"
        )
        for key in ("queue", "fp32", "batch"):
            if key not in conc:
                continue
            label, rows = conc[key]
            one = None
            for users, (answers, wall) in sorted(rows.items()):
                ok = [a for a in answers if a.ok]
                tokens = sum(a.new_tokens for a in ok)
                agg = tokens / wall if wall else None
                per_user = bm.median(a.new_tokens / (a.done_ms / 1000) for a in ok if a.done_ms)
                worst = max(
                    (a.ttft_client_ms for a in answers if a.ttft_client_ms is not None),
                    default=None,
                )
                if users == 1:
                    one = agg
                x = bm.ratio(agg, one)
                r.setdefault("scale", {})[(key, users)] = x if len(ok) == len(answers) else None
                r.setdefault("agg", {})[(key, users)] = (
                    (agg, worst) if len(ok) == len(answers) else None
                )
                out(
                    f"  {label:24} {users:>5} {len(ok):>2}/{len(answers):<2} {tokens:>6} {bm.fmt(wall, '.2f', ' s'):>7} "
                    f"{bm.fmt(agg, '.1f'):>9} {bm.fmt(per_user, '.1f'):>10} {bm.fmt(worst, '.0f', ' ms'):>10} "
                    f"{bm.fmt(x, '.2f', 'x'):>8}"
                )
                errors = sorted({a.error for a in answers if a.error})
                if errors:
                    out(f"    errors: {'; '.join(errors)}")
        out(
            "  user tok/s: median of a user's tokens / (their prompt sent -> their done), queueing included;"
        )
        out(
            "  worst ttft: slowest prompt sent -> first chunk at the client. Answers may end early at eos."
        )

        out("")
        out("Processes")
        for run in self.servers:
            out(
                f"  daphne {run.label:26} start->ready {bm.fmt(run.ready_s, '.2f', ' s'):>8}   "
                f"peak RSS (VmHWM) {bm.fmt(run.peak_rss_mb, '.0f', ' MB')}"
            )
        out(
            f"  benchmark process (model loaded) {'':25} peak RSS (ru_maxrss) {r['bench_rss_mb']:.0f} MB"
        )
        out(
            "  start->ready: LiveServer.start() -> /healthz 200, on an already migrated database (its no-op migrate included)"
        )

        self.api_report(out)
        prefix = ["", *prefix_reuse_report.report(r["prefix"])] if r.get("prefix") else []
        for line in [*self.head_to_head_lines(), *prefix]:
            out(line)
        self.targets(out, floors)
        out("")
        out(f"benchmark took {r['elapsed_s']:.0f} s")

    def closed_tab_report(self, out, closed) -> None:
        """The closed tab's line: measured with a short grace period, said for the default one."""
        if closed is None:
            return
        if closed.stopped_ms is None:
            out("     closed tab to model stopped: not seen within 60 s")
            return
        if closed.ended_first:
            out(
                f"     closed tab to model stopped: the answer ended on its own first, "
                f"{closed.stopped_ms:.0f} ms after the close"
            )
            return
        after_grace = closed.stopped_ms - CLOSED_TAB_GRACE_S * 1000
        out(
            f"     closed tab to model stopped: {closed.stopped_ms:.0f} ms with CHAT_TIMEOUTS resume="
            f"{CLOSED_TAB_GRACE_S:g}, so {settings.CHAT_RESUME_GRACE_S * 1000 + after_grace:.0f} ms "
            f"with {settings.CHAT_RESUME_GRACE_S:g} s (the grace, then {after_grace:.0f} ms)"
        )

    def api_report(self, out):
        all_rows = self.results.get("api") or []
        if not all_rows:
            return
        width = 28
        out("")
        out(
            "Over the OpenAI API: one client (bench/openai_client.py), same prompts, greedy; the "
            "transformers peer in fp32 and in its default dtype; tokens from each server's usage"
        )
        out(f"  {'figure':44}" + "".join(f" {r.target.label[:width]:>{width}}" for r in all_rows))

        def line(name, values):
            out(f"  {name:44}" + "".join(f" {v:>{width}}" for v in values))

        line("start -> answering", [bm.fmt(r.ready_s, ".1f", " s") for r in all_rows])
        line(
            "one stream: first chunk",
            [bm.fmt(r.single and r.single.first_chunk_ms, ".0f", " ms") for r in all_rows],
        )
        line(
            "one stream: tok/s (tokens)",
            [
                f"{bm.fmt(r.single_tps(), '.1f')} ({r.single.tokens if r.single else '-'})"
                for r in all_rows
            ],
        )
        line(
            "newcomer alone: first chunk",
            [
                bm.fmt(r.newcomer and r.newcomer.alone.first_chunk_ms, ".0f", " ms")
                for r in all_rows
            ],
        )

        def busy(r):
            n = r.newcomer
            if not n:
                return "-"
            x = bm.ratio(n.busy.first_chunk_ms, n.alone.first_chunk_ms)
            flag = "" if n.long_running else " (long ended)"
            return f"{bm.fmt(n.busy.first_chunk_ms, '.0f', ' ms')} ({bm.fmt(x, '.2f', 'x')}){flag}"

        line("newcomer during a long answer (x alone)", [busy(r) for r in all_rows])
        for users in self.levels:
            line(
                f"{users} user(s): agg tok/s (x 1 user)",
                [
                    f"{bm.fmt(r.agg_tps(users), '.1f')} "
                    f"({bm.fmt(bm.ratio(r.agg_tps(users), r.agg_tps(1)), '.2f', 'x')})"
                    for r in all_rows
                ],
            )
            line(
                f"{users} user(s): per-user tok/s, worst 1st chunk",
                [
                    f"{bm.fmt(r.per_user_tps(users), '.1f')}, "
                    f"{bm.fmt(r.worst_first_ms(users), '.0f', ' ms')}"
                    for r in all_rows
                ],
            )
        line("peak RSS", [bm.fmt(r.peak_rss_mb, ".0f", " MB") for r in all_rows])
        for r in all_rows:
            errors = sorted(
                {s.error for streams, _ in (r.levels or {}).values() for s in streams if s.error}
            )
            if errors:
                out(f"  errors ({r.target.label}): {'; '.join(errors)[:300]}")

    def api_targets(self) -> list:
        """The targets' ratios between the product and the peer, from one run (docs/benchmarks.md)."""
        rows = {r.target.kind: r for r in self.results.get("api") or []}
        local, peer, remote = rows.get("local"), rows.get("peer"), rows.get("remote")
        peer_auto = rows.get("peer-auto")
        lines = []

        def add(name, value, target, ok, spec=".2f", unit="x"):
            lines.append(
                (name, bm.fmt(value, spec, unit), target, None if value is None else ok(value))
            )

        if local:
            one, four, eight = local.agg_tps(1), local.agg_tps(4), local.agg_tps(8)
            add(
                "4 users vs 1 user, agg tok/s (product /v1)",
                bm.ratio(four, one),
                ">= 3.0x",
                lambda x: x >= 3.0,
            )
            add(
                "8 users vs 1 user, agg tok/s (product /v1)",
                bm.ratio(eight, one),
                ">= 5.0x",
                lambda x: x >= 5.0,
            )
            add(
                "worst first chunk, 8 users (product /v1)",
                local.worst_first_ms(8),
                "<= 2000 ms",
                lambda v: v <= 2000,
                ".0f",
                " ms",
            )
        if local and peer:
            add(
                "one stream tok/s: product / peer",
                bm.ratio(local.single_tps(), peer.single_tps()),
                ">= 1.0x",
                lambda x: x >= 1.0,
            )
            add(
                "4 users agg tok/s: product / peer",
                bm.ratio(local.agg_tps(4), peer.agg_tps(4)),
                ">= 1.0x",
                lambda x: x >= 1.0,
            )
        if local and peer_auto:
            add(
                "4 users agg tok/s: product / peer in its default dtype",
                bm.ratio(local.agg_tps(4), peer_auto.agg_tps(4)),
                ">= 1.0x",
                lambda x: x >= 1.0,
            )
        if remote and peer:
            cost = bm.ratio(remote.single_tps(), peer.single_tps())
            add(
                "web tier in front of the peer: tok/s cost",
                None if cost is None else (1 - cost) * 100,
                "<= 5 %",
                lambda v: v <= 5,
                ".1f",
                " %",
            )
            gap = (
                None
                if not (remote.single and peer.single and remote.single.first and peer.single.first)
                else remote.single.first_chunk_ms - peer.single.first_chunk_ms
            )
            add(
                "web tier in front of the peer: first chunk cost",
                gap,
                "<= 15 ms",
                lambda v: v <= 15,
                "+.0f",
                " ms",
            )
        return lines

    def targets(self, out, floors):
        r = self.results
        lines = []
        live = r.get("live")
        if live and live.ok and floors.get(live.new_tokens):
            floor = floors[live.new_tokens]
            x = live.done_ms / 1000 / floor.total_s
            lines.append(
                (
                    "streamed total (WebSocket) vs bare generate",
                    f"{x:.3f}x ({live.done_ms / 1000:.2f} s vs {floor.total_s:.2f} s, {live.new_tokens} tokens)",
                    f"<= {TARGETS['stream']:.2f}x",
                    x <= TARGETS["stream"],
                )
            )
        else:
            lines.append(
                (
                    "streamed total (WebSocket) vs bare generate",
                    "-",
                    f"<= {TARGETS['stream']:.2f}x",
                    None,
                )
            )
        ttft = live.metrics.get("ttft_ms") if live and live.ok else None
        if ttft is not None and live.first_chunk_ms is not None:
            gap = live.first_chunk_ms - ttft
            lines.append(
                (
                    "first chunk at client - model first token",
                    f"{gap:+.1f} ms (client {live.first_chunk_ms:.1f} ms, server ttft {ttft:.1f} ms)",
                    f"<= +{TARGETS['first_chunk_ms']:.0f} ms",
                    gap <= TARGETS["first_chunk_ms"],
                )
            )
        else:
            lines.append(
                (
                    "first chunk at client - model first token",
                    "-",
                    f"<= +{TARGETS['first_chunk_ms']:.0f} ms",
                    None,
                )
            )
        x = r.get("newcomer_x")
        lines.append(
            (
                "newcomer's first chunk: long answer running / alone",
                bm.fmt(x, ".2f", "x"),
                f"<= {TARGETS['newcomer']:.1f}x",
                None if x is None else x <= TARGETS["newcomer"],
            )
        )
        p50 = r.get("cache_p50")
        lines.append(
            (
                "cache hit p50 (client, prompt sent -> done)",
                bm.fmt(p50, ".1f", " ms"),
                f"<= {TARGETS['cache_ms']:.0f} ms",
                None if p50 is None else p50 <= TARGETS["cache_ms"],
            )
        )
        scale = r.get("scale", {})
        for key, name in (("batch", self.batch_label), ("queue", "batch=1")):
            if (key, 4) in scale or key == "batch":
                x = scale.get((key, 4))
                lines.append(
                    (
                        f"4 users vs 1, agg tok/s ({name})",
                        bm.fmt(x, ".2f", "x"),
                        f">= {TARGETS['scale4']:.1f}x",
                        None if x is None else x >= TARGETS["scale4"],
                    )
                )
        lines.append(self.weights_target(r.get("agg", {})))
        ready = [s.ready_s for s in self.servers if s.ready_s is not None]
        worst = max(ready) if ready else None
        lines.append(
            (
                "warm start to ready (slowest daphne)",
                bm.fmt(worst, ".2f", " s"),
                f"<= {TARGETS['ready_s']:.0f} s",
                None if worst is None else worst <= TARGETS["ready_s"],
            )
        )
        rss = [  # the shipped weights' servers: the fp32 baseline round is not what ships
            s.peak_rss_mb
            for s in self.servers
            if s.peak_rss_mb is not None and s.label != "fp32 weights"
        ]
        peak = max(rss) if rss else None
        lines.append(
            (
                "RSS with the model: daphne peak",
                bm.fmt(peak and peak / 1024, ".2f", " GB"),
                f"<= {TARGETS['rss_mb'] / 1024:.1f} GB",
                None if peak is None else peak <= TARGETS["rss_mb"],
            )
        )
        mine = r["bench_rss_mb"]
        lines.append(
            (
                "RSS with the model: benchmark process peak",
                f"{mine / 1024:.2f} GB",
                f"<= {TARGETS['rss_mb'] / 1024:.1f} GB",
                mine <= TARGETS["rss_mb"],
            )
        )
        lines.extend(self.api_targets())
        lines.extend(self.head_to_head_targets())
        lines.extend(prefix_reuse_report.targets(r.get("prefix") or {}))
        out("")
        out("Targets (docs/benchmarks.md)")
        out(f"  {'figure':50} {'measured':52} {'target':>10}  result")
        for name, measured, target, ok in lines:
            out(f"  {name:50} {measured:52} {target:>10}  {met(ok)}")

    def weights_target(self, agg: dict) -> tuple:
        """8 users' aggregate on the shipped weights against the same server on fp32 weights,
        both from this run, with the worst first chunk of the shipped weights' round."""
        name = "8 users agg tok/s: shipped weights / fp32 weights"
        target = f">= {TARGETS['weights8']:.1f}x"
        users = max((u for key, u in agg if key == "fp32"), default=None)
        shipped = agg.get(("batch", users)) if users else None
        fp32 = agg.get(("fp32", users)) if users else None
        if not shipped or not fp32:
            return (name, "-", target, None)
        x = bm.ratio(shipped[0], fp32[0])
        worst = shipped[1]
        ok = (
            None
            if x is None or worst is None
            else x >= TARGETS["weights8"] and worst <= TARGETS["weights8_ttft_ms"]
        )
        measured = (
            f"{bm.fmt(x, '.2f', 'x')} at {users} users ({shipped[0]:.1f} vs {fp32[0]:.1f}), "
            f"worst first chunk {bm.fmt(worst, '.0f', ' ms')}"
        )
        return (name, measured, target + f", <= {TARGETS['weights8_ttft_ms'] / 1000:.0f} s", ok)


def ms(seconds):
    return None if seconds is None else seconds * 1000
