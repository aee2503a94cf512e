"""`manage.py benchmark`'s `/v1` runs: the product's OpenAI-compatible API and its peers
(transformers serve, llama-server), the head-to-head against llama-server, and both engines
busy at once (the default one and llama-server as a remote engine row)."""

import os
from typing import Any

from bench import benchmarking as bm
from bench import documents, relay_race
from bench import head_to_head as h2h
from bench import openai_client as oc
from bench import two_engines as duo
from bench.benchmark_targets import met
from bench.gguf_formats import GgufFormatRuns
from harness.liveserver import process_status_mb


class ApiRuns(GgufFormatRuns):
    """The /v1 runs: the product, its peers, the head-to-head. Mixed into the command."""

    # The command's, set in handle() or defined on it.
    ctokens: Any
    engine_users: Any
    levels: Any
    llama_rounds: Any
    newcomer_tokens: Any
    note: Any
    prompt: Any
    results: Any
    servers: Any
    slots: Any
    start: Any
    tokens: Any
    workdir: Any

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
            slots=self.slots,
            log_path=self.workdir / "llama-server.log",
        )
        self.note(f"  starting daphne ({label}) and llama-server ({self.slots} slots)")
        with self.start(label, env) as run, llama_server_process as server:
            self.servers.append(run)
            product, llama = h2h.sides(run, server, label, "llama-server")
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

    def relay(self):
        """The web tier in front of llama-server against llama-server alone (bench/relay_race.py)."""
        from chat.engine.weights.loading import bundled_gguf_path
        from harness.peer import LlamaServer, llama_server

        binary = llama_server()
        if binary is None:
            self.note("  skipped: llama-server is not built on this machine (`make llama-peer`)")
            return
        bm.flush_cache_db()
        users = 8
        upstream = LlamaServer(
            bundled_gguf_path(),
            binary=binary,
            slots=users,
            log_path=self.workdir / "llama-server-relay.log",
        )
        with upstream as server:
            env = {
                "CHAT_BACKEND": "openai",
                "CHAT_REMOTE": f"{server.base_url}?model={server.model}&concurrency={users}",
                "CHAT_LIMITS": f"new_tokens_cap={self.tokens}",
            }
            self.note(
                f"  starting daphne (CHAT_BACKEND=openai in front of llama-server, {users} slots)"
            )
            with self.start("web tier (relay)", env) as run:
                self.servers.append(run)
                relay = oc.Target(
                    "via the web tier",
                    "remote",
                    run.server.url + "/v1",
                    "smollm2",
                    key=bm.api_key(run.server),
                )
                direct = oc.Target(
                    "straight to llama-server", "llama", server.base_url, server.model
                )
                pid = run.server.pid
                found = relay_race.race(
                    relay,
                    direct,
                    pid,
                    users=users,
                    tokens=self.tokens,
                    rounds=self.llama_rounds,
                    prompt=self.prompt,
                    note=self.note,
                )
                found.rss_mb = process_status_mb(pid, "VmRSS")
                found.peak_rss_mb = process_status_mb(pid, "VmHWM")
                self.results["relay"] = found

    def relay_lines(self) -> list[str]:
        found = self.results.get("relay")
        return ["", *relay_race.report(found)] if found is not None else []

    def relay_targets(self) -> list:
        found = self.results.get("relay")
        return relay_race.targets(found) if found is not None else []

    def documents_race(self, product: oc.Target, binary: str) -> None:
        """A pasted document on each side (bench/documents.py): llama-server again, with two
        slots of the bundled model's whole context, so a 6,000-token prompt fits one."""
        from chat.engine.weights.loading import bundled_gguf_path
        from harness.peer import LlamaServer

        reader = LlamaServer(
            bundled_gguf_path(),
            binary=binary,
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

    def two_engines(self):
        """The default engine answering its policy while llama-server, an engine row of the
        same web process, answers another: each beside its figure alone (bench/two_engines.py)."""
        from chat.engine.weights.loading import bundled_gguf_path
        from harness.peer import LlamaServer, llama_server

        binary = llama_server()
        if binary is None:
            self.note("  skipped: llama-server is not built on this machine (`make llama-peer`)")
            return
        bm.flush_cache_db()
        env = {"CHAT_LIMITS": f"new_tokens_cap={self.tokens}", **self.batch_env}
        remote = LlamaServer(
            bundled_gguf_path(),
            binary=binary,
            slots=self.slots,
            log_path=self.workdir / "llama-server-engine.log",
        )
        label = "product, two engines"
        self.note(f"  starting daphne ({label}) and llama-server as its remote engine")
        with self.start(label, env) as run, remote as server:
            self.servers.append(run)
            run.server.manage(
                "shell",
                "-c",
                "from chat.models import Engine, OutputPolicy; "
                "engine = Engine.objects.create(name='llama-server', slug='llama-server', "
                f"kind='remote', api_root={server.base_url!r}, served_model={server.model!r}); "
                "OutputPolicy.objects.create(slug='remote', name='remote', engine=engine)",
            )
            url, key = run.server.url + "/v1", bm.api_key(run.server)
            engines = [
                duo.Engine(
                    "default engine (local model)",
                    oc.Target("local", "local", url, "smollm2", key=key),
                ),
                duo.Engine(
                    "remote engine (llama-server)",
                    oc.Target("remote", "remote", url, "smollm2:remote", key=key),
                ),
            ]
            for engine in engines:  # warm-up: the remote engine is built on its first prompt
                warm = oc.stream_chat(engine.target, "Hi", 4)
                if not warm.ok:
                    raise RuntimeError(f"{engine.name}: warm-up failed: {warm.error}")
            self.results["two_engines"] = engines
            duo.race(
                engines,
                prompt=self.prompt,
                tokens=self.tokens,
                users=self.engine_users,
                rounds=self.llama_rounds,
                note=self.note,
            )

    def head_to_head_lines(self) -> list[str]:
        lines = []
        if "two_engines" in self.results:
            lines += [
                "",
                *duo.report(
                    self.results["two_engines"],
                    users=self.engine_users,
                    rounds=self.llama_rounds,
                    cpus=os.cpu_count() or 1,
                ),
            ]
        if "h2h" not in self.results:
            return lines + self.gguf_format_lines()
        product, llama = self.results["h2h"]
        lines = [
            *lines,
            "",
            *h2h.report(
                product, llama, slots=self.slots, busy=self.slots, rounds=self.llama_rounds
            ),
        ]
        if "documents" in self.results:
            lines += ["", *documents.report(*self.results["documents"], rounds=self.llama_rounds)]
        return lines + self.gguf_format_lines()

    def head_to_head_report(self):
        """`--llama-only`'s and `--relay-only`'s report: the races run and their targets."""
        out = self.stdout.write
        r = self.results
        out("")
        out(
            f"== benchmark against llama-server: {os.cpu_count()} CPUs, {self.tokens} tokens per "
            f"answer, 1-min load average {r['load_start']:.1f} at start, {r['load_end']:.1f} at end"
        )
        for line in [*self.head_to_head_lines(), *self.relay_lines()]:
            out(line)
        out("")
        out(f"  {'figure':50} {'measured':52} {'target':>10}  result")
        for name, measured, target, ok in [*self.head_to_head_targets(), *self.relay_targets()]:
            out(f"  {name:50} {measured:52} {target:>10}  {met(ok)}")
        out("")
        out(f"benchmark took {r['elapsed_s']:.0f} s")

    def head_to_head_targets(self) -> list:
        found = duo.targets(self.results["two_engines"]) if "two_engines" in self.results else []
        if "h2h" not in self.results:
            return found + self.gguf_format_targets()
        found += h2h.targets(*self.results["h2h"])
        if "documents" in self.results:
            found += documents.targets(*self.results["documents"])
        return found + self.gguf_format_targets()

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
