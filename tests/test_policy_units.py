"""Unit tests for chat.policy: pure Python, no Django, no model."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from chat.policy import (
    ALLOWED,
    AutoGate,
    BlocklistHook,
    BufferGate,
    Cut,
    Emit,
    ExtractionError,
    Hold,
    HookConfigError,
    ModerationHook,
    Outcome,
    RepetitionHook,
    Retract,
    StreamGate,
    Verdict,
    extract_json,
    gate_for,
    instance_errors,
    load_hook,
    moderate,
    reask_message,
    schema_errors,
)

pytestmark = pytest.mark.unit

ANSWER_SCHEMA = {
    "type": "object",
    "required": ["answer"],
    "properties": {"answer": {"type": "string"}},
}


class CountingHook(ModerationHook):
    """Allows everything and records each call, to prove how often gates moderate."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    def check(self, text: str, *, final: bool) -> Verdict:
        self.calls.append((len(text), final))
        return ALLOWED


def run(gate, chunks):
    """Feed chunks, finish, and return (all actions, outcome)."""
    actions = []
    for chunk in chunks:
        actions += gate.feed(chunk)
    tail, outcome = gate.finish()
    return actions + tail, outcome


def emitted(actions) -> str:
    return "".join(action.text for action in actions if isinstance(action, Emit))


def chars(text: str) -> list[str]:
    return list(text)


# --- extraction ---------------------------------------------------------------------


def test_extract_fenced_block_wins_over_prose():
    """A ```json fence is used even when prose before it has JSON of its own."""
    text = 'Not {"answer": "other"} but this:\n```json\n{"answer": "hi"}\n```\n'
    assert extract_json(text) == {"answer": "hi"}


def test_extract_first_fence_and_plain_fence():
    """Only the first JSON fence counts, and a fence without a language counts too."""
    text = "A:\n```\n[1, 2]\n```\nB:\n```json\n[3]\n```"
    assert extract_json(text) == [1, 2]


def test_extract_unclosed_fence():
    """A fence cut off before its closing ``` (token limit) still yields its JSON."""
    assert extract_json('```json\n{"a": [1, 2]}') == {"a": [1, 2]}


def test_extract_prose_wrapped_object_and_array():
    """The first balanced object/array inside prose is returned."""
    assert extract_json('Sure! Here it is: {"a": 1} Hope that helps.') == {"a": 1}
    assert extract_json("The list: [1, 2, 3].") == [1, 2, 3]


def test_extract_skips_non_json_brace_spans():
    """A balanced but non-JSON span like {name} does not hide the real JSON after it."""
    assert extract_json('Fill {name} in: {"name": "Ada"}') == {"name": "Ada"}


def test_extract_tolerates_trailing_commas_but_not_inside_strings():
    """Trailing commas before } or ] are dropped; a ",}" inside a string survives."""
    text = '{"a": "x,}", "b": [1, 2,], "c": {"d": 3,},}'
    assert extract_json(text) == {"a": "x,}", "b": [1, 2], "c": {"d": 3}}


def test_extract_braces_and_quotes_inside_strings():
    """String-aware matching: braces and escaped quotes in strings don't end the span."""
    text = 'Result: {"t": "use } and { and \\" here", "n": {"m": ["]"]}} done'
    assert extract_json(text) == {"t": 'use } and { and " here', "n": {"m": ["]"]}}


def test_extract_no_json():
    """Plain prose and empty text raise ExtractionError with the agreed message."""
    for text in ("Hello there, no data here.", "", "   \n"):
        with pytest.raises(ExtractionError) as info:
            extract_json(text)
        assert str(info.value) == "no JSON object or array found in the answer"


def test_extract_invalid_and_incomplete_json_messages():
    """Broken JSON is reported readably: a parse error, or unbalanced brackets."""
    expected = r"^invalid JSON: Expecting value \(line 1, column 7\)$"
    with pytest.raises(ExtractionError, match=expected):
        extract_json('{"a": nope}')
    with pytest.raises(ExtractionError, match="incomplete"):
        extract_json('Here: {"a": [1, 2')


def test_extract_bare_scalar():
    """An answer that is exactly a JSON scalar parses as that scalar."""
    assert extract_json(" 42 ") == 42
    assert extract_json('"yes"') == "yes"


# --- validation ---------------------------------------------------------------------


def test_schema_errors_valid_schemas():
    """Well-formed schemas, including boolean schemas, have no errors."""
    assert schema_errors(ANSWER_SCHEMA) == []
    assert schema_errors(True) == []
    assert schema_errors({}) == []


def test_schema_errors_invalid_schemas():
    """Typos in a schema are reported with their path, all of them."""
    assert schema_errors({"type": "objekt"}) == [
        "$.type: 'objekt' is not valid under any of the given schemas"
    ]
    assert schema_errors({"required": "answer"}) == ["$.required: 'answer' is not of type 'array'"]
    both = schema_errors({"type": "objekt", "required": "answer"})
    assert both == [
        "$.required: 'answer' is not of type 'array'",
        "$.type: 'objekt' is not valid under any of the given schemas",
    ]


def test_schema_errors_not_a_schema_and_unknown_dialect():
    """A list is not a schema; an unknown $schema is an error, not a silent fallback."""
    assert schema_errors(["answer"]) == [
        "$: a JSON schema must be an object or a boolean, not list"
    ]
    assert schema_errors({"$schema": "http://example.com/mine"}) == [
        "$.$schema: unknown JSON schema dialect 'http://example.com/mine'"
    ]


def test_instance_errors_format_and_order():
    """Errors name the path ($.answer for a missing property) and come sorted by path."""
    schema = {
        "type": "object",
        "required": ["answer", "score"],
        "properties": {"answer": {"type": "string"}, "tags": {"items": {"type": "string"}}},
    }
    assert instance_errors({"tags": ["ok", 3]}, schema) == [
        "$.answer: 'answer' is a required property",
        "$.score: 'score' is a required property",
        "$.tags[1]: 3 is not of type 'string'",
    ]
    assert instance_errors([], schema) == ["$: [] is not of type 'object'"]
    assert instance_errors({"answer": "x", "score": 1}, schema) == []


def test_instance_errors_shortens_huge_values():
    """A huge offending value is cut, but the message still says what is wrong."""
    (error,) = instance_errors("x" * 1000, {"type": "integer"})
    assert error.endswith("... is not of type 'integer'")
    assert len(error) < 100


# --- moderation ---------------------------------------------------------------------


def test_blocklist_whole_word_case_insensitive():
    """Terms match whole words in any case, never inside other words."""
    hook = BlocklistHook(terms=["ass"])
    assert hook.check("Our class assignment is due.", final=True).allowed
    verdict = hook.check("You ASS!", final=True)
    assert verdict == Verdict(False, "blocked term: 'ass'", ("blocklist",))


def test_blocklist_waits_for_words_still_growing():
    """While streaming, a term at the very end may be the start of a longer word."""
    hook = BlocklistHook(terms=["ass"])
    assert hook.check("Hello ass", final=False).allowed
    assert not hook.check("Hello ass", final=True).allowed
    assert not hook.check("Hello ass and", final=False).allowed


def test_blocklist_patterns():
    """Regex patterns are applied as given (case-sensitive unless the pattern says so)."""
    hook = BlocklistHook(patterns=[r"\b\d{3}-\d{4}\b", r"(?i)secret"])
    verdict = hook.check("call 555-1234 now", final=True)
    assert verdict.reason == "blocked pattern: " + repr(r"\b\d{3}-\d{4}\b")
    assert hook.check("TOP SECRET stuff", final=True).categories == ("blocklist",)
    assert hook.check("call 55-1234 now", final=True).allowed


def test_blocklist_invalid_settings_fail_at_construction():
    """A bad regex or a bare string instead of a list fails when staff save it."""
    with pytest.raises(ValueError, match=r"invalid blocklist pattern '\(oops': missing \)"):
        BlocklistHook(patterns=["(oops"])
    with pytest.raises(TypeError, match="terms must be a list of strings"):
        BlocklistHook(terms="badword")


def test_repetition_detects_repeated_sentences():
    """The same sentence more than max_repeats times is rambling; max_repeats times is not."""
    hook = RepetitionHook()
    four = "I am a helpful assistant. " * 4 + "Anyway."
    assert hook.check(four, final=True).allowed
    verdict = hook.check("I am a helpful assistant. " * 5, final=True)
    assert verdict.categories == ("repetition",)
    assert "I am a helpful assistant." in verdict.reason


def test_repetition_waits_for_the_last_sentence_while_streaming():
    """While streaming, the last sentence may still grow ("...assistant." -> ".com"), so it
    is not counted yet; at the end it is."""
    hook = RepetitionHook()
    text = "I am a helpful assistant. " * 4 + "I am a helpful assistant."
    assert hook.check(text, final=False).allowed
    assert hook.check(text, final=True).categories == ("repetition",)


def test_repetition_detects_back_to_back_loop_without_punctuation():
    """A loop with no sentence breaks is caught too, but separators like ---- are not."""
    hook = RepetitionHook()
    assert hook.check("abcdefghijklmnopqrstuvwxyz" * 5, final=False).categories == ("repetition",)
    assert hook.check("abcdefghijklmnopqrstuvwxyz" * 4, final=False).allowed
    assert hook.check("-" * 500, final=True).allowed


def test_repetition_length_and_settings():
    """Text over max_chars is cut there, between words, as "length"; settings are validated."""
    hook = RepetitionHook(max_chars=50)
    assert hook.check("word " * 10, final=True).allowed  # exactly max_chars is fine
    verdict = hook.check("word " * 11, final=True)
    assert verdict == Verdict(False, "answer longer than 50 characters", ("length",), cut_at=49)
    with pytest.raises(TypeError):
        RepetitionHook(max_repeats=0)


def test_runaway_turn_markers():
    """A model writing the next user turn is caught, including custom markers."""
    hook = RepetitionHook()
    assert hook.check("Sure.\nUser: and now?", final=False).categories == ("runaway",)
    assert hook.check("Sure.<|im_start|>assistant", final=False).categories == ("runaway",)
    assert hook.check("User: hi", final=False).categories == ("runaway",)
    assert hook.check("The user said hi.", final=True).allowed
    custom = RepetitionHook(turn_markers=["\nHuman:"])
    assert custom.check("ok\nHuman: x", final=True).categories == ("runaway",)
    assert custom.check("ok\nUser: x", final=True).allowed


def test_load_hook_by_name_and_path():
    """Short names and dotted paths both build configured hooks."""
    hook = load_hook("blocklist", {"terms": ["foo"]})
    assert isinstance(hook, BlocklistHook)
    assert not hook.check("a foo b", final=True).allowed
    hook = load_hook("chat.policy.moderation.RepetitionHook", {"max_chars": 10})
    assert isinstance(hook, RepetitionHook) and hook.max_chars == 10
    assert isinstance(load_hook("repetition"), RepetitionHook)


def test_load_hook_errors_are_hook_config_errors():
    """Unknown names, non-hooks and bad settings all raise a readable HookConfigError."""
    cases = {
        "nope": "unknown moderation hook 'nope'",
        "no.such.module.Hook": "cannot load moderation hook 'no.such.module.Hook'",
        "chat.policy.moderation.Missing": "cannot load moderation hook",
        "chat.policy.extraction.extract_json": "is not a ModerationHook subclass",
    }
    for path, message in cases.items():
        with pytest.raises(HookConfigError, match=message):
            load_hook(path)
    bad_settings = "bad settings for moderation hook 'blocklist'.*unexpected keyword"
    with pytest.raises(HookConfigError, match=bad_settings):
        load_hook("blocklist", {"words": ["x"]})
    with pytest.raises(HookConfigError, match="invalid blocklist pattern"):
        load_hook("blocklist", {"patterns": ["["]})
    with pytest.raises(HookConfigError, match="must be an object"):
        load_hook("blocklist", ["x"])
    assert issubclass(HookConfigError, ValueError)


def test_moderate_first_veto_wins():
    """moderate() returns the first disallowing verdict, or ALLOWED."""
    hooks = [CountingHook(), BlocklistHook(terms=["a1"]), BlocklistHook(terms=["b2"])]
    assert moderate(hooks, "b2 then a1", final=True).reason == "blocked term: 'a1'"
    assert moderate(hooks, "clean", final=True) is ALLOWED


# --- gates --------------------------------------------------------------------------


def test_stream_gate_moderates_per_window_not_per_chunk():
    """200 one-char chunks with window 64 => 3 windowed checks + 1 final, not 200."""
    counter = CountingHook()
    gate = StreamGate([counter], window_chars=64)
    text = "".join(random.Random(0).choice("abc ") for _ in range(200))
    actions, outcome = run(gate, chars(text))
    assert counter.calls == [(64, False), (128, False), (192, False), (200, True)]
    assert emitted(actions) == text == gate.shown
    assert outcome == Outcome("ok", text)


def test_stream_gate_retracts_and_ignores_the_rest():
    """A violation inside a window retracts, stops emitting, and fixes the outcome."""
    gate = StreamGate([BlocklistHook(terms=["darn"])], window_chars=16)
    first = gate.feed("Well, darn it all")  # 17 chars: one window
    assert first == [Retract("blocked term: 'darn'")]
    assert gate.retracted
    assert gate.feed(" more text") == []
    actions, outcome = gate.finish()
    assert actions == []
    assert (outcome.status, outcome.reason, outcome.categories) == (
        "moderated",
        "blocked term: 'darn'",
        ("blocklist",),
    )
    assert outcome.text == "Well, darn it all" and gate.shown == ""


def test_stream_gate_final_check_catches_the_tail():
    """A violation in the last, partial window is caught by finish()."""
    gate = StreamGate([BlocklistHook(terms=["darn"])], window_chars=64)
    actions, outcome = run(gate, ["Oh ", "da", "rn"])
    assert emitted(actions) == "Oh darn"
    assert actions[-1] == Retract("blocked term: 'darn'")
    assert outcome.status == "moderated"


def test_buffer_gate_ok():
    """Buffer shows nothing, says Hold once, and returns the parsed JSON at the end."""
    text = 'Here:\n```json\n{"answer": "42"}\n```'
    actions, outcome = run(BufferGate([], ANSWER_SCHEMA), chars(text))
    assert actions == [Hold("holding the answer until it is complete")]
    assert outcome == Outcome("ok", text, {"answer": "42"}, "", text)


def test_buffer_gate_invalid():
    """Parse and schema failures are "invalid" with readable reasons."""
    _, outcome = run(BufferGate([], ANSWER_SCHEMA), ["I don't know."])
    assert outcome.status == "invalid"
    assert outcome.reason == "no JSON object or array found in the answer"
    _, outcome = run(BufferGate([], ANSWER_SCHEMA), ['{"answr": "x"}'])
    assert (outcome.status, outcome.json) == ("invalid", {"answr": "x"})
    assert outcome.reason == "$.answer: 'answer' is a required property"
    _, outcome = run(BufferGate([], None), ['{"anything": 1}'])
    assert outcome.status == "ok"


def test_buffer_gate_moderated_beats_invalid():
    """A vetoed answer is "moderated" (not re-asked as invalid), with a Retract."""
    gate = BufferGate([BlocklistHook(terms=["darn"])], ANSWER_SCHEMA)
    actions, outcome = run(gate, ["darn, no json"])
    assert actions[-1] == Retract("blocked term: 'darn'")
    assert outcome.status == "moderated" and outcome.held_text == ""


def test_auto_gate_streams_prose_and_holds_fenced_json():
    """Prose before a ```json fence streams; the fence onwards is held and validated."""
    prose = "Sure! Here you go:\n"
    block = '```json\n{"answer": "yes",}\n```\nDone.'
    actions, outcome = run(AutoGate([], ANSWER_SCHEMA), chars(prose + block))
    assert emitted(actions) == prose
    hold = actions.index(Hold("validating structured answer"))
    assert not any(isinstance(a, Emit) for a in actions[hold:])
    assert outcome == Outcome("ok", prose + block, {"answer": "yes"}, "", block)


def test_auto_gate_holds_leading_brace():
    """An answer opening with { (after whitespace) is held whole."""
    text = '  \n{"answer": "x"}'
    actions, outcome = run(AutoGate([], None), chars(text))
    assert actions == [Hold("validating structured answer")]
    assert (outcome.status, outcome.json, outcome.held_text) == ("ok", {"answer": "x"}, text)


def test_auto_gate_holds_lang_fence_only_with_json_body():
    """```python + newline + [ is held; a ```python block of code streams normally."""
    held = "Code:\n```python\n[1, 2]\n```"
    actions, outcome = run(AutoGate([], None), chars(held))
    assert emitted(actions) == "Code:\n" and outcome.json == [1, 2]
    code = "Code:\n```python\nprint(1)\n```\n"
    actions, outcome = run(AutoGate([], None), chars(code))
    assert emitted(actions) == code
    assert outcome == Outcome("ok", code)


def test_auto_gate_partial_fence_is_held_back_until_clear():
    """Backticks that might open a fence are not shown until the next characters decide."""
    gate = AutoGate([], None)
    assert gate.feed("Use ``") == [Emit("Use ")]
    assert gate.feed("`j") == []
    assert gate.shown == "Use "
    assert gate.feed("s") == []
    assert gate.feed("on\n{") == [Hold("validating structured answer")]
    assert gate.shown == "Use "

    gate = AutoGate([], None)
    assert gate.feed("Type `") == [Emit("Type ")]
    assert gate.feed("ls` now") == [Emit("`ls` now")]
    assert gate.feed(" ``") == [Emit(" ")]
    actions, outcome = gate.finish()
    assert actions == [Emit("``")]  # at the end a half fence is just text
    assert gate.shown == "Type `ls` now ``" == outcome.text and outcome.status == "ok"


def test_auto_gate_invalid_held_part_and_no_structure():
    """A held part that fails the schema is invalid; pure prose is ok with json None."""
    _, outcome = run(AutoGate([], ANSWER_SCHEMA), ['```json\n{"answer": 3}\n```'])
    assert (outcome.status, outcome.reason) == ("invalid", "$.answer: 3 is not of type 'string'")
    _, outcome = run(AutoGate([], ANSWER_SCHEMA), ["[not json"])
    assert outcome.status == "invalid" and "incomplete" in outcome.reason
    _, outcome = run(AutoGate([], ANSWER_SCHEMA), ["Just words."])
    assert outcome == Outcome("ok", "Just words.")


def test_auto_gate_moderation_covers_held_part():
    """A veto inside the held JSON still moderates the whole answer."""
    gate = AutoGate([BlocklistHook(terms=["darn"])], None)
    actions, outcome = run(gate, ['Hi\n```json\n{"a": "darn"}\n```'])
    assert actions[-1] == Retract("blocked term: 'darn'")
    assert outcome.status == "moderated"


def test_gate_for_modes_and_errors():
    """gate_for maps modes to classes and refuses unknown modes and bad windows."""
    assert type(gate_for("stream", hooks=[], schema=None)) is StreamGate
    assert type(gate_for("buffer", hooks=[], schema=ANSWER_SCHEMA)) is BufferGate
    assert type(gate_for("auto", hooks=[], schema=None, window_chars=8)) is AutoGate
    with pytest.raises(ValueError, match="unknown output mode 'json'"):
        gate_for("json", hooks=[], schema=None)
    with pytest.raises(ValueError, match="window_chars"):
        gate_for("stream", hooks=[], schema=None, window_chars=0)


# --- chunking invariance ------------------------------------------------------------

FRAGMENTS = [
    "`",
    "``",
    "```",
    "```json\n",
    "```\n",
    "json",
    "\n",
    " ",
    "{",
    "}",
    "[",
    "]",
    '"',
    ",",
    ":",
    '"answer"',
    '"a\\"}"',
    "Hello world. ",
    "darn",
    "darning",
    "x",
    "\nUser:",
    "I repeat myself here. ",
]
SAMPLES = [
    'Sure!\n```json\n{"answer": "ok",}\n```\nbye',
    '{"answer": "plain"}',
    "Use `ls` and ``` inline ```",
    "Prose only, then a lone `",
    'Look: ```python\nprint("{")\n```',
    "Text\n``` \n\n  [1, 2]\n```",
    "   ",
    "Say darn please",
    "I repeat myself here. " * 6,
]


def random_split(text: str, rng: random.Random) -> list[str]:
    """Cut text at random points; empty chunks and 1-char chunks included."""
    if rng.random() < 0.2:
        return chars(text)
    cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, len(text) + 2)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in pairwise(bounds)]


def make_gate(mode: str, holdback: int = 0):
    hooks = [BlocklistHook(terms=["darn"]), RepetitionHook(max_chars=300)]
    schema = None if mode == "stream" else ANSWER_SCHEMA
    return gate_for(mode, hooks=hooks, schema=schema, window_chars=8, holdback_chars=holdback)


def check_invariance(text: str, chunks: list[str], mode: str, holdback: int = 0) -> None:
    """Same text, any chunking, any hold-back window: same outcome, and shown + held_text is
    the text on ok; a veto (withdrawn or cut) in one chunking is a veto in every other."""
    assert "".join(chunks) == text
    reference_actions, reference = run(make_gate(mode), [text])
    actions, outcome = run(make_gate(mode, holdback), chunks)
    holds = [a for a in actions if isinstance(a, Hold)]
    assert len(holds) <= 1
    if holds:  # nothing is emitted once holding has started
        assert not any(isinstance(a, Emit) for a in actions[actions.index(holds[0]) :])
    cuts = [a for a in actions if isinstance(a, Cut)]

    def vetoed(actions, outcome) -> bool:
        return outcome.status == "moderated" or any(isinstance(a, Cut) for a in actions)

    # Where a veto happens depends on the windows (a loop cut in one window may come before a
    # blocked word in another), so only that there was one must agree.
    assert vetoed(actions, outcome) == vetoed(reference_actions, reference)
    if outcome.status == "moderated":
        assert sum(isinstance(a, Retract) for a in actions) == 1
        assert isinstance(actions[-1], Retract)
        return
    assert not any(isinstance(a, Retract) for a in actions)
    if cuts:
        # Cut short (a loop, an invented turn): what is kept, and anything a held part then
        # shows, is always a prefix of the text.
        after = emitted(actions[len(actions) - actions[::-1].index(cuts[-1]) :])
        assert text.startswith(cuts[-1].text + after) and text.startswith(outcome.text)
        assert all(text.startswith(cut.text) for cut in cuts)
        return
    assert outcome == reference
    shown = emitted(actions)
    assert shown + outcome.held_text == text
    assert shown == text[: len(text) - len(outcome.held_text)]


@pytest.mark.parametrize("holdback", [0, 5, 40])
@pytest.mark.parametrize("mode", ["stream", "buffer", "auto"])
def test_random_splits_are_invariant(mode, holdback):
    """Seeded random splits of samples and random fragment soups never change the result,
    with or without a hold-back window."""
    rng = random.Random(20240601)
    for _ in range(400):
        if rng.random() < 0.4:
            text = rng.choice(SAMPLES)
        else:
            text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 25)))
        check_invariance(text, random_split(text, rng), mode, holdback)


def test_auto_invariance_reference_outcomes():
    """The invariance test above covers all outcome kinds (it could fail), not only "ok"."""
    statuses = {run(make_gate("auto"), [text])[1].status for text in SAMPLES}
    assert statuses == {"ok", "invalid", "moderated"}
    assert any(isinstance(a, Cut) for text in SAMPLES for a in run(make_gate("auto"), [text])[0])
    _, outcome = run(make_gate("auto"), [SAMPLES[0]])
    assert outcome.held_text.startswith("```json") and outcome.json == {"answer": "ok"}


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    given = None  # type: ignore[assignment]

if given is not None:

    @st.composite
    def split_texts(draw):
        """A fragment soup and a chunking of it."""
        text = "".join(draw(st.lists(st.sampled_from(FRAGMENTS), max_size=30)))
        cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 2)))
        bounds = [0, *cuts, len(text)]
        return text, [text[a:b] for a, b in pairwise(bounds)]

    @settings(
        max_examples=300,
        database=None,  # no .hypothesis/ directory in the repository
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        split_texts(), st.sampled_from(["stream", "buffer", "auto"]), st.sampled_from([0, 3, 20])
    )
    def test_hypothesis_splits_are_invariant(case, mode, holdback):
        """Hypothesis-driven chunkings give the same outcome and never leak a held fence."""
        text, chunks = case
        check_invariance(text, chunks, mode, holdback)


# --- retry --------------------------------------------------------------------------


def test_reask_message():
    """The re-ask names the reason and the compact schema, and asks for bare JSON."""
    message = reask_message("$.answer: 'answer' is a required property", ANSWER_SCHEMA)
    assert message == (
        "Your previous answer was invalid: $.answer: 'answer' is a required property.\n"
        "Reply with ONLY a JSON value matching this JSON schema: "
        '{"type":"object","required":["answer"],"properties":{"answer":{"type":"string"}}}\n'
        "No prose, no code fence."
    )
    plain = reask_message("no JSON object or array found in the answer.", None)
    assert "answer was invalid: no JSON object or array found in the answer.\n" in plain
    assert "ONLY a valid JSON value" in plain
    assert len(reask_message("x" * 5000, None)) < 400


# -- explanations of failed answers ----------------------------------------------------


@pytest.mark.unit
def test_an_explanation_says_what_the_policy_expects_in_its_own_words():
    from chat.policy.explanation import explain

    schema = {"title": "A cat", "type": "object", "required": ["name"]}
    told = explain(
        "invalid", policy="cat", reason="bad", schema=schema, about="Cats", raw="{", show_raw=True
    )
    assert told == {
        "kind": "invalid",
        "summary": told["summary"],
        "expected": "Cats. A cat.",
        "detail": "bad",
        "policy": "cat",
        "raw_text": "{",
    }
    bare = {"type": "object", "required": ["name", "chip"]}
    untitled = explain(
        "invalid", policy="p", reason="", schema=bare, about="", raw=" ", show_raw=True
    )
    assert untitled["expected"] == 'JSON with the fields "name" and "chip".'
    assert "raw_text" not in untitled  # nothing written: nothing to show


@pytest.mark.unit
def test_a_withdrawn_answers_explanation_never_carries_its_text():
    from chat.policy.explanation import explain

    told = explain(
        "moderated", policy="p", reason="blocked", schema=None, about="", raw="bad", show_raw=True
    )
    assert told["kind"] == "moderated" and "raw_text" not in told and "bad" not in str(told)
