"""The frameworks are optional: nothing imports them until their module is, and a missing one says
which extra installs it, in one line."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

#: integration module -> (the framework modules it imports, the extra that installs them)
MODULES = {
    "cswap.integrations.huggingface": (("transformers",), "hf"),
    "cswap.integrations.lightning": (("lightning.pytorch", "lightning"), "lightning"),
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_missing_framework_names_its_extra_in_one_line(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    frameworks, extra = MODULES[module]
    for name in frameworks:
        monkeypatch.setitem(sys.modules, name, None)  # what `import name` finds when it is not installed
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError) as raised:
        importlib.import_module(module)
    message = str(raised.value)
    assert f"pip install 'cswap[{extra}]'" in message
    assert frameworks[0] in message
    assert "\n" not in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_importing_cswap_and_its_integrations_package_imports_no_framework() -> None:
    code = (
        "import sys, cswap, cswap.integrations; cswap.Runtime; "
        "print(sorted(m for m in ('transformers', 'accelerate', 'lightning', 'pytorch_lightning') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
