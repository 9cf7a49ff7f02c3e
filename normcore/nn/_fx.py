"""torch.fx's leaf rule for normcore's modules.

``torch.fx.Tracer.is_leaf_module`` keeps a module as one ``call_module`` node when its class
lives in ``torch.nn`` (it reads ``type(m).__module__``); every other module is traced
through.  normcore's modules answer to ``normcore.nn`` (reprs, pickles), so fx would trace
into them, and their forward, which checks shapes and dtypes in Python, cannot be traced
symbolically.  Instead, a forward that receives an ``fx.Proxy`` records itself as the
``call_module`` node a torch norm gives, so the graph has the same nodes as with torch's
norms, and running the ``GraphModule`` calls the normcore module.
"""
from __future__ import annotations

from typing import Any, cast

from torch import Tensor, fx
from torch.nn import Module


def traced_as_leaf(module: Module, input: Any) -> Tensor | None:
    """Under ``torch.fx`` symbolic tracing, the ``call_module`` node of ``module`` applied to
    ``input``; otherwise (a tensor) None.

    The node is an ``fx.Proxy``, typed as the ``Tensor`` it stands for: a forward that
    returns it is, for its caller (the tracer, or the next layer's traced forward), returning
    the tensor that the node will compute when the graph runs, as torch's own modules do
    under tracing."""
    if not isinstance(input, fx.Proxy):
        return None
    tracer = input.tracer
    if not isinstance(tracer, fx.Tracer):   # a module path is a Tracer's notion
        raise TypeError(f"normcore.nn.{type(module).__name__} can be traced by a torch.fx "
                        f"Tracer only, got a {type(tracer).__name__}; use "
                        f"torch.fx.symbolic_trace or torch.export.export")
    node = tracer.create_proxy("call_module", tracer.path_of_module(module), (input,), {})
    return cast(Tensor, node)
