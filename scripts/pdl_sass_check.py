#!/usr/bin/env python3
"""Where each kernel's global loads sit against its PDL wait, from `cuobjdump -sass` text.

ptxas sinks loads whose results are used only after `griddepcontrol.wait` (SASS: ACQBULK) below it, so a
kernel written to start its weight stream before the wait may not (without pdl_begin_after_loads' branch, no
warp-per-row GEMV did).
Prints per kernel, in code order, a run-length sequence of: WAIT (ACQBULK), W (streaming weight loads,
LDG.E.NA*), C (other read-only loads, LDG*.CONSTANT), L (other loads), S (cp.async, LDGSTS).
Usage: pdl_sass_check.py DUMP.txt [NAME_REGEX]
"""
import re
import subprocess
import sys


def kind(line):
    if "ACQBULK" in line:
        return "WAIT"
    if "LDGSTS" in line:
        return "S"
    if re.search(r"\bLDG\.E\.NA", line):
        return "W"
    if re.search(r"\bLDG\S*CONSTANT", line):
        return "C"
    if re.search(r"\bLDG\b|\bLDG\.", line):
        return "L"
    return None


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    pattern = re.compile(sys.argv[2]) if len(sys.argv) > 2 else None
    funcs, cur = [], None
    with open(sys.argv[1], errors="replace") as f:
        for line in f:
            m = re.search(r"Function : (\S+)", line)
            if m:
                cur = [m.group(1), []]
                funcs.append(cur)
            elif cur is not None:
                k = kind(line)
                if k:
                    cur[1].append(k)
    names = subprocess.run(["c++filt"], input="\n".join(f[0] for f in funcs), capture_output=True,
                           text=True).stdout.split("\n")
    for (mangled, seq), name in zip(funcs, names):
        name = re.sub(r"markbase::cuda::\(anonymous namespace\)::", "", name or mangled)
        if pattern and not pattern.search(name):
            continue
        runs, prev, n = [], None, 0
        for k in seq + [None]:
            if k == prev:
                n += 1
                continue
            if prev:
                runs.append(prev + (str(n) if n > 1 else ""))
            prev, n = k, 1
        print(f"{name[:100]:100s} {' '.join(runs[:16])}")


if __name__ == "__main__":
    main()
