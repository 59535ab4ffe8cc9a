"""Which forward serves a step: a captured graph set where one holds the batch, else the
eager forward.

Plain decodes replay the decode graphs, steps that verify drafts the verification graphs
(both only without partial-page copies, which run between a layer's writes and reads),
and the other steps of at most `--extend-graph-tokens` tokens the extend graphs, copies
and prompt scoring included (extend_graphs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.executor.core.cuda_graphs import StepGraphs
from services.executor.core.extend_graphs import ExtendGraphs
from services.executor.core.forward_batch import ForwardBatch
from services.executor.core.kv_pool import KVPool
from services.executor.core.models.decoder import Decoder


@dataclass(slots=True)
class StepForward:
    model: Decoder
    kv_pool: KVPool
    decode: StepGraphs | None = None
    verify: StepGraphs | None = None
    extend: ExtendGraphs | None = None

    def __call__(self, batch: ForwardBatch) -> torch.Tensor:
        """The batch's logits."""
        plain = batch.slot_copies is None
        if plain and self.decode is not None and self.decode.can_run(batch):
            return self.decode.run(batch)
        if plain and self.verify is not None and self.verify.can_run(batch):
            return self.verify.run(batch)
        if self.extend is not None and self.extend.can_run(batch):
            return self.extend.run(batch)
        return self.model.forward(batch, self.kv_pool)

    def scored(self, batch: ForwardBatch, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`Decoder.forward_scored`: the logits and the final hidden states at `rows`."""
        if self.extend is not None and self.extend.can_run(batch):
            return self.extend.run_scored(batch, rows)
        return self.model.forward_scored(batch, self.kv_pool, rows)

    def graph_steps(self) -> dict[str, int]:
        """Steps replayed so far by each captured set: decode, verify, extend."""
        sets = {"decode": self.decode, "verify": self.verify, "extend": self.extend}
        return {name: graphs.num_runs for name, graphs in sets.items() if graphs is not None}

    def drop_graphs(self) -> None:
        self.decode = self.verify = self.extend = None
