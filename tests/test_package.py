"""The package surface: every public name resolves, lazily, and never pulls in TensorFlow."""

import subprocess
import sys

import ckptmerge


def test_every_name_in_all_resolves_to_the_public_object():
    for name in ckptmerge.__all__:
        obj = getattr(ckptmerge, name)
        assert not isinstance(obj, type(sys)), f"ckptmerge.{name} is a module, not the API object"


def test_merge_stays_the_function_after_its_module_is_imported():
    code = ("import ckptmerge.offline, ckptmerge.api, ckptmerge; "
            "assert callable(ckptmerge.merge) and callable(ckptmerge.plan) and callable(ckptmerge.restore)")
    subprocess.run([sys.executable, "-c", code], check=True)


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
             "CkptMergeError", "ConfigError", "PlanError", "RestoreError", "RuleError", "UnknownTensorError", "UnreadableTensorError",
             "UnsafeCheckpointError", "VariableInfo"}
    assert set(ckptmerge.__all__) == eager | set(ckptmerge._LAZY)
