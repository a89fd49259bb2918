r"""MkDocs hook: the site carries its own MathJax, so its mathematics renders without a network.

MathJax 3 comes from the ``django-static-mathjax`` package of the ``docs`` extra: a copy of
MathJax's released files (Apache 2.0) installed as the Python package ``mathjax``; despite its
name it needs no Django. The hook adds to the site, under ``javascripts/mathjax/``:

* ``tex-svg.js``, the TeX input with SVG output: it draws glyphs as paths, so it needs no font
  files, which a browser will not load for a page opened from ``file://``;
* ``input/tex/extensions/*.js``, the TeX packages MathJax loads on demand (``\cancel``,
  ``\boldsymbol``, ...), found next to ``tex-svg.js`` as MathJax expects.

``mkdocs.yml`` loads ``javascripts/mathjax.js`` (the configuration) and then
``javascripts/mathjax/tex-svg.js``. Nothing is copied into the repository: the files come from
the installed package at every build, and ``mkdocs serve`` serves them the same way.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

TARGET = "javascripts/mathjax"
ENTRY = "tex-svg.js"
EXTENSIONS = "input/tex/extensions"


def es5_folder() -> Path:
    """The ``es5`` folder of the installed MathJax, which holds ``tex-svg.js``."""
    spec = importlib.util.find_spec("mathjax")
    if spec is not None and spec.origin is not None:
        folder = Path(spec.origin).parent / "static" / "mathjax" / "es5"
        if (folder / ENTRY).is_file():
            return folder
    raise PluginError(
        "the documentation renders its maths with MathJax from the package "
        "django-static-mathjax, which is not installed: pip install -e '.[docs]'"
    )


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add MathJax's renderer and its TeX extensions to the site's files."""
    es5 = es5_folder()
    for path in (es5 / ENTRY, *sorted((es5 / EXTENSIONS).glob("*.js"))):
        uri = f"{TARGET}/{path.relative_to(es5).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
