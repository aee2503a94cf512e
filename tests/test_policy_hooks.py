"""Unit tests for the hold-back window and the personal data hook: pure Python, no model."""

from __future__ import annotations

import random

import pytest

from chat.policy import (
    BlocklistHook,
    Cut,
    Emit,
    Hold,
    HookConfigError,
    ModerationHook,
    RepetitionHook,
    Retract,
    Verdict,
    gate_for,
    load_hook,
    moderate,
)
from chat.policy.pii import MASK_HOLDBACK, PersonalDataHook, iban_valid, luhn_valid

pytestmark = pytest.mark.unit


def feed_all(gate, chunks):
    actions = []
    for chunk in chunks:
        actions += gate.feed(chunk)
    final, outcome = gate.finish()
    return actions + final, outcome


def shown_text(actions) -> str:
    return "".join(a.text for a in actions if isinstance(a, Emit))


# --- the hold-back window -----------------------------------------------------------


def test_holdback_shows_text_w_characters_behind_the_model():
    """While text arrives, it is shown W to 1.5 W characters behind the model; the rest at the end."""
    gate = gate_for("stream", hooks=[], holdback_chars=10)
    text = "The quick brown fox jumps over the lazy dog."
    shown = ""
    for char in text:
        shown += shown_text(gate.feed(char))
        assert gate.shown == shown
        assert len(gate.text) - 15 < len(shown) <= max(0, len(gate.text) - 10)
    actions, outcome = gate.finish()
    assert shown + shown_text(actions) == text and outcome.status == "ok"


def test_a_blocked_term_inside_the_window_is_never_shown():
    """With W > 0 the term is caught before release: retract with nothing of it shown."""
    text = "Hello there, this part is fine and long enough. Then darn it all."
    gate = gate_for("stream", hooks=[BlocklistHook(terms=["darn"])], holdback_chars=8)
    actions, outcome = feed_all(gate, list(text))
    assert isinstance(actions[-1], Retract) and outcome.status == "moderated"
    assert "darn" not in shown_text(actions) and shown_text(actions)  # the good start was shown
    assert text.startswith(shown_text(actions))


def test_without_a_window_the_term_is_shown_then_withdrawn():
    """W = 0 keeps the old behaviour: shown as it comes, withdrawn after."""
    text = "Hello there, this part is fine and long enough. Then darn it all."
    gate = gate_for("stream", hooks=[BlocklistHook(terms=["darn"])], window_chars=8)
    actions, outcome = feed_all(gate, list(text))
    assert "darn" in shown_text(actions) and isinstance(actions[-1], Retract)


def test_a_cut_shows_the_held_part_of_what_is_kept_then_cuts():
    """A loop cut with a window longer than the loop: none of the loop is ever shown; the kept
    text still held back is emitted, then Cut with all of it (a prefix of what was shown)."""
    text = "Red, blue and green. " + "Yellow is nice too. " * 8
    kept = "Red, blue and green. Yellow is nice too."
    for window, loop_shown in ((200, False), (30, True)):
        gate = gate_for("stream", hooks=[RepetitionHook()], holdback_chars=window)
        actions, outcome = feed_all(gate, [text[i : i + 3] for i in range(0, len(text), 3)])
        cuts = [a for a in actions if isinstance(a, Cut)]
        assert len(cuts) == 1 and outcome.status == "ok" and cuts[0].text == outcome.text == kept
        before_cut = shown_text(actions[: actions.index(cuts[0])])
        assert before_cut.startswith(kept) and (len(before_cut) > len(kept)) == loop_shown


def test_auto_mode_with_a_window_says_hold_after_the_last_prose():
    """Prose still in the window when the JSON block starts is shown before `buffering`."""
    text = 'Here it is, as asked.\n```json\n{"answer": "ok"}\n```'
    gate = gate_for("auto", hooks=[], holdback_chars=12)
    actions, outcome = feed_all(gate, list(text))
    hold = next(i for i, a in enumerate(actions) if isinstance(a, Hold))
    assert not any(isinstance(a, Emit) for a in actions[hold:])
    assert shown_text(actions) == "Here it is, as asked.\n" and outcome.json == {"answer": "ok"}


def test_bad_holdback_is_refused():
    with pytest.raises(ValueError, match="holdback_chars"):
        gate_for("stream", hooks=[], holdback_chars=-1)
    with pytest.raises(ValueError, match="holdback_chars"):
        gate_for("stream", hooks=[], holdback_chars=True)


# --- masks --------------------------------------------------------------------------

PERSONAL = (
    "Sure! You can reach Jane at jane.doe@example.com or call +1 555 123 4567. "
    "Her card is 4111 1111 1111 1111. IBAN GB82 WEST 1234 5698 7654 32. Bye!"
)
MASKED = (
    "Sure! You can reach Jane at [email] or call [phone]. Her card is [card]. IBAN [iban]. Bye!"
)
RAW_PIECES = ("jane.doe", "example.com", "555", "4567", "4111", "GB82", "WEST", "7654")


def test_a_mask_hook_forces_a_window_even_when_the_policy_has_none():
    """W = 0 with a mask hook: the gate holds back the mask's minimum, so raw text never shows."""
    assert gate_for("stream", hooks=[PersonalDataHook()]).holdback == MASK_HOLDBACK
    assert gate_for("stream", hooks=[PersonalDataHook()], holdback_chars=200).holdback == 200
    assert gate_for("stream", hooks=[PersonalDataHook(action="block")]).holdback == 0


@pytest.mark.parametrize("mode", ["stream", "auto", "buffer"])
def test_masked_text_is_all_that_is_shown_and_kept_whatever_the_chunking(mode):
    rng = random.Random(7)
    for _ in range(60):
        cuts = sorted(rng.sample(range(1, len(PERSONAL)), rng.randint(1, 60)))
        chunks = [PERSONAL[a:b] for a, b in zip([0, *cuts], [*cuts, len(PERSONAL)], strict=True)]
        gate = gate_for(mode, hooks=[PersonalDataHook()], schema=None)
        actions, outcome = feed_all(gate, chunks)
        shown = shown_text(actions)
        assert not any(piece in shown for piece in RAW_PIECES), shown
        assert not any(piece in gate.raw for piece in RAW_PIECES)
        if mode != "buffer":
            assert shown + outcome.held_text == MASKED
        assert outcome.text == MASKED and "email" in (gate.masked or "")


def test_a_mask_chains_into_the_next_hook():
    """Hooks after a mask judge the masked text; the result carries the masked text."""
    hooks = [PersonalDataHook(), BlocklistHook(terms=["jane.doe@example.com"])]
    verdict = moderate(hooks, "write to jane.doe@example.com today", final=True)
    assert verdict.allowed and verdict.replacement == "write to [email] today"
    assert verdict.categories == ("email",)


def test_a_mask_of_text_already_shown_withdraws_the_answer():
    """A hook that masks without asking for a window cannot unshow text: the answer is withdrawn."""

    class LateMask(ModerationHook):
        def check(self, text: str, *, final: bool) -> Verdict:
            return Verdict(True, "secret", ("secret",), replacement=text.replace("secret", "***"))

    gate = gate_for("stream", hooks=[LateMask()], window_chars=8)
    actions, outcome = feed_all(gate, list("the secret is out, and it was shown"))
    assert isinstance(actions[-1], Retract) and "already shown" in actions[-1].reason
    assert "secret" not in gate.raw  # what is stored for review is masked too


# --- the personal data hook ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("mail jane.doe@example.com now", "email"),
        ("a.b+tag@mail.example.co.uk.", "email"),
        ("call +44 20 7946 0958 today", "phone"),
        ("call (555) 123-4567 ext", "phone"),
        ("call 020 7946 0958 now", "phone"),
        ("card 4111 1111 1111 1111 ok", "card"),
        ("card 5500-0000-0000-0004 ok", "card"),
        ("amex 3782 822463 10005 ok", "card"),
        ("card 4111111111111111 ok", "card"),
        ("iban GB82 WEST 1234 5698 7654 32 ok", "iban"),
        ("iban DE89370400440532013000.", "iban"),
    ],
)
def test_personal_data_found(text, kind):
    verdict = PersonalDataHook().check(text, final=True)
    assert verdict.allowed and verdict.categories == (kind,)
    assert f"[{kind}]" in (verdict.replacement or "")


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112 fails Luhn",
        "On 2024-01-15 we met",
        "pi is 3.14159265",
        "the years 1999-2001",
        "population 8,000,000,000",
        "Order 12345678 shipped",
        "version 1.2.3.4 and 12:30 to 14:45",
        "ISBN 978-3-16-148410-0",
        "ISBN 978-1-68-583718-5 passes Luhn but is grouped as an ISBN",
        "user @ example dot com",
    ],
)
def test_look_alikes_are_not_personal_data(text):
    assert PersonalDataHook().check(text, final=True).replacement is None


def test_checksums():
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert iban_valid("GB82 WEST 1234 5698 7654 32") and not iban_valid("GB82WEST12345698765433")
    assert not iban_valid("GB82")


def test_block_action_and_kinds_and_placeholder():
    block = PersonalDataHook(action="block", kinds=["card"])
    verdict = block.check("pay with 4111 1111 1111 1111 please", final=True)
    assert not verdict.allowed and verdict.categories == ("card",)
    assert block.check("mail jane@example.com please", final=True).allowed
    custom = PersonalDataHook(placeholder="<{kind} removed>")
    assert custom.check("mail jane@example.com please", final=True).replacement == (
        "mail <email removed> please"
    )


def test_a_match_that_may_still_grow_waits_while_streaming():
    """ "4111 1111 1111" could become a card number: not masked (as a phone) until it is complete."""
    hook = PersonalDataHook()
    assert hook.check("pay with 4111 1111 1111", final=False).replacement is None
    assert hook.check("pay with 4111 1111 1111 11", final=False).replacement is None
    done = hook.check("pay with 4111 1111 1111 1111 today, thanks", final=False)
    assert done.replacement == "pay with [card] today, thanks"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"action": "hide"}, "action"),
        ({"kinds": ["ssn"]}, "kinds"),
        ({"kinds": "email"}, "kinds"),
        ({"placeholder": "{who}"}, "placeholder"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_personal_data_settings_errors(config, message):
    with pytest.raises(HookConfigError, match=message):
        load_hook("personal_data", config)


# --- the profanity classifier -------------------------------------------------------

CLASSIFIED = [
    "you are a fucking idiot",
    "have a nice day",
    "I will kill you",
    "shit happens",
    "Damn, that was a hard exam.",
    "the and of",
    "",
]


def test_the_hand_evaluated_model_gives_the_package_probability():
    """The word-weight evaluation is the package's own model, not an approximation of it."""
    import warnings

    from chat.policy.profanity import profanity_probability

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from profanity_check import predict_prob

    expected = predict_prob(CLASSIFIED)
    for text, probability in zip(CLASSIFIED, expected, strict=True):
        assert profanity_probability(text) == pytest.approx(float(probability), abs=1e-9)


def test_profanity_hook_vetoes_a_sentence_over_the_threshold_and_names_it():
    from chat.policy.profanity import ProfanityHook

    hook = ProfanityHook()
    text = "Here is the summary you asked for. You are a fucking idiot. Have a nice day."
    verdict = hook.check(text, final=False)
    assert not verdict.allowed and verdict.categories == ("profanity",)
    assert "idiot" in verdict.reason and verdict.cut_at is None
    assert hook.check("The weather in spring is mild and pleasant.", final=True).allowed
    # A lower threshold also catches the milder sentence; categories are named by the policy.
    mild = ProfanityHook(threshold=0.5, category="rude").check("Damn, that was hard.", final=True)
    assert not mild.allowed and mild.categories == ("rude",)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"threshold": 0}, "threshold"),
        ({"threshold": "high"}, "threshold"),
        ({"category": ""}, "category"),
    ],
)
def test_profanity_settings_errors(config, message):
    with pytest.raises(HookConfigError, match=message):
        load_hook("profanity", config)


# --- the shape a settings form is built from ----------------------------------------

FORM_TYPES = (str, int, float, bool, list[str])


@pytest.mark.parametrize("name", ["personal_data", "profanity", "remote_moderation", "guard"])
def test_each_hook_takes_typed_keyword_settings_with_defaults(name):
    """Keyword-only, each annotated (str, int, float, bool, list[str] or a Literal) and with a
    default, plus a class docstring: enough to build the hook's settings form."""
    import inspect
    import typing

    from chat.policy import HOOKS

    hook = load_hook(name, {})
    cls = type(hook)
    assert HOOKS[name].endswith(cls.__name__) and (cls.__doc__ or "").strip()
    hints = typing.get_type_hints(cls.__init__)
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert parameters
    for parameter in parameters:
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, parameter
        assert parameter.default is not inspect.Parameter.empty, parameter
        hint = hints[parameter.name]
        assert hint in FORM_TYPES or typing.get_origin(hint) is typing.Literal, (parameter, hint)
