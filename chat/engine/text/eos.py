"""Does the model stop where its chat template says a turn ends?

A model rambling into an invented next turn usually means the template's end
marker is not among the eos ids used at generation time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

_SENTINEL = "\x00ANSWER\x00"


@dataclass
class EosReport:
    tokenizer_eos: str | None
    tokenizer_eos_id: int | None
    generation_eos_ids: list[int]
    template_end_marker: str | None
    template_end_marker_id: int | None
    problems: list[str] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return not self.problems


def token_id(tokenizer: Any, token: str) -> int | None:
    """Id of a single vocabulary token (e.g. "<|im_end|>"), or None: unknown tokens map to unk."""
    value: int | None = tokenizer.convert_tokens_to_ids(token)
    if value is None or (value == tokenizer.unk_token_id and token != tokenizer.unk_token):
        return None
    return value


def template_end_marker(tokenizer: Any) -> str | None:
    """The text the chat template writes right after an assistant answer, e.g. "<|im_end|>"."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    after = rendered.split(_SENTINEL, 1)[1] if _SENTINEL in rendered else ""
    marker = after.strip().split()[0] if after.strip() else ""
    # Only a special token is a reliable marker; plain text after the answer is formatting.
    return (
        marker
        if marker in tokenizer.all_special_tokens or marker in tokenizer.get_added_vocab()
        else None
    )


def eos_report(tokenizer: Any, generation_config: Any) -> EosReport:
    configured = generation_config.eos_token_id
    gen_ids = [
        i for i in (configured if isinstance(configured, list) else [configured]) if i is not None
    ]
    marker = template_end_marker(tokenizer)
    marker_id = tokenizer.convert_tokens_to_ids(marker) if marker else None
    report = EosReport(tokenizer.eos_token, tokenizer.eos_token_id, gen_ids, marker, marker_id)
    if not gen_ids:
        report.problems.append(
            "generation_config has no eos_token_id: the model can only stop at max_new_tokens"
        )
    if tokenizer.eos_token_id is not None and gen_ids and tokenizer.eos_token_id not in gen_ids:
        report.problems.append(
            f"tokenizer eos {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}) is not in generation_config's eos ids {gen_ids}"
        )
    if marker_id is not None and gen_ids and marker_id not in gen_ids:
        report.problems.append(
            f"the chat template ends a turn with {marker!r} (id {marker_id}), which is not in generation_config's eos ids {gen_ids}"
        )
    return report


def load_eos_report(model_dir: str | Path) -> EosReport:
    """The report for a model folder, reading only its tokenizer files and configs (no torch)."""
    from types import SimpleNamespace

    from .file_tokenizer import FileTokenizer, generation_eos_ids

    tokenizer = FileTokenizer(model_dir)
    return eos_report(tokenizer, SimpleNamespace(eos_token_id=generation_eos_ids(model_dir)))
