"""Prompt-token estimates without a tokenizer: characters per token, learned per model.

The gateway knows a prompt's characters when a request arrives and the engine's exact prompt-token
count when the response reports ``usage``. Per model it keeps a moving average of the characters per
token of the prompts it has seen and divides by it. The average starts as a plain running mean (so the
first few observations replace the default quickly) and becomes an EWMA with weight ``alpha`` once it has
``1 / alpha`` observations (so it follows a change of tokenizer or prompt language).

Tiny prompts are ignored: a chat template's fixed tokens dominate them and would skew the ratio, and so
are ratios outside [0.5, 32] characters per token (a mismatched observation, not a tokenizer). At most
``max_models`` models are remembered, least recently observed evicted.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Final

_MIN_TOKENS: Final = 16  # prompts shorter than this say more about the chat template than the text
_MIN_RATIO: Final = 0.5
_MAX_RATIO: Final = 32.0


class _Ratio:
    __slots__ = ("n", "value")

    def __init__(self, value: float) -> None:
        self.value = value
        self.n = 0


class TokenEstimator:
    def __init__(
        self, *, default_chars_per_token: float = 4.0, alpha: float = 0.05, max_models: int = 1024
    ) -> None:
        if not default_chars_per_token > 0:
            raise ValueError("default_chars_per_token must be > 0")
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        if max_models < 1:
            raise ValueError("max_models must be >= 1")
        self._default = float(default_chars_per_token)
        self._alpha = float(alpha)
        self._max_models = max_models
        self._ratios: OrderedDict[str, _Ratio] = OrderedDict()

    def observe(self, model: str, prompt_chars: int, prompt_tokens: int) -> None:
        """The engine's usage for a prompt of `prompt_chars` characters: `prompt_tokens` tokens."""
        if prompt_tokens < _MIN_TOKENS or prompt_chars <= 0:
            return
        ratio = prompt_chars / prompt_tokens
        if not _MIN_RATIO <= ratio <= _MAX_RATIO:
            return
        r = self._ratios.get(model)
        if r is None:
            r = self._ratios[model] = _Ratio(self._default)
            while len(self._ratios) > self._max_models:
                self._ratios.popitem(last=False)
        else:
            self._ratios.move_to_end(model)
        r.n += 1
        weight = max(self._alpha, 1.0 / r.n)  # running mean first, then the EWMA
        r.value += weight * (ratio - r.value)

    def chars_per_token(self, model: str) -> float:
        r = self._ratios.get(model)
        return self._default if r is None else r.value

    def estimate(self, model: str, prompt_chars: int) -> int:
        """Estimated prompt tokens (at least 1 for a non-empty prompt, 0 for an empty one)."""
        if prompt_chars <= 0:
            return 0
        return max(1, math.floor(prompt_chars / self.chars_per_token(model) + 0.5))  # half rounds up

    def observations(self, model: str) -> int:
        r = self._ratios.get(model)
        return 0 if r is None else r.n
