"""numpy model of spec_sample's top-p bucket window (cuda_src/sampling/sample_threshold.cuh):
how many candidate keys pass 2 must collect, with the window bounded from the counts alone
(main as of session 4: a bucket's mass known to its width, 2^(1/64)) and with the truncated
per-bucket mass sums (branch next/threshold-pass2: known to 2^-12). A window with more than
4096 keys falls back to the single-CTA full-row radix. Checks that every window holds the
exact crossing.

    python3 tools/threshold_window_model.py
"""
import numpy as np, math
def model(x, temp, top_p, shifted=True):
    scale=np.float32(math.log2(math.e)/temp)
    s2=(x.astype(np.float32)*scale).astype(np.float32)
    m=np.float32(s2.max())
    u=(m - s2).astype(np.float32)
    j=np.clip(np.floor(u.astype(np.float64)*64),0,2047).astype(int)
    w=np.floor(np.minimum(np.exp2(-u.astype(np.float64)),1.0)*2**31).astype(np.int64)
    tot=w.sum(); target=max(1,min(tot, math.ceil(top_p*tot)))
    cnt=np.bincount(j[j!=2047], minlength=2048)
    if shifted:
        sh=np.maximum(0,19-(np.arange(2048)>>6))
        ms=np.bincount(j[j!=2047], weights=(w>>sh[j])[j!=2047], minlength=2048)
        lo=ms*2.0**sh; hi=(ms+cnt)*2.0**sh
    else:
        jj=np.arange(2048)
        hi_e=np.where(jj==0,1.0,np.minimum(1.0,np.exp2(-jj/64)*(1+1e-5)))
        lo_e=np.where(jj==2047,0.0,np.exp2(-(jj+1)/64)*(1-1e-5))
        hi=cnt*hi_e*2**31; lo=cnt*np.maximum(0,lo_e*2**31-1)
    Clo=np.cumsum(lo); Chi=np.cumsum(hi)
    jmin=int(np.argmax(Chi>=target)) if (Chi>=target).any() else 2047
    jmax=int(np.argmax(Clo>=target)) if (Clo>=target).any() else 2047
    C=np.cumsum(np.bincount(j,weights=w,minlength=2048))
    jstar=int(np.argmax(C>=target))
    ok = jmin<=jstar<=jmax
    nwin=int(((j>=jmin)&(j<=jmax)&(w>0)).sum())
    return ok, jmin, jstar, jmax, nwin
rng=np.random.default_rng(0)
V=151936
for kind in ("n3","tail","llm"):
    for p in (0.5,0.9,0.95,0.99,0.999):
        res=[]
        for rep in range(3):
            if kind=="n3": x=rng.standard_normal(V)*3
            elif kind=="tail":
                x=rng.standard_normal(V)*2-45; idx=rng.choice(V,300,replace=False); x[idx]=rng.standard_normal(300)*2
            else:  # gumbel-ish peaked: zipf-like logits
                x=-np.log(np.arange(1,V+1))*1.2+rng.standard_normal(V)*0.5; rng.shuffle(x)
            x=x.astype(np.float32)
            a=model(x,1.0,p,True); b=model(x,1.0,p,False)
            res.append((a[0],a[4],b[0],b[4]))
        print(kind,p,"new ok/win",[(r[0],r[1]) for r in res],"old ok/win",[(r[2],r[3]) for r in res])
