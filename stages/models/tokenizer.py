"""Text to token ids and back for one artifact, including the streaming detokenizer.

`Tokenizer.load(dir)` reads `tokenizer.json` (a `tokenizers.Tokenizer`) plus the special tokens from
`tokenizer_config.json` and the stop ids from `config.json`. `Detokenizer` turns a stream of ids into text one
token at a time, holding back bytes of a UTF-8 character that the next token completes.

Building `tokenizer.json` from a GGUF belongs in `gguf_vocab.py`; chat templates in `chat.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
from tokenizers import Tokenizer as _HFTokenizer

from speclane.stages.contract.errors import ArtifactError

_REPLACEMENT = "\ufffd"  # what a byte-level decoder yields for bytes that are not (yet) a whole character


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc}); re-create the artifact.")


def _token_text(value: Any) -> str | None:
    # tokenizer_config may spell a special token as a string or as an AddedToken dict.
    return value.get("content") if isinstance(value, dict) else value


@attrs.frozen
class Tokenizer:
    """An artifact's tokenizer: `encode`, `decode`, the special tokens and the ids that end a generation."""

    backend: _HFTokenizer
    bos_token: str | None
    eos_token: str | None
    eos_token_ids: tuple[int, ...]  # every id that stops generation: config's eos id(s) and the eos token
    chat_template: str | None

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise ArtifactError(f"{path}: missing; the artifact needs a tokenizer.json to encode prompts.")
        try:
            backend = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise ArtifactError(f"{path}: cannot be loaded by tokenizers ({exc}); re-create the artifact.")
        tok_config = _read_json(directory / "tokenizer_config.json")
        config = _read_json(directory / "config.json")
        bos, eos = _token_text(tok_config.get("bos_token")), _token_text(tok_config.get("eos_token"))
        eos_ids = config.get("eos_token_id")
        eos_ids = [] if eos_ids is None else [eos_ids] if isinstance(eos_ids, int) else list(eos_ids)
        if eos is not None:
            eos_id = backend.token_to_id(eos)
            if eos_id is None:
                raise ArtifactError(
                    f"{directory / 'tokenizer_config.json'}: eos_token {eos!r} is not in the "
                    "vocabulary of tokenizer.json; fix the file."
                )
            eos_ids.append(eos_id)
        if not eos_ids:
            raise ArtifactError(
                f"{directory}: neither config.json eos_token_id nor tokenizer_config.json "
                "eos_token is set; generation would never stop. Add one."
            )
        return cls(
            backend=backend,
            bos_token=bos,
            eos_token=eos,
            eos_token_ids=tuple(dict.fromkeys(eos_ids)),
            chat_template=tok_config.get("chat_template"),
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (`<|im_end|>`) are always matched whole;
        `add_special` adds what the tokenizer's post-processor adds (BOS for models that want one).
        A chat-templated prompt already holds its specials, hence the default False."""
        return self.backend.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def detokenizer(self, skip_special: bool = False) -> Detokenizer:
        return Detokenizer(self, skip_special)


class Detokenizer:
    """Incremental decoding of one stream: `push(id)` returns the new text (possibly ""), `flush()` the rest.

    Decoding each token alone would break characters split over tokens and the spacing some decoders derive
    from the previous token, so each step decodes a short window: the ids since the last emitted text plus the
    ones before it as context (`prefix`), and returns the part beyond the context's text. A window that ends in
    an incomplete UTF-8 sequence decodes to U+FFFD and is held back until the next token completes it; `flush`
    gives up at the end of the stream and returns the held bytes as U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []  # ids from `_prefix` on; older ones are dropped
        self._prefix = 0  # window start: context whose text was already emitted
        self._read = 0  # ids before this index have been emitted

    def _text(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special=self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        before = self._text(self._ids[self._prefix : self._read])
        now = self._text(self._ids[self._prefix :])
        if len(now) <= len(before) or now.endswith(_REPLACEMENT):
            return ""
        self._ids = self._ids[self._read :]  # the emitted tokens become the next window's context
        self._prefix, self._read = 0, len(self._ids)
        return now[len(before) :]

    def flush(self) -> str:
        """Text still held back (an incomplete character at the end of the stream, as U+FFFD)."""
        before = self._text(self._ids[self._prefix : self._read])
        now = self._text(self._ids[self._prefix :])
        self._ids, self._prefix, self._read = [], 0, 0
        return now[len(before) :]
