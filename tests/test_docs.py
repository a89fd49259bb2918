"""The documentation site is in step with the package: API pages, navigation and gallery."""

import importlib
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.support import REPO

DOCS = REPO / "docs"


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / "_tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


api_pages = _tool("api_pages")
gallery = _tool("gallery")


def test_every_public_module_has_its_generated_page_and_no_page_is_stale():
    modules = api_pages.public_modules()
    expected = {api_pages.page_path(name): api_pages.module_page(name) for name in modules}
    for path, text in expected.items():
        assert path.exists(), f"{path} is missing: run python docs/_tools/api_pages.py"
        assert path.read_text() == text
    pages = set((DOCS / "api").rglob("*.md")) - {DOCS / "api" / "index.md"}
    assert pages == set(expected), "stale API pages: run python docs/_tools/api_pages.py"


def test_the_navigation_lists_every_api_page():
    config = (REPO / "mkdocs.yml").read_text()
    start = config.index(api_pages.NAV_START) + len(api_pages.NAV_START)
    listed = config[start : config.index(api_pages.NAV_END)].strip("\n").splitlines()
    assert listed == api_pages.nav(api_pages.public_modules())


def test_every_exported_name_is_linked_from_the_api_index():
    index = (DOCS / "api" / "index.md").read_text()
    for name in api_pages.public_modules():
        if not api_pages.is_package(name):
            continue
        for public in getattr(importlib.import_module(name), "__all__", []):
            assert re.search(rf"\[`{re.escape(public)}`\]\[pyro_bbb\.[\w.]+\]", index), (
                f"{name}.{public} is not in docs/api/index.md"
            )


def test_the_gallery_page_is_what_its_script_writes_and_every_figure_exists():
    assert (DOCS / "gallery.md").read_text() == gallery.page()
    for entry in gallery.GALLERY:
        assert (DOCS / entry.figure).stat().st_size > 10_000, entry.figure
        script = re.search(r"examples/\w+\.py", entry.command)
        assert script is None or (REPO / script.group(0)).exists(), entry.command


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for this module: ``(folder, the build's CompletedProcess)``."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip('needs the docs extra: pip install -e ".[docs]"')
    folder = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return folder, build


def test_the_site_builds_strictly(site):
    folder, build = site
    assert build.returncode == 0, build.stderr[-3000:]
    assert (folder / "api" / "index.html").exists()


SCRIPT_SRC = re.compile(r"""<script\b[^>]*?\bsrc=["']?([^"' >]+)""", re.IGNORECASE)


def test_the_site_loads_no_script_from_the_network_and_ships_mathjax(site):
    folder, build = site
    assert build.returncode == 0, build.stderr[-3000:]
    pages = sorted(folder.rglob("*.html"))
    assert len(pages) > 20
    remote = {
        (page.relative_to(folder).as_posix(), src)
        for page in pages
        for src in SCRIPT_SRC.findall(page.read_text(encoding="utf-8"))
        if re.match(r"(https?:)?//", src, re.IGNORECASE)
    }
    assert not remote, f"scripts loaded from the network: {sorted(remote)[:5]}"
    # a page with maths loads the configuration, then the renderer the site ships itself
    page = (folder / "kl_scaling" / "index.html").read_text(encoding="utf-8")
    assert 'class="arithmatex"' in page
    sources = SCRIPT_SRC.findall(page)
    assert sources.index("../javascripts/mathjax.js") < sources.index(
        "../javascripts/mathjax/tex-svg.js"
    )
    mathjax = folder / "javascripts" / "mathjax"
    assert (mathjax / "tex-svg.js").stat().st_size > 1_000_000  # MathJax's bundle, not a stub
    assert (mathjax / "input" / "tex" / "extensions" / "cancel.js").exists()  # loaded on demand


def test_concepts_gives_the_default_rate_schedule_the_code_has():
    from pyro_bbb.training import InverseTimeDecay

    start = InverseTimeDecay(100).start
    concepts = " ".join((DOCS / "concepts.md").read_text().split())
    assert f"keeps `lr` for the first {start * 100:.0f} %" in concepts
    assert "keeps `lr` for the first half" not in concepts
