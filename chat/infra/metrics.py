"""Prometheus metrics, named like vLLM's (`<prefix>_time_to_first_token_seconds`), served at /metrics."""

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "chat"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80)

QUEUE_TIME = Histogram(
    f"{PREFIX}_request_queue_time_seconds", "Time a request waited for the model.", buckets=_LATENCY
)
TTFT = Histogram(
    f"{PREFIX}_time_to_first_token_seconds",
    "Accepted prompt to the model's first token.",
    buckets=_LATENCY,
)
TTFV = Histogram(
    f"{PREFIX}_time_to_first_visible_seconds",
    "Accepted prompt to the first character the user sees (later for held-back answers).",
    buckets=_LATENCY,
)
E2E = Histogram(
    f"{PREFIX}_e2e_request_latency_seconds", "Accepted prompt to done.", buckets=_LATENCY
)
HELD = Histogram(
    f"{PREFIX}_held_back_seconds", "How long a structured answer was held back.", buckets=_LATENCY
)
TPOT = Histogram(
    f"{PREFIX}_time_per_output_token_seconds",
    "Mean inter-token latency of a request.",
    buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0),
)
TOKENS_PER_S = Histogram(
    f"{PREFIX}_tokens_per_second",
    "Decode speed of a request.",
    buckets=(1, 2, 5, 10, 15, 20, 30, 50, 100, 200),
)
GENERATION_TOKENS = Counter(f"{PREFIX}_generation_tokens", "Tokens generated.")
REQUESTS = Counter(
    f"{PREFIX}_request_success", "Finished requests by finish_reason.", ["finish_reason"]
)
CANCELLATIONS = Counter(
    f"{PREFIX}_cancellations", "Requests stopped by the user or a closed socket."
)
FAILURES = Counter(f"{PREFIX}_request_failures", "Requests that failed in the model.")
# The same split by the engine that answered (its slug-free name as `done` gives it; "default"
# for the engine CHAT_BACKEND describes), beside the unlabelled series dashboards already read.
ENGINE_ANSWERS = Counter(
    f"{PREFIX}_engine_answers",
    "Finished answers by engine and finish_reason.",
    ["engine", "finish_reason"],
)
ENGINE_TOKENS = Counter(
    f"{PREFIX}_engine_generation_tokens", "Tokens generated, by engine.", ["engine"]
)
ENGINE_E2E = Histogram(
    f"{PREFIX}_engine_e2e_request_latency_seconds",
    "Prompt accepted to answer done, by engine.",
    ["engine"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
)
VALIDATION_FAILURES = Counter(
    f"{PREFIX}_validation_failures", "Structured answers that failed validation (each attempt)."
)
CACHE_HITS = Counter(f"{PREFIX}_cache_hits", "Prompts answered from the completion cache.")
CACHE_MISSES = Counter(f"{PREFIX}_cache_misses", "Cacheable prompts not found in the cache.")
CACHE_ERRORS = Counter(
    f"{PREFIX}_cache_errors", "Completion cache calls that failed (Redis down).", ["operation"]
)
ANSWERS_RESUMED = Counter(
    f"{PREFIX}_answers_resumed",
    "Running answers a client attached to again (a reload, a reconnect), by output policy.",
    ["policy"],
)
ANSWERS_ORPHANED = Counter(
    f"{PREFIX}_answers_orphaned",
    "Answers stopped because their last client left and none resumed within the grace period.",
    ["policy"],
)
FEEDBACK = Counter(
    f"{PREFIX}_feedback",
    "Users' signals on answers by output policy: rated up or down (each rating set or changed), "
    "or stopped or regenerated soon after a cache hit. Never per user.",
    ["policy", "signal"],
)
# Budgets (docs/configuration.md, budgets): labelled by policy or by period and kind, never by
# user or key, so the label sets stay bounded.
BUDGET_TOKENS = Counter(
    f"{PREFIX}_budget_tokens_charged", "Tokens charged to budgets, by output policy.", ["policy"]
)
BUDGET_ANSWERS = Counter(
    f"{PREFIX}_budget_answers_charged", "Answers charged to budgets, by output policy.", ["policy"]
)
BUDGET_REFUSALS = Counter(
    f"{PREFIX}_budget_refusals",
    "Prompts refused because a budget was spent, by the budget's period and kind.",
    ["period", "kind"],
)
BUDGET_REDIS_ERRORS = Counter(
    f"{PREFIX}_budget_redis_errors",
    "Budget counter calls that failed (Redis down); checks then read the database.",
    ["operation"],
)
RUNNING = Gauge(f"{PREFIX}_requests_running", "Requests being generated now.")
WAITING = Gauge(f"{PREFIX}_requests_waiting", "Requests waiting in the queue.")


def track_stack(stack) -> None:
    """Read the gauges from the stack's base scheduler, and the sharing counters from its
    Coalescer, when scraped, so they can never drift."""
    RUNNING.set_function(lambda: stack.base.running)
    WAITING.set_function(lambda: stack.base.waiting)
    ENGINE.sharing = stack.sharing


class _EngineCollector:
    """Counters the engine keeps itself (it never imports this module), read when scraped."""

    def __init__(self):
        self.prefix_store = None  # the local backend's PrefixStore; None for a remote backend
        self.sharing = None  # the scheduler stack's Coalescer, once the model is ready

    def collect(self):
        sharing = self.sharing
        yield CounterMetricFamily(
            f"{PREFIX}_coalesced_requests",
            "Requests that joined an identical generation already in flight.",
            value=sharing.joined if sharing is not None else 0,
        )
        across = sharing.across if sharing is not None else None
        yield CounterMetricFamily(
            f"{PREFIX}_coalesced_remote_requests",
            "Requests that followed an identical generation run by another process.",
            value=across.joined if across is not None else 0,
        )
        store = self.prefix_store
        if store is None:
            return
        prefill = CounterMetricFamily(
            f"{PREFIX}_prefill_tokens",
            "Prompt tokens prefilled: computed by the model, or reused from the prefix store.",
            labels=["source"],
        )
        prefill.add_metric(["computed"], store.computed_tokens)
        prefill.add_metric(["reused"], store.reused_tokens)
        yield prefill
        yield GaugeMetricFamily(
            f"{PREFIX}_prefix_cache_bytes",
            "KV bytes the prefix store holds (a quarter of CHAT_ENGINE kv_mb bounds it).",
            value=store.nbytes,
        )


ENGINE = _EngineCollector()
REGISTRY.register(ENGINE)


def track_prefix_store(backend) -> None:
    """Serve the local backend's prefill counters (a remote backend has none)."""
    ENGINE.prefix_store = getattr(backend, "prefix_store", None)


def observe_done(metrics: dict, finish_reason: str, cached: bool) -> None:
    """Record one finished turn from the metrics dict sent to the client (milliseconds)."""
    REQUESTS.labels(finish_reason).inc()
    engine = str(metrics.get("engine") or "default")
    ENGINE_ANSWERS.labels(engine, finish_reason).inc()
    if metrics.get("total_ms") is not None:
        ENGINE_E2E.labels(engine).observe(metrics["total_ms"] / 1000)
    if finish_reason == "cancelled":
        CANCELLATIONS.inc()
    if cached:
        CACHE_HITS.inc()
    for histogram, name in (
        (QUEUE_TIME, "queue_ms"),
        (TTFT, "ttft_ms"),
        (TTFV, "ttfv_ms"),
        (E2E, "total_ms"),
        (HELD, "held_ms"),
    ):
        if metrics.get(name) is not None:
            histogram.observe(metrics[name] / 1000)
    tokens = metrics.get("new_tokens") or 0
    if tokens and not cached:
        GENERATION_TOKENS.inc(tokens)
        ENGINE_TOKENS.labels(engine).inc(tokens)
        if metrics.get("tokens_per_s"):
            TOKENS_PER_S.observe(metrics["tokens_per_s"])
            TPOT.observe(1 / metrics["tokens_per_s"])
