"""ExecutorCore.step semantics: chunks, decodes, finishes, drops, validation, hooks."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core.warmup import warm_prefill
from tests.unit.executor.conftest import (
    FactoryGrammar,
    TinyModel,
    greedy,
    hf_greedy,
    hf_logits,
    make_core,
    random_prompt,
)


def new_seq(
    req_id: str,
    token_ids: list[int],
    num_scheduled_tokens: int | None = None,
    page_ids: list[int] | None = None,
    sampling: SamplingParams | None = None,
    num_computed_tokens: int = 0,
    num_prompt_tokens: int | None = None,
) -> NewSequence:
    return NewSequence(
        req_id=req_id,
        token_ids=token_ids,
        num_prompt_tokens=len(token_ids) if num_prompt_tokens is None else num_prompt_tokens,
        num_computed_tokens=num_computed_tokens,
        num_scheduled_tokens=(
            len(token_ids) - num_computed_tokens
            if num_scheduled_tokens is None
            else num_scheduled_tokens
        ),
        page_ids=list(range(8)) if page_ids is None else page_ids,
        sampling=sampling or greedy(),
    )


def decode(req_id: str, *appended: int) -> RunningSequence:
    return RunningSequence(req_id, 1, list(appended))


@pytest.fixture(scope="module")
def core(llama_model: TinyModel):
    return make_core(llama_model)


def test_chunked_prefill_samples_only_at_the_end_then_decodes_from_device(
    core, llama_model: TinyModel
) -> None:
    prompt = random_prompt(13, seed=40)
    expected = hf_greedy(llama_model.hf, prompt, 3)
    first = core.step(StepPlan(1, new_seqs=[new_seq("r", prompt, 10, page_ids=[0, 1, 2])]))
    assert [(o.req_id, o.token_id) for o in first.outputs] == [("r", None)]
    second = core.step(StepPlan(2, running_seqs=[RunningSequence("r", 3, [3])]))
    third = core.step(StepPlan(3, running_seqs=[decode("r")]))
    fourth = core.step(StepPlan(4, running_seqs=[decode("r", 4)]))
    assert [s.outputs[0].token_id for s in (second, third, fourth)] == expected
    assert fourth.step_id == 4 and fourth.step_seconds > 0
    core.step(StepPlan(5, finished_req_ids=["r"]))
    assert not core.has_seq("r")


def test_max_tokens_and_context_limit_finish_with_length(llama_model: TinyModel) -> None:
    core = make_core(llama_model, max_model_len=20)
    plan = StepPlan(
        1,
        new_seqs=[
            new_seq("short", random_prompt(5, seed=41), sampling=greedy(2, ignore_eos=True)),
            new_seq("long", random_prompt(16, seed=42), sampling=greedy(None, ignore_eos=True)),
        ],
    )
    outputs = {o.req_id: [o] for o in core.step(plan).outputs}
    step_id = 1
    while core.num_seqs:
        step_id += 1
        live = [r for r in ("short", "long") if core.has_seq(r)]
        plan = StepPlan(step_id, running_seqs=[decode(r) for r in live])
        for o in core.step(plan).outputs:
            outputs[o.req_id].append(o)
    assert [o.finish_reason for o in outputs["short"]] == [None, "length"]
    assert len(outputs["long"]) == 20 - 16  # stops when prompt + output reach max_model_len
    assert outputs["long"][-1].finish_reason == "length"
    assert all(o.matched_stop_token_id is None for o in outputs["long"])


def with_eos(model: TinyModel, tmp_path: Path, eos_token_ids: list[int]) -> TinyModel:
    """The same weights, with generation_config.json naming other EOS ids."""
    folder = tmp_path / "model"
    shutil.copytree(model.path, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_token_ids}))
    return TinyModel(model.name, model.hf, folder)


def test_eos_and_stop_tokens_finish_with_stop_and_drop_state(
    llama_model: TinyModel, tmp_path: Path
) -> None:
    prompt = random_prompt(7, seed=43)
    expected = hf_greedy(llama_model.hf, prompt, 3)
    core = make_core(with_eos(llama_model, tmp_path, [127, expected[1]]))
    assert core.info.eos_token_ids[:2] == (127, expected[1])
    plan = StepPlan(
        1,
        new_seqs=[
            new_seq("eos", prompt, page_ids=[0, 1, 2]),
            new_seq("ignore", prompt, page_ids=[3, 4, 5], sampling=greedy(3, ignore_eos=True)),
            new_seq(
                "stop_id",
                prompt,
                page_ids=[6, 7, 8],
                sampling=greedy(stop_token_ids=(expected[0],)),
            ),
        ],
    )
    first = {o.req_id: o for o in core.step(plan).outputs}
    assert first["stop_id"].finish_reason == "stop"
    assert first["stop_id"].matched_stop_token_id == expected[0]
    assert not core.has_seq("stop_id")
    plan = StepPlan(2, running_seqs=[decode("eos"), decode("ignore"), decode("stop_id")])
    second = {o.req_id: o for o in core.step(plan).outputs}
    assert "stop_id" not in second  # finished one step earlier: skipped silently
    assert (second["eos"].token_id, second["eos"].finish_reason) == (expected[1], "stop")
    assert second["eos"].matched_stop_token_id == expected[1]
    assert second["ignore"].finish_reason is None
    third = core.step(StepPlan(3, running_seqs=[decode("ignore")])).outputs
    assert [(o.token_id, o.finish_reason) for o in third] == [(expected[2], "length")]
    assert core.num_seqs == 0


def test_finished_ids_drop_first_so_a_preempted_sequence_can_resume(
    core, llama_model: TinyModel
) -> None:
    prompt = random_prompt(9, seed=44)
    expected = hf_greedy(llama_model.hf, prompt, 4)
    core.step(StepPlan(1, new_seqs=[new_seq("p", prompt, page_ids=[0, 1, 2])]))
    core.step(StepPlan(2, running_seqs=[decode("p")]))
    resumed = new_seq("p", prompt + expected[:2], page_ids=[9, 10, 11], num_prompt_tokens=9)
    out = core.step(StepPlan(3, new_seqs=[resumed], finished_req_ids=["p"])).outputs
    assert out[0].token_id == expected[2]
    assert core.step(StepPlan(4, running_seqs=[decode("p")])).outputs[0].token_id == expected[3]
    core.step(StepPlan(5, finished_req_ids=["p"]))


def test_extend_over_a_cached_prefix_continues_like_a_full_prefill(
    core, llama_model: TinyModel
) -> None:
    prefix, tail = random_prompt(8, seed=45), random_prompt(5, seed=46)
    core.step(StepPlan(1, new_seqs=[new_seq("a", prefix, page_ids=[20, 21, 22])]))
    core.step(StepPlan(2, finished_req_ids=["a"]))  # pages 20, 21 now hold the prefix
    plan = StepPlan(
        3, new_seqs=[new_seq("b", prefix + tail, page_ids=[20, 21, 23, 24], num_computed_tokens=8)]
    )
    out = core.step(plan).outputs
    assert out[0].token_id == hf_greedy(llama_model.hf, prefix + tail, 1)[0]
    core.step(StepPlan(4, finished_req_ids=["b"]))


def test_logprobs_equal_log_softmax_of_transformers_logits(core, llama_model: TinyModel) -> None:
    prompt = random_prompt(6, seed=47)
    sampling = greedy(logprobs=True, top_logprobs=3)
    out = core.step(StepPlan(1, new_seqs=[new_seq("lp", prompt, sampling=sampling)])).outputs[0]
    reference = hf_logits(llama_model.hf, prompt)[-1].log_softmax(-1)
    top = reference.topk(3)
    assert out.logprobs is not None
    assert out.logprobs.token_id == out.token_id == int(top.indices[0])
    assert math.isclose(out.logprobs.logprob, float(reference[out.token_id]), abs_tol=1e-4)
    assert [t for t, _ in out.logprobs.top] == top.indices.tolist()
    torch.testing.assert_close(
        torch.tensor([lp for _, lp in out.logprobs.top]), top.values, atol=1e-4, rtol=0
    )
    core.step(StepPlan(2, finished_req_ids=["lp"]))


class OneTokenMatcher:
    """A grammar that allows exactly one token, then ends."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id
        self.accepted: list[int] = []

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].zero_()
        word, bit = divmod(self.token_id, 32)
        bitmask[row, word] = torch.tensor(1 << bit, dtype=torch.int64).to(torch.int32)

    def accept(self, token_id: int) -> bool:
        self.accepted.append(token_id)
        return token_id == self.token_id

    def replay(self, token_ids: list[int]) -> None:
        self.accepted = list(token_ids)

    def is_stop_token(self, token_id: int) -> bool:
        return token_id == self.token_id

    @property
    def is_terminated(self) -> bool:
        return bool(self.accepted)


def test_grammar_hook_masks_sampling_and_ends_the_sequence(llama_model: TinyModel) -> None:
    matchers: list[OneTokenMatcher] = []

    def factory(constraint: Constraint) -> OneTokenMatcher:
        matchers.append(OneTokenMatcher(int(constraint.value)))
        return matchers[-1]

    core = make_core(llama_model, FactoryGrammar(factory))
    prompt = random_prompt(5, seed=48)
    unconstrained = hf_greedy(llama_model.hf, prompt, 1)[0]
    forced = (unconstrained + 1) % 128
    seq = new_seq("g", prompt)
    seq.constraint = Constraint(ConstraintKind.REGEX, str(forced))
    out = core.step(StepPlan(1, new_seqs=[seq, new_seq("free", prompt, page_ids=[8, 9])]))
    by_id = {o.req_id: o for o in out.outputs}
    assert (by_id["g"].token_id, by_id["g"].finish_reason) == (forced, "stop")
    assert by_id["free"].token_id == unconstrained
    assert matchers[0].accepted == []  # its one token ended it: nothing reads its state again


def test_constraint_without_a_grammar_backend_is_refused(core) -> None:
    seq = new_seq("c", [5, 6, 7])
    seq.constraint = Constraint(ConstraintKind.REGEX, "a+")
    with pytest.raises(InvalidArgument, match="constraint"):
        core.step(StepPlan(1, new_seqs=[seq]))


@pytest.mark.parametrize(
    ("plan", "error", "field"),
    [
        (
            StepPlan(1, new_seqs=[new_seq("x", [5] * 12, page_ids=[0, 1])]),
            InvalidArgument,
            "page_ids",
        ),
        (StepPlan(1, new_seqs=[new_seq("x", [5] * 4, page_ids=[64])]), InvalidArgument, "page_ids"),
        (StepPlan(1, new_seqs=[new_seq("x", [5] * 4, 5)]), InvalidArgument, "known tokens"),
        (StepPlan(1, new_seqs=[new_seq("x", [5, 128])]), InvalidArgument, "token_ids"),
        (StepPlan(1, new_seqs=[new_seq("x", [5]), new_seq("x", [6])]), InvalidArgument, "req_id"),
        (
            StepPlan(1, new_seqs=[new_seq("x", [5] * 20)]),
            ResourceExhausted,
            "max_num_batched_tokens",
        ),
        (
            StepPlan(1, new_seqs=[new_seq(str(i), [5]) for i in range(3)]),
            ResourceExhausted,
            "max_num_seqs",
        ),
    ],
)
def test_bad_plans_are_refused_and_leave_state_unchanged(
    llama_model: TinyModel, plan: StepPlan, error: type, field: str
) -> None:
    core = make_core(llama_model, max_num_batched_tokens=16, max_num_seqs=3)
    prompt = random_prompt(4, seed=49)
    expected = hf_greedy(llama_model.hf, prompt, 2)
    core.step(StepPlan(1, new_seqs=[new_seq("keep", prompt, page_ids=[40, 41])]))
    with pytest.raises(error, match=field):
        core.step(plan)
    assert core.num_seqs == 1 and not core.has_seq("x")
    assert core.step(StepPlan(3, running_seqs=[decode("keep")])).outputs[0].token_id == expected[1]


def test_info_describes_model_and_pool(llama_model: TinyModel) -> None:
    core = make_core(llama_model, num_pages=None, cpu_kv_bytes=1 << 20, model_name="tiny")
    spec = core.model.spec
    page_bytes = 2 * spec.num_layers * 4 * spec.num_kv_heads * spec.head_dim * 4  # fp32
    info = core.info
    assert info.num_pages == (1 << 20) // page_bytes
    assert core.kv_pool.nbytes == info.num_pages * page_bytes
    assert (info.model, info.architecture, info.device, info.dtype) == (
        "tiny", "LlamaForCausalLM", "cpu", "float32",
    )  # fmt: skip
    assert (info.vocab_size, info.max_model_len, info.eos_token_ids) == (128, 256, (2,))
    assert make_core(llama_model).info.model == llama_model.path.name
    assert set(core.startup_seconds) == {"load_weights"}  # on CPU nothing compiles at startup
    assert core.startup_seconds["load_weights"] > 0


def test_the_prefill_warm_up_leaves_nothing_a_request_reads(llama_model: TinyModel) -> None:
    """The warm-up writes keys and values into one page; a request given that page then
    decodes as it would have without the warm-up (each slot is written before it is read)."""
    prompt = random_prompt(13, seed=61)
    expected = hf_greedy(llama_model.hf, prompt, 4)
    core = make_core(llama_model)
    before = core.kv_pool.k_caches[0][0].clone()
    warm_prefill(core.model, core.kv_pool, 37, page_id=0)
    assert not torch.equal(core.kv_pool.k_caches[0][0], before)  # it did write there
    assert torch.equal(core.kv_pool.k_caches[0][1], before)  # and nowhere else
    outputs = [core.step(StepPlan(1, new_seqs=[new_seq("w", prompt, page_ids=[0, 1, 2, 3, 4])]))]
    outputs += [core.step(StepPlan(i, running_seqs=[decode("w")])) for i in (2, 3, 4)]
    assert [r.outputs[0].token_id for r in outputs] == expected


@pytest.mark.parametrize("max_model_len", [2, 5, 40])
def test_the_prefill_warm_up_stays_within_a_short_context(
    llama_model: TinyModel, max_model_len: int
) -> None:
    """Its positions never pass max_model_len (the rotary table's end), whatever the
    token count asked for."""
    core = make_core(llama_model, max_model_len=max_model_len)
    forward, positions = core.model.forward, []

    def recorded(batch, kv_pool):
        positions.append(int(batch.positions.max()))
        return forward(batch, kv_pool)

    core.model.forward = recorded
    warm_prefill(core.model, core.kv_pool, 4096, page_id=0)
    assert len(positions) == 3 and max(positions) < max_model_len


def test_the_core_warms_its_sampler_before_any_request(
    tiny_model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled draw is made at start-up (on CUDA a request would compile it; the GPU
    test test_no_compile_cuda.py checks that none does)."""
    from services.executor.core.sampling import Sampler

    warmed: list[int] = []
    monkeypatch.setattr(Sampler, "warmup", lambda self: warmed.append(self.vocab_size))
    core = make_core(tiny_model)
    assert warmed == [core.sampler.vocab_size]
