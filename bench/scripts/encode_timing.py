"""Time the prompt encoding: the rendered chat tokenized whole (the old way) vs the safe encoding.

    PYTHONPATH=. .venv/bin/python bench/scripts/encode_timing.py [--turns 10] [--rounds 200]

The safe encoding (chat/engine/text/template.py) keeps typed control tokens as text; for a chat
without them it must give the very same ids, which this asserts before timing.
"""

from __future__ import annotations

import argparse
import time

from transformers import AutoTokenizer

from chat.engine.text.template import encode_pieces, render_pieces
from chat.engine.weights.loading import converted_model_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10, help="earlier question/answer pairs")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(str(converted_model_dir("var")))
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(args.turns):
        messages += [
            {"role": "user", "content": f"Question {i}: tell me about dragons and bread."},
            {"role": "assistant", "content": "Dragons bake bread at dawn. " * 8},
        ]
    messages.append({"role": "user", "content": "And now?"})

    def whole():
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]

    def safe():
        return encode_pieces(tokenizer, render_pieces(tokenizer, messages))

    assert whole() == safe(), "the safe encoding changed the ids of a chat without markers"
    for name, encode in (("rendered string, whole", whole), ("safe (markers kept as text)", safe)):
        encode()
        started = time.perf_counter()
        for _ in range(args.rounds):
            encode()
        per_call = (time.perf_counter() - started) / args.rounds * 1000
        print(f"{name:24} {per_call:6.2f} ms per encode, {len(encode())} tokens")


if __name__ == "__main__":
    main()
