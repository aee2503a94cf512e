"""The audit trail: each audited action leaves exactly one record (who, when, what, before and
after), driven through the real admin, the review views, the account pages and real failed
sign-ins; nobody edits or deletes a record in the admin; erasing an account keeps its records
redacted; `manage.py purge` deletes records past their retention.

Real database (SQLite or PostgreSQL) and real Redis (the cache, the throttle counts); no model.
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import sync_to_async
from auditlog.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections
from django.test import AsyncClient, Client
from django.utils import timezone

from chat.infra.audit import audit_expire
from chat.infra.ratelimit import signin_account_limiter, signin_address_limiter
from chat.models import ApiKey, CachedAnswer, OutputPolicy
from chat.stores import review
from chat.stores.apikeys import apikey_create
from tests.conftest import TEST_CACHE_URL
from tests.test_review import approve, edit, open_page, policy, remember, reviewer

pytestmark = [pytest.mark.unit, pytest.mark.django_db(transaction=True)]

PASSWORD = "a-long-pass-phrase-42"


@pytest.fixture(autouse=True)
def fresh_counts(settings, empty_cache):
    """Throttle counts in the test Redis database, which `empty_cache` empties before each test."""
    settings.REDIS_URL = TEST_CACHE_URL


@pytest.fixture
def staff() -> User:
    return User.objects.create_superuser("staffer", "staffer@example.com", PASSWORD)


@pytest.fixture
def staff_client(staff) -> Client:
    client = Client(REMOTE_ADDR="10.9.8.7")
    client.force_login(staff)
    return client


class Trail:
    """The records written since it was made."""

    def __init__(self):
        self.seen = set(LogEntry.objects.values_list("pk", flat=True))

    def new(self) -> list[LogEntry]:
        fresh = LogEntry.objects.exclude(pk__in=self.seen).order_by("pk")
        entries = list(fresh)
        self.seen |= {entry.pk for entry in entries}
        return entries

    def one(self, event: str) -> LogEntry:
        """Exactly one new record, of `event`."""
        entries = self.new()
        assert [e.additional_data["event"] for e in entries] == [event], [
            (e.additional_data, e.changes) for e in entries
        ]
        return entries[0]


def policy_post(**overrides) -> dict:
    """The policy change form as a browser posts it."""
    data = {
        "name": "Audited",
        "slug": "audited",
        "mode": "stream",
        "json_schema": "",
        "constrained": "",
        "examples": "[]",
        "moderation_hooks": "[]",
        "blocklist_terms": "",
        "holdback_chars": "0",
        "failure_action": "reject",
        "fallback_text": "",
        "max_retries": "1",
        "system_prompt": "",
        "max_new_tokens": "64",
        "stop_strings": "[]",
        "extra_eos_tokens": "[]",
        "temperature": "0",
        "top_p": "1",
        "repetition_penalty": "1",
        "no_repeat_ngram_size": "0",
        "frequency_penalty": "0",
        "presence_penalty": "0",
        "feedback_downs_to_review": "3",
        "cache_ttl_seconds": "60",
    }
    for prefix in ("revisions", "regression_cases"):
        data.update(
            {
                f"{prefix}-TOTAL_FORMS": "0",
                f"{prefix}-INITIAL_FORMS": "0",
                f"{prefix}-MIN_NUM_FORMS": "0",
                f"{prefix}-MAX_NUM_FORMS": "1000",
            }
        )
    return {**data, **overrides}


def user_post(user: User, **overrides) -> dict:
    """The admin's user change form as a browser posts it (every box as it stands)."""
    joined = timezone.localtime(user.date_joined)
    data = {
        "username": user.username,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "email": user.email,
        "date_joined_0": joined.strftime("%Y-%m-%d"),
        "date_joined_1": joined.strftime("%H:%M:%S"),
        "last_login_0": "",
        "last_login_1": "",
    }
    for flag in ("is_active", "is_staff", "is_superuser"):
        if getattr(user, flag):
            data[flag] = "on"
    data.update(overrides)
    return {key: value for key, value in data.items() if value is not None}


# -- one record per action --------------------------------------------------------------


def test_policy_create_change_and_delete_in_the_admin_each_leave_one_record(staff, staff_client):
    trail = Trail()
    made = staff_client.post("/admin/chat/outputpolicy/add/", policy_post())
    assert made.status_code == 302, made.content.decode()[:2000]
    policy_row = OutputPolicy.objects.get(slug="audited")
    created = trail.one("outputpolicy.create")
    assert created.actor == staff and created.remote_addr == "10.9.8.7"
    assert created.object_pk == str(policy_row.pk)
    assert created.changes["max_new_tokens"] == [None, 64]

    url = f"/admin/chat/outputpolicy/{policy_row.pk}/change/"
    assert staff_client.post(url, policy_post(max_new_tokens="100")).status_code == 302
    changed = trail.one("outputpolicy.update")
    assert changed.actor == staff
    assert changed.changes["max_new_tokens"] == [64, 100]
    assert changed.changes["version"] == [1, 2]
    assert policy_row.revisions.count() == 2  # its own history (create, change) stays beside it

    deleted = staff_client.post(
        f"/admin/chat/outputpolicy/{policy_row.pk}/delete/", {"post": "yes"}
    )
    assert deleted.status_code == 302 and not OutputPolicy.objects.filter(pk=policy_row.pk).exists()
    gone = trail.one("outputpolicy.delete")
    assert gone.actor == staff and gone.changes["slug"] == ["audited", None]


def test_each_review_action_on_a_cached_answer_leaves_one_record():
    """Approve, edit and reject through their real views, evict and reset as the changelist's
    actions: each a record with who and the status (or text) before and after."""
    record = remember(policy(review_required=True), "The first answer.")
    client = reviewer("rita")
    rita = User.objects.get(username="rita")
    trail = Trail()

    approve(client, record, open_page(client, record))
    approved = trail.one("cachedanswer.approve")
    assert approved.actor == rita and approved.changes == {"status": ["pending", "approved"]}
    assert "What is kept" not in approved.object_repr  # the prompt is the person's, not the trail's

    assert edit(client, record, "An edited answer.", open_page(client, record)).status_code == 200
    edited = trail.one("cachedanswer.edit")
    assert edited.actor == rita
    assert edited.changes == {
        "answer": ["The first answer.", "An edited answer."],
        "status": ["approved", "pending"],
    }

    response = client.post(f"/admin/chat/cachedanswer/{record.pk}/reject/")
    assert response.status_code == 302
    rejected = trail.one("cachedanswer.reject")
    assert rejected.changes == {"status": ["pending", "rejected"]}

    changelist = "/admin/chat/cachedanswer/"
    client.post(changelist, {"action": "reset", "_selected_action": [record.pk]})
    assert trail.one("cachedanswer.reset").changes == {"status": ["rejected", "evicted"]}

    remember(record.policy, "A refill.")  # evicted: the next answer refills it, pending
    record.refresh_from_db()
    assert record.status == CachedAnswer.Status.PENDING
    client.post(changelist, {"action": "evict", "_selected_action": [record.pk]})
    evicted = trail.one("cachedanswer.evict")
    assert evicted.actor == rita and evicted.changes == {"status": ["pending", "evicted"]}
    # A refused approval (the text changed since the page) records nothing.
    approve(client, record, "0" * 64)
    assert trail.new() == []


def test_api_key_create_and_revoke_on_the_account_page_and_in_the_admin(staff, staff_client):
    alice = User.objects.create_user("alice", "alice@example.com", PASSWORD)
    own = Client()
    own.force_login(alice)
    trail = Trail()

    assert own.post("/account/api-keys/", {"create": "", "name": "script"}).status_code == 200
    row = ApiKey.objects.get(user=alice)
    created = trail.one("apikey.create")
    assert created.actor == alice and created.changes["name"] == [None, "script"]
    assert "key_hash" not in created.changes  # the hash of a secret stays out of the trail

    assert own.post("/account/api-keys/", {"revoke": "", "key": str(row.pk)}).status_code == 302
    revoked = trail.one("apikey.revoke")
    assert revoked.actor == alice and revoked.object_pk == str(row.pk)
    assert revoked.changes["revoked_at"][0] is None and revoked.changes["revoked_at"][1]
    # Revoking it again revokes nothing, and records nothing.
    own.post("/account/api-keys/", {"revoke": "", "key": str(row.pk)})
    assert trail.new() == []

    staff_client.post("/admin/chat/apikey/add/", {"user": alice.pk, "name": "ops"})
    ops = ApiKey.objects.get(user=alice, name="ops")
    assert trail.one("apikey.create").actor == staff
    staff_client.post("/admin/chat/apikey/", {"action": "revoke", "_selected_action": [ops.pk]})
    assert trail.one("apikey.revoke").actor == staff


def test_user_create_staff_change_deactivate_and_delete_in_the_admin(staff, staff_client):
    trail = Trail()
    made = staff_client.post(
        "/admin/auth/user/add/",
        {
            "username": "newbie",
            "password1": PASSWORD,
            "password2": PASSWORD,
            "usable_password": "true",
        },
    )
    assert made.status_code == 302, made.content.decode()[:2000]
    newbie = User.objects.get(username="newbie")
    created = trail.one("user.create")
    assert created.actor == staff and created.changes["username"] == [None, "newbie"]
    assert "password" not in created.changes

    url = f"/admin/auth/user/{newbie.pk}/change/"
    response = staff_client.post(url, user_post(newbie, is_staff="on"))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert trail.one("user.update").changes == {"is_staff": [False, True]}

    newbie.refresh_from_db()
    response = staff_client.post(url, user_post(newbie, is_active=None))
    assert response.status_code == 302
    assert trail.one("user.update").changes == {"is_active": [True, False]}

    deleted = staff_client.post(f"/admin/auth/user/{newbie.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302 and not User.objects.filter(pk=newbie.pk).exists()
    gone = trail.one("user.delete")
    assert gone.actor == staff
    # Erased: the record stays, without the name it was about.
    assert "newbie" not in json.dumps([gone.object_repr, gone.changes, gone.additional_data])


@pytest.mark.parametrize("login_path", ["/accounts/login/", "/admin/login/"])
def test_the_failed_sign_in_that_trips_the_throttle_is_recorded_once(login_path):
    target = User.objects.create_user("target", password=PASSWORD, is_staff=True)
    client = Client(REMOTE_ADDR="10.20.30.40")
    trail = Trail()
    for _ in range(signin_account_limiter.limit - 1):
        client.post(login_path, {"username": "target", "password": "wrong"})
    assert trail.new() == []  # failures under the limit are not audited
    client.post(login_path, {"username": "target", "password": "wrong"})
    tripped = trail.one("user.signin_throttled")
    assert tripped.object_pk == str(target.pk) and tripped.actor is None
    assert tripped.remote_addr == "10.20.30.40"
    assert tripped.additional_data["limits"] == ["signin-account"]
    # Refused attempts while throttled, even the right password, record nothing more.
    for password in ("wrong", PASSWORD):
        refused = client.post(login_path, {"username": "target", "password": password})
        assert "Too many failed sign-in attempts" in refused.content.decode()
    assert trail.new() == []


def test_a_name_that_is_no_account_is_not_kept_it_may_be_a_password():
    """People type their password in the name field: a throttled attempt under a name that is
    no account's keeps a marker, never what was typed; an account's name is kept."""
    User.objects.create_user("kept-name", password=PASSWORD)
    client = Client(REMOTE_ADDR="10.20.30.42")
    trail = Trail()
    for n in range(signin_address_limiter.limit - 1):
        client.post("/accounts/login/", {"username": f"guess{n}", "password": "wrong"})
    client.post("/accounts/login/", {"username": "Tr0ub4dor&3-secret", "password": "wrong"})
    tripped = trail.one("user.signin_throttled")
    record = json.dumps([tripped.object_repr, tripped.changes, tripped.additional_data])
    assert "Tr0ub4dor" not in record and tripped.object_repr == "(no such account)"
    assert tripped.additional_data["username"] == ""
    throttled = Client(REMOTE_ADDR="10.20.30.43")
    for _ in range(signin_account_limiter.limit):
        throttled.post("/accounts/login/", {"username": "kept-name", "password": "wrong"})
    named = trail.one("user.signin_throttled")
    assert named.object_repr == "kept-name" and named.additional_data["username"] == "kept-name"


def test_one_address_tripping_its_limit_over_many_names_is_recorded_once():
    client = Client(REMOTE_ADDR="10.20.30.41")
    trail = Trail()
    for n in range(signin_address_limiter.limit):
        client.post("/accounts/login/", {"username": f"guess{n}", "password": "wrong"})
    tripped = trail.one("user.signin_throttled")
    assert tripped.additional_data["limits"] == ["signin-address"]
    assert tripped.additional_data["address"] == "10.20.30.41"
    assert tripped.object_pk == "" and tripped.object_repr == "(no such account)"
    client.post("/accounts/login/", {"username": "guess0", "password": "wrong"})
    assert trail.new() == []


# -- read only in the admin ---------------------------------------------------------------


def test_nobody_adds_changes_or_deletes_a_record_in_the_admin(staff, staff_client):
    """A superuser reads the trail, filtered by actor, action and day; add, change and delete
    answer 403, and the changelist offers no delete."""
    staff_client.post("/admin/chat/outputpolicy/add/", policy_post())
    entry = LogEntry.objects.get(additional_data__event="outputpolicy.create")
    base = "/admin/auditlog/logentry/"
    listing = staff_client.get(base)
    assert listing.status_code == 200 and "output policy created" in listing.content.decode()
    assert "delete_selected" not in listing.content.decode()
    day = timezone.localtime(entry.timestamp)
    for query, shown in [
        ("event=outputpolicy.create", 1),
        ("event=cachedanswer.approve", 0),
        (f"actor__id__exact={staff.pk}", 1),
        (
            f"event=outputpolicy.create&timestamp__year={day.year}&timestamp__month={day.month}"
            f"&timestamp__day={day.day}",
            1,
        ),
        ("timestamp__year=2001&timestamp__month=1&timestamp__day=1", 0),
    ]:
        filtered = staff_client.get(f"{base}?{query}")
        assert filtered.status_code == 200, query
        assert filtered.context["cl"].result_count == shown, query

    record = f"{base}{entry.pk}/"
    assert staff_client.get(f"{record}change/").status_code == 200  # read
    assert staff_client.get(f"{base}add/").status_code == 403
    assert staff_client.post(f"{base}add/", {"object_repr": "forged"}).status_code == 403
    assert staff_client.post(f"{record}change/", {"object_repr": "forged"}).status_code == 403
    assert staff_client.get(f"{record}delete/").status_code == 403
    assert staff_client.post(f"{record}delete/", {"post": "yes"}).status_code == 403
    staff_client.post(base, {"action": "delete_selected", "_selected_action": [entry.pk]})
    entry.refresh_from_db()
    assert entry.object_repr == "Audited (audited v1)"


# -- erasure and retention ------------------------------------------------------------


def test_erasing_an_account_keeps_its_records_and_redacts_its_personal_data(staff_client):
    """Alice, staff, changes a policy, makes a key, trips the sign-in throttle and deletes her
    account on the account page: every record stays, with her id, without her name, e-mail
    address or client address."""
    staff_client.post(
        "/admin/auth/user/add/",
        {
            "username": "alice",
            "password1": PASSWORD,
            "password2": PASSWORD,
            "usable_password": "true",
        },
    )
    alice = User.objects.get(username="alice")
    alice.email, alice.first_name = "alice.liddell@example.com", "Alice"
    alice.is_staff = alice.is_superuser = True
    alice.save()
    client = Client(REMOTE_ADDR="10.1.2.3")
    client.force_login(alice)
    client.post("/admin/chat/outputpolicy/add/", policy_post())
    client.post("/account/api-keys/", {"create": "", "name": "alice's script"})
    for _ in range(signin_account_limiter.limit):
        Client(REMOTE_ADDR="10.1.2.4").post(
            "/accounts/login/", {"username": "alice", "password": "wrong"}
        )
    signin_account_limiter.reset("alice")
    trail_before = LogEntry.objects.count()
    events = set(LogEntry.objects.values_list("additional_data__event", flat=True))
    assert {"user.create", "user.update", "outputpolicy.create", "apikey.create"} <= events
    assert "user.signin_throttled" in events

    deleted = client.post("/account/delete/", {"password": PASSWORD})
    assert deleted.status_code == 302 and not User.objects.filter(pk=alice.pk).exists()

    entries = list(LogEntry.objects.all())
    # Kept, and more: her key's revocation and deletion, her account's deletion.
    assert len(entries) == trail_before + 3
    everything = json.dumps(
        [
            [e.object_repr, e.changes, e.additional_data, e.actor_email, e.remote_addr]
            for e in entries
        ]
    ).lower()
    for personal in ("alice.liddell@example.com", '"alice"', "alice's script (alice)", "10.1.2."):
        assert personal not in everything, personal
    hers = LogEntry.objects.get(additional_data__event="outputpolicy.create")
    assert hers.actor is None and hers.additional_data["actor_id"] == alice.pk
    assert hers.additional_data["redacted_at"]
    assert hers.object_repr == "Audited (audited v1)"  # what she did stays readable
    created = LogEntry.objects.get(additional_data__event="user.create", object_pk=str(alice.pk))
    assert created.changes["username"] == [None, f"[erased user #{alice.pk}]"]


def test_purge_deletes_records_past_their_retention_and_zero_keeps_them(settings, staff_client):
    staff_client.post("/admin/chat/outputpolicy/add/", policy_post())
    staff_client.post("/admin/chat/outputpolicy/add/", policy_post(name="Newer", slug="newer"))
    old = LogEntry.objects.get(
        additional_data__event="outputpolicy.create", object_repr__startswith="Aud"
    )
    LogEntry.objects.filter(pk=old.pk).update(timestamp=timezone.now() - timedelta(days=400))
    settings.CHAT_AUDIT_RETENTION_DAYS = 0
    out = StringIO()
    call_command("purge", stdout=out)
    assert "audit trail kept" in out.getvalue() and LogEntry.objects.filter(pk=old.pk).exists()
    settings.CHAT_AUDIT_RETENTION_DAYS = 365
    out = StringIO()
    call_command("purge", stdout=out)
    assert "1 audit record(s) over 365 days old deleted" in out.getvalue()
    assert not LogEntry.objects.filter(pk=old.pk).exists()
    assert LogEntry.objects.filter(additional_data__event="outputpolicy.create").count() == 1
    assert audit_expire(days=365) == 0


def test_a_cached_answer_erased_with_its_conversations_leaves_its_records_without_its_text():
    record = remember(policy(review_required=True), "Text that repeats a prompt.")
    client = reviewer("rita")
    edit(client, record, "Text edited by staff.", open_page(client, record))
    record.sources.first().conversation.delete()  # its one holder deleted: the answer erased
    assert not CachedAnswer.objects.filter(pk=record.pk).exists()
    kept = LogEntry.objects.get(additional_data__event="cachedanswer.edit")
    assert kept.changes["answer"] == ["[erased with the cached answer]"] * 2


def test_a_revoked_key_of_the_command_line_is_recorded_without_an_actor():
    alice = User.objects.create_user("alice", password=PASSWORD)
    row, _ = apikey_create(user=alice)
    answer_policy = policy(review_required=False)
    trail = Trail()
    call_command("apikey", "revoke", str(row.pk), stdout=StringIO())
    revoked = trail.one("apikey.revoke")
    assert revoked.actor is None and "actor_id" not in revoked.additional_data
    review_record = remember(answer_policy, "x")
    assert review.answer_evict(record_id=review_record.pk)
    assert trail.one("cachedanswer.evict").actor is None


async def test_over_asgi_the_actor_and_the_address_behind_a_trusted_proxy_are_recorded(
    settings, staff
):
    """The async middleware path (as daphne serves it): the signed-in actor, and the address
    the trusted proxy appended, not the one the client wrote."""
    settings.CHAT_TRUSTED_PROXIES = 1
    client = AsyncClient()
    await client.aforce_login(staff)
    made = await client.post(
        "/admin/chat/outputpolicy/add/",
        policy_post(),
        headers={"x-forwarded-for": "6.6.6.6, 192.0.2.10"},
    )
    assert made.status_code == 302
    entry = await sync_to_async(LogEntry.objects.select_related("actor").get)(
        additional_data__event="outputpolicy.create"
    )
    # The view's thread holds its own connection: closed, so the test database can be dropped.
    await sync_to_async(connections.close_all)()
    assert entry.actor == staff and entry.remote_addr == "192.0.2.10"


def test_budget_changes_leave_one_record_each_and_are_redacted_with_the_account(staff_client):
    """A budget set from the command line, changed in the admin, and the default for new
    accounts: one record each, with the limits before and after; erasing the account keeps its
    budget's records without its name."""
    alice = User.objects.create_user("alice", password=PASSWORD)
    trail = Trail()
    call_command("budget", "set", "--user", "alice", "--daily-tokens", "200", stdout=StringIO())
    made = trail.one("budget.create")
    assert made.changes["daily_tokens"] == [None, 200] and made.actor is None
    budget = alice.budgets.get()
    changed = staff_client.post(
        f"/admin/chat/budget/{budget.pk}/change/",
        {
            "user": alice.pk,
            "api_key": "",
            "daily_tokens": "500",
            "monthly_tokens": "",
            "daily_answers": "",
            "monthly_answers": "",
        },
    )
    assert changed.status_code == 302, changed.content.decode()[:2000]
    update = trail.one("budget.update")
    assert update.changes == {"daily_tokens": [200, 500]} and update.actor is not None
    call_command("budget", "set", "--default", "--daily-answers", "20", stdout=StringIO())
    assert trail.one("budgetdefault.create").changes["daily_answers"] == [None, 20]

    from chat.stores.erasure import account_erase

    account_erase(user=alice)
    about_budget = LogEntry.objects.filter(object_pk=str(budget.pk), content_type__model="budget")
    assert about_budget.count() == 3  # made, changed, deleted with the account
    assert "alice" not in json.dumps([[e.object_repr, e.changes] for e in about_budget])
