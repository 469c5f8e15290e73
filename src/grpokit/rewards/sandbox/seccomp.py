"""A seccomp filter for the sandbox, built as classic BPF in pure Python and loaded by `bwrap --seccomp`.

It answers EPERM to the system calls a program that computes answers never needs and that are the
kernel's usual attack surface: new namespaces (unshare, setns, clone with any CLONE_NEW* flag; clone3 gets
ENOSYS so the C library falls back to clone, whose flags a filter can read), mounts, io_uring,
userfaultfd, keyrings, bpf, ptrace and reading other processes' memory, perf events, kernel modules,
kexec, reboot, swap, quotas, fanotify and open_by_handle_at. A system call of another ABI (x32 on
x86-64, or a foreign architecture) kills the process. Syscall numbers are checked against the kernel
headers (asm/unistd_64.h for x86-64, asm-generic/unistd.h for aarch64); on other machines
`filter_bytes()` returns None and the sandbox runs without the filter (docs/REWARDS.md says so).
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr (offset 0), u32 arch (4), u64 ip (8), u64 args[6] (16...)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # the low 32 bits of args[0] on a little-endian machine
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_X32_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

DENIED = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "perf_event_open",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "fanotify_init",
    "open_by_handle_at",
    "syslog",
    "lookup_dcookie",
    "nfsservctl",
)

GENERIC_NUMBERS = dict(  # syscalls added since Linux 5.1 share one number on every architecture
    io_uring_setup=425,
    io_uring_enter=426,
    io_uring_register=427,
    open_tree=428,
    move_mount=429,
    fsopen=430,
    fsconfig=431,
    fsmount=432,
    fspick=433,
    pidfd_getfd=438,
    mount_setattr=442,
    quotactl_fd=443,
)

SYSCALLS = {  # machine -> (AUDIT_ARCH_*, {name: number}); only what the filter names
    "x86_64": (
        0xC000003E,
        dict(
            clone=56,
            clone3=435,
            ptrace=101,
            syslog=103,
            pivot_root=155,
            chroot=161,
            acct=163,
            mount=165,
            umount2=166,
            swapon=167,
            swapoff=168,
            reboot=169,
            init_module=175,
            delete_module=176,
            quotactl=179,
            nfsservctl=180,
            lookup_dcookie=212,
            kexec_load=246,
            add_key=248,
            request_key=249,
            keyctl=250,
            unshare=272,
            perf_event_open=298,
            fanotify_init=300,
            open_by_handle_at=304,
            setns=308,
            process_vm_readv=310,
            process_vm_writev=311,
            kcmp=312,
            finit_module=313,
            kexec_file_load=320,
            bpf=321,
            userfaultfd=323,
            **GENERIC_NUMBERS,
            iopl=172,
            ioperm=173,
            uselib=134,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            clone=220,
            clone3=435,
            lookup_dcookie=18,
            umount2=39,
            mount=40,
            pivot_root=41,
            nfsservctl=42,
            chroot=51,
            quotactl=60,
            acct=89,
            unshare=97,
            kexec_load=104,
            init_module=105,
            delete_module=106,
            syslog=116,
            ptrace=117,
            reboot=142,
            add_key=217,
            request_key=218,
            keyctl=219,
            swapon=224,
            swapoff=225,
            perf_event_open=241,
            fanotify_init=262,
            open_by_handle_at=265,
            setns=268,
            process_vm_readv=270,
            process_vm_writev=271,
            kcmp=272,
            finit_module=273,
            bpf=280,
            userfaultfd=282,
            kexec_file_load=294,
            **GENERIC_NUMBERS,
        ),
    ),
}
X86_ONLY = ("iopl", "ioperm", "uselib")


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)  # struct sock_filter, native byte order


def filter_bytes(machine: str | None = None) -> bytes | None:
    """The filter as an array of struct sock_filter, or None when this machine's table is unknown."""
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        return None
    arch, nr = SYSCALLS[machine]
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    prog = [_insn(_LD_ABS, _ARCH), _insn(_JEQ, arch, jt=1), _insn(_RET, _KILL_PROCESS), _insn(_LD_ABS, _NR)]
    if machine == "x86_64":
        prog += [_insn(_JGE, _X32_BIT, jf=1), _insn(_RET, _KILL_PROCESS)]
    for name in DENIED + (X86_ONLY if machine == "x86_64" else ()):
        prog += [_insn(_JEQ, nr[name], jf=1), _insn(_RET, eperm)]
    prog += [
        _insn(_JEQ, nr["clone3"], jf=1),
        _insn(_RET, enosys),
        _insn(_JEQ, nr["clone"], jf=3),
        _insn(_LD_ABS, _ARG0_LOW),  # not clone: jump to ALLOW
        _insn(_JSET, CLONE_NEW_ANY, jf=1),
        _insn(_RET, eperm),
        _insn(_RET, _ALLOW),
    ]
    return b"".join(prog)
