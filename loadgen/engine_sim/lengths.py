"""Output-length distributions of a simulated engine (used when the request does not pin its length).

A request's output length is ``max_tokens`` when ``min_tokens == max_tokens`` or ``ignore_eos`` is set;
otherwise it is drawn from the endpoint's distribution and capped by ``max_tokens`` (drawing "EOS" early).
Text form (CLI flag ``--output-len``, fleet key ``output_len``):

- ``fixed:N``                 always N tokens;
- ``uniform:LO:HI``           uniform integer in [LO, HI];
- ``lognormal:MEAN:SIGMA``    log-normal with the given mean (tokens) and sigma of the underlying normal
                              (ShareGPT-like outputs: ``lognormal:338:0.9``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

LengthKind = Literal["fixed", "uniform", "lognormal"]


@dataclass(frozen=True, slots=True)
class LengthDist:
    kind: LengthKind
    a: float
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.kind == "fixed" and self.a < 1:
            raise ValueError("fixed length must be >= 1")
        if self.kind == "uniform" and not 1 <= self.a <= self.b:
            raise ValueError("uniform length needs 1 <= LO <= HI")
        if self.kind == "lognormal" and (self.a < 1 or self.b < 0):
            raise ValueError("lognormal length needs MEAN >= 1 and SIGMA >= 0")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        mu = math.log(self.a) - self.b * self.b / 2.0
        return max(1, round(rng.lognormvariate(mu, self.b)))

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}:{int(self.b)}"
        return f"lognormal:{self.a:g}:{self.b:g}"

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        kind, _, rest = text.partition(":")
        parts = rest.split(":") if rest else []
        try:
            if kind == "fixed" and len(parts) == 1:
                return cls("fixed", float(int(parts[0])))
            if kind == "uniform" and len(parts) == 2:
                return cls("uniform", float(int(parts[0])), float(int(parts[1])))
            if kind == "lognormal" and len(parts) == 2:
                return cls("lognormal", float(parts[0]), float(parts[1]))
        except ValueError as e:
            raise ValueError(f"bad length distribution {text!r}: {e}") from None
        raise ValueError(f"bad length distribution {text!r} (fixed:N | uniform:LO:HI | lognormal:MEAN:SIGMA)")


DEFAULT_OUTPUT_LEN = LengthDist("lognormal", 200.0, 0.8)
