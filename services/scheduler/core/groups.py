"""Program groups: the requests of one program statement, scheduled as one unit.

A program's `Select` submits one score-only request per choice and a `Fork` one
request per branch; the runtime names each such set with one `group_id`.
Score-only requests with the same scoring start and no name count as one group too
(the choices of a select sent by any client). The scheduler treats a group as a unit:

- Admission: waiting members follow the first ranked of them (`order_groups`), so
  they join the same step when its budget holds them.
- In-step sharing: a full page of prompt that members share and that no cache holds
  is computed once, in the step that admits them. The first member (the leader)
  computes it; before the plan goes out its lease puts that page in the tree, still
  locked (`Leases.publish`), and the others take it as a cached prefix of the same
  plan. That is correct with paged KV because one forward stores every sequence's
  new KV of a layer before any sequence of the batch attends in that layer, and
  steps run in order, so the page is written before any read of it. A member that
  scores its prompt takes the scores of the shared positions from the leader's
  result (`lend_prompt_logprobs`): same tokens after the same prefix, same log
  probabilities; it computes its own from the last shared page on. Outside a
  group the older rule holds (sharing.py): a request waits until the leader's
  prefill reaches the tree, one step later.
- Arrival: a group's members reach the scheduler one submit at a time. An idle
  executor waits for a group that just began to arrive (`settle_wait`), so its members
  start in one step instead of the first alone: a group that said its size (a select's
  choices) until every member is in, at most GROUP_COMPLETE_S after the first; any other
  until no member came for GROUP_QUIET_S, at most GROUP_SETTLE_S after the first. A busy executor does not wait: the plan it
  builds while a step runs leaves such a group out, for the plan after, which it joins
  whole (it would finish no sooner split: its late members would start in that plan).
- Preemption: an unrelated request of the same or a lower class never preempts a
  member (`preemption.victim_order`); a group's members are preempted last within
  their class, latest group first.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

import structlog

from radixmesh.errors import InvalidArgument
from radixmesh.step import StepResult
from services.scheduler.core.request import Request, StepShare
from services.scheduler.core.results import take_prompt_logprobs

log = structlog.get_logger(__name__)

GROUP_QUIET_S = 0.004
"""An idle executor waits until a new group's last member arrived this long ago..."""
GROUP_SETTLE_S = 0.02
"""...and no longer than this after its first member arrived."""
GROUP_COMPLETE_S = 0.25
"""A group that said its size (`Request.group_size`) waits for its missing members, at
most this long after its first arrived: its sender has them all in hand (a select's
choices), so only a loaded machine spreads them out, and then by more than the quiet
time. It waits for no quiet time once complete."""
MAX_GROUP_SIZE = 4096
"""The most requests a group may say it has."""


def same_group(a: Request, b: Request) -> bool:
    """a and b belong to one group: one group_id, or both score-only alike and unnamed."""
    if a.group_id is not None or b.group_id is not None:
        return a.group_id == b.group_id
    sa, sb = a.sampling, b.sampling
    return (
        sa.score_only
        and sb.score_only
        and sa.prompt_logprobs_start == sb.prompt_logprobs_start
        and sa.top_logprobs == sb.top_logprobs
    )


def order_groups(ranked: Iterable[Request]) -> list[Request]:
    """The ranked requests with every named group's members moved up behind the first of
    them (a stable reorder: the rank order holds within and between groups)."""
    out: list[Request] = []
    members: dict[str, list[Request]] = {}
    for req in ranked:
        if req.group_id is None:
            out.append(req)
        elif req.group_id in members:
            members[req.group_id].append(req)
        else:
            members[req.group_id] = [req]
            out.append(req)
    if not members:
        return out
    flat: list[Request] = []
    for req in out:
        flat.extend(members.pop(req.group_id) if req.group_id in members else [req])
    return flat


def num_common_tokens(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of a and b."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def share_tokens(leader: Request, follower: Request, num_shared: int, page_size: int) -> int:
    """Tokens (whole pages) of follower's prefix it may take from the leader's work in the
    step that admits both; 0: none. `num_shared` is what their page keys share
    (sharing.Lead.num_shared_tokens).

    A follower that scores its prompt needs the logits from position
    prompt_logprobs_start - 1 on. It may take pages past that only when the leader
    scores those positions with the same settings (`lend_prompt_logprobs`), and then
    only up to the last page before their prompts part: it computes the logits at the
    last shared position itself (its next token is not the leader's).
    """
    if not same_group(leader, follower):
        return 0
    num_tokens = num_shared
    start = follower.sampling.prompt_logprobs_start
    if start is not None and follower.num_wanted_prompt_logprobs:
        lender = leader.sampling
        lends = (
            lender.score_only
            and lender.prompt_logprobs_start is not None
            and lender.prompt_logprobs_start <= start
            and lender.top_logprobs == follower.sampling.top_logprobs
        )
        if lends:
            common = num_common_tokens(leader.prompt_token_ids, follower.prompt_token_ids)
            num_tokens = min(num_tokens, (common - 1) // page_size * page_size)
        else:
            num_tokens = min(num_tokens, (start - 1) // page_size * page_size)
    cached = follower.match_tokens // page_size * page_size
    return num_tokens if num_tokens > cached else 0


def keep_feasible_shares(candidates: list[Request], num_tokens: int) -> list[Request]:
    """The followers of `candidates` (in admission order; the others' leases granted or
    refused) whose share this step honours: the leader holds its lease and its chunk of
    this step reaches the shared pages, and the follower starts in this step too. The
    others lose their share (they wait, as outside a group). Mirrors admission's chunking:
    each started request takes min(what it has left, the tokens left)."""
    reach: dict[str, int] = {}
    kept: list[Request] = []
    for req in candidates:
        share = req.step_share
        if share is not None and req.lease_id is None:
            if num_tokens <= 0 or reach.get(share.leader.req_id, 0) < share.num_tokens:
                req.step_share = None
                continue
            kept.append(req)
            computed, left = share.num_tokens, req.num_tokens - share.num_tokens
        elif req.lease_id is not None:
            computed, left = req.num_computed_tokens, req.num_admitted_tokens - req.num_computed_tokens
        else:
            continue  # refused: it does not start
        chunk = max(0, min(left, num_tokens))
        reach[req.req_id] = computed + chunk
        num_tokens -= chunk
    return kept


def publish_targets(followers: Iterable[Request]) -> dict[str, tuple[Request, int]]:
    """Per leader id: the leader and the most tokens of it its followers take."""
    out: dict[str, tuple[Request, int]] = {}
    for req in followers:
        share = req.step_share
        assert share is not None
        leader, num_tokens = out.get(share.leader.req_id, (share.leader, 0))
        out[share.leader.req_id] = (leader, max(num_tokens, share.num_tokens))
    return out


def lend_prompt_logprobs(result: StepResult, requests: Mapping[str, Request]) -> None:
    """Before a step's outputs are read: a follower that starts scoring past its
    prompt_logprobs_start gets the leader's scores for the positions before (the
    leader scored them in the same step). Clears the follower's step_share."""
    outputs = {out.req_id: out for out in result.outputs}
    for req_id in itertools.chain(outputs, result.plain_req_ids):  # a plain row has no scores
        req = requests.get(req_id)
        share = req.step_share if req is not None else None
        if req is None or share is None:
            continue
        req.step_share = None
        start = req.sampling.prompt_logprobs_start
        if start is None or req.prompt_logprobs:
            continue
        # it computed from its cached prefix on: the logits there score the next token
        first = min(len(req.prompt_token_ids), (req.num_cached_tokens or 0) + 1)
        if first <= start:
            continue  # it scores every position itself
        leader = share.leader
        lent = outputs.get(leader.req_id)
        if lent is not None and lent.prompt_logprobs:  # taking twice is idempotent
            take_prompt_logprobs(leader, lent.prompt_logprobs, lent.prompt_logprobs_position)
        lead_start = leader.sampling.prompt_logprobs_start or 0
        entries = leader.prompt_logprobs[start - lead_start : first - lead_start]
        if len(entries) != first - start:
            log.error("shared prompt logprobs missing", req_id=req.req_id, leader=leader.req_id)
            continue
        req.prompt_logprobs = list(entries)


def arriving_groups(queued: Iterable[Request], started: Iterable[Request], now: float) -> dict[str, float]:
    """Named groups still arriving, each with the seconds left until it counts as in: the
    queued ones none of whose members has started (a member that follows a started one
    takes its pages from the tree anyway) and that are not complete. A group that said
    its size is complete once that many members are queued, or GROUP_COMPLETE_S after its
    first; any other once its last member came GROUP_QUIET_S ago, or GROUP_SETTLE_S after
    its first."""
    begun = {r.group_id for r in started if r.group_id is not None}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    size: dict[str, int] = {}
    count: dict[str, int] = {}
    for req in queued:
        group = req.group_id
        if group is None or group in begun or req.lease_id is not None:
            continue
        first[group] = min(first.get(group, req.arrival_time), req.arrival_time)
        last[group] = max(last.get(group, req.arrival_time), req.arrival_time)
        size[group] = max(size.get(group, 0), req.group_size)
        count[group] = count.get(group, 0) + 1
    out = {}
    for group, start in first.items():
        if size[group]:
            end = start + GROUP_COMPLETE_S if count[group] < size[group] else now
        else:
            end = min(last[group] + GROUP_QUIET_S, start + GROUP_SETTLE_S)
        if end > now:
            out[group] = end - now
    return out


def check_group_size(group_id: str, group_size: int) -> None:
    """Raise InvalidArgument unless group_size is 0, or in [1, MAX_GROUP_SIZE] with a group."""
    if not group_size:
        return
    if not 0 < group_size <= MAX_GROUP_SIZE:
        raise InvalidArgument(f"group_size: must be in [1, {MAX_GROUP_SIZE}], got {group_size}")
    if not group_id:
        raise InvalidArgument(f"group_size ({group_size}) needs a group_id")


def settle_wait(queued: Iterable[Request], started: Iterable[Request], now: float) -> float:
    """Seconds an idle executor waits before it plans, for groups still arriving (0: none)."""
    return max(arriving_groups(queued, started, now).values(), default=0.0)


def join_group(req: Request, member: Request) -> None:
    """Changes state: req joins the group of `member`, a live request of it (routing then
    keeps req on member's executor, where the group shares its context): the group's
    first arrival and its announced size hold for req too."""
    req.group_arrival_time = min(req.group_arrival_time, member.group_arrival_time)
    req.group_size = max(req.group_size, member.group_size)


def members_of(req: Request, requests: Iterable[Request]) -> list[Request]:
    """The other live requests of req's named group."""
    if req.group_id is None:
        return []
    return [r for r in requests if r.group_id == req.group_id and r is not req]


__all__ = [
    "StepShare",
    "arriving_groups",
    "check_group_size",
    "join_group",
    "keep_feasible_shares",
    "lend_prompt_logprobs",
    "members_of",
    "num_common_tokens",
    "order_groups",
    "publish_targets",
    "same_group",
    "settle_wait",
    "share_tokens",
]
