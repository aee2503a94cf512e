"""Measures of an answer's text, shared by bench's quality yardsticks and their tests."""


def repeated_ngram_rate(text: str, n: int = 4) -> float:
    """Share of the answer's word n-grams that already occurred earlier in it (0 for no loops)."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return 1 - len(set(grams)) / len(grams)
