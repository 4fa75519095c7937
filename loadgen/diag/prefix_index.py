"""What the prefix index costs per request, and its memory per block.

- `keys`: one 8,000-token prompt keyed once (`PrefixIndex.keys_of`, 16-token blocks: 500 keys), as text
  (32,000 characters: the approximate source) and as 8,000 token ids (a prompt sent as ids, and the
  precise source's keys of a prompt counted through the engine);
- `lookup`: that request matched against 100 endpoints (`PrefixIndex.lookup`: cached tokens per
  endpoint), in four states of the fleet: nothing held anywhere; one endpoint holding the whole prompt
  (a conversation's home); every endpoint holding its first 2,000 tokens (a shared system prompt) and
  ten of them longer prefixes, each of its own length; every endpoint holding a different length of
  it (the worst case: 100 distinct match lengths, the cost grows with their number), also with a
  fitted characters-per-token ratio (3.7: tokens per block are then not a whole number, as in the
  daemon, which fits the ratio per model);
- `dispatch`: recording it as sent to one endpoint (`PrefixIndex.dispatched`);
- a short chat's whole share: a 300-character chat keyed, matched, dispatched and finished;
- memory: bytes per block held, measured with tracemalloc over 100 endpoints × 20,000 blocks.

    berth-loadgen diag prefix-index [--repeat N]

Prints the median of `--repeat` timings of each (wall clock: run it on a quiet machine).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

from gateway.core.types import ApiKind, EndpointId
from gateway.telemetry.prefix_index import PrefixIndex, PrefixSettings

ENDPOINTS = 100
PROMPT_TOKENS = 8_000
CHARS_PER_TOKEN = 4


def _text(rng: random.Random, chars: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(chars))


def _median_us(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def timings(repeat: int) -> dict[str, float]:
    rng = random.Random(1)
    prompt = _text(rng, PROMPT_TOKENS * CHARS_PER_TOKEN)
    eids = [EndpointId(f"e{i:03d}") for i in range(ENDPOINTS)]
    out: dict[str, float] = {}

    ratio = [float(CHARS_PER_TOKEN)]  # characters per token, as the daemon's fit hands them in
    idx = PrefixIndex(PrefixSettings(), lambda _model: ratio[0])
    out["keys, text (8,000 tokens, 500 keys)"] = _median_us(
        lambda: idx.keys_of("m", ApiKind.COMPLETION, prompt), repeat
    )
    ids = [rng.randrange(150_000) for _ in range(PROMPT_TOKENS)]
    out["keys, token ids (8,000 ids, 500 keys)"] = _median_us(
        lambda: idx.keys_of("m", ApiKind.COMPLETION, ids), repeat
    )
    pk = idx.keys_of("m", ApiKind.COMPLETION, prompt)
    for e in eids:  # every endpoint known, holding other traffic
        idx.dispatched(e, idx.keys_of("m", ApiKind.COMPLETION, _text(rng, 4_000)), 1_000)
    out["lookup, 100 endpoints, nothing held"] = _median_us(lambda: idx.lookup(pk, PROMPT_TOKENS), repeat)
    idx.dispatched(eids[0], pk, PROMPT_TOKENS)
    out["lookup, 100 endpoints, one holds all"] = _median_us(lambda: idx.lookup(pk, PROMPT_TOKENS), repeat)
    system = idx.keys_of("m", ApiKind.COMPLETION, prompt[: 2_000 * CHARS_PER_TOKEN])
    for e in eids:
        idx.dispatched(e, system, 2_000)
    for i, e in enumerate(eids[1:10], start=1):  # nine more hold longer prefixes, each its own length
        cut = (2_000 + 600 * i) * CHARS_PER_TOKEN
        idx.dispatched(e, idx.keys_of("m", ApiKind.COMPLETION, prompt[:cut]), cut // 4)
    out["lookup, 100 hold 2,000 tokens, 10 longer"] = _median_us(
        lambda: idx.lookup(pk, PROMPT_TOKENS), repeat
    )
    for i, e in enumerate(eids[1:], start=1):
        cut = len(prompt) * i // ENDPOINTS
        idx.dispatched(e, idx.keys_of("m", ApiKind.COMPLETION, prompt[:cut]), cut // 4)
    hits = idx.lookup(pk, PROMPT_TOKENS)
    assert len(hits) == ENDPOINTS, len(hits)
    out["lookup, 100 endpoints, 100 distinct lengths"] = _median_us(
        lambda: idx.lookup(pk, PROMPT_TOKENS), repeat
    )
    ratio[0] = 3.7
    out["... the same, 3.7 characters per token (fitted)"] = _median_us(
        lambda: idx.lookup(pk, PROMPT_TOKENS), repeat
    )
    ratio[0] = float(CHARS_PER_TOKEN)
    out["dispatch (500 keys to one endpoint)"] = _median_us(
        lambda: idx.dispatched(eids[5], pk, PROMPT_TOKENS), repeat
    )
    out["a short chat's whole share (keys, lookup, dispatch, finish)"] = _short_chat(eids, repeat)
    return out


def _short_chat(eids: list[EndpointId], repeat: int) -> float:
    """What the index costs a short chat request (300 characters, 8 endpoints known) from admission to
    finish: keying, matching, recording its dispatch and its answer."""
    idx = PrefixIndex(PrefixSettings())
    for e in eids[:8]:
        other = {"messages": [{"role": "user", "content": "x" * 5_000}]}
        idx.dispatched(e, idx.keys("m", ApiKind.CHAT, other), 1_250)
    body = {"model": "m", "messages": [{"role": "user", "content": "Write a haiku about the sea. " * 10}]}

    def one() -> None:
        k = idx.keys("m", ApiKind.CHAT, body)
        idx.lookup(k, 75)
        idx.dispatched(eids[3], k, 75)
        idx.finished(eids[3], k, "The sea rolls in slow " * 4)

    return _median_us(one, repeat)


def bytes_per_block(endpoints: int = ENDPOINTS, blocks: int = 20_000) -> float:
    rng = random.Random(2)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    idx = PrefixIndex(PrefixSettings(index_tokens=blocks * 16))
    per_prompt = 500
    for i in range(endpoints):
        eid = EndpointId(f"e{i:03d}")
        for _ in range(blocks // per_prompt):
            base = rng.getrandbits(60)
            keys = list(range(base, base + per_prompt))  # distinct keys: each block held once
            pk = idx.keys_of("m", ApiKind.COMPLETION, "")
            pk.keys = keys
            idx.dispatched(eid, pk, 0)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / (endpoints * blocks)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args(argv)
    for name, us in timings(args.repeat).items():
        print(f"{name:62s} {us:8.1f} µs")
    print(f"{'memory per block held (100 × 20,000 blocks)':62s} {bytes_per_block():8.0f} bytes")


if __name__ == "__main__":
    main()
