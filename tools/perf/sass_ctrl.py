"""SASS of one kernel with each instruction's control bits (Volta+ 128-bit encodings): stall
cycles, the scoreboard it sets (wr/rd) and the scoreboards it waits on (wait mask).

    python3 tools/perf/sass_ctrl.py FILE.cubin KERNEL_NAME      (cuobjdump + nvdisasm on PATH)

Use it to see which loads an instruction waits for: session 4 found gdn_commit's journal
loads waiting on the state loads' scoreboard this way, session 5 checked that every staging
load issues before the first wait. (From a session 5 helper.)"""
import re,sys,subprocess,os
def parse(text):
    out=[]; lines=text.splitlines(); i=0
    pat=re.compile(r'^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*/\* (0x[0-9a-f]{16}) \*/\s*$')
    hi=re.compile(r'^\s+/\* (0x[0-9a-f]{16}) \*/\s*$')
    while i<len(lines):
        m=pat.match(lines[i])
        if m and i+1<len(lines) and hi.match(lines[i+1]):
            lo=int(m.group(3),16); h=int(hi.match(lines[i+1]).group(1),16)
            ctrl=h>>41
            stall=ctrl&0xf; yld=(ctrl>>4)&1; wb=(ctrl>>5)&7; rb=(ctrl>>8)&7; wm=(ctrl>>11)&0x3f
            out.append(dict(addr=int(m.group(1),16),text=m.group(2).rstrip(' ;'),stall=stall,wb=wb,rb=rb,wm=wm))
            i+=2
        else: i+=1
    return out
def dump(cubin,fn):
    t=subprocess.run(['cuobjdump','-sass','-fun',fn,cubin],capture_output=True,text=True).stdout
    return parse(t)
if __name__=='__main__':
    ins=dump(sys.argv[1],sys.argv[2])
    for x in ins:
        if x['text'] in ('NOP',) or x['text'].startswith('BRA 0x') and x is ins[-1]: continue
        w=''.join(str(b) for b in range(6) if x['wm']>>b&1)
        print(f"{x['addr']:05x} wait[{w:6s}] wr{x['wb'] if x['wb']!=7 else '-'} rd{x['rb'] if x['rb']!=7 else '-'} s{x['stall']:<2d} {x['text']}")
