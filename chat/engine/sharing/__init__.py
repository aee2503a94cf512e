"""Generations shared: identical cacheable requests in flight run once.

In this process (`coalescing`: the Coalescer folds identical requests into one), and across the
processes on one Redis (`coalescing_across`, over the registry of generations in flight in
`generation_registry`). It sits in front of any Scheduler; chat/engine/stack.py puts it there.
No torch here.
"""
