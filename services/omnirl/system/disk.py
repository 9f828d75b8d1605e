"""A directory that cannot take a write: a full disk, a quota, a file-size limit, a read-only mount,
no permission (which refuses reads too: `failed_verb` tells which failed).

Such a fault comes back on every restart until someone frees space (or remounts), so a local run
stops instead of burning `failurePolicy.maxRestarts` on it, and `--resume` continues once there is
room. Used by `omnirl run`'s and `omnirl eval`'s check of `--out` before anything starts
(`check_writable`), by a role that dies on such a write (`launch/roles.py` exits
`STORAGE_ERROR_EXIT` with one line), and by the local supervisor, which probes the run directory
whenever a role or the embedded Redis dies, whatever the process said (a Redis that cannot append
to its AOF just exits 1; a role then fails on Redis). Also the fsyncs a checkpoint or an export
needs before it counts as written (`sync_tree`, `sync_dir`). Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from omnirl.system.causes import causes

STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)
"""No space left on device, disk quota exceeded, file too large (RLIMIT_FSIZE), read-only file system,
permission denied (owner/mode; a pod's volume not writable by its uid 1000), operation not permitted
(an immutable directory, `chattr +i`, which stops root too). Measured: an actor whose
`checkpoints/` took no write died with `PermissionError: [Errno 1]` and the job restarted it until
`failurePolicy.maxRestarts` (3 starts, 77 s) before these two were here."""


def storage_error(exc: BaseException | None) -> OSError | None:
    """The OSError with a `STORAGE_ERRNOS` errno behind `exc` (itself, a cause or a context), or None.

    Libraries that write from native code (safetensors' Rust writer) raise their own exception type
    with the system's text inside; that text (`os.strerror`) is recognised too and returned as an
    OSError with its errno and no file name.
    """
    for behind in causes(exc):
        if isinstance(behind, OSError) and behind.errno in STORAGE_ERRNOS:
            return behind
        text = str(behind)
        for code in STORAGE_ERRNOS:
            if os.strerror(code) in text:
                return OSError(code, os.strerror(code))
    return None


def describe(err: OSError) -> str:
    """`"[Errno 28] No space left on device"`: the errno's number and text (the error's own text without one)."""
    return f"[Errno {err.errno}] {err.strerror}" if err.errno else str(err)


def failed_verb(err: OSError) -> str:
    """What `err` (an OSError with a `STORAGE_ERRNOS` errno) failed to do to `err.filename`: "write",
    "read" or "reach" (a directory above it cannot be searched).

    Space, quota, the file-size limit and a read-only mount refuse writes only. EACCES and EPERM
    refuse reads too (an unreadable model file or checkpoint was reported as "cannot write"), and
    the error does not say which the failed call wanted, so the path is probed: a file that does not
    exist was being created ("write"); one that cannot be opened for reading (a directory: listed)
    was being read, since omnirl reads or appends to (`append_lines`: read too) every file it opens
    that exists; one that can was being written. Without a file name the run directory is meant: "write".
    """
    if err.errno not in (errno.EACCES, errno.EPERM) or not err.filename:
        return "write"
    path = os.fsdecode(err.filename)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # being created
        return "write"
    except OSError as refused:
        return "reach" if refused.errno in (errno.EACCES, errno.EPERM) else "write"
    if stat.S_ISDIR(mode):
        return "write" if _can(os.listdir, path) else "read"
    if not stat.S_ISREG(mode):  # a FIFO or a device: opening it could block
        return "write"
    return "write" if _can(open, path, "rb") else "read"


def _can(opener, *args) -> bool:
    """`opener(*args)` succeeds (a file object it returns is closed at once)."""
    try:
        opened = opener(*args)
    except OSError:
        return False
    if hasattr(opened, "close"):
        opened.close()
    return True


_ABLE = {"write": "writable", "read": "readable", "reach": "reachable (search permission on every directory above it)"}


def fix(err: OSError, verb: str = "write") -> str:
    """What makes the path of `err` usable again, by errno: space (or quota, or the file-size limit)
    for the first three of `STORAGE_ERRNOS`, the owner/mode for EACCES, the immutable flag for EPERM,
    a writable mount for a read-only one (and any other errno); `verb` is `failed_verb`'s answer
    (readable, writable or reachable for EACCES and EPERM)."""
    if err.errno == errno.ENOSPC:
        return "free space there"
    if err.errno == errno.EDQUOT:
        return "free space or raise the disk quota"
    if err.errno == errno.EFBIG:
        return "raise the file-size limit (ulimit -f)"
    able = _ABLE.get(verb, "writable")
    if err.errno == errno.EACCES:
        return (f"make it {able} by uid {os.getuid()} (its owner or mode; in a pod, uid 1000: give the volume "
                "an fsGroup or chown it)")
    if err.errno == errno.EPERM:
        if verb == "write":
            return "make it writable (an immutable flag stops even root: chattr -i)"
        return f"make it {able} by uid {os.getuid()} (its owner or mode, or a security policy that refuses it)"
    return "make it writable"


def failure(err: OSError, where: str | os.PathLike | None = None) -> tuple[str, str]:
    """A storage error in words: (what failed, the fix), e.g. (`cannot read /m/config.json ([Errno 13]
    Permission denied)`, `make it readable by uid 0 (...)`). `where` names the path when `err` has no
    file name (the run directory; a library's error carrying only the system's text)."""
    verb = failed_verb(err)
    path = os.fsdecode(err.filename) if err.filename else (os.fsdecode(where) if where else "the run directory")
    return f"cannot {verb} {path} ({describe(err)})", fix(err, verb)


def readable(path: str | os.PathLike) -> str | os.PathLike:
    """`path`, after opening it for reading and closing it: safetensors (0.8) reports a file it may
    not read (EACCES) as "No such file or directory" (a FileNotFoundError), which sent the user
    looking for a file that is there; the system's own error is raised here first.

    Raises:
        OSError: the file cannot be opened for reading (PermissionError, FileNotFoundError, ...).
    """
    with open(path, "rb"):
        pass
    return path


def probe(directory: Path) -> None:
    """Write one byte to a new file in `directory` (an existing directory), flush it to the file
    system and remove it: a full tmpfs or disk refuses the byte even where it still creates the file.

    Raises:
        OSError: the write failed (its errno says why).
    """
    with tempfile.TemporaryFile(dir=directory, prefix=".omnirl-probe-") as f:
        f.write(b"x")
        f.flush()
        os.fsync(f.fileno())


def unwritable(directory: Path) -> OSError | None:
    """The storage error a probe write to `directory` gets now, or None when it takes the write.
    A probe failing for another reason (the directory was removed) is no storage fault: None."""
    try:
        probe(directory)
    except OSError as err:
        return err if err.errno in STORAGE_ERRNOS else None
    return None


def check_writable(out: Path, flag: str = "--out", purpose: str = "the run's outputs") -> None:
    """`out` can hold `purpose`: an existing directory takes a probe byte, or the nearest existing
    folder above a new one takes a directory holding one (nothing is left behind). Left to the
    first real write, a read-only, full or misnamed `--out` ended in a traceback (after minutes of
    sampling, for `omnirl eval`).

    Raises:
        ValueError: naming `flag`, the path, the system's reason (errno text) and the fix.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {out}: is a file, not a directory; choose a directory for {purpose}")
    where = out
    while not where.exists():
        where = where.parent
    if not where.is_dir():
        raise ValueError(f"{flag} {out}: {where} is a file, not a directory; choose a directory for {purpose}")
    try:
        if where == out:
            probe(out)
        else:
            scratch = Path(tempfile.mkdtemp(dir=where, prefix=".omnirl-probe-"))
            try:
                probe(scratch)
            finally:
                scratch.rmdir()
    except OSError as err:
        raise ValueError(f"{flag} {out}: {where} cannot be written ({describe(err)}); {fix(err)} "
                         f"or choose another {flag}") from None


def append_lines(path: Path):
    """`path` opened for appending JSON lines (text, line-buffered), after dropping a last line cut
    short: a write that failed for want of space may leave part of a line on disk, and the next line
    appended after it (by a resumed role) would make one corrupt line in the middle of the file. The
    cut line's record was never complete (its writer got the error), so nothing written is lost.

    Raises:
        OSError: the file cannot be opened or truncated.
    """
    with path.open("ab+") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(max(0, size - (1 << 16)))
            tail = f.read()
            if not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n")
                if cut < 0 and size > len(tail):
                    raise OSError(errno.EINVAL, f"{path}: its last line is longer than 64 KiB and unterminated")
                f.truncate(size - len(tail) + cut + 1)
    return path.open("a", buffering=1)  # noqa: SIM115 - the caller owns it


def umask() -> int:
    """This process's file-creation mask, read without changing it (`/proc/self/status`, Linux ≥ 4.7;
    elsewhere set and restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def readable_as_umask_allows(path: Path) -> None:
    """Give the file `path`, or every file under the directory `path`, that this process owns the mode
    an ordinary write gets (0o666 & ~umask).

    safetensors' `save_file` (0.8) creates its file 0600 whatever the umask, so a checkpoint's or
    export's weights were the only files of a run directory that another user, or a serving container
    with another uid, could not read beside their readable JSON. A hard-linked export file shares its
    checkpoint file's inode, so fixing the checkpoint fixes it too; a file another user owns (an export
    hard-linked from someone else's run) is theirs to change and is left as it is.

    Raises:
        OSError: a file of ours cannot be changed (a read-only mount).
    """
    mode = 0o666 & ~umask()
    path = Path(path)
    for f in path.rglob("*") if path.is_dir() else [path]:
        st = f.lstat()
        if f.is_file() and not f.is_symlink() and st.st_uid == os.geteuid() and st.st_mode & 0o777 != mode:
            os.chmod(f, mode)


def sync_dir(path: Path) -> None:
    """fsync the directory `path` itself: its entries (a rename into it, a new link, a removal) reach the
    disk, not only the data of the files they name.

    Raises:
        OSError: it cannot be opened or flushed (EIO on a failing disk or a lost NFS server).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(path: Path) -> None:
    """fsync every file and directory under `path`, and `path` (deepest first), before a rename makes
    it visible: a rename can reach the disk before the data it names (ext4 delayed allocation, NFS).

    Raises:
        OSError: as `sync_dir`, for a file or a directory.
    """
    for dirpath, _, filenames in os.walk(path, topdown=False):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        sync_dir(Path(dirpath))
