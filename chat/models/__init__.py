"""The chat app's models, one concept per module; Django and the rest of the code import them
from here (`chat.models`).

- conversations.py: Conversation, Message (an assistant message keeps how its answer ended).
- policies.py: OutputPolicy, PolicyRevision, RegressionCase, RegressionRun.
- cache.py: CachedAnswer, CachedAnswerSource, PendingEviction (the completion cache's records).
- keys.py: ApiKey (the OpenAI-compatible API's keys).
- budgets.py: Budget, BudgetDefault, Usage (token and answer budgets and what was spent).
"""

from .budgets import Budget, BudgetDefault, Usage
from .cache import CachedAnswer, CachedAnswerSource, PendingEviction
from .conversations import Conversation, Message
from .keys import ApiKey
from .policies import OutputPolicy, PolicyRevision, RegressionCase, RegressionRun

__all__ = [
    "ApiKey",
    "Budget",
    "BudgetDefault",
    "CachedAnswer",
    "CachedAnswerSource",
    "Conversation",
    "Message",
    "OutputPolicy",
    "PendingEviction",
    "PolicyRevision",
    "RegressionCase",
    "RegressionRun",
    "Usage",
]
