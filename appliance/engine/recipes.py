"""Recipes: which base image, which SGLang source and which of our patches make an engine image."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from appliance.engine.flags import flag_list_for_commit
from appliance.engine.spec import FieldError, engine_field_names

RECIPES_DIR = Path(__file__).parent / "recipes"
RECIPE_KEYS = ["name", "description", "base_image", "sglang", "patches", "lock", "pip_extras",
               "env", "env_allow", "build_args", "engine_defaults"]
SGLANG_KEYS = ["pip", "git", "archive", "ref", "base_version", "flags"]
LOCKS_DIR = Path(__file__).parent / "locks"
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# ${VAR} or ${VAR:-default}: lets a site swap the base image without editing the recipe.
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass
class SGLangSource:
    pip: str | None = None
    git: str | None = None
    # A local source archive (.tar.gz unpacking to sglang-<ref>/): the snapshots tests and
    # offline sites build from. It holds the same commit as the git source it stands for.
    archive: str | None = None
    ref: str | None = None
    # For a git source: the release it branched from, when the recipe knows it.
    base_version: str | None = None
    # Name of the flag list under appliance/data/ (without -flags.txt) for this source.
    flags: str | None = None


@dataclass
class Recipe:
    name: str
    base_image: str
    sglang: SGLangSource
    patches: list[str] = field(default_factory=list)
    pip_extras: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Engine variables a spec may set beyond appliance.engine.envkeys' allowlist.
    env_allow: list[str] = field(default_factory=list)
    build_args: dict[str, str] = field(default_factory=dict)
    engine_defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    path: Path | None = None
    # Exact versions with hashes the build installs from (pip --require-hashes).
    lock: str | None = None

    @property
    def sglang_version(self) -> str | None:
        return self.sglang.pip or self.sglang.base_version

    @property
    def source_key(self) -> str | None:
        """What SGLang knowledge is keyed by: the release, or the commit's first 9 hex digits.
        A site recipe that pins the same source gets the same flag list and rules, whatever
        its name, and whether it builds from git or from a local archive of that commit."""
        if self.sglang.pip:
            return self.sglang.pip
        return self.sglang.ref[:9] if self.sglang.ref else None

    @property
    def flag_list_name(self) -> str | None:
        """The flag list file stem: explicit, else the one shipped for this source."""
        if self.sglang.flags:
            return self.sglang.flags
        if self.sglang.pip:
            return f"sglang-{self.sglang.pip}"
        return flag_list_for_commit(self.sglang.ref) if self.sglang.ref else None

    def resolve_path(self, value: str) -> Path:
        """A path the recipe names: absolute, or relative to the recipe file."""
        path = Path(expand_env(value))
        if path.is_absolute() or self.path is None:
            return path
        return Path(self.path).parent / path

    @property
    def lock_path(self) -> Path | None:
        if not self.lock:
            return None
        local = self.resolve_path(self.lock)
        return local if local.is_file() else LOCKS_DIR / self.lock

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["path"] = str(self.path) if self.path else None
        return data


class RecipeError(ValueError):
    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        self.field = errors[0].field
        self.fix = errors[0].fix
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))


def expand_env(text: str) -> str:
    return ENV_REF.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), text)


def _unknown(keys: Mapping[str, Any], valid: list[str], path: str) -> list[FieldError]:
    errors = []
    for key in keys:
        if key in valid:
            continue
        close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
        where = f"{path}{key}"
        if close:
            errors.append(FieldError(where, f"unknown key {key!r}; did you mean {close[0]!r}?",
                                     f"rename {key!r} to {close[0]!r}"))
        else:
            errors.append(FieldError(where, f"unknown key {key!r}",
                                     f"remove it; valid keys: {', '.join(valid)}"))
    return errors


def _source(data: Any) -> tuple[SGLangSource, list[FieldError]]:
    if not isinstance(data, Mapping):
        return SGLangSource(), [FieldError("sglang", "must be a mapping",
                                           "write sglang: {pip: 0.5.23} or {git: URL, ref: SHA}")]
    errors = _unknown(data, SGLANG_KEYS, "sglang.")
    values = {k: str(v) for k, v in data.items() if k in SGLANG_KEYS and v is not None}
    src = SGLangSource(**values)
    if sum(bool(x) for x in (src.pip, src.git, src.archive)) != 1:
        errors.append(FieldError("sglang", "give exactly one of pip, git or archive",
                                 "write pip: 0.5.23, or git: URL with ref: <commit>, or "
                                 "archive: sglang-<commit>.tar.gz with ref: <commit>"))
    if (src.git or src.archive) and not (src.ref and FULL_SHA.match(src.ref)):
        # The image tag is a hash of the recipe: a moving branch would make the cache lie.
        errors.append(FieldError("sglang.ref", f"a git source needs a full 40-hex commit, got "
                                 f"{src.ref!r}", "pin the commit: ref: <40 hex digits>"))
    if src.pip and not re.match(r"^\d+(\.\d+)*(\.post\d+|rc\d+)?$", src.pip):
        errors.append(FieldError("sglang.pip", f"not a pinned version: {src.pip!r}",
                                 "pin an exact release, e.g. pip: 0.5.23"))
    return src, errors


def _str_list(data: Any, where: str) -> tuple[list[str], list[FieldError]]:
    if data is None:
        return [], []
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        return [], [FieldError(where, "must be a list of strings", f"write {where}: [...]")]
    return list(data), []


def _str_map(data: Any, where: str) -> tuple[dict[str, str], list[FieldError]]:
    if data is None:
        return {}, []
    if not isinstance(data, Mapping):
        return {}, [FieldError(where, "must be a mapping", f"write {where}: {{KEY: value}}")]
    return {str(k): str(v) for k, v in data.items()}, []


def _engine_defaults(data: Any) -> tuple[dict[str, Any], list[FieldError]]:
    if data is None:
        return {}, []
    if not isinstance(data, Mapping):
        return {}, [FieldError("engine_defaults", "must be a mapping of engine options",
                               "write engine_defaults: {trust_remote_code: true}")]
    return dict(data), _unknown(data, engine_field_names(), "engine_defaults.")


def recipe_from_dict(data: Mapping[str, Any], path: Path | None = None) -> Recipe:
    if not isinstance(data, Mapping):
        raise RecipeError([FieldError("", "a recipe must be a mapping",
                                      "write name:, base_image:, sglang:, patches:")])
    errors = _unknown(data, RECIPE_KEYS, "")
    for key in ("name", "base_image", "sglang"):
        if not data.get(key):
            errors.append(FieldError(key, "is required", f"add {key}: to the recipe"))
    if "patches" not in data:
        errors.append(FieldError("patches", "is required (may be empty)", "add patches: []"))
    src, errs = _source(data.get("sglang", {}))
    errors += errs if data.get("sglang") else []
    patches, errs = _str_list(data.get("patches"), "patches")
    errors += errs
    extras, errs = _str_list(data.get("pip_extras"), "pip_extras")
    errors += errs
    env, errs = _str_map(data.get("env"), "env")
    errors += errs
    env_allow, errs = _str_list(data.get("env_allow"), "env_allow")
    errors += errs
    build_args, errs = _str_map(data.get("build_args"), "build_args")
    errors += errs
    defaults, errs = _engine_defaults(data.get("engine_defaults"))
    errors += errs
    lock = data.get("lock")
    if lock is not None and not (isinstance(lock, str) and lock.endswith(".txt")):
        errors.append(FieldError("lock", f"must name a requirements file, got {lock!r}",
                                 "write lock: <recipe>.lock.txt (made by `appliance lock`)"))
    if errors:
        raise RecipeError(errors)
    return Recipe(name=str(data["name"]), base_image=expand_env(str(data["base_image"])),
                  sglang=src, patches=patches, pip_extras=extras, env=env,
                  env_allow=env_allow, build_args=build_args, engine_defaults=defaults,
                  description=str(data.get("description", "")), path=path,
                  lock=str(lock) if lock else None)


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def _recipe_path(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return candidate
    return RECIPES_DIR / f"{name_or_path}.yaml"


def load_recipe(name_or_path: str) -> Recipe:
    path = _recipe_path(name_or_path)
    if not path.is_file():
        close = difflib.get_close_matches(name_or_path, list_recipes(), n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"use one of {list_recipes()}"
        raise RecipeError([FieldError("recipe", f"no recipe {name_or_path!r}", fix)])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError([FieldError("", f"{path}: not valid YAML: {exc}",
                                      "fix the YAML syntax")]) from exc
    return recipe_from_dict(data, path=path)


def site_recipes(site_dir: str | Path | None) -> dict[str, str]:
    """A site's own recipe files (`site_dir`/*.yaml, APPLIANCE_RECIPES_DIR) by name."""
    if not site_dir:
        return {}
    return {p.stem: str(p) for p in Path(site_dir).glob("*.yaml")}


def load_site_recipe(name: str, site_dir: str | Path | None) -> Recipe:
    """A recipe by name, the panel's and a joined host's alike: the site's file of that
    name wins over a shipped one."""
    return load_recipe(site_recipes(site_dir).get(name, name))
