#!/usr/bin/env python3
# Summarises an Nsight Compute source-page CSV (ncu -i R --page source --csv --print-source sass):
# stall reasons over the first kernel, its N most-sampled SASS lines and the shared stores
# with excess wavefronts. Usage: ncu_source_summary.py SOURCE.csv [N]
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=rows[1]
ix={h:i for i,h in enumerate(hdr)}
# first kernel block only
data=[]
for r in rows[2:]:
    if r and r[0]=="Kernel Name": break
    if len(r)==len(hdr): data.append(r)
S="Warp Stall Sampling (All Samples)"
val=lambda r,h: int(r[ix[h]]) if r[ix[h]].isdigit() else 0
tot=sum(val(r,S) for r in data)
print("instructions",len(data),"total samples",tot)
reasons=[h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
sums={h:sum(val(r,h) for r in data) for h in reasons}
for h,v in sorted(sums.items(), key=lambda x:-x[1])[:12]: print(f"{h:28s} {v:8d} {100*v/tot:5.1f}%")
top=sorted(data, key=lambda r:-val(r,S))[:int(sys.argv[2]) if len(sys.argv)>2 else 40]
for r in top:
    s=val(r,S); main=max(reasons,key=lambda h:val(r,h))
    print(f"{r[0][-5:]} {s:7d} {100*s/tot:5.1f}% {main[6:]:14s} {val(r,main):7d} {r[1].strip()[:80]}")
ex=sorted(data,key=lambda r:-val(r,"L1 Wavefronts Shared Excessive"))[:8]
print("excessive shared wavefronts")
for r in ex: print(r[0][-5:], r[ix["L1 Wavefronts Shared Excessive"]], r[ix["L1 Wavefronts Shared"]], r[1].strip()[:70])
