"""Write the API reference's pages: one per public module, and the index of public names.

Run ``python docs/_tools/api_pages.py`` after adding or removing a module; it rewrites
``docs/api/`` and the API section of ``mkdocs.yml``'s navigation. Each module page is one
mkdocstrings directive, so signatures and docstrings come from the code; the index lists every
name of ``pyro_bbb.__all__`` and of each subpackage's ``__all__``, linked to its documented
place. ``tests/test_docs.py`` checks that the pages match the package.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"
NAV_START, NAV_END = "  # --- API pages (docs/_tools/api_pages.py) ---", "  # --- end of API pages ---"


def public_modules() -> list[str]:
    """Every module of the package whose path has no private part, in walk order."""
    import pyro_bbb

    names = ["pyro_bbb"]
    for info in pkgutil.walk_packages(pyro_bbb.__path__, "pyro_bbb."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def page_path(module: str) -> Path:
    """Where a module's page goes: ``pyro_bbb.infer.elbo`` -> ``docs/api/infer/elbo.md``."""
    parts = module.split(".")[1:]
    if not parts:
        return API / "pyro_bbb.md"
    module_obj = importlib.import_module(module)
    if hasattr(module_obj, "__path__"):  # a package: its index page
        return API.joinpath(*parts, "index.md")
    return API.joinpath(*parts[:-1], f"{parts[-1]}.md")


def _summary(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    first = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    first = re.sub(r":math:`([^`]+)`", r"$\1$", first)
    return re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", first)


def _canonical(module: object, name: str) -> str:
    obj = getattr(module, name)
    if inspect.ismodule(obj):
        return obj.__name__
    home = getattr(obj, "__module__", None)
    if home and hasattr(sys.modules.get(home), name):
        return f"{home}.{name}"
    return f"{module.__name__}.{name}"


def module_page(module: str) -> str:
    """The Markdown of one module's page: a package shows its docstring, a module everything."""
    if hasattr(importlib.import_module(module), "__path__"):
        # a package re-exports; its names are documented where they are defined
        return f"::: {module}\n    options:\n      members: false\n"
    return f"::: {module}\n"


def index_page(modules: list[str]) -> str:
    """The API index: every package's public names, linked, with their first line."""
    lines = [
        "# API reference",
        "",
        "Every public name, by the package that exports it, linked to its documentation (with "
        "its signature and docstring) on the page of the module that defines it.",
        "",
    ]
    for name in modules:
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        if not hasattr(module, "__path__") or not exported:
            continue
        lines += [f"## `{name}`", "", "| name | what it is |", "| --- | --- |"]
        for public in exported:
            target = _canonical(module, public)
            summary = _summary(getattr(module, public)).replace("|", "\\|")
            lines.append(f"| [`{public}`][{target}] | {summary} |")
        lines.append("")
    return "\n".join(lines)


def nav(modules: list[str]) -> list[str]:
    """The navigation entries of the API section, as ``mkdocs.yml`` lines, nested by package."""
    entries = ["    - Index: api/index.md"]
    groups: dict[str, list[str]] = {}
    for name in modules:
        parts = name.split(".")
        key = parts[1] if len(parts) > 1 else ""
        groups.setdefault(key, []).append(name)
    for key, names in groups.items():
        pages = [(n, page_path(n).relative_to(ROOT / "docs").as_posix()) for n in names]
        if len(pages) == 1:
            entries.append(f"    - {pages[0][0]}: {pages[0][1]}")
            continue
        entries.append(f"    - pyro_bbb.{key}:")
        entries += [f"      - {n}: {path}" for n, path in pages]
    return entries


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
