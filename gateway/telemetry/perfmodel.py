"""Per-endpoint performance models (Aladdin §2, MaaSO §4), fitted online by weighted least squares.

The coefficient type and the prior are the scheduler core's (`gateway.sched.perf`); this module fits
them. The models, all in seconds and tokens:

| dimension  | model                                                  | coefficients |
| ---------- | ------------------------------------------------------ | ------------ |
| prefill    | ``t_pre = k1 · Σ prompt tokens of the iteration + c1`` | k1, c1       |
| decode     | ``t_dec = (k2 · avg_context + c2) · batch + c3``       | k2, c2, c3   |
| KV cache   | ``kv tokens of a request = h · context tokens + j``    | h, j         |
| throughput | ``per-request decode tokens/s = thr1 − α·ln(1 + β·n)`` | thr1, α, β   |

**Which live observation feeds which coefficient** (the contract for whoever wires this in; the engine
is treated as a black box that emits one token per running request at the end of every decode
iteration and the first token of newly admitted requests at the end of a prefill iteration):

- **prefill** ← ``observe_prefill(prompt_tokens, seconds)``, once per prefill iteration: a group of
  first tokens that arrive from the endpoint together (within a fraction of an iteration), with
  ``prompt_tokens`` = the sum of the group's prompts (the requests dispatched to the same endpoint whose
  first token came in the same iteration). ``seconds``:
  - endpoint busy (streams running there): from a running stream (one, or the median of several), the
    gap in which the group's first tokens arrived (the prefill paused it) minus the mean of that
    stream's next uninterrupted gaps (up to four; they time the decode iteration that shares the
    interrupted gap). Both ends are the same stream's tokens, so the relay's own delays cancel. Skip it
    when another prefill landed in the same gap, or when the gap before it and the gaps after it differ
    from their median by more than 1.5x (a stalled event loop on either side);
  - endpoint idle (nothing relayed from it between the dispatch and this first token): TTFT from
    dispatch to first token.
  Raw TTFT on a busy endpoint would also count the wait for the iteration in flight and any queueing
  inside the engine, all of which a linear fit would put into ``c1``
  (``loadgen.bench.simulator.predict_accuracy`` shows the size of that error).
- **decode** ← ``observe_decode(batch, avg_context, seconds)``, once per finished stream. ``seconds`` is
  the mean inter-token gap of the stream, leaving out every gap during which another request on the
  same endpoint got its first token (a prefill ran inside that gap and paused the decode). For each
  gap kept, the gateway samples the endpoint's running count (its streams that have had a first token
  and not their last) and the sum of their contexts (prompt + tokens relayed so far); ``batch`` is the
  mean running count over the kept gaps and ``avg_context`` the mean context sum divided by that mean
  count. Because ``t_dec = k2 · Σ context + c2 · batch + c3`` is linear in those two sums, the mean of
  the iteration times equals the model at these means: nothing is lost by averaging. (When the other
  streams are not tracked, ``avg_context = prompt + produced / 2`` of the stream itself is the fallback;
  it is noisier because it stands for the whole batch's mean context.)
- **KV** ← ``observe_kv(context_tokens, kv_tokens)``, once per scrape whose running count agrees with
  the gateway's (its streams that have had a first token and not their last). Scrapes that disagree
  (e.g. while a prefill is in flight) are skipped, and so are scrapes during which a token was relayed
  from the endpoint. ``kv_tokens`` = engine KV usage fraction (``vllm:kv_cache_usage_perc``,
  ``sglang:token_usage``) × KV capacity in tokens (``num_gpu_blocks × block_size`` of
  ``vllm:cache_config_info``, ``sglang:max_total_num_tokens``), divided by the running count;
  ``context_tokens`` = the sum of the contexts (prompt + tokens relayed so far) of the requests running
  there, divided by the same count. Per-request means make ``kv_tokens(ctx)`` Aladdin's per-request
  footprint; the endpoint total for n requests is ``h · Σ context + n · j``.
- **throughput decay** ← ``observe_throughput(concurrency, tokens_per_s)``, once per finished stream:
  ``tokens_per_s = (tokens − 1) / (last token − first token)`` of the stream (prefill pauses included:
  that is the rate a client sees) and ``concurrency`` = the endpoint's running count averaged over all
  gaps of the stream.

**Fitting.** ``observe_*`` only append to a bounded window (O(1); never fit on the request path).
``refit()`` (a background task, every few seconds; 3.5 ms of CPU per endpoint with full windows, run
live in steps of at most about 0.2 ms, ``refit_steps``) solves, per dimension, a weighted least-squares
problem on *relative* errors, so short and long observations count alike and the fit minimises what
``*_mape`` reports. The weights are exponential forgetting (an observation ``a`` observations old weighs
``2^(−a / half_life)``) times robust weights (iteratively reweighted: Huber, then Tukey's biweight, so
gross outliers such as a stalled event loop or a GC pause, which only ever add time, get no weight;
residuals are relative to the fitted value, since dividing by a noisy observation would favour the ones
that came out short). Slopes and intercepts are constrained to be non-negative (exact NNLS by trying
every face of the constraint set: at most three unknowns). A dimension keeps its current coefficients
(the prior until its first good fit) while it has fewer than ``min_obs`` observations
(``first_fit_min_obs`` while it still holds a prior that is a guess, ``guessed``: a prior from other
hardware is worse than a fit of a few observations of this one), or when its system is ill-conditioned
(e.g. every prompt the same length, or a saturated endpoint that only ever runs one batch size: the
slope cannot be told from the intercept), or when the fit would put every coefficient at zero. The
throughput curve is non-linear in β: a log-spaced grid of β with the linear (thr1, α) solved in closed
form for each. The regression itself (stateless, in steps) is `gateway.telemetry.robust_regression`.

**Cadence.** A dimension with a fit of its own is fitted again once the observations made since that
fit carry at least ``refit_share`` (5 %) of its window's forgetting weight: every new observation while
the window is short, about 35 with a full window of 2000 at a half-life of 500. A refit of the same
data gives the same answer, and one observation in a thousand moves a fit by a small part of its own
error, so a refit that follows the clock (every few seconds, whatever came in) spends most of its work
on fits that change nothing; this cadence keeps the coefficients within that error of the fit of the
whole window (`berth-loadgen diag refit-cadence`) at a fraction of the work. New observations that
the current coefficients miss by more than ``DRIFT`` (3) times the fit's own error (their median: one
outlier does not count) are fitted at once, whatever their share: the engine changed. A dimension still
on the prior is fitted as soon as its first fit is due, whatever the share.

``refit_prior_parts()`` fits only the dimensions that still hold the prior and have observations they
had not at their last attempt (``first_fit_due`` says whether there is one): the cheap, frequent check the
telemetry loop runs until every dimension has its first fit.

``*_mape`` are fractions (0.03 = 3 %): the mean absolute relative error of the current coefficients over
the window, weighted by the same forgetting weights (old observations from before a change count
little); ``n_*`` are the observations the dimension's current fit used (0 while it holds the prior).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Final, Literal

import numpy as np

from gateway.sched.perf import PerfCoefficients
from gateway.telemetry.observation_window import ObservationWindow
from gateway.telemetry.robust_regression import Array, Steps, design, fit_decay, fit_linear, window_weights

#: `math.isfinite`, looked up once (an observation checks two or three values: a few per request)
_isfinite: Final = math.isfinite

#: What a part's fit changes: its coefficients in a given `PerfCoefficients`.
Update = Callable[[PerfCoefficients], PerfCoefficients]

#: A fitted part is fitted again once the observations made since its last fit carry this share of its
#: window's forgetting weight (see `PerfModelFitter`): refits follow the observations, not the clock.
REFIT_SHARE: Final = 0.05
#: ... or at once when the new observations' median relative error is over this many times the fit's own
#: (its weighted mean relative error over the window, at least `MIN_FIT_ERROR`): the engine changed.
DRIFT: Final = 3.0
MIN_FIT_ERROR: Final = 0.01


Part = Literal["prefill", "decode", "kv", "throughput"]
PARTS: Final[tuple[Part, ...]] = ("prefill", "decode", "kv", "throughput")
#: Each part's coefficients (`PerfCoefficients` fields).
PART_COEFFICIENTS: Final[dict[Part, tuple[str, ...]]] = {
    "prefill": ("k1", "c1"),
    "decode": ("k2", "c2", "c3"),
    "kv": ("h", "j"),
    "throughput": ("thr1", "alpha", "beta"),
}


class PerfModelFitter:
    """One per endpoint (or per model + engine profile). See the module doc for what to feed it.

    ``observe_*`` are O(1) appends into bounded windows; ``refit()`` runs the least-squares fits (about
    0.8-1 ms per part with full windows of 2000, 0.4 ms with 50; ``refit_part`` runs one, ``refit_steps``
    runs one in steps of at most about 0.2 ms) of the parts with new observations since their last fit,
    and returns and stores the new coefficients;
    ``refit_prior_parts()`` only those of the parts still on the prior that have new observations
    (``first_fit_due``). Invalid observations (non-finite, negative sizes, non-positive times) are
    dropped.
    """

    def __init__(
        self,
        prior: PerfCoefficients,
        *,
        window: int = 2000,
        half_life: float = 500.0,
        min_obs: int = 20,
        first_fit_min_obs: int | None = None,
        guessed: frozenset[Part] = frozenset(PARTS),
        refit_share: float = REFIT_SHARE,
    ) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        if not half_life > 0:
            raise ValueError("half_life must be > 0")
        if min_obs < 1:
            raise ValueError("min_obs must be >= 1")
        if first_fit_min_obs is not None and first_fit_min_obs < 1:
            raise ValueError("first_fit_min_obs must be >= 1")
        if not 0.0 <= refit_share <= 1.0:
            raise ValueError("refit_share must be within [0, 1]")
        self._refit_share = refit_share
        self._window = window
        self._decay = 2.0 ** (-1.0 / float(half_life))  # an observation's weight relative to the next one's
        self._prior = prior
        self._current = prior
        self._half_life = float(half_life)
        self._min_obs = min_obs
        self._first_fit_min_obs = min_obs if first_fit_min_obs is None else first_fit_min_obs
        # parts whose prior is a guess (the built-in one, not an operator's measurement): fitted at
        # first_fit_min_obs, and scaled by `scale_prior` until then; the others wait for min_obs
        self._guessed = guessed
        self._prefill = ObservationWindow(window, 2)
        self._decode = ObservationWindow(window, 3)
        self._kv = ObservationWindow(window, 2)
        self._tput = ObservationWindow(window, 2)
        self._rings: dict[Part, ObservationWindow] = {
            "prefill": self._prefill,
            "decode": self._decode,
            "kv": self._kv,
            "throughput": self._tput,
        }
        self._on_prior: set[Part] = set(PARTS)  # parts without a fit of their own yet
        # per part on the prior: observations ever made when its first fit was last tried (a fit refused
        # as ill-conditioned is tried again only once something new came in)
        self._tried: dict[Part, int] = dict.fromkeys(PARTS, 0)
        # per part: its ring's `total` when it was last fitted (or refused): a fit of the same window
        # gives the same answer, so it is not made again (an idle endpoint's refits cost nothing)
        self._fitted: dict[Part, int] = dict.fromkeys(PARTS, -1)
        self.fits = 0  # part fits made (or refused), for the figures of the refit cadence

    # ---- observations ----------------------------------------------------------------------------
    def observe_prefill(self, prompt_tokens: float, seconds: float) -> None:
        if _isfinite(prompt_tokens) and _isfinite(seconds) and prompt_tokens >= 0 and seconds > 0:
            self._prefill.append(prompt_tokens, seconds)

    def observe_decode(self, batch: float, avg_context: float, seconds: float) -> None:
        if (
            _isfinite(batch)
            and _isfinite(avg_context)
            and _isfinite(seconds)
            and batch > 0
            and avg_context >= 0
            and seconds > 0
        ):
            self._decode.append(batch, avg_context, seconds)

    def observe_kv(self, context_tokens: float, kv_tokens: float) -> None:
        if _isfinite(context_tokens) and _isfinite(kv_tokens) and context_tokens >= 0 and kv_tokens > 0:
            self._kv.append(context_tokens, kv_tokens)

    def observe_throughput(self, concurrency: float, tokens_per_s: float) -> None:
        if _isfinite(concurrency) and _isfinite(tokens_per_s) and concurrency >= 0 and tokens_per_s > 0:
            self._tput.append(concurrency, tokens_per_s)

    @property
    def current(self) -> PerfCoefficients:
        return self._current

    @property
    def prior(self) -> PerfCoefficients:
        return self._prior

    @property
    def on_prior(self) -> frozenset[Part]:
        """The parts that still hold the prior (no fit of their own yet)."""
        return frozenset(self._on_prior)

    @property
    def first_fit_due(self) -> bool:
        """Whether a part on a guessed prior has `first_fit_min_obs` observations and new ones since
        its last attempt (what `refit_prior_parts` would try)."""
        return any(self._first_fit_due(p) for p in self._on_prior)

    def _first_fit_due(self, part: Part) -> bool:
        ring = self._rings[part]
        return (
            part in self._guessed and len(ring) >= self._first_fit_min_obs and ring.total > self._tried[part]
        )

    def scale_prior(self, prefill: float, decode: float) -> PerfCoefficients:
        """Until their first fit, the prefill and decode parts (and the throughput curve, from decode)
        predict the prior's times multiplied by `prefill` and `decode` (see
        `gateway.telemetry.calibration`); fitted parts and those whose prior is not a guess are left
        alone."""
        if not (prefill > 0 and decode > 0 and math.isfinite(prefill) and math.isfinite(decode)):
            raise ValueError("scale factors must be finite and > 0")
        p, cur, on = self._prior, self._current, self._on_prior & self._guessed
        if "prefill" in on:
            cur = replace(cur, k1=p.k1 * prefill, c1=p.c1 * prefill)
        if "decode" in on:
            cur = replace(cur, k2=p.k2 * decode, c2=p.c2 * decode, c3=p.c3 * decode)
        if "throughput" in on:
            cur = replace(cur, thr1=p.thr1 / decode, alpha=p.alpha / decode)
        self._current = cur
        return cur

    def guessing(self, part: Part) -> bool:
        """`part` still holds the prior, and the prior is a guess (see `guessed`)."""
        return part in self._on_prior and part in self._guessed

    # ---- fitting -----------------------------------------------------------------------------------
    def refit(self) -> PerfCoefficients:
        """Fit every part that has enough observations: `first_fit_min_obs` while on a guessed prior,
        else `min_obs`."""
        return self._refit(PARTS)

    def refit_part(self, part: Part) -> PerfCoefficients:
        """`refit` of one part; the parts in turn equal `refit`."""
        return self._refit((part,))

    def refit_steps(self, part: Part) -> Iterator[None]:
        """`refit_part` in steps, for a caller that frees the event loop between them (a part's whole fit
        takes 0.8-1 ms with a full window, and a timer due meanwhile waits for all of it): each `next`
        runs one step, the fit's setup (the window copied, the system's condition checked), one round
        of its reweighting or one slice of the throughput curve's β grid, up to about 0.2 ms each with
        a full window (`berth-loadgen diag refit-steps`). The window is the one the first step
        copied; the part's coefficients change at the last step only, in the coefficients current then
        (a `scale_prior` between steps is kept). The steps in turn equal `refit_part`; a fit left
        unfinished changes nothing (the next refit fits the part again)."""
        return self._refit_steps((part,))

    def refit_prior_parts(self) -> PerfCoefficients:
        """Fit only the parts on a guessed prior whose first fit is due (see `first_fit_due`); the
        others keep their coefficients until the next `refit`."""
        return self._refit(self.prior_parts_due())

    def prior_parts_due(self) -> tuple[Part, ...]:
        """The parts `refit_prior_parts` fits (each `refit_part` in turn does the same)."""
        return tuple(p for p in PARTS if p in self._on_prior and self._first_fit_due(p))

    def _refit(self, parts: tuple[Part, ...]) -> PerfCoefficients:
        for _ in self._refit_steps(parts, back_to_back=True):
            pass
        return self._current

    def _refit_steps(self, parts: tuple[Part, ...], *, back_to_back: bool = False) -> Iterator[None]:
        """The parts' fits in steps; `back_to_back`: nothing runs between one fit's steps (`_refit`),
        so they share one error state and do not yield between them."""
        for part in parts:
            ring = self._rings[part]
            first = part in self._on_prior
            if len(ring) < (self._first_fit_min_obs if first and part in self._guessed else self._min_obs):
                continue
            total = ring.total
            if total == self._fitted[part]:
                continue  # nothing new since its last fit: the same window gives the same answer
            new = total - self._fitted[part]
            if (
                not first
                and self._new_share(len(ring), new) < self._refit_share
                and not self._drifted(part, new)
            ):
                continue  # too little new to move the fit, and it agrees with the fit: it waits for more
            steps = self._fit(part)
            # Extreme inputs (denormal sizes, 1e300 times) may overflow on the way; every result is
            # checked for finiteness instead, and a dimension whose fit is not finite keeps its
            # coefficients. The error state is set per step (back to back: per fit): it must not
            # outlive one, as the event loop runs other work between steps.
            if back_to_back:
                with np.errstate(all="ignore"):
                    update: Update | None = _finish(steps)
            else:
                while True:
                    with np.errstate(all="ignore"):
                        try:
                            next(steps)
                        except StopIteration as done:
                            update = done.value
                            break
                    yield
            self._fitted[part] = total
            self.fits += 1
            if first:
                self._tried[part] = total
            if update is not None:
                self._current = update(self._current)
                self._on_prior.discard(part)
            yield

    def _fit(self, part: Part) -> Steps[Update | None]:
        """`part`'s coefficients fitted to its window, in steps; None when the fit is refused."""
        if part == "throughput":
            data = self._tput.rows()
            tput = yield from fit_decay(data[:, 0], data[:, 1], self._weights(len(data)))
            if tput is None:
                return None
            thr1, alpha, beta = tput
            n = len(data)
            return lambda cur: replace(cur, thr1=thr1, alpha=alpha, beta=beta, n_throughput=n)
        if part == "prefill":
            data = self._prefill.rows()
            x = design(data[:, 0])
            fit = yield from fit_linear(x, data[:, 1], self._weights(len(data)))
            if fit is None:
                return None
            k1, c1 = fit.coef
            mape, n = fit.mape, fit.n
            return lambda cur: replace(cur, k1=k1, c1=c1, prefill_mape=mape, n_prefill=n)
        if part == "decode":
            data = self._decode.rows()
            batch, ctx = data[:, 0], data[:, 1]
            x = design(batch * ctx, batch)
            fit = yield from fit_linear(x, data[:, 2], self._weights(len(data)))
            if fit is None:
                return None
            k2, c2, c3 = fit.coef
            mape, n = fit.mape, fit.n
            return lambda cur: replace(cur, k2=k2, c2=c2, c3=c3, decode_mape=mape, n_decode=n)
        data = self._kv.rows()
        x = design(data[:, 0])
        fit = yield from fit_linear(x, data[:, 1], self._weights(len(data)))
        if fit is None:
            return None
        h, j = fit.coef
        mape, n = fit.mape, fit.n
        return lambda cur: replace(cur, h=h, j=j, kv_mape=mape, n_kv=n)

    def observations_to_refit(self, part: Part) -> int:
        """The fewest new observations of `part` after which a refit fits it (1 while it is on the
        prior, or while its last fit has not seen everything in its window)."""
        ring = self._rings[part]
        size, seen = len(ring), ring.total - self._fitted[part]
        if part in self._on_prior or seen > 0 or self._refit_share <= 0.0:
            return 1
        s, r, window = self._refit_share, self._decay, ring.capacity
        # while the window grows: (1 - r^n) / (1 - r^(size + n)) >= s  <=>  r^n <= (1 - s) / (1 - s r^size)
        n = window
        if s < 1.0:
            n = math.ceil(math.log((1.0 - s) / (1.0 - s * math.pow(r, size))) / math.log(r))
        if size + n > window:  # full by then: (1 - r^n) / (1 - r^window) >= s
            full = 1.0 - s * (1.0 - math.pow(r, window))
            n = max(window - size, math.ceil(math.log(full) / math.log(r)) if full > 0 else window)
        return max(1, n)

    def _drifted(self, part: Part, new: int) -> bool:
        """Whether the current coefficients miss the `new` newest observations of `part` by more than
        `DRIFT` times their fit's own error (the median relative error: one outlier does not count), as
        after a change of the engine's speed: then the part is fitted again at once."""
        cur = self._current
        rows = self._rings[part].newest(new)
        if part == "prefill":
            mape = cur.prefill_mape
            errors = [abs(cur.prefill_s(p) - y) / y for p, y in rows]
        elif part == "decode":
            mape = cur.decode_mape
            errors = [abs(cur.decode_iter_s(b, c) - y) / y for b, c, y in rows]
        elif part == "kv":
            mape = cur.kv_mape
            errors = [abs(cur.kv_tokens(c) - y) / y for c, y in rows]
        else:
            return False  # the throughput curve keeps no error of its own: the share alone decides
        if mape is None or not errors:
            return False
        return statistics.median(errors) > DRIFT * max(mape, MIN_FIT_ERROR)

    def _new_share(self, size: int, new: int) -> float:
        """The share of a window of `size` observations' forgetting weight that its `new` newest carry."""
        if new >= size:
            return 1.0
        r = self._decay
        return (1.0 - math.pow(r, new)) / (1.0 - math.pow(r, size))

    def _weights(self, n: int) -> Array:
        """The forgetting weights of a window of `n` observations, the newest last: the tail of the
        full window's (the same numbers elementwise, made once per window size and half-life)."""
        full = window_weights(self._window, self._half_life)
        return full[len(full) - n :]


def _finish(steps: Steps[Update | None]) -> Update | None:
    """Run a fit's steps to the end; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: Update | None = done.value
            return result
