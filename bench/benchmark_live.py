"""`manage.py benchmark`'s runs against a real daphne on 127.0.0.1: one WebSocket client
(first chunk, done, cache hits, a closed tab), then concurrent clients."""

import asyncio

from bench import benchmarking as bm

PRIMER = (
    "What is the capital of France?"  # short, ends with eos: warms the server and fills the cache
)


# The grace period of the server that times a closed tab (`closed tab to model stopped`).
CLOSED_TAB_GRACE_S = 0.5


class LiveRuns:
    """The WebSocket runs against live daphne servers. Mixed into the command."""

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
