#!/usr/bin/env python3
"""mma_sass_same.py OLD.o NEW.o: per kernel of two builds of a file (for example nvcc -c
src/cuda/03_mma/hdim128.cu for sm_90a from two trees), whether the SASS instruction stream
is identical (cuobjdump -sass; function names and addresses aside)."""
import re, subprocess, sys
def kernels(path):
    sass = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True).stdout
    out = {}
    for k in re.split(r"\n\s*Function : ", sass)[1:]:
        name = k.split("\n", 1)[0].strip()
        ins = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", k)]
        out[name] = ins
    return out
old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
for name in sorted(set(old) | set(new)):
    short = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    short = re.sub(r"void flashtile::detail::mma::mma_forward_kernel<|>\(flashtile.*", "", short)
    short = short.replace("flashtile::detail::", "")
    if name not in old or name not in new:
        print(f"only in {'new' if name in new else 'old'}: {short}"); continue
    same = old[name] == new[name]
    print(f"{'identical' if same else 'DIFFERENT'} ({len(old[name])} -> {len(new[name])} instr): {short}")
