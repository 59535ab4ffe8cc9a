"""Constrained output is valid UTF-8: the grammar library admits the encoded UTF-16
surrogates (0xED 0xA0-0xBF ..), which a byte-level vocabulary can spell one raw byte at a
time; the guard (grammar/utf8.py) masks and refuses them, in one token or across two."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from mesh.tiny_model import write_tiny_model
from radixmesh.sampling import Constraint, ConstraintKind
from radixmesh_kernels.bitmask import unpack_bitmask
from services.executor.core.grammar import GrammarConfig, GrammarService, accept_batch
from services.executor.core.grammar.utf8 import Utf8Guard

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 6},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["name", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    model_dir = write_tiny_model(tmp_path_factory.mktemp("tiny-utf8"), arch="llama", seed=0)
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def service(tokenizer):
    service = GrammarService.from_tokenizer(
        tokenizer, len(tokenizer) + 7, config=GrammarConfig(compile_timeout_s=30)
    )
    yield service
    service.close(wait=True)


def byte_tokens(service: GrammarService) -> dict[int, int]:
    """{byte: token id} for the vocabulary's single-byte tokens."""
    vocab = service.tokenizer_info.decoded_vocab
    return {text[0]: i for i, text in enumerate(vocab) if len(text) == 1}


def allowed(service: GrammarService, matcher) -> set[int]:
    bitmask = service.allocate_bitmask(1)
    matcher.fill_bitmask(bitmask, 0)
    return set(torch.nonzero(unpack_bitmask(bitmask, service.vocab_size)[0]).flatten().tolist())


def test_the_guard_of_a_vocabulary_sorts_its_tokens():
    vocab = [b"a", b"x\xed", b"\xa5b", b"\x85", b"q\xed\xa0\x80", b"\xed\x9f\xbf", b"", b"\xed"]
    guard = Utf8Guard.build(vocab, vocab_size=len(vocab) + 3)
    assert guard is not None
    assert guard.surrogate_token_ids == {4}  # spells U+D800 by itself
    assert guard.lead_token_ids == {1, 7}  # end in the lead byte 0xED
    assert guard.after_lead_token_ids == {2}  # start with 0xA0-0xBF (0x85 stays allowed)
    mask = unpack_bitmask(guard.after_lead_mask[None], len(vocab) + 3)[0]
    assert torch.nonzero(~mask).flatten().tolist() == [2]
    assert guard.refuses([0, 1], 2) and not guard.refuses([1, 0], 2)
    assert not guard.refuses([1], 3) and not guard.refuses([], 2)
    assert Utf8Guard.build([b"a", b"\xa5", b"\xc3\xa9"], vocab_size=3) is None


def test_after_a_lead_byte_the_mask_and_accept_refuse_a_surrogate(service):
    tokens = byte_tokens(service)
    lead, surrogate_second, valid_second = tokens[0xED], tokens[0xA8], tokens[0x9F]
    compiled = service.compile_sync(
        Constraint(ConstraintKind.JSON_SCHEMA, json.dumps({"type": "string", "maxLength": 4}))
    )
    matcher = service.new_matcher(compiled)
    assert matcher.accept(tokens[ord('"')])
    assert lead in allowed(service, matcher)
    assert matcher.accept(lead)
    after = allowed(service, matcher)
    assert valid_second in after  # 0xED 0x9F .. is U+D7C0-U+D7FF
    starts = service.tokenizer_info.decoded_vocab
    assert not any(starts[t] and 0xA0 <= starts[t][0] <= 0xBF for t in after)
    assert not matcher.accept(surrogate_second)
    assert accept_batch([matcher], [surrogate_second]) == [False]
    assert matcher.token_ids[-1] == lead  # refused: state unchanged
    matcher.rollback(1)  # back before the lead byte: a continuation byte is just refused
    assert surrogate_second not in allowed(service, matcher)
    assert matcher.accept(lead) and accept_batch([matcher], [valid_second]) == [True]


def walk(service: GrammarService, constraint: Constraint, seed: int) -> bytes:
    """A random output under the mask that favours raw high bytes (0x80-0xFF): each step
    takes a single-byte token above 0x7F when one is allowed (else any allowed token),
    so multi-byte characters, and any hole in their checking, come up often."""
    rng = random.Random(seed)
    compiled = service.compile_sync(constraint)
    matcher = service.new_matcher(compiled)
    vocab = service.tokenizer_info.decoded_vocab
    for _ in range(400):
        if matcher.is_terminated:
            break
        options = sorted(allowed(service, matcher))
        high = [t for t in options if t < len(vocab) and len(vocab[t]) == 1 and vocab[t][0] > 0x7F]
        token_id = rng.choice(high if high and rng.random() < 0.9 else options)
        assert matcher.accept(token_id), f"token {token_id} allowed by the mask, then refused"
    assert matcher.is_terminated
    ids = [t for t in matcher.token_ids if t not in compiled.stop_token_ids]
    return b"".join(vocab[t] for t in ids)


def test_outputs_favouring_raw_bytes_are_valid_utf8_and_validate(service):
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))
    multibyte = 0
    for seed in range(60):
        raw = walk(service, constraint, seed)
        text = raw.decode("utf-8")  # strict: a surrogate or a cut character raises
        jsonschema.validate(json.loads(text), SCHEMA)
        multibyte += len(raw) != len(text)
    assert multibyte >= 30  # the walk did exercise multi-byte characters
