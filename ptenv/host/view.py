"""The filesystem and namespaces every local sandbox lives in (bubblewrap's view of this machine),
and the one line that says how this process's sandboxes are isolated."""

import importlib.metadata
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from ptenv import inside
from ptenv.inside import cgroups

PTENV_ROOT = "/opt/ptenv"
SITE_PACKAGES = "/opt/site-packages"
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/hosts",
)
NO_FALLBACK = "nothing runs unsandboxed"
NO_CGROUP = "memory polled, memfd and SysV shared memory denied, CPU shared by autogroup"  # seccomp.py


class SandboxUnavailableError(RuntimeError):
    """No sandbox could be made: this machine cannot isolate one (no bubblewrap, no namespaces,
    not root), or the fork server failed."""


def sandbox_command(argv: list[str], privileged: bool = False) -> list[str]:
    """`bwrap ... -- argv`: the filesystem and namespaces every sandbox process lives in.

    Visible, read-only: /usr (and the /bin, /lib... links into it), a few /etc files, the Python
    installation, the venv's site-packages (with this project's own installed files masked) and
    the files of ptenv/inside (inside.FILES). Nothing of the repo, /work, /root or the Hugging Face cache.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError(
            f"bubblewrap (bwrap) is not installed: install it with `apt-get install bubblewrap`; {NO_FALLBACK}"
        )
    prefix = sys.base_prefix
    env = {
        "PATH": f"{prefix}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "USER": "sandbox",  # getpass.getuser() needs a name; the sandbox uid has no passwd entry
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "PYTHONPATH": f"{PTENV_ROOT}:{SITE_PACKAGES}",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "OMP_NUM_THREADS": "1",
        # Each thread would otherwise reserve a 64 MiB malloc arena of the sandbox's address space.
        "MALLOC_ARENA_MAX": "2",
    }
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    args += ["--die-with-parent", "--new-session", "--clearenv"]
    if os.geteuid() != 0:  # rootless: uid 0 of a user namespace of our own, mapped to our uid
        args += ["--unshare-user", "--uid", "0", "--gid", "0"]
    if privileged:  # the fork server needs root's capabilities (in that namespace) to build sandboxes
        args += ["--cap-add", "ALL"]
    for name, value in env.items():
        args += ["--setenv", name, value]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    binds = [("/usr", "/usr")]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):  # merged /usr (Debian): these are links into /usr
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            binds.append((top, top))
    binds += [(path, path) for path in ETC_FILES if os.path.exists(path)]
    if not prefix.startswith("/usr/"):
        binds.append((prefix, prefix))
    site = sysconfig.get_paths()["purelib"]
    binds.append((site, SITE_PACKAGES))
    binds += [(str(inside.SOURCE_ROOT / rel), f"{PTENV_ROOT}/{rel}") for rel in inside.FILES]
    made = {"/", "/tmp", "/dev", "/proc"}
    for src, dest in binds:
        # bwrap would create missing parents 0700, unreadable for the sandbox's uid.
        for parent in reversed(Path(dest).parents):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", src, dest]
    for path in installed_project_files():
        for visible_root, host_root in ((SITE_PACKAGES, site), (prefix, prefix)):
            if path.is_relative_to(host_root) and path.is_file():
                args += ["--ro-bind", "/dev/null", str(visible_root / path.relative_to(host_root))]
                break
    # Read-only: rootless, they belong to the sandbox's uid, and every sandbox of the fork server sees them.
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return args + ["--chdir", "/tmp", "--", *argv]


def isolation_mode() -> str:
    """How this process's sandboxes will be isolated (README, "The sandbox"), in one line."""
    reason = cgroups.unavailable()
    if os.geteuid() == 0:
        who = "root: two host uids per sandbox"
    else:
        who = "rootless: one user namespace per sandbox, the user's uid for all"
    if reason is None:
        return f"{who}; {cgroups.chosen()}"
    return f"{who}; no cgroup ({reason}): {NO_CGROUP}"


def installed_project_files() -> list[Path]:
    """This project's files in an installation (a wheel puts the task catalogue and train.jsonl there)."""
    try:
        dist = importlib.metadata.distribution("pytorch-env")
    except importlib.metadata.PackageNotFoundError:
        return []
    return [Path(dist.locate_file(f)).resolve() for f in dist.files or []]
