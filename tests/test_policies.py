"""Output policies: validation on save, the admin, and each mode end to end on the real model."""

import pytest
from asgiref.sync import sync_to_async
from django import forms
from django.contrib.auth.models import User
from django.test import Client

from chat.models import Message, OutputPolicy, PolicyRevision
from chat.policy import instance_errors
from chat.stores.policy_store import policy_errors
from tests.conftest import chunks_text

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
}


def policy_form(policy: OutputPolicy):
    """The admin's policy form, bound to `policy`'s values as a browser would post them."""
    from chat.admin.policies import OutputPolicyForm

    data = {}
    for name, field in OutputPolicyForm.base_fields.items():
        value = getattr(policy, name)
        data[name] = field.prepare_value(value) if isinstance(field, forms.JSONField) else value
    return OutputPolicyForm(data=data)


def kinds(events):
    return [e["type"] for e in events]


# -- save-time validation -----------------------------------------------------------


@pytest.mark.integration
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"json_schema": {"type": "objekt"}}, "json_schema", "not a valid JSON Schema"),
        ({"json_schema": {"required": "answer"}}, "json_schema", "not a valid JSON Schema"),
        ({"extra_eos_tokens": ["<|no_such_token|>"]}, "extra_eos_tokens", "not a single token"),
        ({"extra_eos_tokens": "<|im_end|>"}, "extra_eos_tokens", "JSON list"),
        ({"stop_strings": ["ok", ""]}, "stop_strings", "JSON list of non-empty strings"),
        ({"moderation_hooks": [{"hook": "no.such.Hook"}]}, "moderation_hooks", "no.such.Hook"),
        (
            {"moderation_hooks": [{"hook": "blocklist", "settings": {"patterns": ["("]}}]},
            "moderation_hooks",
            "(",
        ),
        ({"examples": [{"user": "hi"}]}, "examples", "list of"),
        ({"constrained": True}, "constrained", "needs a JSON Schema"),
        ({"failure_action": "fallback"}, "fallback_text", "needs a fallback text"),
        ({"max_new_tokens": 100000}, "max_new_tokens", "CHAT_MAX_NEW_TOKENS_CAP"),
    ],
)
def test_saving_a_bad_policy_is_refused_with_a_clear_message(runtime, fields, field, message):
    """The admin's form refuses it, with the reason on the field to change."""
    form = policy_form(OutputPolicy(name="x", slug="x", **fields))
    assert not form.is_valid()
    assert field in form.errors, form.errors
    assert any(message in m for m in form.errors[field])
    # The same check, as the form makes it, on the unsaved row
    errors = policy_errors(
        OutputPolicy(name="x", slug="x", **fields), tokenizer=runtime.tokenizer()
    )
    assert any(message in m for m in errors[field])


@pytest.mark.unit
@pytest.mark.django_db
def test_a_policy_that_samples_without_a_seed_is_not_cached():
    """Sampling without a seed never gives the same answer twice: caching it is refused, with
    the way out; with a seed, or greedy, or with caching off, it passes."""
    unseeded = OutputPolicy(name="s", slug="s", temperature=0.7, cache_enabled=True)
    assert "set a seed" in policy_errors(unseeded)["cache_enabled"][0]
    for fine in (
        OutputPolicy(name="s", slug="s", temperature=0.7, seed=3, cache_enabled=True),
        OutputPolicy(name="s", slug="s", temperature=0.0, cache_enabled=True),
        OutputPolicy(name="s", slug="s", temperature=0.7, cache_enabled=False),
    ):
        assert "cache_enabled" not in policy_errors(fine)


@pytest.mark.integration
@pytest.mark.django_db
def test_a_valid_policy_passes_and_its_version_moves_only_on_change(runtime, make_policy):
    policy = make_policy(
        slug="v",
        json_schema=ANSWER_SCHEMA,
        extra_eos_tokens=["<|endoftext|>"],
        stop_strings=["\nUser:"],
    )
    assert policy.version == 1
    policy.save()
    assert OutputPolicy.objects.get(pk=policy.pk).version == 1
    policy.max_new_tokens = 64
    policy.save()
    assert OutputPolicy.objects.get(pk=policy.pk).version == 2


@pytest.mark.integration
@pytest.mark.django_db
def test_staff_edit_policies_in_the_admin_and_every_change_is_recorded(runtime, example_policies):
    """An invalid schema is refused on the form; a valid change bumps the version and is logged with who."""
    staff = User.objects.create_superuser("staff", "staff@example.com", "pw")
    client = Client()
    client.force_login(staff)
    policy = example_policies["json"]
    url = f"/admin/chat/outputpolicy/{policy.pk}/change/"
    form = client.get(url)
    assert (
        form.status_code == 200
        and "history (who changed what, when)" in form.content.decode().lower()
    )
    data = {
        "name": policy.name,
        "slug": policy.slug,
        "mode": "buffer",
        "json_schema": '{"type": "objekt"}',
        "constrained": "",
        "examples": "[]",
        "moderation_hooks": "[]",
        "blocklist_terms": "",
        "holdback_chars": "0",
        "failure_action": "reject",
        "fallback_text": "",
        "max_retries": "1",
        "system_prompt": "",
        "max_new_tokens": "100",
        "stop_strings": "[]",
        "extra_eos_tokens": "[]",
        "temperature": "0",
        "top_p": "1",
        "repetition_penalty": "1",
        "no_repeat_ngram_size": "0",
        "frequency_penalty": "0",
        "presence_penalty": "0",
        "cache_enabled": "on",
        "cache_ttl_seconds": "60",
        "feedback_downs_to_review": "3",
        "revisions-TOTAL_FORMS": "0",
        "revisions-INITIAL_FORMS": "0",
        "revisions-MIN_NUM_FORMS": "0",
        "revisions-MAX_NUM_FORMS": "1000",
        "regression_cases-TOTAL_FORMS": "0",
        "regression_cases-INITIAL_FORMS": "0",
        "regression_cases-MIN_NUM_FORMS": "0",
        "regression_cases-MAX_NUM_FORMS": "1000",
    }
    refused = client.post(url, data)
    assert refused.status_code == 200 and "not a valid JSON Schema" in refused.content.decode()
    assert OutputPolicy.objects.get(pk=policy.pk).version == 1
    data["json_schema"] = '{"type": "object", "required": ["answer"]}'
    saved = client.post(url, data)
    assert saved.status_code == 302
    policy.refresh_from_db()
    assert policy.version == 2 and policy.max_new_tokens == 100
    revision = PolicyRevision.objects.get(policy=policy, version=2)
    assert revision.changed_by == staff
    assert revision.changes["max_new_tokens"] == [128, 100]
    assert revision.changes["json_schema"][1] == {"type": "object", "required": ["answer"]}


@pytest.mark.unit
@pytest.mark.django_db
def test_policy_editing_needs_staff(example_policies):
    member = User.objects.create_user("member", password="pw")
    client = Client()
    client.force_login(member)
    response = client.get(f"/admin/chat/outputpolicy/{example_policies['json'].pk}/change/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


# -- the modes over the WebSocket --------------------------------------------------

pytestmark_ws = pytest.mark.django_db(transaction=True)


@pytest.mark.integration
@pytestmark_ws
async def test_unknown_policy_is_an_error(client, example_policies):
    await client.prompt("Hi", policy="nope", request_id="p")
    error = await client.receive()
    assert (error["code"], error["request_id"]) == ("unknown_policy", "p")
    assert "chat" in error["message"] and "json" in error["message"]


@pytest.mark.integration
@pytestmark_ws
async def test_buffer_mode_sends_no_chunk_and_a_schema_valid_json(client, example_policies):
    """The json policy: `buffering`, then one `done` with json valid against the schema."""
    request_id = await client.prompt("What is the capital of France?", policy="json")
    events = await client.receive_until("done", request_id)
    assert kinds(events)[:2] == ["accepted", "buffering"] and "chunk" not in kinds(events)
    done = events[-1]
    assert done["finish_reason"] in ("eos", "length") and done["policy"] == "json"
    assert instance_errors(done["json"], ANSWER_SCHEMA) == []
    assert (
        done["metrics"]["held_ms"] > 0 and done["metrics"]["ttfv_ms"] >= done["metrics"]["ttft_ms"]
    )
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    assert (message.outcome, message.json_value, message.policy_version) == ("ok", done["json"], 1)
    assert message.held_ms > 0


@pytest.mark.integration
@pytestmark_ws
async def test_buffer_mode_reasks_and_then_rejects_an_answer_that_stays_invalid(
    client, make_policy
):
    """An impossible schema: the model is re-asked max_retries times, then `invalid` with the reason."""
    impossible = {
        "type": "object",
        "required": ["answer"],
        "properties": {"answer": {"type": "integer", "minimum": 10**9}},
    }
    await sync_to_async(make_policy)(
        slug="strict", mode="buffer", json_schema=impossible, max_retries=1, max_new_tokens=40
    )
    request_id = await client.prompt("What is the capital of France?", policy="strict")
    events = await client.receive_until("done", request_id)
    assert "chunk" not in kinds(events) and "buffering" in kinds(events)
    done = events[-1]
    assert done["finish_reason"] == "invalid" and done["json"] is None and done["text"] == ""
    assert done["metrics"]["retries"] == 1 and done["reason"]
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    assert message.outcome == "invalid" and message.retries == 1 and message.raw_text


@pytest.mark.integration
@pytestmark_ws
async def test_fallback_text_replaces_an_answer_that_stays_invalid(client, make_policy):
    impossible = {"type": "array", "minItems": 1000}
    await sync_to_async(make_policy)(
        slug="fb",
        mode="buffer",
        json_schema=impossible,
        max_retries=0,
        max_new_tokens=30,
        failure_action="fallback",
        fallback_text="Sorry, no answer.",
    )
    request_id = await client.prompt("Hi", policy="fb")
    done = (await client.receive_until("done", request_id))[-1]
    assert (done["finish_reason"], done["text"]) == ("invalid", "Sorry, no answer.")


@pytest.mark.integration
@pytestmark_ws
async def test_constrained_decoding_yields_valid_json_without_examples(client, make_policy):
    """With constrained decoding on, even an unprimed prompt gives schema-valid JSON."""
    await sync_to_async(make_policy)(
        slug="cjson",
        mode="buffer",
        json_schema=ANSWER_SCHEMA,
        constrained=True,
        max_new_tokens=60,
        max_retries=0,
    )
    request_id = await client.prompt("How many legs does a spider have?", policy="cjson")
    done = (await client.receive_until("done", request_id))[-1]
    assert done["finish_reason"] in ("eos", "length"), done
    assert instance_errors(done["json"], ANSWER_SCHEMA) == []


@pytest.mark.integration
@pytestmark_ws
async def test_stream_mode_retracts_and_stops_when_a_blocklisted_word_appears(client, make_policy):
    """A blocked term mid-stream: `retract`, generation stops early, nothing withdrawn is stored as text."""
    await sync_to_async(make_policy)(
        slug="clean", mode="stream", blocklist_terms="12", max_new_tokens=200
    )
    request_id = await client.prompt("Count from 1 to 50, separated by commas.", policy="clean")
    events = await client.receive_until("done", request_id)
    assert "chunk" in kinds(events) and "retract" in kinds(events)
    assert kinds(events).index("chunk") < kinds(events).index("retract")
    retract = next(e for e in events if e["type"] == "retract")
    assert "12" in retract["reason"]
    done = events[-1]
    assert done["finish_reason"] == "moderated" and done["text"] == ""
    assert done["metrics"]["new_tokens"] < 100
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    assert message.outcome == "moderated" and message.text == "" and "12" in message.raw_text


@pytest.mark.integration
@pytestmark_ws
async def test_auto_mode_streams_prose_and_holds_back_the_json_block(client, make_policy):
    """Prose streams; from the ```json fence on, text is held until it validates."""
    fence_example = 'The sky is blue.\n```json\n{"answer": "blue"}\n```'
    await sync_to_async(make_policy)(
        slug="mixed",
        mode="auto",
        json_schema=ANSWER_SCHEMA,
        max_new_tokens=80,
        system_prompt="Answer in one sentence, then repeat the answer as JSON in a json code block.",
        examples=[{"user": "What color is the sky?", "assistant": fence_example}],
    )
    request_id = await client.prompt("What is 2 plus 2?", policy="mixed")
    events = await client.receive_until("done", request_id)
    order = kinds(events)
    assert "buffering" in order and order.index("chunk") < order.index("buffering")
    streamed_before_hold = chunks_text(events[: order.index("buffering")])
    assert "`" not in streamed_before_hold and streamed_before_hold.strip()
    done = events[-1]
    assert done["finish_reason"] in ("eos", "length")
    assert instance_errors(done["json"], ANSWER_SCHEMA) == []
    assert done["text"].startswith(streamed_before_hold) and "```json" in done["text"]
    assert chunks_text(events) == streamed_before_hold  # the held part arrives with `done` only


@pytest.mark.integration
@pytestmark_ws
async def test_default_policy_streams_prose(client, example_policies):
    """With no policy named, the default `chat` policy streams chunks as before."""
    request_id = await client.prompt("Count from 1 to 10, separated by commas.")
    events = await client.receive_until("done", request_id)
    assert "chunk" in kinds(events) and "buffering" not in kinds(events)
    assert events[-1]["policy"] == "chat"


# -- a failed answer explains itself -------------------------------------------------

# Three tokens cannot hold a whole {"name": ..., "chip": ...}: the answer fails whatever it says.
CAT_SCHEMA = {
    "title": "A cat",
    "description": "its name and microchip number",
    "type": "object",
    "properties": {"name": {"type": "string"}, "chip": {"type": "integer"}},
    "required": ["name", "chip"],
}
CUT_JSON = {
    "mode": "buffer",
    "json_schema": CAT_SCHEMA,
    "description": "Facts about a cat, as JSON a program can read",
    "system_prompt": 'Reply only with JSON like {"name": "...", "chip": 1}.',
    "max_new_tokens": 3,
    "max_retries": 0,
}


@pytest.mark.integration
@pytestmark_ws
async def test_an_invalid_answer_says_why_and_what_was_expected_and_keeps_it(client, make_policy):
    await sync_to_async(make_policy)(slug="cat", **CUT_JSON)
    request_id = await client.prompt("Describe a cat as JSON.", policy="cat")
    done = (await client.receive_until("done", request_id))[-1]
    assert done["finish_reason"] == "invalid", done
    explanation = done["explanation"]
    assert explanation["kind"] == "invalid" and explanation["summary"]
    assert explanation["expected"] == (
        "Facts about a cat, as JSON a program can read. A cat. its name and microchip number."
    )
    assert explanation["detail"] == " ".join(done["reason"].split())
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    # The policy shows failed text by default: what the model wrote, as stored for review.
    assert explanation.get("raw_text") == (message.raw_text or None)
    assert message.explanation == explanation


@pytest.mark.integration
@pytestmark_ws
async def test_a_policy_may_keep_the_failed_text_to_itself(client, make_policy):
    await sync_to_async(make_policy)(slug="cat-quiet", show_failed_text=False, **CUT_JSON)
    request_id = await client.prompt("Describe a cat as JSON.", policy="cat-quiet")
    done = (await client.receive_until("done", request_id))[-1]
    assert done["finish_reason"] == "invalid" and done["explanation"]["kind"] == "invalid"
    assert "raw_text" not in done["explanation"]


@pytest.mark.integration
@pytestmark_ws
async def test_a_withdrawn_answer_is_explained_without_its_text_whatever_the_policy(
    client, make_policy
):
    """A pattern every answer matches withdraws it; show_failed_text never reaches moderation."""
    await sync_to_async(make_policy)(
        slug="nothing",
        mode="buffer",
        json_schema=ANSWER_SCHEMA,
        constrained=True,  # JSON, so never an empty answer
        moderation_hooks=[{"hook": "blocklist", "settings": {"patterns": [r"\S"]}}],
        show_failed_text=True,
        max_new_tokens=8,
        max_retries=0,
    )
    request_id = await client.prompt("What is the capital of France?", policy="nothing")
    done = (await client.receive_until("done", request_id))[-1]
    assert done["finish_reason"] == "moderated" and done["text"] == ""
    explanation = done["explanation"]
    assert explanation["kind"] == "moderated" and "raw_text" not in explanation
    assert "blocked pattern" in explanation["detail"]
    message = await sync_to_async(Message.objects.get)(pk=done["message"])
    assert message.raw_text.strip() and message.explanation == explanation
    # The stored answer, as a reloaded page reads it, holds the same and no more.
    detail = await sync_to_async(client_conversation)(message)
    stored = next(m for m in detail["messages"] if m["id"] == message.pk)
    assert stored["explanation"] == explanation and stored["text"] == ""


def client_conversation(message: Message) -> dict:
    from chat.stores.selectors import Owner, conversation_detail

    conversation = message.conversation
    owner = Owner(user_id=conversation.user_id, session_key=conversation.session_key)
    detail = conversation_detail(owner, conversation.pk)
    assert detail is not None
    return detail


@pytest.mark.integration
@pytest.mark.django_db
def test_how_a_failure_is_shown_is_no_part_of_the_answers_identity(make_policy):
    """Describing a policy or hiding failed text changes no answer: the same identity, so its
    cached answers stay; but the version moves, so every process reads the new presentation."""
    from chat.stores.policy_store import resolve
    from chat.turns.identity import policy_digest

    policy = make_policy(slug="cat-id", **CUT_JSON)
    before = resolve(policy)
    policy.description = "Something else entirely"
    policy.show_failed_text = False
    policy.save()
    after = resolve(policy)
    assert after.version == before.version + 1
    assert (after.description, after.show_failed_text) == ("Something else entirely", False)
    assert policy_digest(after) == policy_digest(before)
