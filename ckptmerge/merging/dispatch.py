"""The one entry point of merges: :func:`merge` chooses the local or the remote path by the output.

A local prefix is written by :func:`ckptmerge.merging.local.merge_local` (per-tensor jobs, an
atomic publish); so is a ``file://`` URL, which is a local path (created folders, the local lock,
the atomic publish). Any other URL is merged into a local temporary prefix the same way, then
uploaded by :func:`ckptmerge.merging.remote.merge_to_url` (data first, the index last, the old
checkpoint readable until the new one is complete). Neither path imports the other.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence, Union

from ..core.errors import ArgumentError
from ..formats.io.storage import filesystem, is_url
from ..render.report import Report
from ..sources.opening import SourcesArg
from .local import MergeReport, Progress, TemplateArg, merge_local
from .remote import merge_to_url

__all__ = ["merge", "MergeReport"]


def merge(
    sources: SourcesArg,
    out_prefix: Union[str, "os.PathLike[str]"],
    *,
    template: TemplateArg = None,
    allow_missing: Union[str, Sequence[str]] = (),
    on_conflict: str = "error",
    on_shape_mismatch: str = "error",
    cast: bool = False,
    strict: bool = True,
    overwrite: bool = False,
    dry_run: bool = False,
    update_state: bool = False,
    progress: Optional[Progress] = None,
    verify: bool = True,
    durable: bool = False,
    format: Optional[str] = None,
    layout: Optional[str] = None,
    record_paths: bool = True,
) -> Report:
    """Write a new checkpoint assembled from ``sources``, without TensorFlow.

    The sources and their rules are those of :func:`ckptmerge.plan`; the plan is computed (and,
    with ``strict``, checked) before a single byte is written. See the module docstring for what
    the output holds with and without a template.

    Args:
        sources: :class:`~ckptmerge.Source` objects (or checkpoint paths), in priority order.
        out_prefix: the checkpoint prefix to write, e.g. ``"out/merged"`` writes
            ``out/merged.index`` and ``out/merged.data-00000-of-00001``; missing directories
            are created. It must not be a source's (or the template's) own prefix.
        template: ``None`` (write every name the sources produce); a checkpoint path (exactly its
            model variables; its values fill what no source provides and are the current values
            of ``init="keep"`` transforms); a list of :class:`~ckptmerge.VariableInfo` (exactly
            those names and shapes; unprovided names are left out and reported); or a built Keras
            model or ``tf.Module`` (its variables, as specs; Keras weights files among the sources
            are named by the model's own walk, as :func:`ckptmerge.plan` names them).
        allow_missing: glob(s) of template names no source needs to provide.
        on_conflict: ``"error"``, ``"first"`` or ``"last"`` when two sources or rules provide a name.
        on_shape_mismatch: ``"error"`` or ``"skip"`` (keep the template's value, or leave it out).
        cast: convert dtypes to the template's (e.g. float16 -> float32).
        strict: raise :class:`~ckptmerge.PlanError` for any finding other than ``unused``, before
            anything is written. ``False`` writes what matches and reports the rest.
        overwrite: replace an existing checkpoint at ``out_prefix``. At every instant, even if
            the merge is killed, the prefix reads as exactly the old or exactly the new
            checkpoint; of several merges racing to one prefix, the last to finish wins.
        dry_run: plan and report, write nothing.
        update_state: also write the output directory's ``checkpoint`` state file, naming the
            new checkpoint as the latest (earlier entries are kept), so ``tf.train.latest_checkpoint``
            finds it.
        progress: called as ``progress(done_bytes, total_bytes)`` once before the first tensor
            and after each tensor (bytes read from the sources).
        verify: check every CRC32C while reading (``False`` copies corrupt tensors as they are).
        durable: fsync every output file before it is renamed into place, so the checkpoint also
            survives a power loss (slower: it waits for the disk). Without it the output is still
            all-or-nothing for the process: a merge killed half-way leaves the prefix as it was.
        format: ``"tf"`` (a TF checkpoint), ``"safetensors"`` (one ``.safetensors`` file whose
            metadata records the sources and the plan), ``"orbax"`` (an Orbax checkpoint folder
            at ``out_prefix`` that Orbax's V1 ``load`` and V0 ``PyTreeCheckpointer`` restore, names
            split on ``/`` into the tree; see :mod:`ckptmerge.formats.orbax.writer`) or
            ``"keras-h5"`` (a Keras
            ``.weights.h5`` file: each name is a dataset path, as ckptmerge names the entries of
            a ``.weights.h5`` it reads, so ``model.load_weights`` reads it back; names of other
            formats are placed by a Keras model given as ``template``, as its ``save_weights``
            would write them, and without one the merge is refused before writing); default:
            ``"keras-h5"`` when ``out_prefix`` ends with ``.weights.h5``, ``"safetensors"`` when it
            ends with ``.safetensors``, else ``"tf"`` (a ``.keras`` output is refused: write the
            ``.weights.h5``, then ``model.save``).
        layout: ``"torch"``: the inverse of ``Source(layout="torch")``: write the sources' Keras/TF
            tensors under the template's PyTorch names, shapes and layouts (Linear weights
            transposed back, fused ``c_attn``/``qkv`` joined, attention heads reshaped, RNN gates
            in PyTorch order), paired by the planner and the structural alignment a forward
            restore runs. Needs a ``.safetensors`` output and a template: a PyTorch
            ``.safetensors`` file, a ``save_pretrained`` folder, or a list of
            :class:`~ckptmerge.VariableInfo`. Template tensors alignment leaves unresolved block
            the merge (``allow_missing`` lets named ones through: a template file's own values
            fill them, a template of specs leaves them out); ``num_batches_tracked`` comes from
            the template file (0 for specs). See docs/names.md.
        record_paths: whether a safetensors output's metadata records where each source was
            read from (its path, URL credentials redacted, and how it was resolved). ``False``
            keeps only each source's ``name`` (``source 1``, ... for unnamed ones): nothing about
            the machine or the storage the merge ran on. The other formats record neither.

    Returns:
        A :class:`MergeReport` (a :class:`~ckptmerge.render.report.Report` with ``mode="offline"``):
        ``restored`` lists the written names, ``skipped`` the names left out and why.

    Raises:
        OutputExistsError: a checkpoint (or leftover data files) exists at ``out_prefix`` and
            ``overwrite`` is False: raised before any checkpoint is read, or after writing when
            another run published there first (of racing merges without ``overwrite``, exactly
            one publishes).
        ArgumentError: ``out_prefix`` is a directory, ends with ``.index``, or is an input's prefix.
        PlanError: ``strict`` and the plan has findings (``e.plan`` has them all); nothing written.
        TransformError: a transform cannot run in this merge (a slice without a template, or
            ``init="keep"`` without a template checkpoint).
        CheckpointNotFoundError, CheckpointFormatError: a source cannot be found or is corrupt.
        CheckpointWriteError: the disk is full, a file is too large, or permission is denied;
            no file is left at ``out_prefix``.

    Example:
        >>> import ckptmerge as cm
        >>> from ckptmerge.merging.dispatch import merge
        >>> report = merge([cm.Source("runs/A", map={"encoder/": "model/encoder/"}),
        ...                 cm.Source("runs/B", include=["head/*"])],
        ...                "runs/C/merged")                               # doctest: +SKIP
        >>> print(report.summary())                                       # doctest: +SKIP
        wrote 6 variables from 2 sources to 'runs/C/merged' in 0.02 s
        >>> merge([cm.Source.from_values(backbone)], "out/model.safetensors", layout="torch",
        ...       template="hf/model.safetensors")                        # doctest: +SKIP
    """
    options = dict(template=template, allow_missing=allow_missing, on_conflict=on_conflict,
                   on_shape_mismatch=on_shape_mismatch, cast=cast, strict=strict, overwrite=overwrite,
                   dry_run=dry_run, update_state=update_state, progress=progress, verify=verify,
                   durable=durable, format=format, layout=layout, record_paths=record_paths)
    if is_url(out_prefix):
        url = os.fspath(out_prefix)
        fs, path = filesystem(url)
        if type(fs).__name__ == "LocalFileSystem":  # file://: a local path, with every local rule
            return dataclasses.replace(merge_local(sources, path, **options), output=url)
        if format == "orbax":
            raise ArgumentError(f"format='orbax' writes to a local folder; {url!r} is a URL. Merge "
                                "to a local folder, then copy it up (gsutil -m cp -r, aws s3 cp --recursive), the "
                                "commit_success.txt files last.")
        return merge_to_url(merge_local, sources, url, **options)  # merge locally, then upload
    return merge_local(sources, out_prefix, **options)
