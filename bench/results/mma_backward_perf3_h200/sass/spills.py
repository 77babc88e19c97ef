"""Local loads and stores (LDL/STL) in every mma_backward_kernel of the given SASS files.
Usage: spills.py FILE.sass..."""
import re, sys
for fn in sys.argv[1:]:
    text = open(fn).read()
    for f in re.split(r"\n\s*Function : ", text)[1:]:
        name = f.split("\n",1)[0].strip()
        if "mma_backward_kernel" not in name: continue
        ldl = len(re.findall(r"\bLDL\b", f)); stl = len(re.findall(r"\bSTL\b", f))
        m = re.search(r"Traits(ILi\d+E).*?(LogitsFlagsILb(\d)ELb(\d)E|RuntimeLogits)", name)
        ty = "bf16" if "bfloat16" in name else "f16"
        print(fn, ty, m.group(1), m.group(2)[-12:], "LDL", ldl, "STL", stl)
