"""``SelfSpeculative``: the target's own first L layers (+ final norm + LM head) draft for it.

No second set of weights: ``target.truncated(L)`` shares the target's weights and owns a cache.
Drafting works exactly as ``DraftModel`` (same cache invariant).
"""
from __future__ import annotations

from .draft_model import DraftModel


class SelfSpeculative(DraftModel):
    def __init__(self, layers: int):
        super().__init__(model=None)
        if isinstance(layers, bool) or not isinstance(layers, int):
            raise TypeError(f"SelfSpeculative(layers) takes the number of layers to draft with, got {layers!r}")
        self.layers = layers

    def attach(self, target) -> None:
        total = target.config.num_layers
        if not 1 <= self.layers < total:
            raise ValueError(f"SelfSpeculative(layers={self.layers}): need 1 <= layers < the target's "
                             f"{total} layers")
        self.model = target.truncated(self.layers)
