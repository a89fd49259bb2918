"""Write the API reference's pages: one per public module, and the index of public names.

Run ``python docs/_tools/api_pages.py`` after adding or removing a module; it rewrites
``docs/api/`` and the API section of ``mkdocs.yml``'s navigation. Each module page is one
mkdocstrings directive, so signatures and docstrings come from the code; the index lists every
name of ``pyro_bbb.__all__`` and of each subpackage's ``__all__``, linked to its documented
place. ``tests/test_docs.py`` checks that the pages match the package.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # griffe comes with the docs extra; the tests import this module without it
    import griffe

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"
NAV_START = "  # --- API pages (docs/_tools/api_pages.py) ---"
NAV_END = "  # --- end of API pages ---"


def public_modules() -> list[str]:
    """Every module of the package whose path has no private part, in walk order."""
    import pyro_bbb

    names = ["pyro_bbb"]
    for info in pkgutil.walk_packages(pyro_bbb.__path__, "pyro_bbb."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def is_package(module: str) -> bool:
    """Whether ``module`` is a package, found without importing it.

    A module of the NumPyro backend raises on import where JAX is missing; the pages must
    not depend on JAX.
    """
    return importlib.util.find_spec(module).submodule_search_locations is not None


def page_path(module: str) -> Path:
    """Where a module's page goes: ``pyro_bbb.infer.elbo`` -> ``docs/api/infer/elbo.md``."""
    parts = module.split(".")[1:]
    if not parts:
        return API / "pyro_bbb.md"
    if is_package(module):  # a package: its index page
        return API.joinpath(*parts, "index.md")
    return API.joinpath(*parts[:-1], f"{parts[-1]}.md")


def _documented(package: griffe.Module, name: str) -> griffe.Object:
    """Where ``package``'s public ``name`` is defined (re-exports followed to the end)."""
    member = package[name]
    return member.final_target if member.is_alias else member


def _summary(obj: griffe.Object) -> str:
    """The first paragraph of an object's docstring, on one line, roles as code or math."""
    doc = obj.docstring.value if obj.docstring else ""
    first = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    first = re.sub(r":math:`([^`]+)`", r"$\1$", first)
    first = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", first)
    return first.replace("|", "\\|")


def module_page(module: str) -> str:
    """The Markdown of one module's page: a package shows its docstring, a module everything."""
    if is_package(module):
        # a package re-exports; its names are documented where they are defined
        return f"::: {module}\n    options:\n      members: false\n"
    return f"::: {module}\n"


def index_page(modules: list[str]) -> str:
    """The API index: every package's public names, linked, with their first line."""
    import griffe

    root = griffe.load(
        "pyro_bbb", search_paths=[str(ROOT)], docstring_parser="google", resolve_aliases=True
    )
    lines = [
        "# API reference",
        "",
        "Every public name, by the package that exports it, linked to its documentation (with "
        "its signature and docstring) on the page of the module that defines it.",
        "",
    ]
    for name in modules:
        if not is_package(name):
            continue
        exported = getattr(importlib.import_module(name), "__all__", None)
        if not exported:
            continue
        package = root if name == "pyro_bbb" else root[name.removeprefix("pyro_bbb.")]
        lines += [f"## `{name}`", "", "| name | what it is |", "| --- | --- |"]
        for public in exported:
            target = _documented(package, public)
            lines.append(f"| [`{public}`][{target.path}] | {_summary(target)} |")
        lines.append("")
    return "\n".join(lines)


def nav(modules: list[str]) -> list[str]:
    """The navigation entries of the API section, as ``mkdocs.yml`` lines, nested by package."""
    docs = ROOT / "docs"

    def entries(package: str, depth: int) -> list[str]:
        pad = "  " * depth
        lines = [f"{pad}- {package}: {page_path(package).relative_to(docs).as_posix()}"]
        for name in modules:
            if name.rpartition(".")[0] != package:
                continue
            if is_package(name):
                lines.append(f"{pad}- {name}:")
                lines += entries(name, depth + 1)
            else:
                lines.append(f"{pad}- {name}: {page_path(name).relative_to(docs).as_posix()}")
        return lines

    return ["    - Index: api/index.md", *entries("pyro_bbb", 2)]


def main() -> None:
    """Rewrite ``docs/api/`` and the API part of the navigation."""
    sys.path.insert(0, str(ROOT))
    modules = public_modules()
    if API.exists():
        for old in API.rglob("*.md"):
            old.unlink()
    for name in modules:
        path = page_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(module_page(name))
    (API / "index.md").write_text(index_page(modules))
    config = ROOT / "mkdocs.yml"
    text = config.read_text()
    start, end = text.index(NAV_START), text.index(NAV_END)
    text = text[: start + len(NAV_START)] + "\n" + "\n".join(nav(modules)) + "\n" + text[end:]
    config.write_text(text)
    print(f"wrote {len(modules) + 1} pages under {API.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
