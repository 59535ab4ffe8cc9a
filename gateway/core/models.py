"""The models a gateway serves: model id -> Tokenizer, and which one an empty name selects."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.tokenizer import Tokenizer
from services.common.errors import InvalidArgument, NotFound


class ModelRegistry:
    def __init__(
        self, tokenizers: Mapping[str, Tokenizer], default_model: str | None = None
    ) -> None:
        if not tokenizers:
            raise InvalidArgument("model: at least one model is needed")
        self._tokenizers = dict(tokenizers)
        self.default_model = default_model or next(iter(self._tokenizers))
        if self.default_model not in self._tokenizers:
            raise InvalidArgument(f"model: default {self.default_model!r} is not among the models")

    @property
    def ids(self) -> list[str]:
        return list(self._tokenizers)

    def resolve(self, name: str) -> tuple[str, Tokenizer]:
        """(model id, tokenizer) for a requested name; empty selects the default."""
        model_id = name or self.default_model
        tokenizer = self._tokenizers.get(model_id)
        if tokenizer is None:
            raise NotFound(f"model: {model_id!r} is not served here; see the model list")
        return model_id, tokenizer
