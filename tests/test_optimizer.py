"""make_optimizer: AdamW runs fused on CPU and takes the same step as torch's reference loop."""

import torch

from grpokit.config import OptimConfig
from grpokit.train.update import make_optimizer


def test_fused_adamw_step_equals_the_reference_implementation():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    cfg = OptimConfig(lr=0.1, weight_decay=0.01)
    opt, _ = make_optimizer(a, cfg, total_steps=10)
    assert opt.param_groups[0]["fused"] is True
    ref = torch.optim.AdamW(b.parameters(), lr=0.1, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                            weight_decay=0.01, foreach=False)
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, o in ((a, opt), (b, ref)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    # first step of Adam moves every weight by ~lr (m/sqrt(v) = sign(g)), so differences are rounding only
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
