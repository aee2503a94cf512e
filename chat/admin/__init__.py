"""The chat app's admin, one concept per module. Django's autodiscover imports `chat.admin`; this
imports every module, so each registers its ModelAdmins.

- chats.py: conversations and messages.
- accounts.py: users (deleted as they delete themselves) and their API keys.
- engines.py: the engines policies are answered by (beside the default one), and their state.
- policies.py: output policies, their workbench (try a draft, run the regression set), revisions
  and regression runs.
- review.py: cached answers' review (approve, edit, reject, evict, reset).
- feedback.py: users' feedback on answers, read only, each linking to its answer's review.
- audit.py: the audit trail, read only.
- budgets.py: token and answer budgets per user and API key, and the default for new accounts.
- read_only.py: the mixin of what nobody edits (the audit trail, feedback).
"""

from django.contrib import admin

from ..accounts.sign_in import AdminSignInForm
from . import accounts, audit, budgets, chats, engines, feedback, policies, review

# /admin/login/ counts failed attempts exactly like the page's sign-in.
admin.site.login_form = AdminSignInForm

__all__ = ["accounts", "audit", "budgets", "chats", "engines", "feedback", "policies", "review"]
