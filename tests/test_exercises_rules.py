"""Hidden test sets and the rules of what an exercise forbids (normcore.exercises.hidden,
normcore.exercises.rules)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import normcore.functional as nf
from normcore import exercises
from normcore.exercises import check
from normcore.exercises.driver import plan
from normcore.exercises.rules import RuleError, parse_rules


def bn_dims(x):
    return [0] + list(range(2, x.dim()))


def my_bn(x, gamma, beta, eps):
    dims = bn_dims(x)
    m, v = x.mean(dims, keepdim=True), x.var(dims, keepdim=True, unbiased=False)
    shape = [1, -1] + [1] * (x.dim() - 2)
    return gamma.view(shape) * (x - m) / torch.sqrt(v + eps) + beta.view(shape)


def bn_by_torch(x, gamma, beta, eps):
    return F.batch_norm(x, None, None, gamma, beta, training=True, eps=eps)


def bn_by_module(x, gamma, beta, eps):
    kind = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}
    m = kind[x.dim()](x.shape[1], eps=eps, affine=False, track_running_stats=False)
    m = m.to(x.dtype)
    shape = [1, -1] + [1] * (x.dim() - 2)
    return m(x) * gamma.view(shape) + beta.view(shape)


def bn_by_normcore(x, gamma, beta, eps):
    return nf.batch_norm(x, None, None, gamma, beta, training=True, eps=eps)


def bn_by_sample_loop(x, gamma, beta, eps):
    dims = bn_dims(x)
    m = sum(x[n] for n in range(x.shape[0])) / x.shape[0]
    m = m.mean([d - 1 for d in dims[1:]], keepdim=True).unsqueeze(0) if x.dim() > 2 else m
    v = ((x - m) ** 2).mean(dims, keepdim=True)
    shape = [1, -1] + [1] * (x.dim() - 2)
    return gamma.view(shape) * (x - m) / torch.sqrt(v + eps) + beta.view(shape)


def bn_backward(dy, x, gamma, eps):
    dims = bn_dims(x)
    shape = [1, -1] + [1] * (x.dim() - 2)
    m, v = x.mean(dims, keepdim=True), x.var(dims, keepdim=True, unbiased=False)
    r = 1 / torch.sqrt(v + eps)
    xh = (x - m) * r
    d = dy * gamma.view(shape)
    dx = r * (d - d.mean(dims, keepdim=True) - xh * (d * xh).mean(dims, keepdim=True))
    return dx, (dy * xh).sum(dims), dy.sum(dims)


def bn_backward_by_autograd(dy, x, gamma, eps):
    x, gamma = x.detach().requires_grad_(), gamma.detach().requires_grad_()
    beta = torch.zeros_like(gamma, requires_grad=True)
    y = my_bn(x, gamma, beta, eps)
    y.backward(dy)
    return x.grad, gamma.grad, beta.grad


def test_the_rules_are_read_and_bad_ones_refused():
    assert parse_rules(None) == ()
    assert parse_rules("no-autograd") == ("no-autograd",)
    with pytest.raises(RuleError, match="unknown rule 'no-loops'"):
        parse_rules(["no-loops"])
    with pytest.raises(RuleError, match="once:<qualified name>"):
        parse_rules(["once:layer_norm"])
    with pytest.raises(RuleError, match="unknown rule"):
        check("batch_norm", my_bn, rules=("no-autograd", "nope"))


@pytest.mark.parametrize("fn, rule, seen", [
    (bn_by_torch, "no-torch-norms", "torch.nn.functional.batch_norm"),
    (bn_by_module, "no-torch-norms", "torch.nn.functional.batch_norm"),
    (bn_by_normcore, "no-normcore", "normcore.functional.batch_norm"),
    (exercises.reference("batch_norm"), "no-normcore", "normcore.functional"),
])
def test_a_forbidden_tool_is_named(fn, rule, seen):
    assert check("batch_norm", fn).passed              # right numbers ...
    report = check("batch_norm", fn, rules=("no-torch-norms", "no-normcore"))
    assert report.kind == "forbidden" and not report.passed
    assert report.broken_rules == (rule,)
    assert seen in report.message and rule in report.message
    assert check("batch_norm", my_bn, rules=("no-torch-norms", "no-normcore")).passed


def test_an_import_by_name_is_seen_too():
    from normcore.functional import batch_norm

    def student(x, gamma, beta, eps):
        return batch_norm(x, None, None, gamma, beta, training=True, eps=eps)
    report = check("batch_norm", student, rules=("no-normcore",))
    assert report.broken_rules == ("no-normcore",)
    assert check("batch_norm", student).passed   # and the global is restored afterwards
    assert batch_norm is nf.batch_norm


def test_autograd_is_seen_where_it_is_forbidden():
    assert check("batch_norm_backward", bn_backward, rules=("no-autograd",)).passed
    report = check("batch_norm_backward", bn_backward_by_autograd, rules=("no-autograd",))
    assert report.broken_rules == ("no-autograd",), str(report)
    assert "torch.Tensor.backward" in report.message


def test_a_loop_over_the_samples_is_seen():
    assert check("batch_norm", bn_by_sample_loop).passed
    report = check("batch_norm", bn_by_sample_loop, rules=("no-sample-loop",))
    assert report.broken_rules == ("no-sample-loop",), str(report)
    assert check("batch_norm", my_bn, rules=("no-sample-loop",)).passed


def test_exactly_one_call_is_required():
    def in_via_bn(x, gamma, beta, eps):
        n, c = x.shape[:2]
        y = nf.batch_norm(x.reshape(1, n * c, -1), None, None, training=True, eps=eps)
        shape = [1, -1] + [1] * (x.dim() - 2)
        return y.reshape(x.shape) * gamma.view(shape) + beta.view(shape)

    def in_per_sample(x, gamma, beta, eps):
        shape = [1, -1] + [1] * (x.dim() - 2)
        ys = [nf.batch_norm(x[n:n + 1].transpose(0, 1).reshape(1, x.shape[1], -1), None, None,
                            training=True, eps=eps).reshape(x[n:n + 1].shape)
              for n in range(x.shape[0])]
        return torch.cat(ys) * gamma.view(shape) + beta.view(shape)
    rules = ("no-normcore", "no-torch-norms", "once:normcore.functional.batch_norm")
    assert check("instance_norm", in_via_bn, rules=rules).passed
    assert check("instance_norm", in_per_sample).passed
    report = check("instance_norm", in_per_sample, rules=rules)
    assert report.broken_rules == ("once:normcore.functional.batch_norm",), str(report)


def test_a_reshape_to_the_groups_is_seen():
    def gn_reshape(x, num_groups, gamma, beta, eps):
        n = x.shape[0]
        g = x.reshape(n, num_groups, -1)
        g = (g - g.mean(-1, keepdim=True)) / torch.sqrt(g.var(-1, keepdim=True,
                                                            unbiased=False) + eps)
        shape = [1, -1] + [1] * (x.dim() - 2)
        return g.reshape(x.shape) * gamma.view(shape) + beta.view(shape)
    assert check("group_norm", gn_reshape).passed
    report = check("group_norm", gn_reshape, rules=("no-group-reshape",))
    assert report.broken_rules == ("no-group-reshape",), str(report)


def test_hidden_sets_are_other_inputs_with_edge_cases():
    visible, hidden = plan("batch_norm", {}).cases, plan("batch_norm", {}, hidden=True).cases
    assert len(hidden) > len(visible)
    seen = {tuple(c.args["x"].flatten()[:3].tolist()) for c in visible}
    assert not any(tuple(c.args["x"].flatten()[:3].tolist()) in seen for c in hidden)
    labels = " ".join(c.label for c in hidden)
    for what in ("0 and sample 0 constant", "one sample", "twice the samples"):
        assert what in labels
    assert all(c.name.startswith("H") for c in hidden)
    # BatchNorm of (1, C) is refused by torch and the reference: that set is left out
    assert not any(c.shape[0] == 1 and len(c.shape) == 2 for c in hidden)
    constant = next(c for c in hidden if "0 and sample 0 constant" in c.label)
    assert bool((constant.args["x"][:, 0] == 0.5).all())


def test_a_function_fitted_to_the_visible_sets_fails_the_hidden_ones():
    answers = {}
    p = plan("batch_norm", {})
    for case in p.cases:
        answers[case.args["x"].shape, float(case.args["x"].flatten()[0])] = \
            p.impl.call(exercises.reference("batch_norm"), case)

    def fitted(x, gamma, beta, eps):          # a table of the notebook's answers
        return answers.get((x.shape, float(x.flatten()[0])), torch.zeros_like(x))
    assert check("batch_norm", fitted).passed
    assert not check("batch_norm", fitted, hidden=True).passed


def test_no_eps_is_caught_by_the_constant_set():
    def no_eps_guard(x, gamma, beta, eps):
        # eps only where the spread is not tiny: passes every visible set
        dims = bn_dims(x)
        m, v = x.mean(dims, keepdim=True), x.var(dims, keepdim=True, unbiased=False)
        shape = [1, -1] + [1] * (x.dim() - 2)
        return gamma.view(shape) * (x - m) / torch.sqrt(v + eps * (v < 1).to(v)) \
            + beta.view(shape)
    report = check("batch_norm", no_eps_guard, hidden=True)
    assert not report.passed


def test_every_rule_says_what_to_change():
    from normcore.exercises.rules import FIXES, RULES
    assert set(FIXES) == set(RULES) | {"once"}
