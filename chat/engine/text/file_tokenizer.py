"""A model folder's tokenizer and chat template, read without transformers (and so without torch).

A web process in front of an inference server (CHAT_BACKEND=openai) only counts tokens,
defuses typed markers and renders the chat template; for that the folder's
`tokenizer.json` (the `tokenizers` library, which transformers' fast tokenizers wrap) and
its chat template (jinja2, in the sandbox transformers uses) are all it needs. Importing
transformers would pull in torch: about 1 GB of resident memory for nothing.

`FileTokenizer` answers the part of a Hugging Face tokenizer's interface that template.py,
eos.py and the policy checks use, with the same ids and the same rendered text.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from tokenizers import Tokenizer

if TYPE_CHECKING:
    import jinja2

_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclass(frozen=True)
class _AddedToken:
    content: str
    special: bool


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def _compile_template(source: str) -> jinja2.Template:
    """The chat template in transformers' sandbox: same options, filters and globals."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> NoReturn:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: object,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        # jinja's own tojson escapes HTML characters, which a prompt must not get
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return env.from_string(source)


class FileTokenizer:
    """tokenizer.json plus tokenizer_config.json and the chat template of one model folder.

    Args:
        folder: a Hugging Face model (or tokenizer) folder.
    """

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self.name_or_path = str(folder)
        self._plain = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # One instance, not a second one that reads special tokens in text as text: each holds
        # about 30 MB (the web tier's largest single part). Whether an encode reads them as
        # text is a setting of the instance, so it is set and used under a lock (encodes are a
        # few ms, once per prompt: they hardly ever wait).
        self._encoding = threading.Lock()
        config = _read_json(folder / "tokenizer_config.json")
        self.added_tokens_decoder = {
            index: _AddedToken(token.content, token.special)
            for index, token in self._plain.get_added_tokens_decoder().items()
        }
        self.special_tokens_map = {
            name: text for name in _SPECIAL_NAMES if (text := _token_text(config.get(name)))
        }
        self.chat_template = _chat_template(folder, config)
        self._template: jinja2.Template | None = None

    @property
    def backend_tokenizer(self) -> Tokenizer:
        """The `tokenizers` object, under transformers' name for it."""
        return self._plain

    @classmethod
    def from_folder(cls, folder: str | Path) -> FileTokenizer:
        return cls(folder)

    # -- special tokens ----------------------------------------------------------------

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def unk_token(self) -> str | None:
        return self.special_tokens_map.get("unk_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id_or_none(self.eos_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id_or_none(self.unk_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id_or_none(self.special_tokens_map.get("pad_token"))

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens (bos, eos, unk, pad), as transformers lists them."""
        return list(dict.fromkeys(self.special_tokens_map.values()))

    def get_added_vocab(self) -> dict[str, int]:
        return {token.content: index for index, token in self.added_tokens_decoder.items()}

    def _id_or_none(self, token: str | None) -> int | None:
        return self._plain.token_to_id(token) if token is not None else None

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """The id of one vocabulary token; an unknown one maps to unk, as in transformers."""
        index = self._plain.token_to_id(token)
        return index if index is not None else self.unk_token_id

    # -- text <-> ids --------------------------------------------------------------------

    def __call__(
        self,
        text: str | list[str],
        *,
        add_special_tokens: bool = True,
        split_special_tokens: bool = False,
    ) -> dict[str, Any]:
        """{"input_ids": ids} for a string, or a list of them for a list of strings."""
        texts = [text] if isinstance(text, str) else list(text)
        with self._encoding:
            self._plain.encode_special_tokens = split_special_tokens
            try:
                encoded = self._plain.encode_batch(texts, add_special_tokens=add_special_tokens)
            finally:
                self._plain.encode_special_tokens = False  # as everyone else reads it
        ids = [e.ids for e in encoded]
        return {"input_ids": ids[0] if isinstance(text, str) else ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._plain.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # -- chat template -------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
    ) -> Any:  # str, or ids with tokenize=True (as transformers answers)
        """The chat rendered as transformers renders it; ids with `tokenize=True`."""
        if self.chat_template is None:
            raise ValueError(f"{self.name_or_path} has no chat template")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        rendered = self._template.render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens_map,
        )
        return self(rendered, add_special_tokens=False)["input_ids"] if tokenize else rendered


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return value if isinstance(value, dict) else {}


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """chat_template.jinja (transformers 5 writes it there), else the config's `chat_template`."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def generation_eos_ids(folder: str | Path) -> list[int]:
    """The eos ids generation stops at: generation_config.json's, or config.json's without one."""
    folder = Path(folder)
    name = (
        "generation_config.json" if (folder / "generation_config.json").is_file() else "config.json"
    )
    value = _read_json(folder / name).get("eos_token_id")
    return [i for i in (value if isinstance(value, list) else [value]) if i is not None]
