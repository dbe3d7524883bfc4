"""Where independent tasks run: in this process, on a local process pool, or on a Ray cluster.

A sweep or an ensemble is many small tasks that all read the same large inputs (the prepared workload,
the arrival process, the models' predictions) and each return a small result. Every executor here runs
`fn(shared, task)` for each task and hands back the results in the tasks' order, whichever finished
first, so the answer does not depend on the executor. The shared inputs travel once per worker (the pool's
initializer; Ray's object store, fetched once per worker process), never once per task.

A task that raises (or whose worker dies) is retried `retries` times; if it still fails, its slot holds a
`TaskFailure` saying why, and the caller decides what that means (the sweep reports the scenario). No
executor waits forever on a lost task: Ray reports a dead worker as an error, and a broken local pool is
rebuilt with the unfinished tasks.

Ray is optional (`finetwin[ray]`): it is imported only when an address is given.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import forkserver, get_context
from multiprocessing.connection import Connection
from typing import Any, Protocol

from twin.lifeline import exit_now, lifeline, when_gone

log = logging.getLogger(__name__)

DEFAULT_RETRIES = 1

TaskFn = Callable[[Any, Any], Any]  # (shared inputs, task) -> result
Progress = Callable[[int, int], object]  # (tasks done, tasks in all)


class ExecutorUnavailable(RuntimeError):
    """The executor asked for cannot run here (Ray not installed, the address does not answer)."""


@dataclass(frozen=True)
class TaskFailure:
    """A task that failed on every attempt: the last error, as text (the exception may not unpickle)."""

    error: str
    attempts: int


class Executor(Protocol):
    name: str  # "local" or "ray": reported with the results
    workers: int  # how many tasks it runs at once (for choosing chunk sizes and in reports)

    def run(
        self, fn: TaskFn, shared: Any, tasks: Sequence[Any], *, progress: Progress | None = None
    ) -> list[Any]: ...


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}".rstrip(": ")


# --- local


_SHARED: Any = None  # a pool worker's copy of the shared inputs (set once by the initializer)


def _init_worker(shared: Any) -> None:
    global _SHARED
    _SHARED = shared


# How much lower than the rest the workers of the pools made from now on run (`os.nice`): 0 for a command,
# whose runs are what its user waits for; the API's (`set_worker_niceness`), whose standing forecast,
# steering runs and plans share the cores with the requests it answers.
_worker_niceness = 0


def worker_niceness() -> int:
    """How much lower than the rest the workers of the pools made now run (`set_worker_niceness`)."""
    return _worker_niceness


def set_worker_niceness(increment: int) -> int:
    """Run the workers of the pools made from now on `increment` lower in the kernel's scheduling (0-19);
    returns the increment before."""
    global _worker_niceness
    if not 0 <= increment <= 19:
        raise ValueError(f"a niceness increment is from 0 to 19, got {increment}")
    before, _worker_niceness = _worker_niceness, increment
    return before


def worker_pool(
    workers: int, initializer: Callable[..., object], initargs: tuple[Any, ...], preload: Sequence[str] = ()
) -> ProcessPoolExecutor:
    """The twin's local process pool: `workers` processes forked from the forkserver (`start_forkserver`,
    with `preload`), each running `initializer(*initargs)` once, with Ctrl-C left to this process, at the
    niceness `set_worker_niceness` set, ending when this process ends (`twin.lifeline`), however it ends.
    forkserver: workers start from a clean process, safe even when the caller runs threads (the API)."""
    start_forkserver(preload)
    return ProcessPoolExecutor(
        workers, mp_context=get_context("forkserver"), initializer=_start_worker,
        initargs=(initializer, initargs, _worker_niceness, lifeline()),
    )  # fmt: skip


def _start_worker(
    initializer: Callable[..., object], initargs: tuple[Any, ...], niceness: int, parent_line: Connection
) -> None:
    # Once no worker is left, the forkserver sees that nobody can ask it for more, and ends too.
    when_gone(parent_line, exit_now, "finetwin-worker-parent-watch")
    ignore_terminal_interrupt()
    if niceness:
        os.nice(niceness)
    initializer(*initargs)


def start_forkserver(preload: Sequence[str] = ()) -> None:
    """Start the forkserver the local pools fork their workers from, if it is not running, importing
    `preload` in it (each worker forks ready to run them) and `twin.forkserver_preload`: every worker is born
    ignoring Ctrl-C. A terminal sends Ctrl-C to every process of its foreground group: a worker that took it
    died with a KeyboardInterrupt traceback and broke its pool, and one forked while it arrived died before
    any code of ours ran (the parent's write to it failed with BrokenPipeError). The parent alone decides
    what a Ctrl-C stops: the API after the runs in flight, a command at once. The first start wins: a
    server already running keeps what it preloaded."""
    context = get_context("forkserver")
    # "__main__" as multiprocessing preloads by default: a worker of a script forks with the script loaded.
    context.set_forkserver_preload(["twin.forkserver_preload", "__main__", *preload])
    forkserver.ensure_running()


def ignore_terminal_interrupt() -> None:
    """In a pool worker: leave Ctrl-C to the parent, also when this worker's forkserver was started by other
    code than `start_forkserver`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call_in_worker(fn: TaskFn, task: Any) -> Any:
    return fn(_SHARED, task)


class LocalExecutor:
    """A process pool on this machine (`workers` processes; 1 = in this process, no pool at all)."""

    name = "local"

    def __init__(self, workers: int | None = None, retries: int = DEFAULT_RETRIES) -> None:
        self.workers = max(1, workers if workers is not None else (os.cpu_count() or 1))
        self.retries = retries

    def run(
        self, fn: TaskFn, shared: Any, tasks: Sequence[Any], *, progress: Progress | None = None
    ) -> list[Any]:
        if self.workers == 1 or len(tasks) <= 1:
            return self._run_here(fn, shared, tasks, progress)
        return self._run_pool(fn, shared, tasks, progress)

    def _run_here(
        self, fn: TaskFn, shared: Any, tasks: Sequence[Any], progress: Progress | None
    ) -> list[Any]:
        results: list[Any] = []
        for task in tasks:
            for attempt in range(1, self.retries + 2):
                try:
                    results.append(fn(shared, task))
                    break
                except Exception as exc:
                    if attempt > self.retries:
                        results.append(TaskFailure(describe_error(exc), attempt))
                    else:
                        log.warning("task failed (attempt %d), retrying: %s", attempt, describe_error(exc))
            if progress is not None:
                progress(len(results), len(tasks))
        return results

    def _run_pool(
        self, fn: TaskFn, shared: Any, tasks: Sequence[Any], progress: Progress | None
    ) -> list[Any]:
        results: dict[int, Any] = {}
        attempts = dict.fromkeys(range(len(tasks)), 0)
        # The forkserver imports the task's module once and every worker forks from it ready to run, instead
        # of each importing numpy, scipy and SimPy itself (seconds each on a busy machine). No effect when
        # the server already runs (it keeps what it preloaded first).
        preload = [fn.__module__, "twin.ensemble"]
        while len(results) < len(tasks):
            todo = [i for i in range(len(tasks)) if i not in results]
            with worker_pool(min(self.workers, len(todo)), _init_worker, (shared,), preload) as pool:
                pending: dict[Future[Any], int] = {}
                for i in todo:
                    attempts[i] += 1
                    pending[pool.submit(_call_in_worker, fn, tasks[i])] = i
                try:
                    broken = self._collect(fn, tasks, pool, pending, results, attempts, progress)
                except BaseException:
                    # `progress` may raise to stop the sweep (the API is stopping): the tasks not started are
                    # dropped instead of being waited for when the pool closes.
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
                if broken:
                    for future, i in pending.items():
                        if future.done() and not future.exception():
                            results[i] = future.result()
                        elif attempts[i] > self.retries:
                            results[i] = TaskFailure("a worker process died running it", attempts[i])
                    if progress is not None:
                        progress(len(results), len(tasks))
        return [results[i] for i in range(len(tasks))]

    def _collect(
        self, fn: TaskFn, tasks: Sequence[Any], pool: ProcessPoolExecutor, pending: dict[Future[Any], int],
        results: dict[int, Any], attempts: dict[int, int], progress: Progress | None,
    ) -> bool:  # fmt: skip
        """Results of `pending` as they finish (failed tasks retried in the same pool) until none is left or
        a worker died; returns whether one did (then `pending` holds the tasks the pool lost)."""
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            broken = False
            for future in done:
                i = pending.pop(future)
                try:
                    results[i] = future.result()
                except BrokenProcessPool:
                    # A worker died (killed, out of memory): every unfinished task of this pool is lost with
                    # it. Start a new pool for them; each lost task used one attempt.
                    broken = True
                    if attempts[i] > self.retries:
                        results[i] = TaskFailure("a worker process died running it", attempts[i])
                except Exception as exc:
                    if attempts[i] > self.retries:
                        results[i] = TaskFailure(describe_error(exc), attempts[i])
                    else:
                        log.warning("task %d failed, retrying: %s", i, describe_error(exc))
                        attempts[i] += 1
                        pending[pool.submit(_call_in_worker, fn, tasks[i])] = i
                        continue
                if progress is not None and i in results:
                    progress(len(results), len(tasks))
            if broken:
                return True
        return False


# --- Ray


# One connection per process: two threads (an API's plan and its forecast) must not both call ray.init.
_RAY_CONNECT = threading.Lock()

# A Ray worker's cache of shared inputs, by object id: fetched from the object store once per worker
# process, however many of the sweep's tasks that worker runs.
_RAY_CACHE: dict[str, Any] = {}


def _ray_task(fn: TaskFn, shared_ref: list[Any], task: Any) -> Any:
    import ray

    # The reference comes inside a list so that Ray does not resolve it for every task (see _RAY_CACHE).
    key = shared_ref[0].hex()
    if key not in _RAY_CACHE:
        _RAY_CACHE.clear()  # one sweep at a time per worker: do not hold on to the previous one's inputs
        _RAY_CACHE[key] = ray.get(shared_ref[0])
    return fn(_RAY_CACHE[key], task)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a HOST:PORT nobody listens on: `ray.init` would retry for minutes before giving up.
    Other forms (`auto`, `ray://...`) are left to Ray."""
    host, _, port = address.rpartition(":")
    if "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ExecutorUnavailable(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} (is its head running?)"
        ) from None


class RayExecutor:
    """Tasks on an existing Ray cluster (`ray.init(address=...)`); connects on first use."""

    name = "ray"

    def __init__(self, address: str, retries: int = DEFAULT_RETRIES) -> None:
        self.address = address
        self.retries = retries
        self._connected_here = False
        self._workers: int | None = None

    def _connect(self) -> Any:
        try:
            import ray
        except ModuleNotFoundError as exc:
            raise ExecutorUnavailable(
                "Ray is not installed: pip install 'finetwin[ray]' (or unset FINETWIN_RAY_ADDRESS)"
            ) from exc
        with _RAY_CONNECT:
            if not ray.is_initialized():
                check_reachable(self.address)
                try:
                    ray.init(
                        address=self.address,
                        logging_level=logging.WARNING,
                        log_to_driver=False,
                        configure_logging=False,
                    )
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    raise ExecutorUnavailable(
                        f"cannot reach the Ray cluster at {self.address}: {exc}"
                    ) from exc
                self._connected_here = True
        return ray

    @property
    def workers(self) -> int:
        if self._workers is None:
            ray = self._connect()
            self._workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        return self._workers

    def run(
        self, fn: TaskFn, shared: Any, tasks: Sequence[Any], *, progress: Progress | None = None
    ) -> list[Any]:
        ray = self._connect()
        # Retries are ours, not Ray's, so that a task that raises and a worker that dies are handled alike
        # and the attempts are counted in one place.
        remote = ray.remote(num_cpus=1, max_retries=0)(_ray_task)
        shared_ref = [ray.put(shared)]  # once, in the object store; workers fetch it once each
        results: dict[int, Any] = {}
        attempts = dict.fromkeys(range(len(tasks)), 1)
        pending = {remote.remote(fn, shared_ref, tasks[i]): i for i in range(len(tasks))}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    i = pending.pop(ref)
                    try:
                        results[i] = ray.get(ref)
                    except Exception as exc:  # RayTaskError (the task raised), WorkerCrashedError, ...
                        cause = getattr(exc, "cause", None) or exc
                        if attempts[i] > self.retries:
                            results[i] = TaskFailure(describe_error(cause), attempts[i])
                        else:
                            log.warning("task %d failed on Ray, retrying: %s", i, describe_error(cause))
                            attempts[i] += 1
                            pending[remote.remote(fn, shared_ref, tasks[i])] = i
                            continue
                    if progress is not None:
                        progress(len(results), len(tasks))
        finally:
            for ref in pending:  # only when interrupted: do not leave the cluster busy with our work
                ray.cancel(ref, force=True)
        return [results[i] for i in range(len(tasks))]

    def close(self) -> None:
        """Disconnect if this executor connected (a command at its end). A long-lived process (the API)
        does not call it: its forecasts may be using the same connection."""
        if self._connected_here:
            import ray

            ray.shutdown()
            self._connected_here = False


def make_executor(ray_address: str | None = None, workers: int | None = None) -> LocalExecutor | RayExecutor:
    """Ray when an address is given, else the local pool (`workers` processes, default: every core)."""
    if ray_address:
        return RayExecutor(ray_address)
    return LocalExecutor(workers)


def close_executor(executor: Executor) -> None:
    close = getattr(executor, "close", None)
    if close is not None:
        close()
