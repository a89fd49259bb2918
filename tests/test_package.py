"""The package's shape: no module shadowed by a name, one-way imports, a light import."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import pyro_bbb

from .support import HAS_NUMPYRO


def _submodules() -> list[str]:
    names = [
        info.name
        for info in pkgutil.walk_packages(pyro_bbb.__path__, "pyro_bbb.")
        if not info.name.endswith("__main__")  # running it is the command line
    ]
    assert len(names) > 30  # the walk found the subpackages' modules too
    return names


#: Modules of the NumPyro backend, which need its extra (JAX, NumPyro) to import.
_NEEDS_NUMPYRO = (
    "_jax", "export", "export_densities", "export_network", "export_ops", "numpyro_chains"
)  # fmt: skip


def _import(name: str):
    if name.rpartition(".")[2] in _NEEDS_NUMPYRO and not HAS_NUMPYRO:
        pytest.skip('needs the numpyro extra: pip install "pyro-bbb[numpyro]"')
    return importlib.import_module(name)


@pytest.mark.parametrize("name", _submodules())
def test_no_module_is_shadowed_by_a_name_in_its_package(name):
    module = _import(name)
    package_name, _, leaf = name.rpartition(".")
    package = importlib.import_module(package_name)
    assert getattr(package, leaf) is module, (
        f"{package_name}.{leaf} is {getattr(package, leaf)!r}, not the module {name}"
    )


def test_every_public_name_of_a_package_exists():
    for name in ["pyro_bbb", *_submodules()]:
        if name.rpartition(".")[2] in _NEEDS_NUMPYRO and not HAS_NUMPYRO:
            continue
        module = importlib.import_module(name)
        missing = [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names missing attributes {missing}"


def test_the_core_imports_without_matplotlib_jax_or_numpyro():
    core = [
        "pyro_bbb",
        "pyro_bbb.infer",
        "pyro_bbb.evaluation",
        "pyro_bbb.data",
        "pyro_bbb.bench",
        "pyro_bbb.cli",
        "pyro_bbb.plots",  # draws with matplotlib, imported on the first figure
    ]
    code = "import sys\n" + "".join(f"import {m}\n" for m in core)
    code += "assert 'matplotlib' not in sys.modules, sorted(m for m in sys.modules if 'matpl' in m)"
    code += "\nassert not {'jax', 'numpyro'} & set(sys.modules), 'jax or numpyro imported'"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_top_level_api_of_the_readme_is_there():
    for name in (
        "BNN", "mlp", "bayesianize", "MeanFieldGuide", "LowRankGuide", "fit", "predict",
        "run_nuts", "to_inference_data", "psis_khat", "compare", "local_reparameterization",
        "flipout", "priors", "likelihoods", "infer", "data", "metrics",
    ):  # fmt: skip
        assert hasattr(pyro_bbb, name), name
    assert callable(pyro_bbb.predict) and callable(pyro_bbb.compare)
    assert pyro_bbb.infer.predictive.RegressionPrediction is pyro_bbb.RegressionPrediction


def test_no_module_imports_back_a_module_that_imports_it():
    # Import-linter's layers forbid imports up the package; this finds circles anywhere,
    # among modules of one layer too (imports under TYPE_CHECKING excluded, as there).
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("pyro_bbb", exclude_type_checking_imports=True, cache_dir=None)
    circles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if imported != module and graph.chain_exists(importer=imported, imported=module)
    )
    assert not circles, f"modules that import each other, directly or through others: {circles}"


def test_no_docstring_holds_a_control_character_an_escape_made():
    # "\theta" or "\top" in a docstring that is not raw, or a tab pasted in, renders as a tab
    # (predict's linearised predictive once read "J(x)(<TAB>heta_s - mu)")
    import ast
    from pathlib import Path

    found = []
    for path in sorted(Path(pyro_bbb.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False) or ""
                if any(c in doc for c in "\t\b\f\v\a\r"):
                    found.append(f"{path.name}: {getattr(node, 'name', 'module')}")
    assert not found


def _imports_in_source() -> dict[str, set[str]]:
    """Each module of the package and the package's modules its source imports, read with `ast`.

    Every import statement counts, those under ``if TYPE_CHECKING:`` and inside functions too;
    ``from a import b`` is an import of ``a.b`` where that is a module, else of ``a``.
    """
    import ast
    from pathlib import Path

    root = Path(pyro_bbb.__file__).parent
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("pyro_bbb", *path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
                if not node.level:
                    source = node.module
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    imported.add(full if full in modules else source)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules around it, first repeated at the end; else None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every way out is seen
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return [*path[path.index(imported) :], imported]
            if imported not in state and (cycle := visit(imported)):
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_import_graph_in_the_source_has_no_cycle_type_checking_imports_included():
    # The test above follows import-linter and leaves out imports made for type checking; a
    # circle of those still ties two modules into one concern, so none is allowed either.
    graph = _imports_in_source()
    assert "pyro_bbb.training.convergence" in graph["pyro_bbb.training.run_length"]  # it reads
    cycle = _a_cycle(graph)
    assert cycle is None, f"the package's imports go round: {' -> '.join(cycle)}"
