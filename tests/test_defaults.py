"""normcore.defaults.fill_defaults: a docstring's "Default: {default}" is read from the
signature, and a default the signature does not have is an error at import."""
import pytest

from normcore.defaults import EPS, fill_defaults


def test_fills_each_entry_from_the_signature():
    def f(x, eps=EPS, momentum=0.1, affine=True, n=None):
        """Args:
            x: input.
            eps (float): added. Default: {default}
            momentum: the weight, on
                two lines. Default: {default}
            affine: learn. Default: {default}
            n: Default: {default}

        Shape:
            x: any
        """
    fill_defaults(f)
    assert "added. Default: ``1e-5``" in f.__doc__
    assert "two lines. Default: ``0.1``" in f.__doc__
    assert "learn. Default: ``True``" in f.__doc__
    assert "n: Default: ``None``" in f.__doc__
    assert "{default}" not in f.__doc__


def test_a_class_is_read_from_its_init():
    class C:
        """Args:
            eps: Default: {default}
        """
        def __init__(self, eps=1e-6):
            pass
    assert "Default: ``1e-6``" in fill_defaults(C).__doc__


@pytest.mark.parametrize("doc", [
    "Args:\n    x: Default: {default}\n",                  # x has no default
    "Text {default}\n",                                   # not in an Args entry
    "Args:\n    eps: x\nShape:\n    eps: Default: {default}\n",   # left the Args section
])
def test_a_default_the_code_lacks_is_an_error(doc):
    def g(x, eps=1.0):
        pass
    g.__doc__ = doc
    with pytest.raises(ValueError, match="has no default in the signature"):
        fill_defaults(g)
