"""The shared worker: `python -m golden_ref.daemon --socket PATH --idle SECONDS`.

Under `cargo nextest` every test is its own process, and each would import torch (1.6-3 s) in its
own worker. The daemon imports torch once and listens on a Unix socket; each connection gets a
forked copy of the warm interpreter that serves it exactly like a private worker
(:func:`golden_ref.worker.serve`). A crash or a hang in a reference ends that copy only.

* Started by the runtime under a lock file, so two test processes starting at the same moment get
  one daemon. The starting process reads `ready` from the daemon's stdout; the daemon has already
  left the starter's session (double fork and setsid), so it is nobody's child but init's.
* A served copy writes its stderr to `worker-<pid>.log` beside the socket (its path is in the
  `hello` answer, for error messages) and, when it ends, the daemon writes how it ended to
  `worker-<pid>.exit` ("exit code 3", "signal 11"). The runtime removes both.
* A served copy ends at EOF on its connection, or soon after the connected test process is gone
  (its pid, from SO_PEERCRED, is watched).
* Only the daemon's own user gets in: the socket is created 0600 (in a folder the runtime made 0700),
  everything the daemon writes is private (umask 077), and a peer whose uid (SO_PEERCRED) is not the
  daemon's is hung up on before anything is forked for it.
* Each copy leads its own process group, which whatever its references start joins; the copy kills
  it when it leaves, and the daemon kills it when the copy has ended, before reaping the copy: no
  helper or forked process of a reference outlives its copy.
* A copy imports its references after the fork (the daemon imports none) and forgets the import
  system's directory caches of the daemon: what it imports is what is on disk now.
* A copy runs with the environment of the test process it serves, which the runtime sends with
  `hello` (:func:`golden_ref.worker.adopt_environment`), not with the daemon's: the daemon was
  started by whichever test process needed it first. The variables read as the daemon started
  (torch's, the thread pools', Python's own) cannot be given afterwards; the runtime names the
  daemon after their values (`--identity`), which each copy's `hello` answer says, so that a test
  process never uses a daemon started for other values, other import roots or another golden.
* The daemon exits after `--idle` seconds with no connection and no served copy alive (before its
  first connection, at least 30 s), or when its socket file is removed or replaced.
"""

from __future__ import annotations

import argparse
import errno
import faulthandler
import importlib
import os
import select
import signal
import socket
import struct
import sys
import time

from . import worker as worker_module


def record_exit(directory: str, pid: int, status: int) -> None:
    """Write how copy `pid` ended to `worker-<pid>.exit`, whole or not at all: the runtime reads
    the file as soon as it exists, so it is written under another name and renamed into place."""
    final = os.path.join(directory, f"worker-{pid}.exit")
    partial = final + ".part"
    try:
        with open(partial, "w") as f:
            f.write(_describe(status))
        os.replace(partial, final)
    except OSError:
        pass


def _describe(status: int) -> str:
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
            return f"signal {sig} ({name})"
        except ValueError:
            return f"signal {sig}"
    return f"status {status}"


def peer_credentials(conn: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the process at the other end of `conn` (SO_PEERCRED), None if unknown."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)
    except (OSError, AttributeError):
        return None


def peer_allowed(credentials: tuple[int, int, int] | None, uid: int) -> bool:
    """Whether a peer with these credentials may use the daemon of user `uid`: only that user, and
    never a peer whose credentials cannot be read."""
    return credentials is not None and credentials[1] == uid


def end_group(pgid: int) -> None:
    """Kill the process group `pgid` (a copy's), if it still has members."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _serve_connection(conn, directory: str, daemon_pid: int, client: int | None, user_umask: int,
                      identity: str | None) -> None:
    """In the forked copy: become a worker for this connection. Never returns."""
    code = 0
    try:
        # A process group of its own, which whatever its references start joins.
        os.setpgid(0, 0)
        os.umask(user_umask)
        # The daemon's directory listings may predate files added since: look again.
        importlib.invalidate_caches()
        pid = os.getpid()
        log_path = os.path.join(directory, f"worker-{pid}.log")
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.stdout = sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        faulthandler.enable(file=sys.stderr)
        if client:
            worker_module.watch_process(client)
        proto_in = conn.makefile("rb", buffering=0)
        proto_out = conn.makefile("wb", buffering=1 << 16)
        info = {"log": log_path, "daemon_pid": daemon_pid, "client_pid": client, "identity": identity}
        code = worker_module.serve(proto_in, proto_out, info, peer=client)
        # The client is done with this copy: so are the references' helpers.
        worker_module.end_group()
    except BaseException:  # noqa: BLE001 - the copy must never return into the daemon's loop
        code = 70
    finally:
        os._exit(code)


def run(path: str, idle: float, ready_fd: int, user_umask: int, identity: str | None = None) -> int:
    directory = os.path.dirname(os.path.abspath(path))
    uid = os.getuid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # 0600 from the start: no moment in which another user could connect.
    previous = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(previous)
    os.chmod(path, 0o600)
    listener.listen(128)
    inode = os.stat(path).st_ino
    pid = os.getpid()
    os.write(ready_fd, f"ready {pid}\n".encode())
    os.close(ready_fd)
    children: set[int] = set()
    ended: dict[int, float] = {}
    last_activity = time.monotonic()
    # The process that started the daemon connects as soon as it reads `ready`, which on a busy
    # machine can take longer than a short --idle: until the first connection, wait at least 30 s.
    patience = max(idle, 30.0)

    def forget(child: int):
        for suffix in ("log", "exit"):
            try:
                os.unlink(os.path.join(directory, f"worker-{child}.{suffix}"))
            except FileNotFoundError:
                pass

    def tidy(older_than: float):
        # A client reads how its copy ended within seconds; after that the files are litter.
        now = time.monotonic()
        for child, when in list(ended.items()):
            if now - when >= older_than:
                forget(child)
                del ended[child]

    def reap():
        while children:
            try:
                # Look without reaping: until the copy is reaped its pid, the id of its process
                # group, cannot be taken by another process.
                peeked = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                children.clear()
                return
            if peeked is None or peeked.si_pid == 0:
                return
            done = peeked.si_pid
            end_group(done)
            _, status = os.waitpid(done, 0)
            children.discard(done)
            ended[done] = time.monotonic()
            record_exit(directory, done, status)

    def accept_one():
        conn, _ = listener.accept()
        credentials = peer_credentials(conn)
        if not peer_allowed(credentials, uid):
            # Another user (the socket's modes should have stopped them): nothing runs for them.
            conn.close()
            return
        child = os.fork()
        if child == 0:
            listener.close()
            _serve_connection(conn, directory, pid, credentials[0], user_umask, identity)
        try:
            os.setpgid(child, child)  # as the copy does: whichever runs first
        except OSError:
            pass
        children.add(child)
        conn.close()

    def still_ours():
        try:
            return os.stat(path).st_ino == inode
        except FileNotFoundError:
            return False

    while True:
        readable, _, _ = select.select([listener], [], [], 0.25)
        reap()
        tidy(10.0)
        if readable:
            accept_one()
            last_activity = time.monotonic()
            patience = idle
            continue
        if children:
            last_activity = time.monotonic()
        if not still_ours():
            break
        if time.monotonic() - last_activity > patience:
            # Leave: new clients now find no socket and start a new daemon; one that connected
            # just before the unlink is still served.
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            listener.setblocking(False)
            while True:
                try:
                    accept_one()
                except (BlockingIOError, InterruptedError):
                    break
            break
    listener.close()
    # Served copies carry on by themselves; reap what ends in the next moments, then go.
    deadline = time.monotonic() + 1.0
    while children and time.monotonic() < deadline:
        reap()
        time.sleep(0.05)
    tidy(0.0)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--identity", default=None, help="what the runtime named this daemon's socket after")
    args = parser.parse_args()
    # Whatever the daemon creates is its user's alone; the copies get the user's umask back.
    user_umask = os.umask(0o077)

    # Warm up in the starting process, so that an import error reaches the starter's stderr.
    import numpy  # noqa: F401

    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    from . import evaluate, training, variants  # noqa: F401

    ready_r, ready_w = os.pipe()
    if os.fork() > 0:
        # The starter reads our stdout until the daemon says `ready`; this process just goes.
        os.close(ready_w)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = os.read(ready_r, 64)
            if not chunk:
                break
            answer += chunk
        sys.stdout.buffer.write(answer)
        sys.stdout.flush()
        # At once: tearing down the interpreter (torch imported) can take seconds on a busy machine,
        # and the runtime waits for this process.
        os._exit(0 if answer.startswith(b"ready") else 1)
    os.close(ready_r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    # The daemon: no terminal, no inherited pipes (the starter waits for their EOF).
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = run(args.socket, args.idle, ready_w, user_umask, args.identity)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            code = 0
        else:
            code = 1
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
