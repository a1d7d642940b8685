"""autotune's directory on the target, checked the way OpenSSH's StrictModes checks a path, and its files opened
without following links (a library of the programs here; runs with the target's python3 >= 3.6).

Every directory on the way from / must belong to the user or root and must not be writable by group or others
unless it is sticky (like /tmp). A symbolic link on the way is followed only where the user or root placed it: in
such a directory, or, in a sticky one, when the link is the user's or root's (the kernel's protected_symlinks rule);
each directory it leads through is checked the same way. The workdir itself and
autotune's directory in it must be real directories of the user's own, writable by nobody else; missing ones are
created 0700.

The walk holds each directory open (``O_DIRECTORY | O_NOFOLLOW``) and checks the open directory (``fstat``), never a
path looked up again later. The program that walked then reads, writes, renames and removes through that descriptor
(``openat`` with ``O_NOFOLLOW``), so nothing can be swapped in between: whoever could change a directory on the way
was refused by the walk.
"""
import contextlib
import errno
import os
import secrets
import stat

#: exit status of a program that refused a directory (its reason is one line on stderr)
REFUSED = 96
FIX = "give [target] workdir a directory of your own"
MAX_LINKS = 40
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class Refused(Exception):
    """A directory or file another user could control; ``str()`` is the one-line reason."""


def _refuse(path, why, workdir=None):
    where = path if workdir in (None, path) else "%s (on the way to %s)" % (path, workdir)
    return Refused("autotune: %s %s: refusing to use it (%s)" % (where, why, FIX))


def _join(parent, name):
    return "/" + name if parent == "/" else parent + "/" + name


def _open_dir(fd, name):
    """The directory ``name`` in ``fd``, or None when it does not exist; raises OSError(ELOOP) for a link."""
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise OSError(errno.ELOOP, "a symbolic link") from None
        raise


def _make_dir(fd, name):
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=fd)
    return os.open(name, _DIR, dir_fd=fd)


def _trusted(st, uid):
    """Why a directory on the way cannot be trusted (None when it can): StrictModes' rule, sticky ones allowed."""
    if st.st_uid not in (uid, 0):
        return "belongs to another user"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "is writable by other users"
    return None


def _planted(fd, name, uid):
    """Why the symbolic link ``name`` in directory ``fd`` cannot be followed (None when it can): in a sticky directory
    others may write (/tmp) anyone may place a link, so only the user's or root's is followed (the kernel's
    protected_symlinks rule); elsewhere the walk has checked that only the user or root can change the directory."""
    where = os.fstat(fd)
    if not (where.st_mode & stat.S_ISVTX and where.st_mode & 0o022):
        return None
    if os.stat(name, dir_fd=fd, follow_symlinks=False).st_uid in (uid, 0):
        return None
    return "is a symbolic link another user placed in a sticky directory"


def _private(st, uid):
    """Why a directory cannot be autotune's own (None when it can)."""
    if st.st_uid != uid:
        return "belongs to another user"
    if st.st_mode & 0o022:
        return "is writable by other users"
    return None


def _walk(path, uid, workdir):
    """An open descriptor of directory ``path`` (absolute), each directory on the way checked; returns (fd, the
    path it resolved to)."""
    fd = os.open("/", _DIR)
    why = _trusted(os.fstat(fd), uid)
    if why:
        os.close(fd)
        raise _refuse("/", why, workdir)
    stack = []
    here = "/"
    todo = [c for c in path.split("/") if c and c != "."]
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            if name == "..":
                if stack:
                    os.close(fd)
                    fd, here = stack.pop()
                continue
            try:
                nfd = _open_dir(fd, name)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise _refuse(_join(here, name), "is not a directory", workdir) from None
                links += 1
                if links > MAX_LINKS:
                    raise _refuse(_join(here, name), "leads through too many symbolic links", workdir) from None
                why = _planted(fd, name, uid)
                if why:
                    raise _refuse(_join(here, name), why, workdir) from None
                target = os.readlink(name, dir_fd=fd)
                todo = [c for c in target.split("/") if c and c != "."] + todo
                if target.startswith("/"):
                    for parent, _ in stack:
                        os.close(parent)
                    stack = []
                    os.close(fd)
                    fd, here = os.open("/", _DIR), "/"
                continue
            if nfd is None:
                nfd = _make_dir(fd, name)
            why = _trusted(os.fstat(nfd), uid)
            if why:
                os.close(nfd)
                raise _refuse(_join(here, name), why, workdir)
            stack.append((fd, here))
            fd, here = nfd, _join(here, name)
    except BaseException:
        os.close(fd)
        raise
    finally:
        for parent, _ in stack:
            os.close(parent)
    return fd, here


def _enter_private(fd, name, shown, uid):
    """autotune's own directory ``name`` in ``fd`` (created 0700 when missing); closes ``fd``."""
    try:
        try:
            nfd = _open_dir(fd, name)
        except OSError as e:
            raise _refuse(shown, "is a symbolic link" if e.errno == errno.ELOOP else "is not a directory") from None
        if nfd is None:
            nfd = _make_dir(fd, name)
    finally:
        os.close(fd)
    why = _private(os.fstat(nfd), uid)
    if why:
        os.close(nfd)
        raise _refuse(shown, why)
    return nfd


def open_private(workdir, subdir=""):
    """An open descriptor of ``workdir/subdir`` (absolute ``workdir``; ``subdir`` one name or ""), checked as the
    module says; raises ``Refused``."""
    uid = os.geteuid()
    parent, _, last = workdir.rstrip("/").rpartition("/")
    if not workdir.startswith("/") or last in ("", ".", ".."):
        raise _refuse(workdir, "is not an absolute path to a directory")
    fd, _ = _walk(parent or "/", uid, workdir)
    fd = _enter_private(fd, last, workdir, uid)
    if subdir:
        fd = _enter_private(fd, check_name(subdir), workdir.rstrip("/") + "/" + subdir, uid)
    return fd


def check_name(name):
    """``name`` if it is one plain file name."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError("not a file name: %r" % (name,))
    return name


def read_file(dfd, name, where=""):
    """The bytes of regular file ``name`` in ``dfd`` (None when it does not exist); a link is refused (``where``:
    the directory's path, for the message)."""
    try:
        fd = os.open(check_name(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused("autotune: %s%s is a symbolic link: refusing to read it" % (where, name)) from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise Refused("autotune: %s%s is not a regular file: refusing to read it" % (where, name))
        return f.read()


def write_file(dfd, name, data, mode=0o600, exclusive=False):
    """Write ``name`` in ``dfd`` whole: a new temporary beside it (never an existing file or link), then a rename
    over it, or with ``exclusive`` a link that fails when ``name`` exists. Returns False when it existed."""
    check_name(name)
    tmp = "%s.tmp-%s" % (name, secrets.token_hex(6))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
        if exclusive:
            try:
                os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                return False
            return True
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)


def create_file(dfd, name, mode=0o600, flags=os.O_WRONLY | os.O_APPEND):
    """A new file ``name`` in ``dfd`` opened for writing; fails if anything (a link too) is there already."""
    return os.open(check_name(name), flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dfd)


def remove_file(dfd, name):
    """Remove ``name`` from ``dfd`` (a link itself, never what it points to); False when it did not exist."""
    try:
        os.unlink(check_name(name), dir_fd=dfd)
    except FileNotFoundError:
        return False
    return True


def rename_file(dfd, src, dst):
    os.rename(check_name(src), check_name(dst), src_dir_fd=dfd, dst_dir_fd=dfd)
