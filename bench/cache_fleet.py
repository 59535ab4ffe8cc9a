"""A synthetic fleet's cache verbs replayed against N in-process cache shards.

The fleet: `--executors` executors with `--pages` pages each; requests come from
`--families` prompt families (system prompts, Zipf popularity) and `--sessions` multi-turn
sessions, each turn the session's previous prompt plus new tokens. Every request does what
the scheduler does: match (routing), acquire on the chosen executor, one extend per
`PAGE_SIZE` output tokens, commit. Executors are chosen like the scheduler: longest cached
prefix, ties and overloaded executors (more than `--max-load-ratio` x the mean of the last
window) going to the least loaded.

Layouts compared (same request stream, same executors):
  global       one CacheCore holding every pool: the routing reference
  fanout       S shards by executor pool, match sent to every shard and merged: the same
               routing as global, S matches per request
  prefix-hash  S shards by executor pool; a request goes to the shard that the hash of its
               first `--hash-tokens` tokens picks and is routed among that shard's
               executors only: one match per request
  random       S shards, a random one per request (no locality: the lower bound)

Reported per layout: hit rate (cached prompt tokens / prompt tokens, as the cache's own
counters define it), verbs, the busiest shard's CPU seconds (the layout's throughput if
each shard is its own process: verbs / busiest shard's seconds), and load balance (requests per executor and verbs per shard, max over mean).

    python bench/cache_fleet.py [--executors 64 --shards 4 --requests 20000]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from services.cache.core import CacheConfig, CacheCore

PAGE_SIZE = 16
VOCAB_SIZE = 128_000
HOLDER = "fleet-sched"


@dataclass(frozen=True, slots=True)
class Request:
    prompt: list[int]
    output_len: int


def synthetic_stream(args: argparse.Namespace) -> list[Request]:
    """Requests of families (Zipf) and multi-turn sessions; deterministic for a seed."""
    rng = random.Random(args.seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(VOCAB_SIZE) for _ in range(n)]

    families = [draw(args.family_len) for _ in range(args.families)]
    weights = [1.0 / (rank + 1) ** args.zipf for rank in range(args.families)]
    sessions: list[list[int]] = []
    stream = []
    for _ in range(args.requests):
        if sessions and rng.random() < args.follow_up:
            index = rng.randrange(len(sessions))
            prompt = sessions[index] + draw(args.turn_len)
            sessions[index] = prompt[-args.max_prompt_len :] if len(prompt) > args.max_prompt_len else prompt
        else:
            family = rng.choices(families, weights)[0]
            prompt = family + draw(args.turn_len)
            if len(sessions) < args.sessions:
                sessions.append(prompt)
            else:
                sessions[rng.randrange(len(sessions))] = prompt
        stream.append(Request(prompt, rng.randint(args.output_len // 2, args.output_len * 3 // 2)))
    return stream


@dataclass(slots=True)
class Shard:
    core: CacheCore
    executors: list[str]
    cpu_s: float = 0.0
    verbs: int = 0

    def call(self, verb: str, *args):
        start = time.thread_time()
        result = getattr(self.core, verb)(*args)
        self.cpu_s += time.thread_time() - start
        self.verbs += 1
        return result


@dataclass(slots=True)
class Fleet:
    layout: str
    shards: list[Shard]
    home: dict[str, int]
    """executor id -> its shard"""
    window: deque = field(default_factory=lambda: deque(maxlen=512))
    load: Counter = field(default_factory=Counter)
    served: Counter = field(default_factory=Counter)
    """requests per executor over the whole run"""
    hit_tokens: int = 0
    prompt_tokens: int = 0

    def candidates(self, req: Request, args: argparse.Namespace, rng: random.Random) -> tuple[list[int], dict[str, int]]:
        """The shards asked and the merged match over them."""
        if self.layout in ("global", "fanout"):
            asked = list(range(len(self.shards)))
        elif self.layout == "prefix-hash":
            key = hashlib.blake2b(repr(req.prompt[: args.hash_tokens]).encode(), digest_size=8)
            asked = [int.from_bytes(key.digest(), "little") % len(self.shards)]
        else:
            asked = [rng.randrange(len(self.shards))]
        matches: dict[str, int] = {}
        for index in asked:
            matches.update(self.shards[index].call("match", req.prompt[:-1]))
        return asked, matches

    def route(self, req: Request, args: argparse.Namespace, rng: random.Random) -> str:
        asked, matches = self.candidates(req, args, rng)
        pool = [e for i in asked for e in self.shards[i].executors]
        mean = max(1.0, len(self.window) / len(self.home))
        allowed = [e for e in pool if self.load[e] <= args.max_load_ratio * mean] or pool
        least = min(self.load[e] for e in allowed)
        return max(allowed, key=lambda e: (matches.get(e, 0), self.load[e] == least, -self.load[e]))

    def serve(self, req: Request, args: argparse.Namespace, rng: random.Random) -> None:
        executor = self.route(req, args, rng)
        if len(self.window) == self.window.maxlen:
            self.load[self.window[0]] -= 1
        self.window.append(executor)
        self.load[executor] += 1
        self.served[executor] += 1
        shard = self.shards[self.home[executor]]
        lease = shard.call("acquire", executor, req.prompt, len(req.prompt), HOLDER)
        self.hit_tokens += lease.num_cached_tokens
        self.prompt_tokens += len(req.prompt)
        for _ in range(req.output_len // PAGE_SIZE):
            shard.call("extend", lease.lease_id, 1)
        shard.call("commit", lease.lease_id, req.prompt)


def build(layout: str, args: argparse.Namespace) -> Fleet:
    num_shards = 1 if layout == "global" else args.shards
    shards = [Shard(CacheCore(CacheConfig()), []) for _ in range(num_shards)]
    home = {}
    for i in range(args.executors):
        executor = f"exec-{i}"
        shard = i % num_shards
        shards[shard].core.register_pool(executor, "fleet-model", args.pages, PAGE_SIZE)
        shards[shard].executors.append(executor)
        home[executor] = shard
    return Fleet(layout, shards, home)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--executors", type=int, default=64)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--pages", type=int, default=2048, help="per executor")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--families", type=int, default=200)
    p.add_argument("--family-len", type=int, default=512)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--sessions", type=int, default=2000)
    p.add_argument("--follow-up", type=float, default=0.5, help="share of requests that are a next turn")
    p.add_argument("--turn-len", type=int, default=128)
    p.add_argument("--max-prompt-len", type=int, default=4096)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--hash-tokens", type=int, default=256, help="prefix-hash key length")
    p.add_argument("--max-load-ratio", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.executors % args.shards:
        p.error("--executors must be a multiple of --shards")
    stream = synthetic_stream(args)
    print(f"{args.requests} requests, {args.executors} executors x {args.pages} pages, "
          f"{args.shards} shards; mean prompt {sum(len(r.prompt) for r in stream) / len(stream):.0f} tokens")  # fmt: skip
    print(f"{'layout':12s} {'hit rate':>8s} {'verbs':>8s} {'matches/req':>11s} "
          f"{'busiest shard s':>15s} {'verbs/s if parallel':>19s} {'max/mean load':>13s} "
          f"{'max/mean shard':>14s}")  # fmt: skip
    for layout in ("global", "fanout", "prefix-hash", "random"):
        fleet = build(layout, args)
        rng = random.Random(args.seed + 1)
        for req in stream:
            fleet.serve(req, args, rng)
        verbs = sum(s.verbs for s in fleet.shards)
        matches = sum(s.verbs for s in fleet.shards) - sum(
            2 + r.output_len // PAGE_SIZE for r in stream
        )
        busiest = max(s.cpu_s for s in fleet.shards)
        served = [fleet.served[e] for e in fleet.home]
        balance = max(served) / (sum(served) / len(served))
        shard_verbs = [s.verbs for s in fleet.shards]
        shard_balance = max(shard_verbs) / (sum(shard_verbs) / len(shard_verbs))
        print(f"{layout:12s} {fleet.hit_tokens / fleet.prompt_tokens:8.3f} {verbs:8d} "
              f"{matches / len(stream):11.2f} {busiest:15.2f} {verbs / busiest:19,.0f} "
              f"{balance:13.2f} {shard_balance:14.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
