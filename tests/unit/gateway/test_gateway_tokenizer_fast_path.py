"""The tokenizer's per-request fast path: the chat template compiled at load and the Rust
tokenizer's encode give exactly what transformers' apply_chat_template and encode give, on
the test models (the tiny model written by `radixmesh` and the gateway tests' folder) and on
a template that uses more of jinja (loops with loop state, namespaces, filters, a default
system prompt, raise_exception)."""

from __future__ import annotations

import pytest

from gateway.core.request import ChatMessage
from gateway.core.tokenizer import Tokenizer
from mesh.tiny_model import write_tiny_model
from radixmesh.errors import InvalidArgument

RICH_TEMPLATE = (
    "{%- set ns = namespace(system=false) -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' %}{% set ns.system = true %}{% endif -%}"
    "{%- endfor -%}"
    "{{ bos_token }}{% if not ns.system %}<|system|>\nYou are helpful.{{ eos_token }}\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]['role'] -%}"
    "{{ raise_exception('roles must alternate at message ' ~ loop.index0) }}"
    "{%- endif -%}"
    "<|{{ m['role'] }}|>\n{{ m['content'] | trim }}{{ eos_token }}"
    "{%- if not loop.last %}\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}\n<|assistant|>\n{% endif %}"
    "{{ '' if pad_token is none else '' }}"
)

CONVERSATIONS = [
    [ChatMessage("user", "hello world")],
    [ChatMessage("system", "be brief"), ChatMessage("user", "the quick brown fox")],
    [
        ChatMessage("system", "  spaced  "),
        ChatMessage("user", "日本語のテキスト 😀 {{ not a template }} {% raw %}"),
        ChatMessage("assistant", "the lazy dog <|eos|> says"),
        ChatMessage("user", "again\nwith\nlines\t and tabs"),
    ],
    [ChatMessage("user", "")],
]

TEXTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog " * 20,
    "日本語のテキスト 😀 and é",
    "<|bos|><|user|>hi<|eos|><|assistant|>",
    "   leading and trailing   ",
    "\n\n\t",
    "",
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, make_model) -> dict[str, Tokenizer]:
    root = tmp_path_factory.mktemp("fast-path")
    out = {
        "gateway-folder": Tokenizer.from_folder(make_model(root / "gateway")),
        "gateway-rich": Tokenizer.from_folder(make_model(root / "rich", chat_template=RICH_TEMPLATE)),
    }
    for arch in ("llama", "qwen2"):
        out[f"tiny-{arch}"] = Tokenizer.from_folder(write_tiny_model(root / arch, arch, seed=0))
    return out


def test_the_fast_path_is_taken(tokenizers):
    for name, tok in tokenizers.items():
        assert tok._template is not None, name
        assert tok._encoder is not None, name


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_the_compiled_template_renders_what_apply_chat_template_renders(tokenizers, conversation):
    dicts = [{"role": m.role, "content": m.content} for m in conversation]
    for name, tok in tokenizers.items():
        for generation_prompt in (True, False):
            expected = tok._hf.apply_chat_template(
                dicts, add_generation_prompt=generation_prompt, tokenize=False
            )
            assert tok.render_template(conversation, generation_prompt) == expected, name
        tokenized = tok._hf.apply_chat_template(dicts, add_generation_prompt=True)
        if hasattr(tokenized, "keys"):  # a BatchEncoding in some transformers versions
            tokenized = tokenized["input_ids"]
        assert tok.encode_messages(conversation) == list(tokenized), name


def test_a_template_that_raises_still_names_the_field(tokenizers):
    tok = tokenizers["gateway-rich"]
    twice = [ChatMessage("user", "a"), ChatMessage("user", "b")]
    with pytest.raises(InvalidArgument, match=r"^messages: the chat template rejected them: .*"
                       r"roles must alternate at message 1"):
        tok.encode_messages(twice)
    with pytest.raises(Exception, match="roles must alternate at message 1"):
        tok._hf.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in twice], tokenize=False
        )


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_the_rust_encode_gives_the_wrapper_ids(tokenizers, text):
    for name, tok in tokenizers.items():
        assert tok.encode_text(text) == list(tok._hf.encode(text, add_special_tokens=False)), name
        if text:
            assert tok.encode_prompt(text) == list(tok._hf.encode(text, add_special_tokens=True)), name


def test_encoding_after_the_wrapper_truncated_keeps_every_token(tokenizers):
    """A caller of the wrapper that truncates leaves the Rust tokenizer set so; the gateway's
    encode still gives every token (as the wrapper's own untruncated encode does)."""
    tok = tokenizers["tiny-llama"]
    text = TEXTS[1]
    full = list(tok._hf.encode(text, add_special_tokens=False))
    tok._hf(text, truncation=True, max_length=5)
    assert tok._encoder.truncation is not None  # the wrapper left it so
    assert tok.encode_text(text) == full
    assert tok.encode_text(text) == full  # the wrapper's encode set it back
    assert tok._encoder.truncation is None
