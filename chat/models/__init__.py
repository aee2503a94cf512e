"""The chat app's models, one concept per module; Django and the rest of the code import them
from here (`chat.models`).

- conversations.py: Conversation, Message (an assistant message keeps how its answer ended).
- policies.py: OutputPolicy, PolicyRevision, RegressionCase, RegressionRun.
- cache.py: CachedAnswer, CachedAnswerSource, PendingEviction (the completion cache's records).
- feedback.py: Feedback (users' ratings of answers, and the implicit signals after a cache hit).
- keys.py: ApiKey (the OpenAI-compatible API's keys).
- identities.py: OidcIdentity (the OpenID Connect provider's user behind an account).
- budgets.py: Budget, BudgetDefault, Usage (token and answer budgets and what was spent).
- user_settings.py: ChatSettings (a user's custom instructions and default policy).
- engines.py: Engine (a model a policy is answered by, beside the default one).
"""

from .budgets import Budget, BudgetDefault, Usage
from .cache import CachedAnswer, CachedAnswerSource, PendingEviction
from .conversations import Conversation, Message
from .engines import Engine
from .feedback import Feedback
from .identities import OidcIdentity
from .keys import ApiKey
from .policies import OutputPolicy, PolicyRevision, RegressionCase, RegressionRun
from .user_settings import ChatSettings

__all__ = [
    "ApiKey",
    "Budget",
    "BudgetDefault",
    "CachedAnswer",
    "CachedAnswerSource",
    "ChatSettings",
    "Conversation",
    "Engine",
    "Feedback",
    "Message",
    "OidcIdentity",
    "OutputPolicy",
    "PendingEviction",
    "PolicyRevision",
    "RegressionCase",
    "RegressionRun",
    "Usage",
]
