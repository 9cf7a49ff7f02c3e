"""The table of the chapter "Choosing a normalization" (normcore.choose) and the invariance
experiment it shares with the LayerNorm chapter (normcore.invariance): every claim of every
row checked by experiment, the rule that predicts the invariances against the LN paper's Table
1, SyncBatchNorm's exchange, the committed cost file, and the errors."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from normcore import axes, choose, invariance
from normcore import functional as F

ROOT = Path(__file__).resolve().parents[1]
SHAPE, G = (4, 6, 4, 4), 2
f64 = torch.float64


def _x(seed=0, shape=SHAPE):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=f64)


@pytest.fixture(scope="module")
def found():
    return {key: choose.measure(row, _x(), G) for key, row in choose.ROWS.items()}


# ----------------------------------------------------------------------- every claim holds
@pytest.mark.parametrize("key", choose.KEYS)
def test_every_claim_of_the_row_holds_by_experiment(found, key):
    assert choose.mismatches(choose.ROWS[key], found[key], SHAPE, G) == []


@pytest.mark.parametrize("key", choose.KEYS)
def test_the_claims_hold_on_another_input_and_seed(key):
    x = 3.0 + 2.0 * _x(7, (6, 4, 3, 3))
    found = choose.measure(choose.ROWS[key], x, 2, seed=5)
    assert choose.mismatches(choose.ROWS[key], found, x.shape, 2) == []


def test_the_claims_come_from_axes():
    rows = choose.ROWS
    assert rows["batch"].roles == axes.TABLE["batch"].roles
    assert [k for k, r in rows.items() if r.batch_dependent] == ["batch"]
    assert [k for k, r in rows.items() if r.buffers] == ["batch"]
    assert not rows["rms"].centers and rows["layer"].centers
    assert rows["ws"].centers and not rows["ws"].scales      # the filter's mean, no input spread
    assert rows["dyt"].roles == () and not rows["dyt"].centers and not rows["dyt"].scales
    # IN removes every transformation of the input; DyT none
    assert all(rows["instance"].invariant(t) for t in invariance.INPUT_TRANSFORMS)
    assert not any(rows["dyt"].invariant(t) for t in invariance.INPUT_TRANSFORMS)


def test_the_set_sizes_are_those_of_axes(found):
    small = (3, 4, 2, 2)
    for key, f in found.items():
        row = choose.ROWS[key]
        if row.sets is None:
            expected = 1
        else:
            expected = axes.layout(row.sets, small, G if row.sets == "group" else None).set_size
        assert f.set_sizes == (expected,), key


# ------------------------------------------------------------------ the experiments can fail
def test_a_wrong_claim_is_reported(found):
    row = choose.ROWS["layer"]
    wrong = choose.Row(row.key, row.title, row.short, "batch", row.on, row.parameters)
    bad = choose.mismatches(wrong, found["layer"], SHAPE, G)
    assert any(b.startswith("batch dependence") for b in bad)
    assert any("Jacobian" not in b and "invariance to 'scale per sample'" in b for b in bad)
    wrong_buffers = choose.Row(row.key, row.title, row.short, row.sets, row.on, row.parameters,
                               ("running_mean",))
    assert choose.mismatches(wrong_buffers, found["layer"], SHAPE, G) == [
        "buffers: claimed ('running_mean',), found ()"]


def test_a_layer_that_reads_the_batch_is_caught():
    class Leaky(torch.nn.Module):             # an element-wise layer that reads the batch
        def forward(self, x):
            return torch.tanh(x) + x.mean(0, keepdim=True)

    row = choose.ROWS["dyt"]
    found = choose.measure(row, _x(), G, dyt=lambda C: Leaky())
    bad = choose.mismatches(row, found, SHAPE, G)
    assert any(b.startswith("the Jacobian") for b in bad)
    assert any(b.startswith("batch dependence: claimed False") for b in bad)
    assert any(b.startswith("shards differ") for b in bad)


def test_the_jacobian_finds_the_sets():
    x = _x(3, (3, 4, 2, 2))
    same = choose.sets_by_jacobian(lambda t: F.group_norm(t, 2), x)
    assert torch.equal(same, choose.expected_sets(choose.ROWS["group"], x.shape, 2))
    assert not torch.equal(same, choose.expected_sets(choose.ROWS["layer"], x.shape, 2))
    assert torch.equal(choose.sets_by_jacobian(torch.tanh, x), torch.eye(x.numel(), dtype=bool))


# ------------------------------------------------------------------------- the invariances
def test_the_rule_reproduces_the_ln_paper_table_on_a_linear_layer():
    """Ba et al. 2016, Table 1 (quoted in the LayerNorm chapter) for BN and LN, and the
    RMSNorm row, from the input-side rule through LN_PAPER_ON_INPUT."""
    paper = {"batch": [True, False, True, True, True, False],
             "layer": [True, True, False, True, False, True]}
    gen = torch.Generator().manual_seed(11)
    W = torch.randn(16, 10, generator=gen, dtype=f64)
    X = 0.5 + torch.randn(32, 10, generator=gen, dtype=f64)
    v = torch.randn(10, generator=gen, dtype=f64)
    rows = torch.rand(16, 1, generator=gen, dtype=f64) * 1.5 + 0.5
    cases = torch.ones(32, 1, dtype=f64)
    cases[0] = 3.0
    layers = {"batch": lambda W, X: F.batch_norm(X @ W.T, None, None, training=True),
              "layer": lambda W, X: F.layer_norm(X @ W.T, (16,)),
              "rms": lambda W, X: F.rms_norm(X @ W.T, (16,), eps=1e-5)}
    table = invariance.invariance_table(layers, invariance.ln_paper_transforms(v, rows, cases),
                                        W, X)
    assert table.transforms == invariance.LN_PAPER
    for key in layers:
        rule = [choose.ROWS[key].invariant(invariance.LN_PAPER_ON_INPUT[t])
                for t in invariance.LN_PAPER]
        assert table.row(key) == rule, key
        if key in paper:
            assert rule == paper[key], key


def test_groupnorm_ends_have_the_rows_of_layernorm_and_instancenorm():
    """G = 1: LayerNorm's row; G = C (one channel per group): InstanceNorm's, which the rule
    gets only from the group size, since the roles of GN do not change with G."""
    x = _x()
    C = SHAPE[1]
    modules = {G_: choose.make("group", SHAPE, G_) for G_ in (1, 2, C)}
    with torch.no_grad():
        table = invariance.invariance_table(
            modules, invariance.input_transforms(SHAPE, torch.Generator().manual_seed(2)), x)
    gn = choose.ROWS["group"]
    for G_, twin in ((1, "layer"), (C, "instance")):
        rule = [gn.invariant(t, group_size=C // G_) for t in invariance.INPUT_TRANSFORMS]
        assert table.row(G_) == rule == [choose.ROWS[twin].invariant(t)
                                         for t in invariance.INPUT_TRANSFORMS], G_
    assert table.row(2) == [gn.invariant(t) for t in invariance.INPUT_TRANSFORMS]
    assert table.row(C) != [gn.invariant(t) for t in invariance.INPUT_TRANSFORMS]


def test_invariance_table_refuses_an_ambiguous_change():
    x = _x()
    with pytest.raises(ValueError, match=r"moved by 0\.01.*between 0\.001 \(invariant\)"):
        invariance.invariance_table({"id": lambda z: z}, {"nudge": lambda z: (z + 0.01,)}, x)
    with pytest.raises(TypeError, match="must return a tuple"):
        invariance.invariance_table({"id": lambda z: z}, {"bad": lambda z: z}, x)
    with pytest.raises(ValueError, match="invariant_below < changed_above"):
        invariance.invariance_table({"id": lambda z: z}, {"t": lambda z: (z,)}, x,
                                    invariant_below=0.1, changed_above=0.01)
    with pytest.raises(ValueError, match="output's shape"):
        invariance.invariance_table({"id": lambda z: z}, {"t": lambda z: (z[:1],)}, x)


def test_input_transforms_are_never_near_one_and_vary_as_named():
    x = torch.ones(SHAPE, dtype=f64)
    ts = invariance.input_transforms(SHAPE, torch.Generator().manual_seed(0))
    per_sample = ts["scale per sample"](x)[0]
    assert torch.equal(per_sample, per_sample[:, :1, :1, :1].expand(SHAPE))   # one per sample
    assert per_sample[:, 0, 0, 0].unique().numel() == SHAPE[0]
    ratios = ts["scale all"](x)[0].unique()
    assert ratios.numel() == 1 and abs(float(ratios.log())) >= 0.2
    shifts = ts["shift per channel"](x)[0] - x
    assert torch.equal(shifts, shifts[:1, :, :1, :1].expand(SHAPE))
    assert shifts.abs().min() >= 0.5
    with pytest.raises(ValueError, match="a > 1"):
        invariance.input_transforms(SHAPE, torch.Generator(), scale=(0.5, 2.0))
    with pytest.raises(ValueError, match="unknown transformation"):
        invariance.predicted_invariant(("S",), "rotate", centers=True, scales=True)
    with pytest.raises(ValueError, match="unknown role"):
        invariance.spans(("S",), "S")


# ------------------------------------------------------------------- communication and cost
def test_sync_batch_norm_exchanges_2c_plus_1_then_2c_numbers():
    for C in (3, 6):
        assert choose.sync_exchange((4, C, 2, 2)) == (2 * C + 1, 2 * C)


def test_the_committed_cost_file_is_complete():
    cost = choose.load_cost()
    assert {"command", "machine", "date", "shape", "times"} <= set(cost)
    assert cost["command"].startswith("python benchmarks/speed.py --json")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", cost["date"])
    for key in (*choose.KEYS, "batch eval", "conv3x3"):
        for kind in ("fwd", "fwd+bwd"):
            t = cost["times"][key]["torch"][kind]
            assert 0 < t["min"] <= t["median"], (key, kind)
    for key in choose.KEYS:
        assert 0 < choose.cost_ratio(cost, key) < 1, key       # every norm under a 3x3 conv


def test_load_cost_names_a_file_without_its_fields(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text('{"command": "x"}')
    with pytest.raises(ValueError, match=r"no \['date', 'machine', 'shape', 'times'\].*--json"):
        choose.load_cost(path)


# ---------------------------------------------------------------------------- the table
def test_the_table_has_every_row_and_property():
    text = choose.table_markdown(choose.load_cost())
    table, notes = text.split("\n\n")
    lines = table.splitlines()
    assert lines[0] == "|  | BN | LN | RMS&shy;Norm | IN | GN | WS | DyT |"
    assert all(line.count("|") == len(choose.KEYS) + 2 for line in lines)
    assert "| scale per channel | yes | no | no | yes | no | no | no |" in lines
    assert lines[2] == ("| $S_i$ spans | $N$, $H$, $W$ | $C$, $H$, $W$ | $C$, $H$, $W$ | $H$, $W$ "
                        "| $C/G$, $H$, $W$ | a filter<sup>1</sup> | $x_i$ alone |")     # from axes
    assert "| subtracts a mean | yes | yes | no | yes | yes | yes | no |" in lines
    assert "| running buffers | 3<sup>4</sup> | none |" in text
    assert notes.splitlines()[3] == "4. `running_mean`, `running_var`, `num_batches_tracked`"
    assert "{ref}`used in <choose-used>`" in lines[-1]           # the section with the papers


def _shown(cell: str) -> str:
    """A cell's text as the reader sees it: no note marks, markup or TeX commands."""
    cell = re.sub(r"<sup>\d+</sup>|&shy;|[$`*]", "", cell)
    return re.sub(r"\\[a-z]+", "a", cell.replace("_{\\mathrm{DyT}}", ""))


def test_every_entry_is_short_and_every_note_is_marked():
    """A table to take in at a glance: a word, a symbol, a number or a short phrase per entry;
    what needs a sentence is a note under the table, numbered in reading order."""
    lines, notes = choose.table_cells(choose.load_cost())
    cells = [c for row in lines.values() for c in row]
    assert max(len(_shown(c)) for c in cells) <= choose.CELL_CHARS, \
        max(cells, key=lambda c: len(_shown(c)))
    assert _shown("$\\alpha_{\\mathrm{DyT}}$, $\\gamma$, $\\beta$<sup>2</sup>") == "a, a, a"
    marks = [int(m) for c in cells for m in re.findall(r"<sup>(\d+)</sup>", c)]
    assert sorted(set(marks)) == list(range(1, len(notes) + 1))
    assert list(dict.fromkeys(marks)) == sorted(set(marks))        # numbered as read
    assert len(set(notes)) == len(notes) and all(len(n) > 10 for n in notes)
    assert any("SyncBN" in n and "each device normalizes its own share" in n for n in notes)
    text = choose.table_markdown(choose.load_cost())
    assert text.endswith(f"{len(notes)}. {notes[-1]}") and "\0" not in text
    assert not re.search(r"\{cite", text)       # the papers are cited in "Where each is used"


def test_a_table_of_some_rows_numbers_its_own_notes():
    lines, notes = choose.table_cells(rows=("layer", "ws"))
    assert lines["$S_i$ spans"] == ["$C$, $H$, $W$", "a filter<sup>1</sup>"]
    assert len(notes) == 3 and notes[0].startswith("WS: one filter")
    assert "torch" not in lines                             # no cost: no times


def test_make_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="unknown row 'batchnorm'"):
        choose.make("batchnorm", SHAPE, G)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        choose.make("batch", (4, 6), G)


def test_the_dyt_column_is_the_formula_per_channel():
    """DyT (Zhu et al. 2025): gamma * tanh(alpha x) + beta, gamma and beta per channel."""
    m = choose.make("dyt", SHAPE, G)
    x = _x(9)
    with torch.no_grad():
        view = (1, -1, 1, 1)
        formula = m.weight.view(view) * torch.tanh(m.alpha * x) + m.bias.view(view)
        assert torch.allclose(m(x), formula, rtol=0, atol=1e-12)
    assert m.alpha.item() == 0.5 and m.weight.shape == (SHAPE[1],)
