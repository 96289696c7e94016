"""The system-call filter every sandboxed command runs under: no file it makes or changes grants privileges.

A command's files land on the host (the workspace, the writable paths, the
home layer, the trial's /tmp): a setuid or setgid bit set there by the
command's own uid (which, for a root caller, is root on the host) would hand
any later user of the file that uid. Capabilities do not stop it, since the
owner of a file may always chmod it, so the filter does: a call that would
set S_ISUID or S_ISGID on a file (chmod, fchmod, fchmodat, fchmodat2; a mode
given to open, openat, creat, mkdir, mkdirat) fails with EPERM, and so does
mknod of a character or block device. openat2 and io_uring, whose modes lie
in memory a filter cannot read, are ENOSYS (libc falls back to openat).
File capabilities and device nodes are held by the capabilities both backends
drop (CAP_SETFCAP, CAP_MKNOD); docs/sandbox.md says what else holds.

One table of rules, two forms: a classic BPF program for bwrap's `--seccomp`
(x86_64 and aarch64, every other architecture and x86's x32 ABI killed), and
a profile for docker's `--security-opt seccomp=`, which replaces docker's
default profile and so also closes what the privileges both backends drop
leave reachable (keyrings, bpf, perf, userfaultfd, new user namespaces).
"""

from __future__ import annotations

import errno
import platform
import struct

#: The bits that grant privileges: S_ISUID | S_ISGID.
PRIVILEGED_BITS = 0o6000
_S_IFMT, _S_IFCHR, _S_IFBLK = 0o170000, 0o020000, 0o060000

#: (name, x86_64 number, aarch64 number or None, the mode's argument, "mode" | "node").
_MODES: tuple[tuple[str, int, int | None, int, str], ...] = (
    ("chmod", 90, None, 1, "mode"),
    ("fchmod", 91, 52, 1, "mode"),
    ("fchmodat", 268, 53, 2, "mode"),
    ("fchmodat2", 452, 452, 2, "mode"),
    ("open", 2, None, 2, "mode"),
    ("creat", 85, None, 1, "mode"),
    ("openat", 257, 56, 3, "mode"),
    ("mkdir", 83, None, 1, "mode"),
    ("mkdirat", 258, 34, 2, "mode"),
    ("mknod", 133, None, 1, "node"),
    ("mknodat", 259, 33, 2, "node"),
)
#: Calls whose modes a filter cannot see: (name, x86_64, aarch64).
_UNSEEN: tuple[tuple[str, int, int], ...] = (
    ("openat2", 437, 437),
    ("io_uring_setup", 425, 425),
    ("io_uring_enter", 426, 426),
    ("io_uring_register", 427, 427),
)
#: Docker's profile only: what its default profile keeps from a container and ours must too.
_CONTAINER_ONLY = ("keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "kexec_load",
                   "open_by_handle_at", "name_to_handle_at", "fsopen", "fsmount", "fspick", "move_mount",
                   "open_tree", "pidfd_getfd", "process_vm_readv", "process_vm_writev")  # fmt: skip
_CLONE_NEWUSER = 0x10000000

#: uname's machine: (the audit architecture seccomp reports, libseccomp's name for it, which numbers).
_ARCHES = {
    "x86_64": (0xC000003E, "SCMP_ARCH_X86_64", 1),
    "aarch64": (0xC00000B7, "SCMP_ARCH_AARCH64", 2),
    "arm64": (0xC00000B7, "SCMP_ARCH_AARCH64", 2),
}
_X32_BIT = 0x40000000

_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_LD_ABS, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
#: Offsets in struct seccomp_data: nr, arch, then args[6] of 8 bytes each (the low word first here).
_NR, _ARCH, _ARGS = 0, 4, 16


class Unsupported(Exception):
    """This machine's architecture has no filter here: sandboxes refuse to run rather than run without it."""


def _arch() -> tuple[int, str, int]:
    machine = platform.machine()
    if machine not in _ARCHES:
        raise Unsupported(f"no system-call filter for the {machine} architecture (x86_64 and aarch64 have one)")
    return _ARCHES[machine]


def program() -> bytes:
    """The classic BPF program (struct sock_filter[], native order) that bwrap's --seccomp loads."""
    audit, _, column = _arch()
    # Instructions as (code, jump-if-true label, jump-if-false label, k): labels resolve to offsets below.
    code: list[tuple[int, str | None, str | None, int]] = [
        (_LD_ABS, None, None, _ARCH),
        (_JEQ, None, "kill", audit),
        (_LD_ABS, None, None, _NR),
    ]
    if column == 1:
        code.append((_JGE, "kill", None, _X32_BIT))
    for _, x86_64, aarch64 in _UNSEEN:
        code.append((_JEQ, "nosys", None, x86_64 if column == 1 else aarch64))
    checks = sorted({(argument, kind) for *_, argument, kind in _MODES})
    for _, *numbers, argument, kind in _MODES:
        number = numbers[column - 1]
        if number is not None:
            code.append((_JEQ, f"{kind}{argument}", None, number))
    code.append((_RET, None, None, _RET_ALLOW))
    labels: dict[str, int] = {}
    for argument, kind in checks:
        labels[f"{kind}{argument}"] = len(code)
        code += [(_LD_ABS, None, None, _ARGS + 8 * argument), (_JSET, "deny", None, PRIVILEGED_BITS)]
        if kind == "node":
            code += [(_AND, None, None, _S_IFMT), (_JEQ, "deny", None, _S_IFCHR), (_JEQ, "deny", None, _S_IFBLK)]
        code.append((_RET, None, None, _RET_ALLOW))
    for label, value in (("deny", errno.EPERM), ("nosys", errno.ENOSYS)):
        labels[label] = len(code)
        code.append((_RET, None, None, _RET_ERRNO | value))
    labels["kill"] = len(code)
    code.append((_RET, None, None, _RET_KILL_PROCESS))
    out = bytearray()
    for index, (op, true, false, k) in enumerate(code):
        jumps = [0 if label is None else labels[label] - index - 1 for label in (true, false)]
        assert all(0 <= jump < 256 for jump in jumps), "a jump past what one instruction can reach"
        out += struct.pack("=HBBI", op, jumps[0], jumps[1], k)
    return bytes(out)


def profile() -> dict[str, object]:
    """The same rules as a docker seccomp profile (JSON), with what docker's default one would also deny."""
    _, arch, column = _arch()

    def rule(names: list[str], action: int, *args: dict[str, object]) -> dict[str, object]:
        return {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": action, "args": list(args)}

    def masked(index: int, mask: int, value: int) -> dict[str, object]:
        return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}

    rules = []
    for name, *numbers, argument, kind in _MODES:
        if numbers[column - 1] is None:
            continue
        rules += [rule([name], errno.EPERM, masked(argument, bit, bit)) for bit in (0o4000, 0o2000)]
        if kind == "node":
            rules += [rule([name], errno.EPERM, masked(argument, _S_IFMT, node)) for node in (_S_IFCHR, _S_IFBLK)]
    rules.append(rule([row[0] for row in _UNSEEN], errno.ENOSYS))
    rules.append(rule(["clone3"], errno.ENOSYS))  # its flags lie in memory: libc falls back to clone
    rules.append(rule(list(_CONTAINER_ONLY), errno.EPERM))
    # clone's flags are its first argument on both architectures; unshare's too.
    rules += [rule([name], errno.EPERM, masked(0, _CLONE_NEWUSER, _CLONE_NEWUSER)) for name in ("clone", "unshare")]
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [arch], "syscalls": rules}


__all__ = ["PRIVILEGED_BITS", "Unsupported", "profile", "program"]
