#!/usr/bin/env python3
"""Static counts of one kernel's SASS: instruction mix (HMMA, LDSM, REDG/ATOMG, SHFL,
LDL/STL, BAR...) and, for each LDSM, the number of instructions until the first one that
reads one of its destination registers.
Usage: sass_stats.py FILE.sass REGEX   (FILE from `cuobjdump -sass x.o`; REGEX picks the
mangled kernel name, e.g. 'bfloat16NS1_17MmaBackwardTraitsILi128EEENS0_11LogitsFlagsILb0ELb0EEELb1E')"""
import re, sys, collections
text = open(sys.argv[1]).read()
want = sys.argv[2]  # substring of the mangled kernel name
funcs = re.split(r"\n\s*Function : ", text)
body = None
for f in funcs[1:]:
    name = f.split("\n", 1)[0].strip()
    if re.search(want, name):
        body = f; print("kernel:", name[:160]); break
if body is None: sys.exit("no kernel matches " + want)
ins = []
for line in body.split("\n"):
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m: ins.append(m.group(2).strip())
ops = collections.Counter()
for s in ins:
    op = s.split()[0] if not s.startswith("@") else s.split()[1]
    ops[op.split(".")[0]] += 1
print("instructions", len(ins))
for k in ["HMMA", "LDSM", "REDG", "RED", "ATOMG", "SHFL", "LDL", "STL", "BAR", "MUFU", "LDGSTS", "STS", "LDS", "BRA"]:
    print(f"  {k:7s} {ops.get(k, 0)}")
def regs(tok):
    m = re.match(r"-?\|?R(\d+)", tok)
    return int(m.group(1)) if m else None
dist = []
for i, s in enumerate(ins):
    parts = s.split(None, 1)
    if parts[0].startswith("@"): parts = parts[1].split(None, 1)
    if not parts[0].startswith("LDSM"): continue
    n = 4 if ".4" in parts[0] else (2 if ".2" in parts[0] else 1)
    d0 = regs(parts[1].split(",")[0].strip())
    dest = set(range(d0, d0 + n))
    for j in range(i + 1, min(i + 400, len(ins))):
        p = ins[j].split(None, 1)
        if p[0].startswith("@"): p = p[1].split(None, 1)
        if len(p) < 2: continue
        operands = [o.strip() for o in p[1].split(",")]
        srcs = operands[1:] if not p[0].startswith(("ST", "RED", "BAR")) else operands
        used = set()
        widths = [4, 2, 4] if p[0].startswith("HMMA") else [1] * len(srcs)
        for o, w in zip(srcs, widths + [1] * len(srcs)):
            r = regs(o.strip("[] "))
            if r is not None:
                used.update(range(r, r + w))
        if used & dest:
            dist.append(j - i); break
if dist:
    c = collections.Counter(min(d, 20) for d in dist)
    print("LDSM -> first use distance (instructions; 20 = 20+):", dict(sorted(c.items())))
    print("  median", sorted(dist)[len(dist) // 2], " <=3:", sum(d <= 3 for d in dist), "of", len(dist))
