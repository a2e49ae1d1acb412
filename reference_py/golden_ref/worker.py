"""The worker loop: `python -m golden_ref.worker`, one process serving many requests.

Requests and responses are frames of :mod:`golden_ref.wire` on stdin/stdout. Before anything else the
worker moves the protocol onto private copies of both (which processes the reference starts do not
inherit), points fd 1 at stderr, so that a reference that prints cannot corrupt a frame, and gives
fd 0 /dev/null, so that a reference that reads stdin (`input()`) reads end-of-file and one that
closes it closes nothing of golden's. It exits at EOF on its input, and also when its parent process
is gone (checked by a watchdog thread, because a reference stuck in a long computation does not read).

The runtime starts the worker as the leader of its own process group, which whatever the reference
starts joins: when the worker leaves (EOF, or its parent gone) it kills that group, so that no helper
or forked copy outlives it; the runtime kills the group of a worker it kills.

Requests (`op` in the JSON header):

* `hello` -> versions of Python, NumPy and (if the backend asked for it) torch; a copy of the shared
  worker is sent the environment of its test process with it (`environ`), and takes it as its own
  (:func:`adopt_environment`) before it imports any reference
* `load`  -> resolve a reference (import errors are reported with their traceback)
* `params` -> what the runtime needs to draw a module's parameters (:func:`golden_ref.evaluate.param_spec`)
* `state` -> load a checkpoint's state from its file and keep it by id (:mod:`golden_ref.states`);
  a request that names a state this worker does not hold (`state_ref`) fails as `unknown_state`
* `forward` -> evaluate a reference on one case (see :mod:`golden_ref.evaluate`)
* `variants` -> evaluate the reference's known variants on one case (:mod:`golden_ref.variants`)
* `mutations` -> the reference with one of its torch calls mutated into a common porting mistake,
  for those mutations that move it toward the port's outputs (:mod:`golden_ref.mutations`)
* `gradients` -> PyTorch's gradients of sum(out * cotangent) on one case
* `train` -> the overfit check's training steps in PyTorch (:mod:`golden_ref.training`)
* `timing` -> the reference's time on one case, warm runs, beside the port's
  (:mod:`golden_ref.timing`)
* `echo` -> the request's tensors, as they came (the transport's benchmark)

Large tensors travel through shared memory when both sides can map it (:mod:`golden_ref.shm`):
`hello` carries the runtime's offer, and the answer this worker's arena or why it has none.

While it answers a request, the worker says which of golden's evaluations of the reference it is
in: a frame `{"progress": stage, "phase": ...}` with the request's id and no `ok` before each
(:class:`Progress`), so that the runtime can say where a worker died or hung however it ended
(a crash in any thread, an exit, the out-of-memory killer), which a Python stack does not always.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import sys
import threading
import time
import traceback

from . import shm, timing, variables, wire
from .backends import BACKENDS, BackendError, OutputError
from .evaluate import Case, NotDeterministic, ReferenceRaised, forward, gradient_case, param_spec, variants
from .limits import AnswerTooLarge
from .training import train
from .references import ReferenceError_, provenance, resolve
from .schedule import Plan, ScheduleError
from .states import CheckpointError, States


class Worker:
    """State of one worker process: resolved references and backends, cached across requests."""

    def __init__(self, session=None):
        self.references = {}
        self.backends = {}
        self.session = session or shm.Session(None)
        self.states = States()
        # Told where the request being answered is (see `Progress`); None: nobody listens.
        self.progress = None

    def backend(self, name: str):
        if name not in BACKENDS:
            raise BackendError(f"unknown backend `{name}` (golden knows: {', '.join(BACKENDS)})")
        if name not in self.backends:
            backend = BACKENDS[name]()
            backend.check_available()
            self.backends[name] = backend
        return self.backends[name]

    def reference(self, path: str, form: str, backend_name: str):
        key = (path, form, backend_name)
        if key not in self.references:
            backend = self.backend(backend_name)
            obj = resolve(path)
            if form == "module":
                if backend_name != "torch":
                    raise BackendError("the module form needs the torch backend")
                if not (isinstance(obj, type) and issubclass(obj, backend.torch.nn.Module)):
                    raise ReferenceError_(
                        "not_module",
                        f"`{path}` is used in module form (the port takes a VarBuilder), so it must be "
                        f"an nn.Module class; it is a {type(obj).__name__}",
                    )
            self.references[key] = obj
        return self.references[key]

    def config_class(self, path: str):
        """The configuration class of `config = "..."` (resolved like a reference)."""
        key = ("config", path)
        if key not in self.references:
            self.references[key] = resolve(path)
        return self.references[key]

    def handle(self, header: dict, tensors: list):
        op = header.get("op")
        if op == "hello":
            import numpy

            if header.get("environ") is not None:
                adopt_environment(header["environ"])
            info = {"python": sys.version.split()[0], "numpy": numpy.__version__, "pid": os.getpid()}
            info.update(getattr(self, "extra_info", {}))
            info.update(self.session.hello())
            for name in header.get("backends", []):
                version = self.backend(name).check_available()
                if version:
                    info[name] = version
            return info, []
        if op == "echo":
            table = wire.TensorTable()
            return {"tensors": [table.ref(t) for t in tensors]}, table.tensors
        if op == "load":
            obj = self.reference(header["reference"], header["form"], header["backend"])
            objects = [obj]
            if header.get("config"):
                objects.append(self.config_class(header["config"]))
            version = self.backend(header["backend"]).check_available()
            info = {header["backend"]: version} if version else {}
            info["provenance"] = provenance(objects)
            return info, []
        if op == "params":
            spec, spec_tensors = param_spec(self.case(header, tensors), bool(header.get("weights")))
            table = wire.TensorTable()
            for entry in spec["entries"]:
                if "value" in entry:
                    entry["value"] = table.ref(spec_tensors[entry["value"]])
            return {"params": spec}, table.tensors
        if op == "state":
            state = self.states.load(header["state"], tensors)
            return {"id": state.id, "entries": len(state.entries)}, []
        if op == "forward":
            return self.forward(header, tensors)
        if op == "timing":
            answer = timing.measure(self.case(header, tensors), int(header.get("warmup", 1)),
                             int(header.get("runs", 5)), bool(header.get("points", False)))
            return answer, []
        if op == "variants":
            return self.variants(header, tensors)
        if op == "mutations":
            return self.mutations(header, tensors)
        if op == "gradients":
            case = gradient_case(
                self.case(header, tensors), header["names"], header["wrt"], bool(header["params"]),
                header.get("along"),
            )
            table = wire.TensorTable()
            result = forward(case, int(header.get("perturbations", 4)))
            return _outputs_json(result, table), table.tensors
        if op == "train":
            case = self.case(header, tensors)
            targets = wire.resolve_refs(header["targets"], tensors)
            result = train(case, targets, header["loss"], header["optimizer"], int(header["steps"]))
            table = wire.TensorTable()
            final = [[name, table.ref(t)] for name, t in result["final"]]
            return {"losses": result["losses"], "final": final}, table.tensors
        raise wire.ProtocolError(f"unknown op {op!r}")

    def case(self, header: dict, tensors: list) -> Case:
        args = wire.resolve_refs(header["args"], tensors)
        if not all(isinstance(a, wire.WireTensor) for a in args):
            raise wire.ProtocolError("`args` must be a list of tensors")
        backend = self.backend(header["backend"])
        obj = self.reference(header["reference"], header["form"], header["backend"])
        case = Case(
            obj,
            header["form"],
            backend,
            args,
            header.get("kwargs", {}),
            header.get("init", {}),
            int(header["seed"]),
            header["dtype"],
        )
        config = header.get("config")
        if config:
            case.config = (self.config_class(config["class"]), config.get("values", {}))
        case.trace = bool(header.get("trace", False))
        case.twice = bool(header.get("twice", False))
        case.progress = self.progress
        if header.get("state_dict") is not None:
            case.state = [(name, t) for name, t in wire.resolve_refs(header["state_dict"], tensors)]
        if header.get("state_ref") is not None:
            checkpoint = self.states.get(header["state_ref"])
            if checkpoint is None:
                raise UnknownState(header["state_ref"])
            case.checkpoint = checkpoint
            case.state = checkpoint.entries
        spec = header.get("schedule")
        if spec is not None:
            spec = wire.resolve_refs(spec, tensors)
            case.schedule = Plan(spec, spec.get("mask"))
        return case

    def variants(self, header: dict, tensors: list):
        table = wire.TensorTable()
        found = []
        perturbations = int(header.get("perturbations", 4))
        for name, fix, result, error in variants(self.case(header, tensors), perturbations):
            outputs = None if result is None else _outputs_json(result, table)
            found.append({"name": name, "fix": fix, "outputs": outputs, "error": error})
        return {"variants": found}, table.tensors

    def mutations(self, header: dict, tensors: list):
        from .mutations import search

        port = [(name, t) for name, t in wire.resolve_refs(header["port"], tensors)]
        summary, found = search(
            self.case(header, tensors),
            port,
            header.get("names"),
            keep=int(header.get("keep", 6)),
            budget=float(header.get("budget", 20.0)),
            perturbations=int(header.get("perturbations", 4)),
            only=header.get("only"),
            sizes=[(str(n), int(v)) for n, v in header.get("sizes", [])],
            focus=header.get("focus"),
            base=header.get("base"),
        )
        table = wire.TensorTable()
        summary["mutants"] = [
            {"key": c.key, "what": c.what, "instead": c.instead, "fix": c.fix, "where": c.where,
             "kind": c.kind, "code": c.code, "outputs": _outputs_json(result, table)}
            for c, result in found
        ]
        return summary, table.tensors

    def forward(self, header: dict, tensors: list):
        case = self.case(header, tensors)
        result = forward(case, int(header.get("perturbations", 4)), bool(header.get("precise", True)),
                         header.get("upto"), header.get("case_key"))
        table = wire.TensorTable()
        return _outputs_json(result, table), table.tensors


def _outputs_json(result: dict, table) -> dict:
    """A `forward` result as a response header, its tensors added to `table`."""

    def named(leaves):
        if leaves is None:
            return None
        return [[name, table.ref(t)] for name, t in leaves]

    response = {key: named(result.get(key)) for key in ("state_dict", "expected", "precise", "own", "moved", "own_mean")}
    if result.get("mode_shift") is not None:
        response["mode_shift"] = named(result["mode_shift"])
    response["precise_error"] = result["precise_error"]
    for key in ("buffers", "aliases", "unsaved", "mutated"):
        if result.get(key):
            response[key] = result[key]
    return response


def adopt_environment(pairs: list) -> None:
    """Make the environment exactly `pairs` (each name and value as the hex of its bytes): the
    environment the runtime would start a private worker with. A copy of the shared worker takes
    its test process's this way, in place of the daemon's, before it imports any reference; the
    C library's environment changes with it (`os.environb` sets and unsets it)."""
    wanted = {bytes.fromhex(name): bytes.fromhex(value) for name, value in pairs}
    for name in list(os.environb):
        if name not in wanted:
            del os.environb[name]
    for name, value in wanted.items():
        if os.environb.get(name) != value:
            os.environb[name] = value


class UnknownState(Exception):
    """A request names a checkpoint's state this worker does not hold (the runtime sends it)."""


class Progress:
    """Tells the runtime which evaluation of the reference request `request_id` is in: one frame
    per change, written at once (the worker may die in the next instant)."""

    def __init__(self, stream, request_id: int):
        self.stream = stream
        self.request_id = request_id
        self.last = None

    def __call__(self, stage: str, phase: str) -> None:
        if (stage, phase) == self.last:
            return
        self.last = (stage, phase)
        wire.write_frame(self.stream, self.request_id, {"progress": stage, "phase": phase}, [])


def error_response(error: BaseException) -> dict:
    """Describe a failure so that the runtime can name the fix."""
    if isinstance(error, UnknownState):
        return {"kind": "unknown_state", "message": f"this worker holds no state {error}"}
    if isinstance(error, CheckpointError):
        return {"kind": "weights", "message": str(error)}
    if isinstance(error, ReferenceError_):
        return {"kind": error.kind, "message": error.message, "traceback": error.traceback}
    if isinstance(error, NotDeterministic):
        return {"kind": "nondeterministic", "message": str(error)}
    if isinstance(error, ReferenceRaised):
        return {"kind": "raised", "message": str(error), "phase": error.phase, "traceback": error.traceback}
    if isinstance(error, OutputError):
        return {"kind": "return_type", "message": str(error)}
    if isinstance(error, ScheduleError):
        return {"kind": "schedule", "message": str(error)}
    if isinstance(error, AnswerTooLarge):
        return {"kind": "too_large", "message": str(error)}
    if isinstance(error, BackendError):
        return {"kind": "backend", "message": str(error)}
    if isinstance(error, (wire.ProtocolError, KeyError, TypeError, ValueError)):
        return {"kind": "protocol", "message": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    return {"kind": "internal", "message": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}


def end_group() -> None:
    """Kill this process's group, itself included, if it leads one: everything the references it
    ran have started. Never another group (a worker started by hand shares its caller's)."""
    if os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)


def _watch(gone):
    while True:
        time.sleep(0.5)
        if gone():
            end_group()
            os._exit(0)


def watch_parent(parent: int):
    """End this process soon after `parent` (our parent process) is gone."""
    threading.Thread(target=_watch, args=(lambda: os.getppid() != parent,), daemon=True).start()


def watch_process(pid: int):
    """End this process soon after process `pid` (not our parent) is gone."""

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    threading.Thread(target=_watch, args=(gone,), daemon=True).start()


def private_stdio() -> None:
    """Point fd 0 at /dev/null and fd 1 at stderr, for the references (the protocol has its own
    descriptors by then). `print()` in a reference, or a C library writing to fd 1, reaches
    stderr; `input()` reads end-of-file at once instead of waiting for the timeout."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def main() -> int:
    # The protocol gets private duplicates of stdin and stdout (os.dup: not inherited by processes
    # the reference starts); the references get /dev/null and stderr in their place.
    # Unbuffered input: frames are read straight into their buffers, and `serve` can wait for the
    # next one with a timeout.
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb")
    private_stdio()
    # A crash in a reference (or in torch) prints the Python stack on stderr, which the runtime
    # quotes in its message.
    faulthandler.enable(file=sys.stderr)

    parent = variables.whole_number(
        "GOLDEN_PARENT_PID", os.getppid(), 1, 2**31 - 1,
        "a process id: golden sets it on the Python workers it starts (the test process whose end "
        "ends them); unset it",
    )
    if os.getppid() != parent:
        return 0
    watch_parent(parent)
    code = serve(proto_in, proto_out, peer=parent)
    # The runtime closed our input (it is done with us, or gone): so are the references' helpers.
    end_group()
    return code


def _idle(stream, seconds: float) -> bool:
    """Whether nothing arrives on `stream` for `seconds` (False for a stream without a descriptor)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    readable, _, _ = select.select([fd], [], [], seconds)
    return not readable


def serve(proto_in, proto_out, extra_info=None, peer=None) -> int:
    """Answer requests from `proto_in` on `proto_out` until EOF. `extra_info` is added to the
    answer to `hello`; `peer` is the pid of the runtime's process (its shared memory must be
    its own)."""
    session = shm.Session(peer)
    worker = Worker(session)
    worker.extra_info = extra_info or {}
    try:
        return _serve(worker, session, proto_in, proto_out)
    finally:
        session.close()


def _serve(worker, session, proto_in, proto_out) -> int:
    while True:
        if session.large() and _idle(proto_in, shm.IDLE):
            # Idle with a large arena: give its memory back (the runtime does the same).
            session.release()
        try:
            frame = wire.read_frame(proto_in, session)
        except wire.ProtocolError as e:
            # The stream cannot be resynchronised after a broken frame: say why, then stop.
            wire.write_frame(proto_out, 0, {"ok": False, "error": error_response(e)}, [])
            return 2
        if frame is None:
            return 0
        request_id, header, tensors = frame
        session.request(header.pop("$shm", None))
        worker.progress = Progress(proto_out, request_id)
        try:
            body, out_tensors = worker.handle(header, tensors)
            response = {"ok": True, **body}
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            response, out_tensors = {"ok": False, "error": error_response(e)}, []
        # The request's tensors may be views of the runtime's arena: done with them.
        del tensors, frame
        try:
            try:
                # The answer is given up as it goes into shared memory: not held twice.
                wire.write_frame(proto_out, request_id, response, out_tensors, session, release=True)
            except wire.FrameTooLarge as e:
                # Nothing was written yet: the answer becomes an error that says why.
                error = {"kind": "too_large", "message": f"the answer to `{header.get('op')}` is too large: {e}"}
                wire.write_frame(proto_out, request_id, {"ok": False, "error": error}, [])
        except BrokenPipeError:
            return 0


if __name__ == "__main__":
    sys.exit(main())
