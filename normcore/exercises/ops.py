"""The op hooks: what a checker op must implement, and the registry of ops.

An *op* is one exercise function the checker knows (``"batch_norm"``, ...): a subclass of
:class:`Op` whose instance is passed to :func:`register`.  :func:`normcore.exercises.check`
drives it through the hooks below, in this order:

1. :meth:`Op.parse_options` the keyword options of ``check``;
2. :meth:`Op.cases` builds the seeded test sets;
3. :meth:`Op.call` calls the student's function on each set, :meth:`Op.reference` the
   op's :meth:`Op.solution` (the one reference: ``exercises.reference(op)`` and
   ``signature(op)`` derive from it too);
4. outputs are checked against :attr:`Op.outputs`, :meth:`Op.expected_shapes` and the
   set's dtype, then their values against the reference;
5. if they differ: :meth:`Op.candidates` lists the known mistakes as
   :class:`~normcore.exercises.variants.Variant` objects and :meth:`Op.evaluate` computes
   each from :meth:`Op.base_spec`'s knobs with the variant's changes; the first variant
   (or pair) whose numbers the student's match is the diagnosis;
6. the report's prose: the catalogue entry's templates filled with :meth:`Op.context`
   (fields shared by every entry) and :meth:`Op.render_fields` (fields of one variant);
   :meth:`Op.locate` names the position of the largest error.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from . import catalogue as _catalogue
from .inputs import Case
from .variants import Variant


class Op:
    """Base class of a checker op.  Subclasses set the class attributes and the hooks
    marked *required*; the others have defaults that fit ops taking ``x`` of shape
    ``(N, C, *spatial)``."""

    #: The op's name, the first argument of ``check``.
    name = ""
    #: Its short name in the catalogue table ("BN").
    abbr = ""
    #: How ``check`` calls the student's function, e.g. ``"f(x, gamma, beta, eps)"``.
    call_text = ""
    #: The argument the input's shape refers to in messages.
    input_name = "x"
    #: Names of the function's outputs; one name means "returns one tensor".
    outputs: tuple[str, ...] = ("y",)
    #: The input ranks the op accepts, and those tested when ``ndims`` is not given.
    ndims_allowed: tuple[int, ...] = (2, 3, 4)
    ndims_default: tuple[int, ...] = (2, 3, 4)
    #: The keyword options of ``check`` for this op.
    option_names: tuple[str, ...] = ("seed", "ndims")
    #: The catalogue keys the op can diagnose, in catalogue-table order.
    misconceptions: tuple[str, ...] = ()
    #: Are the outputs indexed (sample, channel, ...)?  Then a report of an unknown error
    #: says which samples and channels hold the wrong values.
    indexed_by_sample_and_channel = True

    # ---- options and inputs -------------------------------------------------------------
    def parse_options(self, options: dict) -> dict:
        """``check``'s keyword options -> the parsed options every other hook receives
        (``seed``: int, ``ndims``: sorted tuple).  Raise ``TypeError`` for an unknown name,
        ``ValueError`` for a bad value.  Override to add options (call ``super()``)."""
        unknown = sorted(set(options) - set(self.option_names))
        if unknown:
            raise TypeError(
                f"check({self.name!r}, ...): unknown option(s) {', '.join(unknown)}; "
                f"this op takes {', '.join(self.option_names)}")
        parsed = {"seed": int(options.get("seed", 0))}
        ndims = options.get("ndims", self.ndims_default)
        ndims = (ndims,) if isinstance(ndims, int) else tuple(sorted({int(d) for d in ndims}))
        bad = [d for d in ndims if d not in self.ndims_allowed]
        if not ndims or bad:
            raise ValueError(
                f"check({self.name!r}, ...): ndims={options.get('ndims')!r}; {self.name} "
                f"inputs may have {', '.join(map(str, self.ndims_allowed))} dims")
        parsed["ndims"] = ndims
        return parsed

    def cases(self, options: dict) -> list[Case]:
        """*Required.*  The test sets for the parsed ``options``: seeded from
        ``options["seed"]`` with a ``torch.Generator`` (never the global RNG), named A, B,
        ... in order, each with ``options=options``.  Include the sets the catalogue's prose
        refers to by ``kind`` (``"nearzero"``, ``"largemean"``) where the op's mistakes need
        them to separate."""
        raise NotImplementedError

    # ---- the reference ------------------------------------------------------------------
    def solution(self, options: dict) -> Callable:
        """*Required.*  A correct function with the student's signature (:attr:`call_text`),
        built on :mod:`normcore.functional`, for the parsed ``options``.  This is the op's
        one reference: :meth:`reference`, ``exercises.reference`` and the classroom's
        planted solutions all use it."""
        raise NotImplementedError

    def call(self, fn: Callable, case: Case):
        """*Required.*  Call ``fn`` (the student's function or :meth:`solution`) on
        ``case``, with copies of the tensors (so that an in-place function cannot change
        the set), and return what it returned, unchecked."""
        raise NotImplementedError

    def reference(self, case: Case) -> tuple[torch.Tensor, ...]:
        """The correct outputs on ``case``, as a tuple (one tensor per :attr:`outputs`)."""
        out = self.call(self.solution(case.options), case)
        return (out,) if len(self.outputs) == 1 else tuple(out)

    def torch_kernels(self, case: Case) -> list[tuple[torch.Tensor, ...]]:
        """torch's own computations of the op on ``case``, in the set's dtype: its
        ``torch.nn.functional`` op (or autograd through it), once per form a statement may
        ask for; each a tuple as :meth:`reference`.  Their rounding error sets the set's
        tolerance (:mod:`normcore.exercises.tolerance`).  Default: none (torch has no such
        op; the op's solution in the set's dtype is measured all the same)."""
        return []

    # ---- what the outputs must look like ------------------------------------------------
    def expected_shapes(self, case: Case) -> tuple:
        """One shape per output; default: each has the input's shape."""
        return (case.shape,)

    def shape_hint(self, i: int) -> str:
        """Words appended to "it must have shape (...)" for output ``i``."""
        return f" (the shape of {self.input_name})"

    def call_hint(self, options: dict) -> str:
        """A sentence saying how the function is called (shown when it raised)."""
        return ""

    # ---- the known mistakes -------------------------------------------------------------
    def base_spec(self, options: dict) -> dict:
        """*Required.*  The knobs of the correct computation, e.g. ``{"correction": 0,
        "eps_mode": "inside", ...}``: what :meth:`evaluate` receives when no variant
        changes anything."""
        raise NotImplementedError

    def candidates(self, options: dict, cases: list[Case]) -> list[Variant]:
        """*Required.*  The variants to try, in the order the checker tries them; each
        turns knobs of :meth:`base_spec` and names a key of :attr:`misconceptions`."""
        raise NotImplementedError

    def evaluate(self, spec: dict, case: Case) -> tuple[torch.Tensor, ...] | None:
        """*Required.*  The outputs (a tuple, as :meth:`reference`) computed with the knob
        dict ``spec`` on ``case``, or ``None`` if the variant does not exist for this input
        (reducing over (H, W) of an (N, C) input).  Compute with the package's primitives
        (``functional.normalize``, ``stats``) with a knob changed, not with a second
        implementation of the op."""
        raise NotImplementedError

    # ---- words --------------------------------------------------------------------------
    def context(self, options: dict, cases: list[Case]) -> dict:
        """The template fields of the catalogue prose shared by every variant, e.g.
        ``norm``, ``want``, ``axes_why``, ``eps_case``: every ``{field}`` of every entry
        in :attr:`misconceptions` that :meth:`render_fields` does not fill."""
        return {}

    def render_fields(self, context: dict, key: str, detail: dict) -> dict:
        """The template fields of one variant of entry ``key``; ``detail`` holds the
        variant's own details (``roles`` for ``wrong_axes``).  Default: none."""
        return {}

    def locate(self, case: Case, i: int, idx: tuple) -> str:
        """Where index ``idx`` of output ``i`` is, in words ("sample 3, channel 2")."""
        return locate_sample_channel(idx)

    # ---- helpers shared by the ops --------------------------------------------------------
    @staticmethod
    def display_case(cases: list[Case]) -> Case:
        """The set whose shape the messages use: the regular set of highest rank."""
        regular = [c for c in cases if c.kind == "regular"] or cases
        return max(regular, key=lambda c: len(c.shape))


def locate_sample_channel(idx, first="sample", second="channel") -> str:
    """``(3, 2, 0, 1)`` -> "sample 3, channel 2, position (0, 1)"."""
    parts = [f"{first} {idx[0]}"]
    if len(idx) > 1:
        parts.append(f"{second} {idx[1]}")
    if len(idx) == 3:
        parts.append(f"position {idx[2]}")
    elif len(idx) > 3:
        parts.append("position (" + ", ".join(map(str, idx[2:])) + ")")
    return ", ".join(parts)


# ---- the registry -------------------------------------------------------------------------
#: op name -> :class:`Op`, in the order the op families registered.
REGISTRY: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Make ``op`` known to ``check``; record in the catalogue which keys it can name."""
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} is already registered")
    for key in op.misconceptions:
        _catalogue._add_op(key, op.name)
    REGISTRY[op.name] = op
    return op


def get_op(name: str) -> Op:
    """The registered op called ``name`` (a ``ValueError`` listing the ops if none)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown op {name!r}; choose one of {', '.join(REGISTRY)}")
    return REGISTRY[name]
