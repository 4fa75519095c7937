"""Model names: client aliases to engine served names, and the OpenAI model list."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Any

from gateway.core import errors
from gateway.core.types import ModelName


class ModelCatalog:
    def __init__(self, aliases: Mapping[str, str] | None = None) -> None:
        self.aliases: dict[str, str] = dict(aliases or {})

    def resolve(self, client_model: str, known: Set[ModelName]) -> ModelName:
        """The served name for `client_model`; 404 when no endpoint (in any state) serves it, naming
        the models that are served (and the aliases of those)."""
        served = ModelName(self.aliases.get(client_model, client_model))
        if served not in known:
            aliases = [a for a, target in self.aliases.items() if target in known]
            raise errors.model_not_found(client_model, [*known, *aliases])
        return served

    def listing(self, ready: Iterable[ModelName], created: int) -> dict[str, Any]:
        """OpenAI list shape: models served by ready endpoints, plus aliases that point at them."""
        ready_set = set(ready)
        names = sorted(ready_set | {a for a, t in self.aliases.items() if t in ready_set})
        return {
            "object": "list",
            "data": [
                {
                    "id": n,
                    "object": "model",
                    "created": created,
                    "owned_by": "berth",
                    **({"root": self.aliases[n]} if n in self.aliases else {}),
                }
                for n in names
            ],
        }
