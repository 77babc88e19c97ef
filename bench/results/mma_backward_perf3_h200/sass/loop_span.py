"""The main loop of one kernel's SASS: the backward branch that spans every HMMA, its length
in instructions and its instruction mix. Usage: loop_span.py FILE.sass REGEX (as sass_stats.py)."""
import re, sys, collections
text = open(sys.argv[1]).read()
f = [x for x in re.split(r"\n\s*Function : ", text)[1:] if re.search(sys.argv[2], x.split("\n",1)[0])][0]
ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", f)]
addr_index = {a: i for i, (a, _) in enumerate(ins)}
hm = [i for i, (a, s) in enumerate(ins) if "HMMA" in s]
print("HMMA index range", hm[0], hm[-1], "of", len(ins))
for i, (a, s) in enumerate(ins):
    m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", s)
    m2 = re.search(r"0x([0-9a-f]+)", s) if "BRA" in s else None
    if m2:
        t = int(m2.group(1), 16)
        if t < a and t in addr_index and addr_index[t] <= hm[0] and i >= hm[-1] - 50:
            j = addr_index[t]
            body = ins[j:i+1]
            c = collections.Counter((x.split()[1] if x.split()[0].startswith("@") else x.split()[0]).split(".")[0] for _, x in body)
            print(f"back-edge at {i} -> {j}: {i-j+1} instructions;", ", ".join(f"{k} {v}" for k, v in c.most_common(14)))
