"""Value transforms (vocab remap, slice) and dtype casts: pure numpy, checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from ckptmerge.core.errors import CkptMergeError, RuleError
from ckptmerge.planning.transforms import (
    Slice,
    TransformError,
    VocabRemap,
    cast_array,
    cast_problem,
    dtype_name,
    numpy_dtype,
    read_vocab,
)
from ckptmerge.planning.chains import chain_apply, chain_output_shape, select

OLD = ["a", "b", "c", "d"]
NEW = ["d", "x", "a", "c", "y"]  # reordered (d, a, c), added (x, y), removed (b)
# Row i of the checkpoint tensor is token OLD[i]: a=[0,1], b=[2,3], c=[4,5], d=[6,7].
ROWS = np.arange(8, dtype=np.float32).reshape(4, 2)


def write(path, text, *, encoding="utf-8"):
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return str(path)


# --------------------------------------------------------------------------------------------
# VocabRemap values


def test_vocab_remap_rows_new_tokens_zeros():
    out = VocabRemap("embed", OLD, NEW).apply(ROWS, None)
    np.testing.assert_array_equal(out, [[6, 7], [0, 0], [0, 1], [4, 5], [0, 0]])
    assert out.dtype == np.float32


def test_vocab_remap_rows_new_tokens_keep_current_value():
    current = np.full((5, 2), -1, np.float32)
    out = VocabRemap("embed", OLD, NEW, init="keep").apply(ROWS, current)
    np.testing.assert_array_equal(out, [[6, 7], [-1, -1], [0, 1], [4, 5], [-1, -1]])


def test_vocab_remap_columns_new_tokens_zeros():
    kernel = ROWS.T.copy()  # (2, 4): column j is token OLD[j]
    out = VocabRemap("logits/kernel", OLD, NEW, axis=1).apply(kernel, None)
    np.testing.assert_array_equal(out, [[6, 0, 0, 4, 0], [7, 0, 1, 5, 0]])


def test_vocab_remap_columns_new_tokens_keep_current_value():
    kernel = ROWS.T.copy()
    current = np.array([[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]], np.float32)
    out = VocabRemap("logits/kernel", OLD, NEW, axis=1, init="keep").apply(kernel, current)
    np.testing.assert_array_equal(out, [[6, 11, 0, 4, 14], [7, 21, 1, 5, 24]])


def test_vocab_remap_keep_has_the_targets_dtype_so_kept_values_stay_exact():
    current = np.full((5, 2), 1 + 2 ** -20, np.float32)  # not representable in float16
    out = VocabRemap("embed", OLD, NEW, init="keep").apply(ROWS.astype(np.float16), current)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[[1, 4]], current[[1, 4]])
    np.testing.assert_array_equal(out[[0, 2, 3]], [[6, 7], [0, 1], [4, 5]])


def test_slice_keep_has_the_targets_dtype():
    out = Slice("b", axis=0).apply(np.array([1, 2], np.float16), np.full(3, 0.1, np.float64))
    assert out.dtype == np.float64 and out[2] == 0.1


def test_vocab_remap_1d_bias():
    bias = np.array([1.0, 2.0, 3.0, 4.0])
    out = VocabRemap("logits/bias", OLD, NEW, axis=0).apply(bias, None)
    np.testing.assert_array_equal(out, [4.0, 0.0, 1.0, 3.0, 0.0])


def test_vocab_remap_does_not_change_its_inputs():
    value, current = ROWS.copy(), np.full((5, 2), -1, np.float32)
    VocabRemap("embed", OLD, NEW, init="keep").apply(value, current)
    np.testing.assert_array_equal(value, ROWS)
    np.testing.assert_array_equal(current, np.full((5, 2), -1))


def test_vocab_remap_string_tensor_new_rows_are_empty_bytes():
    value = np.array([b"A", b"B", b"C", b"D"], dtype=object)
    out = VocabRemap("names", OLD, NEW).apply(value, None)
    assert out.tolist() == [b"D", b"", b"A", b"C", b""]


def test_vocab_remap_reads_files(tmp_path):
    old = write(tmp_path / "old.txt", "a\nb\nc\nd\n")
    new = write(tmp_path / "new.txt", "d\nx\na\nc\ny")  # no final newline
    t = VocabRemap("embed", old, new)
    assert t.old_vocab == old and t.new_tokens == tuple(NEW)
    np.testing.assert_array_equal(t.apply(ROWS, None), [[6, 7], [0, 0], [0, 1], [4, 5], [0, 0]])


def test_vocab_remap_accepts_pathlike(tmp_path):
    p = tmp_path / "v.txt"
    write(p, "a\nb\n")
    assert VocabRemap("e", p, ["b"]).old_vocab == str(p)


def test_read_vocab_strips_only_the_line_end(tmp_path):
    p = write(tmp_path / "v.txt", "\ufeffthe\r\nnew york\n  spaced  \n\n")
    assert read_vocab(p) == ("the", "new york", "  spaced  ", "")


def test_vocab_remap_output_shape_is_new_vocab_size_along_axis():
    assert VocabRemap("e", OLD, NEW).output_shape((4, 8), (5, 8)) == (5, 8)
    assert VocabRemap("k", OLD, NEW, axis=1).output_shape((8, 4), (8, 5)) == (8, 5)


def test_vocab_remaps_with_the_same_spec_are_equal_and_hashable():
    a, b = VocabRemap("e", OLD, NEW), VocabRemap("e", list(OLD), tuple(NEW))
    assert a == b and hash(a) == hash(b)
    assert a != VocabRemap("e", OLD, NEW, init="keep")


def test_vocab_remap_applies_to_glob():
    t = VocabRemap("model/*/embeddings", OLD, NEW)
    assert t.applies_to("model/embed/embeddings") and not t.applies_to("model/embed/bias")


# --------------------------------------------------------------------------------------------
# VocabRemap errors


def test_vocab_file_duplicate_token_names_file_and_lines(tmp_path):
    p = write(tmp_path / "v1.txt", "a\nb\nc\nb\n")
    with pytest.raises(TransformError) as e:
        VocabRemap("embed", p, NEW)
    assert str(e.value) == (f"vocab file '{p}' has the duplicate token 'b' on lines 2 and 4; "
                            "every token must be unique.")
    assert e.value.path == p and e.value.line == 4


def test_vocab_file_several_duplicates_are_counted(tmp_path):
    p = write(tmp_path / "v1.txt", "a\na\nb\nb\nc\nc\n")
    with pytest.raises(TransformError, match=r"'a' on lines 1 and 2 \(2 more duplicates follow\)"):
        read_vocab(p)


def test_vocab_list_duplicate_token_names_positions():
    with pytest.raises(TransformError) as e:
        VocabRemap("embed", OLD, ["x", "y", "x"])
    assert str(e.value) == ("vocab remap of 'embed': new_vocab has the duplicate token 'x' on "
                            "positions 0 and 2; every token must be unique.")


def test_vocab_file_missing(tmp_path):
    p = str(tmp_path / "nope.txt")
    with pytest.raises(TransformError, match=f"vocab file '{p}' does not exist"):
        VocabRemap("embed", p, NEW)


def test_vocab_file_is_a_directory(tmp_path):
    with pytest.raises(TransformError, match="is a directory; expected a text file"):
        read_vocab(tmp_path)


def test_vocab_file_empty(tmp_path):
    p = write(tmp_path / "v.txt", "")
    with pytest.raises(TransformError, match=f"vocab file '{p}' is empty"):
        read_vocab(p)


def test_vocab_file_not_utf8_names_the_line(tmp_path):
    p = write(tmp_path / "v.txt", b"ok\n\xff\n")
    with pytest.raises(TransformError, match=r"is not valid UTF-8: line 2 has the byte b'\\xff'") as e:
        read_vocab(p)
    assert e.value.line == 2


def test_vocab_list_empty():
    with pytest.raises(TransformError, match="old_vocab is an empty list"):
        VocabRemap("embed", [], NEW)


def test_vocab_spec_wrong_type():
    with pytest.raises(TransformError, match="new_vocab must be a vocabulary file path or a list of "
                                             "token strings, received int 3"):
        VocabRemap("embed", OLD, 3)


def test_vocab_checkpoint_with_fewer_rows_than_the_old_vocab_names_both_numbers():
    t = VocabRemap("embed", OLD, NEW)
    with pytest.raises(TransformError) as e:
        t.apply(np.zeros((3, 2)), None)
    assert str(e.value) == (
        "vocab remap of 'embed': the checkpoint tensor has 3 rows along axis 0 (shape "
        "(3, 2)) but the old vocabulary (a list) has 4 tokens; it must have at least one per "
        "token (is old_vocab the vocabulary this checkpoint was trained with? old_vocab_size=N "
        "uses its first N tokens).")
    assert e.value.target == "embed"


def test_vocab_size_mismatch_names_the_file(tmp_path):
    p = write(tmp_path / "v1.txt", "a\nb\n")
    with pytest.raises(TransformError, match=f"old vocabulary '{p}' has 2 tokens"):
        VocabRemap("embed", p, NEW).output_shape((1,))


def test_vocab_axis_out_of_range():
    with pytest.raises(TransformError, match=r"axis 1 is out of range for the checkpoint tensor of shape \(4,\)"):
        VocabRemap("b", OLD, NEW, axis=1).output_shape((4,))


def test_vocab_keep_without_current_value_is_an_error():
    with pytest.raises(TransformError, match="with init='keep' needs the target's current value"):
        VocabRemap("embed", OLD, NEW, init="keep").apply(ROWS, None)


def test_vocab_keep_current_value_of_wrong_shape():
    with pytest.raises(TransformError, match=r"current value has shape \(4, 2\), expected \(5, 2\)"):
        VocabRemap("embed", OLD, NEW, init="keep").apply(ROWS, ROWS)


def test_vocab_bad_init_suggests():
    with pytest.raises(TransformError) as e:
        VocabRemap("embed", OLD, NEW, init="zero")
    assert str(e.value) == ("vocab remap of 'embed': init must be 'zeros', 'keep' or 'ones' (or a callable "
                            "backup initializer), received "
                            "'zero'. Did you mean 'zeros'?")


@pytest.mark.parametrize("axis", [-1, 1.0, True, "0"])
def test_vocab_bad_axis(axis):
    with pytest.raises(TransformError, match="axis must be a non-negative integer"):
        VocabRemap("embed", OLD, NEW, axis=axis)


def test_vocab_empty_target():
    with pytest.raises(TransformError, match="target must be a non-empty variable name or glob"):
        VocabRemap("", OLD, NEW)


def test_transform_error_is_a_rule_error():
    assert issubclass(TransformError, RuleError)
    assert issubclass(TransformError, CkptMergeError) and issubclass(TransformError, ValueError)


# --------------------------------------------------------------------------------------------
# VocabRemap describe


def test_vocab_describe_counts_with_thousands_separators():
    old = [f"t{i}" for i in range(10_000)]
    new = old[:4999] + old[5001:] + ["new1", "new2"]  # 2 dropped, 2 added
    t = VocabRemap("embed", old, new)
    assert t.describe() == ("vocab remap axis 0: 9,998 of 10,000 old tokens kept, "
                            "2 new tokens (zeros), 2 dropped")
    assert (t.num_kept, t.num_added, t.num_dropped) == (9998, 2, 2)


def test_vocab_describe_keep_and_singular():
    t = VocabRemap("embed", ["a"], ["a", "b"], axis=1, init="keep")
    assert t.describe() == ("vocab remap axis 1: 1 of 1 old token kept, "
                            "1 new token (target's current value), 0 dropped")


def test_vocab_to_dict():
    assert VocabRemap("e", ["a"], ["b"]).to_dict() == {
        "kind": "vocab", "target": "e", "old_vocab": ["a"], "new_vocab": ["b"], "axis": 0,
        "init": "zeros"}


# --------------------------------------------------------------------------------------------
# Slice


def test_slice_grow_keeps_the_rest_of_the_target():
    value = np.array([[1, 2], [3, 4]], np.float32)
    current = np.full((2, 4), 9, np.float32)
    out = Slice("head/kernel", axis=1).apply(value, current)
    np.testing.assert_array_equal(out, [[1, 2, 9, 9], [3, 4, 9, 9]])
    np.testing.assert_array_equal(current, np.full((2, 4), 9))  # input untouched


def test_slice_grow_zeros_with_target_shape_only():
    value = np.array([1, 2, 3], np.int64)
    out = Slice("head/bias", axis=0, init="zeros").apply(value, None, target_shape=(5,))
    np.testing.assert_array_equal(out, [1, 2, 3, 0, 0])
    assert out.dtype == np.int64


def test_slice_shrink_copies_the_first_entries():
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = Slice("head/kernel", axis=0).apply(value, np.zeros((2, 4), np.float32))
    np.testing.assert_array_equal(out, [[0, 1, 2, 3], [4, 5, 6, 7]])


def test_slice_same_size_copies_everything():
    value = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(Slice("k", axis=1).apply(value, np.zeros((2, 3))), value)


def test_slice_output_shape_is_the_target_shape():
    assert Slice("k", axis=1).output_shape((64, 10), (64, 12)) == (64, 12)


def test_slice_other_axis_differs_is_an_error():
    with pytest.raises(TransformError) as e:
        Slice("head/kernel", axis=1).output_shape((3, 10), (4, 12))
    assert str(e.value) == ("slice of 'head/kernel' along axis 1: the checkpoint tensor (3, 10) "
                            "and the target (4, 12) also differ along axis 0; a slice may change "
                            "one axis only.")


def test_slice_rank_differs_is_an_error():
    with pytest.raises(TransformError, match=r"has shape \(3,\) and the target \(3, 1\); a slice "
                                             "needs the same number of dimensions"):
        Slice("b", axis=0).output_shape((3,), (3, 1))


def test_slice_axis_out_of_range():
    with pytest.raises(TransformError, match=r"axis 2 is out of range for shape \(3, 4\)"):
        Slice("k", axis=2).output_shape((3, 4), (3, 4))


def test_slice_needs_a_target_shape():
    with pytest.raises(TransformError, match="slice of 'k' needs the target's shape"):
        Slice("k", axis=0, init="zeros").apply(np.ones(3), None)


def test_slice_keep_needs_the_current_value():
    with pytest.raises(TransformError, match="slice of 'k' with init='keep' needs the target's current value"):
        Slice("k", axis=0).apply(np.ones(3), None, target_shape=(4,))


def test_slice_bad_init_suggests():
    with pytest.raises(TransformError, match=r"init must be 'keep' or 'zeros', received 'kep'. "
                                             r"Did you mean 'keep'\?"):
        Slice("k", axis=0, init="kep")


def test_slice_describe_texts():
    assert Slice("k", axis=1).describe((64, 10), (64, 12)) == (
        "slice axis 1: 10 of 12 columns copied, 2 keep the target's current value")
    assert Slice("k", axis=1, init="zeros").describe((64, 10), (64, 12)) == (
        "slice axis 1: 10 of 12 columns copied, 2 zeros")
    assert Slice("k", axis=0).describe((13, 4), (12, 4)) == (
        "slice axis 0: 12 of 12 rows copied (checkpoint rows 0..11 of 13), 1 checkpoint row dropped")
    assert Slice("b", axis=0).describe((10,), (1_000,)) == (
        "slice axis 0: 10 of 1,000 entries copied, 990 keep the target's current value")
    assert Slice("k", axis=1).describe() == (
        "slice axis 1: overlap copied, the rest keeps the target's current value")
    assert Slice("k", axis=1, init="zeros").describe() == "slice axis 1: overlap copied, the rest zeros"


def test_slice_to_dict():
    assert Slice("k", 1).to_dict() == {"kind": "slice", "target": "k", "axis": 1, "init": "keep"}


# --------------------------------------------------------------------------------------------
# chains


def test_select_keeps_order_and_matches_globs():
    a, b, c = Slice("head/*", 0), Slice("enc/k", 1), VocabRemap("head/bias", ["x"], ["x"])
    assert select([a, b, c], "head/bias") == [a, c]
    assert select([a, b, c], "other") == []


def test_chain_vocab_then_slice():
    # 4 classes in the old vocab, 5 in the new; the target also has 2 extra feature columns.
    vocab = VocabRemap("head/kernel", OLD, NEW, axis=0)
    grow = Slice("head/kernel", axis=1, init="zeros")
    assert chain_output_shape([vocab, grow], (4, 2), (5, 3)) == (5, 3)
    out = chain_apply([vocab, grow], ROWS, None, target_shape=(5, 3))
    np.testing.assert_array_equal(out, [[6, 7, 0], [0, 0, 0], [0, 1, 0], [4, 5, 0], [0, 0, 0]])


def test_chain_of_nothing_is_identity():
    assert chain_output_shape([], (2, 3), (9, 9)) == (2, 3)
    assert chain_apply([], ROWS) is ROWS


# --------------------------------------------------------------------------------------------
# casts


def test_cast_float16_to_float32_is_exact():
    v = np.array([1.5, -0.0009765625, 65504], np.float16)
    out = cast_array(v, "float32")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.5, -0.0009765625, 65504])


def test_cast_float32_to_bfloat16_rounds_to_nearest_even():
    # 1 + 2**-8 is halfway between 1 and 1 + 2**-7: ties go to even (1.0); 1 + 3 * 2**-9 rounds up.
    out = cast_array(np.array([1.00390625, 1.005859375, np.nan], np.float32), "bfloat16")
    assert dtype_name(out.dtype) == "bfloat16"
    back = out.astype(np.float32)
    assert back[0] == 1.0 and back[1] == 1.0078125 and np.isnan(back[2])


def test_cast_bfloat16_to_float16_and_float32():
    b = cast_array(np.array([2.5, -3.0], np.float32), "bfloat16")
    np.testing.assert_array_equal(cast_array(b, "float16"), np.array([2.5, -3.0], np.float16))
    assert cast_array(b, "float32").dtype == np.float32


def test_cast_int64_to_bfloat16():
    out = cast_array(np.array([3, 257], np.int64), "bfloat16")
    np.testing.assert_array_equal(out.astype(np.float32), [3, 256])  # 257 needs 9 bits


def test_cast_float32_to_float16_overflows_to_inf():
    with np.errstate(over="ignore"):
        out = cast_array(np.array([70000.0], np.float32), "float16")
    assert np.isinf(out[0])


def test_cast_same_dtype_returns_the_array():
    v = np.ones(3, np.float32)
    assert cast_array(v, "float32") is v


def test_cast_bytes_array_to_string_gives_object_array():
    assert cast_array(np.array([b"a"]), "string").dtype == object


@pytest.mark.parametrize("src,dst", [("string", "float32"), ("int64", "string")])
def test_cast_between_string_and_number_is_an_error(src, dst):
    value = np.array([b"a"], dtype=object) if src == "string" else np.array([1], np.int64)
    with pytest.raises(TransformError) as e:
        cast_array(value, dst)
    assert str(e.value) == f"cannot cast {src} to {dst}: strings and numbers do not convert into each other."


def test_cast_complex_to_real_is_an_error():
    with pytest.raises(TransformError, match="cannot cast complex64 to float32: the imaginary part would be lost"):
        cast_array(np.array([1 + 2j], np.complex64), "float32")


def test_cast_unknown_dtype_suggests():
    with pytest.raises(TransformError, match=r"unknown dtype 'flaot32'; expected one of .*Did you mean 'float32'\?"):
        cast_array(np.ones(1), "flaot32")


def test_cast_problem_allows_numeric_casts():
    assert cast_problem("float16", "float32") is None
    assert cast_problem("bool", "int32") is None
    assert cast_problem("float32", "complex64") is None
    assert cast_problem("qint8", "float32") == "cannot cast qint8 to float32: unknown dtype 'qint8'"


def test_numpy_dtype_names():
    assert numpy_dtype("string") == np.dtype(object)
    assert dtype_name(numpy_dtype("bfloat16")) == "bfloat16"
    assert dtype_name(np.dtype("S3")) == "string"


# -- VocabInfo semantics: OOV rows, vocabulary sizes, OOV buckets, backup initializers --------


def test_vocab_checkpoint_with_more_rows_than_the_old_vocab_is_legal():
    with_oov_row = np.vstack([ROWS, [[99, 99]]])  # an Estimator checkpoint's OOV row
    out = VocabRemap("embed", OLD, NEW).apply(with_oov_row, None)
    np.testing.assert_array_equal(out, VocabRemap("embed", OLD, NEW).apply(ROWS, None))


def test_vocab_old_vocab_size_uses_the_first_tokens_only():
    out = VocabRemap("embed", OLD, NEW, old_vocab_size=2).apply(ROWS, None)
    # only a and b are old tokens now: d and c count as new
    np.testing.assert_array_equal(out, [[0, 0], [0, 0], [0, 1], [0, 0], [0, 0]])


def test_vocab_new_vocab_size_and_oov_buckets_give_the_output_size():
    t = VocabRemap("embed", OLD, NEW, new_vocab_size=3, num_oov_buckets=2, init="ones")
    assert t.output_shape((4, 2)) == (5, 2)
    np.testing.assert_array_equal(t.apply(ROWS, None), [[6, 7], [1, 1], [0, 1], [1, 1], [1, 1]])
    assert t.describe() == ("vocab remap axis 0: 2 of 4 old tokens kept, 1 new token, 2 OOV buckets "
                            "(ones), 2 dropped")


def test_vocab_callable_backup_initializer_fills_new_rows_and_oov_buckets():
    seen = []

    def backup(shape, dtype):
        seen.append((shape, dtype))
        return np.full(shape, 0.5)
    out = VocabRemap("embed", OLD, NEW, init=backup, num_oov_buckets=1).apply(ROWS.astype(np.float32), None)
    assert seen == [((6, 2), "float32")] and out.dtype == np.float32
    np.testing.assert_array_equal(out[[1, 4, 5]], np.full((3, 2), 0.5))
    np.testing.assert_array_equal(out[[0, 2, 3]], [[6, 7], [0, 1], [4, 5]])


def test_vocab_backup_initializer_of_the_wrong_shape_is_an_error():
    t = VocabRemap("embed", OLD, NEW, init=lambda shape, dtype: np.zeros(3))
    with pytest.raises(TransformError, match=r"backup initializer gave shape \(3,\), expected \(5, 2\)"):
        t.apply(ROWS, None)


@pytest.mark.parametrize("option,value,message", [
    ("old_vocab_size", 5, "old_vocab_size must be -1 \\(all\\), or an integer from 1 to the vocabulary's 4 tokens"),
    ("old_vocab_size", 0, "old_vocab_size must be"),
    ("new_vocab_size", 6, "new_vocab_size must be an integer from 1 to the vocabulary's 5 tokens"),
    ("num_oov_buckets", -1, "num_oov_buckets must be an integer >= 0"),
])
def test_vocab_bad_sizes_are_errors(option, value, message):
    with pytest.raises(TransformError, match=message):
        VocabRemap("embed", OLD, NEW, **{option: value})


def test_vocab_old_vocab_size_minus_one_means_all():
    assert VocabRemap("embed", OLD, NEW, old_vocab_size=-1).old_tokens == tuple(OLD)


def test_vocab_sizes_round_trip_through_to_dict():
    t = VocabRemap("embed", OLD, NEW, old_vocab_size=3, new_vocab_size=4, num_oov_buckets=1)
    d = t.to_dict()
    assert (d["old_vocab_size"], d["new_vocab_size"], d["num_oov_buckets"]) == (3, 4, 1)


def test_transform_errors_escape_the_target_name():
    # a name from a downloaded config may hold control characters: one visible line, no raw newline
    from ckptmerge.planning.transforms import Slice, TransformError

    with pytest.raises(TransformError) as e:
        Slice("head/\nkernel\x1b[2J", axis=-1)
    assert "\n" not in str(e.value) and "\x1b" not in str(e.value)
    assert "head/\\nkernel" in str(e.value)
