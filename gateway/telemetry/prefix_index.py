"""The prefix index: which prompt blocks each endpoint holds in its KV cache, behind one interface with
two sources (`gateway.telemetry.prefix_source.BlockHolder`).

- *approximate* (the default; any engine; nothing to configure): what berth sent where
  (`gateway.telemetry.prefix_approx`), updated when a request is dispatched (its prompt) and when it
  finishes (its answer, which the next turn of a conversation resends), sized from the engine's KV
  capacity (vLLM's `cache_config_info` num_gpu_blocks × block_size, SGLang's max total tokens, as
  scraped; `[prefix] index_tokens` otherwise), least recently used blocks evicted first;
- *precise*: the blocks an engine reports in its KV events, re-keyed by berth's chain over their token
  ids. A subscriber attaches one holder per endpoint (`attach`), reports its event lag (`set_lag`)
  and detaches it when its events stop; the endpoint then falls back to the approximate source,
  visibly (`source` in its stats).

A request's keys are computed once (`keys`), then matched against every endpoint (`lookup`): the
approximate source answers for all endpoints at once from one dict (a binary search on the prefix, see
`ApproximateBlocks.match_all`), a precise holder per endpoint. The answer, cached prompt tokens per
endpoint (`gateway.sched.prefix.PrefixHits`), is what the scheduler's predictions charge prefill by.

Hit rates shown per endpoint: *predicted* (prompt tokens the index predicted cached at dispatch over
the prompt tokens dispatched) and *engine-measured* (vLLM `prefix_cache_hits_total /
prefix_cache_queries_total`, SGLang `cache_hit_rate`, as scraped). Their ratio over the same scrape
interval is the *correction*: the fitted prefill model applies it to the index's predictions
(`gateway.telemetry.fleet_state`), so the fit learns from the tokens really computed, and below 1 it
scales the approximate source's answers (an engine that hits less than berth's record says, or that
caches nothing at all, is not credited with a cache it does not have). The bookkeeping itself counts the
index's own, uncorrected predictions (`dispatched`), so the correction does not feed back on itself.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import repeat
from operator import mul, rshift
from typing import Any, Final, Literal, cast

from gateway.core.blockhash import text_chain, token_chain
from gateway.core.types import ApiKind, EndpointId
from gateway.sched.prefix import NO_HITS, PrefixHits
from gateway.telemetry.prefix_approx import DEFAULT_BLOCKS, ApproximateBlocks, ApproximateHolder
from gateway.telemetry.prefix_keys import PromptKeys, answer_suffix, model_root, prompt_of
from gateway.telemetry.prefix_source import BlockHolder, SourceKind

Source = Literal["auto", "approximate", "precise", "off"]

#: The correction of the index's predictions by the engine's counters, at most (and at least 0).
_MAX_CORRECTION: Final = 2.0
#: Predicted cached tokens over a scrape interval below which no correction is derived (noise).
_MIN_CORRECTION_TOKENS: Final = 256.0
#: Slot sets whose endpoints are remembered at most.
_MEMO_SETS: Final = 4096
#: Fractional bits of the tokens per block of a text prompt (an estimate: characters per block over
#: the model's characters per token).
_FIXED_BITS: Final = 16
_FIXED_MASK: Final = (1 << _FIXED_BITS) - 1


@dataclass(frozen=True, slots=True)
class PrefixSettings:
    source: Source = "auto"
    block_tokens: int = 16  # tokens per block (approximate source; the precise one uses the engine's)
    # Tokens each endpoint's approximate index holds when the engine does not export its KV capacity.
    index_tokens: int | None = None
    chars_per_token: float = 4.0  # characters per approximate block = block_tokens × this

    @property
    def block_chars(self) -> int:
        return max(1, round(self.block_tokens * self.chars_per_token))

    @property
    def enabled(self) -> bool:
        return self.source != "off"


@dataclass(frozen=True, slots=True)
class PrefixStats:
    """One endpoint's prefix index, for /admin/fleet, `berth top` and the metrics."""

    source: SourceKind
    cached_blocks: int
    capacity_blocks: int
    predicted_hit_rate: float | None  # cached tokens predicted at dispatch / prompt tokens dispatched
    engine_hit_rate: float | None  # the engine's own, as scraped (None: not exported)
    event_lag_s: float | None  # the precise source's delay behind the engine (None: no precise source)
    correction: float  # engine-measured over predicted cached tokens (1: none known)

    def document(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "cached_blocks": self.cached_blocks,
            "capacity_blocks": self.capacity_blocks,
            "predicted_hit_rate": self.predicted_hit_rate,
            "engine_hit_rate": self.engine_hit_rate,
            "event_lag_s": self.event_lag_s,
            "correction": self.correction,
        }


class _Endpoint:
    __slots__ = (
        "correction",
        "engine_hit_rate",
        "engine_hits",
        "engine_queries",
        "holder",
        "lag",
        "precise",
        "predicted",
        "prompt",
        "since_predicted",
        "since_prompt",
    )

    def __init__(self, holder: ApproximateHolder) -> None:
        self.holder = holder
        self.precise: BlockHolder | None = None
        self.lag: float | None = None
        self.predicted = 0.0  # cached prompt tokens predicted at dispatch, cumulative
        self.prompt = 0.0  # prompt tokens dispatched, cumulative
        self.since_predicted = 0.0  # ... since the last engine reading
        self.since_prompt = 0.0
        self.engine_hits: float | None = None  # the engine's cumulative counters at the last scrape
        self.engine_queries: float | None = None
        self.engine_hit_rate: float | None = None
        self.correction = 1.0


class PrefixIndex:
    """Cached prompt tokens per endpoint for a request, from the approximate source or a precise one."""

    def __init__(
        self, settings: PrefixSettings | None = None, chars_per_token: Callable[[str], float] | None = None
    ) -> None:
        self.settings = settings or PrefixSettings()
        self._cpt = chars_per_token
        self._blocks = ApproximateBlocks()
        self._endpoints: dict[EndpointId, _Endpoint] = {}
        self._by_bit: dict[int, EndpointId] = {}  # a slot's bit -> its endpoint
        self._capacity_tokens: dict[EndpointId, float] = {}
        self._roots: dict[str, int] = {}
        self._eids_memo: dict[int, tuple[EndpointId, ...]] = {}  # slots bitset (several) -> its endpoints
        # Endpoints whose correction is below 1, and it: their approximate answers are scaled by it.
        self._damped: dict[EndpointId, float] = {}
        self._precise: dict[EndpointId, BlockHolder] = {}  # the endpoints with a precise holder attached

    def configure(self, settings: PrefixSettings) -> None:
        """New settings (config reload): a new block size starts the approximate index afresh."""
        old, self.settings = self.settings, settings
        if (old.block_tokens, old.block_chars) != (settings.block_tokens, settings.block_chars):
            for ep in self._endpoints.values():
                self._blocks.clear(ep.holder.idx)
        for eid in self._endpoints:
            self._resize(eid)

    # ----------------------------------------------------------------- endpoints
    def _endpoint(self, eid: EndpointId) -> _Endpoint:
        ep = self._endpoints.get(eid)
        if ep is None:
            idx = self._blocks.add_slot(self._capacity_blocks(eid))
            ep = self._endpoints[eid] = _Endpoint(
                ApproximateHolder(self._blocks, idx, self.settings.block_tokens)
            )
            self._by_bit[1 << idx] = eid
            self._eids_memo.clear()
        return ep

    def _capacity_blocks(self, eid: EndpointId) -> int:
        tokens = self._capacity_tokens.get(eid) or self.settings.index_tokens
        if tokens is None:
            return DEFAULT_BLOCKS
        return max(1, int(tokens // self.settings.block_tokens))

    def _resize(self, eid: EndpointId) -> None:
        ep = self._endpoints.get(eid)
        if ep is not None:
            self._blocks.set_capacity(ep.holder.idx, self._capacity_blocks(eid))

    def set_capacity(self, eid: EndpointId, kv_tokens: float | None) -> None:
        """The engine's KV capacity in tokens (None: unknown; the configured size applies)."""
        if kv_tokens is None or kv_tokens <= 0:
            self._capacity_tokens.pop(eid, None)
        elif self._capacity_tokens.get(eid) == kv_tokens:
            return
        else:
            self._capacity_tokens[eid] = kv_tokens
        self._resize(eid)

    def keep(self, eids: Iterable[EndpointId]) -> None:
        """Forget endpoints that left the fleet."""
        wanted = set(eids)
        for eid in [e for e in self._endpoints if e not in wanted]:
            ep = self._endpoints.pop(eid)
            self._blocks.drop_slot(ep.holder.idx)
            self._by_bit.pop(1 << ep.holder.idx, None)
            self._capacity_tokens.pop(eid, None)
            self._damped.pop(eid, None)
            self._precise.pop(eid, None)
            self._eids_memo.clear()

    def clear(self, eid: EndpointId) -> None:
        """The endpoint's cache is gone (engine restarted): forget what it was sent."""
        ep = self._endpoints.get(eid)
        if ep is not None:
            self._blocks.clear(ep.holder.idx)

    def attach(self, eid: EndpointId, holder: BlockHolder | None) -> None:
        """The precise source's holder for `eid` (None: detached; the approximate source answers)."""
        ep = self._endpoint(eid)
        ep.precise = holder
        if holder is None:
            ep.lag = None
            self._precise.pop(eid, None)
        else:
            self._precise[eid] = holder

    def set_lag(self, eid: EndpointId, seconds: float | None) -> None:
        """How far the precise source's events for `eid` are behind the engine."""
        self._endpoint(eid).lag = seconds

    def source(self, eid: EndpointId) -> SourceKind:
        ep = self._endpoints.get(eid)
        precise = ep is not None and ep.precise is not None and self.settings.source in ("auto", "precise")
        return "precise" if precise else "approximate"

    # ----------------------------------------------------------------- requests
    def keys(self, model: str, api: ApiKind, body: Mapping[str, Any]) -> PromptKeys | None:
        """The request's keys (None: not indexed, or the index is off)."""
        if not self.settings.enabled:
            return None
        prompt = prompt_of(api, body)
        return None if prompt is None else self.keys_of(model, api, prompt)

    def keys_of(self, model: str, api: ApiKind, prompt: str | list[int]) -> PromptKeys:
        root = self._roots.get(model)
        if root is None:
            root = self._roots[model] = model_root(model)
        s = self.settings
        chars = s.block_chars
        if isinstance(prompt, str):
            keys = text_chain(prompt, chars, root)
            tail = prompt[len(keys) * chars :]
            return PromptKeys(model, api, keys, root=root, block_chars=chars, tail=tail)
        keys = token_chain(prompt, s.block_tokens, root)
        return PromptKeys(
            model,
            api,
            keys,
            root=root,
            block_chars=chars,
            tail=None,
            token_ids=prompt,
            tokens_per_block=s.block_tokens,
        )

    def _eids_of(self, held: int) -> tuple[EndpointId, ...]:
        """The endpoints of a slots bitset, remembered (the same sets come back request after request:
        the endpoints holding a shared system prompt) until the slots change."""
        by_bit = self._by_bit
        eids: list[EndpointId] = []
        bits = held
        while bits:
            low = bits & -bits
            eid = by_bit.get(low)
            if eid is not None:
                eids.append(eid)
            bits ^= low
        memo = self._eids_memo
        if len(memo) >= _MEMO_SETS:
            memo.clear()
        got = memo[held] = tuple(eids)
        return got

    def _tokens_per_block(self, pk: PromptKeys) -> int:
        """Tokens per block in fixed point (`_FIXED_BITS` fractional bits): `(blocks * this) >>
        _FIXED_BITS` tokens, the same in `lookup` and `cached_on`, in int arithmetic (a float product
        and its conversion back to int cost twice as much per match length)."""
        if pk.tokens_per_block is not None:
            return pk.tokens_per_block << _FIXED_BITS
        cpt = self._cpt(pk.model) if self._cpt is not None else self.settings.chars_per_token
        return round(pk.block_chars / max(cpt, 0.1) * (1 << _FIXED_BITS))

    def _by_endpoint(self, bitsets: list[int], tokens: list[int]) -> dict[EndpointId, int]:
        """Tokens per endpoint from the slots bitsets of each match length and its tokens. Most lengths
        are held by one endpoint each (a bitset of one bit): one dict lookup each, in C. The bitsets of
        several endpoints (and of none) come out as None, and then each of them is expanded (its
        endpoints remembered per bitset)."""
        by_bit: Callable[[int], EndpointId | None] = self._by_bit.get
        firsts = list(map(by_bit, bitsets))
        out = dict(zip(firsts, tokens, strict=True))
        if None in out:
            del out[None]
            memo = self._eids_memo
            at = -1
            for _ in range(firsts.count(None)):
                at = firsts.index(None, at + 1)
                held = bitsets[at]
                eids = memo.get(held)
                out.update(dict.fromkeys(self._eids_of(held) if eids is None else eids, tokens[at]))
        return cast("dict[EndpointId, int]", out)  # None is gone

    def lookup(self, pk: PromptKeys | None, prompt_tokens: int) -> PrefixHits:
        """Cached prompt tokens per endpoint for the request (at most `prompt_tokens`)."""
        if pk is None or not self._endpoints:
            return NO_HITS
        out: dict[EndpointId, int] = {}
        bitsets, lengths = self._blocks.match_lists(pk.keys)
        if bitsets:
            # In C-level iterators: a hundred endpoints each holding its own length cost few more
            # Python steps than one.
            fixed = self._tokens_per_block(pk)
            if fixed & _FIXED_MASK:
                tokens = list(map(rshift, map(mul, lengths, repeat(fixed)), repeat(_FIXED_BITS)))
            else:  # a whole number of tokens per block: one product each
                tokens = list(map(mul, lengths, repeat(fixed >> _FIXED_BITS)))
            if tokens[-1] > prompt_tokens:  # never more than the prompt (the tokens increase)
                cut = bisect_right(tokens, prompt_tokens)
                tokens[cut:] = repeat(prompt_tokens, len(tokens) - cut)
            out = self._by_endpoint(bitsets, tokens)
        if self._damped:  # engines that hit less than the approximate source predicts (even none)
            for eid, c in self._damped.items():
                got = out.get(eid)
                if got is not None:
                    kept = int(got * c)
                    if kept > 0:
                        out[eid] = kept
                    else:
                        del out[eid]
        if self._precise and self.settings.source != "approximate":
            for eid, holder in self._precise.items():
                size = holder.block_tokens
                keys = pk.token_keys(size)
                if keys is None:
                    continue  # no token ids: the approximate answer stands for this endpoint
                out[eid] = min(prompt_tokens, holder.matched(keys) * size)
        return PrefixHits.trusted(out) if out else NO_HITS

    def cached_on(self, eid: EndpointId, pk: PromptKeys | None, prompt_tokens: int) -> int:
        """The index's own prediction of the request's cached tokens on one endpoint (its source's match,
        without the engine counters' correction)."""
        ep = self._endpoints.get(eid)
        if ep is None or pk is None:
            return 0
        holder = ep.precise if self.settings.source != "approximate" else None
        if holder is not None:
            keys = pk.token_keys(holder.block_tokens)
            if keys is not None:
                return min(prompt_tokens, holder.matched(keys) * holder.block_tokens)
        n = self._blocks.matched(ep.holder.idx, pk.keys)
        return min(prompt_tokens, (n * self._tokens_per_block(pk)) >> _FIXED_BITS)

    def dispatched(self, eid: EndpointId, pk: PromptKeys | None, prompt_tokens: int) -> int:
        """The request was sent to `eid`: the endpoint holds its prompt's blocks now. Returns the prompt
        tokens the index predicted cached there just before (its own prediction, uncorrected: what the
        hit-rate bookkeeping and the prefill fit count)."""
        ep = self._endpoint(eid)
        cached = self.cached_on(eid, pk, prompt_tokens)
        ep.prompt += prompt_tokens
        ep.predicted += cached
        ep.since_prompt += prompt_tokens
        ep.since_predicted += cached
        if pk is not None:
            self._blocks.insert(ep.holder.idx, pk.keys)
        return cached

    def finished(self, eid: EndpointId, pk: PromptKeys | None, answer: str | None) -> None:
        """The request finished on `eid` with `answer` (its generated text; None: unknown): its blocks
        are the most recent there, and the answer extends them (the next turn of a conversation resends
        it)."""
        if pk is None:
            return
        ep = self._endpoints.get(eid)
        if ep is None:
            return
        keys = pk.keys
        if answer and pk.tail is not None:
            more = text_chain(
                pk.tail + answer_suffix(pk.api, answer), pk.block_chars, keys[-1] if keys else pk.root
            )
            keys = keys + more
        self._blocks.insert(ep.holder.idx, keys)

    # ----------------------------------------------------------------- engine counters
    def observe_engine(
        self,
        eid: EndpointId,
        *,
        hits: float | None = None,
        queries: float | None = None,
        hit_rate: float | None = None,
    ) -> None:
        """One scrape's prefix-cache readings: cumulative hit and query tokens (vLLM) or a hit rate
        (SGLang). Derives the engine-measured hit rate over the interval and the correction of the
        index's predictions."""
        if hits is None and queries is None and hit_rate is None:
            return
        ep = self._endpoint(eid)
        rate: float | None = None
        if hits is not None and queries is not None:
            last_hits, last_queries = ep.engine_hits, ep.engine_queries
            ep.engine_hits, ep.engine_queries = hits, queries
            if last_hits is None or last_queries is None or queries < last_queries:
                # the first reading, or the engine restarted (its counters went back: its cache is
                # empty, whatever berth sent it before): an interval starts here
                if last_queries is not None and queries < last_queries:
                    self._blocks.clear(ep.holder.idx)
                ep.since_predicted = ep.since_prompt = 0.0
                return
            dh, dq = hits - last_hits, queries - last_queries
            if dq > 0 and dh >= 0:
                rate = dh / dq
        elif hit_rate is not None:
            rate = min(1.0, max(0.0, hit_rate))
        if rate is None:
            return
        ep.engine_hit_rate = rate
        if ep.since_predicted >= _MIN_CORRECTION_TOKENS and ep.since_prompt > 0:
            predicted_rate = ep.since_predicted / ep.since_prompt
            ep.correction = min(_MAX_CORRECTION, max(0.0, rate / predicted_rate))
            if ep.correction < 1.0:
                self._damped[eid] = ep.correction
            else:
                self._damped.pop(eid, None)
        ep.since_predicted = ep.since_prompt = 0.0

    def correction(self, eid: EndpointId) -> float:
        ep = self._endpoints.get(eid)
        return 1.0 if ep is None else ep.correction

    # ----------------------------------------------------------------- visibility
    def stats(self, eid: EndpointId) -> PrefixStats | None:
        ep = self._endpoints.get(eid)
        if ep is None:
            return None
        source = self.source(eid)
        holder: BlockHolder = ep.precise if source == "precise" and ep.precise is not None else ep.holder
        return PrefixStats(
            source=source,
            cached_blocks=holder.cached_blocks(),
            capacity_blocks=self._blocks.capacity(ep.holder.idx),
            predicted_hit_rate=ep.predicted / ep.prompt if ep.prompt > 0 else None,
            engine_hit_rate=ep.engine_hit_rate,
            event_lag_s=ep.lag,
            correction=ep.correction,
        )

    def endpoints(self) -> list[EndpointId]:
        return list(self._endpoints)
