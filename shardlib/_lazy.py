"""Package exports that load on first use, so that importing a pure module never starts the runtime.

Every subpackage's ``__init__`` lists its public names and the module that defines each one. Python runs
a package's ``__init__`` whenever any module inside it is imported: if ``shardlib.pipeline``'s
``__init__`` imported its rank code eagerly, then ``from shardlib.pipeline.schedules import
make_schedule`` (pure arithmetic) would drag in the rank processes' machinery too, and the layers would
exist only on paper. With ``exports`` the name is looked up in its module the first time someone asks
for it (PEP 562's module ``__getattr__``), so ``from shardlib.pipeline import make_schedule`` works and
costs only what it uses.
"""

from __future__ import annotations

from importlib import import_module


def exports(package: str, names_by_module: dict[str, tuple[str, ...]]):
    """``(__all__, __getattr__, __dir__)`` for ``package``, whose submodule ``m`` defines each name in
    ``names_by_module[m]``. Assign the three in the package's ``__init__``."""
    home: dict[str, str] = {}
    for module, names in names_by_module.items():
        for name in names:
            if name in home:
                raise ValueError(f"{package}: {name!r} is exported by both .{home[name]} and .{module}")
            home[name] = module

    def __getattr__(name: str):
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{home[name]}"), name)

    def __dir__() -> list[str]:
        return sorted(home)

    return sorted(home), __getattr__, __dir__
