"""The service's files are its user's only: folders 0700, files 0600.

The service's home holds the database (every run, token hash and log entry), the store
(uploaded models, cards), run folders and their job logs. None of it is for other local users.
``certify serve`` and ``certify worker`` set the process umask to 077, so whatever they and
their children create is private; the places that create the service's own folders and files
also set the mode explicitly (a library caller's umask is not ours to rely on); and an existing
home is tightened at start, with a log line naming what was tightened.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
#: The process umask of the service's processes.
PRIVATE_UMASK = 0o077

log = logging.getLogger("certify.service")


def private_umask() -> None:
    """Make everything this process (and the processes it starts) creates private."""
    os.umask(PRIVATE_UMASK)


def make_private_dir(path: Path) -> Path:
    """``path`` as a folder, each missing component of it created 0700 (``mkdir(parents=True,
    mode=...)`` gives the parents the umask's default); an existing folder is left as it is."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            continue
        os.chmod(d, PRIVATE_DIR)  # mkdir's mode is masked by the umask; never widened here
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty with mode 0600 where it does not exist (a file another program
    then opens, such as SQLite's database, keeps that mode)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         PRIVATE_FILE))
    except FileExistsError:
        pass
    return path


def secure_home(home: Path) -> int:
    """Create ``home`` 0700, or tighten an existing one: the home and every folder under it to
    0700, every file to 0600 where group or others had any access (symbolic links are not
    followed). Logs one line when it tightened anything; returns how many it tightened."""
    if not home.exists():
        make_private_dir(home)
        return 0
    tightened = 0
    for root, dirs, files in os.walk(home, followlinks=False):
        for name, want in ((".", PRIVATE_DIR), *((d, PRIVATE_DIR) for d in dirs),
                           *((f, PRIVATE_FILE) for f in files)):
            p = os.path.join(root, name)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
                continue
            try:
                os.chmod(p, stat.S_IMODE(st.st_mode) & want)
            except OSError as exc:
                log.warning("cannot make %s private (%s)", p, exc.strerror)
                continue
            tightened += 1
    if tightened:
        log.warning("tightened %d file%s and folder%s under %s to the service user's only "
                    "(folders 0700, files 0600): other local users could read them",
                    tightened, "s" if tightened != 1 else "", "s" if tightened != 1 else "",
                    home)
    return tightened
