"""The built-in demo (behind `ckptmerge demo`, the README quick start) passes all its checks."""

from ckptmerge.demo import run_demo


def test_demo_restores_model_c_and_the_keras_model_exactly(tf, tmp_path):
    result = run_demo(str(tmp_path))
    assert [ok for _, ok in result.checks] == [True] * 5
    titles = [t for t, _ in result.steps]
    assert titles[0].startswith("Plan for model C")
    assert "OK: nothing blocks a strict restore" in result.steps[0][1]
    assert (tmp_path / "A" / "checkpoint").exists()
