import csv, sys
f = sys.argv[1]
rows = list(csv.reader(open(f)))
h = rows[1]
data = rows[2:]
ix = {k: i for i, k in enumerate(h)}
cols = [c for c in h if c.startswith('stall_') and 'Not Issued' not in c]
tot = sum(int(r[ix['Warp Stall Sampling (All Samples)']] or 0) for r in data)
print('total samples', tot)
# print instructions with index, samples, top stall reasons
out = []
for n, r in enumerate(data):
    s = int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
    reasons = sorted(((int(r[ix[c]] or 0), c[6:]) for c in cols), reverse=True)[:3]
    out.append((n, s, r[ix['Source']].strip(), reasons, r[ix['Instructions Executed']]))
mode = sys.argv[2] if len(sys.argv) > 2 else 'top'
if mode == 'top':
    for n, s, src, reasons, ex in sorted(out, key=lambda x: -x[1])[:45]:
        print(f"{n:5d} {s:7d} {100*s/tot:5.1f}% {src[:60]:60s} {ex:>10s} " + " ".join(f"{c}:{v}" for v, c in reasons if v))
else:
    a, b = map(int, mode.split(':'))
    for n, s, src, reasons, ex in out[a:b]:
        print(f"{n:5d} {s:7d} {src[:70]:70s} {ex:>10s} " + " ".join(f"{c}:{v}" for v, c in reasons if v))
