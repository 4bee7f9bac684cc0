"""Every docstring example in the package runs, under the names users import it by.

Modules are imported through the ``cswap`` namespace (``cswap.tuner.store``, never ``tuner.store``),
so an example sees the same classes as user code does.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest


NAMESPACED = ("cswap.predictors", "cswap.server", "cswap.tuner")


def _module_names() -> list[str]:
    names = {"cswap", *NAMESPACED}
    for package in ("cswap", *NAMESPACED):
        path = importlib.import_module(package).__path__
        names.update(info.name for info in pkgutil.walk_packages(path, f"{package}."))
    return sorted(names)


def test_the_walk_finds_every_layer() -> None:
    names = _module_names()
    for expected in ("cswap.codecs.zvc", "cswap.runtime", "cswap.tuner.search", "cswap.predictors.decision", "cswap.server.app"):
        assert expected in names
    assert not [n for n in names if n.split(".")[0] != "cswap"]


@pytest.mark.parametrize("name", _module_names())
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} docstring examples in {name} failed (see the output above)"
