"""`radixmesh serve --tensor-parallel-size 2` on CPU: the executor is a group of two gloo
ranks (two processes) that serves as one executor; greedy text equals the one-process
mesh's, and Ctrl-C leaves no rank running."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from e2e_mesh import API_KEY, alive, generate, start_serve, stop_serve

from radixmesh.v1 import inference_pb2 as pb
from radixmesh.v1 import inference_pb2_grpc

PROMPTS = ("The quick brown fox", "Once upon a time, in a land far away")


def ranks(pid: int) -> list[int]:
    """The follower ranks an executor process spawned (not multiprocessing's helpers)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    pids = [int(c) for c in path.read_text().split()] if path.exists() else []
    return [c for c in pids if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


@pytest.fixture(scope="module")
def tp_serve(tmp_path_factory: pytest.TempPathFactory):
    mesh = start_serve(
        tmp_path_factory.mktemp("serve-tp2"), "--api-key", API_KEY, "--tensor-parallel-size", "2"
    )
    yield mesh
    followers = ranks(mesh.child_pids["executor-0"])
    stop_serve(mesh)
    assert followers and not [pid for pid in followers if alive(pid)]


async def greedy_tokens(target: str, prompt: str) -> list[int]:
    async with grpc.aio.insecure_channel(target) as channel:
        request = pb.GenerateRequest(
            prompt=prompt, sampling=pb.SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        )
        out = await generate(inference_pb2_grpc.InferenceStub(channel), request)
    return out.token_ids


async def test_a_tp2_mesh_gives_the_greedy_tokens_of_the_one_process_mesh(serve, tp_serve):
    assert len(ranks(tp_serve.child_pids["executor-0"])) == 1  # rank 1 of the group
    for prompt in PROMPTS:
        tokens = await greedy_tokens(tp_serve.grpc_target, prompt)
        assert len(tokens) == 16
        assert tokens == await greedy_tokens(serve.grpc_target, prompt)
