"""The system calls the seccomp filter names, by architecture, with their numbers.

Numbers are the kernel's own (arch/x86/entry/syscalls/syscall_64.tbl for x86-64; the
generic table, include/uapi/asm-generic/unistd.h, for aarch64); since 424 both share one
numbering. A name missing from an architecture's table (aarch64 has no ``fork``, no
``open``) is simply not there to deny.
"""

from __future__ import annotations

__all__ = [
    "AARCH64",
    "ARCHES",
    "DENIED",
    "FIRST_UNKNOWN",
    "GUARDED",
    "X86_64",
    "arch_named",
]

# Calls newer than this table are answered ENOSYS, as a kernel without them would: a new
# call cannot open a door the filter was never told about.
FIRST_UNKNOWN = 470

# Refused with EPERM, grouped by what they would let a program do.
DENIED: dict[str, tuple[str, ...]] = {
    "start a program or a process": ("execve", "execveat", "fork", "vfork"),
    "reach another process": (
        "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open",
        "pidfd_getfd", "pidfd_send_signal", "tkill", "process_madvise", "process_mrelease",
        "get_robust_list", "migrate_pages", "move_pages", "setpriority", "ioprio_set",
        "sched_setparam", "sched_setscheduler", "sched_setaffinity", "sched_setattr",
    ),
    "open a network socket": ("socket",),
    "change who it is": (
        "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid",
        "setfsgid", "setgroups", "capset", "personality", "lsm_set_self_attr",
    ),
    "change files' metadata (Landlock does not cover it)": (
        "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
        "utime", "utimes", "futimesat", "utimensat", "setxattr", "lsetxattr", "fsetxattr",
        "setxattrat", "removexattr", "lremovexattr", "fremovexattr", "removexattrat",
        "file_setattr", "truncate", "mknod", "mknodat",
    ),
    "watch or share memory and files beyond its life": (
        "memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "shmdt", "semget",
        "semop", "semctl", "semtimedop", "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open",
        "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
        "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init",
        "fanotify_mark", "userfaultfd", "io_uring_setup", "io_uring_enter",
        "io_uring_register", "perf_event_open", "bpf",
    ),
    "administer the kernel": (
        "mount", "umount2", "unshare", "setns", "pivot_root", "chroot", "fsopen", "fsconfig",
        "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
        "statmount", "listmount", "keyctl", "add_key", "request_key", "kexec_load",
        "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
        "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "open_by_handle_at",
        "name_to_handle_at", "syslog", "vhangup", "settimeofday", "clock_settime",
        "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "modify_ldt", "iopl",
        "ioperm", "uselib", "lookup_dcookie", "sysfs", "ustat", "_sysctl", "nfsservctl",
        "create_module", "get_kernel_syms", "query_module", "vserver",
    ),
}  # fmt: skip

# Allowed only for some arguments (the filter's blocks name the rule for each).
GUARDED = (
    "clone", "clone3", "socketpair", "kill", "tgkill", "rt_sigqueueinfo",
    "rt_tgsigqueueinfo", "prlimit64", "fcntl", "ioctl",
)  # fmt: skip

X86_64: dict[str, int] = {
    "socket": 41, "socketpair": 53, "clone": 56, "fork": 57, "vfork": 58, "execve": 59,
    "kill": 62, "fcntl": 72, "truncate": 76, "chmod": 90, "fchmod": 91, "chown": 92,
    "fchown": 93, "lchown": 94, "ioctl": 16, "shmget": 29, "shmat": 30, "shmctl": 31,
    "semget": 64, "semop": 65, "semctl": 66, "shmdt": 67, "msgget": 68, "msgsnd": 69,
    "msgrcv": 70, "msgctl": 71, "ptrace": 101, "syslog": 103, "setuid": 105, "setgid": 106,
    "setreuid": 113, "setregid": 114, "setgroups": 116, "setresuid": 117, "setresgid": 119,
    "setfsuid": 122, "setfsgid": 123, "capset": 126, "rt_sigqueueinfo": 129, "utime": 132,
    "mknod": 133, "uselib": 134, "personality": 135, "ustat": 136, "sysfs": 139,
    "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144, "vhangup": 153,
    "modify_ldt": 154, "pivot_root": 155, "_sysctl": 156, "adjtimex": 159, "chroot": 161,
    "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167,
    "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172,
    "ioperm": 173, "create_module": 174, "init_module": 175, "delete_module": 176,
    "get_kernel_syms": 177, "query_module": 178, "quotactl": 179, "nfsservctl": 180,
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197,
    "lremovexattr": 198, "fremovexattr": 199, "tkill": 200, "sched_setaffinity": 203,
    "lookup_dcookie": 212, "semtimedop": 220, "clock_settime": 227, "tgkill": 234,
    "utimes": 235, "vserver": 236, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242,
    "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "ioprio_set": 251,
    "inotify_init": 253, "inotify_add_watch": 254, "migrate_pages": 256, "mknodat": 259,
    "fchownat": 260, "futimesat": 261, "fchmodat": 268, "unshare": 272,
    "get_robust_list": 274, "move_pages": 279, "utimensat": 280, "inotify_init1": 294,
    "rt_tgsigqueueinfo": 297, "perf_event_open": 298, "fanotify_init": 300,
    "fanotify_mark": 301, "prlimit64": 302, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "sched_setattr": 314,
    "memfd_create": 319, "kexec_file_load": 320, "bpf": 321, "execveat": 322,
    "userfaultfd": 323,
}  # fmt: skip

AARCH64: dict[str, int] = {
    "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
    "fremovexattr": 16, "lookup_dcookie": 18, "fcntl": 25, "inotify_init1": 26,
    "inotify_add_watch": 27, "ioctl": 29, "ioprio_set": 30, "mknodat": 33, "umount2": 39,
    "mount": 40, "pivot_root": 41, "nfsservctl": 42, "truncate": 45, "chroot": 51,
    "fchmod": 52, "fchmodat": 53, "fchownat": 54, "fchown": 55, "vhangup": 58,
    "quotactl": 60, "utimensat": 88, "acct": 89, "capset": 91, "personality": 92,
    "unshare": 97, "get_robust_list": 100, "kexec_load": 104, "init_module": 105,
    "delete_module": 106, "clock_settime": 112, "syslog": 116, "ptrace": 117,
    "sched_setparam": 118, "sched_setscheduler": 119, "sched_setaffinity": 122,
    "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "setpriority": 140,
    "reboot": 142, "setregid": 143, "setgid": 144, "setreuid": 145, "setuid": 146,
    "setresuid": 147, "setresgid": 149, "setfsuid": 151, "setfsgid": 152,
    "setgroups": 159, "sethostname": 161, "setdomainname": 162, "settimeofday": 170,
    "adjtimex": 171, "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182,
    "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185, "msgget": 186,
    "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190, "semctl": 191,
    "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195, "shmat": 196,
    "shmdt": 197, "socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218,
    "keyctl": 219, "clone": 220, "execve": 221, "swapon": 224, "swapoff": 225,
    "migrate_pages": 238, "move_pages": 239, "rt_tgsigqueueinfo": 240,
    "perf_event_open": 241, "prlimit64": 261, "fanotify_init": 262, "fanotify_mark": 263,
    "name_to_handle_at": 264, "open_by_handle_at": 265, "clock_adjtime": 266, "setns": 268,
    "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "finit_module": 273,
    "sched_setattr": 274, "memfd_create": 279, "bpf": 280, "execveat": 281,
    "userfaultfd": 282, "kexec_file_load": 294,
}  # fmt: skip

# One numbering for every architecture from 424 on.
_SHARED: dict[str, int] = {
    "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435,
    "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443,
    "memfd_secret": 447, "process_mrelease": 448, "fchmodat2": 452, "statmount": 457,
    "listmount": 458, "lsm_set_self_attr": 460, "setxattrat": 463, "removexattrat": 466,
    "open_tree_attr": 467, "file_setattr": 469,
}  # fmt: skip
X86_64.update(_SHARED)
AARCH64.update(_SHARED)

# (machine as os.uname() names it, AUDIT_ARCH_* the filter checks, numbers, whether the
# x32 ABI's bit must be refused)
ARCHES: dict[str, tuple[int, dict[str, int], bool]] = {
    "x86_64": (0xC000003E, X86_64, True),
    "aarch64": (0xC00000B7, AARCH64, False),
}


def arch_named(machine: str) -> tuple[int, dict[str, int], bool] | None:
    """The filter's data for ``machine`` (``os.uname().machine``), or None when unsupported."""
    return ARCHES.get("aarch64" if machine == "arm64" else machine)
