r"""A Griffe extension that renders the docstrings' Sphinx markup as the site's Markdown.

The docstrings follow Pyro's conventions (Google sections with Sphinx roles: ``:func:``,
``:class:``, ``:math:``, ``.. math::`` blocks, ``Example::`` literal blocks), so that they read
well in ``help()`` and in Sphinx. mkdocstrings renders docstrings as Markdown; this extension
rewrites the markup once the package is loaded, before any docstring is parsed:

* ``:math:`x``` becomes ``$x$`` and a ``.. math::`` block becomes ``$$ … $$`` (MathJax through
  ``pymdownx.arithmatex``);
* ``:func:`~pyro_bbb.fit``` (and ``:class:``, ``:mod:``, ``:meth:``, ``:attr:``, ``:data:``,
  ``:exc:``) becomes a cross-reference to the object's documented place, ``[`fit`][…]``,
  resolved through re-exports to the canonical path; a target outside the package, or one
  the reference does not document (a private name), stays inline code;
* a paragraph ending in ``::`` ends in ``:`` (its indented block is already a code block).

Used from ``mkdocs.yml``: ``extensions: [docs/_tools/sphinx_roles.py]``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(func|class|mod|meth|attr|data|exc|obj):`(~?)([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_MATH_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)\.\. math::[ \t]*\n((?:(?P=indent)[ \t]+.*\n|[ \t]*\n)+)", re.M
)
_LITERAL_MARKER = re.compile(r"(?<=\S)::[ \t]*$", re.M)


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite Sphinx roles and math in every docstring of the loaded package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Convert the docstrings of ``pkg`` and everything in it."""
        self._root = pkg
        for obj in _walk(pkg):
            docstring = obj.docstring
            if docstring is not None:
                docstring.value = self.convert(docstring.value, obj)

    def convert(self, text: str, owner: griffe.Object) -> str:
        """The Markdown form of one docstring of ``owner``."""
        text = _MATH_BLOCK.sub(_math_block, text)
        text = _MATH_ROLE.sub(lambda m: f"${m.group(1).strip()}$", text)
        text = _ROLE.sub(lambda m: self._reference(m.group(3), bool(m.group(2)), owner), text)
        return _LITERAL_MARKER.sub(":", text)

    def _reference(self, target: str, short: bool, owner: griffe.Object) -> str:
        target = target.strip()
        label = target.rsplit(".", 1)[-1] if short else target
        label = label.removesuffix("()")
        path = self._resolve(target.removesuffix("()"), owner)
        if path is None:
            return f"`{label}`"
        return f"[`{label}`][{path}]"

    def _resolve(self, target: str, owner: griffe.Object) -> str | None:
        """The canonical, documented path of ``target`` seen from ``owner``, or ``None``."""
        candidates = [target]
        scope: griffe.Object | None = owner
        while scope is not None:  # relative names: the owner's class, module, package
            candidates.append(f"{scope.path}.{target}")
            scope = scope.parent
        for candidate in candidates:
            if not candidate.startswith(f"{self._root.name}.") and candidate != self._root.name:
                continue
            try:
                obj = self._root.modules_collection.get_member(candidate)
                final = obj.final_target if obj.is_alias else obj
            except (KeyError, ValueError, AttributeError, griffe.GriffeError):
                continue  # not in the package, or an alias to another package (torch, pyro)
            if any(part.startswith("_") and part != "__init__" for part in final.path.split(".")):
                return None  # private: not on the site
            if not final.is_module and not final.has_docstring:
                return None  # undocumented members are not rendered
            return final.path
        return None


def _math_block(match: re.Match[str]) -> str:
    indent = match.group("indent")
    body = [line.strip() for line in match.group(2).splitlines() if line.strip()]
    return f"{indent}$$\n" + "".join(f"{indent}{line}\n" for line in body) + f"{indent}$$\n\n"


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield from _walk(member)
