"""Helpers for the gateway's tests: a tiny model folder with a real tokenizer, a fake scheduler.

make_model_folder(path) writes config.json and a trained byte-level BPE tokenizer
(with a chat template). FakeScheduler serves `radixmesh.v1.Scheduler.Stream` the
way the real one does on the wire (one StreamResponse per step carrying every
request's new tokens), answering each request with the tokens of FAKE_REPLY.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc

from radixmesh.v1 import scheduler_pb2, scheduler_pb2_grpc

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# English merges only, plus a little CJK so that some merged tokens end inside a character.
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello tokens, goodbye world",
    "日本語のテキスト",
    "日本",
]


def make_model_folder(
    folder: Path, max_model_len: int = 64, chat_template: str | None = CHAT_TEMPLATE
) -> Path:
    """Write config.json and a trained byte-level BPE tokenizer (vocabulary about 330) to folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=330,
        special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS * 20, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    if chat_template is not None:
        hf.chat_template = chat_template
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(folder))
    config = {"model_type": "llama", "max_position_embeddings": max_model_len}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


FAKE_REPLY = "the quick brown fox jumps 😀"


class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Answers each submit with FAKE_REPLY's tokens, two per step, all requests in one message per step.

    A prompt of "fail" gets RESOURCE_EXHAUSTED; "crash" breaks the whole stream.
    """

    def __init__(self, tokenizer):
        self.reply_text = FAKE_REPLY
        self.reply_ids = tokenizer._hf.encode(FAKE_REPLY, add_special_tokens=False)
        self.tokenizer = tokenizer
        self.submits = []
        self.aborts = asyncio.Queue()
        self.num_streams = 0
        self.executors = [scheduler_pb2.ExecutorLoad(executor_id="e0", model="tiny", healthy=True)]
        """What GetLoad reports; tests may change it."""
        self.num_get_load = 0

    async def GetLoad(self, request, context):
        self.num_get_load += 1
        return scheduler_pb2.GetLoadResponse(executors=self.executors)

    async def Stream(self, request_iterator, context):
        self.num_streams += 1
        running: dict[str, list[int]] = {}
        first: set[str] = set()
        wake = asyncio.Event()
        failed: list[str] = []
        crashed = asyncio.Event()

        async def read():
            async for message in request_iterator:
                if message.HasField("submit"):
                    submit = message.submit
                    self.submits.append(submit)
                    prompt = self.tokenizer.decode(submit.token_ids)
                    if prompt.endswith("crash"):
                        crashed.set()
                    elif prompt.endswith("fail"):
                        failed.append(submit.req_id)
                    else:
                        running[submit.req_id] = list(self.reply_ids)
                        first.add(submit.req_id)
                else:
                    running.pop(message.abort.req_id, None)
                    await self.aborts.put(message.abort.req_id)
                wake.set()

        reader = asyncio.create_task(read())
        step = 0
        try:
            while True:
                await wake.wait()
                wake.clear()
                if crashed.is_set():
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "scheduler crashed")
                updates = [
                    scheduler_pb2.TokenUpdate(req_id=r, error_code=8, error_message="queue full")
                    for r in failed
                ]
                failed.clear()
                for req_id, left in list(running.items()):
                    update = scheduler_pb2.TokenUpdate(req_id=req_id, token_ids=left[:2])
                    if req_id in first:
                        first.discard(req_id)
                        update.num_prompt_tokens, update.num_cached_tokens = 5, 2
                    del left[:2]
                    if not left:
                        update.finish_reason = "length"
                        del running[req_id]
                    updates.append(update)
                step += 1
                yield scheduler_pb2.StreamResponse(step_id=step, updates=updates)
                if running:
                    wake.set()
        finally:
            reader.cancel()
