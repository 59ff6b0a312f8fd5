"""Bit-identity check of a kernel refactor without a GPU: compare the floating-point operation
streams of two PTX files, kernel by kernel (kernels whose name starts with PREFIX), with
operands and registers renamed by first appearance (the dataflow shape between float ops,
shuffles included). Prints same / DIFF per kernel and the first differences.

    python3 tools/perf/ptx_float_ops.py BEFORE.ptx AFTER.ptx PREFIX [SKIP]

SKIP drops the first SKIP float ops of AFTER (documented extras). ptxas may still contract
differently: compare SASS float-op counts too. (From a session 5 helper.)"""
import re,sys,difflib
FOPS=re.compile(r'^(@%p\d+\s+)?((fma|mul|add|sub|ex2|rcp|sqrt|rsqrt|lg2|neg|abs|min|max|div)\.[a-z0-9.]*f(32|16)|cvt\.[a-z0-9.]*(f16|bf16|f32)[a-z0-9.]*|shfl\.[a-z0-9.]*)\b')
def kernels(path,prefix):
    txt=open(path).read(); out={}
    for m in re.finditer(r'\.entry\s+(\w+)\s*\((.*?)\n\}\n',txt,re.S):
        name=m.group(1)
        if not name.startswith(prefix): continue
        raw=[]
        for l in m.group(2).splitlines():
            l=l.split('//')[0].strip()
            if not FOPS.match(l): continue
            raw.append(re.sub(r'^@%p\d+\s+','@P ',l))
        out[name]=raw
    return out
def rename(raw):
        ren={}; ops=[]
        def R(mm):
            r=mm.group(0)
            if r not in ren: ren[r]=f"v{len(ren)}"
            return ren[r]
        for l in raw: ops.append(re.sub(r'%[a-z]+\d+',R,l))
        return ops
A=kernels(sys.argv[1],sys.argv[3]); B=kernels(sys.argv[2],sys.argv[3])
skip=int(sys.argv[4]) if len(sys.argv)>4 else 0   # drop the first `skip` ops of B (documented extras)
for k in sorted(A):
    a,b=rename(A[k]),rename(B.get(k)[skip:])
    # renumber b after skipping
    print(f"{k:28s} {len(a):5d} {len(b):5d} {'same' if a==b else 'DIFF'}")
    if a!=b:
        for l in list(difflib.unified_diff(a,b,lineterm='',n=1))[:12]: print('   ',l)
