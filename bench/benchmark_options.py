"""The options of `manage.py benchmark`: which sections run, their sizes, and the rows that can
run alone (kept apart from the command, whose module is the orchestration)."""

import argparse

from bench import memory_load
from bench.gguf_formats import FORMATS

PROMPT = "Write a long, detailed story about a lighthouse keeper."


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
        help="only the rows against llama-server: the race, and both engines busy at once "
        "(a few minutes; no model in this process)",
    )
    parser.add_argument(
        "--relay-only",
        action="store_true",
        help="only the web tier in front of llama-server against llama-server alone: 8 users, "
        "the web process's CPU ms per relayed token and RSS (no model in this process)",
    )
    parser.add_argument(
        "--llama-levels",
        default=None,
        help='concurrent users in the race against llama-server (default "1,4,8,16"; --quick "1,2")',
    )
    parser.add_argument(
        "--engines-only",
        action="store_true",
        help="only the row with both engines busy at once (llama-server as a remote engine)",
    )
    parser.add_argument(
        "--llama-rounds",
        type=int,
        default=None,
        help="interleaved rounds of the race against llama-server (default 3; --quick 1)",
    )
    parser.add_argument(
        "--gguf-formats",
        nargs="?",
        const=",".join(FORMATS),
        default=None,
        help="only the rows per GGUF format against llama-server on the same file, for the "
        f"formats named (default {','.join(FORMATS)}); `make benchmark` runs them after the race",
    )
    parser.add_argument(
        "--quality-prompts",
        type=int,
        default=None,
        help="answerquality prompts per GGUF format (default all 60; --quick 8)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: a smoke test in well under a minute"
    )
    parser.add_argument(
        "--prefix-only",
        action="store_true",
        help="only the prefix-reuse and coalescing rows (in process, a few minutes)",
    )
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="only the `make run` process's memory after the load (no model in this process)",
    )
    parser.add_argument(
        "--memory-seconds",
        type=float,
        default=None,
        help="seconds of the load's 16 sockets before the documents (default 60; --quick 20)",
    )
    parser.add_argument(
        "--memory-candidates",
        default=None,
        help="allocator configurations to measure on the same load, comma-separated, from "
        f"{', '.join(memory_load.CANDIDATES)} (default shipped; --memory-only all)",
    )
