"""System check: warn at start-up when the model's eos ids and its chat template disagree."""

from pathlib import Path

from django.conf import settings
from django.core import checks


def model_dir() -> Path | None:
    from ..engine.weights.loading import converted_model_dir

    folder = (
        Path(settings.CHAT_MODEL_PATH)
        if settings.CHAT_MODEL_PATH
        else converted_model_dir(settings.DATA_DIR)
    )
    return folder if (folder / "config.json").is_file() else None


@checks.register("chat")
def check_eos(app_configs=None, **kwargs):  # noqa: ARG001 (Django's signature)
    folder = model_dir()
    if folder is None:
        return []  # not converted yet; `make run` converts it, and the check runs next start
    from ..engine.text.eos import load_eos_report

    try:
        report = load_eos_report(folder)
    except Exception as exc:
        return [checks.Warning(f"could not read the tokenizer of {folder}: {exc}", id="chat.W002")]
    return [
        checks.Warning(
            f"{folder.name}: {problem}",
            hint="the model may ramble past its answer; fix generation_config.json or add the id as an extra eos "
            "token (run `python manage.py checkeos`)",
            id="chat.W001",
        )
        for problem in report.problems
    ]
