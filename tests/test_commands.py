"""The terminal commands, on the real model."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from chat.engine.text.eos import eos_report

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.unit
def test_checkeos_reports_agreement_for_the_default_model():
    out = io.StringIO()
    call_command("checkeos", stdout=out)
    text = out.getvalue()
    assert "'<|im_end|>' (id 2)" in text and "OK: they agree" in text


@pytest.mark.integration
def test_eos_report_finds_a_template_generation_config_mismatch(backend):
    """A generation config whose eos is not the template's end marker is reported."""
    from transformers import GenerationConfig

    report = eos_report(backend.tokenizer, GenerationConfig(eos_token_id=0))
    assert not report.agree
    assert any("'<|im_end|>' (id 2)" in p for p in report.problems)


@pytest.mark.unit
def test_system_check_is_silent_when_eos_agrees():
    from chat.infra.checks import check_eos

    assert check_eos() == []


@pytest.mark.integration
def test_chat_command_streams_an_answer_to_stdout(capsys, backend):
    call_command("chat", "Count from 1 to 10, separated by commas.", "--max-new-tokens", "12")
    captured = capsys.readouterr()
    assert captured.out.strip()
    assert "[length; 12 tokens;" in captured.err


@pytest.mark.integration
def test_streamtiming_prints_streamed_and_plain_side_by_side(backend):
    out = io.StringIO()
    call_command("streamtiming", "--tokens", "8", stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    for row in (
        "model.generate, not streamed",
        "engine streamer (server path)",
        "TextIteratorStreamer + thread (seed)",
        "cancel:",
    ):
        assert row in text
    assert "8 new tokens" in text


PRODUCTION_ENV = {
    "DEBUG": "0",
    "SECRET_KEY": "x" * 30 + "-production-secret-for-the-check-only-" + "y" * 20,
    "ALLOWED_HOSTS": "chat.example.com",
    "SECURE_HSTS_SECONDS": "31536000",
    "BEHIND_TLS_PROXY": "1",
    "CHAT_BACKEND": "none",
}


@pytest.mark.unit
def test_the_documented_production_settings_pass_check_deploy():
    """The production settings in docs/configuration.md give a clean `manage.py check --deploy`."""
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env={**os.environ, **PRODUCTION_ENV},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


@pytest.mark.unit
def test_production_refuses_to_start_without_a_secret_key():
    import os
    import subprocess
    import sys

    env = {**os.environ, **PRODUCTION_ENV, "SECRET_KEY": ""}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0 and "SECRET_KEY must be set" in done.stderr


def product_settings(**env: str | None) -> subprocess.CompletedProcess:
    """The product's own settings (not the suite's) loaded in a child process with `env`
    changed (None: unset), as a bare `daphne` or a systemd unit loads them; prints DEBUG."""
    changed = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"}
    for name, value in env.items():
        if value is None:
            changed.pop(name, None)
        else:
            changed[name] = value
    code = "import django; from django.conf import settings; django.setup(); print(settings.DEBUG)"
    return subprocess.run(
        [sys.executable, "-c", code], env=changed, capture_output=True, text=True, cwd=ROOT
    )


@pytest.mark.unit
def test_no_secret_key_stops_start_up_with_debug_on_too():
    """No public fallback key in any mode: a key in the source would let anyone forge a session."""
    for debug in ("1", None):
        done = product_settings(DEBUG=debug, SECRET_KEY=None)
        assert done.returncode != 0, done.stdout
        assert "SECRET_KEY must be set" in done.stderr, done.stderr[-2000:]


@pytest.mark.unit
def test_debug_is_off_unless_asked_for():
    """A bare daphne or systemd unit (no `make run`, DEBUG unset) serves no tracebacks."""
    unset = product_settings(DEBUG=None, SECRET_KEY="k" * 50)
    assert unset.returncode == 0 and unset.stdout.strip() == "False", unset.stderr[-2000:]
    asked = product_settings(DEBUG="1", SECRET_KEY="k" * 50)
    assert asked.stdout.strip() == "True", asked.stderr[-2000:]


@pytest.mark.integration
@pytest.mark.django_db
def test_answerquality_runs_prompts_through_the_default_policy_and_counts_endings(
    tmp_path, example_policies
):
    """Each answer is counted under exactly one ending; the trial settings are the ones used."""
    report = tmp_path / "quality.json"
    out = io.StringIO()
    call_command(
        "answerquality",
        "--limit",
        "3",
        "--max-new-tokens",
        "8",
        "--repetition-penalty",
        "1.1",
        "--json",
        str(report),
        stdout=out,
        stderr=io.StringIO(),
    )
    data = json.loads(report.read_text())
    figures, answers = data["summary"]["figures"], data["answers"]
    endings = ("eos", "stop_string", "length", "cut", "withdrawn", "invalid")
    assert figures["answers"] == len(answers) == 3
    assert sum(figures[ending] for ending in endings) == 3
    assert all(a["ending"] in endings and 0 < a["new_tokens"] <= 8 for a in answers)
    assert data["summary"]["settings"]["repetition_penalty"] == 1.1
    assert data["summary"]["settings"]["policy"].startswith("chat ")
    assert "ended on their own or cut at a loop" in out.getvalue()


@pytest.mark.unit
def test_repeated_ngram_rate_measures_loops_not_length():
    from harness.quality import repeated_ngram_rate

    assert repeated_ngram_rate("one two three four five six seven") == 0.0
    assert repeated_ngram_rate("a b c d " * 10) > 0.8
    assert repeated_ngram_rate("too short") == 0.0


@pytest.mark.unit
def test_hookbench_reports_each_hooks_rates_and_cost_per_window():
    out = io.StringIO()
    call_command("hookbench", "--answer-chars", "256", stdout=out)
    text = out.getvalue()
    rows = {line.split()[0]: line for line in text.splitlines() if line[:1].isalpha()}
    for hook in ("personal_data", "profanity", "blocklist", "repetition"):
        assert hook in rows and "ms" in rows[hook]
    assert "of 254" in rows["personal_data"] and "4 windows" in text


@pytest.mark.integration
def test_hookbench_measures_the_first_character_delay_per_window(backend):
    out = io.StringIO()
    call_command(
        "hookbench",
        "--answer-chars",
        "128",
        "--holdback",
        "0,32",
        "--tokens",
        "12",
        stdout=out,
        stderr=io.StringIO(),
    )
    delays = out.getvalue().split("first-character delay")[1].splitlines()[2:4]
    assert [line.split()[0] for line in delays] == ["0", "32"]
