"""The package surface: every public name resolves, lazily, and never pulls in TensorFlow."""

import subprocess
import sys

import ckptmerge


def test_every_name_in_all_resolves_to_the_public_object():
    for name in ckptmerge.__all__:
        obj = getattr(ckptmerge, name)
        assert not isinstance(obj, type(sys)), f"ckptmerge.{name} is a module, not the API object"


def test_dir_shows_the_public_names_only():
    names = dir(ckptmerge)
    assert set(ckptmerge.__all__) <= set(names)
    assert [n for n in names if n.startswith("_")] == ["__version__"]
    assert not set(names) - set(ckptmerge.__all__) - {"__version__"}, "helpers of the package leak into dir()"


def test_public_names_stay_the_api_objects_after_every_module_is_imported():
    # A subpackage named like a public function (ckptmerge.merge, ckptmerge.restore) would replace
    # the function as an attribute of the package the moment it is imported.
    code = ("import importlib, pkgutil, sys, types, ckptmerge; "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(ckptmerge.__path__, 'ckptmerge.')]; "
            "bad = [n for n in ckptmerge.__all__ if isinstance(getattr(ckptmerge, n), types.ModuleType)]; "
            "assert not bad, bad; assert callable(ckptmerge.merge) and callable(ckptmerge.restore)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_old_module_paths_import_the_moved_module_with_a_deprecation_warning():
    import importlib
    import warnings

    from ckptmerge.core.compat import MOVED

    for old, new in sorted(MOVED.items()):
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert [w.category for w in caught] == [DeprecationWarning], old
        assert new in str(caught[0].message), old


def test_a_module_imported_by_its_old_path_keeps_the_spec_of_its_new_path():
    code = ("import warnings; warnings.simplefilter('ignore', DeprecationWarning); "
            "import ckptmerge.errors as old, ckptmerge.core.errors as new; "
            "assert old is new and new.__spec__.name == 'ckptmerge.core.errors', new.__spec__")
    subprocess.run([sys.executable, "-W", "error::ImportWarning", "-c", code], check=True)


#: old module paths that are packages of their format family now -> the modules holding the old names
OLD_MODULES_NOW_PACKAGES = {
    "ckptmerge.formats.orbax": ("ckptmerge.formats.orbax.reader", "ckptmerge.formats.orbax.layout"),
    "ckptmerge.formats.safetensors": ("ckptmerge.formats.safetensors.reader",),
}


def test_the_names_of_an_old_module_that_is_a_package_now_resolve_with_a_deprecation_warning():
    import importlib
    import warnings

    for old, homes in OLD_MODULES_NOW_PACKAGES.items():
        package = importlib.import_module(old)
        for home in homes:
            module = importlib.import_module(home)
            for name in module.__all__:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    value = getattr(package, name)
                assert value is getattr(module, name), (old, name)
                assert [w.category for w in caught] == [DeprecationWarning], (old, name)
                assert f"{home}.{name}" in str(caught[0].message), (old, name)
        try:
            package.no_such_name  # noqa: B018
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError(f"{old}.no_such_name resolved")


def test_an_old_path_that_never_existed_still_fails_to_import():
    import importlib

    import pytest

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ckptmerge.no_such_module")


def test_resolving_every_public_name_does_not_import_tensorflow():
    code = ("import sys, ckptmerge; [getattr(ckptmerge, n) for n in ckptmerge.__all__]; "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_attribute_is_an_attribute_error():
    try:
        ckptmerge.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_all_lists_exactly_the_eager_and_lazy_public_names():
    eager = {"ArgumentError", "ArgumentTypeError", "CheckpointFormatError", "CheckpointNotFoundError",
             "CkptMergeError", "CombineError", "ConfigError", "PlanError", "RestoreError", "RuleError", "UnknownTensorError",
             "UnreadableTensorError",
             "UnsafeCheckpointError", "VariableInfo"}
    assert set(ckptmerge.__all__) == eager | set(ckptmerge._LAZY)
