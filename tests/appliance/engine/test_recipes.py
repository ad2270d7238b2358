"""Recipes: the shipped three, and validation with suggestions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.engine.flags import load_flags
from appliance.engine.recipes import (
    RecipeError,
    list_recipes,
    load_recipe,
    load_site_recipe,
    recipe_from_dict,
    site_recipes,
)

DDTREE_PR_HEAD = "101cd5bd02faab336ada94f78daada6288c1816e"
DDTREE_V2_HEAD = "433c58ed70cd1dabe5a07a83da12f1513cd599ae"


def minimal() -> dict[str, Any]:
    return {"name": "r", "base_image": "img:1", "sglang": {"pip": "0.5.23"}, "patches": []}


def test_it_ships_the_three_kimi_recipes() -> None:
    assert {"kimi-k2.6-baseline", "kimi-k2.6-dflash", "kimi-k2.6-ddtree"} <= set(list_recipes())


def test_the_ddtree_recipe_pins_ddtree_v2_and_its_knowledge_follows_the_commit() -> None:
    recipe = load_recipe("kimi-k2.6-ddtree")
    assert recipe.sglang.git == "https://github.com/Rancy-Wang/sglang"
    assert recipe.sglang.ref == DDTREE_V2_HEAD
    assert recipe.patches == []
    assert recipe.engine_defaults["speculative_ddtree_budget"] == 32
    assert recipe.source_key == DDTREE_V2_HEAD[:9]
    assert recipe.flag_list_name == "sglang-ddtree-433c58ed7"


def test_an_archive_source_needs_the_commit_it_holds() -> None:
    data = minimal() | {"sglang": {"archive": "sglang-x.tar.gz"}}
    with pytest.raises(RecipeError) as err:
        recipe_from_dict(data)
    assert [e.field for e in err.value.errors] == ["sglang.ref"]
    both = minimal() | {"sglang": {"archive": "a.tar.gz", "git": "https://x", "ref": "a" * 40}}
    with pytest.raises(RecipeError) as err:
        recipe_from_dict(both)
    assert "exactly one of pip, git or archive" in err.value.errors[0].message


def test_the_pip_recipes_use_sglang_0_5_23() -> None:
    for name in ("kimi-k2.6-baseline", "kimi-k2.6-dflash"):
        recipe = load_recipe(name)
        assert recipe.sglang_version == "0.5.23"
        assert recipe.patches == []
    assert load_recipe("kimi-k2.6-dflash").engine_defaults["speculative_num_draft_tokens"] == 8


def test_every_shipped_recipe_has_a_flag_list() -> None:
    for name in list_recipes():
        flag_list = load_recipe(name).flag_list_name
        assert flag_list and load_flags(flag_list), name


def test_the_ddtree_flag_list_has_the_budget_flag_and_0_5_23s_does_not() -> None:
    assert "--speculative-ddtree-budget" in (load_flags("sglang-ddtree-101cd5bd0") or set())
    assert "--speculative-ddtree-budget" not in (load_flags("sglang-0.5.23") or set())


def test_the_base_image_defaults_to_cuda_13_and_is_configurable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPLIANCE_ENGINE_BASE_IMAGE", raising=False)
    assert load_recipe("kimi-k2.6-ddtree").base_image == \
        "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
    monkeypatch.setenv("APPLIANCE_ENGINE_BASE_IMAGE", "appliance-base:bookworm")
    assert load_recipe("kimi-k2.6-ddtree").base_image == "appliance-base:bookworm"


def test_it_suggests_the_closest_name_for_an_unknown_key() -> None:
    data = minimal()
    data["patchs"] = data.pop("patches")
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(data)
    assert any("did you mean 'patches'" in e.message for e in info.value.errors)


def test_it_suggests_the_closest_engine_default() -> None:
    data = minimal()
    data["engine_defaults"] = {"tp_sise": 8}
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(data)
    assert info.value.field == "engine_defaults.tp_sise"
    assert "tp_size" in info.value.fix


def test_it_requires_a_full_commit_for_a_git_source() -> None:
    data = minimal()
    data["sglang"] = {"git": "https://github.com/sgl-project/sglang", "ref": "main"}
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(data)
    assert info.value.field == "sglang.ref"


def test_it_rejects_both_pip_and_git() -> None:
    data = minimal()
    data["sglang"] = {"pip": "0.5.23", "git": "https://x", "ref": DDTREE_PR_HEAD}
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(data)
    assert info.value.field == "sglang"


def test_it_requires_the_patch_list() -> None:
    data = minimal()
    del data["patches"]
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(data)
    assert info.value.field == "patches"


def test_it_loads_a_recipe_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(minimal()))
    recipe = load_recipe(str(path))
    assert recipe.path == path
    assert recipe.sglang_version == "0.5.23"


def test_it_suggests_a_shipped_recipe_for_a_misspelt_name() -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe("kimi-k2.6-dtree")
    assert "kimi-k2.6-ddtree" in info.value.fix


def test_every_shipped_recipe_installs_from_a_lock_of_hashed_pins() -> None:
    for name in list_recipes():
        recipe = load_recipe(name)
        assert recipe.lock_path is not None and recipe.lock_path.is_file(), name
        text = recipe.lock_path.read_text()
        pins = dict(re.findall(r"^([a-z0-9.-]+)==(\S+) \\$", text, re.M))
        assert len(pins) > 150 and text.count("--hash=sha256:") >= len(pins), name
        if recipe.sglang.pip:
            assert pins["sglang"] == recipe.sglang.pip, name


def test_a_site_recipe_of_a_shipped_name_wins_and_others_stay_shipped(tmp_path: Path) -> None:
    shipped = list_recipes()[0]
    data = yaml.safe_load(load_recipe(shipped).path.read_text())  # type: ignore[union-attr]
    data["description"] = "this site's own"
    (tmp_path / f"{shipped}.yaml").write_text(yaml.safe_dump(data))
    assert site_recipes(tmp_path) == {shipped: str(tmp_path / f"{shipped}.yaml")}
    assert load_site_recipe(shipped, tmp_path).description == "this site's own"
    assert load_site_recipe(shipped, None).description != "this site's own"
    other = list_recipes()[1]
    assert load_site_recipe(other, tmp_path).path == load_recipe(other).path
    assert site_recipes("") == {}
