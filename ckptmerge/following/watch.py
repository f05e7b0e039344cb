"""Follow a training run: each new complete checkpoint of a directory as it arrives, pinned.

:func:`watch` is ``tf.train.checkpoints_iterator`` done right. It yields a
:class:`~ckptmerge.sources.resolved.CheckpointInfo` for every new checkpoint of a directory (or a
URL), in strictly increasing step order, each only once it is complete, and holds each one
(:mod:`ckptmerge.following.pins`) until the caller asks for the next, so a trainer's cleanup cannot
delete it mid-read. What it guarantees:

- **Complete, never torn.** A checkpoint is yielded only when every file is whole and it opens
  with its own reader (:mod:`ckptmerge.following.scan`); one still being written, or copied
  shard by shard in any order, is waited for: never yielded, never an error.
- **None skipped** (``backlog="all"``, the default). The first look pins every complete
  checkpoint there before the first one is yielded, and a thread goes on looking while the
  caller works, pinning each complete checkpoint as soon as it sees it, so a checkpoint deleted
  by ``max_to_keep`` after it was seen is still yielded, readable. Only a checkpoint written and
  deleted between two looks is never seen (with notifications a look follows each finished file
  within milliseconds); one seen but gone before its pin is reported by name. ``backlog="latest"``
  is TF's behaviour: only the newest, older ones dropped.
- **Only the run's own files**: a checkpoint with a file that leads outside the directory (a
  symbolic link out of it, anywhere below a step folder too) is never read: it is reported and
  skipped, as is a step held by two checkpoints (``model-007`` beside ``model-7``), naming both.
- **New means a higher step**, not another path: steps are the numbers checkpoints are named by
  (``ckpt-10``, ``checkpoint-500/``); a lower step completing late is not yielded after a higher.
  While a lower step is still being written (its files changed in the last :data:`HOLD_BACK`
  seconds) a complete higher one waits for it.
- **Bad ones are reported and skipped**: a checkpoint whose files are all there but do not read,
  and stay so, goes to ``on_skip`` (or a warning), and watching goes on.
- **Cheap when idle**: one directory listing per look; looks back off from a few milliseconds
  after activity to ``poll`` seconds when nothing happens; local directories also wake on
  file-system notifications (Linux ``inotify``), so a finished file is seen at once.
- ``timeout`` bounds the wait for the next checkpoint; ``timeout_fn`` is called only then: a
  true result stops, a false one waits another ``timeout`` (TensorFlow's semantics).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from ..core.args import check_callable, check_path
from ..core.errors import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    CkptMergeError,
    ResourceLimitError,
)
from ..formats.io import storage
from ..formats.io.notify import Waker
from ..core.redact import get_logger
from ..core.text import quote_name, quoted_command
from .pins import FilesChanged, LinksImpossible, Pin, PinFolders, pin_of
from ..sources.resolved import CheckpointInfo
from .scan import COMPLETE, FAILING, INCOMPLETE, Candidate, Listing, check, scan

__all__ = ["watch", "watch_checked", "check_watch_options", "intact", "BACKLOGS", "HOLD_BACK", "SETTLE",
           "WATCH_OPTIONS"]

logger = get_logger(__name__)

#: The values of ``backlog``.
BACKLOGS = ("all", "latest")
#: Seconds a lower step whose files are still changing holds back a complete higher step.
HOLD_BACK = 60.0
#: Seconds (at least; two polls when ``poll`` is longer) a checkpoint whose files are all there
#: but do not read must stay unchanged before it is reported as damaged and skipped.
SETTLE = 1.0
#: The keyword arguments of :func:`watch` (``Restorer.follow`` passes them on).
WATCH_OPTIONS = ("after", "backlog", "until_step", "timeout", "timeout_fn", "poll", "on_skip", "notify")
# The shortest wait between two looks (right after something changed), local and remote.
_FAST_LOCAL, _FAST_REMOTE = 0.01, 0.25
# Seconds close() waits for the looking thread (it may be in the middle of reading a remote index).
_JOIN_TIMEOUT = 30.0

SkipCallback = Callable[[CheckpointInfo, BaseException], None]
# What a look did with a checkpoint; and the verdict of one found complete but gone before its pin.
_QUEUED, _CHANGED, _VANISHED = "queued", "changed", "vanished"


def _number(value: Any, name: str, *, positive: bool, optional: bool) -> Optional[float]:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ArgumentTypeError(f"{name} must be a number of seconds. Received: {name}={value!r:.60}")
    if value < 0 or (positive and value == 0):
        raise ArgumentError(f"{name} must be {'positive' if positive else 'zero or more'}. Received: {name}={value!r}")
    return float(value)


def _step_arg(value: Any, name: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, CheckpointInfo):
        value = value.step
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be a step (an int) or None. Received: {name}={value!r:.60}")
    return value


def check_watch_options(directory: Any, *, after: Any = None, backlog: str = "all", until_step: Any = None,
                        timeout: Any = None, timeout_fn: Any = None, poll: Any = 1.0, on_skip: Any = None,
                        notify: bool = True) -> Dict[str, Any]:
    """Validate :func:`watch`'s arguments; return them checked (``directory`` absolute or a URL).

    Raises:
        ArgumentError: a value out of range, or ``directory`` is a file or a checkpoint prefix.
        ArgumentTypeError: a value of the wrong type.

    Example:
        >>> check_watch_options("runs/A", poll=0.5)["poll"]
        0.5
    """
    given = check_path(directory, "directory")
    if backlog not in BACKLOGS:
        raise ArgumentError(f"backlog must be one of {', '.join(map(repr, BACKLOGS))}. Received: backlog={backlog!r:.60}")
    check_callable(timeout_fn, "timeout_fn")
    check_callable(on_skip, "on_skip")
    if not isinstance(notify, bool):
        raise ArgumentTypeError(f"notify must be True or False. Received: notify={notify!r:.60}")
    if storage.is_url(given):
        storage.filesystem(given)  # a missing filesystem package is an error now, not at the first look
        where = storage.strip_slash(given)
    else:
        where = os.path.abspath(given)
        if os.path.isfile(given + ".index") and not os.path.isdir(given):
            raise ArgumentError(
                f"{quote_name(given)} is a checkpoint prefix, not a directory. Watch its directory "
                f"({quoted_command('watch', os.path.dirname(given) or '.')}).")
        if os.path.exists(given) and not os.path.isdir(given):
            raise ArgumentError(f"{quote_name(given)} is not a directory: watch follows the directory a trainer "
                                "saves its checkpoints to (it may not exist yet).")
    return dict(directory=where, given=given, after=_step_arg(after, "after"), backlog=backlog,
                until_step=_step_arg(until_step, "until_step"),
                timeout=_number(timeout, "timeout", positive=False, optional=True), timeout_fn=timeout_fn,
                poll=_number(poll, "poll", positive=True, optional=False), on_skip=on_skip, notify=notify)


def watch(directory: Any, *, after: Optional[int] = None, backlog: str = "all", until_step: Optional[int] = None,
          timeout: Optional[float] = None, timeout_fn: Optional[Callable[[], bool]] = None, poll: float = 1.0,
          on_skip: Optional[SkipCallback] = None, notify: bool = True) -> Iterator[CheckpointInfo]:
    """Yield each new complete checkpoint of ``directory`` as it arrives, in increasing step order.

    Each :class:`~ckptmerge.CheckpointInfo` is pinned until the loop asks for the next one:
    read it from ``info.read_path`` (its hard-linked copy, when ``info.pinned`` is set) and the
    trainer's cleanup cannot take it away meanwhile. See the module docstring for the guarantees
    and docs/restoring-many-times.md for examples.

    Args:
        directory: a training directory or a URL (``s3://bucket/run``); it may not exist yet.
            TF bundles (``ckpt-10.index`` + shards), Keras ``ckpt-10.weights.h5`` / ``.keras``
            files, ``model-10.safetensors`` files and step folders (``checkpoint-500/``) are
            followed; checkpoints without a step in their name are not (a warning says so).
        after: yield only steps above this one (a step or a ``CheckpointInfo``).
        backlog: ``"all"`` (default): every checkpoint there is and comes, oldest first;
            ``"latest"``: only the newest at each step of the loop (TF's behaviour).
        until_step: stop after yielding a checkpoint of this step or a higher one.
        timeout: stop when no new checkpoint came for this many seconds (``None``: wait forever;
            ``0``: look once).
        timeout_fn: called on a timeout only: return True to stop, False to wait another
            ``timeout`` (TF's ``checkpoints_iterator`` semantics).
        poll: the longest wait between two looks, in seconds (looks come faster right after a
            change and back off to this when nothing happens).
        on_skip: ``on_skip(info, error)`` for each checkpoint skipped (damaged, or deleted
            before it could be pinned); default: a logged warning.
        notify: wake on file-system notifications where available (local directories, Linux).

    Yields:
        :class:`~ckptmerge.CheckpointInfo`, with ``pinned`` set while it is held by links or
        in memory.

    Raises:
        ArgumentError, ArgumentTypeError: bad arguments (raised by this call, before the loop).
        OSError: the directory cannot be listed (permissions).
        CheckpointFormatError: a timeout came while the store kept failing (the last error).

    Example:
        >>> for info in watch("runs/A", timeout=600):        # doctest: +SKIP
        ...     evaluate(info.read_path, info.step)
    """
    opts = check_watch_options(directory, after=after, backlog=backlog, until_step=until_step, timeout=timeout,
                               timeout_fn=timeout_fn, poll=poll, on_skip=on_skip, notify=notify)
    return watch_checked(opts)


def watch_checked(options: Dict[str, Any]) -> Iterator[CheckpointInfo]:
    """:func:`watch` of options :func:`check_watch_options` returned (for callers that check them
    before they start, as ``Restorer.follow`` does).

    Example:
        >>> loop = watch_checked(check_watch_options("runs/A", timeout=0))  # doctest: +SKIP
    """
    return _Watch(options).iterate()


def intact(info: CheckpointInfo) -> bool:
    """Whether a checkpoint a :func:`watch` loop yielded can still be read whole: its pin holds
    every file as it was (pinned), or it is still there and complete (object storage).

    Example:
        >>> for info in watch("runs/A", timeout=0):   # doctest: +SKIP
        ...     assert intact(info)
    """
    if info.pinned:
        pin = pin_of(info.pinned)
        return pin is not None and not pin.missing()
    try:
        listing = scan(storage.dirname(info.path), None if info.step is None else info.step - 1)
        c = listing.candidates.get(info.path)
        return c is not None and check(c)[0] == COMPLETE
    except ResourceLimitError:  # out of open files or memory: not this file's fault, never skipped
        raise
    except (CkptMergeError, OSError):
        return False


@dataclass
class _Ready:
    """A complete checkpoint waiting in the queue, pinned (or to be read into memory)."""

    cand: Candidate
    fmt: str
    pin: Optional[Pin]
    needs_bytes: bool = False


@dataclass
class _State:
    """What the watcher knows of a checkpoint it has seen but not queued."""

    step: int
    sig: Any
    verdict: str
    detail: Any
    since: float  # monotonic: when this signature was first seen
    first: float  # monotonic: when the checkpoint was first seen
    newest: float  # epoch seconds: its newest file
    changes: int = 0
    final: bool = False  # reported (damaged, deleted, given up): never looked at again


class _Watch:
    """The state of one :func:`watch` loop: a looking thread, a queue of pinned checkpoints."""

    def __init__(self, o: Dict[str, Any]) -> None:
        self.directory: str = o["directory"]
        self.given: str = o["given"]
        self.backlog: str = o["backlog"]
        self.until_step: Optional[int] = o["until_step"]
        self.timeout: Optional[float] = o["timeout"]
        self.timeout_fn = o["timeout_fn"]
        self.poll: float = o["poll"]
        self.on_skip = o["on_skip"]
        self.remote = storage.is_url(self.directory)
        self.fast = min(self.poll, _FAST_REMOTE if self.remote else _FAST_LOCAL)
        self.settle = max(SETTLE, 2 * self.poll)  # a failing checkpoint unchanged this long is damaged
        self._last: Optional[int] = o["after"]  # the last step yielded (or the floor given)
        self._cond = threading.Condition()
        self._queue: Dict[int, _Ready] = {}
        self._states: Dict[str, _State] = {}
        self._skips: List[Tuple[CheckpointInfo, BaseException]] = []
        self._warned: Set[str] = set()
        self._reported: Set[str] = set()  # paths reported once: a link out, a step held twice, vanished
        self._yielded: Optional[str] = None  # the path of the last step yielded
        self._error: Optional[BaseException] = None  # fatal: raised to the caller
        self._list_error: Optional[BaseException] = None  # the last look failed (transient)
        self._started = 0  # looks started
        self._done = 0  # the start number of the last look finished
        self._waker = Waker(notify=o["notify"] and not self.remote)
        self._pins = PinFolders(self.directory) if not self.remote else None
        self._thread: Optional[threading.Thread] = None

    # -- the caller's side -------------------------------------------------------------------------
    def iterate(self) -> Iterator[CheckpointInfo]:
        """The generator :func:`watch` returns; its ``close()`` (or the end of the loop) stops
        the looking thread and releases every pin."""
        self._thread = threading.Thread(target=self._run, name="ckptmerge-watch", daemon=True)
        self._thread.start()
        try:
            while True:
                deadline = None if self.timeout is None else time.monotonic() + self.timeout
                got = self._next(deadline)
                while got is None:  # timed out
                    if self._list_error is not None:
                        raise self._list_error
                    if self.timeout_fn is None or self.timeout_fn():
                        return
                    got = self._next(time.monotonic() + (self.timeout or 0.0))
                info, pin = got
                try:
                    yield info
                finally:
                    if pin is not None:
                        pin.release()
                if self.until_step is not None and info.step is not None and info.step >= self.until_step:
                    return
                self._waker.kick()  # look again now: the next one may be there already
        finally:
            self.close()

    def _next(self, deadline: Optional[float]) -> Optional[Tuple[CheckpointInfo, Optional[Pin]]]:
        """The next checkpoint to yield (pinned), or ``None`` at the deadline (after at least one
        look that started after this call)."""
        with self._cond:
            begun = self._started
        self._waker.kick()  # a look that starts now decides a timeout
        while True:
            with self._cond:
                if self._error is not None:
                    raise self._error
                if self._done == 0:  # the first look pins the whole backlog before anything is yielded
                    self._cond.wait(1.0)
                    continue
                ready, wake_at = (None, None) if self._skips else self._pick()
                skips, self._skips = self._skips, []
                if ready is None and not skips:
                    now = time.monotonic()
                    if deadline is not None and now >= deadline and self._done > begun:
                        return None
                    waits = [1.0] + [t - now for t in (deadline, wake_at) if t is not None]
                    self._cond.wait(max(0.001, min(waits)))
                    continue
            try:
                for info, err in skips:
                    self._report(info, err)
            except BaseException:
                if ready is not None:
                    _release(ready)
                raise
            if ready is None:
                continue
            pin = ready.pin
            if ready.needs_bytes:
                try:
                    pin = self._pins.read_bytes(ready.cand.path, ready.cand.files, self.directory)  # type: ignore[union-attr]
                except CheckpointNotFoundError as e:
                    self._report(self._info(ready.cand, None), e)
                    continue
            return self._info(ready.cand, pin), pin

    def _pick(self) -> Tuple[Optional[_Ready], Optional[float]]:
        """(under the lock) The queued checkpoint to yield now, or ``(None, when to look again)``
        while a lower step still being written holds it back."""
        if not self._queue:
            return None, None
        if self.backlog == "latest":
            top = max(self._queue)
            for step in [s for s in self._queue if s != top]:
                old = self._queue.pop(step)
                logger.debug("backlog='latest': step %s superseded by step %s", step, top)
                if old.pin is not None:
                    old.pin.release()
            ready = self._queue.pop(top)
        else:
            low = min(self._queue)
            now_m, now_w = time.monotonic(), time.time()
            blockers = [s for s in self._states.values()
                        if not s.final and s.verdict != COMPLETE and (self._last is None or s.step > self._last)
                        and s.step < low]
            alive = [b for b in blockers if _alive(b, now_m, now_w)]
            if alive:
                return None, min(_hold_ends(b, now_m, now_w) for b in alive)
            for key, b in [(k, s) for k, s in self._states.items() if s in blockers]:
                b.final = True
                self._skips.append((CheckpointInfo(key, b.step, b.newest, 0, False), CheckpointNotFoundError(
                    f"Checkpoint {quote_name(key)} (step {b.step}) stayed incomplete ({_detail(b)}) while step "
                    f"{low} is complete; it was skipped, as steps are yielded in increasing order.", path=key)))
            ready = self._queue.pop(low)
        self._last, self._yielded = ready.cand.step, ready.cand.path
        for key in [k for k, s in self._states.items() if s.step <= ready.cand.step]:
            del self._states[key]
        return ready, None

    def _info(self, c: Candidate, pin: Optional[Pin]) -> CheckpointInfo:
        pinned = pin.read_path if pin is not None and pin.how != "none" else None
        return CheckpointInfo(path=c.path, step=c.step, time=float(c.time or c.newest), size=c.size,
                              latest=self._is_latest(c.path), pinned=pinned)

    def _is_latest(self, path: str) -> bool:
        """Whether the directory's ``checkpoint`` state file names ``path`` as the latest."""
        try:
            if self.remote:
                from ..sources.listing import read_state_url

                state = read_state_url(self.directory)
            else:
                from ..sources.state import read_state

                state = read_state(self.directory, self.given)
        except ResourceLimitError:  # out of open files or memory: not this file's fault, never skipped
            raise
        except (CkptMergeError, OSError):
            return False
        latest = state.model_checkpoint_path if state is not None else None
        return bool(latest) and storage.strip_slash(latest) == storage.strip_slash(path)

    def _report(self, info: CheckpointInfo, err: BaseException) -> None:
        if self.on_skip is not None:
            self.on_skip(info, err)
        else:
            logger.warning("skipped %s: %s", info.path, err)

    def close(self) -> None:
        """Stop looking and release every pin (idempotent)."""
        self._waker.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_TIMEOUT)
        with self._cond:
            queued, self._queue = list(self._queue.values()), {}
        for r in queued:
            if r.pin is not None:
                r.pin.release()
        if self._pins is not None:
            self._pins.close()
        self._waker.close()

    # -- the looking thread ------------------------------------------------------------------------
    def _run(self) -> None:
        interval = self.fast
        failures = 0
        while not self._waker.stopped:
            with self._cond:
                self._started += 1
                number = self._started
            began = time.monotonic()
            changed = False
            try:
                changed = self._look()
                self._list_error, failures = None, 0
            except (ArgumentError, PermissionError) as e:  # not going to get better
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            except (CkptMergeError, OSError) as e:  # a store or a network that may come back
                failures += 1
                self._list_error = e
                if failures == 1:
                    logger.warning("watching %s: %s (looking again every %.3g s)", self.given, e, self.poll)
            except BaseException as e:  # noqa: BLE001 - a bug must reach the caller, not end a thread silently
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            with self._cond:
                self._done = number
                self._cond.notify_all()
            interval = self.fast if changed else min(interval * 2, self.poll)
            # looks start ``interval`` apart (the look's own time included), so a file that lands
            # just after a look is seen within one interval, plus the time to check it
            self._waker.wait(max(self.fast, interval - (time.monotonic() - began)))

    def _floor(self) -> Optional[int]:
        """(under the lock) Steps at or below this are of no interest any more."""
        floor = self._last
        if self.backlog == "latest" and self._queue:
            top = max(self._queue)
            floor = top if floor is None else max(floor, top)
        return floor

    def _look(self) -> bool:
        """One look: list, check what changed, pin and queue what is complete; True if anything
        changed (the next look comes soon)."""
        with self._cond:
            floor = self._floor()
            queued = {r.cand.path for r in self._queue.values()}
            last, yielded = self._last, self._yielded
        # (the last step yielded is looked at too: a second checkpoint of it is reported)
        listing = scan(self.directory, None if floor is None else floor - 1)
        if self._waker.notifying:
            self._waker.watch(self.directory if listing.exists else os.path.dirname(self.directory))
            for folder in listing.folders:
                self._waker.watch(folder)
        for name in sorted(listing.stepless - self._warned):
            self._warned.add(name)
            logger.warning("watching %s: %s has no step in its name (like ckpt-10), so it is not followed",
                           self.given, name)
        changed = False
        by_step: Dict[int, List[Candidate]] = {}
        for c in listing.candidates.values():
            by_step.setdefault(c.step, []).append(c)  # type: ignore[arg-type]
        with self._cond:  # forget what is gone; report what vanished after it was found complete
            for key in [k for k, s in self._states.items() if k not in listing.candidates]:
                s = self._states.pop(key)
                changed = True
                if s.verdict == _VANISHED and not s.final and (floor is None or s.step > floor):
                    self._reported.add(key)
                    self._skips.append((CheckpointInfo(key, s.step, s.newest, 0, False), s.detail))
            changed = self._report_listing(listing, by_step, floor, last, yielded) or changed
        order = sorted((c for c in listing.candidates.values() if (floor is None or c.step > floor)
                        and len(by_step[c.step]) == 1),  # type: ignore[index]
                       key=lambda c: c.step, reverse=self.backlog == "latest")
        for c in order:
            if c.path in queued:
                continue
            outcome = self._consider(c)
            changed = changed or outcome is not None
            if outcome == _QUEUED and self.backlog == "latest":
                break  # the newest complete one is queued: older ones do not matter
        return changed

    def _report_listing(self, listing: Listing, by_step: Dict[int, List[Candidate]], floor: Optional[int],
                        last: Optional[int], yielded: Optional[str]) -> bool:
        """(under the lock) Report, once each, what the look leaves out by name: checkpoints with
        a file that leads outside the directory, ones that vanished while they were looked at,
        steps held by two checkpoints (and a second checkpoint of the step just yielded)."""
        found = False

        def skip(path: str, step: Optional[int], err: BaseException) -> None:
            nonlocal found
            self._reported.add(path)
            self._skips.append((CheckpointInfo(path, step, 0.0, 0, False), err))
            found = True

        def above(step: Optional[int]) -> bool:
            return step is not None and (floor is None or step > floor)

        for u in listing.unsafe:
            if u.path not in self._reported and above(u.step):
                skip(u.path, u.step, u.error(self.given))
        for path, step in listing.vanished:
            if path not in self._reported and above(step) and path not in {r.cand.path for r in self._queue.values()}:
                skip(path, step, CheckpointNotFoundError(
                    f"Checkpoint {quote_name(path)} (step {step}) was deleted while it was being looked at, before it "
                    "could be pinned for reading; a trainer's cleanup (max_to_keep) removes old checkpoints. Keep more "
                    "checkpoints to read every one.", path=path))
        for step, cands in by_step.items():
            paths = sorted(c.path for c in cands)
            if step == last and yielded is not None:
                for p in paths:
                    if p != yielded and p not in self._reported:
                        skip(p, step, ArgumentError(
                            f"Checkpoint {quote_name(p)} is a second checkpoint of step {step}, which was yielded as "
                            f"{quote_name(yielded)}; it is not followed (one checkpoint per step). Move it out of "
                            f"{quote_name(self.given)}, or read it by its path."))
                continue
            if len(cands) < 2 or not above(step) or all(p in self._reported for p in paths):
                continue
            queued = self._queue.get(step)
            if queued is not None and queued.cand.path in paths:
                del self._queue[step]
                _release(queued)
            for p in paths:
                self._states.pop(p, None)
            err = ArgumentError(
                f"{len(paths)} checkpoints of step {step} in {quote_name(self.given)}: "
                f"{', '.join(quote_name(p) for p in paths)}. watch cannot tell which one is step {step}, so it "
                "follows neither; move the other out of the directory.")
            for p in paths:
                self._reported.add(p)
            skip(paths[0], step, err)
        return found

    def _consider(self, c: Candidate) -> Optional[str]:
        """Check ``c`` if it is new or changed and queue it when complete: ``_QUEUED``,
        ``_CHANGED``, or ``None`` when nothing changed."""
        now = time.monotonic()
        with self._cond:
            s = self._states.get(c.path)
            if s is not None and (s.final or s.sig == c.sig):
                if not s.final and s.verdict == FAILING and now - s.since >= self.settle:
                    s.final = True
                    self._skips.append((CheckpointInfo(c.path, c.step, c.newest, c.size, False),
                                        _damaged(c, s.detail)))
                    return _CHANGED
                return None
        verdict, detail, ready = self._pin_and_check(c)
        with self._cond:
            if ready is not None:
                self._states.pop(c.path, None)
                if self._last is not None and c.step <= self._last:
                    _release(ready)
                elif c.step in self._queue:
                    _release(ready)
                    if c.path not in self._warned:
                        self._warned.add(c.path)
                        logger.warning("watching %s: two checkpoints of step %d (%s and %s); following the first",
                                       self.given, c.step, self._queue[c.step].cand.path, c.path)
                else:
                    self._queue[c.step] = ready
                    self._cond.notify_all()
                    return _QUEUED
                return _CHANGED
            s = self._states.get(c.path)
            if s is None:
                s = self._states[c.path] = _State(c.step, c.sig, verdict, detail, now, now, c.newest)
            else:
                s.changes += 1
                s.sig, s.verdict, s.detail, s.since, s.newest = c.sig, verdict, detail, now, c.newest
            if verdict == INCOMPLETE:
                logger.debug("%s is not complete yet: %s", c.path, detail)
        return _CHANGED

    def _pin_and_check(self, c: Candidate) -> Tuple[str, Any, Optional[_Ready]]:
        """``(verdict, detail, ready)`` for ``c``. Local checkpoints are pinned first and checked
        through their pin: the same files, so what was found complete is what is held, and a
        cleanup can take a checkpoint away only before the look that sees it."""
        if not c.files:  # a step folder made, its first file not yet: nothing to pin or check
            return INCOMPLETE, "the folder is empty", None
        if self._pins is None:  # object storage: the pin is the bytes a restore reads
            verdict, detail = check(c)
            return verdict, detail, _Ready(c, detail, Pin(c.path, c.path, "none")) if verdict == COMPLETE else None
        try:
            pin = self._pins.link(c.path, c.files, self.directory)  # type: ignore[arg-type]
        except FilesChanged:
            return INCOMPLETE, "its files changed while it was being pinned", None
        except CheckpointNotFoundError as e:
            return _VANISHED, e, None
        except (LinksImpossible, OSError) as e:  # read its bytes when its turn comes
            if not isinstance(e, LinksImpossible):
                logger.info("cannot link %s for pinning (%s); its bytes will be read instead", c.path, e)
            verdict, detail = check(c)
            return verdict, detail, _Ready(c, detail, None, needs_bytes=True) if verdict == COMPLETE else None
        verdict, detail = check(_through(c, pin))
        if verdict == COMPLETE:
            return verdict, detail, _Ready(c, detail, pin)
        pin.release()  # (the reason names the trainer's files, not the pin's)
        return verdict, str(detail).replace(os.path.dirname(pin.read_path), os.path.dirname(c.path)), None


def _through(c: Candidate, pin: Pin) -> Candidate:
    """``c`` as its pin holds it: the same checkpoint under the pin folder's names."""
    return Candidate(pin.read_path, c.step, c.kind, c.format, {pin.files[f][0]: sig for f, sig in c.files.items()},
                     c.newest, c.time)


def _release(ready: _Ready) -> None:
    if ready.pin is not None:
        ready.pin.release()


def _alive(s: _State, now_m: float, now_w: float) -> bool:
    """Whether a checkpoint that is not complete is still being written: a file of it changed in
    the last :data:`HOLD_BACK` seconds (by its time on disk, or as the watcher saw it change)."""
    return now_w - s.newest < HOLD_BACK or (s.changes > 0 and now_m - s.since < HOLD_BACK)


def _hold_ends(s: _State, now_m: float, now_w: float) -> float:
    """When (monotonic) :func:`_alive` turns false for ``s`` if nothing changes."""
    by_disk = now_m + (HOLD_BACK - (now_w - s.newest))
    by_seen = s.since + HOLD_BACK if s.changes > 0 else now_m
    return max(by_disk, by_seen, now_m + 0.001)


def _detail(s: _State) -> str:
    return str(s.detail) if s.verdict == INCOMPLETE else f"it does not read: {s.detail}"


def _damaged(c: Candidate, err: Any) -> CheckpointFormatError:
    """The error reported for a checkpoint that does not read and stopped changing."""
    e = CheckpointFormatError(f"Checkpoint {quote_name(c.path)} (step {c.step}) cannot be read and its files "
                              f"stopped changing, so it was skipped: {err}", path=c.path)
    e.__cause__ = err if isinstance(err, BaseException) else None
    return e
