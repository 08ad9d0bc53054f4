import math
# rows losing to live FlashInfer (bench/results/2026-12-02_forward_7600fc1.csv)
rows = [  # name, hv, items, chunks(per item, longest), ours_ms, fi_ms
 ("(4,16) 1024x8",16,128,16,0.0658,0.0616),
 ("(4,16) 4096x8",16,128,64,0.2039,0.1996),
 ("(8,24) 1024x8",24,192,16,0.1189,0.1150),
 ("(8,24) 2048x4",24,96,32,0.1068,0.1057),
 ("(8,24) 4096x8",24,192,64,0.3956,0.3805),
 ("(8,24) 8192x4",24,96,128,0.3794,0.3669),
 ("(16,48) 1024x8",48,384,16,0.1752,0.1714),
 ("(16,48) 2048x4",48,192,32,0.2099,0.2052),
 ("(16,48) 4096x8",48,384,64,0.5806,0.5778),
 ("(16,48) 8192x4",48,192,128,0.7539,0.7345),
 ("(16,48) 4096+4096",48,96,64,0.1964,0.1905),
 ("(16,48) 6144+2048",48,96,96,0.2949,0.2777),
 ("(16,48) 2048+6144",48,96,96,0.2895,0.2786),
 ("(16,48) 16384+16384",48,96,256,0.7430,0.7175),
]
import sys
F=float(sys.argv[1]) if len(sys.argv)>1 else 1.98e3
STEP_CYC=5320   # timeline steady step, 8x1024 (16,16), 1.98 GHz
ITEM_CYC=20900  # timeline item overhead over 16 steady steps (106.0k - 16*5.32k) incl. end
END_CYC=1225
print("%-22s %5s %5s %6s %7s %7s | %6s %6s %6s %6s | %6s %5s %5s"%("row","items","waves","chunks","ours","FI","steps","items","rest","quant","gap","st%","it%"))
for n,hv,items,C,o,f in rows:
    w=math.ceil(items/132)
    ous=o*1e3; fus=f*1e3
    steps=w*C*STEP_CYC/F; ovh=w*ITEM_CYC/F; rest=ous-steps-ovh
    # quantization: time of the partially filled waves' idle SM share, at per-wave cost
    per_wave=(ous)/w
    ideal=items/132
    quant=100*(1-items/(132*w))
    print("%-22s %5d %5d %6d %7.1f %7.1f | %6.1f %6.1f %6.1f %5.0f%% | %6.1f %4.0f%% %4.0f%%"%(n,items,w,C,ous,fus,steps,ovh,rest,quant,ous-fus,100*steps/ous,100*ovh/ous))
