"""The generic registry behind losses, models and recipes, and the metadata the report reads."""

from __future__ import annotations

import pytest

from torchcal._registry import Registry
from torchcal.losses import LOSSES, list_losses
from torchcal.models import MODELS, list_models
from torchcal.report.aggregate import LOSS_ORDER, loss_label
from torchcal.train.recipes import RECIPES, UnknownRecipeError, get_recipe, list_recipes


class _Oops(KeyError):
    pass


def test_registry_rules():
    reg = Registry("thing", error=_Oops)

    def a():
        return 1

    assert reg.register("a", a, display="Ay", order=2, paper="X et al.") is a
    assert reg.register("a", a) is a  # the same object again: a no-op
    with pytest.raises(ValueError, match="Thing 'a' is already registered"):
        reg.register("a", lambda: 2)
    for bad in ("", "Upper", 3, None):
        with pytest.raises(ValueError, match="lower-case"):
            reg.register(bad, a)
    with pytest.raises(ValueError, match="display"):
        reg.register("b", a, display="")
    reg.register("c", display="See", order=1)(lambda: 3)
    reg.register("b", lambda: 4)  # no order: after the ordered ones
    assert reg.names() == ["a", "b", "c"] and reg.names("[ab]") == ["a", "b"]
    assert reg.ordered() == ["c", "a", "b"]
    assert reg.display("c") == "See" and reg.display("b") == "b" and reg.display("zz") == "zz"
    assert reg.entry("a").paper == "X et al." and "a" in reg and "zz" not in reg
    with pytest.raises(_Oops, match="Unknown thing 'zz'; expected one of: a, b, c"):
        reg.get("zz")
    reg.unregister("b")
    reg.unregister("b")
    assert reg.names() == ["a", "c"]


def test_the_three_tables_share_the_registry():
    assert LOSSES.names() == list_losses() and MODELS.names() == list_models()
    assert RECIPES.names() == list_recipes()
    with pytest.raises(UnknownRecipeError, match="Unknown recipe 'nope'"):
        get_recipe("nope")
    with pytest.raises(ValueError, match="Unknown model 'nope'"):
        MODELS.get("nope")


def test_every_loss_has_a_display_name_and_an_order():
    """The report's names and order come from the registrations (no table kept by hand)."""
    for name in list_losses():
        e = LOSSES.entry(name)
        assert e.display and e.display != name or name in {"mmce", "tlbs", "dece"}, name
        assert e.order is not None, name
    orders = [LOSSES.entry(n).order for n in list_losses()]
    assert len(set(orders)) == len(orders), "two losses share a table position"
    assert LOSS_ORDER == tuple(sorted(list_losses(), key=lambda n: LOSSES.entry(n).order))
    assert LOSS_ORDER[:5] == ("ce", "ls", "brier", "mmce", "focal")
    assert loss_label("flsd53") == "FLSD-53" and loss_label("bsce_gra") == "BSCE-GRA"
    assert loss_label("focal", {"gamma": 3.0}) == "Focal (γ=3)"
    assert LOSSES.entry("focal").paper and LOSSES.entry("adafocal").paper


def test_every_loss_names_its_paper_and_the_claims_cite_it():
    """``paper`` is filled for every loss, and the report's claims read it (no copy kept)."""
    from torchcal.experiments.claims import CLAIMS

    empty = [n for n in list_losses() if not LOSSES.paper(n)]
    assert not empty, f"losses registered without a paper: {empty}"
    cited = {c.key: c.source for c in CLAIMS}
    assert cited["mukhoti_focal_lt_ce"] == LOSSES.paper("focal") == LOSSES.paper("flsd53")
    assert cited["ghosh_adafocal_lowest"] == LOSSES.paper("adafocal")
    assert cited["lin_bsce_gra"] == LOSSES.paper("bsce_gra")
    assert cited["tao_dual_focal"] == LOSSES.paper("dual_focal")
    reg = Registry("widget")
    reg.register("a", lambda: 1, paper="Someone 2026")
    assert reg.paper("a") == "Someone 2026"
    with pytest.raises(ValueError, match="Unknown widget"):
        reg.paper("b")
