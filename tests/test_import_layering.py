"""The package's layers hold: each imports only what sits below it.

Each layer is imported in a fresh interpreter, and the test lists what that import
loaded. The NumPy specification must not load torch or matplotlib; the torch modules
must not load the specification (the tests compare the two, so neither may lean on the
other); only the layer above both, :mod:`mha.convert`, knows both.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SPECIFICATION = ("mha.attention", "mha.params", "mha.kv_cache", "mha.masks", "mha.tiled",
                 "mha.cost")  # fmt: skip
TOP = ("mha.convert", "mha.gqa_pooling", "mha.draw", "mha.translator", "mha.bench",
       "mha.exercises")  # fmt: skip

# statement to run -> modules it must not load
RULES = {
    "import mha": ("torch", "matplotlib", *SPECIFICATION, "mha.positional"),
    "import mha; mha.multi_head_attention; mha.causal_mask; mha.sinusoidal_positional_encoding": (
        "torch", "matplotlib", *TOP,
    ),
    "import mha; mha.flash_attention; mha.peak_memory_bytes": ("torch", "matplotlib", *TOP),
    "import mha; mha.kv_cache_bytes; mha.PUBLISHED_MODELS": ("torch", "matplotlib", *TOP),
    "import mha.exercises": ("torch", "matplotlib"),
    "import mha.kv_cache_torch": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                                  "mha.modules", "mha.layers", "mha.transformer"),
    "import mha.positional_torch": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                                    "mha.modules", "mha.layers", "mha.transformer"),
    "import mha.modules": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                           "mha.layers", "mha.transformer"),
    "import mha.layers": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                          "mha.transformer"),
    "import mha.masks_torch": ("matplotlib", *SPECIFICATION, "mha.positional", *TOP,
                               "mha.modules"),
    # The Transformer reads the sinusoidal table from mha.positional: data, not the
    # attention under test (the one import of the specification by a torch layer).
    "import mha.transformer": ("matplotlib", *SPECIFICATION, *TOP),
    "import mha.convert": ("matplotlib", "mha.draw", "mha.translator", "mha.bench",
                           "mha.gqa_pooling"),
    "import mha.gqa_pooling": ("matplotlib", *SPECIFICATION, "mha.positional",
                               "mha.convert", "mha.draw", "mha.translator", "mha.bench"),
    "import mha.translator": ("matplotlib", "mha.draw", "mha.bench", "mha.exercises",
                              *SPECIFICATION),
    "import mha.draw": ("torch", "mha.translator", "mha.bench"),
}  # fmt: skip


def loaded_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; import json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out))


def forbidden(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded for n in names if m == n or m.startswith(n + "."))


@pytest.mark.slow
@pytest.mark.parametrize("statement", sorted(RULES))
def test_layer_loads_nothing_above_it(statement):
    loaded = loaded_by(statement)
    assert statement.split(";")[0].split()[-1] in loaded
    assert not forbidden(loaded, RULES[statement]), (
        f"`{statement}` loaded {forbidden(loaded, RULES[statement])}"
    )


def test_the_check_matches_whole_module_names():
    """A forbidden package counts with its submodules, and only with them: "torch"
    catches torch.nn, not torchvision; "mha.draw" does not catch mha.drawing."""
    loaded = {"torch", "torch.nn", "torchvision", "mha.draw.style", "mha.drawing"}
    assert forbidden(loaded, ("torch",)) == ["torch", "torch.nn"]
    assert forbidden(loaded, ("mha.draw",)) == ["mha.draw.style"]
    assert forbidden(loaded, ("numpy",)) == []


def test_the_package_names_exactly_what_the_specification_exports():
    """``mha/__init__.py`` lists the names it loads lazily; they must not drift from
    the ``__all__`` of the modules that define them."""
    import importlib

    import mha

    for module, names in mha._SPECIFICATION.items():
        assert sorted(names) == sorted(importlib.import_module(module).__all__), module
    assert mha.__all__ == sorted(n for names in mha._SPECIFICATION.values() for n in names)
