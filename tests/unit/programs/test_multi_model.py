"""One program on two models: a small model drafts, a large one scores the draft with a
Select; the large model sees the context's text encoded with its own tokenizer."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from gateway.core.models import ModelRegistry
from gateway.core.tokenizer import Tokenizer
from gateway.programs.core import events as ev
from gateway.programs.core.context import start_tokens
from gateway.programs.core.runtime import ProgramRun, RuntimeDeps
from gateway.programs.registry import load_registry
from mesh.engine import Engine, EngineConfig
from mesh.tiny_model import write_tiny_model
from radixmesh.sampling import SamplingParams
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import program_pb2 as pb
from services.executor.core.config import ExecutorConfig
from tests.fixtures.programs import EngineBackend
from tests.unit.programs.builders import compile_program, program, ret, text


@pytest.fixture(scope="module")
def large_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-large"), arch="llama", seed=1)


@pytest.fixture
async def two_models(tiny_model_dir, large_dir):
    fields = {"device": "cpu", "page_size": 4, "num_pages": 128, "max_num_seqs": 8}
    config = EngineConfig(
        executors=(
            ExecutorConfig(model_path=str(tiny_model_dir), model_name="small", **fields),
            ExecutorConfig(model_path=str(large_dir), model_name="large", **fields),
        )
    )
    engine = Engine(config)
    await engine.start()
    models = ModelRegistry(
        {"small": Tokenizer.from_folder(tiny_model_dir), "large": Tokenizer.from_folder(large_dir)}
    )
    tools, plugins = load_registry(builtin=False, entry_points=False)
    yield engine, RuntimeDeps(EngineBackend(engine), models, tools, plugins)
    await engine.stop()


async def test_a_draft_on_one_model_is_scored_by_another(two_models, large_dir):
    engine, deps = two_models
    message = program(
        text("Question: why is the sky blue?\nAnswer:"),
        pb.Statement(
            gen=pb.Gen(
                var="draft", model="small", sampling=ipb.SamplingParams(max_tokens=6, temperature=0)
            )
        ),
        text("\nIs the answer right?"),
        pb.Statement(select=pb.Select(var="verdict", choices=[" yes", " no"], model="large")),
        ret(var="verdict"),
        model="small",
    )
    run = ProgramRun(compile_program(message), {}, deps, "mm")
    events = [e async for e in run.events()]
    small, large = deps.models.resolve("small")[1], deps.models.resolve("large")[1]

    prompt = start_tokens(small) + small.encode_text("Question: why is the sky blue?\nAnswer:")
    draft = await engine.complete(prompt, SamplingParams(max_tokens=6, temperature=0), model="small")
    assert events[-1].variables["draft"] == small.decode(draft.token_ids)

    context_text = "Question: why is the sky blue?\nAnswer:" + small.decode(draft.token_ids)
    context_text += "\nIs the answer right?"
    context = start_tokens(large) + large.encode_text(context_text)
    hf = transformers.AutoModelForCausalLM.from_pretrained(large_dir, dtype=torch.float32).eval()
    scored = next(e for e in events if isinstance(e, ev.SelectScores))
    for score in scored.scores:
        ids = large.encode_text(score.choice)
        with torch.no_grad():
            logprobs = torch.log_softmax(hf(torch.tensor([context + ids])).logits[0], dim=-1)
        total = sum(logprobs[len(context) + j - 1, t].item() for j, t in enumerate(ids))
        assert math.isclose(score.logprob_sum, total, abs_tol=2e-3)
    assert [u.model for u in events[-1].usage] == ["small", "large"]
