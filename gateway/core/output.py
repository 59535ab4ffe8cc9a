"""One choice's output path: token ids in, text deltas out.

The scheduler sends each request's new token ids once per step. A
`ChoiceStream` detokenizes them incrementally, runs the stop-string matcher
over the text, turns token logprobs into OpenAI-ready entries, and decides
when the choice is over: the scheduler reported a finish (EOS, stop token,
length, abort), or a stop string appeared in the text, in which case
`ChoiceDelta.abort_upstream` tells the caller to abort the request at the
scheduler (the one-step-late tokens that still arrive are dropped). A stop string
ending in the text of the first min_tokens tokens does not count (stop.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.core.detokenizer import IncrementalDetokenizer
from gateway.core.openai_responses import PositionLogprobs, TokenLogprob, Usage
from gateway.core.stop import StopMatcher
from gateway.core.tokenizer import Tokenizer
from radixmesh.errors import InvalidArgument
from radixmesh.speculation import SpecUsage
from radixmesh.step import TokenLogprobs

FINISH_REASONS = frozenset({"stop", "length", "abort"})


@dataclass(slots=True)
class ChoiceDelta:
    """What one update of one choice adds for the client."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    """One entry per token in token_ids, when logprobs were asked for."""
    finish_reason: str | None = None
    """Set on the choice's last delta: "stop", "length" or "abort"."""
    matched_stop: str | None = None
    """The stop string, or the text of the stop token, that ended the choice."""
    abort_upstream: bool = False
    """A stop string ended the choice here: the scheduler is still generating it."""
    prompt_logprobs: list[PositionLogprobs] | None = None
    """On the choice's first delta, with sampling.prompt_logprobs_start k: prompt positions
    k, k + 1, ... (`sampled` is the prompt token)."""


class ChoiceStream:
    """Turns one choice's token updates into text deltas; see the module docstring."""

    def __init__(
        self,
        index: int,
        tokenizer: Tokenizer,
        stop: Sequence[str] = (),
        prompt_token_ids: Sequence[int] = (),
        logprobs: bool = False,
        min_tokens: int = 0,
    ) -> None:
        """`min_tokens`: the request's sampling.min_tokens (no stop string ends within them)."""
        self.index = index
        self._tokenizer = tokenizer
        self._detokenizer = IncrementalDetokenizer(tokenizer.decode, prompt_token_ids)
        self._stop = StopMatcher(stop)
        self._logprobs = logprobs
        self._min_tokens = min_tokens
        self.num_tokens = 0
        """Completion tokens received for this choice (including any past a stop string)."""
        self.finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def on_update(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[TokenLogprobs] = (),
        finish_reason: str = "",
        matched_stop_token_id: int | None = None,
        prompt_logprobs: Sequence[TokenLogprobs] = (),
    ) -> ChoiceDelta:
        """Apply one scheduler update (new tokens, maybe a finish, on the first one maybe
        the prompt's log probabilities) of this choice."""
        if self.finished:
            return ChoiceDelta(self.index)  # tokens generated after a stop string: dropped
        if finish_reason and finish_reason not in FINISH_REASONS:
            raise InvalidArgument(
                f"finish_reason: must be one of {sorted(FINISH_REASONS)}, got {finish_reason!r}"
            )
        delta = ChoiceDelta(self.index, token_ids=list(token_ids))
        if self._logprobs:
            delta.logprobs = [self._position(entry) for entry in logprobs]
        if prompt_logprobs:
            delta.prompt_logprobs = [self._position(entry) for entry in prompt_logprobs]
        # the update's tokens within min_tokens, then the rest: a stop string may end only there
        num_within = min(len(token_ids), max(0, self._min_tokens - self.num_tokens))
        self.num_tokens += len(token_ids)
        prefix = ""
        if num_within:
            within = self._detokenizer.push(token_ids[:num_within])
            prefix = self._stop.push(within, may_stop=False).text
        text = self._detokenizer.push(token_ids[num_within:])
        if finish_reason:
            text += self._detokenizer.flush()
        out = self._stop.push(text, may_stop=self.num_tokens > self._min_tokens)
        delta.text = prefix + out.text
        if out.matched_stop is not None:
            self.finish_reason = delta.finish_reason = "stop"
            delta.matched_stop = out.matched_stop
            delta.abort_upstream = not finish_reason
        elif finish_reason:
            delta.text += self._stop.flush()
            self.finish_reason = delta.finish_reason = finish_reason
            if matched_stop_token_id is not None:
                delta.matched_stop = self._tokenizer.token_text(matched_stop_token_id)
        return delta

    def usage(
        self, num_prompt_tokens: int, num_cached_tokens: int, speculation: SpecUsage | None = None
    ) -> Usage:
        return Usage(num_prompt_tokens, self.num_tokens, num_cached_tokens, speculation)

    def _position(self, entry: TokenLogprobs) -> PositionLogprobs:
        return PositionLogprobs(
            self._token(entry.token_id, entry.logprob),
            tuple(self._token(token_id, logprob) for token_id, logprob in entry.top),
        )

    def _token(self, token_id: int, logprob: float) -> TokenLogprob:
        return TokenLogprob(
            self._tokenizer.token_text(token_id),
            logprob,
            self._tokenizer.token_bytes(token_id),
            token_id,
        )
