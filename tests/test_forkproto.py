"""The fork protocol (issue 65): one typed client and one wire format for the service's fork
servers (the job hosts and the card verifier), bounded reads, and its two ends tried against
each other through a real fork server process."""

from __future__ import annotations

import io
import os
import signal
import sys
import textwrap

import pytest

from certify.service import forkproto
from certify.service.forkproto import (
    MAX_LINE,
    Ended,
    ForkFailed,
    Job,
    LineBuffer,
    ProtocolError,
    Ready,
    Started,
    decode_job,
    decode_report,
    encode,
    read_lines,
)


@pytest.mark.unit
@pytest.mark.parametrize("msg", [
    Ready(12, {"import_s": 1.5, "threads": 1, "torch": True}),
    Started(3, 4567),
    Ended(3, 4567, -9, 0.25, 2048, overdue=True),
    ForkFailed(4, 12),
])
def test_every_report_reads_back_as_it_was_sent(msg):
    line = encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_report(line.rstrip(b"\n")) == msg


@pytest.mark.unit
def test_a_job_reads_back_with_its_typed_parameters():
    job = decode_job(encode(Job(7, {"folder": "/x", "memory_mb": 64, "timeout_s": 2})).strip())
    assert (job.id, job.text("folder"), job.integer("memory_mb"), job.number("timeout_s")) == \
        (7, "/x", 64, 2.0)
    with pytest.raises(ProtocolError, match="memory_mb"):
        job.text("memory_mb")
    with pytest.raises(ProtocolError, match="folder"):
        job.number("folder")


@pytest.mark.unit
@pytest.mark.parametrize("line", [
    b"not json", b"[1, 2]", b'{"type": "ended", "id": 1}', b'{"type": "nothing", "id": 1}',
    b'{"type": "started", "id": "1", "pid": 2}', b'{"type": "started", "id": true, "pid": 2}',
    b'{"type": "ready", "pid": 1}',
])
def test_a_line_that_is_not_a_report_is_refused(line):
    with pytest.raises(ProtocolError):
        decode_report(line)


@pytest.mark.unit
def test_reads_are_bounded():
    long = b"x" * (MAX_LINE + 1)
    with pytest.raises(ProtocolError):
        list(read_lines(io.BytesIO(b'{"a": 1}\n' + long + b"\n")))
    assert list(read_lines(io.BytesIO(b"one\ntwo\n"))) == [b"one", b"two"]
    buf = LineBuffer()
    assert buf.feed(b"a\nb") == [b"a"]
    assert buf.feed(b"c\n") == [b"bc"]
    with pytest.raises(ProtocolError):
        buf.feed(b"y" * (MAX_LINE + 1))
    with pytest.raises(ProtocolError):
        encode(Job(1, {"key": "k" * MAX_LINE}))
    with pytest.raises(ProtocolError):
        decode_job(b'{"type": "job", "id": 1, "params": {"a": [1]}}')


#: A fork server in a few lines: each job's child exits with the job's ``status`` or sleeps
#: past its ``deadline_s`` (then the loop kills it and says it was overdue).
_SERVER = textwrap.dedent("""
    import os, sys, time
    from certify.service import forkproto
    from certify.service.forks import Forked, ForkLoop

    loop = ForkLoop(sys.stdin.fileno(), sys.stdout.buffer)

    def start(job):
        deadline = job.params.get("deadline_s")
        pid = loop.fork()
        if pid == 0:
            if deadline is not None:
                time.sleep(60)
            os._exit(job.integer("status"))
        return Forked(pid, None if deadline is None else time.monotonic() + deadline)

    loop.report(forkproto.Ready(os.getpid(), {"kind": "test"}))
    loop.run(start)
""")


@pytest.mark.e2e
def test_both_ends_of_the_protocol_against_a_real_fork_server():
    started: list[int] = []
    server = forkproto.start([sys.executable, "-c", _SERVER], "test-server", dict(os.environ))
    try:
        done = server.send({"status": 3}, on_started=started.append)
        overdue = server.send({"status": 0, "deadline_s": 0.2})
        assert done.wait(30) and overdue.wait(30)
        assert server.ready.is_set() and server.facts is not None
        assert server.facts.facts == {"kind": "test"}
        ending = done.ending
        assert isinstance(ending, Ended) and ending.returncode == 3 and not ending.overdue
        assert started == [ending.pid] == [done.pid]
        late = overdue.ending
        assert isinstance(late, Ended) and late.overdue and late.returncode == -signal.SIGKILL
        # a server that dies: the job it had not reported ended is lost, and so is the next
        running = server.send({"status": 0, "deadline_s": 30})
        assert running.wait_started(30) and running.pid is not None
        server.kill()
        assert running.wait(30) and running.lost and running.ending is None
        with pytest.raises(forkproto.ServerLost):
            running.future.result(0)
        assert server.send({"status": 0}).lost  # nothing is sent to a server seen ended
    finally:
        server.kill()


@pytest.mark.unit
@pytest.mark.parametrize("line", [
    b'{"type": "started", "id": 1, "pid": 0}',  # os.killpg(0): the worker's own group
    b'{"type": "started", "id": 1, "pid": -1}',  # os.kill(-1): every process of the user
    b'{"type": "started", "id": 1, "pid": 1}',
    b'{"type": "ended", "id": 1, "pid": -1, "returncode": 0, "maxrss_kb": 1}',
    b'{"type": "ready", "pid": 0, "facts": {}}',
    b'{"type": "ready", "pid": 12, "facts": {"a": [1]}}',
    b'{"type": "ended", "id": 1, "pid": 9, "returncode": 0, "maxrss_kb": 1, '
    b'"overdue": "false"}',
    b'{"type": "ended", "id": 1, "pid": 9, "returncode": 0, "maxrss_kb": 1, "cpu_s": "1"}',
    b'{"type": "ended", "id": 1, "pid": 9, "returncode": 0, "maxrss_kb": 1, "cpu_s": 1e308}',
    b"[" * 30000 + b"]" * 30000,  # nesting deeper than the stack: RecursionError in json
])
def test_a_report_that_could_harm_the_worker_is_refused(line):
    """Found by review: pids of 0 or -1 made a kill reach the worker's process group or every
    process of the service's user; a deeply nested line raised RecursionError past the
    protocol's checks."""
    assert len(line) <= MAX_LINE
    with pytest.raises(ProtocolError):
        decode_report(line)


#: A fork server that says it is ready, then writes a line the protocol refuses (argv[1]).
_BAD_SERVER = textwrap.dedent("""
    import os, sys, time
    from certify.service import forkproto
    sys.stdout.buffer.write(forkproto.encode(forkproto.Ready(os.getpid(), {})))
    sys.stdout.buffer.flush()
    sys.stdin.buffer.readline()  # the job
    sys.stdout.buffer.write(sys.argv[1].encode() + b"\\n")
    sys.stdout.buffer.flush()
    time.sleep(60)
""")


@pytest.mark.e2e
@pytest.mark.parametrize("bad", ["[" * 30000 + "]" * 30000,
                                 '{"type": "started", "id": 1, "pid": 0}', "x" * 70000])
def test_a_server_that_breaks_the_protocol_is_killed_and_its_jobs_are_lost(bad):
    """Each way a server can break the protocol ends the same way: the server is killed, the
    job it held is lost at once (not at the worker's time limit), and nothing more is sent."""
    server = forkproto.start([sys.executable, "-c", _BAD_SERVER, bad], "bad-server",
                             dict(os.environ))
    try:
        assert server.ready.wait(30)
        child = server.send({"status": 0})
        assert child.wait(30) and child.lost and child.ending is None
        assert server.proc.wait(30) is not None
        assert server.send({"status": 0}).lost
    finally:
        server.kill()
