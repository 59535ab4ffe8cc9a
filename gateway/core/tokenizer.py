"""A model folder's tokenizer: chat template, prompt tokenization and input validation.

`Tokenizer.from_folder(path)` loads the Hugging Face tokenizer of a model folder
(`tokenizer.json` / `tokenizer_config.json`, the chat template) and reads the
context length from `config.json`. Every check raises `InvalidArgument` whose
message starts with the offending field, so the HTTP layer can name it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.core.request import CHAT_ROLES, ChatMessage
from gateway.tracing import timed_event
from radixmesh.errors import FailedPrecondition, InvalidArgument

# config.json keys that hold the context length, most specific first.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def decode_utf8(data: bytes, field: str) -> str:
    """Decode client bytes as UTF-8, naming the field and the byte offset when they are invalid."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(
            f"{field}: invalid UTF-8 at byte {exc.start} ({exc.reason})"
        ) from None


def read_max_model_len(folder: str | Path) -> int:
    """The context length a model folder's config.json declares."""
    config_path = Path(folder) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise InvalidArgument(f"model: {config_path} does not exist") from None
    for source in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            if isinstance(source.get(key), int) and source[key] > 0:
                return source[key]
    raise InvalidArgument(
        f"model: {config_path} names no context length ({', '.join(_CONTEXT_KEYS)})"
    )


def _byte_level_decoder() -> dict[str, int]:
    """The inverse of byte-level BPE's byte -> printable character table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = list(printable)
    shift = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shift)
            shift += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _rust_encoder(hf_tokenizer: Any, backend: Any) -> Any:
    """The Rust tokenizer, set as the wrapper's `encode` sets it before it encodes (no
    truncation or padding, its split_special_tokens); None without one."""
    if not callable(getattr(backend, "encode", None)):
        return None
    if not callable(getattr(hf_tokenizer, "set_truncation_and_padding", None)):
        return None
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = bool(getattr(hf_tokenizer, "split_special_tokens", False))
    return backend


def _compiled_template(hf_tokenizer: Any) -> tuple[Any, dict[str, Any]] | None:
    """The tokenizer's default chat template compiled once, with the variables
    apply_chat_template renders it with besides the messages (its special tokens).
    None where transformers keeps that elsewhere: apply_chat_template is called then."""
    try:
        from transformers.utils.chat_template_utils import (
            _compile_jinja_template,
            _plain_template_data,
        )

        source = hf_tokenizer.get_chat_template()
        return _compile_jinja_template(source), _plain_template_data(
            dict(hf_tokenizer.special_tokens_map)
        )
    except (ImportError, AttributeError, TypeError, ValueError):
        return None


class Tokenizer:
    """Tokenizes prompts and conversations for one model, and decodes its tokens."""

    def __init__(self, hf_tokenizer: Any, max_model_len: int, name: str = "") -> None:
        if max_model_len < 2:
            raise InvalidArgument(f"max_model_len must be >= 2, got {max_model_len}")
        self._hf = hf_tokenizer
        # The Rust tokenizer decodes without the Python wrapper's per-call overhead.
        self._backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        self.model_context = max_model_len
        """The model's own context (config.json's, or as configured)."""
        self.max_model_len = max_model_len
        """The context prompts and max_tokens are checked against: the model's own, lowered
        to what its executors serve once the scheduler has said (`serve_within`)."""
        self.name = name
        self.vocab_size = len(hf_tokenizer)
        self.bos_token_id: int | None = getattr(hf_tokenizer, "bos_token_id", None)
        self.bos_text: str = getattr(hf_tokenizer, "bos_token", None) or ""
        self.eos_token_ids: tuple[int, ...] = tuple(
            i for i in [hf_tokenizer.eos_token_id] if i is not None
        )
        self.has_chat_template = bool(getattr(hf_tokenizer, "chat_template", None))
        decoder = getattr(self._backend, "decoder", None)
        is_byte_level = type(decoder).__name__ == "ByteLevel"
        self._byte_decoder = _byte_level_decoder() if is_byte_level else None
        self._encoder = _rust_encoder(hf_tokenizer, self._backend)
        self._split_special_tokens = bool(getattr(hf_tokenizer, "split_special_tokens", False))
        self._template = _compiled_template(hf_tokenizer) if self.has_chat_template else None

    @classmethod
    def from_folder(
        cls, folder: str | Path, max_model_len: int | None = None, name: str = ""
    ) -> Tokenizer:
        """Load a model folder's tokenizer; max_model_len defaults to config.json's."""
        from transformers import AutoTokenizer  # heavy import, paid only when a model loads

        folder = Path(folder)
        if max_model_len is None:
            max_model_len = read_max_model_len(folder)
        hf_tokenizer = AutoTokenizer.from_pretrained(str(folder))
        return cls(hf_tokenizer, max_model_len, name=name or folder.name)

    def serve_within(self, max_model_len: int) -> None:
        """Changes state: the context checked against becomes the least of the model's own
        and `max_model_len`, the longest sequence its executors serve (an executor lowers
        its model's context to what its KV pool holds; the scheduler publishes the least)."""
        self.max_model_len = min(self.model_context, max_model_len)

    # --- encoding -------------------------------------------------------------------------

    def encode_prompt(self, prompt: str | bytes, field: str = "prompt") -> list[int]:
        """Token ids of raw text, with the tokenizer's own special tokens (e.g. BOS)."""
        if isinstance(prompt, bytes):
            prompt = decode_utf8(prompt, field)
        if not isinstance(prompt, str):
            raise InvalidArgument(f"{field}: must be a string, got {type(prompt).__name__}")
        if not prompt:
            raise InvalidArgument(f"{field}: must not be empty")
        with timed_event("gateway.tokenize"):
            return self._encode(prompt, True)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of text inside a context: no special tokens added."""
        return self._encode(text, False)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """The wrapper's ids; from the Rust tokenizer itself while it is still set as the
        wrapper sets it (a call of the wrapper elsewhere may have changed that)."""
        rust = self._encoder
        if (
            rust is not None
            and rust.truncation is None
            and rust.padding is None
            and rust.encode_special_tokens == self._split_special_tokens
        ):
            return rust.encode(text, add_special_tokens=add_special_tokens).ids
        return list(self._hf.encode(text, add_special_tokens=add_special_tokens))

    def render_template(self, messages: Sequence[ChatMessage], add_generation_prompt: bool) -> str:
        """The chat template's text of messages, unchecked (raises what the template raises)."""
        as_dicts = [{"role": m.role, "content": m.content} for m in messages]
        return self._render(as_dicts, add_generation_prompt)

    def _render(self, as_dicts: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """apply_chat_template's text: with the template compiled at load, rendered with
        the same variables (the messages, no tools or documents, the special tokens)."""
        if self._template is None or not as_dicts:
            return self._hf.apply_chat_template(
                as_dicts, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        template, variables = self._template
        return template.render(
            messages=as_dicts,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )

    def render_chat(self, messages: Sequence[ChatMessage], field: str = "messages") -> str:
        """The prompt text of a conversation: the chat template with the generation prompt."""
        self.validate_messages(messages, field)
        if not self.has_chat_template:
            raise FailedPrecondition(f"{field}: model {self.name!r} has no chat template")
        as_dicts = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self._render(as_dicts, True)
        except Exception as exc:  # the template raised (e.g. it forbids this role order)
            raise InvalidArgument(f"{field}: the chat template rejected them: {exc}") from None

    def encode_messages(
        self, messages: Sequence[ChatMessage], field: str = "messages"
    ) -> list[int]:
        """Token ids of a conversation; the template writes its own special tokens."""
        with timed_event("gateway.template", num_messages=len(messages)):
            text = self.render_chat(messages, field)
        with timed_event("gateway.tokenize"):
            return self._encode(text, False)

    @staticmethod
    def validate_messages(messages: Sequence[ChatMessage], field: str = "messages") -> None:
        if not messages:
            raise InvalidArgument(f"{field}: must contain at least one message")
        for i, message in enumerate(messages):
            if message.role not in CHAT_ROLES:
                raise InvalidArgument(
                    f"{field}[{i}].role: unknown role {message.role!r};"
                    f" expected one of {sorted(CHAT_ROLES)}"
                )
            if isinstance(message.content, bytes):
                decode_utf8(message.content, f"{field}[{i}].content")
            if not isinstance(message.content, str):
                raise InvalidArgument(f"{field}[{i}].content: must be a string")

    def validate_token_ids(self, token_ids: Sequence[int], field: str = "token_ids") -> None:
        if not token_ids:
            raise InvalidArgument(f"{field}: must not be empty")
        for i, token_id in enumerate(token_ids):
            if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                raise InvalidArgument(
                    f"{field}[{i}]: {token_id!r} is not a token id in [0, {self.vocab_size})"
                )

    def check_length(
        self,
        num_prompt_tokens: int,
        max_tokens: int | None,
        field: str = "prompt",
        min_tokens: int = 0,
    ) -> int:
        """Check the prompt fits the context; returns the most tokens that may be generated.

        A prompt must leave room for at least one generated token; an explicit
        max_tokens, and min_tokens, must fit beside the prompt.
        """
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise InvalidArgument(
                f"{field}: {num_prompt_tokens} tokens leave no room in the model's context"
                f" of {self.max_model_len} tokens"
            )
        for name, count in (("max_tokens", max_tokens), ("min_tokens", min_tokens)):
            if count is not None and count > room:
                raise InvalidArgument(
                    f"{name}: {count} plus the prompt's {num_prompt_tokens} tokens exceeds"
                    f" the model's context of {self.max_model_len} tokens"
                )
        return room if max_tokens is None else max_tokens

    # --- decoding -------------------------------------------------------------------------

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids; partial UTF-8 sequences show as U+FFFD."""
        if self._backend is not None:
            return self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return self._hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The text of one token for logprobs (special tokens included, U+FFFD for partial bytes)."""
        return self.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (byte-level BPE), else the UTF-8 of its text."""
        if self._byte_decoder is not None:
            piece = self._hf.convert_ids_to_tokens(token_id)
            if piece is not None and all(ch in self._byte_decoder for ch in piece):
                return bytes(self._byte_decoder[ch] for ch in piece)
        return self.token_text(token_id).encode("utf-8")

    def stop_token_ids(self, extra: Sequence[int] = ()) -> tuple[int, ...]:
        """Token ids that end generation: the model's EOS plus the request's own."""
        return tuple(dict.fromkeys([*self.eos_token_ids, *extra]))
