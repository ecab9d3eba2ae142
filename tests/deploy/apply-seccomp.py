#!/usr/bin/python3
"""Runs a program under an OCI runtime's seccomp profile (the JSON a
kubelet's `Localhost` profile or runc's `linux.seccomp` takes), as the
runtime would apply it: libseccomp, the profile's default action, its rules
with their argument conditions; names unknown on this architecture are
skipped, as runc and crun skip them.

    apply-seccomp.py PROFILE PROGRAM [ARG...]
"""

import errno
import json
import os
import sys

import seccomp

OPS = {
    "SCMP_CMP_NE": seccomp.NE,
    "SCMP_CMP_LT": seccomp.LT,
    "SCMP_CMP_LE": seccomp.LE,
    "SCMP_CMP_EQ": seccomp.EQ,
    "SCMP_CMP_GE": seccomp.GE,
    "SCMP_CMP_GT": seccomp.GT,
    "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ,
}


def action(name, errno_ret):
    if name == "SCMP_ACT_ALLOW":
        return seccomp.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return seccomp.ERRNO(errno_ret)
    if name == "SCMP_ACT_KILL":
        return seccomp.KILL
    raise SystemExit(f"apply-seccomp: action {name} is not handled here")


def arg(condition):
    op = OPS[condition["op"]]
    if op == seccomp.MASKED_EQ:
        # OCI: value is the mask, valueTwo what the masked argument equals.
        return seccomp.Arg(condition["index"], op, condition["value"], condition.get("valueTwo", 0))
    return seccomp.Arg(condition["index"], op, condition["value"])


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        profile = json.load(f)
    default_errno = profile.get("defaultErrnoRet", errno.EPERM)
    rules = seccomp.SyscallFilter(action(profile["defaultAction"], default_errno))
    for rule in profile["syscalls"]:
        act = action(rule["action"], rule.get("errnoRet", default_errno))
        args = [arg(c) for c in rule.get("args", [])]
        for name in rule["names"]:
            try:
                seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
            except (ValueError, RuntimeError):
                continue
            rules.add_rule(act, name, *args)
    rules.load()
    os.execv(sys.argv[2], sys.argv[2:])


main()
