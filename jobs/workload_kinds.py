"""Which parameter model validates a spec's ``workload`` section.

A workload names its ``kind``: a short name registered here, or ``package.module:Model``
for a workload of your own. Parameter models import only pydantic, so a spec is
checked on a laptop without ray or torch.
"""

from __future__ import annotations

import importlib

from pydantic import BaseModel

from jobs.errors import did_you_mean

BUILTIN_WORKLOADS = {
    "hello": "workloads.hello:HelloParams",
    "vision": "workloads.vision.config:VisionParams",
    "hf_vit": "workloads.hf_vit.config:HFViTParams",
}


def workload_model(kind: str) -> type[BaseModel]:
    """Import and return the parameter model for ``kind``.

    Args:
        kind: a built-in kind (``vision``, ``hf_vit``, ``hello``) or ``package.module:Model``.

    Raises:
        ValueError: an unknown kind (with a did-you-mean hint), or a target that cannot be imported
            or is not a pydantic model.
    """
    target = BUILTIN_WORKLOADS.get(kind, kind)
    module_name, sep, attribute = target.partition(":")
    if not sep:
        known = ", ".join(sorted(BUILTIN_WORKLOADS))
        hint = did_you_mean(kind, BUILTIN_WORKLOADS)
        raise ValueError(f"unknown workload kind {kind!r}{hint}; use one of {known}, or 'package.module:Model'")
    try:
        model = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # importing runs the module's code: any failure there is the spec's to fix
        raise ValueError(f"cannot load workload parameters {target!r}: {exc}") from None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ValueError(f"{target!r} is not a pydantic model")
    return model
