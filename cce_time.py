import json, math, sys, torch
from triton.testing import do_bench
from cut_cross_entropy import linear_cross_entropy
res = []
for n, h, v in ((8192, 4096, 128256), (8192, 2304, 256000)):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) / math.sqrt(h)).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[torch.rand(n, device="cuda", generator=g) < 0.1] = -100
    for eps in ("auto", None):
        kw = {} if eps == "auto" else {"filter_eps": None}
        f = lambda: linear_cross_entropy(x, w, t, **kw).backward()
        ms = do_bench(f, warmup=10, rep=300, grad_to_none=[x, w])
        res.append({"N": n, "H": h, "V": v, "filter_eps": eps, "ms": ms})
        print(json.dumps(res[-1]), flush=True)
    del x, w, t
    torch.cuda.empty_cache()
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": res}, open(sys.argv[1], "w"), indent=1)
