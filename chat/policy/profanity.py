"""A profanity/toxicity classifier that runs offline: the linear model `alt-profanity-check`
ships (TF-IDF over words, five calibrated linear SVMs), read once from the package and
evaluated here in plain Python.

Evaluated by hand rather than through scikit-learn's predict_proba: that call costs 15-30 ms
per window in input validation alone, the same arithmetic on a dict of word weights costs
microseconds, which keeps the hook under a millisecond per window. The result is the package's
probability (checked against predict_prob in the tests).
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from functools import cache, lru_cache

from .moderation import ALLOWED, ModerationHook, Verdict

__all__ = ["ProfanityHook", "profanity_probability", "load_classifier"]

# The vectorizer's own token pattern and lowercasing; stop words are simply not in the vocabulary.
_TOKEN = re.compile(r"(?u)\b\w\w+\b")
# Judged per sentence or line: one slur in a long answer must not be diluted by the rest.
_SEGMENT = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True)
class _Classifier:
    """Per word: idf, and idf times each fold's weight; per fold: bias and sigmoid (a, b)."""

    words: dict[str, tuple[float, tuple[float, ...]]]
    biases: tuple[float, ...]
    sigmoids: tuple[tuple[float, float], ...]

    def probability(self, text: str) -> float:
        counts = Counter(word for word in _TOKEN.findall(text.lower()) if word in self.words)
        if not counts:
            return self._calibrated([0.0] * len(self.biases))
        norm = math.sqrt(sum((n * self.words[w][0]) ** 2 for w, n in counts.items()))
        sums = [0.0] * len(self.biases)
        for word, n in counts.items():
            for fold, weight in enumerate(self.words[word][1]):
                sums[fold] += n * weight
        return self._calibrated([s / norm for s in sums])

    def _calibrated(self, dots: list[float]) -> float:
        total = 0.0
        for dot, bias, (a, b) in zip(dots, self.biases, self.sigmoids, strict=True):
            decision = dot + bias
            total += 1.0 / (1.0 + math.exp(a * decision + b))
        return total / len(self.biases)


@cache
def load_classifier() -> _Classifier:
    """Read the package's model once per process (about a second: it imports scikit-learn)."""
    with warnings.catch_warnings():
        # The pickles name the scikit-learn they were made with; the pinned one reads them.
        warnings.simplefilter("ignore")
        from profanity_check import profanity_check as package
    vectorizer, model = package.vectorizer, package.model
    idf = vectorizer.idf_
    folds = model.calibrated_classifiers_
    weights = [fold.estimator.coef_[0] for fold in folds]
    words = {
        word: (float(idf[index]), tuple(float(idf[index] * w[index]) for w in weights))
        for word, index in vectorizer.vocabulary_.items()
    }
    return _Classifier(
        words=words,
        biases=tuple(float(fold.estimator.intercept_[0]) for fold in folds),
        sigmoids=tuple((float(f.calibrators[0].a_), float(f.calibrators[0].b_)) for f in folds),
    )


def profanity_probability(text: str) -> float:
    """The package's probability that `text` is profane or offensive (0..1)."""
    return load_classifier().probability(text)


class ProfanityHook(ModerationHook):
    """Withdraws an answer with a sentence or line that alt-profanity-check's offline model
    scores at or above `threshold` (0..1; 0.9 keeps false positives rare on everyday prose).
    Its verdicts count under `category`. The model loads when the policy is saved or first used."""

    def __init__(self, *, threshold: float = 0.9, category: str = "profanity") -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise TypeError(f"threshold must be a number, not {threshold!r}")
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be above 0 and at most 1, not {threshold}")
        if not isinstance(category, str) or not category.strip():
            raise ValueError("category must be a non-empty string")
        self.threshold = float(threshold)
        self.category = category.strip()
        try:
            classifier = load_classifier()
        except ImportError as exc:  # pragma: no cover - the package is a pinned requirement
            raise ValueError(f"alt-profanity-check is not installed: {exc}") from None
        # Finished sentences come back at every window; each is scored once.
        self._score = lru_cache(maxsize=4096)(classifier.probability)

    def check(self, text: str, *, final: bool) -> Verdict:
        """Every segment, the last one too even while it grows, so a hold-back window works."""
        for segment in _SEGMENT.split(text):
            if not _TOKEN.search(segment):
                continue
            score = self._score(segment)
            if score >= self.threshold:
                reason = f"{self.category} (score {score:.2f}): {segment.strip()[:60]!r}"
                return Verdict(False, reason, (self.category,))
        return ALLOWED
