"""MaaSO's placer (papers/ALGORITHMS.md §4), sans-IO: which instance configurations to run for a model's
SLO mix, and how to split the devices between the strict and the relaxed sub-cluster.

Inputs:
- the traffic mix (`TrafficMix`): the request rate, its burstiness (coefficient of variation of the
  gaps), and kinds of requests with their share, deadline factor (deadline / (decode length × t_slot))
  and decode length; `gateway.sched.mix_window.MixWindow` builds one from observed requests;
- the candidate configurations (`ConfigProfile`): devices, max batch, and the fitted throughput-decay
  curve ``thr(n) = thr1 − α·ln(1 + β·min(n, B))`` (per-request decode tokens/s at concurrency n, the
  curve `gateway.telemetry.perfmodel` fits; `PerfCoefficients` carries it);
- a device budget.

**The estimate is analytic** (not simulator-guided: it runs inside the scheduler's process, in well
under a millisecond per evaluation). A sub-cluster's requests are spread over its instances in
proportion to their capacity (``B·thr(B) / decode length`` requests/s each); an instance's steady
concurrency n solves ``n = λ·L / thr(n)`` (Little's law; n = B and the excess unserved when it has
none); a request sees ``n + cv·√n`` running (burstier arrivals meet fuller batches), waits for a seat
in the gateway's one queue for the sub-cluster's seats (Sakasegawa's approximation of a queue with
Σ B servers, with the arrival variability), is prefilled, and decodes its length at ``thr(n_seen)``.
It meets its deadline with a probability that falls smoothly (logistic, 5 % wide) as that latency
passes the deadline, so the score moves with every added instance.

**The serving score** of a placement: ``w·attainment + (1 − w)·(λ·norm_throughput + (1 − λ)·(1 −
norm_latency))``, where attainment is the share of requests expected to meet their deadline,
norm_throughput the served share of the offered tokens, and norm_latency the mean latency over the
mean deadline (at most 1).

**The search** (MaaSO's greedy placement and its dynamic program): requests with a deadline factor
below `strict_below` form the strict sub-cluster and are served by configurations of max batch at most
`strict_max_batch`; the others (the relaxed sub-cluster) by the larger ones (when one side has no
configuration, every request goes to the other). For each sub-cluster and each device count d, the
best instance set is the best of the set for d − 1, of every set for d − devices(c) plus one instance
of c (instances are added greedily while they raise the score), and of as many instances of c alone as
fit (one instance may gain nothing until enough of them serve a tight kind); then the devices are split
between the two sub-clusters where the sum of their share-weighted scores is highest.
`next_config` answers the scaler's question "which configuration next?": the configuration whose
addition to what runs (as 1, 2, 4, ... instances of it, as many as fit) raises the score most per
device.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from gateway.sched.perf import PerfCoefficients

SubCluster = Literal["strict", "relaxed"]
STRICT: Final[SubCluster] = "strict"
RELAXED: Final[SubCluster] = "relaxed"
#: Width of the logistic that turns latency / deadline into a probability of meeting it.
_SOFTNESS: Final = 0.05


@dataclass(frozen=True, slots=True)
class ConfigProfile:
    """One instance configuration of a model, with its fitted throughput-decay curve."""

    name: str
    devices: int
    max_batch: int
    thr1: float  # per-request decode tokens/s alone
    alpha: float
    beta: float
    prefill_s: float = 0.0  # a typical prompt's prefill (part of every request's latency)

    def __post_init__(self) -> None:
        if self.devices < 1 or self.max_batch < 1:
            raise ValueError(f"{self.name}: devices and max_batch must be >= 1")
        if not self.thr1 > 0 or self.alpha < 0 or self.beta < 0:
            raise ValueError(f"{self.name}: the curve needs thr1 > 0, alpha >= 0, beta >= 0")

    @classmethod
    def from_perf(
        cls, name: str, devices: int, max_batch: int, perf: PerfCoefficients, *, prompt_tokens: float = 0.0
    ) -> ConfigProfile:
        return cls(
            name,
            devices,
            max_batch,
            perf.thr1,
            perf.alpha,
            perf.beta,
            perf.prefill_s(prompt_tokens) if prompt_tokens > 0 else 0.0,
        )

    def tps(self, n: float) -> float:
        """Per-request decode tokens/s at concurrency `n` (truncated at the max batch; > 0)."""
        n = min(max(n, 1.0), float(self.max_batch))
        return max(1e-9, self.thr1 - self.alpha * math.log1p(self.beta * n))

    def capacity(self, decode_tokens: float) -> float:
        """Requests/s it finishes at a full batch."""
        return self.max_batch * self.tps(self.max_batch) / max(1.0, decode_tokens)


@dataclass(frozen=True, slots=True)
class RequestKind:
    share: float  # of the requests
    factor: float  # deadline / (decode length × t_slot)
    decode_tokens: float


@dataclass(frozen=True, slots=True)
class TrafficMix:
    rate: float  # requests/s
    t_slot_s: float  # single-token decode time of a plain instance (what deadline factors are relative to)
    kinds: tuple[RequestKind, ...]
    cv: float = 1.0  # coefficient of variation of the arrival gaps (burstiness)

    def split(self, strict_below: float) -> dict[SubCluster, tuple[RequestKind, ...]]:
        return {
            STRICT: tuple(k for k in self.kinds if k.factor < strict_below),
            RELAXED: tuple(k for k in self.kinds if k.factor >= strict_below),
        }

    @property
    def total_share(self) -> float:
        return sum(k.share for k in self.kinds)


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    w: float = 0.8  # attainment against efficiency
    lam: float = 0.5  # throughput against latency, within efficiency

    def __post_init__(self) -> None:
        if not (0.0 <= self.w <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError("w and lam must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class Estimate:
    """What the analytic model expects of a set of instances serving some kinds of requests. Shares are
    of the whole mix, so the estimates of the two sub-clusters add up."""

    share: float  # of all requests, served by this set
    attained: float  # share of all requests expected to meet their deadline
    served_tokens: float  # decode tokens/s served
    offered_tokens: float  # decode tokens/s offered
    latency_ratio: float  # share-weighted mean latency / deadline (each capped at 1)

    def score(self, weights: ScoreWeights, total: Estimate | None = None) -> float:
        """The serving score of this part, share-weighted (the parts of a placement add up); with `total`,
        throughput is normalised by the whole mix's offered tokens."""
        offered = (total or self).offered_tokens
        thr = self.served_tokens / offered if offered > 0 else 0.0
        eff = weights.lam * thr + (1.0 - weights.lam) * (self.share - self.latency_ratio)
        return weights.w * self.attained + (1.0 - weights.w) * eff


@dataclass(frozen=True, slots=True)
class Placement:
    instances: dict[SubCluster, tuple[str, ...]]  # configuration names per sub-cluster
    devices: dict[SubCluster, int]
    score: float
    estimate: dict[SubCluster, Estimate]

    @property
    def all_instances(self) -> list[str]:
        return [*self.instances[STRICT], *self.instances[RELAXED]]


@dataclass(frozen=True, slots=True)
class NextInstance:
    config: str
    sub_cluster: SubCluster
    gain: float  # serving score gained by `instances` of it
    instances: int = 1  # how many of it the gain was judged on (start one; the next call asks again)


@dataclass(frozen=True, slots=True)
class Placer:
    """MaaSO's placer over fixed candidate configurations (see the module docstring)."""

    configs: tuple[ConfigProfile, ...]
    strict_below: float = 1.1  # deadline factors below this are strict
    strict_max_batch: int = 8  # configurations of max batch at most this serve the strict sub-cluster
    weights: ScoreWeights = field(default_factory=ScoreWeights)

    def __post_init__(self) -> None:
        if not self.configs:
            raise ValueError("no candidate configuration")
        names = [c.name for c in self.configs]
        if len(set(names)) != len(names):
            raise ValueError("a configuration is named twice")

    # ----------------------------------------------------------------- which sub-cluster
    def sub_cluster_of(self, config: ConfigProfile) -> SubCluster:
        return STRICT if config.max_batch <= self.strict_max_batch else RELAXED

    def candidates(self, sub: SubCluster) -> tuple[ConfigProfile, ...]:
        return tuple(c for c in self.configs if self.sub_cluster_of(c) == sub)

    def kinds(self, mix: TrafficMix) -> dict[SubCluster, tuple[RequestKind, ...]]:
        """The requests each sub-cluster serves: split by factor, or all to the one side that has
        configurations."""
        if not self.candidates(STRICT):
            return {STRICT: (), RELAXED: mix.kinds}
        if not self.candidates(RELAXED):
            return {STRICT: mix.kinds, RELAXED: ()}
        return mix.split(self.strict_below)

    # ----------------------------------------------------------------- the estimate
    def estimate(
        self, mix: TrafficMix, kinds: Sequence[RequestKind], instances: Sequence[ConfigProfile]
    ) -> Estimate:
        """What `instances` achieve serving `kinds` of `mix` (module docstring: the analytic model)."""
        total = mix.total_share or 1.0
        share = sum(k.share for k in kinds) / total
        if share <= 0:
            return Estimate(0.0, 0.0, 0.0, 0.0, 0.0)
        rate = mix.rate * share
        mean_len = sum(k.share * k.decode_tokens for k in kinds) / (share * total)
        offered = rate * mean_len
        if not instances or rate <= 0:
            return Estimate(share, 0.0, 0.0, offered, share)
        # Alike instances are one group (their parts are equal): the cost grows with the configurations
        # in the set, not its size (the search and `next_config` evaluate sets of dozens).
        groups = Counter(instances)
        caps = {c: c.capacity(mean_len) for c in groups}
        total_cap = sum(n * caps[c] for c, n in groups.items())
        served_frac = min(1.0, total_cap / rate)
        attained = 0.0
        latency = 0.0
        # One queue in the gateway for all the sub-cluster's seats (a request takes the first free one).
        seats = sum(n * c.max_batch for c, n in groups.items())
        service = sum(n * caps[c] / total_cap * mean_len / c.tps(c.max_batch) for c, n in groups.items())
        wait = _queue_wait(rate / total_cap, seats, service, mix.cv)
        for c, count in groups.items():
            cap = caps[c]
            lam_i = rate * cap / total_cap  # one instance's part of the arrivals (served or not)
            n, _ = _concurrency(c, lam_i, mean_len)
            seen = min(float(c.max_batch), n + mix.cv * math.sqrt(n))
            tps = c.tps(seen)
            part = count * cap / total_cap  # the group's part of every kind
            for k in kinds:
                weight = (k.share / total) * part
                lat = wait + c.prefill_s + k.decode_tokens / tps
                deadline = k.factor * k.decode_tokens * mix.t_slot_s
                ratio = lat / deadline if deadline > 0 else math.inf
                attained += weight * _meets(ratio)
                latency += weight * min(1.0, ratio)
        return Estimate(
            share=share,
            attained=attained * served_frac,
            served_tokens=offered * served_frac,
            offered_tokens=offered,
            latency_ratio=latency * served_frac + share * (1.0 - served_frac),
        )

    def score(self, mix: TrafficMix, instances: Mapping[SubCluster, Sequence[ConfigProfile]]) -> float:
        """The serving score of running `instances`, with requests distributed as the `sub-cluster`
        filter does: by sub-cluster, or all to one side when the other runs nothing."""
        kinds = self.served(mix, instances)
        whole = self.estimate(mix, mix.kinds, [])
        return sum(
            self.estimate(mix, kinds[s], instances.get(s, ())).score(self.weights, whole)
            for s in (STRICT, RELAXED)
        )

    def served(
        self, mix: TrafficMix, instances: Mapping[SubCluster, Sequence[ConfigProfile]]
    ) -> dict[SubCluster, tuple[RequestKind, ...]]:
        """The requests each sub-cluster serves when `instances` run (the filter does not split a model
        whose endpoints are all on one side)."""
        for s in (STRICT, RELAXED):
            if instances.get(s) and not instances.get(_other(s)):
                return {s: mix.kinds, _other(s): ()}
        return self.kinds(mix)

    # ----------------------------------------------------------------- the search
    def place(self, mix: TrafficMix, devices: int) -> Placement:
        """The instance set for `devices` devices: per sub-cluster, the best set for every device count
        (greedy additions), then the split of the devices where the summed score is highest; or one
        sub-cluster's configurations alone serving every request (the distributor does not split a
        model whose endpoints are all alike), when that scores higher."""
        if devices < 0:
            raise ValueError("devices must be >= 0")
        kinds = self.kinds(mix)
        whole = self.estimate(mix, mix.kinds, [])
        best = {s: self._table(mix, kinds[s], self.candidates(s), devices, whole) for s in (STRICT, RELAXED)}
        split = max(
            range(devices + 1),
            key=lambda d: (best[STRICT][d][0] + best[RELAXED][devices - d][0], -d),
        )
        chosen = {STRICT: best[STRICT][split][1], RELAXED: best[RELAXED][devices - split][1]}
        score = best[STRICT][split][0] + best[RELAXED][devices - split][0]
        served = self.served(mix, chosen)
        if not chosen[STRICT] or not chosen[RELAXED]:  # the filter sends every request to the other side
            score = self.score(mix, chosen)
        for s in (STRICT, RELAXED):
            value, alone = self._table(mix, mix.kinds, self.candidates(s), devices, whole)[devices]
            if alone and value > score + 1e-12:
                chosen = {s: alone, _other(s): ()}
                served = {s: mix.kinds, _other(s): ()}
                score = value
        return Placement(
            instances={s: tuple(c.name for c in chosen[s]) for s in (STRICT, RELAXED)},
            devices={s: sum(c.devices for c in chosen[s]) for s in (STRICT, RELAXED)},
            score=score,
            estimate={s: self.estimate(mix, served[s], chosen[s]) for s in (STRICT, RELAXED)},
        )

    def _table(
        self,
        mix: TrafficMix,
        kinds: Sequence[RequestKind],
        cands: Sequence[ConfigProfile],
        devices: int,
        whole: Estimate,
    ) -> list[tuple[float, tuple[ConfigProfile, ...]]]:
        """For every device count d <= `devices`: the best (score, instances) for `kinds` from `cands`."""
        table: list[tuple[float, tuple[ConfigProfile, ...]]] = [
            (self.estimate(mix, kinds, ()).score(self.weights, whole), ())
        ]
        for d in range(1, devices + 1):
            top = table[d - 1]
            for c in cands:
                if c.devices > d:
                    continue
                # One more instance of c on the best set for the devices left, or only instances of c
                # (the greedy additions alone stall where one instance gains nothing yet).
                for inst in ((*table[d - c.devices][1], c), (c,) * (d // c.devices)):
                    value = self.estimate(mix, kinds, inst).score(self.weights, whole)
                    if value > top[0] + 1e-12:
                        top = (value, inst)
            table.append(top)
        return table

    def next_config(
        self,
        mix: TrafficMix,
        running: Iterable[str],
        free_devices: int,
        *,
        min_gain: float = 1e-6,
        among: Collection[str] | None = None,
    ) -> NextInstance | None:
        """The configuration to start next (the scaler's question): of those that fit `free_devices`,
        the one whose instances, added to the `running` configurations (names), raise the serving score
        most per device they take. Per device: devices are what the scaler spends (a two-device
        instance must gain twice as much). Instances, not one instance: as in `place`, one small-batch
        instance may gain nothing (the strict requests all crowd onto it) until enough of them serve
        the tight kinds, so each configuration is tried as 1, 2, 4, ... more instances (as many as fit),
        judged by the best of them. `among`: only these configurations (default: every one). None when
        no addition raises the score by `min_gain`."""
        by_name = {c.name: c for c in self.configs}
        now: dict[SubCluster, list[ConfigProfile]] = {STRICT: [], RELAXED: []}
        for name in running:
            c = by_name.get(name)
            if c is not None:
                now[self.sub_cluster_of(c)].append(c)
        base = self.score(mix, now)
        best: NextInstance | None = None
        best_rate = 0.0
        for c in self.configs:
            if among is not None and c.name not in among:
                continue
            s = self.sub_cluster_of(c)
            k = 1
            while k * c.devices <= free_devices:
                gain = self.score(mix, {**now, s: [*now[s], *(c,) * k]}) - base
                rate = gain / (k * c.devices)
                if gain >= min_gain and (best is None or rate > best_rate):
                    best, best_rate = NextInstance(c.name, s, gain, k), rate
                k *= 2
        return best


def _other(s: SubCluster) -> SubCluster:
    return RELAXED if s == STRICT else STRICT


def _concurrency(c: ConfigProfile, rate: float, decode_tokens: float) -> tuple[float, float]:
    """(steady concurrency, utilisation) of one instance at `rate` requests/s: the n in [0, B] with
    ``n = rate·L / thr(n)`` (bisection; the right side grows with n), B when there is none."""
    b = float(c.max_batch)
    if rate <= 0:
        return 0.0, 0.0
    need = rate * decode_tokens
    if need / c.tps(b) >= b:
        return b, 1.0
    lo, hi = 0.0, b
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if need / c.tps(mid) > mid:
            lo = mid
        else:
            hi = mid
    n = hi
    return n, min(1.0, rate / c.capacity(decode_tokens))


def _queue_wait(rho: float, seats: int, service_s: float, cv: float) -> float:
    """Mean wait for a seat in a `seats`-server queue (Sakasegawa's approximation, with the arrival
    variability `cv` and exponential-like service)."""
    if rho <= 0:
        return 0.0
    rho = min(rho, 0.999)
    c = float(seats)
    busy: float = math.pow(rho, math.sqrt(2.0 * (c + 1.0)) - 1.0)
    return busy / (c * (1.0 - rho)) * service_s * (cv * cv + 1.0) / 2.0


def _meets(ratio: float) -> float:
    """Probability of meeting a deadline at latency/deadline = `ratio`."""
    x = (ratio - 1.0) / _SOFTNESS
    if x > 60:
        return 0.0
    return 1.0 / (1.0 + math.exp(x))
