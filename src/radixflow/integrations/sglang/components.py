"""The FULL component class each `--radix-cache-backend` name runs (above `backend.py` and `adaptive.py`,
so neither imports the other's users)."""

from __future__ import annotations

from radixflow.integrations.sglang.adaptive import DuelFullComponent
from radixflow.integrations.sglang.backend import RadixflowFullComponent


def component_class(kind: str) -> type[RadixflowFullComponent]:
    """A FULL component class for `component_registry_override` running policy `kind`: the duel of
    shadow caches for `adaptive` (adaptive.py), else our walk with `kind`'s policy (backend.py)."""
    if kind == "adaptive":
        return DuelFullComponent
    return type(f"Radixflow{kind.title().replace('-', '')}FullComponent", (RadixflowFullComponent,),
                {"policy_kind": kind})
